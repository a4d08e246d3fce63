//! Idle reclaim's reads and writes: each active booking of a tenant with an
//! idle policy, with its latest telemetry sample; its idle clock.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::IdleAction;

/// An active booking under an idle policy, as idle reclaim sees it.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub id: i64,
    pub user_id: i64,
    pub tenant_slug: String,
    pub after_minutes: i32,
    pub grace_minutes: i32,
    pub action: IdleAction,
    pub idle_since: Option<OffsetDateTime>,
    /// Seconds since `idle_since` (by the database's clock).
    pub idle_secs: Option<f64>,
    pub warned_at: Option<OffsetDateTime>,
    /// Seconds since the warning.
    pub warned_secs: Option<f64>,
    pub kept_at: Option<OffsetDateTime>,
    /// The latest sample: when, its age in seconds, processes, utilisation.
    pub sample_at: Option<OffsetDateTime>,
    pub sample_age_secs: Option<f64>,
    pub processes: Option<i32>,
    pub utilization_pct: Option<f32>,
}

pub async fn candidates(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Candidate>> {
    sqlx::query_as!(
        Candidate,
        r#"SELECT b.id, b.user_id, t.slug AS tenant_slug, t.idle_after_minutes AS after_minutes,
                  t.idle_grace_minutes AS grace_minutes, t.idle_action AS "action: IdleAction",
                  b.idle_since, EXTRACT(EPOCH FROM now() - b.idle_since)::float8 AS idle_secs,
                  b.idle_warned_at AS warned_at,
                  EXTRACT(EPOCH FROM now() - b.idle_warned_at)::float8 AS warned_secs,
                  b.idle_kept_at AS kept_at,
                  s.at AS "sample_at?", EXTRACT(EPOCH FROM now() - s.at)::float8 AS sample_age_secs,
                  s.processes AS "processes?", s.utilization_pct AS "utilization_pct?"
           FROM bookings b
           JOIN tenants t ON t.id = b.tenant_id
           LEFT JOIN LATERAL (
               SELECT at, processes, utilization_pct FROM instance_samples
               WHERE booking_id = b.id ORDER BY at DESC LIMIT 1) s ON true
           WHERE b.status = 'active' AND t.idle_after_minutes > 0
           ORDER BY b.id"#
    )
    .fetch_all(db)
    .await
}

/// The booking is busy (again): its idle clock stops.
pub async fn clear(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET idle_since = NULL, idle_warned_at = NULL
         WHERE id = $1 AND (idle_since IS NOT NULL OR idle_warned_at IS NOT NULL)",
        id
    )
    .execute(db)
    .await?;
    Ok(())
}

/// The idle clock starts at `since` (the first idle sample).
pub async fn start(db: impl PgExecutor<'_>, id: i64, since: OffsetDateTime) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET idle_since = $2
         WHERE id = $1 AND status = 'active' AND idle_since IS NULL",
        id,
        since
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Marks the owner warned, if the booking is still idle for `after_minutes`
/// (an answer or new work since the round read it stops it); false when
/// not, or when another process warned first.
pub async fn mark_warned(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    after_minutes: i32,
) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE bookings SET idle_warned_at = now()
         WHERE id = $1 AND status = 'active' AND idle_warned_at IS NULL
           AND idle_since <= now() - make_interval(mins => $2)",
        id,
        after_minutes
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// "Still working": the idle clock starts again now. False when the
/// booking is not active.
pub async fn keep(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE bookings SET idle_since = NULL, idle_warned_at = NULL, idle_kept_at = now()
         WHERE id = $1 AND status = 'active'",
        id
    )
    .execute(db)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// Sets the reason of a booking released for being idle.
pub async fn set_reason(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    reason: &str,
) -> sqlx::Result<()> {
    sqlx::query!("UPDATE bookings SET reason = $2 WHERE id = $1", id, reason)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Whether a warned booking is still due for release: warned at least
/// `grace_minutes` ago and no "still working" since (read under the row
/// lock the release holds).
pub async fn release_due(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    grace_minutes: i32,
) -> sqlx::Result<bool> {
    Ok(sqlx::query_scalar!(
        r#"SELECT (idle_warned_at <= now() - make_interval(mins => $2)
                   AND (idle_kept_at IS NULL OR idle_kept_at < idle_warned_at)) AS "due!"
           FROM bookings WHERE id = $1"#,
        id,
        grace_minutes
    )
    .fetch_optional(&mut **tx)
    .await?
    .unwrap_or(false))
}
