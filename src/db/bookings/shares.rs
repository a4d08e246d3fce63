//! Time-sliced shares: what the node's scheduler and `gpuslice exec` read,
//! the scheduler's view of each share and the tenant's QoS ledger.

use sqlx::PgExecutor;
use time::OffsetDateTime;

use crate::domain::booking::{Kind, Status};
use crate::domain::Priority;

/// What `gpuslice exec` needs to know about a booking.
#[derive(Debug, Clone)]
pub struct ExecTarget {
    pub id: i64,
    pub status: Status,
    pub kind: Kind,
    pub device_uuid: Option<String>,
    pub node: Option<String>,
    pub owner_email: String,
    pub owner_unix_user: Option<String>,
    pub owner_disabled: bool,
    pub compute_slices: i32,
    pub device_nodes: Option<serde_json::Value>,
}

pub async fn exec_target(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Option<ExecTarget>> {
    sqlx::query_as!(
        ExecTarget,
        r#"SELECT b.id, b.status AS "status: Status", b.kind AS "kind: Kind", b.device_uuid, n.name AS "node?",
                  u.email AS owner_email, u.unix_user AS owner_unix_user, u.disabled AS owner_disabled,
                  b.compute_slices, b.device_nodes
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
    pub priority: Priority,
    pub guaranteed_share_pct: i32,
    pub memory_gib: i32,
    pub compute_slices: i32,
    pub device_nodes: Option<serde_json::Value>,
}

pub async fn active_shares(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<ActiveShare>> {
    sqlx::query_as!(
        ActiveShare,
        r#"SELECT b.id, b.tenant_id, g.uuid AS gpu_uuid, b.priority AS "priority: Priority",
                t.guaranteed_share_pct, b.memory_gib, b.compute_slices, b.device_nodes
         FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
         JOIN tenants t ON t.id = b.tenant_id
         WHERE n.name = $1 AND b.kind = 'timeslice' AND b.status = 'active'
         ORDER BY b.id"#,
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
