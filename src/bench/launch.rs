//! `gpuslice bench launch`: time-sliced shares on the stand-in libcuda's
//! simulated GPU (one GPU for the whole machine, launches queued as on
//! hardware). Busy `cuda-burn` processes in high, normal and low shares
//! (cycling) split the GPU; how they split is read from the stand-in's own
//! timeline (the GPU time each process's launches took), under no control,
//! the cgroup freezer (as root) and the launch shim. Also the shim's added
//! cost per launch while its share is within budget, against the same
//! program without it in the same run.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::domain::Priority;
use crate::sched::cgroup::Layout;
use crate::sched::enforce::Enforcer;
use crate::sched::launch::Regions;
use crate::sched::scheduler::{base_slice_ms, ShareSpec};

/// The built parts: `cuda-burn`, the shim, the directory of the stand-in
/// `libcuda.so.1`.
#[derive(Debug, Clone)]
pub struct Parts {
    pub burn: PathBuf,
    pub shim: PathBuf,
    pub libcuda_dir: PathBuf,
}

impl Parts {
    /// The parts in a cargo target directory (`target/release`).
    pub fn in_dir(dir: &Path) -> Result<Parts> {
        let p = Parts {
            burn: dir.join("cuda-burn"),
            shim: dir.join("libgpuslice_shim.so"),
            libcuda_dir: dir.to_path_buf(),
        };
        for f in [&p.burn, &p.shim, &dir.join("libcuda.so.1")] {
            if !f.exists() {
                bail!(
                    "{} is missing: build it with cargo build --release -p cuda-standin -p gpuslice-shim",
                    f.display()
                );
            }
        }
        Ok(p)
    }
}

/// How the shares are held to 4:2:1.
#[derive(Debug, Clone)]
pub enum Control {
    /// Nobody: the processes race for the GPU.
    None,
    /// The cgroup freezer alone (root).
    Freezer(Layout),
    /// The launch shim, gated by the scheduler.
    Shim,
}

impl Control {
    pub fn name(&self) -> &'static str {
        match self {
            Control::None => "no control",
            Control::Freezer(_) => "freezer alone",
            Control::Shim => "launch shim",
        }
    }
}

/// How `n` busy shares split the simulated GPU.
#[derive(Debug, Clone)]
pub struct Split {
    /// Each share's part of the GPU time in the measured window.
    pub got: Vec<f64>,
    /// Its part by priority (4:2:1).
    pub want: Vec<f64>,
    /// The largest relative error against `want`.
    pub worst: f64,
    /// How busy the GPU was in the window (0..1).
    pub busy: f64,
    /// At the window's end, the most GPU work (ms) any share not running
    /// had still queued: how long a freeze or a closed turn takes to free
    /// the GPU of that share.
    pub backlog_ms: f64,
}

/// A fresh state file for the stand-in (a private simulated GPU).
fn state_file(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("gpuslice-bench-cuda-{}-{tag}", std::process::id()))
}

fn burn(parts: &Parts, state: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(&parts.burn);
    c.args(args)
        .env("LD_LIBRARY_PATH", &parts.libcuda_dir)
        .env(gpuslice_cuda::standin::ENV_STATE, state)
        .env_remove("LD_PRELOAD")
        .stdout(std::process::Stdio::piped());
    c
}

