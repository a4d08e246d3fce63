//! A tenant's page (`/tenants/{slug}`) and what its managers do there:
//! add members (an existing account at once, anyone else by an e-mailed
//! invitation that makes the account when followed), change roles, remove
//! members, see each member's use this month, and ask the admins for more
//! quota (an allocation request). Members see the quota; people outside
//! the tenant get 404 and learn nothing. Everything is audited.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use serde::Deserialize;
use serde_json::json;
use time::{Duration, OffsetDateTime};
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::error::AppError;
use super::forms::FieldErrors;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db::{self, manage::AllocationRequest, manage::Invitation, tenants::Tenant};
use crate::domain::{Allocation, AllocationInput, Email, TenantRole};

/// How long an invitation link works.
pub const INVITATION_DAYS: i64 = 14;
/// The longest justification or decision note.
pub const MAX_NOTE_CHARS: usize = 4000;

/// A member row of the tenant page.
pub struct MemberRow {
    pub user_id: i64,
    pub email: String,
    pub display_name: String,
    pub role: String,
    pub disabled: bool,
    pub source: String,
    /// Slice-hours used this month.
    pub hours: f64,
}

/// What a manager typed, kept when the page comes back with errors.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct AddForm {
    pub email: String,
    pub role: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct RequestForm {
    #[serde(flatten)]
    pub amounts: AllocationInput,
    pub justification: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "tenant.html")]
pub struct TenantPage {
    ctx: PageCtx,
    tenant: Tenant,
    /// A manager of this tenant or an admin: sees members and may act.
    can_manage: bool,
    members: Vec<MemberRow>,
    invitations: Vec<Invitation>,
    requests: Vec<AllocationRequest>,
    has_pending: bool,
    qos: Vec<db::bookings::QosEvent>,
    /// Managers: this month's ended bookings that a smaller slice would
    /// have served, and the slice-hours that would have saved.
    rightsizing: Option<(usize, usize, String)>,
    errors: FieldErrors,
    add: AddForm,
    ask: AllocationInput,
    justification: String,
    /// The month's total of the members' use.
    month_hours: f64,
    /// The requests table offers "withdraw" (always, on this page).
    can_withdraw: bool,
}

impl TenantPage {
    fn amount_rows(&self) -> Vec<(&'static str, &'static str, i32, String)> {
        let current = Allocation::of(&self.tenant.quota);
        let typed = [
            &self.ask.max_active_bookings,
            &self.ask.max_gpu_memory_gib,
            &self.ask.max_compute_slices,
            &self.ask.monthly_slice_hours,
            &self.ask.max_booking_hours,
        ];
        current
            .rows()
            .iter()
            .zip(typed)
            .map(|(r, t)| (r.0, r.1, r.2, t.clone()))
            .collect()
    }
}

fn month_start(now: OffsetDateTime) -> OffsetDateTime {
    now.replace_day(1)
        .map(|d| d.replace_time(time::Time::MIDNIGHT))
        .unwrap_or(now)
}

/// The tenant of `slug` as `user` may see it: 404 for outsiders (admins
/// see every tenant).
async fn visible(state: &AppState, user: &CurrentUser, slug: &str) -> Result<Tenant, AppError> {
    let id = db::tenants::id_by_slug(&state.pool, slug)
        .await?
        .ok_or(AppError::NotFound)?;
    if user.membership(id).is_none() && !user.is_admin() {
        return Err(AppError::NotFound);
    }
    Ok(db::tenants::get(&state.pool, id).await?)
}

fn manages(user: &CurrentUser, tenant_id: i64) -> bool {
    user.is_admin() || user.membership(tenant_id).is_some_and(|m| m.is_manager())
}

/// The tenant of `slug` if `user` manages it (or is an admin): 404 for
/// outsiders, 403 for members, 409 when archived.
async fn managed(state: &AppState, user: &CurrentUser, slug: &str) -> Result<Tenant, AppError> {
    let tenant = visible(state, user, slug).await?;
    if !manages(user, tenant.id) {
        return Err(AppError::Forbidden(
            "only the tenant's managers (and platform admins) may do this".into(),
        ));
    }
    if tenant.archived {
        return Err(AppError::Conflict(
            "this tenant is archived; nothing about it can change".into(),
        ));
    }
    Ok(tenant)
}

