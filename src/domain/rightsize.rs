//! Rightsizing: from what a booking measured (its peak GPU memory and its
//! busiest 5-minute utilisation), the smallest slice that would have served
//! it, and the part of the slice-hours that slice would have cost.

use crate::gpu::catalog::{Model, Profile};

/// Memory headroom over the measured peak (allocators grow, peaks between
/// samples are missed).
pub const HEADROOM: f64 = 1.10;

/// What a finished booking would have needed.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct Advice {
    /// Peak GPU memory used, GiB.
    pub peak_memory_gib: f64,
    /// The busiest 5-minute mean utilisation of its device, % (absent where
    /// the GPU does not measure it, e.g. MIG on A100).
    pub busy_pct: Option<f64>,
    /// The smallest MIG profile that would have done (MIG bookings).
    pub profile: Option<String>,
    /// The smallest share that would have done, GiB (time-sliced shares).
    pub memory_gib: Option<i32>,
    /// Its slice-hours over the booking's (1/3: a third of the cost).
    pub slice_hours_ratio: f64,
    /// One sentence for people.
    pub summary: String,
}

/// Compute slices a booking needed: its busiest utilisation of the slices
/// it had, at least one; all of them when utilisation is not measured.
fn needed_slices(booked: &Profile, busy_pct: Option<f64>) -> u8 {
    match busy_pct {
        Some(b) => {
            let n = (b.clamp(0.0, 100.0) / 100.0 * f64::from(booked.compute_slices)).ceil();
            (n as u8).clamp(1, booked.compute_slices)
        }
        None => booked.compute_slices,
    }
}

/// The smallest profile of `model` (fewest compute slices, then fewest
/// memory slices) with room for `peak_mib` plus headroom and the compute
/// the booking used; media engines only if the booking had them.
pub fn smallest_profile<'a>(
    model: &'a Model,
    booked: &Profile,
    peak_mib: f64,
    busy_pct: Option<f64>,
) -> Option<&'a Profile> {
    let need_mib = peak_mib.max(0.0) * HEADROOM;
    let need_slices = needed_slices(booked, busy_pct);
    model
        .profiles
        .iter()
        .filter(|p| booked.media_extensions || !p.media_extensions)
        .filter(|p| p.memory_gib * 1024.0 >= need_mib && p.compute_slices >= need_slices)
        .min_by_key(|p| (p.compute_slices, p.memory_slices, p.media_extensions))
}

/// Advice for a MIG booking, if a smaller profile would have done.
pub fn advise_mig(
    model: &Model,
    booked: &Profile,
    peak_mib: f64,
    busy_pct: Option<f64>,
) -> Option<Advice> {
    let best = smallest_profile(model, booked, peak_mib, busy_pct)?;
    // Advice is worth giving when it saves slice-hours (what tenants pay).
    if best.compute_slices >= booked.compute_slices {
        return None;
    }
    let ratio = f64::from(best.compute_slices) / f64::from(booked.compute_slices);
    Some(Advice {
        peak_memory_gib: round1(peak_mib / 1024.0),
        busy_pct: busy_pct.map(round1),
        profile: Some(best.name.clone()),
        memory_gib: None,
        slice_hours_ratio: ratio,
        summary: format!(
            "peak {:.1} GiB{}: a {} would have done, {} of the slice-hours",
            peak_mib / 1024.0,
            busy_pct
                .map(|b| format!(", {b:.0} % busy"))
                .unwrap_or_default(),
            best.name,
            fraction(best.compute_slices, booked.compute_slices)
        ),
    })
}

/// Advice for a time-sliced share, if less GPU memory would have done
/// (a share's slice-hours follow its memory).
pub fn advise_share(booked_gib: i32, gpu_memory_gib: f64, peak_mib: f64) -> Option<Advice> {
    let need = ((peak_mib.max(0.0) * HEADROOM) / 1024.0).ceil().max(1.0) as i32;
    if need >= booked_gib {
        return None;
    }
    let slices = |gib| super::booking::share_slices(gib, gpu_memory_gib);
    let (now, then) = (slices(booked_gib), slices(need));
    Some(Advice {
        peak_memory_gib: round1(peak_mib / 1024.0),
        busy_pct: None,
        profile: None,
        memory_gib: Some(need),
        slice_hours_ratio: f64::from(then) / f64::from(now.max(1)),
        summary: format!(
            "peak {:.1} GiB: a {need} GiB share would have done{}",
            peak_mib / 1024.0,
            if then < now {
                format!(", {} of the slice-hours", fraction(then as u8, now as u8))
            } else {
                String::new()
            }
        ),
    })
}

