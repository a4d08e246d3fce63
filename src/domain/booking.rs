//! What a booking request is, parsed once from a form or JSON, and the pure
//! rules of quota: the peak of a tenant's use over a window and the slice
//! hours that fall into each calendar month.

use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, UtcOffset};

use super::{Priority, Slug};
use crate::gpu::catalog;

/// A whole GPU counts as seven compute slices everywhere (quota, budget,
/// metering), MIG or not, so that one unit serves both kinds.
pub const SLICES_PER_GPU: i32 = 7;

text_enum! {
    /// MIG instance or time-sliced share (`bookings.kind`, lower-case text).
    pub enum Kind {
        Mig = "mig",
        Timeslice = "timeslice",
    }
}

impl Kind {
    pub fn parse(raw: &str) -> Result<Kind, String> {
        match raw.trim() {
            "" => Err("choose a MIG instance or a time-sliced share".into()),
            raw => Kind::named(raw)
                .ok_or_else(|| format!("unknown kind \"{raw}\": use mig or timeslice")),
        }
    }

    /// The GPU mode that carries bookings of this kind.
    pub fn gpu_mode(self) -> super::GpuMode {
        match self {
            Kind::Mig => super::GpuMode::Mig,
            Kind::Timeslice => super::GpuMode::Timeslice,
        }
    }
}

pub use super::lifecycle::{Illegal, Status, Step, Transition};

/// What is booked.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Mig {
        profile: String,
    },
    Share {
        memory_gib: i32,
        /// `None`: the tenant's default priority.
        priority: Option<Priority>,
    },
}

/// A booking request, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct BookingRequest {
    pub tenant: Slug,
    pub what: Request,
    /// Catalog model id, when the user asked for one.
    pub model: Option<String>,
    /// `None`: now.
    pub start: Option<OffsetDateTime>,
    pub hours: i32,
}

impl BookingRequest {
    pub fn kind(&self) -> Kind {
        match self.what {
            Request::Mig { .. } => Kind::Mig,
            Request::Share { .. } => Kind::Timeslice,
        }
    }
}

/// The raw fields of a booking form or JSON body.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct BookingInput {
    pub tenant: String,
    pub kind: String,
    pub model: String,
    pub profile: String,
    pub memory_gib: String,
    pub priority: String,
    /// Empty or `now`, RFC 3339, or a form's `YYYY-MM-DDTHH:MM` read in the
    /// browser's time zone (`tz_offset_minutes`, as JavaScript's
    /// `getTimezoneOffset()`: minutes to add to local time to get UTC).
    pub start: String,
    pub tz_offset_minutes: String,
    pub hours: String,
}

/// Longest booking anyone may ask for (90 days), whatever a tenant allows.
pub const MAX_HOURS: i32 = 2160;

impl BookingInput {
    /// Parses every field, collecting one message per bad field.
    pub fn parse(&self) -> Result<BookingRequest, Vec<(&'static str, String)>> {
        let mut errors: Vec<(&'static str, String)> = Vec::new();
        let tenant = Slug::parse(&self.tenant)
            .map_err(|_| errors.push(("tenant", "choose one of your tenants".into())))
            .ok();
        let kind = Kind::parse(&self.kind)
            .map_err(|e| errors.push(("kind", e)))
            .ok();
        let model = match self.model.trim() {
            "" | "any" => None,
            m => match catalog::model(m) {
                Some(found) => Some(found.id.to_string()),
                None => {
                    errors.push(("model", format!("unknown GPU model \"{m}\"")));
                    None
                }
            },
        };
        let what = match kind {
            Some(Kind::Mig) => {
                let p = self.profile.trim();
                if p.is_empty() {
                    errors.push(("profile", "choose a MIG profile such as 1g.10gb".into()));
                    None
                } else {
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
                            "profile",
                            match &model {
                                Some(m) => format!("{m} has no MIG profile \"{p}\""),
                                None => format!("no GPU model has a MIG profile \"{p}\""),
                            },
                        ));
                        None
                    }
                }
            }
            Some(Kind::Timeslice) => {
                let memory = match self.memory_gib.trim().parse::<i32>() {
                    Ok(n) if (1..=1024).contains(&n) => Some(n),
                    Ok(_) => {
                        errors.push(("memory_gib", "give between 1 and 1024 GiB".into()));
                        None
                    }
                    Err(_) => {
                        errors.push((
                            "memory_gib",
                            "give the GPU memory of the share as a whole number of GiB".into(),
                        ));
                        None
                    }
                };
                let priority = match self.priority.trim() {
                    "" | "default" => Ok(None),
                    p => Priority::parse(p).map(Some),
                }
                .map_err(|e| errors.push(("priority", e)))
                .ok();
                match (memory, priority) {
                    (Some(memory_gib), Some(priority)) => Some(Request::Share {
                        memory_gib,
                        priority,
                    }),
                    _ => None,
                }
            }
            None => None,
        };
        let start = parse_start(&self.start, &self.tz_offset_minutes)
            .map_err(|e| errors.push(("start", e)))
            .ok();
        let hours = match self.hours.trim().parse::<i32>() {
            Ok(h) if (1..=MAX_HOURS).contains(&h) => Some(h),
            Ok(_) => {
                errors.push(("hours", format!("give between 1 and {MAX_HOURS} hours")));
                None
            }
            Err(_) => {
                errors.push(("hours", "give the length in whole hours".into()));
                None
            }
        };
        match (tenant, what, start, hours) {
            (Some(tenant), Some(what), Some(start), Some(hours)) if errors.is_empty() => {
                Ok(BookingRequest {
                    tenant,
                    what,
                    model,
                    start,
                    hours,
                })
            }
            _ => Err(errors),
        }
    }
}

