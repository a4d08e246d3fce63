//! Fixes from the hostile-user round (issue 13), each held by a test:
//! NUL bytes answer 400 not 500, no open redirect through control
//! characters, a closed set of method labels on `/metrics`, API tokens end
//! with a password reset or a disable, HSTS over HTTPS.

mod common;

use common::{TestApp, PASSWORD};
use reqwest::StatusCode;

#[tokio::test]
async fn nul_bytes_are_refused_at_the_edge_with_400() {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    // Anonymous sign-in with a NUL in the e-mail.
    let anon = app.client();
    let r = app.login_as(&anon, "ana\0@uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("NUL"));
    let ana = app.signed_in("ana@uni.edu").await;
    for path in [
        "/bookings?tenant=%00",
        "/tenants/lab%00",
        "/usage?tenant=x%00y",
    ] {
        let r = ana.get(app.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{path}");
    }
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    let r = reqwest::Client::new()
        .post(app.url("/api/v1/bookings"))
        .bearer_auth(&token)
        .header("Content-Type", "application/json")
        .body(r#"{"tenant": "lab\u0000", "kind": "mig", "profile": "1g.10gb", "hours": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "bad_request", "{body}");
    // Nothing was booked.
    let n: i64 = app.one("SELECT count(*) FROM bookings").await;
    assert_eq!(n, 0);
}

#[tokio::test]
async fn sign_in_never_redirects_off_site() {
    let app = TestApp::spawn().await;
    app.user("ana@uni.edu", "none", &[]).await;
    let ana = app.signed_in("ana@uni.edu").await;
    for (next, to) in [
        ("/%09/evil.example", "/"),
        ("/%0a/evil.example", "/"),
        ("//evil.example", "/"),
        ("/%5Cevil.example", "/"),
        ("https://evil.example/", "/"),
        ("/bookings/new", "/bookings/new"),
    ] {
        let r = ana
            .get(app.url(&format!("/login?next={next}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "{next}");
        assert_eq!(r.headers()["location"], to, "{next}");
    }
}

#[tokio::test]
async fn invented_methods_do_not_grow_metrics() {
    let app = TestApp::spawn().await;
    let c = reqwest::Client::new();
    for i in 0..5 {
        let m = reqwest::Method::from_bytes(format!("ZZ{i}").as_bytes()).unwrap();
        c.request(m, app.url("/healthz")).send().await.unwrap();
    }
    let body = reqwest::get(app.url("/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!body.contains("ZZ"), "{body}");
    assert!(body.contains("method=\"other\""), "{body}");
}

#[tokio::test]
async fn api_tokens_end_with_a_password_reset_and_a_disable() {
    let app = TestApp::spawn().await;
    app.user("root@uni.edu", "admin", &[]).await;
    let uid = app.user("ana@uni.edu", "none", &[]).await;
    let admin = app.signed_in("root@uni.edu").await;
    let works = |token: String| {
        let url = app.url("/api/v1/me");
        async move {
            reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t1")
        .await
        .unwrap();
    assert_eq!(works(token.clone()).await, StatusCode::OK);
    let r = app
        .post_form(
            &admin,
            "/admin/users",
            &format!("/admin/users/{uid}/password"),
            &[("password", "a brand new passphrase for ana")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(works(token).await, StatusCode::UNAUTHORIZED);

    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t2")
        .await
        .unwrap();
    assert_eq!(works(token.clone()).await, StatusCode::OK);
    let r = app
        .post_form(
            &admin,
            "/admin/users",
            &format!("/admin/users/{uid}/disable"),
            &[],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = app
        .post_form(
            &admin,
            "/admin/users",
            &format!("/admin/users/{uid}/enable"),
            &[],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // Enabled again, but the old token stays dead.
    assert_eq!(works(token).await, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn hsts_only_over_https() {
    let plain = TestApp::spawn().await;
    let r = reqwest::get(plain.url("/healthz")).await.unwrap();
    assert!(r.headers().get("strict-transport-security").is_none());
    let secure = TestApp::spawn_with(gpuslice::web::WebSettings {
        secure_cookies: true,
        ..Default::default()
    })
    .await;
    let r = reqwest::get(secure.url("/healthz")).await.unwrap();
    assert_eq!(
        r.headers()["strict-transport-security"],
        "max-age=31536000; includeSubDomains"
    );
}

#[tokio::test]
async fn overlong_sign_in_addresses_are_refused_before_any_write() {
    let app = TestApp::spawn().await;
    let long = format!("{}@uni.edu", "a".repeat(4000));
    let r = app.login_as(&app.client(), &long, PASSWORD).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r.text().await.unwrap().contains("at most 254 characters"));
    let rows: i64 = app
        .one("SELECT (SELECT count(*) FROM audit_log) + (SELECT count(*) FROM login_throttle)")
        .await;
    assert_eq!(rows, 0);
}
