//! Every route with every role: who may and who may not. Anyone outside a
//! tenant learns nothing about it; only admins change tenants and users.

mod common;

use common::TestApp;
use reqwest::{Client, StatusCode};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Role {
    Anonymous,
    Member,
    Manager,
    Outsider,
    Finance,
    Admin,
}

const ROLES: [Role; 6] = [
    Role::Anonymous,
    Role::Member,
    Role::Manager,
    Role::Outsider,
    Role::Finance,
    Role::Admin,
];

struct World {
    app: TestApp,
    lab: i64,
    member_id: i64,
    booking: i64,
}

async fn world() -> World {
    let app = TestApp::spawn().await;
    let lab = app.tenant("lab-a").await;
    app.tenant("lab-b").await;
    let member_id = app.user("member@uni.edu", "none", &["lab-a"]).await;
    app.user("manager@uni.edu", "none", &["lab-a:manager"])
        .await;
    app.user("outsider@uni.edu", "none", &["lab-b:manager"])
        .await;
    app.user("finance@uni.edu", "finance", &[]).await;
    app.user("admin@uni.edu", "admin", &[]).await;
    // The member's queued booking (no GPUs here).
    let booking: i64 = sqlx::query_scalar(
        "INSERT INTO bookings (tenant_id, user_id, kind, profile, memory_gib, compute_slices, priority,
                               hours, during, status, reason)
         VALUES ($1, $2, 'mig', '1g.10gb', 10, 1, 'normal', 1,
                 tstzrange(now(), now() + interval '1 hour'), 'queued', 'waiting')
         RETURNING id",
    )
    .bind(lab)
    .bind(member_id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    World {
        app,
        lab,
        member_id,
        booking,
    }
}

async fn client_for(w: &World, role: Role) -> Client {
    let email = match role {
        Role::Anonymous => return w.app.client(),
        Role::Member => "member@uni.edu",
        Role::Manager => "manager@uni.edu",
        Role::Outsider => "outsider@uni.edu",
        Role::Finance => "finance@uni.edu",
        Role::Admin => "admin@uni.edu",
    };
    w.app.signed_in(email).await
}

fn expect_get(path: &str, role: Role) -> StatusCode {
    use Role::*;
    let signed_in = role != Anonymous;
    match path {
        "/healthz" | "/readyz" | "/metrics" | "/api/v1/openapi.json" => StatusCode::OK,
        p if p.starts_with("/static/") => StatusCode::OK,
        "/login" if signed_in => StatusCode::SEE_OTHER,
        "/login" => StatusCode::OK,
        p if (p.starts_with("/api/") || p.contains(".csv")) && !signed_in => {
            StatusCode::UNAUTHORIZED
        }
        _ if !signed_in => StatusCode::SEE_OTHER,
        "/" | "/settings/tokens" | "/api/v1/me" | "/api/v1/tenants" => StatusCode::OK,
        "/bookings" | "/bookings/new" | "/api/v1/offerings" | "/api/v1/bookings" => StatusCode::OK,
        "/usage" | "/api/v1/usage" => StatusCode::OK,
        "/usage?tenant=lab-a" | "/api/v1/usage?tenant=lab-a" => match role {
            Manager | Admin | Finance => StatusCode::OK,
            Member => StatusCode::FORBIDDEN,
            _ => StatusCode::NOT_FOUND,
        },
        "/reports" => match role {
            Finance | Admin => StatusCode::OK,
            _ => StatusCode::FORBIDDEN,
        },
        "/reports/usage.csv?from=2026-01-01&to=2026-01-31" => match role {
            Finance | Admin => StatusCode::OK,
            _ => StatusCode::FORBIDDEN,
        },
        "/bookings?scope=all" | "/api/v1/bookings?scope=all" => match role {
            Admin => StatusCode::OK,
            _ => StatusCode::FORBIDDEN,
        },
        "/bookings?scope=tenant&tenant=lab-a" | "/api/v1/bookings?tenant=lab-a" => match role {
            Manager | Admin => StatusCode::OK,
            Member => StatusCode::FORBIDDEN,
            _ => StatusCode::NOT_FOUND,
        },
        "/bookings/{booking}" | "/api/v1/bookings/{booking}" => match role {
            Member | Manager | Admin | Finance => StatusCode::OK,
            _ => StatusCode::NOT_FOUND,
        },
        "/tenants/lab-a" => match role {
            Member | Manager | Admin => StatusCode::OK,
            _ => StatusCode::NOT_FOUND,
        },
        p if p.starts_with("/admin") => match role {
            Admin => StatusCode::OK,
            _ => StatusCode::FORBIDDEN,
        },
        other => panic!("no expectation for {other}"),
    }
}

