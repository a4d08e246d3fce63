//! Who is asking: session or bearer-token authentication, the roles they
//! hold, the sign-in throttle and the sign-in / sign-out handlers.

use axum::routing::{get, post};
use axum::Router;
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::Form;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use tower_sessions::Session;

use super::error::AppError;
use super::pages::{LoginPage, PageCtx};
use super::AppState;
use crate::db::{self, audit::Actor, users::Membership, users::User};
use crate::domain::{self, Email, GlobalRole};

pub(crate) const SESSION_USER: &str = "uid";
const SESSION_EPOCH: &str = "epoch";
const SESSION_LOGIN_AT: &str = "login_at";

/// Failed sign-ins allowed per client address per window.
const IP_LIMIT: i32 = 20;
/// Failed sign-ins allowed per account per window. The window is short, so
/// a stranger can slow an account down but never lock it for good.
const ACCOUNT_LIMIT: i32 = 10;
const WINDOW_SECS: i32 = 15 * 60;

/// The signed-in user with their memberships.
#[derive(Debug, Clone)]
pub struct CurrentUser {
    pub user: User,
    pub memberships: Vec<Membership>,
    pub client_addr: String,
}

impl CurrentUser {
    pub fn role(&self) -> GlobalRole {
        self.user.role()
    }

    pub fn is_admin(&self) -> bool {
        self.role() == GlobalRole::Admin
    }

    pub fn is_finance(&self) -> bool {
        self.role() == GlobalRole::Finance
    }

    pub fn membership(&self, tenant_id: i64) -> Option<&Membership> {
        self.memberships.iter().find(|m| m.tenant_id == tenant_id)
    }

    pub fn manages_any(&self) -> bool {
        self.memberships.iter().any(Membership::is_manager)
    }

    /// The user as the author of an audit entry.
    pub fn actor(&self) -> Actor {
        Actor {
            user_id: Some(self.user.id),
            email: Some(self.user.email.clone()),
            client_addr: Some(self.client_addr.clone()),
        }
    }
}

/// The client's address: the peer, or with `GPUSLICE_TRUST_PROXY` the first
/// `X-Forwarded-For` entry set by the reverse proxy.
pub fn client_addr(parts: &Parts, trust_proxy: bool) -> String {
    if trust_proxy {
        if let Some(first) = parts
            .headers
            .get("x-forwarded-for")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
        {
            let first = first.trim();
            if !first.is_empty() {
                return first.to_string();
            }
        }
    }
    parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ci| ci.0.ip().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// The bearer token of a request, if it carries one.
pub fn bearer(parts: &Parts) -> Option<&str> {
    parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// SHA-256 hex of an API token, the form it is stored in.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

impl FromRequestParts<AppState> for CurrentUser {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        if let Some(cached) = parts.extensions.get::<CurrentUser>() {
            return Ok(cached.clone());
        }
        let addr = client_addr(parts, state.settings.trust_proxy);
        let user_id = if parts.headers.contains_key(header::AUTHORIZATION) {
            // A request that names a token is judged by the token alone,
            // never by cookies that happen to ride along.
            let token = bearer(parts).ok_or(AppError::Unauthenticated)?;
            db::tokens::user_for_hash(&state.pool, &token_hash(token))
                .await?
                .ok_or(AppError::Unauthenticated)?
        } else {
            let session = Session::from_request_parts(parts, state)
                .await
                .map_err(|_| AppError::Unauthenticated)?;
            session_user(&session, state).await?
        };
        let user = match db::users::get(&state.pool, user_id).await {
            Ok(u) if !u.disabled => u,
            Ok(_) | Err(sqlx::Error::RowNotFound) => return Err(AppError::Unauthenticated),
            Err(e) => return Err(e.into()),
        };
        let memberships = db::users::memberships(&state.pool, user.id).await?;
        let current = CurrentUser {
            user,
            memberships,
            client_addr: addr,
        };
        parts.extensions.insert(current.clone());
        Ok(current)
    }
}

/// The user id of a live session, ending the session when the account was
/// disabled, its password reset, or the absolute lifetime is over.
async fn session_user(session: &Session, state: &AppState) -> Result<i64, AppError> {
    let uid: Option<i64> = session.get(SESSION_USER).await.map_err(anyhow_err)?;
    let Some(uid) = uid else {
        return Err(AppError::Unauthenticated);
    };
    let epoch: Option<i32> = session.get(SESSION_EPOCH).await.map_err(anyhow_err)?;
    let login_at: Option<i64> = session.get(SESSION_LOGIN_AT).await.map_err(anyhow_err)?;
    let current_epoch = db::users::live_session_epoch(&state.pool, uid).await?;
    let age = OffsetDateTime::now_utc().unix_timestamp() - login_at.unwrap_or(0);
    let alive = current_epoch.is_some()
        && current_epoch == epoch
        && age < state.settings.session_absolute_secs;
    if !alive {
        session.flush().await.map_err(anyhow_err)?;
        return Err(AppError::Unauthenticated);
    }
    Ok(uid)
}

fn anyhow_err(e: impl std::error::Error + Send + Sync + 'static) -> AppError {
    AppError::Internal(anyhow::Error::new(e))
}

#[derive(Debug, Deserialize)]
pub struct NextQuery {
    pub next: Option<String>,
}

/// Only same-site paths are followed after sign-in (no open redirect):
/// browsers drop tabs and newlines from URLs and read `\\` as `/`, so
/// `/\t/evil.example` is `//evil.example` to them. A path with a control
/// character, a backslash or a leading `//` (after that normalisation),
/// or longer than 2,000 bytes, is refused for `/`.
pub fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n)
            if n.starts_with('/')
                && n.len() <= 2000
                && !n.chars().any(|c| c.is_control() || c == '\\')
                && !n.starts_with("//") =>
        {
            n.to_string()
        }
        _ => "/".to_string(),
    }
}

