//! Who is calling, and the tenants they may see.

use axum::extract::State;
use axum::Json;

use super::views::{ErrorBody, MeView, MembershipView, QuotaView, TenantList, TenantView};
use crate::db;
use crate::web::auth::CurrentUser;
use crate::web::error::AppError;
use crate::web::AppState;

/// Who the token belongs to, and their tenants.
#[utoipa::path(get, path = "/me", responses(
    (status = 200, body = MeView),
    (status = 401, body = ErrorBody),
))]
pub async fn me(user: CurrentUser) -> Json<MeView> {
    Json(MeView {
        id: user.user.id,
        email: user.user.email.clone(),
        display_name: user.user.display_name.clone(),
        global_role: user.user.global_role.clone(),
        tenants: user
            .memberships
            .iter()
            .map(|m| MembershipView {
                slug: m.slug.clone(),
                name: m.name.clone(),
                role: m.role.clone(),
                archived: m.archived,
            })
            .collect(),
    })
}

/// The tenants the caller may see (admins: all) with their quotas.
#[utoipa::path(get, path = "/tenants", responses(
    (status = 200, body = TenantList),
    (status = 401, body = ErrorBody),
))]
pub async fn tenants(
    State(state): State<AppState>,
    user: CurrentUser,
) -> Result<Json<TenantList>, AppError> {
    let all = db::tenants::list(&state.pool).await?;
    let tenants = all
        .into_iter()
        .filter(|t| user.is_admin() || user.membership(t.id).is_some())
        .map(|t| {
            let q = t.quota;
            TenantView {
                slug: t.slug,
                name: t.name,
                archived: t.archived,
                quota: QuotaView {
                    max_active_bookings: q.max_active_bookings,
                    max_gpu_memory_gib: q.max_gpu_memory_gib,
                    max_compute_slices: q.max_compute_slices,
                    default_priority: q.default_priority,
                    guaranteed_share_pct: q.guaranteed_share_pct,
                    monthly_slice_hours: q.monthly_slice_hours,
                    max_booking_hours: q.max_booking_hours,
                    allowed_models: q.allowed_models,
                    allowed_profiles: q.allowed_profiles,
                },
            }
        })
        .collect();
    Ok(Json(TenantList { tenants }))
}
