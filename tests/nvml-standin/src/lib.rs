//! A stand-in `libnvidia-ml.so` for gpuslice's tests.
//!
//! It implements the NVML C functions gpuslice's NVML backend calls, with
//! NVML's semantics — profile enum index vs profile id, `_v2` placements,
//! `NVML_ERROR_INSUFFICIENT_RESOURCES` on overlap, `NVML_ERROR_IN_USE` while
//! compute instances or processes exist, `NVML_ERROR_NOT_FOUND` for an empty
//! MIG index, `MIG-` uuids — over the GPUs of one node of the fleet file
//! named by `GPUSLICE_FLEET` (the demo fleet when unset; the node by
//! `GPUSLICE_NVML_NODE`, else the first). Whether a GPU instance may be
//! created is decided by `gpuslice::gpu::mig::check_create`, the same code
//! the simulated backend uses. With `GPUSLICE_NVML_STATE` the "driver" keeps
//! its state in that file across processes, like real GPUs keep their
//! instances when a program exits.
//!
//! Telemetry follows the simulated backend's load model
//! (`gpuslice::gpu::sim::model_telemetry`) and the same staged values
//! (`gpuslice::gpu::sim::Staged`), so both backends report alike; XID and
//! double-bit ECC errors arrive through NVML's event-set calls.
//!
//! Like a real driver, and unlike a friendly mock:
//! - a compute instance stays busy (`NVML_ERROR_IN_USE`) for
//!   `GPUSLICE_STANDIN_CI_BUSY_MS` milliseconds after its processes are
//!   gone, as NVIDIA's drivers do on H100 and H200 (DCGM reports IN_USE
//!   with no process visible);
//! - GPU-instance profile enums end at `NVML_GPU_INSTANCE_PROFILE_COUNT`
//!   (0xA in the `nvml.h` NVIDIA's go-nvml vendors) with
//!   `NVML_ERROR_INVALID_ARGUMENT`; a profile this "driver" does not know
//!   (`GPUSLICE_STANDIN_HIDE_PROFILES`, comma-separated names, as older
//!   drivers lack some A30 `+me` profiles) is NOT_SUPPORTED by enum and
//!   INVALID_ARGUMENT by id;
//! - every compute-instance profile that fits a GPU instance is offered,
//!   so instances made behind gpuslice's back (`gpusliceStandinForeign`:
//!   a GPU instance with several small compute instances, as
//!   `nvidia-smi mig -cgi … -cci 1c…` makes) are real;
//! - a MIG mode change reports `NVML_ERROR_RESET_REQUIRED` (16) as its
//!   activation status until the GPU is reset.
//!
//! Extra symbols let tests play the world outside NVML:
//! `gpusliceStandinAttachProcess` (a process starts on a device),
//! `gpusliceStandinReset` (a GPU reset applies a pending MIG mode),
//! `gpusliceStandinStage` (what `gpuslice sim set` stages, as JSON) and
//! `gpusliceStandinEvent` (the driver reports an event).
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulonglong, CStr};
use std::sync::Mutex;

use gpuslice::gpu::catalog::{self, Placement};
use gpuslice::gpu::fleet::{Fleet, Mode};
use gpuslice::gpu::mig::{self, Existing};
use serde::{Deserialize, Serialize};

