//! The finance export streams: a million usage rows go out with the
//! server's memory flat (the rows are never all held at once).

mod common;

use common::TestApp;
use reqwest::StatusCode;

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|n| n.parse().ok()))
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn a_million_rows_stream_in_constant_memory() {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("fin@uni.edu", "finance", &[]).await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    // 1,000 bookings x 1,000 days, one usage row each: 1,000,000 rows, and
    // as many rows in the export (one per booking per day).
    sqlx::query(
        "INSERT INTO bookings (tenant_id, user_id, kind, model, profile, memory_gib, compute_slices,
                               priority, hours, during, status)
         SELECT t.id, u.id, 'mig', 'H100-80GB', '1g.10gb', 10, 1, 'normal', 24,
                tstzrange('2024-01-01', '2026-10-01'), 'failed'
         FROM tenants t, users u, generate_series(1, 1000)
         WHERE t.slug = 'lab' AND u.email = 'ana@uni.edu'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds)
         SELECT b.id, timestamptz '2024-01-01 12:00+00' + d * interval '1 day',
                timestamptz '2024-01-01 12:01+00' + d * interval '1 day', 60, 600
         FROM bookings b, generate_series(0, 999) d",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let token = gpuslice::cli::token_create(&app.pool, "fin@uni.edu", "t")
        .await
        .unwrap();
    let before = peak_rss_kib();
    let mut r = reqwest::Client::new()
        .get(app.url("/reports/usage.csv?from=2024-01-01&to=2026-12-31"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut lines = 0usize;
    let mut bytes = 0usize;
    while let Some(chunk) = r.chunk().await.unwrap() {
        lines += chunk.iter().filter(|&&b| b == b'\n').count();
        bytes += chunk.len();
    }
    let grew_mib = (peak_rss_kib().saturating_sub(before)) as f64 / 1024.0;
    assert_eq!(lines, 1_000_001, "a header and one row per booking per day");
    eprintln!(
        "exported {lines} lines, {:.0} MiB; peak memory grew {grew_mib:.1} MiB",
        bytes as f64 / 1048576.0
    );
    assert!(
        grew_mib < 64.0,
        "the export held {grew_mib:.0} MiB: it must stream, not buffer ({:.0} MiB of CSV)",
        bytes as f64 / 1048576.0
    );
}
