//! `gpuslice exec` against a real `gpuslice worker` process: the command
//! runs with the booking's device and inside its cgroup, its exit status
//! passes through, strangers are refused with a sentence; three busy
//! processes joined to high, normal and low shares get CPU time near
//! 4:2:1; after a worker killed with -9 restarts, nothing stays frozen.
//! Without root or cgroups the isolation parts say so loudly and skip.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use common::{booking_status, wait_for, Killed, SimNode, TestApp, WorkerProcess};
use gpuslice::booking::{self, Requester};

/// The node's worker process with its `gpuslice exec` socket.
struct Node(WorkerProcess);

impl Node {
    fn new(app: &TestApp, tag: &str) -> Node {
        let name = format!("x{}{tag}", std::process::id());
        let fleet = format!("[[node]]\nname = \"{name}\"\n[[node.gpu]]\nmodel = \"L40S-48GB\"\nmode = \"timeslice\"\ncount = 1\nmax_shares = 4\n");
        Node(WorkerProcess::new(app, "exec", &name, &fleet))
    }

    fn name(&self) -> &str {
        &self.0.name
    }

    fn socket(&self) -> PathBuf {
        self.0.socket()
    }

    fn start(&self) -> Child {
        let mut cmd = self.0.command();
        // These shares run CPU-bound shell loops, which only the freezer
        // holds to their turns (the launch shim gates CUDA launches).
        cmd.env("GPUSLICE_GRACE_SECS", "1")
            .env("GPUSLICE_TIMESLICE_ENFORCE", "freezer");
        cmd.spawn().unwrap()
    }

    fn exec(&self, as_uid: Option<u32>, booking: i64, script: &str) -> Output {
        let bin = env!("CARGO_BIN_EXE_gpuslice");
        let sock = self.socket();
        let booking = booking.to_string();
        let mut args: Vec<&str> = vec![
            bin,
            "exec",
            &booking,
            "--socket",
            sock.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            script,
        ];
        let uid = as_uid.map(|u| u.to_string());
        let mut cmd = match &uid {
            Some(u) => {
                let mut c = Command::new("setpriv");
                c.args(["--reuid", u, "--regid", u, "--clear-groups", "--"]);
                c
            }
            None => {
                args.remove(0);
                Command::new(bin)
            }
        };
        cmd.args(&args);
        cmd.output().unwrap()
    }

    fn layout(&self) -> Option<gpuslice::sched::cgroup::Layout> {
        gpuslice::sched::shares::layout_for(self.name())
    }
}

async fn share(app: &TestApp, who: &Requester, gib: i32, priority: &str) -> i64 {
    common::timeslice_share(app, who, gib, priority).await
}

async fn setup(tag: &str) -> (TestApp, Node, Requester, Killed) {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    sqlx::query("UPDATE tenants SET max_active_bookings = 10, max_gpu_memory_gib = 100, max_compute_slices = 20")
        .execute(&app.pool)
        .await
        .unwrap();
    app.user("ana@uni.edu", "none", &["lab"]).await;
    gpuslice::cli::user_link(&app.pool, "ana@uni.edu", "nobody")
        .await
        .unwrap();
    let node = Node::new(&app, tag);
    let worker = Killed(node.start());
    common::gpus_seen(&app, 1).await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    (app, node, who, worker)
}

fn skip_without_cgroups(node: &Node, test: &str) -> bool {
    common::skip_without_cgroups(node.layout().is_some(), &format!("cgroup part of {test}"))
}

