//! Idle reclaim against a real PostgreSQL and the simulated backend: an
//! instance is busy while a process runs on it, idle otherwise.

mod common;

use common::{booking_status, SimNode, TestApp};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// One A30 in MIG mode: a 4g.24gb takes all of it.
const FLEET: &str = r#"
[[node]]
name = "n1"
[[node.gpu]]
model = "A30-24GB"
mode = "mig"
count = 1
"#;

struct World {
    app: TestApp,
    node: SimNode,
}

impl World {
    async fn new() -> World {
        let app = TestApp::spawn().await;
        let node = SimNode::register(&app, FLEET, "n1", 3).await;
        World { app, node }
    }

    /// A tenant with an idle policy given as CLI flags.
    async fn tenant(&self, slug: &str, after: &str, grace: &str, action: &str) {
        let args = gpuslice::cli::TenantAddArgs {
            slug: slug.into(),
            name: format!("Tenant {slug}"),
            max_active_bookings: None,
            max_gpu_memory_gib: Some("100".into()),
            max_compute_slices: Some("20".into()),
            monthly_slice_hours: Some("10000".into()),
            max_booking_hours: None,
            priority: None,
            guaranteed_share_pct: None,
            idle: gpuslice::cli::IdleArgs {
                idle_after_minutes: Some(after.into()),
                idle_grace_minutes: Some(grace.into()),
                idle_action: Some(action.into()),
            },
        };
        gpuslice::cli::tenant_add(&self.app.pool, &args)
            .await
            .unwrap();
    }

    async fn person(&self, email: &str, tenant: &str) -> String {
        self.app.user(email, "none", &[tenant]).await;
        gpuslice::cli::token_create(&self.app.pool, email, "t")
            .await
            .unwrap()
    }

    async fn call(
        &self,
        token: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let c = reqwest::Client::new();
        let mut r = c
            .request(method.parse().unwrap(), self.app.url(path))
            .bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let s = r.status();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    async fn book(&self, token: &str, tenant: &str) -> i64 {
        let (s, b) = self
            .call(
                token,
                "POST",
                "/api/v1/bookings",
                Some(json!({"tenant": tenant, "kind": "mig", "profile": "4g.24gb", "hours": 8})),
            )
            .await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        b["id"].as_i64().unwrap()
    }

    async fn until_active(&self, id: i64) {
        for _ in 0..10 {
            if booking_status(&self.app, id).await == "active" {
                return;
            }
            self.node.step(&self.app).await;
        }
        panic!("booking {id} never became active");
    }

    /// One telemetry sample of the node, then one idle-reclaim round.
    async fn round(&self) -> gpuslice::watch::idle::Round {
        gpuslice::worker::telemetry::sample_once(
            &self.app.pool,
            "n1",
            self.node.dyn_backend(),
            None,
        )
        .await
        .unwrap();
        gpuslice::watch::idle::round(&self.app.pool, 5.0, 60.0)
            .await
            .unwrap()
    }

    /// Moves a booking's idle clock (or warning) `minutes` into the past.
    async fn age(&self, id: i64, column: &str, minutes: i32) {
        sqlx::query(&format!(
            "UPDATE bookings SET {column} = {column} - make_interval(mins => $2) WHERE id = $1"
        ))
        .bind(id)
        .bind(minutes)
        .execute(&self.app.pool)
        .await
        .unwrap();
    }

    /// A time-sliced share of `priority` on one L40S, active and started an
    /// hour ago: the world, the owner's token, the booking.
    async fn running_share(priority: &str) -> (World, String, i64) {
        let app = TestApp::spawn().await;
        let fleet = "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"L40S-48GB\"\nmode = \"timeslice\"\nmax_shares = 4\n";
        let node = SimNode::register(&app, fleet, "n1", 4).await;
        let w = World { app, node };
        w.tenant("lab", "0", "30", "notify").await;
        let ana = w.person("ana@uni.edu", "lab").await;
        let body = json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 8, "priority": priority, "hours": 4});
        let (s, b) = w.call(&ana, "POST", "/api/v1/bookings", Some(body)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        let a = b["id"].as_i64().unwrap();
        w.until_active(a).await;
        sqlx::query("UPDATE bookings SET during = tstzrange(lower(during) - interval '1 hour', upper(during)) WHERE id = $1")
            .bind(a)
            .execute(&w.app.pool)
            .await
            .unwrap();
        (w, ana, a)
    }

