//! The placement index: the fleet's bookable GPUs and placed live
//! bookings of each kind, kept in this process's memory, so that a
//! decision under the placement lock reads only what changed since the
//! last one instead of the whole fleet (issue 18).
//!
//! Exactness comes from the database, not from this process's own
//! writes: triggers log every change that matters to placement (a booking
//! placed, moved, ended; a foreign instance; a GPU's mode, health or
//! size) in the changing transaction, tagged with its transaction id. A
//! reader remembers what its last snapshot could not see (transactions
//! from its xmax on, and those then running, its own included) and next
//! time reads exactly the changes of those transactions, so a change that
//! commits after a later one is never skipped and a long transaction
//! elsewhere costs nothing; it reads those bookings as they are now in the
//! same statement (reading one twice is harmless). Changes of the reader's own,
//! uncommitted transaction are used for its decision but not kept: the
//! booking is re-read at the next synchronisation, after it committed or
//! rolled back. Nothing is changed in memory until every read of a
//! synchronisation has answered, so a cancelled request leaves the index
//! as it was. The log keeps an hour: an index whose last look is older
//! than what was trimmed (the database says so) or older than half an
//! hour by this process's clock reloads in full. The advisory placement lock
//! and the exclusion constraint stay the guards.
//!
//! One index per database (keyed by the pool's connection target), shared
//! by everything in the process that decides placement.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock, Mutex as StdMutex};
use std::time::{Duration, Instant};

use sqlx::{PgConnection, PgPool};
use tokio::sync::Mutex;

use super::plan::Asked;
use crate::db::{
    self,
    bookings::{Placed, Unseen},
    fleet::Bookable,
};
use crate::domain::booking::Kind;

/// An index older than this reloads in full (the change log keeps an hour).
const FULL_RELOAD_AFTER: Duration = Duration::from_secs(30 * 60);

/// The profile-mix statistic (what was asked for over 30 days) is read
/// again after this long: a minute changes it by next to nothing.
const ASKED_FOR: Duration = Duration::from_secs(60);

/// The placement index of one database.
#[derive(Default)]
pub struct PlacementIndex {
    mig: Mutex<Option<KindIndex>>,
    timeslice: Mutex<Option<KindIndex>>,
    /// The profile-mix statistic per kind, with when it was read.
    asked: StdMutex<HashMap<&'static str, (Instant, Asked)>>,
}

/// One kind's part of the index.
#[derive(Debug, Clone)]
struct KindIndex {
    /// What the last look could not see.
    unseen: Unseen,
    synced: Instant,
    gpus: Vec<Bookable>,
    placed: HashMap<i64, Placed>,
    /// Foreign MIG instances (MIG only).
    foreign: Vec<Placed>,
    /// Read in a transaction that had changed them itself: read again.
    dirty: HashSet<i64>,
    dirty_gpus: bool,
    dirty_foreign: bool,
}

/// What the index tells a decision: the bookable GPUs and the placed live
/// bookings of the kind (with foreign instances for MIG), by id.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub gpus: Vec<Bookable>,
    pub placed: Vec<Placed>,
}

/// How a synchronisation went (for the tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub full_reload: bool,
    /// Bookings read again.
    pub reread: usize,
}

static INDEXES: LazyLock<StdMutex<HashMap<String, Arc<PlacementIndex>>>> =
    LazyLock::new(Default::default);

/// The index of the database `pool` connects to.
pub fn for_pool(pool: &PgPool) -> Arc<PlacementIndex> {
    let o = pool.connect_options();
    let key = format!(
        "{}|{}|{:?}|{}|{}",
        o.get_host(),
        o.get_port(),
        o.get_socket(),
        o.get_database().unwrap_or_default(),
        o.get_username()
    );
    let mut all = INDEXES.lock().unwrap_or_else(|e| e.into_inner());
    all.entry(key).or_default().clone()
}

