//! Alerts for scripts: admins see every alert; everyone else the alerts
//! on their own bookings.

use axum::extract::{Query, State};
use axum::Json;

use super::views::{AlertView, ErrorBody};
use crate::db;
use crate::domain::alerts::AlertState;
use crate::web::auth::CurrentUser;
use crate::web::error::AppError;
use crate::web::AppState;

/// Most alerts one answer carries (newest first).
const MAX_ALERTS: i64 = 1_000;

#[derive(Debug, Default, serde::Deserialize)]
pub struct AlertsQuery {
    state: Option<String>,
}

/// Alerts by state: `firing` (the default), `resolved` or `all`.
#[utoipa::path(get, path = "/alerts",
    params(("state" = Option<String>, Query, description = "firing (default), resolved or all")),
    responses(
        (status = 200, body = Vec<AlertView>),
        (status = 401, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn alerts(
    State(state): State<AppState>,
    user: CurrentUser,
    Query(q): Query<AlertsQuery>,
) -> Result<Json<Vec<AlertView>>, AppError> {
    let states = match q.state.as_deref().unwrap_or("firing") {
        "firing" => Some(vec![AlertState::Firing]),
        "resolved" => Some(vec![AlertState::Resolved]),
        "all" => None,
        other => {
            return Err(AppError::Invalid(vec![(
                "state".into(),
                format!("\"{other}\" is not one of firing, resolved, all"),
            )]))
        }
    };
    let filter = db::alerts::Filter {
        states,
        owner: (!user.is_admin()).then_some(user.user.id),
        limit: MAX_ALERTS,
        ..Default::default()
    };
    let list = db::alerts::list(&state.pool, &filter).await?;
    Ok(Json(list.into_iter().map(AlertView::from).collect()))
}
