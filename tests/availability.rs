//! The availability timeline and `GET /api/v1/availability`: what they
//! show as free is what a booking then gets, for MIG profiles and for
//! time-sliced shares; bad questions get 422 with a message per field.

mod common;

use common::{SimNode, TestApp};
use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

const FLEET: &str = r#"
[[node]]
name = "a1"
[[node.gpu]]
model = "H100-80GB"
mode = "mig"
count = 1
[[node.gpu]]
model = "H100-80GB"
mode = "timeslice"
count = 1
"#;

async fn setup() -> (TestApp, String) {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    sqlx::query(
        "UPDATE tenants SET max_active_bookings = 20, max_gpu_memory_gib = 1000, max_compute_slices = 100",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    app.user("ana@uni.edu", "none", &["lab"]).await;
    SimNode::register(&app, FLEET, "a1", 4).await;
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    (app, token)
}

async fn get(app: &TestApp, token: &str, query: &str) -> (u16, Value) {
    let r = app
        .client()
        .get(app.url(&format!("/api/v1/availability?{query}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn book(app: &TestApp, token: &str, body: Value) -> Value {
    let r = app
        .client()
        .post(app.url("/api/v1/bookings"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    r.json().await.unwrap()
}

fn at(v: &Value) -> OffsetDateTime {
    OffsetDateTime::parse(v.as_str().unwrap(), &Rfc3339).unwrap()
}

fn stamp(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap()
}

/// The free stretches of the one GPU in an answer.
fn stretches(answer: &Value) -> Vec<(OffsetDateTime, OffsetDateTime)> {
    let gpus = answer["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 1, "{answer}");
    gpus[0]["free"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (at(&s["start"]), at(&s["end"])))
        .collect()
}

#[tokio::test]
async fn a_mig_profile_is_free_where_the_timeline_says_and_a_booking_there_is_placed() {
    let (app, token) = setup().await;
    // Empty: free from now for the next 7 days.
    let (status, empty) = get(&app, &token, "profile=3g.40gb").await;
    assert_eq!(status, 200, "{empty}");
    let free = stretches(&empty);
    assert_eq!(free.len(), 1);
    assert_eq!(free[0].1 - free[0].0, Duration::days(7));
    assert_eq!(empty["gpus"][0]["node"], "a1");
    assert_eq!(empty["profile"], "3g.40gb");

    // The whole GPU for 3 hours from now: a 3g.40gb fits only after it.
    let whole = book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "7g.80gb", "hours": 3}),
    )
    .await;
    let whole_end = at(&whole["end"]);
    let (_, after) = get(&app, &token, "profile=3g.40gb&model=H100-80GB").await;
    let free = stretches(&after);
    assert_eq!(free.len(), 1, "{after}");
    assert_eq!(free[0].0, whole_end, "free from the whole GPU's end");

    // Asking now, where the timeline shows nothing: the booking waits.
    let now = book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "3g.40gb", "hours": 1}),
    )
    .await;
    assert_eq!(now["status"], "queued", "{now}");
    // At the start of the free stretch: placed on that GPU.
    let later = book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "3g.40gb", "start": stamp(free[0].0), "hours": 2}),
    )
    .await;
    assert_eq!(later["status"], "scheduled", "{later}");
    assert_eq!(later["gpu"], after["gpus"][0]["uuid"]);

    // Two 3g.40gb fit side by side; a third over the same hours does not:
    // the timeline then leaves those hours out, and a booking there waits.
    book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "3g.40gb", "start": stamp(free[0].0), "hours": 2}),
    )
    .await;
    let (_, full) = get(&app, &token, "profile=3g.40gb").await;
    let free = stretches(&full);
    assert!(!free.is_empty(), "free again after both: {full}");
    assert!(
        free.iter()
            .all(|s| s.1 <= whole_end || s.0 >= whole_end + Duration::hours(2)),
        "{full}"
    );
    let third = book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "3g.40gb", "start": stamp(whole_end + Duration::minutes(30)), "hours": 1}),
    )
    .await;
    assert_eq!(third["status"], "queued", "{third}");
    // Two 3g.40gb hold all eight memory slices: not even a 1g.10gb fits
    // until they end.
    let (_, small) = get(&app, &token, "profile=1g.10gb").await;
    assert_eq!(
        stretches(&small),
        vec![(whole_end + Duration::hours(2), at(&small["to"]))],
        "{small}"
    );
}

