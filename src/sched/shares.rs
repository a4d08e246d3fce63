//! Time-sliced shares on a node: one enforcer thread per shared GPU runs
//! its scheduler over the shares (at the launch layer through the shim's
//! regions, or by freezing their cgroups; see [`crate::sched::launch`]);
//! every few seconds their state reaches the database (the booking's
//! `scheduler`, the tenant's QoS ledger); a share's processes that use
//! more GPU memory than it booked are warned, then ended; under launch
//! enforcement a process on the GPU without the shim is a security finding
//! and its share is frozen. GPUs set for MPS get NVIDIA's MPS daemon
//! instead of an enforcer.

use std::collections::HashMap;
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::PgPool;

use crate::db;
use crate::domain::booking::Status;
use crate::gpu::GpuBackend;
use crate::sched::cgroup::{Group, Layout};
use crate::sched::enforce::Enforcer;
use crate::sched::launch::{Enforcement, Regions, TimeSlicing};
use crate::sched::scheduler::{Share, ShareSpec};

/// The cgroup layout of a node's bookings, when this process may manage
/// cgroups (root, a freezer). Groups live under `gpuslice-<node>`.
pub fn layout_for(node: &str) -> Option<Layout> {
    if !nix::unistd::Uid::effective().is_root() {
        return None;
    }
    Layout::detect(
        Path::new("/sys/fs/cgroup"),
        &crate::sched::container::group_prefix(node),
    )
}

/// What a GPU's thread runs: its shares, and those a security response
/// holds frozen (out of the scheduler, never thawed).
struct Update {
    /// Each share with its group and its GPU memory in bytes.
    shares: Vec<(ShareSpec, Group, u64)>,
    held: Vec<(i64, Group)>,
}

struct GpuThread {
    tx: mpsc::Sender<Update>,
    state: Arc<Mutex<Vec<Share>>>,
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

/// Starts GPU `gpu`'s enforcer thread; `launch`: the share directory when
/// its shares are enforced at the launch layer.
fn spawn_gpu(
    gpu: &str,
    backend: Arc<dyn GpuBackend>,
    launch: Option<std::path::PathBuf>,
) -> GpuThread {
    let (tx, rx) = mpsc::channel::<Update>();
    let state = Arc::new(Mutex::new(Vec::new()));
    let out = state.clone();
    let name = format!("sched-{}", &gpu[..gpu.len().min(12)]);
    let uuid = gpu.to_string();
    let mut since = now_us();
    // The GPU's own per-process utilisation where NVML samples it.
    let sampler: crate::sched::enforce::Sampler = Box::new(move |pids: &[u32], slice: Duration| {
        let samples = backend.process_utilization(&uuid, since).ok().flatten()?;
        since = now_us();
        let sm = samples
            .iter()
            .filter(|(pid, _)| pids.contains(pid))
            .map(|(_, u)| *u)
            .max()
            .unwrap_or(0);
        Some(slice.as_secs_f64() * 1000.0 * f64::from(sm.min(100)) / 100.0)
    });
    let _ = std::thread::Builder::new().name(name).spawn(move || {
        let mut e = match &launch {
            Some(_) => Enforcer::launch(),
            None => Enforcer::new().with_sampler(sampler),
        };
        let mut published = Instant::now();
        // When the running slice ends: the scheduler is stepped then, not
        // on every wake-up (that would cut slices short).
        let mut next = Instant::now();
        loop {
            loop {
                match rx.try_recv() {
                    Ok(Update { shares: set, held }) => {
                        let keep: Vec<i64> = set.iter().map(|(s, _, _)| s.id).collect();
                        let gone: Vec<i64> = e
                            .shares()
                            .iter()
                            .map(|s| s.spec.id)
                            .filter(|id| !keep.contains(id))
                            .collect();
                        for id in gone {
                            if held.iter().any(|(h, _)| *h == id) {
                                // Leaves the scheduler frozen, not thawed.
                                e.detach(id);
                            } else {
                                e.remove(id);
                                if let Some(dir) = &launch {
                                    crate::sched::launch::remove(dir, id);
                                }
                            }
                        }
                        for (_, group) in &held {
                            if !group.is_frozen() {
                                let _ = group.freeze();
                            }
                        }
                        for (spec, group, memory) in set {
                            // Held before, given back now: it starts thawed
                            // (`add` freezes it again while another runs).
                            if !e.has(spec.id) && group.is_frozen() {
                                let _ = group.thaw();
                            }
                            match &launch {
                                None => e.add(spec, group),
                                Some(_) if e.has(spec.id) => {
                                    if let Some(r) = e.regions(spec.id) {
                                        r.control.mem_limit.store(memory, std::sync::atomic::Ordering::Release);
                                    }
                                    e.update(spec);
                                }
                                Some(dir) => match Regions::ensure(dir, spec.id, memory) {
                                    Ok(r) => e.add_launch(spec, Some(group), r),
                                    Err(err) => tracing::warn!(booking = spec.id, error = %err, "cannot make the share's launch regions"),
                                },
                            }
                        }
                    }
                    Err(mpsc::TryRecvError::Empty) => break,
                    Err(mpsc::TryRecvError::Disconnected) => {
                        e.release_all();
                        return;
                    }
                }
            }
            if Instant::now() >= next {
                next = e.step();
            }
            if published.elapsed() >= Duration::from_millis(500) {
                if let Ok(mut s) = out.lock() {
                    *s = e.shares().to_vec();
                }
                published = Instant::now();
            }
            // Wake at the slice's end, or soon enough to see changes.
            let wait = next
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(50));
            std::thread::sleep(wait);
        }
    });
    GpuThread { tx, state }
}

