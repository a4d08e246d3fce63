//! The stand-in `libcuda.so`'s machine-wide state: one simulated GPU shared
//! by every process on the machine, kept in a shared file
//! (`GPUSLICE_CUDA_STANDIN_STATE`, default `/tmp/gpuslice-cuda-standin`).
//! Kernels of all processes run one at a time: each launch reserves the
//! next free stretch of the GPU's timeline, so work queued before a freeze
//! still occupies the GPU, as on a real one. Each process with a context
//! has a slot (what NVML would list on the GPU), with the device it was
//! given (`CUDA_VISIBLE_DEVICES`), the GPU time its launches reserved and
//! the memory it holds.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

pub const ENV_STATE: &str = "GPUSLICE_CUDA_STANDIN_STATE";
pub const MAGIC: u32 = 0x6763_7331; // "gcs1"
pub const PROCS: usize = 256;
pub const DEVICE_LEN: usize = 64;

/// A process with a context on the simulated GPU.
#[repr(C)]
pub struct Proc {
    /// 0: free.
    pub pid: AtomicU32,
    /// 1 once `device` is written.
    pub ready: AtomicU32,
    /// GPU time its launches reserved, ns.
    pub gpu_ns: AtomicU64,
    /// GPU memory it holds, bytes.
    pub mem: AtomicU64,
    pub launches: AtomicU64,
    /// When its last queued stretch ends (CLOCK_MONOTONIC ns).
    pub last_end_ns: AtomicU64,
    /// `CUDA_VISIBLE_DEVICES` when it created its context (NUL-padded).
    pub device: [AtomicU8; DEVICE_LEN],
}

#[repr(C)]
pub struct State {
    pub magic: AtomicU32,
    _pad: u32,
    /// CLOCK_MONOTONIC ns at which the GPU is next free.
    pub next_free_ns: AtomicU64,
    pub procs: [Proc; PROCS],
}

/// The state file's path.
pub fn state_path() -> PathBuf {
    std::env::var_os(ENV_STATE)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/gpuslice-cuda-standin"))
}

impl Proc {
    pub fn device(&self) -> String {
        let bytes: Vec<u8> = self
            .device
            .iter()
            .map(|b| b.load(Ordering::Acquire))
            .take_while(|b| *b != 0)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    pub fn set_device(&self, device: &str) {
        for (i, b) in self.device.iter().enumerate() {
            b.store(*device.as_bytes().get(i).unwrap_or(&0), Ordering::Release);
        }
    }
}

/// What a reader (the simulated NVML backend, a test) sees of a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcView {
    pub pid: u32,
    pub device: String,
    pub gpu_ns: u64,
    pub mem: u64,
    pub launches: u64,
    pub last_end_ns: u64,
}

impl State {
    /// Reserves `dur_ns` of the GPU from `now_ns` or when it is next free;
    /// returns the stretch's end.
    pub fn reserve(&self, now_ns: u64, dur_ns: u64) -> u64 {
        let mut cur = self.next_free_ns.load(Ordering::Acquire);
        loop {
            let end = cur.max(now_ns).saturating_add(dur_ns);
            match self.next_free_ns.compare_exchange_weak(
                cur,
                end,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return end,
                Err(seen) => cur = seen,
            }
        }
    }

    /// The processes with a context that are still running.
    pub fn live(&self) -> Vec<ProcView> {
        self.procs
            .iter()
            .filter_map(|p| {
                let pid = p.pid.load(Ordering::Acquire);
                if pid == 0 || p.ready.load(Ordering::Acquire) != 1 || !alive(pid) {
                    return None;
                }
                Some(ProcView {
                    pid,
                    device: p.device(),
                    gpu_ns: p.gpu_ns.load(Ordering::Acquire),
                    mem: p.mem.load(Ordering::Acquire),
                    launches: p.launches.load(Ordering::Acquire),
                    last_end_ns: p.last_end_ns.load(Ordering::Acquire),
                })
            })
            .collect()
    }
}

/// Whether a process is running (not ended, not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !matches!(
            s.rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next()),
            Some('Z') | Some('X') | None
        ),
        Err(_) => false,
    }
}

/// Opens the machine's state file (made if missing, open to every
/// account: it simulates hardware every process shares).
pub fn open() -> std::io::Result<crate::region::Mapped<State>> {
    let path = state_path();
    let m: crate::region::Mapped<State> = crate::region::Mapped::create(&path, 0o666)?;
    // umask may have narrowed the mode; the simulated GPU is everyone's.
    // SAFETY: fchmod on the mapping's own open descriptor.
    unsafe { libc::fchmod(m.fd(), 0o666) };
    let _ = m
        .magic
        .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire);
    Ok(m)
}

/// Reads the machine's state file if there is one (never creates it).
pub fn read() -> Option<Vec<ProcView>> {
    read_at(&state_path())
}

/// Reads the state file at `path` if there is one.
pub fn read_at(path: &std::path::Path) -> Option<Vec<ProcView>> {
    let m: crate::region::Mapped<State> = crate::region::Mapped::open(path, false).ok()?;
    Some(m.live())
}
