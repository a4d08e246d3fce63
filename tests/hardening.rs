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

/// A client that says it comes from `addr` through the (trusted) proxy.
fn client_from(addr: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-forwarded-for", addr.parse().unwrap());
    reqwest::Client::builder()
        .cookie_store(true)
        .redirect(reqwest::redirect::Policy::none())
        .default_headers(headers)
        .build()
        .unwrap()
}

#[tokio::test]
async fn parallel_guesses_cannot_race_past_the_account_limit() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    let mut clients = Vec::new();
    for _ in 0..60 {
        let c = app.client();
        let t = app.csrf(&c, "/login").await;
        clients.push((c, t));
    }
    let url = app.url("/login");
    let tries = clients.into_iter().map(|(c, t)| {
        let url = url.clone();
        tokio::spawn(async move {
            c.post(url)
                .form(&[
                    ("csrf_token", t.as_str()),
                    ("email", "ada@uni.edu"),
                    ("password", "guessing the password now"),
                ])
                .send()
                .await
                .unwrap()
                .status()
        })
    });
    let mut counts = std::collections::BTreeMap::new();
    for t in tries {
        *counts.entry(t.await.unwrap().as_u16()).or_insert(0) += 1;
    }
    // Exactly the limit was checked against the password; the rest waited.
    assert_eq!(
        counts,
        [(401, 10), (429, 50)].into_iter().collect(),
        "{counts:?}"
    );
}

#[tokio::test]
async fn forwarded_for_is_read_from_the_right_and_only_from_trusted_proxies() {
    use gpuslice::web::auth::forwarded_client;
    use gpuslice::web::WebSettings;
    let ip = |s: &str| Some(s.parse::<std::net::IpAddr>().unwrap());
    let one_proxy = WebSettings {
        trust_proxy: true,
        ..WebSettings::default()
    };
    // The client wrote the left entry; the proxy appended the right one.
    assert_eq!(
        forwarded_client(ip("10.0.0.2"), "6.6.6.6, 1.2.3.4", &one_proxy),
        ip("1.2.3.4")
    );
    assert_eq!(
        forwarded_client(ip("10.0.0.2"), "[2001:db8::1]", &one_proxy),
        ip("2001:db8::1")
    );
    assert_eq!(
        forwarded_client(ip("10.0.0.2"), "not-an-address", &one_proxy),
        None
    );
    assert_eq!(
        forwarded_client(ip("10.0.0.2"), "", &WebSettings::default()),
        None
    );
    assert_eq!(
        forwarded_client(ip("10.0.0.2"), "1.2.3.4", &WebSettings::default()),
        None
    );
    let chain = WebSettings {
        trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()],
        ..WebSettings::default()
    };
    assert_eq!(
        forwarded_client(ip("10.0.0.5"), "6.6.6.6, 3.3.3.3, 10.0.0.9", &chain),
        ip("3.3.3.3"),
        "past our own proxies, the first stranger"
    );
    assert_eq!(
        forwarded_client(ip("8.8.8.8"), "3.3.3.3", &chain),
        None,
        "a peer that is not our proxy is believed about nothing"
    );
    assert_eq!(
        forwarded_client(ip("10.0.0.5"), "junk, 10.0.0.9", &chain),
        None
    );
}

