//! Booking end to end through the JSON API and the worker: rules, quota,
//! races, the queue, release, expiry and reconciliation against the
//! simulated backend.

mod common;

use std::sync::Arc;

use common::{SimNode, TestApp};
use gpuslice::gpu::catalog::Placement;
use gpuslice::gpu::sim::SimBackend;
use gpuslice::gpu::GpuBackend;
use gpuslice::worker::bookings as worker;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// One node: two H100s in MIG mode and one L40S for time-sliced shares.
const FLEET: &str = r#"
[[node]]
name = "n1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 2
[[node.gpu]]
model = "L40S-48GB"
mode = "timeslice"
count = 1
max_shares = 3
"#;

struct World {
    app: TestApp,
    sim: SimNode,
    node: Arc<SimBackend>,
}

impl World {
    async fn new(fleet: &str) -> World {
        let app = TestApp::spawn().await;
        let sim = SimNode::register(&app, fleet, "n1", 3).await;
        let node = sim.backend.clone();
        World { app, sim, node }
    }

    /// A tenant with the given quota (flags as in `tenant add`).
    async fn tenant(&self, slug: &str, quota: &[(&str, &str)]) {
        let get = |k: &str| quota.iter().find(|q| q.0 == k).map(|q| q.1.to_string());
        let args = gpuslice::cli::TenantAddArgs {
            slug: slug.into(),
            name: format!("Tenant {slug}"),
            max_active_bookings: get("active").or(Some("20".into())),
            max_gpu_memory_gib: get("memory").or(Some("1000".into())),
            max_compute_slices: get("slices").or(Some("100".into())),
            monthly_slice_hours: get("budget").or(Some("100000".into())),
            max_booking_hours: get("hours").or(Some("48".into())),
            priority: get("priority"),
            guaranteed_share_pct: None,
            idle: Default::default(),
        };
        gpuslice::cli::tenant_add(&self.app.pool, &args)
            .await
            .unwrap();
    }

    /// A user in `tenants` with an API token.
    async fn person(&self, email: &str, role: &str, tenants: &[&str]) -> String {
        self.app.user(email, role, tenants).await;
        gpuslice::cli::token_create(&self.app.pool, email, "test")
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
        let url = self.app.url(path);
        let req = match method {
            "GET" => c.get(url),
            _ => c.post(url),
        }
        .bearer_auth(token);
        let req = match body {
            Some(b) => req.json(&b),
            None => req,
        };
        let r = req.send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn book(&self, token: &str, body: Value) -> (StatusCode, Value) {
        self.call(token, "POST", "/api/v1/bookings", Some(body))
            .await
    }

    async fn get(&self, token: &str, id: i64) -> Value {
        let (s, v) = self
            .call(token, "GET", &format!("/api/v1/bookings/{id}"), None)
            .await;
        assert_eq!(s, StatusCode::OK, "{v}");
        v
    }

    /// One pass of the node's worker.
    async fn step(&self) -> usize {
        self.sim.step(&self.app).await
    }

    fn instances(&self) -> Vec<gpuslice::gpu::Instance> {
        self.node
            .inventory()
            .unwrap()
            .iter()
            .filter(|g| g.mig_current)
            .flat_map(|g| self.node.instances(&g.uuid).unwrap())
            .collect()
    }

    async fn count(&self, sql: &str) -> i64 {
        self.app.one::<i64>(sql).await
    }
}

fn mig(tenant: &str, profile: &str, hours: i32) -> Value {
    json!({"tenant": tenant, "kind": "mig", "profile": profile, "hours": hours})
}

#[tokio::test]
async fn a_mig_booking_becomes_a_real_instance_and_goes_away_on_release() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;

    let (s, b) = w.book(&t, mig("lab", "1g.10gb", 2)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["status"], "scheduled");
    assert_eq!(b["model"], "H100-80GB");
    assert_eq!(b["placement"]["size"], 1);
    let id = b["id"].as_i64().unwrap();

    w.step().await;
    let b = w.get(&t, id).await;
    assert_eq!(b["status"], "active", "{b}");
    let device = b["device_uuid"].as_str().unwrap().to_string();
    assert!(device.starts_with("MIG-"), "{device}");
    let on_hw = w.instances();
    assert_eq!(on_hw.len(), 1);
    assert_eq!(on_hw[0].device_uuid.as_deref(), Some(device.as_str()));
    assert_eq!(
        i64::from(on_hw[0].placement.start),
        b["placement"]["start"].as_i64().unwrap()
    );

    let (s, b) = w
        .call(&t, "POST", &format!("/api/v1/bookings/{id}/release"), None)
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "releasing");
    w.step().await;
    assert_eq!(w.get(&t, id).await["status"], "released");
    assert!(w.instances().is_empty(), "the instance must be gone");
    // Releasing again is refused, with the reason.
    let (s, e) = w
        .call(&t, "POST", &format!("/api/v1/bookings/{id}/release"), None)
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(e["message"].as_str().unwrap().contains("released"), "{e}");

    let events: Vec<(Option<String>, String)> = sqlx::query_as(
        "SELECT from_status, to_status FROM booking_events WHERE booking_id = $1 ORDER BY id",
    )
    .bind(id)
    .fetch_all(&w.app.pool)
    .await
    .unwrap();
    let path: Vec<&str> = events.iter().map(|e| e.1.as_str()).collect();
    assert_eq!(
        path,
        [
            "scheduled",
            "provisioning",
            "active",
            "releasing",
            "released"
        ]
    );
}

