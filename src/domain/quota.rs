//! A tenant's quota: every dimension an admin can limit, with the bounds a
//! form or the CLI must respect. Parsed from raw strings so that a form can
//! show one message per field.

use super::Priority;

/// Upper bounds keep typos ("10000000 GiB") out of the database; they sit far
/// above any real university fleet.
const MAX_ACTIVE_BOOKINGS: i32 = 1_000;
const MAX_GPU_MEMORY_GIB: i32 = 100_000;
const MAX_COMPUTE_SLICES: i32 = 10_000;
const MAX_MONTHLY_SLICE_HOURS: i32 = 10_000_000;
/// 90 days: longer bookings belong to a dedicated node, not a shared pool.
const MAX_BOOKING_HOURS: i32 = 2_160;

/// One validated quota (the API and the audit log show it as is).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct Quota {
    pub max_active_bookings: i32,
    pub max_gpu_memory_gib: i32,
    pub max_compute_slices: i32,
    pub default_priority: Priority,
    pub guaranteed_share_pct: i32,
    /// One slice-hour = one compute slice for one hour; a whole 7-slice GPU
    /// for an hour is 7 slice-hours.
    pub monthly_slice_hours: i32,
    pub max_booking_hours: i32,
    /// Empty: every model may be booked.
    pub allowed_models: Vec<String>,
    /// Empty: every profile may be booked.
    pub allowed_profiles: Vec<String>,
}

impl Default for Quota {
    fn default() -> Self {
        Self {
            max_active_bookings: 2,
            max_gpu_memory_gib: 40,
            max_compute_slices: 7,
            default_priority: Priority::Normal,
            guaranteed_share_pct: 0,
            monthly_slice_hours: 500,
            max_booking_hours: 24,
            allowed_models: Vec::new(),
            allowed_profiles: Vec::new(),
        }
    }
}

/// The names of the quota fields, as used in forms, the CLI and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuotaField {
    MaxActiveBookings,
    MaxGpuMemoryGib,
    MaxComputeSlices,
    DefaultPriority,
    GuaranteedSharePct,
    MonthlySliceHours,
    MaxBookingHours,
    AllowedModels,
    AllowedProfiles,
}

impl QuotaField {
    pub fn name(self) -> &'static str {
        match self {
            QuotaField::MaxActiveBookings => "max_active_bookings",
            QuotaField::MaxGpuMemoryGib => "max_gpu_memory_gib",
            QuotaField::MaxComputeSlices => "max_compute_slices",
            QuotaField::DefaultPriority => "default_priority",
            QuotaField::GuaranteedSharePct => "guaranteed_share_pct",
            QuotaField::MonthlySliceHours => "monthly_slice_hours",
            QuotaField::MaxBookingHours => "max_booking_hours",
            QuotaField::AllowedModels => "allowed_models",
            QuotaField::AllowedProfiles => "allowed_profiles",
        }
    }
}

/// The five amounts of a quota an allocation request asks for (and an
/// admin grants); the rest of the quota (priority, guarantee, allowed
/// models and profiles) stays as the admins set it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Allocation {
    pub max_active_bookings: i32,
    pub max_gpu_memory_gib: i32,
    pub max_compute_slices: i32,
    pub monthly_slice_hours: i32,
    pub max_booking_hours: i32,
}

/// The amounts of an allocation as typed.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(default)]
pub struct AllocationInput {
    pub max_active_bookings: String,
    pub max_gpu_memory_gib: String,
    pub max_compute_slices: String,
    pub monthly_slice_hours: String,
    pub max_booking_hours: String,
}

impl Allocation {
    pub fn of(q: &Quota) -> Allocation {
        Allocation {
            max_active_bookings: q.max_active_bookings,
            max_gpu_memory_gib: q.max_gpu_memory_gib,
            max_compute_slices: q.max_compute_slices,
            monthly_slice_hours: q.monthly_slice_hours,
            max_booking_hours: q.max_booking_hours,
        }
    }

    /// `q` with these amounts.
    pub fn applied_to(self, q: &Quota) -> Quota {
        Quota {
            max_active_bookings: self.max_active_bookings,
            max_gpu_memory_gib: self.max_gpu_memory_gib,
            max_compute_slices: self.max_compute_slices,
            monthly_slice_hours: self.monthly_slice_hours,
            max_booking_hours: self.max_booking_hours,
            ..q.clone()
        }
    }

