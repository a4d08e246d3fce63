//! Users, their platform roles, Unix accounts and memberships.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use serde_json::json;
use tower_sessions::Session;

use crate::db::{self, tenants::Tenant, users::Membership, users::User};
use crate::domain::{self, parse_name, Email, GlobalRole, Password, TenantRole};
use crate::web::auth::{Admin, CurrentUser};
use crate::web::error::AppError;
use crate::web::forms::FieldErrors;
use crate::web::pages::{flash, PageCtx};
use crate::web::AppState;

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
    Admin(user): Admin,
) -> Result<UsersPage, AppError> {
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

pub async fn new_user(session: Session, Admin(user): Admin) -> Result<NewUserPage, AppError> {
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
    Admin(user): Admin,
    Form(form): Form<NewUserForm>,
) -> Result<Response, AppError> {
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
        let hash = state
            .with_password_slot(move || domain::hash_password(&password))
            .await?;
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
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<UserPage, AppError> {
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
    Admin(user): Admin,
    Path(id): Path<i64>,
    Form(form): Form<ProfileForm>,
) -> Result<Response, AppError> {
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
    Admin(user): Admin,
    Path(id): Path<i64>,
    Form(form): Form<UnixUserForm>,
) -> Result<Response, AppError> {
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
    Admin(user): &Admin,
    id: i64,
    disabled: bool,
) -> Result<Response, AppError> {
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
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_user_disabled(&state, &session, &Admin(user), id, true).await
}

pub async fn enable_user(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_user_disabled(&state, &session, &Admin(user), id, false).await
}

#[derive(Debug, Deserialize)]
pub struct PasswordForm {
    #[serde(default)]
    password: String,
}

pub async fn reset_password(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
    Form(form): Form<PasswordForm>,
) -> Result<Response, AppError> {
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
    let hash = state
        .with_password_slot(move || domain::hash_password(&password))
        .await?;
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
    Admin(user): Admin,
    Path(id): Path<i64>,
    Form(form): Form<MembershipForm>,
) -> Result<Response, AppError> {
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
    Admin(user): Admin,
    Path((id, tenant_id)): Path<(i64, i64)>,
) -> Result<Response, AppError> {
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
