//! The node's security detectors, run with every telemetry round: a
//! process on a GPU or MIG device that is in no booking's cgroup (an
//! intruder, started outside `gpuslice exec`), and a process inside a
//! booking whose Unix account is neither root nor the owner's linked one.
//! Each sighting is evidence for the security monitor
//! ([`crate::watch::security`]); at the threshold the node may respond by
//! itself (`GPUSLICE_SECURITY_RESPONSE`): end the intruder, or freeze the
//! share, audited.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use sqlx::PgPool;

use crate::db;
use crate::domain::booking::Kind;
use crate::domain::security::{Detector, Response, Suspect};
use crate::gpu::{GpuBackend, GpuProcess};
use crate::sched::cgroup::Layout;
use crate::sched::procfs;
use crate::watch::security::{report, responded, Report};

/// What one round saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// A process on a device in no booking's cgroup; `booking`: the MIG
    /// booking whose device it uses (none for a whole GPU).
    Intruder {
        booking: Option<i64>,
        device: String,
        pid: u32,
        used_mib: u64,
    },
    /// A process in `booking`'s cgroup under another Unix account;
    /// `share`: the booking is a time-sliced share (it can be frozen).
    Foreign {
        booking: i64,
        share: bool,
        pid: u32,
        uid: u32,
    },
}

/// Runs the detectors every `every` until the task is dropped.
pub async fn run(
    pool: PgPool,
    node: String,
    backend: Arc<dyn GpuBackend>,
    layout: Layout,
    every: Duration,
    response: Response,
    grace: Duration,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut done: HashSet<(i64, u32)> = HashSet::new();
    let prefix = layout.prefix_name();
    loop {
        tick.tick().await;
        match inspect_once(&pool, &node, backend.clone(), &layout).await {
            Ok(findings) => {
                act(&pool, &node, &prefix, &findings, response, grace, &mut done).await;
            }
            Err(e) => {
                tracing::warn!(node = %node, error = format!("{e:#}"), "security round failed")
            }
        }
    }
}

/// One round of the detectors (no reports).
pub async fn inspect_once(
    pool: &PgPool,
    node: &str,
    backend: Arc<dyn GpuBackend>,
    layout: &Layout,
) -> anyhow::Result<Vec<Finding>> {
    let bookings = db::security::node_bookings(pool, node).await?;
    let gpus: Vec<String> = db::telemetry::node_gpus(pool, node)
        .await?
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let layout = layout.clone();
    let findings = tokio::task::spawn_blocking(move || {
        // The devices' processes first, then the groups: a process that
        // joins a booking in between is then seen in its group.
        let mut listed: Vec<(Option<i64>, String, Vec<GpuProcess>)> = Vec::new();
        for b in bookings.iter().filter(|b| b.kind == Kind::Mig) {
            if let Ok(procs) = backend.processes(&b.device_uuid) {
                listed.push((Some(b.id), b.device_uuid.clone(), procs));
            }
        }
        for g in &gpus {
            if let Ok(procs) = backend.processes(g) {
                listed.push((None, g.clone(), procs));
            }
        }
        // Every process in some booking's group on this node.
        let mut in_group: HashMap<u32, i64> = HashMap::new();
        for id in layout.existing() {
            for pid in layout.group(id).pids() {
                in_group.insert(pid, id);
            }
        }
        let mut out = Vec::new();
        let mut seen: HashSet<u32> = HashSet::new();
        let mut intruders = |booking: Option<i64>, device: &str, procs: Vec<GpuProcess>| {
            for p in procs {
                if in_group.contains_key(&p.pid) || !seen.insert(p.pid) {
                    continue;
                }
                out.push(Finding::Intruder {
                    booking,
                    device: device.to_string(),
                    pid: p.pid,
                    used_mib: p.used_memory_mib,
                });
            }
        };
        // MIG devices first, so an intruder is charged to the booking whose
        // slice it uses; then whole GPUs (shares, free GPUs).
        for (booking, device, procs) in listed {
            intruders(booking, &device, procs);
        }
        for b in &bookings {
            let owner = b
                .owner_unix_user
                .as_deref()
                .and_then(|u| nix::unistd::User::from_name(u).ok().flatten())
                .map(|u| u.uid.as_raw());
            let pids = in_group
                .iter()
                .filter(|(_, id)| **id == b.id)
                .map(|(p, _)| *p);
            for pid in pids {
                let Some(uid) = procfs::uid(pid) else {
                    continue;
                };
                if uid != 0 && Some(uid) != owner {
                    out.push(Finding::Foreign {
                        booking: b.id,
                        share: b.kind == Kind::Timeslice,
                        pid,
                        uid,
                    });
                }
            }
        }
        out
    })
    .await?;
    Ok(findings)
}

