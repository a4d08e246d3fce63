//! What the booking rules read and write: a tenant's held bookings and
//! slice-hours, the placed bookings of the fleet, what tenants asked for
//! lately, and the queue.

use sqlx::{PgExecutor, Postgres, Transaction};
use time::OffsetDateTime;

use super::{event, status_names};
use crate::domain::booking::{Held, Kind, Status, Step, Transition};
use crate::domain::{GpuMode, Priority};
use crate::placement::ASKED_WINDOW_DAYS;

/// The live statuses that hold a slot on a GPU, as the schema stores them.
pub(super) fn placed() -> Vec<String> {
    status_names(Status::LIVE.into_iter().filter(|s| s.is_placed()))
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
        r#"SELECT floor(extract(epoch FROM lower(during)))::bigint AS "start!",
                  ceil(extract(epoch FROM upper(during)))::bigint AS "end!", memory_gib, compute_slices
           FROM bookings
           WHERE tenant_id = $1 AND status = ANY($4) AND during && tstzrange($2, $3)
             AND id IS DISTINCT FROM $5"#,
        tenant_id,
        from,
        to,
        &status_names(Status::LIVE)[..],
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    pub id: i64,
    pub gpu_id: i64,
    pub kind: Kind,
    pub profile: Option<String>,
    pub slice_start: Option<i32>,
    pub memory_gib: i32,
    /// Unix seconds, rounded outwards (the start down, the end up): a
    /// release ends a booking within a second, and placement in whole
    /// seconds must still see it wherever the database's constraint does.
    pub start: i64,
    pub end: i64,
}

/// The placed live bookings of one GPU that have not ended.
pub async fn placed_live_on(db: impl PgExecutor<'_>, gpu_id: i64) -> sqlx::Result<Vec<Placed>> {
    sqlx::query_as!(
        Placed,
        r#"SELECT id AS "id!", gpu_id AS "gpu_id!", kind AS "kind!: Kind", profile, lower(slices) AS slice_start,
                  memory_gib AS "memory_gib!", floor(extract(epoch FROM lower(during)))::bigint AS "start!",
                  ceil(extract(epoch FROM upper(during)))::bigint AS "end!"
           FROM bookings
           WHERE status = ANY($2) AND gpu_id = $1 AND upper(during) > now()
           UNION ALL
           SELECT -f.gi_id::bigint, f.gpu_id, 'mig', f.profile, f.slice_start, 0,
                  floor(extract(epoch FROM f.seen_at))::bigint, 253402300799
           FROM foreign_instances f WHERE f.gpu_id = $1"#,
        gpu_id,
        &placed()[..]
    )
    .fetch_all(db)
    .await
}

/// Profiles asked for in the last [`ASKED_WINDOW_DAYS`], by model (queued
/// requests too): the mix placement keeps room for.
pub async fn recent_profile_counts(
    db: impl PgExecutor<'_>,
) -> sqlx::Result<Vec<(String, String, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT model AS "model!", profile AS "profile!", count(*) AS "n!"
           FROM bookings
           WHERE kind = 'mig' AND model IS NOT NULL
             AND created_at > now() - make_interval(days => $1)
           GROUP BY model, profile"#,
        ASKED_WINDOW_DAYS
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.model, r.profile, r.n))
        .collect())
}

/// Share sizes (GiB) asked for in the last [`ASKED_WINDOW_DAYS`]: the
/// shapes share placement keeps room for.
pub async fn recent_share_counts(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<(i32, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT memory_gib, count(*) AS "n!"
           FROM bookings
           WHERE kind = 'timeslice' AND created_at > now() - make_interval(days => $1)
           GROUP BY memory_gib"#,
        ASKED_WINDOW_DAYS
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
        let t = Transition::of(Status::Queued, Step::Place, None)
            .expect("the queue planner places queued bookings");
        event(
            &mut **tx,
            id,
            "planner",
            Some(t.from()),
            t.to(),
            "capacity freed",
        )
        .await?;
        crate::db::notify::booking_moved(tx, id, t.to(), t.from(), None).await?;
    }
    Ok(r.rows_affected() == 1)
}

/// A booking waiting in the queue.
#[derive(Debug, Clone)]
pub struct Queued {
    pub id: i64,
    pub tenant_id: i64,
    pub priority: Priority,
    /// When the tenant last had a booking placed, if ever.
    pub last_placed: Option<OffsetDateTime>,
}

