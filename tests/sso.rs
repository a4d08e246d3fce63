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

/// A server with single sign-on configured by `args` (flags as on the
/// command line).
async fn app_with(args: &[&str]) -> TestApp {
    let s = std::sync::Arc::new(sso(args));
    TestApp::spawn_configured(Default::default(), |st| st.sso = s).await
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
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/oidc_provider.py"
    );
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
    assert!(
        authorize.contains("code_challenge_method=S256") && authorize.contains("nonce="),
        "{authorize}"
    );
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
    let app = app_with(&[
        "--oidc-issuer",
        &p.url,
        "--oidc-client-id",
        "gpuslice-test",
        "--oidc-client-secret",
        "s3cret",
        "--oidc-name",
        "Uni Login",
        "--sso-groups",
        MAPPING,
    ])
    .await;
    app.tenant("vision-lab").await;
    app.tenant("other").await;
    let login = app
        .client()
        .get(app.url("/login"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(login.contains("Sign in with Uni Login"), "{login}");

    // An invitation waits for her address in another tenant.
    sqlx::query(
        "INSERT INTO invitations (tenant_id, email, role, token_hash, expires_at)
         SELECT id, 'ana@uni.edu', 'member', 'h', now() + interval '1 day' FROM tenants WHERE slug = 'other'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    // First sign-in: the account is made, the group grants membership.
    as_user(
        &p,
        "u-ana",
        "ana@uni.edu",
        true,
        &["gpu-vision-lab", "unrelated"],
    )
    .await;
    let browser = app.client();
    let r = sign_in(&app, &browser).await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(location(&r), "/tenants/vision-lab");
    let page = browser
        .get(app.url("/tenants/vision-lab"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(
        roles(&app, "ana@uni.edu").await,
        (
            "none".into(),
            vec![
                t("other", "member", "manual"),
                t("vision-lab", "member", "sso")
            ]
        ),
        "the group's membership, and the invitation accepted at a verified sign-in"
    );
    let created: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'user.created' AND detail->>'via' = 'oidc'")
        .await;
    assert_eq!(created, 1);
    // No password opens a single sign-on account.
    let r = app
        .login_as(&app.client(), "ana@uni.edu", common::PASSWORD)
        .await;
    assert_eq!(r.status(), 401);

    // The manual membership (the invitation's) stays whatever the groups say.
    // Groups change: manager and admin at the next sign-in.
    as_user(
        &p,
        "u-ana",
        "ana@uni.edu",
        true,
        &["gpu-vision-pis", "gpu-admins"],
    )
    .await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        roles(&app, "ana@uni.edu").await,
        (
            "admin".into(),
            vec![
                t("other", "member", "manual"),
                t("vision-lab", "manager", "sso")
            ]
        )
    );
    // Groups gone: what the mapping granted goes, the manual one stays.
    as_user(&p, "u-ana", "ana@uni.edu", true, &[]).await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        roles(&app, "ana@uni.edu").await,
        ("none".into(), vec![t("other", "member", "manual")])
    );
    // Each change audited: member, then manager and admin, then both taken back.
    let changes: Vec<(String, i64)> = sqlx::query_as(
        "SELECT action, count(*) FROM audit_log WHERE action LIKE 'sso.%' GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(
        changes,
        vec![
            ("sso.membership".into(), 2),
            ("sso.membership.removed".into(), 1),
            ("sso.role".into(), 2)
        ]
    );
}

#[tokio::test]
async fn oidc_refuses_tampered_tokens_wrong_nonces_replayed_codes_and_unverified_links() {
    let Some(p) = provider() else { return };
    let app = app_with(&[
        "--oidc-issuer",
        &p.url,
        "--oidc-client-id",
        "gpuslice-test",
        "--oidc-client-secret",
        "s3cret",
        "--sso-groups",
        MAPPING,
    ])
    .await;
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
        ("expired", "did not verify"),
        ("hs256", "did not verify"),
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
    let code = back
        .split("code=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    let replay = format!(
        "{}?code={code}&state={state}",
        app.url("/auth/oidc/callback")
    );
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

    // An unverified address never opens someone's existing account, nor
    // makes a new one (nor collects that address's invitations).
    app.user("carol@uni.edu", "admin", &[]).await;
    as_user(&p, "u-mallory", "carol@uni.edu", false, &[]).await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 403);
    as_user(&p, "u-mallory", "dave@uni.edu", false, &[]).await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 403);
    let linked: i64 = app
        .one("SELECT count(*) FROM external_identities WHERE subject LIKE '%u-mallory'")
        .await;
    assert_eq!(linked, 0);
    let dave: i64 = app
        .one("SELECT count(*) FROM users WHERE email = 'dave@uni.edu'")
        .await;
    assert_eq!(dave, 0);
    // A second identity of the provider cannot take over an account that
    // already has one.
    as_user(&p, "u-bob-2", "bob@uni.edu", true, &[]).await;
    let r = sign_in(&app, &app.client()).await;
    assert_eq!(r.status(), 403);
    // Keys and tokens over plain HTTP only on this machine.
    let w = Settings::try_parse_from([
        "gpuslice",
        "--oidc-issuer",
        "http://login.uni.edu",
        "--oidc-client-id",
        "x",
    ])
    .unwrap();
    let e = gpuslice::web::sso::Sso::from_args(&w.sso)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("https://"), "{e}");
}

