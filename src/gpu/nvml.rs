//! The NVML backend: real GPUs through nvml-wrapper 0.13.
//!
//! Safe wrapper calls where the crate has them (inventory, MIG mode, memory,
//! processes, telemetry). GPU- and compute-instance create, destroy, list and
//! info are not wrapped: they go through the raw symbols of `nvml.lib()`,
//! whose fields are `Result<fn, _>` (a missing symbol is an error here, never
//! a panic). `possible_placements()` is not used (0.13 returns an empty
//! list); placements come from the catalog and NVML enforces them.
//!
//! It manages only the GPUs it is told to, and changes a MIG mode only when
//! the admin setting allows it.

use std::ffi::{c_char, c_uint, CStr};
use std::path::Path;
use std::ptr;
use std::time::Duration;

use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings as sys;

use super::backend::{
    end_processes, BackendError, DeviceSample, EventKind, GpuBackend, GpuEvent, GpuInfo,
    GpuProcess, Instance, Telemetry,
};
use super::catalog::{self, Model, Placement};

use super::codes::{INVALID_ARGUMENT, IN_USE, NOT_FOUND, NOT_SUPPORTED, SUCCESS};

/// The GPUs of this node as NVML sees them.
pub struct NvmlBackend {
    nvml: Nvml,
    /// The uuids of the GPUs to manage, resolved once at start; `None`: all.
    managed: Option<std::collections::HashSet<String>>,
    allow_mode_change: bool,
    /// The event set (XID and double-bit ECC errors of the managed GPUs),
    /// made at the first [`GpuBackend::wait_events`]; the raw handle.
    events: std::sync::Mutex<Option<usize>>,
    /// The node's NVIDIA device numbering (`/proc/devices`, `mig-minors`).
    devices: Option<crate::sched::devices::NodeDevices>,
    /// GPU-instance profiles per GPU uuid, as its driver reports them.
    profiles: std::sync::Mutex<std::collections::HashMap<String, Vec<GiProfile>>>,
}

impl Drop for NvmlBackend {
    fn drop(&mut self) {
        let set = *self.events.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(set), Ok(free)) = (set, self.nvml.lib().nvmlEventSetFree.as_ref()) {
            // SAFETY: the set was made by nvmlEventSetCreate and is freed once.
            unsafe {
                free(set as sys::nvmlEventSet_t);
            }
        }
    }
}

/// A raw NVML symbol by its name: `sym!(self, nvmlDeviceGetUUID)` is
/// `self.raw("nvmlDeviceGetUUID", &self.nvml.lib().nvmlDeviceGetUUID)`, an
/// error (not a panic) when the library lacks it.
macro_rules! sym {
    ($self:expr, $name:ident) => {
        $self.raw(stringify!($name), &$self.nvml.lib().$name)
    };
}

/// `nvmlEventTypeDoubleBitEccError` and `nvmlEventTypeXidCriticalError`.
const EVENT_DBE: u64 = 0x2;
const EVENT_XID: u64 = 0x8;
/// `NVML_ERROR_TIMEOUT`: no event came in time.
const TIMEOUT: u32 = 10;
/// `NVML_ERROR_RESET_REQUIRED`.
const RESET_REQUIRED: u32 = 16;

/// The compute-instance profile enum that spans a GPU instance of `slices`
/// (`NVML_COMPUTE_INSTANCE_PROFILE_*_SLICE`).
fn ci_profile_enum(slices: u8) -> u32 {
    match slices {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        7 => 4,
        8 => 5,
        _ => 6,
    }
}

/// Turns the configured GPU list (uuids or indexes) into uuids; a name
/// that matches no GPU here is a configuration error.
fn resolve_managed(
    nvml: &Nvml,
    names: &[String],
) -> Result<std::collections::HashSet<String>, String> {
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let mut gpus = Vec::new();
    for i in 0..count {
        let uuid = nvml
            .device_by_index(i)
            .and_then(|d| d.uuid())
            .map_err(|e| format!("NVML: GPU {i}: {e}"))?;
        gpus.push((i.to_string(), uuid));
    }
    names
        .iter()
        .map(|n| {
            gpus.iter()
                .find(|(i, u)| i == n || u == n)
                .map(|(_, u)| u.clone())
                .ok_or_else(|| {
                    format!("GPUSLICE_NVML_GPUS names \"{n}\", which is no GPU on this node")
                })
        })
        .collect()
}

impl NvmlBackend {
    /// Loads NVML from `lib` (or the system's `libnvidia-ml.so.1`).
    pub fn open(
        lib: Option<&Path>,
        managed: Option<Vec<String>>,
        allow_mode_change: bool,
    ) -> Result<NvmlBackend, String> {
        let nvml = match lib {
            Some(p) => Nvml::builder().lib_path(p.as_os_str()).init(),
            None => Nvml::init(),
        };
        let nvml = nvml.map_err(|e| match e {
            NvmlError::LibloadingError(_) => format!(
                "the NVIDIA management library could not be loaded{}: install the NVIDIA driver, set GPUSLICE_NVML_LIB, or use GPUSLICE_BACKEND=sim",
                lib.map(|p| format!(" from {}", p.display())).unwrap_or_default()
            ),
            other => format!("NVML did not initialise: {other}"),
        })?;
        let managed = match managed {
            None => None,
            Some(names) => Some(resolve_managed(&nvml, &names)?),
        };
        Ok(NvmlBackend {
            nvml,
            managed,
            allow_mode_change,
            events: std::sync::Mutex::new(None),
            devices: crate::sched::devices::NodeDevices::detect(),
            profiles: Default::default(),
        })
    }

