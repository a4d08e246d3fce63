//! What the worker needs from GPUs, as one trait with two implementations:
//! [`super::sim::SimBackend`] (a faithful model) and the NVML backend.
//! Calls are blocking (NVML is); async callers use `spawn_blocking`.

use std::time::Duration;

use super::catalog::Placement;
use super::codes;
use super::mig::MigError;

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    /// Catalog model id (`H100-80GB`); `None` for a model gpuslice does not know.
    pub model: Option<String>,
    /// The driver's product name.
    pub product: String,
    pub memory_mib: u64,
    pub mig_current: bool,
    pub mig_pending: bool,
}

impl GpuInfo {
    /// The MIG mode changes at the next GPU reset.
    pub fn mode_change_pending(&self) -> bool {
        self.mig_current != self.mig_pending
    }
}

/// A GPU instance with its compute instance, as the hardware has it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Instance {
    pub gpu_uuid: String,
    /// NVML's GPU-instance id on that GPU.
    pub gi_id: u32,
    pub profile_id: u32,
    pub profile: String,
    pub placement: Placement,
    /// The compute instance, once created.
    pub ci_id: Option<u32>,
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, once a compute instance exists.
    pub device_uuid: Option<String>,
    /// Made by someone else (`nvidia-smi`, another tool): not the one
    /// full-size compute instance gpuslice makes, or a profile the catalog
    /// lacks. Its slots are taken; reconcile reports it and leaves it.
    #[serde(default)]
    pub foreign: bool,
}

/// A process using a GPU or MIG device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    pub used_memory_mib: u64,
}

/// A telemetry sample of one GPU; fields the hardware does not give are
/// `None` (whole-GPU utilisation in MIG mode, power on some boards, ECC on
/// boards without it).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Telemetry {
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    pub utilization_pct: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    /// Uncorrectable (double-bit) ECC errors since the last reset (volatile).
    pub ecc_uncorrectable: Option<u64>,
    pub sm_clock_mhz: Option<u32>,
    pub mem_clock_mhz: Option<u32>,
    /// Its MIG devices (MIG mode only).
    pub devices: Vec<DeviceSample>,
}

/// Telemetry of one MIG device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceSample {
    /// `MIG-...`
    pub device_uuid: String,
    pub memory_used_mib: u64,
    pub memory_total_mib: u64,
    /// Where the driver reports it (GPM on Hopper and newer).
    pub utilization_pct: Option<u32>,
}

/// What the driver pushes rather than being asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// An XID error; the code says which.
    Xid,
    /// A double-bit ECC error.
    EccUncorrectable,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Xid => "xid",
            EventKind::EccUncorrectable => "ecc_uncorrectable",
        }
    }
}

/// One driver event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct GpuEvent {
    pub gpu_uuid: String,
    pub kind: EventKind,
    /// The XID code; the error count for ECC events.
    pub code: u64,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error("{0}")]
    Mig(#[from] MigError),
    #[error("no GPU with uuid {0}")]
    NoSuchGpu(String),
    #[error("GPU {0} has no GPU instance {1}")]
    NoSuchInstance(String, u32),
    #[error("no MIG device with uuid {0}")]
    NoSuchDevice(String),
    #[error("GPU {0} is not in MIG mode")]
    NotMig(String),
    #[error("GPU {gpu} still has GPU instances; destroy them before changing the MIG mode")]
    NotEmpty { gpu: String },
    #[error("GPU {0} has fallen off the bus (lost)")]
    GpuLost(String),
    #[error("{call}: {message}")]
    Nvml {
        call: &'static str,
        code: u32,
        message: String,
    },
    #[error("the driver refused: {0}")]
    Driver(String),
}

impl BackendError {
    /// The NVML return code this error stands for, where there is one, so
    /// that both backends can be held to the same answers.
    pub fn nvml_code(&self) -> Option<u32> {
        match self {
            BackendError::Mig(m) => Some(m.nvml_code()),
            BackendError::Nvml { code, .. } => Some(*code),
            BackendError::NoSuchGpu(_)
            | BackendError::NoSuchInstance(..)
            | BackendError::NoSuchDevice(_) => Some(codes::NOT_FOUND),
            BackendError::NotMig(_) => Some(codes::NOT_SUPPORTED),
            BackendError::NotEmpty { .. } => Some(codes::IN_USE),
            BackendError::GpuLost(_) => Some(codes::GPU_IS_LOST),
            BackendError::Driver(_) => None,
        }
    }
}

