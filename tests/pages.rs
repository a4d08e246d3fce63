//! Long lists come in pages by keyset (issue 18): the booking list and the
//! API's `GET /bookings` (`cursor`, `limit`, `next_cursor`) and the audit
//! log walk every row exactly once, newest first, however many rows share
//! a creation time; so does the usage page's drill-down by booking-day;
//! each page's query can be served by an index.

mod common;

use std::collections::HashSet;

use common::TestApp;
use serde_json::Value;

/// `n` cancelled bookings of ana in `lab`, the first `same` of them created
/// at one instant (ties are broken by id).
async fn bookings(app: &TestApp, n: i64, same: i64) {
    sqlx::query(
        "INSERT INTO bookings (tenant_id, user_id, kind, profile, memory_gib, compute_slices, priority,
                               hours, during, status, created_at)
         SELECT t.id, u.id, 'mig', '1g.10gb', 10, 1, 'normal', 1,
                tstzrange(now() + interval '1 day', now() + interval '25 hours'), 'cancelled',
                CASE WHEN g <= $2 THEN timestamptz '2026-01-01 00:00:00+00'
                     ELSE timestamptz '2026-01-01 00:00:00+00' + g * interval '1 minute' END
         FROM generate_series(1, $1) g, tenants t, users u
         WHERE t.slug = 'lab' AND u.email = 'ana@uni.edu'",
    )
    .bind(n)
    .bind(same)
    .execute(&app.pool)
    .await
    .unwrap();
}

async fn setup() -> (TestApp, String) {
    let app = TestApp::spawn().await;
    app.tenant("lab").await;
    app.user("ana@uni.edu", "none", &["lab"]).await;
    app.user("root@uni.edu", "admin", &[]).await;
    let token = gpuslice::cli::token_create(&app.pool, "ana@uni.edu", "t")
        .await
        .unwrap();
    (app, token)
}

