//! Admin forms: tenants and quotas, users and memberships, the audit log.

mod common;

use common::TestApp;
use reqwest::StatusCode;

/// The page text with askama's quote escapes undone, for matching messages.
fn unescape(html: &str) -> String {
    html.replace("&#34;", "\"")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
}

fn quota_form<'a>(name: &'a str, overrides: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut f = vec![
        ("name", name),
        ("max_active_bookings", "3"),
        ("max_gpu_memory_gib", "80"),
        ("max_compute_slices", "7"),
        ("default_priority", "high"),
        ("guaranteed_share_pct", "25"),
        ("monthly_slice_hours", "1000"),
        ("max_booking_hours", "48"),
        ("allowed_models", "H100-80GB, A100-80GB"),
        ("allowed_profiles", ""),
    ];
    for (k, v) in overrides {
        f.retain(|(key, _)| key != k);
        f.push((k, v));
    }
    f
}

async fn quota_row(
    app: &TestApp,
    id: i64,
) -> (String, i32, i32, i32, String, i32, i32, i32, Vec<String>) {
    sqlx::query_as(
        "SELECT name, max_active_bookings, max_gpu_memory_gib, max_compute_slices, default_priority,
                guaranteed_share_pct, monthly_slice_hours, max_booking_hours, allowed_models
         FROM tenants WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn admin_edits_a_quota_and_it_is_saved_and_audited() {
    let app = TestApp::spawn().await;
    let id = app.tenant("vision-lab").await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;
    let page = format!("/admin/tenants/{id}");
    let r = app
        .post_form(&admin, &page, &page, &quota_form("Vision Lab", &[]))
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let row = quota_row(&app, id).await;
    assert_eq!(
        row,
        (
            "Vision Lab".into(),
            3,
            80,
            7,
            "high".into(),
            25,
            1000,
            48,
            vec!["H100-80GB".into(), "A100-80GB".into()]
        )
    );
    let body = admin
        .get(app.url(&page))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("Tenant Vision Lab saved."),
        "a confirmation is shown once"
    );
    assert!(body.contains("name=\"max_active_bookings\" type=\"number\" value=\"3\""));
    let (action, detail): (String, serde_json::Value) =
        sqlx::query_as("SELECT action, detail FROM audit_log WHERE action = 'tenant.updated'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(action, "tenant.updated");
    assert_eq!(detail["before"]["quota"]["max_active_bookings"], 2);
    assert_eq!(detail["after"]["quota"]["max_active_bookings"], 3);
}

#[tokio::test]
async fn bad_quota_values_get_a_message_per_field_and_change_nothing() {
    let app = TestApp::spawn().await;
    let id = app.tenant("vision-lab").await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;
    let before = quota_row(&app, id).await;
    let page = format!("/admin/tenants/{id}");
    let bad = quota_form(
        "",
        &[
            ("max_active_bookings", "-1"),
            ("max_gpu_memory_gib", "lots"),
            ("max_compute_slices", "99999999"),
            ("guaranteed_share_pct", "150"),
            ("max_booking_hours", "0"),
            ("default_priority", "urgent"),
            ("allowed_models", "H100;DROP TABLE"),
        ],
    );
    let r = app.post_form(&admin, &page, &page, &bad).await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = unescape(&r.text().await.unwrap());
    for msg in [
        "enter a name",
        "may not be negative",
        "\"lots\" is not a whole number",
        "must be at most 10000 slices",
        "must be at most 100 %",
        "must be at least 1 hours",
        "unknown priority \"urgent\"",
        "is not a model or profile name",
    ] {
        assert!(body.contains(msg), "missing message {msg:?}");
    }
    assert!(
        body.contains("value=\"lots\""),
        "the form keeps what was typed"
    );
    assert_eq!(quota_row(&app, id).await, before, "nothing was saved");
    let n: i64 = app
        .one("SELECT count(*) FROM audit_log WHERE action = 'tenant.updated'")
        .await;
    assert_eq!(n, 0);
}

#[tokio::test]
async fn creating_a_tenant_checks_the_slug() {
    let app = TestApp::spawn().await;
    app.tenant("vision-lab").await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;
    let mut form = quota_form("Again", &[]);
    form.push(("slug", "vision-lab"));
    let r = app
        .post_form(&admin, "/admin/tenants/new", "/admin/tenants", &form)
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(unescape(&r.text().await.unwrap()).contains("the slug \"vision-lab\" is taken"));
    let mut form = quota_form("Bad", &[]);
    form.push(("slug", "Bad Slug"));
    let r = app
        .post_form(&admin, "/admin/tenants/new", "/admin/tenants", &form)
        .await;
    assert!(r.text().await.unwrap().contains("lower-case letters"));
    let mut form = quota_form("NLP Group", &[]);
    form.push(("slug", "nlp"));
    let r = app
        .post_form(&admin, "/admin/tenants/new", "/admin/tenants", &form)
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let list = admin
        .get(app.url("/admin/tenants"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(list.contains("NLP Group") && list.contains("Tenant vision-lab"));
}

#[tokio::test]
async fn a_quota_edit_waits_for_the_tenant_row_lock() {
    let app = TestApp::spawn().await;
    let id = app.tenant("vision-lab").await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;
    let page = format!("/admin/tenants/{id}");
    let token = app.csrf(&admin, &page).await;
    // A quota check (as a booking makes it) holds the tenant's row lock.
    let mut tx = app.pool.begin().await.unwrap();
    sqlx::query("SELECT id FROM tenants WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await
        .unwrap();
    let mut form = quota_form("Edited", &[]);
    form.push(("csrf_token", token.as_str()));
    let form: Vec<(String, String)> = form
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let url = app.url(&page);
    let edit =
        tokio::spawn(async move { admin.post(url).form(&form).send().await.unwrap().status() });
    // The edit's own `SELECT ... FOR UPDATE` queues behind the held lock.
    let mut waiting = false;
    for _ in 0..200 {
        waiting = app.one("SELECT EXISTS (SELECT 1 FROM pg_stat_activity
                            WHERE wait_event_type = 'Lock' AND query LIKE '%FROM tenants WHERE id = $1 FOR UPDATE%')").await;
        if waiting || edit.is_finished() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(waiting, "the edit waits for the tenant's row lock");
    assert!(!edit.is_finished());
    let name: String = sqlx::query_scalar("SELECT name FROM tenants WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(name, "Tenant vision-lab");
    // ...and goes through once it is released.
    tx.commit().await.unwrap();
    assert_eq!(edit.await.unwrap(), StatusCode::SEE_OTHER);
    assert_eq!(quota_row(&app, id).await.0, "Edited");
}

#[tokio::test]
async fn admin_manages_users_and_memberships() {
    let app = TestApp::spawn().await;
    let lab = app.tenant("vision-lab").await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;

    // Bad input: one message per field, nothing created.
    let r = app
        .post_form(
            &admin,
            "/admin/users/new",
            "/admin/users",
            &[
                ("email", "not-an-address"),
                ("display_name", ""),
                ("password", "short"),
                ("global_role", "root"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = r.text().await.unwrap();
    assert!(body.contains("is not an e-mail address"));
    assert!(body.contains("enter a display name"));
    assert!(body.contains("at least 15 characters"));
    assert!(body.contains("unknown role"));
    let r = app
        .post_form(
            &admin,
            "/admin/users/new",
            "/admin/users",
            &[
                ("email", "sam@uni.edu"),
                ("display_name", "Sam"),
                ("password", "passwordpassword"),
                ("global_role", "none"),
            ],
        )
        .await;
    assert!(r.text().await.unwrap().contains("too common"));
    let users: i64 = app.one("SELECT count(*) FROM users").await;
    assert_eq!(users, 1);

    let r = app
        .post_form(
            &admin,
            "/admin/users/new",
            "/admin/users",
            &[
                ("email", "Sam@Uni.edu"),
                ("display_name", "Sam <b>Student</b>"),
                ("password", "sams own long passphrase"),
                ("global_role", "none"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let uid: i64 = app
        .one("SELECT id FROM users WHERE email = 'sam@uni.edu'")
        .await;
    let page = format!("/admin/users/{uid}");
    let r = app
        .post_form(
            &admin,
            &page,
            &format!("{page}/memberships"),
            &[("tenant_id", &lab.to_string()), ("role", "manager")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let role: String = sqlx::query_scalar("SELECT role FROM memberships WHERE user_id = $1")
        .bind(uid)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(role, "manager");
    // Names are escaped wherever they are shown.
    let list = admin
        .get(app.url("/admin/users"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        list.contains("Sam &#60;b&#62;Student&#60;/b&#62;")
            || list.contains("Sam &lt;b&gt;Student&lt;/b&gt;"),
        "escaped: {list}"
    );
    assert!(!list.contains("<b>Student</b>"));
    // Duplicate address.
    let r = app
        .post_form(
            &admin,
            "/admin/users/new",
            "/admin/users",
            &[
                ("email", "sam@uni.edu"),
                ("display_name", "Sam"),
                ("password", "sams own long passphrase"),
                ("global_role", "none"),
            ],
        )
        .await;
    assert!(r.text().await.unwrap().contains("already has an account"));
    // An admin cannot lock themselves out.
    let me: i64 = app
        .one("SELECT id FROM users WHERE email = 'admin@uni.edu'")
        .await;
    let r = app
        .post_form(
            &admin,
            "/admin/users",
            &format!("/admin/users/{me}/disable"),
            &[],
        )
        .await;
    assert_eq!(r.status(), StatusCode::CONFLICT);
    let r = app
        .post_form(
            &admin,
            "/admin/users",
            &format!("/admin/users/{me}"),
            &[("display_name", "Me"), ("global_role", "none")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let role: String = sqlx::query_scalar("SELECT global_role FROM users WHERE id = $1")
        .bind(me)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(role, "admin");

    // The audit log shows who did what.
    let audit = admin
        .get(app.url("/admin/audit?action=membership."))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        audit.contains("membership.set")
            && audit.contains("admin@uni.edu")
            && audit.contains("127.0.0.1")
    );
    assert!(!audit.contains("user.created"), "the filter applies");
}

#[tokio::test]
async fn archived_tenants_are_marked_and_restorable() {
    let app = TestApp::spawn().await;
    let id = app.tenant("old-course").await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;
    let page = format!("/admin/tenants/{id}");
    let r = app
        .post_form(&admin, &page, &format!("{page}/archive"), &[])
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let archived: bool = app.one("SELECT archived FROM tenants").await;
    assert!(archived);
    let body = admin
        .get(app.url(&page))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("Restore"));
    app.post_form(&admin, &page, &format!("{page}/restore"), &[])
        .await;
    let archived: bool = app.one("SELECT archived FROM tenants").await;
    assert!(!archived);
}

#[tokio::test]
async fn admins_link_a_users_unix_account_for_exec() {
    let app = TestApp::spawn().await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let ana = app.user("ana@uni.edu", "none", &[]).await;
    let c = app.signed_in("admin@uni.edu").await;
    let page = format!("/admin/users/{ana}");
    let r = app
        .post_form(
            &c,
            &page,
            &format!("{page}/unix-user"),
            &[("unix_user", "Ana Smith")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("is not a Unix account name"));
    let stored: Option<String> = sqlx::query_scalar("SELECT unix_user FROM users WHERE id = $1")
        .bind(ana)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored, None, "a bad name changes nothing");
    let r = app
        .post_form(
            &c,
            &page,
            &format!("{page}/unix-user"),
            &[("unix_user", "ana")],
        )
        .await;
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let stored: Option<String> = sqlx::query_scalar("SELECT unix_user FROM users WHERE id = $1")
        .bind(ana)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(stored.as_deref(), Some("ana"));
    let body = c
        .get(app.url(&page))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(body.contains("value=\"ana\""));
}

#[tokio::test]
async fn the_tenant_form_sets_the_idle_policy_and_refuses_bad_values() {
    let app = TestApp::spawn().await;
    let id = app.tenant("lab").await;
    app.user("admin@uni.edu", "admin", &[]).await;
    let admin = app.signed_in("admin@uni.edu").await;
    let page = format!("/admin/tenants/{id}");
    let body = admin
        .get(app.url(&page))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("name=\"idle_after_minutes\""),
        "the form shows the policy"
    );
    let bad = quota_form(
        "Lab",
        &[("idle_after_minutes", "-5"), ("idle_action", "shred")],
    );
    let r = app.post_form(&admin, &page, &page, &bad).await;
    assert_eq!(r.status(), reqwest::StatusCode::UNPROCESSABLE_ENTITY);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("between 0 and 10080") && text.contains("notify or release"),
        "{text}"
    );
    let n: i32 = sqlx::query_scalar("SELECT idle_after_minutes FROM tenants WHERE id = $1")
        .bind(id)
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(n, 0, "a refused form changes nothing");
    let good = quota_form(
        "Lab",
        &[
            ("idle_after_minutes", "60"),
            ("idle_grace_minutes", "20"),
            ("idle_action", "release"),
        ],
    );
    let r = app.post_form(&admin, &page, &page, &good).await;
    assert_eq!(r.status(), reqwest::StatusCode::SEE_OTHER);
    let row: (i32, i32, String) = sqlx::query_as(
        "SELECT idle_after_minutes, idle_grace_minutes, idle_action FROM tenants WHERE id = $1",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(row, (60, 20, "release".to_string()));
}
