//! Usage rows, tariffs and the reports built from them.

use futures_util::stream::BoxStream;
use sqlx::{PgExecutor, PgPool, Postgres, Transaction};
use time::{Date, OffsetDateTime};

use crate::domain::usage::UsageRow;

/// A booking the worker meters.
#[derive(Debug, Clone)]
pub struct ToMeter {
    pub id: i64,
    pub kind: String,
    pub compute_slices: i32,
    pub memory_gib: i32,
    pub start: OffsetDateTime,
    pub end: OffsetDateTime,
    pub metered_until: Option<OffsetDateTime>,
    pub device_uuid: String,
    pub gpu_uuid: String,
    pub status: String,
    /// A share's achieved part of its GPU (percent) and when the node's
    /// scheduler last published it (Unix seconds).
    pub achieved_pct: Option<f64>,
    pub achieved_at: Option<i64>,
}

/// Bookings of `node` that got a device and are not fully metered.
pub async fn to_meter(db: impl PgExecutor<'_>, node: &str) -> sqlx::Result<Vec<ToMeter>> {
    sqlx::query_as!(
        ToMeter,
        r#"SELECT b.id, b.kind, b.compute_slices, b.memory_gib,
                  lower(b.during) AS "start!", upper(b.during) AS "end!", b.metered_until,
                  b.device_uuid AS "device_uuid!", g.uuid AS gpu_uuid, b.status,
                  (b.scheduler ->> 'achieved_share_pct')::float8 AS achieved_pct,
                  (b.scheduler ->> 'at')::bigint AS achieved_at
           FROM bookings b JOIN gpus g ON g.id = b.gpu_id JOIN nodes n ON n.id = g.node_id
           WHERE n.name = $1 AND b.device_uuid IS NOT NULL
             AND (b.status IN ('active', 'releasing')
                  OR b.metered_until IS NULL OR b.metered_until < upper(b.during))"#,
        node
    )
    .fetch_all(db)
    .await
}

/// Stores usage rows (a row already there is left alone: re-metering is a
/// no-op) and moves each booking's `metered_until` to its last row's end.
pub async fn record(tx: &mut Transaction<'_, Postgres>, rows: &[UsageRow]) -> sqlx::Result<u64> {
    if rows.is_empty() {
        return Ok(0);
    }
    let ts = |s: i64| OffsetDateTime::from_unix_timestamp(s).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let ids: Vec<i64> = rows.iter().map(|r| r.booking_id).collect();
    let starts: Vec<OffsetDateTime> = rows.iter().map(|r| ts(r.start)).collect();
    let ends: Vec<OffsetDateTime> = rows.iter().map(|r| ts(r.end)).collect();
    let slices: Vec<f64> = rows.iter().map(|r| r.slice_seconds).collect();
    let gibs: Vec<f64> = rows.iter().map(|r| r.gib_seconds).collect();
    let utils: Vec<Option<f32>> = rows.iter().map(|r| r.utilization_pct).collect();
    let mems: Vec<Option<i64>> = rows.iter().map(|r| r.memory_used_mib).collect();
    let inserted = sqlx::query!(
        r#"INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds,
                              utilization_pct, memory_used_mib)
           SELECT * FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::float8[],
                                $5::float8[], $6::real[], $7::bigint[])
           ON CONFLICT (booking_id, interval_start) DO NOTHING"#,
        &ids,
        &starts,
        &ends,
        &slices,
        &gibs,
        &utils as &[Option<f32>],
        &mems as &[Option<i64>]
    )
    .execute(&mut **tx)
    .await?
    .rows_affected();
    sqlx::query!(
        "UPDATE bookings b SET metered_until = GREATEST(b.metered_until, m.until)
         FROM (SELECT id, max(e) AS until FROM unnest($1::bigint[], $2::timestamptz[]) AS u (id, e)
               GROUP BY id) m
         WHERE b.id = m.id",
        &ids,
        &ends
    )
    .execute(&mut **tx)
    .await?;
    Ok(inserted)
}

