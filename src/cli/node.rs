//! A GPU node's parts, started the same way whatever drives the GPUs: the
//! inventory heartbeat, the booking worker, the meter and (with cgroups)
//! the time-slice scheduler of its shared GPUs. [`start_workers`] picks
//! the backend (NVML, or the nodes of the simulated fleet), checks every
//! setting, and only then starts anything.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use sqlx::PgPool;
use tokio::task::JoinHandle;

use super::args::GpuArgs;
use crate::gpu::{fleet::Fleet, nvml::NvmlBackend, sim::SimBackend, GpuBackend};
use crate::sched::cgroup::Layout;

/// Time-sliced shares a GPU takes, by GPU uuid.
pub type MaxShares = Arc<dyn Fn(&str) -> i32 + Send + Sync>;

/// Everything a node's parts need, checked before any of them starts.
#[derive(Debug, Clone)]
pub struct NodeSettings {
    pub worker: crate::worker::bookings::Settings,
    pub meter: crate::worker::meter::Settings,
    /// Where the meter keeps rows while the database is unreachable.
    pub spool_dir: PathBuf,
    /// How long a share may stay over its GPU memory after the warning.
    pub share_memory_grace: Duration,
    /// Whether booking cgroups are wanted (`auto`) or turned off.
    pub cgroups: bool,
    /// How often telemetry is sampled.
    pub telemetry_every: Duration,
    /// What the node does by itself about security incidents.
    pub security_response: crate::domain::security::Response,
    /// How time-sliced shares are enforced (launch layer, freezer, MPS).
    pub slicing: crate::sched::launch::TimeSlicing,
}

impl NodeSettings {
    /// The settings of `gpu`, checked.
    pub fn from_args(gpu: &GpuArgs, data_dir: &Path) -> Result<Self> {
        if let Some(cpus) = &gpu.booking_cpus {
            let ok = !cpus.trim().is_empty()
                && cpus
                    .split(',')
                    .all(|r| r.split('-').all(|n| n.trim().parse::<u32>().is_ok()));
            if !ok {
                bail!("--booking-cpus: give a CPU list such as 0-15 or 0,2,4-7");
            }
        }
        let shim = match gpu.timeslice_enforce.as_str() {
            "freezer" => None,
            mode => {
                let found = match &gpu.cuda_shim {
                    Some(p) if p.is_file() => Some(p.clone()),
                    Some(p) => bail!("--cuda-shim: there is no file at {}", p.display()),
                    None => crate::sched::launch::find_shim(),
                };
                if found.is_none() && mode == "launch" {
                    bail!("--timeslice-enforce launch: the shim libgpuslice_shim.so is not beside the gpuslice binary or in /usr/lib/gpuslice; give its path with --cuda-shim");
                }
                if found.is_none() {
                    tracing::warn!("the launch shim (libgpuslice_shim.so) is not installed: time-sliced shares are enforced by the freezer alone, which on a real GPU holds the CPU side only");
                }
                found
            }
        };
        let mps_gpus: Vec<String> = gpu
            .mps_gpus
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(|g| g.trim().to_string())
            .filter(|g| !g.is_empty())
            .collect();
        if let Some(bad) = mps_gpus
            .iter()
            .find(|g| *g != "all" && !g.starts_with("GPU-"))
        {
            bail!("--mps-gpus: \"{bad}\" is not a GPU uuid (GPU-...) or all");
        }
        let share_dir = gpu.share_dir.clone().unwrap_or_else(|| {
            gpu.exec_socket
                .as_deref()
                .and_then(Path::parent)
                .unwrap_or(data_dir)
                .join("shares")
        });
        Ok(NodeSettings {
            slicing: crate::sched::launch::TimeSlicing {
                shim,
                dir: share_dir,
                mps_gpus,
            },
            worker: crate::worker::bookings::Settings {
                tick: Duration::from_millis(gpu.worker_tick_ms),
                warn_secs: (gpu.warn_minutes * 60) as f64,
                grace: Duration::from_secs(gpu.grace_secs),
                host_memory_gib_per_slice: gpu.host_memory_gib_per_slice,
                cpus: gpu.booking_cpus.clone(),
                ..Default::default()
            },
            meter: crate::worker::meter::Settings {
                interval_secs: gpu.meter_interval_secs,
                tick: Duration::from_secs((gpu.meter_interval_secs as u64 / 6).clamp(1, 5)),
                spool_max_rows: gpu.spool_max_rows as usize,
            },
            spool_dir: data_dir.join("spool"),
            share_memory_grace: Duration::from_secs(gpu.share_memory_grace_secs),
            cgroups: gpu.cgroups != "off",
            telemetry_every: Duration::from_secs(gpu.telemetry_interval_secs),
            security_response: crate::domain::security::Response::parse(&gpu.security_response)
                .map_err(|e| anyhow!(e))?,
        })
    }
}

