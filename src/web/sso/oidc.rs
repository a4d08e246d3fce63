//! OpenID Connect sign-in: the authorization code flow with PKCE (S256),
//! `state` and `nonce` checked, and the ID token verified against the
//! provider's JWKS (signature, issuer, audience, expiry, nonce) by the
//! `openidconnect` crate. The flow's secrets live in the browser's session
//! (its cookie is `SameSite=Lax`, so it comes back with the provider's
//! redirect) and are used once: a replayed callback finds nothing. The
//! provider's metadata and keys are read at the first sign-in and again
//! after an hour or after a token that did not verify (key rotation).

use std::time::{Duration, Instant};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use base64::Engine;
use openidconnect::core::{CoreClient, CoreProviderMetadata, CoreResponseType};
use openidconnect::url;
use openidconnect::{
    AuthenticationFlow, AuthorizationCode, ClientId, ClientSecret, CsrfToken, IssuerUrl, Nonce,
    PkceCodeChallenge, PkceCodeVerifier, RedirectUrl, Scope,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tower_sessions::Session;

use super::{provision, Identity};
use crate::db;
use crate::domain::Email;
use crate::web::auth::{begin_session, safe_next, throttle_scope, RequestParts, SignedIn};
use crate::web::error::AppError;
use crate::web::AppState;

/// The provider as configured.
#[derive(Debug, Clone)]
pub struct OidcSettings {
    pub issuer: String,
    pub client_id: String,
    pub client_secret: Option<String>,
    pub scopes: Vec<String>,
    /// The claim that holds the e-mail address (default `email`).
    pub email_claim: String,
    /// The claim that holds the groups (default `groups`).
    pub groups_claim: String,
    /// The provider's name on the sign-in button.
    pub name: String,
    /// Where the provider sends the browser back; unset: this site's
    /// `/auth/oidc/callback` at its public URL.
    pub redirect_url: Option<String>,
    /// Take the e-mail claim as confirmed without `email_verified` (a
    /// provider whose addresses the campus assigns, e.g. Entra ID's `upn`).
    pub trust_email: bool,
}

/// The client as discovery makes it (authorization and token endpoints
/// set, user info maybe).
type Client = CoreClient<
    openidconnect::EndpointSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointNotSet,
    openidconnect::EndpointMaybeSet,
    openidconnect::EndpointMaybeSet,
>;

/// A configured provider with its cached metadata.
pub struct Oidc {
    pub settings: OidcSettings,
    http: reqwest::Client,
    metadata: tokio::sync::Mutex<Option<(Instant, CoreProviderMetadata)>>,
}

/// How long the provider's metadata and keys are kept.
const METADATA_TTL: Duration = Duration::from_secs(3600);
/// How long a started sign-in may take at the provider.
const FLOW_SECS: i64 = 600;
const FLOW_KEY: &str = "oidc_flow";
/// Sign-ins one address may start per throttle window.
const START_LIMIT: i32 = 60;

/// A sign-in in flight, kept in the session.
#[derive(Serialize, Deserialize)]
struct Flow {
    state: String,
    nonce: String,
    verifier: String,
    next: String,
    redirect: String,
    started: i64,
}

impl Oidc {
    pub fn new(settings: OidcSettings) -> anyhow::Result<Oidc> {
        let issuer = IssuerUrl::new(settings.issuer.clone())
            .map_err(|e| anyhow::anyhow!("GPUSLICE_OIDC_ISSUER is not a URL: {e}"))?;
        // Keys and tokens must not cross the network in the clear: plain
        // HTTP only to a provider on this machine.
        let url = issuer.url();
        let loopback = match url.host() {
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        };
        if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
            anyhow::bail!(
                "GPUSLICE_OIDC_ISSUER: use an https:// URL (plain http only for a provider on this machine)"
            );
        }
        if let Some(r) = &settings.redirect_url {
            RedirectUrl::new(r.clone())
                .map_err(|e| anyhow::anyhow!("GPUSLICE_OIDC_REDIRECT_URL is not a URL: {e}"))?;
        }
        // No redirects: a provider answers its endpoints directly, and
        // following them would let a redirect point the server elsewhere.
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_secs(10))
            .build()?;
        Ok(Oidc {
            settings,
            http,
            metadata: tokio::sync::Mutex::new(None),
        })
    }

    async fn metadata(&self) -> Result<CoreProviderMetadata, AppError> {
        let mut cached = self.metadata.lock().await;
        if let Some((at, m)) = cached.as_ref() {
            if at.elapsed() < METADATA_TTL {
                return Ok(m.clone());
            }
        }
        let issuer = IssuerUrl::new(self.settings.issuer.clone())
            .map_err(|e| AppError::Internal(anyhow::anyhow!("issuer: {e}")))?;
        let m = CoreProviderMetadata::discover_async(issuer, &self.http)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "OpenID Connect discovery failed");
                AppError::Unavailable(
                    30,
                    format!(
                        "{} cannot be reached just now; try again in a minute",
                        self.settings.name
                    ),
                )
            })?;
        *cached = Some((Instant::now(), m.clone()));
        Ok(m)
    }

    /// The client for one sign-in, sending the browser back to `redirect`.
    fn client(&self, metadata: CoreProviderMetadata, redirect: &str) -> Result<Client, AppError> {
        Ok(CoreClient::from_provider_metadata(
            metadata,
            ClientId::new(self.settings.client_id.clone()),
            self.settings.client_secret.clone().map(ClientSecret::new),
        )
        .set_redirect_uri(
            RedirectUrl::new(redirect.to_string())
                .map_err(|e| AppError::Internal(anyhow::anyhow!("redirect URL: {e}")))?,
        ))
    }

    async fn forget_metadata(&self) {
        *self.metadata.lock().await = None;
    }

    fn redirect_url(&self, state: &AppState, headers: &HeaderMap) -> String {
        self.settings.redirect_url.clone().unwrap_or_else(|| {
            format!(
                "{}/auth/oidc/callback",
                crate::web::calendar::base_url(state, headers)
            )
        })
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct StartQuery {
    next: Option<String>,
}

/// `GET /auth/oidc/start?next=`: to the provider.
pub async fn start(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    parts: RequestParts,
    Query(q): Query<StartQuery>,
) -> Result<Response, AppError> {
    let oidc = state.sso.oidc.as_ref().ok_or(AppError::NotFound)?;
    // Each start writes a session: counted per address, as sign-ins are.
    let key = format!("oidc-start:{}", throttle_scope(&parts.client_addr));
    let (n, left) = db::throttle::hit(&state.pool, &key, crate::web::auth::WINDOW_SECS).await?;
    if n > START_LIMIT {
        return Err(AppError::TooManyRequests(left));
    }
    let metadata = oidc.metadata().await?;
    let redirect = oidc.redirect_url(&state, &headers);
    let client = oidc.client(metadata, &redirect)?;
    let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
    let mut request = client
        .authorize_url(
            AuthenticationFlow::<CoreResponseType>::AuthorizationCode,
            CsrfToken::new_random,
            Nonce::new_random,
        )
        .set_pkce_challenge(challenge);
    for s in oidc
        .settings
        .scopes
        .iter()
        .filter(|s| s.as_str() != "openid")
    {
        request = request.add_scope(Scope::new(s.clone()));
    }
    let (url, csrf, nonce) = request.url();
    session
        .insert(
            FLOW_KEY,
            Flow {
                state: csrf.secret().clone(),
                nonce: nonce.secret().clone(),
                verifier: verifier.secret().clone(),
                next: safe_next(q.next.as_deref()),
                redirect,
                started: time::OffsetDateTime::now_utc().unix_timestamp(),
            },
        )
        .await?;
    Ok(Redirect::to(url.as_str()).into_response())
}

#[derive(Debug, Default, Deserialize)]
pub struct CallbackQuery {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
    error_description: Option<String>,
}

/// The claims of a token that has been verified (so its payload may be
/// read as is): the custom ones (e-mail under another name, groups) are
/// not in the crate's standard claim set.
fn payload(id_token: &str) -> Option<Value> {
    let part = id_token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part.trim_end_matches('='))
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// A claim that may be a list of strings or one string.
fn strings(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect(),
        Some(Value::String(s)) => vec![s.clone()],
        _ => Vec::new(),
    }
}

