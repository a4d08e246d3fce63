//! What every page shares: the layout context (user, CSRF token, flash
//! message, asset URLs) and the pages that belong to no group (sign-in,
//! errors).

use askama::Template;
use askama_web::WebTemplate;
use axum::http::StatusCode;
use tower_sessions::Session;

use super::assets;
use super::auth::CurrentUser;
use super::error::AppError;

const FLASH_KEY: &str = "flash";

/// The navigation entries a user may see.
#[derive(Debug, Clone)]
pub struct NavUser {
    pub email: String,
    pub display_name: String,
    pub is_admin: bool,
    pub is_finance: bool,
}

/// Data the layout needs on every page.
#[derive(Debug, Clone)]
pub struct PageCtx {
    pub user: Option<NavUser>,
    pub csrf: String,
    pub flash: Option<String>,
    pub css_url: &'static str,
    pub js_url: &'static str,
    pub htmx_url: &'static str,
}

impl PageCtx {
    pub async fn new(session: &Session, user: Option<&CurrentUser>) -> Result<Self, AppError> {
        let csrf = super::csrf::token(session).await?;
        let flash: Option<String> = session.remove(FLASH_KEY).await?;
        Ok(PageCtx {
            user: user.map(|u| NavUser {
                email: u.user.email.clone(),
                display_name: u.user.display_name.clone(),
                is_admin: u.is_admin(),
                is_finance: u.is_finance(),
            }),
            csrf,
            flash,
            ..Self::anonymous()
        })
    }

    /// The layout of the sign-in page: no session is created for it; the
    /// form's token is the pre-session one (see [`super::csrf`]).
    pub async fn sign_in(session: &Session, csrf: String) -> Result<Self, AppError> {
        let flash: Option<String> = session.remove(FLASH_KEY).await?;
        Ok(PageCtx {
            csrf,
            flash,
            ..Self::anonymous()
        })
    }

    /// The layout without a session (error pages).
    pub fn anonymous() -> Self {
        let urls = assets::urls();
        PageCtx {
            user: None,
            csrf: String::new(),
            flash: None,
            css_url: &urls.css,
            js_url: &urls.js,
            htmx_url: &urls.htmx,
        }
    }
}

/// Shows `message` once, on the next page the user sees.
pub async fn flash(session: &Session, message: impl Into<String>) -> Result<(), AppError> {
    session
        .insert(FLASH_KEY, message.into())
        .await
        .map_err(AppError::from)
}

#[derive(Template, WebTemplate)]
#[template(path = "login.html")]
pub struct LoginPage {
    pub ctx: PageCtx,
    pub email: String,
    pub next: String,
    pub error: Option<String>,
    /// "Sign in with …" (OpenID Connect on).
    pub sso: Option<String>,
    /// The password form: local passwords or LDAP.
    pub password_form: bool,
    /// The form is for a break-glass admin only (folded away).
    pub break_glass: bool,
    /// LDAP is on: a campus user name works as well as an address.
    pub ldap: bool,
}

impl LoginPage {
    pub fn new(
        state: &super::AppState,
        ctx: PageCtx,
        email: String,
        next: String,
        error: Option<String>,
    ) -> Self {
        let sso = &state.sso;
        LoginPage {
            ctx,
            email,
            next,
            error,
            sso: sso.button_label(),
            password_form: sso.ldap.is_some() || sso.password_allowed_for_anyone(),
            break_glass: sso.ldap.is_none() && !sso.local_passwords(),
            ldap: sso.ldap.is_some(),
        }
    }
}

#[derive(Template)]
#[template(path = "error.html")]
pub struct ErrorPage {
    pub ctx: PageCtx,
    pub status: u16,
    pub title: String,
    pub message: String,
}

impl ErrorPage {
    pub fn new(status: StatusCode, message: &str) -> Self {
        let title = match status {
            StatusCode::NOT_FOUND => "Page not found",
            StatusCode::FORBIDDEN => "Not allowed",
            StatusCode::UNAUTHORIZED => "Please sign in",
            StatusCode::TOO_MANY_REQUESTS => "Slow down",
            StatusCode::SERVICE_UNAVAILABLE => "Busy for a moment",
            s if s.is_server_error() => "Something went wrong",
            _ => "That did not work",
        };
        // A 503 says why (busy, database away) and when to try again; other
        // server errors keep their details in the log.
        let message = if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
            "The error has been logged. Please try again in a moment.".to_string()
        } else if status == StatusCode::NOT_FOUND {
            "There is nothing at this address, or you may not see it.".to_string()
        } else {
            message.to_string()
        };
        ErrorPage {
            ctx: PageCtx::anonymous(),
            status: status.as_u16(),
            title: title.to_string(),
            message,
        }
    }

    pub fn render_html(&self) -> String {
        self.render().unwrap_or_else(|_| self.message.clone())
    }
}