/// Runs `n` busy shares for `warm` + `secs` seconds under `control` and
/// measures the split over the last `secs`.
pub fn split(parts: &Parts, n: usize, warm: u64, secs: u64, control: &Control) -> Result<Split> {
    let tag = format!("{n}-{}", control.name().replace(' ', "-"));
    let state = state_file(&tag);
    let _ = std::fs::remove_file(&state);
    let dir = std::env::temp_dir().join(format!(
        "gpuslice-bench-shares-{}-{tag}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir)?;
    let mut e = match control {
        Control::Shim => Enforcer::launch(),
        _ => Enforcer::new(),
    };
    let mut children: Vec<Child> = Vec::new();
    let mut weights = Vec::new();
    let mut groups = Vec::new();
    let total = (warm + secs + 5).to_string();
    let result = (|| -> Result<Split> {
        for i in 0..n {
            let id = 2_000_000 + i as i64;
            let prio = Priority::ALL[i % 3];
            weights.push(base_slice_ms(prio));
            let spec = ShareSpec {
                id,
                priority: prio,
                guaranteed_pct: 0.0,
                min_slice_ms: None,
                max_slice_ms: None,
            };
            let mut cmd = burn(parts, &state, &["--seconds", &total, "--kernel-us", "500"]);
            match control {
                Control::Shim => {
                    let r = Regions::ensure(&dir, id, 0)?;
                    let (c, rep) = gpuslice_cuda::region::paths(&dir, id);
                    cmd.env("LD_PRELOAD", &parts.shim)
                        .env(gpuslice_cuda::region::ENV_CONTROL, c)
                        .env(gpuslice_cuda::region::ENV_REPORT, rep);
                    let child = cmd.spawn().context("run cuda-burn")?;
                    children.push(child);
                    e.add_launch(spec, None, r);
                }
                Control::Freezer(layout) => {
                    let g = layout.create(id, None, None)?;
                    let child = cmd.spawn().context("run cuda-burn")?;
                    g.add(child.id())?;
                    children.push(child);
                    e.add(spec, g.clone());
                    groups.push(g);
                }
                Control::None => children.push(cmd.spawn().context("run cuda-burn")?),
            }
        }
        let pids: Vec<u32> = children.iter().map(Child::id).collect();
        let sample = || -> Vec<u64> {
            let live = gpuslice_cuda::standin::read_at(&state).unwrap_or_default();
            pids.iter()
                .map(|p| live.iter().find(|v| v.pid == *p).map_or(0, |v| v.gpu_ns))
                .collect()
        };
        let t0 = Instant::now() + Duration::from_secs(warm);
        let run = |e: &mut Enforcer, until: Instant| match control {
            Control::None => std::thread::sleep(until.saturating_duration_since(Instant::now())),
            _ => e.run_until(until),
        };
        run(&mut e, t0);
        let before = sample();
        let started = Instant::now();
        run(&mut e, t0 + Duration::from_secs(secs));
        let after = sample();
        let window = started.elapsed().as_secs_f64() * 1e9;
        let now = gpuslice_cuda::now_ns();
        let live = gpuslice_cuda::standin::read_at(&state).unwrap_or_default();
        let running = e.running();
        let backlog_ms = pids
            .iter()
            .enumerate()
            .filter(|(i, _)| running != Some(2_000_000 + *i as i64))
            .filter_map(|(_, p)| live.iter().find(|v| v.pid == *p))
            .map(|v| v.last_end_ns.saturating_sub(now) as f64 / 1e6)
            .fold(0.0, f64::max);
        e.release_all();
        let used: Vec<f64> = after
            .iter()
            .zip(&before)
            .map(|(a, b)| a.saturating_sub(*b) as f64)
            .collect();
        let sum: f64 = used.iter().sum();
        if sum == 0.0 {
            bail!(
                "the shares launched nothing (is the stand-in libcuda.so.1 in {}?)",
                parts.libcuda_dir.display()
            );
        }
        let wsum: f64 = weights.iter().sum();
        let got: Vec<f64> = used.iter().map(|u| u / sum).collect();
        let want: Vec<f64> = weights.iter().map(|w| w / wsum).collect();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w)
            .fold(0.0, f64::max);
        Ok(Split {
            got,
            want,
            worst,
            busy: (sum / window).min(1.0),
            backlog_ms,
        })
    })();
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
    for g in &groups {
        let _ = g.remove(Duration::from_millis(100));
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&state);
    result
}

/// Mean time of a launch call, ns, without and with the shim (its share
/// alone on the GPU, so always within budget): `launches` launches of
/// 1 µs kernels, synchronised every 256 so the queue never fills.
pub fn launch_cost(parts: &Parts, launches: u64) -> Result<(f64, f64)> {
    let state = state_file("cost");
    let dir =
        std::env::temp_dir().join(format!("gpuslice-bench-shares-{}-cost", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let r = Regions::ensure(&dir, 1, 0)?;
    r.control.open_alone();
    let (c, rep) = gpuslice_cuda::region::paths(&dir, 1);
    let n = launches.to_string();
    let args = [
        "--launches",
        n.as_str(),
        "--kernel-us",
        "1",
        "--sync-every",
        "256",
    ];
    let mean = |out: std::process::Output| -> Result<f64> {
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("cuda-burn said: {}", String::from_utf8_lossy(&out.stderr)))?;
        v["launch_ns_mean"].as_f64().context("no launch_ns_mean")
    };
    // Alternating runs, the best of three each: the same machine state.
    let (mut without, mut with) = (f64::MAX, f64::MAX);
    for _ in 0..3 {
        without = without.min(mean(burn(parts, &state, &args).output()?)?);
        let out = burn(parts, &state, &args)
            .env("LD_PRELOAD", &parts.shim)
            .env(gpuslice_cuda::region::ENV_CONTROL, &c)
            .env(gpuslice_cuda::region::ENV_REPORT, &rep)
            .output()?;
        with = with.min(mean(out)?);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_file(&state);
    Ok((without, with))
}

/// Prints the benchmark.
pub fn run(parts: &Parts, secs: u64) -> Result<()> {
    println!(
        "machine: {} cores; stand-in libcuda, 500 µs kernels, {secs} s measured after 3 s",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    let layout = nix::unistd::Uid::effective()
        .is_root()
        .then(|| {
            Layout::detect(
                Path::new("/sys/fs/cgroup"),
                &format!("gpuslice-bench-{}", std::process::id()),
            )
        })
        .flatten();
    let mut controls = vec![Control::None];
    match &layout {
        Some(l) => controls.push(Control::Freezer(l.clone())),
        None => println!("freezer: skipped (needs root and a cgroup freezer)"),
    }
    controls.push(Control::Shim);
    for n in [3, 10] {
        for c in &controls {
            let s = split(parts, n, 3, secs, c)?;
            let shown: Vec<String> = s.got.iter().take(3).map(|g| format!("{:.3}", g)).collect();
            println!(
                "{n} busy shares, {:<13}: worst ratio error {:5.1} %, first three parts {} (want {:.3}, {:.3}, {:.3}), GPU busy {:.0} %, queued work of a waiting share {:.1} ms",
                c.name(),
                s.worst * 100.0,
                shown.join(", "),
                s.want[0],
                s.want[1],
                s.want[2],
                s.busy * 100.0,
                s.backlog_ms
            );
        }
    }
    let (without, with) = launch_cost(parts, 200_000)?;
    println!(
        "launch call, share within budget: {:.0} ns without the shim, {:.0} ns with it: {:.0} ns added per launch ({:.2}x)",
        without,
        with,
        with - without,
        with / without
    );
    if let Some(l) = layout {
        l.remove_prefix();
    }
    Ok(())
}
