//! Bookings and their events. Lists select ids first and then load the
//! bookings through one query ([`get_many`]), so that the joined shape of a
//! booking is written (and checked by sqlx) once.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use crate::domain::booking::Held;

/// A booking with the names around it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Booking {
    pub id: i64,
    pub tenant_id: i64,
    pub tenant_slug: String,
    pub tenant_name: String,
    pub user_id: i64,
    pub user_email: String,
    pub kind: String,
    pub requested_model: Option<String>,
    pub model: Option<String>,
    pub profile: Option<String>,
    pub memory_gib: i32,
    pub compute_slices: i32,
    pub priority: String,
    pub hours: i32,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    pub status: String,
    pub ending_as: Option<String>,
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
}

/// The statuses that hold or wait for capacity.
pub const LIVE: [&str; 5] = ["queued", "scheduled", "provisioning", "active", "releasing"];

/// Loads bookings by id, in the order of `ids`.
pub async fn get_many(db: impl PgExecutor<'_>, ids: &[i64]) -> sqlx::Result<Vec<Booking>> {
    sqlx::query_as!(
        Booking,
        r#"SELECT b.id, b.tenant_id, t.slug AS tenant_slug, t.name AS tenant_name, b.user_id,
                  u.email AS user_email, b.kind, b.requested_model, b.model, b.profile,
                  b.memory_gib, b.compute_slices, b.priority, b.hours,
                  lower(b.during) AS "start!", upper(b.during) AS "end!", b.status, b.ending_as,
                  b.gpu_id, g.uuid AS "gpu_uuid?", g.idx AS "gpu_idx?", n.name AS "node?",
                  lower(b.slices) AS slice_start, upper(b.slices) AS slice_end,
                  b.device_uuid, b.reason, b.offered_start, b.warned_at, b.attempts, b.scheduler, b.created_at, b.updated_at
           FROM unnest($1::bigint[]) WITH ORDINALITY AS i (id, ord)
           JOIN bookings b ON b.id = i.id
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
        &LIVE.map(String::from)[..],
        limit
    )
    .fetch_all(db)
    .await?;
    get_many(db, &ids).await
}

/// A new booking.
pub struct NewBooking<'a> {
    pub tenant_id: i64,
    pub user_id: i64,
    pub kind: &'a str,
    pub requested_model: Option<&'a str>,
    pub model: Option<&'a str>,
    pub profile: Option<&'a str>,
    pub memory_gib: i32,
    pub compute_slices: i32,
    pub priority: &'a str,
    pub hours: i32,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    pub status: &'a str,
    pub gpu_id: Option<i64>,
    /// MIG memory slices `[start, end)`.
    pub slices: Option<(i32, i32)>,
    pub reason: Option<&'a str>,
    pub offered_start: Option<OffsetDateTime>,
    pub idempotency_key: Option<&'a str>,
}

pub async fn insert(db: impl PgExecutor<'_>, b: &NewBooking<'_>) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO bookings (tenant_id, user_id, kind, requested_model, model, profile, memory_gib,
                               compute_slices, priority, hours, during, status, gpu_id, slices,
                               reason, idempotency_key, offered_start)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, tstzrange($11, $12), $13, $14,
                 CASE WHEN $15::int IS NULL THEN NULL ELSE int4range($15, $16) END, $17, $18, $19)
         RETURNING id",
        b.tenant_id,
        b.user_id,
        b.kind,
        b.requested_model,
        b.model,
        b.profile,
        b.memory_gib,
        b.compute_slices,
        b.priority,
        b.hours,
        b.start,
        b.end,
        b.status,
        b.gpu_id,
        b.slices.map(|s| s.0),
        b.slices.map(|s| s.1),
        b.reason,
        b.idempotency_key,
        b.offered_start
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

/// Records a status change.
pub async fn event(
    db: impl PgExecutor<'_>,
    booking_id: i64,
    actor: &str,
    from: Option<&str>,
    to: &str,
    reason: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO booking_events (booking_id, actor, from_status, to_status, reason)
         VALUES ($1, $2, $3, $4, $5)",
        booking_id,
        actor,
        from,
        to,
        reason
    )
    .execute(db)
    .await?;
    Ok(())
}

