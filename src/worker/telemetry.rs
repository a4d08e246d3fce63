//! Telemetry of a node: every GPU and every booking's device sampled each
//! interval and written in one round; driver events (XID, double-bit ECC)
//! waited for on their own task and written as they come.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::db;
use crate::db::telemetry::{BookingSample, GpuSample};
use crate::gpu::{BackendError, GpuBackend, Telemetry};
use crate::sched::cgroup::Layout;

/// Samples every `every` until the task is dropped.
pub async fn run(
    pool: PgPool,
    node: String,
    backend: Arc<dyn GpuBackend>,
    cgroups: Option<Layout>,
    every: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sample_once(&pool, &node, backend.clone(), cgroups.as_ref()).await {
            tracing::warn!(node = %node, error = format!("{e:#}"), "telemetry sample failed");
        }
    }
}

/// Waits for driver events and records them, until the task is dropped.
pub async fn run_events(pool: PgPool, node: String, backend: Arc<dyn GpuBackend>) {
    loop {
        let b = backend.clone();
        let got = tokio::task::spawn_blocking(move || b.wait_events(Duration::from_secs(2))).await;
        match got {
            Ok(Ok(events)) if !events.is_empty() => {
                for e in &events {
                    tracing::warn!(node = %node, gpu = %e.gpu_uuid, kind = e.kind.as_str(), code = e.code, "GPU event");
                }
                if let Err(e) = db::telemetry::record_events(&pool, &events).await {
                    tracing::warn!(node = %node, error = %e, "cannot record GPU events");
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(node = %node, error = %e, "GPU events unavailable; retrying in a minute");
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
            Err(_) => return,
        }
    }
}

/// One round: samples each GPU of the node and each active booking on
/// it. Returns how many GPUs answered.
pub async fn sample_once(
    pool: &PgPool,
    node: &str,
    backend: Arc<dyn GpuBackend>,
    cgroups: Option<&Layout>,
) -> anyhow::Result<usize> {
    let gpus = db::telemetry::node_gpus(pool, node).await?;
    let held = db::telemetry::held_on(pool, node).await?;
    // Processes in each booking's cgroup (what `gpuslice exec` started).
    let has_cgroups = cgroups.is_some();
    let pids: HashMap<i64, Vec<u32>> = held
        .iter()
        .map(|h| {
            let p = cgroups.map(|l| l.group(h.id).pids()).unwrap_or_default();
            (h.id, p)
        })
        .collect();
    let node_name = node.to_string();
    let (samples, bookings) = tokio::task::spawn_blocking(move || {
        let mut by_device: HashMap<String, Vec<u32>> = HashMap::new();
        for h in &held {
            by_device
                .entry(h.device_uuid.clone())
                .or_default()
                .extend(pids.get(&h.id).into_iter().flatten());
        }
        backend.observe_processes(&by_device);
        let mut samples: Vec<(i64, Option<Telemetry>)> = Vec::new();
        for g in &gpus {
            match backend.telemetry(&g.uuid) {
                Ok(t) => samples.push((g.id, Some(t))),
                // Fallen off the bus, or gone from the driver's list.
                Err(BackendError::GpuLost(_) | BackendError::NoSuchGpu(_)) => {
                    samples.push((g.id, None))
                }
                Err(e) => {
                    tracing::debug!(node = %node_name, gpu = %g.uuid, error = %e, "no telemetry")
                }
            }
        }
        let mut bookings = Vec::new();
        for h in &held {
            let limit = i64::from(h.memory_gib) * 1024;
            let Some(Some(t)) = samples.iter().find(|s| s.0 == h.gpu_id).map(|s| &s.1) else {
                continue;
            };
            if let Some(d) = t.devices.iter().find(|d| d.device_uuid == h.device_uuid) {
                bookings.push(BookingSample {
                    booking_id: h.id,
                    gpu_id: h.gpu_id,
                    // Running work: the processes NVML lists on the MIG
                    // device (a shell idling in the booking is not work).
                    processes: backend
                        .processes(&h.device_uuid)
                        .ok()
                        .map(|ps| ps.len() as i32),
                    memory_used_mib: d.memory_used_mib as i64,
                    memory_limit_mib: if d.memory_total_mib > 0 {
                        d.memory_total_mib as i64
                    } else {
                        limit
                    },
                    utilization_pct: d.utilization_pct.map(|u| u as f32),
                });
            } else if h.device_uuid == h.gpu_uuid {
                // A time-sliced share: its processes are those in its cgroup.
                let mine = pids.get(&h.id).cloned().unwrap_or_default();
                let attributable = has_cgroups;
                let on_gpu: Option<Vec<_>> = backend
                    .processes(&h.gpu_uuid)
                    .ok()
                    .map(|ps| ps.into_iter().filter(|p| mine.contains(&p.pid)).collect());
                let used = on_gpu
                    .iter()
                    .flatten()
                    .map(|p| p.used_memory_mib)
                    .sum::<u64>();
                // Its utilisation: NVML's per-process samples of the last
                // half minute (the busiest sample of each of its processes,
                // summed), where the driver gives them.
                let since_us = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_micros() as u64)
                    .unwrap_or(0)
                    .saturating_sub(30_000_000);
                let utilization_pct = backend
                    .process_utilization(&h.gpu_uuid, since_us)
                    .ok()
                    .flatten()
                    .map(|samples| {
                        let mut busiest: HashMap<u32, u32> = HashMap::new();
                        for (pid, sm) in samples.into_iter().filter(|(p, _)| mine.contains(p)) {
                            let b = busiest.entry(pid).or_default();
                            *b = (*b).max(sm);
                        }
                        busiest.values().sum::<u32>().min(100) as f32
                    });
                bookings.push(BookingSample {
                    booking_id: h.id,
                    gpu_id: h.gpu_id,
                    memory_used_mib: used as i64,
                    memory_limit_mib: limit,
                    utilization_pct: utilization_pct.filter(|_| attributable),
                    // Without cgroups a share's processes cannot be told
                    // from its neighbours': unknown, never idle.
                    processes: attributable
                        .then(|| on_gpu.map(|ps| ps.len() as i32))
                        .flatten(),
                });
            }
        }
        (samples, bookings)
    })
    .await?;
    let rows: Vec<GpuSample> = samples
        .iter()
        .map(|(id, t)| GpuSample {
            gpu_id: *id,
            telemetry: t.as_ref(),
        })
        .collect();
    db::telemetry::record(pool, &rows, &bookings).await?;
    Ok(samples.iter().filter(|s| s.1.is_some()).count())
}