    /// What this process may not do with the MIG GPUs it manages, as the
    /// user it runs as (listing instances and placements are privileged
    /// NVML calls; creating and destroying need root or NVIDIA's
    /// `mig-config` capability). Empty when nothing is missing. Read-only.
    pub fn missing_privileges(&self, gpus: &[GpuInfo]) -> Vec<&'static str> {
        const NO_PERMISSION: u32 = 4;
        let mut missing = Vec::new();
        let lib = self.nvml.lib();
        for g in gpus.iter().filter(|g| g.mig_current) {
            let Ok(d) = self.device(&g.uuid) else {
                continue;
            };
            // SAFETY: a handle of this Nvml.
            let dev = unsafe { d.handle() };
            let Ok(profiles) = self.gi_profiles(&g.uuid, dev) else {
                missing.push("read MIG profiles");
                break;
            };
            let Some(p) = profiles.first() else { continue };
            if let (Ok(list), Ok(place)) = (
                lib.nvmlDeviceGetGpuInstances.as_ref(),
                lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2.as_ref(),
            ) {
                // SAFETY: live locals of the prototypes' types.
                let (r1, r2) = unsafe {
                    let mut gis: [sys::nvmlGpuInstance_t; 8] = [ptr::null_mut(); 8];
                    let mut n: c_uint = 8;
                    let r1 = list(dev, p.id, gis.as_mut_ptr(), &mut n);
                    let mut pl: [sys::nvmlGpuInstancePlacement_t; 8] = std::mem::zeroed();
                    let mut m: c_uint = 8;
                    (r1, place(dev, p.id, pl.as_mut_ptr(), &mut m))
                };
                if r1 == NO_PERMISSION {
                    missing.push("list MIG instances");
                }
                if r2 == NO_PERMISSION {
                    missing.push("read MIG placements");
                }
            }
            break;
        }
        if !gpus.iter().any(|g| g.mig_current) {
            return missing;
        }
        let root = nix::unistd::geteuid().is_root();
        let config = std::path::Path::new("/proc/driver/nvidia/capabilities/mig/config");
        if !root && nix::unistd::access(config, nix::unistd::AccessFlags::R_OK).is_err() {
            missing.push("create or destroy MIG instances");
        }
        missing
    }

    /// Uses `devices` as the node's device numbering (tests of the
    /// stand-in library, which has no driver behind it).
    pub fn with_devices(mut self, devices: crate::sched::devices::NodeDevices) -> Self {
        self.devices = Some(devices);
        self
    }

    fn raw<'a, F>(
        &self,
        name: &'static str,
        f: &'a Result<F, libloading::Error>,
    ) -> Result<&'a F, BackendError> {
        f.as_ref()
            .map_err(|_| BackendError::Driver(format!("{name} is missing from the NVML library")))
    }

    /// The event set for XID and double-bit ECC errors of the managed
    /// GPUs, made once. A GPU that cannot report an event type (NVML says
    /// not supported) is left out of it, with a log line.
    fn event_set(&self) -> Result<usize, BackendError> {
        let mut held = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(set) = *held {
            return Ok(set);
        }
        let create = sym!(self, nvmlEventSetCreate)?;
        let register = sym!(self, nvmlDeviceRegisterEvents)?;
        let mut set: sys::nvmlEventSet_t = ptr::null_mut();
        // SAFETY: `set` is a local of the prototype's type.
        self.check("nvmlEventSetCreate", unsafe { create(&mut set) })?;
        let count = self
            .nvml
            .device_count()
            .map_err(|e| BackendError::Driver(e.to_string()))?;
        for i in 0..count {
            let Ok(d) = self.nvml.device_by_index(i) else {
                continue;
            };
            let Ok(uuid) = d.uuid() else { continue };
            if !self.managed(&uuid) {
                continue;
            }
            for (kind, name) in [(EVENT_XID, "XID"), (EVENT_DBE, "double-bit ECC")] {
                // SAFETY: the device handle and `set` are live.
                let r = unsafe { register(d.handle(), kind, set) };
                if r != SUCCESS {
                    tracing::warn!(gpu = %uuid, code = r, "{name} events are not available on this GPU");
                }
            }
        }
        *held = Some(set as usize);
        Ok(set as usize)
    }

    fn check(&self, call: &'static str, ret: u32) -> Result<(), BackendError> {
        if ret == SUCCESS {
            return Ok(());
        }
        let message = match self.nvml.lib().nvmlErrorString.as_ref() {
            // SAFETY: nvmlErrorString returns a static NUL-terminated string.
            Ok(f) => unsafe { CStr::from_ptr(f(ret)) }
                .to_string_lossy()
                .to_string(),
            Err(_) => format!("error {ret}"),
        };
        Err(BackendError::Nvml {
            call,
            code: ret,
            message,
        })
    }

    fn device(&self, uuid: &str) -> Result<Device<'_>, BackendError> {
        self.nvml.device_by_uuid(uuid).map_err(|e| match e {
            NvmlError::NotFound | NvmlError::InvalidArg => {
                BackendError::NoSuchGpu(uuid.to_string())
            }
            NvmlError::GpuLost => BackendError::GpuLost(uuid.to_string()),
            other => BackendError::Driver(other.to_string()),
        })
    }

    fn info(&self, index: u32, d: &Device<'_>) -> Result<GpuInfo, BackendError> {
        let drv = |e: NvmlError| BackendError::Driver(e.to_string());
        let product = d.name().map_err(drv)?;
        let uuid = d.uuid().map_err(drv)?;
        // A MIG parent's memory is a privileged call: without it, the
        // product name alone picks the model and the catalog gives its size.
        let measured = d.memory_info().ok().map(|m| m.total / (1024 * 1024));
        let (mig_current, mig_pending) = match d.mig_mode() {
            Ok(m) => (m.current == 1, m.pending == 1),
            Err(NvmlError::NotSupported) => (false, false),
            Err(e) => return Err(drv(e)),
        };
        let found = catalog::model_for_product(&product, measured.unwrap_or(0) as f64 / 1024.0);
        let memory_mib = measured
            .or(found.map(|m| (m.memory_gib * 1024.0) as u64))
            .unwrap_or(0);
        let model = found.map(|m| m.id.to_string());
        Ok(GpuInfo {
            index,
            uuid,
            model,
            product,
            memory_mib,
            mig_current,
            mig_pending,
        })
    }

    fn model_of(&self, d: &Device<'_>) -> Result<&'static Model, BackendError> {
        let product = d.name().map_err(|e| BackendError::Driver(e.to_string()))?;
        // Privileged for a MIG parent: without it, the product name decides.
        let mib = d
            .memory_info()
            .map(|m| m.total / (1024 * 1024))
            .unwrap_or(0);
        catalog::model_for_product(&product, mib as f64 / 1024.0).ok_or_else(|| {
            BackendError::Driver(format!("{product} is not in the gpuslice catalog"))
        })
    }

    fn managed(&self, uuid: &str) -> bool {
        self.managed.as_ref().is_none_or(|m| m.contains(uuid))
    }

    /// Refuses GPUs this node was not told to manage.
    fn check_managed(&self, uuid: &str) -> Result<(), BackendError> {
        if self.managed(uuid) {
            Ok(())
        } else {
            Err(BackendError::NoSuchGpu(uuid.to_string()))
        }
    }

    /// (gi id, ci id) -> MIG device uuid, over the GPU's MIG devices.
    fn mig_uuids(&self, dev: sys::nvmlDevice_t) -> Result<Vec<(u32, u32, String)>, BackendError> {
        let max_count = sym!(self, nvmlDeviceGetMaxMigDeviceCount)?;
        let by_index = sym!(self, nvmlDeviceGetMigDeviceHandleByIndex)?;
        let gi_id = sym!(self, nvmlDeviceGetGpuInstanceId)?;
        let ci_id = sym!(self, nvmlDeviceGetComputeInstanceId)?;
        let get_uuid = sym!(self, nvmlDeviceGetUUID)?;
        let mut out = Vec::new();
        // SAFETY: every pointer passed points at a live local of the type
        // the NVML prototype names; buffers carry their true length.
        unsafe {
            let mut max: c_uint = 0;
            self.check("nvmlDeviceGetMaxMigDeviceCount", max_count(dev, &mut max))?;
            for i in 0..max {
                let mut mig: sys::nvmlDevice_t = ptr::null_mut();
                let r = by_index(dev, i, &mut mig);
                // An empty index (NOT_FOUND) or one the driver will not hand
                // out (INVALID_ARGUMENT) is skipped, as NVIDIA's go-nvlib does.
                if r == NOT_FOUND || r == INVALID_ARGUMENT {
                    continue;
                }
                self.check("nvmlDeviceGetMigDeviceHandleByIndex", r)?;
                let (mut g, mut c) = (0, 0);
                self.check("nvmlDeviceGetGpuInstanceId", gi_id(mig, &mut g))?;
                self.check("nvmlDeviceGetComputeInstanceId", ci_id(mig, &mut c))?;
                let mut buf = [0 as c_char; 96];
                self.check(
                    "nvmlDeviceGetUUID",
                    get_uuid(mig, buf.as_mut_ptr(), buf.len() as c_uint),
                )?;
                out.push((
                    g,
                    c,
                    CStr::from_ptr(buf.as_ptr()).to_string_lossy().to_string(),
                ));
            }
        }
        Ok(out)
    }

    /// The GPU-instance profiles this GPU's driver knows: every enum up to
    /// `MAX_PROFILE_ENUMS` (past the newest `nvml.h`'s count), skipping
    /// the enums it answers `INVALID_ARGUMENT` (past its own count) or
    /// `NOT_SUPPORTED` (not on this GPU) for, as NVIDIA's mig-parted and
    /// go-nvlib do; not only the catalog's, so instances of any profile are
    /// seen. Asked once per GPU and kept (an empty answer, MIG off, is not).
    fn gi_profiles(
        &self,
        uuid: &str,
        dev: sys::nvmlDevice_t,
    ) -> Result<Vec<GiProfile>, BackendError> {
        if let Some(p) = self
            .profiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uuid)
        {
            return Ok(p.clone());
        }
        let info = sym!(self, nvmlDeviceGetGpuInstanceProfileInfo)?;
        let mut out = Vec::new();
        for e in 0..MAX_PROFILE_ENUMS {
            // SAFETY: `dev` came from NVML; `p` is a live local.
            let (r, p) = unsafe {
                let mut p: sys::nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
                (info(dev, e, &mut p), p)
            };
            match r {
                INVALID_ARGUMENT | NOT_SUPPORTED => continue,
                _ => self.check("nvmlDeviceGetGpuInstanceProfileInfo", r)?,
            }
            if out.iter().any(|x: &GiProfile| x.id == p.id) {
                continue;
            }
            out.push(GiProfile {
                id: p.id,
                slices: p.sliceCount,
                instance_count: p.instanceCount,
            });
        }
        if !out.is_empty() {
            self.profiles
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(uuid.to_string(), out.clone());
        }
        Ok(out)
    }

    /// Every compute instance of a GPU instance, whatever its profile:
    /// `(handle, ci id, compute slices)`. Compute-instance profile enums are
    /// walked like GPU-instance ones.
    fn compute_instances(
        &self,
        gi: sys::nvmlGpuInstance_t,
    ) -> Result<Vec<(sys::nvmlComputeInstance_t, u32, u32)>, BackendError> {
        let profile_info = sym!(self, nvmlGpuInstanceGetComputeInstanceProfileInfo)?;
        let list = sym!(self, nvmlGpuInstanceGetComputeInstances)?;
        let info = sym!(self, nvmlComputeInstanceGetInfo_v2)?;
        let mut out = Vec::new();
        for e in 0..MAX_PROFILE_ENUMS {
            // SAFETY: as in `mig_uuids`.
            unsafe {
                let mut p: sys::nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
                let r = profile_info(
                    gi,
                    e,
                    sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                    &mut p,
                );
                match r {
                    INVALID_ARGUMENT | NOT_SUPPORTED => continue,
                    _ => self.check("nvmlGpuInstanceGetComputeInstanceProfileInfo", r)?,
                }
                // Room for as many as the profile allows (nvml.h: the
                // buffer must be large enough).
                let mut cis: Vec<sys::nvmlComputeInstance_t> =
                    vec![ptr::null_mut(); p.instanceCount.max(8) as usize];
                let mut count: c_uint = cis.len() as c_uint;
                self.check(
                    "nvmlGpuInstanceGetComputeInstances",
                    list(gi, p.id, cis.as_mut_ptr(), &mut count),
                )?;
                for ci in &cis[..(count as usize).min(cis.len())] {
                    let mut i: sys::nvmlComputeInstanceInfo_t = std::mem::zeroed();
                    self.check("nvmlComputeInstanceGetInfo_v2", info(*ci, &mut i))?;
                    // Newer drivers offer alias profiles (1_SLICE_REV1,
                    // 7_SLICE_NVL) that list the same compute instances.
                    if !out.iter().any(|(_, id, _)| *id == i.id) {
                        out.push((*ci, i.id, p.sliceCount));
                    }
                }
            }
        }
        Ok(out)
    }

    /// One GPU instance as an [`Instance`]: its profile by the catalog
    /// (or `unknown-<id>`), its compute instance, and whether it is
    /// foreign — not the one full-size compute instance gpuslice makes.
    #[allow(clippy::too_many_arguments)]
    fn describe(
        &self,
        uuid: &str,
        model: &Model,
        profiles: &[GiProfile],
        uuids: &[(u32, u32, String)],
        gi: sys::nvmlGpuInstance_t,
    ) -> Result<Instance, BackendError> {
        let get_info = sym!(self, nvmlGpuInstanceGetInfo)?;
        // SAFETY: `gi` came from NVML; `info` is a live local.
        let info = unsafe {
            let mut info: sys::nvmlGpuInstanceInfo_t = std::mem::zeroed();
            self.check("nvmlGpuInstanceGetInfo", get_info(gi, &mut info))?;
            info
        };
        let slices = profiles
            .iter()
            .find(|p| p.id == info.profileId)
            .map(|p| p.slices);
        let cis = self.compute_instances(gi)?;
        let catalog = model.profile_by_id(info.profileId);
        let full = match (&cis[..], slices) {
            ([(_, ci, s)], Some(gs)) if *s == gs => Some(*ci),
            _ => None,
        };
        // No compute instance at all is gpuslice's own unfinished work (a
        // create or destroy cut short), which reconcile finishes.
        let foreign = catalog.is_none() || (!cis.is_empty() && full.is_none());
        let device_uuid = full.and_then(|c| {
            uuids
                .iter()
                .find(|(g, cc, _)| *g == info.id && *cc == c)
                .map(|x| x.2.clone())
        });
        Ok(Instance {
            gpu_uuid: uuid.to_string(),
            gi_id: info.id,
            profile_id: info.profileId,
            profile: catalog
                .map(|p| p.name.clone())
                .unwrap_or_else(|| format!("unknown-{}", info.profileId)),
            placement: Placement {
                start: info.placement.start as u8,
                size: info.placement.size as u8,
            },
            ci_id: full,
            device_uuid,
            foreign,
        })
    }

    fn list_instances(
        &self,
        uuid: &str,
    ) -> Result<Vec<(sys::nvmlGpuInstance_t, Instance)>, BackendError> {
        let d = self.device(uuid)?;
        let model = self.model_of(&d)?;
        let list = sym!(self, nvmlDeviceGetGpuInstances)?;
        // SAFETY: `handle` is the raw handle of a device of this Nvml.
        let dev = unsafe { d.handle() };
        let profiles = self.gi_profiles(uuid, dev)?;
        let uuids = self.mig_uuids(dev)?;
        let mut out = Vec::new();
        for p in &profiles {
            // SAFETY: as in `mig_uuids`.
            let gis = unsafe {
                let mut gis: Vec<sys::nvmlGpuInstance_t> =
                    vec![ptr::null_mut(); p.instance_count.max(8) as usize];
                let mut count: c_uint = gis.len() as c_uint;
                let r = list(dev, p.id, gis.as_mut_ptr(), &mut count);
                // A profile id this driver will not list (older drivers lack
                // some `+me` profiles): skipped with a log line, the listing
                // goes on.
                if r == INVALID_ARGUMENT || r == NOT_SUPPORTED {
                    tracing::warn!(gpu = %uuid, profile_id = p.id, code = r, "GPU-instance profile not listable; skipped");
                    continue;
                }
                self.check("nvmlDeviceGetGpuInstances", r)?;
                gis[..(count as usize).min(gis.len())].to_vec()
            };
            for gi in gis {
                out.push((gi, self.describe(uuid, model, &profiles, &uuids, gi)?));
            }
        }
        out.sort_by_key(|(_, i)| i.placement.start);
        Ok(out)
    }

    /// A GPU instance by id (`nvmlDeviceGetGpuInstanceById`), without a
    /// walk of every instance.
    fn instance_by_id(
        &self,
        uuid: &str,
        gi_id: u32,
    ) -> Result<(sys::nvmlGpuInstance_t, Instance), BackendError> {
        let d = self.device(uuid)?;
        let model = self.model_of(&d)?;
        let by_id = sym!(self, nvmlDeviceGetGpuInstanceById)?;
        // SAFETY: as in `mig_uuids`.
        let (dev, gi) = unsafe {
            let dev = d.handle();
            let mut gi: sys::nvmlGpuInstance_t = ptr::null_mut();
            let r = by_id(dev, gi_id, &mut gi);
            if r == NOT_FOUND || r == INVALID_ARGUMENT {
                return Err(BackendError::NoSuchInstance(uuid.to_string(), gi_id));
            }
            self.check("nvmlDeviceGetGpuInstanceById", r)?;
            (dev, gi)
        };
        let profiles = self.gi_profiles(uuid, dev)?;
        let uuids = self.mig_uuids(dev)?;
        Ok((gi, self.describe(uuid, model, &profiles, &uuids, gi)?))
    }

    /// Runs `call` until it stops answering `NVML_ERROR_IN_USE`, with
    /// backoff from 50 ms to 1 s, for at most `patience`.
    fn until_not_in_use(
        &self,
        name: &'static str,
        patience: Duration,
        mut call: impl FnMut() -> u32,
    ) -> Result<(), BackendError> {
        let deadline = std::time::Instant::now() + patience;
        let mut wait = Duration::from_millis(50);
        loop {
            let r = call();
            if r != IN_USE || std::time::Instant::now() >= deadline {
                return self.check(name, r);
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(1));
        }
    }
}

