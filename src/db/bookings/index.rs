//! What the placement index reads: the change log its triggers write
//! (migration `placement_index`), the placed bookings by id, the foreign
//! MIG instances, and the log's trimming.

use sqlx::PgExecutor;

use super::rules::{placed, Placed};
use crate::domain::booking::Kind;

/// Where a reader stands: the horizon of its snapshot (the oldest
/// transaction still running, as `xid8` text) and whether its own
/// transaction has logged changes (which are not committed yet).
#[derive(Debug, Clone)]
pub struct Horizon {
    pub horizon: String,
    pub own_changes: bool,
}

pub async fn horizon(db: impl PgExecutor<'_>) -> sqlx::Result<Horizon> {
    sqlx::query_as!(
        Horizon,
        r#"SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS "horizon!",
                  EXISTS (SELECT 1 FROM placement_changes
                          WHERE xid = pg_current_xact_id_if_assigned()) AS "own_changes!""#
    )
    .fetch_one(db)
    .await
}

/// One logged change: a booking of `kind` (or the kind's foreign
/// instances, without a booking), or the fleet (`kind` = `fleet`); for a
/// booking, how it is now (`placed`: `None` once it holds no slot or is
/// gone).
#[derive(Debug, Clone)]
pub struct Change {
    pub kind: String,
    pub booking_id: Option<i64>,
    /// Written by the reader's own (uncommitted) transaction.
    pub own: bool,
    pub placed: Option<Placed>,
}

/// In one statement (one snapshot, one round trip): the horizon of this
/// read, the changes of `kind` and of the fleet whose transactions had not
/// finished at `since` (a previous [`horizon`]) plus the bookings `also`
/// (to read again), each booking as it is now.
pub async fn changes_since(
    db: impl PgExecutor<'_>,
    kind: Kind,
    since: &str,
    also: &[i64],
) -> sqlx::Result<(String, Vec<Change>)> {
    let rows = sqlx::query!(
        r#"WITH c AS (
               SELECT kind, booking_id,
                      bool_or(COALESCE(xid = pg_current_xact_id_if_assigned(), FALSE)) AS own
               FROM placement_changes
               WHERE xid >= $2::text::xid8 AND kind IN ($1, 'fleet')
               GROUP BY kind, booking_id
               UNION ALL
               SELECT $1, id, FALSE FROM unnest($3::bigint[]) id
           )
           SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS "horizon!",
                  c.kind AS "kind?", c.booking_id, c.own AS "own?",
                  COALESCE(b.status = ANY($4) AND b.gpu_id IS NOT NULL, FALSE) AS "live!",
                  b.gpu_id AS "gpu_id?", b.kind AS "booking_kind?: Kind", b.profile AS "profile?",
                  lower(b.slices) AS slice_start, b.memory_gib AS "memory_gib?",
                  extract(epoch FROM lower(b.during))::bigint AS "start?",
                  extract(epoch FROM upper(b.during))::bigint AS "end?"
           FROM (SELECT 1) one
           LEFT JOIN c ON TRUE
           LEFT JOIN bookings b ON b.id = c.booking_id"#,
        kind.as_str(),
        since,
        also,
        &placed()[..]
    )
    .fetch_all(db)
    .await?;
    let horizon = rows.first().map(|r| r.horizon.clone()).unwrap_or_default();
    let changes = rows
        .into_iter()
        .filter_map(|r| {
            let placed = match (r.live, r.booking_id, r.gpu_id, r.booking_kind) {
                (true, Some(id), Some(gpu_id), Some(kind)) => Some(Placed {
                    id,
                    gpu_id,
                    kind,
                    profile: r.profile,
                    slice_start: r.slice_start,
                    memory_gib: r.memory_gib.unwrap_or(0),
                    start: r.start.unwrap_or(0),
                    end: r.end.unwrap_or(0),
                }),
                _ => None,
            };
            Some(Change {
                kind: r.kind?,
                booking_id: r.booking_id,
                own: r.own.unwrap_or(false),
                placed,
            })
        })
        .collect();
    Ok((horizon, changes))
}

/// The placed live bookings of `kind` that have not ended (no foreign
/// instances).
pub async fn placed_bookings(db: impl PgExecutor<'_>, kind: Kind) -> sqlx::Result<Vec<Placed>> {
    sqlx::query_as!(
        Placed,
        r#"SELECT id, gpu_id AS "gpu_id!", kind AS "kind: Kind", profile, lower(slices) AS slice_start,
                  memory_gib, extract(epoch FROM lower(during))::bigint AS "start!",
                  extract(epoch FROM upper(during))::bigint AS "end!"
           FROM bookings
           WHERE status = ANY($2) AND gpu_id IS NOT NULL AND upper(during) > now() AND kind = $1"#,
        kind.as_str(),
        &placed()[..]
    )
    .fetch_all(db)
    .await
}

/// The MIG instances made behind gpuslice's back: they hold their slots
/// for good (negative ids, as [`super::placed_live`] gives them).
pub async fn foreign_placed(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Placed>> {
    sqlx::query_as!(
        Placed,
        r#"SELECT -f.gi_id::bigint AS "id!", f.gpu_id, 'mig' AS "kind!: Kind", f.profile AS "profile?",
                  f.slice_start AS "slice_start?", 0 AS "memory_gib!",
                  extract(epoch FROM f.seen_at)::bigint AS "start!", 253402300799::bigint AS "end!"
           FROM foreign_instances f"#
    )
    .fetch_all(db)
    .await
}

/// Trims the change log: changes below the horizon marked at least an
/// hour ago go (every index still in use has read them: one that has not
/// synchronised for half an hour reloads in full), and this round's
/// horizon is marked. Returns the changes removed.
pub async fn trim_changes(db: &sqlx::PgPool) -> sqlx::Result<u64> {
    let mut tx = db.begin().await?;
    let removed = sqlx::query!(
        "DELETE FROM placement_changes WHERE xid < (
             SELECT horizon FROM placement_change_marks
             WHERE at <= now() - interval '1 hour' ORDER BY at DESC LIMIT 1)"
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    sqlx::query!(
        "DELETE FROM placement_change_marks WHERE at < (
             SELECT max(at) FROM placement_change_marks WHERE at <= now() - interval '1 hour')"
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO placement_change_marks (horizon) VALUES (pg_snapshot_xmin(pg_current_snapshot()))"
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(removed)
}
