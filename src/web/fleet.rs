//! The admin fleet page: nodes and GPUs with their mode, health and last
//! heartbeat, and for each MIG GPU a drawing of its memory slices showing
//! which instance holds which, so fragmentation is visible at a glance.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use tower_sessions::Session;

use super::auth::Admin;
use super::charts;
use super::error::AppError;
use super::pages::{flash, PageCtx};
use super::AppState;
use std::collections::HashMap;

use time::OffsetDateTime;

use crate::db::{self, fleet::Gpu};
use crate::domain::booking::Kind;
use crate::domain::GpuMode;
use crate::gpu::catalog::{self, Placement};
use crate::gpu::mig::Existing;
use crate::placement::mig::{self, ProfileMix, Window};
use crate::placement::shares::{self, ShareShapes, SharedGpu};

/// One block of the slot drawing.
pub struct Block {
    pub x: u32,
    pub width: u32,
    pub label: String,
    pub title: String,
    pub used: bool,
}

/// A GPU row with its drawing.
pub struct GpuView {
    pub gpu: Gpu,
    pub slices: u32,
    pub blocks: Vec<Block>,
    pub used_slices: u32,
    pub frag: GpuFrag,
    pub stale: bool,
    /// Sparklines of the last 24 hours (utilisation, temperature, memory).
    pub sparks: String,
    /// The worst open alert: `critical`, `warning`, `info`, or empty.
    pub alert: &'static str,
    pub alerts_open: usize,
}

/// Fragmentation of one GPU now, as the fleet page and `/metrics` show it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuFrag {
    /// MIG: free memory slices.
    pub free_slices: u32,
    /// MIG: free memory slices no profile can use.
    pub stranded: u32,
    /// MIG: memory slices the asked profiles can no longer reach, weighted
    /// by how often each is asked for ([`mig::mix_fragmentation`]).
    pub mix_slices: f64,
    /// Time-sliced: FGD's measure, the fraction of the GPU the asked share
    /// sizes cannot use ([`shares::fragmentation`]).
    pub share_fraction: Option<f64>,
}

/// The fleet's fragmentation: per GPU, and totals.
#[derive(Debug, Clone, Default)]
pub struct Fragmentation {
    pub by_gpu: HashMap<i64, GpuFrag>,
    pub mig_slices: u32,
    pub free_slices: u32,
    pub stranded: u32,
    pub mix_slices: f64,
    pub shared_gpus: u32,
    pub share_gpus: f64,
}

impl Fragmentation {
    /// The asked profiles' loss as a share of the MIG fleet's memory slices.
    pub fn mig_ratio(&self) -> f64 {
        if self.mig_slices == 0 {
            0.0
        } else {
            self.mix_slices / f64::from(self.mig_slices)
        }
    }

    /// FGD's fleet measure over the time-sliced GPUs (fraction of them).
    pub fn share_ratio(&self) -> f64 {
        if self.shared_gpus == 0 {
            0.0
        } else {
            self.share_gpus / f64::from(self.shared_gpus)
        }
    }
}

