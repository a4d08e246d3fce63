//! Node-level placement of GPU-sharing workloads, as in the Alibaba GPU
//! cluster trace: nodes with CPU, memory and up to 8 GPUs of one model;
//! tasks asking for CPU, memory and either nothing, a fraction of one GPU
//! (milli-GPU), or whole GPUs, optionally limited to some GPU models.
//!
//! Fragmentation follows FGD's definition (Weng et al., USENIX ATC '23,
//! §4): for a task shape m, the free GPU capacity of a node that m cannot
//! use — all of it when m does not fit the node at all, otherwise the free
//! milli-GPU on GPUs with less free than m needs. A node's fragmentation is
//! the popularity-weighted sum over the typical task shapes.

use std::cmp::Ordering;
use std::collections::HashMap;

/// Milli-GPU in one GPU.
pub const MILLI: i32 = 1000;
/// Normalisation constants of the best-fit score (FGD's simulator: the
/// largest node of the trace's cluster).
const MAX_SPEC_CPU: f64 = 128_000.0;
const MAX_SPEC_GPU: f64 = 8_000.0;

/// A node as the trace describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    pub name: String,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    pub gpus: u8,
    /// Index into the trace's list of GPU models.
    pub model: u8,
}

/// A task (pod) as the trace describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Task {
    pub name: String,
    pub cpu_milli: i64,
    pub memory_mib: i64,
    /// 0: CPU only; 1: one GPU or a fraction of one; more: whole GPUs.
    pub num_gpu: u8,
    /// Milli-GPU per GPU (1000 for whole GPUs).
    pub gpu_milli: i32,
    /// Allowed GPU models as a bit mask over model indexes; 0: any.
    pub models: u64,
}

impl Task {
    /// Milli-GPU this task asks for in all.
    pub fn total_gpu_milli(&self) -> i64 {
        i64::from(self.num_gpu) * i64::from(self.gpu_milli)
    }

    fn is_share(&self) -> bool {
        self.num_gpu == 1 && self.gpu_milli < MILLI
    }

    fn allows(&self, model: u8) -> bool {
        self.models == 0 || self.models & (1u64 << model) != 0
    }
}

/// What is left on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeState {
    pub cpu_left: i64,
    pub mem_left: i64,
    pub gpu_left: [i32; 8],
    pub gpus: u8,
    pub model: u8,
    /// The node's CPU, for how full it is.
    pub cpu_cap: i64,
}

impl NodeState {
    pub fn new(spec: &NodeSpec) -> Self {
        let mut gpu_left = [0; 8];
        for g in gpu_left.iter_mut().take(usize::from(spec.gpus.min(8))) {
            *g = MILLI;
        }
        NodeState {
            cpu_left: spec.cpu_milli,
            mem_left: spec.memory_mib,
            gpu_left,
            gpus: spec.gpus.min(8),
            model: spec.model,
            cpu_cap: spec.cpu_milli,
        }
    }

    fn lefts(&self) -> &[i32] {
        &self.gpu_left[..usize::from(self.gpus)]
    }

    pub fn gpu_free(&self) -> i64 {
        self.lefts().iter().map(|&l| i64::from(l)).sum()
    }

    fn fully_free(&self) -> usize {
        self.lefts().iter().filter(|&&l| l == MILLI).count()
    }

    /// Whether the task fits: CPU, memory, GPU model, and GPU capacity.
    pub fn fits(&self, t: &Task) -> bool {
        if self.cpu_left < t.cpu_milli || self.mem_left < t.memory_mib {
            return false;
        }
        if t.num_gpu == 0 {
            return true;
        }
        if !t.allows(self.model) {
            return false;
        }
        if t.is_share() {
            self.lefts().iter().any(|&l| l >= t.gpu_milli)
        } else {
            self.fully_free() >= usize::from(t.num_gpu)
        }
    }

