//! Who is calling, and the tenants they may see.

use axum::extract::State;
use axum::Json;

use super::views::{ErrorBody, MeView, MembershipView, TenantList, TenantView};
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
        .map(|t| TenantView {
            slug: t.slug,
            name: t.name,
            archived: t.archived,
            quota: t.quota,
        })
        .collect();
    Ok(Json(TenantList { tenants }))
}