#[allow(clippy::too_many_arguments)]
async fn page(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    tenant: Tenant,
    errors: FieldErrors,
    add: AddForm,
    ask: Option<AllocationInput>,
    justification: String,
) -> Result<TenantPage, AppError> {
    let id = tenant.id;
    let can_manage = manages(user, id);
    let now = OffsetDateTime::now_utc();
    let month = month_start(now);
    let (members, invitations, requests, rightsizing) = if can_manage {
        let used: std::collections::HashMap<i64, f64> =
            db::manage::member_usage(&state.pool, id, month.date())
                .await?
                .into_iter()
                .collect();
        let members = db::tenants::members(&state.pool, id)
            .await?
            .into_iter()
            .map(|m| MemberRow {
                hours: used.get(&m.user_id).copied().unwrap_or(0.0),
                user_id: m.user_id,
                email: m.email,
                display_name: m.display_name,
                role: m.role,
                disabled: m.disabled,
                source: m.source,
            })
            .collect();
        let ended = db::bookings::ended_since(&state.pool, id, month).await?;
        let advised: Vec<_> = ended
            .iter()
            .filter_map(|b| {
                let hours = (b.end - b.start).as_seconds_f64() / 3600.0;
                b.advice().map(|a| {
                    crate::domain::rightsize::saved_slice_hours(&a, b.compute_slices, hours)
                })
            })
            .collect();
        (
            members,
            db::manage::open_invitations(&state.pool, id).await?,
            db::manage::requests_of(&state.pool, id, 20).await?,
            Some((
                ended.len(),
                advised.len(),
                format!("{:.1}", advised.iter().sum::<f64>()),
            )),
        )
    } else {
        (Vec::new(), Vec::new(), Vec::new(), None)
    };
    let month_hours = members.iter().map(|m: &MemberRow| m.hours).sum();
    Ok(TenantPage {
        ctx: PageCtx::new(session, Some(user)).await?,
        ask: ask.unwrap_or_else(|| Allocation::of(&tenant.quota).into()),
        has_pending: requests.iter().any(|r| r.state == "pending"),
        qos: db::bookings::qos_ledger(&state.pool, id, 100).await?,
        tenant,
        can_manage,
        members,
        invitations,
        requests,
        rightsizing,
        errors,
        add,
        justification,
        month_hours,
        can_withdraw: true,
    })
}

/// `GET /tenants/{slug}`.
pub async fn show(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(slug): Path<String>,
) -> Result<TenantPage, AppError> {
    let tenant = visible(&state, &user, &slug).await?;
    page(
        &state,
        &session,
        &user,
        tenant,
        FieldErrors::default(),
        AddForm::default(),
        None,
        String::new(),
    )
    .await
}

async fn back_with_errors(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    tenant: Tenant,
    errors: FieldErrors,
    add: AddForm,
    request: Option<RequestForm>,
) -> Result<Response, AppError> {
    let (ask, justification) = match request {
        Some(r) => (Some(r.amounts), r.justification),
        None => (None, String::new()),
    };
    let p = page(
        state,
        session,
        user,
        tenant,
        errors,
        add,
        ask,
        justification,
    )
    .await?;
    Ok((StatusCode::UNPROCESSABLE_ENTITY, p).into_response())
}

/// The tenant page again with `message` beside member `member_id`'s row.
async fn back_with_row_error(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    tenant: Tenant,
    member_id: i64,
    message: String,
) -> Result<Response, AppError> {
    let mut errors = FieldErrors::default();
    errors.add(&format!("role-{member_id}"), message);
    back_with_errors(
        state,
        session,
        user,
        tenant,
        errors,
        AddForm::default(),
        None,
    )
    .await
}

fn to_page(slug: &str) -> Response {
    Redirect::to(&format!("/tenants/{slug}")).into_response()
}

