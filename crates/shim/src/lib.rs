//! gpuslice's launch-layer shim (`libgpuslice_shim.so`), preloaded by
//! `gpuslice exec` into the processes of a time-sliced share.
//!
//! It interposes the CUDA driver API by symbol — for programs linked
//! against `libcuda`, for `dlsym` on a `libcuda` handle (it interposes
//! `dlsym` itself), and for `cuGetProcAddress` / `cuGetProcAddress_v2`,
//! through which the CUDA runtime has found every driver call since 11.3:
//!
//! - **launches** (`cuLaunchKernel`, `cuLaunchKernelEx`,
//!   `cuLaunchCooperativeKernel`, `cuGraphLaunch`, and their per-thread
//!   stream `_ptsz` variants) wait while the share is not admitted: not
//!   its turn, its GPU-time budget for the turn spent, or the work this
//!   process already queued would run past the turn's end. The worker's
//!   scheduler opens and closes turns in the share's control region and
//!   wakes waiting launches through a futex on it;
//! - each process keeps at most `max_queued_ns` of GPU work queued (by the
//!   measured mean kernel time) and 1,024 launches, so that a closed turn
//!   stops the GPU within about that time, not after the driver's whole
//!   queue drains;
//! - the GPU time launches take is measured on the GPU with events
//!   recorded after each launch (and before one that finds the process
//!   idle) and added to the share's report region: that, not CPU time or
//!   NVML's samples, is what the scheduler and the QoS ledger count;
//! - **allocations** (`cuMemAlloc_v2`, `cuMemAllocPitch_v2`,
//!   `cuMemAllocManaged`, `cuMemAllocAsync`, `cuMemCreate`) past the
//!   share's GPU memory fail with `CUDA_ERROR_OUT_OF_MEMORY`; frees give
//!   it back; `cuMemGetInfo_v2` reports the share's memory, not the GPU's.
//!
//! Without the share's regions in the environment (`GPUSLICE_SHARE_CONTROL`,
//! `GPUSLICE_SHARE_REPORT`) every call passes straight through and the
//! process is not registered, so the worker finds it as unshimmed.
//! What it cannot stop (statically linked CUDA, raw ioctls, a process that
//! rewrites its own memory) is in gpuslice's docs/security.md.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, OnceLock};

use gpuslice_cuda::api::*;
use gpuslice_cuda::now_ns;
use gpuslice_cuda::region::{self, Control, Mapped, Report};

// ---------------------------------------------------------------------
// The real functions.

type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// glibc's own `dlsym` (this library's `dlsym` is the interposed one).
static GPUSLICE_REAL_DLSYM: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

fn real_dlsym() -> DlsymFn {
    let mut p = GPUSLICE_REAL_DLSYM.load(Ordering::Acquire);
    if p.is_null() {
        for version in [c"GLIBC_2.34", c"GLIBC_2.2.5", c"GLIBC_2.17"] {
            // SAFETY: dlvsym with a NUL-terminated name and version.
            p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), version.as_ptr()) };
            if !p.is_null() {
                break;
            }
        }
        if p.is_null() {
            eprintln!("gpuslice shim: cannot find glibc's dlsym; refusing to run");
            std::process::abort();
        }
        GPUSLICE_REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: glibc's dlsym has this signature; a missing one is fatal
    // for any program that loads libraries, as without the shim.
    unsafe { std::mem::transmute::<*mut c_void, DlsymFn>(p) }
}

/// The driver library's handle.
fn libcuda() -> *mut c_void {
    static H: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());
    let mut h = H.load(Ordering::Acquire);
    if h.is_null() {
        // SAFETY: dlopen of a NUL-terminated name.
        h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD) };
        if h.is_null() {
            // SAFETY: as above.
            h = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
        }
        H.store(h, Ordering::Release);
    }
    h
}

macro_rules! hooks {
    ($( $id:ident = $sym:literal => $hook:ident ),* $(,)?) => {
        #[derive(Clone, Copy, PartialEq, Eq, Debug)]
        #[allow(clippy::upper_case_acronyms)]
        enum Hook { $( $id ),* }
        const ALL: &[Hook] = &[ $( Hook::$id ),* ];
        impl Hook {
            fn symbol(self) -> &'static CStr {
                match self { $( Hook::$id => $sym ),* }
            }
            fn ours(self) -> *mut c_void {
                match self { $( Hook::$id => $hook as *mut c_void ),* }
            }
        }
    };
}

