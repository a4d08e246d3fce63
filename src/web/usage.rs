//! Usage history (`/usage`, `GET /api/v1/usage`), finance reports
//! (`/reports`, `/reports/usage.csv`) and tariffs (`/admin/tariffs`).

use askama::Template;
use askama_web::WebTemplate;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Form;
use axum::Router;
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::json;
use time::{Date, Duration, OffsetDateTime};
use tower_sessions::Session;

use super::auth::{Admin, CurrentUser, Finance};
use super::cursor::Cursor;
use super::error::AppError;
use super::forms::FieldErrors;
use super::pages::{flash, PageCtx};
use super::AppState;
use crate::db::{self, usage::Total};
use crate::domain::usage::csv_text;
use crate::gpu::catalog;

/// The query of every usage view: a period (dates, UTC, inclusive) and,
/// where allowed, a tenant.
#[derive(Debug, Deserialize, Default, Clone)]
pub struct Period {
    #[serde(default)]
    pub from: String,
    #[serde(default)]
    pub to: String,
    #[serde(default)]
    pub tenant: String,
    /// `day`, `week` or `month` (the usage chart).
    #[serde(default)]
    pub by: String,
    /// The usage page's drill-down: the page after this cursor.
    #[serde(default)]
    pub before: String,
}

fn parse_date(raw: &str, field: &str) -> Result<Option<Date>, AppError> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Ok(None);
    }
    Date::parse(
        raw,
        time::macros::format_description!("[year]-[month]-[day]"),
    )
    .map(Some)
    .map_err(|_| {
        AppError::Unprocessable(format!("{field}: \"{raw}\" is not a date; use YYYY-MM-DD"))
    })
}

/// The period asked for; default: this month so far.
pub(crate) fn period(p: &Period) -> Result<(Date, Date), AppError> {
    let today = OffsetDateTime::now_utc().date();
    let from =
        parse_date(&p.from, "from")?.unwrap_or_else(|| today.replace_day(1).unwrap_or(today));
    let to = parse_date(&p.to, "to")?.unwrap_or(today);
    if to < from {
        return Err(AppError::Unprocessable(
            "to: the period ends before it starts".into(),
        ));
    }
    if (to - from).whole_days() > 3660 {
        return Err(AppError::Unprocessable(
            "the period may span at most ten years".into(),
        ));
    }
    Ok((from, to))
}

/// Whose usage a member may see: their own, or as a manager (or admin,
/// finance) a tenant's.
pub(crate) enum Whose {
    Mine(i64),
    Tenant(i64),
    All,
}

pub(crate) async fn whose(
    state: &AppState,
    user: &CurrentUser,
    tenant: &str,
) -> Result<Whose, AppError> {
    if tenant.is_empty() {
        return Ok(Whose::Mine(user.user.id));
    }
    if tenant == "*" {
        return if user.is_admin() || user.is_finance() {
            Ok(Whose::All)
        } else {
            Err(AppError::Forbidden(
                "only finance and admins see every tenant".into(),
            ))
        };
    }
    let id = db::tenants::id_by_slug(&state.pool, tenant)
        .await?
        .ok_or(AppError::NotFound)?;
    let m = user.membership(id);
    if user.is_admin() || user.is_finance() || m.is_some_and(|m| m.is_manager()) {
        Ok(Whose::Tenant(id))
    } else if m.is_some() {
        Err(AppError::Forbidden(
            "only the tenant's managers see its usage".into(),
        ))
    } else {
        Err(AppError::NotFound)
    }
}

pub(crate) fn split(w: &Whose) -> (Option<i64>, Option<i64>) {
    match w {
        Whose::Mine(u) => (None, Some(*u)),
        Whose::Tenant(t) => (Some(*t), None),
        Whose::All => (None, None),
    }
}

// ---- /usage --------------------------------------------------------------

/// One bar of the usage chart.
pub struct Column {
    pub label: String,
    pub x: f64,
    pub width: f64,
    /// Stacked segments: (y, height, class index, title).
    pub segments: Vec<(f64, f64, usize, String)>,
    pub total: f64,
}

/// A row of the usage page's table.
pub struct ByWhat {
    pub model: String,
    pub what: String,
    pub slice_hours: f64,
    pub class: usize,
}

