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

/// Alerts one answer carries (open first, then newest); a `Link: rel="next"`
/// header leads on.
const MAX_ALERTS: i64 = 500;

#[derive(Debug, Default, serde::Deserialize)]
pub struct AlertsQuery {
    state: Option<String>,
    /// The last alert of the previous page (from the `Link` header).
    cursor: Option<String>,
}

/// Alerts by state: `firing` (the default), `resolved` or `all`.
#[utoipa::path(get, path = "/alerts",
    params(
        ("state" = Option<String>, Query, description = "firing (default), resolved or all"),
        ("cursor" = Option<String>, Query, description = "the next page, as the Link header's rel=\"next\" gives it"),
    ),
    responses(
        (status = 200, body = Vec<AlertView>, description = "a page; `Link: <…>; rel=\"next\"` when more follow"),
        (status = 401, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn alerts(
    State(state): State<AppState>,
    user: CurrentUser,
    Query(q): Query<AlertsQuery>,
) -> Result<axum::response::Response, AppError> {
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
        after: {
            let c = crate::web::cursor::Cursor::parse(q.cursor.as_deref(), "cursor")?;
            (!c.is_first()).then_some((c.open, c.at, c.id))
        },
        limit: MAX_ALERTS + 1,
        ..Default::default()
    };
    let mut list = db::alerts::list(&state.pool, &filter).await?;
    let next = (list.len() as i64 > MAX_ALERTS).then(|| {
        list.truncate(MAX_ALERTS as usize);
        list.last()
            .map(crate::web::alerts::cursor_after)
            .unwrap_or_default()
    });
    let body: Vec<AlertView> = list.into_iter().map(AlertView::from).collect();
    let mut resp = axum::response::IntoResponse::into_response(Json(body));
    if let Some(id) = next {
        let state_param = q.state.as_deref().unwrap_or("firing");
        if let Ok(v) = axum::http::HeaderValue::from_str(&format!(
            "</api/v1/alerts?state={state_param}&cursor={id}>; rel=\"next\""
        )) {
            resp.headers_mut().insert(axum::http::header::LINK, v);
        }
    }
    Ok(resp)
}
