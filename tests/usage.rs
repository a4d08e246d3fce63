//! Metering, tariffs, usage and the finance export: no gap or double
//! interval across worker restarts and a database outage, the tariff in
//! force per day, CSV shape and formula guards, role checks.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::TestApp;
use gpuslice::gpu::sim::SimBackend;
use gpuslice::gpu::GpuBackend;
use gpuslice::worker::meter::{Meter, Settings};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{ConnectOptions, PgPool};
use time::OffsetDateTime;

const FLEET: &str = "[[node]]\nname = \"n1\"\n[[node.gpu]]\nmodel = \"H100-80GB\"\nmode = \"mig\"\ncount = 1\n[[node.gpu]]\nmodel = \"L40S-48GB\"\nmode = \"timeslice\"\ncount = 1\n";

async fn setup() -> (TestApp, Arc<SimBackend>, String) {
    let app = TestApp::spawn().await;
    let node = common::SimNode::register(&app, FLEET, "n1", 4)
        .await
        .backend;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    (app, node, token)
}

async fn book_active(
    app: &TestApp,
    node: &Arc<SimBackend>,
    token: &str,
    body: serde_json::Value,
) -> i64 {
    let r = reqwest::Client::new()
        .post(app.url("/api/v1/bookings"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let id = r.json::<serde_json::Value>().await.unwrap()["id"]
        .as_i64()
        .unwrap();
    let b: Arc<dyn GpuBackend> = node.clone();
    gpuslice::worker::bookings::step(&app.pool, "n1", "t", b, &Default::default())
        .await
        .unwrap();
    id
}

/// A pool that gives up quickly, as a worker's would during an outage.
async fn worker_pool(app: &TestApp) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(app.options.clone().database(&app.db_name))
        .await
        .unwrap()
}

/// Takes the test's database away (and gives it back): a real outage for
/// everything connected to it, the rest of the cluster untouched.
async fn outage(app: &TestApp, down: bool) {
    let mut admin = app
        .options
        .clone()
        .database("postgres")
        .connect()
        .await
        .unwrap();
    let name = &app.db_name;
    sqlx::query(&format!(
        "ALTER DATABASE \"{name}\" ALLOW_CONNECTIONS {}",
        !down
    ))
    .execute(&mut admin)
    .await
    .unwrap();
    if down {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(name)
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

fn at(t: OffsetDateTime, mins: i64) -> OffsetDateTime {
    t + time::Duration::minutes(mins)
}

#[tokio::test]
async fn metering_has_no_gap_nor_double_across_restarts_and_an_outage() {
    let (app, node, token) = setup().await;
    let id = book_active(
        &app,
        &node,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "2g.20gb", "hours": 1}),
    )
    .await;
    // Let the booking have started 30 minutes ago.
    let t0: OffsetDateTime = sqlx::query_scalar(
        "UPDATE bookings SET during = tstzrange(date_trunc('second', now()) - interval '30 minutes',
                                                 date_trunc('second', now()) + interval '30 minutes')
         WHERE id = $1 RETURNING lower(during)",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    let spool = std::env::temp_dir().join(format!("gpuslice-spool-{}", app.db_name));
    let _ = std::fs::remove_dir_all(&spool);
    let backend: Arc<dyn GpuBackend> = node.clone();
    // A spool of 3 rows: the outage below fills it, which raises an alert.
    let settings = Settings {
        interval_secs: 60,
        spool_max_rows: 3,
        ..Default::default()
    };
    let wpool = worker_pool(&app).await;

    let mut m = Meter::new("n1", &spool, settings.clone()).unwrap();
    let p = m.pass(&wpool, &backend, at(t0, 10)).await.unwrap();
    assert_eq!(p.written, 10);
    // A restarted worker meters nothing twice.
    let mut m = Meter::new("n1", &spool, settings.clone()).unwrap();
    assert_eq!(
        m.pass(&wpool, &backend, at(t0, 10)).await.unwrap().written,
        0
    );

    // PostgreSQL goes away: three intervals wait in the spool on disk.
    outage(&app, true).await;
    let p = m.pass(&wpool, &backend, at(t0, 13)).await.unwrap();
    assert_eq!(p.spooled, 3);
    assert_eq!(m.spooled(), 3);
    outage(&app, false).await;
    // And a restart before it is written: the new worker finds the spool.
    drop(m);
    let mut m = Meter::new("n1", &spool, settings.clone()).unwrap();
    assert_eq!(m.spooled(), 3);
    let p = m.pass(&wpool, &backend, at(t0, 15)).await.unwrap();
    assert_eq!((p.flushed, p.written), (3, 2));
    assert_eq!(m.spooled(), 0);
    // The outage is an alert of the metering_spool_full rule, on record
    // after the fact (raised and resolved as the spool drains).
    let (alert, state): (String, String) = sqlx::query_as(
        "SELECT message, state FROM alerts WHERE rule = 'metering_spool_full' AND node = 'n1'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(alert.contains("reached 100 % of its 3 rows"), "{alert}");
    assert_eq!(state, "resolved");

    // Released now (about 30 minutes in): the last interval ends exactly there.
    let r = reqwest::Client::new()
        .post(app.url(&format!("/api/v1/bookings/{id}/release")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    m.pass(
        &wpool,
        &backend,
        OffsetDateTime::now_utc() + time::Duration::seconds(1),
    )
    .await
    .unwrap();
    let rows: Vec<(OffsetDateTime, OffsetDateTime, f64, f64)> = sqlx::query_as(
        "SELECT interval_start, interval_end, slice_seconds, gib_seconds FROM usage
         WHERE booking_id = $1 ORDER BY interval_start",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    let (start, end): (OffsetDateTime, OffsetDateTime) =
        sqlx::query_as("SELECT lower(during), upper(during) FROM bookings WHERE id = $1")
            .bind(id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(rows.first().unwrap().0, start);
    assert_eq!(
        rows.last().unwrap().1.unix_timestamp(),
        end.unix_timestamp()
    );
    for w in rows.windows(2) {
        assert_eq!(w[0].1, w[1].0, "a gap or an overlap");
    }
    let seconds: f64 = rows.iter().map(|r| (r.1 - r.0).as_seconds_f64()).sum();
    assert!((seconds - (end - start).as_seconds_f64()).abs() < 1.0);
    // 2g.20gb: two slices, 20 GiB.
    let slice_seconds: f64 = rows.iter().map(|r| r.2).sum();
    assert!(
        (slice_seconds - 2.0 * seconds).abs() < 2.0,
        "{slice_seconds} vs {seconds}"
    );
    assert!(rows.iter().all(|r| (r.3 / r.2 - 10.0).abs() < 1e-9));
    // Metering again after the end adds nothing.
    let p = m.pass(&wpool, &backend, at(end, 60)).await.unwrap();
    assert_eq!(p.written, 0);
    let _ = std::fs::remove_dir_all(&spool);
}

/// Inserts usage for a booking: one row per (day offset, hours) at noon UTC.
async fn usage_on(app: &TestApp, booking: i64, day: &str, slice_hours: f64) {
    sqlx::query(
        "INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds)
         VALUES ($1, ($2::date + time '12:00') AT TIME ZONE 'UTC',
                 ($2::date + time '12:00') AT TIME ZONE 'UTC' + interval '1 minute', $3, $3 * 10)",
    )
    .bind(booking)
    .bind(day)
    .bind(slice_hours * 3600.0)
    .execute(&app.pool)
    .await
    .unwrap();
}

/// A minimal RFC 4180 reader for the tests.
fn parse_csv(text: &str) -> Vec<Vec<String>> {
    let mut rows = Vec::new();
    let mut row = Vec::new();
    let mut cell = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                cell.push('"');
                chars.next();
            }
            (true, '"') => quoted = false,
            (true, c) => cell.push(c),
            (false, '"') => quoted = true,
            (false, ',') => row.push(std::mem::take(&mut cell)),
            (false, '\r') => {}
            (false, '\n') => {
                row.push(std::mem::take(&mut cell));
                rows.push(std::mem::take(&mut row));
            }
            (false, c) => cell.push(c),
        }
    }
    rows
}

#[tokio::test]
async fn the_export_prices_each_day_by_its_tariff_and_matches_the_report() {
    let (app, node, token) = setup().await;
    let id = book_active(
        &app,
        &node,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 1}),
    )
    .await;
    // A tenant name a spreadsheet would run as a formula, with a comma.
    sqlx::query("UPDATE tenants SET name = '=HYPERLINK(\"x\"), Lab' WHERE slug = 'lab'")
        .execute(&app.pool)
        .await
        .unwrap();
    usage_on(&app, id, "2026-11-10", 3.0).await;
    usage_on(&app, id, "2026-11-20", 2.0).await;
    app.user("fin@uni.edu", "finance", &[]).await;
    app.user("root@uni.edu", "admin", &[]).await;
    let root = app.signed_in("root@uni.edu").await;
    // Tariffs: 1.50 from Nov 1st, 2.00 from Nov 15th (set in the admin form).
    for (price, from) in [("1.5", "2026-11-01"), ("2", "2026-11-15")] {
        let r = app
            .post_form(
                &root,
                "/admin/tariffs",
                "/admin/tariffs",
                &[
                    ("model", "H100-80GB"),
                    ("kind", "mig"),
                    ("price", price),
                    ("effective_from", from),
                ],
            )
            .await;
        assert_eq!(r.status(), StatusCode::SEE_OTHER);
    }
    let r = app
        .post_form(
            &root,
            "/admin/tariffs",
            "/admin/tariffs",
            &[
                ("model", "H100-80GB"),
                ("kind", "mig"),
                ("price", "-1"),
                ("effective_from", "soon"),
            ],
        )
        .await;
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let body = r.text().await.unwrap();
    assert!(body.contains("give a price such as 0.25") && body.contains("YYYY-MM-DD"));
    assert_eq!(app.one::<i64>("SELECT count(*) FROM tariffs").await, 2);

    // Finance fetches the CSV with an API token.
    let fin = gpuslice::cli::token_create(&app.pool, "fin@uni.edu", "t")
        .await
        .unwrap();
    let r = reqwest::Client::new()
        .get(app.url("/reports/usage.csv?from=2026-11-01&to=2026-11-30"))
        .bearer_auth(&fin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["content-type"], "text/csv; charset=utf-8");
    let text = r.text().await.unwrap();
    assert!(text.contains("\r\n"), "CRLF line ends");
    let rows = parse_csv(&text);
    assert_eq!(
        rows[0].join(","),
        gpuslice::web::usage::CSV_HEADER.trim_end()
    );
    assert_eq!(rows.len(), 3, "{text}");
    let d1 = &rows[1];
    assert_eq!(d1[0], "2026-11-10");
    assert_eq!(d1[1], "lab");
    assert_eq!(
        d1[2], "'=HYPERLINK(\"x\"), Lab",
        "formula guarded, comma quoted"
    );
    assert_eq!(d1[3], "ana@uni.edu");
    assert_eq!(d1[4], id.to_string());
    assert_eq!(
        (d1[5].as_str(), d1[6].as_str(), d1[7].as_str()),
        ("mig", "H100-80GB", "1g.10gb")
    );
    assert_eq!((d1[8].as_str(), d1[9].as_str()), ("10800", "3.0000"));
    assert_eq!(
        (d1[11].as_str(), d1[12].as_str()),
        ("4.50", "EUR"),
        "1.50 x 3 slice-hours"
    );
    assert_eq!(rows[2][11], "4.00", "2.00 x 2 slice-hours after the change");

    // The report's totals are the sums of the rows.
    let fin_c = app.signed_in("fin@uni.edu").await;
    let page = fin_c
        .get(app.url("/reports?from=2026-11-01&to=2026-11-30"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains("8.50 EUR"), "{page}");
    assert!(page.contains(">5.00<"), "slice-hours");
    let totals = gpuslice::db::usage::totals(
        &app.pool,
        time::macros::date!(2026 - 11 - 01),
        time::macros::date!(2026 - 11 - 30),
        None,
    )
    .await
    .unwrap();
    let csv_cost: f64 = rows[1..]
        .iter()
        .map(|r| r[11].parse::<f64>().unwrap())
        .sum();
    let csv_hours: f64 = rows[1..].iter().map(|r| r[9].parse::<f64>().unwrap()).sum();
    assert!((totals.iter().map(|t| t.cost).sum::<f64>() - csv_cost).abs() < 1e-9);
    assert!((totals.iter().map(|t| t.slice_hours).sum::<f64>() - csv_hours).abs() < 1e-3);

    // Bad periods are refused with a sentence.
    let r = reqwest::Client::new()
        .get(app.url("/reports/usage.csv?from=2026-11-30&to=2026-11-01"))
        .bearer_auth(&fin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let r = reqwest::Client::new()
        .get(app.url("/reports/usage.csv?from=yesterday&to=2026-11-01"))
        .bearer_auth(&fin)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn only_finance_admins_and_the_tenants_managers_export() {
    let (app, node, token) = setup().await;
    let id = book_active(
        &app,
        &node,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "1g.10gb", "hours": 1}),
    )
    .await;
    usage_on(&app, id, "2026-11-10", 1.0).await;
    app.tenant("other").await;
    app.user("ta@uni.edu", "none", &["lab:manager"]).await;
    app.user("boss@uni.edu", "none", &["other:manager"]).await;
    app.user("fin@uni.edu", "finance", &[]).await;
    let csv = |q: &str| format!("/reports/usage.csv?from=2026-11-01&to=2026-11-30{q}");
    let cases = [
        ("ana@uni.edu", csv(""), StatusCode::FORBIDDEN),
        ("ana@uni.edu", csv("&tenant=lab"), StatusCode::FORBIDDEN),
        ("ta@uni.edu", csv(""), StatusCode::FORBIDDEN),
        ("ta@uni.edu", csv("&tenant=lab"), StatusCode::OK),
        ("boss@uni.edu", csv("&tenant=lab"), StatusCode::NOT_FOUND),
        ("fin@uni.edu", csv(""), StatusCode::OK),
        ("ana@uni.edu", "/reports".to_string(), StatusCode::FORBIDDEN),
        ("ta@uni.edu", "/reports".to_string(), StatusCode::FORBIDDEN),
        ("fin@uni.edu", "/reports".to_string(), StatusCode::OK),
        (
            "ana@uni.edu",
            "/usage?from=2026-11-01&to=2026-11-30".to_string(),
            StatusCode::OK,
        ),
        (
            "ana@uni.edu",
            "/usage?tenant=lab".to_string(),
            StatusCode::FORBIDDEN,
        ),
        (
            "ta@uni.edu",
            "/usage?tenant=lab&from=2026-11-01&to=2026-11-30&by=week".to_string(),
            StatusCode::OK,
        ),
        (
            "boss@uni.edu",
            "/usage?tenant=lab".to_string(),
            StatusCode::NOT_FOUND,
        ),
        (
            "ana@uni.edu",
            "/admin/tariffs".to_string(),
            StatusCode::FORBIDDEN,
        ),
    ];
    for (who, path, want) in cases {
        let c = app.signed_in(who).await;
        let r = c.get(app.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), want, "{who} GET {path}");
    }
    // The manager's export holds only their tenant; a member's usage page
    // shows their own usage with a link to the booking.
    let ta = app.signed_in("ta@uni.edu").await;
    let text = ta
        .get(app.url(&csv("&tenant=lab")))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(parse_csv(&text).len(), 2);
    let ana = app.signed_in("ana@uni.edu").await;
    let page = ana
        .get(app.url("/usage?from=2026-11-01&to=2026-11-30"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(page.contains(&format!("/bookings/{id}")));
    assert!(page.contains("<svg class=\"chart\""));
    // The JSON API gives the same rows.
    let v: serde_json::Value = reqwest::Client::new()
        .get(app.url("/api/v1/usage?from=2026-11-01&to=2026-11-30"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["usage"][0]["booking"], id);
    assert_eq!(v["usage"][0]["slice_hours"], 1.0);
}

#[tokio::test]
async fn the_dashboard_warns_at_80_percent_of_the_budget() {
    let (app, node, token) = setup().await;
    sqlx::query(
        "UPDATE tenants SET monthly_slice_hours = 10, max_gpu_memory_gib = 100 WHERE slug = 'lab'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    // 7 slices x 1 h booked + 2 used earlier = 9 of 10.
    let id = book_active(
        &app,
        &node,
        &token,
        json!({"tenant": "lab", "kind": "mig", "profile": "7g.80gb", "hours": 1}),
    )
    .await;
    let _ = id;
    sqlx::query(
        "INSERT INTO bookings (tenant_id, user_id, kind, profile, model, memory_gib, compute_slices, priority, hours, during, status, gpu_id, slices)
         SELECT tenant_id, user_id, 'mig', '1g.10gb', 'H100-80GB', 10, 1, 'normal', 2,
                tstzrange(date_trunc('month', now()), date_trunc('month', now()) + interval '2 hours'), 'expired',
                gpu_id, int4range(0, 1)
         FROM bookings WHERE id = $1",
    )
    .bind(id)
    .execute(&app.pool)
    .await
    .unwrap();
    let c = app.signed_in("ana@uni.edu").await;
    let page = c
        .get(app.url("/"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("has used or booked 90 % of its 10 slice-hours this month"),
        "{page}"
    );
}

#[tokio::test]
async fn a_share_is_metered_by_its_achieved_part_of_the_gpu() {
    let (app, node, token) = setup().await;
    // 12 GiB of a 48 GiB L40S: booked as 2 of 7 slices.
    let id = book_active(
        &app,
        &node,
        &token,
        json!({"tenant": "lab", "kind": "timeslice", "memory_gib": 12, "hours": 1}),
    )
    .await;
    let t0: OffsetDateTime = sqlx::query_scalar(
        "UPDATE bookings SET during = tstzrange(date_trunc('second', now()) - interval '2 minutes',
                                                 date_trunc('second', now()) + interval '1 hour')
         WHERE id = $1 RETURNING lower(during)",
    )
    .bind(id)
    .fetch_one(&app.pool)
    .await
    .unwrap();
    // The node's scheduler said a moment ago: it got half the GPU.
    sqlx::query("UPDATE bookings SET scheduler = jsonb_build_object('achieved_share_pct', 50.0, 'at', extract(epoch FROM now())::bigint) WHERE id = $1")
        .bind(id)
        .execute(&app.pool)
        .await
        .unwrap();
    let spool = std::env::temp_dir().join(format!("gpuslice-spool-share-{}", app.db_name));
    let backend: Arc<dyn GpuBackend> = node.clone();
    let mut m = Meter::new("n1", &spool, Settings::default()).unwrap();
    let p = m.pass(&app.pool, &backend, at(t0, 2)).await.unwrap();
    assert_eq!(p.written, 2);
    let rows: Vec<f64> = sqlx::query_scalar(
        "SELECT slice_seconds FROM usage WHERE booking_id = $1 ORDER BY interval_start",
    )
    .bind(id)
    .fetch_all(&app.pool)
    .await
    .unwrap();
    // The catch-up interval at the booked 2 slices; the one that just
    // ended at the achieved 50 % of 7 slices.
    assert_eq!(rows, vec![2.0 * 60.0, 3.5 * 60.0]);
    let _ = std::fs::remove_dir_all(&spool);
}