#[tokio::test]
async fn every_page_checks_role_and_tenant() {
    let w = world().await;
    let pages = [
        "/".to_string(),
        "/login".into(),
        "/tenants/lab-a".into(),
        "/settings/tokens".into(),
        "/admin/tenants".into(),
        "/admin/tenants/new".into(),
        format!("/admin/tenants/{}", w.lab),
        "/admin/users".into(),
        "/admin/users/new".into(),
        format!("/admin/users/{}", w.member_id),
        "/admin/audit".into(),
        "/admin/fleet".into(),
        "/api/v1/me".into(),
        "/api/v1/tenants".into(),
        "/api/v1/openapi.json".into(),
        "/bookings".into(),
        "/bookings/new".into(),
        "/usage".into(),
        "/usage?tenant=lab-a".into(),
        "/api/v1/usage".into(),
        "/api/v1/usage?tenant=lab-a".into(),
        "/reports".into(),
        "/reports/usage.csv?from=2026-01-01&to=2026-01-31".into(),
        "/admin/tariffs".into(),
        "/bookings?scope=all".into(),
        "/bookings?scope=tenant&tenant=lab-a".into(),
        format!("/bookings/{}", w.booking),
        "/api/v1/offerings".into(),
        "/api/v1/bookings".into(),
        "/api/v1/bookings?scope=all".into(),
        "/api/v1/bookings?tenant=lab-a".into(),
        format!("/api/v1/bookings/{}", w.booking),
        "/healthz".into(),
        "/readyz".into(),
        "/metrics".into(),
        "/static/app.css".into(),
    ];
    let mut failures = Vec::new();
    for role in ROLES {
        let c = client_for(&w, role).await;
        for page in &pages {
            let generic = page
                .replace(&format!("/{}", w.lab), "/{id}")
                .replace(&format!("/{}", w.member_id), "/{id}");
            let booking_page = format!("/bookings/{}", w.booking);
            let key = if generic.ends_with("/{id}") && generic.starts_with("/admin") {
                "/admin/x"
            } else if page.ends_with(&booking_page) {
                if page.starts_with("/api/") {
                    "/api/v1/bookings/{booking}"
                } else {
                    "/bookings/{booking}"
                }
            } else {
                page.as_str()
            };
            let want = expect_get(key, role);
            let got = c.get(w.app.url(page)).send().await.unwrap().status();
            if got != want {
                failures.push(format!("GET {page} as {role:?}: got {got}, want {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// State-changing admin routes with a valid body and CSRF token.
fn admin_posts(w: &World) -> Vec<(String, Vec<(&'static str, String)>)> {
    let quota = |slug: &str| {
        vec![
            ("slug", slug.to_string()),
            ("name", "New Lab".to_string()),
            ("max_active_bookings", "2".into()),
            ("max_gpu_memory_gib", "40".into()),
            ("max_compute_slices", "7".into()),
            ("default_priority", "normal".into()),
            ("guaranteed_share_pct", "10".into()),
            ("monthly_slice_hours", "100".into()),
            ("max_booking_hours", "8".into()),
        ]
    };
    let (lab, uid) = (w.lab, w.member_id);
    vec![
        ("/admin/tenants".into(), quota("new-lab")),
        (format!("/admin/tenants/{lab}"), quota("")),
        (format!("/admin/tenants/{lab}/archive"), vec![]),
        (format!("/admin/tenants/{lab}/restore"), vec![]),
        (
            "/admin/users".into(),
            vec![
                ("email", "new@uni.edu".into()),
                ("display_name", "New".into()),
                ("password", "another long password here".into()),
                ("global_role", "none".into()),
            ],
        ),
        (
            format!("/admin/users/{uid}"),
            vec![
                ("display_name", "Renamed".into()),
                ("global_role", "none".into()),
            ],
        ),
        (
            format!("/admin/users/{uid}/password"),
            vec![("password", "reset to this long one".into())],
        ),
        (
            format!("/admin/users/{uid}/memberships"),
            vec![("tenant_id", lab.to_string()), ("role", "manager".into())],
        ),
        (
            format!("/admin/users/{uid}/memberships/{lab}/remove"),
            vec![],
        ),
        (
            format!("/admin/users/{uid}/unix-user"),
            vec![("unix_user", "nobody".into())],
        ),
        (format!("/admin/users/{uid}/disable"), vec![]),
        (format!("/admin/users/{uid}/enable"), vec![]),
    ]
}

async fn changes(w: &World) -> i64 {
    w.app
        .one(
            "SELECT count(*) FROM audit_log WHERE action NOT LIKE 'login.%' AND action <> 'logout'",
        )
        .await
}

#[tokio::test]
async fn only_admins_change_tenants_and_users() {
    let w = world().await;
    let before = changes(&w).await;
    let mut failures = Vec::new();
    for role in ROLES.into_iter().filter(|r| *r != Role::Admin) {
        let c = client_for(&w, role).await;
        let page = if role == Role::Anonymous {
            "/login"
        } else {
            "/settings/tokens"
        };
        for (path, fields) in admin_posts(&w) {
            let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let got = w.app.post_form(&c, page, &path, &fields).await.status();
            let want = if role == Role::Anonymous {
                StatusCode::UNAUTHORIZED
            } else {
                StatusCode::FORBIDDEN
            };
            if got != want {
                failures.push(format!("POST {path} as {role:?}: got {got}, want {want}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        changes(&w).await,
        before,
        "refused requests changed nothing"
    );

    // The admin may do every one of them.
    let admin = client_for(&w, Role::Admin).await;
    for (path, fields) in admin_posts(&w) {
        let fields: Vec<(&str, &str)> = fields.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let r = w
            .app
            .post_form(&admin, "/admin/tenants", &path, &fields)
            .await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER, "POST {path} as admin");
    }
    assert_eq!(
        changes(&w).await,
        before + admin_posts(&w).len() as i64,
        "each change is audited"
    );
}

#[tokio::test]
async fn members_see_quota_managers_see_people() {
    let w = world().await;
    let member = client_for(&w, Role::Member).await;
    let page = member
        .get(w.app.url("/tenants/lab-a"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("Quota"));
    assert!(
        !page.contains("manager@uni.edu"),
        "members do not see the member list"
    );
    let manager = client_for(&w, Role::Manager).await;
    let page = manager
        .get(w.app.url("/tenants/lab-a"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("member@uni.edu"));
    // The outsider cannot even tell the tenant exists.
    let outsider = client_for(&w, Role::Outsider).await;
    let missing = outsider
        .get(w.app.url("/tenants/no-such-lab"))
        .send()
        .await
        .unwrap();
    let hidden = outsider
        .get(w.app.url("/tenants/lab-a"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), hidden.status());
    assert_eq!(
        missing
            .text()
            .await
            .unwrap()
            .replace(|c: char| !c.is_ascii_alphabetic(), ""),
        hidden
            .text()
            .await
            .unwrap()
            .replace(|c: char| !c.is_ascii_alphabetic(), "")
    );
}

#[tokio::test]
async fn signed_in_api_via_session_lists_only_own_tenants() {
    let w = world().await;
    let outsider = client_for(&w, Role::Outsider).await;
    let v: serde_json::Value = outsider
        .get(w.app.url("/api/v1/tenants"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let slugs: Vec<_> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["slug"].clone())
        .collect();
    assert_eq!(slugs, ["lab-b"]);
    let admin = client_for(&w, Role::Admin).await;
    let v: serde_json::Value = admin
        .get(w.app.url("/api/v1/tenants"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["tenants"].as_array().unwrap().len(), 2);
}
