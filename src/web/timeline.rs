//! When a request would fit: the booking form's availability timeline
//! (`GET /bookings/timeline`, htmx) and `GET /api/v1/availability`. Both
//! read [`crate::booking::availability`]; any signed-in person may ask
//! (the answer says when capacity is free, never whose bookings hold it).

use askama::Template;
use askama_web::WebTemplate;
use axum::extract::{Query, State};
use serde::Deserialize;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::auth::CurrentUser;
use super::charts::{self, TimelineRow};
use super::error::AppError;
use super::AppState;
use crate::booking::availability::{self, GpuFree};
use crate::db;
use crate::domain::booking::{BookingInput, Request};
use crate::gpu::catalog;
use crate::placement::mig::Window;

/// How far the timeline and, by default, the API look ahead.
pub const DEFAULT_DAYS: i64 = 7;
/// The longest period one API answer covers.
pub const MAX_DAYS: i64 = 31;

/// `GET /api/v1/availability` parameters, as sent.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct AvailabilityQuery {
    /// A tenant of the caller: only the models and profiles it may book.
    pub tenant: String,
    pub model: String,
    pub profile: String,
    pub memory_gib: String,
    pub from: String,
    pub to: String,
}

/// A parsed availability question.
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub what: Request,
    pub model: Option<String>,
    /// Unix seconds; `from` is never before now, `to` never past the
    /// booking horizon.
    pub period: Window,
}

/// A time as the API takes it: RFC 3339, with its zone; or what to tell
/// the caller.
pub fn rfc3339(raw: &str) -> Result<OffsetDateTime, String> {
    OffsetDateTime::parse(raw, &Rfc3339)
        .map_err(|_| format!("\"{raw}\" is not an RFC 3339 time such as 2026-12-24T14:00:00Z"))
}

/// Parses an availability question at `now`, one message per bad field.
/// A `from` in the past means now; a `to` past the horizon (bookings may
/// start at most `max_ahead_days` ahead) means the horizon.
pub fn parse(
    q: &AvailabilityQuery,
    now: OffsetDateTime,
    max_ahead_days: i64,
) -> Result<Asked, Vec<(String, String)>> {
    let mut errors: Vec<(String, String)> = Vec::new();
    let model = match q.model.trim() {
        "" | "any" => None,
        m => match catalog::model(m) {
            Some(found) => Some(found.id.to_string()),
            None => {
                errors.push(("model".into(), format!("unknown GPU model \"{m}\"")));
                None
            }
        },
    };
    let what = match (q.profile.trim(), q.memory_gib.trim()) {
        ("", "") => {
            errors.push((
                "profile".into(),
                "give profile (a MIG profile such as 1g.10gb) or memory_gib (a time-sliced share's GiB)"
                    .into(),
            ));
            None
        }
        (p, m) if !p.is_empty() && !m.is_empty() => {
            errors.push((
                "profile".into(),
                "give profile (MIG) or memory_gib (a share), not both".into(),
            ));
            None
        }
        (p, "") => {
            let known = match model.as_deref().and_then(catalog::model) {
                Some(m) => m.profile(p).is_some(),
                None => catalog::models().iter().any(|m| m.profile(p).is_some()),
            };
            if known {
                Some(Request::Mig {
                    profile: p.to_string(),
                })
            } else {
                errors.push((
                    "profile".into(),
                    match &model {
                        Some(m) => format!("{m} has no MIG profile \"{p}\""),
                        None => format!("no GPU model has a MIG profile \"{p}\""),
                    },
                ));
                None
            }
        }
        (_, m) => match m.parse::<i32>() {
            Ok(gib) if (1..=1024).contains(&gib) => Some(Request::Share {
                memory_gib: gib,
                priority: None,
            }),
            _ => {
                errors.push((
                    "memory_gib".into(),
                    "a share's memory is a whole number of GiB from 1 to 1024".into(),
                ));
                None
            }
        },
    };
    let now_s = now.unix_timestamp();
    let instant = |field: &str, raw: &str, errors: &mut Vec<(String, String)>| match raw.trim() {
        "" => None,
        r => match rfc3339(r) {
            Ok(t) => Some(t.unix_timestamp()),
            Err(e) => {
                errors.push((field.into(), e));
                None
            }
        },
    };
    let from = instant("from", &q.from, &mut errors).unwrap_or(now_s);
    let to = instant("to", &q.to, &mut errors);
    let from = from.max(now_s);
    let horizon = now_s + max_ahead_days * 86_400;
    let to = to.unwrap_or(from + DEFAULT_DAYS * 86_400).min(horizon);
    if errors.is_empty() {
        if from >= horizon {
            errors.push((
                "from".into(),
                format!("bookings may start at most {max_ahead_days} days ahead"),
            ));
        } else if to <= from {
            errors.push(("to".into(), "to must lie after from (and after now)".into()));
        } else if to - from > MAX_DAYS * 86_400 {
            errors.push((
                "to".into(),
                format!("ask for at most {MAX_DAYS} days at a time"),
            ));
        }
    }
    match what {
        Some(what) if errors.is_empty() => Ok(Asked {
            what,
            model,
            period: Window {
                start: from,
                end: to,
            },
        }),
        _ => Err(errors),
    }
}