async fn api(app: &TestApp, token: &str, query: &str) -> (u16, Value) {
    let r = app
        .client()
        .get(app.url(&format!("/api/v1/bookings{query}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

#[tokio::test]
async fn the_api_walks_every_booking_once_by_cursor() {
    let (app, token) = setup().await;
    bookings(&app, 250, 120).await;
    let (mut seen, mut order) = (HashSet::new(), Vec::new());
    let mut query = "?limit=100".to_string();
    let mut pages = 0;
    loop {
        let (status, page) = api(&app, &token, &query).await;
        assert_eq!(status, 200, "{page}");
        pages += 1;
        for b in page["bookings"].as_array().unwrap() {
            let id = b["id"].as_i64().unwrap();
            assert!(seen.insert(id), "booking {id} twice");
            order.push(id);
        }
        match page["next_cursor"].as_str() {
            Some(c) => query = format!("?limit=100&cursor={c}"),
            None => break,
        }
    }
    assert_eq!((seen.len(), pages), (250, 3));
    // Newest first: the spread ones by time, then the tied ones by id.
    let created: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT id, extract(epoch FROM created_at)::bigint FROM bookings ORDER BY created_at DESC, id DESC",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(order, created.iter().map(|c| c.0).collect::<Vec<_>>());
    // The default page and its bounds.
    let (_, first) = api(&app, &token, "").await;
    assert_eq!(first["bookings"].as_array().unwrap().len(), 100);
    for bad in [
        "?cursor=abc",
        "?cursor=-4",
        "?limit=0",
        "?limit=501",
        "?limit=x",
    ] {
        let (status, body) = api(&app, &token, bad).await;
        assert_eq!(status, 422, "{bad}: {body}");
    }
}

fn booking_ids(html: &str) -> Vec<i64> {
    html.match_indices("href=\"/bookings/")
        .filter_map(|(i, m)| {
            let rest = &html[i + m.len()..];
            let end = rest.find('"')?;
            rest[..end].parse().ok()
        })
        .collect()
}

/// Follows a page's "older" link from `first` to the last page; returns
/// each page's HTML.
async fn walk(app: &TestApp, client: &reqwest::Client, first: &str) -> Vec<String> {
    let mut url = first.to_string();
    let mut pages = Vec::new();
    loop {
        let html = app.text(client, &url).await;
        let next = html.find("id=\"older\"").map(|i| {
            let href = html[..i].rfind("href=\"").unwrap();
            html[href + 6..i]
                .split('"')
                .next()
                .unwrap()
                .replace("&amp;", "&")
                .replace("&#38;", "&")
        });
        pages.push(html);
        match next {
            Some(n) => url = n,
            None => return pages,
        }
        assert!(pages.len() < 10, "no last page");
    }
}

#[tokio::test]
async fn the_booking_list_and_the_audit_log_come_in_pages() {
    let (app, _) = setup().await;
    bookings(&app, 230, 150).await;
    let ana = app.signed_in("ana@uni.edu").await;
    let pages = walk(&app, &ana, "/bookings?scope=mine").await;
    let mut seen = HashSet::new();
    for (n, html) in pages.iter().enumerate() {
        // A row may link its booking more than once.
        let ids: HashSet<i64> = booking_ids(html).into_iter().collect();
        assert!(ids.len() <= 100, "{}", ids.len());
        for id in ids {
            assert!(seen.insert(id), "booking {id} on two pages (page {n})");
        }
    }
    let pages = pages.len();
    assert_eq!((seen.len(), pages), (230, 3));

    sqlx::query(
        "INSERT INTO audit_log (at, actor_email, action, target, detail)
         SELECT CASE WHEN g <= 300 THEN timestamptz '2026-02-01 00:00:00+00'
                     ELSE timestamptz '2026-02-01 00:00:00+00' + g * interval '1 second' END,
                'root@uni.edu', 'tenant.updated', 'lab-' || g, '{}'::jsonb
         FROM generate_series(1, 450) g",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let root = app.signed_in("root@uni.edu").await;
    let pages = walk(&app, &root, "/admin/audit?action=tenant.").await;
    let mut targets = HashSet::new();
    for html in &pages {
        for (i, _) in html.match_indices("<td>lab-") {
            let t = &html[i + 4..];
            let t = &t[..t.find('<').unwrap()];
            assert!(targets.insert(t.to_string()), "{t} on two pages");
        }
    }
    let pages = pages.len();
    assert_eq!((targets.len(), pages), (450, 3));
}

/// The generic plan of a page statement (as a prepared statement reused
/// many times gets): an index serves it in order, with no sort.
async fn served_by_index(app: &TestApp, types: &str, sql: &str, args: &str) {
    let mut tx = app.pool.begin().await.unwrap();
    // With scans that cannot give the order, and sorting, made dear: the
    // plan keeps a sort only when no index gives the order.
    for set in [
        "SET LOCAL enable_seqscan = off",
        "SET LOCAL enable_bitmapscan = off",
        "SET LOCAL enable_sort = off",
        "SET LOCAL plan_cache_mode = force_generic_plan",
    ] {
        sqlx::query(set).execute(&mut *tx).await.unwrap();
    }
    // The simple protocol: a PREPARE sent as a prepared statement runs twice.
    sqlx::raw_sql(&format!("PREPARE page_q ({types}) AS {sql}"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let plan: Vec<String> = sqlx::query_scalar(&format!("EXPLAIN EXECUTE page_q ({args})"))
        .fetch_all(&mut *tx)
        .await
        .unwrap();
    sqlx::raw_sql("DEALLOCATE page_q")
        .execute(&mut *tx)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(
        !plan.contains("Seq Scan") && !plan.contains("Sort") && plan.contains("Index"),
        "{sql}\n{plan}"
    );
}

/// The page statements as `db::bookings::page`, `db::audit::recent` and
/// `db::alerts::list` send them.
#[tokio::test]
async fn every_page_query_has_an_index() {
    let (app, _) = setup().await;
    bookings(&app, 50, 10).await;
    let first = "'9999-12-31 00:00:00+00', 9223372036854775807";
    for (types, sql, args) in [
        (
            "bigint, timestamptz, bigint, bigint",
            "SELECT id FROM bookings WHERE user_id = $1 AND (created_at, id) < ($2, $3) ORDER BY created_at DESC, id DESC LIMIT $4",
            format!("1, {first}, 101"),
        ),
        (
            "bigint, timestamptz, bigint, bigint",
            "SELECT id FROM bookings WHERE tenant_id = $1 AND (created_at, id) < ($2, $3) ORDER BY created_at DESC, id DESC LIMIT $4",
            format!("1, {first}, 101"),
        ),
        (
            "timestamptz, bigint, bigint",
            "SELECT id FROM bookings WHERE (created_at, id) < ($1, $2) ORDER BY created_at DESC, id DESC LIMIT $3",
            format!("{first}, 101"),
        ),
        (
            "text, timestamptz, bigint, bigint",
            "SELECT id, at FROM audit_log WHERE starts_with(action, $1) AND (at, id) < ($2, $3) ORDER BY at DESC, id DESC LIMIT $4",
            format!("'', {first}, 201"),
        ),
        (
            "date, date, bigint, bigint, date, bigint, bigint",
            "SELECT d.day, b.id FROM usage_daily d JOIN bookings b ON b.id = d.booking_id
             WHERE d.day BETWEEN $1 AND $2 AND (d.day, d.booking_id) < ($5, $6)
               AND ($3::bigint IS NULL OR b.tenant_id = $3) AND ($4::bigint IS NULL OR b.user_id = $4)
             ORDER BY d.day DESC, d.booking_id DESC LIMIT $7",
            "'2026-01-01', '2026-12-31', NULL, 1, '2027-01-01', 9223372036854775807, 101".to_string(),
        ),
        (
            "boolean, timestamptz, bigint, bigint",
            "SELECT id FROM alerts a WHERE ((a.state <> 'resolved'), a.started_at, a.id) < ($1, $2, $3) ORDER BY (a.state <> 'resolved') DESC, a.started_at DESC, a.id DESC LIMIT $4",
            format!("true, {first}, 201"),
        ),
    ] {
        served_by_index(&app, types, sql, &args).await;
    }
}

#[tokio::test]
async fn alerts_come_in_pages_open_first() {
    let (app, _) = setup().await;
    // 100 firing (50 at one instant) and 1,000 resolved.
    sqlx::query(
        "INSERT INTO alerts (started_at, severity, message, rule, state, node, resolved_at)
         SELECT CASE WHEN g <= 50 THEN timestamptz '2026-03-01 00:00:00+00'
                     ELSE timestamptz '2026-03-01 00:00:00+00' + g * interval '1 second' END,
                'warning', 'hot', 'gpu_temperature_high',
                CASE WHEN g <= 100 THEN 'firing' ELSE 'resolved' END, 'n' || g,
                CASE WHEN g <= 100 THEN NULL ELSE timestamptz '2026-03-02 00:00:00+00' END
         FROM generate_series(1, 1100) g",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let token = gpuslice::cli::token_create(&app.pool, "root@uni.edu", "t")
        .await
        .unwrap();
    let mut url = app.url("/api/v1/alerts?state=all");
    let (mut seen, mut states) = (HashSet::new(), Vec::new());
    let mut pages = 0;
    loop {
        let r = app
            .client()
            .get(&url)
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let link = r
            .headers()
            .get("link")
            .map(|l| l.to_str().unwrap().to_string());
        let page: Vec<Value> = r.json().await.unwrap();
        pages += 1;
        for a in &page {
            assert!(seen.insert(a["id"].as_i64().unwrap()), "alert twice");
            states.push(a["state"].as_str().unwrap().to_string());
        }
        match link {
            Some(l) => {
                let path = l.trim_start_matches('<').split('>').next().unwrap();
                url = app.url(path);
            }
            None => break,
        }
    }
    assert_eq!((seen.len(), pages), (1100, 3), "500 to a page");
    assert!(
        states[..100].iter().all(|s| s == "firing")
            && states[100..].iter().all(|s| s == "resolved")
    );

    let root = app.signed_in("root@uni.edu").await;
    let pages = walk(&app, &root, "/admin/alerts?state=all").await;
    let mut seen = HashSet::new();
    for html in &pages {
        for (i, _) in html.match_indices("<td>n") {
            let t = &html[i + 4..];
            let node = &t[..t.find('<').unwrap()];
            if node[1..].parse::<u32>().is_ok() {
                assert!(seen.insert(node.to_string()), "{node} on two pages");
            }
        }
    }
    let pages = pages.len();
    assert_eq!((seen.len(), pages), (1100, 6));
}

/// The (day, booking) rows of the usage page's drill-down in `html`.
fn day_rows(html: &str) -> Vec<(String, i64)> {
    html.match_indices("<tr><td>")
        .filter_map(|(i, m)| {
            let rest = &html[i + m.len()..];
            let day = rest.get(..10)?.to_string();
            let rest = rest
                .get(10..)?
                .strip_prefix("</td><td class=\"num\" data-value=\"")?;
            Some((day, rest[..rest.find('"')?].parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn the_usage_drill_down_comes_in_pages_newest_first() {
    let (app, _) = setup().await;
    bookings(&app, 30, 0).await;
    // Eight days of November each: 240 booking-days, through the rollup.
    sqlx::query(
        "INSERT INTO usage (booking_id, interval_start, interval_end, slice_seconds, gib_seconds)
         SELECT b.id, timestamptz '2026-11-01 10:00+00' + d * interval '1 day',
                timestamptz '2026-11-01 10:01+00' + d * interval '1 day', 60, 600
         FROM bookings b, generate_series(0, 7) d",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let ana = app.signed_in("ana@uni.edu").await;
    let pages = walk(&app, &ana, "/usage?from=2026-11-01&to=2026-11-30").await;
    let rows: Vec<(String, i64)> = pages.iter().flat_map(|p| day_rows(p)).collect();
    assert_eq!(pages.len(), 3, "100 + 100 + 40");
    assert_eq!(day_rows(&pages[0]).len(), 100);
    assert_eq!(rows.len(), 240);
    assert_eq!(
        rows.iter().collect::<HashSet<_>>().len(),
        240,
        "every booking-day exactly once"
    );
    let mut sorted = rows.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(rows, sorted, "newest day first, then the newest booking");
    assert!(pages[1].contains("← Newest"));
    // A malformed cursor is a clear 4xx, not a page.
    let r = ana
        .get(app.url("/usage?from=2026-11-01&to=2026-11-30&before=nonsense"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);
}
