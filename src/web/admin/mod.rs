//! Admin pages: tenants and their quotas, users and memberships, the audit
//! log. Every handler takes the [`Admin`] extractor.

mod requests;
mod tenants;
mod users;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Query, State};
use axum::response::Redirect;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use tower_sessions::Session;

use super::auth::Admin;
use super::error::AppError;
use super::pages::PageCtx;
use super::AppState;
use crate::db;

/// Audit entries on one page (newest first; older ones on the next page).
const AUDIT_LIMIT: i64 = 200;

pub use requests::*;
pub use tenants::*;
pub use users::*;

// -------------------------------------------------------------- audit log

#[derive(Template, WebTemplate)]
#[template(path = "admin/audit.html")]
pub struct AuditPage {
    ctx: PageCtx,
    entries: Vec<db::audit::Entry>,
    filter: String,
    filters: Vec<(&'static str, &'static str)>,
    older_url: Option<String>,
    newest_url: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    #[serde(default)]
    action: String,
    /// Entries older than this one (the "older" link).
    #[serde(default)]
    before: String,
}

pub async fn audit(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Query(q): Query<AuditQuery>,
) -> Result<AuditPage, AppError> {
    let filters = vec![
        ("", "everything"),
        ("login.", "sign-ins"),
        ("tenant.", "tenants"),
        ("user.", "users"),
        ("membership.", "memberships"),
        ("invitation.", "invitations"),
        ("allocation.", "allocation requests"),
        ("token.", "API tokens"),
    ];
    let filter = filters
        .iter()
        .find(|(k, _)| *k == q.action)
        .map(|(k, _)| k.to_string())
        .unwrap_or_default();
    let before = crate::web::cursor::Cursor::parse(Some(&q.before), "before")?;
    let mut entries = db::audit::recent(
        &state.pool,
        &filter,
        (before.at, before.id),
        AUDIT_LIMIT + 1,
    )
    .await?;
    let base = format!(
        "/admin/audit?action={}",
        form_urlencoded::byte_serialize(filter.as_bytes()).collect::<String>()
    );
    let older_url = (entries.len() as i64 > AUDIT_LIMIT).then(|| {
        entries.truncate(AUDIT_LIMIT as usize);
        let last = entries
            .last()
            .map(|e| crate::web::cursor::Cursor::after(false, e.at, e.id).encode())
            .unwrap_or_default();
        format!("{base}&before={last}")
    });
    Ok(AuditPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        entries,
        filter,
        filters,
        older_url,
        newest_url: (!before.is_first()).then_some(base),
    })
}

/// Time as people read it in tables (UTC).
pub fn when(t: &time::OffsetDateTime) -> String {
    let f = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute] UTC");
    t.format(&f).unwrap_or_default()
}

/// An audit entry's details as compact JSON; empty for `{}`.
pub fn detail_text(detail: &serde_json::Value) -> String {
    match detail.as_object() {
        Some(o) if o.is_empty() => String::new(),
        _ => detail.to_string(),
    }
}

/// Tenants, users, memberships and the audit log (admins).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin", get(|| async { Redirect::to("/admin/tenants") }))
        .route("/admin/", get(|| async { Redirect::to("/admin/tenants") }))
        .route("/admin/tenants", get(tenants).post(create_tenant))
        .route("/admin/tenants/new", get(new_tenant))
        .route("/admin/tenants/{id}", get(edit_tenant).post(update_tenant))
        .route("/admin/tenants/{id}/archive", post(archive_tenant))
        .route("/admin/tenants/{id}/restore", post(restore_tenant))
        .route("/admin/users", get(users).post(create_user))
        .route("/admin/users/new", get(new_user))
        .route("/admin/users/{id}", get(edit_user).post(update_user))
        .route("/admin/users/{id}/disable", post(disable_user))
        .route("/admin/users/{id}/enable", post(enable_user))
        .route("/admin/users/{id}/password", post(reset_password))
        .route("/admin/users/{id}/unix-user", post(set_unix_user))
        .route("/admin/users/{id}/memberships", post(add_membership))
        .route(
            "/admin/users/{id}/memberships/{tenant_id}/remove",
            post(remove_membership),
        )
        .route("/admin/audit", get(audit))
        .route("/admin/requests", get(requests))
        .route("/admin/requests/{id}", post(decide))
}