    /// A booking as its owner reads it through the API.
    async fn view(&self, token: &str, id: i64) -> Value {
        self.call(token, "GET", &format!("/api/v1/bookings/{id}"), None)
            .await
            .1
    }

    /// `buckets` 5-minute rollups up to now, `util` % busy, as telemetry
    /// would have written them.
    async fn busy_for(&self, id: i64, buckets: i32, util: f64) {
        sqlx::query(
            "INSERT INTO instance_rollups (booking_id, bucket, samples, memory_used_sum, memory_used_max,
                                           memory_limit_mib, utilization_sum, utilization_n)
             SELECT $1, date_bin('5 minutes', now(), TIMESTAMPTZ '2000-01-01') - k * interval '5 minutes',
                    30, 30 * 1000, 1000, 8192, 30 * $3, 30
             FROM generate_series(0, $2 - 1) AS k
             ON CONFLICT (booking_id, bucket) DO UPDATE SET utilization_sum = EXCLUDED.utilization_sum",
        )
        .bind(id)
        .bind(buckets)
        .bind(util)
        .execute(&self.app.pool)
        .await
        .unwrap();
    }

    async fn optimize(&self) -> (usize, usize) {
        gpuslice::watch::optimizer::round(&self.app.pool)
            .await
            .unwrap()
    }

    /// A page's HTML as `client` sees it.
    async fn html(&self, client: &reqwest::Client, path: &str) -> String {
        let r = client.get(self.app.url(path)).send().await.unwrap();
        r.text().await.unwrap()
    }

    async fn count(&self, sql: &str) -> i64 {
        self.app.one::<i64>(sql).await
    }
}

#[tokio::test]
async fn an_idle_booking_is_warned_then_released_and_its_slot_goes_to_the_queue() {
    let w = World::new().await;
    w.tenant("lab", "30", "15", "release").await;
    let ana = w.person("ana@uni.edu", "lab").await;
    let bob = w.person("bob@uni.edu", "lab").await;
    let a = w.book(&ana, "lab").await;
    w.until_active(a).await;
    // Bob's booking waits for the only GPU.
    let b = w.book(&bob, "lab").await;
    assert_eq!(booking_status(&w.app, b).await, "queued");

    // No process on the device: the idle clock starts.
    let r = w.round().await;
    assert_eq!(r.started, 1, "{r:?}");
    let view = w.view(&ana, a).await;
    assert!(view["idle"]["since"].is_string(), "{view}");
    assert!(view["idle"]["warned_at"].is_null(), "{view}");

    // Thirty idle minutes later: Ana is warned (e-mail, timeline, banner).
    w.age(a, "idle_since", 31).await;
    assert_eq!(w.round().await.warned, 1);
    let view = w.view(&ana, a).await;
    assert!(view["idle"]["warned_at"].is_string(), "{view}");
    assert!(view["idle"]["release_at"].is_string(), "{view}");
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM notifications WHERE booking_id = {a} AND topic = 'booking_idle'"
        ))
        .await,
        1
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM booking_events WHERE booking_id = {a} AND actor = 'idle-reclaim'"
        ))
        .await,
        1
    );
    let page = w.app.signed_in("ana@uni.edu").await;
    let body = w.html(&page, "/").await;
    assert!(
        body.contains("has had no work on its GPU"),
        "dashboard banner"
    );
    let body = w.html(&page, &format!("/bookings/{a}")).await;
    assert!(
        body.contains("id=\"keep\""),
        "the booking page offers \"Still working\""
    );
    // A second round does not warn twice.
    assert_eq!(w.round().await.warned, 0);

    // No answer within the grace: released with the reason idle.
    let end_before: time::OffsetDateTime =
        sqlx::query_scalar("SELECT upper(during) FROM bookings WHERE id = $1")
            .bind(a)
            .fetch_one(&w.app.pool)
            .await
            .unwrap();
    w.age(a, "idle_warned_at", 16).await;
    assert_eq!(w.round().await.released, 1);
    let view = w.view(&ana, a).await;
    assert_eq!(view["reason"], "idle", "{view}");
    assert_eq!(view["status"], "releasing", "{view}");
    assert_eq!(
        w.count("SELECT count(*) FROM audit_log WHERE action = 'booking.idle_released'")
            .await,
        1
    );
    assert_eq!(
        w.count(&format!(
            "SELECT count(*) FROM notifications WHERE booking_id = {a} AND topic = 'booking_idle'"
        ))
        .await,
        2
    );
    let end_after: time::OffsetDateTime =
        sqlx::query_scalar("SELECT upper(during) FROM bookings WHERE id = $1")
            .bind(a)
            .fetch_one(&w.app.pool)
            .await
            .unwrap();
    let reclaimed = (end_before - end_after).as_seconds_f64() / 3600.0 * 4.0;
    eprintln!("idle reclaim gave back {reclaimed:.1} slice-hours of a 4-slice, 8-hour booking");
    assert!(reclaimed > 31.0, "{reclaimed}");
    // The worker tears it down; the queue planner gives Bob the GPU.
    for _ in 0..5 {
        w.node.step(&w.app).await;
    }
    assert_eq!(booking_status(&w.app, a).await, "released");
    assert_eq!(gpuslice::booking::plan_queue(&w.app.pool).await.unwrap(), 1);
    assert_eq!(booking_status(&w.app, b).await, "scheduled");
}

