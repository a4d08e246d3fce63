//! Operations endpoints and HTTP metrics: `/healthz`, `/readyz`, `/metrics`.

use axum::routing::get;
use axum::Router;
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
    // Fragmentation, the product's headline: per GPU and for the fleet.
    if let Ok(gpus) = db::fleet::list(pool).await {
        if let Ok(frag) = super::fleet::fragmentation(pool, &gpus).await {
            let mut free = String::new();
            let mut stranded = String::new();
            let mut mix = String::new();
            let mut share = String::new();
            for g in &gpus {
                let Some(f) = frag.by_gpu.get(&g.id) else {
                    continue;
                };
                let labels = format!(
                    "node=\"{}\",gpu=\"{}\",model=\"{}\"",
                    escape(&g.node),
                    g.idx,
                    escape(&g.model)
                );
                if let Some(v) = f.share_fraction {
                    let _ = writeln!(share, "gpuslice_share_fragmentation_ratio{{{labels}}} {v}");
                } else if g.mig_current {
                    let _ = writeln!(
                        free,
                        "gpuslice_mig_free_slices{{{labels}}} {}",
                        f.free_slices
                    );
                    let _ = writeln!(
                        stranded,
                        "gpuslice_mig_stranded_slices{{{labels}}} {}",
                        f.stranded
                    );
                    let _ = writeln!(
                        mix,
                        "gpuslice_mig_fragmentation_slices{{{labels}}} {}",
                        f.mix_slices
                    );
                }
            }
            for (name, help, kind, lines) in [
                ("gpuslice_mig_free_slices", "Free MIG memory slices per GPU.", "gauge", &free),
                ("gpuslice_mig_stranded_slices", "Free MIG memory slices that no profile can use, per GPU.", "gauge", &stranded),
                ("gpuslice_mig_fragmentation_slices", "MIG memory slices the asked profiles can no longer reach, weighted by how often each is asked for, per GPU.", "gauge", &mix),
                ("gpuslice_share_fragmentation_ratio", "Part of a time-sliced GPU the asked share sizes cannot use (FGD), per GPU.", "gauge", &share),
            ] {
                let _ = writeln!(body, "# HELP {name} {help}");
                let _ = writeln!(body, "# TYPE {name} {kind}");
                body.push_str(lines);
            }
            let _ = writeln!(body, "# HELP gpuslice_fleet_fragmentation_ratio Fragmentation of the fleet: MIG slices the asked profiles cannot reach over all MIG slices; time-sliced capacity the asked shares cannot use over all time-sliced GPUs.");
            let _ = writeln!(body, "# TYPE gpuslice_fleet_fragmentation_ratio gauge");
            let _ = writeln!(
                body,
                "gpuslice_fleet_fragmentation_ratio{{kind=\"mig\"}} {}",
                frag.mig_ratio()
            );
            let _ = writeln!(
                body,
                "gpuslice_fleet_fragmentation_ratio{{kind=\"timeslice\"}} {}",
                frag.share_ratio()
            );
        }
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

/// Health, readiness, metrics and the static assets.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/static/{*path}", get(super::assets::serve))
}
