//! The simulated backend: a faithful model of a node's GPUs built from the
//! fleet file. It applies NVIDIA's MIG rules through [`super::mig`] (the same
//! code the stand-in `libnvidia-ml` uses), keeps MIG mode changes pending
//! until a simulated reset, and keeps its hardware state in the data
//! directory, so a restarted gpuslice finds the instances it left, as on
//! real GPUs. Faults can be injected for tests.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::backend::{
    end_processes, BackendError, DeviceSample, EventKind, GpuBackend, GpuEvent, GpuInfo,
    GpuProcess, Instance, Telemetry,
};
use super::catalog::{self, Placement};
use super::fleet::{Fleet, Mode};
use super::mig::{self, Existing};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SimInstance {
    gi_id: u32,
    profile_id: u32,
    placement: Placement,
    ci_id: Option<u32>,
    device_uuid: Option<String>,
    processes: Vec<GpuProcess>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct SimGpu {
    index: u32,
    uuid: String,
    model: String,
    mig_current: bool,
    mig_pending: bool,
    instances: Vec<SimInstance>,
    /// Processes on the whole GPU (time-slice mode).
    processes: Vec<GpuProcess>,
    next_gi: u32,
    /// Values staged by `gpuslice sim set` (faults, load).
    #[serde(default)]
    staged: Staged,
    /// Driver events staged by `gpuslice sim xid`, not yet delivered.
    #[serde(default)]
    events: Vec<(EventKind, u64)>,
    /// Attached processes that were real processes of this machine: the
    /// driver stops listing them once they end (a made-up pid stays).
    #[serde(default)]
    real_pids: Vec<u32>,
}

/// What `gpuslice sim set` stages on a simulated GPU: each value, when
/// set, replaces what the load model gives. The stand-in NVML library
/// keeps the same record, so both backends serve the same values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Staged {
    pub temperature_c: Option<u32>,
    pub utilization_pct: Option<u32>,
    pub power_w: Option<f64>,
    pub memory_used_mib: Option<u64>,
    pub ecc_uncorrectable: Option<u64>,
    /// Fallen off the bus.
    #[serde(default)]
    pub lost: bool,
}

impl Staged {
    /// Overlays the staged values on a sample.
    pub fn apply(&self, t: &mut Telemetry) {
        if let Some(v) = self.temperature_c {
            t.temperature_c = Some(v);
        }
        if let Some(v) = self.utilization_pct {
            t.utilization_pct = Some(v.min(100));
        }
        if let Some(v) = self.power_w {
            t.power_w = Some(v);
        }
        if let Some(v) = self.memory_used_mib {
            t.memory_used_mib = v.min(t.memory_total_mib);
        }
        if let Some(v) = self.ecc_uncorrectable {
            t.ecc_uncorrectable = Some(v);
        }
    }
}

/// A device (MIG device, or the whole GPU outside MIG) as the load model
/// sees it.
pub struct Load<'a> {
    pub device_uuid: &'a str,
    /// Its share of the GPU's compute (compute slices / 7; 1 outside MIG).
    pub compute_fraction: f64,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    /// Processes running on it.
    pub processes: usize,
}

