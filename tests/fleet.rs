//! Inventory: workers register nodes and GPUs with a heartbeat; the admin
//! fleet page draws each MIG GPU's memory slices.

mod common;

use std::sync::Arc;

use common::TestApp;
use gpuslice::gpu::catalog::Placement;
use gpuslice::gpu::fleet::Fleet;
use gpuslice::gpu::sim::SimBackend;
use gpuslice::gpu::GpuBackend;
use reqwest::StatusCode;

async fn report(app: &TestApp, b: &Arc<SimBackend>) {
    let backend: Arc<dyn GpuBackend> = b.clone();
    gpuslice::worker::report_inventory(&app.pool, b.node(), backend, |_| 4)
        .await
        .unwrap();
}

#[tokio::test]
async fn workers_register_gpus_and_the_fleet_page_draws_slices() {
    let app = TestApp::spawn().await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let fleet = Fleet::demo();
    let n1 = Arc::new(SimBackend::open(&fleet, "gpu-node-1", None).unwrap());
    let n2 = Arc::new(SimBackend::open(&fleet, "gpu-node-2", None).unwrap());
    let h100 = n1.inventory().unwrap()[0].uuid.clone();
    // A 1g at slice 2 and a 3g at slice 4: a fragmented H100.
    n1.create_instance(&h100, 19, Placement { start: 2, size: 1 })
        .unwrap();
    n1.create_instance(&h100, 9, Placement { start: 4, size: 4 })
        .unwrap();
    // The second H100: a 3g at 0 and a 1g at 6 leave slice 7 that no
    // profile can use (1g may not start at 7; 1g.20gb needs 6 and 7).
    let second = n1.inventory().unwrap()[1].uuid.clone();
    n1.create_instance(&second, 9, Placement { start: 0, size: 4 })
        .unwrap();
    n1.create_instance(&second, 19, Placement { start: 6, size: 1 })
        .unwrap();
    report(&app, &n1).await;
    report(&app, &n2).await;

    let (gpus, nodes): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM gpus), (SELECT count(*) FROM nodes)")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((gpus, nodes), (6, 2));
    let modes: Vec<String> = sqlx::query_scalar("SELECT mode FROM gpus ORDER BY node_id, idx")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        modes,
        ["mig", "mig", "mig", "timeslice", "timeslice", "mig"]
    );

    let admin = app.signed_in("admin@uni.edu").await;
    let page = admin
        .get(app.url("/admin/fleet"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("gpu-node-1") && page.contains("L40S-48GB"));
    assert!(
        page.contains("5 / 8 used"),
        "1g + 3g use five of eight slices"
    );
    assert!(page.contains("3g.40gb at memory slices 4–7"));
    assert!(page.contains("memory slice 0: free"));
    assert!(page.contains("A30-24GB") && page.contains("0 / 4 used"));
    assert!(
        page.contains(
            "5 / 8 used · <span class=\"error\" title=\"memory slices the asked profiles"
        ),
        "fragmentation is shown: {page}"
    );
    assert!(
        page.contains("<span class=\"error\">1 stranded</span>"),
        "the stranded slice is shown: {page}"
    );
    assert!(page.contains("slices the asked profiles cannot reach"));
    assert!(page.contains("of 2 time-sliced GPUs unusable by the asked share sizes"));
    let metrics = reqwest::get(app.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "gpuslice_mig_stranded_slices{node=\"gpu-node-1\",gpu=\"1\",model=\"H100-80GB\"} 1"
        ),
        "{metrics}"
    );
    assert!(metrics
        .contains("gpuslice_mig_free_slices{node=\"gpu-node-1\",gpu=\"0\",model=\"H100-80GB\"} 3"));
    let value = |name: &str| -> f64 {
        let line = metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {metrics}"));
        line.rsplit(' ').next().unwrap().parse().unwrap()
    };
    // Both fragmented H100s lose slices the asked profiles wanted; an
    // untouched GPU loses none.
    for gpu in ["0", "1"] {
        let v = value(&format!(
            "gpuslice_mig_fragmentation_slices{{node=\"gpu-node-1\",gpu=\"{gpu}\""
        ));
        assert!(v > 0.0, "GPU {gpu}: {v}");
    }
    assert_eq!(
        value("gpuslice_mig_fragmentation_slices{node=\"gpu-node-1\",gpu=\"2\""),
        0.0
    );
    // Idle time-sliced GPUs strand nothing.
    assert_eq!(
        value("gpuslice_share_fragmentation_ratio{node=\"gpu-node-2\",gpu=\"0\""),
        0.0
    );
    assert!(value("gpuslice_fleet_fragmentation_ratio{kind=\"mig\"}") > 0.0);
    assert_eq!(
        value("gpuslice_fleet_fragmentation_ratio{kind=\"timeslice\"}"),
        0.0
    );
    // htmx gets the table alone.
    let fragment = admin
        .get(app.url("/admin/fleet"))
        .header("hx-request", "true")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(fragment.starts_with("<section id=\"fleet\""));
    assert!(!fragment.contains("<html"));
}