/// `POST /tenants/{slug}/members`: adds an existing account, or invites an
/// address that has none by e-mail.
pub async fn add_member(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    user: CurrentUser,
    Path(slug): Path<String>,
    Form(form): Form<AddForm>,
) -> Result<Response, AppError> {
    let tenant = managed(&state, &user, &slug).await?;
    let mut errors = FieldErrors::default();
    let email = Email::parse(&form.email)
        .map_err(|e| errors.add("email", e))
        .ok();
    let role = TenantRole::parse(&form.role)
        .map_err(|e| errors.add("role", e))
        .ok();
    let (Some(email), Some(role)) = (email, role) else {
        return back_with_errors(&state, &session, &user, tenant, errors, form, None).await;
    };
    let mut tx = state.pool.begin().await?;
    let message = match db::users::id_by_email(&mut *tx, &email).await? {
        Some(member_id) => {
            let before = db::users::memberships(&mut *tx, member_id)
                .await?
                .into_iter()
                .find(|m| m.tenant_id == tenant.id);
            if before.as_ref().is_some_and(|m| m.role == role.as_str()) {
                drop(tx);
                flash(
                    &session,
                    format!(
                        "{} is already {} of {}.",
                        email.as_str(),
                        role.as_str(),
                        tenant.name
                    ),
                )
                .await?;
                return Ok(to_page(&slug));
            }
            if before.is_some() && role == TenantRole::Member {
                let members = locked_members(&mut tx, tenant.id).await?;
                if let Some(refusal) = last_manager(&user, &members, member_id) {
                    drop(tx);
                    errors.add("role", refusal);
                    return back_with_errors(&state, &session, &user, tenant, errors, form, None)
                        .await;
                }
            }
            db::users::set_membership(&mut *tx, member_id, tenant.id, role).await?;
            db::audit::record(
                &mut *tx,
                &user.actor(),
                "membership.set",
                email.as_str(),
                json!({"tenant": tenant.slug, "role": role.as_str()}),
            )
            .await?;
            let body = format!(
                "{} made you {} of {} ({}) on gpuslice.\n\nIts quota is yours to book from now on.",
                user.user.email,
                role.as_str(),
                tenant.name,
                tenant.slug
            );
            db::notify::email_user(
                &mut tx,
                member_id,
                &db::notify::Message {
                    topic: "membership",
                    subject: &format!("You are now {} of {}", role.as_str(), tenant.name),
                    body: &body,
                    alert_id: None,
                    booking_id: None,
                },
            )
            .await?;
            format!(
                "{} is now {} of {}.",
                email.as_str(),
                role.as_str(),
                tenant.name
            )
        }
        None => {
            let token = super::auth::random_secret();
            let expires = OffsetDateTime::now_utc() + Duration::days(INVITATION_DAYS);
            db::manage::invite(
                &mut tx,
                tenant.id,
                email.as_str(),
                role,
                &super::auth::token_hash(&token),
                user.user.id,
                expires,
            )
            .await?;
            db::audit::record(
                &mut *tx,
                &user.actor(),
                "invitation.sent",
                email.as_str(),
                json!({"tenant": tenant.slug, "role": role.as_str()}),
            )
            .await?;
            let link = format!(
                "{}/invite/{token}",
                super::calendar::base_url(&state, &headers)
            );
            let body = format!(
                "{} invites you to book GPUs as {} of {} ({}) on gpuslice.\n\n\
                 Follow this link within {INVITATION_DAYS} days to make your account:\n{link}\n\n\
                 If you did not expect this, ignore it: nothing happens until the link is followed.",
                user.user.email,
                role.as_str(),
                tenant.name,
                tenant.slug
            );
            db::notify::email_address(
                &mut tx,
                email.as_str(),
                &db::notify::Message {
                    topic: "invitation",
                    subject: &format!("Invitation to {} on gpuslice", tenant.name),
                    body: &body,
                    alert_id: None,
                    booking_id: None,
                },
            )
            .await?;
            format!(
                "{} has no account yet: an invitation to join as {} was e-mailed (valid for {INVITATION_DAYS} days).",
                email.as_str(),
                role.as_str()
            )
        }
    };
    tx.commit().await?;
    flash(&session, message).await?;
    Ok(to_page(&slug))
}

/// The tenant's members, its row locked first: two managers changing
/// roles at once see each other's change (the last-manager rule holds).
async fn locked_members(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    tenant_id: i64,
) -> Result<Vec<db::tenants::Member>, AppError> {
    db::tenants::get_for_update(tx, tenant_id).await?;
    Ok(db::tenants::members(&mut **tx, tenant_id).await?)
}

/// Refuses to leave a tenant without a manager when a manager (not an
/// admin) removes or demotes `member_id`, the last one.
fn last_manager(
    user: &CurrentUser,
    members: &[db::tenants::Member],
    member_id: i64,
) -> Option<String> {
    let mut managers = members
        .iter()
        .filter(|m| m.role == TenantRole::Manager.as_str());
    let only =
        managers.next().filter(|m| m.user_id == member_id).is_some() && managers.next().is_none();
    (only && !user.is_admin()).then(|| {
        "a tenant keeps at least one manager: make someone else manager first (or ask a platform admin)"
            .to_string()
    })
}