    /// The state after placing `t` on the GPUs in `choice` (one index for a
    /// share, the whole GPUs otherwise).
    pub fn with(&self, t: &Task, choice: &Choice) -> NodeState {
        let mut s = *self;
        s.cpu_left -= t.cpu_milli;
        s.mem_left -= t.memory_mib;
        for &g in choice.gpus() {
            s.gpu_left[usize::from(g)] -= t.gpu_milli;
        }
        s
    }

    /// The lowest-indexed fully free GPUs for a whole-GPU task.
    fn exclusive_choice(&self, t: &Task) -> Choice {
        let mut c = Choice::default();
        for (i, &l) in self.lefts().iter().enumerate() {
            if c.len as usize == usize::from(t.num_gpu) {
                break;
            }
            if l == MILLI {
                c.push(i as u8);
            }
        }
        c
    }

    /// How full the node is in its emptiest dimension (GPU or CPU), 0..1:
    /// a node with free GPUs but no CPU left is as full as its GPUs.
    pub fn fullness(&self) -> f64 {
        let gpu_free = if self.gpus == 0 {
            0.0
        } else {
            self.gpu_free() as f64 / (f64::from(self.gpus) * f64::from(MILLI))
        };
        let cpu_free = self.cpu_left as f64 / self.cpu_cap.max(1) as f64;
        1.0 - gpu_free.max(cpu_free)
    }

    /// Free milli-GPU that the node's free CPU cannot feed when tasks ask
    /// for `cpu_per_milli` CPU per milli-GPU (the workload's mean): GPUs
    /// that will sit idle for want of CPU, whatever arrives.
    pub fn starved(&self, cpu_per_milli: f64) -> f64 {
        (self.gpu_free() as f64 - self.cpu_left as f64 / cpu_per_milli).max(0.0)
    }

    /// A key equal for states that fragmentation cannot tell apart (GPU
    /// order does not matter; memory does not enter the measure).
    fn frag_key(&self) -> u128 {
        let mut lefts = self.gpu_left;
        lefts[..usize::from(self.gpus)].sort_unstable_by(|a, b| b.cmp(a));
        let mut k: u128 = self.cpu_left.clamp(0, (1 << 20) - 1) as u128;
        for l in lefts {
            k = (k << 11) | (l.clamp(0, 2047) as u128);
        }
        (k << 10) | (u128::from(self.model) << 4) | u128::from(self.gpus)
    }
}

/// The GPUs a task gets on its node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Choice {
    ids: [u8; 8],
    len: u8,
}

impl Choice {
    fn push(&mut self, g: u8) {
        self.ids[usize::from(self.len)] = g;
        self.len += 1;
    }

    fn one(g: u8) -> Choice {
        let mut c = Choice::default();
        c.push(g);
        c
    }

    pub fn gpus(&self) -> &[u8] {
        &self.ids[..usize::from(self.len)]
    }
}

/// A typical task shape and how often it is asked for (weights sum to 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub cpu_milli: i64,
    pub num_gpu: u8,
    pub gpu_milli: i32,
    pub models: u64,
    pub weight: f64,
}

/// The typical shapes of a workload, FGD's way: shapes (CPU, GPU count,
/// milli-GPU, model constraint) by decreasing count, taken one at a time
/// until they cover `coverage` of the tasks, CPU-only tasks included.
pub fn typical_shapes(tasks: &[Task], coverage: f64) -> Vec<Shape> {
    let mut counts: HashMap<(i64, i32, u8, u64), usize> = HashMap::new();
    for t in tasks {
        *counts
            .entry((t.cpu_milli, t.gpu_milli, t.num_gpu, t.models))
            .or_default() += 1;
    }
    let total = counts.values().sum::<usize>() as f64;
    let mut list: Vec<((i64, i32, u8, u64), usize)> = counts.into_iter().collect();
    // Decreasing count; equal counts: the larger shape first (a stable order).
    list.sort_by(|a, b| b.1.cmp(&a.1).then(b.0.cmp(&a.0)));
    let mut taken = 0;
    let mut covered = 0.0;
    while covered < coverage * total && taken < list.len() {
        let step_end = (taken + 1).min(list.len());
        for item in &list[taken..step_end] {
            covered += item.1 as f64;
        }
        taken = step_end;
    }
    list[..taken]
        .iter()
        .map(|((cpu, milli, num, models), n)| Shape {
            cpu_milli: *cpu,
            num_gpu: *num,
            gpu_milli: *milli,
            models: *models,
            weight: *n as f64 / covered,
        })
        .collect()
}

