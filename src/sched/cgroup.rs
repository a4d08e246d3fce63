//! One cgroup per booking: a memory limit, a CPU set, CPU-time accounting
//! and freezing, on cgroup v2 (`cgroup.freeze`, `cpu.stat`, `memory.max`,
//! `cpuset.cpus`) or, where the controllers live in v1 hierarchies (hybrid
//! and v1-only hosts), on the v1 `freezer`, `memory`, `cpuacct` and `cpuset`
//! hierarchies. The layout is detected once at start.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Where the booking groups live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Unified hierarchy with controllers (`cgroup.controllers` at the root).
    V2 { dir: PathBuf },
    /// Controller hierarchies: `freezer` is required, the others optional.
    V1 {
        freezer: PathBuf,
        memory: Option<PathBuf>,
        cpuacct: Option<PathBuf>,
        cpuset: Option<PathBuf>,
        /// The v1 `devices` controller, which confines the booking to its
        /// device nodes (see [`crate::sched::devices`]).
        devices: Option<PathBuf>,
        /// A hybrid host's v2 mount (`unified`): when present, freezing uses
        /// its `cgroup.freeze`, which settles faster than the v1 freezer.
        unified: Option<PathBuf>,
    },
}

impl Layout {
    /// Detects the layout under `base` (normally `/sys/fs/cgroup`) and
    /// places groups under `prefix` (e.g. `gpuslice`). `None` when there is
    /// no usable freezer.
    pub fn detect(base: &Path, prefix: &str) -> Option<Layout> {
        if base.join("cgroup.controllers").is_file() {
            return Some(Layout::V2 {
                dir: base.join(prefix),
            });
        }
        let v1 = |c: &str| {
            let p = base.join(c);
            p.join("cgroup.procs").is_file().then(|| p.join(prefix))
        };
        let unified = base.join("unified");
        Some(Layout::V1 {
            freezer: v1("freezer")?,
            memory: v1("memory"),
            cpuacct: v1("cpuacct"),
            cpuset: v1("cpuset"),
            devices: v1("devices"),
            unified: unified
                .join("cgroup.procs")
                .is_file()
                .then(|| unified.join(prefix)),
        })
    }

