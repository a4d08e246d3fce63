//! The embedded PostgreSQL cluster: created on first use, reused by a second
//! process, stopped only by the one that started it.

use gpuslice::db::embedded::Cluster;
use sqlx::{ConnectOptions, Connection};

#[tokio::test]
async fn cluster_is_created_reused_and_stopped() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!("embedded-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);

    let first = Cluster::ensure(&dir)
        .await
        .expect("first start creates the cluster");
    assert!(first.started_here());
    assert!(dir.join("pg/PG_VERSION").exists());
    let mut conn = first.connect_options().connect().await.unwrap();
    let listen: String = sqlx::query_scalar("SHOW listen_addresses")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(listen, "", "no TCP port");
    let btree_gist: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gist')",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert!(btree_gist, "contrib is available for later migrations");
    conn.close().await.unwrap();

    let second = Cluster::ensure(&dir)
        .await
        .expect("a second process attaches");
    assert!(!second.started_here(), "the running server is reused");
    second.stop().await.unwrap();
    // Still running: only the starter stops it.
    let conn = first.connect_options().connect().await.expect("still up");
    conn.close().await.unwrap();

    first.stop().await.unwrap();
    assert!(first_is_down(&dir).await);
    let _ = std::fs::remove_dir_all(&dir);
}

async fn first_is_down(dir: &std::path::Path) -> bool {
    !dir.join("pg/postmaster.pid").exists()
}

#[tokio::test]
async fn a_killed_server_is_started_again_and_the_restart_is_an_alert() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!("embedded-supervise-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cluster = Cluster::ensure(&dir).await.unwrap();
    let pool = gpuslice::db::connect(cluster.connect_options())
        .await
        .unwrap();
    gpuslice::db::migrate(&pool).await.unwrap();
    let supervisor = cluster.supervise(pool.clone(), std::time::Duration::from_millis(500));
    // Kill the postmaster as the out-of-memory killer would.
    let pid: i32 = std::fs::read_to_string(dir.join("pg/postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let n: Result<i64, _> =
            sqlx::query_scalar("SELECT count(*) FROM alerts WHERE rule = 'database_restarted'")
                .fetch_one(&pool)
                .await;
        if matches!(n, Ok(1)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not restarted: {n:?}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let new_pid: i32 = std::fs::read_to_string(dir.join("pg/postmaster.pid"))
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert_ne!(new_pid, pid);
    supervisor.abort();
    pool.close().await;
    cluster.stop().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
