//! Enforces one time-sliced GPU's scheduler, in one of two ways:
//!
//! - **freezer**: the share whose turn it is runs, every other share's
//!   cgroup is frozen. How much of its slice a share used is the CPU time
//!   its group consumed during the slice (or NVML's per-process samples
//!   where the GPU has them). Work a frozen share queued on the GPU still
//!   runs, so on real GPUs this holds the CPU side only;
//! - **launch** ([`Enforcer::launch`]): every share has control and report
//!   regions its shims read and write ([`crate::sched::launch`]); a turn
//!   opens the running share's control region with the slice as its
//!   GPU-time budget and closes the others', and what a share used is the
//!   GPU time its shims measured. Nothing is frozen.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::sched::cgroup::Group;
use crate::sched::launch::Regions;
use crate::sched::scheduler::{GpuScheduler, Share, ShareSpec};

/// Measures how many milliseconds of a slice of `slice` the processes
/// `pids` used, from the GPU's own per-process samples; `None`: no samples
/// (then the cgroup's CPU time counts).
pub type Sampler = Box<dyn FnMut(&[u32], Duration) -> Option<f64> + Send>;

/// The enforcer of one GPU. Blocking: run it on its own thread.
pub struct Enforcer {
    sampler: Option<Sampler>,
    sched: GpuScheduler,
    groups: HashMap<i64, Group>,
    /// Launch mode: every share's regions.
    regions: HashMap<i64, Regions>,
    launch: bool,
    running: Option<i64>,
    /// The running share's CPU time (freezer) or GPU time (launch) at its
    /// slice's start, ns.
    cpu_at_start: u64,
    epoch: Instant,
    /// Freeze-then-thaw times of the switches so far (for the benchmark).
    pub switches: Vec<Duration>,
}

impl Default for Enforcer {
    fn default() -> Self {
        Enforcer::new()
    }
}

impl Enforcer {
    pub fn new() -> Enforcer {
        Enforcer {
            sampler: None,
            sched: GpuScheduler::default(),
            groups: HashMap::new(),
            regions: HashMap::new(),
            launch: false,
            running: None,
            cpu_at_start: 0,
            epoch: Instant::now(),
            switches: Vec::new(),
        }
    }

    /// Measures shares with the GPU's per-process samples where it has them.
    pub fn with_sampler(mut self, sampler: Sampler) -> Enforcer {
        self.sampler = Some(sampler);
        self
    }

    /// Enforces at the launch layer: shares are added with
    /// [`Enforcer::add_launch`] and never frozen.
    pub fn launch() -> Enforcer {
        Enforcer {
            launch: true,
            ..Enforcer::new()
        }
    }

    /// Whether this enforcer works at the launch layer.
    pub fn is_launch(&self) -> bool {
        self.launch
    }

    /// Adds a share under launch enforcement with its regions (and its
    /// cgroup, where the node has them: its processes make it runnable).
    /// It waits closed for its turn.
    pub fn add_launch(&mut self, spec: ShareSpec, group: Option<Group>, regions: Regions) {
        if !self.regions.contains_key(&spec.id) {
            if self.running.is_some() {
                regions.control.close();
            }
            self.regions.insert(spec.id, regions);
        }
        if let Some(g) = group {
            self.groups.entry(spec.id).or_insert(g);
        }
        self.sched.add(spec);
    }

    /// Updates a share's spec (it keeps its state).
    pub fn update(&mut self, spec: ShareSpec) {
        self.sched.add(spec);
    }

    /// A share's regions (launch mode).
    pub fn regions(&self, id: i64) -> Option<&Regions> {
        self.regions.get(&id)
    }

    /// Adds a share with its group; it waits frozen for its turn when
    /// another share runs.
    pub fn add(&mut self, spec: ShareSpec, group: Group) {
        // A share seen before keeps its state (and, if it runs, runs on);
        // only its spec is updated.
        if !self.groups.contains_key(&spec.id) {
            if self.running.is_some() {
                let _ = group.freeze();
            }
            self.groups.insert(spec.id, group);
        }
        self.sched.add(spec);
    }

    /// Removes a share (its group is left thawed and its launches open for
    /// its owner to remove).
    pub fn remove(&mut self, id: i64) {
        if let Some(g) = self.groups.remove(&id) {
            if !self.launch {
                let _ = g.thaw();
            }
        }
        if let Some(r) = self.regions.remove(&id) {
            r.control.open_alone();
        }
        self.sched.remove(id);
        if self.running == Some(id) {
            self.running = None;
        }
    }

    /// Whether the share is in this enforcer.
    pub fn has(&self, id: i64) -> bool {
        self.sched.share(id).is_some()
    }

    /// Takes a share out of the scheduler without thawing it (a security
    /// response holds it frozen).
    pub fn detach(&mut self, id: i64) {
        self.groups.remove(&id);
        if let Some(r) = self.regions.remove(&id) {
            r.control.close();
        }
        self.sched.remove(id);
        if self.running == Some(id) {
            self.running = None;
        }
    }