/// Ends an intruding process (`end_processes`: SIGTERM, SIGKILL after
/// `grace`, through a pidfd) after checking it is still outside every
/// booking group (`prefix` in its cgroup path). Whether it was ended.
fn end_intruder(pid: u32, grace: Duration, prefix: &str) -> bool {
    let in_booking = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map(|c| c.contains(&format!("/{prefix}/")))
        .unwrap_or(true);
    if in_booking || procfs::ended(pid) {
        return false;
    }
    crate::gpu::backend::end_processes(
        &[GpuProcess {
            pid,
            used_memory_mib: 0,
        }],
        grace,
    );
    true
}

/// Reports the findings and responds where the node is told to.
#[allow(clippy::too_many_arguments)]
pub async fn act(
    pool: &PgPool,
    node: &str,
    prefix: &str,
    findings: &[Finding],
    response: Response,
    grace: Duration,
    done: &mut HashSet<(i64, u32)>,
) {
    if done.len() > 10_000 {
        done.clear();
    }
    for f in findings {
        match f {
            Finding::Intruder {
                booking,
                device,
                pid,
                used_mib,
            } => {
                let uid = procfs::uid(*pid)
                    .map(|u| format!("uid {u}"))
                    .unwrap_or_else(|| "uid unknown".into());
                let detail = format!(
                    "process {pid} ({}, {uid}) uses {used_mib} MiB on {device} on {node} and is in no booking's cgroup (not started with gpuslice exec)",
                    procfs::comm(*pid)
                );
                let suspect = match booking {
                    Some(id) => Suspect::Booking(*id),
                    None => Suspect::Device(device.clone()),
                };
                let Some(o) = report(
                    pool,
                    Report::new(suspect, Detector::IntruderProcess, detail).on_node(node),
                )
                .await
                else {
                    continue;
                };
                if o.alerting && response.end_intruders && done.insert((o.incident_id, *pid)) {
                    let (pid, prefix) = (*pid, prefix.to_string());
                    let ended =
                        tokio::task::spawn_blocking(move || end_intruder(pid, grace, &prefix))
                            .await
                            .unwrap_or(false);
                    if !ended {
                        continue;
                    }
                    responded(
                        pool,
                        o.incident_id,
                        node,
                        "security.end_process",
                        &format!(
                            "ended process {pid} on {device} (SIGTERM, then SIGKILL after {} s)",
                            grace.as_secs()
                        ),
                    )
                    .await;
                }
            }
            Finding::Foreign {
                booking,
                share,
                pid,
                uid,
            } => {
                let detail = format!(
                    "process {pid} ({}) in booking {booking}'s cgroup runs as uid {uid}, not the owner's linked account",
                    procfs::comm(*pid)
                );
                let Some(o) = report(
                    pool,
                    Report::new(Suspect::Booking(*booking), Detector::ForeignAccount, detail)
                        .on_node(node),
                )
                .await
                else {
                    continue;
                };
                if o.alerting && response.freeze_shares && *share && done.insert((o.incident_id, 0))
                {
                    freeze_share(pool, node, *booking, o.incident_id).await;
                }
            }
        }
    }
}

/// The `freeze-shares` response for a time-sliced share: its group is held
/// frozen by the node's share supervisor until an admin closes the
/// incident.
pub async fn freeze_share(pool: &PgPool, node: &str, booking: i64, incident: i64) {
    match db::security::hold(pool, incident).await {
        Ok(true) => {}
        // Already held (two detectors saw it in the same second): one response.
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(booking, error = %e, "cannot hold the share");
            return;
        }
    }
    responded(
        pool,
        incident,
        node,
        "security.freeze_share",
        &format!("froze share {booking} until an admin closes incident #{incident}"),
    )
    .await;
}