/// Keeps the minute rows' monthly partitions: this month's and the next
/// two made ahead, and those older than `keep_months` months (the current
/// one counts) dropped whole; 0 keeps every month. The daily rollups stay.
/// Returns how many partitions were dropped.
pub async fn maintain(db: &PgPool, keep_months: i32) -> sqlx::Result<i32> {
    sqlx::query_scalar!(
        r#"SELECT gpuslice_usage_month(((now() AT TIME ZONE 'UTC') + make_interval(months => k))::date) AS "name!"
         FROM generate_series(0, 2) k"#
    )
    .fetch_all(db)
    .await?;
    if keep_months <= 0 {
        return Ok(0);
    }
    Ok(
        sqlx::query_scalar!("SELECT gpuslice_usage_retain($1)", keep_months)
            .fetch_one(db)
            .await?
            .unwrap_or(0),
    )
}

/// A tariff as stored.
#[derive(Debug, Clone)]
pub struct Tariff {
    pub id: i64,
    pub model: String,
    pub kind: String,
    /// Decimal text, as stored (NUMERIC(12,4)).
    pub price: String,
    pub effective_from: Date,
}

pub async fn tariffs(db: impl PgExecutor<'_>) -> sqlx::Result<Vec<Tariff>> {
    sqlx::query_as!(
        Tariff,
        r#"SELECT id, model, kind, price_per_slice_hour::text AS "price!", effective_from
           FROM tariffs ORDER BY model, kind, effective_from DESC"#
    )
    .fetch_all(db)
    .await
}

/// Adds (or replaces, for the same model, kind and date) a tariff.
pub async fn set_tariff(
    db: impl PgExecutor<'_>,
    model: &str,
    kind: &str,
    price: &str,
    effective_from: Date,
) -> sqlx::Result<i64> {
    sqlx::query_scalar!(
        "INSERT INTO tariffs (model, kind, price_per_slice_hour, effective_from)
         VALUES ($1, $2, $3::text::numeric, $4)
         ON CONFLICT (model, kind, effective_from)
         DO UPDATE SET price_per_slice_hour = EXCLUDED.price_per_slice_hour
         RETURNING id",
        model,
        kind,
        price,
        effective_from
    )
    .fetch_one(db)
    .await
}

pub async fn delete_tariff(db: impl PgExecutor<'_>, id: i64) -> sqlx::Result<bool> {
    let r = sqlx::query!("DELETE FROM tariffs WHERE id = $1", id)
        .execute(db)
        .await?;
    Ok(r.rows_affected() == 1)
}

/// One row of the finance export: one booking on one day (UTC).
#[derive(Debug, Clone, serde::Serialize)]
pub struct DayRow {
    pub day: Date,
    pub tenant_slug: String,
    pub tenant_name: String,
    pub user_email: String,
    pub booking_id: i64,
    pub kind: String,
    pub model: String,
    /// The MIG profile, or `12 GiB share`.
    pub what: String,
    pub slice_seconds: f64,
    pub gib_seconds: f64,
    /// Cost rounded to cents, by the tariff in force on that day; `None`
    /// when no tariff covers it.
    pub cost: Option<f64>,
}

/// Streams the export rows of `[from, to]` (dates, UTC), one tenant or all,
/// ordered by day, tenant and booking. Rows come from the database as the
/// response goes out: memory stays flat however long the period.
pub fn day_rows<'a>(
    pool: &'a PgPool,
    from: Date,
    to: Date,
    tenant_id: Option<i64>,
    user_id: Option<i64>,
) -> BoxStream<'a, sqlx::Result<DayRow>> {
    sqlx::query_as!(
        DayRow,
        r#"WITH days AS (
               SELECT r.booking_id, r.day, r.slice_seconds, r.gib_seconds
               FROM usage_daily r WHERE r.day BETWEEN $1::date AND $2::date
           )
           SELECT d.day AS "day!", t.slug AS tenant_slug, t.name AS tenant_name,
                  us.email AS user_email, b.id AS booking_id, b.kind,
                  COALESCE(b.model, '') AS "model!",
                  COALESCE(b.profile, b.memory_gib || ' GiB share') AS "what!",
                  d.slice_seconds AS "slice_seconds!", d.gib_seconds AS "gib_seconds!",
                  round(d.slice_seconds::numeric / 3600 * tf.price, 2)::float8 AS cost
           FROM days d
           JOIN bookings b ON b.id = d.booking_id
           JOIN tenants t ON t.id = b.tenant_id
           JOIN users us ON us.id = b.user_id
           LEFT JOIN LATERAL (
               SELECT price_per_slice_hour AS price FROM tariffs
               WHERE model = b.model AND kind = b.kind AND effective_from <= d.day
               ORDER BY effective_from DESC LIMIT 1
           ) tf ON TRUE
           WHERE ($3::bigint IS NULL OR b.tenant_id = $3) AND ($4::bigint IS NULL OR b.user_id = $4)
           ORDER BY d.day, t.slug, b.id"#,
        from,
        to,
        tenant_id,
        user_id
    )
    .fetch(pool)
}

