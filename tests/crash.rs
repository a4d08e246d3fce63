//! A worker killed at the worst moments converges after a restart: no
//! leaked MIG instance, no booking stuck in a transient status. The crash
//! is real: the simulated backend aborts the `gpuslice worker` process
//! (`GPUSLICE_SIM_CRASH`), like `kill -9`, with its hardware state on disk.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{booking_status, wait_for, Killed, TestApp};
use gpuslice::booking::{self, Created, Requester};
use gpuslice::domain::booking::BookingInput;
use serde_json::Value;

const FLEET: &str =
    "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n";

struct Node {
    dir: PathBuf,
    url: String,
}

impl Node {
    fn new(app: &TestApp) -> Node {
        let dir = std::env::temp_dir().join(format!(
            "gpuslice-crash-{}-{}",
            std::process::id(),
            app.db_name
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("fleet.toml"), FLEET).unwrap();
        Node {
            url: common::database_url(&app.options, &app.db_name),
            dir,
        }
    }

    /// Starts `gpuslice worker --node n1`, crashing at `crash` if given.
    fn start(&self, crash: Option<&str>) -> Killed {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpuslice"));
        cmd.args(["worker", "--node", "n1"])
            .env("DATABASE_URL", &self.url)
            .env("GPUSLICE_DATA_DIR", &self.dir)
            .env("GPUSLICE_FLEET", self.dir.join("fleet.toml"))
            .env("GPUSLICE_BACKEND", "sim")
            .env("GPUSLICE_WORKER_TICK_MS", "100")
            .env("GPUSLICE_GRACE_SECS", "0")
            .env("GPUSLICE_CGROUPS", "off")
            .env("RUST_LOG", "warn")
            .env_remove("GPUSLICE_SIM_CRASH")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        if let Some(c) = crash {
            cmd.env("GPUSLICE_SIM_CRASH", c);
        }
        Killed(cmd.spawn().unwrap())
    }

    /// MIG instances on the simulated hardware, from its state file.
    fn instances(&self) -> Vec<Value> {
        let path: &Path = &self.dir.join("sim/sim-n1.json");
        let Ok(bytes) = std::fs::read(path) else {
            return Vec::new();
        };
        let state: Value = serde_json::from_slice(&bytes).unwrap();
        state["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["instances"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
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
    let uid = app.user("ana@uni.edu", "none", &["lab"]).await;
    let tenant: i64 = app.one("SELECT id FROM tenants").await;
    let node = Node::new(&app);
    let who = Requester {
        user_id: uid,
        email: "ana@uni.edu".into(),
        is_admin: false,
        is_finance: false,
        tenants: vec![(tenant, "lab".into(), false)],
    };
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
