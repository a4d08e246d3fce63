//! `GET /api/v1/availability`: when a MIG profile or a share of some GPU
//! memory would fit, GPU by GPU, over a period (the booking form's
//! timeline, for scripts).

use axum::extract::{Query, State};
use axum::Json;
use serde::Serialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use utoipa::ToSchema;

use super::views::ErrorBody;
use crate::domain::booking::Request;
use crate::web::auth::CurrentUser;
use crate::web::error::AppError;
use crate::web::timeline::{self, AvailabilityQuery};
use crate::web::AppState;

/// A free stretch: a booking whose window lies inside it fits on its GPU.
#[derive(Debug, Serialize, ToSchema)]
pub struct StretchView {
    #[schema(format = DateTime)]
    pub start: String,
    #[schema(format = DateTime)]
    pub end: String,
}

/// One GPU that could take the request, with its free stretches.
#[derive(Debug, Serialize, ToSchema)]
pub struct GpuAvailabilityView {
    pub uuid: String,
    pub node: String,
    pub index: i32,
    pub model: String,
    pub free: Vec<StretchView>,
}

/// When the request fits, per GPU.
#[derive(Debug, Serialize, ToSchema)]
pub struct AvailabilityView {
    /// The model asked for; null: any.
    pub model: Option<String>,
    pub profile: Option<String>,
    pub memory_gib: Option<i32>,
    /// The period answered (from is never before now, to never past the
    /// booking horizon).
    #[schema(format = DateTime)]
    pub from: String,
    #[schema(format = DateTime)]
    pub to: String,
    pub gpus: Vec<GpuAvailabilityView>,
}

fn rfc3339(t: i64) -> String {
    OffsetDateTime::from_unix_timestamp(t)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// When a MIG profile (`profile`) or a time-sliced share (`memory_gib`)
/// fits on each GPU between `from` (default now) and `to` (default 7 days
/// later, at most 31 days after from).
#[utoipa::path(get, path = "/availability",
    params(
        ("tenant" = Option<String>, Query, description = "one of your tenants: only the models and profiles it may book"),
        ("model" = Option<String>, Query, description = "a catalog model; omitted or any: every model"),
        ("profile" = Option<String>, Query, description = "a MIG profile such as 1g.10gb (or memory_gib)"),
        ("memory_gib" = Option<String>, Query, description = "a time-sliced share's GPU memory in GiB (or profile)"),
        ("from" = Option<String>, Query, description = "RFC 3339; omitted or past: now"),
        ("to" = Option<String>, Query, description = "RFC 3339; omitted: 7 days after from"),
    ),
    responses(
        (status = 200, body = AvailabilityView),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "not one of your tenants"),
        (status = 422, body = ErrorBody),
    ))]
pub async fn availability(
    State(state): State<AppState>,
    user: CurrentUser,
    Query(q): Query<AvailabilityQuery>,
) -> Result<Json<AvailabilityView>, AppError> {
    let asked = timeline::parse(
        &q,
        OffsetDateTime::now_utc(),
        state.booking_settings.max_ahead_days,
    )
    .map_err(AppError::Invalid)?;
    let found = timeline::free(&state, &user, &q.tenant, &asked).await?;
    let (profile, memory_gib) = match &asked.what {
        Request::Mig { profile } => (Some(profile.clone()), None),
        Request::Share { memory_gib, .. } => (None, Some(*memory_gib)),
    };
    Ok(Json(AvailabilityView {
        model: asked.model.clone(),
        profile,
        memory_gib,
        from: rfc3339(asked.period.start),
        to: rfc3339(asked.period.end),
        gpus: found
            .into_iter()
            .map(|g| GpuAvailabilityView {
                uuid: g.gpu.uuid,
                node: g.gpu.node,
                index: g.gpu.idx,
                model: g.gpu.model,
                free: g
                    .free
                    .iter()
                    .map(|w| StretchView {
                        start: rfc3339(w.start),
                        end: rfc3339(w.end),
                    })
                    .collect(),
            })
            .collect(),
    }))
}
