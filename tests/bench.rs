//! `gpuslice bench replay` on a small trace written here.

use std::process::Command;

/// The gpuslice binary under test.
fn gpuslice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gpuslice"))
}

/// Runs `cmd`, which must succeed, and parses its JSON output.
fn json_of(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `bench mig` with `args` on `pods` exits 1 with `says` in its message.
fn refused(args: &[&str], pods: &std::path::Path, says: &str) {
    let out = gpuslice()
        .args(["bench", "mig"])
        .args(args)
        .arg("--pods")
        .arg(pods)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{args:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(says), "{args:?}: {stderr}");
}

/// `bench mig ARGS --json --pods PODS`'s results, one per policy and seed.
fn mig_rows(args: &[&str], pods: &std::path::Path) -> Vec<serde_json::Value> {
    let v = json_of(
        gpuslice()
            .args(["bench", "mig"])
            .args(args)
            .args(["--json", "--pods"])
            .arg(pods),
    );
    v.as_array().unwrap().clone()
}

/// The policy of each result, in order.
fn policies(rows: &[serde_json::Value]) -> Vec<&str> {
    rows.iter()
        .map(|r| r["result"]["policy"].as_str().unwrap())
        .collect()
}

fn write_trace(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let nodes = dir.join("nodes.csv");
    let pods = dir.join("pods.csv");
    let mut n = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for i in 0..20 {
        n += &format!(
            "node-{i:02},64000,262144,{},{}\n",
            if i % 2 == 0 { 8 } else { 2 },
            if i % 3 == 0 { "T4" } else { "V100" }
        );
    }
    n += "cpu-node,32000,131072,0,\n";
    let mut p = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n");
    for i in 0..200 {
        let (num, milli, spec) = match i % 5 {
            0 => (1, 500, ""),
            1 => (1, 1000, ""),
            2 => (2, 1000, "V100"),
            3 => (0, 0, ""),
            _ => (1, 250, "T4|V100"),
        };
        p += &format!(
            "pod-{i:03},{},{},{num},{milli},{spec},LS\n",
            4000 + (i % 4) * 2000,
            8192
        );
    }
    std::fs::write(&nodes, n).unwrap();
    std::fs::write(&pods, p).unwrap();
    (nodes, pods)
}

#[test]
fn replay_reports_allocation_and_curves_for_each_policy() {
    let dir = std::env::temp_dir().join(format!("gpuslice-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (nodes, pods) = write_trace(&dir);
    let v = json_of(
        gpuslice()
            .args(["bench", "replay", "--seeds", "1..2", "--json", "--nodes"])
            .arg(&nodes)
            .arg("--pods")
            .arg(&pods),
    );
    let results = v.as_array().unwrap();
    let names: Vec<_> = results
        .iter()
        .map(|r| r["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["first-fit", "best-fit", "fgd", "gpuslice"]);
    for r in results {
        let alloc = r["allocation_pct_at_130"].as_f64().unwrap();
        assert!(alloc > 50.0 && alloc <= 100.0, "{alloc}");
        assert_eq!(r["per_seed"].as_array().unwrap().len(), 2);
        let curve = r["allocation_curve"].as_array().unwrap();
        assert_eq!(curve.len(), 131);
        // No departures in this replay: allocation only grows.
        let c: Vec<f64> = curve.iter().map(|a| a.as_f64().unwrap()).collect();
        assert!(c.windows(2).all(|w| w[1] >= w[0]), "{c:?}");
        assert_eq!(c[0], 0.0);
        assert_eq!(r["fragmentation_curve"].as_array().unwrap().len(), 131);
    }
    // The same seeds give the same answer.
    let again = json_of(
        gpuslice()
            .args([
                "bench", "replay", "--seeds", "1..2", "--json", "--policy", "fgd", "--nodes",
            ])
            .arg(&nodes)
            .arg("--pods")
            .arg(&pods),
    );
    assert_eq!(
        again["allocation_pct_at_130"],
        results[2]["allocation_pct_at_130"]
    );

    // Bad input: one sentence, non-zero.
    for (args, want) in [
        (vec!["--policy", "magic"], "unknown policy \"magic\""),
        (vec!["--seeds", "9..1"], "is not a seed list"),
    ] {
        let out = gpuslice()
            .args(["bench", "replay", "--nodes"])
            .arg(&nodes)
            .arg("--pods")
            .arg(&pods)
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(want),
            "{args:?}"
        );
    }
    let out = gpuslice()
        .args(["bench", "replay", "--nodes", "/nonexistent.csv", "--pods"])
        .arg(&pods)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read /nonexistent.csv"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn latency_and_mig_benchmarks_run_small() {
    let v = json_of(gpuslice().args([
        "bench",
        "latency",
        "--gpus",
        "50",
        "--bookings",
        "300",
        "--decisions",
        "20",
        "--json",
    ]));
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r["bookings"].as_u64().unwrap() > 200
        && r["p99_us"].as_f64().unwrap() >= r["p50_us"].as_f64().unwrap()));

    let dir = std::env::temp_dir().join(format!("gpuslice-migbench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pods = dir.join("pods.csv");
    let mut p = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n");
    for i in 0..300 {
        let (num, milli) = [(1, 100), (1, 300), (1, 500), (1, 1000), (2, 1000)][i % 5];
        p += &format!(
            "pod-{i},4000,8192,{num},{milli},,LS,Running,{},{},0\n",
            i * 60,
            i * 60 + 3600 * (1 + i % 3)
        );
    }
    std::fs::write(&pods, p).unwrap();
    let rows = &mig_rows(&["--gpus", "4"], &pods);
    assert_eq!(rows.len(), 4, "three policies and the repack reference");
    assert_eq!(rows[3]["result"]["policy"], "repack-reference");
    for r in rows {
        let r = &r["result"];
        assert_eq!(r["requests"], 360, "300 tasks, 60 of them two GPUs");
        assert!(r["accepted"].as_u64().unwrap() <= 360);
        assert!(r["served_slice_hours"].as_f64().unwrap() > 0.0);
    }
    // Faster arrivals on the same fleet: more load, no more requests accepted.
    let fast = mig_rows(&["--gpus", "4", "--speedup", "4"], &pods);
    for (slow, fast) in rows.iter().zip(&fast) {
        assert!(
            fast["result"]["accepted"].as_u64() <= slow["result"]["accepted"].as_u64(),
            "{fast} vs {slow}"
        );
    }
    refused(
        &["--speedup", "0"],
        &pods,
        "--speedup must be a positive number",
    );
    // Refusals by cause: only when asked for (null, not zero, otherwise);
    // the same decisions either way; some refusal on this small fleet is
    // fragmentation's.
    assert!(rows
        .iter()
        .all(|r| r["result"]["refused_fragmented"].is_null()));
    let split = mig_rows(&["--gpus", "4", "--causes"], &pods);
    assert_eq!(split.len(), rows.len());
    for (r, plain) in split.iter().zip(rows) {
        let (r, plain) = (&r["result"], &plain["result"]);
        assert_eq!(r["accepted"], plain["accepted"], "{r}");
        assert_eq!(r["served_slice_hours"], plain["served_slice_hours"], "{r}");
        assert!(r["refused_slice_hours"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        split
            .iter()
            .any(|r| r["result"]["refused_fragmented"].as_u64().unwrap() > 0),
        "some refusal on this fleet is fragmentation's: {split:?}"
    );
    // An order of the ranking terms: first-fit and that order only; the
    // default's own order decides as the default does.
    let keyed = mig_rows(&["--gpus", "4", "--key", "ext,loss"], &pods);
    assert_eq!(policies(&keyed), ["first-fit", "key ext,loss"]);
    assert_eq!(rows[2]["result"]["policy"], "gpuslice");
    assert_eq!(
        keyed[1]["result"]["served_slice_hours"],
        rows[2]["result"]["served_slice_hours"]
    );
    assert_eq!(
        keyed[1]["result"]["accepted"],
        rows[2]["result"]["accepted"]
    );
    refused(
        &["--key", "ext,fullest"],
        &pods,
        "--key: unknown term \"fullest\"",
    );
    refused(
        &["--key", "ext", "--advance", "10"],
        &pods,
        "leave out --advance",
    );
    // An admission rule: first-fit (as without it) and the default behind
    // the rule, and nothing else.
    let admitted = mig_rows(&["--gpus", "4", "--admit", "1,0.5"], &pods);
    assert_eq!(policies(&admitted), ["first-fit", "gpuslice admit 1,0.5"]);
    assert_eq!(admitted[0]["result"], rows[0]["result"]);
    refused(
        &["--admit", "1"],
        &pods,
        "--admit: \"1\" is not KEEP,QUANTILE",
    );
    for other in [
        ["--key", "ext"],
        ["--advance", "10"],
        ["--causes", "--json"],
    ] {
        let mut args = vec!["--admit", "1,0.5"];
        args.extend(other);
        refused(&args, &pods, "leave out --key, --advance and --causes");
    }
    // Half the requests booked ahead: a fifth run moves
    // bookings ahead, never one within ten minutes of its start.
    let rows = mig_rows(&["--gpus", "8", "--advance", "50"], &pods);
    assert_eq!(rows.len(), 5);
    let moving = &rows[4]["result"];
    assert_eq!(moving["policy"], "gpuslice + moves");
    assert!(moving["moves"].as_u64().unwrap() > 0, "{moving}");
    assert!(moving["least_notice_s"].as_i64().unwrap() > 600, "{moving}");
    assert!(rows[..4].iter().all(|r| r["result"]["moves"] == 0));
    refused(&["--advance", "120"], &pods, "--advance is a percentage");
    // The mix the default policy keeps room for: the booking path's (the
    // default) or the whole stream's. Only the default policy reads it.
    let with_mix = |mix: &str| mig_rows(&["--gpus", "6", "--speedup", "4", "--mix", mix], &pods);
    let (recent, stream) = (with_mix("recent"), with_mix("stream"));
    assert_eq!(recent.len(), 4);
    assert_eq!(recent.len(), stream.len());
    for (r, s) in recent.iter().zip(&stream) {
        assert_eq!(r["result"]["policy"], s["result"]["policy"]);
        if r["result"]["policy"] != "gpuslice" {
            assert_eq!(r, s);
        }
    }
    let bad = gpuslice()
        .args(["bench", "mig", "--mix", "future", "--pods"])
        .arg(&pods)
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("[possible values: recent, stream]"));
    let _ = std::fs::remove_dir_all(&dir);
}