/// Availability answers computed at once (each reads the fleet's live
/// bookings and does CPU work); beyond, callers wait up to 5 s, then 503.
static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(2);

/// Answers a parsed question, for `tenant` when given: the caller must be
/// its member (or an admin; 404 otherwise), and only its allowed models and
/// profiles count.
pub async fn free(
    state: &AppState,
    user: &CurrentUser,
    tenant: &str,
    asked: &Asked,
) -> Result<Vec<GpuFree>, AppError> {
    let allowed = match tenant.trim() {
        "" => Vec::new(),
        slug => {
            let id = db::tenants::id_by_slug(&state.pool, slug)
                .await?
                .filter(|id| user.is_admin() || user.membership(*id).is_some())
                .ok_or(AppError::NotFound)?;
            let t = db::tenants::get(&state.pool, id).await?;
            let q = &t.quota;
            if let Request::Mig { profile } = &asked.what {
                if !q.allowed_profiles.is_empty() && !q.allowed_profiles.contains(profile) {
                    return Err(AppError::Invalid(vec![(
                        "profile".into(),
                        format!("{} may not book {profile}", t.slug),
                    )]));
                }
            }
            if let Some(m) = &asked.model {
                if !q.allowed_models.is_empty() && !q.allowed_models.contains(m) {
                    return Err(AppError::Invalid(vec![(
                        "model".into(),
                        format!("{} may not book {m}", t.slug),
                    )]));
                }
            }
            q.allowed_models.clone()
        }
    };
    let _slot = tokio::time::timeout(std::time::Duration::from_secs(5), SLOTS.acquire())
        .await
        .ok()
        .and_then(Result::ok)
        .ok_or_else(|| {
            AppError::Unavailable(
                5,
                "busy working out availability; try again in a few seconds".into(),
            )
        })?;
    Ok(availability::availability(
        &state.pool,
        &asked.what,
        asked.model.as_deref(),
        &allowed,
        asked.period,
    )
    .await?)
}

/// The timeline fragment under the booking form.
#[derive(Template, WebTemplate)]
#[template(path = "bookings/_timeline.html")]
pub struct TimelineFragment {
    /// Why there is no timeline (nothing chosen yet, bad input).
    message: Option<String>,
    /// The chart (numbers and labels escaped by [`charts::timeline`]).
    svg: String,
    /// What was asked, in words.
    what: String,
    /// (GPU label, [(RFC 3339 start, "from … to …")]) for the list view.
    rows: Vec<(String, Vec<(String, String)>)>,
}