#[tokio::test]
async fn exec_runs_in_the_booking_and_refuses_strangers() {
    let (app, node, who, worker) = setup("a").await;
    let id = share(&app, &who, 8, "normal").await;
    // Not active yet (or not this node's): a sentence, non-zero.
    let out = node.exec(None, 999_999, "true");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("there is no booking 999999"),
        "{out:?}"
    );
    wait_for("active", || async {
        booking_status(&app, id).await == "active"
    })
    .await;
    let gpu: String = sqlx::query_scalar("SELECT device_uuid FROM bookings WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();

    let out = node.exec(
        None,
        id,
        "echo $CUDA_VISIBLE_DEVICES; cat /proc/self/cgroup; exit 7",
    );
    assert_eq!(
        out.status.code(),
        Some(7),
        "the command's status passes through: {out:?}"
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with(&gpu), "{stdout}");
    if !skip_without_cgroups(&node, "exec") {
        assert!(
            stdout.contains(&format!("booking-{id}")),
            "inside the booking's cgroup: {stdout}"
        );
        // The owner's linked account may run in it too; another may not.
        let out = node.exec(Some(65534), id, "exit 3");
        assert_eq!(out.status.code(), Some(3), "{out:?}");
        let out = node.exec(Some(1), id, "exit 0");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        // A stranger is told nothing about whose booking it is.
        assert!(
            err.contains(&format!(
                "there is no booking {id} that your Unix account (uid 1)"
            )),
            "{err}"
        );
        assert!(!err.contains('@'), "no e-mail address in a refusal: {err}");
    }
    // A disabled owner's booking runs nothing.
    sqlx::query("UPDATE users SET disabled = true WHERE email = 'ana@uni.edu'")
        .execute(&app.pool)
        .await
        .unwrap();
    let out = node.exec(None, id, "true");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("owner account is disabled"),
        "{out:?}"
    );
    sqlx::query("UPDATE users SET disabled = false WHERE email = 'ana@uni.edu'")
        .execute(&app.pool)
        .await
        .unwrap();
    // Released: exec says so.
    booking::release(&app.pool, &who, id, None, None)
        .await
        .unwrap();
    wait_for("released", || async {
        booking_status(&app, id).await == "released"
    })
    .await;
    let out = node.exec(None, id, "true");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is released, not active"),
        "{out:?}"
    );
    drop(worker);
    if let Some(l) = node.layout() {
        assert!(
            l.existing().is_empty(),
            "the released booking's cgroup is gone"
        );
        l.remove_prefix();
    }
}

