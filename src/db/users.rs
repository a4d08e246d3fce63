//! Users and their tenant memberships.

use sqlx::PgExecutor;
use time::OffsetDateTime;

use crate::domain::{Email, GlobalRole, TenantRole};

/// A user as stored (the password hash stays in [`Credentials`]).
#[derive(Debug, Clone)]
pub struct User {
    pub id: i64,
    pub email: String,
    pub display_name: String,
    pub global_role: String,
    pub disabled: bool,
    pub session_epoch: i32,
    pub last_login_at: Option<OffsetDateTime>,
    pub created_at: OffsetDateTime,
}

impl User {
    pub fn role(&self) -> GlobalRole {
        GlobalRole::parse(&self.global_role).unwrap_or(GlobalRole::None)
    }
}

/// What sign-in needs to check a password.
#[derive(Debug, Clone)]
pub struct Credentials {
    pub id: i64,
    pub password_hash: String,
    pub disabled: bool,
    pub session_epoch: i32,
}

/// One membership of a user, with the tenant's names.
#[derive(Debug, Clone)]
pub struct Membership {
    pub tenant_id: i64,
    pub slug: String,
    pub name: String,
    pub role: String,
    pub archived: bool,
}

impl Membership {
    pub fn is_manager(&self) -> bool {
        self.role == TenantRole::Manager.as_str()
    }
}

pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<User>> {
    sqlx::query_as!(
        User,
        "SELECT id, email, display_name, global_role, disabled, session_epoch,
                last_login_at, created_at
         FROM users ORDER BY disabled, email"
    )
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<User> {
    sqlx::query_as!(
        User,
        "SELECT id, email, display_name, global_role, disabled, session_epoch,
                last_login_at, created_at
         FROM users WHERE id = $1",
        id
    )
    .fetch_one(db)
    .await
}

pub async fn id_by_email(db: impl PgExecutor<'_>, email: &Email) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!("SELECT id FROM users WHERE email = $1", email.as_str())
        .fetch_optional(db)
        .await
}

pub async fn credentials(
    db: impl PgExecutor<'_>,
    email: &Email,
) -> sqlx::Result<Option<Credentials>> {
    sqlx::query_as!(
        Credentials,
        "SELECT id, password_hash, disabled, session_epoch FROM users WHERE email = $1",
        email.as_str()
    )
    .fetch_optional(db)
    .await
}

/// Creates a user; a taken address fails on `users_email_key`.
pub async fn insert(
    db: impl PgExecutor<'_>,
    email: &Email,
    display_name: &str,
    password_hash: &str,
    role: GlobalRole,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO users (email, display_name, password_hash, global_role)
         VALUES ($1, $2, $3, $4) RETURNING id",
        email.as_str(),
        display_name,
        password_hash,
        role.as_str()
    )
    .fetch_one(db)
    .await
}

/// Enables or disables an account. Disabling moves the session epoch, which
/// ends every session of the user at its next request, and revokes every
/// API token (enabling again does not bring them back).
pub async fn set_disabled(db: impl PgExecutor<'_>, id: i64, disabled: bool) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "WITH revoked AS (UPDATE api_tokens SET revoked_at = now()
                          WHERE user_id = $1 AND $2 AND revoked_at IS NULL)
         UPDATE users SET disabled = $2,
             session_epoch = session_epoch + CASE WHEN $2 THEN 1 ELSE 0 END
         WHERE id = $1",
        id,
        disabled
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Sets a new password hash, ends the user's other sessions and revokes
/// their API tokens (a reset usually means the account was at risk).
pub async fn set_password(db: impl PgExecutor<'_>, id: i64, hash: &str) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "WITH revoked AS (UPDATE api_tokens SET revoked_at = now() WHERE user_id = $1 AND revoked_at IS NULL)
         UPDATE users SET password_hash = $2, session_epoch = session_epoch + 1,
             failed_logins = 0
         WHERE id = $1",
        id,
        hash
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

pub async fn set_profile(
    db: impl PgExecutor<'_>,
    id: i64,
    display_name: &str,
    role: GlobalRole,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE users SET display_name = $2, global_role = $3,
             role_source = CASE WHEN global_role = $3 THEN role_source ELSE 'manual' END
         WHERE id = $1",
        id,
        display_name,
        role.as_str()
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

pub async fn record_login(db: impl PgExecutor<'_>, id: i64, ok: bool) -> sqlx::Result<()> {
    if ok {
        sqlx::query!(
            "UPDATE users SET last_login_at = now(), failed_logins = 0 WHERE id = $1",
            id
        )
        .execute(db)
        .await?;
    } else {
        sqlx::query!(
            "UPDATE users SET failed_logins = failed_logins + 1, last_failed_login_at = now()
             WHERE id = $1",
            id
        )
        .execute(db)
        .await?;
    }
    Ok(())
}

pub async fn memberships(db: impl PgExecutor<'_>, user_id: i64) -> sqlx::Result<Vec<Membership>> {
    sqlx::query_as!(
        Membership,
        "SELECT t.id AS tenant_id, t.slug, t.name, m.role, t.archived
         FROM memberships m JOIN tenants t ON t.id = m.tenant_id
         WHERE m.user_id = $1 ORDER BY lower(t.name)",
        user_id
    )
    .fetch_all(db)
    .await
}

/// Adds a membership or changes its role.
pub async fn set_membership(
    db: impl PgExecutor<'_>,
    user_id: i64,
    tenant_id: i64,
    role: TenantRole,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO memberships (user_id, tenant_id, role) VALUES ($1, $2, $3)
         ON CONFLICT (user_id, tenant_id) DO UPDATE SET role = EXCLUDED.role, source = 'manual'",
        user_id,
        tenant_id,
        role.as_str()
    )
    .execute(db)
    .await?;
    Ok(())
}

pub async fn remove_membership(
    db: impl PgExecutor<'_>,
    user_id: i64,
    tenant_id: i64,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "DELETE FROM memberships WHERE user_id = $1 AND tenant_id = $2",
        user_id,
        tenant_id
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// The session epoch of an enabled user (None when disabled or gone).
pub async fn live_session_epoch(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<i32>> {
    sqlx::query_scalar!(
        "SELECT session_epoch FROM users WHERE id = $1 AND NOT disabled",
        id
    )
    .fetch_optional(db)
    .await
}

/// Links a user to their Unix account on the GPU nodes (`None`: unlink).
pub async fn set_unix_user(
    db: impl PgExecutor<'_>,
    id: i64,
    unix_user: Option<&str>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE users SET unix_user = $2 WHERE id = $1",
        id,
        unix_user
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The Unix account linked to a user, if any.
pub async fn unix_user(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!("SELECT unix_user FROM users WHERE id = $1", id)
        .fetch_one(db)
        .await
}
