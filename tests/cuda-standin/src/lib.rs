//! A stand-in `libcuda.so` (soname `libcuda.so.1`) for gpuslice's tests:
//! the CUDA driver calls a kernel-launching program needs, over one
//! simulated GPU shared by every process on the machine
//! ([`gpuslice_cuda::standin`]).
//!
//! Like a real driver, and unlike a friendly mock:
//! - launches are asynchronous: `cuLaunchKernel` reserves the next free
//!   stretch of the machine-wide timeline (`gridDimX` microseconds) and
//!   returns; a process may have 1,024 launches queued before a launch
//!   blocks, as a stream's queue does; work queued before the process is
//!   frozen still occupies the GPU;
//! - `cuCtxSynchronize`, `cuStreamSynchronize` and `cuEventSynchronize`
//!   wait until the caller's stretches have passed; events complete when
//!   the work recorded before them has;
//! - memory is the GPU's, shared by all processes (48 GiB, or
//!   `GPUSLICE_CUDA_STANDIN_MEMORY_MIB`): an allocation past it fails with
//!   `CUDA_ERROR_OUT_OF_MEMORY`;
//! - every other symbol is found as the CUDA runtime finds it since 11.3,
//!   through `cuGetProcAddress` / `cuGetProcAddress_v2`, by base name with
//!   the version and per-thread-stream flag deciding the variant.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use gpuslice_cuda::api::*;
use gpuslice_cuda::now_ns;
use gpuslice_cuda::region::Mapped;
use gpuslice_cuda::standin::{self, State};

/// Launches a process may have queued before a launch blocks.
const QUEUE_DEPTH: usize = 1024;

struct Local {
    /// Ends of this process's queued stretches, oldest first.
    pending: VecDeque<u64>,
    last_end: u64,
    allocs: Option<HashMap<CUdeviceptr, u64>>,
    next_ptr: CUdeviceptr,
}

static LOCAL: Mutex<Local> = Mutex::new(Local {
    pending: VecDeque::new(),
    last_end: 0,
    allocs: None,
    next_ptr: 0x7000_0000_0000,
});
static MACHINE: OnceLock<Option<(Mapped<State>, usize)>> = OnceLock::new();

fn total_memory() -> u64 {
    std::env::var("GPUSLICE_CUDA_STANDIN_MEMORY_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(48 * 1024)
        * 1024
        * 1024
}

/// The machine's state and this process's slot (taken at the first
/// context, as a process appears on a GPU once it has one).
fn machine() -> Option<&'static (Mapped<State>, usize)> {
    MACHINE
        .get_or_init(|| {
            let state = standin::open().ok()?;
            let pid = std::process::id();
            let device = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
            let slot = state.procs.iter().position(|p| {
                let cur = p.pid.load(Ordering::Acquire);
                (cur == 0 || cur == pid || !standin::alive(cur))
                    && p.pid
                        .compare_exchange(cur, pid, Ordering::AcqRel, Ordering::Acquire)
                        .is_ok()
            })?;
            let p = &state.procs[slot];
            p.ready.store(0, Ordering::Release);
            p.gpu_ns.store(0, Ordering::Release);
            p.mem.store(0, Ordering::Release);
            p.launches.store(0, Ordering::Release);
            p.last_end_ns.store(0, Ordering::Release);
            p.set_device(&device);
            p.ready.store(1, Ordering::Release);
            Some((state, slot))
        })
        .as_ref()
}

fn sleep_until(t: u64) {
    let now = now_ns();
    if t > now {
        std::thread::sleep(std::time::Duration::from_nanos(t - now));
    }
}

fn local() -> std::sync::MutexGuard<'static, Local> {
    LOCAL.lock().unwrap_or_else(|e| e.into_inner())
}