/// How long a destroy waits out `NVML_ERROR_IN_USE` after the device's
/// processes are gone.
pub const DESTROY_PATIENCE: Duration = Duration::from_secs(30);

/// Profile enums walked (the newest `nvml.h` counts 17 GPU-instance and 9
/// compute-instance profiles; room for drivers newer than it).
const MAX_PROFILE_ENUMS: u32 = 32;

/// A GPU-instance profile as the driver reports it.
#[derive(Debug, Clone)]
struct GiProfile {
    id: u32,
    slices: u32,
    /// Most instances of it on one GPU (sizes the listing buffer).
    instance_count: u32,
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn inventory(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|e| BackendError::Driver(e.to_string()))?;
        let mut out = Vec::new();
        for i in 0..count {
            let d = match self.nvml.device_by_index(i) {
                Ok(d) => d,
                // A GPU that fell off the bus is left out, like in the sim.
                Err(NvmlError::GpuLost) => continue,
                Err(e) => return Err(BackendError::Driver(e.to_string())),
            };
            let info = self.info(i, &d)?;
            if self.managed(&info.uuid) {
                out.push(info);
            }
        }
        Ok(out)
    }

    fn instances(&self, gpu_uuid: &str) -> Result<Vec<Instance>, BackendError> {
        self.check_managed(gpu_uuid)?;
        Ok(self
            .list_instances(gpu_uuid)?
            .into_iter()
            .map(|(_, i)| i)
            .collect())
    }

    fn create_instance(
        &self,
        gpu_uuid: &str,
        profile_id: u32,
        placement: Placement,
    ) -> Result<Instance, BackendError> {
        self.check_managed(gpu_uuid)?;
        let d = self.device(gpu_uuid)?;
        if !d.mig_mode().is_ok_and(|m| m.current == 1) {
            return Err(BackendError::NotMig(gpu_uuid.to_string()));
        }
        let model = self.model_of(&d)?;
        let create_gi = sym!(self, nvmlDeviceCreateGpuInstanceWithPlacement)?;
        let destroy_gi = sym!(self, nvmlGpuInstanceDestroy)?;
        let ci_info = sym!(self, nvmlGpuInstanceGetComputeInstanceProfileInfo)?;
        let create_ci = sym!(self, nvmlGpuInstanceCreateComputeInstance)?;
        // No guessing: a profile the catalog cannot size gets no compute
        // instance (checked once the driver has said what it thinks of it).
        let slices = model.profile_by_id(profile_id).map(|p| p.compute_slices);
        // SAFETY: as in `mig_uuids`.
        let gi_id = unsafe {
            let dev = d.handle();
            let pl = sys::nvmlGpuInstancePlacement_t {
                start: u32::from(placement.start),
                size: u32::from(placement.size),
            };
            let mut gi: sys::nvmlGpuInstance_t = ptr::null_mut();
            self.check(
                "nvmlDeviceCreateGpuInstanceWithPlacement",
                create_gi(dev, profile_id, &pl, &mut gi),
            )?;
            let mut p: sys::nvmlComputeInstanceProfileInfo_t = std::mem::zeroed();
            let mut ci: sys::nvmlComputeInstance_t = ptr::null_mut();
            let made = slices
                .ok_or_else(|| {
                    BackendError::Driver(format!(
                        "profile id {profile_id} is not in the catalog for {}; its compute slices are unknown",
                        model.id
                    ))
                })
                .and_then(|slices| {
                    self.check(
                    "nvmlGpuInstanceGetComputeInstanceProfileInfo",
                    ci_info(
                        gi,
                        ci_profile_enum(slices),
                        sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                        &mut p,
                    ),
                )
                })
                .and_then(|_| {
                    self.check(
                        "nvmlGpuInstanceCreateComputeInstance",
                        create_ci(gi, p.id, &mut ci),
                    )
                });
            if let Err(e) = made {
                // No half-made instance is left behind; if the driver will
                // not take it back, reconcile does later.
                let r = destroy_gi(gi);
                if r != SUCCESS {
                    tracing::warn!(gpu = %gpu_uuid, code = r, "a half-made GPU instance could not be destroyed; reconcile removes it");
                    return Err(BackendError::Driver(format!(
                        "{e}; the half-made GPU instance could not be destroyed (NVML code {r}) and is left for reconcile"
                    )));
                }
                return Err(e);
            }
            let mut info: sys::nvmlGpuInstanceInfo_t = std::mem::zeroed();
            let get_info = sym!(self, nvmlGpuInstanceGetInfo)?;
            self.check("nvmlGpuInstanceGetInfo", get_info(gi, &mut info))?;
            info.id
        };
        // By id: one booking does not cost a walk of every GPU instance.
        self.instance_by_id(gpu_uuid, gi_id)
            .map(|(_, i)| i)
            .map_err(|_| BackendError::Driver("the new GPU instance is not listed".into()))
    }

    fn destroy_instance(
        &self,
        gpu_uuid: &str,
        gi_id: u32,
        grace: Duration,
    ) -> Result<Vec<GpuProcess>, BackendError> {
        self.check_managed(gpu_uuid)?;
        let (gi, inst) = self.instance_by_id(gpu_uuid, gi_id)?;
        let holders = match &inst.device_uuid {
            Some(u) => self.processes(u)?,
            None => Vec::new(),
        };
        if !holders.is_empty() {
            end_processes(&holders, grace);
            // The driver lists a process until its context is torn down.
            if let Some(u) = &inst.device_uuid {
                let deadline = std::time::Instant::now() + grace + Duration::from_secs(5);
                while std::time::Instant::now() < deadline
                    && self.processes(u).is_ok_and(|p| !p.is_empty())
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        let destroy_ci = sym!(self, nvmlComputeInstanceDestroy)?;
        let destroy_gi = sym!(self, nvmlGpuInstanceDestroy)?;
        // A compute instance may stay busy a while after its last process
        // (NVIDIA's drivers on H100 and H200): IN_USE is waited out.
        for (ci, _, _) in self.compute_instances(gi)? {
            self.until_not_in_use("nvmlComputeInstanceDestroy", DESTROY_PATIENCE, || {
                // SAFETY: `ci` came from NVML for this GPU instance.
                unsafe { destroy_ci(ci) }
            })?;
        }
        self.until_not_in_use("nvmlGpuInstanceDestroy", DESTROY_PATIENCE, || {
            // SAFETY: `gi` came from NVML for this GPU.
            unsafe { destroy_gi(gi) }
        })
        .map_err(|e| {
            BackendError::Driver(format!(
                "{e}; GPU instance {gi_id} is left without compute instances and the next reconcile removes it"
            ))
        })?;
        Ok(holders)
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
        let is_mig = sym!(self, nvmlDeviceIsMigDeviceHandle)?;
        let parent_of = sym!(self, nvmlDeviceGetDeviceHandleFromMigDeviceHandle)?;
        let gi_id = sym!(self, nvmlDeviceGetGpuInstanceId)?;
        let ci_id = sym!(self, nvmlDeviceGetComputeInstanceId)?;
        let minor_of = sym!(self, nvmlDeviceGetMinorNumber)?;
        let d = self
            .nvml
            .device_by_uuid(device_uuid)
            .map_err(|_| BackendError::NoSuchDevice(device_uuid.to_string()))?;
        // SAFETY: the handle came from NVML; every out-pointer is a live
        // local of the type the prototype names.
        let (minor, mig) = unsafe {
            let dev = d.handle();
            let mut mig: c_uint = 0;
            self.check("nvmlDeviceIsMigDeviceHandle", is_mig(dev, &mut mig))?;
            let (gpu, ids) = if mig == 1 {
                let mut parent: sys::nvmlDevice_t = ptr::null_mut();
                self.check(
                    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
                    parent_of(dev, &mut parent),
                )?;
                let (mut g, mut c) = (0, 0);
                self.check("nvmlDeviceGetGpuInstanceId", gi_id(dev, &mut g))?;
                self.check("nvmlDeviceGetComputeInstanceId", ci_id(dev, &mut c))?;
                (parent, Some((g, c)))
            } else {
                (dev, None)
            };
            let mut minor: c_uint = 0;
            self.check("nvmlDeviceGetMinorNumber", minor_of(gpu, &mut minor))?;
            (minor, ids)
        };
        nd.for_device(minor, mig).ok_or_else(|| {
            BackendError::Driver(format!(
                "{device_uuid}: its capability device files are not listed in /proc/driver/nvidia-caps/mig-minors"
            ))
        })
    }

    fn processes(&self, device_uuid: &str) -> Result<Vec<GpuProcess>, BackendError> {
        let d = self
            .nvml
            .device_by_uuid(device_uuid)
            .map_err(|_| BackendError::NoSuchDevice(device_uuid.to_string()))?;
        let procs = d
            .running_compute_processes()
            .map_err(|e| BackendError::Driver(e.to_string()))?;
        Ok(procs
            .into_iter()
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b / (1024 * 1024),
                    UsedGpuMemory::Unavailable => 0,
                },
            })
            .collect())
    }

    fn process_utilization(
        &self,
        gpu_uuid: &str,
        since_us: u64,
    ) -> Result<Option<Vec<(u32, u32)>>, BackendError> {
        self.check_managed(gpu_uuid)?;
        let d = self.device(gpu_uuid)?;
        // Not supported (or not in this library): the caller falls back.
        Ok(d.process_utilization_stats(since_us)
            .ok()
            .map(|v| v.into_iter().map(|s| (s.pid, s.sm_util)).collect()))
    }

    fn telemetry(&self, gpu_uuid: &str) -> Result<Telemetry, BackendError> {
        use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError};
        self.check_managed(gpu_uuid)?;
        let d = self.device(gpu_uuid)?;
        let mem = d.memory_info().map_err(|e| match e {
            NvmlError::GpuLost => BackendError::GpuLost(gpu_uuid.to_string()),
            e => BackendError::Driver(e.to_string()),
        })?;
        let mig = matches!(d.mig_mode(), Ok(m) if m.current == 1);
        let mut devices = Vec::new();
        if mig {
            // SAFETY: `handle` is the live handle of `d`.
            for (_, _, uuid) in self.mig_uuids(unsafe { d.handle() })? {
                let Ok(m) = self.nvml.device_by_uuid(uuid.as_str()) else {
                    continue;
                };
                let Ok(mi) = m.memory_info() else { continue };
                devices.push(DeviceSample {
                    device_uuid: uuid,
                    memory_used_mib: mi.used / (1024 * 1024),
                    memory_total_mib: mi.total / (1024 * 1024),
                    // Per-instance utilisation needs GPM (Hopper and newer),
                    // which nvml-wrapper does not wrap yet; left out.
                    utilization_pct: None,
                });
            }
        }
        Ok(Telemetry {
            memory_used_mib: mem.used / (1024 * 1024),
            memory_total_mib: mem.total / (1024 * 1024),
            utilization_pct: d.utilization_rates().ok().map(|u| u.gpu),
            temperature_c: d.temperature(TemperatureSensor::Gpu).ok(),
            power_w: d.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            ecc_uncorrectable: d
                .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                .ok(),
            sm_clock_mhz: d.clock_info(Clock::SM).ok(),
            mem_clock_mhz: d.clock_info(Clock::Memory).ok(),
            devices,
        })
    }

    fn wait_events(&self, timeout: Duration) -> Result<Vec<GpuEvent>, BackendError> {
        let set = self.event_set()?;
        let wait = sym!(self, nvmlEventSetWait_v2)?;
        let get_uuid = sym!(self, nvmlDeviceGetUUID)?;
        let mut out = Vec::new();
        let mut ms = timeout.as_millis().min(u128::from(u32::MAX)) as u32;
        loop {
            // SAFETY: `set` is the live event set made by `event_set`; the
            // event data is a local of the prototype's type.
            let mut data: sys::nvmlEventData_t = unsafe { std::mem::zeroed() };
            let r = unsafe { wait(set as sys::nvmlEventSet_t, &mut data, ms) };
            if r == TIMEOUT {
                return Ok(out);
            }
            if r != SUCCESS && !out.is_empty() {
                // Keep what arrived; the error comes back at the next wait.
                return Ok(out);
            }
            self.check("nvmlEventSetWait_v2", r)?;
            let mut buf = [0 as c_char; 96];
            // SAFETY: the device handle comes from the driver's event.
            let uuid = unsafe {
                self.check(
                    "nvmlDeviceGetUUID",
                    get_uuid(data.device, buf.as_mut_ptr(), buf.len() as c_uint),
                )?;
                CStr::from_ptr(buf.as_ptr()).to_string_lossy().to_string()
            };
            let kind = match data.eventType {
                EVENT_XID => EventKind::Xid,
                EVENT_DBE => EventKind::EccUncorrectable,
                // Only these two are registered; anything else is skipped.
                _ => {
                    ms = 0;
                    continue;
                }
            };
            out.push(GpuEvent {
                gpu_uuid: uuid,
                kind,
                code: data.eventData,
            });
            // Collect what else is already queued, without waiting again.
            ms = 0;
        }
    }

    fn switch_mig_mode(&self, gpu_uuid: &str, enabled: bool) -> Result<(), BackendError> {
        self.check_managed(gpu_uuid)?;
        if !self.allow_mode_change {
            return Err(BackendError::Driver(
                "MIG mode changes are disabled on this node; an operator may allow them with GPUSLICE_NVML_ALLOW_MODE_CHANGE=true"
                    .into(),
            ));
        }
        let d = self.device(gpu_uuid)?;
        if d.mig_mode().is_ok_and(|m| m.current == 1) && !self.list_instances(gpu_uuid)?.is_empty()
        {
            return Err(BackendError::NotEmpty {
                gpu: gpu_uuid.to_string(),
            });
        }
        let set = sym!(self, nvmlDeviceSetMigMode)?;
        let mut activation: u32 = 0;
        // SAFETY: as in `mig_uuids`.
        self.check("nvmlDeviceSetMigMode", unsafe {
            set(d.handle(), u32::from(enabled), &mut activation)
        })?;
        self.profiles
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(gpu_uuid);
        match activation {
            SUCCESS => Ok(()),
            // Pending until the GPU is reset (A100, or clients attached):
            // the inventory reports it as mig_pending.
            RESET_REQUIRED => {
                tracing::info!(gpu = %gpu_uuid, "MIG mode change pending until the GPU is reset");
                Ok(())
            }
            // The change is pending; the driver asks for the GPU to be
            // idled (another client holds it) and reset.
            IN_USE => {
                tracing::warn!(gpu = %gpu_uuid, "MIG mode change pending: another client holds the GPU (NVML_ERROR_IN_USE); idle it and reset the GPU");
                Ok(())
            }
            code => Err(BackendError::Driver(format!(
                "the MIG mode change was not activated (NVML code {code})"
            ))),
        }
    }
}

