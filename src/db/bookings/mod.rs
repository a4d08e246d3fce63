//! Bookings and their events. Lists select ids first and then load the
//! bookings through one query ([`get_many`]), so that the joined shape of a
//! booking is written (and checked by sqlx) once. Split by who uses them:
//! this file reads bookings and records people's changes; [`rules`] serves
//! the booking rules (quota, placement, the queue); [`index`] the placement
//! index's change log; [`leases`] the node
//! worker's claims and steps; [`shares`] the time-slice scheduler, its QoS
//! ledger and `gpuslice exec`.

mod index;
mod leases;
mod rules;
mod shares;

pub use index::*;
pub use leases::*;
pub use rules::*;
pub use shares::*;

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::booking::{Kind, Status, Transition};
use crate::domain::Priority;

/// A booking with the names around it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Booking {
    pub id: i64,
    pub tenant_id: i64,
    pub tenant_slug: String,
    pub tenant_name: String,
    pub user_id: i64,
    pub user_email: String,
    pub kind: Kind,
    pub requested_model: Option<String>,
    pub model: Option<String>,
    pub profile: Option<String>,
    pub memory_gib: i32,
    pub compute_slices: i32,
    pub priority: Priority,
    pub hours: i32,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    pub status: Status,
    pub ending_as: Option<Status>,
    pub gpu_id: Option<i64>,
    pub gpu_uuid: Option<String>,
    pub gpu_idx: Option<i32>,
    pub node: Option<String>,
    pub slice_start: Option<i32>,
    pub slice_end: Option<i32>,
    pub device_uuid: Option<String>,
    pub reason: Option<String>,
    pub offered_start: Option<OffsetDateTime>,
    pub warned_at: Option<OffsetDateTime>,
    pub attempts: i32,
    /// The time-slice scheduler's latest view (active shares).
    pub scheduler: Option<serde_json::Value>,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    /// Idle reclaim: since when the device shows no work, when the owner
    /// was warned, and when it will be released (a `release` policy).
    pub idle_since: Option<OffsetDateTime>,
    pub idle_warned_at: Option<OffsetDateTime>,
    pub idle_release_at: Option<OffsetDateTime>,
    /// What its device measured: peak memory (MiB) and the busiest
    /// 5-minute mean utilisation (%), for rightsizing advice.
    pub peak_memory_mib: Option<i64>,
    pub busy_pct: Option<f64>,
    /// The device files its processes may open (set at activation).
    pub device_nodes: Option<serde_json::Value>,
}

impl Booking {
    /// Once it has ended: the smallest slice that would have served it, if
    /// smaller than what it had (see [`crate::domain::rightsize`]).
    pub fn advice(&self) -> Option<crate::domain::rightsize::Advice> {
        use crate::domain::rightsize;
        if !Status::FINAL.contains(&self.status) {
            return None;
        }
        // No memory ever seen: nothing ran, or it could not be measured
        // (a share on a node without cgroups); no advice either way.
        let peak = self.peak_memory_mib.filter(|&m| m > 0)? as f64;
        let model = crate::gpu::catalog::model(self.model.as_deref()?)?;
        match self.kind {
            Kind::Mig => {
                let booked = model.profile(self.profile.as_deref()?)?;
                rightsize::advise_mig(model, booked, peak, self.busy_pct)
            }
            Kind::Timeslice => rightsize::advise_share(self.memory_gib, model.memory_gib, peak),
        }
    }
}

/// Statuses as the text the schema stores (for `= ANY($n)`).
fn status_names(statuses: impl IntoIterator<Item = Status>) -> Vec<String> {
    statuses
        .into_iter()
        .map(|s| s.as_str().to_string())
        .collect()
}

