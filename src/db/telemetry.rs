//! Telemetry: raw samples, their 5-minute rollups, driver events, and the
//! series the pages draw.

use sqlx::{PgExecutor, PgPool};
use time::OffsetDateTime;

use crate::gpu::Telemetry;

/// How old a sample may be and still say something about now: three
/// sampling intervals, at least 30 s (one rule for the alerts and `/metrics`).
pub fn fresh_secs(interval_secs: f64) -> f64 {
    (interval_secs * 3.0).max(30.0)
}

/// One GPU's sample: `None` when the GPU did not answer (lost).
pub struct GpuSample<'a> {
    pub gpu_id: i64,
    pub telemetry: Option<&'a Telemetry>,
}

/// One booking's sample.
pub struct BookingSample {
    pub booking_id: i64,
    pub gpu_id: i64,
    pub memory_used_mib: i64,
    pub memory_limit_mib: i64,
    pub utilization_pct: Option<f32>,
    /// Processes on the booking's device (None: the backend cannot tell).
    pub processes: Option<i32>,
}

/// Records one round of samples, all at the database's `now()`, in one
/// statement per table.
pub async fn record(
    db: &PgPool,
    gpus: &[GpuSample<'_>],
    bookings: &[BookingSample],
) -> sqlx::Result<()> {
    let mut tx = db.begin().await?;
    let col = |f: &dyn Fn(&Telemetry) -> Option<f64>| -> Vec<Option<f64>> {
        gpus.iter().map(|g| g.telemetry.and_then(f)).collect()
    };
    let ids: Vec<i64> = gpus.iter().map(|g| g.gpu_id).collect();
    let lost: Vec<bool> = gpus.iter().map(|g| g.telemetry.is_none()).collect();
    let util = col(&|t| t.utilization_pct.map(f64::from));
    let used = col(&|t| Some(t.memory_used_mib as f64));
    let total = col(&|t| Some(t.memory_total_mib as f64));
    let temp = col(&|t| t.temperature_c.map(f64::from));
    let power = col(&|t| t.power_w);
    let ecc = col(&|t| t.ecc_uncorrectable.map(|v| v as f64));
    let sm = col(&|t| t.sm_clock_mhz.map(f64::from));
    let mem = col(&|t| t.mem_clock_mhz.map(f64::from));
    sqlx::query!(
        "INSERT INTO gpu_samples (gpu_id, at, lost, utilization_pct, memory_used_mib, memory_total_mib,
                                  temperature_c, power_w, ecc_uncorrectable, sm_clock_mhz, mem_clock_mhz)
         SELECT id, now(), lost, util::real, used::bigint, total::bigint, temp::real, power::real,
                ecc::bigint, sm::integer, mem::integer
         FROM unnest($1::bigint[], $2::bool[], $3::float8[], $4::float8[], $5::float8[], $6::float8[],
                     $7::float8[], $8::float8[], $9::float8[], $10::float8[])
              AS u (id, lost, util, used, total, temp, power, ecc, sm, mem)
         ON CONFLICT DO NOTHING",
        &ids,
        &lost,
        &util as &[Option<f64>],
        &used as &[Option<f64>],
        &total as &[Option<f64>],
        &temp as &[Option<f64>],
        &power as &[Option<f64>],
        &ecc as &[Option<f64>],
        &sm as &[Option<f64>],
        &mem as &[Option<f64>],
    )
    .execute(&mut *tx)
    .await?;
    // The 5-minute rollup of the same round, kept up to date as it goes.
    sqlx::query!(
        "INSERT INTO gpu_rollups AS r (gpu_id, bucket, samples, lost_samples, utilization_sum, utilization_n,
                                       utilization_max, temperature_sum, temperature_n, temperature_max,
                                       memory_used_sum, memory_used_n, memory_used_max, power_sum, power_n)
         SELECT id, date_bin('5 minutes', now(), TIMESTAMPTZ '2000-01-01'), 1, lost::int,
                COALESCE(util, 0), (util IS NOT NULL)::int, util::real,
                COALESCE(temp, 0), (temp IS NOT NULL)::int, temp::real,
                COALESCE(used, 0), (used IS NOT NULL)::int, used::bigint,
                COALESCE(power, 0), (power IS NOT NULL)::int
         FROM unnest($1::bigint[], $2::bool[], $3::float8[], $4::float8[], $5::float8[], $6::float8[])
              AS u (id, lost, util, used, temp, power)
         ON CONFLICT (gpu_id, bucket) DO UPDATE SET
             samples = r.samples + 1,
             lost_samples = r.lost_samples + EXCLUDED.lost_samples,
             utilization_sum = r.utilization_sum + EXCLUDED.utilization_sum,
             utilization_n = r.utilization_n + EXCLUDED.utilization_n,
             utilization_max = GREATEST(r.utilization_max, EXCLUDED.utilization_max),
             temperature_sum = r.temperature_sum + EXCLUDED.temperature_sum,
             temperature_n = r.temperature_n + EXCLUDED.temperature_n,
             temperature_max = GREATEST(r.temperature_max, EXCLUDED.temperature_max),
             memory_used_sum = r.memory_used_sum + EXCLUDED.memory_used_sum,
             memory_used_n = r.memory_used_n + EXCLUDED.memory_used_n,
             memory_used_max = GREATEST(r.memory_used_max, EXCLUDED.memory_used_max),
             power_sum = r.power_sum + EXCLUDED.power_sum,
             power_n = r.power_n + EXCLUDED.power_n",
        &ids,
        &lost,
        &util as &[Option<f64>],
        &used as &[Option<f64>],
        &temp as &[Option<f64>],
        &power as &[Option<f64>],
    )
    .execute(&mut *tx)
    .await?;
    if !bookings.is_empty() {
        let b: Vec<i64> = bookings.iter().map(|s| s.booking_id).collect();
        let g: Vec<i64> = bookings.iter().map(|s| s.gpu_id).collect();
        let u: Vec<i64> = bookings.iter().map(|s| s.memory_used_mib).collect();
        let l: Vec<i64> = bookings.iter().map(|s| s.memory_limit_mib).collect();
        let p: Vec<Option<f32>> = bookings.iter().map(|s| s.utilization_pct).collect();
        let n: Vec<Option<i32>> = bookings.iter().map(|s| s.processes).collect();
        sqlx::query!(
            "INSERT INTO instance_samples (booking_id, at, gpu_id, memory_used_mib, memory_limit_mib, utilization_pct, processes)
             SELECT b, now(), g, u, l, p, n
             FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::real[], $6::int[]) AS x (b, g, u, l, p, n)
             ON CONFLICT DO NOTHING",
            &b,
            &g,
            &u,
            &l,
            &p as &[Option<f32>],
            &n as &[Option<i32>]
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query!(
            "INSERT INTO instance_rollups AS r (booking_id, bucket, samples, memory_used_sum, memory_used_max,
                                                memory_limit_mib, utilization_sum, utilization_n)
             SELECT b, date_bin('5 minutes', now(), TIMESTAMPTZ '2000-01-01'), 1, u, u, l,
                    COALESCE(p, 0), (p IS NOT NULL)::int
             FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::real[]) AS x (b, u, l, p)
             ON CONFLICT (booking_id, bucket) DO UPDATE SET
                 samples = r.samples + 1,
                 memory_used_sum = r.memory_used_sum + EXCLUDED.memory_used_sum,
                 memory_used_max = GREATEST(r.memory_used_max, EXCLUDED.memory_used_max),
                 memory_limit_mib = GREATEST(r.memory_limit_mib, EXCLUDED.memory_limit_mib),
                 utilization_sum = r.utilization_sum + EXCLUDED.utilization_sum,
                 utilization_n = r.utilization_n + EXCLUDED.utilization_n",
            &b,
            &u,
            &l,
            &p as &[Option<f32>]
        )
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await
}