#[derive(Template, WebTemplate)]
#[template(path = "usage.html")]
pub struct UsagePage {
    ctx: PageCtx,
    from: String,
    to: String,
    by: String,
    tenant: String,
    tenants: Vec<(String, String)>,
    columns: Vec<Column>,
    chart_width: f64,
    max: f64,
    legend: Vec<(usize, String)>,
    rows: Vec<ByWhat>,
    bookings: Vec<db::usage::DayRow>,
    /// The drill-down's cursor now (empty: its first page) and the next.
    before: String,
    older: Option<String>,
    total: f64,
    /// The CSV of the tenant shown (managers).
    csv_url: Option<String>,
}

const CHART_H: f64 = 180.0;

/// Booking-days per page of the usage page's drill-down.
const DRILL_DOWN_PAGE: i64 = 100;

fn bucket(day: Date, by: &str) -> Date {
    match by {
        "week" => day - Duration::days(i64::from(day.weekday().number_days_from_monday())),
        "month" => day.replace_day(1).unwrap_or(day),
        _ => day,
    }
}

/// `GET /usage`: my usage, or a managed tenant's, as a chart and tables.
pub async fn usage_page(
    State(state): State<AppState>,
    session: Session,
    user: CurrentUser,
    Query(q): Query<Period>,
) -> Result<UsagePage, AppError> {
    let (from, to) = period(&q)?;
    let w = whose(&state, &user, &q.tenant).await?;
    let (tenant_id, user_id) = split(&w);
    let by = match q.by.as_str() {
        "week" | "month" => q.by.clone(),
        _ => "day".to_string(),
    };
    let days = db::usage::by_day(&state.pool, from, to, tenant_id, user_id).await?;
    // Legend: one class per (model, profile), most used first.
    let mut per_what: Vec<(String, String, f64)> = Vec::new();
    for (_, model, what, h) in &days {
        match per_what.iter_mut().find(|p| &p.0 == model && &p.1 == what) {
            Some(p) => p.2 += h,
            None => per_what.push((model.clone(), what.clone(), *h)),
        }
    }
    per_what.sort_by(|a, b| b.2.total_cmp(&a.2));
    let class_of = |model: &str, what: &str| {
        per_what
            .iter()
            .position(|p| p.0 == model && p.1 == what)
            .unwrap_or(0)
            % 8
    };
    // Per bucket: its segments as (series class, title, slice-hours).
    type Segment = (usize, String, f64);
    let mut buckets: Vec<(Date, Vec<Segment>)> = Vec::new();
    for (day, model, what, h) in &days {
        let b = bucket(*day, &by);
        if buckets.last().is_none_or(|l| l.0 != b) {
            buckets.push((b, Vec::new()));
        }
        if let Some(last) = buckets.last_mut() {
            last.1
                .push((class_of(model, what), format!("{model} {what}"), *h));
        }
    }
    let max = buckets
        .iter()
        .map(|b| b.1.iter().map(|s| s.2).sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-9);
    let n = buckets.len().max(1) as f64;
    let chart_width = 720.0;
    let slot = chart_width / n;
    let columns = buckets
        .iter()
        .enumerate()
        .map(|(i, (d, segs))| {
            let mut y = CHART_H;
            let mut segments = Vec::new();
            for (class, title, h) in segs {
                let height = h / max * (CHART_H - 10.0);
                y -= height;
                segments.push((y, height, *class, format!("{title}: {h:.2} slice-hours")));
            }
            Column {
                label: d.to_string(),
                x: i as f64 * slot + slot * 0.1,
                width: slot * 0.8,
                segments,
                total: sum(segs.iter().map(|s| s.2)),
            }
        })
        .collect();
    let rows = per_what
        .iter()
        .map(|(model, what, h)| ByWhat {
            class: class_of(model, what),
            model: model.clone(),
            what: what.clone(),
            slice_hours: *h,
        })
        .collect();
    let legend = per_what
        .iter()
        .take(8)
        .map(|(m, w, _)| (class_of(m, w), format!("{m} {w}")))
        .collect();
    // Drill-down: the period's booking-days, newest first, a page at a time.
    let cursor = Cursor::parse(Some(&q.before), "before")?;
    let before_day = cursor.at.date().min(to.next_day().unwrap_or(to));
    let mut bookings = db::usage::day_rows_page(
        &state.pool,
        from,
        to,
        tenant_id,
        user_id,
        before_day,
        cursor.id,
        DRILL_DOWN_PAGE + 1,
    )
    .await?;
    let older = (bookings.len() as i64 > DRILL_DOWN_PAGE).then(|| {
        bookings.truncate(DRILL_DOWN_PAGE as usize);
        let last = &bookings[bookings.len() - 1];
        Cursor::after(false, last.day.midnight().assume_utc(), last.booking_id).encode()
    });
    let total = sum(per_what.iter().map(|p| p.2));
    let tenants = user
        .memberships
        .iter()
        .filter(|m| m.is_manager())
        .map(|m| (m.slug.clone(), m.name.clone()))
        .collect();
    let csv_url = matches!(w, Whose::Tenant(_)).then(|| {
        format!(
            "/reports/usage.csv?from={from}&to={to}&tenant={}",
            form_urlencoded::byte_serialize(q.tenant.as_bytes()).collect::<String>()
        )
    });
    Ok(UsagePage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        csv_url,
        from: from.to_string(),
        to: to.to_string(),
        by,
        tenant: q.tenant.clone(),
        tenants,
        columns,
        chart_width,
        max,
        legend,
        rows,
        bookings,
        before: q.before.trim().to_string(),
        older,
        total,
    })
}

