//! Operations endpoints and HTTP metrics: `/healthz`, `/readyz`, `/metrics`.

use axum::routing::get;
use axum::Router;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::AppState;
use crate::db;

/// Latency buckets in seconds (Prometheus' defaults, which suit web pages).
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

type Labels = Vec<(&'static str, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// Request counters and latency histograms, keyed by method and route
/// pattern (`/admin/tenants/{id}`, never the raw path, so the number of
/// series stays bounded), kept by the Prometheus client library.
pub struct Metrics {
    registry: Registry,
    requests: Family<Labels, Counter>,
    latency: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        let latency = Family::<Labels, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "gpuslice_http_requests",
            "HTTP requests by method, route and status",
            requests.clone(),
        );
        registry.register(
            "gpuslice_http_request_duration_seconds",
            "HTTP request latency",
            latency.clone(),
        );
        Metrics {
            registry,
            requests,
            latency,
        }
    }
}

impl Metrics {
    fn observe(&self, method: &str, route: &str, status: u16, secs: f64) {
        self.requests
            .get_or_create(&vec![
                ("method", method.to_string()),
                ("route", route.to_string()),
                ("status", status.to_string()),
            ])
            .inc();
        self.latency
            .get_or_create(&vec![
                ("method", method.to_string()),
                ("route", route.to_string()),
            ])
            .observe(secs);
    }

    /// The HTTP metrics in the text exposition (without the final `# EOF`).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = encode_registry(&mut out, &self.registry);
        out
    }
}

pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    // A closed set of labels: invented methods must not add series.
    let method = match req.method().as_str() {
        m @ ("GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS") => m.to_string(),
        _ => "other".to_string(),
    };
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

