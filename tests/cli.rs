//! The command line as a user runs it: the real binary against a test
//! database. Bad arguments exit non-zero with one sentence.

mod common;

use std::io::Write;
use std::process::{Command, Output, Stdio};

use common::{database_url, fresh_db};

fn gpuslice(url: &str, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(args)
        .env("DATABASE_URL", url)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).trim().to_string()
}

#[tokio::test]
async fn tenant_user_and_token_commands() {
    let (pool, options, name) = fresh_db().await;
    let url = database_url(&options, &name);

    let o = gpuslice(&url, &["migrate"], "");
    assert!(o.status.success(), "{}", stderr(&o));

    let o = gpuslice(
        &url,
        &[
            "tenant",
            "add",
            "--slug",
            "vision-lab",
            "--name",
            "Vision Lab",
            "--max-active-bookings",
            "4",
            "--max-gpu-memory-gib",
            "160",
            "--max-compute-slices",
            "14",
            "--monthly-slice-hours",
            "2000",
            "--max-booking-hours",
            "72",
            "--priority",
            "high",
            "--guaranteed-share-pct",
            "30",
        ],
        "",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let row: (i32, i32, i32, i32, i32, String, i32) = sqlx::query_as(
        "SELECT max_active_bookings, max_gpu_memory_gib, max_compute_slices, monthly_slice_hours,
                max_booking_hours, default_priority, guaranteed_share_pct FROM tenants WHERE slug = 'vision-lab'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(row, (4, 160, 14, 2000, 72, "high".into(), 30));

    let o = gpuslice(
        &url,
        &[
            "user",
            "add",
            "--email",
            "PI@uni.edu",
            "--tenant",
            "vision-lab:manager",
            "--role",
            "none",
        ],
        "a long password for the pi\n",
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let role: String = sqlx::query_scalar(
        "SELECT m.role FROM memberships m JOIN users u ON u.id = m.user_id WHERE u.email = 'pi@uni.edu'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(role, "manager");

    let o = gpuslice(&url, &["token", "create", "--email", "pi@uni.edu"], "");
    assert!(o.status.success(), "{}", stderr(&o));
    let token = String::from_utf8_lossy(&o.stdout).trim().to_string();
    assert!(token.starts_with("gps_") && token.len() > 40, "{token}");
}

#[tokio::test]
async fn bad_arguments_exit_non_zero_with_one_sentence() {
    let (pool, options, name) = fresh_db().await;
    let url = database_url(&options, &name);
    let cases: &[(&[&str], &str, &str)] = &[
        (
            &["tenant", "add", "--slug", "Bad Slug", "--name", "X"],
            "",
            "--slug: a slug uses lower-case letters",
        ),
        (
            &[
                "tenant",
                "add",
                "--slug",
                "lab",
                "--name",
                "X",
                "--max-gpu-memory-gib",
                "-5",
            ],
            "",
            "--max-gpu-memory-gib: may not be negative",
        ),
        (
            &[
                "tenant",
                "add",
                "--slug",
                "lab",
                "--name",
                "X",
                "--priority",
                "urgent",
            ],
            "",
            "--priority: unknown priority",
        ),
        (
            &["user", "add", "--email", "nobody"],
            "a long password for nobody",
            "--email: \"nobody\" is not an e-mail address",
        ),
        (
            &["user", "add", "--email", "a@uni.edu"],
            "short",
            "at least 15 characters",
        ),
        (
            &[
                "user",
                "add",
                "--email",
                "a@uni.edu",
                "--tenant",
                "no-such-lab",
            ],
            "a long password for a user",
            "no tenant has the slug \"no-such-lab\"",
        ),
        (
            &["user", "add", "--email", "a@uni.edu", "--role", "root"],
            "a long password for a user",
            "--role: unknown role \"root\"",
        ),
        (
            &["token", "create", "--email", "ghost@uni.edu"],
            "",
            "no user has the e-mail address ghost@uni.edu",
        ),
        (
            // Checked before the worker starts anything.
            &["worker", "--node", "n1", "--booking-cpus", "0-x"],
            "",
            "--booking-cpus: give a CPU list such as 0-15",
        ),
    ];
    for (args, stdin, want) in cases {
        let o = gpuslice(&url, args, stdin);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = stderr(&o);
        assert!(err.starts_with("error: "), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one sentence: {err}");
    }
    // Duplicates are refused too.
    assert!(gpuslice(
        &url,
        &["tenant", "add", "--slug", "lab", "--name", "Lab"],
        ""
    )
    .status
    .success());
    let o = gpuslice(
        &url,
        &["tenant", "add", "--slug", "lab", "--name", "Lab"],
        "",
    );
    assert!(stderr(&o).contains("a tenant with slug \"lab\" already exists"));
    // Nothing half-made: the failed user adds left no users behind.
    let users: i64 = sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(users, 0);
    // Unknown subcommands are clap's job: non-zero as well.
    let o = gpuslice(&url, &["frobnicate"], "");
    assert!(!o.status.success());
}

#[tokio::test]
async fn demo_data_is_idempotent() {
    let (pool, _, _) = fresh_db().await;
    gpuslice::cli::seed_demo(&pool).await.unwrap();
    gpuslice::cli::seed_demo(&pool).await.unwrap();
    let (tenants, users): (i64, i64) =
        sqlx::query_as("SELECT (SELECT count(*) FROM tenants), (SELECT count(*) FROM users)")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!((tenants, users), (3, 5));
}

/// `serve` on the embedded cluster: SIGTERM finishes the server and stops
/// the PostgreSQL it started.
#[tokio::test]
async fn serve_shuts_down_cleanly_on_sigterm() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target")
        .join(format!("sigterm-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_gpuslice"))
        .args(["serve", "--bind", &format!("127.0.0.1:{port}")])
        .env_remove("DATABASE_URL")
        .env("GPUSLICE_DATA_DIR", &dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/readyz");
    let mut ready = false;
    for _ in 0..300 {
        if reqwest::get(&url)
            .await
            .is_ok_and(|r| r.status().is_success())
        {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ready, "serve became ready on the embedded database");
    assert!(dir.join("pg/postmaster.pid").exists());
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(
        !dir.join("pg/postmaster.pid").exists(),
        "the embedded PostgreSQL was stopped"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