#[tokio::test]
async fn placement_keeps_the_big_profiles_placeable() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    // Three 1g bookings: a careless first-fit would put them at slices
    // 0, 1, 2 and make 4g impossible on that GPU; gpuslice keeps 0..3 free.
    for _ in 0..3 {
        let (s, b) = w.book(&t, mig("lab", "1g.10gb", 1)).await;
        assert_eq!(s, StatusCode::CREATED, "{b}");
        assert!(b["placement"]["start"].as_i64().unwrap() >= 4, "{b}");
    }
    let (s, b) = w.book(&t, mig("lab", "4g.40gb", 1)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["status"], "scheduled");
}

#[tokio::test]
async fn bad_input_gets_a_message_per_field_and_changes_nothing() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[("hours", "4")]).await;
    w.tenant("other", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let cases: Vec<(Value, StatusCode, &str)> = vec![
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "9g.99gb", "hours": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "profile",
        ),
        (
            json!({"tenant": "lab", "kind": "gpu", "hours": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "kind",
        ),
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "hours",
        ),
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 5}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "at most 4 hours",
        ),
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 1, "start": "2020-01-01T00:00:00Z"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "in the past",
        ),
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 1, "start": "2099-01-01T00:00:00Z"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "days ahead",
        ),
        (
            json!({"tenant": "other", "kind": "mig", "profile": "1g.10gb", "hours": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "not a member",
        ),
        (
            json!({"tenant": "lab", "kind": "timeslice", "memory_gib": "lots", "hours": 1}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "memory_gib",
        ),
        (
            json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 200, "hours": 1}),
            StatusCode::CONFLICT,
            "200 GiB",
        ),
        (
            json!({"tenant": "lab", "kind": "mig", "model": "A30-24GB", "profile": "1g.6gb", "hours": 1}),
            StatusCode::CONFLICT,
            "A30-24GB",
        ),
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 1, "colour": "red"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "colour",
        ),
        (
            json!(["not", "an", "object"]),
            StatusCode::UNPROCESSABLE_ENTITY,
            "object",
        ),
    ];
    for (body, status, needle) in cases {
        let (s, e) = w.book(&t, body.clone()).await;
        assert_eq!(s, status, "{body} -> {e}");
        assert!(e["error"].is_string(), "{e}");
        assert!(
            e["message"].as_str().unwrap().contains(needle),
            "{body} -> {e}"
        );
    }
    assert_eq!(w.count("SELECT count(*) FROM bookings").await, 0);
    // Several bad fields: one message each, by field name, the tenant
    // (good) not among them; a blank field beside a bad one is named in
    // the same answer.
    let several = [
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "", "hours": "two", "start": "soon"}),
            &["profile", "hours", "start"][..],
        ),
        (
            json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": "two", "start": ""}),
            &["hours", "start"][..],
        ),
    ];
    for (body, named) in several {
        let (s, e) = w.book(&t, body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {e}");
        let fields = e["fields"].as_object().expect("fields by name");
        for f in named {
            assert!(
                fields[*f].as_str().is_some_and(|m| !m.is_empty()),
                "{f}: {body} -> {e}"
            );
        }
        assert!(!fields.contains_key("tenant"), "{body} -> {e}");
    }
    // Refused by name, each with what its field says (422): a blank value
    // is not the default ("start": "" is no time: found by Schemathesis,
    // which had it booked for now; leave a field out instead), a blank
    // field with no default gets its own message, and the API's start is
    // RFC 3339 with its zone (a local time, the form's kind, or "now"
    // would be guessed at).
    let share = json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 8, "hours": 1});
    let mig_1g = json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 1});
    let with = |base: &Value, field: &str, value: &str| {
        let mut body = base.clone();
        body[field] = json!(value);
        body
    };
    let mut refused = vec![
        (with(&share, "start", " "), "start", "empty"),
        (with(&share, "model", " "), "model", "empty"),
        (with(&share, "priority", " "), "priority", "empty"),
        (with(&mig_1g, "profile", ""), "profile", "1g.10gb"),
    ];
    for start in ["now", "2099-12-24T14:00", " 2099-12-24T14:00:00Z"] {
        refused.push((with(&mig_1g, "start", start), "start", "RFC 3339"));
    }
    for (body, field, needle) in refused {
        let (s, e) = w.book(&t, body.clone()).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {e}");
        assert!(
            e["fields"][field]
                .as_str()
                .is_some_and(|m| m.contains(needle)),
            "{body} -> {e}"
        );
    }
    assert_eq!(w.count("SELECT count(*) FROM bookings").await, 0);
    // Not JSON at all.
    let r = reqwest::Client::new()
        .post(w.app.url("/api/v1/bookings"))
        .bearer_auth(&t)
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e: Value = r.json().await.unwrap();
    assert!(e["message"].is_string());
    // Without a token.
    let r = reqwest::Client::new()
        .post(w.app.url("/api/v1/bookings"))
        .json(&mig("lab", "1g.10gb", 1))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn quota_is_checked_in_every_dimension_over_the_whole_window() {
    let w = World::new(FLEET).await;
    w.tenant(
        "lab",
        &[
            ("active", "2"),
            ("memory", "45"),
            ("slices", "3"),
            ("budget", "10"),
        ],
    )
    .await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;

    // Compute slices: a 4g is 4 of 3.
    let (s, e) = w.book(&t, mig("lab", "4g.40gb", 1)).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(
        e["message"].as_str().unwrap().contains("compute slices"),
        "{e}"
    );
    // Memory: 46 GiB of 45.
    let (s, e) = w
        .book(
            &t,
            json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 46, "hours": 1}),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(
        e["message"].as_str().unwrap().contains("GiB of GPU memory"),
        "{e}"
    );
    // Budget: 2 slices x 6 h = 12 slice-hours of 10.
    let (s, e) = w.book(&t, mig("lab", "2g.20gb", 6)).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert!(e["message"].as_str().unwrap().starts_with("budget:"), "{e}");
    // Active bookings: two fit, the third is refused with the count.
    assert_eq!(
        w.book(&t, mig("lab", "1g.10gb", 2)).await.0,
        StatusCode::CREATED
    );
    assert_eq!(
        w.book(&t, mig("lab", "1g.10gb", 2)).await.0,
        StatusCode::CREATED
    );
    let (s, e) = w.book(&t, mig("lab", "1g.10gb", 1)).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(
        e["message"],
        "quota: 2 of 2 active bookings in use during that time (lab)"
    );
    // After both end, the same tenant may book again: quota is about the
    // window, not about all bookings ever.
    let later = (time::OffsetDateTime::now_utc() + time::Duration::hours(3))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let (s, b) = w
        .book(&t, json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 1, "start": later}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(w.count("SELECT count(*) FROM bookings").await, 3);
}

