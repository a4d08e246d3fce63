//! Operations endpoints, security headers, static assets and error pages.

mod common;

use common::TestApp;
use reqwest::StatusCode;

#[tokio::test]
async fn health_readiness_and_metrics() {
    let app = TestApp::spawn().await;
    let r = reqwest::get(app.url("/healthz")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = reqwest::get(app.url("/readyz")).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    reqwest::get(app.url("/login")).await.unwrap();
    reqwest::get(app.url("/no/such/page")).await.unwrap();
    let r = reqwest::get(app.url("/metrics")).await.unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let body = r.text().await.unwrap();
    assert!(
        body.contains(
            "gpuslice_http_requests_total{method=\"GET\",route=\"/login\",status=\"200\"} 1"
        ),
        "{body}"
    );
    assert!(body.contains("gpuslice_http_request_duration_seconds_bucket{le=\"+Inf\",method=\"GET\",route=\"/login\"} 1"), "{body}");
    // Unknown paths share one series, so scanners cannot blow up the label set.
    assert!(body.contains("route=\"unmatched\",status=\"404\""));
    assert!(!body.contains("/no/such/page"));
}

#[tokio::test]
async fn readiness_fails_when_the_database_is_gone() {
    let app = TestApp::spawn().await;
    app.pool.close().await;
    let r = reqwest::get(app.url("/readyz")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        reqwest::get(app.url("/healthz")).await.unwrap().status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn every_page_carries_the_security_headers_and_a_request_id() {
    let app = TestApp::spawn().await;
    for path in ["/login", "/no/such/page", "/static/app.css", "/api/v1/me"] {
        let r = reqwest::get(app.url(path)).await.unwrap();
        let h = r.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
            "{path}: {csp}"
        );
        assert!(csp.contains("frame-ancestors 'none'"));
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(h["x-frame-options"], "DENY", "{path}");
        assert_eq!(h["referrer-policy"], "same-origin", "{path}");
        assert!(h.contains_key("x-request-id"), "{path}");
    }
}

#[tokio::test]
async fn static_assets_are_embedded_typed_and_cacheable() {
    let app = TestApp::spawn().await;
    let login = reqwest::get(app.url("/login"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let start = login.find("/static/htmx.min.js?v=").unwrap();
    let url: String = login[start..].chars().take_while(|c| *c != '"').collect();
    let r = reqwest::get(app.url(&url)).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        r.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert!(r.headers()["cache-control"]
        .to_str()
        .unwrap()
        .contains("max-age=31536000"));
    let etag = r.headers()["etag"].to_str().unwrap().to_string();
    assert!(r.text().await.unwrap().contains("htmx"));
    let r = reqwest::Client::new()
        .get(app.url("/static/htmx.min.js"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    let css = reqwest::get(app.url("/static/app.css")).await.unwrap();
    assert_eq!(css.headers()["content-type"], "text/css; charset=utf-8");
    assert_eq!(
        reqwest::get(app.url("/static/nope.js"))
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn error_pages_use_the_layout() {
    let app = TestApp::spawn().await;
    let r = reqwest::get(app.url("/no/such/page")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let body = r.text().await.unwrap();
    assert!(body.contains("Page not found") && body.contains("class=\"topbar\""));
    app.user("sam@uni.edu", "none", &[]).await;
    let sam = app.signed_in("sam@uni.edu").await;
    let r = sam.get(app.url("/admin/tenants")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r.text().await.unwrap().contains("platform admins"));
    // A malformed id is a clean 400 page, not a crash (for an admin: the
    // role is checked before anything is parsed, so sam gets 403).
    let r = sam.get(app.url("/admin/users/abc")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    app.user("ada@uni.edu", "admin", &[]).await;
    let ada = app.signed_in("ada@uni.edu").await;
    let r = ada.get(app.url("/admin/users/abc")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert!(r.text().await.unwrap().contains("class=\"topbar\""));
}

#[tokio::test]
async fn metrics_ask_for_the_token_when_one_is_set() {
    let app = TestApp::spawn().await;
    let mut state = gpuslice::AppState::new(app.pool.clone(), Default::default())
        .await
        .unwrap();
    state.metrics_token = Some(std::sync::Arc::from("s3cret-scrape"));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(gpuslice::web::serve(l, state, std::future::pending()));
    let r = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = reqwest::Client::new()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let r = reqwest::Client::new()
        .get(format!("http://{addr}/metrics"))
        .bearer_auth("s3cret-scrape")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

/// `gpuslice healthcheck` (the container's HEALTHCHECK): 0 against a
/// serving gpuslice, non-zero with a sentence where nothing answers.
#[tokio::test]
async fn the_healthcheck_command_asks_healthz() {
    let app = TestApp::spawn().await;
    let run = |bind: String| {
        std::process::Command::new(env!("CARGO_BIN_EXE_gpuslice"))
            .args(["healthcheck", "--bind", &bind])
            .output()
            .unwrap()
    };
    let addr = app.addr;
    let out = tokio::task::spawn_blocking(move || run(addr.to_string()))
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // 0.0.0.0 is asked on the loopback address.
    let any = format!("0.0.0.0:{}", addr.port());
    let out = tokio::task::spawn_blocking(move || run(any)).await.unwrap();
    assert!(out.status.success(), "{out:?}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = tokio::task::spawn_blocking(move || run(closed.to_string()))
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("did not answer"),
        "{out:?}"
    );
}