/// One GPU-instance profile as the driver describes it, next to the catalog.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProfileCheck {
    pub gpu_index: u32,
    pub product: String,
    pub model: Option<String>,
    /// `NVML_GPU_INSTANCE_PROFILE_*` enum index asked for.
    pub nvml_enum: u32,
    /// The catalog's profile for that enum, if it has one.
    pub catalog_name: Option<String>,
    /// What the driver returned (None: not supported on this GPU).
    pub nvml_id: Option<u32>,
    pub slices: Option<u32>,
    pub instance_count: Option<u32>,
    pub memory_mib: Option<u64>,
    pub placements: Option<Vec<Placement>>,
    /// Whether id, slices, count and placements match the catalog.
    pub agrees: bool,
    /// The return code of `nvmlDeviceGetGpuInstanceProfileInfo` (0 success,
    /// 3 not supported on this GPU).
    pub rc: u32,
    /// The profile's name as the driver spells it (the versioned info
    /// call), where the driver has that call.
    pub driver_name: Option<String>,
    /// The catalog's nominal memory for the profile (the driver's is
    /// `memory_mib`; they may differ, which is not a disagreement).
    pub catalog_memory_mib: Option<u64>,
}

/// What `gpu-check` reports: everything NVML says about the node's MIG
/// setup, read-only, for diffing against the catalog.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceReport {
    pub driver_version: String,
    pub nvml_version: String,
    pub effective_uid: u32,
    pub effective_user: String,
    pub gpus: Vec<GpuReport>,
    pub profiles: Vec<ProfileCheck>,
    pub instances: Vec<Instance>,
    pub mig_devices: Vec<MigDeviceReport>,
    /// Wall time of one full walk (profiles, instances, MIG devices), ms.
    pub walk_ms: f64,
    /// Privileged calls this user may not make.
    pub missing_privileges: Vec<&'static str>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuReport {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub catalog: Option<String>,
    /// How far the catalog's rows for this model are known.
    pub provenance: Option<catalog::Provenance>,
    pub pci_device_id: Option<String>,
    pub mig_current: bool,
    pub mig_pending: bool,
    /// The GPU's memory (the MIG parent's, a privileged call in MIG mode)
    /// and the call's return code.
    pub memory_mib: Option<u64>,
    pub memory_rc: u32,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct MigDeviceReport {
    pub gpu_index: u32,
    pub gi_id: u32,
    pub ci_id: u32,
    pub uuid: String,
    pub processes: Option<usize>,
}

