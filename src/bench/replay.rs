//! The trace replay of FGD (Weng et al., USENIX ATC '23), on the Alibaba
//! GPU cluster trace (`openb_*` files, CC BY 4.0).
//!
//! Method, as FGD's simulator does it: tasks sorted by name and shuffled
//! with the seed; then tuned to 130 % of the cluster's GPU capacity —
//! random tasks of the original list appended (with replacement) while the
//! next would not pass the target, or random tasks removed while over it;
//! each task placed once, in order, and dropped when nothing fits. The
//! typical shapes for fragmentation come from the original list. Curves
//! record allocation and fragmentation (% of GPU capacity) each time the
//! arrived GPU demand passes another 1 % of capacity, up to 130 %.

use std::path::Path;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::bench::cluster::{cpu_per_milli, typical_shapes, Cluster, NodeSpec, Policy, Task};

/// Load levels of the curves: 0..=130 % of GPU capacity.
pub const LOAD_POINTS: usize = 131;
const TUNE_RATIO: f64 = 1.3;
const SHAPE_COVERAGE: f64 = 0.95;

/// A trace: nodes, tasks and the GPU model names.
#[derive(Debug, Clone)]
pub struct Trace {
    pub nodes: Vec<NodeSpec>,
    pub tasks: Vec<Task>,
    pub models: Vec<String>,
}

fn columns(header: &str, want: &[&str], file: &Path) -> Result<Vec<usize>, String> {
    let cols: Vec<&str> = header.trim().split(',').collect();
    want.iter()
        .map(|w| {
            cols.iter()
                .position(|c| c == w)
                .ok_or_else(|| format!("{}: no column \"{w}\" in the header", file.display()))
        })
        .collect()
}

fn num<T: std::str::FromStr>(v: &str, what: &str, line: usize, file: &Path) -> Result<T, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("{}:{line}: {what} \"{v}\" is not a number", file.display()))
}

impl Trace {
    /// Reads the node and pod CSV files of the trace.
    pub fn load(nodes_csv: &Path, pods_csv: &Path) -> Result<Trace, String> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
        };
        let node_text = read(nodes_csv)?;
        let pod_text = read(pods_csv)?;
        let mut models: Vec<String> = Vec::new();
        let model_index = |m: &str, models: &mut Vec<String>| -> Result<u8, String> {
            if let Some(i) = models.iter().position(|x| x == m) {
                return Ok(i as u8);
            }
            if models.len() >= 64 {
                return Err("more than 64 GPU models".into());
            }
            models.push(m.to_string());
            Ok((models.len() - 1) as u8)
        };
        let mut lines = node_text.lines();
        let header = lines
            .next()
            .ok_or_else(|| format!("{} is empty", nodes_csv.display()))?;
        let c = columns(
            header,
            &["sn", "cpu_milli", "memory_mib", "gpu", "model"],
            nodes_csv,
        )?;
        let mut nodes = Vec::new();
        for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split(',').collect();
            let get = |k: usize| f.get(c[k]).copied().unwrap_or("");
            let gpus: u8 = num(get(3), "gpu", i + 2, nodes_csv)?;
            if gpus > 8 {
                return Err(format!(
                    "{}:{}: more than 8 GPUs on a node",
                    nodes_csv.display(),
                    i + 2
                ));
            }
            nodes.push(NodeSpec {
                name: get(0).to_string(),
                cpu_milli: num(get(1), "cpu_milli", i + 2, nodes_csv)?,
                memory_mib: num(get(2), "memory_mib", i + 2, nodes_csv)?,
                gpus,
                model: model_index(get(4), &mut models)?,
            });
        }
        let mut lines = pod_text.lines();
        let header = lines
            .next()
            .ok_or_else(|| format!("{} is empty", pods_csv.display()))?;
        let c = columns(
            header,
            &["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"],
            pods_csv,
        )?;
        // gpu_spec is optional (some variants of the trace leave it out).
        let spec_col = header.trim().split(',').position(|h| h == "gpu_spec");
        let mut tasks = Vec::new();
        for (i, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let f: Vec<&str> = line.split(',').collect();
            let get = |k: usize| f.get(c[k]).copied().unwrap_or("");
            let num_gpu: u8 = num(get(3), "num_gpu", i + 2, pods_csv)?;
            let milli: i32 = num(get(4), "gpu_milli", i + 2, pods_csv)?;
            let mut mask = 0u64;
            let spec = spec_col.and_then(|i| f.get(i).copied()).unwrap_or("");
            for m in spec.split('|').map(str::trim).filter(|m| !m.is_empty()) {
                mask |= 1u64 << model_index(m, &mut models)?;
            }
            tasks.push(Task {
                name: get(0).to_string(),
                cpu_milli: num(get(1), "cpu_milli", i + 2, pods_csv)?,
                memory_mib: num(get(2), "memory_mib", i + 2, pods_csv)?,
                num_gpu,
                // gpu_milli counts only for one-GPU tasks; more take whole GPUs.
                gpu_milli: match num_gpu {
                    0 => 0,
                    1 => milli.clamp(0, 1000),
                    _ => 1000,
                },
                models: mask,
            });
        }
        if nodes.iter().all(|n| n.gpus == 0) || tasks.is_empty() {
            return Err("the trace has no GPU nodes or no tasks".into());
        }
        Ok(Trace {
            nodes,
            tasks,
            models,
        })
    }

    pub fn capacity_milli(&self) -> i64 {
        self.nodes.iter().map(|n| i64::from(n.gpus) * 1000).sum()
    }
}