/// The simulation's load model, shared with the stand-in NVML library: a
/// device with processes is busy (85 % of its compute, more processes add
/// little), one without is idle; temperature, power and clocks follow the
/// GPU's utilisation. Utilisation of MIG devices is reported on Hopper
/// and newer (GPM), as NVML does, and whole-GPU utilisation only outside
/// MIG mode.
pub fn model_telemetry(model: &str, mig: bool, memory_total_mib: u64, loads: &[Load]) -> Telemetry {
    let busy = |l: &Load| match l.processes {
        0 => 0.0,
        n => (85.0 + 5.0 * (n as f64 - 1.0)).min(98.0),
    };
    let util: f64 = loads
        .iter()
        .map(|l| busy(l) * l.compute_fraction)
        .sum::<f64>()
        .min(100.0);
    let gpm = ["H100", "H200", "GH200", "B200"]
        .iter()
        .any(|p| model.starts_with(p));
    let tdp = catalog::model(model).map(|m| m.tdp_w()).unwrap_or(300.0);
    Telemetry {
        memory_used_mib: loads.iter().map(|l| l.memory_used_mib).sum(),
        memory_total_mib,
        utilization_pct: (!mig).then_some(util.round() as u32),
        temperature_c: Some((32.0 + util * 0.45).round() as u32),
        power_w: Some((tdp * 0.12 + tdp * 0.8 * util / 100.0).round()),
        ecc_uncorrectable: Some(0),
        sm_clock_mhz: Some(if util > 0.0 { 1980 } else { 345 }),
        mem_clock_mhz: Some(2619),
        devices: if mig {
            loads
                .iter()
                .map(|l| DeviceSample {
                    device_uuid: l.device_uuid.to_string(),
                    memory_used_mib: l.memory_used_mib,
                    memory_total_mib: l.memory_total_mib,
                    utilization_pct: gpm.then_some(busy(l).round() as u32),
                })
                .collect()
        } else {
            Vec::new()
        },
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    gpus: Vec<SimGpu>,
}

#[derive(Debug, Default)]
struct Faults {
    /// `GPUSLICE_SIM_CRASH`: abort the whole process at this point, the
    /// way `kill -9` would, to prove that the worker converges afterwards.
    crash_at: Option<CrashPoint>,
    fail_next_create: Option<String>,
    lost: HashSet<String>,
    delay: Duration,
    /// Live processes the worker found in bookings' cgroups, by device:
    /// the simulation's model of CUDA work, so NVML-like process lists
    /// show them too.
    observed: HashMap<String, Vec<u32>>,
}

/// Where an injected crash strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashPoint {
    /// As a create starts, before the hardware changes.
    BeforeCreate,
    /// Right after the instance exists, before anyone records it.
    AfterCreate,
    /// Right after an instance is gone, before anyone records it.
    AfterDestroy,
}

impl CrashPoint {
    /// `before-create`, `after-create` or `after-destroy`.
    pub fn parse(raw: &str) -> Option<CrashPoint> {
        match raw {
            "before-create" => Some(CrashPoint::BeforeCreate),
            "after-create" => Some(CrashPoint::AfterCreate),
            "after-destroy" => Some(CrashPoint::AfterDestroy),
            _ => None,
        }
    }
}

/// The simulated GPUs of one node.
pub struct SimBackend {
    node: String,
    state: Mutex<State>,
    path: Option<PathBuf>,
    faults: Mutex<Faults>,
    /// Its device files under `<state dir>/dev/<node>/` (a node with a
    /// state directory).
    devices: Option<crate::sched::devices::NodeDevices>,
}

/// The hardware keeps what it had, for the GPUs that still exist with the
/// same model.
fn merge(gpus: &mut [SimGpu], saved: &State) {
    for g in gpus {
        if let Some(old) = saved
            .gpus
            .iter()
            .find(|o| o.uuid == g.uuid && o.model == g.model)
        {
            *g = old.clone();
        }
    }
}

/// A stable GPU uuid for a node's GPU index, in NVIDIA's `GPU-` form.
pub fn gpu_uuid(node: &str, index: u32) -> String {
    let h = Sha256::digest(format!("gpuslice-sim/{node}/{index}").as_bytes());
    format!("GPU-{}", dashed(&hex::encode(&h[..16])))
}

