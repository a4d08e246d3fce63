//! Nodes and GPUs as the workers report them.

use serde_json::Value;
use sqlx::PgExecutor;
use time::OffsetDateTime;

use crate::domain::GpuMode;

/// A GPU as the fleet page shows it.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub id: i64,
    pub node: String,
    pub idx: i32,
    pub uuid: String,
    pub model: String,
    pub memory_mib: i64,
    pub mode: GpuMode,
    pub mig_current: bool,
    pub mig_pending: bool,
    pub max_shares: i32,
    pub healthy: bool,
    pub instances: Value,
    pub requested_mode: Option<GpuMode>,
    /// How its time-sliced shares are enforced, as its worker reported
    /// (`launch`, `freezer`, `mps`).
    pub share_enforcement: Option<String>,
    pub last_seen: OffsetDateTime,
    pub last_heartbeat: OffsetDateTime,
}

impl Gpu {
    /// How its time-sliced shares are enforced, as its worker reported.
    pub fn enforcement(&self) -> Option<crate::sched::launch::Enforcement> {
        self.share_enforcement
            .as_deref()
            .and_then(crate::sched::launch::Enforcement::parse)
    }
}

/// Registers (or refreshes) a node and returns its id.
pub async fn heartbeat_node(
    db: impl PgExecutor<'_>,
    name: &str,
    backend: &str,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO nodes (name, backend) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET backend = EXCLUDED.backend, last_heartbeat = now()
         RETURNING id",
        name,
        backend
    )
    .fetch_one(db)
    .await
}

/// What a worker saw of one GPU.
pub struct SeenGpu<'a> {
    pub idx: i32,
    pub uuid: &'a str,
    pub model: &'a str,
    pub product: &'a str,
    pub memory_mib: i64,
    pub mig_current: bool,
    pub mig_pending: bool,
    /// Mode for a GPU seen for the first time (from the hardware or fleet file).
    pub initial_mode: GpuMode,
    pub max_shares: i32,
    pub instances: Value,
}