#[tokio::test]
async fn local_passwords_off_leaves_only_the_break_glass_admin() {
    let Some(p) = provider() else { return };
    let app = app_with(&[
        "--oidc-issuer",
        &p.url,
        "--oidc-client-id",
        "gpuslice-test",
        "--oidc-client-secret",
        "s3cret",
        "--local-passwords",
        "off",
        "--break-glass-admin",
        "root@uni.edu",
    ])
    .await;
    app.user("root@uni.edu", "admin", &[]).await;
    app.user("ana@uni.edu", "none", &[]).await;
    let r = app
        .login_as(&app.client(), "ana@uni.edu", common::PASSWORD)
        .await;
    assert_eq!(r.status(), 401);
    let r = app
        .login_as(&app.client(), "root@uni.edu", common::PASSWORD)
        .await;
    assert_eq!(r.status(), 303);
    let page = app
        .client()
        .get(app.url("/login"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Administrator sign-in"), "{page}");
}

/// OpenLDAP's slapd on LDAPS with a CA and certificate made here, stopped
/// when dropped.
struct Directory {
    child: Child,
    url: String,
    /// The same directory on plain LDAP, for StartTLS.
    plain_url: String,
    ca: std::path::PathBuf,
    _dir: tempdir::Dir,
}

impl Drop for Directory {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

mod tempdir {
    /// A folder removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

const PEOPLE: &str = "ou=people,dc=uni,dc=edu";

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn directory() -> Option<Directory> {
    let slapd = ["/usr/sbin/slapd", "/usr/local/sbin/slapd"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let (Some(slapd), true) = (
        slapd,
        Command::new("openssl").arg("version").output().is_ok(),
    ) else {
        common::skip_or_require(
            "LDAP sign-in",
            "OpenLDAP's slapd or openssl is not installed (scripts/test.sh installs them)",
        );
        return None;
    };
    if !std::path::Path::new("/etc/ldap/schema/inetorgperson.schema").exists() {
        common::skip_or_require(
            "LDAP sign-in",
            "slapd's schema files are missing (/etc/ldap/schema)",
        );
        return None;
    }
    let dir = std::env::temp_dir().join(format!(
        "gpuslice-ldap-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(dir.join("db")).unwrap();
    let d = |f: &str| dir.join(f).to_string_lossy().into_owned();
    // A CA and a certificate for 127.0.0.1 it signs.
    run(Command::new("openssl").args([
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=gpuslice test CA",
        "-keyout",
        &d("ca.key"),
        "-out",
        &d("ca.pem"),
    ]));
    run(Command::new("openssl").args([
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        &d("server.key"),
        "-out",
        &d("server.csr"),
    ]));
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    run(Command::new("openssl").args([
        "x509",
        "-req",
        "-in",
        &d("server.csr"),
        "-CA",
        &d("ca.pem"),
        "-CAkey",
        &d("ca.key"),
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        &d("san.ext"),
        "-out",
        &d("server.pem"),
    ]));
    let conf = format!(
        "include /etc/ldap/schema/core.schema\n\
         include /etc/ldap/schema/cosine.schema\n\
         include /etc/ldap/schema/inetorgperson.schema\n\
         modulepath /usr/lib/ldap\n\
         moduleload back_mdb\n\
         pidfile {pid}\n\
         TLSCACertificateFile {ca}\n\
         TLSCertificateFile {cert}\n\
         TLSCertificateKeyFile {key}\n\
         database mdb\n\
         maxsize 10485760\n\
         suffix \"dc=uni,dc=edu\"\n\
         rootdn \"cn=admin,dc=uni,dc=edu\"\n\
         rootpw directory-admin-secret\n\
         directory {db}\n\
         access to attrs=userPassword by self write by anonymous auth by * none\n\
         access to * by * read\n",
        pid = d("slapd.pid"),
        ca = d("ca.pem"),
        cert = d("server.pem"),
        key = d("server.key"),
        db = d("db"),
    );
    std::fs::write(dir.join("slapd.conf"), conf).unwrap();
    let ldif = format!(
        "dn: dc=uni,dc=edu\nobjectClass: dcObject\nobjectClass: organization\no: Uni\ndc: uni\n\n\
         dn: {PEOPLE}\nobjectClass: organizationalUnit\nou: people\n\n\
         dn: ou=groups,dc=uni,dc=edu\nobjectClass: organizationalUnit\nou: groups\n\n\
         dn: uid=dana,{PEOPLE}\nobjectClass: inetOrgPerson\nuid: dana\ncn: Dana Scully\nsn: Scully\nmail: Dana@Uni.edu\nuserPassword: dana campus passphrase\n\n\
         dn: uid=erin,{PEOPLE}\nobjectClass: inetOrgPerson\nuid: erin\ncn: Erin\nsn: Erin\nmail: erin@uni.edu\nuserPassword: erin campus passphrase\n\n\
         dn: cn=gpu-vision-pis,ou=groups,dc=uni,dc=edu\nobjectClass: groupOfNames\ncn: gpu-vision-pis\nmember: uid=dana,{PEOPLE}\n"
    );
    std::fs::write(dir.join("data.ldif"), ldif).unwrap();
    run(Command::new("/usr/sbin/slapadd").args(["-f", &d("slapd.conf"), "-l", &d("data.ldif")]));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("ldaps://127.0.0.1:{port}/");
    let plain_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let plain_url = format!("ldap://127.0.0.1:{plain_port}/");
    let child = Command::new(slapd)
        .args([
            "-f",
            &d("slapd.conf"),
            "-h",
            &format!("{url} {plain_url}"),
            "-d",
            "0",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(started.elapsed().as_secs() < 20, "slapd did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    while std::net::TcpStream::connect(("127.0.0.1", plain_port)).is_err() {
        assert!(started.elapsed().as_secs() < 20, "slapd did not start");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Some(Directory {
        child,
        url,
        plain_url,
        ca: dir.join("ca.pem"),
        _dir: tempdir::Dir(dir),
    })
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

#[tokio::test]
async fn ldap_binds_as_the_person_over_tls_and_maps_their_groups() {
    let Some(dir) = directory() else { return };
    let ca = dir.ca.to_string_lossy().into_owned();
    let app = app_with(&[
        "--ldap-url",
        &dir.url,
        "--ldap-ca-file",
        &ca,
        "--ldap-bind-dn",
        "cn=admin,dc=uni,dc=edu",
        "--ldap-bind-password",
        "directory-admin-secret",
        "--ldap-user-base",
        PEOPLE,
        "--ldap-group-base",
        "ou=groups,dc=uni,dc=edu",
        "--sso-groups",
        MAPPING,
    ])
    .await;
    app.tenant("vision-lab").await;
    let page = app
        .client()
        .get(app.url("/login"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("campus user name"), "{page}");

    // By user name: the account is made, the group makes a manager.
    let r = app
        .login_as(&app.client(), "dana", "dana campus passphrase")
        .await;
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(
        roles(&app, "dana@uni.edu").await,
        ("none".into(), vec![t("vision-lab", "manager", "sso")])
    );
    // By address, the same account.
    let r = app
        .login_as(&app.client(), "dana@uni.edu", "dana campus passphrase")
        .await;
    assert_eq!(r.status(), 303);
    let accounts: i64 = app.one("SELECT count(*) FROM users").await;
    assert_eq!(accounts, 1);
    let via: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'login.succeeded' AND detail->>'via' = 'ldap'")
        .await;
    assert_eq!(via, 2);
    // Someone without groups gets an account and no tenant.
    let r = app
        .login_as(&app.client(), "erin", "erin campus passphrase")
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(roles(&app, "erin@uni.edu").await, ("none".into(), vec![]));

    // Wrong password, empty password (an unauthenticated bind would pass),
    // a filter wildcard, nobody.
    for (who, pw) in [
        ("dana", "wrong"),
        ("dana", ""),
        ("*", "dana campus passphrase"),
        ("nobody", "x"),
    ] {
        let r = app.login_as(&app.client(), who, pw).await;
        assert_eq!(r.status(), 401, "{who}/{pw}");
    }
    let failed: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'login.failed'")
        .await;
    assert_eq!(failed, 4);

    // StartTLS on the plain port works the same.
    let starttls = app_with(&[
        "--ldap-url",
        &dir.plain_url,
        "--ldap-starttls",
        "--ldap-ca-file",
        &ca,
        "--ldap-bind-dn",
        "cn=admin,dc=uni,dc=edu",
        "--ldap-bind-password",
        "directory-admin-secret",
        "--ldap-user-base",
        PEOPLE,
    ])
    .await;
    let r = starttls
        .login_as(&starttls.client(), "erin", "erin campus passphrase")
        .await;
    assert_eq!(r.status(), 303, "StartTLS sign-in");

    // Passwords never cross in the clear: plain ldap:// without StartTLS
    // is refused when the server starts.
    let w = Settings::try_parse_from([
        "gpuslice",
        "--ldap-url",
        "ldap://127.0.0.1:389",
        "--ldap-user-base",
        PEOPLE,
    ])
    .unwrap();
    let e = gpuslice::web::sso::Sso::from_args(&w.sso)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("never sent in the clear"), "{e}");
}
