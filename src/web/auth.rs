//! Who is asking: session or bearer-token authentication, the roles they
//! hold, the sign-in throttle and the sign-in / sign-out handlers.

use axum::routing::{get, post};
use axum::Router;
use std::net::{IpAddr, SocketAddr};

use axum::extract::{ConnectInfo, FromRequestParts, Query, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
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
use crate::domain::security::{Detector, Suspect};
use crate::domain::{Email, GlobalRole};

pub(crate) const SESSION_USER: &str = "uid";
const SESSION_EPOCH: &str = "epoch";
const SESSION_LOGIN_AT: &str = "login_at";

/// Sign-in attempts allowed per client address per window (any accounts).
pub(crate) const IP_LIMIT: i32 = 20;
/// Attempts allowed per account from one address per window. A stranger
/// elsewhere cannot use it to lock the owner out.
const ACCOUNT_LIMIT: i32 = 10;
/// Attempts allowed per account from all addresses together per window (a
/// guessing attack spread over many addresses). Past it, only addresses the
/// account has signed in from before are let through, so the owner keeps
/// getting in while the strangers wait.
const ACCOUNT_CEILING: i32 = 50;
pub(crate) const WINDOW_SECS: i32 = 15 * 60;

/// What throttling counts as one client: an IPv4 address, or an IPv6
/// address's /64 network (a host usually owns a whole /64, and privacy
/// addresses rotate inside it).
pub fn throttle_scope(addr: &str) -> String {
    match addr.parse::<IpAddr>().map(|ip| ip.to_canonical()) {
        Ok(IpAddr::V6(v6)) => ipnet::Ipv6Net::new(v6, 64)
            .map(|n| n.trunc().to_string())
            .unwrap_or_else(|_| addr.to_string()),
        Ok(v4) => v4.to_string(),
        Err(_) => addr.to_string(),
    }
}

/// The three throttle counters one sign-in attempt counts against.
pub(crate) struct ThrottleKeys {
    pub(crate) address: String,
    pair: String,
    account: String,
}

impl ThrottleKeys {
    /// Each counter has its own prefix, so no typed e-mail address can
    /// name another counter's key (`x@y|1.2.3.4` as an address must not
    /// count against the owner of `x@y` at 1.2.3.4).
    pub(crate) fn new(addr: &str, email: &str) -> Self {
        ThrottleKeys {
            address: format!("ip:{addr}"),
            pair: format!("pair:{email}|{addr}"),
            account: format!("account:{email}"),
        }
    }

    /// Takes this attempt back from every counter.
    async fn forgive(&self, pool: &sqlx::PgPool) -> Result<(), AppError> {
        for key in [&self.address, &self.pair, &self.account] {
            db::throttle::forgive(pool, key).await?;
        }
        Ok(())
    }
}

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

/// The client's address: the peer, or behind a reverse proxy the address
/// that proxy saw. `X-Forwarded-For` is read only with `--trust-proxy` or
/// when the peer is one of `--trusted-proxies`, and then from the right:
/// every proxy appends the address it was reached from, so the left-most
/// entries are whatever the client chose to send. With `--trust-proxy` the
/// right-most entry (added by the one proxy in front) is the client; with
/// `--trusted-proxies` entries are walked from the right past the trusted
/// proxies' own addresses.
pub fn client_addr(parts: &Parts, settings: &super::WebSettings) -> String {
    // IPv4 clients of a server bound to `[::]` arrive as ::ffff:a.b.c.d.
    let peer = parts
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map(|ci| ci.0.ip().to_canonical());
    let xff: Vec<&str> = parts
        .headers
        .get_all("x-forwarded-for")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    forwarded_client(peer, &xff.join(","), settings)
        .or(peer)
        .map_or_else(|| "unknown".into(), |ip| ip.to_string())
}

/// The client address `X-Forwarded-For` vouches for, if the settings let it
/// be read at all (see [`client_addr`]).
pub fn forwarded_client(
    peer: Option<IpAddr>,
    xff: &str,
    settings: &super::WebSettings,
) -> Option<IpAddr> {
    let trusted = |ip: &IpAddr| settings.trusted_proxies.iter().any(|n| n.contains(ip));
    let entries: Vec<&str> = xff
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    if !settings.trusted_proxies.is_empty() {
        if !peer.as_ref().is_some_and(trusted) {
            return None;
        }
        // The last hop that is not one of ours; an entry that is not an
        // address was not written by a proxy of ours: stop before it.
        let mut found = None;
        for e in entries.iter().rev() {
            let ip = parse_forwarded_ip(e)?;
            found = Some(ip);
            if !trusted(&ip) {
                break;
            }
        }
        return found;
    }
    if settings.trust_proxy {
        return entries.last().and_then(|e| parse_forwarded_ip(e));
    }
    None
}

/// An address as proxies write it: bare, or IPv6 in brackets, or with a port.
fn parse_forwarded_ip(entry: &str) -> Option<IpAddr> {
    let ip = entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .and_then(|e| e.parse().ok())
        })?;
    Some(ip.to_canonical())
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
        let addr = client_addr(parts, &state.settings);
        let user_id = if parts.headers.contains_key(header::AUTHORIZATION) {
            // A request that names a token is judged by the token alone,
            // never by cookies that happen to ride along.
            let token = bearer(parts).ok_or(AppError::Unauthenticated)?;
            let (token_id, user_id, name) =
                db::tokens::user_for_hash(&state.pool, &token_hash(token))
                    .await?
                    .ok_or(AppError::Unauthenticated)?;
            let scope = throttle_scope(&addr);
            if let Some(before) =
                db::security::token_used_from(&state.pool, token_id, &scope).await?
            {
                // A token that moves to a new address may have leaked.
                if before > 0 {
                    let detail = format!(
                        "API token \"{name}\" used from {scope}, new for it (used from {before} other address{} before)",
                        if before == 1 { "" } else { "es" }
                    );
                    crate::watch::security::report_later(
                        &state.pool,
                        crate::watch::security::Report::new(
                            Suspect::Account(user_id),
                            Detector::TokenNewAddress,
                            detail,
                        ),
                    );
                }
            }
            user_id
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
    let uid: Option<i64> = session.get(SESSION_USER).await?;
    let Some(uid) = uid else {
        return Err(AppError::Unauthenticated);
    };
    let epoch: Option<i32> = session.get(SESSION_EPOCH).await?;
    let login_at: Option<i64> = session.get(SESSION_LOGIN_AT).await?;
    let current_epoch = db::users::live_session_epoch(&state.pool, uid).await?;
    let age = OffsetDateTime::now_utc().unix_timestamp() - login_at.unwrap_or(0);
    let alive = current_epoch.is_some()
        && current_epoch == epoch
        && age < state.settings.session_absolute_secs;
    if !alive {
        session.flush().await?;
        return Err(AppError::Unauthenticated);
    }
    Ok(uid)
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
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    Query(q): Query<NextQuery>,
    maybe_user: Option<CurrentUser>,
) -> Result<Response, AppError> {
    if maybe_user.is_some() {
        return Ok(Redirect::to(&safe_next(q.next.as_deref())).into_response());
    }
    let (token, set_cookie) =
        super::csrf::pre_session_token(&headers, state.settings.secure_cookies);
    let ctx = PageCtx::sign_in(&session, token).await?;
    let mut resp = LoginPage::new(
        &state,
        ctx,
        String::new(),
        safe_next(q.next.as_deref()),
        None,
    )
    .into_response();
    if let Some(c) = set_cookie {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    Ok(resp)
}

/// The sign-in page's layout when the form comes back with an error.
async fn sign_in_ctx(
    state: &AppState,
    session: &Session,
    headers: &HeaderMap,
) -> Result<PageCtx, AppError> {
    let (token, _) = super::csrf::pre_session_token(headers, state.settings.secure_cookies);
    PageCtx::sign_in(session, token).await
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

/// A sign-in limit was reached: evidence for the security monitor,
/// recorded in the background so the answer is not delayed.
fn burst(state: &AppState, suspect: Suspect, detail: String) {
    crate::watch::security::report_later(
        &state.pool,
        crate::watch::security::Report::new(suspect, Detector::SignInFailures, detail),
    );
}

pub async fn login(
    State(state): State<AppState>,
    session: Session,
    parts: RequestParts,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Result<Response, AppError> {
    let addr = parts.client_addr;
    let next = safe_next(form.next.as_deref());
    // No address is longer (RFC 5321); a longer one is refused before it
    // reaches the throttle table or the audit log.
    if form.email.trim().len() > MAX_EMAIL_LEN {
        let page = LoginPage::new(
            &state,
            sign_in_ctx(&state, &session, &headers).await?,
            String::new(),
            next,
            Some(format!(
                "An e-mail address has at most {MAX_EMAIL_LEN} characters."
            )),
        );
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    }
    let email_key = form.email.trim().to_lowercase();
    // An IPv6 client is counted by its /64 (one host can use the whole
    // block); so are its known addresses.
    let addr_key = throttle_scope(&addr);
    let keys = ThrottleKeys::new(&addr_key, &email_key);
    let creds = match Email::parse(&form.email) {
        Ok(email) => db::users::credentials(&state.pool, &email).await?,
        Err(_) => None,
    };
    // Counted before the password is checked, each in one statement, so
    // parallel guesses cannot slip past a limit.
    let (n, left) = db::throttle::hit(&state.pool, &keys.address, WINDOW_SECS).await?;
    if n > IP_LIMIT {
        if n == IP_LIMIT + 1 {
            burst(&state, Suspect::Address(addr_key.clone()), format!(
                "{IP_LIMIT} sign-in attempts within 15 minutes from {addr_key}; further ones refused"
            ));
        }
        return Err(AppError::TooManyRequests(left));
    }
    let (n, left) = db::throttle::hit(&state.pool, &keys.pair, WINDOW_SECS).await?;
    if n > ACCOUNT_LIMIT {
        if n == ACCOUNT_LIMIT + 1 {
            let suspect = match &creds {
                Some(c) => Suspect::Account(c.id),
                None => Suspect::Address(addr_key.clone()),
            };
            burst(&state, suspect, format!(
                "{ACCOUNT_LIMIT} sign-in attempts within 15 minutes for {} from {addr_key}; further ones refused",
                if creds.is_some() { "this account" } else { "an unknown account" }
            ));
        }
        return Err(AppError::TooManyRequests(left));
    }
    let (n, left) = db::throttle::hit(&state.pool, &keys.account, WINDOW_SECS).await?;
    if let (true, Some(c)) = (n == ACCOUNT_CEILING + 1, &creds) {
        burst(&state, Suspect::Account(c.id), format!(
            "{ACCOUNT_CEILING} sign-in attempts within 15 minutes for this account from several addresses (latest {addr_key}); only its known addresses get through"
        ));
    }
    if n > ACCOUNT_CEILING {
        let known = match &creds {
            Some(c) => db::throttle::known_address(&state.pool, c.id, &addr_key).await?,
            None => false,
        };
        if !known {
            return Err(AppError::TooManyRequests(left));
        }
    }

    // A local password counts only where local passwords are on (or for
    // the break-glass admin). Unknown accounts are checked against a dummy
    // hash so that they take as long as a wrong password for a real one.
    let creds = creds.filter(|_| state.sso.password_allowed(&email_key));
    // An account with no usable password (single sign-on only) is checked
    // against the dummy hash too, so it answers as slowly as any other.
    let stored = creds
        .as_ref()
        .map(|c| c.password_hash.clone())
        .filter(|h| h.starts_with("$argon2"))
        .unwrap_or_else(|| state.dummy_hash.to_string());
    let matches = match state.check_password(stored, form.password.clone()).await {
        Ok(m) => m,
        Err(busy) => {
            // Not checked: the attempt does not count against anyone.
            keys.forgive(&state.pool).await?;
            return Err(busy);
        }
    };

    let actor = Actor {
        user_id: creds.as_ref().map(|c| c.id),
        email: Some(email_key.clone()),
        client_addr: Some(addr.clone()),
    };
    let ok_user = creds.filter(|c| matches && !c.disabled);
    // Not a local account (or not its password): the campus directory.
    if let (None, Some(ldap)) = (&ok_user, &state.sso.ldap) {
        if let Some(who) = ldap.authenticate(&form.email, &form.password).await? {
            let (user_id, epoch) = match super::sso::provision(&state, &who, &addr).await {
                Ok(u) => u,
                Err(AppError::Forbidden(m)) | Err(AppError::Conflict(m)) => {
                    return login_error(&state, &session, &headers, StatusCode::FORBIDDEN, m).await;
                }
                Err(e) => return Err(e),
            };
            keys.forgive(&state.pool).await?;
            db::throttle::clear(&state.pool, &keys.pair).await?;
            let actor = Actor {
                user_id: Some(user_id),
                email: Some(who.email.as_str().to_string()),
                client_addr: Some(addr.clone()),
            };
            begin_session(
                &state,
                &session,
                SignedIn {
                    user_id,
                    session_epoch: epoch,
                    email: who.email.as_str(),
                    addr_key: &addr_key,
                    actor: &actor,
                    how: "ldap",
                    accept_invitations: who.email_verified,
                },
            )
            .await?;
            return Ok(after_sign_in(&state, &next));
        }
    }
    let Some(creds) = ok_user else {
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
        let ctx = sign_in_ctx(&state, &session, &headers).await?;
        let message = if state.sso.ldap.is_some() {
            "That name and password do not match an account or the campus directory."
        } else {
            "That e-mail address and password do not match an account."
        };
        let page = LoginPage::new(
            &state,
            ctx,
            form.email.trim().to_string(),
            next,
            Some(message.into()),
        );
        return Ok((StatusCode::UNAUTHORIZED, page).into_response());
    };

    keys.forgive(&state.pool).await?;
    db::throttle::clear(&state.pool, &keys.pair).await?;
    begin_session(
        &state,
        &session,
        SignedIn {
            user_id: creds.id,
            session_epoch: creds.session_epoch,
            email: &email_key,
            addr_key: &addr_key,
            actor: &actor,
            how: "password",
            accept_invitations: true,
        },
    )
    .await?;
    Ok(after_sign_in(&state, &next))
}

/// The sign-in page again with `why` (single sign-on refusals).
pub async fn login_error(
    state: &AppState,
    session: &Session,
    headers: &HeaderMap,
    status: StatusCode,
    why: String,
) -> Result<Response, AppError> {
    let (token, set_cookie) =
        super::csrf::pre_session_token(headers, state.settings.secure_cookies);
    let ctx = PageCtx::sign_in(session, token).await?;
    let mut resp = (
        status,
        LoginPage::new(state, ctx, String::new(), "/".into(), Some(why)),
    )
        .into_response();
    if let Some(c) = set_cookie {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    Ok(resp)
}

/// Turns the open invitations of `email` (the account's own address) into
/// memberships of `user_id`, each audited.
pub async fn accept_invitations(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    actor: &Actor,
    user_id: i64,
    email: &str,
) -> Result<(), AppError> {
    for (tenant, role) in db::manage::accept_invitations(tx, user_id, email).await? {
        db::audit::record(
            &mut **tx,
            actor,
            "invitation.accepted",
            email,
            serde_json::json!({"tenant": tenant, "role": role}),
        )
        .await?;
    }
    Ok(())
}

/// The answer to a successful sign-in: to `next`, the pre-session CSRF
/// cookie cleared.
pub fn after_sign_in(state: &AppState, next: &str) -> Response {
    let mut resp = Redirect::to(next).into_response();
    resp.headers_mut().append(
        header::SET_COOKIE,
        super::csrf::clear_pre_cookie(state.settings.secure_cookies),
    );
    resp
}

/// Who just proved who they are, and how.
pub struct SignedIn<'a> {
    pub user_id: i64,
    pub session_epoch: i32,
    /// The account's address (lower case).
    pub email: &'a str,
    /// The client's address as the throttle counts it.
    pub addr_key: &'a str,
    pub actor: &'a Actor,
    /// `password`, `oidc`, `ldap` or `invitation` (audited).
    pub how: &'a str,
    /// The sign-in proved the account's address (a password, a provider
    /// that vouches for it): open invitations of that address are
    /// accepted.
    pub accept_invitations: bool,
}

/// Starts a signed-in session for every way of signing in: a fresh
/// session id (defeats session fixation), a new CSRF token, the address
/// remembered as known, the sign-in recorded and audited, and any open
/// invitations of the address turned into memberships.
pub async fn begin_session(
    state: &AppState,
    session: &Session,
    who: SignedIn<'_>,
) -> Result<(), AppError> {
    session.cycle_id().await?;
    session.insert(SESSION_USER, who.user_id).await?;
    session.insert(SESSION_EPOCH, who.session_epoch).await?;
    session
        .insert(SESSION_LOGIN_AT, OffsetDateTime::now_utc().unix_timestamp())
        .await?;
    super::csrf::rotate(session).await?;
    db::throttle::remember_address(&state.pool, who.user_id, who.addr_key).await?;
    db::users::record_login(&state.pool, who.user_id, true).await?;
    let mut tx = state.pool.begin().await?;
    // By the account's own address, never the one a provider sent.
    if who.accept_invitations {
        let stored = db::users::get(&mut *tx, who.user_id).await?.email;
        accept_invitations(&mut tx, who.actor, who.user_id, &stored).await?;
    }
    db::audit::record(
        &mut *tx,
        who.actor,
        "login.succeeded",
        who.email,
        serde_json::json!({"via": who.how}),
    )
    .await?;
    tx.commit().await?;
    Ok(())
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
    session.flush().await?;
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
            client_addr: client_addr(parts, &state.settings),
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
    let token = format!("gps_{}", random_secret());
    let prefix = token.chars().take(10).collect();
    let hash = token_hash(&token);
    (token, hash, prefix)
}

/// 256 random bits, URL-safe base64 without padding (API tokens, calendar
/// feed addresses).
pub fn random_secret() -> String {
    use base64::Engine;
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Signing in and out.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/auth/oidc/start", get(super::sso::oidc::start))
        .route("/auth/oidc/callback", get(super::sso::oidc::callback))
}