#[tokio::test]
async fn nobody_sees_or_touches_another_tenants_booking() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    w.tenant("rival", &[]).await;
    let ana = w.person("ana@uni.edu", "none", &["lab"]).await;
    let bob = w.person("bob@uni.edu", "none", &["rival"]).await;
    let boss = w.person("boss@uni.edu", "none", &["rival:manager"]).await;
    let (_, b) = w.book(&ana, mig("lab", "1g.10gb", 1)).await;
    let id = b["id"].as_i64().unwrap();
    for t in [&bob, &boss] {
        let (s, e) = w
            .call(t, "GET", &format!("/api/v1/bookings/{id}"), None)
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{e}");
        let (s, _) = w
            .call(
                t,
                "POST",
                &format!("/api/v1/bookings/{id}/release"),
                Some(json!({"reason": "mine now"})),
            )
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let (s, _) = w
            .call(
                t,
                "POST",
                &format!("/api/v1/bookings/{id}/extend"),
                Some(json!({"hours": 1})),
            )
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let (_, list) = w.call(t, "GET", "/api/v1/bookings", None).await;
        assert_eq!(list["bookings"].as_array().unwrap().len(), 0);
        let (s, _) = w
            .call(t, "GET", "/api/v1/bookings?scope=tenant&tenant=lab", None)
            .await;
        assert_eq!(s, StatusCode::NOT_FOUND);
    }
    let (s, _) = w
        .call(&bob, "GET", "/api/v1/bookings?scope=all", None)
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(w.get(&ana, id).await["status"], "scheduled");
}

#[tokio::test]
async fn managers_and_admins_may_end_a_booking_with_a_reason_that_is_audited() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let ana = w.person("ana@uni.edu", "none", &["lab"]).await;
    let ta = w.person("ta@uni.edu", "none", &["lab:manager"]).await;
    let admin = w.person("root@uni.edu", "admin", &[]).await;
    let (_, b) = w.book(&ana, mig("lab", "1g.10gb", 1)).await;
    let id = b["id"].as_i64().unwrap();
    w.step().await;
    let (_, list) = w
        .call(&ta, "GET", "/api/v1/bookings?tenant=lab", None)
        .await;
    assert_eq!(list["bookings"][0]["id"], id);
    let (s, e) = w
        .call(&ta, "POST", &format!("/api/v1/bookings/{id}/release"), None)
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(e["message"].as_str().unwrap().contains("reason"));
    let (s, _) = w
        .call(
            &ta,
            "POST",
            &format!("/api/v1/bookings/{id}/extend"),
            Some(json!({"hours": 1})),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    // A reason is checked as sent, as the API document says: a trailing
    // newline is a control character (found by Schemathesis), and so is
    // refused with a sentence, changing nothing.
    let (s, e) = w
        .call(
            &admin,
            "POST",
            &format!("/api/v1/bookings/{id}/release"),
            Some(json!({"reason": "GPU maintenance\n"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("control characters"),
        "{e}"
    );
    let (s, b) = w
        .call(
            &admin,
            "POST",
            &format!("/api/v1/bookings/{id}/release"),
            Some(json!({"reason": "GPU maintenance"})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["status"], "releasing");
    let audit: (String, Value) = sqlx::query_as(
        "SELECT actor_email, detail FROM audit_log WHERE action = 'booking.force_release'",
    )
    .fetch_one(&w.app.pool)
    .await
    .unwrap();
    assert_eq!(audit.0, "root@uni.edu");
    assert_eq!(audit.1["reason"], "GPU maintenance");
    w.step().await;
    assert_eq!(w.get(&ana, id).await["status"], "released");
    assert!(w.instances().is_empty());
}

#[tokio::test]
async fn the_same_idempotency_key_makes_one_booking() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let send = || async {
        reqwest::Client::new()
            .post(w.app.url("/api/v1/bookings"))
            .bearer_auth(&t)
            .header("Idempotency-Key", "run-42")
            .json(&mig("lab", "1g.10gb", 1))
            .send()
            .await
            .unwrap()
    };
    let (a, b) = tokio::join!(send(), send());
    let mut codes = [a.status().as_u16(), b.status().as_u16()];
    codes.sort();
    assert_eq!(codes, [200, 201]);
    let a: Value = a.json().await.unwrap();
    let b: Value = b.json().await.unwrap();
    assert_eq!(a["id"], b["id"]);
    let r = send().await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["idempotent-replayed"], "true");
    assert_eq!(w.count("SELECT count(*) FROM bookings").await, 1);
}

#[tokio::test]
async fn a_malformed_idempotency_key_is_refused_and_books_nothing() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let long = "k".repeat(201);
    for key in ["run\t42", long.as_str()] {
        let r = reqwest::Client::new()
            .post(w.app.url("/api/v1/bookings"))
            .bearer_auth(&t)
            .header("Idempotency-Key", key)
            .json(&mig("lab", "1g.10gb", 1))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_client_error(), "{key:?}: {}", r.status());
        let body: Value = r.json().await.unwrap();
        assert!(body.to_string().contains("Idempotency-Key"), "{body}");
    }
    assert_eq!(w.count("SELECT count(*) FROM bookings").await, 0);
}

