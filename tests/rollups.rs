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
