//! `gpuslice bench history`: fills the database it points at with a
//! realistic usage history, for the benchmarks of reports, usage pages and
//! the finance CSV as history grows (BENCHMARKS.md).
//!
//! What it makes: ended bookings of twelve tenants (`hist-01` ...
//! `hist-12`, three people each) on the fleet's own GPUs (ten simulated
//! nodes `history-bench-NN` of six H100-80GB in MIG mode and two L40S for
//! shares, marked unhealthy so that no booking is ever placed on them, are
//! registered when the database has no GPU), both kinds, every MIG profile of the GPU's model
//! (small ones more often), shares of 4 to 24 GiB, lengths of one hour to
//! three days (some released early), starting anywhere in the last
//! `months` months; then one usage row per booking-minute, as the worker's
//! metering writes them. The rows go through the `usage` table's own
//! statement trigger, so every daily rollup is exact, and into the monthly
//! partitions, which it makes first. Nothing already there is changed.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use rand::{rngs::StdRng, Rng, SeedableRng};
use sqlx::{PgPool, Row};
use time::{Duration, OffsetDateTime};

use crate::domain::booking::share_slices;
use crate::gpu::catalog;

/// What `bench history` made.
#[derive(Debug, serde::Serialize)]
pub struct Made {
    pub bookings: u64,
    pub usage_rows: u64,
    pub rollup_rows: i64,
    pub months: u32,
    pub tenants: usize,
    pub secs: f64,
}

#[derive(Debug, Clone)]
struct Gpu {
    id: i64,
    model: String,
    mode: String,
    memory_gib: f64,
}

/// A booking to make.
struct Planned {
    tenant: i64,
    user: i64,
    kind: &'static str,
    model: String,
    profile: Option<String>,
    memory_gib: i32,
    compute_slices: i32,
    hours: i32,
    start: OffsetDateTime,
    end: OffsetDateTime,
    status: &'static str,
    gpu: i64,
    slices: Option<(i32, i32)>,
}

/// Usage rows per insert statement (the trigger's transition table holds
/// them all).
const ROWS_PER_STATEMENT: u64 = 500_000;

/// Makes about `rows` usage rows over the `months` months ending now.
pub async fn run(pool: &PgPool, rows: u64, months: u32, seed: u64) -> Result<Made> {
    if rows == 0 {
        bail!("--rows must be at least 1");
    }
    if !(1..=120).contains(&months) {
        bail!("--months must be 1 to 120");
    }
    let started = Instant::now();
    let gpus = fleet(pool).await?;
    let people = people(pool).await?;
    let now = OffsetDateTime::now_utc();
    let now = now
        - Duration::seconds(i64::from(now.second()))
        - Duration::nanoseconds(i64::from(now.nanosecond()));
    let from = now - Duration::days(i64::from(months) * 3044 / 100);
    // Every month's partition first, so no row waits in the default one.
    sqlx::query(
        "SELECT gpuslice_usage_month(m::date) FROM generate_series(date_trunc('month', $1::timestamptz AT TIME ZONE 'UTC'), $2::timestamptz AT TIME ZONE 'UTC', interval '1 month') m",
    )
    .bind(from)
    .bind(now)
    .fetch_all(pool)
    .await
    .context("making the monthly partitions")?;

    let mut rng = StdRng::seed_from_u64(seed);
    let mut made_rows = 0u64;
    let mut bookings = 0u64;
    let mut next_report = rows / 10;
    while made_rows < rows {
        // One batch of bookings, about ROWS_PER_STATEMENT minutes in all.
        let mut batch = Vec::new();
        let mut batch_rows = 0u64;
        while batch_rows < ROWS_PER_STATEMENT.min(rows - made_rows) {
            let b = plan_one(&mut rng, &gpus, &people, from, now);
            batch_rows += ((b.end - b.start).whole_minutes()) as u64;
            batch.push(b);
        }
        let ids = insert_bookings(pool, &batch).await?;
        let n = sqlx::query(
            "INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds, utilization_pct, memory_used_mib)
             SELECT b.id, m, m + interval '1 minute', b.compute_slices * 60.0, b.memory_gib * 60.0,
                    (abs(hashint8(b.id * 1000003 + extract(epoch FROM m)::bigint)::bigint) % 1000) / 10.0,
                    (b.memory_gib * 1024 * (abs(hashint8(b.id)::bigint) % 90 + 10) / 100)
             FROM bookings b
             CROSS JOIN LATERAL generate_series(lower(b.during), upper(b.during) - interval '1 minute', interval '1 minute') m
             WHERE b.id = ANY($1)",
        )
        .bind(&ids)
        .execute(pool)
        .await
        .context("inserting usage rows")?
        .rows_affected();
        made_rows += n;
        bookings += ids.len() as u64;
        if made_rows >= next_report && made_rows < rows {
            println!(
                "  {made_rows} usage rows, {bookings} bookings, {:.0} s",
                started.elapsed().as_secs_f64()
            );
            next_report = made_rows + rows / 10;
        }
    }
    sqlx::query("ANALYZE bookings, usage, usage_daily")
        .execute(pool)
        .await?;
    let rollup_rows: i64 = sqlx::query("SELECT count(*) FROM usage_daily")
        .fetch_one(pool)
        .await?
        .get(0);
    Ok(Made {
        bookings,
        usage_rows: made_rows,
        rollup_rows,
        months,
        tenants: people
            .iter()
            .map(|p| p.0)
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        secs: started.elapsed().as_secs_f64(),
    })
}