/// Slice-hours a booking of `compute_slices` for `hours` would have saved
/// at `advice`'s size.
pub fn saved_slice_hours(advice: &Advice, compute_slices: i32, hours: f64) -> f64 {
    (1.0 - advice.slice_hours_ratio).max(0.0) * f64::from(compute_slices) * hours
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// `a/b` in lowest terms (`1/3`), or a percentage when that reads better.
fn fraction(a: u8, b: u8) -> String {
    fn gcd(a: u8, b: u8) -> u8 {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    let g = gcd(a, b).max(1);
    format!("{}/{}", a / g, b / g)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::catalog;
    use proptest::prelude::*;

    #[test]
    fn a_light_job_on_a_3g_would_have_done_on_a_1g() {
        let h100 = catalog::model("H100-80GB").unwrap();
        let booked = h100.profile("3g.40gb").unwrap();
        let a = advise_mig(h100, booked, 7.1 * 1024.0, Some(12.0)).unwrap();
        assert_eq!(a.profile.as_deref(), Some("1g.10gb"));
        assert!((a.slice_hours_ratio - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(
            a.summary,
            "peak 7.1 GiB, 12 % busy: a 1g.10gb would have done, 1/3 of the slice-hours"
        );
        // A job that filled its slice gets no advice.
        assert_eq!(advise_mig(h100, booked, 38.0 * 1024.0, Some(95.0)), None);
        // Unmeasured utilisation keeps the compute: only memory may shrink.
        let whole = h100.profile("7g.80gb").unwrap();
        assert_eq!(advise_mig(h100, whole, 5.0 * 1024.0, None), None);
    }

    #[test]
    fn a_share_is_advised_by_its_peak_memory() {
        let a = advise_share(24, 48.0, 6.0 * 1024.0).unwrap();
        assert_eq!(a.memory_gib, Some(7));
        assert_eq!(advise_share(8, 48.0, 7.9 * 1024.0), None);
    }

    proptest! {
        /// On every MIG model of the catalog, for any booked profile and
        /// any measurement: the advice fits what was measured, is never
        /// bigger than what was booked, and no fitting profile is smaller.
        #[test]
        fn the_advice_is_the_smallest_fitting_profile(
            model_i in 0usize..64,
            profile_i in 0usize..64,
            peak_frac in 0.0f64..1.2,
            busy in proptest::option::of(0.0f64..100.0),
        ) {
            let models: Vec<_> = catalog::models().iter().filter(|m| m.mig_capable()).collect();
            let model = models[model_i % models.len()];
            let booked = &model.profiles[profile_i % model.profiles.len()];
            let peak_mib = peak_frac * booked.memory_gib * 1024.0;
            let fits = |p: &Profile| {
                (booked.media_extensions || !p.media_extensions)
                    && p.memory_gib * 1024.0 >= peak_mib * HEADROOM
                    && p.compute_slices >= needed_slices(booked, busy)
            };
            match smallest_profile(model, booked, peak_mib, busy) {
                Some(best) => {
                    prop_assert!(fits(best));
                    for p in model.profiles.iter().filter(|p| fits(p)) {
                        prop_assert!(
                            (best.compute_slices, best.memory_slices) <= (p.compute_slices, p.memory_slices),
                            "{} is smaller than {}", p.name, best.name
                        );
                    }
                    if let Some(a) = advise_mig(model, booked, peak_mib, busy) {
                        prop_assert!(a.slice_hours_ratio <= 1.0);
                        prop_assert_eq!(a.profile.as_deref(), Some(best.name.as_str()));
                    }
                }
                // Nothing fits only when even the booked profile would not
                // (the peak and its headroom exceed it).
                None => prop_assert!(!fits(booked) || peak_mib * HEADROOM > booked.memory_gib * 1024.0),
            }
        }
    }
}