/// One page of the usage page's drill-down: the booking-days of
/// `[from, to]` (one tenant's, one person's, or all), newest day first,
/// before (`before_day`, `before_id`) in that order, at most `limit`.
/// Covered by `usage_daily_day_idx` (day, booking_id), read backwards.
#[allow(clippy::too_many_arguments)]
pub async fn day_rows_page(
    db: impl PgExecutor<'_>,
    from: Date,
    to: Date,
    tenant_id: Option<i64>,
    user_id: Option<i64>,
    before_day: Date,
    before_id: i64,
    limit: i64,
) -> sqlx::Result<Vec<DayRow>> {
    sqlx::query_as!(
        DayRow,
        r#"SELECT d.day AS "day!", t.slug AS tenant_slug, t.name AS tenant_name,
                  us.email AS user_email, b.id AS booking_id, b.kind,
                  COALESCE(b.model, '') AS "model!",
                  COALESCE(b.profile, b.memory_gib || ' GiB share') AS "what!",
                  d.slice_seconds AS "slice_seconds!", d.gib_seconds AS "gib_seconds!",
                  NULL::float8 AS cost
           FROM usage_daily d
           JOIN bookings b ON b.id = d.booking_id
           JOIN tenants t ON t.id = b.tenant_id
           JOIN users us ON us.id = b.user_id
           WHERE d.day BETWEEN $1::date AND $2::date AND (d.day, d.booking_id) < ($5::date, $6::bigint)
             AND ($3::bigint IS NULL OR b.tenant_id = $3) AND ($4::bigint IS NULL OR b.user_id = $4)
           ORDER BY d.day DESC, d.booking_id DESC
           LIMIT $7"#,
        from,
        to,
        tenant_id,
        user_id,
        before_day,
        before_id,
        limit
    )
    .fetch_all(db)
    .await
}

/// Totals of a period by tenant, model and profile (or share), summed from
/// the same rounded rows as the export, so the two always agree: the
/// period's whole past months from their cached totals (migration
/// `usage_month_totals`), the rest from the daily rollup.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Total {
    pub tenant_slug: String,
    pub tenant_name: String,
    pub model: String,
    pub what: String,
    pub bookings: i64,
    pub slice_hours: f64,
    pub gib_hours: f64,
    pub cost: f64,
    /// Rows without a tariff (their cost counts as 0).
    pub unpriced_rows: i64,
}

