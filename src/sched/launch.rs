//! Launch-layer enforcement of time-sliced shares: the worker's side of
//! the shim (`crates/shim`, `libgpuslice_shim.so`). Per share, two small
//! files under the node's share directory hold the shared-memory regions
//! ([`gpuslice_cuda::region`]): the control region the enforcer writes
//! (turns, GPU-time budgets, the memory cap) and the report region the
//! share's shims write (GPU time used, memory held, registered processes).
//!
//! Which GPU is enforced how is a node setting ([`TimeSlicing`]): at the
//! launch layer (the default where the shim is installed), by the cgroup
//! freezer alone, or by NVIDIA MPS for GPUs listed for it.

use std::path::{Path, PathBuf};

use gpuslice_cuda::region::{self, Control, Mapped, Report};

pub use gpuslice_cuda::region::{ENV_CONTROL, ENV_REPORT};

/// How a time-sliced GPU's shares are held to their part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Enforcement {
    /// The shim gates kernel launches by the scheduler's turns and budgets
    /// and caps GPU memory; the freezer holds processes found without it.
    Launch,
    /// The scheduler freezes and thaws the shares' cgroups (CPU side only).
    Freezer,
    /// NVIDIA MPS: clients run at once with a thread percentage and a
    /// pinned memory limit each (one fault domain).
    Mps,
}

impl Enforcement {
    pub fn as_str(self) -> &'static str {
        match self {
            Enforcement::Launch => "launch",
            Enforcement::Freezer => "freezer",
            Enforcement::Mps => "mps",
        }
    }

    pub fn parse(s: &str) -> Option<Enforcement> {
        match s {
            "launch" => Some(Enforcement::Launch),
            "freezer" => Some(Enforcement::Freezer),
            "mps" => Some(Enforcement::Mps),
            _ => None,
        }
    }

    /// What it holds and what it does not, for the fleet page.
    pub fn explain(self) -> &'static str {
        match self {
            Enforcement::Launch => "kernel launches gated by the scheduler (4:2:1 by priority, QoS from measured GPU time), GPU memory capped per share at allocation; a process without the shim is frozen",
            Enforcement::Freezer => "the scheduler freezes the other shares' processes; work they already queued on the GPU still runs, and GPU memory is only watched (warned, then ended)",
            Enforcement::Mps => "NVIDIA MPS: shares run at once, each limited to a part of the SMs and a pinned memory limit fixed when its process starts; one fault domain (a fatal error in one client ends every client), same-user inference only",
        }
    }
}

/// The node's time-slicing settings.
#[derive(Debug, Clone, Default)]
pub struct TimeSlicing {
    /// The shim library `gpuslice exec` preloads (`None`: not installed,
    /// or launch enforcement switched off: the freezer enforces).
    pub shim: Option<PathBuf>,
    /// Where the shares' region files live (reachable by the node's users).
    pub dir: PathBuf,
    /// GPUs (uuids) whose shares run under MPS; `["all"]`: every GPU.
    pub mps_gpus: Vec<String>,
}

impl TimeSlicing {
    /// How shares on GPU `uuid` are enforced.
    pub fn mode(&self, uuid: &str) -> Enforcement {
        if self.mps_gpus.iter().any(|g| g == "all" || g == uuid) {
            Enforcement::Mps
        } else if self.shim.is_some() {
            Enforcement::Launch
        } else {
            Enforcement::Freezer
        }
    }

    /// The MPS pipe directory of GPU `uuid`.
    pub fn mps_pipe(&self, uuid: &str) -> PathBuf {
        self.dir.join(format!("mps-{uuid}")).join("pipe")
    }

    /// The MPS log directory of GPU `uuid`.
    pub fn mps_log(&self, uuid: &str) -> PathBuf {
        self.dir.join(format!("mps-{uuid}")).join("log")
    }
}

/// Where the shim is looked for when no path is set: beside the `gpuslice`
/// binary (a build tree or a tarball), then where packages install it.
pub fn find_shim() -> Option<PathBuf> {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("libgpuslice_shim.so")));
    beside
        .into_iter()
        .chain([
            PathBuf::from("/usr/lib/gpuslice/libgpuslice_shim.so"),
            PathBuf::from("/usr/local/lib/gpuslice/libgpuslice_shim.so"),
        ])
        .find(|p| p.is_file())
}

/// A share's regions as the worker holds them: the control region mapped
/// (its own file), the report region by path (read with `pread`: its
/// owner may truncate it, which would fault a mapping in the worker).
pub struct Regions {
    pub control: Mapped<Control>,
    pub report: PathBuf,
}

/// Queued GPU time a process may hold: a fifth of the shortest slice, so a
/// closed turn stops the share's GPU work within 2 ms.
pub const MAX_QUEUED_NS: u64 = 2_000_000;

impl Regions {
    /// Opens booking `id`'s regions under `dir`, making them when missing
    /// (control: the worker's, readable by all; report: written by the
    /// share's processes, handed to its owner by [`Regions::give_to`]).
    /// A new control region starts closed.
    pub fn ensure(dir: &Path, id: i64, memory_bytes: u64) -> std::io::Result<Regions> {
        std::fs::create_dir_all(dir)?;
        let (c, r) = region::paths(dir, id);
        let control: Mapped<Control> = Mapped::create(&c, 0o644)?;
        if region::read_report(&r).is_err() {
            let report: Mapped<Report> = Mapped::create(&r, 0o600)?;
            report
                .magic
                .store(region::REPORT_MAGIC, std::sync::atomic::Ordering::Release);
        }
        use std::sync::atomic::Ordering;
        control
            .magic
            .store(region::CONTROL_MAGIC, Ordering::Release);
        control.mem_limit.store(memory_bytes, Ordering::Release);
        control
            .max_queued_ns
            .store(MAX_QUEUED_NS, Ordering::Release);
        Ok(Regions { control, report: r })
    }