/// One entry of a booking's timeline.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Event {
    pub at: OffsetDateTime,
    pub actor: String,
    pub from_status: Option<String>,
    pub to_status: String,
    pub reason: String,
}

pub async fn events(db: impl PgExecutor<'_>, booking_id: i64) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as!(
        Event,
        "SELECT at, actor, from_status, to_status, reason FROM booking_events
         WHERE booking_id = $1 ORDER BY at, id",
        booking_id
    )
    .fetch_all(db)
    .await
}

/// Moves a booking from `from` to `to` if it still is in `from`, recording
/// the event; false when someone else moved it first. `reason` replaces the
/// booking's reason when given.
pub async fn transition(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    from: &str,
    to: &str,
    actor: &str,
    reason: Option<&str>,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE bookings SET status = $3, reason = COALESCE($4, reason), updated_at = now()
         WHERE id = $1 AND status = $2",
        id,
        from,
        to,
        reason
    )
    .execute(&mut **tx)
    .await?;
    if r.rows_affected() == 1 {
        event(&mut **tx, id, actor, Some(from), to, reason.unwrap_or("")).await?;
    }
    Ok(r.rows_affected() == 1)
}

/// Starts the end of a booking that holds a device: `releasing`, becoming
/// `ending_as` once torn down. An early end moves the window's end to now.
pub async fn begin_release(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    from: &str,
    ending_as: &str,
    actor: &str,
    reason: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE bookings SET status = 'releasing', ending_as = $3, updated_at = now(),
                             reason = CASE WHEN $3 = 'failed' THEN $4 ELSE reason END,
                             during = tstzrange(lower(during),
                                 GREATEST(LEAST(upper(during), now()), lower(during) + interval '1 second')),
                             lease_owner = NULL, lease_until = NULL, attempts = 0, next_attempt_at = now()
         WHERE id = $1 AND status = $2",
        id,
        from,
        ending_as,
        reason
    )
    .execute(&mut **tx)
    .await?;
    if r.rows_affected() == 1 {
        event(&mut **tx, id, actor, Some(from), "releasing", reason).await?;
    }
    Ok(r.rows_affected() == 1)
}

/// Locks a booking's row for a change by a person.
pub async fn lock(tx: &mut Transaction<'_, Postgres>, id: i64) -> sqlx::Result<String> {
    sqlx::query_scalar!("SELECT status FROM bookings WHERE id = $1 FOR UPDATE", id)
        .fetch_one(&mut **tx)
        .await
}

/// A tenant's live bookings overlapping `[from, to)`, except `except`.
pub async fn tenant_live_between(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    from: OffsetDateTime,
    to: OffsetDateTime,
    except: Option<i64>,
) -> sqlx::Result<Vec<Held>> {
    let rows = sqlx::query!(
        r#"SELECT extract(epoch FROM lower(during))::bigint AS "start!",
                  extract(epoch FROM upper(during))::bigint AS "end!", memory_gib, compute_slices
           FROM bookings
           WHERE tenant_id = $1 AND status = ANY($4) AND during && tstzrange($2, $3)
             AND id IS DISTINCT FROM $5"#,
        tenant_id,
        from,
        to,
        &LIVE.map(String::from)[..],
        except
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Held {
            start: r.start,
            end: r.end,
            memory_gib: r.memory_gib,
            compute_slices: r.compute_slices,
        })
        .collect())
}

/// Slice-hours a tenant used or booked within `[from, to)` (every booking
/// but cancelled ones; ended ones count the time they held).
pub async fn tenant_slice_hours(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    from: OffsetDateTime,
    to: OffsetDateTime,
    except: Option<i64>,
) -> sqlx::Result<f64> {
    sqlx::query_scalar!(
        r#"SELECT COALESCE(sum(compute_slices * extract(epoch FROM
                      upper(during * tstzrange($2, $3)) - lower(during * tstzrange($2, $3)))::float8 / 3600.0), 0)
                  AS "hours!"
           FROM bookings
           WHERE tenant_id = $1 AND status <> 'cancelled' AND during && tstzrange($2, $3)
             AND id IS DISTINCT FROM $4"#,
        tenant_id,
        from,
        to,
        except
    )
    .fetch_one(db)
    .await
}

