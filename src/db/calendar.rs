//! Private iCalendar feeds: their secret tokens and the bookings they show.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::booking::{Kind, Status};

/// Whose bookings a feed shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feed {
    pub user_id: i64,
    /// A tenant's feed (its managers'); `None`: the person's own.
    pub tenant_id: Option<i64>,
}

/// The live token of a person's feed (or of a tenant's, by one manager).
pub async fn token_of(db: impl PgExecutor<'_>, feed: Feed) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        "SELECT token FROM calendar_feeds
         WHERE user_id = $1 AND tenant_id IS NOT DISTINCT FROM $2 AND revoked_at IS NULL",
        feed.user_id,
        feed.tenant_id
    )
    .fetch_optional(db)
    .await
}

/// The feed's live token, `candidate` becoming it when it has none (one
/// statement, so two first asks at once cannot both insert). `None` only
/// when a concurrent first ask won and is not yet visible: ask again.
pub async fn ensure(
    db: impl PgExecutor<'_>,
    feed: Feed,
    candidate: &str,
) -> sqlx::Result<Option<String>> {
    sqlx::query_scalar!(
        r#"WITH made AS (
               INSERT INTO calendar_feeds (user_id, tenant_id, token) VALUES ($1, $2, $3)
               ON CONFLICT (user_id, coalesce(tenant_id, 0)) WHERE revoked_at IS NULL DO NOTHING
               RETURNING token)
           SELECT token AS "token!" FROM made
           UNION ALL
           SELECT token FROM calendar_feeds
           WHERE user_id = $1 AND tenant_id IS NOT DISTINCT FROM $2 AND revoked_at IS NULL
           LIMIT 1"#,
        feed.user_id,
        feed.tenant_id,
        candidate
    )
    .fetch_optional(db)
    .await
}

/// Revokes the feed's live token, if any; whether there was one.
pub async fn revoke(db: impl PgExecutor<'_>, feed: Feed) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE calendar_feeds SET revoked_at = now()
         WHERE user_id = $1 AND tenant_id IS NOT DISTINCT FROM $2 AND revoked_at IS NULL",
        feed.user_id,
        feed.tenant_id
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n > 0)
}

/// A new token for the feed (the old one, if any, revoked in the same
/// transaction).
pub async fn renew(
    tx: &mut Transaction<'_, Postgres>,
    feed: Feed,
    token: &str,
) -> sqlx::Result<()> {
    revoke(&mut **tx, feed).await?;
    sqlx::query!(
        "INSERT INTO calendar_feeds (user_id, tenant_id, token) VALUES ($1, $2, $3)",
        feed.user_id,
        feed.tenant_id,
        token
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The feed a live token opens: its owner enabled and, for a tenant's
/// feed, still a manager of the tenant.
pub async fn feed_of_token(db: impl PgExecutor<'_>, token: &str) -> sqlx::Result<Option<Feed>> {
    let row = sqlx::query!(
        r#"SELECT f.user_id, f.tenant_id
           FROM calendar_feeds f JOIN users u ON u.id = f.user_id
           WHERE f.token = $1 AND f.revoked_at IS NULL AND NOT u.disabled
             AND (f.tenant_id IS NULL OR EXISTS (
                   SELECT 1 FROM memberships m
                   WHERE m.user_id = f.user_id AND m.tenant_id = f.tenant_id AND m.role = 'manager'))"#,
        token
    )
    .fetch_optional(db)
    .await?;
    Ok(row.map(|r| Feed {
        user_id: r.user_id,
        tenant_id: r.tenant_id,
    }))
}

/// A booking as a calendar shows it.
#[derive(Debug, Clone)]
pub struct Entry {
    pub id: i64,
    pub kind: Kind,
    pub model: Option<String>,
    pub profile: Option<String>,
    pub memory_gib: i32,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    pub status: Status,
    pub tenant_slug: String,
    pub user_email: String,
    pub node: Option<String>,
    pub device_uuid: Option<String>,
    pub updated_at: OffsetDateTime,
}

/// The feed's bookings that end after `since`, by start (at most 2,000).
pub async fn entries(
    db: impl PgExecutor<'_>,
    feed: Feed,
    since: OffsetDateTime,
) -> sqlx::Result<Vec<Entry>> {
    sqlx::query_as!(
        Entry,
        r#"SELECT b.id, b.kind AS "kind: Kind", coalesce(b.model, b.requested_model) AS model, b.profile,
                  b.memory_gib, lower(b.during) AS "start!", upper(b.during) AS "end!",
                  b.status AS "status: Status", t.slug AS tenant_slug, u.email AS user_email,
                  n.name AS "node?", b.device_uuid, b.updated_at
           FROM bookings b
           JOIN tenants t ON t.id = b.tenant_id
           JOIN users u ON u.id = b.user_id
           LEFT JOIN gpus g ON g.id = b.gpu_id
           LEFT JOIN nodes n ON n.id = g.node_id
           WHERE upper(b.during) > $3
             AND (CASE WHEN $2::bigint IS NULL THEN b.user_id = $1 ELSE b.tenant_id = $2 END)
           ORDER BY lower(b.during), b.id
           LIMIT 2000"#,
        feed.user_id,
        feed.tenant_id,
        since
    )
    .fetch_all(db)
    .await
}