/// Measures every GPU's fragmentation against what tenants asked for in
/// the last 30 days (MIG profiles per model; share sizes), or the defaults
/// while there are fewer than 20 asks (every profile alike; the smallest
/// share).
pub async fn fragmentation(pool: &sqlx::PgPool, gpus: &[Gpu]) -> sqlx::Result<Fragmentation> {
    let profiles = db::bookings::recent_profile_counts(pool).await?;
    let shapes = ShareShapes::from_counts(&db::bookings::recent_share_counts(pool).await?);
    let live =
        db::bookings::placed_live(&mut *pool.acquire().await?, Some(Kind::Timeslice)).await?;
    let now = OffsetDateTime::now_utc().unix_timestamp();
    let window = Window {
        start: now,
        end: now + 1,
    };
    let mut out = Fragmentation::default();
    for g in gpus {
        let mut f = GpuFrag::default();
        if let Some(model) = catalog::model(&g.model).filter(|m| m.mig_capable() && g.mig_current) {
            let present = instances_of(g, model);
            let mix = ProfileMix::from_counts(
                profiles
                    .iter()
                    .filter(|c| c.0 == model.id)
                    .map(|c| (c.1.as_str(), c.2)),
            )
            .unwrap_or_else(|| mig::default_mix(model));
            let used: u32 = present.iter().map(|e| u32::from(e.placement.size)).sum();
            f.free_slices = u32::from(model.memory_slices).saturating_sub(used);
            f.stranded = mig::stranded_slices(model, &present, &mig::default_mix(model));
            f.mix_slices = mig::mix_fragmentation(model, &present, &mix);
            out.mig_slices += u32::from(model.memory_slices);
            out.free_slices += f.free_slices;
            out.stranded += f.stranded;
            out.mix_slices += f.mix_slices;
        } else if g.mode == GpuMode::Timeslice {
            let gpu = SharedGpu {
                node: 0,
                model: g.model.clone(),
                memory_gib: g.memory_mib as f64 / 1024.0,
                max_shares: u32::try_from(g.max_shares).unwrap_or(0),
                held: live
                    .iter()
                    .filter(|p| p.gpu_id == g.id)
                    .map(crate::booking::plan::share_held)
                    .collect(),
            };
            let v = shares::fragmentation(&gpu, window, &shapes);
            f.share_fraction = Some(v);
            out.shared_gpus += 1;
            out.share_gpus += v;
        }
        out.by_gpu.insert(g.id, f);
    }
    Ok(out)
}

/// The instances a MIG GPU reports, as the rule book sees them.
fn instances_of(gpu: &Gpu, model: &catalog::Model) -> Vec<Existing> {
    gpu.instances
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| {
            let p = model.profile(i["profile"].as_str()?)?;
            Some(Existing {
                profile_id: p.nvml_id,
                placement: Placement {
                    start: u8::try_from(i["start"].as_u64()?).ok()?,
                    size: p.memory_slices,
                },
            })
        })
        .collect()
}

const SLICE_PX: u32 = 44;

fn view(gpu: Gpu, frag: GpuFrag) -> GpuView {
    let slices = catalog::model(&gpu.model)
        .map(|m| u32::from(m.memory_slices))
        .unwrap_or(0);
    let mut blocks = Vec::new();
    let mut taken = vec![false; slices as usize];
    for inst in gpu.instances.as_array().into_iter().flatten() {
        let start = inst["start"].as_u64().unwrap_or(0) as u32;
        let size = inst["size"].as_u64().unwrap_or(0) as u32;
        let profile = inst["profile"].as_str().unwrap_or("?").to_string();
        for s in start..(start + size).min(slices) {
            taken[s as usize] = true;
        }
        blocks.push(Block {
            x: start * SLICE_PX,
            width: size * SLICE_PX,
            label: profile.split('.').next().unwrap_or("").to_string(),
            title: format!(
                "{profile} at memory slices {start}–{} {}",
                start + size - 1,
                inst["device_uuid"].as_str().unwrap_or("")
            ),
            used: true,
        });
    }
    for (s, t) in taken.iter().enumerate() {
        if !t {
            blocks.push(Block {
                x: s as u32 * SLICE_PX,
                width: SLICE_PX,
                label: String::new(),
                title: format!("memory slice {s}: free"),
                used: false,
            });
        }
    }
    let used_slices = taken.iter().filter(|t| **t).count() as u32;
    let stale = !gpu.healthy;
    GpuView {
        gpu,
        slices,
        blocks,
        used_slices,
        frag,
        stale,
        sparks: String::new(),
        alert: "",
        alerts_open: 0,
    }
}

/// Points of the last 24 hours at 5-minute steps.
const SPARK_POINTS: usize = 288;

