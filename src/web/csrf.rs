//! CSRF protection for every state-changing request.
//!
//! A random token lives in the session (synchroniser token pattern). Forms
//! carry it as the hidden field `csrf_token`; htmx sends it as the
//! `X-CSRF-Token` header (set once on `<body hx-headers>`). The middleware
//! checks every POST/PUT/PATCH/DELETE before any handler runs, so a route
//! cannot forget it. Requests that carry a valid API token
//! (`Authorization: Bearer`) are exempt: browsers never attach that header on
//! their own, and such a request is judged by its token only; a request with
//! any other `Authorization` header answers 401 here. A
//! `Sec-Fetch-Site: cross-site` request is refused outright.
//!
//! Before sign-in there is no session (an anonymous visit to `/login` stores
//! nothing in the database): the sign-in form's token lives in its own
//! cookie, `gpuslice_presign` (HttpOnly, SameSite=Strict), and the form must
//! send the same value (double submit). Sign-in deletes that cookie and puts
//! a fresh token in the new session.

use axum::body::{to_bytes, Body};
use axum::extract::Request;
use axum::extract::{FromRequestParts, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use rand::RngCore;
use tower_sessions::Session;

use super::error::AppError;

const SESSION_KEY: &str = "csrf";
/// The cookie that carries the sign-in form's token before any session.
pub const PRE_COOKIE: &str = "gpuslice_presign";
/// Its name over HTTPS: the `__Host-` prefix makes browsers refuse it from
/// a sibling subdomain or with a narrower path (no cookie tossing).
pub const PRE_COOKIE_SECURE: &str = "__Host-gpuslice_presign";

fn pre_cookie_name(secure: bool) -> &'static str {
    if secure {
        PRE_COOKIE_SECURE
    } else {
        PRE_COOKIE
    }
}
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
    let existing: Option<String> = session.get(SESSION_KEY).await?;
    match existing {
        Some(t) => Ok(t),
        None => rotate(session).await,
    }
}

/// Replaces the session's token (at sign-in).
pub async fn rotate(session: &Session) -> Result<String, AppError> {
    let t = new_token();
    session.insert(SESSION_KEY, &t).await?;
    Ok(t)
}

/// The pre-session token a request carries in [`PRE_COOKIE`], if well formed.
fn pre_cookie(headers: &HeaderMap, secure: bool) -> Option<String> {
    let wanted = pre_cookie_name(secure);
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(name, _)| *name == wanted)
        .map(|(_, value)| value.to_string())
        .filter(|v| {
            v.len() == 43
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The sign-in form's token: the one in the visitor's [`PRE_COOKIE`], or a
/// new one with the `Set-Cookie` header that hands it out.
pub fn pre_session_token(headers: &HeaderMap, secure: bool) -> (String, Option<HeaderValue>) {
    if let Some(t) = pre_cookie(headers, secure) {
        return (t, None);
    }
    let t = new_token();
    let cookie = format!(
        "{}={t}; Path=/; HttpOnly; SameSite=Strict; Max-Age=7200{}",
        pre_cookie_name(secure),
        if secure { "; Secure" } else { "" }
    );
    (t, HeaderValue::from_str(&cookie).ok())
}

/// The `Set-Cookie` header that deletes [`PRE_COOKIE`] (at sign-in).
pub fn clear_pre_cookie(secure: bool) -> HeaderValue {
    if secure {
        HeaderValue::from_static(
            "__Host-gpuslice_presign=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0; Secure",
        )
    } else {
        HeaderValue::from_static("gpuslice_presign=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    }
}

pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn protect(
    State(state): State<super::AppState>,
    session: Session,
    req: Request,
    next: Next,
) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    if req.headers().contains_key(header::AUTHORIZATION) {
        // Exempt only once the token is known good: authenticate here (the
        // handler reuses the result) and answer 401 otherwise.
        let (mut parts, body) = req.into_parts();
        return match super::auth::CurrentUser::from_request_parts(&mut parts, &state).await {
            Ok(_) => next.run(Request::from_parts(parts, body)).await,
            Err(e) => e.into_response(),
        };
    }
    let signed_in = match session.get::<i64>(super::auth::SESSION_USER).await {
        Ok(uid) => uid.is_some(),
        Err(e) => return AppError::from(e).into_response(),
    };
    // An API call with neither a token nor a signed-in session has no
    // authority to forge: let it through to its clear 401.
    if !signed_in && req.uri().path().starts_with("/api/") {
        return next.run(req).await;
    }
    if req
        .headers()
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return AppError::Csrf.into_response();
    }
    // The session's token; before sign-in also the sign-in form's cookie
    // token (a session from before sign-in may hold a token of its own).
    let mut expected: Vec<String> = match session.get(SESSION_KEY).await {
        Ok(t) => t.into_iter().collect(),
        Err(e) => return AppError::from(e).into_response(),
    };
    if !signed_in {
        expected.extend(pre_cookie(req.headers(), state.settings.secure_cookies));
    }
    if expected.is_empty() {
        return AppError::Csrf.into_response();
    }
    let matches = |sent: &[u8]| {
        expected
            .iter()
            .any(|e| constant_time_eq(sent, e.as_bytes()))
    };
    if let Some(sent) = req.headers().get(HEADER) {
        if matches(sent.as_bytes()) {
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
        Some(s) if matches(s.as_bytes()) => {
            next.run(Request::from_parts(parts, Body::from(bytes)))
                .await
        }
        _ => AppError::Csrf.into_response(),
    }
}
