//! The fleet optimizer's automatic action (on with
//! `GPUSLICE_OPTIMIZER_LOWER_IDLE_SHARES`): a time-sliced share whose
//! device was under 10 % busy over the last 30 minutes is lowered to `low`
//! priority, so that its turns go to busier shares; once it is busy again
//! (15 % over the last 10 minutes: a low share gets about a fifth of the
//! GPU against two normal ones, so the mark must be reachable from low)
//! its priority comes back. Both are in the
//! optimization history with the utilisation before and after, and an
//! admin can give the priority back by hand (`/admin/optimizer`), after
//! which the optimizer leaves that booking alone.

use sqlx::PgPool;

use crate::db;
use crate::domain::Priority;

/// The actor of automatic actions in the history.
pub const ACTOR: &str = "optimizer";
/// Under this mean utilisation (%) over [`QUIET_MINS`] a share is lowered.
pub const QUIET_PCT: f64 = 10.0;
pub const QUIET_MINS: i32 = 30;
/// At or over this mean utilisation (%) over [`BUSY_MINS`] it is restored.
pub const BUSY_PCT: f64 = 15.0;
pub const BUSY_MINS: i32 = 10;

/// What one round did: (lowered, restored).
pub async fn round(pool: &PgPool) -> anyhow::Result<(usize, usize)> {
    let (mut lowered, mut restored) = (0, 0);
    for s in db::optimizer::share_activity(pool, QUIET_MINS).await? {
        let Some(util) = s.mean_util else { continue };
        if s.lowered_from.is_none() && !s.pinned && s.priority != Priority::Low && util < QUIET_PCT
        {
            let mut tx = pool.begin().await?;
            if db::optimizer::lower(&mut tx, s.id, s.priority).await? {
                db::optimizer::record(
                    &mut tx,
                    "priority_lowered",
                    ACTOR,
                    s.id,
                    "utilization_pct",
                    Some(util),
                    None,
                    serde_json::json!({ "from": s.priority, "to": Priority::Low, "window_mins": QUIET_MINS }),
                )
                .await?;
                lowered += 1;
            }
            tx.commit().await?;
        }
    }
    for s in db::optimizer::share_activity(pool, BUSY_MINS).await? {
        let Some(util) = s.mean_util else { continue };
        if s.lowered_from.is_some() && util >= BUSY_PCT {
            restored += usize::from(restore(pool, s.id, ACTOR, Some(util)).await?);
        }
    }
    Ok((lowered, restored))
}

/// Gives a lowered share its priority back and records who did it; false
/// when it was not lowered (any more).
pub async fn restore(
    pool: &PgPool,
    id: i64,
    actor: &str,
    util: Option<f64>,
) -> anyhow::Result<bool> {
    let mut tx = pool.begin().await?;
    let Some(back) = db::optimizer::restore(&mut tx, id).await? else {
        return Ok(false);
    };
    db::optimizer::record(
        &mut tx,
        "priority_restored",
        actor,
        id,
        "utilization_pct",
        None,
        util,
        serde_json::json!({ "to": back }),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}
