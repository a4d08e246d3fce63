//! Booking pages (`/bookings/...`) and the booking JSON API
//! (`/api/v1/offerings`, `/api/v1/bookings...`). Both call the one set of
//! rules in [`crate::booking`].

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Form;
use axum::Router;
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;
use tower_sessions::Session;

use super::auth::CurrentUser;
use super::cursor::Cursor;
use super::error::AppError;
use super::forms::FieldErrors;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::booking::{self, BookingError, Created, Offering, Requester};
use crate::db::{self, bookings::Booking, bookings::Scope};
use crate::domain::booking::{BookingInput, Kind, Status, Step};

/// Bookings on one page of the list (newest first; older ones on the next
/// page).
const PAGE_LIMIT: i64 = 100;

/// The rules' view of the signed-in user.
pub fn requester(u: &CurrentUser) -> Requester {
    Requester {
        user_id: u.user.id,
        email: u.user.email.clone(),
        is_admin: u.is_admin(),
        is_finance: u.is_finance(),
        tenants: u
            .memberships
            .iter()
            .filter(|m| !m.archived)
            .map(|m| (m.tenant_id, m.slug.clone(), m.is_manager()))
            .collect(),
    }
}

impl From<BookingError> for AppError {
    fn from(e: BookingError) -> Self {
        match e {
            BookingError::Invalid(fields) => AppError::Invalid(
                fields
                    .into_iter()
                    .map(|(f, m)| (f.to_string(), m))
                    .collect(),
            ),
            BookingError::Refused(m) => AppError::Conflict(m),
            BookingError::NotFound => AppError::NotFound,
            BookingError::Forbidden(m) => AppError::Forbidden(m),
            BookingError::Retry => AppError::Conflict(e.to_string()),
            BookingError::Internal(m) => AppError::Internal(anyhow::anyhow!(m)),
            BookingError::Db(e) => e.into(),
        }
    }
}

/// RFC 3339, as the API and `<time datetime>` write times.
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&Rfc3339).unwrap_or_default()
}

/// `2026-12-24 14:00 UTC` (the browser shows it in local time).
pub fn when(t: &OffsetDateTime) -> String {
    booking::when(*t)
}

pub fn datetime_attr(t: &OffsetDateTime) -> String {
    rfc3339(*t)
}

#[derive(Debug, Deserialize, Default)]
pub struct ListQuery {
    /// `mine` (default), `tenant` (with `tenant=slug`; managers and admins)
    /// or `all` (admins).
    pub scope: Option<String>,
    pub tenant: Option<String>,
    /// Bookings older than this one (the page's "older" link).
    pub before: Option<String>,
    /// The API's name for `before` (its `next_cursor`).
    pub cursor: Option<String>,
    /// The API's page size.
    pub limit: Option<String>,
}

pub(crate) async fn scope_of(
    state: &AppState,
    user: &CurrentUser,
    q: &ListQuery,
) -> Result<Scope, AppError> {
    // Blank is the same as not given; anything else must be a slug.
    let tenant = q.tenant.as_deref().filter(|t| !t.is_empty());
    if let Some(t) = tenant {
        let slug = crate::domain::Slug::parse(t).map_err(|e| AppError::invalid("tenant", e))?;
        if slug.as_str() != t {
            return Err(AppError::invalid(
                "tenant",
                "a slug has no spaces around it",
            ));
        }
    }
    match q
        .scope
        .as_deref()
        .unwrap_or(if tenant.is_some() { "tenant" } else { "mine" })
    {
        "mine" => Ok(Scope::User(user.user.id)),
        "all" if user.is_admin() => Ok(Scope::All),
        "all" => Err(AppError::Forbidden("only admins see every booking".into())),
        "tenant" => {
            let slug = tenant.unwrap_or_default();
            let id = db::tenants::id_by_slug(&state.pool, slug)
                .await?
                .ok_or(AppError::NotFound)?;
            let m = user.membership(id);
            if user.is_admin() || m.is_some_and(|m| m.is_manager()) {
                Ok(Scope::Tenant(id))
            } else if m.is_some() {
                Err(AppError::Forbidden(
                    "only the tenant's managers see all its bookings".into(),
                ))
            } else {
                Err(AppError::NotFound)
            }
        }
        other => Err(AppError::BadRequest(format!(
            "unknown scope \"{other}\": use mine, tenant or all"
        ))),
    }
}