// ---- /reports ------------------------------------------------------------

#[derive(Template, WebTemplate)]
#[template(path = "reports.html")]
pub struct ReportsPage {
    ctx: PageCtx,
    from: String,
    to: String,
    tenant: String,
    tenants: Vec<(String, String)>,
    totals: Vec<Total>,
    currency: String,
    sum_cost: f64,
    sum_hours: f64,
    unpriced: i64,
    csv_url: String,
}

async fn tenant_filter(state: &AppState, slug: &str) -> Result<Option<i64>, AppError> {
    if slug.is_empty() {
        return Ok(None);
    }
    db::tenants::id_by_slug(&state.pool, slug)
        .await?
        .map(Some)
        .ok_or_else(|| AppError::Unprocessable(format!("tenant: no tenant \"{slug}\"")))
}

/// `GET /reports`: totals per tenant, model and profile with cost.
pub async fn reports(
    State(state): State<AppState>,
    session: Session,
    Finance(user): Finance,
    Query(q): Query<Period>,
) -> Result<ReportsPage, AppError> {
    let (from, to) = period(&q)?;
    let tenant_id = tenant_filter(&state, &q.tenant).await?;
    let totals = db::usage::totals(&state.pool, from, to, tenant_id).await?;
    let csv_url = {
        let mut csv = form_urlencoded::Serializer::new(String::new());
        csv.append_pair("from", &from.to_string())
            .append_pair("to", &to.to_string());
        if !q.tenant.is_empty() {
            csv.append_pair("tenant", &q.tenant);
        }
        format!("/reports/usage.csv?{}", csv.finish())
    };
    Ok(ReportsPage {
        ctx: PageCtx::new(&session, Some(&user)).await?,
        from: from.to_string(),
        to: to.to_string(),
        tenant: q.tenant.clone(),
        tenants: db::tenants::list(&state.pool)
            .await?
            .into_iter()
            .map(|t| (t.slug, t.name))
            .collect(),
        sum_cost: sum(totals.iter().map(|t| t.cost)),
        sum_hours: sum(totals.iter().map(|t| t.slice_hours)),
        unpriced: totals.iter().map(|t| t.unpriced_rows).sum(),
        totals,
        currency: state.currency.to_string(),
        csv_url,
    })
}

/// The export's columns.
pub const CSV_HEADER: &str = "date,tenant_slug,tenant_name,user_email,booking_id,kind,model,profile_or_share,slice_seconds,slice_hours,gib_hours,cost,currency\r\n";

fn csv_line(r: &db::usage::DayRow, currency: &str, out: &mut String) {
    use std::fmt::Write;
    let _ = write!(
        out,
        "{},{},{},{},{},{},{},{},{:.0},{:.4},{:.4},{},{}\r\n",
        r.day,
        csv_text(&r.tenant_slug),
        csv_text(&r.tenant_name),
        csv_text(&r.user_email),
        r.booking_id,
        csv_text(&r.kind),
        csv_text(&r.model),
        csv_text(&r.what),
        r.slice_seconds,
        r.slice_seconds / 3600.0,
        r.gib_seconds / 3600.0,
        r.cost.map(|c| format!("{c:.2}")).unwrap_or_default(),
        csv_text(currency),
    );
}