pub async fn login_page(
    session: Session,
    Query(q): Query<NextQuery>,
    maybe_user: Option<CurrentUser>,
) -> Result<Response, AppError> {
    if maybe_user.is_some() {
        return Ok(Redirect::to(&safe_next(q.next.as_deref())).into_response());
    }
    let ctx = PageCtx::new(&session, None).await?;
    Ok(LoginPage {
        ctx,
        email: String::new(),
        next: safe_next(q.next.as_deref()),
        error: None,
    }
    .into_response())
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    email: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    next: Option<String>,
}

/// The longest e-mail address (RFC 5321's path limit).
const MAX_EMAIL_LEN: usize = 254;

pub async fn login(
    State(state): State<AppState>,
    session: Session,
    parts: RequestParts,
    Form(form): Form<LoginForm>,
) -> Result<Response, AppError> {
    let addr = parts.client_addr;
    let next = safe_next(form.next.as_deref());
    // No address is longer (RFC 5321); a longer one is refused before it
    // reaches the throttle table or the audit log.
    if form.email.trim().len() > MAX_EMAIL_LEN {
        let page = LoginPage {
            ctx: PageCtx::new(&session, None).await?,
            email: String::new(),
            next,
            error: Some(format!(
                "An e-mail address has at most {MAX_EMAIL_LEN} characters."
            )),
        };
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    }
    let email_key = form.email.trim().to_lowercase();
    let ip_key = format!("ip:{addr}");
    let account_key = format!("account:{email_key}");
    for (key, limit) in [(&ip_key, IP_LIMIT), (&account_key, ACCOUNT_LIMIT)] {
        if let Some(secs) = db::throttle::blocked_for(&state.pool, key, limit, WINDOW_SECS).await? {
            return Err(AppError::TooManyRequests(secs));
        }
    }

    let creds = match Email::parse(&form.email) {
        Ok(email) => db::users::credentials(&state.pool, &email).await?,
        Err(_) => None,
    };
    // Unknown accounts are checked against a dummy hash so that they take as
    // long as a wrong password for a real one.
    let stored = creds
        .as_ref()
        .map(|c| c.password_hash.clone())
        .unwrap_or_else(|| state.dummy_hash.to_string());
    let password = form.password;
    let matches = tokio::task::spawn_blocking(move || domain::verify_password(&stored, &password))
        .await
        .map_err(|e| AppError::Internal(e.into()))?;

    let actor = Actor {
        user_id: creds.as_ref().map(|c| c.id),
        email: Some(email_key.clone()),
        client_addr: Some(addr.clone()),
    };
    let ok_user = creds.filter(|c| matches && !c.disabled);
    let Some(creds) = ok_user else {
        db::throttle::record_failure(&state.pool, &ip_key, WINDOW_SECS).await?;
        db::throttle::record_failure(&state.pool, &account_key, WINDOW_SECS).await?;
        if let Some(id) = actor.user_id {
            db::users::record_login(&state.pool, id, false).await?;
        }
        db::audit::record(
            &state.pool,
            &actor,
            "login.failed",
            &email_key,
            serde_json::json!({}),
        )
        .await?;
        let ctx = PageCtx::new(&session, None).await?;
        let page = LoginPage {
            ctx,
            email: form.email.trim().to_string(),
            next,
            error: Some("That e-mail address and password do not match an account.".into()),
        };
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };

    // A fresh session id at sign-in defeats session fixation.
    session.cycle_id().await.map_err(anyhow_err)?;
    session
        .insert(SESSION_USER, creds.id)
        .await
        .map_err(anyhow_err)?;
    session
        .insert(SESSION_EPOCH, creds.session_epoch)
        .await
        .map_err(anyhow_err)?;
    session
        .insert(SESSION_LOGIN_AT, OffsetDateTime::now_utc().unix_timestamp())
        .await
        .map_err(anyhow_err)?;
    super::csrf::rotate(&session).await?;
    db::throttle::clear(&state.pool, &account_key).await?;
    db::users::record_login(&state.pool, creds.id, true).await?;
    db::audit::record(
        &state.pool,
        &actor,
        "login.succeeded",
        &email_key,
        serde_json::json!({}),
    )
    .await?;
    Ok(Redirect::to(&next).into_response())
}