// ---- Pages -------------------------------------------------------------

/// The booking form.
#[derive(Template, WebTemplate)]
#[template(path = "bookings/new.html")]
pub struct NewPage {
    ctx: PageCtx,
    input: BookingInput,
    errors: FieldErrors,
    refusal: Option<String>,
    tenants: Vec<(String, String)>,
    models: Vec<String>,
    profiles: Vec<String>,
    offerings: Vec<Offering>,
    /// The availability panel's filter (the form's kind and model).
    kind: String,
    model: String,
    /// What the person's latest ended booking measured, when a smaller
    /// slice would have done (pre-filled on a fresh form).
    suggestion: Option<String>,
}

impl NewPage {
    fn is_kind(&self, k: &str) -> bool {
        self.input.kind == k
    }
}

async fn new_page(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    input: BookingInput,
    errors: FieldErrors,
    refusal: Option<String>,
) -> Result<NewPage, AppError> {
    let offerings = booking::offerings(&state.pool).await?;
    let mut models: Vec<String> = offerings.iter().map(|o| o.model.clone()).collect();
    models.dedup();
    let mut profiles: Vec<String> = offerings.iter().filter_map(|o| o.profile.clone()).collect();
    profiles.sort_by_key(|p| {
        (
            p.split('g')
                .next()
                .and_then(|n| n.parse::<u32>().ok())
                .unwrap_or(99),
            p.clone(),
        )
    });
    profiles.dedup();
    Ok(NewPage {
        ctx: PageCtx::new(session, Some(user)).await?,
        kind: input.kind.clone(),
        model: input.model.clone(),
        input,
        errors,
        refusal,
        tenants: user
            .memberships
            .iter()
            .filter(|m| !m.archived)
            .map(|m| (m.slug.clone(), m.name.clone()))
            .collect(),
        models,
        profiles,
        offerings,
        suggestion: None,
    })
}

/// `GET /bookings/new`, prefilled from the query (the "earliest start"
/// offer links here).
pub async fn new_form(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Query(mut input): Query<BookingInput>,
) -> Result<NewPage, AppError> {
    // A fresh form starts from what the person's latest ended booking
    // would have needed.
    let fresh = input.kind.is_empty() && input.profile.is_empty() && input.memory_gib.is_empty();
    let mut suggestion = None;
    if fresh {
        let recent =
            db::bookings::list(&state.pool, db::bookings::Scope::User(user.user.id), 10).await?;
        if let Some((b, a)) = recent.iter().find_map(|b| b.advice().map(|a| (b, a))) {
            input.kind = b.kind.as_str().into();
            input.model = b.model.clone().unwrap_or_default();
            if let Some(p) = &a.profile {
                input.profile = p.clone();
            }
            if let Some(m) = a.memory_gib {
                input.memory_gib = m.to_string();
            }
            input.tenant = b.tenant_slug.clone();
            suggestion = Some(format!(
                "Suggested from your booking #{}: {}.",
                b.id, a.summary
            ));
        }
    }
    if input.kind.is_empty() {
        input.kind = "mig".into();
    }
    if input.hours.is_empty() {
        input.hours = "2".into();
    }
    if input.tenant.is_empty() {
        if let Some(m) = user.memberships.iter().find(|m| !m.archived) {
            input.tenant = m.slug.clone();
        }
    }
    let mut page = new_page(&state, &session, &user, input, FieldErrors::default(), None).await?;
    page.suggestion = suggestion;
    Ok(page)
}