    /// (field, label, value) for forms and tables.
    pub fn rows(self) -> [(&'static str, &'static str, i32); 5] {
        [
            (
                "max_active_bookings",
                "active bookings",
                self.max_active_bookings,
            ),
            (
                "max_gpu_memory_gib",
                "GiB of GPU memory at once",
                self.max_gpu_memory_gib,
            ),
            (
                "max_compute_slices",
                "compute slices at once",
                self.max_compute_slices,
            ),
            (
                "monthly_slice_hours",
                "slice-hours a month",
                self.monthly_slice_hours,
            ),
            (
                "max_booking_hours",
                "hours the longest booking",
                self.max_booking_hours,
            ),
        ]
    }
}

impl From<Allocation> for AllocationInput {
    fn from(a: Allocation) -> Self {
        AllocationInput {
            max_active_bookings: a.max_active_bookings.to_string(),
            max_gpu_memory_gib: a.max_gpu_memory_gib.to_string(),
            max_compute_slices: a.max_compute_slices.to_string(),
            monthly_slice_hours: a.monthly_slice_hours.to_string(),
            max_booking_hours: a.max_booking_hours.to_string(),
        }
    }
}

impl AllocationInput {
    /// Validates the amounts by the quota's own limits, one message per
    /// bad field (named as the quota's fields).
    pub fn parse(&self, current: &Quota) -> Result<Allocation, Vec<(&'static str, String)>> {
        let mut input = QuotaInput::from(current);
        input.max_active_bookings = self.max_active_bookings.clone();
        input.max_gpu_memory_gib = self.max_gpu_memory_gib.clone();
        input.max_compute_slices = self.max_compute_slices.clone();
        input.monthly_slice_hours = self.monthly_slice_hours.clone();
        input.max_booking_hours = self.max_booking_hours.clone();
        input
            .parse()
            .map(|q| Allocation::of(&q))
            .map_err(|errors| errors.into_iter().map(|(f, m)| (f.name(), m)).collect())
    }
}

/// Raw quota values as typed by a person.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct QuotaInput {
    pub max_active_bookings: String,
    pub max_gpu_memory_gib: String,
    pub max_compute_slices: String,
    pub default_priority: String,
    pub guaranteed_share_pct: String,
    pub monthly_slice_hours: String,
    pub max_booking_hours: String,
    #[serde(default)]
    pub allowed_models: String,
    #[serde(default)]
    pub allowed_profiles: String,
}

impl From<&Quota> for QuotaInput {
    fn from(q: &Quota) -> Self {
        Self {
            max_active_bookings: q.max_active_bookings.to_string(),
            max_gpu_memory_gib: q.max_gpu_memory_gib.to_string(),
            max_compute_slices: q.max_compute_slices.to_string(),
            default_priority: q.default_priority.as_str().to_string(),
            guaranteed_share_pct: q.guaranteed_share_pct.to_string(),
            monthly_slice_hours: q.monthly_slice_hours.to_string(),
            max_booking_hours: q.max_booking_hours.to_string(),
            allowed_models: q.allowed_models.join(", "),
            allowed_profiles: q.allowed_profiles.join(", "),
        }
    }
}

fn int_in(raw: &str, min: i32, max: i32, unit: &str) -> Result<i32, String> {
    let t = raw.trim();
    if t.is_empty() {
        return Err("enter a number".into());
    }
    let n: i64 = t
        .parse()
        .map_err(|_| format!("\"{t}\" is not a whole number"))?;
    if n < 0 {
        return Err("may not be negative".into());
    }
    if n < i64::from(min) {
        return Err(format!("must be at least {min} {unit}")
            .trim_end()
            .to_string());
    }
    if n > i64::from(max) {
        return Err(format!("must be at most {max} {unit}")
            .trim_end()
            .to_string());
    }
    Ok(n as i32)
}