pub async fn logout(
    State(state): State<AppState>,
    session: Session,
    user: Option<CurrentUser>,
) -> Result<Response, AppError> {
    if let Some(user) = user {
        db::audit::record(
            &state.pool,
            &user.actor(),
            "logout",
            &user.user.email,
            serde_json::json!({}),
        )
        .await?;
    }
    // Deletes the session row: the cookie is worthless from now on.
    session.flush().await.map_err(anyhow_err)?;
    Ok(Redirect::to("/login").into_response())
}

/// Small facts about the request that handlers need (client address).
pub struct RequestParts {
    pub client_addr: String,
}

impl FromRequestParts<AppState> for RequestParts {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        Ok(RequestParts {
            client_addr: client_addr(parts, state.settings.trust_proxy),
        })
    }
}

/// The signed-in user if `allowed` says yes; 403 with `refusal` otherwise
/// (401 when signed out).
async fn user_with_role(
    parts: &mut Parts,
    state: &AppState,
    allowed: fn(&CurrentUser) -> bool,
    refusal: &str,
) -> Result<CurrentUser, AppError> {
    let user =
        <CurrentUser as FromRequestParts<AppState>>::from_request_parts(parts, state).await?;
    if allowed(&user) {
        Ok(user)
    } else {
        Err(AppError::Forbidden(refusal.into()))
    }
}

/// A signed-in platform admin: the extractor of every `/admin` handler, so
/// none can forget the check.
#[derive(Debug, Clone)]
pub struct Admin(pub CurrentUser);

impl FromRequestParts<AppState> for Admin {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        user_with_role(
            parts,
            state,
            CurrentUser::is_admin,
            "this page is for platform admins",
        )
        .await
        .map(Admin)
    }
}

/// Finance staff or a platform admin: the extractor of the reports.
#[derive(Debug, Clone)]
pub struct Finance(pub CurrentUser);

impl FromRequestParts<AppState> for Finance {
    type Rejection = AppError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        user_with_role(
            parts,
            state,
            |u| u.is_finance() || u.is_admin(),
            "reports are for finance and platform admins",
        )
        .await
        .map(Finance)
    }
}

impl axum::extract::OptionalFromRequestParts<AppState> for CurrentUser {
    type Rejection = AppError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Option<Self>, AppError> {
        match <CurrentUser as FromRequestParts<AppState>>::from_request_parts(parts, state).await {
            Ok(u) => Ok(Some(u)),
            Err(AppError::Unauthenticated) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A new API token: `gps_` and 256 random bits in base64url. Returns the
/// token (shown once), its hash (stored) and a prefix (to tell tokens apart
/// in lists).
pub fn generate_token() -> (String, String, String) {
    use base64::Engine;
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    let token = format!(
        "gps_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    );
    let prefix = token.chars().take(10).collect();
    let hash = token_hash(&token);
    (token, hash, prefix)
}

/// Signing in and out.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
}
