//! The web application: routes, layers and shared state.

pub mod admin;
pub mod alerts;
pub mod api;
pub mod assets;
pub mod auth;
pub mod bookings;
pub mod charts;
pub mod csrf;
pub mod error;
pub mod fleet;
pub mod forms;
pub mod home;
pub mod ops;
pub mod pages;
pub mod settings;
pub mod usage;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::Router;
use sqlx::PgPool;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, SessionManagerLayer};
use tower_sessions_sqlx_store::PostgresStore;

use crate::domain::{self, Password};

/// Settings of the web layer.
#[derive(Debug, Clone)]
pub struct WebSettings {
    /// Mark cookies `Secure` (set when served over HTTPS).
    pub secure_cookies: bool,
    /// Take the client address from `X-Forwarded-For` (behind a proxy).
    pub trust_proxy: bool,
    /// A session unused this long ends.
    pub session_idle_secs: i64,
    /// A session ends this long after sign-in, however busy.
    pub session_absolute_secs: i64,
}

impl Default for WebSettings {
    fn default() -> Self {
        WebSettings {
            secure_cookies: false,
            trust_proxy: false,
            session_idle_secs: 2 * 3600,
            session_absolute_secs: 12 * 3600,
        }
    }
}

/// Everything handlers share; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub pool: PgPool,
    pub settings: Arc<WebSettings>,
    pub metrics: Arc<ops::Metrics>,
    /// A real argon2id hash that unknown accounts are checked against, so
    /// that their sign-in takes as long as a wrong password.
    pub dummy_hash: Arc<str>,
    /// When bookings may start.
    pub booking_settings: Arc<crate::booking::Settings>,
    /// The currency of tariffs and reports (ISO 4217 code).
    pub currency: Arc<str>,
    /// The bearer token `/metrics` asks for; `None`: open.
    pub metrics_token: Option<Arc<str>>,
    /// Whether `/metrics` names tenants and bookings: with a token, or when
    /// served on a loopback address only (an open `/metrics` on the network
    /// would tell anyone who uses which GPU).
    pub metrics_attribution: bool,
    /// Seconds between telemetry samples (how fresh a sample must be to count).
    pub telemetry_interval_secs: u64,
}

impl AppState {
    pub async fn new(pool: PgPool, settings: WebSettings) -> anyhow::Result<Self> {
        let dummy = tokio::task::spawn_blocking(|| {
            Password::new("no account has this password, ever", None)
                .map(|p| domain::hash_password(&p))
        })
        .await?
        .map_err(|e| anyhow::anyhow!("dummy password rejected: {e}"))?;
        Ok(AppState {
            pool,
            settings: Arc::new(settings),
            metrics: Arc::new(ops::Metrics::default()),
            dummy_hash: dummy.into(),
            booking_settings: Arc::new(crate::booking::Settings::default()),
            currency: Arc::from("EUR"),
            metrics_token: None,
            metrics_attribution: true,
            telemetry_interval_secs: 10,
        })
    }
}

const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; object-src 'none'";

async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        // Pages show personal data: keep them out of shared caches.
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

/// Most bytes of a request body read to check it (forms and JSON are small).
const MAX_CHECKED_BODY: usize = 2 * 1024 * 1024;

/// Refuses text with NUL characters at the edge (PostgreSQL cannot store
/// them, so they would otherwise reach a query and fail there): in the
/// path, the query string, and form or JSON bodies. Answers 400 with a
/// sentence; nothing behind it runs.
async fn reject_nul(req: Request, next: Next) -> Response {
    use axum::response::IntoResponse;
    let refuse = || {
        error::AppError::BadRequest(
            "text may not contain NUL characters (\\0); remove them and try again".into(),
        )
        .into_response()
    };
    let has_nul = |s: &str| s.to_ascii_lowercase().contains("%00");
    if has_nul(req.uri().path()) || req.uri().query().is_some_and(has_nul) {
        return refuse();
    }
    let kind = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let form = kind.starts_with("application/x-www-form-urlencoded");
    let json = kind.starts_with("application/json");
    if !form && !json {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_CHECKED_BODY).await else {
        return error::AppError::BadRequest("the request body is too large".into()).into_response();
    };
    let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
    if (form && text.contains("%00")) || (json && (text.contains("\\u0000") || bytes.contains(&0)))
    {
        return refuse();
    }
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await
}

/// HSTS when served over HTTPS (`--secure-cookies`): browsers then never
/// try plain HTTP for a year.
async fn hsts(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let mut resp = next.run(req).await;
    if state.settings.secure_cookies {
        resp.headers_mut().insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000; includeSubDomains"),
        );
    }
    resp
}

async fn not_found() -> error::AppError {
    error::AppError::NotFound
}

/// The whole application. Tests drive exactly this.
pub fn router(state: AppState) -> Router {
    let store = PostgresStore::new(state.pool.clone());
    let sessions = SessionManagerLayer::new(store)
        .with_name("gpuslice_session")
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(state.settings.secure_cookies)
        .with_expiry(Expiry::OnInactivity(time::Duration::seconds(
            state.settings.session_idle_secs,
        )));
    let request_id = HeaderName::from_static("x-request-id");

    Router::new()
        .merge(home::routes())
        .merge(auth::routes())
        .merge(bookings::routes())
        .merge(usage::routes())
        .merge(settings::routes())
        .merge(admin::routes())
        .merge(fleet::routes())
        .merge(alerts::routes())
        .merge(ops::routes())
        .nest(api::BASE, api::routes())
        .fallback(not_found)
        // Layers run bottom-up on the way in: the request id first, the
        // CSRF check last, right before the handler.
        .layer(middleware::from_fn(csrf::protect))
        .layer(middleware::from_fn(reject_nul))
        .layer(sessions)
        .layer(middleware::from_fn(error::render_errors))
        .layer(middleware::from_fn(security_headers))
        .layer(middleware::from_fn_with_state(state.clone(), hsts))
        .layer(middleware::from_fn_with_state(state.clone(), ops::track))
        .layer(PropagateRequestIdLayer::new(request_id.clone()))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(|req: &Request| {
                    let id = req
                        .headers()
                        .get("x-request-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-");
                    tracing::info_span!("http", method = %req.method(), path = %req.uri().path(), request_id = %id)
                })
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(SetRequestIdLayer::new(request_id, MakeRequestUuid))
        .with_state(state)
}

/// Serves the application on `listener` until `shutdown` resolves, then
/// finishes the requests in flight. Also runs the clean-up of expired
/// sessions and stale throttle rows.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let cleanup_pool = state.pool.clone();
    let cleanup = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(300));
        loop {
            tick.tick().await;
            if let Err(e) = crate::db::sessions_cleanup(&cleanup_pool).await {
                tracing::warn!(error = %e, "session clean-up failed");
            }
        }
    });
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    cleanup.abort();
    result.map_err(Into::into)
}
