//! `/admin/security`: the security monitor's incidents with their
//! evidence; an admin closes one with a note (audited), which resolves its
//! alert and lets a share the node froze run again.

use std::collections::HashMap;

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use tower_sessions::Session;

use super::auth::Admin;
use super::error::AppError;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db::{self, security::Evidence, security::Incident};

/// Incidents a page lists.
const PAGE: i64 = 200;
/// Longest closing note.
pub const NOTE_MAX: usize = 2000;

#[derive(Template, WebTemplate)]
#[template(path = "admin/security.html")]
pub struct SecurityPage {
    ctx: PageCtx,
    closed: bool,
    incidents: Vec<(Incident, Vec<Evidence>)>,
    threshold: f64,
    /// A closing note that was refused: the incident and why.
    error: Option<(i64, String)>,
}

impl SecurityPage {
    /// Where the subject links to, and its words.
    pub fn subject(&self, i: &Incident) -> (Option<String>, String) {
        let (kind, rest) = i.subject.split_once(':').unwrap_or(("", &i.subject));
        match kind {
            "booking" => (
                Some(format!("/bookings/{rest}")),
                format!("booking #{rest}"),
            ),
            "account" => (
                Some(format!("/admin/users/{rest}")),
                i.user_email
                    .clone()
                    .unwrap_or_else(|| format!("account #{rest}")),
            ),
            "address" => (None, format!("address {rest}")),
            "uid" => (None, format!("Unix uid {rest}")),
            "device" => (None, format!("device {rest}")),
            _ => (None, i.subject.clone()),
        }
    }

    pub fn alerting(&self, i: &Incident) -> bool {
        i.alert_id.is_some()
    }
}

#[derive(serde::Deserialize)]
pub struct Filter {
    #[serde(default)]
    state: Option<String>,
}

async fn render(
    state: &AppState,
    session: &Session,
    user: &super::auth::CurrentUser,
    closed: bool,
    error: Option<(i64, String)>,
) -> Result<SecurityPage, AppError> {
    let list = db::security::list(&state.pool, closed, PAGE).await?;
    let ids: Vec<i64> = list.iter().map(|i| i.id).collect();
    let mut evidence: HashMap<i64, Vec<Evidence>> = HashMap::new();
    for e in db::security::evidence(&state.pool, &ids).await? {
        evidence.entry(e.incident_id).or_default().push(e);
    }
    let threshold = db::alerts::rule(&state.pool, crate::watch::security::RULE)
        .await?
        .map(|r| r.threshold)
        .unwrap_or(5.0);
    Ok(SecurityPage {
        ctx: PageCtx::new(session, Some(user)).await?,
        closed,
        incidents: list
            .into_iter()
            .map(|i| {
                let e = evidence.remove(&i.id).unwrap_or_default();
                (i, e)
            })
            .collect(),
        threshold,
        error,
    })
}

pub async fn page(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Query(f): Query<Filter>,
) -> Result<SecurityPage, AppError> {
    let closed = match f.state.as_deref() {
        None | Some("open") => false,
        Some("closed") => true,
        Some(_) => return Err(AppError::BadRequest("state: give open or closed".into())),
    };
    render(&state, &session, &user, closed, None).await
}

#[derive(serde::Deserialize)]
pub struct CloseForm {
    #[serde(default)]
    note: String,
}

/// Closes an incident with a note.
pub async fn close(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
    axum::Form(form): axum::Form<CloseForm>,
) -> Result<Response, AppError> {
    let incident = db::security::get(&state.pool, id)
        .await?
        .ok_or(AppError::NotFound)?;
    let note = form.note.trim();
    let refused = if note.is_empty() {
        Some("Say what you found or did: the note is what the next admin reads.".to_string())
    } else if note.chars().count() > NOTE_MAX {
        Some(format!("A note has at most {NOTE_MAX} characters."))
    } else {
        None
    };
    if let Some(why) = refused {
        let page = render(&state, &session, &user, false, Some((id, why))).await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    }
    if incident.state != "open"
        || !crate::watch::security::close(&state.pool, id, &user.actor(), note)
            .await
            .map_err(AppError::Internal)?
    {
        return Err(AppError::Conflict(format!(
            "incident #{id} is closed already"
        )));
    }
    flash(&session, format!("Incident #{id} is closed.")).await?;
    Ok(Redirect::to("/admin/security").into_response())
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/admin/security", get(page))
        .route("/admin/security/{id}/close", post(close))
}