impl NvmlBackend {
    /// Read-only: asks the driver for every GPU-instance profile (enum
    /// indexes 0 to 9) and its possible placements on every GPU, and
    /// compares them with the catalog. Changes nothing on the GPUs.
    pub fn check_profiles(&self) -> Result<Vec<ProfileCheck>, BackendError> {
        let info_fn = sym!(self, nvmlDeviceGetGpuInstanceProfileInfo)?;
        let placements_fn = sym!(self, nvmlDeviceGetGpuInstancePossiblePlacements_v2)?;
        let count = self
            .nvml
            .device_count()
            .map_err(|e| BackendError::Driver(e.to_string()))?;
        let mut out = Vec::new();
        for index in 0..count {
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(|e| BackendError::Driver(e.to_string()))?;
            let info = self.info(index, &d)?;
            let model = info.model.as_deref().and_then(catalog::model);
            // SAFETY: `handle` is the raw handle of a device of this Nvml.
            let dev = unsafe { d.handle() };
            for nvml_enum in 0..MAX_PROFILE_ENUMS {
                let expected = model.and_then(|m| m.profile_by_enum(nvml_enum));
                let rc;
                // SAFETY: `p` and `buf` are live locals of the prototype's
                // types; `n` carries the buffer's true length.
                let (nvml_id, slices, instance_count, memory_mib, placements) = unsafe {
                    let mut p: sys::nvmlGpuInstanceProfileInfo_t = std::mem::zeroed();
                    rc = info_fn(dev, nvml_enum, &mut p);
                    if rc != SUCCESS {
                        (None, None, None, None, None)
                    } else {
                        let mut buf = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 16];
                        let mut n: c_uint = buf.len() as c_uint;
                        let placements = (placements_fn(dev, p.id, buf.as_mut_ptr(), &mut n)
                            == SUCCESS)
                            .then(|| {
                                buf[..n as usize]
                                    .iter()
                                    .map(|x| Placement {
                                        start: x.start as u8,
                                        size: x.size as u8,
                                    })
                                    .collect::<Vec<_>>()
                            });
                        (
                            Some(p.id),
                            Some(p.sliceCount),
                            Some(p.instanceCount),
                            Some(p.memorySizeMB),
                            placements,
                        )
                    }
                };
                // Past the driver's own count (INVALID_ARGUMENT) or not on
                // this GPU: listed only where the catalog expects a profile.
                if nvml_id.is_none() && expected.is_none() {
                    continue;
                }
                let driver_name = self.profile_name(dev, nvml_enum);
                let agrees = match expected {
                    Some(e) => {
                        nvml_id == Some(e.nvml_id)
                            && slices == Some(u32::from(e.compute_slices))
                            && instance_count == Some(u32::from(e.max_count))
                            && placements.as_deref()
                                == Some(&e.placements().collect::<Vec<_>>()[..])
                    }
                    None => false,
                };
                out.push(ProfileCheck {
                    gpu_index: index,
                    product: info.product.clone(),
                    model: info.model.clone(),
                    nvml_enum,
                    catalog_name: expected.map(|e| e.name.clone()),
                    nvml_id,
                    slices,
                    instance_count,
                    memory_mib,
                    placements,
                    agrees,
                    rc,
                    driver_name,
                    catalog_memory_mib: expected.map(|e| (e.memory_gib * 1024.0) as u64),
                });
            }
        }
        Ok(out)
    }

    /// A profile's name from the versioned info call
    /// (`nvmlGpuInstanceProfileInfo_v2`), where the driver has it.
    fn profile_name(&self, dev: sys::nvmlDevice_t, nvml_enum: u32) -> Option<String> {
        let f = self
            .nvml
            .lib()
            .nvmlDeviceGetGpuInstanceProfileInfoV
            .as_ref()
            .ok()?;
        // SAFETY: a zeroed v2 struct carrying its version, as nvml.h asks.
        unsafe {
            let mut p: sys::nvmlGpuInstanceProfileInfo_v2_t = std::mem::zeroed();
            p.version =
                std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as u32 | (2 << 24);
            if f(dev, nvml_enum, &mut p) != SUCCESS {
                return None;
            }
            Some(
                CStr::from_ptr(p.name.as_ptr())
                    .to_string_lossy()
                    .to_string(),
            )
        }
    }

    /// Everything `gpu-check` prints, read-only; `walk_ms` is the time of
    /// the whole walk.
    pub fn report(&self) -> Result<DeviceReport, BackendError> {
        let started = std::time::Instant::now();
        let count = self
            .nvml
            .device_count()
            .map_err(|e| BackendError::Driver(e.to_string()))?;
        let lib = self.nvml.lib();
        let mut gpus = Vec::new();
        let mut infos = Vec::new();
        let mut instances = Vec::new();
        let mut mig_devices = Vec::new();
        for index in 0..count {
            let d = self
                .nvml
                .device_by_index(index)
                .map_err(|e| BackendError::Driver(e.to_string()))?;
            let info = self.info(index, &d)?;
            // SAFETY: the raw handle of a device of this Nvml.
            let dev = unsafe { d.handle() };
            let (memory_mib, memory_rc) = match lib.nvmlDeviceGetMemoryInfo_v2.as_ref() {
                // SAFETY: a live local of the prototype's type, carrying its
                // version as nvml.h asks.
                Ok(f) => unsafe {
                    let mut m: sys::nvmlMemory_v2_t = std::mem::zeroed();
                    m.version = std::mem::size_of::<sys::nvmlMemory_v2_t>() as u32 | (2 << 24);
                    let rc = f(dev, &mut m);
                    ((rc == SUCCESS).then_some(m.total / (1024 * 1024)), rc)
                },
                Err(_) => (None, u32::MAX),
            };
            gpus.push(GpuReport {
                index,
                uuid: info.uuid.clone(),
                name: info.product.clone(),
                catalog: info.model.clone(),
                provenance: info
                    .model
                    .as_deref()
                    .and_then(catalog::model)
                    .map(|m| m.provenance()),
                pci_device_id: d
                    .pci_info()
                    .ok()
                    .map(|p| format!("{:#010x}", p.pci_device_id)),
                mig_current: info.mig_current,
                mig_pending: info.mig_pending,
                memory_mib,
                memory_rc,
            });
            infos.push(info.clone());
            if info.mig_current {
                instances.extend(self.list_instances(&info.uuid)?.into_iter().map(|(_, i)| i));
                for (gi, ci, uuid) in self.mig_uuids(dev)? {
                    let processes = self.processes(&uuid).ok().map(|p| p.len());
                    mig_devices.push(MigDeviceReport {
                        gpu_index: index,
                        gi_id: gi,
                        ci_id: ci,
                        uuid,
                        processes,
                    });
                }
            }
        }
        let profiles = self.check_profiles()?;
        let walk_ms = started.elapsed().as_secs_f64() * 1000.0;
        let uid = nix::unistd::geteuid();
        Ok(DeviceReport {
            driver_version: self
                .nvml
                .sys_driver_version()
                .unwrap_or_else(|e| format!("unavailable ({e})")),
            nvml_version: self
                .nvml
                .sys_nvml_version()
                .unwrap_or_else(|e| format!("unavailable ({e})")),
            effective_uid: uid.as_raw(),
            effective_user: nix::unistd::User::from_uid(uid)
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_default(),
            gpus,
            profiles,
            instances,
            mig_devices,
            walk_ms,
            missing_privileges: self.missing_privileges(&infos),
        })
    }
}