#[tokio::test]
async fn shares_joined_with_exec_get_cpu_near_4_2_1_and_a_restart_leaves_nothing_frozen() {
    let (app, node, who, worker) = setup("b").await;
    if skip_without_cgroups(&node, "4:2:1") {
        return;
    }
    let layout = node.layout().unwrap();
    // Every share is promised half the GPU: the normal and low ones fall
    // short, which the tenant's QoS ledger records.
    sqlx::query("UPDATE tenants SET guaranteed_share_pct = 50")
        .execute(&app.pool)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for p in ["high", "normal", "low"] {
        ids.push(share(&app, &who, 8, p).await);
    }
    for id in &ids {
        wait_for("active", || async {
            booking_status(&app, *id).await == "active"
        })
        .await;
    }
    // Three busy loops, each joined to its share with gpuslice exec.
    let bin = env!("CARGO_BIN_EXE_gpuslice");
    let mut procs: Vec<Killed> = ids
        .iter()
        .map(|id| {
            Killed(
                Command::new(bin)
                    .args([
                        "exec",
                        &id.to_string(),
                        "--socket",
                        node.socket().to_str().unwrap(),
                        "--",
                        "sh",
                        "-c",
                        "while :; do :; done",
                    ])
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    // Let the scheduler see them, then measure 6 s of CPU time.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before: Vec<u64> = ids.iter().map(|id| layout.group(*id).cpu_ns()).collect();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let used: Vec<f64> = ids
        .iter()
        .zip(&before)
        .map(|(id, b)| (layout.group(*id).cpu_ns() - b) as f64)
        .collect();
    let total: f64 = used.iter().sum();
    let shares: Vec<f64> = used.iter().map(|u| u / total).collect();
    eprintln!("CPU time shares under the worker: {shares:?} (4:2:1 is 0.571, 0.286, 0.143)");
    for (got, want) in shares.iter().zip([4.0 / 7.0, 2.0 / 7.0, 1.0 / 7.0]) {
        assert!((got - want).abs() / want < 0.2, "{shares:?}");
    }
    // The booking JSON carries the scheduler's view.
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    let b: serde_json::Value = reqwest::Client::new()
        .get(app.url(&format!("/api/v1/bookings/{}", ids[0])))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let state = &b["scheduler"];
    assert_eq!(state["priority"], "high", "{b}");
    assert!(state["time_slice_ms"].as_f64().unwrap() >= 100.0, "{state}");
    assert_eq!(state["guaranteed_share_pct"], 50.0);
    // The ledger is written every 5 s: wait for the round that records the
    // starved low share's violation.
    wait_for(
        "the starved low share's violation in the ledger",
        || async {
            sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM qos_events WHERE kind = 'violation' AND booking_id = $1",
            )
            .bind(ids[2])
            .fetch_one(&app.pool)
            .await
            .unwrap()
                >= 1
        },
    )
    .await;

    // kill -9 while two of the three are frozen; release everything; the
    // restarted worker thaws, ends the processes and removes the groups.
    drop(worker);
    for id in &ids {
        booking::release(&app.pool, &who, *id, None, None)
            .await
            .unwrap();
    }
    let worker = Killed(node.start());
    for id in &ids {
        wait_for("released", || async {
            booking_status(&app, *id).await == "released"
        })
        .await;
    }
    for (id, p) in ids.iter().zip(procs.iter_mut()) {
        assert!(!layout.group(*id).exists(), "booking {id}'s cgroup is gone");
        let deadline = Instant::now() + Duration::from_secs(10);
        while p.0.try_wait().unwrap().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            p.0.try_wait().unwrap().is_some(),
            "the share's process was ended"
        );
    }
    assert!(layout.existing().is_empty());
    drop(worker);
    layout.remove_prefix();
}

#[tokio::test]
async fn a_process_over_its_shares_gpu_memory_is_warned_then_ended() {
    let app = TestApp::spawn().await;
    let name = format!("m{}", std::process::id());
    let Some(layout) = gpuslice::sched::shares::layout_for(&name) else {
        let why = "not root, or no cgroup freezer under /sys/fs/cgroup";
        if std::env::var_os("GPUSLICE_REQUIRE_CGROUPS").is_some() {
            panic!("cgroup test required but {why}");
        }
        common::skipped("GPU-memory watch test", why);
        return;
    };
    let node = SimNode::register(
        &app,
        &format!(
            "[[node]]\nname = \"{name}\"\n[[node.gpu]]\nmodel = \"L40S-48GB\"\nmode = \"timeslice\"\ncount = 1\n"
        ),
        &name,
        4,
    )
    .await;
    let (sim, backend) = (node.backend.clone(), node.dyn_backend());
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    let id = share(&app, &who, 4, "normal").await;
    let settings = gpuslice::worker::bookings::Settings {
        cgroups: Some(layout.clone()),
        ..Default::default()
    };
    gpuslice::worker::bookings::step(&app.pool, &name, "t", backend.clone(), &settings)
        .await
        .unwrap();
    gpuslice::worker::bookings::step(&app.pool, &name, "t", backend.clone(), &settings)
        .await
        .unwrap();
    assert_eq!(booking_status(&app, id).await, "active");
    // A process of the share that holds 6 GiB of its 4.
    let mut p = Killed(Command::new("sleep").arg("60").spawn().unwrap());
    layout.group(id).add(p.0.id()).unwrap();
    let gpu = backend.inventory().unwrap()[0].uuid.clone();
    sim.attach_process(&gpu, p.0.id(), 6 * 1024).unwrap();
    let shares = gpuslice::db::bookings::active_shares(&app.pool, &name)
        .await
        .unwrap();
    let mut memory = gpuslice::sched::shares::Memory::default();
    let grace = Duration::ZERO;
    gpuslice::sched::shares::watch_memory(
        &app.pool,
        &name,
        &backend,
        &layout,
        &shares,
        &mut memory,
        gpuslice::sched::shares::OverMemory {
            grace,
            response: Default::default(),
        },
    )
    .await;
    assert!(p.0.try_wait().unwrap().is_none(), "warned first, not ended");
    gpuslice::sched::shares::watch_memory(
        &app.pool,
        &name,
        &backend,
        &layout,
        &shares,
        &mut memory,
        gpuslice::sched::shares::OverMemory {
            grace,
            response: Default::default(),
        },
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.0.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        p.0.try_wait().unwrap().is_some(),
        "ended after the grace period"
    );
    let events: Vec<String> =
        sqlx::query_scalar("SELECT reason FROM booking_events WHERE booking_id = $1 ORDER BY id")
            .bind(id)
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("warning: process") && e.contains("6144 MiB")),
        "{events:?}"
    );
    // The security monitor has it as evidence against the booking.
    let evidence: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM security_evidence e JOIN security_incidents i ON i.id = e.incident_id
         WHERE i.subject = $1 AND e.detector = 'share_memory'",
    )
    .bind(format!("booking:{id}"))
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(evidence, 1);
    assert!(
        events.iter().any(|e| e.starts_with("ended: process")),
        "{events:?}"
    );
    layout.group(id).remove(Duration::from_millis(100)).unwrap();
    layout.remove_prefix();
}
