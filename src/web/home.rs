//! The dashboard and the tenant page members see.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::routing::get;
use axum::Router;
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::error::AppError;
use super::pages::PageCtx;
use super::AppState;
use crate::db::{self, tenants::Member, tenants::Tenant};

/// One tenant on the dashboard with the user's role in it and its use.
pub struct MyTenant {
    pub tenant: Tenant,
    pub role: String,
    pub used: crate::booking::QuotaUse,
}

/// One bar of a quota chart.
pub struct Bar {
    pub label: &'static str,
    pub used: String,
    pub limit: String,
    /// Percent of the bar filled, 0..=100.
    pub pct: u32,
    pub warn: bool,
}

impl MyTenant {
    /// Percent of the monthly slice-hour budget used and booked.
    pub fn budget_pct(&self) -> u32 {
        let budget = f64::from(self.tenant.quota.monthly_slice_hours);
        if budget <= 0.0 {
            return 100;
        }
        (self.used.slice_hours / budget * 100.0).round() as u32
    }

    pub fn bars(&self) -> Vec<Bar> {
        let q = &self.tenant.quota;
        let bar = |label, used: f64, limit: f64, unit: &str| {
            let pct = if limit > 0.0 {
                (used / limit * 100.0).clamp(0.0, 100.0)
            } else {
                100.0
            };
            Bar {
                label,
                used: format!("{used:.0}{unit}"),
                limit: format!("{limit:.0}{unit}"),
                pct: pct.round() as u32,
                warn: pct >= 80.0,
            }
        };
        vec![
            bar(
                "Active bookings",
                f64::from(self.used.active_bookings),
                f64::from(q.max_active_bookings),
                "",
            ),
            bar(
                "GPU memory",
                f64::from(self.used.memory_gib),
                f64::from(q.max_gpu_memory_gib),
                " GiB",
            ),
            bar(
                "Compute slices",
                f64::from(self.used.compute_slices),
                f64::from(q.max_compute_slices),
                "",
            ),
            bar(
                "Slice-hours this month (used + booked)",
                self.used.slice_hours,
                f64::from(q.monthly_slice_hours),
                "",
            ),
        ]
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "dashboard.html")]
pub struct DashboardPage {
    ctx: PageCtx,
    tenants: Vec<MyTenant>,
    bookings: Vec<db::bookings::Booking>,
    show_owner: bool,
    poll_url: String,
    /// Open alerts on my bookings.
    alerts: Vec<db::alerts::Alert>,
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
            used: crate::booking::quota_use(&state.pool, m.tenant_id).await?,
        });
    }
    let bookings =
        db::bookings::list(&state.pool, db::bookings::Scope::User(user.user.id), 20).await?;
    let alerts = db::alerts::list(
        &state.pool,
        &db::alerts::Filter {
            states: Some(vec![crate::domain::alerts::AlertState::Firing]),
            owner: Some(user.user.id),
            limit: 20,
            ..Default::default()
        },
    )
    .await?;
    Ok(DashboardPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        alerts,
        tenants,
        bookings,
        show_owner: false,
        poll_url: "/bookings?scope=mine".into(),
    })
}

#[derive(Template, WebTemplate)]
#[template(path = "tenant.html")]
pub struct TenantPage {
    ctx: PageCtx,
    tenant: Tenant,
    can_see_members: bool,
    members: Vec<Member>,
    qos: Vec<db::bookings::QosEvent>,
    /// Managers: this month's ended bookings that a smaller slice would
    /// have served, and the slice-hours that would have saved.
    rightsizing: Option<(usize, usize, String)>,
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
    let rightsizing = if can_see_members {
        let now = time::OffsetDateTime::now_utc();
        let month = now
            .replace_day(1)
            .map(|d| d.replace_time(time::Time::MIDNIGHT))
            .unwrap_or(now);
        let ended = db::bookings::ended_since(&state.pool, id, month).await?;
        let advised: Vec<_> = ended
            .iter()
            .filter_map(|b| {
                let hours = (b.end - b.start).as_seconds_f64() / 3600.0;
                b.advice().map(|a| {
                    crate::domain::rightsize::saved_slice_hours(&a, b.compute_slices, hours)
                })
            })
            .collect();
        Some((
            ended.len(),
            advised.len(),
            format!("{:.1}", advised.iter().sum::<f64>()),
        ))
    } else {
        None
    };
    Ok(TenantPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        tenant: db::tenants::get(&state.pool, id).await?,
        can_see_members,
        members,
        qos: db::bookings::qos_ledger(&state.pool, id, 100).await?,
        rightsizing,
    })
}

/// The dashboard and tenant pages.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(dashboard))
        .route("/tenants/{slug}", get(tenant))
}