fn parse_start(raw: &str, tz_offset: &str) -> Result<Option<OffsetDateTime>, String> {
    let raw = raw.trim();
    if raw.is_empty() || raw == "now" {
        return Ok(None);
    }
    if let Ok(t) = OffsetDateTime::parse(raw, &Rfc3339) {
        return Ok(Some(t));
    }
    let local = PrimitiveDateTime::parse(
        raw,
        format_description!("[year]-[month]-[day]T[hour]:[minute]"),
    )
    .or_else(|_| {
        PrimitiveDateTime::parse(
            raw,
            format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]"),
        )
    })
    .map_err(|_| {
        format!("\"{raw}\" is not a date and time; use 2026-12-24T14:00 or leave it empty for now")
    })?;
    let minutes = match tz_offset.trim() {
        "" => 0,
        m => m
            .parse::<i32>()
            .ok()
            .filter(|m| m.abs() <= 18 * 60)
            .ok_or("the time zone offset is not valid")?,
    };
    let offset = UtcOffset::from_whole_seconds(-minutes * 60).map_err(|e| e.to_string())?;
    Ok(Some(local.assume_offset(offset)))
}

/// One live booking of a tenant, for quota: its window and what it holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Held {
    pub start: i64,
    pub end: i64,
    pub memory_gib: i32,
    pub compute_slices: i32,
}

/// The most a tenant holds at any one moment of `[start, end)`: bookings,
/// GPU memory, compute slices. Each is the peak of its own dimension.
pub fn peak_use(held: &[Held], start: i64, end: i64) -> (i32, i32, i32) {
    let inside: Vec<&Held> = held
        .iter()
        .filter(|h| h.start < end && start < h.end)
        .collect();
    // The peak of a step function is reached at some booking's start (or
    // the window's start).
    let mut points: Vec<i64> = inside.iter().map(|h| h.start.max(start)).collect();
    points.push(start);
    let mut peak = (0, 0, 0);
    for t in points {
        let at: Vec<&&Held> = inside
            .iter()
            .filter(|h| h.start <= t && t < h.end)
            .collect();
        peak.0 = peak.0.max(at.len() as i32);
        peak.1 = peak.1.max(at.iter().map(|h| h.memory_gib).sum());
        peak.2 = peak.2.max(at.iter().map(|h| h.compute_slices).sum());
    }
    peak
}

/// Slice-hours of `compute_slices` held over `[start, end)` that fall into
/// `[from, to)`.
pub fn slice_hours_within(compute_slices: i32, start: i64, end: i64, from: i64, to: i64) -> f64 {
    let secs = (end.min(to) - start.max(from)).max(0);
    f64::from(compute_slices) * secs as f64 / 3600.0
}

/// The calendar months (UTC) that `[start, end)` touches, as `[from, to)`
/// in seconds.
pub fn months_touched(start: i64, end: i64) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let Ok(s) = OffsetDateTime::from_unix_timestamp(start) else {
        return out;
    };
    let mut first = month_start(s.year(), s.month());
    while first < end {
        let t = OffsetDateTime::from_unix_timestamp(first).unwrap_or(OffsetDateTime::UNIX_EPOCH);
        let next_month = t.month().next();
        let year = if next_month == Month::January {
            t.year() + 1
        } else {
            t.year()
        };
        let next = month_start(year, next_month);
        out.push((first, next));
        first = next;
    }
    out
}

fn month_start(year: i32, month: Month) -> i64 {
    Date::from_calendar_date(year, month, 1)
        .map(|d| d.midnight().assume_utc().unix_timestamp())
        .unwrap_or(0)
}