/// Loads bookings by id, in the order of `ids`.
pub async fn get_many(db: impl PgExecutor<'_>, ids: &[i64]) -> sqlx::Result<Vec<Booking>> {
    sqlx::query_as!(
        Booking,
        r#"SELECT b.id, b.tenant_id, t.slug AS tenant_slug, t.name AS tenant_name, b.user_id,
                  u.email AS user_email, b.kind AS "kind: Kind", b.requested_model, b.model, b.profile,
                  b.memory_gib, b.compute_slices, b.priority AS "priority: Priority", b.hours,
                  lower(b.during) AS "start!", upper(b.during) AS "end!", b.status AS "status: Status",
                  b.ending_as AS "ending_as: Status",
                  b.gpu_id, g.uuid AS "gpu_uuid?", g.idx AS "gpu_idx?", n.name AS "node?",
                  lower(b.slices) AS slice_start, upper(b.slices) AS slice_end,
                  b.device_uuid, b.reason, b.offered_start, b.warned_at, b.attempts, b.scheduler, b.created_at, b.updated_at,
                  b.idle_since, b.idle_warned_at,
                  CASE WHEN t.idle_action = 'release'
                       THEN b.idle_warned_at + make_interval(mins => t.idle_grace_minutes) END AS idle_release_at,
                  r.peak_memory_mib, r.busy_pct, b.device_nodes
           FROM unnest($1::bigint[]) WITH ORDINALITY AS i (id, ord)
           JOIN bookings b ON b.id = i.id
           LEFT JOIN LATERAL (
               SELECT max(memory_used_max) AS peak_memory_mib,
                      max(utilization_sum / NULLIF(utilization_n, 0)) AS busy_pct
               FROM instance_rollups
               WHERE booking_id = b.id
                 -- Advice is for ended bookings: skip the read for live ones.
                 AND b.status IN ('released', 'expired', 'cancelled', 'failed')) r ON true
           JOIN tenants t ON t.id = b.tenant_id
           JOIN users u ON u.id = b.user_id
           LEFT JOIN gpus g ON g.id = b.gpu_id
           LEFT JOIN nodes n ON n.id = g.node_id
           ORDER BY i.ord"#,
        ids
    )
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Booking> {
    get_many(db, &[id])
        .await?
        .into_iter()
        .next()
        .ok_or(sqlx::Error::RowNotFound)
}

/// Which bookings a list shows.
#[derive(Debug, Clone, Copy)]
pub enum Scope {
    User(i64),
    Tenant(i64),
    All,
}

/// The newest bookings in `scope`, live ones first.
pub async fn list(
    db: impl PgExecutor<'_> + Copy,
    scope: Scope,
    limit: i64,
) -> sqlx::Result<Vec<Booking>> {
    let (user, tenant) = match scope {
        Scope::User(u) => (Some(u), None),
        Scope::Tenant(t) => (None, Some(t)),
        Scope::All => (None, None),
    };
    let ids = sqlx::query_scalar!(
        "SELECT id FROM bookings
         WHERE ($1::bigint IS NULL OR user_id = $1) AND ($2::bigint IS NULL OR tenant_id = $2)
         ORDER BY status = ANY($3) DESC, created_at DESC, id DESC
         LIMIT $4",
        user,
        tenant,
        &status_names(Status::LIVE)[..],
        limit
    )
    .fetch_all(db)
    .await?;
    get_many(db, &ids).await
}

/// A page of bookings in `scope`, newest first (by creation, then id),
/// after `(at, id)` (the last row of the previous page): keyset
/// pagination, one static query per scope so that every plan, generic ones
/// included, is one index range scan however deep.
pub async fn page(
    db: impl PgExecutor<'_> + Copy,
    scope: Scope,
    after: (OffsetDateTime, i64),
    limit: i64,
) -> sqlx::Result<Vec<Booking>> {
    let (at, id) = after;
    let ids = match scope {
        Scope::User(u) => {
            sqlx::query_scalar!(
                "SELECT id FROM bookings WHERE user_id = $1 AND (created_at, id) < ($2, $3)
                 ORDER BY created_at DESC, id DESC LIMIT $4",
                u,
                at,
                id,
                limit
            )
            .fetch_all(db)
            .await?
        }
        Scope::Tenant(t) => {
            sqlx::query_scalar!(
                "SELECT id FROM bookings WHERE tenant_id = $1 AND (created_at, id) < ($2, $3)
                 ORDER BY created_at DESC, id DESC LIMIT $4",
                t,
                at,
                id,
                limit
            )
            .fetch_all(db)
            .await?
        }
        Scope::All => {
            sqlx::query_scalar!(
                "SELECT id FROM bookings WHERE (created_at, id) < ($1, $2)
                 ORDER BY created_at DESC, id DESC LIMIT $3",
                at,
                id,
                limit
            )
            .fetch_all(db)
            .await?
        }
    };
    get_many(db, &ids).await
}

/// A new booking.
pub struct NewBooking<'a> {
    pub tenant_id: i64,
    pub user_id: i64,
    pub kind: Kind,
    pub requested_model: Option<&'a str>,
    pub model: Option<&'a str>,
    pub profile: Option<&'a str>,
    pub memory_gib: i32,
    pub compute_slices: i32,
    pub priority: Priority,
    pub hours: i32,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    /// `queued` or `scheduled`.
    pub status: Status,
    pub gpu_id: Option<i64>,
    /// MIG memory slices `[start, end)`.
    pub slices: Option<(i32, i32)>,
    pub reason: Option<&'a str>,
    pub offered_start: Option<OffsetDateTime>,
    pub idempotency_key: Option<&'a str>,
}

