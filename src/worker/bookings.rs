//! Applying bookings to the hardware of one node: provision at the start,
//! warn before the end, tear down at the end or on release, and reconcile
//! what the hardware has with what the database wants.
//!
//! Crash safety rests on three facts. Every step is claimed with a lease
//! and is idempotent: provisioning adopts an instance already at the
//! planned slot, teardown of a missing instance is done. The transient
//! statuses (`provisioning`, `releasing`) are only left by finishing the
//! step, so a crash leaves a booking the next worker picks up. And one
//! worker runs a node (a PostgreSQL advisory lock on its name), so at start
//! it may take over every lease its dead predecessor held.

use std::sync::Arc;
use std::time::Duration;

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgPool, Postgres};
use time::OffsetDateTime;

use crate::db::{self, bookings::Due};
use crate::domain::booking::{Kind, Status, Step, Transition};
use crate::gpu::catalog::{self, Placement};
use crate::gpu::{BackendError, GpuBackend, Instance};

/// How the worker paces itself.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often it looks for due work.
    pub tick: Duration,
    /// How long a claim holds before another worker may take it.
    pub lease_secs: f64,
    /// Warn this long before a booking's end.
    pub warn_secs: f64,
    /// Processes get this long after SIGTERM before SIGKILL.
    pub grace: Duration,
    /// A step failing this many times fails the booking.
    pub max_attempts: i32,
    /// Reconcile every this many ticks.
    pub reconcile_every: u32,
    /// Where booking cgroups live; `None`: no isolation (not root, no
    /// freezer), which the worker says at start.
    pub cgroups: Option<crate::sched::cgroup::Layout>,
    /// Host memory a booking's processes may use, per compute slice (GiB).
    pub host_memory_gib_per_slice: u64,
    /// CPUs a booking's processes may use (`0-7`); `None`: all.
    pub cpus: Option<String>,
    /// The node's NVIDIA device numbering: booking groups are confined
    /// to their device files (set with the cgroups at start).
    pub devices: Option<crate::sched::devices::NodeDevices>,
}

impl Settings {
    /// The limits a booking's cgroup is created with.
    pub fn limits(&self) -> crate::sched::cgroup::Limits {
        crate::sched::cgroup::Limits {
            host_memory_gib_per_slice: self.host_memory_gib_per_slice,
            cpus: self.cpus.clone(),
            devices: self.devices.clone(),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            tick: Duration::from_secs(1),
            lease_secs: 60.0,
            warn_secs: 15.0 * 60.0,
            grace: Duration::from_secs(10),
            max_attempts: 5,
            reconcile_every: 10,
            cgroups: None,
            host_memory_gib_per_slice: 16,
            cpus: None,
            devices: None,
        }
    }
}

/// Holds the node's advisory lock while alive. The connection is detached
/// from the pool, so the lock dies with the process (or this value).
pub struct NodeLock {
    _conn: sqlx::PgConnection,
}

