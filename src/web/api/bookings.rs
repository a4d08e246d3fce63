//! Bookings through the API: what is offered, list, create, read, release,
//! extend. The rules are `booking`'s, the same as the pages'.

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::Value;

use super::views::{
    BookingBody, BookingList, BookingView, ErrorBody, ExtendBody, OfferingList, ReleaseBody,
};
use crate::booking::{self, BookingError, Created};
use crate::db;
use crate::domain::booking::BookingInput;
use crate::web::auth::CurrentUser;
use crate::web::bookings::{requester, scope_of, ListQuery};
use crate::web::error::AppError;
use crate::web::AppState;

/// Bookings one list answer carries unless `limit` says fewer (newest
/// first; `next_cursor` leads on).
const LIST_LIMIT: i64 = 100;
/// The most `limit` may ask for.
const MAX_LIMIT: i64 = 500;

/// Every profile and share kind the fleet offers, with what is free now.
#[utoipa::path(get, path = "/offerings", responses(
    (status = 200, body = OfferingList),
    (status = 401, body = ErrorBody),
))]
pub async fn offerings(
    State(state): State<AppState>,
    _user: CurrentUser,
) -> Result<Json<OfferingList>, AppError> {
    let list = booking::offerings(&state.pool).await?;
    Ok(Json(OfferingList { offerings: list }))
}

/// The caller's bookings (`scope=mine`, the default), a tenant's
/// (`scope=tenant&tenant=slug`: its managers and admins) or all (admins).
#[utoipa::path(get, path = "/bookings",
    params(
        ("scope" = Option<String>, Query, description = "mine (default), tenant or all"),
        ("tenant" = Option<String>, Query, description = "a tenant's slug, with scope=tenant"),
        ("cursor" = Option<String>, Query, description = "next_cursor of the previous page"),
        ("limit" = Option<String>, Query, description = "bookings per page, 1 to 500 (default 100)"),
    ),
    responses(
        (status = 200, body = BookingList),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub async fn list(
    State(state): State<AppState>,
    user: CurrentUser,
    Query(q): Query<ListQuery>,
) -> Result<Json<BookingList>, AppError> {
    let scope = scope_of(&state, &user, &q).await?;
    let cursor = crate::web::cursor::Cursor::parse(q.cursor.as_deref(), "cursor")?;
    let limit = match q.limit.as_deref().map(str::trim).filter(|l| !l.is_empty()) {
        None => LIST_LIMIT,
        Some(l) => l
            .parse::<i64>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| AppError::invalid("limit", "a page holds 1 to 500 bookings"))?,
    };
    let mut list =
        db::bookings::page(&state.pool, scope, (cursor.at, cursor.id), limit + 1).await?;
    let next_cursor = (list.len() as i64 > limit).then(|| {
        list.truncate(limit as usize);
        list.last()
            .map(|b| crate::web::cursor::Cursor::after(false, b.created_at, b.id).encode())
            .unwrap_or_default()
    });
    Ok(Json(BookingList {
        bookings: list.iter().map(BookingView::from).collect(),
        next_cursor,
    }))
}

/// The fields of a booking body: strings or numbers, unknown fields
/// refused by name, and a blank string where leaving the field out
/// would mean a default.
pub fn input_from_json(body: &Value) -> Result<BookingInput, AppError> {
    let obj = body
        .as_object()
        .ok_or_else(|| AppError::Unprocessable("the body must be a JSON object".into()))?;
    const FIELDS: [&str; 8] = [
        "tenant",
        "kind",
        "model",
        "profile",
        "memory_gib",
        "priority",
        "start",
        "hours",
    ];
    let unknown: Vec<(String, String)> = obj
        .keys()
        .filter(|k| !FIELDS.contains(&k.as_str()))
        .map(|k| {
            (
                k.clone(),
                format!("unknown field; the fields are {}", FIELDS.join(", ")),
            )
        })
        .collect();
    if !unknown.is_empty() {
        return Err(AppError::Invalid(unknown));
    }
    /// The fields that may be left out for a default.
    const DEFAULTED: [&str; 3] = ["model", "priority", "start"];
    let mut bad = Vec::new();
    let mut get = |k: &str| -> String {
        match obj.get(k) {
            None | Some(Value::Null) => String::new(),
            // Where empty means the default (the form's "now", "any
            // model", the tenant's priority), a blank string must not
            // quietly mean it too: the schema has no blank value. Other
            // fields go on to their own messages.
            Some(Value::String(s)) if s.trim().is_empty() && DEFAULTED.contains(&k) => {
                bad.push((
                    k.to_string(),
                    "empty: give a value, or leave the field out (or null) for its default"
                        .to_string(),
                ));
                String::new()
            }
            Some(Value::String(s)) => s.clone(),
            // 1.0 is the whole number 1 (as JSON Schema counts it).
            Some(Value::Number(n)) => match n.as_f64() {
                Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e15 => {
                    format!("{}", f as i64)
                }
                _ => n.to_string(),
            },
            Some(_) => {
                bad.push((k.to_string(), "give a string or a number".to_string()));
                String::new()
            }
        }
    };
    let input = BookingInput {
        tenant: get("tenant"),
        kind: get("kind"),
        model: get("model"),
        profile: get("profile"),
        memory_gib: get("memory_gib"),
        priority: get("priority"),
        start: get("start"),
        tz_offset_minutes: String::new(),
        hours: get("hours"),
    };
    // The API's start is RFC 3339, zone included (the form's local time
    // and "now" are the form's): a time without its zone would be guessed.
    if !input.start.is_empty() && !bad.iter().any(|(f, _)| f == "start") {
        if let Err(e) = crate::web::timeline::rfc3339(&input.start) {
            bad.push((
                "start".to_string(),
                format!("{e}; leave the field out for now"),
            ));
        }
    }
    if bad.is_empty() {
        return Ok(input);
    }
    // One answer names every bad field: the other fields' own messages too.
    if let Err(more) = input.parse() {
        for (field, message) in more {
            if !bad.iter().any(|(b, _)| b == field) {
                bad.push((field.to_string(), message));
            }
        }
    }
    Err(AppError::Invalid(bad))
}

