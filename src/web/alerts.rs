//! Alerts for admins: `/admin/alerts` (open and past alerts with filters,
//! acknowledge and silence, the rules' settings, the notification outbox)
//! and a GPU's own page with its history, alerts and driver events.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::json;
use time::{Duration, OffsetDateTime};
use tower_sessions::Session;

use super::auth::Admin;
use super::charts::{self, Series};
use super::error::AppError;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db;
use crate::db::alerts::{Alert, Filter};
use crate::domain::alerts::{AlertState, Rule, RuleEdit, Severity};

/// Alerts on one page (open first, then newest; older on the next page).
const PAGE_ROWS: i64 = 200;

#[derive(Debug, Default, serde::Deserialize)]
pub struct AlertQuery {
    #[serde(default)]
    pub state: String,
    #[serde(default)]
    pub severity: String,
    #[serde(default)]
    pub rule: String,
    #[serde(default)]
    pub node: String,
    /// Alerts after this one (the "older" link).
    #[serde(default)]
    pub before: String,
}

impl AlertQuery {
    /// The filter, or a sentence saying which value is wrong.
    fn filter(&self) -> Result<Filter, AppError> {
        let states = match self.state.as_str() {
            "" | "open" => Some(vec![AlertState::Pending, AlertState::Firing]),
            "all" => None,
            s => Some(vec![AlertState::named(s).ok_or_else(|| {
                AppError::BadRequest(format!(
                    "state: \"{s}\" is not one of open, pending, firing, resolved, all"
                ))
            })?]),
        };
        let severity = match self.severity.as_str() {
            "" => None,
            s => Some(Severity::named(s).ok_or_else(|| {
                AppError::BadRequest(format!("severity: \"{s}\" is not a severity"))
            })?),
        };
        let text = |v: &str| (!v.trim().is_empty()).then(|| v.trim().to_string());
        Ok(Filter {
            states,
            severity,
            rule: text(&self.rule),
            node: text(&self.node),
            after: {
                let c = crate::web::cursor::Cursor::parse(Some(&self.before), "before")?;
                (!c.is_first()).then_some((c.open, c.at, c.id))
            },
            // One more than shown: whether an older page exists.
            limit: PAGE_ROWS + 1,
            ..Filter::default()
        })
    }
}