/// `GET /bookings/timeline?kind=&model=&profile=&memory_gib=&tz_offset_minutes=`
/// (htmx, the booking form's fields): when the chosen slice fits on each
/// GPU over the next 7 days.
pub async fn timeline(
    State(state): State<AppState>,
    user: CurrentUser,
    Query(input): Query<BookingInput>,
) -> Result<TimelineFragment, AppError> {
    let message = |m: &str| TimelineFragment {
        message: Some(m.to_string()),
        svg: String::new(),
        what: String::new(),
        rows: Vec::new(),
    };
    let q = match input.kind.trim() {
        "mig" => AvailabilityQuery {
            model: input.model.clone(),
            profile: input.profile.clone(),
            ..Default::default()
        },
        "timeslice" if input.memory_gib.trim().is_empty() => {
            return Ok(message("Enter the share's memory to see when it fits."))
        }
        "timeslice" => AvailabilityQuery {
            model: input.model.clone(),
            memory_gib: input.memory_gib.clone(),
            ..Default::default()
        },
        _ => {
            return Ok(message(
                "Choose a MIG instance or a share to see when it fits.",
            ))
        }
    };
    let now = OffsetDateTime::now_utc();
    let asked = match parse(&q, now, state.booking_settings.max_ahead_days) {
        Ok(a) => a,
        Err(errors) => {
            let text: Vec<String> = errors.into_iter().map(|(_, m)| m).collect();
            return Ok(message(&format!("No timeline: {}.", text.join("; "))));
        }
    };
    let mut found = match free(&state, &user, &input.tenant, &asked).await {
        Ok(f) => f,
        Err(AppError::Invalid(errors)) => {
            let text: Vec<String> = errors.into_iter().map(|(_, m)| m).collect();
            return Ok(message(&format!("No timeline: {}.", text.join("; "))));
        }
        Err(e) => return Err(e),
    };
    // Only stretches long enough for the hours asked.
    if let Some(h) = input.hours.trim().parse::<i64>().ok().filter(|h| *h > 0) {
        for g in &mut found {
            g.free.retain(|w| w.len() >= h * 3600);
        }
    }
    let what = match &asked.what {
        Request::Mig { profile } => format!("a {profile} instance"),
        Request::Share { memory_gib, .. } => format!("a {memory_gib} GiB share"),
    };
    if found.is_empty() {
        return Ok(message(&format!(
            "No GPU{} can take {what}.",
            asked
                .model
                .as_deref()
                .map(|m| format!(" of model {m}"))
                .unwrap_or_default()
        )));
    }
    let tz_offset_secs = -i64::from(
        input
            .tz_offset_minutes
            .trim()
            .parse::<i32>()
            .ok()
            .filter(|m| m.abs() <= 18 * 60)
            .unwrap_or(0),
    ) * 60;
    let label = |g: &GpuFree| format!("{} #{} {}", g.gpu.node, g.gpu.idx, g.gpu.model);
    let chart_rows: Vec<TimelineRow> = found
        .iter()
        .map(|g| TimelineRow {
            label: label(g),
            free: g.free.iter().map(|w| (w.start, w.end)).collect(),
        })
        .collect();
    let stamp =
        |t: i64| OffsetDateTime::from_unix_timestamp(t).unwrap_or(OffsetDateTime::UNIX_EPOCH);
    let rows = found
        .iter()
        .map(|g| {
            (
                label(g),
                g.free
                    .iter()
                    .map(|w| {
                        (
                            stamp(w.start).format(&Rfc3339).unwrap_or_default(),
                            format!(
                                "from {} to {}",
                                crate::booking::when(stamp(w.start)),
                                crate::booking::when(stamp(w.end))
                            ),
                        )
                    })
                    .collect(),
            )
        })
        .collect();
    Ok(TimelineFragment {
        message: None,
        svg: charts::timeline(
            &chart_rows,
            asked.period.start,
            asked.period.end,
            now.unix_timestamp(),
            tz_offset_secs,
        ),
        what,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(profile: &str, memory_gib: &str) -> AvailabilityQuery {
        AvailabilityQuery {
            profile: profile.into(),
            memory_gib: memory_gib.into(),
            ..Default::default()
        }
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
    }

    fn fields(r: Result<Asked, Vec<(String, String)>>) -> Vec<String> {
        r.unwrap_err().into_iter().map(|e| e.0).collect()
    }

    #[test]
    fn defaults_to_the_next_seven_days() {
        let a = parse(&q("1g.10gb", ""), now(), 90).unwrap();
        assert_eq!(a.period.start, 1_800_000_000);
        assert_eq!(a.period.len(), 7 * 86_400);
        assert_eq!(
            a.what,
            Request::Mig {
                profile: "1g.10gb".into()
            }
        );
    }

    #[test]
    fn a_past_from_means_now_and_the_horizon_caps_to() {
        let mut x = q("", "8");
        x.from = "2020-01-01T00:00:00Z".into();
        x.to = "2099-01-01T00:00:00Z".into();
        // The horizon first (3 days), so the 31-day limit is not hit.
        let a = parse(&x, now(), 3).unwrap();
        assert_eq!(a.period.start, 1_800_000_000);
        assert_eq!(a.period.end, 1_800_000_000 + 3 * 86_400);
    }

    #[test]
    fn refuses_what_it_cannot_answer() {
        assert_eq!(fields(parse(&q("", ""), now(), 90)), ["profile"]);
        assert_eq!(fields(parse(&q("1g.10gb", "8"), now(), 90)), ["profile"]);
        assert_eq!(fields(parse(&q("9g.1tb", ""), now(), 90)), ["profile"]);
        assert_eq!(fields(parse(&q("", "0"), now(), 90)), ["memory_gib"]);
        let mut x = q("1g.10gb", "");
        x.model = "Voodoo2".into();
        assert_eq!(fields(parse(&x, now(), 90)), ["model"]);
        let mut x = q("1g.10gb", "");
        x.to = "2000-01-01T00:00:00Z".into();
        assert_eq!(fields(parse(&x, now(), 90)), ["to"]);
        let mut x = q("1g.10gb", "");
        x.to = "tomorrow".into();
        assert_eq!(fields(parse(&x, now(), 90)), ["to"]);
        let mut x = q("1g.10gb", "");
        x.to = "2099-01-01T00:00:00Z".into();
        assert_eq!(fields(parse(&x, now(), 90)), ["to"], "more than 31 days");
    }
}
