//! The booking pages: the form re-renders with a message per field, a good
//! booking lands on its page, live fragments for htmx, release and force
//! release, and the API description matches the routes.

mod common;

use std::sync::Arc;

use common::TestApp;
use gpuslice::gpu::fleet::Fleet;
use gpuslice::gpu::sim::SimBackend;
use gpuslice::gpu::GpuBackend;
use reqwest::StatusCode;
use serde_json::Value;

async fn world() -> (TestApp, Arc<SimBackend>) {
    let app = TestApp::spawn().await;
    let node = common::SimNode::register_fleet(&app, &Fleet::demo(), "gpu-node-1", 4)
        .await
        .backend;
    app.tenant("lab").await;
    (app, node)
}

async fn step(app: &TestApp, node: &Arc<SimBackend>) {
    let b: Arc<dyn GpuBackend> = node.clone();
    gpuslice::worker::bookings::step(
        &app.pool,
        "gpu-node-1",
        "t",
        b,
        &gpuslice::worker::bookings::Settings::default(),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn the_form_books_and_the_booking_page_shows_how_to_use_it() {
    let (app, node) = world().await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let c = app.signed_in("ana@uni.edu").await;
    let form = c.get(app.url("/bookings/new")).send().await.unwrap();
    assert_eq!(form.status(), StatusCode::OK);
    let body = form.text().await.unwrap();
    assert!(
        body.contains("1g.10gb") && body.contains("H100-80GB"),
        "the form offers the fleet's profiles"
    );
    assert!(body.contains("Free right now"));

    // Bad input: 422, the form again with a message per field, nothing booked.
    let r = app
        .post_form(
            &c,
            "/bookings/new",
            "/bookings",
            &[
                ("tenant", "lab"),
                ("kind", "mig"),
                ("profile", "9g.99gb"),
                ("start", "soon"),
                ("hours", "zero"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = r.text().await.unwrap();
    assert!(body.contains("Please correct the 3 field(s)"), "{body}");
    assert!(
        body.contains("no GPU model has a MIG profile &quot;9g.99gb&quot;")
            || body.contains("no GPU model has a MIG profile &#34;9g.99gb&#34;"),
        "{body}"
    );
    assert!(body.contains("value=\"soon\""), "input is kept");
    assert_eq!(app.one::<i64>("SELECT count(*) FROM bookings").await, 0);

    // Over quota (default: 24 h at most): the form with the refusal.
    let r = app
        .post_form(
            &c,
            "/bookings/new",
            "/bookings",
            &[
                ("tenant", "lab"),
                ("kind", "mig"),
                ("profile", "1g.10gb"),
                ("hours", "30"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("at most 24 hours"));

    let r = app
        .post_form(
            &c,
            "/bookings/new",
            "/bookings",
            &[
                ("tenant", "lab"),
                ("kind", "mig"),
                ("model", "H100-80GB"),
                ("profile", "1g.10gb"),
                ("start", ""),
                ("hours", "2"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let at = r.headers()["location"].to_str().unwrap().to_string();
    let id: i64 = at.trim_start_matches("/bookings/").parse().unwrap();
    let page = c
        .get(app.url(&at))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Booked: H100-80GB 1g.10gb"), "flash message");
    assert!(page.contains("status-scheduled"));
    assert!(
        page.contains("hx-trigger=\"every 3s\""),
        "a live booking polls"
    );

    step(&app, &node).await;
    // The htmx poll gets the fragment only, now with the device.
    let frag = c
        .get(app.url(&at))
        .header("HX-Request", "true")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!frag.contains("<html"), "a fragment, not a page");
    let device: String = sqlx::query_scalar("SELECT device_uuid FROM bookings WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert!(
        frag.contains(&format!("CUDA_VISIBLE_DEVICES={device}")),
        "{frag}"
    );
    assert!(
        frag.contains("docker run --rm --cgroup-parent=/gpuslice-"),
        "{frag}"
    );
    assert!(frag.contains(&format!("/booking-{id} --gpus")), "{frag}");
    assert!(frag.contains("Release now"));

    // The dashboard lists it with live rows.
    let dash = c
        .get(app.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(dash.contains(&format!("/bookings/{id}")));
    assert!(dash.contains("Compute slices"), "quota bars");
    let rows = c
        .get(app.url("/bookings?scope=mine"))
        .header("HX-Request", "true")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(rows.starts_with("<tbody"), "{rows}");
    assert!(rows.contains("status-active"));

    // Extend, then release.
    let r = app
        .post_form(&c, &at, &format!("{at}/extend"), &[("hours", "1")])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let hours: i32 = sqlx::query_scalar("SELECT hours FROM bookings WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(hours, 3);
    let r = app
        .post_form(&c, &at, &format!("{at}/extend"), &[("hours", "99")])
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("at most 24 hours"));
    let r = app.post_form(&c, &at, &format!("{at}/release"), &[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    step(&app, &node).await;
    let page = c
        .get(app.url(&at))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("status-released"));
    assert!(
        !page.contains("hx-trigger=\"every 3s\""),
        "a finished booking stops polling"
    );
}

#[tokio::test]
async fn booking_pages_are_for_the_owner_the_managers_and_admins_only() {
    let (app, _node) = world().await;
    app.tenant("rival").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    app.user("ta@uni.edu", "none", &["lab:manager"]).await;
    app.user("bob@uni.edu", "none", &["rival"]).await;
    app.user("peer@uni.edu", "none", &["lab"]).await;
    app.user("root@uni.edu", "admin", &[]).await;
    let ana = app.signed_in("ana@uni.edu").await;
    let r = app
        .post_form(
            &ana,
            "/bookings/new",
            "/bookings",
            &[
                ("tenant", "lab"),
                ("kind", "mig"),
                ("profile", "1g.10gb"),
                ("hours", "1"),
            ],
        )
        .await;
    let at = r.headers()["location"].to_str().unwrap().to_string();

    for who in ["bob@uni.edu", "peer@uni.edu"] {
        let c = app.signed_in(who).await;
        assert_eq!(
            c.get(app.url(&at)).send().await.unwrap().status(),
            StatusCode::NOT_FOUND,
            "{who}"
        );
        let r = app
            .post_form(&c, "/", &format!("{at}/release"), &[("reason", "x")])
            .await;
        assert_eq!(r.status(), StatusCode::NOT_FOUND, "{who}");
        let r = c
            .get(app.url("/bookings?scope=tenant&tenant=lab"))
            .send()
            .await
            .unwrap();
        assert!(
            r.status() == StatusCode::NOT_FOUND || r.status() == StatusCode::FORBIDDEN,
            "{who}"
        );
    }
    // The manager sees it and may end it with a reason.
    let ta = app.signed_in("ta@uni.edu").await;
    let list = ta
        .get(app.url("/bookings?scope=tenant&tenant=lab"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(list.contains(&at));
    let page = ta
        .get(app.url(&at))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Force release"));
    let r = app
        .post_form(&ta, &at, &format!("{at}/release"), &[("reason", "")])
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("say why"));
    // The admin sees every booking.
    let root = app.signed_in("root@uni.edu").await;
    let all = root
        .get(app.url("/bookings?scope=all"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(all.contains(&at));
    let r = app
        .post_form(
            &root,
            &at,
            &format!("{at}/release"),
            &[("reason", "maintenance window")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        app.one::<String>("SELECT status FROM bookings").await,
        "cancelled"
    );
    assert_eq!(
        app.one::<i64>("SELECT count(*) FROM audit_log WHERE action = 'booking.force_release'")
            .await,
        1
    );
    // A form without the CSRF token changes nothing.
    let r = ana
        .post(app.url("/bookings"))
        .form(&[
            ("tenant", "lab"),
            ("kind", "mig"),
            ("profile", "1g.10gb"),
            ("hours", "1"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(app.one::<i64>("SELECT count(*) FROM bookings").await, 1);
}

#[tokio::test]
async fn every_operation_in_the_openapi_document_is_a_real_route() {
    let (app, _node) = world().await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    let doc: Value = reqwest::get(app.url("/api/v1/openapi.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let base = doc["servers"][0]["url"]
        .as_str()
        .unwrap_or("/api/v1")
        .to_string();
    let c = reqwest::Client::new();
    let mut checked = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for (method, _) in ops.as_object().unwrap() {
            let url = app.url(&format!("{base}{}", path.replace("{id}", "999999")));
            let req = match method.as_str() {
                "get" => c.get(&url),
                "post" => c.post(&url).json(&serde_json::json!({})),
                other => panic!("unexpected method {other}"),
            };
            let r = req.bearer_auth(&token).send().await.unwrap();
            let status = r.status();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            // A documented route reaches its handler: not the fallback 404
            // ("not_found" with no such booking is fine) nor 405.
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            if status == StatusCode::NOT_FOUND {
                assert!(
                    path.contains("{id}"),
                    "{method} {path} is not routed: {body}"
                );
            }
            checked.push(format!("{} {path}", method.to_uppercase()));
        }
    }
    // And every API route is documented.
    for op in [
        "GET /me",
        "GET /tenants",
        "GET /offerings",
        "GET /bookings",
        "POST /bookings",
        "GET /bookings/{id}",
        "POST /bookings/{id}/release",
        "POST /bookings/{id}/extend",
        "GET /usage",
    ] {
        assert!(
            checked.iter().any(|c| c == op),
            "{op} is missing from openapi.json"
        );
    }
}
