//! Accounts that sign in through an identity provider (OpenID Connect or
//! LDAP): their identities, and the memberships and platform role their
//! groups grant, kept in step at each sign-in.

use sqlx::{Postgres, Transaction};

use crate::domain::{GlobalRole, TenantRole};

/// The account an identity belongs to (and notes that it was seen).
pub async fn user_of(
    tx: &mut Transaction<'_, Postgres>,
    provider: &str,
    subject: &str,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "UPDATE external_identities SET last_seen = now()
         WHERE provider = $1 AND subject = $2 RETURNING user_id",
        provider,
        subject
    )
    .fetch_optional(&mut **tx)
    .await
}

/// Whether the account already has an identity at `provider`.
pub async fn linked_to(
    tx: &mut Transaction<'_, Postgres>,
    provider: &str,
    user_id: i64,
) -> sqlx::Result<bool> {
    sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM external_identities WHERE provider = $1 AND user_id = $2) AS "x!""#,
        provider,
        user_id
    )
    .fetch_one(&mut **tx)
    .await
}

pub async fn link(
    tx: &mut Transaction<'_, Postgres>,
    provider: &str,
    subject: &str,
    user_id: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO external_identities (provider, subject, user_id) VALUES ($1, $2, $3)",
        provider,
        subject,
        user_id
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A user's platform role and where it came from, and whether the account
/// is disabled, its row locked.
pub struct Account {
    pub global_role: String,
    pub role_source: String,
    pub disabled: bool,
    pub session_epoch: i32,
}

pub async fn account_for_update(
    tx: &mut Transaction<'_, Postgres>,
    user_id: i64,
) -> sqlx::Result<Account> {
    sqlx::query_as!(
        Account,
        "SELECT global_role, role_source, disabled, session_epoch FROM users WHERE id = $1 FOR UPDATE",
        user_id
    )
    .fetch_one(&mut **tx)
    .await
}

pub async fn set_role(
    tx: &mut Transaction<'_, Postgres>,
    user_id: i64,
    role: GlobalRole,
    source: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE users SET global_role = $2, role_source = $3 WHERE id = $1",
        user_id,
        role.as_str(),
        source
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// A membership as the mapping sees it.
pub struct Held {
    pub tenant_id: i64,
    pub slug: String,
    pub role: String,
    pub source: String,
}

pub async fn memberships(
    tx: &mut Transaction<'_, Postgres>,
    user_id: i64,
) -> sqlx::Result<Vec<Held>> {
    sqlx::query_as!(
        Held,
        "SELECT m.tenant_id, t.slug, m.role, m.source FROM memberships m
         JOIN tenants t ON t.id = m.tenant_id WHERE m.user_id = $1",
        user_id
    )
    .fetch_all(&mut **tx)
    .await
}

/// Sets a membership granted by the mapping (never over a manual one).
pub async fn grant(
    tx: &mut Transaction<'_, Postgres>,
    user_id: i64,
    tenant_id: i64,
    role: TenantRole,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO memberships (user_id, tenant_id, role, source) VALUES ($1, $2, $3, 'sso')
         ON CONFLICT (user_id, tenant_id) DO UPDATE SET role = EXCLUDED.role
         WHERE memberships.source = 'sso'",
        user_id,
        tenant_id,
        role.as_str()
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Removes a membership the mapping granted.
pub async fn revoke(
    tx: &mut Transaction<'_, Postgres>,
    user_id: i64,
    tenant_id: i64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "DELETE FROM memberships WHERE user_id = $1 AND tenant_id = $2 AND source = 'sso'",
        user_id,
        tenant_id
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Live (not archived) tenants by slug.
pub async fn tenant_ids(
    tx: &mut Transaction<'_, Postgres>,
    slugs: &[String],
) -> sqlx::Result<Vec<(i64, String)>> {
    let rows = sqlx::query!(
        "SELECT id, slug FROM tenants WHERE slug = ANY($1) AND NOT archived",
        slugs
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows.into_iter().map(|r| (r.id, r.slug)).collect())
}
