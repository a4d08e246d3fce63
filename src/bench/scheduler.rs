//! `gpuslice bench scheduler`: the time-slice scheduler's tick cost with
//! 1,000 shares (pure, no hardware), and — as root, with cgroups — the
//! achieved 4:2:1 ratio of real busy processes and the freeze→thaw switch
//! latency.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::domain::Priority;
use crate::sched::cgroup::Layout;
use crate::sched::enforce::Enforcer;
use crate::sched::scheduler::{GpuScheduler, ShareSpec};

fn spec(id: i64, priority: Priority) -> ShareSpec {
    ShareSpec {
        id,
        priority,
        guaranteed_pct: 10.0,
        min_slice_ms: None,
        max_slice_ms: None,
    }
}

/// Nanoseconds per tick with `shares` busy shares, over `ticks` ticks.
pub fn tick_cost(shares: usize, ticks: usize) -> (f64, f64) {
    let mut s = GpuScheduler::default();
    for i in 0..shares {
        s.add(spec(i as i64, Priority::ALL[i % 3]));
    }
    let mut now = 0;
    let mut d = s.tick(now, None, |_| true);
    let mut samples = Vec::with_capacity(ticks);
    for _ in 0..ticks {
        now = d.until;
        let t = Instant::now();
        d = s.tick(now, Some(1e9), |_| true);
        samples.push(t.elapsed().as_nanos() as f64);
    }
    samples.sort_by(f64::total_cmp);
    let p = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    (p(0.5), p(0.99))
}

/// Runs `n` busy processes in shares cycling high, normal, low for
/// `secs` seconds; returns the worst relative error against the priority
/// ratio and the switch latencies.
pub fn real_ratio(layout: &Layout, n: usize, secs: u64) -> anyhow::Result<(f64, Vec<Duration>)> {
    let mut procs: Vec<Child> = Vec::new();
    let mut groups = Vec::new();
    let mut e = Enforcer::new();
    let mut weights = Vec::new();
    for i in 0..n {
        let id = 1_000_000 + i as i64;
        let prio = Priority::ALL[i % 3];
        let g = layout.create(id, None, Some("0"))?;
        let p = Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()?;
        g.add(p.id())?;
        procs.push(p);
        e.add(
            ShareSpec {
                guaranteed_pct: 0.0,
                ..spec(id, prio)
            },
            g.clone(),
        );
        weights.push(crate::sched::scheduler::base_slice_ms(prio));
        groups.push(g);
    }
    let before: Vec<u64> = groups.iter().map(|g| g.cpu_ns()).collect();
    e.run_until(Instant::now() + Duration::from_secs(secs));
    e.release_all();
    let used: Vec<f64> = groups
        .iter()
        .zip(&before)
        .map(|(g, b)| g.cpu_ns().saturating_sub(*b) as f64)
        .collect();
    for p in &mut procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    for g in &groups {
        let _ = g.remove(Duration::from_millis(100));
    }
    let total: f64 = used.iter().sum();
    let wsum: f64 = weights.iter().sum();
    let worst = used
        .iter()
        .zip(&weights)
        .map(|(u, w)| ((u / total) - (w / wsum)).abs() / (w / wsum))
        .fold(0.0, f64::max);
    Ok((worst, e.switches.clone()))
}

/// Prints the benchmark.
pub fn run(secs: u64) -> anyhow::Result<()> {
    println!(
        "machine: {} cores",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    let (p50, p99) = tick_cost(1000, 20_000);
    println!(
        "tick with 1,000 busy shares: p50 {:.1} µs, p99 {:.1} µs",
        p50 / 1000.0,
        p99 / 1000.0
    );
    let (b50, b99) = tick_cost(3, 20_000);
    println!(
        "tick with 3 busy shares (baseline): p50 {:.2} µs, p99 {:.2} µs",
        b50 / 1000.0,
        b99 / 1000.0
    );
    let prefix = format!("gpuslice-bench-{}", std::process::id());
    let layout = nix::unistd::Uid::effective()
        .is_root()
        .then(|| Layout::detect(std::path::Path::new("/sys/fs/cgroup"), &prefix))
        .flatten();
    let Some(layout) = layout else {
        println!("real processes: skipped (needs root and a cgroup freezer)");
        return Ok(());
    };
    println!("cgroups: {}", layout.kind());
    // The busy processes share CPU 0; the enforcer gets CPU 1 (on a GPU node
    // the worker would have a core of its own), so its wake-ups do not wait
    // behind the very processes it switches.
    let mut cpus = nix::sched::CpuSet::new();
    if cpus.set(1).is_ok()
        && nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &cpus).is_ok()
    {
        println!("enforcer pinned to CPU 1, shares to CPU 0");
    }
    let mut all_switches = Vec::new();
    for n in [3, 10] {
        let (err, switches) = real_ratio(&layout, n, secs)?;
        println!(
            "{n} busy shares over {secs} s: worst ratio error {:.1} % ({} switches)",
            err * 100.0,
            switches.len()
        );
        all_switches.extend(switches);
    }
    all_switches.sort();
    if !all_switches.is_empty() {
        let p = |q: f64| {
            all_switches[((all_switches.len() as f64 * q) as usize).min(all_switches.len() - 1)]
        };
        println!(
            "freeze→thaw switch: p50 {:.0} µs, p99 {:.0} µs ({} switches)",
            p(0.5).as_secs_f64() * 1e6,
            p(0.99).as_secs_f64() * 1e6,
            all_switches.len()
        );
    }
    layout.remove_prefix();
    Ok(())
}