#[tokio::test]
async fn a_hundred_concurrent_posts_never_exceed_the_quota_nor_fail() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[("active", "5")]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let client = reqwest::Client::new();
    let mut tasks = Vec::new();
    for _ in 0..100 {
        let c = client.clone();
        let url = w.app.url("/api/v1/bookings");
        let t = t.clone();
        tasks.push(tokio::spawn(async move {
            c.post(url)
                .bearer_auth(t)
                .json(&mig("lab", "1g.10gb", 1))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    let mut created = 0;
    for task in tasks {
        let s = task.await.unwrap();
        assert!(!s.is_server_error(), "a 5xx under load: {s}");
        assert!(s == StatusCode::CREATED || s == StatusCode::CONFLICT, "{s}");
        if s == StatusCode::CREATED {
            created += 1;
        }
    }
    assert_eq!(created, 5);
    assert_eq!(w.count("SELECT count(*) FROM bookings").await, 5);
}

#[tokio::test]
async fn two_tenants_racing_for_the_last_slot_exactly_one_wins() {
    // One H100: a 7g takes all of it.
    let fleet =
        "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n";
    for round in 0..3 {
        let w = World::new(fleet).await;
        w.tenant("lab-a", &[]).await;
        w.tenant("lab-b", &[]).await;
        let ta = w.person("a@uni.edu", "none", &["lab-a"]).await;
        let tb = w.person("b@uni.edu", "none", &["lab-b"]).await;
        let (ra, rb) = tokio::join!(
            w.book(&ta, mig("lab-a", "7g.80gb", 1)),
            w.book(&tb, mig("lab-b", "7g.80gb", 1))
        );
        assert_eq!(ra.0, StatusCode::CREATED, "{}", ra.1);
        assert_eq!(rb.0, StatusCode::CREATED, "{}", rb.1);
        let mut statuses = [
            ra.1["status"].as_str().unwrap().to_string(),
            rb.1["status"].as_str().unwrap().to_string(),
        ];
        statuses.sort();
        assert_eq!(statuses, ["queued", "scheduled"], "round {round}");
        let queued = if ra.1["status"] == "queued" {
            &ra.1
        } else {
            &rb.1
        };
        assert!(
            queued["reason"]
                .as_str()
                .unwrap()
                .contains("earliest start"),
            "{queued}"
        );
        assert!(queued["earliest_start"].is_string());
    }
}

#[tokio::test]
async fn the_database_refuses_overlapping_mig_bookings_on_its_own() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let (_, b) = w.book(&t, mig("lab", "1g.10gb", 2)).await;
    let id = b["id"].as_i64().unwrap();
    // Copy it by hand onto an overlapping slot: the exclusion constraint says no.
    let r = sqlx::query(
        "INSERT INTO bookings (tenant_id, user_id, kind, model, profile, memory_gib, compute_slices,
                               priority, hours, during, status, gpu_id, slices)
         SELECT tenant_id, user_id, kind, model, profile, memory_gib, compute_slices, priority, hours,
                tstzrange(lower(during) + interval '1 hour', upper(during) + interval '1 hour'),
                'scheduled', gpu_id, slices
         FROM bookings WHERE id = $1",
    )
    .bind(id)
    .execute(&w.app.pool)
    .await;
    let e = r.unwrap_err();
    assert_eq!(
        e.as_database_error().and_then(|d| d.constraint()),
        Some("bookings_no_overlap")
    );
}

#[tokio::test]
async fn a_queued_booking_is_placed_when_capacity_frees() {
    let fleet =
        "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n";
    let w = World::new(fleet).await;
    w.tenant("lab-a", &[]).await;
    w.tenant("lab-b", &[]).await;
    let ta = w.person("a@uni.edu", "none", &["lab-a"]).await;
    let tb = w.person("b@uni.edu", "none", &["lab-b"]).await;
    let (_, first) = w.book(&ta, mig("lab-a", "4g.40gb", 2)).await;
    let (_, second) = w.book(&ta, mig("lab-a", "3g.40gb", 2)).await;
    assert_eq!(second["status"], "scheduled");
    let (s, waiting) = w.book(&tb, mig("lab-b", "4g.40gb", 1)).await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(waiting["status"], "queued");
    assert!(
        waiting["reason"]
            .as_str()
            .unwrap()
            .starts_with("no capacity on any GPU for 4g.40gb between"),
        "{waiting}"
    );
    let id = waiting["id"].as_i64().unwrap();
    // Nothing frees: the planner leaves it queued.
    assert_eq!(gpuslice::booking::plan_queue(&w.app.pool).await.unwrap(), 0);
    let first_id = first["id"].as_i64().unwrap();
    w.call(
        &ta,
        "POST",
        &format!("/api/v1/bookings/{first_id}/release"),
        None,
    )
    .await;
    assert_eq!(gpuslice::booking::plan_queue(&w.app.pool).await.unwrap(), 1);
    let b = w.get(&tb, id).await;
    assert_eq!(b["status"], "scheduled", "{b}");
    assert_eq!(b["placement"]["start"], 0);
    w.step().await;
    w.step().await;
    assert_eq!(w.get(&tb, id).await["status"], "active");
}

#[tokio::test]
async fn shares_respect_gpu_memory_and_the_share_limit() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let share = |gib: i32| json!({"tenant": "lab", "kind": "timeslice", "memory_gib": gib, "priority": "high", "hours": 1});
    let (s, b) = w.book(&t, share(30)).await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    assert_eq!(b["status"], "scheduled");
    assert_eq!(b["model"], "L40S-48GB");
    assert_eq!(b["priority"], "high");
    assert_eq!(b["compute_slices"], 5); // 30 of 48 GiB, in sevenths, rounded up
                                        // 20 more GiB do not fit in the 18 left: queued.
    let (_, b2) = w.book(&t, share(20)).await;
    assert_eq!(b2["status"], "queued", "{b2}");
    // Two small ones fit, then the share limit (3) is reached.
    assert_eq!(w.book(&t, share(8)).await.1["status"], "scheduled");
    assert_eq!(w.book(&t, share(8)).await.1["status"], "scheduled");
    assert_eq!(w.book(&t, share(1)).await.1["status"], "queued");
    w.step().await;
    w.step().await;
    let id = b["id"].as_i64().unwrap();
    let b = w.get(&t, id).await;
    assert_eq!(b["status"], "active");
    assert!(b["device_uuid"].as_str().unwrap().starts_with("GPU-"));
}