/// The fleet's GPUs that take bookings; a small simulated node when there
/// is none.
async fn fleet(pool: &PgPool) -> Result<Vec<Gpu>> {
    let read = || async {
        sqlx::query("SELECT id, model, mode, memory_mib FROM gpus WHERE mode IN ('mig', 'timeslice') ORDER BY id")
            .fetch_all(pool)
            .await
            .map(|rows| {
                rows.iter()
                    .map(|r| Gpu {
                        id: r.get(0),
                        model: r.get(1),
                        mode: r.get(2),
                        memory_gib: r.get::<i64, _>(3) as f64 / 1024.0,
                    })
                    .filter(|g| g.mode == "timeslice" || catalog::model(&g.model).is_some_and(|m| m.mig_capable()))
                    .collect::<Vec<_>>()
            })
    };
    let gpus = read().await?;
    if !gpus.is_empty() {
        return Ok(gpus);
    }
    let mut tx = pool.begin().await?;
    for n in 1..=10 {
        let node: i64 = sqlx::query(
            "INSERT INTO nodes (name, backend) VALUES ($1, 'sim')
             ON CONFLICT (name) DO UPDATE SET name = EXCLUDED.name RETURNING id",
        )
        .bind(format!("history-bench-{n:02}"))
        .fetch_one(&mut *tx)
        .await?
        .get(0);
        for i in 0..8 {
            let (model, mib, mode, mig) = if i < 6 {
                ("H100-80GB", 81_559i64, "mig", true)
            } else {
                ("L40S-48GB", 46_068, "timeslice", false)
            };
            sqlx::query(
                // Not healthy: history only, never offered to a booking.
                "INSERT INTO gpus (node_id, idx, uuid, model, memory_mib, mode, mig_current, mig_pending, healthy)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $7, FALSE) ON CONFLICT DO NOTHING",
            )
            .bind(node)
            .bind(i)
            .bind(format!("GPU-history-bench-{n:02}-{i}"))
            .bind(model)
            .bind(mib)
            .bind(mode)
            .bind(mig)
            .execute(&mut *tx)
            .await?;
        }
    }
    tx.commit().await?;
    let gpus = read().await?;
    if gpus.is_empty() {
        bail!("the fleet has no GPU that takes bookings and none could be added");
    }
    Ok(gpus)
}

/// The (tenant, person) pairs that book: twelve tenants of three people,
/// made when missing. The people cannot sign in (no password).
async fn people(pool: &PgPool) -> Result<Vec<(i64, i64)>> {
    let mut tx = pool.begin().await?;
    let mut out = Vec::new();
    for t in 1..=12 {
        let tenant: i64 = sqlx::query(
            "INSERT INTO tenants (slug, name) VALUES ($1, $2)
             ON CONFLICT (slug) DO UPDATE SET slug = EXCLUDED.slug RETURNING id",
        )
        .bind(format!("hist-{t:02}"))
        .bind(format!("History lab {t:02}"))
        .fetch_one(&mut *tx)
        .await?
        .get(0);
        for p in 1..=3 {
            let user: i64 = sqlx::query(
                "INSERT INTO users (email, display_name, password_hash) VALUES ($1, $2, '!no password: history bench')
                 ON CONFLICT (email) DO UPDATE SET email = EXCLUDED.email RETURNING id",
            )
            .bind(format!("hist-{t:02}-{p}@history.example"))
            .bind(format!("History {t:02}/{p}"))
            .fetch_one(&mut *tx)
            .await?
            .get(0);
            sqlx::query(
                "INSERT INTO memberships (user_id, tenant_id, role) VALUES ($1, $2, 'member') ON CONFLICT DO NOTHING",
            )
            .bind(user)
            .bind(tenant)
            .execute(&mut *tx)
            .await?;
            out.push((tenant, user));
        }
    }
    tx.commit().await?;
    Ok(out)
}

/// Picks from `choices` by weight.
fn weighted<T: Copy>(rng: &mut StdRng, choices: &[(T, u32)]) -> T {
    let total: u32 = choices.iter().map(|c| c.1).sum();
    let mut x = rng.gen_range(0..total);
    for &(v, w) in choices {
        if x < w {
            return v;
        }
        x -= w;
    }
    choices[choices.len() - 1].0
}

