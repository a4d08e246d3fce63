//! `gpuslice bench ...`: the benchmarks of `bench/`, with their output.

use anyhow::{anyhow, bail, Result};

use super::args::BenchCommand;

/// `gpuslice bench ...`: runs one benchmark and prints its figures (a
/// table, or JSON with `--json`).
pub fn bench(cmd: &BenchCommand) -> Result<()> {
    use crate::bench::cluster::Policy;
    use crate::bench::replay;
    let (nodes, pods, policy, seeds, json) = match cmd {
        BenchCommand::Mig(args) => return bench_mig(args),
        BenchCommand::Latency {
            gpus,
            bookings,
            decisions,
            json,
        } => return bench_latency(*gpus, *bookings, *decisions, *json),
        BenchCommand::Scheduler { secs } => return crate::bench::scheduler::run(*secs),
        BenchCommand::Launch { parts, secs } => {
            let parts = crate::bench::launch::Parts::in_dir(parts)?;
            return crate::bench::launch::run(&parts, *secs);
        }
        BenchCommand::Telemetry { .. } | BenchCommand::History { .. } => {
            bail!("this benchmark needs a database")
        }
        BenchCommand::Replay {
            nodes,
            pods,
            policy,
            seeds,
            json,
        } => (nodes, pods, policy, seeds, json),
    };
    let policies: Vec<Policy> = if policy == "all" {
        Policy::ALL.to_vec()
    } else {
        policy
            .split(',')
            .map(|p| Policy::parse(p.trim()).map_err(|e| anyhow!("--policy: {e}")))
            .collect::<Result<_>>()?
    };
    let seeds = replay::parse_seeds(seeds).map_err(|e| anyhow!(e))?;
    let trace = replay::Trace::load(nodes, pods).map_err(|e| anyhow!(e))?;
    let mut results = Vec::new();
    for p in policies {
        let started = std::time::Instant::now();
        let r = replay::run(&trace, p, &seeds);
        let secs = started.elapsed().as_secs_f64();
        if !json {
            let lo = r
                .per_seed
                .iter()
                .map(|s| s.allocation_pct_at_130)
                .fold(f64::MAX, f64::min);
            let hi = r
                .per_seed
                .iter()
                .map(|s| s.allocation_pct_at_130)
                .fold(f64::MIN, f64::max);
            println!(
                "{:<10} allocation at 130 %: {:6.2} % (seeds {:.2}–{:.2}), fragmentation at 100 %: {:5.2} %, {} seeds in {secs:.1} s",
                r.policy, r.allocation_pct_at_130, lo, hi, r.fragmentation_curve[100], seeds.len()
            );
        }
        results.push(r);
    }
    if *json {
        let out = if results.len() == 1 {
            serde_json::to_string_pretty(&results[0])?
        } else {
            serde_json::to_string_pretty(&results)?
        };
        println!("{out}");
    }
    Ok(())
}

fn bench_latency(gpus: usize, bookings: usize, decisions: usize, json: bool) -> Result<()> {
    if gpus == 0 || decisions == 0 {
        bail!("--gpus and --decisions must be at least 1");
    }
    let results = crate::bench::latency::run(gpus, bookings, decisions, 42);
    if json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    } else {
        for r in results {
            println!(
                "{:<10} {} GPUs, {} bookings: p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs over {} decisions (time index built once in {:.1} ms)",
                r.policy, r.gpus, r.bookings, r.p50_us, r.p99_us, r.max_us, r.decisions, r.index_ms
            );
        }
    }
    Ok(())
}