#[tokio::test]
async fn a_booking_ahead_waits_for_its_start_and_can_be_cancelled() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let start = (time::OffsetDateTime::now_utc() + time::Duration::hours(5))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let (s, b) = w
        .book(&t, json!({"tenant": "lab", "kind": "mig", "profile": "2g.20gb", "hours": 2, "start": start}))
        .await;
    assert_eq!(s, StatusCode::CREATED, "{b}");
    let id = b["id"].as_i64().unwrap();
    assert_eq!(w.step().await, 0);
    assert_eq!(w.get(&t, id).await["status"], "scheduled");
    assert!(w.instances().is_empty());
    let (s, b) = w
        .call(
            &t,
            "POST",
            &format!("/api/v1/bookings/{id}/extend"),
            Some(json!({"hours": 3})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["hours"], 5);
    let (_, b) = w
        .call(&t, "POST", &format!("/api/v1/bookings/{id}/release"), None)
        .await;
    assert_eq!(b["status"], "cancelled");
}

#[tokio::test]
async fn extension_stops_at_the_next_booking_of_the_slot() {
    let fleet =
        "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n";
    let w = World::new(fleet).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let (_, now) = w.book(&t, mig("lab", "7g.80gb", 2)).await;
    let later = (time::OffsetDateTime::now_utc() + time::Duration::hours(3))
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let (_, next) = w
        .book(&t, json!({"tenant": "lab", "kind": "mig", "profile": "7g.80gb", "hours": 1, "start": later}))
        .await;
    assert_eq!(next["status"], "scheduled", "{next}");
    let id = now["id"].as_i64().unwrap();
    let (s, e) = w
        .call(
            &t,
            "POST",
            &format!("/api/v1/bookings/{id}/extend"),
            Some(json!({"hours": 2})),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("booked by someone else"),
        "{e}"
    );
    assert_eq!(w.get(&t, id).await["hours"], 2);
}

#[tokio::test]
async fn the_worker_warns_before_the_end_and_expires_at_the_end() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let (_, b) = w.book(&t, mig("lab", "1g.10gb", 1)).await;
    let id = b["id"].as_i64().unwrap();
    w.step().await;
    // Move the end into the warning time.
    sqlx::query("UPDATE bookings SET during = tstzrange(lower(during), now() + interval '5 minutes') WHERE id = $1")
        .bind(id)
        .execute(&w.app.pool)
        .await
        .unwrap();
    w.step().await;
    let warned: String = sqlx::query_scalar(
        "SELECT reason FROM booking_events WHERE booking_id = $1 ORDER BY id DESC LIMIT 1",
    )
    .bind(id)
    .fetch_one(&w.app.pool)
    .await
    .unwrap();
    assert!(warned.contains("save your work"), "{warned}");
    assert_eq!(w.step().await, 0, "one warning only");
    // And past the end.
    sqlx::query("UPDATE bookings SET during = tstzrange(lower(during) - interval '2 hours', now() - interval '1 second') WHERE id = $1")
        .bind(id)
        .execute(&w.app.pool)
        .await
        .unwrap();
    w.step().await;
    assert_eq!(w.get(&t, id).await["status"], "expired");
    assert!(w.instances().is_empty());
}

