//! The dashboard and the tenant page members see.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::error::AppError;
use super::pages::PageCtx;
use super::AppState;
use crate::db::{self, tenants::Member, tenants::Tenant};

/// One tenant on the dashboard with the user's role in it.
pub struct MyTenant {
    pub tenant: Tenant,
    pub role: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "dashboard.html")]
pub struct DashboardPage {
    ctx: PageCtx,
    tenants: Vec<MyTenant>,
}

pub async fn dashboard(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<DashboardPage, AppError> {
    let mut tenants = Vec::new();
    for m in user.memberships.iter().filter(|m| !m.archived) {
        tenants.push(MyTenant {
            tenant: db::tenants::get(&state.pool, m.tenant_id).await?,
            role: m.role.clone(),
        });
    }
    Ok(DashboardPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        tenants,
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "tenant.html")]
pub struct TenantPage {
    ctx: PageCtx,
    tenant: Tenant,
    can_see_members: bool,
    members: Vec<Member>,
}

/// A tenant's quota (members), plus its people (managers and admins).
/// Someone outside the tenant gets 404: they learn nothing, not even that
/// the slug exists.
pub async fn tenant(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(slug): Path<String>,
) -> Result<TenantPage, AppError> {
    let id = db::tenants::id_by_slug(&state.pool, &slug)
        .await?
        .ok_or(AppError::NotFound)?;
    let membership = user.membership(id);
    if membership.is_none() && !user.is_admin() {
        return Err(AppError::NotFound);
    }
    let can_see_members = user.is_admin() || membership.is_some_and(|m| m.is_manager());
    let members = if can_see_members {
        db::tenants::members(&state.pool, id).await?
    } else {
        Vec::new()
    };
    Ok(TenantPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        tenant: db::tenants::get(&state.pool, id).await?,
        can_see_members,
        members,
    })
}