/// A booking holding (or about to hold) a slot, for placement.
#[derive(Debug, Clone)]
pub struct Placed {
    pub id: i64,
    pub gpu_id: i64,
    pub kind: String,
    pub profile: Option<String>,
    pub slice_start: Option<i32>,
    pub memory_gib: i32,
    pub start: i64,
    pub end: i64,
}

/// Every placed live booking (of `kind`, when given) that has not ended.
pub async fn placed_live(db: impl PgExecutor<'_>, kind: Option<&str>) -> sqlx::Result<Vec<Placed>> {
    sqlx::query_as!(
        Placed,
        r#"SELECT id, gpu_id AS "gpu_id!", kind, profile, lower(slices) AS slice_start, memory_gib,
                  extract(epoch FROM lower(during))::bigint AS "start!",
                  extract(epoch FROM upper(during))::bigint AS "end!"
           FROM bookings
           WHERE status IN ('scheduled', 'provisioning', 'active', 'releasing')
             AND gpu_id IS NOT NULL AND upper(during) > now() AND ($1::text IS NULL OR kind = $1)"#,
        kind
    )
    .fetch_all(db)
    .await
}

/// The placed live bookings of one GPU that have not ended.
pub async fn placed_live_on(db: impl PgExecutor<'_>, gpu_id: i64) -> sqlx::Result<Vec<Placed>> {
    sqlx::query_as!(
        Placed,
        r#"SELECT id, gpu_id AS "gpu_id!", kind, profile, lower(slices) AS slice_start, memory_gib,
                  extract(epoch FROM lower(during))::bigint AS "start!",
                  extract(epoch FROM upper(during))::bigint AS "end!"
           FROM bookings
           WHERE status IN ('scheduled', 'provisioning', 'active', 'releasing')
             AND gpu_id = $1 AND upper(during) > now()"#,
        gpu_id
    )
    .fetch_all(db)
    .await
}

/// Profiles asked for in the last 30 days, by model: the mix placement keeps room for.
pub async fn recent_profile_counts(
    db: impl PgExecutor<'_>,
) -> sqlx::Result<Vec<(String, String, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT model AS "model!", profile AS "profile!", count(*) AS "n!"
           FROM bookings
           WHERE kind = 'mig' AND model IS NOT NULL AND created_at > now() - interval '30 days'
           GROUP BY model, profile"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.model, r.profile, r.n))
        .collect())
}

/// Share sizes (GiB) asked for in the last 30 days: the shapes share
/// placement keeps room for.
pub async fn recent_share_counts(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<(i32, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT memory_gib, count(*) AS "n!"
           FROM bookings
           WHERE kind = 'timeslice' AND created_at > now() - interval '30 days'
           GROUP BY memory_gib"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.memory_gib, r.n)).collect())
}

/// Places a queued booking: its GPU, slot and (possibly moved) window.
#[allow(clippy::too_many_arguments)]
pub async fn place_queued(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    gpu_id: i64,
    model: &str,
    slices: Option<(i32, i32)>,
    compute_slices: i32,
    memory_gib: i32,
    start: OffsetDateTime,
    end: OffsetDateTime,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE bookings SET status = 'scheduled', gpu_id = $2, model = $3,
                slices = CASE WHEN $4::int IS NULL THEN NULL ELSE int4range($4, $5) END,
                compute_slices = $6, memory_gib = $7, during = tstzrange($8, $9), reason = NULL,
                offered_start = NULL, updated_at = now()
         WHERE id = $1 AND status = 'queued'",
        id,
        gpu_id,
        model,
        slices.map(|s| s.0),
        slices.map(|s| s.1),
        compute_slices,
        memory_gib,
        start,
        end
    )
    .execute(&mut **tx)
    .await?;
    if r.rows_affected() == 1 {
        event(
            &mut **tx,
            id,
            "planner",
            Some("queued"),
            "scheduled",
            "capacity freed",
        )
        .await?;
    }
    Ok(r.rows_affected() == 1)
}

