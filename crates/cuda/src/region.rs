//! A time-sliced share's two shared-memory regions, one file each under
//! the worker's share directory:
//!
//! - the **control** region (`<booking>.control`), written by the worker
//!   only (the share's processes map it read-only): whether it is the
//!   share's turn, until when, how much GPU time it may reach in this turn,
//!   its GPU memory cap, and a generation word the shim sleeps on (a
//!   futex) so that a turn wakes it at once;
//! - the **report** region (`<booking>.report`), written by the share's
//!   shims: the GPU time its launches took (measured on the GPU), the GPU
//!   memory they hold, and one slot per process so that the worker can
//!   tell shimmed processes from others and give back the memory of
//!   processes that died.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const CONTROL_MAGIC: u32 = 0x6773_6331; // "gsc1"
pub const REPORT_MAGIC: u32 = 0x6773_7231; // "gsr1"
/// Processes of one share the report tracks at once.
pub const SLOTS: usize = 64;
/// A slot's pid while it is being filled in.
pub const CLAIMED: u32 = u32::MAX;

/// The environment variables `gpuslice exec` hands the shim.
pub const ENV_CONTROL: &str = "GPUSLICE_SHARE_CONTROL";
pub const ENV_REPORT: &str = "GPUSLICE_SHARE_REPORT";

/// Written by the worker.
#[repr(C)]
pub struct Control {
    pub magic: AtomicU32,
    /// 1: the share may launch (its turn, or it is alone on the GPU).
    pub open: AtomicU32,
    /// Bumped on every change; the shim waits on it (futex).
    pub generation: AtomicU32,
    _pad: u32,
    /// CLOCK_MONOTONIC ns at which the turn ends (`u64::MAX`: no end).
    pub until_ns: AtomicU64,
    /// The report's `used_ns` the share may reach in this turn.
    pub budget_ns: AtomicU64,
    /// GPU memory the share's processes may hold together, bytes (0: no cap).
    pub mem_limit: AtomicU64,
    /// GPU time a process may have queued and unfinished at once, ns.
    pub max_queued_ns: AtomicU64,
}

/// One process of the share, as its shim registered it.
#[repr(C)]
pub struct Slot {
    /// 0: free.
    pub pid: AtomicU32,
    _pad: u32,
    /// The process's start time (clock ticks since boot, `/proc/PID/stat`
    /// field 22), so a reused pid is not taken for it.
    pub start_ticks: AtomicU64,
    /// GPU memory it holds, bytes.
    pub mem: AtomicU64,
    /// GPU time its launches took, ns.
    pub used_ns: AtomicU64,
}

/// Written by the share's shims.
#[repr(C)]
pub struct Report {
    pub magic: AtomicU32,
    _pad: u32,
    /// GPU time the share's launches took, ns (monotonic).
    pub used_ns: AtomicU64,
    /// GPU memory the share's processes hold, bytes.
    pub mem_used: AtomicU64,
    /// Kernel and graph launches.
    pub launches: AtomicU64,
    /// Time launches waited for the share's turn, ns.
    pub held_ns: AtomicU64,
    /// Allocations refused for the memory cap.
    pub refused_allocs: AtomicU64,
    pub slots: [Slot; SLOTS],
}

/// A file mapped shared, as a `T`.
pub struct Mapped<T> {
    ptr: NonNull<T>,
    _file: File,
}

// SAFETY: `T`'s fields are atomics shared across processes anyway.
unsafe impl<T: Sync> Send for Mapped<T> {}
// SAFETY: as above.
unsafe impl<T: Sync> Sync for Mapped<T> {}

impl<T> std::ops::Deref for Mapped<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the mapping lives as long as `self` and has `T`'s size.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> Drop for Mapped<T> {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `map` mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), std::mem::size_of::<T>()) };
    }
}

impl<T> Mapped<T> {
    fn map(file: File, writable: bool) -> io::Result<Mapped<T>> {
        let size = std::mem::size_of::<T>();
        if file.metadata()?.len() < size as u64 {
            return Err(io::Error::other("the region file is too small"));
        }
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh shared mapping of an open file of at least `size`
        // bytes; the kernel chooses the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapped {
            ptr: NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?,
            _file: file,
        })
    }

    /// Maps an existing file; `writable: false` maps it read-only (a
    /// store through it faults).
    pub fn open(path: &Path, writable: bool) -> io::Result<Mapped<T>> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        Mapped::map(file, writable)
    }

    /// Creates (or reuses) the file at `path` with `mode`, sized for `T`,
    /// and maps it writable.
    pub fn create(path: &Path, mode: u32) -> io::Result<Mapped<T>> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        file.set_len(std::mem::size_of::<T>() as u64)?;
        Mapped::map(file, true)
    }

    /// The file's descriptor (to change its owner).
    pub fn fd(&self) -> std::os::fd::RawFd {
        self._file.as_raw_fd()
    }

    /// The mapped file's metadata (owner, mode).
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self._file.metadata()
    }
}

