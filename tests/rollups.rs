//! Usage rollups and partitions (issue 18): the daily rollup every report
//! reads stays exactly the sum of the minute rows through the metering
//! path (re-metering counts nothing twice, rows across midnight go to their
//! own day), reports read it, the minute rows live in monthly partitions
//! made ahead, and old months leave whole while their rollups (and so the
//! reports) stay.

mod common;

use common::TestApp;
use gpuslice::domain::usage::UsageRow;

async fn setup() -> (TestApp, i64) {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let id: i64 = sqlx::query_scalar(
        "INSERT INTO bookings (tenant_id, user_id, kind, model, profile, memory_gib, compute_slices, priority,
                               hours, during, status)
         SELECT t.id, u.id, 'mig', 'H100-80GB', '1g.10gb', 10, 1, 'normal', 24,
                tstzrange('2024-01-01', '2027-01-01'), 'failed'
         FROM tenants t, users u WHERE t.slug = 'lab' AND u.email = 'ana@uni.edu' RETURNING id",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    (app, id)
}

fn row(booking: i64, start: &str, slice_seconds: f64) -> UsageRow {
    let t = time::OffsetDateTime::parse(start, &time::format_description::well_known::Rfc3339)
        .unwrap()
        .unix_timestamp();
    UsageRow {
        booking_id: booking,
        start: t,
        end: t + 60,
        slice_seconds,
        gib_seconds: slice_seconds * 10.0,
        utilization_pct: None,
        memory_used_mib: None,
    }
}

async fn record(app: &TestApp, rows: &[UsageRow]) -> u64 {
    let mut tx = app.pool.begin().await.unwrap();
    let n = gpuslice::db::usage::record(&mut tx, rows).await.unwrap();
    tx.commit().await.unwrap();
    n
}

/// (day, slice_seconds) of the rollup, and the same summed from the minute
/// rows, by an independent query.
async fn both(app: &TestApp) -> (Vec<(String, f64)>, Vec<(String, f64)>) {
    let rolled = sqlx::query_as("SELECT day::text, slice_seconds FROM usage_daily ORDER BY day")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    let summed = sqlx::query_as(
        "SELECT (interval_start AT TIME ZONE 'UTC')::date::text, sum(slice_seconds)
         FROM usage GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    (rolled, summed)
}

#[tokio::test]
async fn the_rollup_is_the_sum_of_the_rows_through_the_metering_path() {
    let (app, b) = setup().await;
    let first = [
        row(b, "2026-12-01T23:58:00Z", 60.0),
        row(b, "2026-12-01T23:59:00Z", 60.0),
        row(b, "2026-12-02T00:00:00Z", 30.0),
    ];
    assert_eq!(record(&app, &first).await, 3);
    // Metered again (a worker retrying after a crash): nothing counts twice;
    // with one new row, only that one.
    assert_eq!(record(&app, &first).await, 0);
    let mut again = first.to_vec();
    again.push(row(b, "2026-12-02T00:01:00Z", 15.0));
    assert_eq!(record(&app, &again).await, 1);
    let (rolled, summed) = both(&app).await;
    assert_eq!(rolled, summed);
    assert_eq!(
        rolled,
        vec![("2026-12-01".into(), 120.0), ("2026-12-02".into(), 45.0)]
    );

    // The reports read the rollup: the export's rows and totals agree.
    let day = |s: &str| {
        time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]")).unwrap()
    };
    let totals = gpuslice::db::usage::totals(&app.pool, day("2026-12-01"), day("2026-12-31"), None)
        .await
        .unwrap();
    assert_eq!(totals.len(), 1);
    assert!(
        (totals[0].slice_hours - 165.0 / 3600.0).abs() < 1e-9,
        "{totals:?}"
    );
    use futures_util::StreamExt;
    let rows: Vec<_> =
        gpuslice::db::usage::day_rows(&app.pool, day("2026-12-02"), day("2026-12-02"), None, None)
            .collect()
            .await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].as_ref().unwrap().slice_seconds, 45.0);
}

