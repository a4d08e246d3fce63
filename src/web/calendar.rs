//! Calendars (part of issue 19): a private iCalendar feed of a person's
//! bookings, and of a tenant's for its managers, at a secret URL
//! (`/calendar/<token>.ics`) that can be revoked and renewed on
//! `/settings/calendar`; `GET /api/v1/calendar` gives the URL to scripts.
//! RFC 5545 through the `icalendar` crate: stable UIDs, times in UTC,
//! cancelled bookings as `STATUS:CANCELLED`.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use icalendar::{Calendar, Component, EventLike, EventStatus};
use time::OffsetDateTime;
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::error::AppError;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db::{self, calendar::Entry, calendar::Feed};
use crate::domain::booking::{Kind, Status};

/// How far back a feed reaches (ended bookings stay a while, so a
/// calendar keeps its history of the last weeks).
const HISTORY_DAYS: i64 = 90;

fn utc(t: OffsetDateTime) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(t.unix_timestamp(), t.nanosecond()).unwrap_or_default()
}

/// The feed's calendar as RFC 5545 text.
pub fn ics(name: &str, entries: &[Entry]) -> String {
    let mut cal = Calendar::new();
    cal.name(name);
    for e in entries {
        let what = match e.kind {
            Kind::Mig => format!(
                "MIG {} on {}",
                e.profile.as_deref().unwrap_or("?"),
                e.model.as_deref().unwrap_or("any GPU")
            ),
            Kind::Timeslice => format!(
                "{} GiB share of {}",
                e.memory_gib,
                e.model.as_deref().unwrap_or("a GPU")
            ),
        };
        let status = match e.status {
            Status::Cancelled => EventStatus::Cancelled,
            Status::Queued => EventStatus::Tentative,
            _ => EventStatus::Confirmed,
        };
        let mut description = format!(
            "gpuslice booking #{} for {} ({}), {}",
            e.id, e.user_email, e.tenant_slug, e.status
        );
        if let Some(n) = &e.node {
            description.push_str(&format!("; node {n}"));
        }
        if let Some(d) = &e.device_uuid {
            description.push_str(&format!("; device {d}"));
        }
        let ev = icalendar::Event::new()
            // Stable across fetches and edits: calendars update in place.
            .uid(&format!("booking-{}@gpuslice", e.id))
            .timestamp(utc(e.updated_at))
            .summary(&format!("{what} (#{})", e.id))
            .description(&description)
            .starts(utc(e.start))
            .ends(utc(e.end))
            .status(status)
            .done();
        cal.push(ev);
    }
    cal.done().to_string()
}

/// `GET /calendar/<token>.ics`: no session, the token is the key; an
/// unknown or revoked token is 404.
pub async fn feed(
    State(state): State<AppState>,
    Path(file): Path<String>,
) -> Result<Response, AppError> {
    let token = file.strip_suffix(".ics").ok_or(AppError::NotFound)?;
    if token.len() > 128
        || !token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(AppError::NotFound);
    }
    let feed = db::calendar::feed_of_token(&state.pool, token)
        .await?
        .ok_or(AppError::NotFound)?;
    let since = OffsetDateTime::now_utc() - time::Duration::days(HISTORY_DAYS);
    let entries = db::calendar::entries(&state.pool, feed, since).await?;
    let name = match feed.tenant_id {
        Some(_) => format!(
            "gpuslice: {}",
            entries
                .first()
                .map(|e| e.tenant_slug.clone())
                .unwrap_or_else(|| "tenant".into())
        ),
        None => "gpuslice: my bookings".to_string(),
    };
    Ok((
        [
            (header::CONTENT_TYPE, "text/calendar; charset=utf-8"),
            (header::CACHE_CONTROL, "private, max-age=300"),
        ],
        ics(&name, &entries),
    )
        .into_response())
}

/// The site's address: the configured public URL (`serve` always has one),
/// else as the browser reached it (scheme by the cookie setting; a Host
/// header that is not a plain host name and port is not trusted).
pub fn base_url(state: &AppState, headers: &HeaderMap) -> String {
    if let Some(url) = &state.settings.public_url {
        return url.trim_end_matches('/').to_string();
    }
    let scheme = if state.settings.secure_cookies {
        "https"
    } else {
        "http"
    };
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        })
        .unwrap_or("localhost");
    format!("{scheme}://{host}")
}