pub async fn insert(
    db: impl PgExecutor<'_>,
    b: &NewBooking<'_>,
    actor: &str,
    event_reason: &str,
) -> sqlx::Result<i64> {
    // The booking and the first line of its timeline in one statement (one
    // round trip less inside the placement lock).
    sqlx::query_scalar!(
        r#"WITH b AS (
               INSERT INTO bookings (tenant_id, user_id, kind, requested_model, model, profile, memory_gib,
                                     compute_slices, priority, hours, during, status, gpu_id, slices,
                                     reason, idempotency_key, offered_start)
               VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, tstzrange($11, $12), $13, $14,
                       CASE WHEN $15::int IS NULL THEN NULL ELSE int4range($15, $16) END, $17, $18, $19)
               RETURNING id, status
           ), e AS (
               INSERT INTO booking_events (booking_id, actor, from_status, to_status, reason)
               SELECT id, $20, NULL, status, $21 FROM b
           )
           SELECT id AS "id!" FROM b"#,
        b.tenant_id,
        b.user_id,
        b.kind.as_str(),
        b.requested_model,
        b.model,
        b.profile,
        b.memory_gib,
        b.compute_slices,
        b.priority.as_str(),
        b.hours,
        b.start,
        b.end,
        b.status.as_str(),
        b.gpu_id,
        b.slices.map(|s| s.0),
        b.slices.map(|s| s.1),
        b.reason,
        b.idempotency_key,
        b.offered_start,
        actor,
        event_reason
    )
    .fetch_one(db)
    .await
}

/// The booking a user made with an `Idempotency-Key`, if any.
pub async fn by_idempotency_key(
    db: impl PgExecutor<'_>,
    user_id: i64,
    key: &str,
) -> sqlx::Result<Option<i64>> {
    sqlx::query_scalar!(
        "SELECT id FROM bookings WHERE user_id = $1 AND idempotency_key = $2",
        user_id,
        key
    )
    .fetch_optional(db)
    .await
}

/// Records a status change (`from` is `None` for a new booking).
pub async fn event(
    db: impl PgExecutor<'_>,
    booking_id: i64,
    actor: &str,
    from: Option<Status>,
    to: Status,
    reason: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO booking_events (booking_id, actor, from_status, to_status, reason)
         VALUES ($1, $2, $3, $4, $5)",
        booking_id,
        actor,
        from.map(Status::as_str),
        to.as_str(),
        reason
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Adds a line to a booking's timeline without changing its status
/// (extended, warned, device recreated).
pub async fn note(
    db: impl PgExecutor<'_>,
    booking_id: i64,
    actor: &str,
    status: Status,
    reason: &str,
) -> sqlx::Result<()> {
    event(db, booking_id, actor, Some(status), status, reason).await
}

/// One entry of a booking's timeline.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Event {
    pub at: OffsetDateTime,
    pub actor: String,
    pub from_status: Option<Status>,
    pub to_status: Status,
    pub reason: String,
}