/// Compute slices a share of `memory_gib` on a GPU of `gpu_memory_gib`
/// counts as: its fraction of the GPU's memory, rounded up, in sevenths.
pub fn share_slices(memory_gib: i32, gpu_memory_gib: f64) -> i32 {
    if gpu_memory_gib <= 0.0 {
        return SLICES_PER_GPU;
    }
    let s = (f64::from(SLICES_PER_GPU) * f64::from(memory_gib) / gpu_memory_gib).ceil() as i32;
    s.clamp(1, SLICES_PER_GPU)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn input() -> BookingInput {
        BookingInput {
            tenant: "vision-lab".into(),
            kind: "mig".into(),
            profile: "1g.10gb".into(),
            hours: "2".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_good_mig_request_parses() {
        let r = input().parse().unwrap();
        assert_eq!(r.kind(), Kind::Mig);
        assert_eq!(r.start, None);
        assert_eq!(r.hours, 2);
    }

    #[test]
    fn every_bad_field_gets_its_own_message() {
        let bad = BookingInput {
            tenant: "No Such".into(),
            kind: "mig".into(),
            model: "H100-81GB".into(),
            profile: "9g.99gb".into(),
            start: "tomorrow".into(),
            hours: "0".into(),
            ..Default::default()
        };
        let errors = bad.parse().unwrap_err();
        let fields: Vec<&str> = errors.iter().map(|(f, _)| *f).collect();
        assert_eq!(
            fields,
            ["tenant", "model", "profile", "start", "hours"],
            "{errors:?}"
        );
    }

    #[test]
    fn a_profile_must_belong_to_the_model_asked_for() {
        let mut i = input();
        i.model = "A30-24GB".into();
        i.profile = "1g.10gb".into();
        let e = i.parse().unwrap_err();
        assert_eq!(e[0].0, "profile");
        assert!(e[0].1.contains("A30-24GB"), "{e:?}");
    }

    #[test]
    fn shares_need_memory_and_a_known_priority() {
        let mut i = input();
        i.kind = "timeslice".into();
        i.memory_gib = "ten".into();
        i.priority = "urgent".into();
        let e = i.parse().unwrap_err();
        assert_eq!(
            e.iter().map(|(f, _)| *f).collect::<Vec<_>>(),
            ["memory_gib", "priority"]
        );
        i.memory_gib = "12".into();
        i.priority = String::new();
        assert_eq!(
            i.parse().unwrap().what,
            Request::Share {
                memory_gib: 12,
                priority: None
            }
        );
    }

    #[test]
    fn a_form_time_is_read_in_the_browsers_zone() {
        let mut i = input();
        i.start = "2026-12-24T14:00".into();
        i.tz_offset_minutes = "-60".into(); // UTC+1
        let t = i.parse().unwrap().start.unwrap();
        assert_eq!(
            t.unix_timestamp(),
            time::macros::datetime!(2026-12-24 13:00 UTC).unix_timestamp()
        );
        i.start = "2026-12-24T14:00:00Z".into();
        assert_eq!(i.parse().unwrap().start.unwrap().hour(), 14);
    }

    #[test]
    fn peak_use_counts_only_what_overlaps_at_one_moment() {
        let h = |start, end, m, c| Held {
            start,
            end,
            memory_gib: m,
            compute_slices: c,
        };
        // Two back-to-back bookings never hold at the same time.
        let held = [h(0, 10, 10, 1), h(10, 20, 20, 2)];
        assert_eq!(peak_use(&held, 0, 20), (1, 20, 2));
        let held = [h(0, 10, 10, 1), h(5, 20, 20, 2), h(30, 40, 40, 3)];
        assert_eq!(peak_use(&held, 0, 25), (2, 30, 3));
        assert_eq!(peak_use(&held, 25, 29), (0, 0, 0));
    }

    #[test]
    fn months_split_at_the_first_of_the_month() {
        let start = time::macros::datetime!(2026-12-31 22:00 UTC).unix_timestamp();
        let m = months_touched(start, start + 4 * 3600);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[1].0,
            time::macros::datetime!(2027-01-01 00:00 UTC).unix_timestamp()
        );
        let dec = slice_hours_within(7, start, start + 4 * 3600, m[0].0, m[0].1);
        assert!((dec - 14.0).abs() < 1e-9);
    }

    #[test]
    fn a_share_counts_its_memory_fraction_in_sevenths() {
        assert_eq!(share_slices(12, 48.0), 2);
        assert_eq!(share_slices(48, 48.0), 7);
        assert_eq!(share_slices(1, 80.0), 1);
    }

    proptest! {
        #[test]
        fn peak_is_never_below_any_single_moment(
            items in proptest::collection::vec((0i64..100, 1i64..50, 1i32..40, 1i32..7), 0..12),
            t in 0i64..150,
        ) {
            let held: Vec<Held> = items.iter().map(|&(s, l, m, c)| Held { start: s, end: s + l, memory_gib: m, compute_slices: c }).collect();
            let (n, m, c) = peak_use(&held, 0, 200);
            let at: Vec<&Held> = held.iter().filter(|h| h.start <= t && t < h.end).collect();
            prop_assert!(n >= at.len() as i32);
            prop_assert!(m >= at.iter().map(|h| h.memory_gib).sum::<i32>());
            prop_assert!(c >= at.iter().map(|h| h.compute_slices).sum::<i32>());
        }
    }
}