/// Queued bookings, oldest first: (id, tenant id, priority, when the
/// tenant last had a booking placed, if ever).
pub async fn queued(
    db: impl PgExecutor<'_>,
) -> sqlx::Result<Vec<(i64, i64, String, Option<OffsetDateTime>)>> {
    let rows = sqlx::query!(
        r#"SELECT b.id, b.tenant_id, b.priority,
                  (SELECT max(e.at) FROM booking_events e JOIN bookings x ON x.id = e.booking_id
                   WHERE x.tenant_id = b.tenant_id AND e.to_status = 'scheduled') AS last_placed
           FROM bookings b WHERE b.status = 'queued'
           ORDER BY b.created_at, b.id"#
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.id, r.tenant_id, r.priority, r.last_placed))
        .collect())
}

/// Updates a queued booking's reason (the planner's latest answer).
pub async fn set_reason(
    db: impl PgExecutor<'_>,
    id: i64,
    reason: &str,
    offered_start: Option<OffsetDateTime>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET reason = $2, offered_start = $3 WHERE id = $1",
        id,
        reason,
        offered_start
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Moves a live booking's end (extension).
pub async fn set_end(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    end: OffsetDateTime,
    hours: i32,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET during = tstzrange(lower(during), $2), hours = $3, warned_at = NULL,
                             updated_at = now()
         WHERE id = $1",
        id,
        end,
        hours
    )
    .execute(&mut **tx)
    .await?;
    Ok(())
}

// ---- The worker's side -------------------------------------------------

/// A step the worker of a node has to take for a booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// `scheduled` whose start has come, or `provisioning` whose lease lapsed.
    Provision,
    /// `active` whose end has come.
    Expire,
    /// `releasing`, not yet torn down.
    Teardown,
    /// `active` within the warning time of its end.
    Warn,
}

/// Claims up to `limit` bookings of `node` that need a step, with a lease
/// of `lease_secs` (`FOR UPDATE SKIP LOCKED`: two workers never take the
/// same booking). Returns (id, step).
pub async fn claim_due(
    db: impl PgExecutor<'_>,
    node: &str,
    owner: &str,
    lease_secs: f64,
    warn_secs: f64,
    limit: i64,
) -> sqlx::Result<Vec<(i64, Due)>> {
    let rows = sqlx::query!(
        r#"WITH due AS (
               SELECT b.id,
                      CASE WHEN b.status IN ('scheduled', 'provisioning') THEN 'provision'
                           WHEN b.status = 'releasing' THEN 'teardown'
                           WHEN upper(b.during) <= now() THEN 'expire'
                           ELSE 'warn' END AS step
               FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
               WHERE n.name = $1
                 AND (b.lease_until IS NULL OR b.lease_until < now())
                 AND b.next_attempt_at <= now()
                 AND ((b.status = 'scheduled' AND lower(b.during) <= now())
                      OR b.status IN ('provisioning', 'releasing')
                      OR (b.status = 'active' AND upper(b.during) <= now())
                      OR (b.status = 'active' AND b.warned_at IS NULL
                          AND upper(b.during) <= now() + make_interval(secs => $4)))
               ORDER BY b.next_attempt_at, b.id
               LIMIT $5
               FOR UPDATE OF b SKIP LOCKED
           )
           UPDATE bookings b SET lease_owner = $2, lease_until = now() + make_interval(secs => $3)
           FROM due WHERE b.id = due.id
           RETURNING b.id, due.step AS "step!""#,
        node,
        owner,
        lease_secs,
        warn_secs,
        limit
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let step = match r.step.as_str() {
                "provision" => Due::Provision,
                "teardown" => Due::Teardown,
                "expire" => Due::Expire,
                _ => Due::Warn,
            };
            (r.id, step)
        })
        .collect())
}

