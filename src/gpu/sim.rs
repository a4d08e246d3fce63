//! The simulated backend: a faithful model of a node's GPUs built from the
//! fleet file. It applies NVIDIA's MIG rules through [`super::mig`] (the same
//! code the stand-in `libnvidia-ml` uses), keeps MIG mode changes pending
//! until a simulated reset, and keeps its hardware state in the data
//! directory, so a restarted gpuslice finds the instances it left, as on
//! real GPUs. Faults can be injected for tests.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::backend::{
    end_processes, BackendError, GpuBackend, GpuInfo, GpuProcess, Instance, Telemetry,
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
        Ok(SimBackend {
            node: node.to_string(),
            state: Mutex::new(State { gpus }),
            path,
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
        self.access(true, |state| {
            for g in &mut state.gpus {
                if g.uuid == device_uuid {
                    g.processes.push(proc_);
                    return Ok(());
                }
                if let Some(i) = g
                    .instances
                    .iter_mut()
                    .find(|i| i.device_uuid.as_deref() == Some(device_uuid))
                {
                    i.processes.push(proc_);
                    return Ok(());
                }
            }
            Err(BackendError::NoSuchDevice(device_uuid.to_string()))
        })
    }

    /// Applies the injected delay; returns the GPUs now lost.
    fn pause(&self) -> HashSet<String> {
        let (delay, lost) = {
            let f = self.faults.lock().unwrap_or_else(|e| e.into_inner());
            (f.delay, f.lost.clone())
        };
        if !delay.is_zero() {
            std::thread::sleep(delay);
        }
        lost
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
        self.access(false, |state| {
            for g in &state.gpus {
                if g.uuid == device_uuid {
                    if lost.contains(&g.uuid) {
                        return Err(BackendError::GpuLost(g.uuid.clone()));
                    }
                    let mut all = g.processes.clone();
                    all.extend(g.instances.iter().flat_map(|i| i.processes.clone()));
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
                    return Ok(i.processes.clone());
                }
            }
            Err(BackendError::NoSuchDevice(device_uuid.to_string()))
        })
    }

    /// The simulated node resets an idle GPU right away, so the new mode
    /// takes effect at once (a real node needs its operator's reset).
    fn switch_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        self.set_mig_mode(gpu_uuid, enabled)?;
        self.reset(gpu_uuid)
    }

    fn telemetry(&self, gpu_uuid: &str) -> Result<Telemetry, BackendError> {
        self.read_gpu(gpu_uuid, |g| {
            let model = catalog::model(&g.model);
            let procs: Vec<&GpuProcess> = g
                .processes
                .iter()
                .chain(g.instances.iter().flat_map(|i| i.processes.iter()))
                .collect();
            let busy = procs.len() as u32;
            Ok(Telemetry {
                memory_used_mib: procs.iter().map(|p| p.used_memory_mib).sum(),
                memory_total_mib: model.map(|m| (m.memory_gib * 1024.0) as u64).unwrap_or(0),
                // Whole-GPU utilisation is not defined per MIG device before
                // Hopper's GPM; the simulation reports it only outside MIG.
                utilization_pct: (!g.mig_current).then_some((busy * 35).min(100)),
                temperature_c: Some(34 + busy * 6),
                power_w: Some(60.0 + f64::from(busy) * 90.0),
            })
        })
    }
}