#[tokio::test]
async fn reconcile_removes_strays_and_recreates_what_a_booking_should_have() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let (_, b) = w.book(&t, mig("lab", "3g.40gb", 1)).await;
    let id = b["id"].as_i64().unwrap();
    w.step().await;
    let device = w.get(&t, id).await["device_uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let gpus = w.node.inventory().unwrap();
    // A stray instance nobody booked, on the other GPU.
    let other = gpus
        .iter()
        .find(|g| g.mig_current && Some(g.uuid.as_str()) != b["gpu"].as_str())
        .unwrap();
    w.node
        .create_instance(&other.uuid, 19, Placement { start: 0, size: 1 })
        .unwrap();
    // And the booking's own instance vanishes.
    let gpu = b["gpu"].as_str().unwrap().to_string();
    let mine = w.node.instances(&gpu).unwrap()[0].gi_id;
    w.node
        .destroy_instance(&gpu, mine, std::time::Duration::ZERO)
        .unwrap();

    let backend: Arc<dyn GpuBackend> = w.node.clone();
    let (removed, recreated) =
        worker::reconcile(&w.app.pool, "n1", backend, &worker::Settings::default())
            .await
            .unwrap();
    assert_eq!((removed, recreated), (1, 1));
    assert!(w.node.instances(&other.uuid).unwrap().is_empty());
    let b = w.get(&t, id).await;
    assert_eq!(b["status"], "active");
    assert_ne!(b["device_uuid"].as_str().unwrap(), device);
    assert_eq!(w.node.instances(&gpu).unwrap().len(), 1);
    assert_eq!(
        w.count("SELECT count(*) FROM audit_log WHERE action = 'reconcile.remove_instance'")
            .await,
        1
    );
}

#[tokio::test]
async fn a_failing_create_is_retried_then_fails_with_a_reason() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let (_, b) = w.book(&t, mig("lab", "1g.10gb", 1)).await;
    let id = b["id"].as_i64().unwrap();
    w.node.fail_next_create("the driver is busy");
    w.step().await;
    let b = w.get(&t, id).await;
    assert_eq!(b["status"], "provisioning");
    assert!(
        b["reason"].as_str().unwrap().contains("the driver is busy"),
        "{b}"
    );
    // Retried after the backoff: make it due now, and it succeeds.
    sqlx::query("UPDATE bookings SET next_attempt_at = now() WHERE id = $1")
        .bind(id)
        .execute(&w.app.pool)
        .await
        .unwrap();
    w.step().await;
    assert_eq!(w.get(&t, id).await["status"], "active");

    // A create that keeps failing fails the booking after the last attempt.
    let (_, b) = w.book(&t, mig("lab", "1g.10gb", 1)).await;
    let id = b["id"].as_i64().unwrap();
    for _ in 0..5 {
        w.node.fail_next_create("no luck");
        sqlx::query("UPDATE bookings SET next_attempt_at = now() WHERE id = $1")
            .bind(id)
            .execute(&w.app.pool)
            .await
            .unwrap();
        w.step().await;
    }
    w.step().await;
    let b = w.get(&t, id).await;
    assert_eq!(b["status"], "failed", "{b}");
    assert!(b["reason"].as_str().unwrap().contains("no luck"), "{b}");
}

#[tokio::test]
async fn offerings_list_what_the_fleet_has_with_room_now() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    w.book(&t, mig("lab", "7g.80gb", 1)).await;
    let (s, o) = w.call(&t, "GET", "/api/v1/offerings", None).await;
    assert_eq!(s, StatusCode::OK);
    let list = o["offerings"].as_array().unwrap();
    let seven = list.iter().find(|o| o["profile"] == "7g.80gb").unwrap();
    assert_eq!(
        (seven["gpus"].as_i64(), seven["available_now"].as_i64()),
        (Some(2), Some(1))
    );
    let share = list.iter().find(|o| o["kind"] == "timeslice").unwrap();
    assert_eq!(share["model"], "L40S-48GB");
    assert_eq!(share["available_now"], 1);
}

#[tokio::test]
async fn the_queue_serves_priority_first_then_takes_turns_across_tenants() {
    let fleet =
        "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n";
    let w = World::new(fleet).await;
    w.tenant("lab-a", &[]).await;
    w.tenant("lab-b", &[]).await;
    w.tenant("lab-c", &[("priority", "high")]).await;
    let a = w.person("a@uni.edu", "none", &["lab-a"]).await;
    let b = w.person("b@uni.edu", "none", &["lab-b"]).await;
    let c = w.person("c@uni.edu", "none", &["lab-c"]).await;
    let id = |v: &Value| v["id"].as_i64().unwrap();
    let (_, holder) = w.book(&a, mig("lab-a", "7g.80gb", 1)).await;
    assert_eq!(holder["status"], "scheduled");
    // Submitted in this order: A1, A2, B1, C1 (C's tenant has high priority).
    let (_, a1) = w.book(&a, mig("lab-a", "7g.80gb", 1)).await;
    let (_, a2) = w.book(&a, mig("lab-a", "7g.80gb", 1)).await;
    let (_, b1) = w.book(&b, mig("lab-b", "7g.80gb", 1)).await;
    let (_, c1) = w.book(&c, mig("lab-c", "7g.80gb", 1)).await;
    for q in [&a1, &a2, &b1, &c1] {
        assert_eq!(q["status"], "queued");
    }
    assert_eq!(c1["priority"], "high");
    // Each time the GPU frees, the planner places exactly one: C1 (high),
    // then B1 (A just had the GPU, B never did), then A1, then A2.
    let mut running = (a.clone(), id(&holder));
    for (token, next) in [(&c, &c1), (&b, &b1), (&a, &a1), (&a, &a2)] {
        let (s, _) = w
            .call(
                &running.0,
                "POST",
                &format!("/api/v1/bookings/{}/release", running.1),
                None,
            )
            .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(gpuslice::booking::plan_queue(&w.app.pool).await.unwrap(), 1);
        assert_eq!(
            w.get(token, id(next)).await["status"],
            "scheduled",
            "{next}"
        );
        running = (token.clone(), id(next));
    }
}