hooks! {
    LaunchKernel = c"cuLaunchKernel" => cuLaunchKernel,
    LaunchKernelPtsz = c"cuLaunchKernel_ptsz" => cuLaunchKernel_ptsz,
    LaunchKernelEx = c"cuLaunchKernelEx" => cuLaunchKernelEx,
    LaunchKernelExPtsz = c"cuLaunchKernelEx_ptsz" => cuLaunchKernelEx_ptsz,
    LaunchCooperative = c"cuLaunchCooperativeKernel" => cuLaunchCooperativeKernel,
    LaunchCooperativePtsz = c"cuLaunchCooperativeKernel_ptsz" => cuLaunchCooperativeKernel_ptsz,
    GraphLaunch = c"cuGraphLaunch" => cuGraphLaunch,
    GraphLaunchPtsz = c"cuGraphLaunch_ptsz" => cuGraphLaunch_ptsz,
    MemAlloc = c"cuMemAlloc_v2" => cuMemAlloc_v2,
    MemAllocPitch = c"cuMemAllocPitch_v2" => cuMemAllocPitch_v2,
    MemAllocManaged = c"cuMemAllocManaged" => cuMemAllocManaged,
    MemAllocAsync = c"cuMemAllocAsync" => cuMemAllocAsync,
    MemAllocAsyncPtsz = c"cuMemAllocAsync_ptsz" => cuMemAllocAsync_ptsz,
    MemFree = c"cuMemFree_v2" => cuMemFree_v2,
    MemFreeAsync = c"cuMemFreeAsync" => cuMemFreeAsync,
    MemFreeAsyncPtsz = c"cuMemFreeAsync_ptsz" => cuMemFreeAsync_ptsz,
    MemCreate = c"cuMemCreate" => cuMemCreate,
    MemRelease = c"cuMemRelease" => cuMemRelease,
    MemGetInfo = c"cuMemGetInfo_v2" => cuMemGetInfo_v2,
    CtxSynchronize = c"cuCtxSynchronize" => cuCtxSynchronize,
    StreamSynchronize = c"cuStreamSynchronize" => cuStreamSynchronize,
    StreamSynchronizePtsz = c"cuStreamSynchronize_ptsz" => cuStreamSynchronize_ptsz,
    GetProcAddress = c"cuGetProcAddress" => cuGetProcAddress,
    GetProcAddressV2 = c"cuGetProcAddress_v2" => cuGetProcAddress_v2,
}

static REAL: [AtomicPtr<c_void>; 24] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 24];

impl Hook {
    fn index(self) -> usize {
        ALL.iter().position(|h| *h == self).unwrap_or(0)
    }

    /// The exact driver symbol a program asked for by name.
    fn by_symbol(name: &[u8]) -> Option<Hook> {
        ALL.iter().copied().find(|h| h.symbol().to_bytes() == name)
    }

