//! The worker of a GPU node. This part keeps the inventory: it registers the
//! node and its GPUs, heartbeats, and marks GPUs nobody has seen for a while
//! as unhealthy. (Applying bookings, the scheduler and metering build on it.)

pub mod bookings;
pub mod meter;
pub mod security;
pub mod telemetry;

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::PgPool;

use crate::db;
use crate::domain::GpuMode;
use crate::gpu::GpuBackend;

/// How often a worker reports.
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// A GPU unseen for this long is unhealthy (three missed heartbeats).
pub const STALE_SECS: f64 = 30.0;

/// Reports the node's GPUs once.
pub async fn report_inventory(
    pool: &PgPool,
    node: &str,
    backend: Arc<dyn GpuBackend>,
    max_shares: impl Fn(&str) -> i32,
) -> anyhow::Result<usize> {
    let requests = db::fleet::pending_mode_requests(pool, node).await?;
    let b = backend.clone();
    let node_name = node.to_string();
    let seen = tokio::task::spawn_blocking(move || {
        for (uuid, wants_mig) in requests {
            // Refusals (instances appeared, no MIG on this model) are logged;
            // the request stays visible on the fleet page.
            if let Err(e) = b.switch_mig_mode(&uuid, wants_mig) {
                tracing::warn!(node = %node_name, gpu = %uuid, error = %e, "MIG mode switch refused");
            }
        }
        let inv = b.inventory()?;
        let mut out = Vec::new();
        for g in inv {
            let instances = if g.mig_current {
                b.instances(&g.uuid)?
            } else {
                Vec::new()
            };
            out.push((g, instances));
        }
        Ok::<_, crate::gpu::BackendError>(out)
    })
    .await??;
    let mut tx = pool.begin().await?;
    let node_id = db::fleet::heartbeat_node(&mut *tx, node, backend.kind()).await?;
    for (g, instances) in &seen {
        let model = g.model.clone().unwrap_or_else(|| g.product.clone());
        let instances = json!(instances
            .iter()
            .map(|i| json!({"profile": i.profile, "start": i.placement.start, "size": i.placement.size,
                            "device_uuid": i.device_uuid}))
            .collect::<Vec<_>>());
        db::fleet::upsert_gpu(
            &mut *tx,
            node_id,
            &db::fleet::SeenGpu {
                idx: g.index as i32,
                uuid: &g.uuid,
                model: &model,
                product: &g.product,
                memory_mib: g.memory_mib as i64,
                mig_current: g.mig_current,
                mig_pending: g.mig_pending,
                initial_mode: GpuMode::of_hardware(g.mig_current),
                max_shares: max_shares(&g.uuid),
                instances,
            },
        )
        .await?;
    }
    db::fleet::mark_stale(&mut *tx, STALE_SECS).await?;
    tx.commit().await?;
    Ok(seen.len())
}

/// Reports every [`HEARTBEAT`] until the task is dropped. Failures are
/// logged and retried at the next beat.
pub async fn run_inventory(
    pool: PgPool,
    node: String,
    backend: Arc<dyn GpuBackend>,
    max_shares: Arc<dyn Fn(&str) -> i32 + Send + Sync>,
) {
    let mut tick = tokio::time::interval(HEARTBEAT);
    loop {
        tick.tick().await;
        let ms = max_shares.clone();
        if let Err(e) = report_inventory(&pool, &node, backend.clone(), move |u| ms(u)).await {
            tracing::warn!(node = %node, error = format!("{e:#}"), "inventory report failed");
        }
    }
}
