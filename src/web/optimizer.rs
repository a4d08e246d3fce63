//! `/admin/optimizer`: each GPU and model over the last 7 days (mean
//! utilisation, booked share of its compute), advice in the design
//! source's terms (under 60 %: consolidate; over 90 %: capacity is short,
//! with the queue's waits as evidence), and the optimization history, where
//! an admin can give a lowered share its priority back.

use std::collections::{BTreeMap, HashMap};

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use tower_sessions::Session;

use super::auth::Admin;
use super::error::AppError;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db::{self, optimizer::Action};

/// Under this busy share (%) over 7 days a GPU or model is underused.
pub const LOW_PCT: f64 = 60.0;
/// Over this busy share (%) capacity is short.
pub const HIGH_PCT: f64 = 90.0;

/// The advice for a GPU or model: `busy` is its mean utilisation where
/// measured, else its booked share; `mig`: in MIG mode; `wait_min`: the
/// mean wait of queued bookings of the model.
pub fn advice(busy: Option<f64>, mig: bool, wait_min: Option<f64>) -> (&'static str, String) {
    match busy {
        None => ("", "no measurements in the last 7 days".into()),
        Some(b) if b < LOW_PCT => (
            "sev-warning",
            if mig {
                format!("{b:.0} % busy: consolidate bookings onto fewer GPUs, or give this one the layout (or time-slice mode) that tenants ask for")
            } else {
                format!("{b:.0} % busy: consolidate shares onto fewer GPUs, or switch it to MIG if tenants ask for instances")
            },
        ),
        Some(b) if b > HIGH_PCT => (
            "sev-critical",
            match wait_min {
                Some(w) => format!("{b:.0} % busy: capacity is short; queued bookings waited {w:.0} min on average"),
                None => format!("{b:.0} % busy: capacity is short"),
            },
        ),
        Some(b) => ("ok", format!("{b:.0} % busy: well used")),
    }
}

pub struct GpuRow {
    pub node: String,
    pub idx: i32,
    pub model: String,
    pub mode: String,
    pub util: String,
    pub booked: String,
    pub class: &'static str,
    pub advice: String,
}

pub struct ModelRow {
    pub model: String,
    pub gpus: usize,
    pub util: String,
    pub booked: String,
    pub waits: String,
    pub class: &'static str,
    pub advice: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/optimizer.html")]
pub struct OptimizerPage {
    ctx: PageCtx,
    gpus: Vec<GpuRow>,
    models: Vec<ModelRow>,
    history: Vec<(Action, bool)>,
}

/// The share of a GPU's compute booked over the 7 days: slice-seconds
/// over the slices it has (4 on an A30 in MIG mode, else 7) for 7 days.
fn booked_pct(g: &db::optimizer::GpuWeek) -> Option<f64> {
    let slices = match crate::gpu::catalog::model(&g.model) {
        Some(m) if g.mode == "mig" && m.compute_slices > 0 => f64::from(m.compute_slices),
        _ => f64::from(crate::domain::booking::SLICES_PER_GPU),
    };
    Some(100.0 * g.booked_slice_secs / (slices * 7.0 * 86_400.0))
}

fn pct(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.0} %")).unwrap_or_else(|| "–".into())
}

fn mean(xs: impl Iterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = xs.flatten().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

pub async fn page(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
) -> Result<OptimizerPage, AppError> {
    let week: Vec<(db::optimizer::GpuWeek, Option<f64>)> = db::optimizer::gpu_week(&state.pool)
        .await?
        .into_iter()
        .map(|g| {
            let booked = booked_pct(&g);
            (g, booked)
        })
        .collect();
    let waits: HashMap<String, (i64, f64)> = db::optimizer::queue_waits(&state.pool)
        .await?
        .into_iter()
        .map(|(m, n, w)| (m, (n, w)))
        .collect();
    let gpus = week
        .iter()
        .map(|(g, booked_pct)| {
            let busy = g.mean_util.or(*booked_pct);
            let (class, advice) = advice(busy, g.mode == "mig", waits.get(&g.model).map(|w| w.1));
            GpuRow {
                node: g.node.clone(),
                idx: g.idx,
                model: g.model.clone(),
                mode: g.mode.clone(),
                util: pct(g.mean_util),
                booked: pct(*booked_pct),
                class,
                advice,
            }
        })
        .collect();
    let mut by_model: BTreeMap<&str, Vec<&(db::optimizer::GpuWeek, Option<f64>)>> = BTreeMap::new();
    for g in &week {
        by_model.entry(g.0.model.as_str()).or_default().push(g);
    }
    let models = by_model
        .into_iter()
        .map(|(model, gs)| {
            let util = mean(gs.iter().map(|g| g.0.mean_util));
            let booked = mean(gs.iter().map(|g| g.1));
            let wait = waits.get(model);
            let (class, advice) = advice(
                util.or(booked),
                gs.iter().all(|g| g.0.mode == "mig"),
                wait.map(|w| w.1),
            );
            ModelRow {
                model: model.to_string(),
                gpus: gs.len(),
                util: pct(util),
                booked: pct(booked),
                waits: wait
                    .map(|(n, w)| format!("{n} waited {w:.0} min on average"))
                    .unwrap_or_else(|| "none queued".into()),
                class,
                advice,
            }
        })
        .collect();
    let history = db::optimizer::history(&state.pool, 200).await?;
    Ok(OptimizerPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        gpus,
        models,
        history,
    })
}

/// An admin gives a share the optimizer lowered its priority back.
pub async fn reverse(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    let a = db::optimizer::action(&state.pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    let Some(booking) = a.booking_id.filter(|_| a.action == "priority_lowered") else {
        return Err(AppError::Conflict(
            "only a lowered priority can be given back".into(),
        ));
    };
    let done = crate::watch::optimizer::restore(&state.pool, booking, &user.user.email, None)
        .await
        .map_err(AppError::Internal)?;
    if !done {
        return Err(AppError::Conflict(format!(
            "booking {booking} has its own priority already"
        )));
    }
    db::audit::record(
        &state.pool,
        &user.actor(),
        "optimizer.reversed",
        &format!("booking {booking}"),
        serde_json::json!({ "action": id }),
    )
    .await?;
    flash(
        &session,
        format!("Booking {booking} has its priority back."),
    )
    .await?;
    Ok(Redirect::to("/admin/optimizer").into_response())
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/optimizer", get(page))
        .route("/admin/optimizer/actions/{id}/reverse", post(reverse))
}

#[cfg(test)]
mod tests {
    use super::advice;

    #[test]
    fn advice_follows_the_60_and_90_percent_marks() {
        assert_eq!(advice(Some(30.0), true, None).0, "sev-warning");
        assert!(advice(Some(30.0), true, None).1.contains("consolidate"));
        assert_eq!(advice(Some(75.0), false, None).0, "ok");
        let (class, text) = advice(Some(95.0), true, Some(42.0));
        assert_eq!(class, "sev-critical");
        assert!(text.contains("waited 42 min"), "{text}");
        assert_eq!(advice(None, true, None).0, "");
    }
}