    /// The hook for what `cuGetProcAddress` returns for a base name at a
    /// CUDA version, with or without per-thread default streams.
    fn by_base(name: &[u8], version: c_int, ptds: bool) -> Option<Hook> {
        let h = match name {
            b"cuLaunchKernel" if ptds => Hook::LaunchKernelPtsz,
            b"cuLaunchKernel" => Hook::LaunchKernel,
            b"cuLaunchKernelEx" if ptds => Hook::LaunchKernelExPtsz,
            b"cuLaunchKernelEx" => Hook::LaunchKernelEx,
            b"cuLaunchCooperativeKernel" if ptds => Hook::LaunchCooperativePtsz,
            b"cuLaunchCooperativeKernel" => Hook::LaunchCooperative,
            b"cuGraphLaunch" if ptds => Hook::GraphLaunchPtsz,
            b"cuGraphLaunch" => Hook::GraphLaunch,
            // Before 3.2 these names meant 32-bit sizes; not hooked.
            b"cuMemAlloc" if version >= 3020 => Hook::MemAlloc,
            b"cuMemAllocPitch" if version >= 3020 => Hook::MemAllocPitch,
            b"cuMemFree" if version >= 3020 => Hook::MemFree,
            b"cuMemGetInfo" if version >= 3020 => Hook::MemGetInfo,
            b"cuMemAllocManaged" => Hook::MemAllocManaged,
            b"cuMemAllocAsync" if ptds => Hook::MemAllocAsyncPtsz,
            b"cuMemAllocAsync" => Hook::MemAllocAsync,
            b"cuMemFreeAsync" if ptds => Hook::MemFreeAsyncPtsz,
            b"cuMemFreeAsync" => Hook::MemFreeAsync,
            b"cuMemCreate" => Hook::MemCreate,
            b"cuMemRelease" => Hook::MemRelease,
            b"cuCtxSynchronize" => Hook::CtxSynchronize,
            b"cuStreamSynchronize" if ptds => Hook::StreamSynchronizePtsz,
            b"cuStreamSynchronize" => Hook::StreamSynchronize,
            b"cuGetProcAddress" if version >= 12000 => Hook::GetProcAddressV2,
            b"cuGetProcAddress" => Hook::GetProcAddress,
            _ => return None,
        };
        Some(h)
    }

    /// Remembers the driver's function behind this hook (never the hook
    /// itself: asking the global scope finds this library first).
    fn learn(self, real: *mut c_void) {
        if !real.is_null() && real != self.ours() {
            REAL[self.index()].store(real, Ordering::Release);
        }
    }

    /// The driver's function behind this hook.
    fn real(self) -> *mut c_void {
        let p = REAL[self.index()].load(Ordering::Acquire);
        if !p.is_null() {
            return p;
        }
        let dlsym = real_dlsym();
        // SAFETY: glibc's dlsym with a NUL-terminated name.
        let mut p = unsafe { dlsym(libc::RTLD_NEXT, self.symbol().as_ptr()) };
        if p.is_null() || p == self.ours() {
            let h = libcuda();
            // SAFETY: as above, on the driver's handle.
            p = if h.is_null() {
                std::ptr::null_mut()
            } else {
                unsafe { dlsym(h, self.symbol().as_ptr()) }
            };
        }
        self.learn(p);
        REAL[self.index()].load(Ordering::Acquire)
    }
}

macro_rules! real {
    ($hook:expr, $ty:ty) => {{
        let p = $hook.real();
        if p.is_null() {
            return CUDA_ERROR_NOT_INITIALIZED;
        }
        // SAFETY: the driver's function of that name has this signature
        // (CUDA Driver API reference).
        unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
    }};
}

// ---------------------------------------------------------------------
// The share.

struct Share {
    control: Mapped<Control>,
    report: Mapped<Report>,
    slot: Option<usize>,
}

static SHARE: OnceLock<Option<Share>> = OnceLock::new();

