//! CSRF protection for every state-changing request.
//!
//! A random token lives in the session (synchroniser token pattern). Forms
//! carry it as the hidden field `csrf_token`; htmx sends it as the
//! `X-CSRF-Token` header (set once on `<body hx-headers>`). The middleware
//! checks every POST/PUT/PATCH/DELETE before any handler runs, so a route
//! cannot forget it. Requests authenticated by `Authorization: Bearer` are
//! exempt: browsers never attach that header on their own, and such a request
//! is judged by its token only. A `Sec-Fetch-Site: cross-site` request is
//! refused outright.

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use rand::RngCore;
use tower_sessions::Session;

use super::error::AppError;

const SESSION_KEY: &str = "csrf";
pub const FIELD: &str = "csrf_token";
pub const HEADER: &str = "x-csrf-token";
/// Largest form body read to find the token.
const MAX_FORM_BYTES: usize = 256 * 1024;

fn new_token() -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The session's token, created on first use.
pub async fn token(session: &Session) -> Result<String, AppError> {
    let existing: Option<String> = session
        .get(SESSION_KEY)
        .await
        .map_err(|e| AppError::Internal(e.into()))?;
    match existing {
        Some(t) => Ok(t),
        None => rotate(session).await,
    }
}

/// Replaces the session's token (at sign-in).
pub async fn rotate(session: &Session) -> Result<String, AppError> {
    let t = new_token();
    session
        .insert(SESSION_KEY, &t)
        .await
        .map_err(|e| AppError::Internal(e.into()))?;
    Ok(t)
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn protect(session: Session, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    if req.headers().contains_key(header::AUTHORIZATION) {
        return next.run(req).await;
    }
    // An API call with neither a token nor a signed-in session has no
    // authority to forge: let it through to its clear 401.
    if req.uri().path().starts_with("/api/") {
        let signed_in = session
            .get::<i64>(super::auth::SESSION_USER)
            .await
            .ok()
            .flatten()
            .is_some();
        if !signed_in {
            return next.run(req).await;
        }
    }
    if req
        .headers()
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return AppError::Csrf.into_response();
    }
    let expected: Option<String> = session.get(SESSION_KEY).await.ok().flatten();
    let Some(expected) = expected else {
        return AppError::Csrf.into_response();
    };
    if let Some(sent) = req.headers().get(HEADER) {
        if constant_time_eq(sent.as_bytes(), expected.as_bytes()) {
            return next.run(req).await;
        }
        return AppError::Csrf.into_response();
    }
    let is_form = req.headers().get(header::CONTENT_TYPE).is_some_and(|v| {
        v.as_bytes()
            .starts_with(b"application/x-www-form-urlencoded")
    });
    if !is_form {
        return AppError::Csrf.into_response();
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = to_bytes(body, MAX_FORM_BYTES).await else {
        return AppError::BadRequest("the form is too large".into()).into_response();
    };
    let sent = form_urlencoded::parse(&bytes)
        .find(|(k, _)| k == FIELD)
        .map(|(_, v)| v.into_owned());
    match sent {
        Some(s) if constant_time_eq(s.as_bytes(), expected.as_bytes()) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        _ => AppError::Csrf.into_response(),
    }
}
