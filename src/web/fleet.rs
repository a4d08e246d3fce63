//! The admin fleet page: nodes and GPUs with their mode, health and last
//! heartbeat, and for each MIG GPU a drawing of its memory slices showing
//! which instance holds which, so fragmentation is visible at a glance.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use serde_json::json;
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::error::AppError;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db::{self, fleet::Gpu};
use crate::gpu::catalog;

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
    /// Free memory slices no profile of the mix can use (fragmentation).
    pub stranded: u32,
    pub stale: bool,
}

/// Free and stranded memory slices of a GPU as the fleet page and
/// `/metrics` report them (MIG GPUs only; zeros otherwise).
pub fn slice_use(gpu: &Gpu) -> (u32, u32) {
    let Some(model) = catalog::model(&gpu.model).filter(|m| m.mig_capable() && gpu.mig_current)
    else {
        return (0, 0);
    };
    let instances: Vec<(String, u8)> = gpu
        .instances
        .as_array()
        .into_iter()
        .flatten()
        .map(|i| {
            (
                i["profile"].as_str().unwrap_or("").to_string(),
                i["start"].as_u64().unwrap_or(0) as u8,
            )
        })
        .collect();
    let used: u32 = instances
        .iter()
        .filter_map(|(n, _)| model.profile(n).map(|p| u32::from(p.memory_slices)))
        .sum();
    let free = u32::from(model.memory_slices).saturating_sub(used);
    let stranded = crate::placement::mig::stranded_for(
        model,
        &instances,
        &crate::placement::mig::default_mix(model),
    );
    (free, stranded)
}

const SLICE_PX: u32 = 44;

fn view(gpu: Gpu) -> GpuView {
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
    let (_, stranded) = slice_use(&gpu);
    GpuView {
        gpu,
        slices,
        blocks,
        used_slices,
        stranded,
        stale,
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/fleet.html")]
pub struct FleetPage {
    ctx: PageCtx,
    free_slices: u32,
    stranded_slices: u32,
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
    user: CurrentUser,
    headers: HeaderMap,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let gpus: Vec<GpuView> = db::fleet::list(&state.pool)
        .await?
        .into_iter()
        .map(view)
        .collect();
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
    let (free_slices, stranded_slices) = gpus.iter().fold((0, 0), |(f, s), v| {
        let (vf, vs) = slice_use(&v.gpu);
        (f + vf, s + vs)
    });
    Ok(FleetPage {
        free_slices,
        stranded_slices,
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
    user: &CurrentUser,
    id: i64,
    drained: bool,
) -> Result<Response, AppError> {
    user.require_admin()?;
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
    user: CurrentUser,
    Path(id): Path<i64>,
    axum::Form(form): axum::Form<ModeForm>,
) -> Result<Response, AppError> {
    user.require_admin()?;
    let gpu = db::fleet::get(&state.pool, id).await?;
    let mode = match form.mode.as_str() {
        m @ ("mig" | "timeslice") => m,
        other => {
            return Err(AppError::BadRequest(format!(
                "unknown mode \"{other}\": use mig or timeslice"
            )))
        }
    };
    if mode == "mig" && !catalog::model(&gpu.model).is_some_and(|m| m.mig_capable()) {
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
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_drained(&state, &session, &user, id, true).await
}

pub async fn undrain(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    set_drained(&state, &session, &user, id, false).await
}