fn sorted(mut placed: Vec<Placed>) -> Vec<Placed> {
    placed.sort_by_key(|p| (p.gpu_id, p.id));
    placed
}

impl PlacementIndex {
    /// What tenants asked for lately (profiles for MIG, share sizes for
    /// shares), read at most once a minute.
    pub async fn asked(&self, conn: &mut PgConnection, kind: Kind) -> sqlx::Result<Asked> {
        let fresh = self
            .asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(kind.as_str())
            .filter(|a| a.0.elapsed() < ASKED_FOR)
            .map(|a| a.1.clone());
        if let Some(a) = fresh {
            return Ok(a);
        }
        let asked = match kind {
            Kind::Mig => Asked {
                profiles: db::bookings::recent_profile_counts(&mut *conn).await?,
                shares: Vec::new(),
            },
            Kind::Timeslice => Asked {
                profiles: Vec::new(),
                shares: db::bookings::recent_share_counts(&mut *conn).await?,
            },
        };
        self.asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind.as_str(), (Instant::now(), asked.clone()));
        Ok(asked)
    }

    fn slot(&self, kind: Kind) -> &Mutex<Option<KindIndex>> {
        match kind {
            Kind::Mig => &self.mig,
            Kind::Timeslice => &self.timeslice,
        }
    }

    /// The fleet of `kind` as the caller's transaction sees it, from
    /// memory plus what changed. Call it under the placement lock of
    /// `kind` for a decision (it is exact without the lock too).
    pub async fn snapshot(&self, conn: &mut PgConnection, kind: Kind) -> sqlx::Result<Snapshot> {
        self.snapshot_with_stats(conn, kind).await.map(|s| s.0)
    }

    pub async fn snapshot_with_stats(
        &self,
        conn: &mut PgConnection,
        kind: Kind,
    ) -> sqlx::Result<(Snapshot, SyncStats)> {
        let mut guard = self.slot(kind).lock().await;
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let current = guard
            .as_ref()
            .filter(|k| k.synced.elapsed() < FULL_RELOAD_AFTER);
        let Some(old) = current else {
            return reload(&mut guard, conn, kind, now).await;
        };
        let also: Vec<i64> = old.dirty.iter().copied().collect();
        let found = db::bookings::changes_since(&mut *conn, kind, &old.unseen, &also).await?;
        if found.trimmed_below > old.unseen.xmin {
            // Changes this index has not read may have been trimmed (it
            // was away over an hour, whatever this process's clock says).
            return reload(&mut guard, conn, kind, now).await;
        }
        let mut next = old.clone();
        next.unseen = found.unseen;
        next.synced = Instant::now();
        next.dirty.clear();
        let mut own_ids = HashSet::new();
        let (mut reload_gpus, mut own_gpus) = (std::mem::take(&mut next.dirty_gpus), false);
        let (mut reload_foreign, mut own_foreign) =
            (std::mem::take(&mut next.dirty_foreign), false);
        let mut reread: Vec<(i64, Option<Placed>)> = Vec::new();
        for c in found.changes {
            match (c.kind.as_str(), c.booking_id) {
                ("fleet", _) => {
                    reload_gpus = true;
                    own_gpus |= c.own;
                }
                (_, None) => {
                    reload_foreign = true;
                    own_foreign |= c.own;
                }
                (_, Some(id)) => {
                    if c.own {
                        own_ids.insert(id);
                    }
                    reread.push((id, c.placed));
                }
            }
        }
        // The rest of the reads first; memory changes only after the last.
        let gpus = if reload_gpus {
            Some(db::fleet::bookable(&mut *conn).await?)
        } else {
            None
        };
        let foreign = if reload_foreign && kind == Kind::Mig {
            Some(db::bookings::foreign_placed(&mut *conn).await?)
        } else {
            None
        };
        let stats = SyncStats {
            full_reload: false,
            reread: reread.len(),
        };
        // What this decision sees: everything read, own changes included
        // (apart from what is kept only when there are some).
        let any_own = !own_ids.is_empty() || own_gpus || own_foreign;
        let seen = any_own.then(|| {
            let mut seen = next.clone();
            apply(&mut seen, &reread, gpus.clone(), foreign.clone(), kind);
            seen.snapshot(now)
        });
        // What is kept: nothing read of this transaction's own changes.
        let kept: Vec<(i64, Option<Placed>)> = reread
            .into_iter()
            .filter(|(id, _)| !own_ids.contains(id))
            .collect();
        apply(
            &mut next,
            &kept,
            gpus.filter(|_| !own_gpus),
            foreign.filter(|_| !own_foreign),
            kind,
        );
        next.dirty.extend(own_ids);
        next.dirty_gpus = own_gpus;
        next.dirty_foreign = own_foreign;
        // Bookings that have ended hold nothing any more.
        next.placed.retain(|_, p| p.end > now);
        let snap = seen.unwrap_or_else(|| next.snapshot(now));
        *guard = Some(next);
        Ok((snap, stats))
    }
}