fn name_list(raw: &str) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in raw
        .split([',', ' ', '\n'])
        .map(str::trim)
        .filter(|s| !s.is_empty())
    {
        let ok = item.len() <= 40
            && item
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '-' | '_'));
        if !ok {
            return Err(format!("\"{item}\" is not a model or profile name"));
        }
        if !out.iter().any(|o| o == item) {
            out.push(item.to_string());
        }
    }
    Ok(out)
}

impl QuotaInput {
    /// Validates every field and reports all problems at once.
    pub fn parse(&self) -> Result<Quota, Vec<(QuotaField, String)>> {
        let mut errors = Vec::new();
        let mut take = |field: QuotaField, r: Result<i32, String>| match r {
            Ok(v) => v,
            Err(e) => {
                errors.push((field, e));
                0
            }
        };
        let max_active_bookings = take(
            QuotaField::MaxActiveBookings,
            int_in(
                &self.max_active_bookings,
                0,
                MAX_ACTIVE_BOOKINGS,
                "bookings",
            ),
        );
        let max_gpu_memory_gib = take(
            QuotaField::MaxGpuMemoryGib,
            int_in(&self.max_gpu_memory_gib, 0, MAX_GPU_MEMORY_GIB, "GiB"),
        );
        let max_compute_slices = take(
            QuotaField::MaxComputeSlices,
            int_in(&self.max_compute_slices, 0, MAX_COMPUTE_SLICES, "slices"),
        );
        let guaranteed_share_pct = take(
            QuotaField::GuaranteedSharePct,
            int_in(&self.guaranteed_share_pct, 0, 100, "%"),
        );
        let monthly_slice_hours = take(
            QuotaField::MonthlySliceHours,
            int_in(
                &self.monthly_slice_hours,
                0,
                MAX_MONTHLY_SLICE_HOURS,
                "slice-hours",
            ),
        );
        let max_booking_hours = take(
            QuotaField::MaxBookingHours,
            int_in(&self.max_booking_hours, 1, MAX_BOOKING_HOURS, "hours"),
        );
        let default_priority = match Priority::parse(&self.default_priority) {
            Ok(p) => p,
            Err(e) => {
                errors.push((QuotaField::DefaultPriority, e));
                Priority::Normal
            }
        };
        let allowed_models = name_list(&self.allowed_models).unwrap_or_else(|e| {
            errors.push((QuotaField::AllowedModels, e));
            Vec::new()
        });
        let allowed_profiles = name_list(&self.allowed_profiles).unwrap_or_else(|e| {
            errors.push((QuotaField::AllowedProfiles, e));
            Vec::new()
        });
        if errors.is_empty() {
            Ok(Quota {
                max_active_bookings,
                max_gpu_memory_gib,
                max_compute_slices,
                default_priority,
                guaranteed_share_pct,
                monthly_slice_hours,
                max_booking_hours,
                allowed_models,
                allowed_profiles,
            })
        } else {
            Err(errors)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> QuotaInput {
        QuotaInput::from(&Quota::default())
    }

    #[test]
    fn default_round_trips() {
        assert_eq!(input().parse().unwrap(), Quota::default());
    }

    #[test]
    fn every_bad_field_gets_its_own_message() {
        let mut i = input();
        i.max_active_bookings = "-1".into();
        i.max_gpu_memory_gib = "lots".into();
        i.guaranteed_share_pct = "101".into();
        i.max_booking_hours = "0".into();
        i.default_priority = "urgent".into();
        let errs = i.parse().unwrap_err();
        let fields: Vec<_> = errs.iter().map(|(f, _)| f.name()).collect();
        assert_eq!(
            fields,
            [
                "max_active_bookings",
                "max_gpu_memory_gib",
                "guaranteed_share_pct",
                "max_booking_hours",
                "default_priority"
            ]
        );
        assert_eq!(errs[0].1, "may not be negative");
        assert_eq!(errs[2].1, "must be at most 100 %");
    }

    #[test]
    fn model_lists_are_split_and_deduplicated() {
        let mut i = input();
        i.allowed_models = "H100-80GB, A100-80GB H100-80GB".into();
        assert_eq!(
            i.parse().unwrap().allowed_models,
            ["H100-80GB", "A100-80GB"]
        );
        i.allowed_models = "H100;drop".into();
        assert!(i.parse().is_err());
    }
}
