//! Managers run their tenant: add an existing account or invite an address
//! (the link makes the account), change roles, remove members (never the
//! last manager), and ask for more quota; admins approve, amend or decline
//! in a queue; the requester hears by e-mail; everything is audited, and
//! members and outsiders can do none of it.

mod common;

use common::TestApp;

async fn setup() -> TestApp {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.tenant("other").await;
    app.user("pi@uni.edu", "none", &["lab:manager"]).await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    app.user("bob@uni.edu", "none", &["other"]).await;
    app.user("root@uni.edu", "admin", &[]).await;
    app
}

async fn role_of(app: &TestApp, email: &str, tenant: &str) -> Option<String> {
    sqlx::query_scalar(
        "SELECT m.role FROM memberships m JOIN users u ON u.id = m.user_id
         JOIN tenants t ON t.id = m.tenant_id WHERE u.email = $1 AND t.slug = $2",
    )
    .bind(email)
    .bind(tenant)
    .fetch_optional(&app.pool)
    .await
    .unwrap()
}

async fn user_id(app: &TestApp, email: &str) -> i64 {
    sqlx::query_scalar("SELECT id FROM users WHERE email = $1")
        .bind(email)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

async fn audited(app: &TestApp, action: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM audit_log WHERE action = $1")
        .bind(action)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_manager_adds_changes_and_removes_members_but_keeps_a_manager() {
    let app = setup().await;
    let pi = app.signed_in("pi@uni.edu").await;
    let page = "/tenants/lab";
    // The member list with this month's use.
    let body = app.text(&pi, page).await;
    assert!(
        body.contains("ana@uni.edu")
            && body.contains("Slice-hours this month")
            && body.contains("Add someone"),
        "{body}"
    );

    // An existing account joins at once.
    let r = app
        .post_form(
            &pi,
            page,
            "/tenants/lab/members",
            &[("email", "Bob@Uni.edu"), ("role", "member")],
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        role_of(&app, "bob@uni.edu", "lab").await.as_deref(),
        Some("member")
    );
    assert_eq!(audited(&app, "membership.set").await, 1);
    let told: i64 = app
        .one("SELECT count(*) FROM notifications WHERE recipient = 'bob@uni.edu' AND topic = 'membership'")
        .await;
    assert_eq!(told, 1);

    // Bad input: the page again with a message, nothing changed.
    let memberships: i64 = app.one("SELECT count(*) FROM memberships").await;
    let r = app
        .post_form(
            &pi,
            page,
            "/tenants/lab/members",
            &[("email", "not an address"), ("role", "owner")],
        )
        .await;
    assert_eq!(r.status(), 422);
    let body = r.text().await.unwrap();
    assert!(body.contains("field-error"), "{body}");
    let after: i64 = app.one("SELECT count(*) FROM memberships").await;
    assert_eq!(after, memberships);

    // Roles change both ways.
    let bob = user_id(&app, "bob@uni.edu").await;
    let r = app
        .post_form(
            &pi,
            page,
            &format!("/tenants/lab/members/{bob}/role"),
            &[("role", "manager")],
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        role_of(&app, "bob@uni.edu", "lab").await.as_deref(),
        Some("manager")
    );
    let r = app
        .post_form(
            &pi,
            page,
            &format!("/tenants/lab/members/{bob}/remove"),
            &[],
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(role_of(&app, "bob@uni.edu", "lab").await, None);
    assert_eq!(
        role_of(&app, "bob@uni.edu", "other").await.as_deref(),
        Some("member"),
        "other tenants untouched"
    );

    // The last manager cannot step down or leave.
    let me = user_id(&app, "pi@uni.edu").await;
    for path in [
        format!("/tenants/lab/members/{me}/role"),
        format!("/tenants/lab/members/{me}/remove"),
    ] {
        let r = app.post_form(&pi, page, &path, &[("role", "member")]).await;
        assert_eq!(r.status(), 422, "{path}");
        assert!(r.text().await.unwrap().contains("at least one manager"));
        assert_eq!(
            role_of(&app, "pi@uni.edu", "lab").await.as_deref(),
            Some("manager")
        );
    }

    // A member may look but not act; an outsider learns nothing.
    let ana = app.signed_in("ana@uni.edu").await;
    let body = app.text(&ana, page).await;
    assert!(
        !body.contains("Add someone"),
        "members do not get the forms"
    );
    let r = app
        .post_form(
            &ana,
            page,
            "/tenants/lab/members",
            &[("email", "eve@uni.edu"), ("role", "manager")],
        )
        .await;
    assert_eq!(r.status(), 403);
    let bobc = app.signed_in("bob@uni.edu").await;
    assert_eq!(bobc.get(app.url(page)).send().await.unwrap().status(), 404);
    let r = app
        .post_form(
            &bobc,
            "/",
            "/tenants/lab/members",
            &[("email", "eve@uni.edu"), ("role", "manager")],
        )
        .await;
    assert_eq!(r.status(), 404);
    let invited: i64 = app.one("SELECT count(*) FROM invitations").await;
    assert_eq!(invited, 0);
}

/// The secret of the invitation e-mailed to `email`.
async fn link_for(app: &TestApp, email: &str) -> String {
    let body: String = sqlx::query_scalar(
        "SELECT body FROM notifications WHERE recipient = $1 AND topic = 'invitation' ORDER BY id DESC LIMIT 1",
    )
    .bind(email)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let i = body.find("/invite/").unwrap();
    body[i..].split_whitespace().next().unwrap().to_string()
}

#[tokio::test]
async fn an_invitation_makes_the_account_once() {
    let app = setup().await;
    let pi = app.signed_in("pi@uni.edu").await;
    let r = app
        .post_form(
            &pi,
            "/tenants/lab",
            "/tenants/lab/members",
            &[("email", "new@uni.edu"), ("role", "manager")],
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(audited(&app, "invitation.sent").await, 1);
    let link = link_for(&app, "new@uni.edu").await;
    let page = app.text(&pi, "/tenants/lab").await;
    assert!(page.contains("Open invitations") && page.contains("new@uni.edu"));

    let guest = app.client();
    let form = guest.get(app.url(&link)).send().await.unwrap();
    assert_eq!(form.status(), 200);
    let form = form.text().await.unwrap();
    assert!(
        form.contains("Make your account") && form.contains("new@uni.edu"),
        "{form}"
    );
    // A weak password: the form again, no account.
    let token = common::extract_csrf(&form).unwrap();
    let r = guest
        .post(app.url(&link))
        .form(&[
            ("csrf_token", token.as_str()),
            ("display_name", "New Person"),
            ("password", "short"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    let none: i64 = app
        .one("SELECT count(*) FROM users WHERE email = 'new@uni.edu'")
        .await;
    assert_eq!(none, 0);
    // Without the form's token: refused.
    let r = app
        .client()
        .post(app.url(&link))
        .form(&[
            ("display_name", "New Person"),
            ("password", "a long enough passphrase here"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = guest
        .post(app.url(&link))
        .form(&[
            ("csrf_token", token.as_str()),
            ("display_name", "New Person"),
            ("password", "a long enough passphrase here"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "{:?}", r.text().await);
    assert_eq!(
        role_of(&app, "new@uni.edu", "lab").await.as_deref(),
        Some("manager")
    );
    // Signed in at once.
    let home = guest.get(app.url("/tenants/lab")).send().await.unwrap();
    assert_eq!(home.status(), 200);
    assert_eq!(audited(&app, "invitation.accepted").await, 1);
    // Used: the link is dead.
    assert_eq!(
        app.client()
            .get(app.url(&link))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    assert_eq!(
        app.client()
            .get(app.url("/invite/nonsense"))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );

    // A revoked invitation is dead too.
    app.post_form(
        &pi,
        "/tenants/lab",
        "/tenants/lab/members",
        &[("email", "late@uni.edu"), ("role", "member")],
    )
    .await;
    let link = link_for(&app, "late@uni.edu").await;
    let id: i64 = app
        .one("SELECT id FROM invitations WHERE email = 'late@uni.edu'")
        .await;
    let r = app
        .post_form(
            &pi,
            "/tenants/lab",
            &format!("/tenants/lab/invitations/{id}/revoke"),
            &[],
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(
        app.client()
            .get(app.url(&link))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
}

async fn quota(app: &TestApp, slug: &str) -> (i32, i32) {
    sqlx::query_as("SELECT max_active_bookings, monthly_slice_hours FROM tenants WHERE slug = $1")
        .bind(slug)
        .fetch_one(&app.pool)
        .await
        .unwrap()
}

fn asking<'a>(active: &'a str, hours: &'a str, why: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![
        ("max_active_bookings", active),
        ("max_gpu_memory_gib", "40"),
        ("max_compute_slices", "7"),
        ("monthly_slice_hours", hours),
        ("max_booking_hours", "24"),
        ("justification", why),
    ]
}

#[tokio::test]
async fn allocation_requests_are_approved_amended_or_declined_by_admins() {
    let app = setup().await;
    let before = quota(&app, "lab").await;
    let pi = app.signed_in("pi@uni.edu").await;
    let page = "/tenants/lab";
    // Nothing changed, or no reason: the form again.
    let r = app
        .post_form(
            &pi,
            page,
            "/tenants/lab/requests",
            &asking(&before.0.to_string(), &before.1.to_string(), "more"),
        )
        .await;
    assert_eq!(r.status(), 422);
    let r = app
        .post_form(
            &pi,
            page,
            "/tenants/lab/requests",
            &asking("5", "900", "  "),
        )
        .await;
    assert_eq!(r.status(), 422);
    let r = app
        .post_form(&pi, page, "/tenants/lab/requests", &asking("5", "-3", "x"))
        .await;
    assert_eq!(r.status(), 422);
    let none: i64 = app.one("SELECT count(*) FROM allocation_requests").await;
    assert_eq!(none, 0);

    let r = app
        .post_form(
            &pi,
            page,
            "/tenants/lab/requests",
            &asking("5", "900", "CV course, 40 students, deadline 20 Dec"),
        )
        .await;
    assert_eq!(r.status(), 303);
    let to_admins: i64 = app
        .one("SELECT count(*) FROM notifications WHERE recipient = 'root@uni.edu' AND topic = 'allocation'")
        .await;
    assert_eq!(to_admins, 1);
    // One waits at a time.
    let r = app
        .post_form(
            &pi,
            page,
            "/tenants/lab/requests",
            &asking("6", "900", "again"),
        )
        .await;
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("waiting already"));
    // A member may not ask; nor decide.
    let ana = app.signed_in("ana@uni.edu").await;
    let r = app
        .post_form(
            &ana,
            page,
            "/tenants/lab/requests",
            &asking("9", "900", "me too"),
        )
        .await;
    assert_eq!(r.status(), 403);
    let id: i64 = app.one("SELECT id FROM allocation_requests").await;
    let r = app
        .post_form(
            &pi,
            page,
            &format!("/admin/requests/{id}"),
            &[("decision", "approve")],
        )
        .await;
    assert_eq!(r.status(), 403, "managers do not decide");

    let root = app.signed_in("root@uni.edu").await;
    let queue = app.text(&root, "/admin/requests").await;
    assert!(
        queue.contains("CV course, 40 students") && queue.contains("1 waiting"),
        "{queue}"
    );
    // Declining needs a note.
    let r = app
        .post_form(
            &root,
            "/admin/requests",
            &format!("/admin/requests/{id}"),
            &[("decision", "decline"), ("note", "")],
        )
        .await;
    assert_eq!(r.status(), 422);
    // Amended: the admin grants other amounts.
    let mut fields = asking("4", "700", "");
    fields.pop();
    fields.push(("decision", "amend"));
    fields.push(("note", "700 is what the fleet can carry in December"));
    let r = app
        .post_form(
            &root,
            "/admin/requests",
            &format!("/admin/requests/{id}"),
            &fields,
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(quota(&app, "lab").await, (4, 700));
    let state: String = app.one("SELECT state FROM allocation_requests").await;
    assert_eq!(state, "amended");
    let told: String = app
        .one("SELECT body FROM notifications WHERE recipient = 'pi@uni.edu' AND topic = 'allocation'")
        .await;
    assert!(told.contains("amended") && told.contains("700"), "{told}");
    assert_eq!(audited(&app, "allocation.amended").await, 1);
    // Decided: no second decision.
    let r = app
        .post_form(
            &root,
            "/admin/requests",
            &format!("/admin/requests/{id}"),
            &[("decision", "approve")],
        )
        .await;
    assert_eq!(r.status(), 409);

    // Approved as asked; then a declined one changes nothing.
    app.post_form(
        &pi,
        page,
        "/tenants/lab/requests",
        &asking("6", "800", "second course"),
    )
    .await;
    let id: i64 = app.one("SELECT max(id) FROM allocation_requests").await;
    let r = app
        .post_form(
            &root,
            "/admin/requests",
            &format!("/admin/requests/{id}"),
            &[("decision", "approve")],
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(quota(&app, "lab").await, (6, 800));
    app.post_form(
        &pi,
        page,
        "/tenants/lab/requests",
        &asking("9", "5000", "everything"),
    )
    .await;
    let id: i64 = app.one("SELECT max(id) FROM allocation_requests").await;
    let r = app
        .post_form(
            &root,
            "/admin/requests",
            &format!("/admin/requests/{id}"),
            &[("decision", "decline"), ("note", "not this term")],
        )
        .await;
    assert_eq!(r.status(), 303);
    assert_eq!(quota(&app, "lab").await, (6, 800));
    // Withdrawn by the manager.
    app.post_form(
        &pi,
        page,
        "/tenants/lab/requests",
        &asking("7", "800", "one more"),
    )
    .await;
    let id: i64 = app.one("SELECT max(id) FROM allocation_requests").await;
    // Another tenant's manager cannot touch it: it stays pending.
    let bob = app.signed_in("bob@uni.edu").await;
    let r = app
        .post_form(
            &bob,
            "/",
            &format!("/tenants/lab/requests/{id}/withdraw"),
            &[],
        )
        .await;
    assert_eq!(r.status(), 404);
    let state: String = app
        .one("SELECT state FROM allocation_requests ORDER BY id DESC LIMIT 1")
        .await;
    assert_eq!(state, "pending");
    let r = app
        .post_form(
            &pi,
            page,
            &format!("/tenants/lab/requests/{id}/withdraw"),
            &[],
        )
        .await;
    assert_eq!(r.status(), 303);
    let state: String = app
        .one("SELECT state FROM allocation_requests ORDER BY id DESC LIMIT 1")
        .await;
    assert_eq!(state, "withdrawn");
}
