//! The telemetry benchmark: what watching the fleet costs.
//!
//! 1. Sampling: one simulated node of H100-80GB GPUs in MIG mode, each
//!    with seven 1g.10gb instances held by active bookings, sampled the
//!    way the worker samples (`worker::telemetry::sample_once`: one
//!    batched statement per table). The worker's own CPU time per round
//!    (getrusage) over the 10-second interval is the share of a core it
//!    needs. Baseline, in the same run: the same rows written one
//!    statement per row.
//! 2. Rollup: a day of samples of a large fleet, rolled into 5-minute
//!    buckets at once (a catch-up after a day away), and the steady state
//!    (the last few minutes, as every minute's run does).
//! 3. `/metrics`: the DCGM-named gauges, fragmentation and alerts for that
//!    fleet, built and encoded as a scrape does.
//!
//! It runs in a scratch database on the configured server, created and
//! dropped here, so real data is never touched.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use sqlx::{Connection, PgPool};

use crate::db::{self, Database};
use crate::gpu::catalog::Placement;
use crate::gpu::fleet::Fleet;
use crate::gpu::sim::SimBackend;
use crate::gpu::{BackendError, GpuBackend};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Params {
    pub gpus: usize,
    pub instances: usize,
    pub rounds: usize,
    pub fleet: usize,
    pub interval_secs: u64,
}