/// Takes the node's lock, waiting while another worker holds it.
pub async fn lock_node(pool: &PgPool, node: &str) -> anyhow::Result<NodeLock> {
    let mut warned = false;
    loop {
        let conn: PoolConnection<Postgres> = pool.acquire().await?;
        let mut conn = conn.detach();
        let got: bool = sqlx::query_scalar!(
            r#"SELECT pg_try_advisory_lock(hashtextextended('gpuslice-node:' || $1, 0)) AS "got!""#,
            node
        )
        .fetch_one(&mut conn)
        .await?;
        if got {
            return Ok(NodeLock { _conn: conn });
        }
        let _ = conn.close().await;
        if !warned {
            tracing::warn!(node = %node, "another worker runs this node; waiting for it to stop");
            warned = true;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

fn actor(node: &str) -> String {
    format!("worker:{node}")
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, BackendError> + Send + 'static,
) -> anyhow::Result<Result<T, BackendError>> {
    Ok(tokio::task::spawn_blocking(f).await?)
}

/// Runs the node's bookings until the task is dropped.
pub async fn run(pool: PgPool, node: String, backend: Arc<dyn GpuBackend>, settings: Settings) {
    let _lock = loop {
        match lock_node(&pool, &node).await {
            Ok(l) => break l,
            Err(e) => {
                tracing::warn!(node = %node, error = format!("{e:#}"), "cannot take the node lock");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    if let Some(l) = &settings.cgroups {
        let thawed = l.thaw_all();
        tracing::info!(node = %node, cgroups = l.kind(), thawed, "booking cgroups ready");
    }
    match db::bookings::clear_node_leases(&pool, &node).await {
        Ok(n) if n > 0 => {
            tracing::info!(node = %node, leases = n, "took over the leases of the previous worker")
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(node = %node, error = %e, "cannot clear old leases"),
    }
    let owner = format!("{node}/{}", uuid::Uuid::new_v4());
    let mut tick = tokio::time::interval(settings.tick);
    let mut n: u32 = 0;
    loop {
        tick.tick().await;
        if n.is_multiple_of(settings.reconcile_every.max(1)) {
            if let Err(e) = reconcile(&pool, &node, backend.clone(), &settings).await {
                tracing::warn!(node = %node, error = format!("{e:#}"), "reconcile failed");
            }
        }
        n = n.wrapping_add(1);
        if let Err(e) = step(&pool, &node, &owner, backend.clone(), &settings).await {
            tracing::warn!(node = %node, error = format!("{e:#}"), "booking step failed");
        }
    }
}

/// Claims and performs the due steps of the node once. Returns how many.
pub async fn step(
    pool: &PgPool,
    node: &str,
    owner: &str,
    backend: Arc<dyn GpuBackend>,
    settings: &Settings,
) -> anyhow::Result<usize> {
    let due = db::bookings::claim_due(
        pool,
        node,
        owner,
        settings.lease_secs,
        settings.warn_secs,
        20,
    )
    .await?;
    for (id, what) in &due {
        let result = match what {
            Due::Provision => provision(pool, node, *id, backend.clone(), settings).await,
            Due::Expire => expire(pool, node, *id, backend.clone(), settings).await,
            Due::Teardown => teardown(pool, node, *id, backend.clone(), settings).await,
            Due::Warn => warn(pool, node, *id).await,
        };
        if let Err(e) = result {
            let msg = format!("{e:#}");
            tracing::warn!(node = %node, booking = id, error = %msg, "booking step failed; will retry");
            let attempts = db::bookings::retry_later(pool, *id, &msg).await?;
            if attempts >= settings.max_attempts {
                give_up(pool, node, *id, &msg).await?;
            }
        }
    }
    Ok(due.len())
}

/// A step failed too often: a booking being provisioned fails (its
/// instance, if any, is torn down); one being torn down is retried later.
async fn give_up(pool: &PgPool, node: &str, id: i64, msg: &str) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    let (status, _) = db::bookings::lock(&mut tx, id).await?;
    if matches!(status, Status::Provisioning | Status::Scheduled) {
        let t = Transition::of(status, Step::Fail, None)?;
        let why = format!("could not set up the device: {msg}");
        db::bookings::transition(&mut tx, id, t, &actor(node), Some(&why)).await?;
    }
    tx.commit().await?;
    Ok(())
}

fn placement_of(b: &db::bookings::Booking) -> anyhow::Result<(u32, Placement)> {
    let model = catalog::model(b.model.as_deref().unwrap_or_default())
        .ok_or_else(|| anyhow::anyhow!("the GPU model {:?} is not in the catalog", b.model))?;
    let profile = model
        .profile(b.profile.as_deref().unwrap_or_default())
        .ok_or_else(|| anyhow::anyhow!("{} has no profile {:?}", model.id, b.profile))?;
    let start = b
        .slice_start
        .and_then(|s| u8::try_from(s).ok())
        .ok_or_else(|| anyhow::anyhow!("booking {} has no placement", b.id))?;
    Ok((
        profile.nvml_id,
        Placement {
            start,
            size: profile.memory_slices,
        },
    ))
}

fn find_at(instances: &[Instance], profile_id: u32, placement: Placement) -> Option<&Instance> {
    instances
        .iter()
        .find(|i| !i.foreign && i.profile_id == profile_id && i.placement == placement)
}

/// Records a GPU's foreign instances (made by `nvidia-smi` or another
/// tool): their slots count as taken for placement, they are never
/// destroyed, and a new one is logged and audited once.
async fn record_foreign(
    pool: &PgPool,
    node: &str,
    gpu: &str,
    model: Option<&str>,
    instances: &[Instance],
) -> anyhow::Result<()> {
    let model = model.and_then(catalog::model);
    let now: Vec<db::fleet::ForeignInstance> = instances
        .iter()
        .filter(|i| i.foreign)
        .map(|i| {
            // The catalog profile whose slots it takes: its own, else one
            // of the same size.
            let profile = model
                .and_then(|m| {
                    m.profile(&i.profile).or_else(|| {
                        m.profiles
                            .iter()
                            .find(|p| p.memory_slices == i.placement.size)
                    })
                })
                .map(|p| p.name.clone())
                .unwrap_or_else(|| i.profile.clone());
            db::fleet::ForeignInstance {
                gi_id: i.gi_id as i32,
                profile,
                slice_start: i32::from(i.placement.start),
                slice_size: i32::from(i.placement.size),
                detail: format!(
                    "GPU instance {} ({}, profile id {}) at memory slices {}..{}{}",
                    i.gi_id,
                    i.profile,
                    i.profile_id,
                    i.placement.start,
                    i.placement.end(),
                    if i.ci_id.is_none() {
                        ", not gpuslice's layout of compute instances"
                    } else {
                        ""
                    }
                ),
            }
        })
        .collect();
    let mut tx = pool.begin().await?;
    let new = db::fleet::set_foreign(&mut tx, gpu, &now).await?;
    for f in &new {
        tracing::warn!(node = %node, gpu = %gpu, instance = %f.detail, "a GPU instance gpuslice did not make: its slots are left alone and count as taken");
        db::audit::record(
            &mut *tx,
            &db::audit::Actor::system(&actor(node)),
            "reconcile.foreign_instance",
            gpu,
            serde_json::json!({ "instance": f.detail, "profile": f.profile }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn provision(
    pool: &PgPool,
    node: &str,
    id: i64,
    backend: Arc<dyn GpuBackend>,
    settings: &Settings,
) -> anyhow::Result<()> {
    let b = db::bookings::get(pool, id).await?;
    if b.status == Status::Scheduled {
        let mut tx = pool.begin().await?;
        let t = Transition::of(b.status, Step::Start, None)?;
        let moved = db::bookings::transition(&mut tx, id, t, &actor(node), None).await?;
        tx.commit().await?;
        if !moved {
            return Ok(());
        }
    } else if b.status != Status::Provisioning {
        return Ok(());
    }
    let gpu = b
        .gpu_uuid
        .clone()
        .ok_or_else(|| anyhow::anyhow!("booking {id} has no GPU"))?;
    let (device, how) = if b.kind == Kind::Mig {
        let (profile_id, placement) = placement_of(&b)?;
        let g = gpu.clone();
        let be = backend.clone();
        let existing = blocking(move || be.instances(&g)).await??;
        match find_at(&existing, profile_id, placement).and_then(|i| i.device_uuid.clone()) {
            // A crash after the create left it there: adopt it.
            Some(uuid) => (uuid, "device ready (adopted after a restart)"),
            None => {
                let (g, be) = (gpu.clone(), backend.clone());
                let created =
                    blocking(move || be.create_instance(&g, profile_id, placement)).await?;
                match created {
                    Ok(i) => (
                        i.device_uuid
                            .ok_or_else(|| anyhow::anyhow!("the new instance has no MIG device"))?,
                        "device ready",
                    ),
                    Err(e) => anyhow::bail!(
                        "the GPU refused {} at memory slices {}..{}: {e}",
                        b.profile.as_deref().unwrap_or_default(),
                        placement.start,
                        placement.end()
                    ),
                }
            }
        }
    } else {
        // A time-sliced share runs on the whole GPU, its turn given by the
        // node's scheduler.
        (gpu, "share registered on the GPU")
    };
    // The device files its processes may open.
    let (d2, be) = (device.clone(), backend.clone());
    let nodes = blocking(move || be.device_nodes(&d2)).await??;
    if let Some(l) = &settings.cgroups {
        // The booking's processes join this group through `gpuslice exec`:
        // host memory in proportion to its compute slices, the node's CPUs,
        // its own device files and no others.
        l.create_for(id, b.compute_slices, &settings.limits(), &nodes)?;
    }
    let mut tx = pool.begin().await?;
    db::bookings::activate(&mut tx, id, &device, &nodes, &actor(node), how).await?;
    tx.commit().await?;
    Ok(())
}

async fn expire(
    pool: &PgPool,
    node: &str,
    id: i64,
    backend: Arc<dyn GpuBackend>,
    settings: &Settings,
) -> anyhow::Result<()> {
    let mut tx = pool.begin().await?;
    let t = Transition::of(Status::Active, Step::Expire, None)?;
    let moved =
        db::bookings::transition(&mut tx, id, t, &actor(node), Some("reached its end")).await?;
    tx.commit().await?;
    if moved {
        teardown(pool, node, id, backend, settings).await?;
    }
    Ok(())
}

async fn teardown(
    pool: &PgPool,
    node: &str,
    id: i64,
    backend: Arc<dyn GpuBackend>,
    settings: &Settings,
) -> anyhow::Result<()> {
    let b = db::bookings::get(pool, id).await?;
    if b.status != Status::Releasing {
        return Ok(());
    }
    if b.kind == Kind::Mig {
        if let (Some(gpu), Ok((profile_id, placement))) = (b.gpu_uuid.clone(), placement_of(&b)) {
            let g = gpu.clone();
            let be = backend.clone();
            let existing = blocking(move || be.instances(&g)).await??;
            if let Some(gi) = find_at(&existing, profile_id, placement).map(|i| i.gi_id) {
                let grace = settings.grace;
                let ended = blocking(move || backend.destroy_instance(&gpu, gi, grace)).await??;
                if !ended.is_empty() {
                    tracing::info!(
                        booking = id,
                        processes = ended.len(),
                        "ended processes on the device"
                    );
                }
            }
        }
    }
    if let Some(l) = &settings.cgroups {
        // Its processes get the grace period, then the group goes.
        let (g, grace) = (l.group(id), settings.grace);
        tokio::task::spawn_blocking(move || g.remove(grace)).await??;
    }
    let mut tx = pool.begin().await?;
    let t = Transition::of(Status::Releasing, Step::Finish, b.ending_as)?;
    db::bookings::transition(&mut tx, id, t, &actor(node), Some("torn down")).await?;
    tx.commit().await?;
    Ok(())
}

async fn warn(pool: &PgPool, node: &str, id: i64) -> anyhow::Result<()> {
    let b = db::bookings::get(pool, id).await?;
    let left = (b.end - OffsetDateTime::now_utc()).whole_minutes().max(0);
    let mut tx = pool.begin().await?;
    db::bookings::mark_warned(
        &mut tx,
        id,
        &actor(node),
        &format!(
            "ends in {left} minutes, at {}: save your work",
            crate::booking::when(b.end)
        ),
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Makes the hardware match the database on this node's MIG GPUs:
/// instances no live booking owns are destroyed (and audited); an active
/// booking whose instance vanished gets it back at its slot, or fails with
/// the reason. Returns (removed, recreated).
pub async fn reconcile(
    pool: &PgPool,
    node: &str,
    backend: Arc<dyn GpuBackend>,
    settings: &Settings,
) -> anyhow::Result<(usize, usize)> {
    if let Some(l) = &settings.cgroups {
        let live = db::bookings::live_on_node(pool, node).await?;
        for id in l.existing().into_iter().filter(|id| !live.contains(id)) {
            let (g, grace) = (l.group(id), settings.grace);
            tokio::task::spawn_blocking(move || g.remove(grace)).await??;
            tracing::info!(node = %node, booking = id, "removed the cgroup of a booking that is over");
        }
    }
    let holders = db::bookings::node_mig_holders(pool, node).await?;
    let be = backend.clone();
    let hardware = blocking(move || {
        let mut out = Vec::new();
        for g in be.inventory()? {
            if g.mig_current {
                out.push((g.uuid.clone(), g.model.clone(), be.instances(&g.uuid)?));
            }
        }
        Ok(out)
    })
    .await??;
    let mut removed = 0;
    let mut recreated = 0;
    for (gpu, model, instances) in &hardware {
        record_foreign(pool, node, gpu, model.as_deref(), instances).await?;
        for inst in instances.iter().filter(|i| !i.foreign) {
            let owned = holders.iter().any(|h| {
                h.gpu_uuid == *gpu
                    && h.profile == inst.profile
                    && h.slice_start == i32::from(inst.placement.start)
            });
            if owned {
                continue;
            }
            let (g, gi, grace, be) = (gpu.clone(), inst.gi_id, settings.grace, backend.clone());
            blocking(move || be.destroy_instance(&g, gi, grace)).await??;
            removed += 1;
            tracing::warn!(node = %node, gpu = %gpu, profile = %inst.profile, start = inst.placement.start,
                           "removed a MIG instance no booking owns");
            db::audit::record(
                pool,
                &db::audit::Actor {
                    user_id: None,
                    email: Some(actor(node)),
                    client_addr: None,
                },
                "reconcile.remove_instance",
                gpu,
                serde_json::json!({
                    "profile": inst.profile, "start": inst.placement.start,
                    "size": inst.placement.size, "device_uuid": inst.device_uuid,
                }),
            )
            .await?;
        }
        for h in &holders {
            if h.gpu_uuid != *gpu || h.status != Status::Active {
                continue;
            }
            let present = instances
                .iter()
                .any(|i| i.profile == h.profile && i32::from(i.placement.start) == h.slice_start);
            if present {
                continue;
            }
            let id = &h.id;
            let b = db::bookings::get(pool, *id).await?;
            let (profile_id, placement) = placement_of(&b)?;
            // A booking whose slots someone else took by hand is not
            // recreated into them (the create would collide).
            if instances
                .iter()
                .any(|i| i.foreign && placement.overlaps(i.placement))
            {
                continue;
            }
            let (g2, be) = (gpu.clone(), backend.clone());
            let made = blocking(move || be.create_instance(&g2, profile_id, placement)).await?;
            let mut tx = pool.begin().await?;
            match made {
                Ok(inst) => {
                    let device = inst.device_uuid.unwrap_or_default();
                    // A new instance may have new capability files: the
                    // booking's group is confined to them again.
                    let (d2, be) = (device.clone(), backend.clone());
                    let nodes = blocking(move || be.device_nodes(&d2)).await??;
                    if let (Some(l), Some(nd)) = (&settings.cgroups, &settings.devices) {
                        let g = l.group(*id);
                        if g.exists() {
                            g.restrict_devices(&nd.policy(&nodes))?;
                        }
                    }
                    db::bookings::set_device(&mut *tx, *id, &device, &nodes).await?;
                    db::bookings::note(
                        &mut *tx,
                        *id,
                        &actor(node),
                        Status::Active,
                        &format!("the MIG instance had vanished; recreated as {device}"),
                    )
                    .await?;
                    recreated += 1;
                }
                Err(e) => {
                    let t = Transition::of(Status::Active, Step::Fail, None)?;
                    let why = format!("the MIG instance vanished and could not be recreated: {e}");
                    db::bookings::transition(&mut tx, *id, t, &actor(node), Some(&why)).await?;
                }
            }
            tx.commit().await?;
        }
    }
    Ok((removed, recreated))
}

/// Places queued bookings as capacity frees, every `every`, until dropped.
pub async fn run_planner(pool: PgPool, every: Duration) {
    let mut tick = tokio::time::interval(every);
    let mut planner = crate::booking::Planner::default();
    loop {
        tick.tick().await;
        match planner.tick(&pool).await {
            Ok(n) if n > 0 => tracing::info!(placed = n, "placed queued bookings"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "planning the queue failed"),
        }
    }
}
