//! Watching the fleet end to end: a real `gpuslice worker` samples its
//! simulated GPUs, `gpuslice sim` stages faults in the node's state file
//! (its hardware), every default alert rule fires and resolves, alerts
//! reach a real SMTP server (aiosmtpd) and a webhook receiver, a
//! notification is sent once across a kill between sending and marking,
//! `/metrics` parses with the Prometheus client's parser, and retention
//! keeps the samples bounded.

mod common;

use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{wait_for, Killed, TestApp, WorkerProcess};
use gpuslice::booking;
use reqwest::StatusCode;

const FLEET: &str = r#"
[[node]]
name = "w1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 1
[[node.gpu]]
model = "L40S-48GB"
mode = "timeslice"
count = 1
"#;

fn ok(out: std::process::Output) -> String {
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// `gpuslice sim set --node w1 --gpu 0 FLAGS`.
fn sim_set(w: &WorkerProcess, flags: &[&str]) {
    let mut args = vec!["sim", "set", "--node", "w1", "--gpu", "0"];
    args.extend_from_slice(flags);
    ok(w.cli(&args));
}

/// The worker, sampling every second.
fn worker(w: &WorkerProcess, extra: &[(&str, &str)]) -> Killed {
    let mut cmd = w.command();
    cmd.env("GPUSLICE_TELEMETRY_INTERVAL_SECS", "1")
        .env("GPUSLICE_CGROUPS", "off");
    for (k, v) in extra {
        cmd.env(k, v);
    }
    Killed(cmd.spawn().unwrap())
}

/// The state of the newest alert of `rule`, if any.
async fn state_of(app: &TestApp, rule: &str) -> Option<String> {
    sqlx::query_scalar("SELECT state FROM alerts WHERE rule = $1 ORDER BY id DESC LIMIT 1")
        .bind(rule)
        .fetch_optional(&app.pool)
        .await
        .unwrap()
}

async fn wait_state(app: &TestApp, rule: &str, want: &str) {
    wait_for(&format!("{rule} {want}"), || async {
        state_of(app, rule).await.as_deref() == Some(want)
    })
    .await;
}

/// A 1-hour MIG booking of `profile` in tenant `lab`, placed now.
async fn book_mig(app: &TestApp, who: &booking::Requester, profile: &str) -> i64 {
    common::book(app, who, "mig", profile, 1).await.id
}

async fn setup(tag: &str) -> (TestApp, WorkerProcess) {
    let app = TestApp::spawn().await;
    let w = WorkerProcess::new(&app, tag, "w1", FLEET);
    (app, w)
}

#[tokio::test]
async fn every_default_rule_fires_and_resolves_through_gpuslice_sim() {
    let (app, w) = setup("rules").await;
    // Durations short enough for a test, set as an admin would on the
    // command line (audited).
    for (rule, flags) in [
        ("gpu_temperature_high", vec!["--for-secs", "1"]),
        ("gpu_utilization_high", vec!["--for-secs", "1"]),
        ("instance_memory_near_limit", vec!["--for-secs", "1"]),
        ("gpu_xid_error", vec!["--for-secs", "3"]),
        ("node_heartbeat_stale", vec!["--threshold", "4"]),
    ] {
        let mut args = vec!["alert", "rule", rule];
        args.extend(flags);
        ok(w.cli(&args));
    }
    let audited: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'alert_rule.update'")
        .await;
    assert_eq!(audited, 5);
    let bad = w.cli(&["alert", "rule", "gpu_lost", "--for-secs", "soon"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("duration: give whole seconds"));
    assert!(ok(w.cli(&["alert", "rules"])).contains("gpu_temperature_high"));

    let mut proc_ = worker(&w, &[]);
    wait_for("samples", || async {
        app.one::<i64>("SELECT count(*) FROM gpu_samples").await >= 2
    })
    .await;

    for (rule, stage) in [
        ("gpu_temperature_high", vec!["--temperature", "92"]),
        ("gpu_utilization_high", vec!["--utilization", "99"]),
        ("gpu_ecc_uncorrectable", vec!["--ecc-uncorrectable", "2"]),
        ("gpu_lost", vec!["--lost"]),
    ] {
        sim_set(&w, &stage);
        wait_state(&app, rule, "firing").await;
        ok(w.cli(&["sim", "clear", "--node", "w1", "--gpu", "0"]));
        wait_state(&app, rule, "resolved").await;
    }
    let (node, gpu, msg): (String, String, String) = sqlx::query_as(
        "SELECT node, gpu_uuid, message FROM alerts WHERE rule = 'gpu_temperature_high'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(node, "w1");
    assert_eq!(gpu, gpuslice::gpu::sim::gpu_uuid("w1", 0));
    assert!(msg.contains("92 °C"), "{msg}");

    // An XID fires at once and resolves after a quiet window.
    ok(w.cli(&["sim", "xid", "--node", "w1", "--gpu", "0", "--code", "79"]));
    wait_state(&app, "gpu_xid_error", "firing").await;
    let code: i64 = app
        .one("SELECT code FROM gpu_events WHERE kind = 'xid'")
        .await;
    assert_eq!(code, 79);
    wait_state(&app, "gpu_xid_error", "resolved").await;

    // A booking near its memory limit: the alert names the booking.
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    let id = book_mig(&app, &who, "1g.10gb").await;
    wait_for("active", || async {
        common::booking_status(&app, id).await == "active"
    })
    .await;
    let device: String = app
        .one(&format!("SELECT device_uuid FROM bookings WHERE id = {id}"))
        .await;
    let sleeper = Killed(Command::new("sleep").arg("600").spawn().unwrap());
    let pid = sleeper.0.id().to_string();
    ok(w.cli(&[
        "sim",
        "process",
        "--node",
        "w1",
        "--device",
        &device,
        "--pid",
        &pid,
        "--used-mib",
        "9600",
    ]));
    wait_state(&app, "instance_memory_near_limit", "firing").await;
    let on: i64 = app
        .one("SELECT booking_id FROM alerts WHERE rule = 'instance_memory_near_limit'")
        .await;
    assert_eq!(on, id);
    // Its owner was told (the outbox row exists with the change).
    let told: i64 = app
        .one("SELECT count(*) FROM notifications WHERE topic = 'booking_alert' AND recipient = 'ana@uni.edu'")
        .await;
    assert_eq!(told, 1);
    booking::release(&app.pool, &who, id, None, None)
        .await
        .unwrap();
    wait_state(&app, "instance_memory_near_limit", "resolved").await;
    // Lifecycle notices for the owner were queued with the transitions.
    let topics: Vec<String> = sqlx::query_scalar(
        "SELECT topic FROM notifications WHERE booking_id = $1 AND topic LIKE 'booking_%' ORDER BY id",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    wait_for("the ended notice", || async {
        app.one::<i64>(&format!(
            "SELECT count(*) FROM notifications WHERE booking_id = {id} AND topic = 'booking_ended'"
        ))
        .await
            == 1
    })
    .await;
    assert!(topics.contains(&"booking_active".to_string()), "{topics:?}");

    // A node that stops reporting: nobody on it can say so, so another
    // process's watcher does.
    drop(proc_);
    wait_for("node_heartbeat_stale firing", || async {
        gpuslice::watch::evaluate_all(&app.pool, 1.0).await.unwrap();
        state_of(&app, "node_heartbeat_stale").await.as_deref() == Some("firing")
    })
    .await;
    proc_ = worker(&w, &[]);
    wait_state(&app, "node_heartbeat_stale", "resolved").await;
    drop(proc_);
    // Never more than one open alert per rule and subject.
    let dupes: i64 = app
        .one("SELECT count(*) FROM (SELECT rule, subject FROM alerts WHERE state <> 'resolved' GROUP BY 1, 2 HAVING count(*) > 1) d")
        .await;
    assert_eq!(dupes, 0);
}

/// The Python with aiosmtpd and prometheus_client: the one scripts/test.sh
/// prepared, else `python3` if it has them; `None` skips loudly (and fails
/// when the test script asked for it).
fn python(test: &str) -> Option<String> {
    if let Ok(p) = std::env::var("GPUSLICE_TEST_PYTHON") {
        return Some(p);
    }
    let ok = Command::new("python3")
        .args(["-c", "import aiosmtpd, prometheus_client"])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Some("python3".into());
    }
    common::skipped(
        test,
        "no python3 with aiosmtpd and prometheus_client (scripts/test.sh installs them)",
    );
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real SMTP server (aiosmtpd) writing each message it accepts into a
/// Maildir.
struct Smtp {
    port: u16,
    maildir: std::path::PathBuf,
    _proc: Killed,
}

impl Smtp {
    async fn start(python: &str, dir: &std::path::Path) -> Smtp {
        let port = free_port();
        let maildir = dir.join("maildir");
        let proc_ = Killed(
            Command::new(python)
                .args([
                    "-m",
                    "aiosmtpd",
                    "-n",
                    "-l",
                    &format!("127.0.0.1:{port}"),
                    "-c",
                    "aiosmtpd.handlers.Mailbox",
                ])
                .arg(&maildir)
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        wait_for("the SMTP server", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        })
        .await;
        Smtp {
            port,
            maildir,
            _proc: proc_,
        }
    }

    /// The messages received so far.
    fn messages(&self) -> Vec<String> {
        let mut out = Vec::new();
        for sub in ["new", "cur"] {
            if let Ok(rd) = std::fs::read_dir(self.maildir.join(sub)) {
                for e in rd.flatten() {
                    out.push(std::fs::read_to_string(e.path()).unwrap_or_default());
                }
            }
        }
        out
    }
}

/// A local HTTP receiver standing in for Slack or Mattermost.
async fn webhook_receiver() -> (String, Arc<Mutex<Vec<serde_json::Value>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |axum::Json(v): axum::Json<serde_json::Value>| {
            let g = g.clone();
            async move {
                g.lock().unwrap().push(v);
                "ok"
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, got)
}

#[tokio::test]
async fn alerts_reach_a_real_smtp_server_and_a_webhook() {
    let Some(py) = python("alerts_reach_a_real_smtp_server_and_a_webhook") else {
        return;
    };
    let (app, w) = setup("mail").await;
    app.user("ops@uni.edu", "admin", &[]).await;
    let quiet = app.user("quiet@uni.edu", "admin", &[]).await;
    // One admin turned critical alerts off on the settings page.
    let client = app.signed_in("quiet@uni.edu").await;
    let r = app
        .post_form(
            &client,
            "/settings/notifications",
            "/settings/notifications",
            &[("topic_booking_alert", "on")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let prefs = gpuslice::db::notify::prefs(&app.pool, quiet).await.unwrap();
    assert!(
        prefs.contains(&("alert_critical".to_string(), false)),
        "{prefs:?}"
    );
    let smtp = Smtp::start(&py, &w.dir).await;
    let (hook, got) = webhook_receiver().await;
    ok(w.cli(&["alert", "rule", "gpu_temperature_high", "--for-secs", "0"]));
    let smtp_url = format!("smtp://127.0.0.1:{}", smtp.port);
    let _worker = worker(
        &w,
        &[
            ("GPUSLICE_SMTP_URL", smtp_url.as_str()),
            ("GPUSLICE_MAIL_FROM", "gpuslice <gpus@uni.edu>"),
            ("GPUSLICE_ALERT_WEBHOOK_URL", hook.as_str()),
        ],
    );
    sim_set(&w, &["--temperature", "92"]);
    wait_for("an e-mail", || async { !smtp.messages().is_empty() }).await;
    wait_for("a webhook post", || async {
        !got.lock().unwrap().is_empty()
    })
    .await;
    let mail = smtp.messages().remove(0);
    assert!(mail.contains("To: ops@uni.edu"), "{mail}");
    assert!(mail.contains("gpu_temperature_high"), "{mail}");
    assert!(
        mail.contains("92 =C2=B0C") || mail.contains("92 °C"),
        "{mail}"
    );
    let text = got.lock().unwrap()[0]["text"].as_str().unwrap().to_string();
    assert!(
        text.contains("FIRING") && text.contains("gpu_temperature_high"),
        "{text}"
    );
    // Resolving tells the webhook too; e-mail stays at one per admin who wants it.
    ok(w.cli(&["sim", "clear", "--node", "w1", "--gpu", "0"]));
    wait_for("the resolved post", || async {
        got.lock()
            .unwrap()
            .iter()
            .any(|v| v["text"].as_str().unwrap_or("").contains("RESOLVED"))
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(smtp.messages().len(), 1, "only ops@ wants critical alerts");
    let sent: i64 = app
        .one("SELECT count(*) FROM notifications WHERE state = 'sent'")
        .await;
    assert_eq!(sent, 3);
}

#[tokio::test]
async fn a_notification_is_sent_once_across_a_kill_between_send_and_mark() {
    let Some(py) = python("a_notification_is_sent_once_across_a_kill_between_send_and_mark") else {
        return;
    };
    let (app, w) = setup("once").await;
    let admin = app.user("ops@uni.edu", "admin", &[]).await;
    let smtp = Smtp::start(&py, &w.dir).await;
    let queue = |subject: &'static str| {
        let pool = app.pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            gpuslice::db::notify::email_user(
                &mut tx,
                admin,
                &gpuslice::db::notify::Message {
                    topic: "booking_alert",
                    subject,
                    body: "body",
                    alert_id: None,
                    booking_id: None,
                },
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
        }
    };
    queue("first").await;
    let smtp_url = format!("smtp://127.0.0.1:{}", smtp.port);
    // The sender dies right after the server accepted the message, before
    // it could record that.
    let mut crashing = w.command();
    crashing
        .env("GPUSLICE_SMTP_URL", &smtp_url)
        .env("GPUSLICE_NOTIFY_CRASH", "after-send")
        .env("GPUSLICE_CGROUPS", "off")
        .stderr(Stdio::null());
    let mut child = crashing.spawn().unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(!status.success(), "the injected crash aborts the process");
    assert_eq!(smtp.messages().len(), 1);
    // A new sender does not send it again: it is unconfirmed, for an
    // admin to resend; the next notification goes out normally.
    let _worker = worker(
        &w,
        &[
            ("GPUSLICE_SMTP_URL", smtp_url.as_str()),
            ("GPUSLICE_NOTIFY_LEASE_SECS", "1"),
        ],
    );
    queue("second").await;
    wait_for("the second e-mail", || async { smtp.messages().len() == 2 }).await;
    wait_for("unconfirmed", || async {
        app.one::<String>("SELECT state FROM notifications WHERE subject = 'first'")
            .await
            == "unconfirmed"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let msgs = smtp.messages();
    assert_eq!(msgs.len(), 2, "each notification once");
    assert_eq!(
        msgs.iter().filter(|m| m.contains("Subject: first")).count(),
        1
    );
    // An admin's resend sends it once more, on purpose.
    let client = app.signed_in("ops@uni.edu").await;
    let nid: i64 = app
        .one("SELECT id FROM notifications WHERE subject = 'first'")
        .await;
    let r = app
        .post_form(
            &client,
            "/admin/alerts",
            &format!("/admin/notifications/{nid}/resend"),
            &[],
        )
        .await;
    assert!(r.status().is_redirection(), "{:?}", r.status());
    wait_for("the resent e-mail", || async { smtp.messages().len() == 3 }).await;
}

#[tokio::test]
async fn metrics_parse_and_carry_dcgm_names_tenant_and_booking() {
    let (app, w) = setup("metrics").await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    let _worker = worker(&w, &[]);
    wait_for("the worker's GPUs", || async {
        app.one::<i64>("SELECT count(*) FROM gpus").await == 2
    })
    .await;
    let id = book_mig(&app, &who, "3g.40gb").await;
    wait_for("a booking sample", || async {
        app.one::<i64>(&format!(
            "SELECT count(*) FROM instance_samples WHERE booking_id = {id}"
        ))
        .await
            > 0
    })
    .await;
    sim_set(&w, &["--temperature", "91"]);
    wait_for("the staged sample", || async {
        app.one::<i64>("SELECT count(*) FROM gpu_samples WHERE temperature_c = 91")
            .await
            > 0
    })
    .await;
    reqwest::get(app.url("/login")).await.unwrap();
    let body = reqwest::get(app.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "DCGM_FI_DEV_GPU_UTIL{",
        "DCGM_FI_DEV_FB_USED{",
        "DCGM_FI_DEV_FB_FREE{",
        "DCGM_FI_DEV_POWER_USAGE{",
        "DCGM_FI_DEV_XID_ERRORS{",
        "DCGM_FI_DEV_SM_CLOCK{",
        "gpuslice_http_requests_total{",
        "gpuslice_fleet_fragmentation_ratio{",
    ] {
        assert!(body.contains(name), "{name} missing:\n{body}");
    }
    let uuid = gpuslice::gpu::sim::gpu_uuid("w1", 0);
    assert!(body.contains(&format!(
        "DCGM_FI_DEV_GPU_TEMP{{gpu=\"0\",UUID=\"{uuid}\",device=\"nvidia0\",modelName=\"Simulated H100-80GB\",Hostname=\"w1\"}} 91"
    )), "{body}");
    assert!(body.contains("GPU_I_PROFILE=\"3g.40gb\""), "{body}");
    assert!(
        body.contains(&format!("tenant=\"lab\",booking=\"{id}\"")),
        "{body}"
    );
    // The Prometheus client's own OpenMetrics parser reads what
    // Prometheus asks for.
    let body = reqwest::Client::new()
        .get(app.url("/metrics"))
        .header("Accept", "application/openmetrics-text; version=1.0.0")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.ends_with("# EOF\n"));
    if let Some(py) = python(
        "the Prometheus parser part of metrics_parse_and_carry_dcgm_names_tenant_and_booking",
    ) {
        let mut p = Command::new(py)
            .args([
                "-c",
                "import sys\nfrom prometheus_client.openmetrics.parser import text_string_to_metric_families as f\nfams = list(f(sys.stdin.read()))\nprint(len(fams), sum(len(x.samples) for x in fams))",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        p.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = p.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the parser refused /metrics: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let counts = String::from_utf8_lossy(&out.stdout);
        let families: usize = counts.split_whitespace().next().unwrap().parse().unwrap();
        assert!(families >= 15, "{counts}");
    }
}

#[tokio::test]
async fn rollups_follow_the_samples_and_retention_keeps_them_bounded() {
    use gpuslice::db::telemetry::{self, GpuSample, Retention};
    let app = TestApp::spawn().await;
    let node = common::SimNode::register(&app, FLEET, "w1", 4).await;
    let gpu: i64 = app.one("SELECT id FROM gpus ORDER BY idx LIMIT 1").await;
    // Three rounds as the worker writes them: the 5-minute bucket is kept
    // up to date at once (means are sums over counts, maxima kept).
    for (util, temp) in [(20, 40), (40, 60), (90, 80)] {
        let t = gpuslice::gpu::Telemetry {
            memory_used_mib: 1024,
            memory_total_mib: 81920,
            utilization_pct: Some(util),
            temperature_c: Some(temp),
            ..Default::default()
        };
        telemetry::record(
            &app.pool,
            &[GpuSample {
                gpu_id: gpu,
                telemetry: Some(&t),
            }],
            &[],
        )
        .await
        .unwrap();
    }
    // A lost round counts as a sample without values.
    telemetry::record(
        &app.pool,
        &[GpuSample {
            gpu_id: gpu,
            telemetry: None,
        }],
        &[],
    )
    .await
    .unwrap();
    let (samples, lost, n, max): (i32, i32, i32, f32) = sqlx::query_as(
        "SELECT sum(samples)::int, sum(lost_samples)::int, sum(utilization_n)::int, max(utilization_max) FROM gpu_rollups",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((samples, lost, n, max), (4, 1, 3, 90.0));
    // The mean over the rounds, whichever buckets they fell in (a round
    // may cross a 5-minute boundary), and the history draws from the same.
    let mean: f64 = app
        .one("SELECT sum(utilization_sum) / sum(utilization_n) FROM gpu_rollups")
        .await;
    assert!((mean - 50.0).abs() < 1e-9, "{mean}");
    let since = time::OffsetDateTime::now_utc() - time::Duration::hours(24);
    let points = telemetry::gpu_history(&app.pool, &[gpu], since)
        .await
        .unwrap();
    assert!(!points.is_empty() && points.len() <= 2, "{points:?}");
    assert!(points.iter().all(|p| p.utilization.is_some()), "{points:?}");

    // Three days of raw samples every minute and 100 days of rollups, as if
    // the retention had been off: it deletes what it no longer keeps.
    sqlx::query(
        "INSERT INTO gpu_samples (gpu_id, at, utilization_pct, memory_used_mib, memory_total_mib, temperature_c)
         SELECT $1, t, 50, 1024, 81920, 60
         FROM generate_series(now() - interval '72 hours', now() - interval '1 minute', interval '1 minute') t",
    )
    .bind(gpu)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO gpu_rollups (gpu_id, bucket, samples, lost_samples, utilization_sum, utilization_n,
                                  temperature_sum, temperature_n, memory_used_sum, memory_used_n, power_sum, power_n)
         SELECT $1, b, 30, 0, 1500, 30, 1800, 30, 30720, 30, 0, 0
         FROM generate_series(now() - interval '100 days', now() - interval '1 day', interval '5 minutes') b
         ON CONFLICT DO NOTHING",
    )
    .bind(gpu)
    .execute(&app.pool)
    .await
    .unwrap();
    let keep = Retention {
        raw_hours: 48,
        rollup_days: 90,
    };
    assert!(telemetry::prune(&app.pool, keep).await.unwrap() > 0);
    let oldest_raw_h: f64 = app
        .one("SELECT EXTRACT(EPOCH FROM now() - min(at))::float8 / 3600 FROM gpu_samples")
        .await;
    assert!(
        oldest_raw_h <= 48.01,
        "raw samples older than 48 h remain: {oldest_raw_h}"
    );
    let oldest_rollup_d: f64 = app
        .one("SELECT EXTRACT(EPOCH FROM now() - min(bucket))::float8 / 86400 FROM gpu_rollups")
        .await;
    assert!(oldest_rollup_d <= 90.01, "{oldest_rollup_d}");
    // A second pass finds nothing more to delete: the tables stay bounded.
    assert_eq!(telemetry::prune(&app.pool, keep).await.unwrap(), 0);
    // The pages' 24 hours come from the rollups: at most one point per 5 minutes.
    let points = telemetry::gpu_history(&app.pool, &[gpu], since)
        .await
        .unwrap();
    assert!(points.len() <= 24 * 12 + 1, "{}", points.len());
    drop(node);
}

#[tokio::test]
async fn admins_edit_rules_in_a_form_and_people_see_only_their_alerts() {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("root@uni.edu", "admin", &[]).await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let admin = app.signed_in("root@uni.edu").await;
    // A bad threshold re-renders the form with a sentence and changes nothing.
    let r = app
        .post_form(
            &admin,
            "/admin/alerts",
            "/admin/alerts/rules/gpu_temperature_high",
            &[
                ("threshold", "hot"),
                ("for_secs", "60"),
                ("severity", "critical"),
                ("enabled", "on"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("is not a number"));
    let t: f64 = app
        .one("SELECT threshold FROM alert_rules WHERE name = 'gpu_temperature_high'")
        .await;
    assert_eq!(t, 85.0);
    let r = app
        .post_form(
            &admin,
            "/admin/alerts",
            "/admin/alerts/rules/gpu_temperature_high",
            &[
                ("threshold", "80"),
                ("for_secs", "30"),
                ("severity", "warning"),
            ],
        )
        .await;
    assert!(r.status().is_redirection());
    let (t, f, s, on): (f64, i32, String, bool) = sqlx::query_as(
        "SELECT threshold, for_secs, severity, enabled FROM alert_rules WHERE name = 'gpu_temperature_high'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!((t, f, s.as_str(), on), (80.0, 30, "warning", false));
    // Alerts: one on a GPU, one on ana's booking.
    let node = common::SimNode::register(&app, FLEET, "w1", 4).await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    let booking_id = book_mig(&app, &who, "1g.10gb").await;
    sqlx::query(
        "INSERT INTO alerts (rule, severity, state, node, gpu_uuid, booking_id, value, message, fired_at)
         VALUES ('gpu_lost', 'critical', 'firing', 'w1', 'GPU-x', NULL, 1, 'lost <b>', now()),
                ('instance_memory_near_limit', 'warning', 'firing', 'w1', 'GPU-x', $1, 95, 'near', now())",
    )
    .bind(booking_id)
    .execute(&app.pool)
    .await
    .unwrap();
    let mine: serde_json::Value = app
        .signed_in("ana@uni.edu")
        .await
        .get(app.url("/api/v1/alerts"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(mine.as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine[0]["subject"]["booking_id"], booking_id);
    assert_eq!(mine[0]["severity"], "warning");
    let all: serde_json::Value = admin
        .get(app.url("/api/v1/alerts?state=all"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(all.as_array().unwrap().len(), 2);
    let r = admin
        .get(app.url("/api/v1/alerts?state=maybe"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    // The owner sees it on the dashboard; others cannot open admin alerts.
    let ana = app.signed_in("ana@uni.edu").await;
    let dash = ana
        .get(app.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(dash.contains("near"), "{dash}");
    let r = ana.get(app.url("/admin/alerts")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The admin page escapes messages and acknowledges.
    let page = admin
        .get(app.url("/admin/alerts"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("lost &") && !page.contains("lost <b>"),
        "{page}"
    );
    let aid: i64 = app
        .one("SELECT id FROM alerts WHERE rule = 'gpu_lost'")
        .await;
    let r = app
        .post_form(
            &admin,
            "/admin/alerts",
            &format!("/admin/alerts/{aid}/ack"),
            &[],
        )
        .await;
    assert!(r.status().is_redirection());
    let acked: bool = app
        .one(&format!(
            "SELECT acked_at IS NOT NULL FROM alerts WHERE id = {aid}"
        ))
        .await;
    assert!(acked);
    let r = app
        .post_form(
            &admin,
            "/admin/alerts",
            &format!("/admin/alerts/{aid}/silence"),
            &[("hours", "forever")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    drop(node);
}