/// Records a GPU as seen now and healthy. An admin's mode choice
/// (including drained) survives; the hardware facts are refreshed.
pub async fn upsert_gpu(
    db: impl PgExecutor<'_>,
    node_id: i64,
    g: &SeenGpu<'_>,
) -> sqlx::Result<()> {
    sqlx::query!(
        "INSERT INTO gpus (node_id, idx, uuid, model, product, memory_mib, mode, mig_current,
                           mig_pending, max_shares, instances)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (uuid) DO UPDATE SET
             node_id = EXCLUDED.node_id, idx = EXCLUDED.idx, model = EXCLUDED.model,
             product = EXCLUDED.product, memory_mib = EXCLUDED.memory_mib,
             mig_current = EXCLUDED.mig_current, mig_pending = EXCLUDED.mig_pending,
             instances = EXCLUDED.instances, healthy = TRUE, last_seen = now(),
             -- A requested mode the hardware now has becomes the GPU's mode
             -- (a drained GPU stays drained) and the request is done.
             mode = CASE WHEN gpus.requested_mode IS NOT NULL
                              AND EXCLUDED.mig_current = (gpus.requested_mode = 'mig')
                              AND gpus.mode <> 'drained'
                         THEN gpus.requested_mode ELSE gpus.mode END,
             requested_mode = CASE WHEN EXCLUDED.mig_current = (gpus.requested_mode = 'mig')
                                   THEN NULL ELSE gpus.requested_mode END",
        node_id,
        g.idx,
        g.uuid,
        g.model,
        g.product,
        g.memory_mib,
        g.initial_mode.as_str(),
        g.mig_current,
        g.mig_pending,
        g.max_shares,
        g.instances
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Marks GPUs not seen for `stale_secs` as unhealthy; returns how many
/// changed.
pub async fn mark_stale(db: impl PgExecutor<'_>, stale_secs: f64) -> sqlx::Result<u64> {
    let r = sqlx::query!(
        "UPDATE gpus SET healthy = FALSE
         WHERE healthy AND last_seen < now() - make_interval(secs => $1)",
        stale_secs
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}

pub async fn list(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Gpu>> {
    sqlx::query_as!(
        Gpu,
        r#"SELECT g.id, n.name AS node, g.idx, g.uuid, g.model, g.memory_mib, g.mode AS "mode: GpuMode",
                g.mig_current, g.mig_pending, g.max_shares, g.healthy, g.instances,
                g.requested_mode AS "requested_mode: GpuMode", g.share_enforcement, g.last_seen, n.last_heartbeat
         FROM gpus g JOIN nodes n ON n.id = g.node_id
         ORDER BY n.name, g.idx"#
    )
    .fetch_all(db)
    .await
}

pub async fn get(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<Gpu> {
    sqlx::query_as!(
        Gpu,
        r#"SELECT g.id, n.name AS node, g.idx, g.uuid, g.model, g.memory_mib, g.mode AS "mode: GpuMode",
                g.mig_current, g.mig_pending, g.max_shares, g.healthy, g.instances,
                g.requested_mode AS "requested_mode: GpuMode", g.share_enforcement, g.last_seen, n.last_heartbeat
         FROM gpus g JOIN nodes n ON n.id = g.node_id WHERE g.id = $1"#,
        id
    )
    .fetch_one(db)
    .await
}

/// Records how node `node`'s GPUs enforce time-sliced shares: `mps` for
/// the uuids in `mps` (or all with `all_mps`), `default` for the others.
pub async fn set_share_enforcement(
    db: impl PgExecutor<'_>,
    node: &str,
    default: &str,
    mps: &[String],
    all_mps: bool,
) -> sqlx::Result<()> {
    sqlx::query!(
        "UPDATE gpus g SET share_enforcement = CASE WHEN $4 OR g.uuid = ANY($3) THEN 'mps' ELSE $2 END
         FROM nodes n
         WHERE n.id = g.node_id AND n.name = $1
           AND g.share_enforcement IS DISTINCT FROM (CASE WHEN $4 OR g.uuid = ANY($3) THEN 'mps' ELSE $2 END)",
        node,
        default,
        mps,
        all_mps
    )
    .execute(db)
    .await?;
    Ok(())
}

/// Drains a GPU (no new bookings) or gives it back its hardware mode.
pub async fn set_drained(db: impl PgExecutor<'_>, id: i64, drained: bool) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE gpus SET mode = CASE WHEN $2 THEN 'drained'
                                     WHEN mig_current THEN 'mig' ELSE 'timeslice' END
         WHERE id = $1",
        id,
        drained
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Asks the GPU's worker to switch its MIG mode. Only for a GPU whose last
/// report showed no GPU instances; false otherwise (nothing changes).
pub async fn request_mode(db: impl PgExecutor<'_>, id: i64, mode: GpuMode) -> sqlx::Result<bool> {
    let r = sqlx::query!(
        "UPDATE gpus SET requested_mode = $2
         WHERE id = $1 AND jsonb_array_length(instances) = 0",
        id,
        mode.as_str()
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected() == 1)
}

/// Mode requests waiting for a node's worker: (GPU uuid, wants MIG).
pub async fn pending_mode_requests(
    db: impl PgExecutor<'_>,
    node: &str,
) -> sqlx::Result<Vec<(String, bool)>> {
    let rows = sqlx::query!(
        r#"SELECT g.uuid, g.requested_mode = 'mig' AS "wants_mig!"
           FROM gpus g JOIN nodes n ON n.id = g.node_id
           WHERE n.name = $1 AND g.requested_mode IS NOT NULL"#,
        node
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.uuid, r.wants_mig)).collect())
}

/// A GPU new bookings may land on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bookable {
    pub id: i64,
    pub node_id: i64,
    /// The node's name and the GPU's index on it (for people).
    pub node: String,
    pub idx: i32,
    pub uuid: String,
    pub model: String,
    pub memory_mib: i64,
    pub mode: GpuMode,
    pub max_shares: i32,
}

/// Healthy GPUs in MIG or time-slice mode whose hardware agrees with that
/// mode and that no mode switch is pending for, in node and index order.
pub async fn bookable(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Bookable>> {
    sqlx::query_as!(
        Bookable,
        r#"SELECT g.id, g.node_id, n.name AS node, g.idx, g.uuid, g.model, g.memory_mib, g.mode AS "mode: GpuMode", g.max_shares
         FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE g.healthy AND g.requested_mode IS NULL
           AND ((g.mode = 'mig' AND g.mig_current AND g.mig_pending)
                OR (g.mode = 'timeslice' AND NOT g.mig_current))
         ORDER BY n.name, g.idx"#
    )
    .fetch_all(db)
    .await
}

/// Locks a GPU's row (shares check its capacity under this lock).
pub async fn lock_gpu(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<()> {
    sqlx::query_scalar!("SELECT id FROM gpus WHERE id = $1 FOR UPDATE", id)
        .fetch_one(db)
        .await?;
    Ok(())
}

/// A GPU instance made behind gpuslice's back, as reconcile records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignInstance {
    pub gi_id: i32,
    pub profile: String,
    pub slice_start: i32,
    pub slice_size: i32,
    pub detail: String,
}

/// Makes the GPU's recorded foreign instances `now`; returns the ones that
/// are new (to report).
pub async fn set_foreign(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    gpu_uuid: &str,
    now: &[ForeignInstance],
) -> sqlx::Result<Vec<ForeignInstance>> {
    let gis: Vec<i32> = now.iter().map(|f| f.gi_id).collect();
    sqlx::query!(
        "DELETE FROM foreign_instances f USING gpus g
         WHERE g.id = f.gpu_id AND g.uuid = $1 AND NOT (f.gi_id = ANY($2))",
        gpu_uuid,
        &gis
    )
    .execute(&mut **tx)
    .await?;
    let mut new = Vec::new();
    for f in now {
        let inserted = sqlx::query_scalar!(
            r#"INSERT INTO foreign_instances (gpu_id, gi_id, profile, slice_start, slice_size, detail)
               SELECT id, $2, $3, $4, $5, $6 FROM gpus WHERE uuid = $1
               ON CONFLICT (gpu_id, gi_id) DO UPDATE
                 SET profile = EXCLUDED.profile, slice_start = EXCLUDED.slice_start,
                     slice_size = EXCLUDED.slice_size, detail = EXCLUDED.detail
                 WHERE (foreign_instances.profile, foreign_instances.slice_start,
                        foreign_instances.slice_size, foreign_instances.detail)
                       IS DISTINCT FROM (EXCLUDED.profile, EXCLUDED.slice_start,
                                         EXCLUDED.slice_size, EXCLUDED.detail)
               RETURNING (xmax = 0) AS "inserted!""#,
            gpu_uuid,
            f.gi_id,
            f.profile,
            f.slice_start,
            f.slice_size,
            f.detail
        )
        .fetch_optional(&mut **tx)
        .await?;
        if inserted == Some(true) {
            new.push(f.clone());
        }
    }
    Ok(new)
}