/// `POST /bookings`
pub async fn create(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Form(input): Form<BookingInput>,
) -> Result<Response, AppError> {
    let req = match input.parse() {
        Ok(r) => r,
        Err(list) => {
            let mut errors = FieldErrors::default();
            for (f, m) in list {
                errors.add(f, m);
            }
            let page = new_page(&state, &session, &user, input, errors, None).await?;
            return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
        }
    };
    let who = requester(&user);
    match booking::create(&state.pool, &who, &req, None, &state.booking_settings).await {
        Ok(Created::New(b)) | Ok(Created::Replayed(b)) => {
            let msg = if b.status == Status::Queued {
                format!(
                    "Booking {} is queued: {}",
                    b.id,
                    b.reason.clone().unwrap_or_default()
                )
            } else {
                format!(
                    "Booked: {} {} from {}.",
                    b.model.clone().unwrap_or_default(),
                    b.profile
                        .clone()
                        .unwrap_or_else(|| format!("{} GiB share", b.memory_gib)),
                    booking::when(b.start)
                )
            };
            flash(&session, msg).await?;
            Ok(Redirect::to(&format!("/bookings/{}", b.id)).into_response())
        }
        Err(BookingError::Invalid(list)) => {
            let mut errors = FieldErrors::default();
            for (f, m) in list {
                errors.add(f, m);
            }
            let page = new_page(&state, &session, &user, input, errors, None).await?;
            Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response())
        }
        Err(BookingError::Refused(m)) => {
            let page = new_page(
                &state,
                &session,
                &user,
                input,
                FieldErrors::default(),
                Some(m),
            )
            .await?;
            Ok((StatusCode::CONFLICT, page).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

/// The live availability panel of the form.
#[derive(Template, WebTemplate)]
#[template(path = "bookings/_availability.html")]
pub struct AvailabilityFragment {
    offerings: Vec<Offering>,
    kind: String,
    model: String,
}

/// `GET /bookings/availability?kind=&model=` (htmx)
pub async fn availability(
    State(state): State<AppState>,
    _user: CurrentUser,
    Query(input): Query<BookingInput>,
) -> Result<AvailabilityFragment, AppError> {
    Ok(AvailabilityFragment {
        offerings: booking::offerings(&state.pool).await?,
        kind: input.kind,
        model: input.model,
    })
}

/// A booking list row set (dashboard and `/bookings`).
#[derive(Template, WebTemplate)]
#[template(path = "bookings/_rows.html")]
pub struct RowsFragment {
    bookings: Vec<Booking>,
    show_owner: bool,
    poll_url: String,
}

#[derive(Template, WebTemplate)]
#[template(path = "bookings/list.html")]
pub struct ListPage {
    ctx: PageCtx,
    bookings: Vec<Booking>,
    show_owner: bool,
    poll_url: String,
    scope: String,
    tenant: String,
    /// The next page (older bookings), when there is one.
    older_url: Option<String>,
    /// Back to the newest, when not on the first page.
    newest_url: Option<String>,
    managed: Vec<(String, String)>,
    is_admin: bool,
}

fn is_htmx(headers: &HeaderMap) -> bool {
    headers.contains_key("hx-request")
}

/// `GET /bookings`: mine, a managed tenant's, or (admins) all; an htmx
/// request gets the rows only.
pub async fn list(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    headers: HeaderMap,
    Query(q): Query<ListQuery>,
) -> Result<Response, AppError> {
    let scope = scope_of(&state, &user, &q).await?;
    let before = Cursor::parse(q.before.as_deref(), "before")?;
    let mut bookings =
        db::bookings::page(&state.pool, scope, (before.at, before.id), PAGE_LIMIT + 1).await?;
    let older = (bookings.len() as i64 > PAGE_LIMIT).then(|| {
        bookings.truncate(PAGE_LIMIT as usize);
        bookings
            .last()
            .map(|b| Cursor::after(false, b.created_at, b.id).encode())
            .unwrap_or_default()
    });
    let scope_name = match scope {
        Scope::User(_) => "mine",
        Scope::Tenant(_) => "tenant",
        Scope::All => "all",
    };
    let tenant = q.tenant.clone().unwrap_or_default();
    let base = format!(
        "/bookings?scope={scope_name}&tenant={}",
        form_urlencoded::byte_serialize(tenant.as_bytes()).collect::<String>()
    );
    // The live refresh keeps the page it is on.
    let poll_url = if before.is_first() {
        base.clone()
    } else {
        format!("{base}&before={}", before.encode())
    };
    let older_url = older.map(|c| format!("{base}&before={c}"));
    let newest_url = (!before.is_first()).then(|| base.clone());
    let show_owner = scope_name != "mine";
    if is_htmx(&headers) {
        return Ok(RowsFragment {
            bookings,
            show_owner,
            poll_url,
        }
        .into_response());
    }
    Ok(ListPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        bookings,
        show_owner,
        poll_url,
        scope: scope_name.into(),
        tenant,
        older_url,
        newest_url,
        managed: user
            .memberships
            .iter()
            .filter(|m| m.is_manager())
            .map(|m| (m.slug.clone(), m.name.clone()))
            .collect(),
        is_admin: user.is_admin(),
    }
    .into_response())
}

/// Everything the booking page shows (also its live fragment).
pub struct Detail {
    pub b: Booking,
    pub events: Vec<db::bookings::Event>,
    /// Memory against its limit and utilisation since it started (SVG).
    pub chart: Option<String>,
    /// Alerts on this booking, open first.
    pub alerts: Vec<db::alerts::Alert>,
    pub is_owner: bool,
    pub can_force: bool,
    pub live: bool,
    pub csrf: String,
    pub error: Option<String>,
}

impl Detail {
    pub fn can_release(&self) -> bool {
        self.is_owner && self.b.status.allows(Step::Release)
    }

    pub fn can_cancel(&self) -> bool {
        self.is_owner && self.b.status.allows(Step::Cancel)
    }

    /// An active booking whose device shows no work (its tenant reclaims
    /// idle GPUs).
    pub fn idle(&self) -> bool {
        self.b.status == crate::domain::booking::Status::Active && self.b.idle_since.is_some()
    }

    pub fn can_extend(&self) -> bool {
        self.is_owner && self.b.status.can_extend()
    }

    pub fn force(&self) -> bool {
        self.can_force
            && !self.is_owner
            && (self.b.status.allows(Step::Cancel) || self.b.status.allows(Step::Release))
    }

    pub fn ending_soon(&self) -> bool {
        self.b.status == Status::Active && self.b.warned_at.is_some()
    }

    pub fn device(&self) -> &str {
        self.b.device_uuid.as_deref().unwrap_or("")
    }

    /// The `docker run` line that puts a container into the booking.
    pub fn docker_line(&self) -> String {
        match &self.b.node {
            Some(node) => crate::sched::container::docker_line(
                node,
                self.b.id,
                self.device(),
                "nvidia/cuda:12.4.1-base-ubuntu22.04 nvidia-smi -L",
            ),
            None => String::new(),
        }
    }

    /// The device files its processes may open, while active.
    pub fn device_nodes(&self) -> Vec<String> {
        if self.b.status != Status::Active {
            return Vec::new();
        }
        crate::sched::devices::from_json(self.b.device_nodes.as_ref())
            .into_iter()
            .map(|d| d.path)
            .collect()
    }

    /// The profile or share, in words.
    pub fn what(&self) -> String {
        match &self.b.profile {
            Some(p) => format!("MIG {p}"),
            None => format!(
                "{} GiB time-sliced share, {} priority",
                self.b.memory_gib, self.b.priority
            ),
        }
    }

    /// The scheduler's view of an active share.
    pub fn scheduler(&self) -> Option<SchedView> {
        if self.b.kind != Kind::Timeslice || self.b.status != Status::Active {
            return None;
        }
        let s = self.b.scheduler.as_ref()?;
        Some(SchedView {
            achieved: s["achieved_share_pct"].as_f64().unwrap_or(0.0),
            guaranteed: s["guaranteed_share_pct"].as_f64().unwrap_or(0.0),
            slice_ms: s["time_slice_ms"].as_f64().unwrap_or(0.0),
            priority: s["priority"].as_str().unwrap_or("").to_string(),
            boosted: s["boosted"].as_bool().unwrap_or(false),
            violations: s["violations"].as_u64().unwrap_or(0),
        })
    }

    pub fn offer_link(&self) -> Option<String> {
        let t = self.b.offered_start?;
        let start = rfc3339(t);
        let mut q = form_urlencoded::Serializer::new(String::new());
        q.append_pair("tenant", &self.b.tenant_slug)
            .append_pair("kind", self.b.kind.as_str())
            .append_pair("model", self.b.requested_model.as_deref().unwrap_or(""))
            .append_pair("profile", self.b.profile.as_deref().unwrap_or(""))
            .append_pair("memory_gib", &self.b.memory_gib.to_string())
            .append_pair("priority", self.b.priority.as_str())
            .append_pair("start", &start)
            .append_pair("hours", &self.b.hours.to_string());
        Some(format!("/bookings/new?{}", q.finish()))
    }
}

/// A share's achieved against guaranteed part of its GPU.
pub struct SchedView {
    pub achieved: f64,
    pub guaranteed: f64,
    pub slice_ms: f64,
    pub priority: String,
    pub boosted: bool,
    pub violations: u64,
}

impl SchedView {
    /// Bar widths in a 220-unit track.
    pub fn achieved_w(&self) -> f64 {
        self.achieved.clamp(0.0, 100.0) * 2.2
    }

    pub fn guaranteed_w(&self) -> f64 {
        self.guaranteed.clamp(0.0, 100.0) * 2.2
    }

    /// Below 90 % of its guarantee (a QoS violation if it was busy).
    pub fn short(&self) -> bool {
        self.guaranteed > 0.0 && self.achieved < 0.9 * self.guaranteed
    }

    pub fn text(&self) -> String {
        format!(
            "{:.1} % of the GPU in the last 5 s (guaranteed {:.0} %) · slice {:.0} ms at {} priority · {} QoS violations",
            self.achieved, self.guaranteed, self.slice_ms, self.priority, self.violations
        )
    }
}

#[derive(Template, WebTemplate)]
#[template(path = "bookings/show.html")]
pub struct ShowPage {
    ctx: PageCtx,
    d: Detail,
}

#[derive(Template, WebTemplate)]
#[template(path = "bookings/_detail.html")]
pub struct DetailFragment {
    d: Detail,
}

async fn detail(
    state: &AppState,
    user: &CurrentUser,
    id: i64,
    csrf: String,
    error: Option<String>,
) -> Result<Detail, AppError> {
    let who = requester(user);
    let b = booking::visible(&state.pool, &who, id).await?;
    let events = db::bookings::events(&state.pool, id).await?;
    let live = b.status.is_live();
    let alerts = db::alerts::list(
        &state.pool,
        &db::alerts::Filter {
            booking_id: Some(id),
            limit: 50,
            ..Default::default()
        },
    )
    .await?;
    let history = db::telemetry::booking_history(&state.pool, id).await?;
    let chart = (!history.is_empty()).then(|| {
        let limit = history
            .iter()
            .map(|p| p.memory_limit_mib)
            .max()
            .unwrap_or(0) as f64
            / 1024.0;
        let mut series = vec![
            super::charts::Series {
                label: "memory used (GiB)",
                class: "line-a",
                points: history
                    .iter()
                    .map(|p| (p.at, Some(p.memory_used_mib / 1024.0)))
                    .collect(),
            },
            super::charts::Series {
                label: "memory limit (GiB)",
                class: "line-limit",
                points: history
                    .iter()
                    .map(|p| (p.at, Some(p.memory_limit_mib as f64 / 1024.0)))
                    .collect(),
            },
        ];
        let mut out = super::charts::line_chart(
            &series,
            (limit * 1.05).max(1.0),
            " GiB",
            "GPU memory since the start",
        );
        if history.iter().any(|p| p.utilization.is_some()) {
            series.truncate(0);
            series.push(super::charts::Series {
                label: "utilisation (%)",
                class: "line-b",
                points: history.iter().map(|p| (p.at, p.utilization)).collect(),
            });
            out.push_str(&super::charts::line_chart(
                &series,
                100.0,
                " %",
                "Utilisation since the start",
            ));
        }
        out
    });
    Ok(Detail {
        chart,
        alerts,
        is_owner: b.user_id == user.user.id,
        can_force: user.is_admin() || user.membership(b.tenant_id).is_some_and(|m| m.is_manager()),
        live,
        b,
        events,
        csrf,
        error,
    })
}

/// `GET /bookings/{id}`; htmx polls get the live part only.
pub async fn show(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    headers: HeaderMap,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    let ctx = PageCtx::new(&session, Some(&user)).await?;
    let d = detail(&state, &user, id, ctx.csrf.clone(), None).await?;
    if is_htmx(&headers) {
        return Ok(DetailFragment { d }.into_response());
    }
    Ok(ShowPage { ctx, d }.into_response())
}

#[derive(Debug, Deserialize, Default)]
pub struct ReasonForm {
    #[serde(default)]
    pub reason: String,
}

/// Re-renders the booking page with `message` (a refused action).
async fn show_error(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    id: i64,
    status: StatusCode,
    message: String,
) -> Result<Response, AppError> {
    let ctx = PageCtx::new(session, Some(user)).await?;
    let d = detail(state, user, id, ctx.csrf.clone(), Some(message)).await?;
    Ok((status, ShowPage { ctx, d }).into_response())
}

fn refusal_of(e: BookingError) -> Result<(StatusCode, String), AppError> {
    match e {
        BookingError::Invalid(list) => Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            list.into_iter()
                .map(|(_, m)| m)
                .collect::<Vec<_>>()
                .join("; "),
        )),
        BookingError::Refused(m) => Ok((StatusCode::CONFLICT, m)),
        other => Err(other.into()),
    }
}