/// A member of the tenant (404 when not one) among `members`.
fn member_of(
    members: &[db::tenants::Member],
    member_id: i64,
) -> Result<db::tenants::Member, AppError> {
    members
        .iter()
        .find(|m| m.user_id == member_id)
        .cloned()
        .ok_or(AppError::NotFound)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct RoleForm {
    pub role: String,
}

/// `POST /tenants/{slug}/members/{user_id}/role`.
pub async fn set_role(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path((slug, member_id)): Path<(String, i64)>,
    Form(form): Form<RoleForm>,
) -> Result<Response, AppError> {
    let tenant = managed(&state, &user, &slug).await?;
    let role = match TenantRole::parse(&form.role) {
        Ok(r) => r,
        Err(e) => {
            return back_with_row_error(&state, &session, &user, tenant, member_id, e).await;
        }
    };
    let mut tx = state.pool.begin().await?;
    let members = locked_members(&mut tx, tenant.id).await?;
    let member = member_of(&members, member_id)?;
    if role == TenantRole::Member {
        if let Some(refusal) = last_manager(&user, &members, member_id) {
            drop(tx);
            return back_with_row_error(&state, &session, &user, tenant, member_id, refusal).await;
        }
    }
    db::users::set_membership(&mut *tx, member_id, tenant.id, role).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "membership.set",
        &member.email,
        json!({"tenant": tenant.slug, "role": role.as_str(), "was": member.role}),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        format!(
            "{} is now {} of {}.",
            member.email,
            role.as_str(),
            tenant.name
        ),
    )
    .await?;
    Ok(to_page(&slug))
}

/// `POST /tenants/{slug}/members/{user_id}/remove`. Their bookings stay
/// (they were booked within the quota); they can make no new ones.
pub async fn remove_member(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path((slug, member_id)): Path<(String, i64)>,
) -> Result<Response, AppError> {
    let tenant = managed(&state, &user, &slug).await?;
    let mut tx = state.pool.begin().await?;
    let members = locked_members(&mut tx, tenant.id).await?;
    let member = member_of(&members, member_id)?;
    if let Some(refusal) = last_manager(&user, &members, member_id) {
        drop(tx);
        return back_with_row_error(&state, &session, &user, tenant, member_id, refusal).await;
    }
    db::users::remove_membership(&mut *tx, member_id, tenant.id).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "membership.removed",
        &member.email,
        json!({"tenant": tenant.slug, "was": member.role}),
    )
    .await?;
    tx.commit().await?;
    let sso = if member.source == "sso" {
        " Their single sign-on groups granted it: it comes back at their next sign-in unless the groups change."
    } else {
        ""
    };
    flash(
        &session,
        format!("{} left {}.{sso}", member.email, tenant.name),
    )
    .await?;
    Ok(to_page(&slug))
}

/// `POST /tenants/{slug}/invitations/{id}/revoke`.
pub async fn revoke_invitation(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path((slug, id)): Path<(String, i64)>,
) -> Result<Response, AppError> {
    let tenant = managed(&state, &user, &slug).await?;
    let mut tx = state.pool.begin().await?;
    let email = db::manage::revoke_invitation(&mut *tx, tenant.id, id)
        .await?
        .ok_or(AppError::NotFound)?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "invitation.revoked",
        &email,
        json!({"tenant": tenant.slug}),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        format!("The invitation of {email} no longer works."),
    )
    .await?;
    Ok(to_page(&slug))
}

/// Checks a justification or note: trimmed, not empty when `required`, at
/// most [`MAX_NOTE_CHARS`], no control characters but line breaks.
pub fn note(raw: &str, required: bool, what: &str) -> Result<Option<String>, String> {
    let t = raw.trim();
    if t.is_empty() {
        return if required {
            Err(format!("write {what}"))
        } else {
            Ok(None)
        };
    }
    if t.chars().count() > MAX_NOTE_CHARS {
        return Err(format!("{what} has at most {MAX_NOTE_CHARS} characters"));
    }
    if t.chars()
        .any(|c| c.is_control() && c != '\n' && c != '\r' && c != '\t')
    {
        return Err(format!("{what} may not contain control characters"));
    }
    Ok(Some(t.to_string()))
}