#[tokio::test]
async fn old_months_leave_as_partitions_and_their_rollups_stay() {
    let (app, b) = setup().await;
    // Partitions ahead: this month and the next two.
    gpuslice::db::usage::maintain(&app.pool, 13).await.unwrap();
    let ahead: i64 = app
        .one("SELECT count(*) FROM pg_inherits WHERE inhparent = 'usage'::regclass AND inhrelid::regclass::text ~ '^usage_y'")
        .await;
    assert_eq!(ahead, 3, "this month and the next two");
    // Two years ago: its rows wait in the default partition until their
    // month's partition is made, which takes them in.
    record(
        &app,
        &[
            row(b, "2024-11-15T10:00:00Z", 60.0),
            row(b, "2024-11-15T10:01:00Z", 60.0),
        ],
    )
    .await;
    let waiting: i64 = app.one("SELECT count(*) FROM usage_default").await;
    assert_eq!(waiting, 2);
    let made: String = app.one("SELECT gpuslice_usage_month('2024-11-01')").await;
    assert_eq!(made, "usage_y2024m11");
    let waiting: i64 = app.one("SELECT count(*) FROM usage_default").await;
    assert_eq!(waiting, 0);
    let moved: i64 = app.one("SELECT count(*) FROM usage_y2024m11").await;
    assert_eq!(moved, 2);
    let (rolled, summed) = both(&app).await;
    assert_eq!(rolled, summed, "moving rows does not count them again");

    // Past the retention the month is dropped whole; its rollup stays.
    let dropped = gpuslice::db::usage::maintain(&app.pool, 13).await.unwrap();
    assert_eq!(dropped, 1);
    let gone: Option<String> = app.one("SELECT to_regclass('usage_y2024m11')::text").await;
    assert_eq!(gone, None);
    let rows: i64 = app
        .one("SELECT count(*) FROM usage WHERE interval_start < '2025-01-01'")
        .await;
    assert_eq!(rows, 0);
    let kept: f64 = app
        .one("SELECT slice_seconds FROM usage_daily WHERE day = '2024-11-15'")
        .await;
    assert_eq!(kept, 120.0);
    // 0 keeps every month.
    assert_eq!(
        gpuslice::db::usage::maintain(&app.pool, 0).await.unwrap(),
        0
    );
}

/// The totals as computed before the month cache: every booking-day of the
/// period, priced per day (the reference the cached totals must equal).
async fn direct_totals(
    app: &TestApp,
    from: &str,
    to: &str,
) -> Vec<(String, String, String, i64, f64, f64, i64)> {
    sqlx::query_as(
        "WITH priced AS (
             SELECT b.tenant_id, COALESCE(b.model, '') AS model,
                    COALESCE(b.profile, b.memory_gib || ' GiB share') AS what, b.id AS booking_id,
                    d.slice_seconds, round(d.slice_seconds::numeric / 3600 * tf.price, 2) AS cost
             FROM usage_daily d JOIN bookings b ON b.id = d.booking_id
             LEFT JOIN LATERAL (
                 SELECT price_per_slice_hour AS price FROM tariffs
                 WHERE model = b.model AND kind = b.kind AND effective_from <= d.day
                 ORDER BY effective_from DESC LIMIT 1
             ) tf ON TRUE
             WHERE d.day BETWEEN $1::date AND $2::date
         )
         SELECT t.slug, p.model, p.what, count(DISTINCT p.booking_id), sum(p.slice_seconds) / 3600,
                COALESCE(sum(p.cost), 0)::float8, count(*) FILTER (WHERE p.cost IS NULL)
         FROM priced p JOIN tenants t ON t.id = p.tenant_id
         GROUP BY t.slug, p.model, p.what ORDER BY 1, 2, 3",
    )
    .bind(from)
    .bind(to)
    .fetch_all(&app.pool)
    .await
    .unwrap()
}

async fn cached_totals(
    app: &TestApp,
    from: &str,
    to: &str,
) -> Vec<(String, String, String, i64, f64, f64, i64)> {
    let day = |s: &str| {
        time::Date::parse(s, time::macros::format_description!("[year]-[month]-[day]")).unwrap()
    };
    gpuslice::db::usage::totals(&app.pool, day(from), day(to), None)
        .await
        .unwrap()
        .into_iter()
        .map(|t| {
            (
                t.tenant_slug,
                t.model,
                t.what,
                t.bookings,
                t.slice_hours,
                t.cost,
                t.unpriced_rows,
            )
        })
        .collect()
}