/// One GPU node this process drives.
pub struct Node {
    pub name: String,
    /// Where its bookings' cgroups live; `None`: no isolation.
    pub cgroups: Option<Layout>,
    /// What its booking groups are made with (device numbering included).
    pub limits: crate::sched::cgroup::Limits,
    pub tasks: Vec<JoinHandle<()>>,
}

impl Node {
    /// Starts a node's parts on `backend`.
    pub fn start(
        pool: &PgPool,
        name: &str,
        backend: Arc<dyn GpuBackend>,
        max_shares: MaxShares,
        settings: &NodeSettings,
    ) -> Node {
        let cgroups = if settings.cgroups {
            let l = crate::sched::shares::layout_for(name);
            if l.is_none() {
                tracing::warn!(node = %name, "no cgroups (not root, or no freezer): bookings are not isolated and shares are not time-sliced");
            }
            l
        } else {
            None
        };
        let mut worker = settings.worker.clone();
        worker.cgroups = cgroups.clone();
        // Groups are confined to their booking's device files wherever
        // the node's device numbering is known.
        worker.devices = cgroups.as_ref().and_then(|_| backend.node_devices());
        if cgroups.is_some() && worker.devices.is_none() {
            tracing::warn!(node = %name, "the NVIDIA device numbering is unknown (no nvidia major in /proc/devices): bookings are not confined to their device files");
        }
        let worker_limits = worker.limits();
        let mut tasks = vec![
            tokio::spawn(crate::worker::run_inventory(
                pool.clone(),
                name.to_string(),
                backend.clone(),
                max_shares,
            )),
            tokio::spawn(crate::worker::bookings::run(
                pool.clone(),
                name.to_string(),
                backend.clone(),
                worker,
            )),
            tokio::spawn(crate::worker::meter::run(
                pool.clone(),
                name.to_string(),
                backend.clone(),
                settings.spool_dir.clone(),
                settings.meter.clone(),
            )),
        ];
        tasks.push(tokio::spawn(crate::worker::telemetry::run(
            pool.clone(),
            name.to_string(),
            backend.clone(),
            cgroups.clone(),
            settings.telemetry_every,
        )));
        if let Some(l) = &cgroups {
            // Only where bookings live in cgroups can a process be told to
            // be outside every booking.
            tasks.push(tokio::spawn(crate::worker::security::run(
                pool.clone(),
                name.to_string(),
                backend.clone(),
                l.clone(),
                settings.telemetry_every,
                settings.security_response,
                settings.worker.grace,
            )));
        }
        tasks.push(tokio::spawn(crate::worker::telemetry::run_events(
            pool.clone(),
            name.to_string(),
            backend.clone(),
        )));
        if let Some(l) = &cgroups {
            tasks.push(tokio::spawn(crate::sched::shares::run(
                pool.clone(),
                name.to_string(),
                backend.clone(),
                l.clone(),
                worker_limits.clone(),
                crate::sched::shares::OverMemory {
                    grace: settings.share_memory_grace,
                    response: settings.security_response,
                },
                settings.slicing.clone(),
            )));
        }
        Node {
            name: name.to_string(),
            cgroups,
            limits: worker_limits,
            tasks,
        }
    }
}

/// The GPUs of one node, before anything runs on them.
struct Planned {
    name: String,
    backend: Arc<dyn GpuBackend>,
    max_shares: MaxShares,
}

/// The nodes this process drives: the local GPUs through NVML, or the
/// nodes of the simulated fleet (only `only_node` when given). With
/// `auto`, NVML is tried first and the simulation is the fallback.
fn plan_nodes(gpu: &GpuArgs, data_dir: &Path, only_node: Option<&str>) -> Result<Vec<Planned>> {
    if gpu.backend != "sim" {
        match NvmlBackend::open(
            gpu.nvml_lib.as_deref(),
            gpu.nvml_gpus.clone(),
            gpu.nvml_allow_mode_change,
        ) {
            Ok(b) => {
                let missing = b.missing_privileges(&b.inventory().unwrap_or_default());
                if !missing.is_empty() {
                    tracing::warn!(
                        "running as uid {}, this worker cannot {}: run it as root, or grant the account NVIDIA's mig-config and mig-monitor capabilities (docs/operations.md)",
                        nix::unistd::geteuid(),
                        missing.join(", ")
                    );
                }
                let name = match &gpu.node_name {
                    Some(n) => n.clone(),
                    None => nix::unistd::gethostname()
                        .map(|h| h.to_string_lossy().to_string())
                        .unwrap_or_else(|_| "localhost".into()),
                };
                let shares = gpu.max_shares;
                tracing::info!(node = %name, "worker started on the NVML backend");
                return Ok(vec![Planned {
                    name,
                    backend: Arc::new(b),
                    max_shares: Arc::new(move |_: &str| shares),
                }]);
            }
            Err(e) if gpu.backend == "nvml" => bail!("{e}"),
            Err(e) => {
                tracing::info!(reason = %e, "no usable NVIDIA driver; using the simulated fleet")
            }
        }
    }
    let fleet = Fleet::load(gpu.fleet.as_deref()).map_err(|e| anyhow!(e))?;
    if let Some(n) = only_node {
        if fleet.node(n).is_none() {
            bail!("--node: the fleet has no node named \"{n}\"");
        }
    }
    let state_dir = data_dir.join("sim");
    std::fs::create_dir_all(&state_dir)
        .with_context(|| format!("cannot create {}", state_dir.display()))?;
    let mut nodes = Vec::new();
    for node in fleet
        .nodes
        .iter()
        .filter(|n| only_node.is_none_or(|o| o == n.name))
    {
        let backend =
            SimBackend::open(&fleet, &node.name, Some(&state_dir)).map_err(|e| anyhow!(e))?;
        // max_shares comes from the fleet file, by GPU uuid.
        let shares: HashMap<String, i32> = node
            .gpus
            .iter()
            .flat_map(|g| std::iter::repeat_n(g.max_shares as i32, g.count as usize))
            .enumerate()
            .map(|(i, s)| (crate::gpu::sim::gpu_uuid(&node.name, i as u32), s))
            .collect();
        nodes.push(Planned {
            name: node.name.clone(),
            backend: Arc::new(backend),
            max_shares: Arc::new(move |uuid: &str| shares.get(uuid).copied().unwrap_or(4)),
        });
    }
    tracing::info!(
        nodes = nodes.len(),
        "worker started for the simulated fleet"
    );
    Ok(nodes)
}