/// What the node remembers between passes.
#[derive(Default)]
pub struct Memory {
    /// Last published (violations, boosted) per share, for the ledger.
    seen: HashMap<i64, (u64, bool)>,
    /// When a process was first seen over its share's GPU memory.
    over_since: HashMap<u32, Instant>,
    /// Processes already reported as running without the shim.
    unshimmed: std::collections::HashSet<u32>,
}

/// Runs the node's shares until the task is dropped (then every GPU's
/// thread thaws its shares and ends).
pub async fn run(
    pool: PgPool,
    node: String,
    backend: Arc<dyn GpuBackend>,
    layout: Layout,
    limits: crate::sched::cgroup::Limits,
    over_memory: OverMemory,
    slicing: TimeSlicing,
) {
    let mut threads: HashMap<String, GpuThread> = HashMap::new();
    let mut memory = Memory::default();
    let mut mps = MpsDaemons::default();
    let layout_ref = &layout;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut n: u64 = 0;
    loop {
        tick.tick().await;
        n += 1;
        let shares = match db::bookings::active_shares(&pool, &node).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "cannot read the node's shares");
                continue;
            }
        };
        // Shares a security response froze stay frozen until an admin
        // closes the incident.
        let held_ids = db::security::held_bookings(&pool, &node)
            .await
            .unwrap_or_default();
        if n % 5 == 1 {
            let default = if slicing.shim.is_some() {
                "launch"
            } else {
                "freezer"
            };
            let all = slicing.mps_gpus.iter().any(|g| g == "all");
            if let Err(e) =
                db::fleet::set_share_enforcement(&pool, &node, default, &slicing.mps_gpus, all)
                    .await
            {
                tracing::warn!(node = %node, error = %e, "cannot record how shares are enforced");
            }
        }
        let mut by_gpu: HashMap<String, Vec<(ShareSpec, Group, u64)>> = HashMap::new();
        let mut held: HashMap<String, Vec<(i64, Group)>> = HashMap::new();
        for s in &shares {
            let group = layout.group(s.id);
            if !group.exists() {
                let nodes = crate::sched::devices::from_json(s.device_nodes.as_ref());
                if let Err(e) = layout.create_for(s.id, s.compute_slices, &limits, &nodes) {
                    tracing::warn!(booking = s.id, error = %e, "cannot create the share's cgroup");
                    continue;
                }
            }
            if held_ids.contains(&s.id) {
                held.entry(s.gpu_uuid.clone())
                    .or_default()
                    .push((s.id, group));
                by_gpu.entry(s.gpu_uuid.clone()).or_default();
                continue;
            }
            by_gpu.entry(s.gpu_uuid.clone()).or_default().push((
                ShareSpec {
                    id: s.id,
                    priority: s.priority,
                    guaranteed_pct: f64::from(s.guaranteed_share_pct),
                    min_slice_ms: None,
                    max_slice_ms: None,
                },
                group,
                u64::try_from(s.memory_gib).unwrap_or(0) << 30,
            ));
        }
        // MPS GPUs run NVIDIA's daemon, not an enforcer.
        for gpu in by_gpu.keys() {
            if slicing.mode(gpu) == Enforcement::Mps {
                mps.ensure(&slicing, gpu);
            }
        }
        by_gpu.retain(|gpu, _| slicing.mode(gpu) != Enforcement::Mps);
        // GPUs without shares lose their thread (it thaws and ends).
        threads.retain(|gpu, _| by_gpu.contains_key(gpu));
        for (gpu, set) in by_gpu {
            let launch = (slicing.mode(&gpu) == Enforcement::Launch).then(|| slicing.dir.clone());
            let t = threads
                .entry(gpu.clone())
                .or_insert_with(|| spawn_gpu(&gpu, backend.clone(), launch));
            let _ = t.tx.send(Update {
                shares: set,
                held: held.remove(&gpu).unwrap_or_default(),
            });
        }
        if n.is_multiple_of(5) {
            publish(&pool, &threads, &shares, &mut memory).await;
        }
        if slicing.shim.is_some() {
            let launch: Vec<db::bookings::ActiveShare> = shares
                .iter()
                .filter(|s| {
                    slicing.mode(&s.gpu_uuid) == Enforcement::Launch && !held_ids.contains(&s.id)
                })
                .cloned()
                .collect();
            find_unshimmed(
                &pool,
                &node,
                &backend,
                layout_ref,
                &slicing,
                &launch,
                &mut memory,
            )
            .await;
        }
        watch_memory(
            &pool,
            &node,
            &backend,
            layout_ref,
            &shares,
            &mut memory,
            over_memory,
        )
        .await;
    }
}

