//! Load generator for `scripts/bench-booking.sh`: C concurrent clients, one
//! API token each, send N requests in all and report throughput and
//! latency percentiles. `--mode me` (GET /api/v1/me) is the baseline;
//! `--mode book` POSTs bookings (1g.10gb, 2g.20gb, 3g.40gb and small
//! time-sliced shares, one hour each). `--mode rush` is open-loop: every
//! client (a student) books one 1g.10gb for an hour at a random moment
//! within `--window-ms` (default 1,000), then polls its booking every
//! 250 ms until it is active (or says it waits in the queue), and the
//! report adds the time from booking to active.
//!
//! Usage: booking_load --url http://127.0.0.1:8080 --clients FILE --requests N --mode me|book|rush
//! where FILE has one "tenant-slug token" per line (one client per line).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// The `p` quantile of sorted values (0 when there are none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// The clients file: one "tenant-slug token" per line.
fn read_clients(file: &str) -> Vec<(String, String)> {
    let clients: Vec<(String, String)> = std::fs::read_to_string(file)
        .expect("read the clients file")
        .lines()
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(t, k)| (t.to_string(), k.to_string()))
        })
        .collect();
    assert!(!clients.is_empty(), "no clients in {file}");
    clients
}

#[tokio::main]
async fn main() {
    let url = arg("--url").expect("--url");
    let file = arg("--clients").expect("--clients");
    let total: usize = arg("--requests")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let mode = arg("--mode").unwrap_or_else(|| "book".into());
    if mode == "rush" {
        return rush(&url, &file).await;
    }
    let clients = read_clients(&file);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients.len())
        .build()
        .unwrap();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, (tenant, token)) in clients.into_iter().enumerate() {
        let (http, url, mode, next) = (http.clone(), url.clone(), mode.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut out: Vec<(Duration, u16)> = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= total {
                    break;
                }
                let req = if mode == "me" {
                    http.get(format!("{url}/api/v1/me"))
                } else {
                    let body = match (n + i) % 4 {
                        0 | 1 => serde_json::json!({"tenant": tenant, "kind": "mig", "profile": "1g.10gb", "hours": 1}),
                        2 => serde_json::json!({"tenant": tenant, "kind": "mig", "profile": if n % 8 == 2 { "3g.40gb" } else { "2g.20gb" }, "hours": 1}),
                        _ => serde_json::json!({"tenant": tenant, "kind": "timeslice", "memory_gib": 4, "hours": 1}),
                    };
                    http.post(format!("{url}/api/v1/bookings")).json(&body)
                };
                let t = Instant::now();
                let status = match req.bearer_auth(&token).send().await {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let _ = r.bytes().await;
                        s
                    }
                    Err(_) => 0,
                };
                out.push((t.elapsed(), status));
            }
            out
        }));
    }
    let mut all: Vec<(Duration, u16)> = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let wall = started.elapsed();
    let mut lat: Vec<f64> = all.iter().map(|(d, _)| d.as_secs_f64() * 1000.0).collect();
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| percentile(&lat, p);
    let mut codes: std::collections::BTreeMap<u16, usize> = Default::default();
    for (_, s) in &all {
        *codes.entry(*s).or_default() += 1;
    }
    println!(
        "{{\"mode\": \"{mode}\", \"requests\": {}, \"seconds\": {:.2}, \"per_second\": {:.0}, \"p50_ms\": {:.1}, \"p99_ms\": {:.1}, \"max_ms\": {:.1}, \"statuses\": {}}}",
        all.len(),
        wall.as_secs_f64(),
        all.len() as f64 / wall.as_secs_f64(),
        pct(0.50),
        pct(0.99),
        lat.last().copied().unwrap_or(0.0),
        serde_json::to_string(&codes.iter().map(|(k, v)| (k.to_string(), v)).collect::<std::collections::BTreeMap<_, _>>()).unwrap()
    );
}

/// The class rush: each student books once within the window (open loop),
/// then polls until active or queued.
async fn rush(url: &str, file: &str) {
    use rand::Rng;
    let window_ms: u64 = arg("--window-ms")
        .and_then(|n| n.parse().ok())
        .unwrap_or(1000);
    let clients = read_clients(file);
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients.len())
        .build()
        .unwrap();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (tenant, token) in clients {
        let at = Duration::from_millis(rand::thread_rng().gen_range(0..window_ms.max(1)));
        let (http, url) = (http.clone(), url.to_string());
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(tokio::time::Instant::from_std(started + at)).await;
            let t = Instant::now();
            let body = serde_json::json!({"tenant": tenant, "kind": "mig", "profile": "1g.10gb", "hours": 1});
            let resp = http
                .post(format!("{url}/api/v1/bookings"))
                .json(&body)
                .bearer_auth(&token)
                .send()
                .await;
            let (code, booking) = match resp {
                Ok(r) => {
                    let c = r.status().as_u16();
                    (c, r.json::<serde_json::Value>().await.unwrap_or_default())
                }
                Err(_) => (0, serde_json::Value::Null),
            };
            let post = t.elapsed();
            let mut status = booking["status"].as_str().unwrap_or("").to_string();
            let id = booking["id"].as_i64();
            let mut polls = 0u32;
            let mut errors = 0u32;
            // Poll until active, or until the queue is its answer.
            while let Some(id) = id {
                if status == "active" || status == "queued" || t.elapsed() > Duration::from_secs(180) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
                polls += 1;
                match http
                    .get(format!("{url}/api/v1/bookings/{id}"))
                    .bearer_auth(&token)
                    .send()
                    .await
                {
                    Ok(r) if r.status().is_success() => {
                        let v = r.json::<serde_json::Value>().await.unwrap_or_default();
                        status = v["status"].as_str().unwrap_or("").to_string();
                    }
                    Ok(r) if r.status().is_server_error() => errors += 1,
                    _ => errors += 1,
                }
            }
            (post, code, status, t.elapsed(), polls, errors)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.unwrap());
    }
    let mut lat: Vec<f64> = all.iter().map(|a| a.0.as_secs_f64() * 1000.0).collect();
    lat.sort_by(f64::total_cmp);
    let mut active: Vec<f64> = all
        .iter()
        .filter(|a| a.2 == "active")
        .map(|a| a.3.as_secs_f64())
        .collect();
    active.sort_by(f64::total_cmp);
    let mut codes: std::collections::BTreeMap<String, usize> = Default::default();
    let mut finals: std::collections::BTreeMap<String, usize> = Default::default();
    for a in &all {
        *codes.entry(a.1.to_string()).or_default() += 1;
        *finals.entry(a.2.clone()).or_default() += 1;
    }
    println!(
        "{{\"mode\": \"rush\", \"students\": {}, \"window_ms\": {window_ms}, \"post_p50_ms\": {:.1}, \"post_p99_ms\": {:.1}, \"post_max_ms\": {:.1}, \"statuses\": {}, \"final\": {}, \"to_active_p50_s\": {:.2}, \"to_active_p99_s\": {:.2}, \"polls\": {}, \"poll_errors\": {}}}",
        all.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().copied().unwrap_or(0.0),
        serde_json::to_string(&codes).unwrap(),
        serde_json::to_string(&finals).unwrap(),
        percentile(&active, 0.5),
        percentile(&active, 0.99),
        all.iter().map(|a| a.4).sum::<u32>(),
        all.iter().map(|a| a.5).sum::<u32>(),
    );
}