/// FGD's fragmentation of a node: the weighted milli-GPU the typical shapes
/// cannot use.
pub fn node_fragmentation(s: &NodeState, shapes: &[Shape]) -> f64 {
    let free = s.gpu_free() as f64;
    let mut frag = 0.0;
    for m in shapes {
        let unusable = if m.gpu_milli == 0 {
            // CPU-only shapes use no GPU: every free GPU is idle to them.
            free
        } else if m.models != 0 && m.models & (1u64 << s.model) == 0 {
            free
        } else {
            let hosts = s.lefts().iter().filter(|&&l| l >= m.gpu_milli).count();
            if hosts >= usize::from(m.num_gpu) && s.cpu_left >= m.cpu_milli {
                s.lefts()
                    .iter()
                    .filter(|&&l| l < m.gpu_milli)
                    .map(|&l| f64::from(l))
                    .sum()
            } else {
                free
            }
        };
        frag += m.weight * unusable;
    }
    frag
}

/// The mean CPU (milli) per milli-GPU of a workload's GPU tasks.
pub fn cpu_per_milli(tasks: &[Task]) -> f64 {
    let (cpu, gpu) = tasks
        .iter()
        .filter(|t| t.num_gpu > 0)
        .fold((0i64, 0i64), |a, t| {
            (a.0 + t.cpu_milli, a.1 + t.total_gpu_milli())
        });
    if gpu == 0 {
        1.0
    } else {
        cpu as f64 / gpu as f64
    }
}

/// Placement policies of the replay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// First node and GPU (by index) that fit.
    FirstFit,
    /// FGD's best-fit baseline: least CPU and GPU left after placement
    /// (weights 0.5 / 0.5, scores as integers 0–100 normalised over the
    /// candidates), ties to the first node; the fullest GPU that fits.
    BestFit,
    /// FGD: the node and GPU whose fragmentation grows least, scored as
    /// FGD's simulator does (sigmoid of the change, as an integer 0–100),
    /// ties to the first node in list order.
    Fgd,
    /// gpuslice's default: FGD's node score (rounded as FGD's simulator
    /// rounds it), and among nodes whose score is within one point of the
    /// best (the score's own resolution, see `GPUSLICE_SCORE_TOLERANCE`):
    /// - a GPU task goes where it starves the fewest free GPUs of CPU (free
    ///   GPU the node's free CPU cannot feed at the workload's mean CPU per
    ///   GPU), then to the node left fullest in its emptiest dimension;
    /// - a CPU-only task goes to the node with the least free GPU (CPU next
    ///   to fully used GPUs is worth least to GPU tasks), then the fullest;
    ///
    /// then the higher score, then the first node in the seed's node
    /// order; on that node the GPU
    /// whose exact fragmentation growth is least. FGD's score sees whether
    /// one more task of each typical shape fits, not whether the CPU left
    /// can feed all the free GPUs, and FGD sends ties to the first node of
    /// an arbitrary order; these keys pack by what the rest of the
    /// workload needs.
    Gpuslice,
}

impl Policy {
    pub const ALL: [Policy; 4] = [
        Policy::FirstFit,
        Policy::BestFit,
        Policy::Fgd,
        Policy::Gpuslice,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Policy::FirstFit => "first-fit",
            Policy::BestFit => "best-fit",
            Policy::Fgd => "fgd",
            Policy::Gpuslice => "gpuslice",
        }
    }

    pub fn parse(s: &str) -> Result<Policy, String> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                format!("unknown policy \"{s}\": use first-fit, best-fit, fgd or gpuslice")
            })
    }
}