/// Under launch enforcement, a process of a share that NVML lists on the
/// share's GPU but that did not register with the shim, or no longer has
/// it mapped (it runs without it: `LD_PRELOAD` removed, an `exec` after
/// registering, statically linked CUDA) is evidence for the
/// security monitor, and its share is frozen until an admin closes the
/// incident: its launches would otherwise take GPU time the scheduler
/// cannot gate.
pub async fn find_unshimmed(
    pool: &PgPool,
    node: &str,
    backend: &Arc<dyn GpuBackend>,
    layout: &Layout,
    slicing: &TimeSlicing,
    shares: &[db::bookings::ActiveShare],
    memory: &mut Memory,
) {
    use crate::domain::security::{Detector, Suspect};
    let Some(shim) = slicing.shim.as_deref() else {
        return;
    };
    let dir = slicing.dir.as_path();
    use crate::watch::security::{report, Report};
    let mut gpus: Vec<&str> = shares.iter().map(|s| s.gpu_uuid.as_str()).collect();
    gpus.sort();
    gpus.dedup();
    let mut on_gpu: HashMap<&str, Vec<u32>> = HashMap::new();
    for gpu in gpus {
        let (be, g) = (backend.clone(), gpu.to_string());
        if let Ok(Ok(procs)) = tokio::task::spawn_blocking(move || be.processes(&g)).await {
            on_gpu.insert(gpu, procs.iter().map(|p| p.pid).collect());
        }
    }
    let mut seen = std::collections::HashSet::new();
    for s in shares {
        let Some(procs) = on_gpu.get(s.gpu_uuid.as_str()) else {
            continue;
        };
        let mine = layout.group(s.id).pids();
        let (control_path, report_path) = gpuslice_cuda::region::paths(dir, s.id);
        let registered: Vec<u32> = gpuslice_cuda::region::read_report(&report_path)
            .map(|r| crate::sched::launch::registered_hosts(&r.registered, &mine))
            .unwrap_or_default();
        let unshimmed = |p: &u32| {
            mine.contains(p)
                && !(registered.contains(p)
                    && crate::sched::launch::shim_loaded(*p, shim, &control_path))
        };
        for pid in procs.iter().copied().filter(unshimmed) {
            seen.insert(pid);
            if !memory.unshimmed.insert(pid) {
                continue;
            }
            let detail = format!(
                "process {pid} ({}) runs on share {}'s GPU without the launch shim; the share is frozen",
                crate::sched::procfs::comm(pid),
                s.id
            );
            let _ = db::bookings::note(
                pool,
                s.id,
                &format!("worker:{node}"),
                Status::Active,
                &format!("frozen: {detail} until an admin closes the security incident"),
            )
            .await;
            let evidence = Report::new(Suspect::Booking(s.id), Detector::UnshimmedProcess, detail)
                .on_node(node);
            match report(pool, evidence).await {
                Some(o) => {
                    crate::worker::security::freeze_share(pool, node, s.id, o.incident_id).await
                }
                None => tracing::warn!(booking = s.id, pid, "cannot record the unshimmed process"),
            }
        }
    }
    memory.unshimmed.retain(|p| seen.contains(p));
}