/// Books a MIG instance or a time-sliced share: 201 with the booking
/// (`scheduled`, or `queued` with its reason and earliest start); with an
/// `Idempotency-Key` seen before, 200 with the booking it made.
#[utoipa::path(post, path = "/bookings",
    request_body = BookingBody,
    params(("Idempotency-Key" = Option<String>, Header, description = "1 to 200 printable ASCII characters (no tabs); a repeat returns the first answer")),
    responses(
        (status = 201, body = BookingView),
        (status = 200, body = BookingView, description = "replayed by Idempotency-Key"),
        (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "over quota or budget, or no GPU could ever take it"),
        (status = 422, body = ErrorBody, description = "invalid input, one message per field"),
    ))]
pub async fn create(
    State(state): State<AppState>,
    user: CurrentUser,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Result<Response, AppError> {
    let input = input_from_json(&body)?;
    let req = input
        .parse()
        .map_err(|e| AppError::from(BookingError::Invalid(e)))?;
    let key = match headers.get("idempotency-key") {
        Some(v) => Some(
            v.to_str()
                .map_err(|_| AppError::BadRequest("Idempotency-Key must be text".into()))?
                .to_string(),
        ),
        None => None,
    };
    let who = requester(&user);
    let created = booking::create(
        &state.pool,
        &who,
        &req,
        key.as_deref(),
        &state.booking_settings,
    )
    .await?;
    Ok(match created {
        Created::New(b) => (StatusCode::CREATED, Json(BookingView::from(&b))).into_response(),
        Created::Replayed(b) => (
            StatusCode::OK,
            [("idempotent-replayed", "true")],
            Json(BookingView::from(&b)),
        )
            .into_response(),
    })
}

/// One booking (the owner's, a managed tenant's, or any for admins and
/// finance); others' are not found.
#[utoipa::path(get, path = "/bookings/{id}",
    params(("id" = i64, Path)),
    responses(
        (status = 200, body = BookingView),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
    ))]
pub async fn get(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Json<BookingView>, AppError> {
    let b = booking::visible(&state.pool, &requester(&user), id).await?;
    Ok(Json(BookingView::from(&b)))
}

/// Releases a booking that holds a device, cancels one that has not
/// started. Ending someone else's booking (managers, admins) needs a
/// reason.
#[utoipa::path(post, path = "/bookings/{id}/release",
    params(("id" = i64, Path)),
    request_body(content = Option<ReleaseBody>),
    responses(
        (status = 200, body = BookingView),
        (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "already ended"),
        (status = 422, body = ErrorBody, description = "a reason is needed"),
    ))]
pub async fn release(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(id): Path<i64>,
    body: Option<Json<Option<ReleaseBody>>>,
) -> Result<Json<BookingView>, AppError> {
    let reason = body.and_then(|b| b.0).and_then(|b| b.reason);
    let b = booking::release(
        &state.pool,
        &requester(&user),
        id,
        reason.as_deref(),
        Some(&user.client_addr),
    )
    .await?;
    Ok(Json(BookingView::from(&b)))
}

/// Extends a scheduled or active booking, if quota and the slot allow.
#[utoipa::path(post, path = "/bookings/{id}/extend",
    params(("id" = i64, Path)),
    request_body = ExtendBody,
    responses(
        (status = 200, body = BookingView),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 422, body = ErrorBody),
    ))]
pub async fn extend(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(id): Path<i64>,
    Json(body): Json<ExtendBody>,
) -> Result<Json<BookingView>, AppError> {
    let b = booking::extend(&state.pool, &requester(&user), id, body.hours).await?;
    Ok(Json(BookingView::from(&b)))
}

/// "Still working": the owner says an idle booking is in use; its idle
/// clock starts again and a warning is withdrawn.
#[utoipa::path(post, path = "/bookings/{id}/keep",
    params(("id" = i64, Path)),
    responses(
        (status = 200, body = BookingView),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody, description = "not the owner"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "not active"),
    ))]
pub async fn keep(
    State(state): State<AppState>,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Json<BookingView>, AppError> {
    let b = booking::keep(&state.pool, &requester(&user), id).await?;
    Ok(Json(BookingView::from(&b)))
}