/// The schema repeats the placed live statuses in SQL (the exclusion
/// constraint and the live index); they must be the Rust list's.
#[tokio::test]
async fn the_schema_and_the_rules_agree_on_which_statuses_are_live() {
    use gpuslice::domain::booking::Status;
    let app = TestApp::spawn().await;
    let placed: std::collections::BTreeSet<String> = Status::ALL
        .into_iter()
        .filter(|s| s.is_placed())
        .map(|s| s.as_str().to_string())
        .collect();
    let quoted = |def: &str| -> std::collections::BTreeSet<String> {
        let inside = def
            .split("ARRAY[")
            .nth(1)
            .unwrap()
            .split(']')
            .next()
            .unwrap();
        inside
            .split(',')
            .map(|w| w.split('\'').nth(1).unwrap().to_string())
            .collect()
    };
    let constraint: String = app
        .one("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'bookings_no_overlap'")
        .await;
    assert_eq!(quoted(&constraint), placed, "{constraint}");
    let index: String = app
        .one("SELECT indexdef FROM pg_indexes WHERE indexname = 'bookings_live_idx'")
        .await;
    assert_eq!(quoted(&index), placed, "{index}");
    // Every status the rules know is one the schema accepts, and no other.
    let check: String = app
        .one("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'bookings_status_check'")
        .await;
    let all: std::collections::BTreeSet<String> =
        Status::ALL.iter().map(|s| s.as_str().to_string()).collect();
    assert_eq!(quoted(&check), all, "{check}");
}

#[tokio::test]
async fn extending_needs_an_owner_who_is_still_a_member_of_a_live_tenant() {
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    w.tenant("old", &[]).await;
    let ana = w.person("ana@uni.edu", "none", &["lab", "old"]).await;
    let root = w.person("root@uni.edu", "admin", &[]).await;
    let (_, a) = w.book(&ana, mig("lab", "1g.10gb", 1)).await;
    let (_, b) = w.book(&ana, mig("old", "1g.10gb", 1)).await;
    let (a, b) = (a["id"].as_i64().unwrap(), b["id"].as_i64().unwrap());
    let extend = |id: i64| format!("/api/v1/bookings/{id}/extend");
    // Ana leaves lab: nobody may give her booking there more time.
    let uid: i64 = w
        .count("SELECT id FROM users WHERE email = 'ana@uni.edu'")
        .await;
    let lab: i64 = w.count("SELECT id FROM tenants WHERE slug = 'lab'").await;
    gpuslice::db::users::remove_membership(&w.app.pool, uid, lab)
        .await
        .unwrap();
    let (s, e) = w
        .call(&root, "POST", &extend(a), Some(json!({"hours": 1})))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("no longer an active member"),
        "{e}"
    );
    // Tenant old is archived: its bookings are not extended either.
    sqlx::query("UPDATE tenants SET archived = true WHERE slug = 'old'")
        .execute(&w.app.pool)
        .await
        .unwrap();
    let (s, e) = w
        .call(&ana, "POST", &extend(b), Some(json!({"hours": 1})))
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{e}");
    assert!(e["message"].as_str().unwrap().contains("archived"), "{e}");
    // Neither end moved.
    assert_eq!(
        w.count("SELECT count(*) FROM bookings WHERE hours <> 1")
            .await,
        0
    );
}