impl Control {
    /// Makes it the share's turn until `until_ns`, with `slice_ns` of GPU
    /// time over what it used so far, and wakes its waiting launches.
    pub fn open_turn(&self, used_ns: u64, slice_ns: u64, until_ns: u64) {
        self.budget_ns
            .store(used_ns.saturating_add(slice_ns), Ordering::Release);
        self.until_ns.store(until_ns, Ordering::Release);
        self.open.store(1, Ordering::Release);
        self.bump();
    }

    /// Open without end: the share is alone on its GPU.
    pub fn open_alone(&self) {
        self.budget_ns.store(u64::MAX, Ordering::Release);
        self.until_ns.store(u64::MAX, Ordering::Release);
        self.open.store(1, Ordering::Release);
        self.bump();
    }

    /// Ends the share's turn: launches wait from now on.
    pub fn close(&self) {
        self.open.store(0, Ordering::Release);
        self.bump();
    }

    pub fn is_open(&self) -> bool {
        self.open.load(Ordering::Acquire) == 1
    }

    fn bump(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        futex_wake(&self.generation);
    }

    /// Whether a launch may go now, given the report's GPU time so far and
    /// the GPU time this process has queued.
    pub fn admits(&self, used_ns: u64, queued_ns: u64, now_ns: u64) -> bool {
        self.is_open()
            && used_ns < self.budget_ns.load(Ordering::Acquire)
            && now_ns.saturating_add(queued_ns) < self.until_ns.load(Ordering::Acquire)
    }
}

impl Report {
    /// Takes a free slot for `pid` (or one a dead process left, as
    /// `alive` says); `None`: all taken.
    pub fn register(&self, pid: u32, start_ticks: u64) -> Option<usize> {
        for (i, s) in self.slots.iter().enumerate() {
            // Claimed first, published last: a reader never sees the pid
            // with a previous process's start time.
            if s.pid
                .compare_exchange(0, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                s.start_ticks.store(start_ticks, Ordering::Release);
                s.mem.store(0, Ordering::Release);
                s.used_ns.store(0, Ordering::Release);
                s.pid.store(pid, Ordering::Release);
                return Some(i);
            }
        }
        None
    }

    /// Gives slot `slot` back (the process ends), with its memory.
    pub fn unregister(&self, slot: usize, pid: u32) {
        if let Some(s) = self.slots.get(slot) {
            let mem = s.mem.swap(0, Ordering::AcqRel);
            let _ = self
                .mem_used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                    Some(m.saturating_sub(mem))
                });
            let _ = s
                .pid
                .compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Acquire);
        }
    }

    /// The registered processes: (pid, start ticks).
    pub fn registered(&self) -> Vec<(u32, u64)> {
        self.slots
            .iter()
            .filter_map(|s| {
                let pid = s.pid.load(Ordering::Acquire);
                (pid != 0 && pid != CLAIMED).then(|| (pid, s.start_ticks.load(Ordering::Acquire)))
            })
            .collect()
    }

    /// Frees the slots of processes that ended (`alive(pid, start)` is
    /// false), giving back the GPU memory they held (the driver frees a
    /// dead process's memory). Returns how many.
    pub fn reap(&self, alive: impl Fn(u32, u64) -> bool) -> usize {
        let mut n = 0;
        for s in &self.slots {
            let pid = s.pid.load(Ordering::Acquire);
            if pid == 0 || pid == CLAIMED || alive(pid, s.start_ticks.load(Ordering::Acquire)) {
                continue;
            }
            // Taken back only if still that process's (not re-registered).
            if s.pid
                .compare_exchange(pid, CLAIMED, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue;
            }
            let mem = s.mem.swap(0, Ordering::AcqRel);
            let _ = self
                .mem_used
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                    Some(m.saturating_sub(mem))
                });
            s.pid.store(0, Ordering::Release);
            n += 1;
        }
        n
    }

    /// Reserves `bytes` of the share's memory for slot `slot` under
    /// `limit` (0: none); false: over the cap, nothing reserved.
    pub fn reserve(&self, slot: Option<usize>, bytes: u64, limit: u64) -> bool {
        let ok = self
            .mem_used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                let next = m.checked_add(bytes)?;
                (limit == 0 || next <= limit).then_some(next)
            })
            .is_ok();
        if ok {
            if let Some(s) = slot.and_then(|i| self.slots.get(i)) {
                s.mem.fetch_add(bytes, Ordering::AcqRel);
            }
        } else {
            self.refused_allocs.fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Gives back what `reserve` took.
    pub fn unreserve(&self, slot: Option<usize>, bytes: u64) {
        let sub = |v: &AtomicU64| {
            let _ = v.fetch_update(Ordering::AcqRel, Ordering::Acquire, |m| {
                Some(m.saturating_sub(bytes))
            });
        };
        sub(&self.mem_used);
        if let Some(s) = slot.and_then(|i| self.slots.get(i)) {
            sub(&s.mem);
        }
    }

    /// Adds GPU time a launch of slot `slot` took.
    pub fn add_used(&self, slot: Option<usize>, ns: u64) {
        self.used_ns.fetch_add(ns, Ordering::AcqRel);
        if let Some(s) = slot.and_then(|i| self.slots.get(i)) {
            s.used_ns.fetch_add(ns, Ordering::AcqRel);
        }
    }
}