    /// Lets Unix account `uid` write the report region (its shims
    /// register there); the control region stays the worker's.
    pub fn give_to(dir: &Path, id: i64, uid: u32) -> std::io::Result<()> {
        let (_, r) = region::paths(dir, id);
        std::os::unix::fs::lchown(&r, Some(uid), None)
    }

    /// Registered processes of the share that are still running, as host
    /// pids (`members`: the share's cgroup's processes, which a process
    /// registered from inside a container is matched against).
    pub fn registered_alive(&self, members: &[u32]) -> Vec<u32> {
        self.read()
            .map(|r| registered_hosts(&r.registered, members))
            .unwrap_or_default()
    }

    /// The report region as the share's shims left it (`None`: unreadable,
    /// which counts as nothing used and nobody registered).
    pub fn read(&self) -> Option<region::ReportSnapshot> {
        region::read_report(&self.report).ok()
    }
}

/// A process's pid in its innermost PID namespace (`NSpid`'s last field):
/// what a shim in a container registers as its own pid.
fn inner_pid(pid: u32) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// Whether host process `host` is the one that registered as (`pid`,
/// `start`): the same pid (or the same pid inside its namespace) and the
/// same start time (boot-relative, the same inside a container).
fn same_process(host: u32, pid: u32, start: u64) -> bool {
    let Some(s) = crate::sched::procfs::start_ticks(host) else {
        return false;
    };
    s == start
        && !crate::sched::procfs::ended(host)
        && (host == pid || inner_pid(host) == Some(pid))
}

/// The host pids of `registered` processes: a registration matches a
/// running host process of the same pid, or a member of the share's
/// cgroup whose namespaced pid and start time match.
pub fn registered_hosts(registered: &[(u32, u64)], members: &[u32]) -> Vec<u32> {
    let mut out = Vec::new();
    for &(pid, start) in registered {
        let host = members
            .iter()
            .copied()
            .find(|&m| same_process(m, pid, start))
            .or_else(|| same_process(pid, pid, start).then_some(pid));
        if let Some(h) = host {
            out.push(h);
        }
    }
    out
}

/// Whether the shim is mapped into process `pid`: a registration alone is
/// not proof, since a process that registered may `exec` a program
/// without it (same pid, same start time).
pub fn shim_loaded(pid: u32, shim: &Path, control: &Path) -> bool {
    let name = shim
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("libgpuslice_shim.so");
    let control = control.to_string_lossy();
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    // A library replaced by an upgrade shows " (deleted)"; still loaded.
    let paths: Vec<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5).map(|_| l))
        .map(|l| l.trim_end_matches(" (deleted)"))
        .collect();
    // The shim mapped, and this share's own control region (not a file
    // the user made and pointed the shim at).
    paths.iter().any(|l| l.ends_with(&format!("/{name}")))
        && paths.iter().any(|l| l.ends_with(control.as_ref()))
}

/// Removes booking `id`'s region files.
pub fn remove(dir: &Path, id: i64) {
    let (c, r) = region::paths(dir, id);
    let _ = std::fs::remove_file(c);
    let _ = std::fs::remove_file(r);
}

/// The environment `gpuslice exec` gives a share's process under MPS:
/// its part of the SMs by its priority's weight among `weights` (the
/// shares on the GPU, its own included) and its memory as a pinned limit.
/// The values are fixed when the process starts (MPS reads them then).
pub fn mps_env(
    pipe: &Path,
    weight: f64,
    weights: &[f64],
    memory_gib: i32,
) -> Vec<(String, String)> {
    let total: f64 = weights.iter().sum::<f64>().max(weight);
    let pct = ((100.0 * weight / total).round() as i64).clamp(1, 100);
    vec![
        ("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.display().to_string()),
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), pct.to_string()),
        // The process sees one device (ordinal 0).
        (
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(),
            format!("0={}G", memory_gib.max(1)),
        ),
    ]
}

/// A priority's weight (its base slice: 4:2:1).
pub fn weight(p: crate::domain::Priority) -> f64 {
    crate::sched::scheduler::base_slice_ms(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Priority;

    #[test]
    fn mps_parts_follow_priority_weights() {
        let w = [Priority::High, Priority::Normal, Priority::Low].map(weight);
        let env = mps_env(Path::new("/p"), w[2], &w, 8);
        assert!(env.contains(&("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "14".into())));
        assert!(env.contains(&("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), "0=8G".into())));
        let alone = mps_env(Path::new("/p"), w[0], &w[..1], 8);
        assert!(alone.contains(&("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "100".into())));
    }

    #[test]
    fn modes_by_gpu() {
        let mut t = TimeSlicing {
            shim: Some("/x.so".into()),
            dir: "/d".into(),
            mps_gpus: vec!["GPU-b".into()],
        };
        assert_eq!(t.mode("GPU-a"), Enforcement::Launch);
        assert_eq!(t.mode("GPU-b"), Enforcement::Mps);
        t.shim = None;
        assert_eq!(t.mode("GPU-a"), Enforcement::Freezer);
        t.mps_gpus = vec!["all".into()];
        assert_eq!(t.mode("GPU-a"), Enforcement::Mps);
    }
}