#[tokio::test]
async fn a_spoofed_forwarded_for_does_not_escape_the_address_limit() {
    let app = TestApp::spawn_with(gpuslice::web::WebSettings {
        trust_proxy: true,
        ..Default::default()
    })
    .await;
    for i in 0..20 {
        let c = client_from(&format!("1.2.3.{i}, 9.9.9.9"));
        let r = app
            .login_as(&c, &format!("nobody{i}@uni.edu"), "guess guess guess")
            .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    let c = client_from("1.2.3.200, 9.9.9.9");
    let r = app
        .login_as(&c, "nobody@uni.edu", "guess guess guess")
        .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // Another client behind the same proxy is counted on its own.
    app.user("ada@uni.edu", "none", &[]).await;
    let r = app
        .login_as(&client_from("9.9.9.10"), "ada@uni.edu", PASSWORD)
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn strangers_spread_over_many_addresses_do_not_lock_the_owner_out() {
    let app = TestApp::spawn_with(gpuslice::web::WebSettings {
        trust_proxy: true,
        ..Default::default()
    })
    .await;
    app.user("ada@uni.edu", "none", &[]).await;
    // Ada signs in from her usual address once.
    let home = client_from("192.0.2.1");
    assert_eq!(
        app.login_as(&home, "ada@uni.edu", PASSWORD).await.status(),
        StatusCode::SEE_OTHER
    );
    // Six strangers guess ten times each (the per-address limit): 60 in all,
    // past the account-wide ceiling of 50.
    let mut refused = 0;
    for s in 0..6 {
        let c = client_from(&format!("203.0.113.{s}"));
        for _ in 0..10 {
            match app
                .login_as(&c, "ada@uni.edu", "guess guess guess")
                .await
                .status()
            {
                StatusCode::UNAUTHORIZED => {}
                StatusCode::TOO_MANY_REQUESTS => refused += 1,
                other => panic!("{other}"),
            }
        }
        // An eleventh guess from the same address waits.
        let r = app.login_as(&c, "ada@uni.edu", "guess guess guess").await;
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(refused, 10, "the ceiling refused the guesses past 50");
    // A new address is refused even with the right password ...
    let r = app
        .login_as(&client_from("203.0.113.99"), "ada@uni.edu", PASSWORD)
        .await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // ... but Ada gets in from where she signed in before.
    let r = app
        .login_as(&client_from("192.0.2.1"), "ada@uni.edu", PASSWORD)
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn password_checks_wait_for_a_free_slot_and_shed_with_503() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    // Every slot busy (as under a flood of sign-ins).
    let n = app.state.password_slots.available_permits() as u32;
    let held = app
        .state
        .password_slots
        .clone()
        .acquire_many_owned(n)
        .await
        .unwrap();
    let c = app.client();
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    assert!(r.text().await.unwrap().contains("busy checking passwords"));
    drop(held);
    // The refused attempt did not count against her.
    let n: i32 = app
        .one("SELECT coalesce(max(failures), 0) FROM login_throttle")
        .await;
    assert_eq!(n, 0);
    let c = app.client();
    assert_eq!(
        app.login_as(&c, "ada@uni.edu", PASSWORD).await.status(),
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn a_visit_to_the_sign_in_page_stores_no_session() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    for _ in 0..20 {
        let r = reqwest::get(app.url("/login")).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
    }
    let n: i64 = app.one("SELECT count(*) FROM tower_sessions.session").await;
    assert_eq!(n, 0, "anonymous visits wrote session rows");
    // The form's token is bound to the visitor's cookie: without the
    // cookie, a token lifted from the page is worthless.
    let c = app.client();
    let token = app.csrf(&c, "/login").await;
    let r = app
        .post_login(&reqwest::Client::new(), &token, "ada@uni.edu", PASSWORD)
        .await;
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // With it, sign-in works, and the pre-session cookie is cleared.
    let r = app.post_login(&c, &token, "ada@uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cleared = r
        .headers()
        .get_all("set-cookie")
        .iter()
        .any(|v| v.to_str().unwrap().starts_with("gpuslice_presign=;"));
    assert!(cleared);
    let n: i64 = app.one("SELECT count(*) FROM tower_sessions.session").await;
    assert_eq!(n, 1);
}

#[tokio::test]
async fn htmx_panels_never_put_the_csrf_token_in_a_url() {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let ana = app.signed_in("ana@uni.edu").await;
    let body = ana
        .get(app.url("/bookings/new"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let tags: Vec<&str> = body
        .split('<')
        .filter(|t| t.contains("hx-include="))
        .collect();
    assert!(!tags.is_empty());
    for tag in tags {
        assert!(tag.contains(r#"hx-params="not csrf_token""#), "{tag}");
    }
}

#[tokio::test]
async fn only_a_valid_api_token_skips_the_csrf_check() {
    let app = TestApp::spawn().await;
    app.user("ana@uni.edu", "none", &[]).await;
    let ana = app.signed_in("ana@uni.edu").await;
    for auth in ["Bearer not-a-token", "Basic YW5hOnB3"] {
        // A forged sign-out that adds some Authorization header.
        let r = ana
            .post(app.url("/logout"))
            .header("authorization", auth)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{auth}");
    }
    // The session survived.
    let r = ana.get(app.url("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn requests_past_the_limit_or_the_time_answer_503_with_retry_after() {
    let app = TestApp::spawn_with(gpuslice::web::WebSettings {
        request_timeout: std::time::Duration::from_secs(1),
        header_read_timeout: std::time::Duration::from_secs(1),
        ..Default::default()
    })
    .await;
    app.user("ada@uni.edu", "none", &[]).await;
    // Every request slot taken: shed at once.
    let n = app.state.request_slots.available_permits() as u32;
    let held = app
        .state
        .request_slots
        .clone()
        .acquire_many_owned(n)
        .await
        .unwrap();
    let r = reqwest::get(app.url("/healthz")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "2");
    drop(held);
    assert_eq!(
        reqwest::get(app.url("/healthz")).await.unwrap().status(),
        StatusCode::OK
    );
    // One client holding its share (half) of the slots waits its turn
    // while others are served.
    let share = app.state.settings.max_concurrent_requests / 2;
    app.state
        .in_flight
        .lock()
        .unwrap()
        .insert("127.0.0.1".into(), share);
    let r = reqwest::get(app.url("/login")).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("too many requests in flight"));
    app.state.in_flight.lock().unwrap().clear();
    assert_eq!(
        reqwest::get(app.url("/healthz")).await.unwrap().status(),
        StatusCode::OK
    );
    // A request stuck longer than the request timeout (here: waiting for a
    // password slot) is answered 503, not left hanging.
    let n = app.state.password_slots.available_permits() as u32;
    let _held = app
        .state
        .password_slots
        .clone()
        .acquire_many_owned(n)
        .await
        .unwrap();
    let c = app.client();
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.text().await.unwrap().contains("took too long"));
    // A client that opens a connection and never finishes its request head
    // is cut off (slow loris).
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let read =
        tokio::time::timeout(std::time::Duration::from_secs(20), s.read_to_end(&mut buf)).await;
    assert!(read.is_ok(), "the server kept a half-sent request open");
}

#[tokio::test]
async fn usage_exports_are_capped_so_pages_keep_their_connections() {
    let app = TestApp::spawn().await;
    app.user("fin@uni.edu", "finance", &[]).await;
    let fin = app.signed_in("fin@uni.edu").await;
    let held = app
        .state
        .export_slots
        .clone()
        .acquire_many_owned(gpuslice::web::MAX_EXPORTS as u32)
        .await
        .unwrap();
    let url = app.url("/reports/usage.csv?from=2026-01-01&to=2026-01-31");
    let r = fin.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "30");
    drop(held);
    let r = fin.get(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}

#[tokio::test]
async fn an_unreachable_database_answers_503_with_retry_after() {
    // A pool whose server does not exist (a closed port): as while
    // PostgreSQL is stopped.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_secs(2))
        .connect_lazy(&format!("postgres://nobody@127.0.0.1:{port}/none"))
        .unwrap();
    let state = gpuslice::web::AppState::new(pool, Default::default())
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(gpuslice::web::serve(
        listener,
        state,
        std::future::pending(),
    ));
    let r = reqwest::Client::new()
        .get(format!("http://{addr}/api/v1/bookings"))
        .bearer_auth("gps_whatever")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "unavailable", "{body}");
    // The sign-in page itself needs no database; signing in does.
    let c = reqwest::Client::builder()
        .cookie_store(true)
        .build()
        .unwrap();
    let page = c.get(format!("http://{addr}/login")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let token = common::extract_csrf(&page.text().await.unwrap()).unwrap();
    let r = c
        .post(format!("http://{addr}/login"))
        .form(&[
            ("csrf_token", token.as_str()),
            ("email", "a@b.c"),
            ("password", "x"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("database is not reachable"));
}

#[tokio::test]
async fn every_form_and_api_field_survives_hostile_input() {
    // The demo's tenants and accounts, and a fleet to book on.
    let app = TestApp::spawn().await;
    gpuslice::cli::seed_demo(&app.pool).await.unwrap();
    // Every page, every form field and every API field with NUL, invalid
    // UTF-8, an RTL override, markup, 300 KB of text and numbers out of
    // range, as each demo role: no 5xx, no markup echoed unescaped.
    let crawler = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/hostile_crawl.py");
    let base = app.url("");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args([
                crawler,
                base.trim_end_matches('/'),
                gpuslice::cli::DEMO_PASSWORD,
            ])
            .output()
            .expect("python3 runs the hostile crawler (scripts/test.sh installs it)")
    })
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("hostile crawl:"), "{text}");
    eprintln!("{}", text.lines().last().unwrap_or_default());
}

#[tokio::test]
async fn the_exec_socket_reads_one_bounded_line_in_bounded_time() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let app = TestApp::spawn().await;
    let dir = std::env::temp_dir().join(format!("gpuslice-exec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("exec.sock");
    let server = tokio::spawn(gpuslice::sched::exec::serve(
        app.pool.clone(),
        path.clone(),
        Default::default(),
        Default::default(),
    ));
    while !path.exists() {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let reply = |s: tokio::net::UnixStream| async move {
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).await.unwrap();
        serde_json::from_str::<serde_json::Value>(&line).unwrap()
    };
    // A megabyte without a newline: read up to the bound, then refused.
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    let _ = s.write_all(&vec![b'{'; 1 << 20]).await;
    let r = reply(s).await;
    assert_eq!(r["ok"], false);
    assert!(
        r["error"].as_str().unwrap().contains("not understood"),
        "{r}"
    );
    // Nothing at all: refused after the time limit, not held for ever.
    let s = tokio::net::UnixStream::connect(&path).await.unwrap();
    let r = tokio::time::timeout(std::time::Duration::from_secs(30), reply(s))
        .await
        .expect("the worker let a silent client hold a connection");
    assert!(r["error"].as_str().unwrap().contains("no request"), "{r}");
    // A well-formed request still gets its answer.
    let mut s = tokio::net::UnixStream::connect(&path).await.unwrap();
    s.write_all(b"{\"booking\": 42}\n").await.unwrap();
    let r = reply(s).await;
    assert!(
        r["error"].as_str().unwrap().contains("no booking 42"),
        "{r}"
    );
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_tenant_that_is_no_slug_is_refused_even_where_it_is_unused() {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    let get = |q: &'static str| {
        reqwest::Client::new()
            .get(app.url(&format!("/api/v1/bookings?{q}")))
            .bearer_auth(&token)
            .send()
    };
    for q in ["scope=mine&tenant=%C2%A2", "tenant=%20lab", "tenant=LAB"] {
        let r = get(q).await.unwrap();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY, "{q}");
    }
    // Blank is the same as not given.
    assert_eq!(get("tenant=").await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        get("scope=tenant&tenant=lab").await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
}

#[tokio::test]
async fn a_typed_address_cannot_name_another_accounts_counter() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    // Ten guesses "for" ada@uni.edu|127.0.0.1: an account-wide key that
    // once equalled Ada's own counter at this address.
    for _ in 0..10 {
        let c = app.client();
        let r = app
            .login_as(&c, "ada@uni.edu|127.0.0.1", "guess guess guess")
            .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    }
    let c = app.client();
    assert_eq!(
        app.login_as(&c, "ada@uni.edu", PASSWORD).await.status(),
        StatusCode::SEE_OTHER
    );
}

#[test]
fn ipv6_clients_are_counted_by_their_64_and_mapped_ipv4_as_ipv4() {
    use gpuslice::web::auth::throttle_scope;
    assert_eq!(
        throttle_scope("2001:db8:1:2:aaaa:bbbb:cccc:1"),
        "2001:db8:1:2::/64"
    );
    assert_eq!(throttle_scope("2001:db8:1:2::99"), "2001:db8:1:2::/64");
    assert_eq!(throttle_scope("::ffff:10.0.0.1"), "10.0.0.1");
    assert_eq!(throttle_scope("192.0.2.7"), "192.0.2.7");
    assert_eq!(throttle_scope("unknown"), "unknown");
}