/// The GPUs of one node.
pub trait GpuBackend: Send + Sync {
    /// `sim` or `nvml`.
    fn kind(&self) -> &'static str;

    /// The GPUs this backend manages.
    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError>;

    /// GPU instances present on a GPU, by placement.
    fn instances(&self, gpu_uuid: &str) -> Result<Vec<Instance>, BackendError>;

    /// Creates a GPU instance of `profile_id` at `placement` and a compute
    /// instance spanning it; returns it with its MIG device uuid.
    fn create_instance(
        &self,
        gpu_uuid: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<Instance, BackendError>;

    /// Destroys a GPU instance. Processes on it are asked to end (SIGTERM),
    /// killed after `grace`, and returned; then the compute instance and the
    /// GPU instance are destroyed.
    fn destroy_instance(
        &self,
        gpu_uuid: &str,
        gi_id: u32,
        grace: Duration,
    ) -> Result<Vec<GpuProcess>, BackendError>;

    /// Processes on a GPU (its uuid) or MIG device (its `MIG-` uuid).
    fn processes(&self, device_uuid: &str) -> Result<Vec<GpuProcess>, BackendError>;

    /// A telemetry sample of a GPU.
    fn telemetry(&self, gpu_uuid: &str) -> Result<Telemetry, BackendError>;

    /// Per-process GPU utilisation, `(pid, SM %)`, sampled since `since_us`
    /// (CPU clock, microseconds), where the driver reports it; `None` where
    /// it does not (the simulation, older boards), and the time-slice
    /// scheduler then measures a share by its cgroup's CPU time.
    fn process_utilization(
        &self,
        _gpu_uuid: &str,
        _since_us: u64,
    ) -> Result<Option<Vec<(u32, u32)>>, BackendError> {
        Ok(None)
    }

    /// Waits up to `timeout` for driver events (XID and double-bit ECC
    /// errors; NVML's event set) and returns them; an empty list when none
    /// came. Backends without events sleep out the timeout.
    fn wait_events(&self, timeout: Duration) -> Result<Vec<GpuEvent>, BackendError> {
        std::thread::sleep(timeout);
        Ok(Vec::new())
    }

    /// The processes the worker found in bookings' cgroups, by device
    /// uuid: the whole picture each round (a device not named has none).
    /// Real hardware sees them by itself; the simulation learns of them
    /// here, so that its load follows them.
    fn observe_processes(&self, _by_device: &std::collections::HashMap<String, Vec<u32>>) {}

    /// The node's NVIDIA device numbering, for confining bookings to their
    /// device files; `None` where it is unknown (no driver loaded).
    fn node_devices(&self) -> Option<crate::sched::devices::NodeDevices> {
        None
    }

    /// The device files a process using `device_uuid` (a GPU, or a MIG
    /// device) opens: control, UVM, its GPU and, for MIG, its GPU-instance
    /// and compute-instance capabilities. Empty where the numbering is
    /// unknown.
    fn device_nodes(
        &self,
        _device_uuid: &str,
    ) -> Result<Vec<crate::sched::devices::DeviceNode>, BackendError> {
        Ok(Vec::new())
    }

    /// Switches an empty GPU's MIG mode on an admin's request. The change
    /// may stay pending until the GPU is reset (`GpuInfo::mig_pending`).
    fn switch_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError>;
}

/// Ends processes holding a device: SIGTERM, then SIGKILL after `grace`
/// for those still alive. Used by both backends.
pub fn end_processes(processes: &[GpuProcess], grace: Duration) {
    use crate::sched::procfs;
    // Held by pidfd: a pid reused during the grace period is never
    // signalled.
    let held: Vec<(u32, std::os::fd::OwnedFd)> = processes
        .iter()
        .filter_map(|p| procfs::pidfd(p.pid).map(|fd| (p.pid, fd)))
        .collect();
    let alive = |(pid, fd): &&(u32, std::os::fd::OwnedFd)| {
        procfs::pidfd_signal(fd, 0) && !procfs::ended(*pid)
    };
    for (_, fd) in &held {
        procfs::pidfd_signal(fd, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + grace;
    while std::time::Instant::now() < deadline && held.iter().any(|h| alive(&h)) {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (_, fd) in held.iter().filter(alive) {
        procfs::pidfd_signal(fd, libc::SIGKILL);
    }
}