type Ret = c_uint;
const SUCCESS: Ret = 0;
const UNINITIALIZED: Ret = 1;
const INVALID_ARGUMENT: Ret = 2;
const NOT_SUPPORTED: Ret = 3;
const NOT_FOUND: Ret = 6;
const INSUFFICIENT_SIZE: Ret = 7;
const IN_USE: Ret = 19;
const RESET_REQUIRED: Ret = 16;
const NO_PERMISSION: Ret = 4;
/// `NVML_GPU_INSTANCE_PROFILE_COUNT` and `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`
/// of the `nvml.h` this stand-in follows.
const GI_PROFILE_COUNT: c_uint = 0xA;
const CI_PROFILE_COUNT: c_uint = 0x8;
const TIMEOUT: Ret = 10;
const GPU_IS_LOST: Ret = 15;
const INSUFFICIENT_RESOURCES: Ret = 23;
const UNKNOWN: Ret = 999;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Proc {
    pid: u32,
    mib: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Ci {
    id: u32,
    profile_id: u32,
    uuid: String,
    processes: Vec<Proc>,
    /// When its processes were first seen gone (ms since the epoch): it
    /// stays busy `GPUSLICE_STANDIN_CI_BUSY_MS` longer.
    #[serde(default)]
    idle_since_ms: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gi {
    id: u32,
    profile_id: u32,
    placement: Placement,
    cis: Vec<Ci>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Gpu {
    model: String,
    uuid: String,
    mig_current: bool,
    mig_pending: bool,
    gis: Vec<Gi>,
    next_gi: u32,
    processes: Vec<Proc>,
    #[serde(default)]
    staged: gpuslice::gpu::sim::Staged,
    /// Undelivered events: (NVML event type, event data).
    #[serde(default)]
    events: Vec<(u64, u64)>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    gpus: Vec<Gpu>,
    #[serde(skip)]
    path: Option<String>,
    #[serde(skip)]
    inits: u32,
    #[serde(skip)]
    config: Config,
}

/// How driver-like this copy behaves: from the environment at load, or set
/// by a test through `gpusliceStandinConfigure` (each loaded copy has its own).
#[derive(Debug, Clone, Default)]
struct Config {
    /// `GPUSLICE_STANDIN_CI_BUSY_MS`.
    ci_busy_ms: u64,
    /// `GPUSLICE_STANDIN_HIDE_PROFILES`.
    hidden: Vec<String>,
    /// `GPUSLICE_STANDIN_UNPRIVILEGED`: privileged MIG queries answer
    /// NVML_ERROR_NO_PERMISSION, as for a user without root.
    unprivileged: bool,
}

impl Config {
    fn from_env() -> Config {
        Config {
            ci_busy_ms: std::env::var("GPUSLICE_STANDIN_CI_BUSY_MS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            hidden: std::env::var("GPUSLICE_STANDIN_HIDE_PROFILES")
                .map(|v| v.split(',').map(|h| h.trim().to_string()).collect())
                .unwrap_or_default(),
            unprivileged: std::env::var_os("GPUSLICE_STANDIN_UNPRIVILEGED").is_some(),
        }
    }

    fn hidden(&self, name: &str) -> bool {
        self.hidden.iter().any(|h| h == name)
    }
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn load() -> Result<State, String> {
    let fleet = match std::env::var_os("GPUSLICE_FLEET") {
        Some(p) => Fleet::load(Some(std::path::Path::new(&p)))?,
        None => Fleet::demo(),
    };
    let node = match std::env::var("GPUSLICE_NVML_NODE") {
        Ok(n) => fleet.node(&n).ok_or(format!("no node {n}"))?.clone(),
        Err(_) => fleet.nodes.first().ok_or("empty fleet")?.clone(),
    };
    let mut gpus = Vec::new();
    for group in &node.gpus {
        for _ in 0..group.count {
            let mig = group.mode == Mode::Mig;
            gpus.push(Gpu {
                model: group.model.clone(),
                uuid: gpuslice::gpu::sim::gpu_uuid(&node.name, gpus.len() as u32),
                mig_current: mig,
                mig_pending: mig,
                gis: Vec::new(),
                next_gi: 1,
                processes: Vec::new(),
                staged: Default::default(),
                events: Vec::new(),
            });
        }
    }
    let path = std::env::var("GPUSLICE_NVML_STATE").ok();
    if let Some(saved) = path.as_ref().and_then(|p| std::fs::read(p).ok()) {
        if let Ok(saved) = serde_json::from_slice::<State>(&saved) {
            for g in &mut gpus {
                if let Some(old) = saved
                    .gpus
                    .iter()
                    .find(|o| o.uuid == g.uuid && o.model == g.model)
                {
                    *g = old.clone();
                }
            }
        }
    }
    Ok(State {
        gpus,
        path,
        inits: 0,
        config: Config::from_env(),
    })
}

fn save(s: &State) {
    if let Some(p) = &s.path {
        if let Ok(bytes) = serde_json::to_vec(s) {
            let tmp = format!("{p}.tmp");
            if std::fs::write(&tmp, bytes).is_ok() {
                let _ = std::fs::rename(tmp, p);
            }
        }
    }
}

/// Runs `f` on the initialised state; saves it when `f` succeeded.
fn with<F: FnOnce(&mut State) -> Ret>(f: F) -> Ret {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        None => UNINITIALIZED,
        Some(s) => {
            let r = f(s);
            if r == SUCCESS {
                save(s);
            }
            r
        }
    }
}

// ----------------------------------------------------------------- handles
// Opaque handles encode what they name: tag << 24 | gpu << 16 | gi << 8 | ci.

const TAG_GPU: usize = 1;
const TAG_MIG: usize = 2;
const TAG_GI: usize = 3;
const TAG_CI: usize = 4;

fn handle(tag: usize, gpu: usize, gi: u32, ci: u32) -> *mut std::ffi::c_void {
    ((tag << 24) | (gpu << 16) | ((gi as usize) << 8) | ci as usize) as *mut std::ffi::c_void
}

fn decode(h: *mut std::ffi::c_void) -> (usize, usize, u32, u32) {
    let v = h as usize;
    (
        v >> 24,
        (v >> 16) & 0xff,
        ((v >> 8) & 0xff) as u32,
        (v & 0xff) as u32,
    )
}

fn gpu_of(s: &mut State, h: *mut std::ffi::c_void, tag: usize) -> Option<(&mut Gpu, u32, u32)> {
    let (t, g, gi, ci) = decode(h);
    if t != tag {
        return None;
    }
    s.gpus.get_mut(g).map(|gpu| (gpu, gi, ci))
}

fn model(g: &Gpu) -> &'static catalog::Model {
    catalog::model(&g.model).unwrap_or_else(|| &catalog::models()[0])
}

/// A GPU-instance profile id the driver knows on this GPU.
fn known(cfg: &Config, g: &Gpu, profile_id: u32) -> Option<&'static catalog::Profile> {
    model(g)
        .profile_by_id(profile_id)
        .filter(|p| !cfg.hidden(&p.name))
}

/// Compute slices of compute-instance profile enum `e`
/// (`NVML_COMPUTE_INSTANCE_PROFILE_*`: 1, 2, 3, 4, 7, 8, 6 slices, then
/// 1_SLICE_REV1).
fn ci_enum_slices(e: c_uint) -> Option<u8> {
    match e {
        0 => Some(1),
        1 => Some(2),
        2 => Some(3),
        3 => Some(4),
        4 => Some(7),
        5 => Some(8),
        6 => Some(6),
        _ => None,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

unsafe fn write_str(s: &str, buf: *mut c_char, len: c_uint) -> Ret {
    if buf.is_null() {
        return INVALID_ARGUMENT;
    }
    let bytes = s.as_bytes();
    if bytes.len() + 1 > len as usize {
        return INSUFFICIENT_SIZE;
    }
    std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf as *mut u8, bytes.len());
    *buf.add(bytes.len()) = 0;
    SUCCESS
}

/// NVML's list convention: `count` in is the room in `out`, out is how many
/// there are; too little room (or no buffer) is INSUFFICIENT_SIZE unless
/// there is nothing to list.
unsafe fn fill(
    handles: &[*mut std::ffi::c_void],
    out: *mut *mut std::ffi::c_void,
    count: *mut c_uint,
) -> Ret {
    let room = *count as usize;
    *count = handles.len() as c_uint;
    if handles.is_empty() {
        return SUCCESS;
    }
    if out.is_null() || room < handles.len() {
        return INSUFFICIENT_SIZE;
    }
    for (i, h) in handles.iter().enumerate() {
        *out.add(i) = *h;
    }
    SUCCESS
}

// ------------------------------------------------------------------ init

#[no_mangle]
pub unsafe extern "C" fn nvmlInit_v2() -> Ret {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = guard.as_mut() {
        s.inits += 1;
        return SUCCESS;
    }
    match load() {
        Ok(mut s) => {
            s.inits = 1;
            *guard = Some(s);
            SUCCESS
        }
        Err(_) => UNKNOWN,
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Ret {
    nvmlInit_v2()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlShutdown() -> Ret {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        None => UNINITIALIZED,
        Some(s) => {
            s.inits = s.inits.saturating_sub(1);
            if s.inits == 0 {
                *guard = None;
            }
            SUCCESS
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlErrorString(code: Ret) -> *const c_char {
    let s: &'static CStr = match code {
        SUCCESS => c"Success",
        UNINITIALIZED => c"Uninitialized",
        INVALID_ARGUMENT => c"Invalid Argument",
        NOT_SUPPORTED => c"Not Supported",
        NOT_FOUND => c"Not Found",
        INSUFFICIENT_SIZE => c"Insufficient Size",
        IN_USE => c"In use by another client",
        INSUFFICIENT_RESOURCES => c"Insufficient Resources",
        _ => c"Unknown Error",
    };
    s.as_ptr()
}

// --------------------------------------------------------------- devices

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> Ret {
    with(|s| {
        *count = s.gpus.len() as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    device: *mut *mut std::ffi::c_void,
) -> Ret {
    with(|s| {
        if index as usize >= s.gpus.len() {
            return INVALID_ARGUMENT;
        }
        *device = handle(TAG_GPU, index as usize, 0, 0);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(
    uuid: *const c_char,
    device: *mut *mut std::ffi::c_void,
) -> Ret {
    let want = CStr::from_ptr(uuid).to_string_lossy().to_string();
    with(|s| {
        for (i, g) in s.gpus.iter().enumerate() {
            if g.uuid == want {
                *device = handle(TAG_GPU, i, 0, 0);
                return SUCCESS;
            }
            for gi in &g.gis {
                for ci in &gi.cis {
                    if ci.uuid == want {
                        *device = handle(TAG_MIG, i, gi.id, ci.id);
                        return SUCCESS;
                    }
                }
            }
        }
        NOT_FOUND
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(
    device: *mut std::ffi::c_void,
    index: *mut c_uint,
) -> Ret {
    with(|_| {
        let (t, g, _, _) = decode(device);
        if t != TAG_GPU {
            return INVALID_ARGUMENT;
        }
        *index = g as c_uint;
        SUCCESS
    })
}

/// A GPU's device-file minor (`/dev/nvidiaN`): its index, as on most
/// nodes (NVIDIA makes no promise that they agree; the backend asks).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(
    device: *mut std::ffi::c_void,
    minor: *mut c_uint,
) -> Ret {
    with(|_| {
        let (t, g, _, _) = decode(device);
        if t != TAG_GPU {
            return INVALID_ARGUMENT;
        }
        *minor = g as c_uint;
        SUCCESS
    })
}

/// The versioned profile info (`nvmlGpuInstanceProfileInfo_v2_t`): the
/// same answer with the profile's name, as recent drivers give it.
#[repr(C)]
pub struct GiProfileInfoV2 {
    version: c_uint,
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: c_ulonglong,
    name: [c_char; 96],
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfoV(
    device: *mut std::ffi::c_void,
    profile: c_uint,
    info: *mut GiProfileInfoV2,
) -> Ret {
    let want = std::mem::size_of::<GiProfileInfoV2>() as c_uint | (2 << 24);
    if info.is_null() || (*info).version != want {
        return 25; // NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    }
    let mut plain: GiProfileInfo = std::mem::zeroed();
    let r = nvmlDeviceGetGpuInstanceProfileInfo(device, profile, &mut plain);
    if r != SUCCESS {
        return r;
    }
    let name = with(|s| {
        let cfg = s.config.clone();
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        match model(g)
            .profile_by_enum(profile)
            .filter(|p| !cfg.hidden(&p.name))
        {
            Some(p) => {
                // NVIDIA's drivers write "MIG 1g.10gb".
                write_str(&format!("MIG {}", p.name), (*info).name.as_mut_ptr(), 96)
            }
            None => NOT_SUPPORTED,
        }
    });
    if name != SUCCESS {
        return name;
    }
    let i = &mut *info;
    i.id = plain.id;
    i.is_p2p_supported = plain.is_p2p_supported;
    i.slice_count = plain.slice_count;
    i.instance_count = plain.instance_count;
    i.multiprocessor_count = plain.multiprocessor_count;
    i.copy_engine_count = plain.copy_engine_count;
    i.decoder_count = plain.decoder_count;
    i.encoder_count = plain.encoder_count;
    i.jpeg_count = plain.jpeg_count;
    i.ofa_count = plain.ofa_count;
    i.memory_size_mb = plain.memory_size_mb;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) -> Ret {
    write_str("gpuslice-standin", version, len)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, len: c_uint) -> Ret {
    write_str("12.gpuslice-standin", version, len)
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(
    device: *mut std::ffi::c_void,
    name: *mut c_char,
    len: c_uint,
) -> Ret {
    with(|s| {
        let (t, _, _, _) = decode(device);
        let Some((g, gi, _)) = gpu_of(s, device, t) else {
            return INVALID_ARGUMENT;
        };
        let m = model(g);
        if t == TAG_MIG {
            let profile = g
                .gis
                .iter()
                .find(|x| x.id == gi)
                .and_then(|x| m.profile_by_id(x.profile_id));
            let text = format!(
                "{} MIG {}",
                m.product,
                profile.map(|p| p.name.as_str()).unwrap_or("")
            );
            return write_str(&text, name, len);
        }
        write_str(m.product, name, len)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    device: *mut std::ffi::c_void,
    uuid: *mut c_char,
    len: c_uint,
) -> Ret {
    with(|s| {
        let (t, _, _, _) = decode(device);
        let Some((g, gi, ci)) = gpu_of(s, device, t) else {
            return INVALID_ARGUMENT;
        };
        match t {
            TAG_GPU => write_str(&g.uuid.clone(), uuid, len),
            TAG_MIG => match g
                .gis
                .iter()
                .find(|x| x.id == gi)
                .and_then(|x| x.cis.iter().find(|c| c.id == ci))
            {
                Some(c) => write_str(&c.uuid.clone(), uuid, len),
                None => NOT_FOUND,
            },
            _ => INVALID_ARGUMENT,
        }
    })
}

#[repr(C)]
pub struct Memory2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    device: *mut std::ffi::c_void,
    memory: *mut Memory2,
) -> Ret {
    with(|s| {
        let (t, _, _, _) = decode(device);
        let Some((g, gi, ci)) = gpu_of(s, device, t) else {
            return INVALID_ARGUMENT;
        };
        if g.staged.lost {
            return GPU_IS_LOST;
        }
        let m = model(g);
        let staged_used = g.staged.memory_used_mib;
        let (total_gib, used_mib) = match t {
            TAG_GPU => (
                m.memory_gib,
                staged_used.unwrap_or_else(|| {
                    g.processes
                        .iter()
                        .chain(
                            g.gis
                                .iter()
                                .flat_map(|x| x.cis.iter().flat_map(|c| c.processes.iter())),
                        )
                        .map(|p| p.mib)
                        .sum::<u64>()
                }),
            ),
            TAG_MIG => {
                let Some(x) = g.gis.iter().find(|x| x.id == gi) else {
                    return NOT_FOUND;
                };
                let gib = m
                    .profile_by_id(x.profile_id)
                    .map(|p| p.memory_gib)
                    .unwrap_or(0.0);
                let used = x
                    .cis
                    .iter()
                    .filter(|c| c.id == ci)
                    .flat_map(|c| c.processes.iter())
                    .map(|p| p.mib)
                    .sum();
                (gib, used)
            }
            _ => return INVALID_ARGUMENT,
        };
        let total = (total_gib * 1024.0 * 1024.0 * 1024.0) as u64;
        let used = used_mib * 1024 * 1024;
        *memory = Memory2 {
            version: (*memory).version,
            total,
            reserved: 0,
            free: total.saturating_sub(used),
            used,
        };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: *mut std::ffi::c_void,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        if !model(g).mig_capable() {
            return NOT_SUPPORTED;
        }
        *current = g.mig_current as c_uint;
        *pending = g.mig_pending as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceSetMigMode(
    device: *mut std::ffi::c_void,
    mode: c_uint,
    activation: *mut Ret,
) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        if !model(g).mig_capable() {
            return NOT_SUPPORTED;
        }
        if !g.gis.is_empty() {
            return IN_USE;
        }
        g.mig_pending = mode == 1;
        // The change waits for a GPU reset, as on GPUs with running clients.
        *activation = if g.mig_pending == g.mig_current {
            SUCCESS
        } else {
            RESET_REQUIRED
        };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    device: *mut std::ffi::c_void,
    count: *mut c_uint,
) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        *count = u32::from(model(g).compute_slices);
        SUCCESS
    })
}

/// MIG devices in the order NVML enumerates them: by GPU instance, then
/// compute instance.
fn mig_devices(g: &Gpu) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = g
        .gis
        .iter()
        .flat_map(|x| x.cis.iter().map(move |c| (x.id, c.id)))
        .collect();
    v.sort();
    v
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: *mut std::ffi::c_void,
    index: c_uint,
    mig: *mut *mut std::ffi::c_void,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(device);
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        if !g.mig_current {
            return NOT_SUPPORTED;
        }
        match mig_devices(g).get(index as usize) {
            Some(&(gi, ci)) => {
                *mig = handle(TAG_MIG, gidx, gi, ci);
                SUCCESS
            }
            None => NOT_FOUND,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig: *mut std::ffi::c_void,
    device: *mut *mut std::ffi::c_void,
) -> Ret {
    with(|_| {
        let (t, g, _, _) = decode(mig);
        if t != TAG_MIG {
            return INVALID_ARGUMENT;
        }
        *device = handle(TAG_GPU, g, 0, 0);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(
    device: *mut std::ffi::c_void,
    is_mig: *mut c_uint,
) -> Ret {
    with(|_| {
        *is_mig = (decode(device).0 == TAG_MIG) as c_uint;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(
    device: *mut std::ffi::c_void,
    id: *mut c_uint,
) -> Ret {
    with(|_| {
        let (t, _, gi, _) = decode(device);
        if t != TAG_MIG {
            return NOT_SUPPORTED;
        }
        *id = gi;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    device: *mut std::ffi::c_void,
    id: *mut c_uint,
) -> Ret {
    with(|_| {
        let (t, _, _, ci) = decode(device);
        if t != TAG_MIG {
            return NOT_SUPPORTED;
        }
        *id = ci;
        SUCCESS
    })
}

// -------------------------------------------------------- GPU instances

#[repr(C)]
pub struct GiProfileInfo {
    id: c_uint,
    is_p2p_supported: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    copy_engine_count: c_uint,
    decoder_count: c_uint,
    encoder_count: c_uint,
    jpeg_count: c_uint,
    ofa_count: c_uint,
    memory_size_mb: c_ulonglong,
}

/// Takes the profile *enum index* (`NVML_GPU_INSTANCE_PROFILE_*`) and
/// returns the profile *id* in `info.id`, as NVML does.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceProfileInfo(
    device: *mut std::ffi::c_void,
    profile: c_uint,
    info: *mut GiProfileInfo,
) -> Ret {
    with(|s| {
        let cfg = s.config.clone();
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        if profile >= GI_PROFILE_COUNT {
            return INVALID_ARGUMENT;
        }
        let Some(p) = model(g)
            .profile_by_enum(profile)
            .filter(|p| !cfg.hidden(&p.name))
        else {
            return NOT_SUPPORTED;
        };
        *info = GiProfileInfo {
            id: p.nvml_id,
            is_p2p_supported: 0,
            slice_count: u32::from(p.compute_slices),
            instance_count: u32::from(p.max_count),
            multiprocessor_count: 16 * u32::from(p.compute_slices),
            copy_engine_count: u32::from(p.compute_slices),
            decoder_count: u32::from(p.media_extensions),
            encoder_count: 0,
            jpeg_count: u32::from(p.media_extensions),
            ofa_count: u32::from(p.media_extensions),
            memory_size_mb: driver_memory_mib(model(g), p),
        };
        SUCCESS
    })
}

/// What a driver reports for a profile's memory: the catalog's nominal
/// figure, except where a real GPU is known to differ (an H100 80GB reports
/// about 19.62 / 39.50 / 79.25 GiB for 2g / 3g–4g / 7g, not the A100's
/// 19.5 / 39.25 / 78.5).
fn driver_memory_mib(m: &catalog::Model, p: &catalog::Profile) -> u64 {
    let gib = match (m.id, p.name.as_str()) {
        ("H100-80GB", "2g.20gb") => 19.62,
        ("H100-80GB", "3g.40gb" | "4g.40gb") => 39.50,
        ("H100-80GB", "7g.80gb") => 79.25,
        _ => p.memory_gib,
    };
    (gib * 1024.0) as u64
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CPlacement {
    start: c_uint,
    size: c_uint,
}

/// Every placement of the profile, whatever is already created (as NVML
/// documents); `placements` null asks for the count.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    device: *mut std::ffi::c_void,
    profile_id: c_uint,
    placements: *mut CPlacement,
    count: *mut c_uint,
) -> Ret {
    with(|s| {
        if s.config.unprivileged {
            return NO_PERMISSION;
        }
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        let Some(p) = model(g).profile_by_id(profile_id) else {
            return NOT_SUPPORTED;
        };
        let all: Vec<Placement> = p.placements().collect();
        if placements.is_null() {
            *count = all.len() as c_uint;
            return SUCCESS;
        }
        if (*count as usize) < all.len() {
            *count = all.len() as c_uint;
            return INSUFFICIENT_SIZE;
        }
        for (i, pl) in all.iter().enumerate() {
            *placements.add(i) = CPlacement {
                start: u32::from(pl.start),
                size: u32::from(pl.size),
            };
        }
        *count = all.len() as c_uint;
        SUCCESS
    })
}

fn existing(g: &Gpu) -> Vec<Existing> {
    g.gis
        .iter()
        .map(|x| Existing {
            profile_id: x.profile_id,
            placement: x.placement,
        })
        .collect()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceRemainingCapacity(
    device: *mut std::ffi::c_void,
    profile_id: c_uint,
    count: *mut c_uint,
) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        let m = model(g);
        if m.profile_by_id(profile_id).is_none() {
            return NOT_SUPPORTED;
        }
        // Greedy count of how many more fit, lowest placement first.
        let mut ex = existing(g);
        let mut n = 0;
        while let Some(pl) = mig::free_placements(m, &ex, profile_id).first().copied() {
            ex.push(Existing {
                profile_id,
                placement: pl,
            });
            n += 1;
        }
        *count = n;
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceCreateGpuInstanceWithPlacement(
    device: *mut std::ffi::c_void,
    profile_id: c_uint,
    placement: *const CPlacement,
    gi: *mut *mut std::ffi::c_void,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(device);
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        if !g.mig_current {
            return NOT_SUPPORTED;
        }
        if placement.is_null() {
            return INVALID_ARGUMENT;
        }
        let pl = *placement;
        if pl.start > 255 || pl.size > 255 {
            return INVALID_ARGUMENT;
        }
        let pl = Placement {
            start: pl.start as u8,
            size: pl.size as u8,
        };
        if let Err(e) = mig::check_create(model(g), &existing(g), profile_id, pl) {
            return e.nvml_code();
        }
        let id = g.next_gi;
        g.next_gi += 1;
        g.gis.push(Gi {
            id,
            profile_id,
            placement: pl,
            cis: Vec::new(),
        });
        *gi = handle(TAG_GI, gidx, id, 0);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstances(
    device: *mut std::ffi::c_void,
    profile_id: c_uint,
    gis: *mut *mut std::ffi::c_void,
    count: *mut c_uint,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(device);
        let cfg = s.config.clone();
        if cfg.unprivileged {
            return NO_PERMISSION;
        }
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        if known(&cfg, g, profile_id).is_none() {
            return INVALID_ARGUMENT;
        }
        let ids: Vec<u32> = g
            .gis
            .iter()
            .filter(|x| x.profile_id == profile_id)
            .map(|x| x.id)
            .collect();
        let handles: Vec<_> = ids.iter().map(|&id| handle(TAG_GI, gidx, id, 0)).collect();
        fill(&handles, gis, count)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceById(
    device: *mut std::ffi::c_void,
    id: c_uint,
    gi: *mut *mut std::ffi::c_void,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(device);
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        if !g.gis.iter().any(|x| x.id == id) {
            return NOT_FOUND;
        }
        *gi = handle(TAG_GI, gidx, id, 0);
        SUCCESS
    })
}

#[repr(C)]
pub struct GiInfo {
    device: *mut std::ffi::c_void,
    id: c_uint,
    profile_id: c_uint,
    placement: CPlacement,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetInfo(
    gi: *mut std::ffi::c_void,
    info: *mut GiInfo,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(gi);
        let Some((g, id, _)) = gpu_of(s, gi, TAG_GI) else {
            return INVALID_ARGUMENT;
        };
        let Some(x) = g.gis.iter().find(|x| x.id == id) else {
            return NOT_FOUND;
        };
        *info = GiInfo {
            device: handle(TAG_GPU, gidx, 0, 0),
            id,
            profile_id: x.profile_id,
            placement: CPlacement {
                start: u32::from(x.placement.start),
                size: u32::from(x.placement.size),
            },
        };
        SUCCESS
    })
}

/// Refused while compute instances exist (NVML_ERROR_IN_USE).
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceDestroy(gi: *mut std::ffi::c_void) -> Ret {
    with(|s| {
        let Some((g, id, _)) = gpu_of(s, gi, TAG_GI) else {
            return INVALID_ARGUMENT;
        };
        let Some(pos) = g.gis.iter().position(|x| x.id == id) else {
            return NOT_FOUND;
        };
        if !g.gis[pos].cis.is_empty() {
            return IN_USE;
        }
        g.gis.remove(pos);
        SUCCESS
    })
}

// ---------------------------------------------------- compute instances

#[repr(C)]
pub struct CiProfileInfo {
    id: c_uint,
    slice_count: c_uint,
    instance_count: c_uint,
    multiprocessor_count: c_uint,
    shared_copy_engine_count: c_uint,
    shared_decoder_count: c_uint,
    shared_encoder_count: c_uint,
    shared_jpeg_count: c_uint,
    shared_ofa_count: c_uint,
}

/// Every compute-instance profile no larger than the GPU instance (by
/// enum; the profile id is the enum, as on NVIDIA's drivers); enums past
/// the count are INVALID_ARGUMENT.
#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstanceProfileInfo(
    gi: *mut std::ffi::c_void,
    profile: c_uint,
    eng_profile: c_uint,
    info: *mut CiProfileInfo,
) -> Ret {
    with(|s| {
        let Some((g, id, _)) = gpu_of(s, gi, TAG_GI) else {
            return INVALID_ARGUMENT;
        };
        let m = model(g);
        let Some(x) = g.gis.iter().find(|x| x.id == id) else {
            return NOT_FOUND;
        };
        let Some(p) = m.profile_by_id(x.profile_id) else {
            return UNKNOWN;
        };
        if profile >= CI_PROFILE_COUNT || eng_profile != 0 {
            return INVALID_ARGUMENT;
        }
        let Some(slices) = ci_enum_slices(profile).filter(|c| *c <= p.compute_slices) else {
            return NOT_SUPPORTED;
        };
        *info = CiProfileInfo {
            id: profile,
            slice_count: u32::from(slices),
            instance_count: u32::from(p.compute_slices / slices),
            multiprocessor_count: 16 * u32::from(slices),
            shared_copy_engine_count: 1,
            shared_decoder_count: 0,
            shared_encoder_count: 0,
            shared_jpeg_count: 0,
            shared_ofa_count: 0,
        };
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceCreateComputeInstance(
    gi: *mut std::ffi::c_void,
    profile_id: c_uint,
    ci: *mut *mut std::ffi::c_void,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(gi);
        let Some((g, id, _)) = gpu_of(s, gi, TAG_GI) else {
            return INVALID_ARGUMENT;
        };
        let m = model(g);
        let Some(x) = g.gis.iter_mut().find(|x| x.id == id) else {
            return NOT_FOUND;
        };
        let Some(p) = m.profile_by_id(x.profile_id) else {
            return UNKNOWN;
        };
        let Some(slices) = ci_enum_slices(profile_id).filter(|c| *c <= p.compute_slices) else {
            return NOT_SUPPORTED;
        };
        let used: u8 = x
            .cis
            .iter()
            .filter_map(|c| ci_enum_slices(c.profile_id))
            .sum();
        if used + slices > p.compute_slices {
            return INSUFFICIENT_RESOURCES;
        }
        let ci_id = (0..)
            .find(|i| !x.cis.iter().any(|c| c.id == *i))
            .unwrap_or(0);
        x.cis.push(Ci {
            id: ci_id,
            profile_id,
            uuid: format!("MIG-{}", uuid::Uuid::new_v4()),
            processes: Vec::new(),
            idle_since_ms: None,
        });
        *ci = handle(TAG_CI, gidx, id, ci_id);
        SUCCESS
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlGpuInstanceGetComputeInstances(
    gi: *mut std::ffi::c_void,
    profile_id: c_uint,
    cis: *mut *mut std::ffi::c_void,
    count: *mut c_uint,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(gi);
        let Some((g, id, _)) = gpu_of(s, gi, TAG_GI) else {
            return INVALID_ARGUMENT;
        };
        let Some(x) = g.gis.iter().find(|x| x.id == id) else {
            return NOT_FOUND;
        };
        let ids: Vec<u32> = x
            .cis
            .iter()
            .filter(|c| c.profile_id == profile_id)
            .map(|c| c.id)
            .collect();
        let handles: Vec<_> = ids
            .iter()
            .map(|&cid| handle(TAG_CI, gidx, id, cid))
            .collect();
        fill(&handles, cis, count)
    })
}

#[repr(C)]
pub struct CiInfo {
    device: *mut std::ffi::c_void,
    gpu_instance: *mut std::ffi::c_void,
    id: c_uint,
    profile_id: c_uint,
    placement: CPlacement,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceGetInfo_v2(
    ci: *mut std::ffi::c_void,
    info: *mut CiInfo,
) -> Ret {
    with(|s| {
        let (_, gidx, _, _) = decode(ci);
        let Some((g, gi, cid)) = gpu_of(s, ci, TAG_CI) else {
            return INVALID_ARGUMENT;
        };
        let m = model(g);
        let Some(x) = g.gis.iter().find(|x| x.id == gi) else {
            return NOT_FOUND;
        };
        let Some(c) = x.cis.iter().find(|c| c.id == cid) else {
            return NOT_FOUND;
        };
        let slices = m
            .profile_by_id(x.profile_id)
            .map(|p| u32::from(p.compute_slices))
            .unwrap_or(0);
        *info = CiInfo {
            device: handle(TAG_GPU, gidx, 0, 0),
            gpu_instance: handle(TAG_GI, gidx, gi, 0),
            id: cid,
            profile_id: c.profile_id,
            placement: CPlacement {
                start: 0,
                size: slices,
            },
        };
        SUCCESS
    })
}

/// Refused while processes run on it (NVML_ERROR_IN_USE).
#[no_mangle]
pub unsafe extern "C" fn nvmlComputeInstanceDestroy(ci: *mut std::ffi::c_void) -> Ret {
    with(|s| {
        let busy_ms = s.config.ci_busy_ms;
        let Some((g, gi, cid)) = gpu_of(s, ci, TAG_CI) else {
            return INVALID_ARGUMENT;
        };
        let Some(x) = g.gis.iter_mut().find(|x| x.id == gi) else {
            return NOT_FOUND;
        };
        let Some(pos) = x.cis.iter().position(|c| c.id == cid) else {
            return NOT_FOUND;
        };
        let c = &mut x.cis[pos];
        if c.processes.iter().any(|p| process_alive(p.pid)) {
            c.idle_since_ms = None;
            return IN_USE;
        }
        // Busy a while longer after its last process, like a real driver.
        let busy = busy_ms;
        if busy > 0 && !c.processes.is_empty() {
            let since = *c.idle_since_ms.get_or_insert_with(now_ms);
            if now_ms() < since + busy {
                return IN_USE;
            }
        }
        x.cis.remove(pos);
        SUCCESS
    })
}

/// A process counts while it exists and is not a zombie.
fn process_alive(pid: u32) -> bool {
    !gpuslice::sched::procfs::ended(pid)
}

// -------------------------------------------------------------- processes

#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: *mut std::ffi::c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Ret {
    with(|s| {
        let (t, _, _, _) = decode(device);
        let Some((g, gi, ci)) = gpu_of(s, device, t) else {
            return INVALID_ARGUMENT;
        };
        let mut procs: Vec<(u32, u64, u32, u32)> = Vec::new();
        if t == TAG_GPU {
            procs.extend(
                g.processes
                    .iter()
                    .map(|p| (p.pid, p.mib, u32::MAX, u32::MAX)),
            );
        }
        for x in &g.gis {
            for c in &x.cis {
                if t == TAG_GPU || (x.id == gi && c.id == ci) {
                    procs.extend(c.processes.iter().map(|p| (p.pid, p.mib, x.id, c.id)));
                }
            }
        }
        procs.retain(|p| process_alive(p.0));
        if infos.is_null() || (*count as usize) < procs.len() {
            let had = *count;
            *count = procs.len() as c_uint;
            return if procs.is_empty() || (!infos.is_null() && had as usize >= procs.len()) {
                SUCCESS
            } else {
                INSUFFICIENT_SIZE
            };
        }
        for (i, p) in procs.iter().enumerate() {
            *infos.add(i) = ProcessInfo {
                pid: p.0,
                used_gpu_memory: p.1 * 1024 * 1024,
                gpu_instance_id: p.2,
                compute_instance_id: p.3,
            };
        }
        *count = procs.len() as c_uint;
        SUCCESS
    })
}

// -------------------------------------------------------------- telemetry

/// What a GPU reports now: the load model over its live processes, with
/// the staged values on top.
fn telemetry(g: &Gpu) -> gpuslice::gpu::Telemetry {
    use gpuslice::gpu::sim::{model_telemetry, Load};
    let m = model(g);
    let total = (m.memory_gib * 1024.0) as u64;
    let live = |ps: &[Proc]| ps.iter().filter(|p| process_alive(p.pid)).count();
    let loads: Vec<Load> = if g.mig_current {
        g.gis
            .iter()
            .flat_map(|x| {
                let p = m.profile_by_id(x.profile_id);
                x.cis.iter().map(move |c| Load {
                    device_uuid: &c.uuid,
                    compute_fraction: p.map(|p| f64::from(p.compute_slices)).unwrap_or(1.0)
                        / f64::from(m.compute_slices.max(1)),
                    memory_total_mib: p.map(|p| (p.memory_gib * 1024.0) as u64).unwrap_or(0),
                    memory_used_mib: c.processes.iter().map(|p| p.mib).sum(),
                    processes: live(&c.processes),
                })
            })
            .collect()
    } else {
        vec![Load {
            device_uuid: &g.uuid,
            compute_fraction: 1.0,
            memory_total_mib: total,
            memory_used_mib: g.processes.iter().map(|p| p.mib).sum(),
            processes: live(&g.processes),
        }]
    };
    let mut t = model_telemetry(&g.model, g.mig_current, total, &loads);
    g.staged.apply(&mut t);
    t
}

/// Runs `f` on the telemetry of a (not lost) GPU handle.
unsafe fn read_telemetry(
    device: *mut std::ffi::c_void,
    f: impl FnOnce(&Gpu, gpuslice::gpu::Telemetry) -> Ret,
) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return NOT_SUPPORTED;
        };
        if g.staged.lost {
            return GPU_IS_LOST;
        }
        let t = telemetry(g);
        f(g, t)
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(
    device: *mut std::ffi::c_void,
    _sensor: c_uint,
    temp: *mut c_uint,
) -> Ret {
    read_telemetry(device, |_, t| match t.temperature_c {
        Some(v) => {
            *temp = v;
            SUCCESS
        }
        None => NOT_SUPPORTED,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(
    device: *mut std::ffi::c_void,
    milliwatts: *mut c_uint,
) -> Ret {
    read_telemetry(device, |_, t| match t.power_w {
        Some(v) => {
            *milliwatts = (v * 1000.0) as c_uint;
            SUCCESS
        }
        None => NOT_SUPPORTED,
    })
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// Not supported on MIG-enabled GPUs and MIG devices, as on real hardware
/// (unless a test staged a value).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    device: *mut std::ffi::c_void,
    util: *mut Utilization,
) -> Ret {
    read_telemetry(device, |_, t| match t.utilization_pct {
        Some(v) => {
            *util = Utilization {
                gpu: v,
                memory: v / 3,
            };
            SUCCESS
        }
        None => NOT_SUPPORTED,
    })
}

/// `nvmlDeviceGetTotalEccErrors`: uncorrected volatile errors as staged.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: *mut std::ffi::c_void,
    error_type: c_uint,
    _counter_type: c_uint,
    count: *mut c_ulonglong,
) -> Ret {
    read_telemetry(device, |_, t| {
        // NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1.
        *count = if error_type == 1 {
            t.ecc_uncorrectable.unwrap_or(0)
        } else {
            0
        };
        SUCCESS
    })
}

/// `nvmlDeviceGetClockInfo`: graphics/SM (0, 1) and memory (2) clocks.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: *mut std::ffi::c_void,
    clock: c_uint,
    mhz: *mut c_uint,
) -> Ret {
    read_telemetry(device, |_, t| {
        let v = match clock {
            0 | 1 => t.sm_clock_mhz,
            2 => t.mem_clock_mhz,
            _ => None,
        };
        match v {
            Some(v) => {
                *mhz = v;
                SUCCESS
            }
            None => NOT_SUPPORTED,
        }
    })
}

// ------------------------------------------------------------------ events
// One event set per process is enough for gpuslice; its handle is a tag.

const EVENT_SET: usize = 0x5e7;

#[repr(C)]
pub struct EventData {
    device: *mut std::ffi::c_void,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut *mut std::ffi::c_void) -> Ret {
    if set.is_null() {
        return INVALID_ARGUMENT;
    }
    *set = EVENT_SET as *mut std::ffi::c_void;
    SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceRegisterEvents(
    device: *mut std::ffi::c_void,
    _types: c_ulonglong,
    set: *mut std::ffi::c_void,
) -> Ret {
    if set as usize != EVENT_SET {
        return INVALID_ARGUMENT;
    }
    with(|s| match gpu_of(s, device, TAG_GPU) {
        Some(_) => SUCCESS,
        None => INVALID_ARGUMENT,
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetFree(set: *mut std::ffi::c_void) -> Ret {
    if set as usize == EVENT_SET {
        SUCCESS
    } else {
        INVALID_ARGUMENT
    }
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(
    set: *mut std::ffi::c_void,
    data: *mut EventData,
    timeout_ms: c_uint,
) -> Ret {
    if set as usize != EVENT_SET || data.is_null() {
        return INVALID_ARGUMENT;
    }
    let deadline =
        std::time::Instant::now() + std::time::Duration::from_millis(u64::from(timeout_ms));
    loop {
        let got = {
            let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
            let Some(s) = guard.as_mut() else {
                return UNINITIALIZED;
            };
            let found = s
                .gpus
                .iter_mut()
                .enumerate()
                .find_map(|(i, g)| (!g.events.is_empty()).then(|| (i, g.events.remove(0))));
            if found.is_some() {
                save(s);
            }
            found
        };
        if let Some((i, (kind, code))) = got {
            *data = EventData {
                device: handle(TAG_GPU, i, 0, 0),
                event_type: kind,
                event_data: code,
                gpu_instance_id: 0xFFFF_FFFF,
                compute_instance_id: 0xFFFF_FFFF,
            };
            return SUCCESS;
        }
        if std::time::Instant::now() >= deadline {
            return TIMEOUT;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

// ------------------------------------------------- the world outside NVML

/// Test hook: a process starts using the GPU or MIG device with this uuid.
#[no_mangle]
pub unsafe extern "C" fn gpusliceStandinAttachProcess(
    uuid: *const c_char,
    pid: c_uint,
    mib: c_ulonglong,
) -> Ret {
    let want = CStr::from_ptr(uuid).to_string_lossy().to_string();
    with(|s| {
        for g in &mut s.gpus {
            if g.uuid == want {
                g.processes.push(Proc { pid, mib });
                return SUCCESS;
            }
            for x in &mut g.gis {
                for c in &mut x.cis {
                    if c.uuid == want {
                        c.processes.push(Proc { pid, mib });
                        return SUCCESS;
                    }
                }
            }
        }
        NOT_FOUND
    })
}

/// Test hook: somebody else (`nvidia-smi mig -cgi … -cci …`) makes a GPU
/// instance of `profile_id` at `start` with `ci_count` compute instances
/// of compute-instance profile `ci_profile`, behind gpuslice's back.
#[no_mangle]
pub unsafe extern "C" fn gpusliceStandinForeign(
    device: *mut std::ffi::c_void,
    profile_id: c_uint,
    start: c_uint,
    ci_profile: c_uint,
    ci_count: c_uint,
) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        let m = model(g);
        let Some(p) = m.profile_by_id(profile_id) else {
            return INVALID_ARGUMENT;
        };
        let pl = Placement {
            start: start as u8,
            size: p.memory_slices,
        };
        if let Err(e) = mig::check_create(m, &existing(g), profile_id, pl) {
            return e.nvml_code();
        }
        let id = g.next_gi;
        g.next_gi += 1;
        let cis = (0..ci_count)
            .map(|i| Ci {
                id: i,
                profile_id: ci_profile,
                uuid: format!("MIG-{}", uuid::Uuid::new_v4()),
                processes: Vec::new(),
                idle_since_ms: None,
            })
            .collect();
        g.gis.push(Gi {
            id,
            profile_id,
            placement: pl,
            cis,
        });
        SUCCESS
    })
}

/// Test hook: how driver-like this copy is: a compute instance's busy time
/// after its last process (ms), GPU-instance profiles it does not know
/// (comma-separated names; null: none), and whether privileged MIG queries
/// are refused.
#[no_mangle]
pub unsafe extern "C" fn gpusliceStandinConfigure(
    ci_busy_ms: c_ulonglong,
    hidden: *const c_char,
    unprivileged: c_uint,
) -> Ret {
    let hidden: Vec<String> = if hidden.is_null() {
        Vec::new()
    } else {
        CStr::from_ptr(hidden)
            .to_string_lossy()
            .split(',')
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .collect()
    };
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        None => UNINITIALIZED,
        Some(s) => {
            s.config = Config {
                ci_busy_ms,
                hidden,
                unprivileged: unprivileged != 0,
            };
            SUCCESS
        }
    }
}

/// Test hook: a GPU reset, which applies a pending MIG mode.
#[no_mangle]
pub unsafe extern "C" fn gpusliceStandinReset(device: *mut std::ffi::c_void) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        g.mig_current = g.mig_pending;
        g.gis.clear();
        g.processes.clear();
        SUCCESS
    })
}

/// Test hook: stage what a GPU reports (`gpuslice::gpu::sim::Staged` as
/// JSON), as `gpuslice sim set` does for the simulated backend.
#[no_mangle]
pub unsafe extern "C" fn gpusliceStandinStage(
    device: *mut std::ffi::c_void,
    json: *const c_char,
) -> Ret {
    let Ok(staged) =
        serde_json::from_str::<gpuslice::gpu::sim::Staged>(&CStr::from_ptr(json).to_string_lossy())
    else {
        return INVALID_ARGUMENT;
    };
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        g.staged = staged;
        SUCCESS
    })
}

/// Test hook: the driver reports an event (NVML event type and data).
#[no_mangle]
pub unsafe extern "C" fn gpusliceStandinEvent(
    device: *mut std::ffi::c_void,
    kind: c_ulonglong,
    code: c_ulonglong,
) -> Ret {
    with(|s| {
        let Some((g, _, _)) = gpu_of(s, device, TAG_GPU) else {
            return INVALID_ARGUMENT;
        };
        g.events.push((kind, code));
        SUCCESS
    })
}