#[tokio::test]
async fn drain_survives_heartbeats_and_unseen_gpus_turn_unhealthy() {
    let app = TestApp::spawn().await;
    app.user("admin@uni.edu", "admin", &[]).await;
    app.user("sam@uni.edu", "none", &[]).await;
    let fleet = Fleet::demo();
    let n2 = Arc::new(SimBackend::open(&fleet, "gpu-node-2", None).unwrap());
    report(&app, &n2).await;
    let id: i64 = app.one("SELECT id FROM gpus WHERE idx = 0").await;

    let sam = app.signed_in("sam@uni.edu").await;
    assert_eq!(
        sam.get(app.url("/admin/fleet"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::FORBIDDEN
    );
    let r = app
        .post_form(&sam, "/", &format!("/admin/gpus/{id}/drain"), &[])
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);

    let admin = app.signed_in("admin@uni.edu").await;
    let r = app
        .post_form(
            &admin,
            "/admin/fleet",
            &format!("/admin/gpus/{id}/drain"),
            &[],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    report(&app, &n2).await;
    let mode: String = sqlx::query_scalar("SELECT mode FROM gpus WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        mode, "drained",
        "a heartbeat does not undo the admin's drain"
    );
    app.post_form(
        &admin,
        "/admin/fleet",
        &format!("/admin/gpus/{id}/undrain"),
        &[],
    )
    .await;
    let mode: String = sqlx::query_scalar("SELECT mode FROM gpus WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(mode, "timeslice");

    // A GPU falls off the bus: it stops being reported and turns unhealthy.
    let lost = n2.inventory().unwrap()[0].uuid.clone();
    n2.set_lost(&lost, true);
    sqlx::query("UPDATE gpus SET last_seen = now() - interval '1 minute'")
        .execute(&app.pool)
        .await
        .unwrap();
    report(&app, &n2).await;
    let health: Vec<(String, bool)> = sqlx::query_as("SELECT uuid, healthy FROM gpus ORDER BY idx")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    for (uuid, healthy) in health {
        assert_eq!(healthy, uuid != lost, "{uuid}");
    }
    let page = admin
        .get(app.url("/admin/fleet"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("unhealthy"));
    let audit: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action LIKE 'gpu.%'")
        .await;
    assert_eq!(audit, 2);
}

#[tokio::test]
async fn an_empty_gpu_switches_mode_through_its_worker() {
    let app = TestApp::spawn().await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let fleet = Fleet::demo();
    let n1 = Arc::new(SimBackend::open(&fleet, "gpu-node-1", None).unwrap());
    let n2 = Arc::new(SimBackend::open(&fleet, "gpu-node-2", None).unwrap());
    let busy = n1.inventory().unwrap()[0].uuid.clone();
    let empty = n1.inventory().unwrap()[1].uuid.clone();
    n1.create_instance(&busy, 19, Placement { start: 0, size: 1 })
        .unwrap();
    report(&app, &n1).await;
    report(&app, &n2).await;
    let id = |uuid: String| {
        let pool = app.pool.clone();
        async move {
            sqlx::query_scalar::<_, i64>("SELECT id FROM gpus WHERE uuid = $1")
                .bind(uuid)
                .fetch_one(&pool)
                .await
                .unwrap()
        }
    };
    let admin = app.signed_in("admin@uni.edu").await;

    // A GPU with instances cannot switch.
    let r = app
        .post_form(
            &admin,
            "/admin/fleet",
            &format!("/admin/gpus/{}/mode", id(busy.clone()).await),
            &[("mode", "timeslice")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    assert!(r.text().await.unwrap().contains("still has GPU instances"));
    // An L40S has no MIG.
    let l40s = n2.inventory().unwrap()[0].uuid.clone();
    let r = app
        .post_form(
            &admin,
            "/admin/fleet",
            &format!("/admin/gpus/{}/mode", id(l40s).await),
            &[("mode", "mig")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let requests: i64 = app
        .one("SELECT count(*) FROM gpus WHERE requested_mode IS NOT NULL")
        .await;
    assert_eq!(requests, 0, "refusals changed nothing");

    // The empty H100 switches at its worker's next report.
    let empty_id = id(empty.clone()).await;
    let r = app
        .post_form(
            &admin,
            "/admin/fleet",
            &format!("/admin/gpus/{empty_id}/mode"),
            &[("mode", "timeslice")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let page = admin
        .get(app.url("/admin/fleet"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("switching to timeslice"));
    report(&app, &n1).await;
    let (mode, mig, requested): (String, bool, Option<String>) =
        sqlx::query_as("SELECT mode, mig_current, requested_mode FROM gpus WHERE id = $1")
            .bind(empty_id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((mode.as_str(), mig, requested), ("timeslice", false, None));
    assert!(
        !n1.inventory().unwrap()[1].mig_current,
        "the hardware switched"
    );
    // And back.
    app.post_form(
        &admin,
        "/admin/fleet",
        &format!("/admin/gpus/{empty_id}/mode"),
        &[("mode", "mig")],
    )
    .await;
    report(&app, &n1).await;
    let mode: String = sqlx::query_scalar("SELECT mode FROM gpus WHERE id = $1")
        .bind(empty_id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(mode, "mig");
}

/// `serve` with `GPUSLICE_BACKEND=nvml` on the stand-in library registers the
/// same GPUs as `serve` on the simulated backend for the same fleet.
#[tokio::test]
async fn serve_on_the_nvml_standin_matches_serve_on_sim() {
    let fleet = std::env::temp_dir().join(format!("gpuslice-fleet-{}.toml", std::process::id()));
    std::fs::write(
        &fleet,
        "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 2\n\
         [[node.gpu]]\nmodel = \"L40S-48GB\"\nmode = \"timeslice\"\n",
    )
    .unwrap();
    let lib = common::standin_copy();
    let mut seen = Vec::new();
    for backend in ["nvml", "sim"] {
        let (pool, options, name) = common::fresh_db().await;
        let data =
            std::env::temp_dir().join(format!("gpuslice-serve-{backend}-{}", std::process::id()));
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
            .env("DATABASE_URL", common::database_url(&options, &name))
            .env("GPUSLICE_DATA_DIR", &data)
            .env("GPUSLICE_BACKEND", backend)
            .env("GPUSLICE_NVML_LIB", &lib)
            .env("GPUSLICE_FLEET", &fleet)
            .env("GPUSLICE_NVML_NODE", "n1")
            .env("GPUSLICE_NODE", "n1")
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let mut rows: Vec<(String, String, i32, String, bool, i64)> = Vec::new();
        for _ in 0..200 {
            rows = sqlx::query_as(
                "SELECT n.backend, g.uuid, g.idx, g.mode, g.mig_current, g.memory_mib
                 FROM gpus g JOIN nodes n ON n.id = g.node_id ORDER BY g.idx",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            if rows.len() == 3 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let out = tokio::task::spawn_blocking(move || child.wait_with_output())
            .await
            .unwrap()
            .unwrap();
        assert!(out.status.success(), "serve on {backend} exited cleanly");
        assert_eq!(
            rows.len(),
            3,
            "serve on {backend} registered the fleet: {rows:?}"
        );
        assert!(rows.iter().all(|r| r.0 == backend));
        seen.push(
            rows.into_iter()
                .map(|r| (r.1, r.2, r.3, r.4, r.5))
                .collect::<Vec<_>>(),
        );
        let _ = std::fs::remove_dir_all(&data);
    }
    assert_eq!(
        seen[0], seen[1],
        "the same GPUs, uuids, modes and memory on both backends"
    );
}