/// Equal but for floating-point summation order in the slice-hours.
fn assert_same(
    a: &[(String, String, String, i64, f64, f64, i64)],
    b: &[(String, String, String, i64, f64, f64, i64)],
    what: &str,
) {
    assert_eq!(a.len(), b.len(), "{what}: {a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert_eq!(
            (&x.0, &x.1, &x.2, x.3, x.6),
            (&y.0, &y.1, &y.2, y.3, y.6),
            "{what}"
        );
        assert!((x.4 - y.4).abs() < 1e-6, "{what}: {x:?} vs {y:?}");
        assert!((x.5 - y.5).abs() < 0.005, "{what}: cost {x:?} vs {y:?}");
    }
}

#[tokio::test]
async fn month_totals_are_cached_and_always_equal_the_daily_rollup() {
    let (app, b) = setup().await;
    // A second booking of another profile that crosses a month's end, and
    // usage over 2025 on both, some days without a tariff.
    let b2: i64 = sqlx::query_scalar(
        "INSERT INTO bookings (tenant_id, user_id, kind, model, profile, memory_gib, compute_slices, priority,
                               hours, during, status, metered_until)
         SELECT tenant_id, user_id, kind, model, '3g.40gb', 40, 3, priority, hours, during, status, now()
         FROM bookings WHERE id = $1 RETURNING id",
    )
    .bind(b)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE bookings SET metered_until = now() WHERE id = $1")
        .bind(b)
        .execute(&app.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds)
         SELECT CASE WHEN d % 3 = 0 THEN $2 ELSE $1 END,
                timestamptz '2025-01-01 08:00+00' + d * interval '1 day' + m * interval '7 minutes',
                timestamptz '2025-01-01 08:01+00' + d * interval '1 day' + m * interval '7 minutes',
                37.5 + d % 5, 375
         FROM generate_series(0, 364) d, generate_series(0, 3) m",
    )
    .bind(b)
    .bind(b2)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tariffs (model, kind, price_per_slice_hour, effective_from)
         VALUES ('H100-80GB', 'mig', 0.3333, '2025-03-10'), ('H100-80GB', 'mig', 0.25, '2025-08-01')",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let periods = [
        ("2025-01-01", "2025-12-31"),
        ("2025-02-14", "2025-11-03"),
        ("2025-03-01", "2025-03-31"),
        ("2025-03-05", "2025-03-20"),
        ("2024-12-01", "2026-01-31"),
    ];
    for (from, to) in periods {
        assert_same(
            &cached_totals(&app, from, to).await,
            &direct_totals(&app, from, to).await,
            &format!("{from}..{to}, first read"),
        );
    }
    let cached: i64 = app.one("SELECT count(*) FROM usage_month_cached").await;
    assert_eq!(cached, 14, "every whole past month read is cached");
    for (from, to) in periods {
        assert_same(
            &cached_totals(&app, from, to).await,
            &direct_totals(&app, from, to).await,
            &format!("{from}..{to}, from the cache"),
        );
    }
    // Late metering into a cached month, a tariff change, a correction by
    // hand (also one inserted into the rollup directly): each makes the
    // cache stale, and the year's totals stay right.
    record(&app, &[row(b, "2025-06-15T12:00:00Z", 600.0)]).await;
    let year = || async {
        (
            cached_totals(&app, "2025-01-01", "2025-12-31").await,
            direct_totals(&app, "2025-01-01", "2025-12-31").await,
        )
    };
    let (cached, direct) = year().await;
    assert_same(&cached, &direct, "after late metering");
    for (what, sql) in [
        ("a tariff change", "UPDATE tariffs SET price_per_slice_hour = 0.5 WHERE effective_from = '2025-08-01'"),
        ("a correction by hand", "UPDATE usage_daily SET slice_seconds = slice_seconds + 3600 WHERE day = '2025-09-09'"),
        ("a day added by hand", "INSERT INTO usage_daily (booking_id, day, slice_seconds, gib_seconds) SELECT id, '2025-10-31', 7200, 0 FROM bookings WHERE profile = '3g.40gb' ON CONFLICT DO NOTHING"),
    ] {
        sqlx::query(sql).execute(&app.pool).await.unwrap();
        let (cached, direct) = year().await;
        assert_same(&cached, &direct, &format!("after {what}"));
    }
    let stale: i64 = app
        .one(
            "SELECT count(*) FROM usage_month_cached c LEFT JOIN usage_month_versions v USING (month)
             WHERE c.month BETWEEN '2025-01-01' AND '2025-12-01'
               AND (c.version <> COALESCE(v.version, 0) OR c.epoch <> (SELECT version FROM usage_totals_epoch))",
        )
        .await;
    assert_eq!(stale, 0, "the year's read brought every month up to date");
}