/// Queued bookings, oldest first.
pub async fn queued(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Queued>> {
    sqlx::query_as!(
        Queued,
        r#"SELECT b.id, b.tenant_id, b.priority AS "priority: Priority",
                  (SELECT max(e.at) FROM booking_events e JOIN bookings x ON x.id = e.booking_id
                   WHERE x.tenant_id = b.tenant_id AND e.to_status = 'scheduled'
                     AND e.from_status IS DISTINCT FROM 'scheduled') AS last_placed
           FROM bookings b WHERE b.status = 'queued'
           ORDER BY b.created_at, b.id"#
    )
    .fetch_all(db)
    .await
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

/// Bookings ahead that may move to make room: MIG, scheduled, not claimed
/// by a worker, starting more than `notice_s` seconds from now (the
/// database's clock at the statement, not the transaction's start) and
/// overlapping `[start, end)`. Read without locking: the caller plans with
/// them and locks only those it moves ([`lock_movable`]).
pub async fn movable_mig(
    tx: &mut Transaction<'_, Postgres>,
    start: OffsetDateTime,
    end: OffsetDateTime,
    notice_s: i64,
) -> sqlx::Result<std::collections::HashSet<i64>> {
    let ids = sqlx::query_scalar!(
        "SELECT id FROM bookings
         WHERE kind = 'mig' AND status = 'scheduled' AND lease_owner IS NULL
           AND lower(during) > clock_timestamp() + make_interval(secs => $3)
           AND during && tstzrange($1, $2)",
        start,
        end,
        notice_s as f64
    )
    .fetch_all(&mut **tx)
    .await?;
    Ok(ids.into_iter().collect())
}

/// Locks the bookings `ids` for the rest of the transaction where they may
/// still move (as [`movable_mig`]); returns those it locked. Rows another
/// transaction holds are skipped rather than waited for: the caller holds
/// the placement lock, which a transition holding a booking row may be
/// waiting for.
pub async fn lock_movable(
    tx: &mut Transaction<'_, Postgres>,
    ids: &[i64],
    notice_s: i64,
) -> sqlx::Result<Vec<i64>> {
    sqlx::query_scalar!(
        "SELECT id FROM bookings
         WHERE id = ANY($1) AND kind = 'mig' AND status = 'scheduled' AND lease_owner IS NULL
           AND lower(during) > clock_timestamp() + make_interval(secs => $2)
         FOR UPDATE SKIP LOCKED",
        ids,
        notice_s as f64
    )
    .fetch_all(&mut **tx)
    .await
}

/// Moves a booking ahead (locked by [`lock_movable`]) to `gpu_id`, memory
/// slices `[from, to)`, and writes it on its timeline; false (nothing
/// changed) when it no longer may move. The overlap constraint is checked
/// at commit (several bookings may trade places).
pub async fn move_scheduled(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    gpu_id: i64,
    slices: (i32, i32),
    notice_s: i64,
    reason: &str,
) -> sqlx::Result<bool> {
    sqlx::query!("SET CONSTRAINTS bookings_no_overlap DEFERRED")
        .execute(&mut **tx)
        .await?;
    let moved = sqlx::query!(
        "UPDATE bookings SET gpu_id = $2, slices = int4range($3, $4), updated_at = now()
         WHERE id = $1 AND kind = 'mig' AND status = 'scheduled' AND lease_owner IS NULL
           AND lower(during) > clock_timestamp() + make_interval(secs => $5)",
        id,
        gpu_id,
        slices.0,
        slices.1,
        notice_s as f64
    )
    .execute(&mut **tx)
    .await?
    .rows_affected()
        == 1;
    if moved {
        event(
            &mut **tx,
            id,
            "planner",
            Some(Status::Scheduled),
            Status::Scheduled,
            reason,
        )
        .await?;
        // The owner hears of it with the move itself (outbox).
        crate::db::notify::booking_moved(
            tx,
            id,
            Status::Scheduled,
            Status::Scheduled,
            Some(reason),
        )
        .await?;
    }
    Ok(moved)
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
        r#"SELECT COALESCE((SELECT max(id) FROM booking_events WHERE to_status = ANY($1)), 0) AS "ended!",
                  (SELECT count(*) FROM gpus WHERE healthy AND mode <> $2) AS "gpus!""#,
        &status_names(Status::FINAL)[..],
        GpuMode::Drained.as_str()
    )
    .fetch_one(db)
    .await?;
    Ok((r.ended, r.gpus))
}