/// `POST /bookings/{id}/release`: release, cancel, or (managers, admins)
/// force-release with a reason.
pub async fn release(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
    Form(form): Form<ReasonForm>,
) -> Result<Response, AppError> {
    let who = requester(&user);
    match booking::release(
        &state.pool,
        &who,
        id,
        Some(&form.reason),
        Some(&user.client_addr),
    )
    .await
    {
        Ok(b) => {
            let msg = if b.status == Status::Cancelled {
                format!("Booking {id} is cancelled.")
            } else {
                format!("Booking {id} is being released; its device goes away in a moment.")
            };
            flash(&session, msg).await?;
            Ok(Redirect::to(&format!("/bookings/{id}")).into_response())
        }
        Err(e) => {
            let (status, msg) = refusal_of(e)?;
            show_error(&state, &session, &user, id, status, msg).await
        }
    }
}

#[derive(Debug, Deserialize, Default)]
pub struct ExtendForm {
    #[serde(default)]
    pub hours: String,
}

/// `POST /bookings/{id}/extend`
pub async fn extend(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
    Form(form): Form<ExtendForm>,
) -> Result<Response, AppError> {
    let Ok(hours) = form.hours.trim().parse::<i32>() else {
        return show_error(
            &state,
            &session,
            &user,
            id,
            StatusCode::UNPROCESSABLE_ENTITY,
            "give the extra time in whole hours".into(),
        )
        .await;
    };
    match booking::extend(&state.pool, &requester(&user), id, hours).await {
        Ok(b) => {
            flash(
                &session,
                format!("Booking {id} now ends {}.", booking::when(b.end)),
            )
            .await?;
            Ok(Redirect::to(&format!("/bookings/{id}")).into_response())
        }
        Err(e) => {
            let (status, msg) = refusal_of(e)?;
            show_error(&state, &session, &user, id, status, msg).await
        }
    }
}

/// "Still working" from the booking page.
pub async fn keep(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Path(id): Path<i64>,
) -> Result<Response, AppError> {
    match booking::keep(&state.pool, &requester(&user), id).await {
        Ok(_) => {
            flash(
                &session,
                format!("Booking {id} stays yours: its idle clock starts again."),
            )
            .await?;
            Ok(Redirect::to(&format!("/bookings/{id}")).into_response())
        }
        Err(e) => {
            let (status, msg) = refusal_of(e)?;
            show_error(&state, &session, &user, id, status, msg).await
        }
    }
}

/// The booking pages (the API's are in `api`).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/bookings", get(list).post(create))
        .route("/bookings/new", get(new_form))
        .route("/bookings/availability", get(availability))
        .route("/bookings/timeline", get(super::timeline::timeline))
        .route("/bookings/{id}", get(show))
        .route("/bookings/{id}/release", post(release))
        .route("/bookings/{id}/extend", post(extend))
        .route("/bookings/{id}/keep", post(keep))
}