unsafe fn out<T>(p: *mut T, v: T) -> CUresult {
    if p.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    p.write(v);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuInit(_flags: c_uint) -> CUresult {
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    out(v, 12040)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    out(n, 1)
}

#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(d: *mut CUdevice, ordinal: c_int) -> CUresult {
    if ordinal != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    out(d, 0)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxCreate_v2(
    ctx: *mut CUcontext,
    _flags: c_uint,
    dev: CUdevice,
) -> CUresult {
    if dev != 0 {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    if machine().is_none() {
        return CUDA_ERROR_NO_DEVICE;
    }
    out(ctx, 0x1 as CUcontext)
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let end = local().last_end;
    sleep_until(end);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(_s: CUstream) -> CUresult {
    cuCtxSynchronize()
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleLoadData(m: *mut CUmodule, image: *const c_void) -> CUresult {
    if image.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    out(m, 0x2 as CUmodule)
}

#[no_mangle]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut CUfunction,
    _m: CUmodule,
    name: *const c_char,
) -> CUresult {
    if name.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    out(f, 0x3 as CUfunction)
}

/// Queues `dur_ns` of work for this process.
fn launch(dur_ns: u64) -> CUresult {
    let Some((state, slot)) = machine() else {
        return CUDA_ERROR_INVALID_CONTEXT;
    };
    let mut l = local();
    loop {
        let now = now_ns();
        while l.pending.front().is_some_and(|&e| e <= now) {
            l.pending.pop_front();
        }
        if l.pending.len() < QUEUE_DEPTH {
            break;
        }
        let oldest = l.pending[0];
        drop(l);
        sleep_until(oldest);
        l = local();
    }
    let end = state.reserve(now_ns(), dur_ns);
    l.pending.push_back(end);
    l.last_end = end;
    let p = &state.procs[*slot];
    p.gpu_ns.fetch_add(dur_ns, Ordering::AcqRel);
    p.launches.fetch_add(1, Ordering::AcqRel);
    p.last_end_ns.store(end, Ordering::Release);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    _gy: c_uint,
    _gz: c_uint,
    _bx: c_uint,
    _by: c_uint,
    _bz: c_uint,
    _shared: c_uint,
    _stream: CUstream,
    _params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CUresult {
    if f.is_null() || grid_x == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    launch(u64::from(grid_x) * 1000)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    if dptr.is_null() || bytes == 0 {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let Some((state, slot)) = machine() else {
        return CUDA_ERROR_INVALID_CONTEXT;
    };
    let used: u64 = state.live().iter().map(|p| p.mem).sum();
    if used.saturating_add(bytes as u64) > total_memory() {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let mut l = local();
    let ptr = l.next_ptr;
    l.next_ptr += (bytes as u64).div_ceil(512) * 512;
    l.allocs
        .get_or_insert_with(HashMap::new)
        .insert(ptr, bytes as u64);
    state.procs[*slot]
        .mem
        .fetch_add(bytes as u64, Ordering::AcqRel);
    dptr.write(ptr);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    let Some((state, slot)) = machine() else {
        return CUDA_ERROR_INVALID_CONTEXT;
    };
    let held = local().allocs.as_mut().and_then(|a| a.remove(&ptr));
    match held {
        Some(bytes) => {
            state.procs[*slot].mem.fetch_sub(bytes, Ordering::AcqRel);
            CUDA_SUCCESS
        }
        None => CUDA_ERROR_INVALID_VALUE,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let used: u64 = machine()
        .map(|(s, _)| s.live().iter().map(|p| p.mem).sum())
        .unwrap_or(0);
    let t = total_memory();
    if out(free, t.saturating_sub(used) as usize) != CUDA_SUCCESS {
        return CUDA_ERROR_INVALID_VALUE;
    }
    out(total, t as usize)
}

/// An event: when the work recorded before it is done (0: never recorded,
/// which CUDA reports as complete).
#[no_mangle]
pub unsafe extern "C" fn cuEventCreate(ev: *mut CUevent, _flags: c_uint) -> CUresult {
    out(ev, Box::into_raw(Box::new(AtomicU64::new(0))).cast())
}

unsafe fn event<'a>(ev: CUevent) -> Option<&'a AtomicU64> {
    ev.cast::<AtomicU64>().as_ref()
}

#[no_mangle]
pub unsafe extern "C" fn cuEventRecord(ev: CUevent, _s: CUstream) -> CUresult {
    let Some(e) = event(ev) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    e.store(local().last_end.max(now_ns()), Ordering::Release);
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventQuery(ev: CUevent) -> CUresult {
    match event(ev) {
        None => CUDA_ERROR_INVALID_HANDLE,
        Some(e) if e.load(Ordering::Acquire) <= now_ns() => CUDA_SUCCESS,
        Some(_) => CUDA_ERROR_NOT_READY,
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuEventSynchronize(ev: CUevent) -> CUresult {
    let Some(e) = event(ev) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    sleep_until(e.load(Ordering::Acquire));
    CUDA_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, a: CUevent, b: CUevent) -> CUresult {
    let (Some(a), Some(b)) = (event(a), event(b)) else {
        return CUDA_ERROR_INVALID_HANDLE;
    };
    let (a, b) = (a.load(Ordering::Acquire), b.load(Ordering::Acquire));
    if a == 0 || b == 0 {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if a.max(b) > now_ns() {
        return CUDA_ERROR_NOT_READY;
    }
    out(ms, (b as f64 - a as f64) as f32 / 1e6)
}

#[no_mangle]
pub unsafe extern "C" fn cuEventDestroy_v2(ev: CUevent) -> CUresult {
    if ev.is_null() {
        return CUDA_ERROR_INVALID_HANDLE;
    }
    drop(Box::from_raw(ev.cast::<AtomicU64>()));
    CUDA_SUCCESS
}

/// The stand-in's function for a base name (the `_v2` variants for
/// versions that have them; per-thread-stream variants are the same here).
fn lookup(name: &str, version: c_int) -> Option<*mut c_void> {
    let f: *mut c_void = match name.trim_end_matches("_ptsz").trim_end_matches("_ptds") {
        "cuInit" => cuInit as *mut c_void,
        "cuDriverGetVersion" => cuDriverGetVersion as *mut c_void,
        "cuDeviceGet" => cuDeviceGet as *mut c_void,
        "cuDeviceGetCount" => cuDeviceGetCount as *mut c_void,
        "cuCtxCreate" | "cuCtxCreate_v2" => cuCtxCreate_v2 as *mut c_void,
        "cuCtxSynchronize" => cuCtxSynchronize as *mut c_void,
        "cuStreamSynchronize" => cuStreamSynchronize as *mut c_void,
        "cuModuleLoadData" => cuModuleLoadData as *mut c_void,
        "cuModuleGetFunction" => cuModuleGetFunction as *mut c_void,
        "cuLaunchKernel" => cuLaunchKernel as *mut c_void,
        "cuMemAlloc" | "cuMemAlloc_v2" => cuMemAlloc_v2 as *mut c_void,
        "cuMemFree" | "cuMemFree_v2" => cuMemFree_v2 as *mut c_void,
        "cuMemGetInfo" | "cuMemGetInfo_v2" => cuMemGetInfo_v2 as *mut c_void,
        "cuEventCreate" => cuEventCreate as *mut c_void,
        "cuEventRecord" => cuEventRecord as *mut c_void,
        "cuEventQuery" => cuEventQuery as *mut c_void,
        "cuEventSynchronize" => cuEventSynchronize as *mut c_void,
        "cuEventElapsedTime" => cuEventElapsedTime as *mut c_void,
        "cuEventDestroy" | "cuEventDestroy_v2" => cuEventDestroy_v2 as *mut c_void,
        "cuGetProcAddress" if version >= 12000 => cuGetProcAddress_v2 as *mut c_void,
        "cuGetProcAddress" => cuGetProcAddress as *mut c_void,
        "cuGetProcAddress_v2" => cuGetProcAddress_v2 as *mut c_void,
        _ => return None,
    };
    Some(f)
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    _flags: u64,
    status: *mut c_int,
) -> CUresult {
    if symbol.is_null() || pfn.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    let name = CStr::from_ptr(symbol).to_str().unwrap_or("");
    let (r, s, f) = match lookup(name, version) {
        Some(f) => (CUDA_SUCCESS, CU_GET_PROC_ADDRESS_SUCCESS, f),
        None => (
            CUDA_ERROR_NOT_FOUND,
            CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND,
            std::ptr::null_mut(),
        ),
    };
    pfn.write(f);
    if !status.is_null() {
        status.write(s);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    cuGetProcAddress_v2(symbol, pfn, version, flags, std::ptr::null_mut())
}
