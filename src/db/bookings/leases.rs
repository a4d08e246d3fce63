//! The node worker's side: claiming due work with leases, and the steps
//! that set up, warn about and tear down a booking's device.

use sqlx::{PgExecutor, Postgres, Transaction};

use super::{event, note};
use crate::domain::booking::{Status, Step, Transition};

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
    device_nodes: &[crate::sched::devices::DeviceNode],
    actor: &str,
    reason: &str,
) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE bookings SET status = 'active', device_uuid = $2, device_nodes = $3, reason = NULL,
                             updated_at = now(), lease_owner = NULL, lease_until = NULL, attempts = 0
         WHERE id = $1 AND status = 'provisioning'",
        id,
        device_uuid,
        crate::sched::devices::to_json(device_nodes)
    )
    .execute(&mut **tx)
    .await?;
    if r.rows_affected() == 1 {
        let t = Transition::of(Status::Provisioning, Step::Ready, None)
            .expect("a provisioned booking becomes active");
        event(&mut **tx, id, actor, Some(t.from()), t.to(), reason).await?;
        crate::db::notify::booking_moved(tx, id, t.to(), t.from(), None).await?;
    }
    Ok(r.rows_affected() == 1)
}

/// Records a new device of an active booking (instance recreated).
pub async fn set_device(
    db: impl PgExecutor<'_>,
    id: i64,
    device_uuid: &str,
    device_nodes: &[crate::sched::devices::DeviceNode],
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE bookings SET device_uuid = $2, device_nodes = $3, updated_at = now() WHERE id = $1",
        id,
        device_uuid,
        crate::sched::devices::to_json(device_nodes)
    )
    .execute(db)
    .await?;
    Ok(())
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
    note(&mut **tx, id, actor, Status::Active, reason).await?;
    let owner = crate::db::notify::owner_of(&mut **tx, id).await?;
    let subject = format!("gpuslice: booking #{id} {reason}");
    crate::db::notify::email_user(
        tx,
        owner,
        &crate::db::notify::Message {
            topic: "booking_ending",
            subject: &subject,
            body: &format!(
                "Your booking #{id} {reason}.\nExtend it on its page if you need more time.\n"
            ),
            alert_id: None,
            booking_id: Some(id),
        },
    )
    .await?;
    Ok(())
}

/// A MIG booking that should have (or is getting) an instance.
#[derive(Debug, Clone)]
pub struct MigHolder {
    pub id: i64,
    pub gpu_uuid: String,
    pub profile: String,
    pub slice_start: i32,
    pub status: Status,
}

/// Live MIG bookings on a node's GPUs that should have (or are getting) an
/// instance.
pub async fn node_mig_holders(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<MigHolder>> {
    sqlx::query_as!(
        MigHolder,
        r#"SELECT b.id, g.uuid AS gpu_uuid, b.profile AS "profile!", lower(b.slices) AS "slice_start!",
                  b.status AS "status: Status"
           FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
           WHERE n.name = $1 AND b.kind = 'mig'
             AND (b.status IN ('provisioning', 'active', 'releasing')
                  OR (b.status = 'scheduled' AND lower(b.during) <= now()))"#,
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