/// `POST /tenants/{slug}/requests`: asks the admins for other quota.
pub async fn file_request(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(slug): Path<String>,
    Form(form): Form<RequestForm>,
) -> Result<Response, AppError> {
    let tenant = managed(&state, &user, &slug).await?;
    let mut errors = FieldErrors::default();
    let current = Allocation::of(&tenant.quota);
    let asked = match form.amounts.parse(&tenant.quota) {
        Ok(a) => Some(a),
        Err(list) => {
            for (f, m) in list {
                errors.add(f, m);
            }
            None
        }
    };
    if asked == Some(current) {
        errors.add(
            "max_active_bookings",
            "these are the amounts the tenant has now: change the ones you need",
        );
    }
    let justification = note(&form.justification, true, "a justification")
        .map_err(|e| errors.add("justification", e))
        .ok()
        .flatten();
    let (Some(asked), Some(justification), true) = (asked, justification, errors.is_empty()) else {
        return back_with_errors(
            &state,
            &session,
            &user,
            tenant,
            errors,
            AddForm::default(),
            Some(form),
        )
        .await;
    };
    let mut tx = state.pool.begin().await?;
    let id = match db::manage::file_request(
        &mut tx,
        tenant.id,
        user.user.id,
        current,
        asked,
        &justification,
    )
    .await
    {
        Ok(id) => id,
        Err(e) if db::is_unique_violation(&e, "allocation_requests_pending_idx") => {
            drop(tx);
            errors.add(
                "justification",
                "the tenant has a request waiting already: withdraw it first, or wait for the admins",
            );
            return back_with_errors(
                &state,
                &session,
                &user,
                tenant,
                errors,
                AddForm::default(),
                Some(form),
            )
            .await;
        }
        Err(e) => return Err(e.into()),
    };
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "allocation.requested",
        &tenant.slug,
        json!({"request": id, "current": current, "asked": asked}),
    )
    .await?;
    let body = format!(
        "{} asks for other quota for {} ({}):\n\n{}\n\nWhy: {justification}\n\nDecide at /admin/requests.",
        user.user.email,
        tenant.name,
        tenant.slug,
        changes(current, asked)
    );
    db::notify::email_admins(
        &mut tx,
        &db::notify::Message {
            topic: "allocation",
            subject: &format!("Allocation request from {}", tenant.name),
            body: &body,
            alert_id: None,
            booking_id: None,
        },
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        "Your request went to the platform admins; you will hear by e-mail.",
    )
    .await?;
    Ok(to_page(&slug))
}

/// The amounts that differ, one per line: "slice-hours a month: 500 → 800".
pub fn changes(from: Allocation, to: Allocation) -> String {
    from.rows()
        .iter()
        .zip(to.rows())
        .filter(|(a, b)| a.2 != b.2)
        .map(|(a, b)| format!("- {}: {} → {}", a.1, a.2, b.2))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `POST /tenants/{slug}/requests/{id}/withdraw`.
pub async fn withdraw_request(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path((slug, id)): Path<(String, i64)>,
) -> Result<Response, AppError> {
    let tenant = managed(&state, &user, &slug).await?;
    let mut tx = state.pool.begin().await?;
    let request = db::manage::request_for_update(&mut tx, id)
        .await?
        .filter(|r| r.tenant_id == tenant.id)
        .ok_or(AppError::NotFound)?;
    if !db::manage::decide(
        &mut tx,
        request.id,
        "withdrawn",
        None,
        Some(user.user.id),
        None,
    )
    .await?
    {
        return Err(AppError::Conflict(format!(
            "the request was {} already",
            request.state
        )));
    }
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "allocation.withdrawn",
        &tenant.slug,
        json!({"request": id}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, "The request is withdrawn.").await?;
    Ok(to_page(&slug))
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/tenants/{slug}", get(show))
        .route("/tenants/{slug}/members", post(add_member))
        .route("/tenants/{slug}/members/{user_id}/role", post(set_role))
        .route(
            "/tenants/{slug}/members/{user_id}/remove",
            post(remove_member),
        )
        .route(
            "/tenants/{slug}/invitations/{id}/revoke",
            post(revoke_invitation),
        )
        .route("/tenants/{slug}/requests", post(file_request))
        .route(
            "/tenants/{slug}/requests/{id}/withdraw",
            post(withdraw_request),
        )
}
