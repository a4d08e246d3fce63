//! The dashboard.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::error::AppError;
use super::pages::PageCtx;
use super::AppState;
use crate::db::{self, tenants::Tenant};

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

/// The dashboard.
pub fn routes() -> Router<AppState> {
    Router::new().route("/", get(dashboard))
}