#[tokio::test]
async fn a_share_is_free_where_the_timeline_says() {
    let (app, token) = setup().await;
    let big = book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 70, "hours": 2}),
    )
    .await;
    let end = at(&big["end"]);
    let (status, answer) = get(&app, &token, "memory_gib=20").await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["memory_gib"], 20);
    let free = stretches(&answer);
    assert_eq!(free[0].0, end, "{answer}");
    // 8 GiB still fits beside the 70 GiB share now.
    let (_, small) = get(&app, &token, "memory_gib=8").await;
    assert!(stretches(&small)[0].0 <= OffsetDateTime::now_utc());
    let placed = book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 20, "start": stamp(end), "hours": 1}),
    )
    .await;
    assert_eq!(placed["status"], "scheduled", "{placed}");
    let waits = book(
        &app,
        &token,
        json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 20, "hours": 1}),
    )
    .await;
    assert_eq!(waits["status"], "queued", "{waits}");
}

#[tokio::test]
async fn bad_questions_are_refused_with_a_message_per_field() {
    let (app, token) = setup().await;
    for (query, field) in [
        ("", "profile"),
        ("profile=1g.10gb&memory_gib=8", "profile"),
        ("profile=9g.1tb", "profile"),
        ("memory_gib=0", "memory_gib"),
        ("profile=1g.10gb&model=Voodoo2", "model"),
        ("profile=1g.10gb&from=yesterday", "from"),
        ("profile=1g.10gb&to=2001-01-01T00:00:00Z", "to"),
        ("profile=1g.10gb&to=2099-01-01T00:00:00Z", "to"),
    ] {
        let (status, body) = get(&app, &token, query).await;
        assert_eq!(status, 422, "{query}: {body}");
        assert!(body["fields"][field].is_string(), "{query}: {body}");
    }
    let r = app
        .client()
        .get(app.url("/api/v1/availability?profile=1g.10gb"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}

#[tokio::test]
async fn the_booking_form_shows_the_timeline() {
    let (app, _) = setup().await;
    let web = app.signed_in("ana@uni.edu").await;
    let form = app.text(&web, "/bookings/new").await;
    assert!(form.contains(r#"hx-get="/bookings/timeline""#), "{form}");
    let fragment = app
        .text(
            &web,
            "/bookings/timeline?kind=mig&model=&profile=1g.10gb&memory_gib=&tz_offset_minutes=-60",
        )
        .await;
    assert!(fragment.contains("<svg class=\"timeline\""), "{fragment}");
    assert!(fragment.contains("data-fill-start=\""), "{fragment}");
    assert!(fragment.contains("a1 #0 H100-80GB"), "{fragment}");
    let share = app
        .text(&web, "/bookings/timeline?kind=timeslice&memory_gib=")
        .await;
    assert!(share.contains("Enter the share"), "{share}");
    let bad = app
        .text(&web, "/bookings/timeline?kind=timeslice&memory_gib=5000")
        .await;
    assert!(
        bad.contains("No timeline: a share") && bad.contains("from 1 to 1024"),
        "{bad}"
    );
}

#[tokio::test]
async fn a_tenant_sees_only_what_it_may_book() {
    let (app, token) = setup().await;
    app.tenant("other").await;
    sqlx::query(
        "UPDATE tenants SET allowed_models = '{A100-80GB}', allowed_profiles = '{1g.10gb,2g.20gb}' WHERE slug = 'lab'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    // Its allowed models hold no GPU of this fleet: nothing is free for it.
    let (status, none) = get(&app, &token, "profile=1g.10gb&tenant=lab").await;
    assert_eq!(status, 200, "{none}");
    assert_eq!(none["gpus"], json!([]), "{none}");
    // Without the tenant, capacity as such.
    let (_, all) = get(&app, &token, "profile=1g.10gb").await;
    assert_eq!(all["gpus"].as_array().unwrap().len(), 1);
    let (status, body) = get(&app, &token, "profile=3g.40gb&tenant=lab").await;
    assert_eq!(status, 422, "{body}");
    assert!(body["fields"]["profile"]
        .as_str()
        .unwrap()
        .contains("may not book"));
    let (status, body) = get(&app, &token, "profile=1g.10gb&model=H100-80GB&tenant=lab").await;
    assert_eq!(status, 422, "{body}");
    assert!(body["fields"]["model"].is_string());
    // Someone else's tenant: as if it did not exist.
    let (status, _) = get(&app, &token, "profile=1g.10gb&tenant=other").await;
    assert_eq!(status, 404);
    let (status, _) = get(&app, &token, "profile=1g.10gb&tenant=nope").await;
    assert_eq!(status, 404);
}