/// `GET /auth/oidc/callback`: back from the provider.
pub async fn callback(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    parts: RequestParts,
    Query(q): Query<CallbackQuery>,
) -> Result<Response, AppError> {
    let oidc = state.sso.oidc.as_ref().ok_or(AppError::NotFound)?;
    let addr_key = throttle_scope(&parts.client_addr);
    let keys = crate::web::auth::ThrottleKeys::new(&addr_key, "");
    let (n, left) =
        db::throttle::hit(&state.pool, &keys.address, crate::web::auth::WINDOW_SECS).await?;
    if n > crate::web::auth::IP_LIMIT {
        return Err(AppError::TooManyRequests(left));
    }
    // Used once: whatever happens next, this flow is gone.
    let flow: Option<Flow> = session.remove(FLOW_KEY).await?;
    macro_rules! refuse {
        ($status:expr, $why:expr $(,)?) => {
            return crate::web::auth::login_error(&state, &session, &headers, $status, $why).await
        };
    }
    let Some(flow) = flow else {
        refuse!(
            StatusCode::BAD_REQUEST,
            "That sign-in was not started in this browser or was used already; start again.".into(),
        );
    };
    if let Some(e) = q.error.as_deref() {
        let why = q.error_description.as_deref().unwrap_or(e);
        refuse!(
            StatusCode::UNAUTHORIZED,
            format!(
                "{} did not sign you in (it said: \"{}\").",
                oidc.settings.name,
                why.chars()
                    .filter(|c| !c.is_control())
                    .take(200)
                    .collect::<String>()
            ),
        );
    }
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let same_state = q.state.as_deref().is_some_and(|s| {
        use subtle_eq::eq;
        eq(s.as_bytes(), flow.state.as_bytes())
    });
    if !same_state || now - flow.started > FLOW_SECS {
        refuse!(
            StatusCode::BAD_REQUEST,
            "That sign-in did not match the one started here (or took over ten minutes); start again.".into(),
        );
    }
    let Some(code) = q.code.filter(|c| !c.is_empty() && c.len() <= 2048) else {
        refuse!(
            StatusCode::BAD_REQUEST,
            "The provider sent no sign-in code.".into()
        );
    };
    let metadata = oidc.metadata().await?;
    let client = oidc.client(metadata, &flow.redirect)?;
    let exchanged = match client.exchange_code(AuthorizationCode::new(code)) {
        Ok(req) => {
            req.set_pkce_verifier(PkceCodeVerifier::new(flow.verifier.clone()))
                .request_async(&oidc.http)
                .await
        }
        Err(e) => {
            return Err(AppError::Internal(anyhow::anyhow!("token endpoint: {e}")));
        }
    };
    let tokens = match exchanged {
        Ok(t) => t,
        Err(e) => {
            tracing::info!(error = %e, "OpenID Connect code exchange refused");
            refuse!(
                StatusCode::UNAUTHORIZED,
                format!(
                    "{} refused the sign-in code (it may have been used already); start again.",
                    oidc.settings.name
                ),
            );
        }
    };
    use openidconnect::TokenResponse;
    let Some(id_token) = tokens.id_token() else {
        refuse!(
            StatusCode::UNAUTHORIZED,
            "The provider sent no ID token.".into()
        );
    };
    let verifier = client.id_token_verifier();
    let claims = match id_token.claims(&verifier, &Nonce::new(flow.nonce.clone())) {
        Ok(c) => c.clone(),
        Err(e) => {
            tracing::warn!(error = %e, "an OpenID Connect ID token did not verify");
            // Perhaps the provider rotated its keys: read them again next time.
            oidc.forget_metadata().await;
            refuse!(
                StatusCode::UNAUTHORIZED,
                format!(
                    "The ID token from {} did not verify; nobody was signed in.",
                    oidc.settings.name
                ),
            );
        }
    };
    let raw = payload(&id_token.to_string()).unwrap_or(Value::Null);
    let email_raw = raw
        .get(&oidc.settings.email_claim)
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| claims.email().map(|e| e.as_str().to_string()));
    let Some(email) = email_raw.and_then(|e| Email::parse(&e).ok()) else {
        refuse!(
            StatusCode::UNAUTHORIZED,
            format!(
                "{} did not say your e-mail address (claim \"{}\"); ask your admins to release it to gpuslice.",
                oidc.settings.name, oidc.settings.email_claim
            ),
        );
    };
    let name = claims
        .name()
        .and_then(|n| n.get(None))
        .map(|n| n.as_str().to_string())
        .unwrap_or_default();
    let address = email.as_str().to_string();
    let who = Identity {
        provider: "oidc",
        subject: format!("{}#{}", claims.issuer().as_str(), claims.subject().as_str()),
        email,
        // `email_verified` speaks of the `email` claim only.
        email_verified: oidc.settings.trust_email
            || (raw.get("email_verified").and_then(Value::as_bool) == Some(true)
                && raw
                    .get("email")
                    .and_then(Value::as_str)
                    .map(str::to_lowercase)
                    .as_deref()
                    == Some(address.as_str())),
        name,
        groups: strings(raw.get(&oidc.settings.groups_claim)),
    };
    let (user_id, epoch) = match provision(&state, &who, &parts.client_addr).await {
        Ok(u) => u,
        Err(AppError::Forbidden(m)) | Err(AppError::Conflict(m)) => {
            refuse!(StatusCode::FORBIDDEN, m);
        }
        Err(e) => return Err(e),
    };
    db::throttle::forgive(&state.pool, &keys.address).await?;
    let actor = db::audit::Actor {
        user_id: Some(user_id),
        email: Some(who.email.as_str().to_string()),
        client_addr: Some(parts.client_addr.clone()),
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
            how: "oidc",
            accept_invitations: who.email_verified,
        },
    )
    .await?;
    Ok(Redirect::to(&flow.next).into_response())
}

/// Constant-time equality for the state check.
mod subtle_eq {
    pub fn eq(a: &[u8], b: &[u8]) -> bool {
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }
}
