//! `GET /api/v1/calendar`: the address of the caller's iCalendar feed (a
//! tenant's with `?tenant=slug`, for its managers), made on first ask.

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;

use super::views::ErrorBody;
use crate::db::calendar::Feed;
use crate::web::auth::CurrentUser;
use crate::web::error::AppError;
use crate::web::AppState;

#[derive(Debug, Default, serde::Deserialize)]
pub struct CalendarQuery {
    tenant: Option<String>,
}

/// The feed's secret address.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct CalendarView {
    pub url: String,
}

/// The caller's calendar feed address (a tenant's for its managers).
#[utoipa::path(get, path = "/calendar",
    params(("tenant" = Option<String>, Query, description = "a tenant the caller manages")),
    responses(
        (status = 200, body = CalendarView),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub async fn calendar(
    State(state): State<AppState>,
    headers: HeaderMap,
    user: CurrentUser,
    Query(q): Query<CalendarQuery>,
) -> Result<Json<CalendarView>, AppError> {
    let tenant_id = match q.tenant.as_deref() {
        None | Some("") => None,
        Some(slug) => Some(crate::web::calendar::managed(&user, slug).ok_or(AppError::NotFound)?),
    };
    let url = crate::web::calendar::url_of(
        &state,
        &headers,
        Feed {
            user_id: user.user.id,
            tenant_id,
        },
    )
    .await?;
    Ok(Json(CalendarView { url }))
}