/// The arrival order for one seed: sorted by name, shuffled, tuned to
/// 130 % of capacity.
pub fn arrivals(trace: &Trace, rng: &mut impl Rng) -> Vec<Task> {
    let mut sorted = trace.tasks.clone();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let mut order = sorted.clone();
    order.shuffle(rng);
    let target = TUNE_RATIO * trace.capacity_milli() as f64;
    let mut total: i64 = order.iter().map(Task::total_gpu_milli).sum();
    if (total as f64) < target {
        loop {
            let t = &sorted[rng.gen_range(0..sorted.len())];
            // FGD's tuning compares with the per-GPU request of the next
            // task, so a multi-GPU task may pass the target slightly.
            if (total + i64::from(t.gpu_milli)) as f64 > target {
                break;
            }
            total += t.total_gpu_milli();
            order.push(t.clone());
        }
    } else {
        while total as f64 > target && !order.is_empty() {
            let i = rng.gen_range(0..order.len());
            total -= order.remove(i).total_gpu_milli();
        }
    }
    order
}

/// The nodes in the order the scheduler meets them for one seed. FGD's
/// simulator sorts the nodes by name, prefixes each name with its place in a
/// seeded random permutation (`syncClusterResourceList`), and its scheduler
/// sends equal scores to the smallest name (`selectHost`): among equal
/// scores the winner is the first node of a random order fixed per seed, not
/// the first of the node list. Every policy here breaks its last ties by
/// this order.
pub fn node_order(trace: &Trace, rng: &mut impl Rng) -> Vec<NodeSpec> {
    let mut nodes = trace.nodes.clone();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    nodes.shuffle(rng);
    nodes
}

/// One seed's outcome.
#[derive(Debug, Clone, Serialize)]
pub struct SeedResult {
    pub seed: u64,
    pub tasks: usize,
    pub placed: usize,
    pub failed: usize,
    pub allocation_pct_at_130: f64,
    /// Allocation (% of GPU capacity) at arrived load 0..=130 %.
    pub allocation_pct: Vec<f64>,
    /// Fragmentation (% of GPU capacity) at arrived load 0..=130 %.
    pub fragmentation_pct: Vec<f64>,
}