/// Starts every node this process drives, one queue planner and the
/// `gpuslice exec` socket. Settings and backends are checked first; an
/// error starts nothing. Returns the tasks (they end with the process).
pub fn start_workers(
    pool: &PgPool,
    gpu: &GpuArgs,
    data_dir: &Path,
    only_node: Option<&str>,
) -> Result<Vec<JoinHandle<()>>> {
    let settings = NodeSettings::from_args(gpu, data_dir)?;
    let planned = plan_nodes(gpu, data_dir, only_node)?;
    let mut tasks = Vec::new();
    let mut exec_nodes = HashMap::new();
    for p in planned {
        let node = Node::start(pool, &p.name, p.backend, p.max_shares, &settings);
        exec_nodes.insert(
            node.name.clone(),
            node.cgroups.clone().map(|l| (l, node.limits.clone())),
        );
        tasks.extend(node.tasks);
    }
    // Queued bookings wait for capacity anywhere, so one planner serves
    // the process (several processes planning at once is safe: tenant
    // locks and the exclusion constraint keep them apart).
    tasks.push(tokio::spawn(crate::worker::bookings::run_planner(
        pool.clone(),
        Duration::from_millis(gpu.worker_tick_ms),
    )));
    let socket = gpu
        .exec_socket
        .clone()
        .unwrap_or_else(|| data_dir.join("exec.sock"));
    tasks.push(tokio::spawn(crate::sched::exec::serve(
        pool.clone(),
        socket,
        exec_nodes,
        settings.slicing.clone(),
    )));
    Ok(tasks)
}

/// Starts the watcher (alert rules, rollups, retention) and, when e-mail
/// or a webhook is configured, the notifier. Every process that serves or
/// drives GPUs runs them. The settings are checked first; an error starts
/// nothing.
pub fn start_watch(pool: &PgPool, gpu: &GpuArgs) -> Result<Vec<JoinHandle<()>>> {
    let channels = crate::watch::notifier::Channels::from_settings(
        gpu.smtp_url.as_deref(),
        gpu.mail_from.as_deref(),
        gpu.alert_webhook_url.as_deref(),
    )
    .map_err(|e| anyhow!(e))?;
    let mut settings = crate::watch::Settings::new(gpu.telemetry_interval_secs);
    if !(0.0..=100.0).contains(&gpu.idle_threshold_pct) {
        bail!("--idle-threshold-pct: give a utilisation between 0 and 100");
    }
    settings.idle_threshold_pct = gpu.idle_threshold_pct;
    settings.lower_idle_shares = gpu.optimizer_lower_idle_shares;
    settings.retention = crate::db::telemetry::Retention {
        raw_hours: gpu.telemetry_raw_hours,
        rollup_days: gpu.telemetry_rollup_days,
    };
    settings.usage_retention_months = gpu.usage_retention_months;
    let mut tasks = vec![tokio::spawn(crate::watch::run(pool.clone(), settings))];
    if channels.any() {
        tracing::info!(channels = ?channels, "notifications on");
        let who = format!(
            "{}:{}",
            nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().to_string())
                .unwrap_or_default(),
            std::process::id()
        );
        tasks.push(tokio::spawn(crate::watch::notifier::run(
            pool.clone(),
            channels,
            who,
            gpu.notify_lease_secs as f64,
        )));
    }
    Ok(tasks)
}