/// NVIDIA MPS control daemons this worker started, one per GPU; they are
/// told to quit when the worker stops.
#[derive(Default)]
struct MpsDaemons {
    started: HashMap<String, std::path::PathBuf>,
    missing_warned: bool,
}

const MPS_CONTROL: &str = "nvidia-cuda-mps-control";

impl MpsDaemons {
    fn ensure(&mut self, slicing: &TimeSlicing, gpu: &str) {
        if self.started.contains_key(gpu) {
            return;
        }
        let (pipe, log) = (slicing.mps_pipe(gpu), slicing.mps_log(gpu));
        if std::fs::create_dir_all(&pipe).is_err() || std::fs::create_dir_all(&log).is_err() {
            tracing::warn!(gpu, "cannot make the MPS pipe and log directories");
            return;
        }
        let status = std::process::Command::new(MPS_CONTROL)
            .arg("-d")
            .env("CUDA_VISIBLE_DEVICES", gpu)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &log)
            .status();
        match status {
            Ok(s) if s.success() => {
                tracing::info!(gpu, "MPS control daemon started");
                self.started.insert(gpu.to_string(), pipe);
            }
            Ok(s) => tracing::warn!(gpu, status = %s, "the MPS control daemon did not start"),
            Err(e) => {
                if !self.missing_warned {
                    tracing::error!(gpu, error = %e, "{MPS_CONTROL} cannot run: shares on MPS GPUs run without MPS limits; install NVIDIA's MPS or remove the GPU from GPUSLICE_MPS_GPUS");
                    self.missing_warned = true;
                }
            }
        }
    }
}

impl Drop for MpsDaemons {
    fn drop(&mut self) {
        use std::io::Write;
        for (gpu, pipe) in &self.started {
            let child = std::process::Command::new(MPS_CONTROL)
                .env("CUDA_MPS_PIPE_DIRECTORY", pipe)
                .stdin(std::process::Stdio::piped())
                .spawn();
            if let Ok(mut c) = child {
                if let Some(mut stdin) = c.stdin.take() {
                    let _ = stdin.write_all(b"quit\n");
                }
                let _ = c.wait();
                tracing::info!(gpu, "MPS control daemon told to quit");
            }
        }
    }
}