pub async fn totals(
    pool: &PgPool,
    from: Date,
    to: Date,
    tenant_id: Option<i64>,
) -> sqlx::Result<Vec<Total>> {
    // Whole months of the period that have ended: their totals are cached.
    let this_month = OffsetDateTime::now_utc()
        .date()
        .replace_day(1)
        .unwrap_or(from);
    let months = whole_months(from, to, this_month);
    for m in &months {
        // The cache only saves time: a month it could not fill is read
        // from the daily rollup below.
        if let Err(e) = ensure_month(pool, *m).await {
            tracing::warn!(month = %m, error = %e, "usage month totals not cached");
        }
    }
    // One snapshot for the cached months' validity and the rest's rows.
    let mut tx = pool.begin().await?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let valid = sqlx::query_scalar!(
        r#"SELECT month AS "month!" FROM usage_month_current WHERE month = ANY($1)"#,
        &months
    )
    .fetch_all(&mut *tx)
    .await?;
    let (lo, hi) = uncovered(from, to, &valid);
    let rows = sqlx::query_as!(
        Total,
        r#"WITH parts AS (
               SELECT m.tenant_id, m.model, m.what, m.slice_seconds, m.gib_seconds, m.cost,
                      m.unpriced_rows, m.bookings
               FROM usage_month_totals m
               WHERE m.month = ANY($1) AND ($4::bigint IS NULL OR m.tenant_id = $4)
               UNION ALL
               SELECT g.tenant_id, g.model, g.what, g.slice_seconds, g.gib_seconds, g.cost,
                      g.unpriced_rows, g.bookings
               FROM unnest($2::date[], $3::date[]) r(lo, hi),
                    gpuslice_usage_groups(r.lo, r.hi, $4::bigint) g
           ), sums AS (
               SELECT tenant_id, model, what, sum(slice_seconds) AS s, sum(gib_seconds) AS g,
                      sum(cost) AS c, sum(unpriced_rows) AS u
               FROM parts GROUP BY 1, 2, 3
           ), counts AS (
               SELECT p.tenant_id, p.model, p.what, count(DISTINCT id) AS n
               FROM parts p, unnest(p.bookings) id GROUP BY 1, 2, 3
           )
           SELECT t.slug AS tenant_slug, t.name AS tenant_name, s.model AS "model!", s.what AS "what!",
                  n.n AS "bookings!", s.s / 3600 AS "slice_hours!", s.g / 3600 AS "gib_hours!",
                  s.c::float8 AS "cost!", s.u::bigint AS "unpriced_rows!"
           FROM sums s JOIN counts n USING (tenant_id, model, what)
           JOIN tenants t ON t.id = s.tenant_id
           ORDER BY t.slug, s.model, s.what"#,
        &valid,
        &lo,
        &hi,
        tenant_id
    )
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(rows)
}

/// The first days of the months wholly inside `[from, to]` that ended
/// before `this_month`.
fn whole_months(from: Date, to: Date, this_month: Date) -> Vec<Date> {
    let mut out = Vec::new();
    let mut m = from.replace_day(1).unwrap_or(from);
    if m < from {
        m = next_month(m);
    }
    while m < this_month && next_month(m) <= to.next_day().unwrap_or(to) {
        out.push(m);
        m = next_month(m);
    }
    out
}

fn next_month(m: Date) -> Date {
    let (y, mo) = match m.month() {
        time::Month::December => (m.year() + 1, time::Month::January),
        other => (m.year(), other.next()),
    };
    Date::from_calendar_date(y, mo, 1).unwrap_or(m)
}

/// The stretches of `[from, to]` (inclusive days) outside the months
/// `covered` (sorted or not): `(starts, ends)`.
fn uncovered(from: Date, to: Date, covered: &[Date]) -> (Vec<Date>, Vec<Date>) {
    let mut covered = covered.to_vec();
    covered.sort();
    let (mut lo, mut hi) = (Vec::new(), Vec::new());
    let mut at = from;
    for m in covered {
        if m > at {
            lo.push(at);
            hi.push(m.previous_day().unwrap_or(m));
        }
        at = next_month(m).max(at);
    }
    if at <= to {
        lo.push(at);
        hi.push(to);
    }
    (lo, hi)
}

/// Makes month `m`'s cached totals current (in one snapshot with the
/// version and epoch they reflect), unless they are. Another reader
/// filling the same month at the same time makes this one give way
/// (serialization failure or duplicate key): theirs serves as well, and a
/// month whose cache is not current is read from the daily rollup.
async fn ensure_month(pool: &PgPool, m: Date) -> sqlx::Result<()> {
    match fill_month(pool, m).await {
        Err(sqlx::Error::Database(e))
            if matches!(e.code().as_deref(), Some("40001") | Some("23505")) =>
        {
            Ok(())
        }
        other => other,
    }
}

