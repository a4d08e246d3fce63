//! Sign-in, sessions, CSRF and throttling against a real PostgreSQL.

mod common;

use common::{TestApp, PASSWORD};
use reqwest::StatusCode;

fn session_cookie(resp: &reqwest::Response) -> Option<String> {
    resp.cookies()
        .find(|c| c.name() == "gpuslice_session")
        .map(|c| c.value().to_string())
}

#[tokio::test]
async fn sign_in_succeeds_and_shows_the_dashboard() {
    let app = TestApp::spawn().await;
    app.tenant("vision-lab").await;
    app.user("ada@uni.edu", "none", &["vision-lab"]).await;
    let c = app.client();
    let r = app.login_as(&c, "Ada@Uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(r.headers()["location"], "/");
    let page = c.get(app.url("/")).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let body = page.text().await.unwrap();
    assert!(
        body.contains("Tenant vision-lab"),
        "dashboard lists the tenant"
    );
    let n: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'login.succeeded'")
        .await;
    assert_eq!(n, 1);
}

#[tokio::test]
async fn sign_in_follows_only_local_next() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "admin", &[]).await;
    let c = app.client();
    let token = app.csrf(&c, "/login").await;
    let r = c
        .post(app.url("/login"))
        .form(&[
            ("csrf_token", token.as_str()),
            ("email", "ada@uni.edu"),
            ("password", PASSWORD),
            ("next", "//evil.example/"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["location"], "/");
    let c = app.client();
    let token = app.csrf(&c, "/login").await;
    let r = c
        .post(app.url("/login"))
        .form(&[
            ("csrf_token", token.as_str()),
            ("email", "ada@uni.edu"),
            ("password", PASSWORD),
            ("next", "/admin/users"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.headers()["location"], "/admin/users");
}

#[tokio::test]
async fn unknown_user_and_wrong_password_get_the_same_answer() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    let strip = |s: String| {
        // Only the CSRF token differs between two renders of the form.
        let t = common::extract_csrf(&s).unwrap();
        s.replace(&t, "TOKEN")
    };
    let c1 = app.client();
    let wrong = app
        .login_as(&c1, "ada@uni.edu", "not the right password at all")
        .await;
    let c2 = app.client();
    let unknown = app
        .login_as(&c2, "bob@uni.edu", "not the right password at all")
        .await;
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
    let wrong = strip(wrong.text().await.unwrap()).replace("ada@uni.edu", "EMAIL");
    let unknown = strip(unknown.text().await.unwrap()).replace("bob@uni.edu", "EMAIL");
    assert_eq!(wrong, unknown);
    assert!(wrong.contains("do not match an account"));
    let failed: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'login.failed'")
        .await;
    assert_eq!(failed, 2);
}

#[tokio::test]
async fn session_id_changes_at_sign_in() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    app.user("bob@uni.edu", "none", &[]).await;
    let c = app.client();
    // The sign-in page itself starts no session (nothing to fixate) ...
    let page = c.get(app.url("/login")).send().await.unwrap();
    assert!(session_cookie(&page).is_none());
    // ... and a session that exists when someone signs in is replaced.
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    let before = session_cookie(&r).expect("sign-in sets a session cookie");
    let token = app.csrf(&c, "/").await;
    let r = app.post_login(&c, &token, "bob@uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let after = session_cookie(&r).expect("sign-in sets a new session cookie");
    assert_ne!(before, after);
    // The earlier id is dead.
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM tower_sessions.session WHERE id = $1")
        .bind(&before)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(n, 0);
}

/// The `Set-Cookie` header that sets `name`.
fn set_cookie(resp: &reqwest::Response, name: &str) -> String {
    resp.headers()
        .get_all("set-cookie")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .find(|v| v.starts_with(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} cookie"))
}

#[tokio::test]
async fn cookies_are_http_only_and_same_site() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    let c = app.client();
    let r = c.get(app.url("/login")).send().await.unwrap();
    let pre = set_cookie(&r, "gpuslice_presign");
    assert!(
        pre.contains("HttpOnly") && pre.contains("SameSite=Strict"),
        "{pre}"
    );
    assert!(!pre.contains("Secure"), "plain HTTP by default: {pre}");
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    let session = set_cookie(&r, "gpuslice_session");
    assert!(session.contains("HttpOnly"), "{session}");
    assert!(session.contains("SameSite=Lax"), "{session}");
    assert!(
        !session.contains("Secure"),
        "plain HTTP by default: {session}"
    );

    let secure = TestApp::spawn_with(gpuslice::web::WebSettings {
        secure_cookies: true,
        ..Default::default()
    })
    .await;
    secure.user("ada@uni.edu", "none", &[]).await;
    let c = secure.client();
    let r = c.get(secure.url("/login")).send().await.unwrap();
    // Over HTTPS the cookie carries the __Host- prefix (no cookie tossing).
    assert!(set_cookie(&r, "__Host-gpuslice_presign").contains("Secure"));
    // reqwest keeps Secure cookies only over HTTPS: sign in by hand.
    let token = common::extract_csrf(&r.text().await.unwrap()).unwrap();
    let r = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(secure.url("/login"))
        .header("cookie", format!("__Host-gpuslice_presign={token}"))
        .form(&[
            ("csrf_token", token.as_str()),
            ("email", "ada@uni.edu"),
            ("password", PASSWORD),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    // Over HTTPS the session cookie carries the __Host- prefix: no sibling
    // subdomain can plant one.
    let c = set_cookie(&r, "__Host-gpuslice_session");
    assert!(
        c.contains("Secure") && c.contains("Path=/") && !c.contains("Domain"),
        "{c}"
    );
}

/// Replays a stolen cookie from a second client.
async fn with_cookie(app: &TestApp, cookie: &str, path: &str) -> reqwest::Response {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(app.url(path))
        .header("cookie", format!("gpuslice_session={cookie}"))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn logout_ends_the_session_on_the_server() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    let c = app.client();
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    let cookie = session_cookie(&r).unwrap();
    assert_eq!(
        with_cookie(&app, &cookie, "/").await.status(),
        StatusCode::OK
    );
    let r = app.post_form(&c, "/", "/logout", &[]).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let after = with_cookie(&app, &cookie, "/").await;
    assert_eq!(after.status(), StatusCode::SEE_OTHER);
    assert!(after.headers()["location"]
        .to_str()
        .unwrap()
        .starts_with("/login"));
}

#[tokio::test]
async fn disabling_a_user_ends_their_sessions_and_tokens_at_once() {
    let app = TestApp::spawn().await;
    let uid = app.user("sam@uni.edu", "none", &[]).await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let sam = app.signed_in("sam@uni.edu").await;
    let token = gpuslice::cli::token_create(&app.pool, "sam@uni.edu", "laptop")
        .await
        .unwrap();
    assert_eq!(
        sam.get(app.url("/")).send().await.unwrap().status(),
        StatusCode::OK
    );

    let admin = app.signed_in("admin@uni.edu").await;
    let r = app
        .post_form(
            &admin,
            "/admin/users",
            &format!("/admin/users/{uid}/disable"),
            &[],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);

    let r = sam.get(app.url("/")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::SEE_OTHER,
        "the open session is over"
    );
    let api = reqwest::Client::new()
        .get(app.url("/api/v1/me"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), StatusCode::UNAUTHORIZED);
    // And they cannot sign in again.
    let c = app.client();
    assert_eq!(
        app.login_as(&c, "sam@uni.edu", PASSWORD).await.status(),
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn password_reset_ends_old_sessions() {
    let app = TestApp::spawn().await;
    let uid = app.user("sam@uni.edu", "none", &[]).await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let sam = app.signed_in("sam@uni.edu").await;
    let admin = app.signed_in("admin@uni.edu").await;
    let r = app
        .post_form(
            &admin,
            "/admin/users",
            &format!("/admin/users/{uid}/password"),
            &[("password", "a brand new passphrase for sam")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        sam.get(app.url("/")).send().await.unwrap().status(),
        StatusCode::SEE_OTHER
    );
    let c = app.client();
    let r = app
        .login_as(&c, "sam@uni.edu", "a brand new passphrase for sam")
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_post_without_the_csrf_token_changes_nothing() {
    let app = TestApp::spawn().await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;
    let fields = [
        ("slug", "evil-lab"),
        ("name", "Evil"),
        ("max_active_bookings", "1"),
        ("max_gpu_memory_gib", "1"),
        ("max_compute_slices", "1"),
        ("default_priority", "normal"),
        ("guaranteed_share_pct", "0"),
        ("monthly_slice_hours", "1"),
        ("max_booking_hours", "1"),
    ];
    // No token at all.
    let r = admin
        .post(app.url("/admin/tenants"))
        .form(&fields)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("did not come from this site"));
    // A wrong token.
    let mut bad = fields.to_vec();
    bad.push(("csrf_token", "forged"));
    let r = admin
        .post(app.url("/admin/tenants"))
        .form(&bad)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The right token, but a cross-site request (what a browser says for a
    // form posted from another site).
    let token = app.csrf(&admin, "/admin/tenants/new").await;
    let mut good = fields.to_vec();
    good.push(("csrf_token", token.as_str()));
    let r = admin
        .post(app.url("/admin/tenants"))
        .header("sec-fetch-site", "cross-site")
        .form(&good)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // Logout is protected too.
    let r = admin.post(app.url("/logout")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        admin.get(app.url("/")).send().await.unwrap().status(),
        StatusCode::OK
    );

    let n: i64 = app.one("SELECT count(*) FROM tenants").await;
    assert_eq!(n, 0, "no forged request created a tenant");

    // With the token, from the site itself, it works; htmx's header works too.
    let r = admin
        .post(app.url("/admin/tenants"))
        .header("x-csrf-token", token.as_str())
        .form(&fields)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn sign_in_is_throttled_per_account_and_recovers() {
    let app = TestApp::spawn().await;
    app.user("ada@uni.edu", "none", &[]).await;
    for i in 0..10 {
        let c = app.client();
        let r = app
            .login_as(&c, "ada@uni.edu", "guessing the password now")
            .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    let c = app.client();
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    assert_eq!(
        r.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "even the right password waits"
    );
    let retry: i64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(retry > 0 && retry <= 15 * 60, "{retry}");
    // Other accounts from the same address are not locked out.
    app.user("bob@uni.edu", "none", &[]).await;
    let c = app.client();
    assert_eq!(
        app.login_as(&c, "bob@uni.edu", PASSWORD).await.status(),
        StatusCode::SEE_OTHER
    );
    // The window ends: the account works again (no permanent lockout).
    sqlx::query("UPDATE login_throttle SET window_start = now() - interval '16 minutes'")
        .execute(&app.pool)
        .await
        .unwrap();
    let c = app.client();
    assert_eq!(
        app.login_as(&c, "ada@uni.edu", PASSWORD).await.status(),
        StatusCode::SEE_OTHER
    );
}

#[tokio::test]
async fn sign_in_is_throttled_per_address() {
    let app = TestApp::spawn().await;
    for i in 0..20 {
        let c = app.client();
        let r = app
            .login_as(
                &c,
                &format!("nobody{i}@uni.edu"),
                "guessing the password now",
            )
            .await;
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "attempt {i}");
    }
    app.user("ada@uni.edu", "none", &[]).await;
    let c = app.client();
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(r.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn api_tokens_work_for_the_api_and_can_be_revoked() {
    let app = TestApp::spawn().await;
    app.tenant("vision-lab").await;
    app.tenant("nlp").await;
    app.user("sam@uni.edu", "none", &["vision-lab"]).await;
    let sam = app.signed_in("sam@uni.edu").await;
    let r = app
        .post_form(
            &sam,
            "/settings/tokens",
            "/settings/tokens",
            &[("name", "laptop")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::CREATED);
    let body = r.text().await.unwrap();
    let start = body.find("gps_").expect("the new token is shown once");
    let token: String = body[start..]
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();

    let api = reqwest::Client::new();
    let me: serde_json::Value = api
        .get(app.url("/api/v1/me"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(me["email"], "sam@uni.edu");
    let tenants: serde_json::Value = api
        .get(app.url("/api/v1/tenants"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let slugs: Vec<_> = tenants["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["slug"].as_str().unwrap())
        .collect();
    assert_eq!(slugs, ["vision-lab"], "no other tenant's data");
    // Only the hash is stored.
    let stored: String = app.one("SELECT token_hash FROM api_tokens").await;
    assert_ne!(stored, token);
    assert!(!stored.contains(&token[4..]));

    let list = sam
        .get(app.url("/settings/tokens"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!list.contains(&token), "never shown again");
    let id: i64 = app.one("SELECT id FROM api_tokens").await;
    let r = app
        .post_form(
            &sam,
            "/settings/tokens",
            &format!("/settings/tokens/{id}/revoke"),
            &[],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = api
        .get(app.url("/api/v1/me"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let err: serde_json::Value = r.json().await.unwrap();
    assert_eq!(err["error"], "unauthenticated");
    assert!(err["message"].is_string());
}

#[tokio::test]
async fn a_token_cannot_be_revoked_by_someone_else() {
    let app = TestApp::spawn().await;
    app.user("sam@uni.edu", "none", &[]).await;
    app.user("eve@uni.edu", "none", &[]).await;
    gpuslice::cli::token_create(&app.pool, "sam@uni.edu", "laptop")
        .await
        .unwrap();
    let id: i64 = app.one("SELECT id FROM api_tokens").await;
    let eve = app.signed_in("eve@uni.edu").await;
    let r = app
        .post_form(
            &eve,
            "/settings/tokens",
            &format!("/settings/tokens/{id}/revoke"),
            &[],
        )
        .await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let revoked: bool = app
        .one("SELECT revoked_at IS NOT NULL FROM api_tokens")
        .await;
    assert!(!revoked);
}

#[tokio::test]
async fn api_errors_are_json() {
    let app = TestApp::spawn().await;
    let r = reqwest::get(app.url("/api/v1/me")).await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"], "unauthenticated");
    let r = reqwest::get(app.url("/api/v1/nothing-here")).await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"], "not_found");
    let r = reqwest::Client::new()
        .get(app.url("/api/v1/me"))
        .header("authorization", "Bearer gps_made_up")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn sessions_end_after_their_absolute_lifetime() {
    // A lifetime of zero seconds: the session is over at its first use,
    // however active it is.
    let app = TestApp::spawn_with(gpuslice::web::WebSettings {
        session_absolute_secs: 0,
        ..Default::default()
    })
    .await;
    app.user("ada@uni.edu", "none", &[]).await;
    let c = app.client();
    let r = app.login_as(&c, "ada@uni.edu", PASSWORD).await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = c.get(app.url("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert!(r.headers()["location"]
        .to_str()
        .unwrap()
        .starts_with("/login"));
    let n: i64 = app.one("SELECT count(*) FROM tower_sessions.session").await;
    assert_eq!(n, 0, "the expired session was deleted on the server");
}