/// Replays one seed under `policy`.
pub fn run_seed(trace: &Trace, policy: Policy, seed: u64) -> SeedResult {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let order = arrivals(trace, &mut rng);
    let shapes = typical_shapes(&trace.tasks, SHAPE_COVERAGE);
    let mut cluster = Cluster::new(
        &node_order(trace, &mut rng),
        shapes,
        cpu_per_milli(&trace.tasks),
    );
    let cap = cluster.capacity_milli as f64;
    let mut alloc = vec![f64::NAN; LOAD_POINTS];
    let mut frag = vec![f64::NAN; LOAD_POINTS];
    let mut arrived: i64 = 0;
    let mut next_point = 0usize;
    let mut placed = 0;
    let mut record = |cluster: &mut Cluster, upto: usize, next: &mut usize| {
        while *next <= upto && *next < LOAD_POINTS {
            alloc[*next] = 100.0 * cluster.allocated_milli as f64 / cap;
            frag[*next] = 100.0 * cluster.fragmentation() / cap;
            *next += 1;
        }
    };
    record(&mut cluster, 0, &mut next_point);
    for t in &order {
        if cluster.place(t, policy).is_some() {
            placed += 1;
        }
        arrived += t.total_gpu_milli();
        let pct = (100.0 * arrived as f64 / cap).floor() as usize;
        if pct >= next_point {
            record(&mut cluster, pct, &mut next_point);
        }
    }
    // Points the stream did not reach hold the final state.
    record(&mut cluster, LOAD_POINTS - 1, &mut next_point);
    SeedResult {
        seed,
        tasks: order.len(),
        placed,
        failed: order.len() - placed,
        allocation_pct_at_130: alloc[LOAD_POINTS - 1],
        allocation_pct: alloc,
        fragmentation_pct: frag,
    }
}

/// All seeds of one policy, with the means.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyResult {
    pub policy: String,
    pub seeds: Vec<u64>,
    pub allocation_pct_at_130: f64,
    pub per_seed: Vec<SeedResult>,
    /// Mean allocation (% of GPU capacity) at arrived load 0..=130 %.
    pub allocation_curve: Vec<f64>,
    /// Mean fragmentation (% of GPU capacity) at arrived load 0..=130 %.
    pub fragmentation_curve: Vec<f64>,
}

/// Replays every seed (in parallel threads) and averages.
pub fn run(trace: &Trace, policy: Policy, seeds: &[u64]) -> PolicyResult {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(seeds.len().max(1));
    let chunks: Vec<Vec<u64>> = (0..threads)
        .map(|i| seeds.iter().copied().skip(i).step_by(threads).collect())
        .collect();
    let mut per_seed: Vec<SeedResult> = std::thread::scope(|scope| {
        let handles: Vec<_> = chunks
            .iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|&s| run_seed(trace, policy, s))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    per_seed.sort_by_key(|r| r.seed);
    let n = per_seed.len().max(1) as f64;
    let mean_curve = |f: &dyn Fn(&SeedResult) -> &Vec<f64>| -> Vec<f64> {
        (0..LOAD_POINTS)
            .map(|i| per_seed.iter().map(|r| f(r)[i]).sum::<f64>() / n)
            .collect()
    };
    PolicyResult {
        policy: policy.name().to_string(),
        seeds: seeds.to_vec(),
        allocation_pct_at_130: per_seed
            .iter()
            .map(|r| r.allocation_pct_at_130)
            .sum::<f64>()
            / n,
        allocation_curve: mean_curve(&|r| &r.allocation_pct),
        fragmentation_curve: mean_curve(&|r| &r.fragmentation_pct),
        per_seed,
    }
}

/// Parses `42..51` (inclusive) or `42,43,44` or `42`.
pub fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let bad = || format!("--seeds: \"{s}\" is not a seed list (e.g. 42..51 or 42,43)");
    if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().map_err(|_| bad())?;
        let b: u64 = b
            .trim()
            .trim_start_matches('=')
            .parse()
            .map_err(|_| bad())?;
        if b < a || b - a > 1000 {
            return Err(bad());
        }
        return Ok((a..=b).collect());
    }
    s.split(',')
        .map(|x| x.trim().parse().map_err(|_| bad()))
        .collect()
}