/// `GET /reports/usage.csv?from=&to=[&tenant=]`: one row per booking per
/// day, streamed straight from the database (RFC 4180, CRLF, a header).
/// Finance and admins: any tenant or all; managers: a tenant they manage.
pub async fn usage_csv(
    State(state): State<AppState>,
    user: CurrentUser,
    Query(q): Query<Period>,
) -> Result<Response, AppError> {
    // Finance and admins export any tenant or all; a manager exports the
    // tenants they manage; members use /usage.
    let tenant_id = if user.is_finance() || user.is_admin() {
        tenant_filter(&state, &q.tenant).await?
    } else if q.tenant.is_empty() {
        return Err(if user.manages_any() {
            AppError::Forbidden("managers export their own tenant: add tenant=<slug>".into())
        } else {
            AppError::Forbidden("the export is for finance, admins and tenant managers".into())
        });
    } else {
        match whose(&state, &user, &q.tenant).await? {
            Whose::Tenant(id) => Some(id),
            _ => return Err(AppError::forbidden()),
        }
    };
    if q.from.trim().is_empty() || q.to.trim().is_empty() {
        return Err(AppError::Unprocessable(
            "give the period as from=YYYY-MM-DD&to=YYYY-MM-DD".into(),
        ));
    }
    let (from, to) = period(&q)?;
    // An export holds a database connection for as long as the client
    // reads: a few at a time, so slow downloads cannot take the pool that
    // pages need.
    let slot = state
        .export_slots
        .clone()
        .try_acquire_owned()
        .map_err(|_| {
            AppError::Unavailable(
                30,
                "other usage exports are running; try again in half a minute".into(),
            )
        })?;
    let pool = state.pool.clone();
    let currency = state.currency.to_string();
    let body = async_stream(pool, from, to, tenant_id, currency, slot);
    let name = format!(
        "gpuslice-usage-{from}-{to}{}.csv",
        if q.tenant.is_empty() {
            String::new()
        } else {
            format!("-{}", q.tenant)
        }
    );
    Ok((
        [
            (header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        body,
    )
        .into_response())
}

/// The CSV body: the header, then rows in chunks of about 64 KiB as the
/// database sends them.
fn async_stream(
    pool: sqlx::PgPool,
    from: Date,
    to: Date,
    tenant_id: Option<i64>,
    currency: String,
    slot: tokio::sync::OwnedSemaphorePermit,
) -> Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(4);
    // A client that stops reading for this long loses its download (and
    // gives back the connection and the export slot).
    const STALL: std::time::Duration = std::time::Duration::from_secs(60);
    let send = move |chunk: Result<Bytes, std::io::Error>| {
        let tx = tx.clone();
        async move {
            matches!(
                tokio::time::timeout(STALL, tx.send(chunk)).await,
                Ok(Ok(()))
            )
        }
    };
    tokio::spawn(async move {
        let _slot = slot;
        if !send(Ok(Bytes::from_static(CSV_HEADER.as_bytes()))).await {
            return;
        }
        let mut rows = db::usage::day_rows(&pool, from, to, tenant_id, None);
        let mut buf = String::with_capacity(70_000);
        while let Some(r) = rows.next().await {
            match r {
                Ok(r) => {
                    csv_line(&r, &currency, &mut buf);
                    if buf.len() >= 64 * 1024 {
                        let chunk =
                            Bytes::from(std::mem::replace(&mut buf, String::with_capacity(70_000)));
                        if !send(Ok(chunk)).await {
                            return; // the client went away or stalled
                        }
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "usage export failed mid-stream");
                    send(Err(std::io::Error::other("export failed"))).await;
                    return;
                }
            }
        }
        if !buf.is_empty() {
            send(Ok(Bytes::from(buf))).await;
        }
    });
    Body::from_stream(tokio_stream_from(rx))
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

// ---- /admin/tariffs ------------------------------------------------------

#[derive(Template, WebTemplate)]
#[template(path = "admin/tariffs.html")]
pub struct TariffsPage {
    ctx: PageCtx,
    tariffs: Vec<db::usage::Tariff>,
    models: Vec<&'static str>,
    currency: String,
    form: TariffForm,
    errors: FieldErrors,
}

#[derive(Debug, Deserialize, Default, Clone)]
pub struct TariffForm {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default)]
    pub price: String,
    #[serde(default)]
    pub effective_from: String,
}

async fn tariffs_page(
    state: &AppState,
    session: &Session,
    user: &CurrentUser,
    form: TariffForm,
    errors: FieldErrors,
) -> Result<TariffsPage, AppError> {
    Ok(TariffsPage {
        ctx: PageCtx::new(session, Some(user)).await?,
        tariffs: db::usage::tariffs(&state.pool).await?,
        models: catalog::models().iter().map(|m| m.id).collect(),
        currency: state.currency.to_string(),
        form,
        errors,
    })
}

