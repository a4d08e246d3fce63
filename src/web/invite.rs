//! Following an invitation (`/invite/{token}`): someone without an account
//! makes one (name and password, or single sign-on where it is on) and
//! joins the tenant; someone with an account signs in and joins; a signed-in
//! person with the invited address accepts with one button. A link that was
//! used, revoked or has expired answers 404 and says so.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::{Form, Router};
use serde::Deserialize;
use serde_json::json;
use tower_sessions::Session;

use super::auth::{begin_session, throttle_scope, CurrentUser, RequestParts, SignedIn};
use super::error::AppError;
use super::forms::FieldErrors;
use super::pages::PageCtx;
use super::AppState;
use crate::db::{self, audit::Actor, manage::Invitation};
use crate::domain::{self, parse_name, Email, GlobalRole, Password};

#[derive(Template, WebTemplate)]
#[template(path = "invite.html")]
pub struct InvitePage {
    ctx: PageCtx,
    token: String,
    invitation: Option<Invitation>,
    /// Signed in as someone else (their address).
    other: Option<String>,
    /// Signed in with the invited address.
    is_invitee: bool,
    /// An account with the invited address exists (sign in to accept).
    has_account: bool,
    /// Accounts may have passwords here (not single sign-on only).
    passwords: bool,
    /// "Sign in with …" when single sign-on is on.
    sso: Option<String>,
    display_name: String,
    errors: FieldErrors,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct InviteForm {
    display_name: String,
    password: String,
}

/// The longest secret a link can carry (ours are 43 characters).
const MAX_TOKEN_LEN: usize = 100;

async fn find(state: &AppState, token: &str) -> Result<Option<Invitation>, AppError> {
    if token.is_empty() || token.len() > MAX_TOKEN_LEN {
        return Ok(None);
    }
    Ok(db::manage::invitation_by_token(&state.pool, &super::auth::token_hash(token)).await?)
}

#[allow(clippy::too_many_arguments)]
async fn render(
    state: &AppState,
    session: &Session,
    headers: &HeaderMap,
    user: Option<&CurrentUser>,
    token: &str,
    invitation: Option<Invitation>,
    display_name: String,
    errors: FieldErrors,
) -> Result<Response, AppError> {
    let (ctx, set_cookie) = match user {
        Some(u) => (PageCtx::new(session, Some(u)).await?, None),
        None => {
            let (csrf, cookie) =
                super::csrf::pre_session_token(headers, state.settings.secure_cookies);
            (PageCtx::sign_in(session, csrf).await?, cookie)
        }
    };
    let has_account = match &invitation {
        Some(i) => match Email::parse(&i.email) {
            Ok(e) => db::users::id_by_email(&state.pool, &e).await?.is_some(),
            Err(_) => false,
        },
        None => false,
    };
    let status = if invitation.is_none() {
        StatusCode::NOT_FOUND
    } else if !errors.is_empty() {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    let is_invitee = match (user, &invitation) {
        (Some(u), Some(i)) => u.user.email == i.email,
        _ => false,
    };
    let page = InvitePage {
        ctx,
        token: token.to_string(),
        other: user.filter(|_| !is_invitee).map(|u| u.user.email.clone()),
        is_invitee,
        has_account,
        passwords: state.sso.local_passwords(),
        sso: state.sso.button_label(),
        invitation,
        display_name,
        errors,
    };
    let mut resp = (status, page).into_response();
    if let Some(c) = set_cookie {
        resp.headers_mut().append(header::SET_COOKIE, c);
    }
    Ok(resp)
}

/// `GET /invite/{token}`.
pub async fn show(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    user: Option<CurrentUser>,
    Path(token): Path<String>,
) -> Result<Response, AppError> {
    let invitation = find(&state, &token).await?;
    render(
        &state,
        &session,
        &headers,
        user.as_ref(),
        &token,
        invitation,
        String::new(),
        FieldErrors::default(),
    )
    .await
}

/// `POST /invite/{token}`: accept (signed in with the invited address) or
/// make the account and accept.
pub async fn accept(
    State(state): State<AppState>,
    session: Session,
    headers: HeaderMap,
    parts: RequestParts,
    user: Option<CurrentUser>,
    Path(token): Path<String>,
    Form(form): Form<InviteForm>,
) -> Result<Response, AppError> {
    let Some(invitation) = find(&state, &token).await? else {
        return render(
            &state,
            &session,
            &headers,
            user.as_ref(),
            &token,
            None,
            String::new(),
            FieldErrors::default(),
        )
        .await;
    };
    let target = format!("/tenants/{}", invitation.tenant_slug);
    if let Some(u) = &user {
        if u.user.email != invitation.email {
            return Err(AppError::Forbidden(format!(
                "this invitation is for {}; sign out first to accept it",
                invitation.email
            )));
        }
        let mut tx = state.pool.begin().await?;
        super::auth::accept_invitations(&mut tx, &u.actor(), u.user.id, &u.user.email).await?;
        tx.commit().await?;
        super::pages::flash(
            &session,
            format!(
                "You are now {} of {}.",
                invitation.role, invitation.tenant_name
            ),
        )
        .await?;
        return Ok(Redirect::to(&target).into_response());
    }
    let email = Email::parse(&invitation.email)
        .map_err(|e| AppError::Internal(anyhow::anyhow!("invitation address: {e}")))?;
    if db::users::id_by_email(&state.pool, &email).await?.is_some() {
        return Err(AppError::Conflict(format!(
            "{} has an account already: sign in to accept the invitation",
            invitation.email
        )));
    }
    if !state.sso.local_passwords() {
        return Err(AppError::Conflict(
            "accounts here sign in with single sign-on: use the sign-in button with the invited address"
                .into(),
        ));
    }
    let mut errors = FieldErrors::default();
    let name = parse_name(&form.display_name, "your name")
        .map_err(|e| errors.add("display_name", e))
        .ok();
    let password = Password::new(&form.password, Some(email.as_str()))
        .map_err(|e| errors.add("password", e.to_string()))
        .ok();
    let (Some(name), Some(password)) = (name, password) else {
        return render(
            &state,
            &session,
            &headers,
            None,
            &token,
            Some(invitation),
            form.display_name,
            errors,
        )
        .await;
    };
    let hash = state
        .with_password_slot(move || domain::hash_password(&password))
        .await?;
    let actor = Actor {
        user_id: None,
        email: Some(email.as_str().to_string()),
        client_addr: Some(parts.client_addr.clone()),
    };
    let mut tx = state.pool.begin().await?;
    let id = match db::users::insert(&mut *tx, &email, &name, &hash, GlobalRole::None).await {
        Ok(id) => id,
        Err(e) if db::is_unique_violation(&e, "users_email_key") => {
            return Err(AppError::Conflict(format!(
                "{} has an account already: sign in to accept the invitation",
                invitation.email
            )));
        }
        Err(e) => return Err(e.into()),
    };
    db::audit::record(
        &mut *tx,
        &actor,
        "user.created",
        email.as_str(),
        json!({"via": "invitation", "tenant": invitation.tenant_slug}),
    )
    .await?;
    tx.commit().await?;
    let actor = Actor {
        user_id: Some(id),
        ..actor
    };
    begin_session(
        &state,
        &session,
        SignedIn {
            user_id: id,
            session_epoch: 0,
            email: email.as_str(),
            addr_key: &throttle_scope(&parts.client_addr),
            actor: &actor,
            how: "invitation",
            accept_invitations: true,
        },
    )
    .await?;
    super::pages::flash(
        &session,
        format!(
            "Welcome! You are {} of {}.",
            invitation.role, invitation.tenant_name
        ),
    )
    .await?;
    Ok(super::auth::after_sign_in(&state, &target))
}

pub fn routes() -> Router<AppState> {
    Router::new().route("/invite/{token}", get(show).post(accept))
}
