//! Single sign-on against real providers started by the test: an OpenID
//! Connect provider (`tests/support/oidc_provider.py`: discovery, JWKS,
//! PKCE, one-use codes, RS256 ID tokens) and OpenLDAP's `slapd` over
//! LDAPS with a certificate made here. Just-in-time accounts, the group
//! mapping kept in step at each sign-in, a tampered token, a wrong nonce
//! and a replayed code refused, local passwords turned off but for a
//! break-glass admin.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use clap::Parser;
use common::TestApp;
use gpuslice::cli::args::SsoArgs;
use reqwest::Client;
use serde_json::json;

#[derive(Parser)]
struct Settings {
    #[command(flatten)]
    sso: SsoArgs,
}

fn sso(args: &[&str]) -> gpuslice::web::sso::Sso {
    let mut all = vec!["gpuslice"];
    all.extend_from_slice(args);
    let s = Settings::try_parse_from(all).unwrap();
    gpuslice::web::sso::Sso::from_args(&s.sso).unwrap()
}

const MAPPING: &str =
    "gpu-vision-lab=vision-lab,gpu-vision-pis=vision-lab:manager,gpu-admins=platform:admin";

/// The provider process, stopped when dropped.
struct Provider {
    child: Child,
    url: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn provider() -> Option<Provider> {
    let python = std::env::var("GPUSLICE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args(["-c", "import cryptography"])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        common::skip_or_require(
            "OpenID Connect sign-in",
            "no python3 with the cryptography package (scripts/test.sh installs it)",
        );
        return None;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/oidc_provider.py");
    let mut child = Command::new(&python)
        .args([script, "gpuslice-test", "s3cret"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    Some(Provider {
        child,
        url: format!("http://127.0.0.1:{}", line.trim()),
    })
}

async fn as_user(p: &Provider, sub: &str, email: &str, verified: bool, groups: &[&str]) {
    let r = reqwest::Client::new()
        .post(format!("{}/_test/user", p.url))
        .json(&json!({"sub": sub, "email": email, "email_verified": verified, "name": "Ana Lyst", "groups": groups}))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
}

async fn mode(p: &Provider, m: &str) {
    reqwest::Client::new()
        .post(format!("{}/_test/mode", p.url))
        .json(&json!({"mode": m}))
        .send()
        .await
        .unwrap();
}

fn location(r: &reqwest::Response) -> String {
    r.headers()["location"].to_str().unwrap().to_string()
}

/// Through the provider and back: the callback URL it sends the browser to.
async fn through_provider(app: &TestApp, browser: &Client) -> String {
    let start = browser
        .get(app.url("/auth/oidc/start?next=/tenants/vision-lab"))
        .send()
        .await
        .unwrap();
    assert_eq!(start.status(), 303);
    let authorize = location(&start);
    assert!(authorize.contains("code_challenge_method=S256") && authorize.contains("nonce="), "{authorize}");
    let at_provider = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(&authorize)
        .send()
        .await
        .unwrap();
    assert_eq!(at_provider.status(), 302);
    location(&at_provider)
}

async fn sign_in(app: &TestApp, browser: &Client) -> reqwest::Response {
    let back = through_provider(app, browser).await;
    browser.get(back).send().await.unwrap()
}

async fn roles(app: &TestApp, email: &str) -> (String, Vec<(String, String, String)>) {
    let role: String = sqlx::query_scalar("SELECT global_role FROM users WHERE email = $1")
        .bind(email)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    let ms = sqlx::query_as(
        "SELECT t.slug, m.role, m.source FROM memberships m JOIN users u ON u.id = m.user_id
         JOIN tenants t ON t.id = m.tenant_id WHERE u.email = $1 ORDER BY t.slug",
    )
    .bind(email)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    (role, ms)
}

fn t(slug: &str, role: &str, source: &str) -> (String, String, String) {
    (slug.into(), role.into(), source.into())
}

#[tokio::test]
async fn oidc_signs_in_just_in_time_and_keeps_groups_in_step() {
    let Some(p) = provider() else { return };
    let s = sso(&[
        "--oidc-issuer", &p.url, "--oidc-client-id", "gpuslice-test", "--oidc-client-secret", "s3cret",
        "--oidc-name", "Uni Login", "--sso-groups", MAPPING,
    ]);
    let app = TestApp::spawn_configured(Default::default(), |st| st.sso = std::sync::Arc::new(s)).await;
    app.tenant("vision-lab").await;
    app.tenant("other").await;
    let login = app.client().get(app.url("/login")).send().await.unwrap().text().await.unwrap();
    assert!(login.contains("Sign in with Uni Login"), "{login}");

    // First sign-in: the account is made, the group grants membership.
    as_user(&p, "u-ana", "ana@uni.edu", true, &["gpu-vision-lab", "unrelated"]).await;
    let browser = app.client();
    let r = sign_in(&app, &browser).await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(location(&r), "/tenants/vision-lab");
    let page = browser.get(app.url("/tenants/vision-lab")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(roles(&app, "ana@uni.edu").await, ("none".into(), vec![t("vision-lab", "member", "sso")]));
    let created: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'user.created' AND detail->>'via' = 'oidc'")
        .await;
    assert_eq!(created, 1);
    // No password opens a single sign-on account.
    let r = app.login_as(&app.client(), "ana@uni.edu", common::PASSWORD).await;
    assert_eq!(r.status(), 401);

    // A manual membership elsewhere stays whatever the groups say.
    let ana: i64 = app.one("SELECT id FROM users WHERE email = 'ana@uni.edu'").await;
    let other: i64 = app.one("SELECT id FROM tenants WHERE slug = 'other'").await;
    sqlx::query("INSERT INTO memberships (user_id, tenant_id, role) VALUES ($1, $2, 'member')")
        .bind(ana)
        .bind(other)
        .execute(&app.pool)
        .await
        .unwrap();

    // Groups change: manager and admin at the next sign-in.
    as_user(&p, "u-ana", "ana@uni.edu", true, &["gpu-vision-pis", "gpu-admins"]).await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        roles(&app, "ana@uni.edu").await,
        ("admin".into(), vec![t("other", "member", "manual"), t("vision-lab", "manager", "sso")])
    );
    // Groups gone: what the mapping granted goes, the manual one stays.
    as_user(&p, "u-ana", "ana@uni.edu", true, &[]).await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 303);
    assert_eq!(roles(&app, "ana@uni.edu").await, ("none".into(), vec![t("other", "member", "manual")]));
    let changes: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action LIKE 'sso.%'")
        .await;
    assert!(changes >= 4, "{changes}");
}

#[tokio::test]
async fn oidc_refuses_tampered_tokens_wrong_nonces_replayed_codes_and_unverified_links() {
    let Some(p) = provider() else { return };
    let s = sso(&[
        "--oidc-issuer", &p.url, "--oidc-client-id", "gpuslice-test", "--oidc-client-secret", "s3cret",
        "--sso-groups", MAPPING,
    ]);
    let app = TestApp::spawn_configured(Default::default(), |st| st.sso = std::sync::Arc::new(s)).await;
    app.tenant("vision-lab").await;
    as_user(&p, "u-bob", "bob@uni.edu", true, &["gpu-vision-lab"]).await;
    let signed_in = |c: Client| {
        let url = app.url("/");
        async move { c.get(url).send().await.unwrap().status() == 200 }
    };

    for (m, says) in [
        ("tamper", "did not verify"),
        ("wrong_nonce", "did not verify"),
        ("wrong_audience", "did not verify"),
    ] {
        mode(&p, m).await;
        let browser = app.client();
        let r = sign_in(&app, &browser).await;
        assert_eq!(r.status(), 401, "{m}");
        assert!(r.text().await.unwrap().contains(says), "{m}");
        assert!(!signed_in(browser).await, "{m}: nobody signed in");
    }
    let users: i64 = app.one("SELECT count(*) FROM users").await;
    assert_eq!(users, 0, "no account from a refused token");

    // A good sign-in; then its code again: refused by us (the flow is
    // used) and, in a fresh flow, by the provider (the code is used).
    mode(&p, "ok").await;
    let browser = app.client();
    let back = through_provider(&app, &browser).await;
    assert_eq!(browser.get(&back).send().await.unwrap().status(), 303);
    let again = app.client().get(&back).send().await.unwrap();
    assert_eq!(again.status(), 400);
    let thief = app.client();
    let fresh = through_provider(&app, &thief).await;
    let state = fresh.split("state=").nth(1).unwrap();
    let code = back.split("code=").nth(1).unwrap().split('&').next().unwrap();
    let replay = format!("{}?code={code}&state={state}", app.url("/auth/oidc/callback"));
    let r = thief.get(replay).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.text().await.unwrap().contains("refused the sign-in code"));
    assert!(!signed_in(thief).await);
    // A state that is not this browser's.
    let r = app
        .client()
        .get(app.url("/auth/oidc/callback?code=x&state=y"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // An unverified address never opens someone's existing account.
    app.user("carol@uni.edu", "admin", &[]).await;
    as_user(&p, "u-mallory", "carol@uni.edu", false, &[]).await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 403);
    let linked: i64 = app.one("SELECT count(*) FROM external_identities WHERE subject LIKE '%u-mallory'").await;
    assert_eq!(linked, 0);
}

#[tokio::test]
async fn local_passwords_off_leaves_only_the_break_glass_admin() {
    let Some(p) = provider() else { return };
    let s = sso(&[
        "--oidc-issuer", &p.url, "--oidc-client-id", "gpuslice-test", "--oidc-client-secret", "s3cret",
        "--local-passwords", "off", "--break-glass-admin", "root@uni.edu",
    ]);
    let app = TestApp::spawn_configured(Default::default(), |st| st.sso = std::sync::Arc::new(s)).await;
    app.user("root@uni.edu", "admin", &[]).await;
    app.user("ana@uni.edu", "none", &[]).await;
    let r = app.login_as(&app.client(), "ana@uni.edu", common::PASSWORD).await;
    assert_eq!(r.status(), 401);
    let r = app.login_as(&app.client(), "root@uni.edu", common::PASSWORD).await;
    assert_eq!(r.status(), 303);
    let page = app.client().get(app.url("/login")).send().await.unwrap().text().await.unwrap();
    assert!(page.contains("Administrator sign-in"), "{page}");
}