/// A running process's start time (clock ticks since boot); `None`:
/// ended, a zombie, or not visible from here.
fn proc_start(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(") ")?;
    let mut fields = rest.split_whitespace();
    if matches!(fields.next(), Some("Z") | Some("X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

fn start_ticks() -> u64 {
    proc_start(std::process::id()).unwrap_or(0)
}

fn share() -> Option<&'static Share> {
    SHARE
        .get_or_init(|| {
            let control = std::env::var_os(region::ENV_CONTROL)?;
            let report = std::env::var_os(region::ENV_REPORT)?;
            let opened = Mapped::<Control>::open(control.as_ref(), false).and_then(|c| {
                Mapped::<Report>::open(report.as_ref(), true).map(|r| (c, r))
            });
            // The control region must be the worker's: root's, written by
            // no one else (a user's own file could grant any budget).
            let opened = opened.and_then(|(c, r)| {
                use std::os::unix::fs::MetadataExt;
                let m = c.metadata()?;
                if m.uid() != 0 || m.mode() & 0o022 != 0 {
                    return Err(std::io::Error::other(
                        "the control region is not the worker's (root's, not writable by others)",
                    ));
                }
                Ok((c, r))
            });
            match opened {
                Ok((control, report)) => {
                    // Processes of the share that ended give their slots
                    // and memory back (the worker only reads the report).
                    report.reap(|pid, start| proc_start(pid) == Some(start));
                    let slot = report.register(std::process::id(), start_ticks());
                    if slot.is_none() {
                        eprintln!("gpuslice shim: the share has no free process slot; this process is not registered and the worker will freeze it");
                    }
                    Some(Share {
                        control,
                        report,
                        slot,
                    })
                }
                Err(e) => {
                    eprintln!("gpuslice shim: cannot open the share's regions ({e}); launches are not gated and the worker will freeze this process");
                    None
                }
            }
        })
        .as_ref()
}

/// Registers the process when the library loads, so that the worker
/// knows it is shimmed before its first CUDA call.
extern "C" fn on_load() {
    let _ = real_dlsym();
    let _ = share();
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Gives the process's slot and memory back when it exits normally.
extern "C" fn on_unload() {
    if let Some(Some(s)) = SHARE.get() {
        if let Some(slot) = s.slot {
            s.report.unregister(slot, std::process::id());
        }
    }
}

#[used]
#[link_section = ".fini_array"]
static ON_UNLOAD: extern "C" fn() = on_unload;

// ---------------------------------------------------------------------
// Launches.

/// The driver's event calls the shim uses.
struct Events {
    create: cuEventCreate_t,
    record: cuEventRecord_t,
    record_ptsz: cuEventRecord_t,
    query: cuEventQuery_t,
    sync: cuEventSynchronize_t,
    elapsed: cuEventElapsedTime_t,
    destroy: cuEventDestroy_t,
    /// `cuStreamIsCapturing` where the driver has it.
    capturing: Option<cuStreamIsCapturing_t>,
}

fn driver_fn(name: &CStr, ptds: bool) -> *mut c_void {
    let mut p = std::ptr::null_mut();
    let flags = if ptds {
        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
    } else {
        0
    };
    let v2 = Hook::GetProcAddressV2.real();
    if !v2.is_null() {
        // SAFETY: cuGetProcAddress_v2's signature; live out-pointers.
        let f: cuGetProcAddress_v2_t = unsafe { std::mem::transmute(v2) };
        let mut status = 0;
        unsafe { f(name.as_ptr(), &mut p, 12000, flags, &mut status) };
    } else {
        let v1 = Hook::GetProcAddress.real();
        if !v1.is_null() {
            // SAFETY: cuGetProcAddress's signature; a live out-pointer.
            let f: cuGetProcAddress_t = unsafe { std::mem::transmute(v1) };
            unsafe { f(name.as_ptr(), &mut p, 11030, flags) };
        }
    }
    p
}

fn events() -> Option<&'static Events> {
    static E: OnceLock<Option<Events>> = OnceLock::new();
    E.get_or_init(|| {
        let get = |n: &CStr, ptds: bool| {
            let p = driver_fn(n, ptds);
            (!p.is_null()).then_some(p)
        };
        // SAFETY: each pointer is the driver's function of that name.
        unsafe {
            Some(Events {
                create: std::mem::transmute(get(c"cuEventCreate", false)?),
                record: std::mem::transmute(get(c"cuEventRecord", false)?),
                record_ptsz: std::mem::transmute(get(c"cuEventRecord", true)?),
                query: std::mem::transmute(get(c"cuEventQuery", false)?),
                sync: std::mem::transmute(get(c"cuEventSynchronize", false)?),
                elapsed: std::mem::transmute(get(c"cuEventElapsedTime", false)?),
                destroy: std::mem::transmute(get(c"cuEventDestroy", false)?),
                capturing: get(c"cuStreamIsCapturing", false)
                    .map(|p| std::mem::transmute::<*mut c_void, cuStreamIsCapturing_t>(p)),
            })
        }
    })
    .as_ref()
}

/// A launch not known to be finished: its end event, and its start event
/// when it found the process idle (else it started when the one before it
/// ended).
struct Pending {
    start: Option<CUevent>,
    end: CUevent,
}

struct Queue {
    pending: VecDeque<Pending>,
    /// The last finished launch's end event (the next one's start).
    prev_end: Option<CUevent>,
    free: Vec<CUevent>,
    /// Mean GPU time of a launch, ns (moving average).
    mean_ns: f64,
}

// SAFETY: the events are driver handles, usable from any thread of the
// process; the queue is only reached under its mutex.
unsafe impl Send for Queue {}

static QUEUE: Mutex<Queue> = Mutex::new(Queue {
    pending: VecDeque::new(),
    prev_end: None,
    free: Vec::new(),
    mean_ns: 0.0,
});

/// Launches a process may have queued and unfinished.
const MAX_PENDING: usize = 1024;
/// Queued GPU time per process when the worker set none.
const DEFAULT_MAX_QUEUED_NS: u64 = 2_000_000;
/// Longest single wait on the control word before looking again.
const WAIT_NS: u64 = 2_000_000;

impl Queue {
    fn event(&mut self, ev: &Events) -> Option<CUevent> {
        if let Some(e) = self.free.pop() {
            return Some(e);
        }
        let mut e = std::ptr::null_mut();
        // SAFETY: a live out-pointer.
        (unsafe { (ev.create)(&mut e, 0) } == CUDA_SUCCESS).then_some(e)
    }

    fn recycle(&mut self, e: CUevent, ev: &Events) {
        if self.free.len() < 64 {
            self.free.push(e);
        } else {
            // SAFETY: an event this queue created and no longer uses.
            unsafe { (ev.destroy)(e) };
        }
    }

    /// GPU time queued and unfinished, by the measured mean launch; until
    /// one launch was measured, any queued launch counts as a full queue
    /// (a first turn must not queue the driver's whole 1,024).
    fn queued_ns(&self) -> u64 {
        match (self.pending.len(), self.mean_ns) {
            (0, _) => 0,
            (_, m) if m == 0.0 => u64::MAX / 2,
            (n, m) => (n as f64 * m) as u64,
        }
    }

    /// Takes finished launches off the front, adding their GPU time to the
    /// share's report; `wait`: waits for the oldest first.
    fn retire(&mut self, ev: &Events, share: &Share, wait: bool) {
        if wait {
            if let Some(p) = self.pending.front() {
                // SAFETY: a live event of this queue.
                unsafe { (ev.sync)(p.end) };
            }
        }
        while let Some(p) = self.pending.front() {
            // SAFETY: a live event of this queue.
            let state = unsafe { (ev.query)(p.end) };
            if state == CUDA_ERROR_NOT_READY {
                break;
            }
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            if state != CUDA_SUCCESS {
                // A failed context or a lost event: the launch is not
                // waited for nor measured (waiting would never end).
                if let Some(s) = p.start {
                    self.recycle(s, ev);
                }
                if let Some(old) = self.prev_end.take() {
                    self.recycle(old, ev);
                }
                continue;
            }
            let base = p.start.or(self.prev_end);
            let mut ms: f32 = 0.0;
            if let Some(b) = base {
                // SAFETY: two live, completed events; a live out-pointer.
                if unsafe { (ev.elapsed)(&mut ms, b, p.end) } == CUDA_SUCCESS && ms > 0.0 {
                    let ns = (f64::from(ms) * 1e6) as u64;
                    share.report.add_used(share.slot, ns);
                    self.mean_ns = if self.mean_ns == 0.0 {
                        ns as f64
                    } else {
                        0.9 * self.mean_ns + 0.1 * ns as f64
                    };
                }
            }
            if let Some(s) = p.start {
                self.recycle(s, ev);
            }
            if let Some(old) = self.prev_end.replace(p.end) {
                self.recycle(old, ev);
            }
        }
    }
}

/// Gates one launch: waits until the share is admitted and this process's
/// queue has room, runs `launch`, and records its end.
fn gated(stream: CUstream, ptds: bool, launch: impl FnOnce() -> CUresult) -> CUresult {
    let (Some(share), Some(ev)) = (share(), events()) else {
        return launch();
    };
    // A launch into a stream being captured into a graph does not run now
    // (its graph's launch is gated), and events cannot be recorded there.
    if let Some(capturing) = ev.capturing {
        let mut status = CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the launch's stream and a live out-pointer.
        let r = unsafe { capturing(stream, &mut status) };
        if r != CUDA_SUCCESS || status != CU_STREAM_CAPTURE_STATUS_NONE {
            return launch();
        }
    }
    let control = &share.control;
    let mut q = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
    q.retire(ev, share, false);
    let mut held_since = None;
    loop {
        let max_queued = match control.max_queued_ns.load(Ordering::Acquire) {
            0 => DEFAULT_MAX_QUEUED_NS,
            v => v,
        };
        if q.pending.len() >= MAX_PENDING || (!q.pending.is_empty() && q.queued_ns() >= max_queued)
        {
            q.retire(ev, share, true);
            continue;
        }
        let generation = control.generation.load(Ordering::Acquire);
        let used = share.report.used_ns.load(Ordering::Acquire);
        if control.admits(used, q.queued_ns(), now_ns()) {
            break;
        }
        held_since.get_or_insert_with(now_ns);
        if q.pending.is_empty() {
            region::futex_wait(&control.generation, generation, WAIT_NS);
        } else {
            // Queued work finishing may be what admits the next launch.
            region::futex_wait(&control.generation, generation, WAIT_NS / 4);
        }
        q.retire(ev, share, false);
    }
    if let Some(t) = held_since {
        share
            .report
            .held_ns
            .fetch_add(now_ns().saturating_sub(t), Ordering::Relaxed);
    }
    let record = if ptds { ev.record_ptsz } else { ev.record };
    let start = if q.pending.is_empty() {
        q.event(ev).filter(|&e| {
            // SAFETY: a live event; the launch's stream.
            unsafe { record(e, stream) == CUDA_SUCCESS }
        })
    } else {
        None
    };
    let r = launch();
    if r == CUDA_SUCCESS {
        share.report.launches.fetch_add(1, Ordering::Relaxed);
        match q.event(ev) {
            // SAFETY: a live event; the launch's stream.
            Some(e) if unsafe { record(e, stream) } == CUDA_SUCCESS => {
                q.pending.push_back(Pending { start, end: e })
            }
            other => {
                if let Some(e) = other {
                    q.recycle(e, ev);
                }
                if let Some(s) = start {
                    q.recycle(s, ev);
                }
            }
        }
    } else if let Some(s) = start {
        q.recycle(s, ev);
    }
    r
}

/// After a synchronisation every launch before it is finished: account
/// for them now rather than at the next launch.
fn after_sync(r: CUresult) -> CUresult {
    if let (Some(share), Some(ev)) = (share(), events()) {
        let mut q = QUEUE.lock().unwrap_or_else(|e| e.into_inner());
        q.retire(ev, share, false);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real!(Hook::LaunchKernel, cuLaunchKernel_t);
    gated(stream, false, || unsafe {
        real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real!(Hook::LaunchKernelPtsz, cuLaunchKernel_t);
    gated(stream, true, || unsafe {
        real(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
    })
}

unsafe fn config_stream(config: *const CUlaunchConfig) -> CUstream {
    config
        .as_ref()
        .map(|c| c.h_stream)
        .unwrap_or(std::ptr::null_mut())
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real!(Hook::LaunchKernelEx, cuLaunchKernelEx_t);
    gated(config_stream(config), false, || unsafe {
        real(config, f, params, extra)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let real = real!(Hook::LaunchKernelExPtsz, cuLaunchKernelEx_t);
    gated(config_stream(config), true, || unsafe {
        real(config, f, params, extra)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    let real = real!(Hook::LaunchCooperative, cuLaunchCooperativeKernel_t);
    gated(stream, false, || unsafe {
        real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuLaunchCooperativeKernel_ptsz(
    f: CUfunction,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
) -> CUresult {
    let real = real!(Hook::LaunchCooperativePtsz, cuLaunchCooperativeKernel_t);
    gated(stream, true, || unsafe {
        real(f, gx, gy, gz, bx, by, bz, shared, stream, params)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch(g: CUgraphExec, stream: CUstream) -> CUresult {
    let real = real!(Hook::GraphLaunch, cuGraphLaunch_t);
    gated(stream, false, || unsafe { real(g, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(g: CUgraphExec, stream: CUstream) -> CUresult {
    let real = real!(Hook::GraphLaunchPtsz, cuGraphLaunch_t);
    gated(stream, true, || unsafe { real(g, stream) })
}

#[no_mangle]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    let real = real!(Hook::CtxSynchronize, cuCtxSynchronize_t);
    after_sync(real())
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize(s: CUstream) -> CUresult {
    let real = real!(Hook::StreamSynchronize, cuStreamSynchronize_t);
    after_sync(real(s))
}

#[no_mangle]
pub unsafe extern "C" fn cuStreamSynchronize_ptsz(s: CUstream) -> CUresult {
    let real = real!(Hook::StreamSynchronizePtsz, cuStreamSynchronize_t);
    after_sync(real(s))
}

// ---------------------------------------------------------------------
// Memory.

/// What this process holds: device pointers and allocation handles.
static HELD: Mutex<Option<HashMap<(bool, u64), u64>>> = Mutex::new(None);

/// Reserves `bytes` of the share's memory, runs `alloc`, and remembers
/// what it returned under `key` (`handle`: a `cuMemCreate` handle).
fn capped(bytes: u64, handle: bool, alloc: impl FnOnce() -> (CUresult, u64)) -> CUresult {
    let Some(share) = share() else {
        return alloc().0;
    };
    let limit = share.control.mem_limit.load(Ordering::Acquire);
    if !share.report.reserve(share.slot, bytes, limit) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let (r, key) = alloc();
    if r == CUDA_SUCCESS {
        HELD.lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert((handle, key), bytes);
    } else {
        share.report.unreserve(share.slot, bytes);
    }
    r
}

/// `capped` for the calls that return a device pointer through `dptr`.
unsafe fn capped_ptr(
    dptr: *mut CUdeviceptr,
    bytes: u64,
    alloc: impl FnOnce() -> CUresult,
) -> CUresult {
    capped(bytes, false, || {
        let r = alloc();
        // SAFETY: the driver wrote `dptr` (or left it) during `alloc`.
        (r, unsafe { dptr.as_ref() }.copied().unwrap_or(0))
    })
}

/// Gives back what `capped` reserved for `key` once the driver freed it.
fn released(r: CUresult, handle: bool, key: u64) -> CUresult {
    if r == CUDA_SUCCESS {
        if let Some(share) = share() {
            let bytes = HELD
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_mut()
                .and_then(|m| m.remove(&(handle, key)));
            if let Some(b) = bytes {
                share.report.unreserve(share.slot, b);
            }
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    let real = real!(Hook::MemAlloc, cuMemAlloc_t);
    capped_ptr(dptr, bytes as u64, || unsafe { real(dptr, bytes) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    let real = real!(Hook::MemAllocPitch, cuMemAllocPitch_t);
    capped_ptr(dptr, width.saturating_mul(height) as u64, || unsafe {
        real(dptr, pitch, width, height, elem)
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    let real = real!(Hook::MemAllocManaged, cuMemAllocManaged_t);
    capped_ptr(dptr, bytes as u64, || unsafe { real(dptr, bytes, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    s: CUstream,
) -> CUresult {
    let real = real!(Hook::MemAllocAsync, cuMemAllocAsync_t);
    capped_ptr(dptr, bytes as u64, || unsafe { real(dptr, bytes, s) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemAllocAsync_ptsz(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    s: CUstream,
) -> CUresult {
    let real = real!(Hook::MemAllocAsyncPtsz, cuMemAllocAsync_t);
    capped_ptr(dptr, bytes as u64, || unsafe { real(dptr, bytes, s) })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(ptr: CUdeviceptr) -> CUresult {
    let real = real!(Hook::MemFree, cuMemFree_t);
    released(real(ptr), false, ptr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    let real = real!(Hook::MemFreeAsync, cuMemFreeAsync_t);
    released(real(ptr, s), false, ptr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemFreeAsync_ptsz(ptr: CUdeviceptr, s: CUstream) -> CUresult {
    let real = real!(Hook::MemFreeAsyncPtsz, cuMemFreeAsync_t);
    released(real(ptr, s), false, ptr)
}

#[no_mangle]
pub unsafe extern "C" fn cuMemCreate(
    handle: *mut CUmemGenericAllocationHandle,
    bytes: usize,
    prop: *const CUmemAllocationProp,
    flags: u64,
) -> CUresult {
    let real = real!(Hook::MemCreate, cuMemCreate_t);
    capped(bytes as u64, true, || unsafe {
        let r = real(handle, bytes, prop, flags);
        (r, handle.as_ref().copied().unwrap_or(0))
    })
}

#[no_mangle]
pub unsafe extern "C" fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult {
    let real = real!(Hook::MemRelease, cuMemRelease_t);
    released(real(handle), true, handle)
}

/// The share's memory, as frameworks size their caches by it.
#[no_mangle]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    let real = real!(Hook::MemGetInfo, cuMemGetInfo_t);
    let r = real(free, total);
    if r != CUDA_SUCCESS || free.is_null() || total.is_null() {
        return r;
    }
    if let Some(share) = share() {
        let limit = share.control.mem_limit.load(Ordering::Acquire) as usize;
        if limit > 0 {
            let used = share.report.mem_used.load(Ordering::Acquire) as usize;
            *total = (*total).min(limit);
            *free = (*free).min(limit.saturating_sub(used));
        }
    }
    r
}

// ---------------------------------------------------------------------
// Finding the driver's functions.

/// Swaps the driver's function for its hook where there is one.
unsafe fn substitute(pfn: *mut *mut c_void, hook: Option<Hook>) {
    if let (Some(h), Some(p)) = (hook, pfn.as_mut()) {
        if !p.is_null() {
            h.learn(*p);
            *p = h.ours();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> CUresult {
    let real = real!(Hook::GetProcAddress, cuGetProcAddress_t);
    let r = real(symbol, pfn, version, flags);
    if r == CUDA_SUCCESS && !symbol.is_null() {
        let ptds = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
        substitute(
            pfn,
            Hook::by_base(CStr::from_ptr(symbol).to_bytes(), version, ptds),
        );
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> CUresult {
    let real = real!(Hook::GetProcAddressV2, cuGetProcAddress_v2_t);
    let r = real(symbol, pfn, version, flags, status);
    if r == CUDA_SUCCESS && !symbol.is_null() {
        let ptds = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
        substitute(
            pfn,
            Hook::by_base(CStr::from_ptr(symbol).to_bytes(), version, ptds),
        );
    }
    r
}

/// `dlsym` for names starting with "cu": the driver's symbol, with the
/// hook in its place where there is one.
unsafe extern "C" fn dlsym_cu(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let p = real_dlsym()(handle, name);
    if p.is_null() {
        return p;
    }
    match Hook::by_symbol(CStr::from_ptr(name).to_bytes()) {
        Some(h) => {
            h.learn(p);
            h.ours()
        }
        None => p,
    }
}

/// Before the real `dlsym` is known (only while this library loads).
unsafe extern "C" fn dlsym_slow(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    real_dlsym()(handle, name)
}

/// The interposed `dlsym`. Names not starting with "cu" jump straight to
/// glibc's, so that glibc sees the caller's return address and
/// `RTLD_NEXT` keeps meaning "after the caller" (a call from here would
/// make it "after the shim").
#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "test rsi, rsi",
        "jz 2f",
        "cmp byte ptr [rsi], 0x63",
        "jne 2f",
        "cmp byte ptr [rsi + 1], 0x75",
        "jne 2f",
        "jmp {cu}",
        "2:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 3f",
        "jmp rax",
        "3:",
        "jmp {slow}",
        cu = sym dlsym_cu,
        real = sym GPUSLICE_REAL_DLSYM,
        slow = sym dlsym_slow,
    )
}

/// Elsewhere the shim calls glibc's `dlsym` itself (`RTLD_NEXT` from the
/// program then means "after the shim").
#[cfg(not(target_arch = "x86_64"))]
#[no_mangle]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    if !name.is_null() && CStr::from_ptr(name).to_bytes().starts_with(b"cu") {
        dlsym_cu(handle, name)
    } else {
        real_dlsym()(handle, name)
    }
}