/// Scores of gpuslice's replay policy this close to the best (in points of
/// FGD's 0–100 node score) count as equal. FGD truncates its score to an
/// integer, so two nodes a point apart may differ by next to nothing while
/// two with the same score differ by almost a point: one point is the
/// score's own resolution. Within it, gpuslice's keys decide (see
/// [`Policy::Gpuslice`]).
const GPUSLICE_SCORE_TOLERANCE: f64 = 1.0;

/// The fleet during a replay, with a memo of node fragmentation by state.
pub struct Cluster {
    pub nodes: Vec<NodeState>,
    shapes: Vec<Shape>,
    memo: HashMap<u128, f64>,
    pub capacity_milli: i64,
    pub allocated_milli: i64,
    /// The workload's mean CPU (milli) per milli-GPU of its GPU tasks.
    cpu_per_milli: f64,
}

/// Where a task goes: a node and its GPUs there.
#[derive(Clone, Copy)]
struct Pick {
    node: usize,
    choice: Choice,
}

impl Cluster {
    /// A fleet for a workload whose GPU tasks ask `cpu_per_milli` CPU per
    /// milli-GPU on average (see [`cpu_per_milli`]).
    pub fn new(nodes: &[NodeSpec], shapes: Vec<Shape>, cpu_per_milli: f64) -> Cluster {
        let states: Vec<NodeState> = nodes.iter().map(NodeState::new).collect();
        let capacity_milli = states
            .iter()
            .map(|s| i64::from(s.gpus) * i64::from(MILLI))
            .sum();
        Cluster {
            nodes: states,
            shapes,
            memo: HashMap::new(),
            capacity_milli,
            allocated_milli: 0,
            cpu_per_milli: if cpu_per_milli > 0.0 {
                cpu_per_milli
            } else {
                1.0
            },
        }
    }

    fn frag(&mut self, s: &NodeState) -> f64 {
        let key = s.frag_key();
        if let Some(v) = self.memo.get(&key) {
            return *v;
        }
        let v = node_fragmentation(s, &self.shapes);
        self.memo.insert(key, v);
        v
    }

    /// The whole fleet's fragmentation, in milli-GPU.
    pub fn fragmentation(&mut self) -> f64 {
        (0..self.nodes.len())
            .map(|i| self.frag(&self.nodes[i].clone()))
            .sum()
    }

    /// Places `t` by `policy`; returns the node, or None when nothing fits.
    pub fn place(&mut self, t: &Task, policy: Policy) -> Option<usize> {
        let best = match policy {
            Policy::FirstFit => self.first_fit(t),
            Policy::BestFit => self.best_fit(t),
            Policy::Fgd | Policy::Gpuslice => self.by_fragmentation(t, policy),
        }?;
        let s = self.nodes[best.node].with(t, &best.choice);
        self.nodes[best.node] = s;
        self.allocated_milli += t.total_gpu_milli();
        Some(best.node)
    }

    fn first_fit(&self, t: &Task) -> Option<Pick> {
        let node = self.nodes.iter().position(|s| s.fits(t))?;
        let s = &self.nodes[node];
        let choice = if t.is_share() {
            Choice::one(s.lefts().iter().position(|&l| l >= t.gpu_milli)? as u8)
        } else {
            s.exclusive_choice(t)
        };
        Some(Pick { node, choice })
    }