/// Gives up a lease after a failed step: retried after an exponential
/// backoff (2, 4, 8 ... up to 60 seconds). Returns the attempts so far.
pub async fn retry_later(db: impl PgExecutor<'_>, id: i64, reason: &str) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        "UPDATE bookings SET lease_owner = NULL, lease_until = NULL, attempts = attempts + 1,
                             next_attempt_at = now() + make_interval(secs => LEAST(60, 2 ^ (attempts + 1))),
                             reason = $2
         WHERE id = $1 RETURNING attempts",
        id,
        reason
    )
    .fetch_one(db)
    .await
}

/// Drops the leases a node's previous worker process held (it is gone: one
/// worker runs a node, guarded by an advisory lock).
pub async fn clear_node_leases(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<u64> {
    let r = sqlx::query!(
        "UPDATE bookings b SET lease_owner = NULL, lease_until = NULL
         FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE g.id = b.gpu_id AND n.name = $1 AND b.lease_owner IS NOT NULL",
        node
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}

/// Marks a booking provisioned: its device uuid, `active`.
pub async fn activate(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    device_uuid: &str,
    actor: &str,
    reason: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE bookings SET status = 'active', device_uuid = $2, reason = NULL, updated_at = now(),
                             lease_owner = NULL, lease_until = NULL, attempts = 0
         WHERE id = $1 AND status = 'provisioning'",
        id,
        device_uuid
    )
    .execute(&mut **tx)
    .await?;
    if r.rows_affected() == 1 {
        event(&mut **tx, id, actor, Some("provisioning"), "active", reason).await?;
    }
    Ok(r.rows_affected() == 1)
}

/// Records a new device uuid of an active booking (instance recreated).
pub async fn set_device(db: impl PgExecutor<'_>, id: i64, device_uuid: &str) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET device_uuid = $2, updated_at = now() WHERE id = $1",
        id,
        device_uuid
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Ends a torn-down booking as its `ending_as`.
pub async fn finish_release(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    actor: &str,
) -> sqlx::Result<bool> {
    let to = sqlx::query_scalar!(
        r#"UPDATE bookings SET status = COALESCE(ending_as, 'released'), updated_at = now(),
                               lease_owner = NULL, lease_until = NULL
           WHERE id = $1 AND status = 'releasing' RETURNING status"#,
        id
    )
    .fetch_optional(&mut **tx)
    .await?;
    match to {
        Some(to) => {
            event(&mut **tx, id, actor, Some("releasing"), &to, "torn down").await?;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// Notes that the end-of-booking warning went out.
pub async fn mark_warned(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    actor: &str,
    reason: &str,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET warned_at = now(), lease_owner = NULL, lease_until = NULL WHERE id = $1",
        id
    )
    .execute(&mut **tx)
    .await?;
    event(&mut **tx, id, actor, Some("active"), "active", reason).await
}

/// Live MIG bookings on a node's GPUs that should have (or are getting) an
/// instance: (booking id, GPU uuid, profile, slice start, status).
pub async fn node_mig_holders(
    db: impl PgExecutor<'_>,
    node: &str,
) -> sqlx::Result<Vec<(i64, String, String, i32, String)>> {
    let rows = sqlx::query!(
        r#"SELECT b.id, g.uuid, b.profile AS "profile!", lower(b.slices) AS "start!", b.status
           FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
           WHERE n.name = $1 AND b.kind = 'mig'
             AND (b.status IN ('provisioning', 'active', 'releasing')
                  OR (b.status = 'scheduled' AND lower(b.during) <= now()))"#,
        node
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.id, r.uuid, r.profile, r.start, r.status))
        .collect())
}

/// Takes a transaction-level advisory lock named `key` (released at commit).
pub async fn advisory_xact_lock(db: impl PgExecutor<'_>, key: &str) -> sqlx::Result<()> {
    sqlx::query!("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", key)
        .execute(db)
        .await?;
    Ok(())
}

/// Changes when capacity may have freed: the newest event that ended a
/// booking, and the number of bookable GPUs.
pub async fn capacity_fingerprint(db: impl PgExecutor<'_>) -> sqlx::Result<(i64, i64)> {
    let r = sqlx::query!(
        r#"SELECT COALESCE((SELECT max(id) FROM booking_events
                            WHERE to_status IN ('released', 'expired', 'cancelled', 'failed')), 0) AS "ended!",
                  (SELECT count(*) FROM gpus WHERE healthy AND mode <> 'drained') AS "gpus!""#
    )
    .fetch_one(db)
    .await?;
    Ok((r.ended, r.gpus))
}