/// A GPU of a node, as the telemetry task samples it.
pub struct NodeGpu {
    pub id: i64,
    pub uuid: String,
}

pub async fn node_gpus(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<NodeGpu>> {
    sqlx::query_as!(
        NodeGpu,
        "SELECT g.id, g.uuid FROM gpus g JOIN nodes n ON n.id = g.node_id
         WHERE n.name = $1 ORDER BY g.idx",
        node
    )
    .fetch_all(db)
    .await
}

/// A booking holding a device on a node now.
pub struct Held {
    pub id: i64,
    pub gpu_id: i64,
    pub gpu_uuid: String,
    pub device_uuid: String,
    pub memory_gib: i32,
}

/// Active bookings with a device on `node`.
pub async fn held_on(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<Held>> {
    sqlx::query_as!(
        Held,
        r#"SELECT b.id, g.id AS gpu_id, g.uuid AS gpu_uuid, b.device_uuid AS "device_uuid!", b.memory_gib
           FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
           WHERE n.name = $1 AND b.status = 'active' AND b.device_uuid IS NOT NULL"#,
        node
    )
    .fetch_all(db)
    .await
}

/// Records driver events by GPU uuid; events of unknown GPUs are dropped.
pub async fn record_events(
    db: impl PgExecutor<'_>,
    events: &[crate::gpu::GpuEvent],
) -> sqlx::Result<u64> {
    let uuids: Vec<String> = events.iter().map(|e| e.gpu_uuid.clone()).collect();
    let kinds: Vec<String> = events.iter().map(|e| e.kind.as_str().to_string()).collect();
    let codes: Vec<i64> = events.iter().map(|e| e.code as i64).collect();
    let r = sqlx::query!(
        "INSERT INTO gpu_events (gpu_id, kind, code)
         SELECT g.id, e.kind, e.code
         FROM unnest($1::text[], $2::text[], $3::bigint[]) AS e (uuid, kind, code)
         JOIN gpus g ON g.uuid = e.uuid",
        &uuids,
        &kinds,
        &codes
    )
    .execute(db)
    .await?;
    Ok(r.rows_affected())
}

/// What the retention keeps.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub raw_hours: i64,
    pub rollup_days: i64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            raw_hours: 48,
            rollup_days: 90,
        }
    }
}

