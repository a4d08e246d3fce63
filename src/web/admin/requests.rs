//! The allocation-request queue (`/admin/requests`): pending requests
//! oldest first, each approved as asked, amended (other amounts) or
//! declined with a note; the requester hears by e-mail. The quota changes
//! in the same transaction as the decision, under the tenant's row lock
//! (the lock bookings take for their quota check).

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use serde_json::json;
use tower_sessions::Session;

use crate::db::{self, manage::AllocationRequest};
use crate::domain::{Allocation, AllocationInput};
use crate::web::auth::{Admin, CurrentUser};
use crate::web::error::AppError;
use crate::web::forms::FieldErrors;
use crate::web::pages::{flash, PageCtx};
use crate::web::tenant::{changes, note};
use crate::web::AppState;

/// Decided requests the queue still shows below the pending ones.
const DECIDED_SHOWN: i64 = 50;

#[derive(Template, WebTemplate)]
#[template(path = "admin/requests.html")]
pub struct RequestsPage {
    ctx: PageCtx,
    requests: Vec<AllocationRequest>,
    pending: usize,
    /// The request a failed decision was about, with its messages and what
    /// was typed.
    failed: Option<(i64, FieldErrors, DecisionForm)>,
    can_withdraw: bool,
}

impl RequestsPage {
    /// The decision form's amounts for a request: as typed after an
    /// error, else as asked.
    fn amounts_for(&self, r: &AllocationRequest) -> Vec<(&'static str, &'static str, String)> {
        let typed: Option<AllocationInput> = match &self.failed {
            Some((id, _, f)) if *id == r.id => Some(f.amounts.clone()),
            _ => r.asked().map(Into::into),
        };
        let Some(t) = typed else { return Vec::new() };
        let values = [
            t.max_active_bookings,
            t.max_gpu_memory_gib,
            t.max_compute_slices,
            t.monthly_slice_hours,
            t.max_booking_hours,
        ];
        r.asked()
            .map(|a| a.rows())
            .into_iter()
            .flatten()
            .zip(values)
            .map(|(row, v)| (row.0, row.1, v))
            .collect()
    }

    fn error_for(&self, r: &AllocationRequest, field: &str) -> Option<String> {
        match &self.failed {
            Some((i, e, _)) if *i == r.id => e.get(field).cloned(),
            _ => None,
        }
    }

    fn note_for(&self, r: &AllocationRequest) -> String {
        match &self.failed {
            Some((i, _, f)) if *i == r.id => f.note.clone(),
            _ => String::new(),
        }
    }
}

async fn page(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    failed: Option<(i64, FieldErrors, DecisionForm)>,
) -> Result<RequestsPage, AppError> {
    let requests = db::manage::queue(&state.pool, DECIDED_SHOWN).await?;
    Ok(RequestsPage {
        ctx: PageCtx::new(session, Some(user)).await?,
        pending: requests.iter().filter(|r| r.state == "pending").count(),
        requests,
        failed,
        can_withdraw: false,
    })
}

/// `GET /admin/requests`.
pub async fn requests(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
) -> Result<RequestsPage, AppError> {
    page(&state, &session, &user, None).await
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct DecisionForm {
    /// `approve`, `amend` or `decline`.
    pub decision: String,
    #[serde(flatten)]
    pub amounts: AllocationInput,
    pub note: String,
}

/// `POST /admin/requests/{id}`: approve, amend or decline.
pub async fn decide(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
    Form(form): Form<DecisionForm>,
) -> Result<Response, AppError> {
    let mut errors = FieldErrors::default();
    let mut tx = state.pool.begin().await?;
    let request = db::manage::request_for_update(&mut tx, id)
        .await?
        .ok_or(AppError::NotFound)?;
    if request.state != "pending" {
        return Err(AppError::Conflict(format!(
            "request #{id} was {} already",
            request.state
        )));
    }
    let tenant = db::tenants::get_for_update(&mut tx, request.tenant_id).await?;
    if tenant.archived && form.decision.trim() != "decline" {
        return Err(AppError::Conflict(format!(
            "{} is archived: its quota cannot change (decline the request instead)",
            tenant.name
        )));
    }
    let asked = request
        .asked()
        .ok_or_else(|| AppError::Internal(anyhow::anyhow!("request #{id} has no amounts")))?;
    let decision = form.decision.trim();
    let granted: Option<Allocation> = match decision {
        "approve" => Some(asked),
        "amend" => match form.amounts.parse(&tenant.quota) {
            Ok(a) if a == asked => {
                errors.add(
                    "max_active_bookings",
                    "these are the amounts asked for: approve instead",
                );
                None
            }
            Ok(a) => Some(a),
            Err(list) => {
                for (f, m) in list {
                    errors.add(f, m);
                }
                None
            }
        },
        "decline" => None,
        _ => {
            errors.add("decision", "choose approve, amend or decline");
            None
        }
    };
    let text = note(&form.note, decision == "decline", "a note saying why")
        .map_err(|e| errors.add("note", e))
        .ok()
        .flatten();
    if !errors.is_empty() {
        drop(tx);
        let p = page(&state, &session, &user, Some((id, errors, form))).await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, p).into_response());
    }
    let state_name = match decision {
        "approve" => "approved",
        "amend" => "amended",
        _ => "declined",
    };
    if let Some(g) = granted {
        db::tenants::update(
            &mut tx,
            tenant.id,
            &tenant.name,
            &g.applied_to(&tenant.quota),
        )
        .await?;
    }
    db::manage::decide(
        &mut tx,
        id,
        state_name,
        granted,
        Some(user.user.id),
        text.as_deref(),
    )
    .await?;
    let before = Allocation::of(&tenant.quota);
    db::audit::record(
        &mut *tx,
        &user.actor(),
        &format!("allocation.{state_name}"),
        &tenant.slug,
        json!({"request": id, "asked": asked, "granted": granted, "before": before, "note": text}),
    )
    .await?;
    if let Some(requester) = request.requested_by {
        let outcome = match granted {
            Some(g) => format!(
                "{} the request: {}'s quota is now\n\n{}",
                state_name,
                tenant.name,
                changes(before, g)
            ),
            None => format!("declined the request for {}.", tenant.name),
        };
        let body = format!(
            "{} {outcome}{}\n\nSee /tenants/{}.",
            user.user.email,
            text.as_deref()
                .map(|n| format!("\n\nNote: {n}"))
                .unwrap_or_default(),
            tenant.slug
        );
        db::notify::email_user(
            &mut tx,
            requester,
            &db::notify::Message {
                topic: "allocation",
                subject: &format!("Allocation request for {}: {state_name}", tenant.name),
                body: &body,
                alert_id: None,
                booking_id: None,
            },
        )
        .await?;
    }
    tx.commit().await?;
    flash(
        &session,
        format!("Request #{id} for {} {state_name}.", tenant.name),
    )
    .await?;
    Ok(Redirect::to("/admin/requests").into_response())
}