/// A rule row of the form, with what was typed when it was refused.
pub struct RuleRow {
    pub rule: Rule,
    pub threshold: String,
    pub for_secs: String,
    pub errors: Vec<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/alerts.html")]
pub struct AlertsPage {
    ctx: PageCtx,
    q: AlertQuery,
    alerts: Vec<Alert>,
    rules: Vec<RuleRow>,
    notifications: Vec<db::notify::Notification>,
    severities: Vec<&'static str>,
    rule_names: Vec<&'static str>,
    now: OffsetDateTime,
    csrf: String,
    older: Option<String>,
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/alerts_table.html")]
pub struct AlertsTable {
    alerts: Vec<Alert>,
    csrf: String,
    now: OffsetDateTime,
    q: AlertQuery,
    /// The cursor after the last alert shown, when more follow.
    older: Option<String>,
}

/// Cuts a fetched page to its size; the cursor of the next page if any.
fn cut(alerts: &mut Vec<Alert>) -> Option<String> {
    (alerts.len() as i64 > PAGE_ROWS).then(|| {
        alerts.truncate(PAGE_ROWS as usize);
        alerts.last().map(cursor_after).unwrap_or_default()
    })
}

/// The cursor after an alert, in the list's order (open first, newest).
pub fn cursor_after(a: &Alert) -> String {
    crate::web::cursor::Cursor::after(a.state != AlertState::Resolved, a.started_at, a.id).encode()
}

fn rows(rules: Vec<Rule>) -> Vec<RuleRow> {
    rules
        .into_iter()
        .map(|r| RuleRow {
            threshold: r.threshold.to_string(),
            for_secs: r.for_secs.to_string(),
            rule: r,
            errors: Vec::new(),
        })
        .collect()
}

async fn page(
    state: &AppState,
    session: &Session,
    admin: &Admin,
    q: AlertQuery,
    rules: Vec<RuleRow>,
) -> Result<AlertsPage, AppError> {
    let mut alerts = db::alerts::list(&state.pool, &q.filter()?).await?;
    let older = cut(&mut alerts);
    let notifications = db::notify::recent(&state.pool, 50).await?;
    let ctx = PageCtx::new(session, Some(&admin.0)).await?;
    Ok(AlertsPage {
        csrf: ctx.csrf.clone(),
        ctx,
        q,
        alerts,
        rules,
        notifications,
        severities: Severity::ALL.iter().map(|s| s.as_str()).collect(),
        rule_names: crate::domain::alerts::RULES.to_vec(),
        now: OffsetDateTime::now_utc(),
        older,
    })
}

pub async fn alerts(
    State(state): State<AppState>,
    session: Session,
    admin: Admin,
    headers: HeaderMap,
    Query(q): Query<AlertQuery>,
) -> Result<Response, AppError> {
    if headers.contains_key("hx-request") {
        let mut alerts = db::alerts::list(&state.pool, &q.filter()?).await?;
        let older = cut(&mut alerts);
        let ctx = PageCtx::new(&session, Some(&admin.0)).await?;
        return Ok(AlertsTable {
            alerts,
            csrf: ctx.csrf,
            now: OffsetDateTime::now_utc(),
            q,
            older,
        }
        .into_response());
    }
    let rules = rows(db::alerts::rules(&state.pool).await?);
    Ok(page(&state, &session, &admin, q, rules)
        .await?
        .into_response())
}

async fn open_alert(state: &AppState, id: i64) -> Result<Alert, AppError> {
    db::alerts::get(&state.pool, id)
        .await?
        .ok_or(AppError::NotFound)
}

pub async fn acknowledge(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    let a = open_alert(&state, id).await?;
    let mut tx = state.pool.begin().await?;
    if !db::alerts::acknowledge(&mut *tx, id, user.user.id).await? {
        return Err(AppError::Conflict(format!(
            "alert #{id} is resolved; there is nothing to acknowledge"
        )));
    }
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "alert.acknowledged",
        &format!("alert #{id}"),
        json!({"rule": a.rule}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, format!("Alert #{id} acknowledged.")).await?;
    Ok(Redirect::to("/admin/alerts").into_response())
}

#[derive(Debug, serde::Deserialize)]
pub struct SilenceForm {
    #[serde(default)]
    hours: String,
}

pub async fn silence(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
    axum::Form(form): axum::Form<SilenceForm>,
) -> Result<Response, AppError> {
    let a = open_alert(&state, id).await?;
    let hours: i64 = match form.hours.trim().parse() {
        Ok(h) if (0..=720).contains(&h) => h,
        _ => {
            return Err(AppError::BadRequest(
                "hours: give whole hours from 0 (unsilence) to 720".into(),
            ))
        }
    };
    let until = (hours > 0).then(|| OffsetDateTime::now_utc() + Duration::hours(hours));
    let mut tx = state.pool.begin().await?;
    db::alerts::silence(&mut *tx, id, until).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "alert.silenced",
        &format!("alert #{id}"),
        json!({"rule": a.rule, "hours": hours}),
    )
    .await?;
    tx.commit().await?;
    let msg = if hours == 0 {
        format!("Alert #{id} notifies again.")
    } else {
        format!("Alert #{id} is silenced for {hours} h: it stays on this page but sends nothing.")
    };
    flash(&session, msg).await?;
    Ok(Redirect::to("/admin/alerts").into_response())
}

#[derive(Debug, serde::Deserialize)]
pub struct RuleForm {
    #[serde(default)]
    threshold: String,
    #[serde(default)]
    for_secs: String,
    #[serde(default)]
    severity: String,
    /// A checkbox: present when ticked.
    enabled: Option<String>,
}

pub async fn update_rule(
    State(state): State<AppState>,
    session: Session,
    admin: Admin,
    Path(name): Path<String>,
    axum::Form(form): axum::Form<RuleForm>,
) -> Result<Response, AppError> {
    let rule = db::alerts::rule(&state.pool, &name)
        .await?
        .ok_or(AppError::NotFound)?;
    let edit = RuleEdit {
        threshold: Some(form.threshold.clone()),
        for_secs: Some(form.for_secs.clone()),
        severity: Some(form.severity.clone()),
        enabled: Some(form.enabled.is_some()),
    };
    match rule.edited(&edit) {
        Ok(new) => {
            let mut tx = state.pool.begin().await?;
            db::alerts::update_rule(&mut *tx, &new).await?;
            db::audit::record(
                &mut *tx,
                &admin.0.actor(),
                "alert_rule.update",
                &new.name,
                json!({"before": rule, "after": new}),
            )
            .await?;
            tx.commit().await?;
            flash(&session, format!("Rule {} saved.", new.name)).await?;
            Ok(Redirect::to("/admin/alerts#rules").into_response())
        }
        Err(errors) => {
            // Re-render with what was typed and why it was refused.
            let mut rules = rows(db::alerts::rules(&state.pool).await?);
            if let Some(r) = rules.iter_mut().find(|r| r.rule.name == name) {
                r.threshold = form.threshold;
                r.for_secs = form.for_secs;
                r.errors = errors.into_iter().map(|e| e.1).collect();
            }
            let p = page(&state, &session, &admin, AlertQuery::default(), rules).await?;
            Ok((StatusCode::UNPROCESSABLE_ENTITY, p).into_response())
        }
    }
}

pub async fn resend(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    let mut tx = state.pool.begin().await?;
    if !db::notify::resend(&mut *tx, id).await? {
        return Err(AppError::Conflict(format!(
            "notification #{id} is not failed or unconfirmed; it is not sent again"
        )));
    }
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "notification.resend",
        &format!("notification #{id}"),
        json!({}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, format!("Notification #{id} will be sent again.")).await?;
    Ok(Redirect::to("/admin/alerts#outbox").into_response())
}

#[derive(Template, WebTemplate)]
#[template(path = "admin/gpu.html")]
pub struct GpuPage {
    ctx: PageCtx,
    gpu: db::fleet::Gpu,
    latest: Option<db::telemetry::Latest>,
    charts: Vec<String>,
    alerts: Vec<Alert>,
    events: Vec<db::telemetry::Event>,
    now: OffsetDateTime,
}

/// `GET /admin/gpus/{id}`: a GPU's last 24 hours, its alerts and events.
pub async fn gpu(
    State(state): State<AppState>,
    session: Session,
    admin: Admin,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    let gpu = match db::fleet::get(&state.pool, id).await {
        Ok(g) => g,
        Err(sqlx::Error::RowNotFound) => return Err(AppError::NotFound),
        Err(e) => return Err(e.into()),
    };
    let since = OffsetDateTime::now_utc() - Duration::hours(24);
    let points = db::telemetry::gpu_history(&state.pool, &[id], since).await?;
    let latest = db::telemetry::latest(&state.pool, 3600.0 * 24.0)
        .await?
        .into_iter()
        .find(|l| l.gpu_id == id);
    let series = |f: fn(&db::telemetry::GpuPoint) -> Option<f64>| {
        points.iter().map(|p| (p.at, f(p))).collect::<Vec<_>>()
    };
    let mem_total = gpu.memory_mib as f64 / 1024.0;
    let charts = vec![
        charts::line_chart(
            &[Series {
                label: "utilisation (%)",
                class: "line-a",
                points: series(|p| p.utilization),
            }],
            100.0,
            " %",
            if gpu.mig_current {
                "Utilisation, last 24 hours (in MIG mode the GPU reports none as a whole; see its bookings)"
            } else {
                "Utilisation, last 24 hours"
            },
        ),
        charts::line_chart(
            &[Series {
                label: "temperature (°C)",
                class: "line-b",
                points: series(|p| p.temperature),
            }],
            100.0,
            " °C",
            "Temperature, last 24 hours",
        ),
        charts::line_chart(
            &[Series {
                label: "memory used (GiB)",
                class: "line-a",
                points: series(|p| p.memory_used_mib.map(|m| m / 1024.0)),
            }],
            mem_total,
            " GiB",
            "Memory used, last 24 hours",
        ),
    ];
    let alerts = db::alerts::list(
        &state.pool,
        &Filter {
            gpu_uuid: Some(gpu.uuid.clone()),
            limit: 100,
            ..Filter::default()
        },
    )
    .await?;
    let events = db::telemetry::events(&state.pool, id, 50).await?;
    Ok(GpuPage {
        ctx: PageCtx::new(&session, Some(&admin.0)).await?,
        gpu,
        latest,
        charts,
        alerts,
        events,
        now: OffsetDateTime::now_utc(),
    }
    .into_response())
}

/// How long ago, in words.
pub fn ago(now: &OffsetDateTime, t: &OffsetDateTime) -> String {
    let s = (*now - *t).whole_seconds().max(0);
    match s {
        0..=59 => format!("{s} s ago"),
        60..=3599 => format!("{} min ago", s / 60),
        3600..=86_399 => format!("{} h {} min ago", s / 3600, s % 3600 / 60),
        _ => format!("{} days ago", s / 86_400),
    }
}

/// The alerts pages (admins).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/alerts", get(alerts))
        .route("/admin/alerts/{id}/ack", post(acknowledge))
        .route("/admin/alerts/{id}/silence", post(silence))
        .route("/admin/alerts/rules/{name}", post(update_rule))
        .route("/admin/notifications/{id}/resend", post(resend))
        .route("/admin/gpus/{id}", get(gpu))
}