/// Deletes what the retention no longer keeps: raw samples after
/// `raw_hours`, rollups and driver events after `rollup_days`,
/// notifications after a month (and gives up those nobody sent in a day).
/// Deletion is by indexed time, so its cost follows what expires, not the
/// history kept. Returns the rows deleted.
pub async fn prune(db: &PgPool, keep: Retention) -> sqlx::Result<u64> {
    let mut tx = db.begin().await?;
    let raw = keep.raw_hours as i32;
    let days = keep.rollup_days as i32;
    let mut deleted = 0;
    deleted += sqlx::query!(
        "DELETE FROM gpu_samples WHERE at < now() - make_interval(hours => $1)",
        raw
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    deleted += sqlx::query!(
        "DELETE FROM instance_samples WHERE at < now() - make_interval(hours => $1)",
        raw
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    deleted += sqlx::query!(
        "DELETE FROM gpu_rollups WHERE bucket < now() - make_interval(days => $1)",
        days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    deleted += sqlx::query!(
        "DELETE FROM instance_rollups WHERE bucket < now() - make_interval(days => $1)",
        days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    deleted += sqlx::query!(
        "DELETE FROM gpu_events WHERE at < now() - make_interval(days => $1)",
        days
    )
    .execute(&mut *tx)
    .await?
    .rows_affected();
    crate::db::notify::expire_unsent(&mut *tx).await?;
    deleted +=
        sqlx::query!("DELETE FROM notifications WHERE created_at < now() - interval '30 days'")
            .execute(&mut *tx)
            .await?
            .rows_affected();
    tx.commit().await?;
    Ok(deleted)
}

/// One point of a GPU's history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GpuPoint {
    pub gpu_id: i64,
    pub at: OffsetDateTime,
    pub utilization: Option<f64>,
    pub temperature: Option<f64>,
    pub memory_used_mib: Option<f64>,
    pub lost: bool,
}

/// The history of GPUs since `since` in 5-minute points (the last one
/// is the bucket filling now).
pub async fn gpu_history(
    db: impl PgExecutor<'_>,
    gpu_ids: &[i64],
    since: OffsetDateTime,
) -> sqlx::Result<Vec<GpuPoint>> {
    sqlx::query_as!(
        GpuPoint,
        r#"SELECT gpu_id, bucket AS at,
                  utilization_sum / NULLIF(utilization_n, 0) AS utilization,
                  temperature_sum / NULLIF(temperature_n, 0) AS temperature,
                  memory_used_sum / NULLIF(memory_used_n, 0) AS memory_used_mib,
                  lost_samples = samples AS "lost!"
           FROM gpu_rollups WHERE gpu_id = ANY($1) AND bucket >= $2
           ORDER BY gpu_id, bucket"#,
        gpu_ids,
        since
    )
    .fetch_all(db)
    .await
}

/// One point of a booking's history.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BookingPoint {
    pub at: OffsetDateTime,
    pub memory_used_mib: f64,
    pub memory_limit_mib: i64,
    pub utilization: Option<f64>,
}

/// A booking's memory and utilisation since it started: 5-minute means
/// where the raw samples are gone, 1-minute means of the raw samples
/// after (at most 1,440 points a day, whatever the sampling interval).
pub async fn booking_history(
    db: impl PgExecutor<'_>,
    booking_id: i64,
) -> sqlx::Result<Vec<BookingPoint>> {
    sqlx::query_as!(
        BookingPoint,
        r#"WITH raw_from AS (SELECT COALESCE(min(at), 'infinity') AS t FROM instance_samples WHERE booking_id = $1)
           SELECT bucket AS "at!", memory_used_sum / samples AS "memory_used_mib!", memory_limit_mib AS "memory_limit_mib!",
                  utilization_sum / NULLIF(utilization_n, 0) AS utilization
           FROM instance_rollups, raw_from
           WHERE booking_id = $1 AND bucket + interval '5 minutes' <= raw_from.t
           UNION ALL
           SELECT date_bin('1 minute', at, TIMESTAMPTZ '2000-01-01'), avg(memory_used_mib)::float8,
                  max(memory_limit_mib), avg(utilization_pct)::float8
           FROM instance_samples WHERE booking_id = $1
           GROUP BY 1
           ORDER BY 1"#,
        booking_id
    )
    .fetch_all(db)
    .await
}

/// The latest sample of every GPU, with where it is.
#[derive(Debug, Clone)]
pub struct Latest {
    pub gpu_id: i64,
    pub node: String,
    pub idx: i32,
    pub uuid: String,
    pub model: String,
    /// The driver's product name.
    pub product: String,
    pub at: OffsetDateTime,
    pub lost: bool,
    pub utilization_pct: Option<f32>,
    pub memory_used_mib: Option<i64>,
    pub memory_total_mib: Option<i64>,
    pub temperature_c: Option<f32>,
    pub power_w: Option<f32>,
    pub ecc_uncorrectable: Option<i64>,
    pub sm_clock_mhz: Option<i32>,
    pub mem_clock_mhz: Option<i32>,
    pub last_xid: Option<i64>,
}

/// The latest sample of each GPU taken within `fresh_secs`.
pub async fn latest(db: impl PgExecutor<'_>, fresh_secs: f64) -> sqlx::Result<Vec<Latest>> {
    sqlx::query_as!(
        Latest,
        r#"SELECT g.id AS gpu_id, n.name AS node, g.idx, g.uuid, g.model, g.product, s.at, s.lost, s.utilization_pct,
                  s.memory_used_mib, s.memory_total_mib, s.temperature_c, s.power_w, s.ecc_uncorrectable,
                  s.sm_clock_mhz, s.mem_clock_mhz,
                  (SELECT code FROM gpu_events e WHERE e.gpu_id = g.id AND e.kind = 'xid'
                   ORDER BY at DESC LIMIT 1) AS last_xid
           FROM gpus g JOIN nodes n ON n.id = g.node_id
           CROSS JOIN LATERAL (SELECT * FROM gpu_samples s WHERE s.gpu_id = g.id
                               AND s.at > now() - make_interval(secs => $1)
                               ORDER BY s.at DESC LIMIT 1) s
           ORDER BY n.name, g.idx"#,
        fresh_secs
    )
    .fetch_all(db)
    .await
}

/// The latest sample of each active booking within `fresh_secs`, with
/// its owner and tenant.
#[derive(Debug, Clone)]
pub struct LatestBooking {
    pub booking_id: i64,
    pub gpu_id: i64,
    pub node: String,
    pub idx: i32,
    pub gpu_uuid: String,
    pub model: String,
    pub product: String,
    pub device_uuid: Option<String>,
    pub profile: Option<String>,
    pub gi_placement: Option<i32>,
    pub tenant: String,
    pub memory_used_mib: i64,
    pub memory_limit_mib: i64,
    pub utilization_pct: Option<f32>,
}

pub async fn latest_bookings(
    db: impl PgExecutor<'_>,
    fresh_secs: f64,
) -> sqlx::Result<Vec<LatestBooking>> {
    sqlx::query_as!(
        LatestBooking,
        r#"SELECT b.id AS booking_id, g.id AS gpu_id, n.name AS node, g.idx, g.uuid AS gpu_uuid, g.model,
                  g.product, b.device_uuid, b.profile, lower(b.slices) AS gi_placement, t.slug AS tenant,
                  s.memory_used_mib, s.memory_limit_mib, s.utilization_pct
           FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
           JOIN tenants t ON t.id = b.tenant_id
           CROSS JOIN LATERAL (SELECT * FROM instance_samples s WHERE s.booking_id = b.id
                               AND s.at > now() - make_interval(secs => $1)
                               ORDER BY s.at DESC LIMIT 1) s
           WHERE b.status = 'active'
           ORDER BY b.id"#,
        fresh_secs
    )
    .fetch_all(db)
    .await
}

/// Recent driver events of a GPU.
#[derive(Debug, Clone)]
pub struct Event {
    pub at: OffsetDateTime,
    pub kind: String,
    pub code: i64,
}

pub async fn events(db: impl PgExecutor<'_>, gpu_id: i64, limit: i64) -> sqlx::Result<Vec<Event>> {
    sqlx::query_as!(
        Event,
        "SELECT at, kind, code FROM gpu_events WHERE gpu_id = $1 ORDER BY at DESC LIMIT $2",
        gpu_id,
        limit
    )
    .fetch_all(db)
    .await
}

/// XID events per GPU within the last `secs`: (gpu id, count, last code).
pub async fn xid_counts(db: impl PgExecutor<'_>, secs: f64) -> sqlx::Result<Vec<(i64, i64, i64)>> {
    let rows = sqlx::query!(
        r#"SELECT gpu_id, count(*) AS "n!", (array_agg(code ORDER BY at DESC))[1] AS "last!"
           FROM gpu_events WHERE kind = 'xid' AND at > now() - make_interval(secs => $1)
           GROUP BY gpu_id"#,
        secs
    )
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(|r| (r.gpu_id, r.n, r.last)).collect())
}

/// Subjects of open `instance_memory_near_limit` alerts whose booking is
/// no longer active: (node, gpu uuid, booking id).
pub async fn ended_with_open_memory_alerts(
    db: impl PgExecutor<'_>,
) -> sqlx::Result<Vec<(Option<String>, Option<String>, Option<i64>)>> {
    let rows = sqlx::query!(
        "SELECT a.node, a.gpu_uuid, a.booking_id FROM alerts a JOIN bookings b ON b.id = a.booking_id
         WHERE a.rule = 'instance_memory_near_limit' AND a.state IN ('pending', 'firing')
           AND b.status <> 'active'"
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.node, r.gpu_uuid, r.booking_id))
        .collect())
}
