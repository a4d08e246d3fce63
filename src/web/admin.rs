//! Admin pages: tenants and their quotas, users and memberships, the audit
//! log. Every handler starts with `require_admin`.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use serde_json::json;
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::error::AppError;
use super::forms::{Field, FieldErrors};
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db::{self, tenants::Member, tenants::Tenant, users::Membership, users::User};
use crate::domain::{
    self, parse_name, Email, GlobalRole, Password, Priority, Quota, QuotaField, QuotaInput, Slug,
    TenantRole,
};

// ---------------------------------------------------------------- tenants

#[derive(Template, WebTemplate)]
#[template(path = "admin/tenants.html")]
pub struct TenantsPage {
    ctx: PageCtx,
    tenants: Vec<Tenant>,
}

pub async fn tenants(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<TenantsPage, AppError> {
    user.require_admin()?;
    Ok(TenantsPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        tenants: db::tenants::list(&state.pool).await?,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/tenant_form.html")]
pub struct TenantFormPage {
    ctx: PageCtx,
    tenant: Option<Tenant>,
    slug: String,
    name: String,
    fields: Vec<Field>,
    errors: FieldErrors,
    members: Vec<Member>,
}

#[derive(Debug, Deserialize)]
pub struct TenantForm {
    #[serde(default)]
    slug: String,
    #[serde(default)]
    name: String,
    #[serde(flatten)]
    quota: QuotaInput,
}

/// The quota inputs of the tenant form, in order, with their messages.
fn quota_fields(q: &QuotaInput, errors: &FieldErrors) -> Vec<Field> {
    let f = |name: QuotaField, label, hint, value: &str, min, max| Field {
        name: name.name(),
        label,
        hint,
        value: value.to_string(),
        error: errors.get(name.name()).cloned(),
        kind: "number",
        options: Vec::new(),
        min,
        max,
    };
    vec![
        f(
            QuotaField::MaxActiveBookings,
            "Active bookings",
            "bookings live at the same time",
            &q.max_active_bookings,
            "0",
            "1000",
        ),
        f(
            QuotaField::MaxGpuMemoryGib,
            "GPU memory (GiB)",
            "booked at the same time",
            &q.max_gpu_memory_gib,
            "0",
            "100000",
        ),
        f(
            QuotaField::MaxComputeSlices,
            "Compute slices",
            "at the same time; a whole GPU has 7",
            &q.max_compute_slices,
            "0",
            "10000",
        ),
        f(
            QuotaField::MonthlySliceHours,
            "Monthly slice-hours",
            "budget; 1 slice for 1 hour = 1",
            &q.monthly_slice_hours,
            "0",
            "10000000",
        ),
        f(
            QuotaField::MaxBookingHours,
            "Longest booking (hours)",
            "1 to 2160",
            &q.max_booking_hours,
            "1",
            "2160",
        ),
        f(
            QuotaField::GuaranteedSharePct,
            "Guaranteed share (%)",
            "QoS floor for time-sliced shares",
            &q.guaranteed_share_pct,
            "0",
            "100",
        ),
        Field {
            kind: "select",
            options: Priority::ALL.iter().map(|p| p.as_str()).collect(),
            ..f(
                QuotaField::DefaultPriority,
                "Default priority",
                "for time-sliced shares",
                &q.default_priority,
                "",
                "",
            )
        },
        Field {
            kind: "text",
            ..f(
                QuotaField::AllowedModels,
                "Allowed GPU models",
                "comma-separated; empty allows all",
                &q.allowed_models,
                "",
                "",
            )
        },
        Field {
            kind: "text",
            ..f(
                QuotaField::AllowedProfiles,
                "Allowed MIG profiles",
                "comma-separated; empty allows all",
                &q.allowed_profiles,
                "",
                "",
            )
        },
    ]
}

pub async fn new_tenant(session: Session, user: CurrentUser) -> Result<TenantFormPage, AppError> {
    user.require_admin()?;
    let errors = FieldErrors::default();
    Ok(TenantFormPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        tenant: None,
        slug: String::new(),
        name: String::new(),
        fields: quota_fields(&QuotaInput::from(&Quota::default()), &errors),
        errors,
        members: Vec::new(),
    })
}

fn parse_tenant_form(
    form: &TenantForm,
    creating: bool,
) -> Result<(Option<Slug>, String, Quota), FieldErrors> {
    let mut errors = FieldErrors::default();
    let slug = if creating {
        match Slug::parse(&form.slug) {
            Ok(s) => Some(s),
            Err(e) => {
                errors.add("slug", e);
                None
            }
        }
    } else {
        None
    };
    let name = parse_name(&form.name, "name").unwrap_or_else(|e| {
        errors.add("name", e);
        String::new()
    });
    let quota = form.quota.parse().unwrap_or_else(|errs| {
        for (field, msg) in errs {
            errors.add(field.name(), msg);
        }
        Quota::default()
    });
    if errors.is_empty() {
        Ok((slug, name, quota))
    } else {
        Err(errors)
    }
}

fn quota_json(q: &Quota) -> serde_json::Value {
    json!({
        "max_active_bookings": q.max_active_bookings,
        "max_gpu_memory_gib": q.max_gpu_memory_gib,
        "max_compute_slices": q.max_compute_slices,
        "default_priority": q.default_priority.as_str(),
        "guaranteed_share_pct": q.guaranteed_share_pct,
        "monthly_slice_hours": q.monthly_slice_hours,
        "max_booking_hours": q.max_booking_hours,
        "allowed_models": q.allowed_models,
        "allowed_profiles": q.allowed_profiles,
    })
}

pub async fn create_tenant(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Form(form): Form<TenantForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let rerender = |errors: FieldErrors| async {
        let page = TenantFormPage {
            ctx: PageCtx::new(&session, Some(&user)).await?,
            tenant: None,
            slug: form.slug.trim().to_string(),
            name: form.name.trim().to_string(),
            fields: quota_fields(&form.quota, &errors),
            errors,
            members: Vec::new(),
        };
        Ok::<_, AppError>((StatusCode::UNPROCESSABLE_ENTITY, page).into_response())
    };
    let (slug, name, quota) = match parse_tenant_form(&form, true) {
        Ok(v) => v,
        Err(errors) => return rerender(errors).await,
    };
    let Some(slug) = slug else {
        return Err(AppError::BadRequest("missing slug".into()));
    };
    let mut tx = state.pool.begin().await?;
    let id = match db::tenants::insert(&mut *tx, &slug, &name, &quota).await {
        Ok(id) => id,
        Err(e) if db::is_unique_violation(&e, "tenants_slug_key") => {
            let mut errors = FieldErrors::default();
            errors.add("slug", format!("the slug \"{slug}\" is taken"));
            return rerender(errors).await;
        }
        Err(e) => return Err(e.into()),
    };
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "tenant.created",
        slug.as_str(),
        json!({"name": name, "quota": quota_json(&quota)}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, format!("Tenant {name} created.")).await?;
    Ok(Redirect::to(&format!("/admin/tenants/{id}")).into_response())
}

pub async fn edit_tenant(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<TenantFormPage, AppError> {
    user.require_admin()?;
    let tenant = db::tenants::get(&state.pool, id).await?;
    let members = db::tenants::members(&state.pool, id).await?;
    let errors = FieldErrors::default();
    Ok(TenantFormPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        slug: tenant.slug.clone(),
        name: tenant.name.clone(),
        fields: quota_fields(&QuotaInput::from(&tenant.quota), &errors),
        errors,
        tenant: Some(tenant),
        members,
    })
}

pub async fn update_tenant(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
    Form(form): Form<TenantForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let tenant = db::tenants::get(&state.pool, id).await?;
    let (_, name, quota) = match parse_tenant_form(&form, false) {
        Ok(v) => v,
        Err(errors) => {
            let members = db::tenants::members(&state.pool, id).await?;
            let page = TenantFormPage {
                ctx: PageCtx::new(&session, Some(&user)).await?,
                slug: tenant.slug.clone(),
                name: form.name.trim().to_string(),
                fields: quota_fields(&form.quota, &errors),
                errors,
                tenant: Some(tenant),
                members,
            };
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
        }
    };
    // The same row lock a booking's quota check takes: an edit never
    // interleaves with a check.
    let mut tx = state.pool.begin().await?;
    let before = db::tenants::get_for_update(&mut tx, id).await?;
    db::tenants::update(&mut tx, id, &name, &quota).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "tenant.updated",
        &before.slug,
        json!({"before": {"name": before.name, "quota": quota_json(&before.quota)},
               "after": {"name": name, "quota": quota_json(&quota)}}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, format!("Tenant {name} saved.")).await?;
    Ok(Redirect::to(&format!("/admin/tenants/{id}")).into_response())
}

async fn set_tenant_archived(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    id: i64,
    archived: bool,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let tenant = db::tenants::get(&state.pool, id).await?;
    let mut tx = state.pool.begin().await?;
    db::tenants::set_archived(&mut *tx, id, archived).await?;
    let action = if archived {
        "tenant.archived"
    } else {
        "tenant.restored"
    };
    db::audit::record(&mut *tx, &user.actor(), action, &tenant.slug, json!({})).await?;
    tx.commit().await?;
    let verb = if archived { "archived" } else { "restored" };
    flash(session, format!("Tenant {} {verb}.", tenant.name)).await?;
    Ok(Redirect::to(&format!("/admin/tenants/{id}")).into_response())
}

pub async fn archive_tenant(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_tenant_archived(&state, &session, &user, id, true).await
}

pub async fn restore_tenant(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_tenant_archived(&state, &session, &user, id, false).await
}

// ------------------------------------------------------------------ users

/// A user row of the list, with their tenants.
pub struct UserRow {
    pub user: User,
    pub tenants: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/users.html")]
pub struct UsersPage {
    ctx: PageCtx,
    users: Vec<UserRow>,
}

pub async fn users(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<UsersPage, AppError> {
    user.require_admin()?;
    let mut rows = Vec::new();
    for u in db::users::list(&state.pool).await? {
        let tenants = db::users::memberships(&state.pool, u.id)
            .await?
            .iter()
            .map(|m| {
                if m.is_manager() {
                    format!("{} (manager)", m.slug)
                } else {
                    m.slug.clone()
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        rows.push(UserRow { user: u, tenants });
    }
    Ok(UsersPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        users: rows,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/user_new.html")]
pub struct NewUserPage {
    ctx: PageCtx,
    email: String,
    display_name: String,
    global_role: String,
    roles: Vec<&'static str>,
    errors: FieldErrors,
}

pub async fn new_user(session: Session, user: CurrentUser) -> Result<NewUserPage, AppError> {
    user.require_admin()?;
    Ok(NewUserPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        email: String::new(),
        display_name: String::new(),
        global_role: "none".into(),
        roles: GlobalRole::ALL.iter().map(|r| r.as_str()).collect(),
        errors: FieldErrors::default(),
    })
}

#[derive(Debug, Deserialize)]
pub struct NewUserForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    display_name: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    global_role: String,
}

pub async fn create_user(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Form(form): Form<NewUserForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let mut errors = FieldErrors::default();
    let email = Email::parse(&form.email)
        .map_err(|e| errors.add("email", e))
        .ok();
    let name = parse_name(&form.display_name, "display name")
        .map_err(|e| errors.add("display_name", e))
        .ok();
    let role = GlobalRole::parse(&form.global_role)
        .map_err(|e| errors.add("global_role", e))
        .ok();
    let password = Password::new(&form.password, email.as_ref().map(Email::as_str))
        .map_err(|e| errors.add("password", e.to_string()))
        .ok();
    if let (true, Some(email), Some(name), Some(role), Some(password)) =
        (errors.is_empty(), &email, &name, role, password)
    {
        let hash = hash_off_runtime(password).await?;
        let mut tx = state.pool.begin().await?;
        match db::users::insert(&mut *tx, email, name, &hash, role).await {
            Ok(id) => {
                db::audit::record(
                    &mut *tx,
                    &user.actor(),
                    "user.created",
                    email.as_str(),
                    json!({"global_role": role.as_str()}),
                )
                .await?;
                tx.commit().await?;
                flash(
                    &session,
                    format!("User {email} created. Add their tenants below."),
                )
                .await?;
                return Ok(Redirect::to(&format!("/admin/users/{id}")).into_response());
            }
            Err(e) if db::is_unique_violation(&e, "users_email_key") => {
                errors.add("email", format!("{email} already has an account"));
            }
            Err(e) => return Err(e.into()),
        }
    }
    let page = NewUserPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        email: form.email.trim().to_string(),
        display_name: form.display_name.trim().to_string(),
        global_role: form.global_role.clone(),
        roles: GlobalRole::ALL.iter().map(|r| r.as_str()).collect(),
        errors,
    };
    Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response())
}

/// Hashes on the blocking pool: argon2id at 19 MiB takes tens of
/// milliseconds of CPU, which must not stall the async workers.
pub async fn hash_off_runtime(password: Password) -> Result<String, AppError> {
    tokio::task::spawn_blocking(move || domain::hash_password(&password))
        .await
        .map_err(|e| AppError::Internal(e.into()))
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/user_edit.html")]
pub struct UserPage {
    ctx: PageCtx,
    subject: User,
    memberships: Vec<Membership>,
    tenants: Vec<Tenant>,
    roles: Vec<&'static str>,
    display_name: String,
    global_role: String,
    /// The linked Unix account (for `gpuslice exec`), as stored or as typed.
    unix_user: String,
    errors: FieldErrors,
}

async fn user_page(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    id: i64,
    errors: FieldErrors,
    edited: Option<(&str, &str)>,
) -> Result<UserPage, AppError> {
    let subject = db::users::get(&state.pool, id).await?;
    let (display_name, global_role) = match edited {
        Some((n, r)) => (n.to_string(), r.to_string()),
        None => (subject.display_name.clone(), subject.global_role.clone()),
    };
    let unix_user = match errors.get("unix_user") {
        Some(_) => String::new(),
        None => db::users::unix_user(&state.pool, id)
            .await?
            .unwrap_or_default(),
    };
    Ok(UserPage {
        ctx: PageCtx::new(session, Some(user)).await?,
        unix_user,
        memberships: db::users::memberships(&state.pool, id).await?,
        tenants: db::tenants::list(&state.pool)
            .await?
            .into_iter()
            .filter(|t| !t.archived)
            .collect(),
        roles: GlobalRole::ALL.iter().map(|r| r.as_str()).collect(),
        display_name,
        global_role,
        subject,
        errors,
    })
}

pub async fn edit_user(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<UserPage, AppError> {
    user.require_admin()?;
    user_page(&state, &session, &user, id, FieldErrors::default(), None).await
}

#[derive(Debug, Deserialize)]
pub struct ProfileForm {
    #[serde(default)]
    display_name: String,
    #[serde(default)]
    global_role: String,
}

pub async fn update_user(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
    Form(form): Form<ProfileForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let subject = db::users::get(&state.pool, id).await?;
    let mut errors = FieldErrors::default();
    let name = parse_name(&form.display_name, "display name")
        .map_err(|e| errors.add("display_name", e))
        .ok();
    let role = GlobalRole::parse(&form.global_role)
        .map_err(|e| errors.add("global_role", e))
        .ok();
    if id == user.user.id && role.is_some_and(|r| r != GlobalRole::Admin) {
        errors.add(
            "global_role",
            "you cannot remove your own admin role; ask another admin",
        );
    }
    let (Some(name), Some(role), true) = (name, role, errors.is_empty()) else {
        let page = user_page(
            &state,
            &session,
            &user,
            id,
            errors,
            Some((&form.display_name, &form.global_role)),
        )
        .await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    };
    let mut tx = state.pool.begin().await?;
    db::users::set_profile(&mut *tx, id, &name, role).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "user.updated",
        &subject.email,
        json!({"before": {"display_name": subject.display_name, "global_role": subject.global_role},
               "after": {"display_name": name, "global_role": role.as_str()}}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, "Saved.").await?;
    Ok(Redirect::to(&format!("/admin/users/{id}")).into_response())
}

#[derive(Debug, Deserialize)]
pub struct UnixUserForm {
    #[serde(default)]
    pub unix_user: String,
}

/// `POST /admin/users/{id}/unix-user`: links the Unix account `gpuslice
/// exec` accepts for the user (empty: unlink).
pub async fn set_unix_user(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
    Form(form): Form<UnixUserForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let subject = db::users::get(&state.pool, id).await?;
    let value = match crate::domain::parse_unix_user(&form.unix_user) {
        Ok(v) => v,
        Err(e) => {
            let mut errors = FieldErrors::default();
            errors.add("unix_user", e);
            let page = user_page(&state, &session, &user, id, errors, None).await?;
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
        }
    };
    let mut tx = state.pool.begin().await?;
    db::users::set_unix_user(&mut *tx, id, value.as_deref()).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "user.unix_user",
        &subject.email,
        json!({ "unix_user": value }),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        match &value {
            Some(v) => format!(
                "{} may now run gpuslice exec as Unix account {v}.",
                subject.email
            ),
            None => format!("{} has no Unix account linked now.", subject.email),
        },
    )
    .await?;
    Ok(Redirect::to(&format!("/admin/users/{id}")).into_response())
}

async fn set_user_disabled(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    id: i64,
    disabled: bool,
) -> Result<Response, AppError> {
    user.require_admin()?;
    if disabled && id == user.user.id {
        return Err(AppError::Conflict(
            "you cannot disable your own account".into(),
        ));
    }
    let subject = db::users::get(&state.pool, id).await?;
    let mut tx = state.pool.begin().await?;
    db::users::set_disabled(&mut *tx, id, disabled).await?;
    let action = if disabled {
        "user.disabled"
    } else {
        "user.enabled"
    };
    db::audit::record(&mut *tx, &user.actor(), action, &subject.email, json!({})).await?;
    tx.commit().await?;
    let msg = if disabled {
        format!(
            "{} is disabled; their sessions and tokens no longer work.",
            subject.email
        )
    } else {
        format!("{} can sign in again.", subject.email)
    };
    flash(session, msg).await?;
    Ok(Redirect::to(&format!("/admin/users/{id}")).into_response())
}

pub async fn disable_user(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_user_disabled(&state, &session, &user, id, true).await
}

pub async fn enable_user(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_user_disabled(&state, &session, &user, id, false).await
}

#[derive(Debug, Deserialize)]
pub struct PasswordForm {
    #[serde(default)]
    password: String,
}

pub async fn reset_password(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
    Form(form): Form<PasswordForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let subject = db::users::get(&state.pool, id).await?;
    let password = match Password::new(&form.password, Some(&subject.email)) {
        Ok(p) => p,
        Err(e) => {
            let mut errors = FieldErrors::default();
            errors.add("password", e.to_string());
            let page = user_page(&state, &session, &user, id, errors, None).await?;
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
        }
    };
    let hash = hash_off_runtime(password).await?;
    let mut tx = state.pool.begin().await?;
    db::users::set_password(&mut *tx, id, &hash).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "user.password_reset",
        &subject.email,
        json!({}),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        format!(
            "New password set for {}; their other sessions have ended.",
            subject.email
        ),
    )
    .await?;
    Ok(Redirect::to(&format!("/admin/users/{id}")).into_response())
}

#[derive(Debug, Deserialize)]
pub struct MembershipForm {
    #[serde(default)]
    tenant_id: String,
    #[serde(default)]
    role: String,
}

pub async fn add_membership(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
    Form(form): Form<MembershipForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let subject = db::users::get(&state.pool, id).await?;
    let mut errors = FieldErrors::default();
    let role = TenantRole::parse(&form.role)
        .map_err(|e| errors.add("role", e))
        .ok();
    let tenant = match form.tenant_id.trim().parse::<i64>() {
        Ok(tid) => match db::tenants::get(&state.pool, tid).await {
            Ok(t) if !t.archived => Some(t),
            Ok(_) => {
                errors.add("tenant_id", "that tenant is archived");
                None
            }
            Err(sqlx::Error::RowNotFound) => {
                errors.add("tenant_id", "choose a tenant");
                None
            }
            Err(e) => return Err(e.into()),
        },
        Err(_) => {
            errors.add("tenant_id", "choose a tenant");
            None
        }
    };
    let (Some(role), Some(tenant)) = (role, tenant) else {
        let page = user_page(&state, &session, &user, id, errors, None).await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    };
    let mut tx = state.pool.begin().await?;
    db::users::set_membership(&mut *tx, id, tenant.id, role).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "membership.set",
        &subject.email,
        json!({"tenant": tenant.slug, "role": role.as_str()}),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        format!(
            "{} is now {} of {}.",
            subject.email,
            role.as_str(),
            tenant.name
        ),
    )
    .await?;
    Ok(Redirect::to(&format!("/admin/users/{id}")).into_response())
}

pub async fn remove_membership(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path((id, tenant_id)): Path<(i64, i64)>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let subject = db::users::get(&state.pool, id).await?;
    let tenant = db::tenants::get(&state.pool, tenant_id).await?;
    let mut tx = state.pool.begin().await?;
    if !db::users::remove_membership(&mut *tx, id, tenant_id).await? {
        return Err(AppError::NotFound);
    }
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "membership.removed",
        &subject.email,
        json!({"tenant": tenant.slug}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, format!("{} left {}.", subject.email, tenant.name)).await?;
    Ok(Redirect::to(&format!("/admin/users/{id}")).into_response())
}

// -------------------------------------------------------------- audit log

#[derive(Template, WebTemplate)]
#[template(path = "admin/audit.html")]
pub struct AuditPage {
    ctx: PageCtx,
    entries: Vec<db::audit::Entry>,
    filter: String,
    filters: Vec<(&'static str, &'static str)>,
}

#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    #[serde(default)]
    action: String,
}

pub async fn audit(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Query(q): Query<AuditQuery>,
) -> Result<AuditPage, AppError> {
    user.require_admin()?;
    let filters = vec![
        ("", "everything"),
        ("login.", "sign-ins"),
        ("tenant.", "tenants"),
        ("user.", "users"),
        ("membership.", "memberships"),
        ("token.", "API tokens"),
    ];
    let filter = filters
        .iter()
        .find(|(k, _)| *k == q.action)
        .map(|(k, _)| k.to_string())
        .unwrap_or_default();
    Ok(AuditPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        entries: db::audit::recent(&state.pool, &filter, 500).await?,
        filter,
        filters,
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
