//! A worker killed at the worst moments converges after a restart: no
//! leaked MIG instance, no booking stuck in a transient status. The crash
//! is real: the simulated backend aborts the `gpuslice worker` process
//! (`GPUSLICE_SIM_CRASH`), like `kill -9`, with its hardware state on disk.

mod common;

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{booking_status, wait_for, Killed, TestApp, WorkerProcess};
use gpuslice::booking::{self, Created, Requester};
use gpuslice::domain::booking::BookingInput;
use serde_json::Value;

const FLEET: &str =
    "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n";

/// The node's worker process, started and crashed at will.
struct Node(WorkerProcess);

impl Node {
    fn new(app: &TestApp) -> Node {
        Node(WorkerProcess::new(app, "crash", "n1", FLEET))
    }

    /// Starts `gpuslice worker --node n1`, crashing at `crash` if given.
    fn start(&self, crash: Option<&str>) -> Killed {
        let mut cmd = self.0.command();
        cmd.env("GPUSLICE_GRACE_SECS", "0")
            .env("GPUSLICE_CGROUPS", "off")
            .env_remove("GPUSLICE_SIM_CRASH")
            .stderr(Stdio::inherit());
        if let Some(c) = crash {
            cmd.env("GPUSLICE_SIM_CRASH", c);
        }
        Killed(cmd.spawn().unwrap())
    }

    /// MIG instances on the simulated hardware, from its state file.
    fn instances(&self) -> Vec<Value> {
        self.0.hardware()["gpus"]
            .as_array()
            .map(|gpus| {
                gpus.iter()
                    .flat_map(|g| g["instances"].as_array().cloned().unwrap_or_default())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn wait_exit(child: &mut Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(Instant::now() < deadline, "the worker did not crash");
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn setup() -> (TestApp, Node, Requester) {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    let node = Node::new(&app);
    (app, node, who)
}

async fn book(app: &TestApp, who: &Requester) -> i64 {
    let req = BookingInput {
        tenant: "lab".into(),
        kind: "mig".into(),
        profile: "1g.10gb".into(),
        hours: "1".into(),
        ..Default::default()
    }
    .parse()
    .unwrap();
    match booking::create(&app.pool, who, &req, None, &Default::default())
        .await
        .unwrap()
    {
        Created::New(b) => b.id,
        Created::Replayed(_) => unreachable!(),
    }
}

async fn gpus_registered(app: &TestApp) {
    wait_for("the worker to register its GPU", || async {
        app.one::<i64>("SELECT count(*) FROM gpus").await == 1
    })
    .await;
}

async fn converges_after_a_crash_while_provisioning(point: &str, instances_after_crash: usize) {
    let (app, node, who) = setup().await;
    let mut worker = node.start(Some(point));
    gpus_registered(&app).await;
    let id = book(&app, &who).await;
    let exit = wait_exit(&mut worker.0);
    assert!(!exit.success(), "the injected crash must kill the worker");
    assert_eq!(booking_status(&app, id).await, "provisioning");
    assert_eq!(node.instances().len(), instances_after_crash);

    let worker = node.start(None);
    wait_for("the booking to become active", || async {
        booking_status(&app, id).await == "active"
    })
    .await;
    let on_hw = node.instances();
    assert_eq!(on_hw.len(), 1, "exactly one instance: {on_hw:?}");
    let device: String = sqlx::query_scalar("SELECT device_uuid FROM bookings WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(on_hw[0]["device_uuid"].as_str(), Some(device.as_str()));
    drop(worker);
}

#[tokio::test]
async fn a_crash_before_the_instance_exists_converges() {
    converges_after_a_crash_while_provisioning("before-create", 0).await;
}

#[tokio::test]
async fn a_crash_after_the_instance_exists_adopts_it_instead_of_leaking_it() {
    converges_after_a_crash_while_provisioning("after-create", 1).await;
}

#[tokio::test]
async fn a_crash_during_teardown_converges_to_released_with_nothing_left() {
    let (app, node, who) = setup().await;
    let worker = node.start(None);
    gpus_registered(&app).await;
    let id = book(&app, &who).await;
    wait_for("active", || async {
        booking_status(&app, id).await == "active"
    })
    .await;
    assert_eq!(node.instances().len(), 1);
    drop(worker);

    let mut worker = node.start(Some("after-destroy"));
    booking::release(&app.pool, &who, id, None, None)
        .await
        .unwrap();
    let exit = wait_exit(&mut worker.0);
    assert!(!exit.success());
    assert_eq!(booking_status(&app, id).await, "releasing");
    assert!(node.instances().is_empty());

    let worker = node.start(None);
    wait_for("released", || async {
        booking_status(&app, id).await == "released"
    })
    .await;
    assert!(node.instances().is_empty());
    drop(worker);
}

#[tokio::test]
async fn a_second_worker_for_the_same_node_waits_for_the_first() {
    let (app, node, who) = setup().await;
    let first = node.start(None);
    gpus_registered(&app).await;
    let second = node.start(None);
    let id = book(&app, &who).await;
    wait_for("active", || async {
        booking_status(&app, id).await == "active"
    })
    .await;
    // Only one worker applied it: one instance, one provisioning event.
    assert_eq!(node.instances().len(), 1);
    let provisioning: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM booking_events WHERE booking_id = $1 AND to_status = 'provisioning'",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(provisioning, 1);
    drop(first);
    drop(second);
}
