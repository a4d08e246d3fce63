//! The web application: routes, layers and shared state.

pub mod admin;
pub mod alerts;
pub mod api;
pub mod assets;
pub mod auth;
pub mod bookings;
pub mod calendar;
pub mod charts;
pub mod csrf;
pub mod cursor;
pub mod error;
pub mod fleet;
pub mod forms;
pub mod home;
pub mod invite;
pub mod ops;
pub mod optimizer;
pub mod pages;
pub mod security;
pub mod settings;
pub mod sso;
pub mod tenant;
pub mod timeline;
pub mod usage;

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
    /// Take the client address from the right-most `X-Forwarded-For` entry
    /// (behind one reverse proxy).
    pub trust_proxy: bool,
    /// Reverse proxies whose `X-Forwarded-For` entries are believed; when
    /// set, only requests from these peers are read that way.
    pub trusted_proxies: Vec<ipnet::IpNet>,
    /// Longest a request may take to produce its response head.
    pub request_timeout: Duration,
    /// Longest a client may take to send a request's head (slow-loris guard).
    pub header_read_timeout: Duration,
    /// Requests served at once; beyond it, 503 with `Retry-After`.
    pub max_concurrent_requests: usize,
    /// A session unused this long ends.
    pub session_idle_secs: i64,
    /// A session ends this long after sign-in, however busy.
    pub session_absolute_secs: i64,
    /// The site's address as people reach it (`https://gpus.uni.edu`):
    /// links in e-mails (invitations), calendar addresses and the OpenID
    /// Connect redirect are made from it, never from a request's `Host`.
    pub public_url: Option<String>,
}

impl Default for WebSettings {
    fn default() -> Self {
        WebSettings {
            secure_cookies: false,
            trust_proxy: false,
            trusted_proxies: Vec::new(),
            request_timeout: Duration::from_secs(30),
            header_read_timeout: Duration::from_secs(10),
            max_concurrent_requests: 512,
            session_idle_secs: 2 * 3600,
            session_absolute_secs: 12 * 3600,
            public_url: None,
        }
    }
}