pub async fn events(db: impl PgExecutor<'_>, booking_id: i64) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as!(
        Event,
        r#"SELECT at, actor, from_status AS "from_status: Status", to_status AS "to_status: Status",
                  reason
           FROM booking_events WHERE booking_id = $1 ORDER BY at, id"#,
        booking_id
    )
    .fetch_all(db)
    .await
}

/// Makes move `t` if the booking still is in `t.from()`, recording the
/// event; false when someone else moved it first. Into `releasing`: the
/// window's end moves to now (an early end) and the worker tears down
/// next, the booking becoming `t.ending()` after; a failure's `reason`
/// becomes the booking's reason. Out of `releasing`: the lease is
/// dropped. Otherwise `reason`, when given, replaces the booking's reason.
pub async fn transition(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    t: Transition,
    actor: &str,
    reason: Option<&str>,
) -> sqlx::Result<bool> {
    let (from, to) = (t.from().as_str(), t.to().as_str());
    let r = if t.to() == Status::Releasing {
        sqlx::query!(
            "UPDATE bookings SET status = 'releasing', ending_as = $3, updated_at = now(),
                                 reason = CASE WHEN $3 = 'failed' THEN $4 ELSE reason END,
                                 during = tstzrange(lower(during),
                                     GREATEST(LEAST(upper(during), now()), lower(during) + interval '1 second')),
                                 lease_owner = NULL, lease_until = NULL, attempts = 0, next_attempt_at = now()
             WHERE id = $1 AND status = $2",
            id,
            from,
            t.ending().map(Status::as_str),
            reason
        )
        .execute(&mut **tx)
        .await?
    } else if t.from() == Status::Releasing {
        sqlx::query!(
            "UPDATE bookings SET status = $3, updated_at = now(), lease_owner = NULL, lease_until = NULL
             WHERE id = $1 AND status = $2",
            id,
            from,
            to
        )
        .execute(&mut **tx)
        .await?
    } else {
        sqlx::query!(
            "UPDATE bookings SET status = $3, reason = COALESCE($4, reason), updated_at = now()
             WHERE id = $1 AND status = $2",
            id,
            from,
            to,
            reason
        )
        .execute(&mut **tx)
        .await?
    };
    let moved = r.rows_affected() == 1;
    if moved {
        event(
            &mut **tx,
            id,
            actor,
            Some(t.from()),
            t.to(),
            reason.unwrap_or(""),
        )
        .await?;
        // The owner's notice is queued with the change itself (outbox).
        crate::db::notify::booking_moved(tx, id, t.to(), t.from(), reason).await?;
    }
    Ok(moved)
}

/// Locks a booking's row for a change: its status and, while
/// `releasing`, what it ends as.
pub async fn lock(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
) -> sqlx::Result<(Status, Option<Status>)> {
    let r = sqlx::query!(
        r#"SELECT status AS "status: Status", ending_as AS "ending_as: Status"
           FROM bookings WHERE id = $1 FOR UPDATE"#,
        id
    )
    .fetch_one(&mut **tx)
    .await?;
    Ok((r.status, r.ending_as))
}

/// A tenant's bookings that ran and ended (released or expired) since
/// `since` (for the rightsizing sum).
pub async fn ended_since(
    db: impl PgExecutor<'_> + Copy,
    tenant_id: i64,
    since: OffsetDateTime,
) -> sqlx::Result<Vec<Booking>> {
    let ids = sqlx::query_scalar!(
        "SELECT id FROM bookings
         WHERE tenant_id = $1 AND status = ANY($2) AND upper(during) >= $3
         ORDER BY id",
        tenant_id,
        &status_names([Status::Released, Status::Expired]) as &[String],
        since
    )
    .fetch_all(db)
    .await?;
    get_many(db, &ids).await
}