/// Loads a kind's part in full into `slot`; a transaction that changed
/// placement itself sees its own uncommitted changes: used, none kept.
async fn reload(
    slot: &mut Option<KindIndex>,
    conn: &mut PgConnection,
    kind: Kind,
    now: i64,
) -> sqlx::Result<(Snapshot, SyncStats)> {
    let (index, own) = full_load(conn, kind).await?;
    let snap = index.snapshot(now);
    *slot = if own { None } else { Some(index) };
    let stats = SyncStats {
        full_reload: true,
        ..Default::default()
    };
    Ok((snap, stats))
}

fn apply(
    index: &mut KindIndex,
    reread: &[(i64, Option<Placed>)],
    gpus: Option<Vec<Bookable>>,
    foreign: Option<Vec<Placed>>,
    kind: Kind,
) {
    for (id, p) in reread {
        match p {
            Some(p) if p.kind == kind => {
                index.placed.insert(*id, p.clone());
            }
            _ => {
                index.placed.remove(id);
            }
        }
    }
    if let Some(g) = gpus {
        index.gpus = g;
    }
    if let Some(f) = foreign {
        index.foreign = f;
    }
}

impl KindIndex {
    fn snapshot(&self, now: i64) -> Snapshot {
        let placed = self
            .placed
            .values()
            .filter(|p| p.end > now)
            .chain(self.foreign.iter())
            .cloned()
            .collect();
        Snapshot {
            gpus: self.gpus.clone(),
            placed: sorted(placed),
        }
    }
}

/// Reads a kind's part in full; also says whether the transaction has
/// placement changes of its own (then the result is not kept).
async fn full_load(conn: &mut PgConnection, kind: Kind) -> sqlx::Result<(KindIndex, bool)> {
    let h = db::bookings::horizon(&mut *conn).await?;
    let gpus = db::fleet::bookable(&mut *conn).await?;
    let placed = db::bookings::placed_bookings(&mut *conn, Some(kind)).await?;
    let foreign = match kind {
        Kind::Mig => db::bookings::foreign_placed(&mut *conn).await?,
        Kind::Timeslice => Vec::new(),
    };
    Ok((
        KindIndex {
            unseen: h.unseen,
            synced: Instant::now(),
            gpus,
            placed: placed.into_iter().map(|p| (p.id, p)).collect(),
            foreign,
            dirty: HashSet::new(),
            dirty_gpus: false,
            dirty_foreign: false,
        },
        h.own_changes,
    ))
}

/// The same fleet read straight from the database (what the index must
/// always equal; the tests compare them).
pub async fn read_direct(conn: &mut PgConnection, kind: Kind) -> sqlx::Result<Snapshot> {
    let gpus = db::fleet::bookable(&mut *conn).await?;
    let placed = db::bookings::placed_live(&mut *conn, Some(kind)).await?;
    Ok(Snapshot {
        gpus,
        placed: sorted(placed),
    })
}