    /// The share whose turn it is.
    pub fn running(&self) -> Option<i64> {
        self.running
    }

    pub fn shares(&self) -> &[Share] {
        self.sched.shares()
    }

    /// One step: closes the running slice, lets the scheduler choose, and
    /// freezes / thaws accordingly. Returns when to step again.
    pub fn step(&mut self) -> Instant {
        if self.launch {
            return self.step_launch();
        }
        let now_ms = self.epoch.elapsed().as_millis() as u64;
        let used = self
            .running
            .and_then(|id| self.groups.get(&id))
            .map(|g| g.cpu_ns().saturating_sub(self.cpu_at_start) as f64 / 1e6);
        let groups = &self.groups;
        let d = self.sched.tick(now_ms, used, |id| {
            groups.get(&id).is_some_and(|g| !g.pids().is_empty())
        });
        // The next slice's CPU baseline, read before its share is thawed:
        // the share runs from the thaw on, while the previous one's freeze
        // is still settling, and that time is part of its slice. Read after
        // the settle, it went uncounted, and a short (LOW, 25 ms) slice on a
        // busy host looked mostly idle, so its starvation never counted.
        let cpu_at_start = d
            .run
            .and_then(|id| self.groups.get(&id))
            .map(Group::cpu_ns)
            .unwrap_or(0);
        if d.run != self.running {
            let t = Instant::now();
            // Freeze is asked first and the next share thawed at once; the
            // kernel settles the freeze within a moment (confirmed below,
            // off the switch's critical path).
            let previous = self.running.and_then(|id| self.groups.get(&id));
            if let Some(g) = previous {
                let _ = g.start_freeze();
            }
            if let Some(g) = d.run.and_then(|id| self.groups.get(&id)) {
                let _ = g.thaw();
            }
            if self.running.is_some() && d.run.is_some() {
                self.switches.push(t.elapsed());
            }
            if let Some(g) = previous {
                g.wait_frozen();
            }
            if self.running.is_none() {
                // First turn: everyone else waits.
                for (id, g) in &self.groups {
                    if Some(*id) != d.run {
                        let _ = g.freeze();
                    }
                }
            }
            self.running = d.run;
        }
        if d.alone {
            // A single share is never paused.
            if let Some(g) = d.run.and_then(|id| self.groups.get(&id)) {
                if g.is_frozen() {
                    let _ = g.thaw();
                }
            }
        }
        self.cpu_at_start = cpu_at_start;
        self.epoch + Duration::from_millis(d.until)
    }

    /// Launch mode's step: the scheduler chooses from the GPU time the
    /// shims measured; the chosen share's control region opens with its
    /// slice as budget, every other one is closed.
    fn step_launch(&mut self) -> Instant {
        let now_ms = self.epoch.elapsed().as_millis() as u64;
        // The report is its owner's to write: a figure wound back only
        // mis-measures that share's own turn, which still ends by the clock.
        let used_of = |r: &Regions| r.read().map_or(0, |s| s.used_ns);
        let used = self
            .running
            .and_then(|id| self.regions.get(&id))
            .map(|r| used_of(r).saturating_sub(self.cpu_at_start) as f64 / 1e6);
        let (groups, regions) = (&self.groups, &self.regions);
        let d = self.sched.tick(now_ms, used, |id| {
            let members = groups.get(&id).map(Group::pids).unwrap_or_default();
            !members.is_empty()
                || regions
                    .get(&id)
                    .is_some_and(|r| !r.registered_alive(&members).is_empty())
        });
        let t = Instant::now();
        for (id, r) in &self.regions {
            if Some(*id) != d.run && r.control.is_open() {
                r.control.close();
            }
        }
        if let Some(r) = d.run.and_then(|id| self.regions.get(&id)) {
            let at = used_of(r);
            self.cpu_at_start = at;
            if d.alone {
                r.control.open_alone();
            } else {
                let slice_ns = d.until.saturating_sub(now_ms) * 1_000_000;
                r.control
                    .open_turn(at, slice_ns, gpuslice_cuda::now_ns() + slice_ns);
            }
        }
        if d.run != self.running && self.running.is_some() && d.run.is_some() {
            self.switches.push(t.elapsed());
        }
        self.running = d.run;
        self.epoch + Duration::from_millis(d.until)
    }

    /// Runs until `deadline`, sleeping between steps.
    pub fn run_until(&mut self, deadline: Instant) {
        while Instant::now() < deadline {
            let next = self.step().min(deadline);
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
        }
    }

    /// Thaws every share (stop: leave nothing frozen).
    pub fn release_all(&mut self) {
        for g in self.groups.values() {
            let _ = g.thaw();
        }
        for r in self.regions.values() {
            r.control.open_alone();
        }
        self.running = None;
    }
}
