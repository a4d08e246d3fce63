//! The user's own settings: API tokens and which notifications they get.

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Form;
use axum::Router;
use serde::Deserialize;
use serde_json::json;
use tower_sessions::Session;

use super::auth::{generate_token, CurrentUser};
use super::error::AppError;
use super::forms::FieldErrors;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db;

#[derive(Template, WebTemplate)]
#[template(path = "tokens.html")]
pub struct TokensPage {
    ctx: PageCtx,
    tokens: Vec<db::tokens::Token>,
    new_token: Option<String>,
    name: String,
    errors: FieldErrors,
}

async fn page(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    new_token: Option<String>,
    name: String,
    errors: FieldErrors,
) -> Result<TokensPage, AppError> {
    Ok(TokensPage {
        ctx: PageCtx::new(session, Some(user)).await?,
        tokens: db::tokens::list_for_user(&state.pool, user.user.id).await?,
        new_token,
        name,
        errors,
    })
}

pub async fn tokens(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<TokensPage, AppError> {
    page(
        &state,
        &session,
        &user,
        None,
        String::new(),
        FieldErrors::default(),
    )
    .await
}

#[derive(Debug, Deserialize)]
pub struct NewTokenForm {
    #[serde(default)]
    name: String,
}

pub async fn create_token(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Form(form): Form<NewTokenForm>,
) -> Result<Response, AppError> {
    let name = form.name.trim();
    let mut errors = FieldErrors::default();
    if name.is_empty() {
        errors.add(
            "name",
            "name the token after where it will be used, e.g. \"laptop\"",
        );
    } else if name.chars().count() > 100 {
        errors.add("name", "a token name has at most 100 characters");
    }
    if !errors.is_empty() {
        let p = page(&state, &session, &user, None, name.to_string(), errors).await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, p).into_response());
    }
    let (token, hash, prefix) = generate_token();
    let mut tx = state.pool.begin().await?;
    db::tokens::insert(&mut *tx, user.user.id, name, &hash, &prefix).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "token.created",
        &user.user.email,
        json!({"name": name, "prefix": prefix}),
    )
    .await?;
    tx.commit().await?;
    // Shown on this response only; never stored in clear.
    let mut p = page(
        &state,
        &session,
        &user,
        Some(token),
        String::new(),
        FieldErrors::default(),
    )
    .await?;
    p.ctx.flash = Some(format!(
        "Token \"{name}\" created. Copy it now: it will not be shown again."
    ));
    Ok((StatusCode::CREATED, p).into_response())
}

pub async fn revoke_token(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    let mut tx = state.pool.begin().await?;
    // Scoped to the caller: another user's token id is simply not found.
    if !db::tokens::revoke(&mut *tx, user.user.id, id).await? {
        return Err(AppError::NotFound);
    }
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "token.revoked",
        &user.user.email,
        json!({"token_id": id}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, "Token revoked.").await?;
    Ok(Redirect::to("/settings/tokens").into_response())
}

/// A person's API tokens.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/settings/tokens", get(tokens).post(create_token))
        .route(
            "/settings/notifications",
            get(notifications).post(save_notifications),
        )
        .route("/settings/tokens/{id}/revoke", post(revoke_token))
}

/// One choice on the notifications page.
pub struct Choice {
    pub topic: &'static str,
    pub label: &'static str,
    pub on: bool,
}

#[derive(Template, WebTemplate)]
#[template(path = "notifications.html")]
pub struct NotificationsPage {
    ctx: PageCtx,
    choices: Vec<Choice>,
    is_admin: bool,
}

/// `GET /settings/notifications`: what I am told by e-mail.
pub async fn notifications(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
) -> Result<NotificationsPage, AppError> {
    let prefs = db::notify::prefs(&state.pool, user.user.id).await?;
    let choices = db::notify::TOPICS
        .iter()
        .filter(|(t, _)| *t != "alert_critical" || user.is_admin())
        .map(|(topic, label)| Choice {
            topic,
            label,
            on: prefs.iter().any(|(t, on)| t == topic && *on),
        })
        .collect();
    Ok(NotificationsPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        choices,
        is_admin: user.is_admin(),
    })
}

/// Saves the ticked topics (unticked ones are off).
pub async fn save_notifications(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Form(fields): Form<Vec<(String, String)>>,
) -> Result<Response, AppError> {
    let mut on = Vec::new();
    for (k, _) in fields.iter().filter(|(k, _)| k != "csrf_token") {
        let Some(topic) = k.strip_prefix("topic_") else {
            return Err(AppError::BadRequest(format!("unknown field \"{k}\"")));
        };
        if !db::notify::TOPICS.iter().any(|(t, _)| *t == topic) {
            return Err(AppError::BadRequest(format!(
                "unknown notification \"{topic}\""
            )));
        }
        on.push(topic.to_string());
    }
    if !user.is_admin() {
        // Not offered to others; kept on so a later promotion starts on.
        on.push("alert_critical".into());
    }
    db::notify::set_prefs(&state.pool, user.user.id, &on).await?;
    flash(&session, "Notification choices saved.").await?;
    Ok(Redirect::to("/settings/notifications").into_response())
}
