//! The one error type of the web layer. Handlers return `AppError`; the
//! [`render_errors`] middleware turns it into an HTML page in the layout or,
//! under `/api/`, into JSON `{"error","message"}`. Internal details are
//! logged once here and never shown.

use axum::extract::Request;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};

use super::pages::ErrorPage;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("sign in to continue")]
    Unauthenticated,
    #[error("{0}")]
    Forbidden(String),
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Unprocessable(String),
    /// Bad input, one message per field (422; the API lists them under
    /// `fields`).
    #[error("{}", .0.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<(String, String)>),
    #[error("the form has expired or did not come from this site; reload the page and try again")]
    Csrf,
    #[error("too many attempts; try again in {0} seconds")]
    TooManyRequests(i64),
    /// Temporarily unable to serve (busy, or the database unreachable):
    /// 503 with `Retry-After` seconds and a sentence.
    #[error("{1}")]
    Unavailable(i64, String),
    #[error("internal error")]
    Internal(#[from] anyhow::Error),
}

impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::RowNotFound => AppError::NotFound,
            e if crate::db::is_unavailable(&e) => {
                tracing::warn!(error = %e, "database unavailable");
                AppError::Unavailable(
                    5,
                    "the database is not reachable at the moment; try again in a few seconds"
                        .into(),
                )
            }
            other => AppError::Internal(other.into()),
        }
    }
}

/// A session that cannot be read or written: the store is PostgreSQL, so a
/// store error means the database is away (503); a session that does not
/// (de)serialise is a bug (500).
impl From<tower_sessions::session::Error> for AppError {
    fn from(e: tower_sessions::session::Error) -> Self {
        match e {
            tower_sessions::session::Error::Store(store) => {
                tracing::warn!(error = %store, "session store unavailable");
                AppError::Unavailable(
                    5,
                    "the database is not reachable at the moment; try again in a few seconds"
                        .into(),
                )
            }
            other => AppError::Internal(other.into()),
        }
    }
}

impl AppError {
    /// Bad input in one field.
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        AppError::Invalid(vec![(field.to_string(), message.into())])
    }

    pub fn forbidden() -> Self {
        AppError::Forbidden("you do not have access to this page".into())
    }

    fn status(&self) -> StatusCode {
        match self {
            AppError::Unauthenticated => StatusCode::UNAUTHORIZED,
            AppError::Forbidden(_) | AppError::Csrf => StatusCode::FORBIDDEN,
            AppError::NotFound => StatusCode::NOT_FOUND,
            AppError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AppError::Conflict(_) => StatusCode::CONFLICT,
            AppError::Unprocessable(_) | AppError::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            AppError::TooManyRequests(_) => StatusCode::TOO_MANY_REQUESTS,
            AppError::Unavailable(..) => StatusCode::SERVICE_UNAVAILABLE,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            AppError::Unauthenticated => "unauthenticated",
            AppError::Forbidden(_) => "forbidden",
            AppError::NotFound => "not_found",
            AppError::BadRequest(_) => "bad_request",
            AppError::Conflict(_) => "conflict",
            AppError::Unprocessable(_) | AppError::Invalid(_) => "unprocessable",
            AppError::Csrf => "csrf",
            AppError::TooManyRequests(_) => "too_many_requests",
            AppError::Unavailable(..) => "unavailable",
            AppError::Internal(_) => "internal",
        }
    }
}

/// Carried on an error response until [`render_errors`] gives it a body.
#[derive(Debug, Clone)]
pub struct ErrorInfo {
    pub code: &'static str,
    pub message: String,
    /// Invalid input: field -> message.
    pub fields: Option<std::collections::BTreeMap<String, String>>,
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        if let AppError::Internal(e) = &self {
            tracing::error!(error = format!("{e:#}"), "internal error");
        }
        let mut resp = self.status().into_response();
        if let AppError::TooManyRequests(secs) | AppError::Unavailable(secs, _) = self {
            if let Ok(v) = HeaderValue::from_str(&secs.max(1).to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
        }
        let fields = match &self {
            AppError::Invalid(f) => Some(f.iter().cloned().collect()),
            _ => None,
        };
        resp.extensions_mut().insert(ErrorInfo {
            code: self.code(),
            message: self.to_string(),
            fields,
        });
        resp
    }
}

/// Gives every error response its body: JSON under `/api/`, an HTML page in
/// the layout elsewhere. Errors raised by axum's own extractors (plain text)
/// are wrapped the same way. An unauthenticated page request goes to the
/// sign-in page instead.
pub async fn render_errors(req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    // Endpoints for machines (scrapers, probes) answer as they are: a
    // scraper without the token gets 401, not a sign-in page.
    if matches!(path.as_str(), "/metrics" | "/healthz" | "/readyz") {
        return next.run(req).await;
    }
    let query = req.uri().query().map(str::to_string);
    let is_get = req.method() == Method::GET;
    let resp = next.run(req).await;
    let status = resp.status();
    if status.as_u16() < 400 {
        return resp;
    }
    let info = match resp.extensions().get::<ErrorInfo>() {
        Some(info) => info.clone(),
        None => {
            let is_plain = resp
                .headers()
                .get(header::CONTENT_TYPE)
                .is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
            if !is_plain {
                return resp;
            }
            let (parts, body) = resp.into_parts();
            let bytes = axum::body::to_bytes(body, 64 * 1024)
                .await
                .unwrap_or_default();
            let message = String::from_utf8_lossy(&bytes).trim().to_string();
            let info = ErrorInfo {
                code: match parts.status {
                    StatusCode::NOT_FOUND => "not_found",
                    StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
                    StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
                    StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
                    StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
                    s if s.is_server_error() => "internal",
                    _ => "bad_request",
                },
                message: if message.is_empty() {
                    parts
                        .status
                        .canonical_reason()
                        .unwrap_or("error")
                        .to_lowercase()
                } else {
                    message
                },
                fields: None,
            };
            let mut rebuilt = Response::from_parts(parts, axum::body::Body::empty());
            rebuilt.extensions_mut().insert(info.clone());
            return finish(rebuilt, info, &path, query.as_deref(), is_get);
        }
    };
    finish(resp, info, &path, query.as_deref(), is_get)
}

fn finish(
    resp: Response,
    info: ErrorInfo,
    path: &str,
    query: Option<&str>,
    is_get: bool,
) -> Response {
    let status = resp.status();
    let api = path.starts_with("/api/") || path.ends_with(".csv");
    if !api && status == StatusCode::UNAUTHORIZED && is_get {
        let here = match query {
            Some(q) => format!("{path}?{q}"),
            None => path.to_string(),
        };
        let next: String = form_urlencoded::byte_serialize(here.as_bytes()).collect();
        return Redirect::to(&format!("/login?next={next}")).into_response();
    }
    let (mut parts, _) = resp.into_parts();
    parts.headers.remove(header::CONTENT_LENGTH);
    if api {
        let body = super::api::views::ErrorBody {
            error: info.code.to_string(),
            message: info.message,
            fields: info.fields,
        };
        let body = serde_json::to_string(&body).unwrap_or_default();
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        Response::from_parts(parts, axum::body::Body::from(body))
    } else {
        let page = ErrorPage::new(status, &info.message);
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        );
        Response::from_parts(parts, axum::body::Body::from(page.render_html()))
    }
}