fn dashed(hex: &str) -> String {
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn mig_uuid() -> String {
    format!("MIG-{}", uuid::Uuid::new_v4())
}

impl SimBackend {
    /// The GPUs of `node` in `fleet`. With `state_dir`, hardware state is
    /// read from and written to `state_dir/sim-<node>.json`.
    pub fn open(fleet: &Fleet, node: &str, state_dir: Option<&Path>) -> Result<SimBackend, String> {
        let spec = fleet
            .node(node)
            .ok_or_else(|| format!("the fleet has no node named \"{node}\""))?;
        let mut gpus = Vec::new();
        for group in &spec.gpus {
            for _ in 0..group.count {
                let index = gpus.len() as u32;
                let mig = group.mode == Mode::Mig;
                gpus.push(SimGpu {
                    index,
                    uuid: gpu_uuid(node, index),
                    model: group.model.clone(),
                    mig_current: mig,
                    mig_pending: mig,
                    instances: Vec::new(),
                    processes: Vec::new(),
                    next_gi: 1,
                    staged: Staged::default(),
                    events: Vec::new(),
                    real_pids: Vec::new(),
                });
            }
        }
        let path = state_dir.map(|d| d.join(format!("sim-{node}.json")));
        if let Some(saved) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
            let saved: State = serde_json::from_slice(&saved).map_err(|e| {
                format!(
                    "simulated GPU state {} is damaged: {e}",
                    path.as_ref()
                        .map(|p| p.display().to_string())
                        .unwrap_or_default()
                )
            })?;
            merge(&mut gpus, &saved);
        }
        let devices = state_dir.and_then(|d| {
            crate::sched::devices::sim::prepare(&d.join("dev"), node, gpus.len() as u32)
        });
        Ok(SimBackend {
            node: node.to_string(),
            state: Mutex::new(State { gpus }),
            path,
            devices,
            faults: Mutex::new(Faults {
                crash_at: std::env::var("GPUSLICE_SIM_CRASH")
                    .ok()
                    .and_then(|v| CrashPoint::parse(&v)),
                ..Faults::default()
            }),
        })
    }

    /// Fault injection: abort the process at `point` (see [`CrashPoint`]).
    pub fn crash_at(&self, point: Option<CrashPoint>) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .crash_at = point;
    }

    fn maybe_crash(&self, point: CrashPoint) {
        let armed = self
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .crash_at;
        if armed == Some(point) {
            eprintln!("gpuslice: injected crash at {point:?}");
            std::process::abort();
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

    /// Fault injection: the next create fails with `message`.
    pub fn fail_next_create(&self, message: &str) {
        self.faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fail_next_create = Some(message.to_string());
    }

    /// Fault injection: the GPU falls off the bus (or comes back).
    pub fn set_lost(&self, gpu_uuid: &str, lost: bool) {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        if lost {
            f.lost.insert(gpu_uuid.to_string());
        } else {
            f.lost.remove(gpu_uuid);
        }
    }

    /// Fault injection: every call takes this long.
    pub fn set_delay(&self, delay: Duration) {
        self.faults.lock().unwrap_or_else(|e| e.into_inner()).delay = delay;
    }

    /// Requests a MIG mode change; it takes effect at [`Self::reset`], as
    /// on real GPUs. Refused while GPU instances exist.
    pub fn set_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        self.with_gpu(gpu_uuid, |g| {
            if !g.instances.is_empty() {
                return Err(BackendError::NotEmpty {
                    gpu: g.uuid.clone(),
                });
            }
            let model = catalog::model(&g.model)
                .ok_or_else(|| BackendError::Driver(format!("unknown model {}", g.model)))?;
            if enabled && !model.mig_capable() {
                return Err(BackendError::Driver(format!(
                    "{} does not support MIG",
                    g.model
                )));
            }
            g.mig_pending = enabled;
            Ok(())
        })
    }

    /// A simulated GPU reset: a pending MIG mode takes effect.
    pub fn reset(&self, gpu_uuid: &str) -> Result<(), BackendError> {
        self.with_gpu(gpu_uuid, |g| {
            g.mig_current = g.mig_pending;
            g.instances.clear();
            g.processes.clear();
            Ok(())
        })
    }

    /// Test helper: a process starts using a device (GPU or MIG uuid).
    pub fn attach_process(
        &self,
        device_uuid: &str,
        pid: u32,
        used_memory_mib: u64,
    ) -> Result<(), BackendError> {
        let proc_ = GpuProcess {
            pid,
            used_memory_mib,
        };
        let real = !crate::sched::procfs::ended(pid);
        self.access(true, |state| {
            for g in &mut state.gpus {
                let target = if g.uuid == device_uuid {
                    Some(&mut g.processes)
                } else {
                    g.instances
                        .iter_mut()
                        .find(|i| i.device_uuid.as_deref() == Some(device_uuid))
                        .map(|i| &mut i.processes)
                };
                if let Some(list) = target {
                    list.push(proc_);
                    if real {
                        g.real_pids.push(pid);
                    }
                    return Ok(());
                }
            }
            Err(BackendError::NoSuchDevice(device_uuid.to_string()))
        })
    }

    /// Applies the injected delay; returns the GPUs now lost (by a test's
    /// fault or staged by `gpuslice sim set --lost`).
    fn pause(&self) -> HashSet<String> {
        let (delay, mut lost) = {
            let f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
            (f.delay, f.lost.clone())
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        if let Ok(staged) = self.access(false, |state| {
            Ok(state
                .gpus
                .iter()
                .filter(|g| g.staged.lost)
                .map(|g| g.uuid.clone())
                .collect::<Vec<_>>())
        }) {
            lost.extend(staged);
        }
        lost
    }

    /// `gpuslice sim set`: changes what GPU `index` reports (`change`
    /// edits the staged values). Works on a lost GPU too (`--found`).
    pub fn stage(&self, index: u32, change: impl FnOnce(&mut Staged)) -> Result<(), BackendError> {
        self.on_index(index, |g| {
            change(&mut g.staged);
            Ok(())
        })
    }

    /// `gpuslice sim clear`: the GPU reports its modelled values again,
    /// is found again, and undelivered events are dropped.
    pub fn clear(&self, index: u32) -> Result<(), BackendError> {
        self.on_index(index, |g| {
            g.staged = Staged::default();
            g.events.clear();
            Ok(())
        })
    }

    /// `gpuslice sim xid`: the driver reports an XID error on GPU `index`.
    pub fn raise_event(&self, index: u32, kind: EventKind, code: u64) -> Result<(), BackendError> {
        self.on_index(index, |g| {
            g.events.push((kind, code));
            Ok(())
        })
    }

    /// The uuid of GPU `index`.
    pub fn uuid_of(&self, index: u32) -> Result<String, BackendError> {
        self.on_index(index, |g| Ok(g.uuid.clone()))
    }

    fn on_index<T>(
        &self,
        index: u32,
        f: impl FnOnce(&mut SimGpu) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.access(true, |state| {
            let g = state
                .gpus
                .iter_mut()
                .find(|g| g.index == index)
                .ok_or_else(|| BackendError::NoSuchGpu(format!("index {index}")))?;
            f(g)
        })
    }

    /// Runs `f` on the state as the hardware holds it now. With a state
    /// file, the file is the hardware: several processes may drive one
    /// simulated node (as several tools share one real GPU), so the file is
    /// read again under an exclusive lock before `f`, and written back after
    /// it when `write` (and `f` succeeded).
    fn access<T>(
        &self,
        write: bool,
        f: impl FnOnce(&mut State) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let _held = match &self.path {
            Some(path) => {
                let lock = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(path.with_extension("lock"))
                    .and_then(|f| f.lock().map(|_| f))
                    .map_err(|e| {
                        BackendError::Driver(format!("cannot lock simulated GPU state: {e}"))
                    })?;
                if let Some(saved) = std::fs::read(path)
                    .ok()
                    .and_then(|b| serde_json::from_slice::<State>(&b).ok())
                {
                    merge(&mut state.gpus, &saved);
                }
                Some(lock)
            }
            None => None,
        };
        let out = f(&mut state)?;
        if write {
            self.save(&state)?;
        }
        Ok(out)
    }

    fn gpu<T>(
        &self,
        write: bool,
        gpu_uuid: &str,
        f: impl FnOnce(&mut SimGpu) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let lost = self.pause();
        if lost.contains(gpu_uuid) {
            return Err(BackendError::GpuLost(gpu_uuid.to_string()));
        }
        self.access(write, |state| {
            let g = state
                .gpus
                .iter_mut()
                .find(|g| g.uuid == gpu_uuid)
                .ok_or_else(|| BackendError::NoSuchGpu(gpu_uuid.to_string()))?;
            f(g)
        })
    }

    /// Changes one GPU.
    fn with_gpu<T>(
        &self,
        gpu_uuid: &str,
        f: impl FnOnce(&mut SimGpu) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.gpu(true, gpu_uuid, f)
    }

    /// Reads one GPU.
    fn read_gpu<T>(
        &self,
        gpu_uuid: &str,
        f: impl FnOnce(&SimGpu) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        self.gpu(false, gpu_uuid, |g| f(g))
    }

    /// Writes the state atomically (temporary file, then rename), so a crash
    /// leaves either the old or the new state, never half of one.
    fn save(&self, state: &State) -> Result<(), BackendError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let tmp = path.with_extension("json.tmp");
        let bytes =
            serde_json::to_vec_pretty(state).map_err(|e| BackendError::Driver(e.to_string()))?;
        std::fs::write(&tmp, bytes)
            .and_then(|_| std::fs::rename(&tmp, path))
            .map_err(|e| BackendError::Driver(format!("cannot save simulated GPU state: {e}")))
    }
}