    /// `v2` or `v1`.
    pub fn kind(&self) -> &'static str {
        match self {
            Layout::V2 { .. } => "v2",
            Layout::V1 { .. } => "v1",
        }
    }

    fn roots(&self) -> Vec<PathBuf> {
        match self {
            Layout::V2 { dir } => vec![dir.clone()],
            Layout::V1 {
                freezer,
                memory,
                cpuacct,
                cpuset,
                devices,
                unified,
            } => std::iter::once(freezer.clone())
                .chain(memory.clone())
                .chain(cpuacct.clone())
                .chain(cpuset.clone())
                .chain(devices.clone())
                .chain(unified.clone())
                .collect(),
        }
    }

    /// The group of a booking (not created).
    pub fn group(&self, booking: i64) -> Group {
        let name = format!("booking-{booking}");
        Group {
            layout: self.clone(),
            name,
        }
    }

    /// Creates a booking's group with the node's limits for it (host memory
    /// in proportion to its compute slices, the node's CPUs): the worker at
    /// activation, and `exec` and the share supervisor when the group went
    /// missing (a reboot), so it never comes back bare.
    ///
    /// On a node with NVIDIA device numbering (`limits.devices`), the group
    /// is confined to `device_nodes`, the booking's own device files; an
    /// error when it cannot be (the booking must not run unconfined).
    pub fn create_for(
        &self,
        booking: i64,
        compute_slices: i32,
        limits: &Limits,
        device_nodes: &[crate::sched::devices::DeviceNode],
    ) -> std::io::Result<Group> {
        let memory = limits.host_memory_gib_per_slice * compute_slices.max(1) as u64 * (1 << 30);
        let g = self.create(booking, Some(memory), limits.cpus.as_deref())?;
        if let Some(devices) = &limits.devices {
            if let Err(e) = g.restrict_devices(&devices.policy(device_nodes)) {
                // Not left behind open: whoever finds the group joins it.
                let _ = g.remove(std::time::Duration::ZERO);
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("cannot confine booking {booking} to its devices: {e}"),
                ));
            }
        }
        Ok(g)
    }

    /// Creates a booking's group with an optional memory limit (bytes) and
    /// CPU list (`0-3`).
    pub fn create(
        &self,
        booking: i64,
        memory_limit: Option<u64>,
        cpus: Option<&str>,
    ) -> std::io::Result<Group> {
        let g = self.group(booking);
        match self {
            Layout::V2 { dir } => {
                std::fs::create_dir_all(dir)?;
                // Controllers must be enabled for the children; missing
                // ones are skipped (the freezer needs none).
                let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+memory +cpuset");
                let p = dir.join(&g.name);
                mkdir(&p)?;
                if let Some(m) = memory_limit {
                    let _ = std::fs::write(p.join("memory.max"), m.to_string());
                }
                if let Some(c) = cpus {
                    let _ = std::fs::write(p.join("cpuset.cpus"), c);
                }
            }
            Layout::V1 {
                freezer,
                memory,
                cpuacct,
                cpuset,
                devices,
                unified,
            } => {
                for root in [
                    Some(freezer),
                    memory.as_ref(),
                    cpuacct.as_ref(),
                    devices.as_ref(),
                    unified.as_ref(),
                ]
                .into_iter()
                .flatten()
                {
                    std::fs::create_dir_all(root)?;
                    mkdir(&root.join(&g.name))?;
                }
                if let (Some(m), Some(root)) = (memory_limit, memory) {
                    std::fs::write(
                        root.join(&g.name).join("memory.limit_in_bytes"),
                        m.to_string(),
                    )?;
                }
                if let Some(root) = cpuset {
                    // A v1 cpuset takes no task until cpus and mems are set,
                    // on the prefix directory too.
                    let parent = root.parent().unwrap_or(root);
                    let read =
                        |f: &str| std::fs::read_to_string(parent.join(f)).unwrap_or_default();
                    let (all_cpus, mems) = (read("cpuset.cpus"), read("cpuset.mems"));
                    std::fs::create_dir_all(root)?;
                    std::fs::write(root.join("cpuset.cpus"), all_cpus.trim())?;
                    std::fs::write(root.join("cpuset.mems"), mems.trim())?;
                    let p = root.join(&g.name);
                    mkdir(&p)?;
                    std::fs::write(p.join("cpuset.cpus"), cpus.unwrap_or(all_cpus.trim()))?;
                    std::fs::write(p.join("cpuset.mems"), mems.trim())?;
                }
            }
        }
        Ok(g)
    }

    /// Booking ids that have a group (for a worker's start).
    pub fn existing(&self) -> Vec<i64> {
        let Some(root) = self.roots().into_iter().next() else {
            return Vec::new();
        };
        let Ok(dir) = std::fs::read_dir(root) else {
            return Vec::new();
        };
        let mut ids: Vec<i64> = dir
            .flatten()
            .filter_map(|e| {
                e.file_name()
                    .to_str()?
                    .strip_prefix("booking-")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The name of the directory the booking groups live in
    /// (`gpuslice-<node>`), as it shows in `/proc/PID/cgroup`.
    pub fn prefix_name(&self) -> String {
        self.roots()
            .first()
            .and_then(|r| r.file_name())
            .map(|n| n.to_string_lossy().to_string())
            .unwrap_or_default()
    }

    /// Removes the (empty) prefix directories; groups inside stay.
    pub fn remove_prefix(&self) {
        for d in self.roots() {
            let _ = std::fs::remove_dir(d);
        }
    }

    /// Thaws every group (a worker's start: nothing stays frozen from a
    /// previous run). Returns how many were frozen.
    pub fn thaw_all(&self) -> usize {
        self.existing()
            .into_iter()
            .map(|id| self.group(id))
            .filter(|g| g.is_frozen())
            .map(|g| g.thaw())
            .filter(Result::is_ok)
            .count()
    }
}

fn mkdir(p: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(p) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

/// A booking's cgroup.
#[derive(Debug, Clone)]
pub struct Group {
    layout: Layout,
    name: String,
}

impl Group {
    fn dirs(&self) -> Vec<PathBuf> {
        self.layout
            .roots()
            .into_iter()
            .map(|r| r.join(&self.name))
            .collect()
    }

    fn freezer_dir(&self) -> PathBuf {
        match &self.layout {
            Layout::V2 { dir } => dir.join(&self.name),
            Layout::V1 {
                unified: Some(u), ..
            } if u.join(&self.name).join("cgroup.freeze").is_file() => u.join(&self.name),
            Layout::V1 { freezer, .. } => freezer.join(&self.name),
        }
    }

    /// Freezing through a v2 `cgroup.freeze` (pure v2, or a hybrid's
    /// unified mount) rather than the v1 freezer.
    fn v2_freezer(&self) -> bool {
        self.freezer_dir().join("cgroup.freeze").is_file()
    }

    pub fn exists(&self) -> bool {
        self.freezer_dir().is_dir()
    }

    /// Confines the group's processes to `policy`'s devices: the v1
    /// `devices` controller where the host has it, else a BPF device
    /// program on the v2 group (pure v2, or a hybrid's unified mount).
    pub fn restrict_devices(
        &self,
        policy: &crate::sched::devices::DevicePolicy,
    ) -> std::io::Result<crate::sched::devices::Mechanism> {
        use crate::sched::devices::{apply_v1, apply_v2, Mechanism};
        match &self.layout {
            Layout::V2 { dir } => apply_v2(&dir.join(&self.name), policy).map(|_| Mechanism::V2Bpf),
            Layout::V1 {
                devices: Some(d), ..
            } => apply_v1(&d.join(&self.name), policy).map(|_| Mechanism::V1Devices),
            Layout::V1 {
                unified: Some(u), ..
            } => apply_v2(&u.join(&self.name), policy).map(|_| Mechanism::V2Bpf),
            Layout::V1 { .. } => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "this host has neither the v1 devices controller nor a v2 hierarchy",
            )),
        }
    }

    /// The v2 directory of the group, where there is one (for a BPF
    /// device program).
    pub fn v2_dir(&self) -> Option<PathBuf> {
        match &self.layout {
            Layout::V2 { dir } => Some(dir.join(&self.name)),
            Layout::V1 { unified, .. } => unified.as_ref().map(|u| u.join(&self.name)),
        }
    }

    /// Moves a process (and so its future children) into the group.
    pub fn add(&self, pid: u32) -> std::io::Result<()> {
        for d in self.dirs() {
            std::fs::write(d.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    /// The processes in the group.
    pub fn pids(&self) -> Vec<u32> {
        std::fs::read_to_string(self.freezer_dir().join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// CPU time the group's processes used, in nanoseconds.
    pub fn cpu_ns(&self) -> u64 {
        match &self.layout {
            Layout::V2 { dir } => std::fs::read_to_string(dir.join(&self.name).join("cpu.stat"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us * 1000)
                .unwrap_or(0),
            Layout::V1 { cpuacct, .. } => cpuacct
                .as_ref()
                .and_then(|c| {
                    std::fs::read_to_string(c.join(&self.name).join("cpuacct.usage")).ok()
                })
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0),
        }
    }

    pub fn is_frozen(&self) -> bool {
        if self.v2_freezer() {
            std::fs::read_to_string(self.freezer_dir().join("cgroup.freeze"))
                .map(|s| s.trim() == "1")
                .unwrap_or(false)
        } else {
            std::fs::read_to_string(self.freezer_dir().join("freezer.state"))
                .map(|s| s.trim() != "THAWED")
                .unwrap_or(false)
        }
    }

    /// Stops every process of the group (and waits until they are).
    pub fn freeze(&self) -> std::io::Result<()> {
        self.set_frozen(true)?;
        self.wait_frozen();
        Ok(())
    }

    /// Asks the kernel to stop the group's processes without waiting for
    /// it to finish (see [`Group::wait_frozen`]).
    pub fn start_freeze(&self) -> std::io::Result<()> {
        self.set_frozen(true)
    }

    /// Waits (at most 2 s) until the kernel reports the group frozen.
    pub fn wait_frozen(&self) {
        let dir = self.freezer_dir();
        let deadline = Instant::now() + Duration::from_secs(2);
        let v2 = self.v2_freezer();
        while Instant::now() < deadline {
            let done = if v2 {
                std::fs::read_to_string(dir.join("cgroup.events"))
                    .unwrap_or_default()
                    .lines()
                    .any(|l| l.trim() == "frozen 1")
            } else {
                std::fs::read_to_string(dir.join("freezer.state"))
                    .map(|s| s.trim() == "FROZEN")
                    .unwrap_or(true)
            };
            if done {
                return;
            }
            std::thread::yield_now();
        }
    }

    pub fn thaw(&self) -> std::io::Result<()> {
        self.set_frozen(false)
    }

    /// Writes the freezer's wish; thawing is immediate, freezing settles
    /// asynchronously.
    fn set_frozen(&self, frozen: bool) -> std::io::Result<()> {
        let dir = self.freezer_dir();
        if self.v2_freezer() {
            std::fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
        } else {
            std::fs::write(
                dir.join("freezer.state"),
                if frozen { "FROZEN" } else { "THAWED" },
            )
        }
    }

    /// Ends the group's processes (SIGTERM, SIGKILL after `grace`) and
    /// removes the group.
    pub fn remove(&self, grace: Duration) -> std::io::Result<()> {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        if !self.exists() {
            return Ok(());
        }
        let _ = self.thaw();
        for p in self.pids() {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while !self.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for p in self.pids() {
            let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.pids().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for d in self.dirs() {
            match std::fs::remove_dir(&d) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        Ok(())
    }
}

/// What a booking's group is created with (the node's settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Host memory per compute slice, GiB.
    pub host_memory_gib_per_slice: u64,
    /// The CPUs of bookings (`0-15`); `None`: all.
    pub cpus: Option<String>,
    /// The node's NVIDIA device numbering: groups are confined to their
    /// booking's device files. `None`: no driver known, no confinement.
    pub devices: Option<crate::sched::devices::NodeDevices>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            host_memory_gib_per_slice: 16,
            cpus: None,
            devices: None,
        }
    }
}
