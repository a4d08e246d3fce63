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
/// instances, without a booking), or the fleet (`kind` = `fleet`).
#[derive(Debug, Clone)]
pub struct Change {
    pub kind: String,
    pub booking_id: Option<i64>,
    /// Written by the reader's own (uncommitted) transaction.
    pub own: bool,
}

/// The changes of `kind` and of the fleet whose transactions had not
/// finished at `since` (a previous [`horizon`]), with the horizon of this
/// read, in one snapshot.
pub async fn changes_since(
    db: impl PgExecutor<'_>,
    kind: Kind,
    since: &str,
) -> sqlx::Result<(String, Vec<Change>)> {
    let rows = sqlx::query!(
        r#"WITH c AS (
               SELECT DISTINCT kind, booking_id,
                      COALESCE(xid = pg_current_xact_id_if_assigned(), FALSE) AS own
               FROM placement_changes
               WHERE xid >= $2::text::xid8 AND kind IN ($1, 'fleet')
           )
           SELECT pg_snapshot_xmin(pg_current_snapshot())::text AS "horizon!",
                  c.kind AS "kind?", c.booking_id, c.own AS "own?"
           FROM (SELECT 1) one LEFT JOIN c ON TRUE"#,
        kind.as_str(),
        since
    )
    .fetch_all(db)
    .await?;
    let horizon = rows.first().map(|r| r.horizon.clone()).unwrap_or_default();
    let changes = rows
        .into_iter()
        .filter_map(|r| {
            Some(Change {
                kind: r.kind?,
                booking_id: r.booking_id,
                own: r.own.unwrap_or(false),
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

/// Bookings `ids` as they are now: `Some` while placed and live, `None`
/// for those that no longer hold a slot (or are gone).
pub async fn placed_by_id(
    db: impl PgExecutor<'_>,
    ids: &[i64],
) -> sqlx::Result<Vec<(i64, Option<Placed>)>> {
    let rows = sqlx::query!(
        r#"SELECT id, gpu_id, kind AS "kind: Kind", profile, lower(slices) AS slice_start,
                  memory_gib, extract(epoch FROM lower(during))::bigint AS "start!",
                  extract(epoch FROM upper(during))::bigint AS "end!",
                  (status = ANY($2) AND gpu_id IS NOT NULL) AS "live!"
           FROM bookings WHERE id = ANY($1)"#,
        ids,
        &placed()[..]
    )
    .fetch_all(db)
    .await?;
    let mut out: Vec<(i64, Option<Placed>)> = rows
        .into_iter()
        .map(|r| {
            let p = match (r.live, r.gpu_id) {
                (true, Some(gpu_id)) => Some(Placed {
                    id: r.id,
                    gpu_id,
                    kind: r.kind,
                    profile: r.profile,
                    slice_start: r.slice_start,
                    memory_gib: r.memory_gib,
                    start: r.start,
                    end: r.end,
                }),
                _ => None,
            };
            (r.id, p)
        })
        .collect();
    // Deleted bookings: gone from the index too.
    for id in ids {
        if !out.iter().any(|o| o.0 == *id) {
            out.push((*id, None));
        }
    }
    Ok(out)
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
