//! The security monitor: a process started outside `gpuslice exec` and
//! registered on a booking's MIG device raises a HIGH alert within the
//! threshold's samples and, with the response on, is ended (audited);
//! refused `exec` calls count against the Unix account; sign-in limits and
//! a token used from a new address are evidence; an admin closes an
//! incident with a note on `/admin/security`, which resolves its alert.
//! The node-side parts need root (cgroups) and skip loudly without it.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{booking_status, wait_for, Killed, TestApp, WorkerProcess};
use gpuslice::web::WebSettings;

fn skip(test: &str, why: &str) {
    common::skip_or_require(&format!("security test {test}"), why);
}

async fn setup(tag: &str, response: &str) -> (TestApp, WorkerProcess, Killed, i64) {
    let (app, node, worker, who) = common::mig_worker(
        &format!("sec{tag}"),
        &[
            ("GPUSLICE_TELEMETRY_INTERVAL_SECS", "1"),
            ("GPUSLICE_SECURITY_RESPONSE", response),
            ("GPUSLICE_GRACE_SECS", "1"),
        ],
    )
    .await;
    let id = common::book_active(&app, &who, "mig", "1g.10gb").await;
    (app, node, worker, id)
}

async fn alert_state(app: &TestApp, booking: i64) -> Option<(String, String)> {
    sqlx::query_as(
        "SELECT state, severity FROM alerts WHERE rule = 'security_incident' AND booking_id = $1
         ORDER BY id DESC LIMIT 1",
    )
    .bind(booking)
    .fetch_optional(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn an_intruder_on_a_mig_device_raises_a_high_alert_and_is_ended() {
    if !nix::unistd::Uid::effective().is_root() {
        skip("intruder", "not running as root (no booking cgroups)");
        return;
    }
    let (app, node, _worker, id) = setup("a", "end-intruders").await;
    let device: String = app
        .one(&format!("SELECT device_uuid FROM bookings WHERE id = {id}"))
        .await;
    // A process that did not come through gpuslice exec.
    let mut intruder = Killed(Command::new("sleep").arg("600").spawn().unwrap());
    let pid = intruder.0.id().to_string();
    let out = node.cli(&[
        "sim",
        "process",
        "--node",
        &node.name,
        "--device",
        &device,
        "--pid",
        &pid,
        "--used-mib",
        "2048",
    ]);
    assert!(out.status.success(), "{out:?}");
    wait_for("the HIGH alert", || async {
        alert_state(&app, id).await == Some(("firing".into(), "high".into()))
    })
    .await;
    let (score, evidence): (i32, i64) = sqlx::query_as(
        "SELECT i.score, (SELECT count(*) FROM security_evidence e
                           WHERE e.incident_id = i.id AND e.detector = 'intruder_process')
         FROM security_incidents i WHERE i.subject = $1",
    )
    .bind(format!("booking:{id}"))
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(score >= 5 && evidence >= 5, "{score} {evidence}");
    let detail: String = app
        .one("SELECT detail FROM security_evidence WHERE detector = 'intruder_process' ORDER BY id LIMIT 1")
        .await;
    assert!(
        detail.contains(&format!("process {pid} (sleep")),
        "{detail}"
    );
    // The response ends it and says so.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while intruder.0.try_wait().unwrap().is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        intruder.0.try_wait().unwrap().is_some(),
        "the intruder was ended"
    );
    wait_for("the audited response", || async {
        app.one::<i64>("SELECT count(*) FROM audit_log WHERE action = 'security.end_process'")
            .await
            >= 1
    })
    .await;
    let responses: i64 = app
        .one("SELECT count(*) FROM security_evidence WHERE detector = 'response'")
        .await;
    assert!(responses >= 1);
    // The booking's owner was told (the alert names their booking), and so
    // were the admins.
    let mails: i64 = app
        .one(
            "SELECT count(*) FROM notifications WHERE topic IN ('booking_alert', 'alert_critical')",
        )
        .await;
    assert!(mails >= 1, "notifications queued: {mails}");

    // An admin closes it with a note: the alert resolves, the audit says who.
    app.user("root@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("root@uni.edu").await;
    let page = admin
        .get(app.url("/admin/security"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&format!("booking #{id}")), "{page}");
    assert!(page.contains("process outside every booking"), "{page}");
    let incident: i64 = app
        .one(&format!(
            "SELECT id FROM security_incidents WHERE subject = 'booking:{id}'"
        ))
        .await;
    let r = app
        .post_form(
            &admin,
            "/admin/security",
            &format!("/admin/security/{incident}/close"),
            &[("note", "  ")],
        )
        .await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("Say what you found"));
    let r = app
        .post_form(
            &admin,
            "/admin/security",
            &format!("/admin/security/{incident}/close"),
            &[("note", "a student's <script> test job; talked to them")],
        )
        .await;
    assert!(
        r.status().is_redirection() || r.status().is_success(),
        "{}",
        r.status()
    );
    let state: String = app
        .one(&format!(
            "SELECT state FROM security_incidents WHERE id = {incident}"
        ))
        .await;
    assert_eq!(state, "closed");
    assert_eq!(
        alert_state(&app, id).await.map(|s| s.0),
        Some("resolved".into())
    );
    let audited: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'security.close_incident'")
        .await;
    assert_eq!(audited, 1);
    let closed = admin
        .get(app.url("/admin/security?state=closed"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(closed.contains("test job; talked to them"), "{closed}");
    assert!(!closed.contains("<script>"), "the note is escaped");
    // Other roles cannot see the page.
    let member = app.signed_in("ana@uni.edu").await;
    let r = member.get(app.url("/admin/security")).send().await.unwrap();
    assert!(r.status() == 403 || r.status() == 404, "{}", r.status());
}

#[tokio::test]
async fn refused_exec_calls_count_against_the_unix_account() {
    if !nix::unistd::Uid::effective().is_root() {
        skip("exec refusals", "not running as root (setpriv)");
        return;
    }
    let (app, node, _worker, id) = setup("b", "none").await;
    for _ in 0..5 {
        let out = Command::new("setpriv")
            .args(["--reuid", "1", "--regid", "1", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_gpuslice"))
            .args(["exec", &id.to_string(), "--socket"])
            .arg(node.socket())
            .args(["--", "true"])
            .output()
            .unwrap();
        assert!(!out.status.success());
    }
    // Written in the background (a loop on the socket must not become
    // database work at its pace).
    let subject = format!("uid:1@{}", node.name);
    wait_for("five pieces of evidence", || async {
        app.one::<i64>(&format!(
            "SELECT coalesce(max(score), 0)::bigint FROM security_incidents WHERE subject = '{subject}'"
        ))
        .await
            == 5
    })
    .await;
    wait_for("the HIGH alert", || async {
        app.one::<i64>("SELECT count(*) FROM alerts WHERE rule = 'security_incident' AND state = 'firing' AND severity = 'high'")
            .await
            == 1
    })
    .await;
}

#[tokio::test]
async fn sign_in_bursts_and_a_token_from_a_new_address_are_evidence() {
    let app = TestApp::spawn_with(WebSettings {
        trust_proxy: true,
        ..Default::default()
    })
    .await;
    app.user("bo@uni.edu", "none", &[]).await;
    let client = app.client();
    // Eleven wrong passwords from one address: the account-and-address
    // limit (10) is reached once.
    for _ in 0..11 {
        let csrf = app.csrf(&client, "/login").await;
        let _ = client
            .post(app.url("/login"))
            .header("X-Forwarded-For", "198.51.100.7")
            .form(&[
                ("csrf_token", csrf.as_str()),
                ("email", "bo@uni.edu"),
                ("password", "not the password at all"),
            ])
            .send()
            .await
            .unwrap();
    }
    let user: i64 = app
        .one("SELECT id FROM users WHERE email = 'bo@uni.edu'")
        .await;
    wait_for("the sign-in evidence", || async {
        app.one::<i64>(&format!(
            "SELECT count(*) FROM security_evidence e JOIN security_incidents i ON i.id = e.incident_id
             WHERE i.subject = 'account:{user}' AND e.detector = 'sign_in_failures'"
        ))
        .await
            == 1
    })
    .await;
    // A token used from one address, then another.
    let token = gpuslice::cli::token_create(&app.pool, "bo@uni.edu", "laptop")
        .await
        .unwrap();
    for addr in ["203.0.113.1", "203.0.113.1", "203.0.113.9"] {
        let r = client
            .get(app.url("/api/v1/me"))
            .bearer_auth(&token)
            .header("X-Forwarded-For", addr)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    wait_for("the token evidence", || async {
        app.one::<i64>(&format!(
            "SELECT count(*) FROM security_evidence e JOIN security_incidents i ON i.id = e.incident_id
             WHERE i.subject = 'account:{user}' AND e.detector = 'token_new_address'"
        ))
        .await
            == 1
    })
    .await;
    let detail: String = app
        .one("SELECT detail FROM security_evidence WHERE detector = 'token_new_address'")
        .await;
    assert!(detail.contains("203.0.113.9"), "{detail}");
}

#[tokio::test]
async fn a_share_run_under_another_account_is_frozen_until_the_incident_is_closed() {
    if !nix::unistd::Uid::effective().is_root() {
        skip("freeze", "not running as root (no booking cgroups)");
        return;
    }
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    gpuslice::cli::user_link(&app.pool, "ana@uni.edu", "nobody")
        .await
        .unwrap();
    let name = format!("s{}c", std::process::id());
    let fleet = format!(
        "[[node]]\nname = \"{name}\"\n[[node.gpu]]\nmodel = \"L40S-48GB\"\nmode = \"timeslice\"\ncount = 1\nmax_shares = 4\n"
    );
    let node = WorkerProcess::new(&app, "sec", &name, &fleet);
    let _worker = Killed(
        node.command()
            .env("GPUSLICE_TELEMETRY_INTERVAL_SECS", "1")
            .env("GPUSLICE_SECURITY_RESPONSE", "freeze-shares")
            .spawn()
            .unwrap(),
    );
    wait_for("the worker's GPU", || async {
        app.one::<i64>("SELECT count(*) FROM gpus").await == 1
    })
    .await;
    let who = common::member(&app, "ana@uni.edu", "lab").await;
    let id = common::book(&app, &who, "timeslice", "", 1).await.id;
    wait_for("active", || async {
        booking_status(&app, id).await == "active"
    })
    .await;
    let layout = gpuslice::sched::shares::layout_for(&name).expect("root has cgroups");
    let group = layout.group(id);
    wait_for("the share's group", || async { group.exists() }).await;
    // A process of uid 2 (not the owner's `nobody`) inside the share.
    let stranger = Killed(
        Command::new("setpriv")
            .args([
                "--reuid",
                "2",
                "--regid",
                "2",
                "--clear-groups",
                "--",
                "sleep",
                "600",
            ])
            .spawn()
            .unwrap(),
    );
    group.add(stranger.0.id()).unwrap();
    wait_for("the share held", || async {
        app.one::<bool>(&format!(
            "SELECT coalesce(bool_or(held), false) FROM security_incidents WHERE subject = 'booking:{id}'"
        ))
        .await
    })
    .await;
    wait_for("frozen", || async { group.is_frozen() }).await;
    // It stays frozen: the scheduler no longer gives it turns.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(group.is_frozen());
    let audited: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'security.freeze_share'")
        .await;
    assert_eq!(audited, 1);
    // Closing the incident gives it back to the scheduler.
    drop(stranger);
    let incident: i64 = app
        .one(&format!(
            "SELECT id FROM security_incidents WHERE subject = 'booking:{id}'"
        ))
        .await;
    let admin = gpuslice::db::audit::Actor {
        user_id: None,
        email: Some("root@uni.edu".into()),
        client_addr: None,
    };
    assert!(
        gpuslice::watch::security::close(&app.pool, incident, &admin, "checked")
            .await
            .unwrap()
    );
    wait_for("thawed", || async { !group.is_frozen() }).await;
}