fn to_instance(g: &SimGpu, i: &SimInstance) -> Instance {
    let profile = catalog::model(&g.model)
        .and_then(|m| m.profile_by_id(i.profile_id))
        .map(|p| p.name.clone())
        .unwrap_or_default();
    Instance {
        gpu_uuid: g.uuid.clone(),
        gi_id: i.gi_id,
        profile_id: i.profile_id,
        profile,
        placement: i.placement,
        ci_id: i.ci_id,
        device_uuid: i.device_uuid.clone(),
        foreign: false,
    }
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let lost = self.pause();
        self.access(false, |state| {
            Ok(state
                .gpus
                .iter()
                .filter(|g| !lost.contains(&g.uuid))
                .map(|g| {
                    let model = catalog::model(&g.model);
                    GpuInfo {
                        index: g.index,
                        uuid: g.uuid.clone(),
                        model: model.map(|m| m.id.to_string()),
                        product: format!("Simulated {}", g.model),
                        memory_mib: model.map(|m| (m.memory_gib * 1024.0) as u64).unwrap_or(0),
                        mig_current: g.mig_current,
                        mig_pending: g.mig_pending,
                    }
                })
                .collect())
        })
    }

    fn instances(&self, gpu_uuid: &str) -> Result<Vec<Instance>, BackendError> {
        self.read_gpu(gpu_uuid, |g| {
            let mut list: Vec<Instance> = g.instances.iter().map(|i| to_instance(g, i)).collect();
            list.sort_by_key(|i| i.placement.start);
            Ok(list)
        })
    }

    fn create_instance(
        &self,
        gpu_uuid: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<Instance, BackendError> {
        let injected = self
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .fail_next_create
            .take();
        self.maybe_crash(CrashPoint::BeforeCreate);
        let created = self.with_gpu(gpu_uuid, |g| {
            if let Some(msg) = injected {
                return Err(BackendError::Driver(msg));
            }
            if !g.mig_current {
                return Err(BackendError::NotMig(g.uuid.clone()));
            }
            let model = catalog::model(&g.model)
                .ok_or_else(|| BackendError::Driver(format!("unknown model {}", g.model)))?;
            let existing: Vec<Existing> = g
                .instances
                .iter()
                .map(|i| Existing {
                    profile_id: i.profile_id,
                    placement: i.placement,
                })
                .collect();
            mig::check_create(model, &existing, profile_id, placement)?;
            let gi_id = g.next_gi;
            g.next_gi += 1;
            g.instances.push(SimInstance {
                gi_id,
                profile_id,
                placement,
                ci_id: Some(0),
                device_uuid: Some(mig_uuid()),
                processes: Vec::new(),
            });
            let created = g.instances.last().map(|i| to_instance(g, i));
            created.ok_or_else(|| BackendError::Driver("instance vanished".into()))
        })?;
        self.maybe_crash(CrashPoint::AfterCreate);
        Ok(created)
    }

    fn destroy_instance(
        &self,
        gpu_uuid: &str,
        gi_id: u32,
        grace: Duration,
    ) -> Result<Vec<GpuProcess>, BackendError> {
        let holders = self.read_gpu(gpu_uuid, |g| {
            let i = g
                .instances
                .iter()
                .find(|i| i.gi_id == gi_id)
                .ok_or_else(|| BackendError::NoSuchInstance(g.uuid.clone(), gi_id))?;
            Ok(i.processes.clone())
        })?;
        if !holders.is_empty() {
            end_processes(&holders, grace);
        }
        self.with_gpu(gpu_uuid, |g| {
            g.instances.retain(|i| i.gi_id != gi_id);
            Ok(())
        })?;
        self.maybe_crash(CrashPoint::AfterDestroy);
        Ok(holders)
    }

    fn processes(&self, device_uuid: &str) -> Result<Vec<GpuProcess>, BackendError> {
        let lost = self.pause();
        let mut observed: Vec<GpuProcess> = self
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observed
            .get(device_uuid)
            .into_iter()
            .flatten()
            .map(|&pid| GpuProcess {
                pid,
                used_memory_mib: 0,
            })
            .collect();
        // Processes with a context on the stand-in libcuda's simulated GPU
        // that were given this device, as NVML lists processes with a
        // context (only where a test or the demo points at its state).
        if std::env::var_os(gpuslice_cuda::standin::ENV_STATE).is_some() {
            observed.extend(
                gpuslice_cuda::standin::read()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|p| p.device == device_uuid)
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_memory_mib: p.mem >> 20,
                    }),
            );
        }
        self.access(false, |state| {
            for g in &state.gpus {
                if g.uuid == device_uuid {
                    if lost.contains(&g.uuid) {
                        return Err(BackendError::GpuLost(g.uuid.clone()));
                    }
                    let mut all = g.processes.clone();
                    all.extend(g.instances.iter().flat_map(|i| i.processes.clone()));
                    all.retain(|p| {
                        !(g.real_pids.contains(&p.pid) && crate::sched::procfs::ended(p.pid))
                    });
                    all.extend(observed.iter().cloned());
                    return Ok(all);
                }
                if let Some(i) = g
                    .instances
                    .iter()
                    .find(|i| i.device_uuid.as_deref() == Some(device_uuid))
                {
                    if lost.contains(&g.uuid) {
                        return Err(BackendError::GpuLost(g.uuid.clone()));
                    }
                    let mut all = i.processes.clone();
                    all.retain(|p| {
                        !(g.real_pids.contains(&p.pid) && crate::sched::procfs::ended(p.pid))
                    });
                    all.extend(observed.iter().cloned());
                    return Ok(all);
                }
            }
            Err(BackendError::NoSuchDevice(device_uuid.to_string()))
        })
    }

    fn node_devices(&self) -> Option<crate::sched::devices::NodeDevices> {
        self.devices.clone()
    }

    fn device_nodes(
        &self,
        device_uuid: &str,
    ) -> Result<Vec<crate::sched::devices::DeviceNode>, BackendError> {
        let Some(nd) = &self.devices else {
            return Ok(Vec::new());
        };
        let (index, mig) = self.access(false, |state| {
            for g in &state.gpus {
                if g.uuid == device_uuid {
                    return Ok((g.index, None));
                }
                if let Some(i) = g
                    .instances
                    .iter()
                    .find(|i| i.device_uuid.as_deref() == Some(device_uuid))
                {
                    return Ok((g.index, Some((i.gi_id, i.ci_id.unwrap_or(0)))));
                }
            }
            Err(BackendError::NoSuchDevice(device_uuid.to_string()))
        })?;
        nd.for_device(index, mig).ok_or_else(|| {
            BackendError::Driver(format!(
                "no capability device files for GPU {index} instance {mig:?}"
            ))
        })
    }

    /// The simulated node resets an idle GPU right away, so the new mode
    /// takes effect at once (a real node needs its operator's reset).
    fn switch_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        self.set_mig_mode(gpu_uuid, enabled)?;
        self.reset(gpu_uuid)
    }

    fn telemetry(&self, gpu_uuid: &str) -> Result<Telemetry, BackendError> {
        let observed = self
            .faults
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observed
            .clone();
        let seen =
            |uuid: &str, procs: &[GpuProcess]| procs.len() + observed.get(uuid).map_or(0, Vec::len);
        self.read_gpu(gpu_uuid, |g| {
            let model = catalog::model(&g.model);
            let total = model.map(|m| (m.memory_gib * 1024.0) as u64).unwrap_or(0);
            let loads: Vec<Load> = if g.mig_current {
                g.instances
                    .iter()
                    .filter_map(|i| {
                        let p = model?.profile_by_id(i.profile_id)?;
                        let uuid = i.device_uuid.as_deref()?;
                        Some(Load {
                            device_uuid: uuid,
                            compute_fraction: f64::from(p.compute_slices)
                                / f64::from(model?.compute_slices.max(1)),
                            memory_total_mib: (p.memory_gib * 1024.0) as u64,
                            memory_used_mib: i.processes.iter().map(|p| p.used_memory_mib).sum(),
                            processes: seen(uuid, &i.processes),
                        })
                    })
                    .collect()
            } else {
                vec![Load {
                    device_uuid: &g.uuid,
                    compute_fraction: 1.0,
                    memory_total_mib: total,
                    memory_used_mib: g.processes.iter().map(|p| p.used_memory_mib).sum(),
                    processes: seen(&g.uuid, &g.processes),
                }]
            };
            let mut t = model_telemetry(&g.model, g.mig_current, total, &loads);
            g.staged.apply(&mut t);
            Ok(t)
        })
    }

    fn wait_events(&self, timeout: Duration) -> Result<Vec<GpuEvent>, BackendError> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let has = self.access(false, |state| {
                Ok(state.gpus.iter().any(|g| !g.events.is_empty()))
            })?;
            if has {
                return self.access(true, |state| {
                    Ok(state
                        .gpus
                        .iter_mut()
                        .flat_map(|g| {
                            let uuid = g.uuid.clone();
                            g.events.drain(..).map(move |(kind, code)| GpuEvent {
                                gpu_uuid: uuid.clone(),
                                kind,
                                code,
                            })
                        })
                        .collect())
                });
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(Vec::new());
            }
            std::thread::sleep(left.min(Duration::from_millis(500)));
        }
    }

    fn observe_processes(&self, by_device: &HashMap<String, Vec<u32>>) {
        let mut f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
        f.observed = by_device
            .iter()
            .filter(|(_, p)| !p.is_empty())
            .map(|(d, p)| (d.clone(), p.clone()))
            .collect();
    }
}
