//! What the placement index reads: the change log its triggers write
//! (migration `placement_index`) with the bookings they name, the placed
//! bookings of a kind, the foreign MIG instances, and the log's trimming.

use sqlx::{PgConnection, PgExecutor};

use super::rules::{placed, Placed};
use crate::domain::booking::Kind;

/// What a reader's snapshot could not see: transactions from `xmax` on,
/// and those in `running` (its own included, until it commits). Its
/// `xmin` bounds them all from below (for the trimming check). Ids are
/// `xid8` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unseen {
    pub xmin: u64,
    pub xmax: u64,
    pub running: Vec<u64>,
}

impl Unseen {
    fn from_text(xmin: &str, xmax: &str, running: &[String]) -> Unseen {
        let n = |s: &str| s.parse::<u64>().unwrap_or(0);
        Unseen {
            xmin: n(xmin),
            xmax: n(xmax),
            running: running.iter().map(|r| n(r)).collect(),
        }
    }
}

/// Where a reader stands now, and whether its own transaction has logged
/// changes (which are not committed yet).
#[derive(Debug, Clone)]
pub struct Horizon {
    pub unseen: Unseen,
    pub own_changes: bool,
}

pub async fn horizon(db: impl PgExecutor<'_>) -> sqlx::Result<Horizon> {
    let r = sqlx::query!(
        r#"WITH s AS (SELECT pg_current_snapshot() AS snap)
           SELECT pg_snapshot_xmin(snap)::text AS "xmin!", pg_snapshot_xmax(snap)::text AS "xmax!",
                  ARRAY(SELECT x::text FROM pg_snapshot_xip(snap) x
                        UNION SELECT pg_current_xact_id_if_assigned()::text
                              WHERE pg_current_xact_id_if_assigned() IS NOT NULL) AS "running!",
                  EXISTS (SELECT 1 FROM placement_changes
                          WHERE xid = pg_current_xact_id_if_assigned()) AS "own_changes!"
           FROM s"#
    )
    .fetch_one(db)
    .await?;
    Ok(Horizon {
        unseen: Unseen::from_text(&r.xmin, &r.xmax, &r.running),
        own_changes: r.own_changes,
    })
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

/// What [`changes_since`] found.
#[derive(Debug, Clone)]
pub struct Changes {
    /// What this read could not see (for the next one).
    pub unseen: Unseen,
    /// Changes below this id may have been trimmed from the log.
    pub trimmed_below: u64,
    pub changes: Vec<Change>,
}

/// In one statement (one snapshot, one round trip): the changes of `kind`
/// and of the fleet that the previous read could not see (`since`), plus
/// the bookings `also` (to read again), each booking as it is now; and
/// what this read cannot see.
pub async fn changes_since(
    db: impl PgExecutor<'_>,
    kind: Kind,
    since: &Unseen,
    also: &[i64],
) -> sqlx::Result<Changes> {
    let running: Vec<String> = since.running.iter().map(u64::to_string).collect();
    let rows = sqlx::query!(
        r#"WITH s AS (SELECT pg_current_snapshot() AS snap),
           c AS (
               SELECT kind, booking_id,
                      bool_or(COALESCE(xid = pg_current_xact_id_if_assigned(), FALSE)) AS own
               FROM placement_changes
               WHERE (xid >= $2::text::xid8 OR xid = ANY($3::text[]::xid8[])) AND kind IN ($1, 'fleet')
               GROUP BY kind, booking_id
               UNION ALL
               SELECT $1, id, FALSE FROM unnest($4::bigint[]) id
           )
           SELECT pg_snapshot_xmin(s.snap)::text AS "xmin!", pg_snapshot_xmax(s.snap)::text AS "xmax!",
                  ARRAY(SELECT x::text FROM pg_snapshot_xip(s.snap) x
                        UNION SELECT pg_current_xact_id_if_assigned()::text
                              WHERE pg_current_xact_id_if_assigned() IS NOT NULL) AS "running!",
                  COALESCE((SELECT below::text FROM placement_change_trimmed), '0') AS "trimmed_below!",
                  c.kind AS "kind?", c.booking_id, c.own AS "own?",
                  COALESCE(b.status = ANY($5) AND b.gpu_id IS NOT NULL, FALSE) AS "live!",
                  b.gpu_id AS "gpu_id?", b.kind AS "booking_kind?: Kind", b.profile AS "profile?",
                  lower(b.slices) AS slice_start, b.memory_gib AS "memory_gib?",
                  floor(extract(epoch FROM lower(b.during)))::bigint AS "start?",
                  ceil(extract(epoch FROM upper(b.during)))::bigint AS "end?"
           FROM s
           LEFT JOIN c ON TRUE
           LEFT JOIN bookings b ON b.id = c.booking_id"#,
        kind.as_str(),
        since.xmax.to_string(),
        &running,
        also,
        &placed()[..]
    )
    .fetch_all(db)
    .await?;
    let (unseen, trimmed_below) = rows
        .first()
        .map(|r| {
            (
                Unseen::from_text(&r.xmin, &r.xmax, &r.running),
                r.trimmed_below.parse().unwrap_or(0),
            )
        })
        .unwrap_or((since.clone(), 0));
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
    Ok(Changes {
        unseen,
        trimmed_below,
        changes,
    })
}

/// Every placed live booking (of `kind`, when given) that has not ended,
/// with the foreign MIG instances unless only shares are asked for: what
/// placement works with (the placement index keeps the same in memory).
pub async fn placed_live(conn: &mut PgConnection, kind: Option<Kind>) -> sqlx::Result<Vec<Placed>> {
    let mut placed = placed_bookings(&mut *conn, kind).await?;
    if kind != Some(Kind::Timeslice) {
        placed.extend(foreign_placed(&mut *conn).await?);
    }
    Ok(placed)
}

/// The placed live bookings (of `kind`, when given) that have not ended
/// (no foreign instances).
pub async fn placed_bookings(
    db: impl PgExecutor<'_>,
    kind: Option<Kind>,
) -> sqlx::Result<Vec<Placed>> {
    sqlx::query_as!(
        Placed,
        r#"SELECT id, gpu_id AS "gpu_id!", kind AS "kind: Kind", profile, lower(slices) AS slice_start,
                  memory_gib, floor(extract(epoch FROM lower(during)))::bigint AS "start!",
                  ceil(extract(epoch FROM upper(during)))::bigint AS "end!"
           FROM bookings
           WHERE status = ANY($2) AND gpu_id IS NOT NULL AND upper(during) > now()
             AND ($1::text IS NULL OR kind = $1)"#,
        kind.map(Kind::as_str),
        &placed()[..]
    )
    .fetch_all(db)
    .await
}

/// The MIG instances made behind gpuslice's back: they hold their slots
/// for good (negative ids).
pub async fn foreign_placed(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Placed>> {
    sqlx::query_as!(
        Placed,
        r#"SELECT -f.gi_id::bigint AS "id!", f.gpu_id, 'mig' AS "kind!: Kind", f.profile AS "profile?",
                  f.slice_start AS "slice_start?", 0 AS "memory_gib!",
                  floor(extract(epoch FROM f.seen_at))::bigint AS "start!", 253402300799::bigint AS "end!"
           FROM foreign_instances f"#
    )
    .fetch_all(db)
    .await
}

/// Trims the change log: changes below the horizon marked at least an
/// hour ago go (an index that looked after that mark has read them; one
/// that did not sees `trimmed_below` past its own horizon and loads in
/// full), and this round's horizon is marked. Returns the changes removed.
pub async fn trim_changes(db: &sqlx::PgPool) -> sqlx::Result<u64> {
    let mut tx = db.begin().await?;
    // Readers that last looked before this horizon load in full.
    sqlx::query!(
        "UPDATE placement_change_trimmed SET below = GREATEST(below, (
             SELECT horizon FROM placement_change_marks
             WHERE at <= now() - interval '1 hour' ORDER BY at DESC LIMIT 1))
         WHERE EXISTS (SELECT 1 FROM placement_change_marks WHERE at <= now() - interval '1 hour')"
    )
    .execute(&mut *tx)
    .await?;
    let removed = sqlx::query!(
        "DELETE FROM placement_changes WHERE xid < (SELECT below FROM placement_change_trimmed)"
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
