//! Real processes in real cgroups (as root): freezing stops a busy process
//! and thawing resumes it; three busy shares at high, normal and low
//! priority get CPU time near 4:2:1 under the scheduler; a worker start
//! thaws whatever a previous run left frozen. Where the machine does not
//! allow cgroups the tests say so loudly and skip.

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use gpuslice::domain::Priority;
use gpuslice::sched::cgroup::Layout;
use gpuslice::sched::enforce::Enforcer;
use gpuslice::sched::scheduler::ShareSpec;

/// The layout with a private prefix, or `None` (and a loud message).
fn layout(test: &str) -> Option<Layout> {
    let why = if !nix::unistd::Uid::effective().is_root() {
        Some("not running as root".to_string())
    } else {
        None
    };
    let prefix = format!("gpuslice-test-{}-{test}", std::process::id());
    let found = why
        .is_none()
        .then(|| Layout::detect(std::path::Path::new("/sys/fs/cgroup"), &prefix))
        .flatten();
    let usable = found
        .as_ref()
        .is_some_and(|l| match l.create(0, None, None) {
            Ok(g) => g.remove(Duration::ZERO).is_ok(),
            Err(_) => false,
        });
    if !usable {
        let why = why.unwrap_or_else(|| "no writable cgroup freezer under /sys/fs/cgroup".into());
        if std::env::var_os("GPUSLICE_REQUIRE_CGROUPS").is_some() {
            panic!("cgroup test required but {why}");
        }
        common::skipped(&format!("cgroup test {test}"), &why);
        return None;
    }
    found
}

fn cleanup(l: &Layout) {
    for id in l.existing() {
        let _ = l.group(id).remove(Duration::from_millis(100));
    }
    l.remove_prefix();
}

/// The tests pin busy processes to CPU 0: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn busy() -> Child {
    Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .unwrap()
}

#[test]
fn freezing_stops_a_busy_process_and_thawing_resumes_it() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = layout("freeze") else { return };
    let g = l.create(1, Some(256 << 20), None).unwrap();
    let mut p = busy();
    g.add(p.id()).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    g.freeze().unwrap();
    assert!(g.is_frozen());
    let a = g.cpu_ns();
    std::thread::sleep(Duration::from_millis(300));
    let b = g.cpu_ns();
    assert!(
        b - a < 5_000_000,
        "frozen but used {} ms",
        (b - a) / 1_000_000
    );
    g.thaw().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(g.cpu_ns() - b > 100_000_000, "thawed but did not run");
    // A worker start thaws what a crashed run left frozen.
    g.freeze().unwrap();
    assert_eq!(l.thaw_all(), 1);
    assert!(!g.is_frozen());
    let _ = p.kill();
    let _ = p.wait();
    g.remove(Duration::from_millis(100)).unwrap();
    assert!(!g.exists());
    cleanup(&l);
}

#[test]
fn three_busy_shares_get_cpu_time_near_4_2_1() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = layout("ratio") else { return };
    let mut procs = Vec::new();
    let mut e = Enforcer::new();
    let mut groups = Vec::new();
    for (id, prio) in [
        (1, Priority::High),
        (2, Priority::Normal),
        (3, Priority::Low),
    ] {
        // All on one CPU: when a share runs it has that CPU to itself.
        let g = l.create(id, None, Some("0")).unwrap();
        let p = busy();
        g.add(p.id()).unwrap();
        procs.push(p);
        e.add(
            ShareSpec {
                id,
                priority: prio,
                guaranteed_pct: 0.0,
                min_slice_ms: None,
                max_slice_ms: None,
            },
            g.clone(),
        );
        groups.push(g);
    }
    let before: Vec<u64> = groups.iter().map(|g| g.cpu_ns()).collect();
    e.run_until(Instant::now() + Duration::from_secs(4));
    e.release_all();
    let used: Vec<f64> = groups
        .iter()
        .zip(&before)
        .map(|(g, b)| (g.cpu_ns() - b) as f64)
        .collect();
    let total: f64 = used.iter().sum();
    for p in &mut procs {
        let _ = p.kill();
        let _ = p.wait();
    }
    cleanup(&l);
    let shares: Vec<f64> = used.iter().map(|u| u / total).collect();
    eprintln!("CPU time shares: {shares:?} (4:2:1 is 0.571, 0.286, 0.143)");
    for (got, want) in shares.iter().zip([4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
        assert!((got - want).abs() / want < 0.15, "{shares:?}");
    }
    assert!(groups.iter().all(|g| !g.exists()));
}

#[test]
fn the_scheduler_benchmark_runs() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // `gpuslice bench scheduler` in CI, short: tick cost always, real
    // processes when the machine allows (it says when it does not).
    gpuslice::bench::scheduler::run(2).unwrap();
}