/// Bookings ahead move to another GPU or slot of their model to let a new
/// booking in: in the same transaction, same window and profile, written
/// on their timeline, shown to their owner; never within ten minutes of
/// their start (nor, then, once live).
#[tokio::test]
async fn bookings_ahead_move_to_let_a_new_booking_in() {
    use time::format_description::well_known::Rfc3339;
    let w = World::new(FLEET).await;
    w.tenant("lab", &[]).await;
    let t = w.person("ana@uni.edu", "none", &["lab"]).await;
    let pool = &w.app.pool;
    let gpus: Vec<(i64, String)> =
        sqlx::query_as("SELECT id, uuid FROM gpus WHERE model = 'H100-80GB' ORDER BY id")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(gpus.len(), 2);
    let at = |d: time::Duration| {
        (time::OffsetDateTime::now_utc() + d)
            .format(&Rfc3339)
            .unwrap()
    };
    let ahead = |profile: &str, start: &str| json!({"tenant": "lab", "kind": "mig", "profile": profile, "hours": 3, "start": start});
    // Two 3g.40gb bookings, each alone on a GPU at slice 0 (the engine
    // would have packed them on one GPU; the layout is set by hand, in one
    // statement, the way bookings made and ended over time can leave it).
    let (g0, g1) = (gpus[0].0, gpus[1].0);
    let spread = |a: i64, b: i64| async move {
        sqlx::query(
            "UPDATE bookings SET gpu_id = CASE WHEN id = $1 THEN $3 ELSE $4 END, slices = '[0,4)'
             WHERE id IN ($1, $2)",
        )
        .bind(a)
        .bind(b)
        .bind(g0)
        .bind(g1)
        .execute(pool)
        .await
        .unwrap();
    };
    let start = at(time::Duration::hours(5));
    let (_, a) = w.book(&t, ahead("3g.40gb", &start)).await;
    let (_, b) = w.book(&t, ahead("3g.40gb", &start)).await;
    let (a, b) = (a["id"].as_i64().unwrap(), b["id"].as_i64().unwrap());
    spread(a, b).await;
    let before: Vec<(i64, String, String)> = sqlx::query_as(
        "SELECT id, during::text, profile FROM bookings WHERE id IN ($1, $2) ORDER BY id",
    )
    .bind(a)
    .bind(b)
    .fetch_all(pool)
    .await
    .unwrap();

    // A whole GPU for the same hours: no GPU is free, one is once its
    // 3g.40gb moves to the other's free half.
    let (s, c) = w.book(&t, ahead("7g.80gb", &start)).await;
    assert_eq!(s, StatusCode::CREATED, "{c}");
    assert_eq!(c["status"], "scheduled", "{c}");
    let c_gpu = c["gpu"].as_str().unwrap().to_string();
    let after: Vec<(i64, i64, i32, String, String)> = sqlx::query_as(
        "SELECT b.id, b.gpu_id, lower(b.slices), b.during::text, b.profile FROM bookings b
         WHERE b.id IN ($1, $2) ORDER BY b.id",
    )
    .bind(a)
    .bind(b)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        after[0].1, after[1].1,
        "the two 3g.40gb now share a GPU: {after:?}"
    );
    let mut starts = [after[0].2, after[1].2];
    starts.sort();
    assert_eq!(starts, [0, 4]);
    let shared_uuid = &gpus.iter().find(|g| g.0 == after[0].1).unwrap().1;
    assert_ne!(&c_gpu, shared_uuid, "the whole GPU is the other one");
    for (x, y) in before.iter().zip(&after) {
        assert_eq!((&x.1, &x.2), (&y.3, &y.4), "window and profile stay");
    }
    // Exactly one moved, and its timeline and page say so.
    let moved: Vec<(i64, String, String, Option<String>, String)> = sqlx::query_as(
        "SELECT booking_id, actor, to_status, from_status, reason FROM booking_events
         WHERE booking_id IN ($1, $2) AND reason LIKE 'moved to %'",
    )
    .bind(a)
    .bind(b)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(moved.len(), 1, "{moved:?}");
    let (id, actor, to, from, reason) = &moved[0];
    assert_eq!(
        (actor.as_str(), to.as_str(), from.as_deref()),
        ("planner", "scheduled", Some("scheduled"))
    );
    assert!(reason.contains(shared_uuid.as_str()), "{reason}");
    let view = w.get(&t, *id).await;
    assert_eq!(view["gpu"].as_str(), Some(shared_uuid.as_str()), "{view}");
    assert_eq!(view["placement"]["start"], 4, "{view}");
    // Its owner is told by e-mail, naming only their own booking's new GPU;
    // its row's change time moved (calendar feeds read it).
    let mails: Vec<(String, String)> = sqlx::query_as(
        "SELECT subject, body FROM notifications WHERE booking_id = $1 AND channel = 'email'",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    let moved_mail: Vec<_> = mails
        .iter()
        .filter(|(s, _)| s.contains("moved to another GPU or slot"))
        .collect();
    assert_eq!(moved_mail.len(), 1, "{mails:?}");
    assert!(moved_mail[0].1.contains(shared_uuid.as_str()), "{mails:?}");
    let fresh: bool = w
        .app
        .one(&format!(
            "SELECT updated_at > created_at FROM bookings WHERE id = {id}"
        ))
        .await;
    assert!(fresh, "a move bumps updated_at");

    // Two 3g.40gb spread over both GPUs from `start` (claimed by a worker
    // when `claim` says so); a whole GPU for the same hours must then wait,
    // and neither 3g.40gb moves.
    let (w, t) = (&w, &t);
    let stays_put = |start: String, claim: bool| async move {
        let (_, d) = w.book(t, ahead("3g.40gb", &start)).await;
        let (_, e) = w.book(t, ahead("3g.40gb", &start)).await;
        let (d, e) = (d["id"].as_i64().unwrap(), e["id"].as_i64().unwrap());
        spread(d, e).await;
        if claim {
            sqlx::query("UPDATE bookings SET lease_owner = 'node-a', lease_until = now() + interval '1 minute' WHERE id IN ($1, $2)")
                .bind(d)
                .bind(e)
                .execute(pool)
                .await
                .unwrap();
        }
        let (s, f) = w.book(t, ahead("7g.80gb", &start)).await;
        assert_eq!(s, StatusCode::CREATED, "{f}");
        assert_eq!(f["status"], "queued", "{f}");
        let moves: i64 = w
            .app
            .one(&format!(
                "SELECT count(*) FROM booking_events WHERE booking_id IN ({d}, {e}) AND reason LIKE 'moved to %'"
            ))
            .await;
        assert_eq!(moves, 0);
    };
    // Ten minutes before their start, bookings ahead stay where they are:
    // the same layout five minutes ahead leaves the whole GPU waiting.
    stays_put(at(time::Duration::minutes(5)), false).await;
    // A booking a worker has claimed stays put however far ahead it starts.
    stays_put(at(time::Duration::hours(30)), true).await;
}
