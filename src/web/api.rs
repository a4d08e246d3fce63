//! The JSON API under `/api/v1`, authenticated by bearer token (or the
//! browser session). Errors are `{"error","message"}` (see `error.rs`).

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::Json;
use serde_json::{json, Value};

use super::auth::CurrentUser;
use super::error::AppError;
use super::AppState;
use crate::db;

/// `GET /api/v1/me`: who the token belongs to, and their tenants.
pub async fn me(user: CurrentUser) -> Json<Value> {
    Json(json!({
        "id": user.user.id,
        "email": user.user.email,
        "display_name": user.user.display_name,
        "global_role": user.user.global_role,
        "tenants": user.memberships.iter().map(|m| json!({
            "slug": m.slug, "name": m.name, "role": m.role, "archived": m.archived,
        })).collect::<Vec<_>>(),
    }))
}

/// `GET /api/v1/tenants`: the tenants the caller may see (admins: all) with
/// their quotas.
pub async fn tenants(
    State(state): State<AppState>,
    user: CurrentUser,
) -> Result<Json<Value>, AppError> {
    let all = db::tenants::list(&state.pool).await?;
    let visible = all
        .into_iter()
        .filter(|t| user.is_admin() || user.membership(t.id).is_some())
        .map(|t| {
            let q = &t.quota;
            json!({
                "slug": t.slug, "name": t.name, "archived": t.archived,
                "quota": {
                    "max_active_bookings": q.max_active_bookings,
                    "max_gpu_memory_gib": q.max_gpu_memory_gib,
                    "max_compute_slices": q.max_compute_slices,
                    "default_priority": q.default_priority.as_str(),
                    "guaranteed_share_pct": q.guaranteed_share_pct,
                    "monthly_slice_hours": q.monthly_slice_hours,
                    "max_booking_hours": q.max_booking_hours,
                    "allowed_models": q.allowed_models,
                    "allowed_profiles": q.allowed_profiles,
                }
            })
        })
        .collect::<Vec<_>>();
    Ok(Json(json!({ "tenants": visible })))
}

/// `GET /api/v1/openapi.json`: the API description (public).
pub async fn openapi() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        include_str!("openapi.json"),
    )
}