/// `GET /metrics`: HTTP metrics, GPU and instance gauges under
/// DCGM-exporter's names and labels (plus `tenant` and `booking`),
/// fragmentation and open alerts. Open unless `GPUSLICE_METRICS_TOKEN` is
/// set; then it asks for that bearer token.
pub async fn metrics(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(token) = &state.metrics_token {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        // Compared as hashes, so that neither content nor length leaks.
        use sha2::{Digest, Sha256};
        if !crate::web::csrf::constant_time_eq(
            &Sha256::digest(given.as_bytes()),
            &Sha256::digest(token.as_bytes()),
        ) {
            return (
                StatusCode::UNAUTHORIZED,
                [(header::WWW_AUTHENTICATE, "Bearer")],
                "metrics need the bearer token set by GPUSLICE_METRICS_TOKEN\n",
            )
                .into_response();
        }
    }
    let mut body = state.metrics.render();
    match fleet_registry(&state).await {
        Ok(r) => {
            let _ = encode_registry(&mut body, &r);
        }
        Err(e) => tracing::warn!(error = %e, "metrics: fleet gauges unavailable"),
    }
    // Prometheus asks for OpenMetrics; anything else gets the classic
    // text format (the same lines without the closing `# EOF`).
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    let content_type = if openmetrics {
        let _ = encode_eof(&mut body);
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    } else {
        "text/plain; version=0.0.4; charset=utf-8"
    };
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// Registers a gauge family and returns it.
fn gauges(r: &mut Registry, name: &str, help: &str) -> Family<Labels, FloatGauge> {
    let f = Family::<Labels, FloatGauge>::default();
    r.register(name, help, f.clone());
    f
}

/// The fleet's gauges, built from the database at each scrape.
pub async fn fleet_registry(state: &AppState) -> anyhow::Result<Registry> {
    let pool = &state.pool;
    let mut r = Registry::default();
    let conns = gauges(
        &mut r,
        "gpuslice_db_pool_connections",
        "Open database connections",
    );
    conns.get_or_create(&vec![]).set(f64::from(pool.size()));
    render_gpus(&mut r, state).await?;
    // Fragmentation, the product's headline: per GPU and for the fleet.
    let gpus = db::fleet::list(pool).await?;
    let frag = super::fleet::fragmentation(pool, &gpus).await?;
    let free = gauges(
        &mut r,
        "gpuslice_mig_free_slices",
        "Free MIG memory slices per GPU",
    );
    let stranded = gauges(
        &mut r,
        "gpuslice_mig_stranded_slices",
        "Free MIG memory slices that no profile can use, per GPU",
    );
    let mix = gauges(&mut r, "gpuslice_mig_fragmentation_slices", "MIG memory slices the asked profiles can no longer reach, weighted by how often each is asked for, per GPU");
    let share = gauges(
        &mut r,
        "gpuslice_share_fragmentation_ratio",
        "Part of a time-sliced GPU the asked share sizes cannot use (FGD), per GPU",
    );
    for g in &gpus {
        let Some(f) = frag.by_gpu.get(&g.id) else {
            continue;
        };
        let labels: Labels = vec![
            ("node", g.node.clone()),
            ("gpu", g.idx.to_string()),
            ("model", g.model.clone()),
        ];
        if let Some(v) = f.share_fraction {
            share.get_or_create(&labels).set(v);
        } else if g.mig_current {
            free.get_or_create(&labels).set(f64::from(f.free_slices));
            stranded.get_or_create(&labels).set(f64::from(f.stranded));
            mix.get_or_create(&labels).set(f.mix_slices);
        }
    }
    let fleet = gauges(&mut r, "gpuslice_fleet_fragmentation_ratio", "Fragmentation of the fleet: MIG slices the asked profiles cannot reach over all MIG slices; time-sliced capacity the asked shares cannot use over all time-sliced GPUs");
    fleet
        .get_or_create(&vec![("kind", "mig".to_string())])
        .set(frag.mig_ratio());
    fleet
        .get_or_create(&vec![("kind", "timeslice".to_string())])
        .set(frag.share_ratio());
    let alerts = gauges(
        &mut r,
        "gpuslice_alerts_firing",
        "Firing alerts by rule and severity",
    );
    for (rule, severity, n) in db::alerts::firing_counts(pool).await? {
        alerts
            .get_or_create(&vec![
                ("rule", rule),
                ("severity", severity.as_str().to_string()),
            ])
            .set(n as f64);
    }
    Ok(r)
}

/// Per-GPU and per-booking gauges from the latest samples, named and
/// labelled as DCGM-exporter names and labels them (its default counters),
/// so dashboards built for it work unchanged.
async fn render_gpus(r: &mut Registry, state: &AppState) -> anyhow::Result<()> {
    let fresh = db::telemetry::fresh_secs(state.telemetry_interval_secs as f64);
    let latest = db::telemetry::latest(&state.pool, fresh).await?;
    let held = db::telemetry::latest_bookings(&state.pool, fresh).await?;
    let util = gauges(r, "DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %)");
    let fb_used = gauges(r, "DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB)");
    let fb_free = gauges(r, "DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB)");
    let temp = gauges(r, "DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)");
    let power = gauges(r, "DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)");
    let sm = gauges(r, "DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz)");
    let mem = gauges(
        r,
        "DCGM_FI_DEV_MEM_CLOCK",
        "Memory clock frequency (in MHz)",
    );
    let dbe = gauges(
        r,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors",
    );
    let xid = gauges(
        r,
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered",
    );
    let gr = gauges(
        r,
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "Ratio of time the graphics engine is active (MIG instance)",
    );
    let base = |node: &str, idx: i32, uuid: &str, product: &str| -> Labels {
        vec![
            ("gpu", idx.to_string()),
            ("UUID", uuid.to_string()),
            ("device", format!("nvidia{idx}")),
            ("modelName", product.to_string()),
            ("Hostname", node.to_string()),
        ]
    };
    for l in latest.iter().filter(|l| !l.lost) {
        let labels = base(&l.node, l.idx, &l.uuid, &l.product);
        if let Some(v) = l.utilization_pct {
            util.get_or_create(&labels).set(f64::from(v));
        }
        if let (Some(u), Some(t)) = (l.memory_used_mib, l.memory_total_mib) {
            fb_used.get_or_create(&labels).set(u as f64);
            fb_free.get_or_create(&labels).set((t - u).max(0) as f64);
        }
        if let Some(v) = l.temperature_c {
            temp.get_or_create(&labels).set(f64::from(v));
        }
        if let Some(v) = l.power_w {
            power.get_or_create(&labels).set(f64::from(v));
        }
        if let Some(v) = l.sm_clock_mhz {
            sm.get_or_create(&labels).set(f64::from(v));
        }
        if let Some(v) = l.mem_clock_mhz {
            mem.get_or_create(&labels).set(f64::from(v));
        }
        if let Some(v) = l.ecc_uncorrectable {
            dbe.get_or_create(&labels).set(v as f64);
        }
        xid.get_or_create(&labels)
            .set(l.last_xid.unwrap_or(0) as f64);
    }
    // Each booking's device: a MIG instance carries DCGM's GPU_I labels;
    // both kinds carry the tenant and booking, to slice dashboards by.
    for b in &held {
        let mut labels = base(&b.node, b.idx, &b.gpu_uuid, &b.product);
        if let Some(p) = &b.profile {
            labels.push(("GPU_I_PROFILE", p.clone()));
            labels.push(("GPU_I_ID", b.gi_placement.unwrap_or(0).to_string()));
        }
        if state.metrics_attribution {
            labels.push(("tenant", b.tenant.clone()));
            labels.push(("booking", b.booking_id.to_string()));
        }
        fb_used.get_or_create(&labels).set(b.memory_used_mib as f64);
        fb_free
            .get_or_create(&labels)
            .set((b.memory_limit_mib - b.memory_used_mib).max(0) as f64);
        if let Some(u) = b.utilization_pct {
            gr.get_or_create(&labels).set(f64::from(u) / 100.0);
        }
    }
    Ok(())
}

/// Health, readiness, metrics and the static assets.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/static/{*path}", get(super::assets::serve))
}