    fn best_fit(&self, t: &Task) -> Option<Pick> {
        let mut raw: Vec<(usize, i64)> = Vec::new();
        for (i, s) in self.nodes.iter().enumerate() {
            if !s.fits(t) {
                continue;
            }
            let left = 0.5 * (s.cpu_left - t.cpu_milli) as f64 / MAX_SPEC_CPU
                + 0.5 * (s.gpu_free() - t.total_gpu_milli()) as f64 / MAX_SPEC_GPU;
            raw.push((i, ((1.0 - left) * 100.0) as i64));
        }
        // Scores are normalised to 0–100 over the candidates, in integers.
        let hi = raw.iter().map(|r| r.1).max()?;
        let lo = raw.iter().map(|r| r.1).min()?;
        let norm = |v: i64| {
            if hi == lo {
                0
            } else {
                (v - lo) * 100 / (hi - lo)
            }
        };
        let top = raw.iter().map(|r| norm(r.1)).max()?;
        // The first node among the best (see `by_fragmentation`).
        let node = raw.iter().find(|r| norm(r.1) == top)?.0;
        let s = &self.nodes[node];
        let choice = if t.is_share() {
            // The fullest GPU that still fits (lowest index among equals).
            let mut best: Option<usize> = None;
            for (i, &l) in s.lefts().iter().enumerate() {
                if l >= t.gpu_milli && best.is_none_or(|b| l < s.gpu_left[b]) {
                    best = Some(i);
                }
            }
            Choice::one(best? as u8)
        } else {
            s.exclusive_choice(t)
        };
        Some(Pick { node, choice })
    }

    fn by_fragmentation(&mut self, t: &Task, policy: Policy) -> Option<Pick> {
        // Nodes in the same state score the same: evaluate each state once.
        let mut by_state: HashMap<u128, (i32, f64)> = HashMap::new();
        // FGD: the first node in list order among the best scores wins: this
        // reproduces the published FGD and best-fit figures (uniform random
        // choice among equal scores does not: FGD drops to about 91.6 % on
        // the default trace), and it packs, which is what makes near-equal
        // choices good.
        let mut all: Vec<(f64, Pick, (f64, f64))> = Vec::new();
        for i in 0..self.nodes.len() {
            let s = self.nodes[i];
            if !s.fits(t) {
                continue;
            }
            // Memory only gates `fits`, checked above; it does not change the score.
            let key = s.frag_key();
            let (choice, score) = match by_state.get(&key) {
                // Equal states may order their GPUs differently: take the
                // same-capacity GPU of this node (the lowest index).
                Some(&(left, score)) => (choice_on(&s, t, left), score),
                None => {
                    let (c, score) = self.evaluate(&s, t, policy);
                    let left = c
                        .gpus()
                        .first()
                        .map(|&g| s.gpu_left[usize::from(g)])
                        .unwrap_or(0);
                    by_state.insert(key, (left, score));
                    (c, score)
                }
            };
            // gpuslice's keys (see `Policy::Gpuslice`), used below among the
            // scores within the tolerance; FGD has none.
            let tie = if policy == Policy::Gpuslice {
                let after = s.with(t, &choice);
                if t.num_gpu == 0 {
                    (-(after.gpu_free() as f64), after.fullness())
                } else {
                    let r = self.cpu_per_milli;
                    (-(after.starved(r) - s.starved(r)), after.fullness())
                }
            } else {
                (0.0, 0.0)
            };
            all.push((score, Pick { node: i, choice }, tie));
        }
        // FGD: the best score, the first in order. gpuslice: every score
        // within `GPUSLICE_SCORE_TOLERANCE` of the best counts as equal;
        // among them its keys, then the higher score, then the first.
        let tolerance = if policy == Policy::Gpuslice {
            GPUSLICE_SCORE_TOLERANCE
        } else {
            0.0
        };
        let top = all.iter().map(|c| c.0).fold(f64::MIN, f64::max);
        let mut best: Option<&(f64, Pick, (f64, f64))> = None;
        for c in all.iter().filter(|c| c.0 >= top - tolerance) {
            if best.is_none_or(|b| {
                (c.2 .0, c.2 .1, c.0).partial_cmp(&(b.2 .0, b.2 .1, b.0)) == Some(Ordering::Greater)
            }) {
                best = Some(c);
            }
        }
        best.map(|b| b.1)
    }