#[tokio::test]
async fn a_booking_with_work_running_is_never_warned() {
    let w = World::new().await;
    w.tenant("lab", "1", "1", "release").await;
    let ana = w.person("ana@uni.edu", "lab").await;
    let a = w.book(&ana, "lab").await;
    w.until_active(a).await;
    let device: String = sqlx::query_scalar("SELECT device_uuid FROM bookings WHERE id = $1")
        .bind(a)
        .fetch_one(&w.app.pool)
        .await
        .unwrap();
    w.node.backend.attach_process(&device, 4242, 2048).unwrap();
    for _ in 0..3 {
        let r = w.round().await;
        assert_eq!(r, Default::default(), "{r:?}");
        w.age(a, "idle_since", 60).await;
    }
    let view = w.view(&ana, a).await;
    assert!(view["idle"].is_null(), "{view}");
    assert_eq!(view["status"], "active");
}

#[tokio::test]
async fn still_working_starts_the_clock_again_and_notify_never_releases() {
    let w = World::new().await;
    w.tenant("lab", "10", "5", "notify").await;
    let ana = w.person("ana@uni.edu", "lab").await;
    let eve = w.person("eve@uni.edu", "lab").await;
    let a = w.book(&ana, "lab").await;
    w.until_active(a).await;
    w.round().await;
    w.age(a, "idle_since", 11).await;
    assert_eq!(w.round().await.warned, 1);
    // notify: no release however long the owner stays silent.
    w.age(a, "idle_warned_at", 600).await;
    assert_eq!(w.round().await.released, 0);
    let view = w.view(&ana, a).await;
    assert!(view["idle"]["release_at"].is_null(), "{view}");
    // Only the owner may say it is still in use.
    let (s, _) = w
        .call(&eve, "POST", &format!("/api/v1/bookings/{a}/keep"), None)
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, view) = w
        .call(&ana, "POST", &format!("/api/v1/bookings/{a}/keep"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{view}");
    assert!(view["idle"].is_null(), "{view}");
    // Samples from before the answer do not count; a new one starts a new
    // stretch, which is not yet long enough to warn.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let r = w.round().await;
    assert_eq!((r.started, r.warned), (1, 0), "{r:?}");
    // Keeping a booking that is not active is refused.
    let (s, _) = w
        .call(&ana, "POST", &format!("/api/v1/bookings/{a}/release"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    let (s, e) = w
        .call(&ana, "POST", &format!("/api/v1/bookings/{a}/keep"), None)
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{e}");
}

#[tokio::test]
async fn idle_flags_are_checked_and_edited() {
    let w = World::new().await;
    w.tenant("lab", "0", "30", "notify").await;
    let edit = |after: &str, action: &str| gpuslice::cli::TenantEditArgs {
        slug: "lab".into(),
        idle: gpuslice::cli::IdleArgs {
            idle_after_minutes: Some(after.into()),
            idle_grace_minutes: None,
            idle_action: Some(action.into()),
        },
    };
    let p = gpuslice::cli::tenant_edit(&w.app.pool, &edit("45", "release"))
        .await
        .unwrap();
    assert_eq!((p.after_minutes, p.grace_minutes), (45, 30));
    let e = gpuslice::cli::tenant_edit(&w.app.pool, &edit("-3", "release"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("--idle-after-minutes"), "{e}");
    let e = gpuslice::cli::tenant_edit(&w.app.pool, &edit("5", "delete"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("--idle-action"), "{e}");
    // Nothing changed by the refused edits.
    let n: i64 = w
        .count("SELECT idle_after_minutes::bigint FROM tenants WHERE slug = 'lab'")
        .await;
    assert_eq!(n, 45);
}

#[tokio::test]
async fn an_ended_booking_says_which_smaller_slice_would_have_done() {
    let w = World::new().await;
    w.tenant("lab", "0", "30", "notify").await;
    let ana = w.person("ana@uni.edu", "lab").await;
    let a = w.book(&ana, "lab").await;
    w.until_active(a).await;
    // What its device measured: 5 GiB at peak, at most 20 % busy.
    sqlx::query(
        "INSERT INTO instance_rollups (booking_id, bucket, samples, memory_used_sum, memory_used_max,
                                       memory_limit_mib, utilization_sum, utilization_n)
         VALUES ($1, now() - interval '10 minutes', 30, 30 * 4000, 5120, 24576, 30 * 20.0, 30),
                ($1, now() - interval '5 minutes', 30, 30 * 2000, 3000, 24576, 30 * 8.0, 30)",
    )
    .bind(a)
    .execute(&w.app.pool)
    .await
    .unwrap();
    let view = w.view(&ana, a).await;
    assert!(view["advice"].is_null(), "no advice while it runs: {view}");
    let (s, _) = w
        .call(&ana, "POST", &format!("/api/v1/bookings/{a}/release"), None)
        .await;
    assert_eq!(s, StatusCode::OK);
    for _ in 0..5 {
        w.node.step(&w.app).await;
    }
    let view = w.view(&ana, a).await;
    let advice = &view["advice"];
    assert_eq!(advice["profile"], "1g.6gb", "{view}");
    assert_eq!(advice["slice_hours_ratio"], 0.25, "{view}");
    assert_eq!(advice["peak_memory_gib"], 5.0, "{view}");
    assert_eq!(advice["busy_pct"], 20.0, "{view}");
    let page = w.app.signed_in("ana@uni.edu").await;
    let body = w.html(&page, &format!("/bookings/{a}")).await;
    assert!(
        body.contains("a 1g.6gb would have done, 1/4 of the slice-hours"),
        "the booking page gives the advice"
    );
    // The next booking form starts from it ...
    let body = w.html(&page, "/bookings/new").await;
    assert!(
        body.contains(&format!("Suggested from your booking #{a}")),
        "{body}"
    );
    assert!(
        body.contains(r#"<option value="1g.6gb" selected"#),
        "the profile is pre-filled"
    );
    // ... and the tenant's managers see the month's sum.
    w.app.user("boss@uni.edu", "none", &["lab:manager"]).await;
    let boss = w.app.signed_in("boss@uni.edu").await;
    let body = w.html(&boss, "/tenants/lab").await;
    assert!(
        body.contains(
            "1 of the 1 bookings that ended this month would have done on a smaller slice"
        ),
        "{body}"
    );
}

#[tokio::test]
async fn the_optimizer_lowers_a_quiet_share_records_it_and_an_admin_gives_it_back() {
    let (w, ana, a) = World::running_share("high").await;
    // It has run an hour at 3 % busy.
    w.busy_for(a, 6, 3.0).await;
    assert_eq!(w.optimize().await, (1, 0));
    let view = w.view(&ana, a).await;
    assert_eq!(view["priority"], "low", "{view}");
    let before: f64 = sqlx::query_scalar(
        "SELECT before FROM optimizer_actions WHERE action = 'priority_lowered'",
    )
    .fetch_one(&w.app.pool)
    .await
    .unwrap();
    assert!((before - 3.0).abs() < 1e-9, "{before}");
    // Lowered once, not again.
    assert_eq!(w.optimize().await, (0, 0));
    // An admin gives it back from the optimizer page.
    w.app.user("root@uni.edu", "admin", &[]).await;
    let root = w.app.signed_in("root@uni.edu").await;
    let body = w.html(&root, "/admin/optimizer").await;
    assert!(
        body.contains("priority_lowered") && body.contains("Give the priority back"),
        "{body}"
    );
    assert!(body.contains("L40S-48GB"), "the GPU table lists the fleet");
    let id: i64 = w
        .count("SELECT id FROM optimizer_actions WHERE action = 'priority_lowered'")
        .await;
    let path = format!("/admin/optimizer/actions/{id}/reverse");
    let r = w.app.post_form(&root, "/admin/optimizer", &path, &[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let view = w.view(&ana, a).await;
    assert_eq!(view["priority"], "high", "{view}");
    assert_eq!(
        w.count("SELECT count(*) FROM optimizer_actions WHERE action = 'priority_restored' AND actor = 'root@uni.edu'").await,
        1
    );
    // The admin's decision holds: the optimizer leaves the booking alone.
    assert_eq!(w.optimize().await, (0, 0));
    // Reversing twice is refused with a sentence.
    let r = w.app.post_form(&root, "/admin/optimizer", &path, &[]).await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
}

#[tokio::test]
async fn the_optimizer_gives_the_priority_back_once_the_share_is_busy() {
    let (w, ana, a) = World::running_share("normal").await;
    // The optimizer lowered it earlier.
    sqlx::query("UPDATE bookings SET priority = 'low', lowered_from = 'normal' WHERE id = $1")
        .bind(a)
        .execute(&w.app.pool)
        .await
        .unwrap();
    w.busy_for(a, 1, 80.0).await;
    assert_eq!(w.optimize().await, (0, 1));
    let view = w.view(&ana, a).await;
    assert_eq!(view["priority"], "normal", "{view}");
    let after: f64 = sqlx::query_scalar("SELECT after FROM optimizer_actions WHERE action = 'priority_restored' AND actor = 'optimizer'")
        .fetch_one(&w.app.pool)
        .await
        .unwrap();
    assert!((after - 80.0).abs() < 1e-9, "{after}");
}

#[tokio::test]
async fn no_telemetry_or_a_new_policy_stops_the_clock() {
    let w = World::new().await;
    w.tenant("lab", "10", "5", "release").await;
    let ana = w.person("ana@uni.edu", "lab").await;
    let a = w.book(&ana, "lab").await;
    w.until_active(a).await;
    w.round().await;
    w.age(a, "idle_since", 11).await;
    assert_eq!(w.round().await.warned, 1);
    // The node stops reporting: its last sample grows old. The warning is
    // withdrawn rather than the booking released on stale data.
    sqlx::query(
        "UPDATE instance_samples SET at = at - interval '10 minutes' WHERE booking_id = $1",
    )
    .bind(a)
    .execute(&w.app.pool)
    .await
    .unwrap();
    let r = gpuslice::watch::idle::round(&w.app.pool, 5.0, 60.0)
        .await
        .unwrap();
    assert_eq!(r.cleared, 1, "{r:?}");
    assert!(w.view(&ana, a).await["idle"].is_null());
    // Warned again later, then the tenant's policy changes: every clock
    // starts afresh (no release at once under the new policy).
    w.round().await;
    w.age(a, "idle_since", 11).await;
    assert_eq!(w.round().await.warned, 1);
    w.age(a, "idle_warned_at", 60).await;
    let edit = gpuslice::cli::TenantEditArgs {
        slug: "lab".into(),
        idle: gpuslice::cli::IdleArgs {
            idle_grace_minutes: Some("30".into()),
            ..Default::default()
        },
    };
    gpuslice::cli::tenant_edit(&w.app.pool, &edit)
        .await
        .unwrap();
    assert!(w.view(&ana, a).await["idle"].is_null());
    assert_eq!(w.round().await.released, 0);
    assert_eq!(booking_status(&w.app, a).await, "active");
}