/// Adds each GPU's sparklines and worst open alert.
async fn watch_views(pool: &sqlx::PgPool, views: &mut [GpuView]) -> Result<(), AppError> {
    let now = OffsetDateTime::now_utc();
    let since = now - time::Duration::hours(24);
    let ids: Vec<i64> = views.iter().map(|v| v.gpu.id).collect();
    let history = db::telemetry::gpu_history(pool, &ids, since).await?;
    let open = db::alerts::list(
        pool,
        &db::alerts::Filter {
            states: Some(vec![
                crate::domain::alerts::AlertState::Firing,
                crate::domain::alerts::AlertState::Pending,
            ]),
            limit: 10_000,
            ..Default::default()
        },
    )
    .await?;
    let step = 300.0;
    let mut by_gpu: HashMap<i64, Vec<&db::telemetry::GpuPoint>> = HashMap::new();
    for p in &history {
        by_gpu.entry(p.gpu_id).or_default().push(p);
    }
    let mut firing: HashMap<&str, Vec<&db::alerts::Alert>> = HashMap::new();
    for a in open
        .iter()
        .filter(|a| a.state == crate::domain::alerts::AlertState::Firing)
    {
        if let Some(g) = a.gpu_uuid.as_deref() {
            firing.entry(g).or_default().push(a);
        }
    }
    for v in views.iter_mut() {
        let mut util = vec![None; SPARK_POINTS];
        let mut temp = vec![None; SPARK_POINTS];
        let mut mem = vec![None; SPARK_POINTS];
        for p in by_gpu.get(&v.gpu.id).into_iter().flatten() {
            let i = ((p.at - since).as_seconds_f64() / step) as usize;
            if i < SPARK_POINTS {
                util[i] = p.utilization;
                temp[i] = p.temperature;
                mem[i] = p.memory_used_mib.map(|m| m / 1024.0);
            }
        }
        let last = |xs: &[Option<f64>]| xs.iter().rev().flatten().next().copied();
        let total = v.gpu.memory_mib as f64 / 1024.0;
        v.sparks = [
            charts::sparkline(
                &util,
                100.0,
                72,
                16,
                "spark-util",
                &format!(
                    "utilisation, last 24 h{}",
                    last(&util)
                        .map(|u| format!("; now {u:.0} %"))
                        .unwrap_or_default()
                ),
            ),
            charts::sparkline(
                &temp,
                100.0,
                72,
                16,
                "spark-temp",
                &format!(
                    "temperature, last 24 h{}",
                    last(&temp)
                        .map(|t| format!("; now {t:.0} °C"))
                        .unwrap_or_default()
                ),
            ),
            charts::sparkline(
                &mem,
                total,
                72,
                16,
                "spark-mem",
                &format!(
                    "memory used, last 24 h{}",
                    last(&mem)
                        .map(|m| format!("; now {m:.1} of {total:.0} GiB"))
                        .unwrap_or_default()
                ),
            ),
        ]
        .join("");
        let mine = firing.get(v.gpu.uuid.as_str()).cloned().unwrap_or_default();
        v.alerts_open = mine.len();
        v.alert = mine
            .iter()
            .map(|a| match a.severity {
                crate::domain::alerts::Severity::Critical
                | crate::domain::alerts::Severity::High => "critical",
                crate::domain::alerts::Severity::Warning => "warning",
                crate::domain::alerts::Severity::Info => "info",
            })
            .min_by_key(|s| match *s {
                "critical" => 0,
                "warning" => 1,
                _ => 2,
            })
            .unwrap_or("");
    }
    Ok(())
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/fleet.html")]
pub struct FleetPage {
    ctx: PageCtx,
    frag: Fragmentation,
    gpus: Vec<GpuView>,
    slice_px: u32,
    csrf: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/fleet_table.html")]
pub struct FleetTable {
    gpus: Vec<GpuView>,
    slice_px: u32,
    csrf: String,
}

pub async fn fleet(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    let list = db::fleet::list(&state.pool).await?;
    let frag = fragmentation(&state.pool, &list).await?;
    let mut gpus: Vec<GpuView> = list
        .into_iter()
        .map(|g| {
            let f = frag.by_gpu.get(&g.id).copied().unwrap_or_default();
            view(g, f)
        })
        .collect();
    watch_views(&state.pool, &mut gpus).await?;
    let ctx = PageCtx::new(&session, Some(&user)).await?;
    // htmx polls the table alone; a normal request gets the whole page.
    if headers.contains_key("hx-request") {
        return Ok(FleetTable {
            gpus,
            slice_px: SLICE_PX,
            csrf: ctx.csrf,
        }
        .into_response());
    }
    Ok(FleetPage {
        frag,
        csrf: ctx.csrf.clone(),
        ctx,
        gpus,
        slice_px: SLICE_PX,
    }
    .into_response())
}

async fn set_drained(
    state: &AppState,
    session: &Session,
    Admin(user): &Admin,
    id: i64,
    drained: bool,
) -> Result<Response, AppError> {
    let gpu = db::fleet::get(&state.pool, id).await?;
    let mut tx = state.pool.begin().await?;
    db::fleet::set_drained(&mut *tx, id, drained).await?;
    let action = if drained {
        "gpu.drained"
    } else {
        "gpu.undrained"
    };
    db::audit::record(
        &mut *tx,
        &user.actor(),
        action,
        &gpu.uuid,
        json!({"node": gpu.node, "index": gpu.idx}),
    )
    .await?;
    tx.commit().await?;
    let msg = if drained {
        format!(
            "GPU {} of {} is drained: it takes no new bookings.",
            gpu.idx, gpu.node
        )
    } else {
        format!("GPU {} of {} takes bookings again.", gpu.idx, gpu.node)
    };
    flash(session, msg).await?;
    Ok(Redirect::to("/admin/fleet").into_response())
}

#[derive(Debug, serde::Deserialize)]
pub struct ModeForm {
    #[serde(default)]
    mode: String,
}

/// Asks the node to switch an empty GPU between MIG and time-slice mode.
pub async fn switch_mode(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
    axum::Form(form): axum::Form<ModeForm>,
) -> Result<Response, AppError> {
    let gpu = db::fleet::get(&state.pool, id).await?;
    let mode = match form.mode.as_str() {
        "mig" => GpuMode::Mig,
        "timeslice" => GpuMode::Timeslice,
        other => {
            return Err(AppError::BadRequest(format!(
                "unknown mode \"{other}\": use mig or timeslice"
            )))
        }
    };
    if mode == GpuMode::Mig && !catalog::model(&gpu.model).is_some_and(|m| m.mig_capable()) {
        return Err(AppError::Conflict(format!(
            "{} cannot run in MIG mode",
            gpu.model
        )));
    }
    let mut tx = state.pool.begin().await?;
    if !db::fleet::request_mode(&mut *tx, id, mode).await? {
        return Err(AppError::Conflict(format!(
            "GPU {} of {} still has GPU instances; release them before switching its mode",
            gpu.idx, gpu.node
        )));
    }
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "gpu.mode_requested",
        &gpu.uuid,
        json!({"mode": mode}),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        format!(
            "GPU {} of {} switches to {mode} at its node's next report.",
            gpu.idx, gpu.node
        ),
    )
    .await?;
    Ok(Redirect::to("/admin/fleet").into_response())
}

pub async fn drain(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_drained(&state, &session, &Admin(user), id, true).await
}

pub async fn undrain(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_drained(&state, &session, &Admin(user), id, false).await
}

/// The fleet page and its GPU actions (admins).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/fleet", get(fleet))
        .route("/admin/gpus/{id}/drain", post(drain))
        .route("/admin/gpus/{id}/undrain", post(undrain))
        .route("/admin/gpus/{id}/mode", post(switch_mode))
}