fn bench_mig(args: &super::args::MigBench) -> Result<()> {
    let &super::args::MigBench {
        ref pods,
        gpus,
        speedup,
        advance,
        resample,
        jitter_s,
        mix,
        ref key,
        causes,
        ref admit,
        ref seeds,
        json,
    } = args;
    use crate::bench::{mig, replay::parse_seeds};
    use crate::placement::mig::{KeyOrder, MigPolicy};
    let order = key
        .as_deref()
        .map(KeyOrder::parse)
        .transpose()
        .map_err(|e| anyhow!("--key: {e}"))?;
    if order.is_some() && advance > 0.0 {
        bail!("--key replays first-fit and the order only, without bookings ahead: leave out --advance");
    }
    let admission = admit
        .as_deref()
        .map(mig::Admission::parse)
        .transpose()
        .map_err(|e| anyhow!("--admit: {e}"))?;
    if admission.is_some() && (order.is_some() || advance > 0.0 || causes) {
        bail!("--admit replays first-fit and the default policy behind the rule only: leave out --key, --advance and --causes (a request the rule refuses fits, so it would count as fragmentation's)");
    }
    if gpus == 0 {
        bail!("--gpus: the fleet needs at least one GPU");
    }
    if !(speedup.is_finite() && speedup > 0.0) {
        bail!("--speedup must be a positive number (1 replays the trace's own times)");
    }
    if !(0.0..=100.0).contains(&advance) {
        bail!("--advance is a percentage of requests booked ahead, 0 to 100");
    }
    // Each policy; the repack reference; with bookings ahead, the default
    // policy moving scheduled bookings to let requests in. With --key:
    // first-fit and that order only; with --admit, first-fit and the
    // default behind the rule.
    enum Replay {
        Plain(MigPolicy),
        Moving(MigPolicy),
        Repack,
        Admitting(MigPolicy, mig::Admission),
    }
    let runs: Vec<Replay> = match (order, admission) {
        (Some(o), _) => vec![
            Replay::Plain(MigPolicy::FirstFit),
            Replay::Plain(MigPolicy::Ordered(o)),
        ],
        (None, Some(a)) => vec![
            Replay::Plain(MigPolicy::FirstFit),
            Replay::Admitting(MigPolicy::Gpuslice, a),
        ],
        (None, None) => MigPolicy::ALL
            .into_iter()
            .map(Replay::Plain)
            .chain([Replay::Repack])
            .chain((advance > 0.0).then_some(Replay::Moving(MigPolicy::Gpuslice)))
            .collect(),
    };
    let setup = mig::Setup { gpus, causes };
    let mut all = Vec::new();
    for seed in parse_seeds(seeds).map_err(|e| anyhow!(e))? {
        let stream = mig::stream(pods, seed, speedup, advance / 100.0, resample, jitter_s)
            .map_err(|e| anyhow!(e))?;
        let mut base = None;
        for run in &runs {
            let started = std::time::Instant::now();
            let r = match *run {
                Replay::Plain(p) => mig::run(&stream, setup, p, mix),
                Replay::Moving(p) => mig::run_moving(&stream, setup, p, mix),
                Replay::Repack => mig::run_repack(&stream, setup),
                Replay::Admitting(p, a) => mig::run_admitting(&stream, setup, p, mix, a),
            };
            let base_acc = *base.get_or_insert(r.accepted);
            if !json {
                println!(
                    "seed {seed} {:<22} accepted {:>6} of {} ({:5.2} %, {:+5.1} % vs first-fit), served {:9.0} slice-hours ({:9.0} before the last arrival, fleet {:4.1} % busy), stranded slices {:7.1}, fleet busy at refusals {:5.1} %{}, moves {}{}, {:.1} s",
                    r.policy,
                    r.accepted,
                    r.requests,
                    r.acceptance_pct,
                    100.0 * (r.accepted as f64 / base_acc.max(1) as f64 - 1.0),
                    r.served_slice_hours,
                    r.served_in_window_slice_hours,
                    r.window_busy_pct,
                    r.mean_stranded_slices,
                    r.busy_pct_at_refusals,
                    r.refused_fragmented
                        .zip(r.refused_fragmented_slice_hours)
                        .map(|(n, sh)| format!(
                            ", refused for fragmentation {n} ({sh:.0} slice-hours)"
                        ))
                        .unwrap_or_default(),
                    r.moves,
                    r.least_notice_s
                        .map(|s| format!(" (least notice {} min)", s / 60))
                        .unwrap_or_default(),
                    started.elapsed().as_secs_f64()
                );
            }
            all.push(serde_json::json!({"seed": seed, "result": r}));
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
    }
    Ok(())
}
