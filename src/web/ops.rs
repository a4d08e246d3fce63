//! Operations endpoints and HTTP metrics: `/healthz`, `/readyz`, `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::db;

/// Latency buckets in seconds (Prometheus' defaults, which suit web pages).
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Request counters and latency histograms, keyed by method and route
/// pattern (`/admin/tenants/{id}`, never the raw path, so the number of
/// series stays bounded).
#[derive(Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
    latency: Mutex<BTreeMap<(String, String), Histogram>>,
}

impl Metrics {
    fn observe(&self, method: &str, route: &str, status: u16, secs: f64) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((method.to_string(), route.to_string(), status))
                .or_default() += 1;
        }
        if let Ok(mut m) = self.latency.lock() {
            let h = m
                .entry((method.to_string(), route.to_string()))
                .or_default();
            for (i, le) in BUCKETS.iter().enumerate() {
                if secs <= *le {
                    h.counts[i] += 1;
                }
            }
            h.count += 1;
            h.sum += secs;
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP gpuslice_http_requests_total HTTP requests by method, route and status.\n",
        );
        out.push_str("# TYPE gpuslice_http_requests_total counter\n");
        if let Ok(m) = self.requests.lock() {
            for ((method, route, status), n) in m.iter() {
                let _ = writeln!(
                    out,
                    "gpuslice_http_requests_total{{method=\"{method}\",route=\"{}\",status=\"{status}\"}} {n}",
                    escape(route)
                );
            }
        }
        out.push_str("# HELP gpuslice_http_request_duration_seconds HTTP request latency.\n");
        out.push_str("# TYPE gpuslice_http_request_duration_seconds histogram\n");
        if let Ok(m) = self.latency.lock() {
            for ((method, route), h) in m.iter() {
                let labels = format!("method=\"{method}\",route=\"{}\"", escape(route));
                for (i, le) in BUCKETS.iter().enumerate() {
                    let _ = writeln!(
                        out,
                        "gpuslice_http_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {}",
                        h.counts[i]
                    );
                }
                let _ = writeln!(
                    out,
                    "gpuslice_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                    h.count
                );
                let _ = writeln!(
                    out,
                    "gpuslice_http_request_duration_seconds_sum{{{labels}}} {}",
                    h.sum
                );
                let _ = writeln!(
                    out,
                    "gpuslice_http_request_duration_seconds_count{{{labels}}} {}",
                    h.count
                );
            }
        }
        out
    }
}

fn escape(label: &str) -> String {
    label
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().to_string();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let resp = next.run(req).await;
    state.metrics.observe(
        &method,
        &route,
        resp.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    resp
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

pub async fn readyz(State(state): State<AppState>) -> Response {
    if db::ping(&state.pool).await {
        "ready\n".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "database unreachable\n").into_response()
    }
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let mut body = state.metrics.render();
    let pool = &state.pool;
    let _ = writeln!(
        body,
        "# HELP gpuslice_db_pool_connections Open database connections."
    );
    let _ = writeln!(body, "# TYPE gpuslice_db_pool_connections gauge");
    let _ = writeln!(body, "gpuslice_db_pool_connections {}", pool.size());
    // Fragmentation, the product's headline: free MIG memory slices and
    // those no profile can use.
    if let Ok(gpus) = db::fleet::list(pool).await {
        let mut free_lines = String::new();
        let mut stranded_lines = String::new();
        for g in gpus.iter().filter(|g| g.mig_current) {
            let (free, stranded) = super::fleet::slice_use(g);
            let labels = format!(
                "node=\"{}\",gpu=\"{}\",model=\"{}\"",
                escape(&g.node),
                g.idx,
                escape(&g.model)
            );
            let _ = writeln!(free_lines, "gpuslice_mig_free_slices{{{labels}}} {free}");
            let _ = writeln!(
                stranded_lines,
                "gpuslice_mig_stranded_slices{{{labels}}} {stranded}"
            );
        }
        body.push_str("# HELP gpuslice_mig_free_slices Free MIG memory slices per GPU.\n");
        body.push_str("# TYPE gpuslice_mig_free_slices gauge\n");
        body.push_str(&free_lines);
        body.push_str("# HELP gpuslice_mig_stranded_slices Free MIG memory slices that no profile can use, per GPU.\n");
        body.push_str("# TYPE gpuslice_mig_stranded_slices gauge\n");
        body.push_str(&stranded_lines);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}