/// Usage exports streaming at once (of the pool's 16 connections).
pub const MAX_EXPORTS: usize = 4;

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
    /// Password hashes checked at once (argon2id takes 19 MiB and a core
    /// each): one per core, so a flood of sign-ins cannot take them all.
    pub password_slots: Arc<tokio::sync::Semaphore>,
    /// Usage exports streaming at once (each holds a database connection
    /// while the client reads).
    pub export_slots: Arc<tokio::sync::Semaphore>,
    /// Requests being served at once (see [`WebSettings::max_concurrent_requests`]).
    pub request_slots: Arc<tokio::sync::Semaphore>,
    /// Requests in flight per client (address, or IPv6 /64): one client may
    /// hold at most half of the request slots.
    pub in_flight: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// Single sign-on (OpenID Connect, LDAP) and the group mapping.
    pub sso: Arc<sso::Sso>,
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
            metrics: Arc::new(ops::Metrics::default()),
            dummy_hash: dummy.into(),
            booking_settings: Arc::new(crate::booking::Settings::default()),
            currency: Arc::from("EUR"),
            metrics_token: None,
            metrics_attribution: true,
            telemetry_interval_secs: 10,
            password_slots: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(2, usize::from),
            )),
            export_slots: Arc::new(tokio::sync::Semaphore::new(MAX_EXPORTS)),
            request_slots: Arc::new(tokio::sync::Semaphore::new(
                settings.max_concurrent_requests.max(1),
            )),
            in_flight: Arc::default(),
            sso: Arc::default(),
            settings: Arc::new(settings),
        })
    }

    /// Runs `work` (an argon2 hash or check) on the blocking pool once one of
    /// the [`AppState::password_slots`] is free; 503 when none frees within
    /// 10 seconds.
    pub async fn with_password_slot<T: Send + 'static>(
        &self,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, error::AppError> {
        let permit = tokio::time::timeout(
            Duration::from_secs(10),
            self.password_slots.clone().acquire_owned(),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or_else(|| {
            error::AppError::Unavailable(
                5,
                "the server is busy checking passwords; try again in a few seconds".into(),
            )
        })?;
        let out = tokio::task::spawn_blocking(move || {
            let out = work();
            drop(permit);
            out
        })
        .await
        .map_err(|e| error::AppError::Internal(e.into()))?;
        Ok(out)
    }

    /// Checks `password` against the argon2id hash `stored` (see
    /// [`AppState::with_password_slot`]).
    pub async fn check_password(
        &self,
        stored: String,
        password: String,
    ) -> Result<bool, error::AppError> {
        self.with_password_slot(move || domain::verify_password(&stored, &password))
            .await
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

/// Sheds load and bounds time: beyond `max_concurrent_requests` requests
/// in flight the server answers 503 with `Retry-After` at once (no queue
/// that grows without bound), and a request that has not produced its
/// response within `request_timeout` answers 503 (its work is dropped; a
/// download that has started streams on).
async fn limits(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    use axum::response::IntoResponse;
    let busy = |what: &str| {
        error::AppError::Unavailable(2, format!("{what}; try again in a moment")).into_response()
    };
    let (parts, body) = req.into_parts();
    let client = auth::throttle_scope(&auth::client_addr(&parts, &state.settings));
    let req = Request::from_parts(parts, body);
    let per_client = (state.settings.max_concurrent_requests / 2).max(1);
    let Some(_mine) = ClientSlot::take(&state.in_flight, client, per_client) else {
        return busy("you have too many requests in flight");
    };
    let Ok(_permit) = state.request_slots.clone().try_acquire_owned() else {
        return busy("the server is at its limit of requests in flight");
    };
    match tokio::time::timeout(state.settings.request_timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => error::AppError::Unavailable(
            5,
            "the request took too long and was stopped; try again in a few seconds".into(),
        )
        .into_response(),
    }
}

/// One request of a client in [`AppState::in_flight`], given back on drop.
struct ClientSlot {
    map: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    client: String,
}

impl ClientSlot {
    fn take(
        map: &Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
        client: String,
        limit: usize,
    ) -> Option<ClientSlot> {
        let mut m = map.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(client.clone()).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            map: map.clone(),
            client,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut m = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.client);
            }
        }
    }
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
        .with_name(if state.settings.secure_cookies {
            // Over HTTPS the prefix makes browsers refuse the cookie from a
            // sibling subdomain (no planted session, no login CSRF).
            "__Host-gpuslice_session"
        } else {
            "gpuslice_session"
        })
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(state.settings.secure_cookies)
        .with_expiry(Expiry::OnInactivity(time::Duration::seconds(
            state.settings.session_idle_secs,
        )));
    let request_id = HeaderName::from_static("x-request-id");

    Router::new()
        .merge(home::routes())
        .merge(tenant::routes())
        .merge(invite::routes())
        .merge(auth::routes())
        .merge(bookings::routes())
        .merge(usage::routes())
        .merge(settings::routes())
        .merge(admin::routes())
        .merge(fleet::routes())
        .merge(alerts::routes())
        .merge(optimizer::routes())
        .merge(security::routes())
        .merge(calendar::routes())
        .merge(ops::routes())
        .nest(api::BASE, api::routes())
        .fallback(not_found)
        // Layers run bottom-up on the way in: the request id first, the
        // CSRF check last, right before the handler.
        .layer(middleware::from_fn_with_state(state.clone(), csrf::protect))
        .layer(middleware::from_fn(reject_nul))
        .layer(sessions)
        .layer(middleware::from_fn_with_state(state.clone(), limits))
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
/// finishes the requests in flight (for at most 30 seconds). HTTP/1.1.
/// Connections must send a request head within `header_read_timeout` of
/// opening, and each later one within as long of the last answer on a
/// kept-alive connection (so silent, idle and slow-loris connections are
/// closed). Also runs the clean-up of expired sessions and
/// stale throttle rows.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

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
    let header_timeout = state.settings.header_read_timeout;
    let app = router(state);
    // HTTP/1.1 only (a TLS proxy in front speaks it to its backends):
    // detecting HTTP/2 would first read the connection's opening bytes
    // without any timer, so a client that connects and sends nothing would
    // be held for ever (hyper issues 3756 and 3962). Without detection,
    // hyper's header timer runs from the connection's first poll.
    let mut builder = Builder::new(TokioExecutor::new()).http1_only();
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // Out of file descriptors and the like: wait, do not spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let app = app.clone();
        let service =
            tower::service_fn(move |mut req: axum::http::Request<hyper::body::Incoming>| {
                req.extensions_mut()
                    .insert(axum::extract::ConnectInfo(peer));
                tower::ServiceExt::oneshot(app.clone(), req)
            });
        let _ = stream.set_nodelay(true);
        let conn = builder
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    cleanup.abort();
    if tokio::time::timeout(Duration::from_secs(30), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("requests still running 30 s after shutdown began were cut off");
    }
    Ok(())
}