// ---- Time-sliced shares ------------------------------------------------

/// What `gpuslice exec` needs to know about a booking.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    pub id: i64,
    pub status: String,
    pub kind: String,
    pub device_uuid: Option<String>,
    pub node: Option<String>,
    pub owner_email: String,
    pub owner_unix_user: Option<String>,
}

pub async fn exec_target(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<ExecTarget>> {
    sqlx::query_as!(
        ExecTarget,
        r#"SELECT b.id, b.status, b.kind, b.device_uuid, n.name AS "node?",
                  u.email AS owner_email, u.unix_user AS owner_unix_user
           FROM bookings b JOIN users u ON u.id = b.user_id
           LEFT JOIN gpus g ON g.id = b.gpu_id LEFT JOIN nodes n ON n.id = g.node_id
           WHERE b.id = $1"#,
        id
    )
    .fetch_optional(db)
    .await
}

/// An active time-sliced share on a node, for its GPU's scheduler.
#[derive(Debug, Clone)]
pub struct ActiveShare {
    pub id: i64,
    pub tenant_id: i64,
    pub gpu_uuid: String,
    pub priority: String,
    pub guaranteed_share_pct: i32,
    pub memory_gib: i32,
}

pub async fn active_shares(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<ActiveShare>> {
    sqlx::query_as!(
        ActiveShare,
        "SELECT b.id, b.tenant_id, g.uuid AS gpu_uuid, b.priority, t.guaranteed_share_pct, b.memory_gib
         FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
         JOIN tenants t ON t.id = b.tenant_id
         WHERE n.name = $1 AND b.kind = 'timeslice' AND b.status = 'active'
         ORDER BY b.id",
        node
    )
    .fetch_all(db)
    .await
}

/// Bookings of a node that hold (or are getting) a device.
pub async fn live_on_node(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        "SELECT b.id FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
         WHERE n.name = $1 AND b.status IN ('provisioning', 'active', 'releasing')",
        node
    )
    .fetch_all(db)
    .await
}

/// Stores the scheduler's latest view of a share.
pub async fn set_scheduler(
    db: impl PgExecutor<'_>,
    id: i64,
    state: &serde_json::Value,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET scheduler = $2 WHERE id = $1",
        id,
        state
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Records a QoS violation, boost or recovery in the tenant's ledger.
pub async fn qos_event(
    db: impl PgExecutor<'_>,
    booking_id: i64,
    tenant_id: i64,
    kind: &str,
    achieved: f64,
    guaranteed: f64,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO qos_events (booking_id, tenant_id, kind, achieved_share_pct, guaranteed_share_pct)
         VALUES ($1, $2, $3, $4, $5)",
        booking_id,
        tenant_id,
        kind,
        achieved,
        guaranteed
    )
    .execute(db)
    .await?;
    Ok(())
}

/// One entry of a tenant's QoS ledger.
#[derive(Debug, Clone)]
pub struct QosEvent {
    pub at: OffsetDateTime,
    pub booking_id: i64,
    pub kind: String,
    pub achieved_share_pct: f64,
    pub guaranteed_share_pct: f64,
}

pub async fn qos_ledger(
    db: impl PgExecutor<'_>,
    tenant_id: i64,
    limit: i64,
) -> sqlx::Result<Vec<QosEvent>> {
    sqlx::query_as!(
        QosEvent,
        "SELECT at, booking_id, kind, achieved_share_pct, guaranteed_share_pct FROM qos_events
         WHERE tenant_id = $1 ORDER BY at DESC, id DESC LIMIT $2",
        tenant_id,
        limit
    )
    .fetch_all(db)
    .await
}