fn cpu_secs() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| {
            let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
        .unwrap_or(0.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the benchmark and prints its figures.
pub async fn run(database: &Database, p: &Params) -> Result<()> {
    if p.gpus == 0 || !(1..=7).contains(&p.instances) || p.rounds == 0 || p.fleet == 0 {
        bail!("--gpus, --rounds and --fleet must be at least 1, --instances 1 to 7");
    }
    let options = database.connect_options()?;
    let scratch = format!("gpuslice_bench_telemetry_{}", std::process::id());
    let mut admin = sqlx::postgres::PgConnection::connect_with(&options)
        .await
        .context("cannot connect to PostgreSQL")?;
    sqlx::query(&format!("CREATE DATABASE {scratch}"))
        .execute(&mut admin)
        .await
        .context("cannot create the scratch database (the user needs CREATEDB)")?;
    let pool = db::connect(options.clone().database(&scratch)).await?;
    let result = measure(&pool, p).await;
    pool.close().await;
    let dropped = sqlx::query(&format!("DROP DATABASE IF EXISTS {scratch} WITH (FORCE)"))
        .execute(&mut admin)
        .await;
    result?;
    dropped?;
    Ok(())
}

async fn measure(pool: &PgPool, p: &Params) -> Result<()> {
    db::migrate(pool).await?;
    println!(
        "PostgreSQL {}; {} CPUs",
        sqlx::query_scalar::<_, String>("SHOW server_version")
            .fetch_one(pool)
            .await?,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    );
    sampling(pool, p).await?;
    fleet(pool, p).await
}

/// Part 1: the worker's cost of one sampling round.
async fn sampling(pool: &PgPool, p: &Params) -> Result<()> {
    // The fleet file takes at most 16 GPUs a group.
    let mut toml = String::from("[[node]]\nname = \"bench\"\n");
    let mut left = p.gpus;
    while left > 0 {
        let n = left.min(16);
        toml.push_str(&format!(
            "[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = {n}\n"
        ));
        left -= n;
    }
    let fleet = Fleet::parse(&toml).map_err(|e| anyhow::anyhow!(e))?;
    let sim = Arc::new(SimBackend::open(&fleet, "bench", None).map_err(|e| anyhow::anyhow!(e))?);
    let backend: Arc<dyn GpuBackend> = sim.clone();
    crate::worker::report_inventory(pool, "bench", backend.clone(), |_| 4).await?;
    sqlx::query("INSERT INTO tenants (slug, name) VALUES ('bench', 'Bench')")
        .execute(pool)
        .await?;
    sqlx::query(
        "INSERT INTO users (email, display_name, password_hash) VALUES ('bench@bench', 'Bench', 'x')",
    )
    .execute(pool)
    .await?;
    let gpus = db::telemetry::node_gpus(pool, "bench").await?;
    for g in &gpus {
        for start in 0..p.instances as u8 {
            let i = sim
                .create_instance(&g.uuid, 19, Placement { start, size: 1 })
                .map_err(|e: BackendError| anyhow::anyhow!(e))?;
            sqlx::query(
                "INSERT INTO bookings (tenant_id, user_id, kind, model, profile, memory_gib, compute_slices,
                                       priority, hours, during, status, gpu_id, slices, device_uuid)
                 SELECT t.id, u.id, 'mig', 'H100-80GB', '1g.10gb', 10, 1, 'normal', 1,
                        tstzrange(now(), now() + interval '1 hour'), 'active', $1, int4range($2, $2 + 1), $3
                 FROM tenants t, users u",
            )
            .bind(g.id)
            .bind(i32::from(start))
            .bind(i.device_uuid.clone())
            .execute(pool)
            .await?;
        }
    }
    // Warm up once, then time the worker's rounds.
    crate::worker::telemetry::sample_once(pool, "bench", backend.clone(), None).await?;
    let (mut cpu, mut wall) = (Vec::new(), Vec::new());
    for _ in 0..p.rounds {
        let (c0, w0) = (cpu_secs(), Instant::now());
        crate::worker::telemetry::sample_once(pool, "bench", backend.clone(), None).await?;
        cpu.push(cpu_secs() - c0);
        wall.push(w0.elapsed().as_secs_f64());
    }
    // Baseline: the same samples, one INSERT per row.
    let (mut bcpu, mut bwall) = (Vec::new(), Vec::new());
    for _ in 0..p.rounds.min(10) {
        let (c0, w0) = (cpu_secs(), Instant::now());
        row_by_row(pool, backend.clone(), &gpus).await?;
        bcpu.push(cpu_secs() - c0);
        bwall.push(w0.elapsed().as_secs_f64());
    }
    // Idle reclaim's round over the same active bookings, policy on and
    // every device idle: the first round starts every clock (a write each),
    // later ones only read (none is due yet), as in a steady day.
    sqlx::query("UPDATE tenants SET idle_after_minutes = 60 WHERE slug = 'bench'")
        .execute(pool)
        .await?;
    // The baseline's rows carry no process counts: sample as the worker does.
    crate::worker::telemetry::sample_once(pool, "bench", backend.clone(), None).await?;
    let w0 = Instant::now();
    let started = crate::watch::idle::round(pool, 5.0, 60.0).await?.started;
    let first = w0.elapsed().as_secs_f64();
    let mut idle = Vec::new();
    for _ in 0..p.rounds.min(10) {
        let w0 = Instant::now();
        crate::watch::idle::round(pool, 5.0, 60.0).await?;
        idle.push(w0.elapsed().as_secs_f64());
    }
    let idle_ms = median(&mut idle) * 1e3;
    let (c, w, bc, bw) = (
        median(&mut cpu),
        median(&mut wall),
        median(&mut bcpu),
        median(&mut bwall),
    );
    let rows = p.gpus * (1 + p.instances);
    println!(
        "sampling {} GPUs x {} instances ({rows} rows a round), median of {} rounds:",
        p.gpus, p.instances, p.rounds
    );
    println!(
        "  batched (the worker): {:.1} ms CPU, {:.1} ms wall a round = {:.3} % of a core at a 10 s interval",
        c * 1e3,
        w * 1e3,
        c / 10.0 * 100.0
    );
    println!(
        "  one row per statement (baseline): {:.1} ms CPU, {:.1} ms wall = {:.3} % of a core; batched takes {:.2}x its CPU, {:.2}x its wall time",
        bc * 1e3,
        bw * 1e3,
        bc / 10.0 * 100.0,
        c / bc.max(1e-9),
        w / bw.max(1e-9)
    );
    println!(
        "  idle reclaim round over {started} active bookings: {:.1} ms wall the first time (every clock starts), {idle_ms:.1} ms steady (median of {})",
        first * 1e3,
        p.rounds.min(10)
    );
    Ok(())
}

/// The baseline writer: what sample_once gathers, one statement per row.
async fn row_by_row(
    pool: &PgPool,
    backend: Arc<dyn GpuBackend>,
    gpus: &[db::telemetry::NodeGpu],
) -> Result<()> {
    let held = db::telemetry::held_on(pool, "bench").await?;
    let uuids: Vec<(i64, String)> = gpus.iter().map(|g| (g.id, g.uuid.clone())).collect();
    let samples = tokio::task::spawn_blocking(move || {
        uuids
            .into_iter()
            .map(|(id, u)| (id, backend.telemetry(&u).ok()))
            .collect::<Vec<_>>()
    })
    .await?;
    for (id, t) in &samples {
        let Some(t) = t else { continue };
        sqlx::query(
            "INSERT INTO gpu_samples (gpu_id, at, utilization_pct, memory_used_mib, memory_total_mib, temperature_c, power_w)
             VALUES ($1, clock_timestamp(), $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(t.utilization_pct.map(|v| v as f32))
        .bind(t.memory_used_mib as i64)
        .bind(t.memory_total_mib as i64)
        .bind(t.temperature_c.map(|v| v as f32))
        .bind(t.power_w.map(|v| v as f32))
        .execute(pool)
        .await?;
        for h in held.iter().filter(|h| h.gpu_id == *id) {
            if let Some(d) = t.devices.iter().find(|d| d.device_uuid == h.device_uuid) {
                sqlx::query(
                    "INSERT INTO instance_samples (booking_id, at, gpu_id, memory_used_mib, memory_limit_mib)
                     VALUES ($1, clock_timestamp(), $2, $3, $4)",
                )
                .bind(h.id)
                .bind(h.gpu_id)
                .bind(d.memory_used_mib as i64)
                .bind(d.memory_total_mib as i64)
                .execute(pool)
                .await?;
            }
        }
    }
    Ok(())
}

/// Parts 2 and 3: a fleet's day of samples, its rollup and `/metrics`.
async fn fleet(pool: &PgPool, p: &Params) -> Result<()> {
    let nodes = p.fleet.div_ceil(8);
    sqlx::query(
        "INSERT INTO nodes (name, backend) SELECT 'fleet-' || n, 'sim' FROM generate_series(1, $1) n",
    )
    .bind(nodes as i32)
    .execute(pool)
    .await?;
    sqlx::query(
        "INSERT INTO gpus (node_id, idx, uuid, model, product, memory_mib, mode, mig_current, mig_pending)
         SELECT n.id, i, 'GPU-fleet-' || n.id || '-' || i, 'H100-80GB', 'NVIDIA H100 80GB HBM3', 81559,
                'mig', true, true
         FROM nodes n, generate_series(0, 7) i WHERE n.name LIKE 'fleet-%'
         ORDER BY n.id, i LIMIT $1",
    )
    .bind(p.fleet as i64)
    .execute(pool)
    .await?;
    let t0 = Instant::now();
    let rows = sqlx::query(
        "INSERT INTO gpu_samples (gpu_id, at, utilization_pct, memory_used_mib, memory_total_mib, temperature_c,
                                  power_w, ecc_uncorrectable, sm_clock_mhz, mem_clock_mhz)
         SELECT g.id, t, (g.id * 7 + extract(epoch FROM t)::bigint) % 100, 40000, 81559, 55, 350, 0, 1980, 2619
         FROM gpus g, generate_series(now() - interval '24 hours', now(), make_interval(secs => $1)) t
         WHERE g.uuid LIKE 'GPU-fleet-%'",
    )
    .bind(p.interval_secs as f64)
    .execute(pool)
    .await?
    .rows_affected();
    sqlx::query("ANALYZE gpu_samples").execute(pool).await?;
    println!(
        "fleet of {} GPUs: {rows} samples for a day at {} s (written in {:.1} s)",
        p.fleet,
        p.interval_secs,
        t0.elapsed().as_secs_f64()
    );
    // Baseline: the batch rollup this design replaced, a day of raw
    // samples aggregated into 5-minute buckets in one pass.
    let t = Instant::now();
    let buckets = sqlx::query(
        "CREATE TEMP TABLE batch_rollup AS
         SELECT gpu_id, date_bin('5 minutes', at, TIMESTAMPTZ '2000-01-01') AS bucket, count(*) AS samples,
                avg(utilization_pct) AS u, max(utilization_pct) AS um, avg(temperature_c) AS t,
                max(temperature_c) AS tm, avg(memory_used_mib) AS m, max(memory_used_mib) AS mm,
                avg(power_w) AS p
         FROM gpu_samples WHERE at >= now() - interval '24 hours'
         GROUP BY 1, 2",
    )
    .execute(pool)
    .await?
    .rows_affected();
    let batch = t.elapsed().as_secs_f64();
    println!("  baseline, a day rolled up in one batch: {batch:.2} s ({buckets} 5-minute buckets)");
    // gpuslice keeps the rollups as samples arrive: the day's work is the
    // upserts of its 8,640 rounds (at 10 s), timed here as whole rounds of
    // the fleet (raw rows and rollups, as the workers write them).
    let ids: Vec<i64> = sqlx::query_scalar("SELECT id FROM gpus WHERE uuid LIKE 'GPU-fleet-%'")
        .fetch_all(pool)
        .await?;
    let sample = crate::gpu::Telemetry {
        memory_used_mib: 40_000,
        memory_total_mib: 81_559,
        utilization_pct: Some(70),
        temperature_c: Some(55),
        power_w: Some(350.0),
        ecc_uncorrectable: Some(0),
        sm_clock_mhz: Some(1980),
        mem_clock_mhz: Some(2619),
        devices: Vec::new(),
    };
    let rows: Vec<db::telemetry::GpuSample> = ids
        .iter()
        .map(|id| db::telemetry::GpuSample {
            gpu_id: *id,
            telemetry: Some(&sample),
        })
        .collect();
    let mut rounds = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        db::telemetry::record(pool, &rows, &[]).await?;
        rounds.push(t.elapsed().as_secs_f64());
        // Samples are keyed by time: the next round needs a new instant.
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let round = median(&mut rounds);
    let per_day = 86_400 / p.interval_secs.max(1);
    println!(
        "  a round of {} GPUs written with its rollup: {:.1} ms (median of 10); a day's {per_day} rounds: {:.0} s of database time spread over the day, none of it in one go",
        p.fleet,
        round * 1e3,
        round * per_day as f64
    );
    let t = Instant::now();
    let deleted = db::telemetry::prune(
        pool,
        db::telemetry::Retention {
            raw_hours: 12,
            rollup_days: 90,
        },
    )
    .await?;
    println!(
        "  retention deleting half a day of raw samples ({deleted} rows): {:.2} s",
        t.elapsed().as_secs_f64()
    );
    // /metrics as a scrape builds it.
    let settings = crate::web::WebSettings::default();
    let mut state = crate::web::AppState::new(pool.clone(), settings).await?;
    state.telemetry_interval_secs = p.interval_secs;
    let mut times = Vec::new();
    let mut size = 0;
    for _ in 0..10 {
        let t = Instant::now();
        let r = crate::web::ops::fleet_registry(&state).await?;
        let mut body = state.metrics.render();
        prometheus_client::encoding::text::encode_registry(&mut body, &r)?;
        times.push(t.elapsed().as_secs_f64());
        size = body.len();
    }
    println!(
        "  /metrics for {} GPUs: {:.1} ms to build and encode (median of 10), {:.0} KiB",
        p.fleet,
        median(&mut times) * 1e3,
        size as f64 / 1024.0
    );
    Ok(())
}