fn plan_one(
    rng: &mut StdRng,
    gpus: &[Gpu],
    people: &[(i64, i64)],
    from: OffsetDateTime,
    now: OffsetDateTime,
) -> Planned {
    // Some tenants book far more than others (a few heavy labs).
    let who = people[(rng.gen_range(0.0f64..1.0).powi(2) * people.len() as f64) as usize];
    let gpu = gpus[rng.gen_range(0..gpus.len())].clone();
    let hours = weighted(
        rng,
        &[
            (1, 20),
            (2, 20),
            (4, 20),
            (8, 15),
            (24, 15),
            (48, 7),
            (72, 3),
        ],
    );
    let released_early = rng.gen_bool(0.4);
    let minutes = if released_early {
        (hours * 60 * rng.gen_range(30..100) / 100).max(1)
    } else {
        hours * 60
    };
    let span = (now - from).whole_minutes() - i64::from(minutes);
    let start = from + Duration::minutes(rng.gen_range(0..span.max(1)));
    let end = start + Duration::minutes(i64::from(minutes));
    let status = if released_early {
        "released"
    } else {
        "expired"
    };
    if gpu.mode == "mig" {
        let model = catalog::model(&gpu.model).expect("MIG GPUs are in the catalog");
        // Small profiles more often: weight by the inverse of the slices.
        let weights: Vec<(usize, u32)> = model
            .profiles
            .iter()
            .enumerate()
            .map(|(i, p)| (i, 840 / u32::from(p.compute_slices.max(1))))
            .collect();
        let p = &model.profiles[weighted(rng, &weights)];
        let place = p
            .placements()
            .next()
            .expect("every profile has a placement");
        Planned {
            tenant: who.0,
            user: who.1,
            kind: "mig",
            model: gpu.model.clone(),
            profile: Some(p.name.clone()),
            memory_gib: p.memory_gib.ceil() as i32,
            compute_slices: i32::from(p.compute_slices),
            hours,
            start,
            end,
            status,
            gpu: gpu.id,
            slices: Some((i32::from(place.start), i32::from(place.end()))),
        }
    } else {
        let memory_gib = weighted(rng, &[(4, 35), (8, 25), (12, 15), (16, 15), (24, 10)])
            .min(gpu.memory_gib.floor().max(1.0) as i32);
        Planned {
            tenant: who.0,
            user: who.1,
            kind: "timeslice",
            model: gpu.model.clone(),
            profile: None,
            memory_gib,
            compute_slices: share_slices(memory_gib, gpu.memory_gib),
            hours,
            start,
            end,
            status,
            gpu: gpu.id,
            slices: None,
        }
    }
}

async fn insert_bookings(pool: &PgPool, batch: &[Planned]) -> Result<Vec<i64>> {
    let col = |f: &dyn Fn(&Planned) -> i64| batch.iter().map(f).collect::<Vec<i64>>();
    let tenants = col(&|b| b.tenant);
    let users = col(&|b| b.user);
    let gpus = col(&|b| b.gpu);
    let kinds: Vec<&str> = batch.iter().map(|b| b.kind).collect();
    let models: Vec<&str> = batch.iter().map(|b| b.model.as_str()).collect();
    let profiles: Vec<Option<&str>> = batch.iter().map(|b| b.profile.as_deref()).collect();
    let memory: Vec<i32> = batch.iter().map(|b| b.memory_gib).collect();
    let compute: Vec<i32> = batch.iter().map(|b| b.compute_slices).collect();
    let hours: Vec<i32> = batch.iter().map(|b| b.hours).collect();
    let starts: Vec<OffsetDateTime> = batch.iter().map(|b| b.start).collect();
    let ends: Vec<OffsetDateTime> = batch.iter().map(|b| b.end).collect();
    let statuses: Vec<&str> = batch.iter().map(|b| b.status).collect();
    let lo: Vec<Option<i32>> = batch.iter().map(|b| b.slices.map(|s| s.0)).collect();
    let hi: Vec<Option<i32>> = batch.iter().map(|b| b.slices.map(|s| s.1)).collect();
    let rows = sqlx::query(
        "INSERT INTO bookings (tenant_id, user_id, kind, requested_model, model, profile, memory_gib, compute_slices,
                               priority, hours, during, status, ending_as, gpu_id, slices, reason, metered_until,
                               created_at, updated_at)
         SELECT t, u, k, m, m, p, mem, cs, 'normal', h, tstzrange(s, e), st, NULL, g,
                CASE WHEN lo IS NULL THEN NULL ELSE int4range(lo, hi) END,
                CASE WHEN st = 'released' THEN 'released by its owner' ELSE 'its time ended' END, e,
                s - interval '1 hour', e
         FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::int[], $7::int[],
                     $8::int[], $9::timestamptz[], $10::timestamptz[], $11::text[], $12::bigint[], $13::int[], $14::int[])
              AS x(t, u, k, m, p, mem, cs, h, s, e, st, g, lo, hi)
         RETURNING id",
    )
    .bind(&tenants)
    .bind(&users)
    .bind(&kinds)
    .bind(&models)
    .bind(&profiles)
    .bind(&memory)
    .bind(&compute)
    .bind(&hours)
    .bind(&starts)
    .bind(&ends)
    .bind(&statuses)
    .bind(&gpus)
    .bind(&lo)
    .bind(&hi)
    .fetch_all(pool)
    .await
    .context("inserting bookings")?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