    /// The best GPU choice on a node state and its score (higher is better).
    fn evaluate(&mut self, s: &NodeState, t: &Task, policy: Policy) -> (Choice, f64) {
        let before = self.frag(s);
        let candidates: Vec<Choice> = if t.is_share() {
            let mut seen: Vec<i32> = Vec::new();
            let mut c = Vec::new();
            for (i, &l) in s.lefts().iter().enumerate() {
                // GPUs with the same free capacity lead to the same state.
                if l >= t.gpu_milli && !seen.contains(&l) {
                    seen.push(l);
                    c.push(Choice::one(i as u8));
                }
            }
            c
        } else {
            vec![s.exclusive_choice(t)]
        };
        let mut best: Option<(Choice, f64, f64)> = None;
        for c in candidates {
            let after_state = s.with(t, &c);
            let after = self.frag(&after_state);
            let (score, tie) = match policy {
                Policy::Fgd => {
                    let x = (before - after) / 1000.0;
                    (((1.0 / (1.0 + (-x).exp())) * 100.0).trunc(), 0.0)
                }
                _ => {
                    // FGD's rounded score across nodes; on one node, among
                    // equal scores, the GPU whose exact growth is least.
                    let x = (before - after) / 1000.0;
                    (((1.0 / (1.0 + (-x).exp())) * 100.0).trunc(), before - after)
                }
            };
            if best.is_none_or(|b| score > b.1 || (score == b.1 && tie > b.2)) {
                best = Some((c, score, tie));
            }
        }
        best.map(|b| (b.0, b.1))
            .unwrap_or((Choice::default(), f64::MIN))
    }
}