/// What the worker reads of a report region: by `pread`, never a mapping,
/// since the share's owner may write (or truncate) the file and a mapping
/// of a truncated file faults in the reader.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportSnapshot {
    pub used_ns: u64,
    pub mem_used: u64,
    /// Registered processes: (pid, start ticks).
    pub registered: Vec<(u32, u64)>,
}

/// Reads the report region at `path`; an error if it is not one (short,
/// wrong magic).
pub fn read_report(path: &Path) -> io::Result<ReportSnapshot> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; std::mem::size_of::<Report>()];
    let f = OpenOptions::new()
        .read(true)
        .custom_flags_nofollow()
        .open(path)?;
    f.read_exact_at(&mut buf, 0)?;
    let u32_at = |o: usize| u32::from_ne_bytes(buf[o..o + 4].try_into().unwrap_or([0; 4]));
    let u64_at = |o: usize| u64::from_ne_bytes(buf[o..o + 8].try_into().unwrap_or([0; 8]));
    if u32_at(std::mem::offset_of!(Report, magic)) != REPORT_MAGIC {
        return Err(io::Error::other("not a share report region"));
    }
    let slots = std::mem::offset_of!(Report, slots);
    let size = std::mem::size_of::<Slot>();
    let registered = (0..SLOTS)
        .filter_map(|i| {
            let o = slots + i * size;
            let pid = u32_at(o + std::mem::offset_of!(Slot, pid));
            (pid != 0 && pid != CLAIMED)
                .then(|| (pid, u64_at(o + std::mem::offset_of!(Slot, start_ticks))))
        })
        .collect();
    Ok(ReportSnapshot {
        used_ns: u64_at(std::mem::offset_of!(Report, used_ns)),
        mem_used: u64_at(std::mem::offset_of!(Report, mem_used)),
        registered,
    })
}

trait NoFollow {
    fn custom_flags_nofollow(&mut self) -> &mut Self;
}

impl NoFollow for OpenOptions {
    fn custom_flags_nofollow(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
    }
}

/// Waits while `word` holds `expected`, at most `timeout_ns` (a futex on
/// shared memory: the worker's wake reaches every process).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: `word` is a live, aligned u32; the timeout a live timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        )
    };
}

/// Wakes every process waiting on `word`.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: `word` is a live, aligned u32.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// The region files of booking `id` under `dir`.
pub fn paths(dir: &Path, id: i64) -> (std::path::PathBuf, std::path::PathBuf) {
    (
        dir.join(format!("{id}.control")),
        dir.join(format!("{id}.report")),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_cap_is_shared_and_given_back() {
        let dir = std::env::temp_dir().join(format!("gpuslice-region-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r: Mapped<Report> = Mapped::create(&dir.join("r"), 0o600).unwrap();
        r.magic.store(REPORT_MAGIC, Ordering::Release);
        let a = r.register(11, 1);
        let b = r.register(12, 1);
        assert_eq!((a, b), (Some(0), Some(1)));
        assert!(r.reserve(a, 6, 10));
        assert!(!r.reserve(b, 5, 10), "6 + 5 is over the cap of 10");
        assert!(r.reserve(b, 4, 10));
        assert_eq!(r.refused_allocs.load(Ordering::Relaxed), 1);
        // Process 11 died: its 6 come back.
        assert_eq!(r.reap(|pid, _| pid != 11), 1);
        assert_eq!(r.mem_used.load(Ordering::Relaxed), 4);
        assert_eq!(r.registered(), vec![(12, 1)]);
        let seen = read_report(&dir.join("r")).unwrap();
        assert_eq!(seen.registered, vec![(12, 1)]);
        assert_eq!(seen.mem_used, 4);
        r.unreserve(b, 4);
        assert_eq!(r.mem_used.load(Ordering::Relaxed), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_turn_admits_within_its_budget_and_time() {
        let dir = std::env::temp_dir().join(format!("gpuslice-control-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let c: Mapped<Control> = Mapped::create(&dir.join("c"), 0o600).unwrap();
        assert!(!c.admits(0, 0, 0), "closed until the worker opens it");
        c.open_turn(100, 50, 1_000);
        assert!(c.admits(100, 0, 10));
        assert!(!c.admits(150, 0, 10), "budget spent");
        assert!(
            !c.admits(100, 995, 10),
            "queued work would run past the turn"
        );
        c.close();
        assert!(!c.admits(100, 0, 10));
        c.open_alone();
        assert!(c.admits(u64::MAX - 1, 0, u64::MAX - 1));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
