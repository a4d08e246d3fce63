//! The fleet optimizer's reads and writes: shares' recent activity, the
//! priority it lowers and gives back, its history, and the 7-day figures
//! of the optimizer page.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::Priority;

/// An active time-sliced share with its mean utilisation over a window.
#[derive(Debug, Clone)]
pub struct ShareActivity {
    pub id: i64,
    pub priority: Priority,
    pub lowered_from: Option<Priority>,
    /// Mean of the 5-minute means since the window's start (None: no
    /// measurement).
    pub mean_util: Option<f64>,
    /// An admin gave its priority back: the optimizer leaves it alone.
    pub pinned: bool,
}

/// Active shares that have run at least `window_mins`, with their mean
/// utilisation over the last `window_mins`.
pub async fn share_activity(
    db: impl PgExecutor<'_>,
    window_mins: i32,
) -> sqlx::Result<Vec<ShareActivity>> {
    sqlx::query_as!(
        ShareActivity,
        r#"SELECT b.id, b.priority AS "priority: Priority", b.lowered_from AS "lowered_from: Priority",
                  r.mean_util,
                  EXISTS (SELECT 1 FROM optimizer_actions a
                          WHERE a.booking_id = b.id AND a.action = 'priority_restored'
                            AND a.actor <> 'optimizer') AS "pinned!"
           FROM bookings b
           LEFT JOIN LATERAL (
               SELECT sum(utilization_sum) / NULLIF(sum(utilization_n), 0) AS mean_util
               FROM instance_rollups
               WHERE booking_id = b.id
                 AND bucket >= now() - make_interval(mins => $1)) r ON true
           WHERE b.status = 'active' AND b.kind = 'timeslice'
             AND lower(b.during) <= now() - make_interval(mins => $1)
           ORDER BY b.id"#,
        window_mins
    )
    .fetch_all(db)
    .await
}

/// Lowers a share to `low`, remembering its priority; false when it
/// changed meanwhile.
pub async fn lower(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    from: Priority,
) -> sqlx::Result<bool> {
    let n = sqlx::query!(
        "UPDATE bookings SET priority = 'low', lowered_from = $2
         WHERE id = $1 AND lowered_from IS NULL AND priority = $2 AND status = 'active'",
        id,
        from.as_str()
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

/// Gives a lowered share its priority back; the priority it gets, or None
/// when it was not lowered.
pub async fn restore(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
) -> sqlx::Result<Option<Priority>> {
    sqlx::query_scalar!(
        r#"UPDATE bookings SET priority = lowered_from, lowered_from = NULL
           WHERE id = $1 AND lowered_from IS NOT NULL AND status = 'active'
           RETURNING priority AS "priority: Priority""#,
        id
    )
    .fetch_optional(&mut **tx)
    .await
}

/// One entry of the optimization history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Action {
    pub id: i64,
    pub at: OffsetDateTime,
    pub action: String,
    pub actor: String,
    pub booking_id: Option<i64>,
    pub metric: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
    pub detail: serde_json::Value,
}

#[allow(clippy::too_many_arguments)]
pub async fn record(
    tx: &mut Transaction<'_, Postgres>,
    action: &str,
    actor: &str,
    booking_id: i64,
    metric: &str,
    before: Option<f64>,
    after: Option<f64>,
    detail: serde_json::Value,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO optimizer_actions (action, actor, booking_id, metric, before, after, detail)
         VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
        action,
        actor,
        booking_id,
        metric,
        before,
        after,
        detail
    )
    .fetch_one(&mut **tx)
    .await
}

/// The newest entries, each with whether an admin can undo it now (the
/// latest lowering of a booking still lowered and active).
pub async fn history(db: impl PgExecutor<'_>, limit: i64) -> sqlx::Result<Vec<(Action, bool)>> {
    let rows = sqlx::query!(
        r#"SELECT a.id, a.at, a.action, a.actor, a.booking_id, a.metric, a.before, a.after, a.detail,
                  (a.action = 'priority_lowered' AND b.lowered_from IS NOT NULL AND b.status = 'active'
                   AND a.id = (SELECT max(l.id) FROM optimizer_actions l
                               WHERE l.booking_id = a.booking_id AND l.action = 'priority_lowered'))
                  AS "reversible!"
           FROM optimizer_actions a LEFT JOIN bookings b ON b.id = a.booking_id
           ORDER BY a.at DESC, a.id DESC LIMIT $1"#,
        limit
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            (
                Action {
                    id: r.id,
                    at: r.at,
                    action: r.action,
                    actor: r.actor,
                    booking_id: r.booking_id,
                    metric: r.metric,
                    before: r.before,
                    after: r.after,
                    detail: r.detail,
                },
                r.reversible,
            )
        })
        .collect())
}

pub async fn action(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<Action>> {
    sqlx::query_as!(
        Action,
        "SELECT id, at, action, actor, booking_id, metric, before, after, detail
         FROM optimizer_actions WHERE id = $1",
        id
    )
    .fetch_optional(db)
    .await
}

/// A GPU over the last 7 days: mean utilisation, and the slice-seconds
/// booked on it (the page divides by what it had: 7 compute slices, 4 on
/// an A30 in MIG mode).
#[derive(Debug, Clone)]
pub struct GpuWeek {
    pub id: i64,
    pub node: String,
    pub idx: i32,
    pub model: String,
    pub mode: String,
    pub mean_util: Option<f64>,
    pub booked_slice_secs: f64,
}

pub async fn gpu_week(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<GpuWeek>> {
    sqlx::query_as!(
        GpuWeek,
        r#"WITH booked AS (
               SELECT b.gpu_id, sum(b.compute_slices * EXTRACT(EPOCH FROM
                          LEAST(upper(b.during), now()) - GREATEST(lower(b.during), now() - interval '7 days')))::float8 AS secs
               FROM bookings b
               WHERE b.gpu_id IS NOT NULL AND b.status NOT IN ('queued', 'cancelled')
                 AND b.during && tstzrange(now() - interval '7 days', now())
               GROUP BY b.gpu_id),
           util AS (
               SELECT gpu_id, sum(utilization_sum) / NULLIF(sum(utilization_n), 0) AS mean_util
               FROM gpu_rollups WHERE bucket >= now() - interval '7 days'
               GROUP BY gpu_id)
           SELECT g.id, n.name AS node, g.idx, g.model, g.mode, u.mean_util AS "mean_util?",
                  COALESCE(bk.secs, 0) AS "booked_slice_secs!"
           FROM gpus g JOIN nodes n ON n.id = g.node_id
           LEFT JOIN booked bk ON bk.gpu_id = g.id
           LEFT JOIN util u ON u.gpu_id = g.id
           ORDER BY g.model, n.name, g.idx"#
    )
    .fetch_all(db)
    .await
}

/// Per model over 7 days: queued bookings that got a GPU and their mean
/// wait in minutes.
pub async fn queue_waits(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<(String, i64, f64)>> {
    let rows = sqlx::query!(
        r#"SELECT COALESCE(b.model, b.requested_model, 'any') AS "model!",
                  count(*) AS "n!",
                  avg(EXTRACT(EPOCH FROM e.at - b.created_at) / 60.0)::float8 AS "mean_wait_min!"
           FROM booking_events e JOIN bookings b ON b.id = e.booking_id
           WHERE e.from_status = 'queued' AND e.to_status = 'scheduled'
             AND e.at >= now() - interval '7 days'
           GROUP BY 1 ORDER BY 1"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.model, r.n, r.mean_wait_min))
        .collect())
}