pub async fn tariffs(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
) -> Result<TariffsPage, AppError> {
    let form = TariffForm {
        effective_from: OffsetDateTime::now_utc().date().to_string(),
        kind: "mig".into(),
        ..Default::default()
    };
    tariffs_page(&state, &session, &user, form, FieldErrors::default()).await
}

/// A price: a non-negative decimal with at most 4 places.
fn parse_price(raw: &str) -> Result<String, String> {
    let raw = raw.trim();
    let (int, frac) = raw.split_once('.').unwrap_or((raw, ""));
    let digits = |s: &str| s.chars().all(|c| c.is_ascii_digit());
    if raw.is_empty() || int.is_empty() || !digits(int) || !digits(frac) {
        return Err("give a price such as 0.25 (no sign, no currency symbol)".into());
    }
    if frac.len() > 4 || int.len() > 8 {
        return Err("at most 8 digits before the point and 4 after".into());
    }
    Ok(raw.to_string())
}

pub async fn set_tariff(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Form(form): Form<TariffForm>,
) -> Result<Response, AppError> {
    let mut errors = FieldErrors::default();
    if catalog::model(form.model.trim()).is_none() {
        errors.add("model", "choose a GPU model from the catalog");
    }
    if form.kind != "mig" && form.kind != "timeslice" {
        errors.add("kind", "choose MIG or time-sliced");
    } else if form.kind == "mig"
        && catalog::model(form.model.trim()).is_some_and(|m| !m.mig_capable())
    {
        errors.add("kind", "this model has no MIG");
    }
    let price = parse_price(&form.price)
        .map_err(|e| errors.add("price", e))
        .ok();
    let day = match parse_date(&form.effective_from, "effective_from") {
        Ok(Some(d)) => Some(d),
        _ => {
            errors.add(
                "effective_from",
                "give the first day it applies, as YYYY-MM-DD",
            );
            None
        }
    };
    let (Some(price), Some(day)) = (price, day) else {
        let page = tariffs_page(&state, &session, &user, form, errors).await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    };
    if !errors.is_empty() {
        let page = tariffs_page(&state, &session, &user, form, errors).await?;
        return Ok((StatusCode::UNPROCESSABLE_ENTITY, page).into_response());
    }
    let mut tx = state.pool.begin().await?;
    db::usage::set_tariff(&mut *tx, form.model.trim(), &form.kind, &price, day).await?;
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "tariff.set",
        &format!("{} {}", form.model.trim(), form.kind),
        json!({"price_per_slice_hour": price, "effective_from": day.to_string()}),
    )
    .await?;
    tx.commit().await?;
    flash(
        &session,
        format!(
            "Tariff saved: {} {} costs {price} {} per slice-hour from {day}.",
            form.model.trim(),
            form.kind,
            state.currency
        ),
    )
    .await?;
    Ok(Redirect::to("/admin/tariffs").into_response())
}

pub async fn delete_tariff(
    State(state): State<AppState>,
    session: Session,
    Admin(user): Admin,
    Path(id): Path<i64>,
) -> Result<Redirect, AppError> {
    let mut tx = state.pool.begin().await?;
    if !db::usage::delete_tariff(&mut *tx, id).await? {
        return Err(AppError::NotFound);
    }
    db::audit::record(
        &mut *tx,
        &user.actor(),
        "tariff.delete",
        &format!("tariff {id}"),
        json!({}),
    )
    .await?;
    tx.commit().await?;
    flash(&session, "Tariff removed.").await?;
    Ok(Redirect::to("/admin/tariffs"))
}

/// Usage history, finance reports and the CSV, tariffs.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/usage", get(usage_page))
        .route("/reports", get(reports))
        .route("/reports/", get(|| async { Redirect::to("/reports") }))
        .route("/reports/usage.csv", get(usage_csv))
        .route("/admin/tariffs", get(tariffs).post(set_tariff))
        .route("/admin/tariffs/{id}/delete", post(delete_tariff))
}

/// A sum that reads 0.0 when there is nothing to add: Rust's float sum of
/// nothing is -0.0, which the pages printed as "-0.0 slice-hours".
fn sum(values: impl Iterator<Item = f64>) -> f64 {
    values.sum::<f64>() + 0.0
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_empty_period_sums_to_plain_zero() {
        let total = super::sum(std::iter::empty());
        assert_eq!(format!("{total:.1}"), "0.0");
    }
}