async fn fill_month(pool: &PgPool, m: Date) -> sqlx::Result<()> {
    let mut tx = pool.begin().await?;
    sqlx::query!("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        .execute(&mut *tx)
        .await?;
    let current = sqlx::query!(
        r#"SELECT COALESCE((SELECT version FROM usage_month_versions WHERE month = $1), 0) AS "version!",
                  (SELECT version FROM usage_totals_epoch) AS "epoch!",
                  EXISTS (SELECT 1 FROM usage_month_current WHERE month = $1) AS "fresh!""#,
        m
    )
    .fetch_one(&mut *tx)
    .await?;
    if current.fresh {
        return Ok(());
    }
    sqlx::query!("DELETE FROM usage_month_totals WHERE month = $1", m)
        .execute(&mut *tx)
        .await?;
    sqlx::query!(
        r#"INSERT INTO usage_month_totals (month, tenant_id, model, what, slice_seconds, gib_seconds, cost,
                                           unpriced_rows, bookings)
           SELECT $1, g.* FROM gpuslice_usage_groups($1::date, ($1::date + interval '1 month' - interval '1 day')::date, NULL) g"#,
        m
    )
    .execute(&mut *tx)
    .await?;
    sqlx::query!(
        "INSERT INTO usage_month_cached (month, version, epoch) VALUES ($1, $2, $3)
         ON CONFLICT (month) DO UPDATE SET version = EXCLUDED.version, epoch = EXCLUDED.epoch",
        m,
        current.version,
        current.epoch
    )
    .execute(&mut *tx)
    .await?;
    tx.commit().await
}

/// Usage by day (UTC) for charts: (day, model, what, slice-hours).
pub async fn by_day(
    db: impl PgExecutor<'_>,
    from: Date,
    to: Date,
    tenant_id: Option<i64>,
    user_id: Option<i64>,
) -> sqlx::Result<Vec<(Date, String, String, f64)>> {
    let rows = sqlx::query!(
        r#"SELECT r.day AS "day!",
                  COALESCE(b.model, '') AS "model!",
                  COALESCE(b.profile, b.memory_gib || ' GiB share') AS "what!",
                  sum(r.slice_seconds) / 3600 AS "slice_hours!"
           FROM usage_daily r JOIN bookings b ON b.id = r.booking_id
           WHERE r.day BETWEEN $1::date AND $2::date
             AND ($3::bigint IS NULL OR b.tenant_id = $3) AND ($4::bigint IS NULL OR b.user_id = $4)
           GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"#,
        from,
        to,
        tenant_id,
        user_id
    )
    .fetch_all(db)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| (r.day, r.model, r.what, r.slice_hours))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::date;

    #[test]
    fn whole_months_are_those_inside_the_period_that_ended() {
        let now = date!(2026 - 12 - 01);
        assert_eq!(
            whole_months(date!(2026 - 01 - 01), date!(2026 - 03 - 31), now),
            vec![
                date!(2026 - 01 - 01),
                date!(2026 - 02 - 01),
                date!(2026 - 03 - 01)
            ]
        );
        assert_eq!(
            whole_months(date!(2026 - 01 - 02), date!(2026 - 03 - 30), now),
            vec![date!(2026 - 02 - 01)]
        );
        assert!(
            whole_months(date!(2026 - 11 - 01), date!(2026 - 12 - 31), now)
                .eq(&[date!(2026 - 11 - 01)])
        );
        assert!(whole_months(date!(2026 - 02 - 03), date!(2026 - 02 - 20), now).is_empty());
        assert_eq!(
            whole_months(date!(2025 - 12 - 01), date!(2026 - 01 - 31), now),
            vec![date!(2025 - 12 - 01), date!(2026 - 01 - 01)]
        );
    }

    #[test]
    fn uncovered_is_the_period_less_the_covered_months() {
        let (lo, hi) = uncovered(
            date!(2026 - 01 - 15),
            date!(2026 - 05 - 10),
            &[date!(2026 - 03 - 01), date!(2026 - 02 - 01)],
        );
        assert_eq!(lo, vec![date!(2026 - 01 - 15), date!(2026 - 04 - 01)]);
        assert_eq!(hi, vec![date!(2026 - 01 - 31), date!(2026 - 05 - 10)]);
        let (lo, hi) = uncovered(
            date!(2026 - 01 - 01),
            date!(2026 - 01 - 31),
            &[date!(2026 - 01 - 01)],
        );
        assert!(lo.is_empty() && hi.is_empty());
        let (lo, hi) = uncovered(
            date!(2026 - 01 - 01),
            date!(2026 - 03 - 31),
            &[date!(2026 - 02 - 01)],
        );
        assert_eq!(lo, vec![date!(2026 - 01 - 01), date!(2026 - 03 - 01)]);
        assert_eq!(hi, vec![date!(2026 - 01 - 31), date!(2026 - 03 - 31)]);
    }
}
