//! Tenants and their quotas.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::{Priority, Quota, Slug};

/// A tenant as stored.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: i64,
    pub slug: String,
    pub name: String,
    pub archived: bool,
    pub quota: Quota,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
}

struct Row {
    id: i64,
    slug: String,
    name: String,
    archived: bool,
    max_active_bookings: i32,
    max_gpu_memory_gib: i32,
    max_compute_slices: i32,
    default_priority: Priority,
    guaranteed_share_pct: i32,
    monthly_slice_hours: i32,
    max_booking_hours: i32,
    allowed_models: Vec<String>,
    allowed_profiles: Vec<String>,
    created_at: OffsetDateTime,
    updated_at: OffsetDateTime,
}

impl From<Row> for Tenant {
    fn from(r: Row) -> Self {
        Tenant {
            id: r.id,
            slug: r.slug,
            name: r.name,
            archived: r.archived,
            quota: Quota {
                max_active_bookings: r.max_active_bookings,
                max_gpu_memory_gib: r.max_gpu_memory_gib,
                max_compute_slices: r.max_compute_slices,
                default_priority: r.default_priority,
                guaranteed_share_pct: r.guaranteed_share_pct,
                monthly_slice_hours: r.monthly_slice_hours,
                max_booking_hours: r.max_booking_hours,
                allowed_models: r.allowed_models,
                allowed_profiles: r.allowed_profiles,
            },
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

/// Every tenant, active ones first, by name.
pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Tenant>> {
    let rows = sqlx::query_as!(
        Row,
        r#"SELECT id, slug, name, archived, max_active_bookings, max_gpu_memory_gib,
                max_compute_slices, default_priority AS "default_priority: Priority",
                guaranteed_share_pct, monthly_slice_hours, max_booking_hours, allowed_models,
                allowed_profiles, created_at, updated_at
         FROM tenants ORDER BY archived, lower(name), id"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(Tenant::from).collect())
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Tenant> {
    sqlx::query_as!(
        Row,
        r#"SELECT id, slug, name, archived, max_active_bookings, max_gpu_memory_gib,
                max_compute_slices, default_priority AS "default_priority: Priority",
                guaranteed_share_pct, monthly_slice_hours, max_booking_hours, allowed_models,
                allowed_profiles, created_at, updated_at
         FROM tenants WHERE id = $1"#,
        id
    )
    .fetch_one(db)
    .await
    .map(Tenant::from)
}

/// Reads a tenant while taking its row lock: quota checks and quota edits
/// both go through here, so they never interleave.
pub async fn get_for_update(tx: &mut Transaction<'_, Postgres>, id: i64) -> sqlx::Result<Tenant> {
    sqlx::query_as!(
        Row,
        r#"SELECT id, slug, name, archived, max_active_bookings, max_gpu_memory_gib,
                max_compute_slices, default_priority AS "default_priority: Priority",
                guaranteed_share_pct, monthly_slice_hours, max_booking_hours, allowed_models,
                allowed_profiles, created_at, updated_at
         FROM tenants WHERE id = $1 FOR UPDATE"#,
        id
    )
    .fetch_one(&mut **tx)
    .await
    .map(Tenant::from)
}

pub async fn id_by_slug(db: impl PgExecutor<'_>, slug: &str) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!("SELECT id FROM tenants WHERE slug = $1", slug)
        .fetch_optional(db)
        .await
}

/// Creates a tenant. A taken slug fails with the `tenants_slug_key`
/// constraint, which callers turn into a field message.
pub async fn insert(
    db: impl PgExecutor<'_>,
    slug: &Slug,
    name: &str,
    q: &Quota,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO tenants (slug, name, max_active_bookings, max_gpu_memory_gib,
             max_compute_slices, default_priority, guaranteed_share_pct,
             monthly_slice_hours, max_booking_hours, allowed_models, allowed_profiles)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         RETURNING id",
        slug.as_str(),
        name,
        q.max_active_bookings,
        q.max_gpu_memory_gib,
        q.max_compute_slices,
        q.default_priority.as_str(),
        q.guaranteed_share_pct,
        q.monthly_slice_hours,
        q.max_booking_hours,
        &q.allowed_models,
        &q.allowed_profiles,
    )
    .fetch_one(db)
    .await
}

/// Writes a tenant's name and quota. Call with the row lock held
/// ([`get_for_update`]).
pub async fn update(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    name: &str,
    q: &Quota,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE tenants SET name = $2, max_active_bookings = $3, max_gpu_memory_gib = $4,
             max_compute_slices = $5, default_priority = $6, guaranteed_share_pct = $7,
             monthly_slice_hours = $8, max_booking_hours = $9, allowed_models = $10,
             allowed_profiles = $11, updated_at = now()
         WHERE id = $1",
        id,
        name,
        q.max_active_bookings,
        q.max_gpu_memory_gib,
        q.max_compute_slices,
        q.default_priority.as_str(),
        q.guaranteed_share_pct,
        q.monthly_slice_hours,
        q.max_booking_hours,
        &q.allowed_models,
        &q.allowed_profiles,
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub async fn set_archived(db: impl PgExecutor<'_>, id: i64, archived: bool) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE tenants SET archived = $2, updated_at = now() WHERE id = $1",
        id,
        archived
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// A member of a tenant, for the tenant page.
#[derive(Debug, Clone)]
pub struct Member {
    pub user_id: i64,
    pub email: String,
    pub display_name: String,
    pub role: String,
    pub disabled: bool,
    /// `manual` or `sso` (kept in step by a single sign-on group mapping).
    pub source: String,
}

pub async fn members(db: impl PgExecutor<'_>, tenant_id: i64) -> sqlx::Result<Vec<Member>> {
    sqlx::query_as!(
        Member,
        "SELECT u.id AS user_id, u.email, u.display_name, m.role, u.disabled, m.source
         FROM memberships m JOIN users u ON u.id = m.user_id
         WHERE m.tenant_id = $1 ORDER BY m.role DESC, u.email",
        tenant_id
    )
    .fetch_all(db)
    .await
}

/// A tenant's idle policy.
pub async fn idle_policy(
    db: impl PgExecutor<'_>,
    id: i64,
) -> sqlx::Result<crate::domain::IdlePolicy> {
    let r = sqlx::query!(
        r#"SELECT idle_after_minutes, idle_grace_minutes, idle_action AS "idle_action: crate::domain::IdleAction"
           FROM tenants WHERE id = $1"#,
        id
    )
    .fetch_one(db)
    .await?;
    Ok(crate::domain::IdlePolicy {
        after_minutes: r.idle_after_minutes,
        grace_minutes: r.idle_grace_minutes,
        action: r.idle_action,
    })
}

/// Sets a tenant's idle policy.
pub async fn set_idle_policy(
    db: &mut sqlx::PgConnection,
    id: i64,
    p: &crate::domain::IdlePolicy,
) -> sqlx::Result<()> {
    if idle_policy(&mut *db, id).await? == *p {
        return Ok(());
    }
    sqlx::query!(
        "UPDATE tenants SET idle_after_minutes = $2, idle_grace_minutes = $3, idle_action = $4,
                            updated_at = now()
         WHERE id = $1",
        id,
        p.after_minutes,
        p.grace_minutes,
        p.action.as_str()
    )
    .execute(&mut *db)
    .await?;
    // A new policy starts every clock afresh (no release at once on a
    // switch to `release`, no stale warnings when turned off).
    sqlx::query!(
        "UPDATE bookings SET idle_since = NULL, idle_warned_at = NULL
         WHERE tenant_id = $1 AND status = 'active'
           AND (idle_since IS NOT NULL OR idle_warned_at IS NOT NULL)",
        id
    )
    .execute(&mut *db)
    .await?;
    Ok(())
}