/// Writes each share's scheduler state and its QoS events.
async fn publish(
    pool: &PgPool,
    threads: &HashMap<String, GpuThread>,
    shares: &[db::bookings::ActiveShare],
    memory: &mut Memory,
) {
    for t in threads.values() {
        let state = t.state.lock().map(|s| s.clone()).unwrap_or_default();
        for s in state {
            let id = s.spec.id;
            let doc = json!({
                "time_slice_ms": s.slice_ms(),
                "priority": s.effective_priority().as_str(),
                "achieved_share_pct": (s.achieved_pct * 10.0).round() / 10.0,
                "guaranteed_share_pct": s.spec.guaranteed_pct,
                "violations": s.violations,
                "boosted": s.boosted,
                "at": time::OffsetDateTime::now_utc().unix_timestamp(),
            });
            if let Err(e) = db::bookings::set_scheduler(pool, id, &doc).await {
                tracing::warn!(booking = id, error = %e, "cannot store scheduler state");
                continue;
            }
            let Some(tenant) = shares.iter().find(|a| a.id == id).map(|a| a.tenant_id) else {
                continue;
            };
            let (old_v, old_b) = memory.seen.get(&id).copied().unwrap_or((0, false));
            let mut events = Vec::new();
            if s.violations > old_v {
                events.push("violation");
            }
            if s.boosted && !old_b {
                events.push("boost");
            }
            if !s.boosted && old_b {
                events.push("recovered");
            }
            for kind in events {
                let _ = db::bookings::qos_event(
                    pool,
                    id,
                    tenant,
                    kind,
                    s.achieved_pct,
                    s.spec.guaranteed_pct,
                )
                .await;
            }
            memory.seen.insert(id, (s.violations, s.boosted));
        }
    }
}

/// What happens to a share's process over its GPU memory: how long it may
/// stay over after the warning, and whether a security incident that
/// alerts freezes the share.
#[derive(Debug, Clone, Copy)]
pub struct OverMemory {
    pub grace: Duration,
    pub response: crate::domain::security::Response,
}

/// Warns about, then ends, a share's processes that hold more GPU memory
/// than the share booked (a booking event each time).
pub async fn watch_memory(
    pool: &PgPool,
    node: &str,
    backend: &Arc<dyn GpuBackend>,
    layout: &Layout,
    shares: &[db::bookings::ActiveShare],
    memory: &mut Memory,
    rules: OverMemory,
) {
    let OverMemory { grace, response } = rules;
    let mut still_over = Vec::new();
    for s in shares {
        let (be, gpu) = (backend.clone(), s.gpu_uuid.clone());
        let Ok(Ok(procs)) = tokio::task::spawn_blocking(move || be.processes(&gpu)).await else {
            continue;
        };
        let mine = layout.group(s.id).pids();
        let limit = i64::from(s.memory_gib) * 1024;
        for p in procs.iter().filter(|p| mine.contains(&p.pid)) {
            if p.used_memory_mib as i64 <= limit {
                continue;
            }
            still_over.push(p.pid);
            let newly = !memory.over_since.contains_key(&p.pid);
            let first = *memory.over_since.entry(p.pid).or_insert_with(Instant::now);
            let why = format!(
                "process {} uses {} MiB of GPU memory, over the share's {} GiB",
                p.pid, p.used_memory_mib, s.memory_gib
            );
            if newly {
                let _ = db::bookings::note(
                    pool,
                    s.id,
                    &format!("worker:{node}"),
                    Status::Active,
                    &format!(
                        "warning: {why}; it is ended in {} s unless it frees memory",
                        grace.as_secs()
                    ),
                )
                .await;
            } else if first.elapsed() >= grace {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p.pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
                memory.over_since.remove(&p.pid);
                let _ = db::bookings::note(
                    pool,
                    s.id,
                    &format!("worker:{node}"),
                    Status::Active,
                    &format!("ended: {why}"),
                )
                .await;
                use crate::domain::security::{Detector, Suspect};
                use crate::watch::security::{report, Report};
                let evidence = Report::new(
                    Suspect::Booking(s.id),
                    Detector::ShareMemory,
                    format!(
                        "{why}, still after the {} s warning; ended",
                        grace.as_secs()
                    ),
                )
                .on_node(node);
                if let Some(o) = report(pool, evidence).await {
                    if o.alerting && response.freeze_shares {
                        crate::worker::security::freeze_share(pool, node, s.id, o.incident_id)
                            .await;
                    }
                }
            }
        }
    }
    memory.over_since.retain(|pid, _| still_over.contains(pid));
}