/// The feed's URL, making its token if it has none.
pub async fn url_of(state: &AppState, headers: &HeaderMap, feed: Feed) -> Result<String, AppError> {
    let token = match db::calendar::ensure(&state.pool, feed, &super::auth::random_secret()).await?
    {
        Some(t) => t,
        None => db::calendar::token_of(&state.pool, feed)
            .await?
            .ok_or(AppError::Conflict(
                "the calendar address is being made; ask again".into(),
            ))?,
    };
    Ok(format!("{}/calendar/{token}.ics", base_url(state, headers)))
}

/// The tenant `slug` if `user` manages it.
pub fn managed(user: &CurrentUser, slug: &str) -> Option<i64> {
    user.memberships
        .iter()
        .find(|m| m.slug == slug && m.is_manager())
        .map(|m| m.tenant_id)
}

#[derive(Template, WebTemplate)]
#[template(path = "calendar.html")]
pub struct CalendarPage {
    ctx: PageCtx,
    mine: String,
    /// (slug, name, feed URL if it has one) of each tenant the person manages.
    tenants: Vec<(String, String, Option<String>)>,
}

pub async fn page(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    user: CurrentUser,
) -> Result<CalendarPage, AppError> {
    let mine = url_of(
        &state,
        &headers,
        Feed {
            user_id: user.user.id,
            tenant_id: None,
        },
    )
    .await?;
    let mut tenants = Vec::new();
    for m in user.memberships.iter().filter(|m| m.is_manager()) {
        let feed = Feed {
            user_id: user.user.id,
            tenant_id: Some(m.tenant_id),
        };
        let url = db::calendar::token_of(&state.pool, feed)
            .await?
            .map(|t| format!("{}/calendar/{t}.ics", base_url(&state, &headers)));
        tenants.push((m.slug.clone(), m.name.clone(), url));
    }
    Ok(CalendarPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        mine,
        tenants,
    })
}

#[derive(serde::Deserialize)]
pub struct FeedForm {
    #[serde(default)]
    tenant: String,
}

fn feed_of_form(user: &CurrentUser, form: &FeedForm) -> Result<Feed, AppError> {
    let tenant_id = match form.tenant.trim() {
        "" => None,
        slug => Some(managed(user, slug).ok_or(AppError::NotFound)?),
    };
    Ok(Feed {
        user_id: user.user.id,
        tenant_id,
    })
}

/// A new secret URL; the old one stops working at once.
pub async fn renew(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Form(form): Form<FeedForm>,
) -> Result<Response, AppError> {
    let feed = feed_of_form(&user, &form)?;
    let mut tx = state.pool.begin().await?;
    db::calendar::renew(&mut tx, feed, &super::auth::random_secret()).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "calendar.renew",
        form.tenant.trim(),
        serde_json::json!({}),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        "A new calendar address is ready; the old one no longer works.",
    )
    .await?;
    Ok(Redirect::to("/settings/calendar").into_response())
}

/// Revokes a tenant's feed (a person's own is renewed instead: the page
/// always shows one).
pub async fn revoke(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Form(form): Form<FeedForm>,
) -> Result<Response, AppError> {
    let feed = feed_of_form(&user, &form)?;
    if !db::calendar::revoke(&state.pool, feed).await? {
        return Err(AppError::Conflict(
            "that calendar address is not in use".into(),
        ));
    }
    db::audit::record(
        &state.pool,
        &user.actor(),
        "calendar.revoke",
        form.tenant.trim(),
        serde_json::json!({}),
    )
    .await?;
    flash(&session, "The calendar address no longer works.").await?;
    Ok(Redirect::to("/settings/calendar").into_response())
}

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/calendar/{file}", get(feed))
        .route("/settings/calendar", get(page))
        .route("/settings/calendar/renew", post(renew))
        .route("/settings/calendar/revoke", post(revoke))
}
