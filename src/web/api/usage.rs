//! Usage per booking per day, for scripts (finance uses the CSV).

use axum::extract::{Query, State};
use axum::Json;
use futures_util::StreamExt;

use super::views::{ErrorBody, UsageReport, UsageRow};
use crate::db;
use crate::web::auth::CurrentUser;
use crate::web::error::AppError;
use crate::web::usage::{period, split, whose, Period};
use crate::web::AppState;

/// Most rows one answer carries; longer periods go to the CSV export.
const MAX_ROWS: usize = 100_000;

/// Usage per booking per UTC day over `[from, to]` (dates), of the caller's
/// bookings, or of `tenant` (managers, finance, admins).
#[utoipa::path(get, path = "/usage",
    params(
        ("from" = Option<String>, Query, description = "first day, YYYY-MM-DD; omitted: the first of this month"),
        ("to" = Option<String>, Query, description = "last day, YYYY-MM-DD; omitted: today"),
        ("tenant" = Option<String>, Query, description = "a tenant's slug; * for every tenant (finance and admins)"),
    ),
    responses(
        (status = 200, body = UsageReport),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "every tenant (*) is for finance and admins"),
        (status = 404, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn usage(
    State(state): State<AppState>,
    user: CurrentUser,
    Query(q): Query<Period>,
) -> Result<Json<UsageReport>, AppError> {
    let (from, to) = period(&q)?;
    let w = whose(&state, &user, &q.tenant).await?;
    let (tenant_id, user_id) = split(&w);
    let mut out = Vec::new();
    let mut stream = db::usage::day_rows(&state.pool, from, to, tenant_id, user_id);
    while let Some(r) = stream.next().await {
        let r = r?;
        out.push(UsageRow {
            date: r.day.to_string(),
            tenant: r.tenant_slug,
            user: r.user_email,
            booking: r.booking_id,
            kind: r.kind,
            model: r.model,
            profile_or_share: r.what,
            slice_seconds: r.slice_seconds,
            slice_hours: r.slice_seconds / 3600.0,
            gib_hours: r.gib_seconds / 3600.0,
            cost: r.cost,
        });
        if out.len() >= MAX_ROWS {
            return Err(AppError::Unprocessable(
                "more than 100,000 rows: ask for a shorter period or use /reports/usage.csv".into(),
            ));
        }
    }
    Ok(Json(UsageReport {
        from: from.to_string(),
        to: to.to_string(),
        currency: state.currency.to_string(),
        usage: out,
    }))
}