/// The GPUs a task gets on `node` when the choice was "a GPU with `left`
/// milli-GPU free" (shares) or "the lowest fully free GPUs" (whole GPUs).
fn choice_on(node: &NodeState, t: &Task, left: i32) -> Choice {
    if !t.is_share() {
        return node.exclusive_choice(t);
    }
    match node.lefts().iter().position(|&l| l == left) {
        Some(i) => Choice::one(i as u8),
        None => Choice::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(gpus: u8) -> NodeSpec {
        NodeSpec {
            name: "n".into(),
            cpu_milli: 64_000,
            memory_mib: 262_144,
            gpus,
            model: 0,
        }
    }

    fn task(cpu: i64, num: u8, milli: i32) -> Task {
        Task {
            name: "t".into(),
            cpu_milli: cpu,
            memory_mib: 1024,
            num_gpu: num,
            gpu_milli: milli,
            models: 0,
        }
    }

    #[test]
    fn fragmentation_follows_fgd_definition() {
        // Shapes: half ask for a whole GPU, half for 0.5 GPU.
        let shapes = vec![
            Shape {
                cpu_milli: 1000,
                num_gpu: 1,
                gpu_milli: 1000,
                models: 0,
                weight: 0.5,
            },
            Shape {
                cpu_milli: 1000,
                num_gpu: 1,
                gpu_milli: 500,
                models: 0,
                weight: 0.5,
            },
        ];
        let mut s = NodeState::new(&node(2));
        assert_eq!(
            node_fragmentation(&s, &shapes),
            0.0,
            "an empty node strands nothing"
        );
        s.gpu_left = [700, 1000, 0, 0, 0, 0, 0, 0];
        // Whole-GPU shape: 700 on GPU 0 is unusable; half shape: all usable.
        assert_eq!(node_fragmentation(&s, &shapes), 350.0);
        s.gpu_left = [300, 1000, 0, 0, 0, 0, 0, 0];
        assert_eq!(node_fragmentation(&s, &shapes), 0.5 * 300.0 + 0.5 * 300.0);
        s.cpu_left = 0;
        // No CPU: nothing fits, all free GPU is fragment.
        assert_eq!(node_fragmentation(&s, &shapes), 1300.0);
    }

    #[test]
    fn typical_shapes_cover_the_workload() {
        let mut tasks = vec![task(1000, 1, 1000); 90];
        tasks.extend(vec![task(2000, 1, 500); 10]);
        let shapes = typical_shapes(&tasks, 0.95);
        assert_eq!(shapes.len(), 2);
        assert!((shapes[0].weight - 0.9).abs() < 1e-9);
    }

    #[test]
    fn every_policy_respects_capacity() {
        let nodes = vec![node(2), node(4)];
        let tasks = vec![
            task(8000, 1, 600),
            task(8000, 1, 600),
            task(8000, 2, 1000),
            task(8000, 1, 400),
            task(8000, 4, 1000),
        ];
        for p in Policy::ALL {
            let mut c = Cluster::new(&nodes, typical_shapes(&tasks, 0.95), cpu_per_milli(&tasks));
            for t in &tasks {
                c.place(t, p);
            }
            for s in &c.nodes {
                assert!(s.lefts().iter().all(|&l| (0..=MILLI).contains(&l)), "{p:?}");
                assert!(s.cpu_left >= 0 && s.mem_left >= 0);
            }
            let used: i64 = c
                .nodes
                .iter()
                .map(|s| i64::from(s.gpus) * 1000 - s.gpu_free())
                .sum();
            assert_eq!(used, c.allocated_milli, "{p:?}");
        }
    }

    #[test]
    fn fragmentation_aware_policies_keep_whole_gpus_whole() {
        // One node with GPU 0 free and GPU 1 half used; half the workload
        // wants whole GPUs. A half-GPU task belongs on GPU 1.
        let tasks = vec![task(1000, 1, 1000), task(1000, 1, 500)];
        let shapes = typical_shapes(&tasks, 1.0);
        for (policy, want) in [
            (Policy::FirstFit, 0u8),
            (Policy::Fgd, 1),
            (Policy::Gpuslice, 1),
            (Policy::BestFit, 1),
        ] {
            let mut c = Cluster::new(&[node(2)], shapes.clone(), 4.0);
            c.nodes[0].gpu_left = [1000, 500, 0, 0, 0, 0, 0, 0];
            c.place(&task(1000, 1, 500), policy).unwrap();
            let expected = if want == 1 { [1000, 0] } else { [500, 500] };
            assert_eq!(&c.nodes[0].gpu_left[..2], &expected, "{policy:?}");
        }
    }

    #[test]
    fn gpuslice_breaks_fgd_ties_towards_the_fuller_node() {
        // Whole-GPU work only: a whole GPU strands nothing on either node,
        // so FGD scores them equal and takes the first; gpuslice packs.
        let tasks = vec![task(1000, 1, 1000)];
        let shapes = typical_shapes(&tasks, 1.0);
        for (policy, want) in [(Policy::Fgd, 0), (Policy::Gpuslice, 1)] {
            let mut c = Cluster::new(&[node(8), node(8)], shapes.clone(), 4.0);
            c.nodes[1].gpu_left = [0, 0, 0, 0, 1000, 1000, 1000, 1000];
            c.nodes[1].cpu_left = 32_000;
            assert_eq!(
                c.place(&task(1000, 1, 1000), policy),
                Some(want),
                "{policy:?}"
            );
        }
        // Fullness counts the emptiest dimension: a node whose GPUs are half
        // used but whose CPU is untouched is no fuller than an empty one.
        let mut s = NodeState::new(&node(8));
        s.gpu_left = [0, 0, 0, 0, 1000, 1000, 1000, 1000];
        assert_eq!(s.fullness(), 0.0);
        s.cpu_left = 16_000;
        assert_eq!(s.fullness(), 0.5);
    }

    #[test]
    fn gpuslice_does_not_starve_free_gpus_of_cpu() {
        // Tasks ask 8 CPU per GPU. Node 0: 4 free GPUs, 40 CPU left (one
        // more task leaves 32 CPU for 3 GPUs: fed); node 1: 2 free GPUs,
        // 17 CPU left (one more task leaves 9 CPU for 1 GPU: fed as well,
        // but node 1 is fuller). A 16-CPU GPU task on node 1 would leave
        // 1 CPU for its last free GPU: starved; on node 0, 24 CPU for 3.
        let tasks = vec![task(8000, 1, 1000)];
        let shapes = typical_shapes(&tasks, 1.0);
        let r = cpu_per_milli(&tasks);
        assert_eq!(r, 8.0);
        let mut c = Cluster::new(&[node(8), node(8)], shapes.clone(), r);
        c.nodes[0].gpu_left = [0, 0, 0, 0, 1000, 1000, 1000, 1000];
        c.nodes[0].cpu_left = 40_000;
        c.nodes[1].gpu_left = [0, 0, 0, 0, 0, 0, 1000, 1000];
        c.nodes[1].cpu_left = 17_000;
        assert_eq!(c.nodes[1].starved(r), 0.0);
        // FGD: one more 8-CPU task fits on either node after it, so the
        // scores are equal.
        let heavy = task(16_000, 1, 1000);
        let mut on = c.nodes[1];
        on = on.with(&heavy, &on.exclusive_choice(&heavy));
        assert_eq!(on.starved(r), 1000.0 - 1000.0 / 8.0);
        assert_eq!(c.place(&heavy, Policy::Gpuslice), Some(0));
        // An 8-CPU task starves nothing on either: the fuller node wins.
        assert_eq!(c.place(&task(8000, 1, 1000), Policy::Gpuslice), Some(1));
    }

    #[test]
    fn gpuslice_counts_scores_a_point_apart_as_equal() {
        // Node 0: every GPU free, 64 CPU. Node 1: one GPU free, 34 CPU. GPU
        // tasks ask 30 CPU and a whole GPU. A 5-CPU task on node 1 leaves 29
        // CPU: its last GPU can no longer take a GPU task, so fragmentation
        // grows by that GPU times the GPU shape's weight; on node 0 it does
        // not grow. Where GPU tasks are rare (1 in 25), that is 40 milli-GPU:
        // FGD scores 50 against 49 and takes node 0; gpuslice counts the two
        // as equal and puts the CPU next to used GPUs (node 1). Where they
        // are half the tasks, node 1 scores 37: gpuslice follows the score.
        for (gpu_tasks, cpu_tasks, fgd_score_1, gpuslice_wants) in
            [(1, 24, 49.0, 1), (1, 1, 37.0, 0)]
        {
            let mut tasks = vec![task(30_000, 1, 1000); gpu_tasks];
            tasks.extend(vec![task(4000, 0, 0); cpu_tasks]);
            let shapes = typical_shapes(&tasks, 1.0);
            let fresh = || {
                let mut c = Cluster::new(&[node(8), node(8)], shapes.clone(), 30.0);
                c.nodes[1].gpu_left = [0, 0, 0, 0, 0, 0, 0, 1000];
                c.nodes[1].cpu_left = 34_000;
                c
            };
            let small = task(5000, 0, 0);
            let mut c = fresh();
            let (n0, n1) = (c.nodes[0], c.nodes[1]);
            assert_eq!(c.evaluate(&n0, &small, Policy::Fgd).1, 50.0);
            assert_eq!(c.evaluate(&n1, &small, Policy::Fgd).1, fgd_score_1);
            assert_eq!(c.place(&small, Policy::Fgd), Some(0));
            assert_eq!(
                fresh().place(&small, Policy::Gpuslice),
                Some(gpuslice_wants),
                "{gpu_tasks} GPU tasks in {}",
                gpu_tasks + cpu_tasks
            );
        }
    }

    #[test]
    fn gpuslice_puts_cpu_only_tasks_next_to_used_gpus() {
        // Node 0 has every GPU free, node 1 none; a CPU-only task changes
        // neither node's fragmentation. Its CPU is worth least on node 1.
        let tasks = vec![task(8000, 1, 1000), task(4000, 0, 0)];
        let shapes = typical_shapes(&tasks, 1.0);
        for (policy, want) in [(Policy::Fgd, 0), (Policy::Gpuslice, 1)] {
            let mut c = Cluster::new(&[node(8), node(8)], shapes.clone(), 8.0);
            c.nodes[1].gpu_left = [0; 8];
            c.nodes[1].cpu_left = 20_000;
            assert_eq!(c.place(&task(4000, 0, 0), policy), Some(want), "{policy:?}");
        }
    }
}
