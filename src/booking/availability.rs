//! When a request would fit, GPU by GPU, over a period: the booking form's
//! timeline and `GET /api/v1/availability`.
//!
//! A stretch `[a, b)` is reported free on a GPU only when the request fits
//! there with every booking that overlaps the whole stretch present, the
//! same conservative rule the placement engine applies to a booking's
//! window. So any booking whose window lies inside a reported stretch fits
//! on that GPU (fewer bookings overlap a shorter window, and fewer
//! instances never make a placement invalid): what the timeline shows is
//! what a booking then gets. Stretches are grown greedily from the points
//! where the GPU's bookings start or end; two adjacent stretches mean the
//! request fits in each, but one booking across both would not.

use sqlx::PgPool;

use super::decide::load_fleet;
use super::plan::{Asked, Fleet};
use crate::db::fleet::Bookable;
use crate::domain::booking::{Kind, Request};
use crate::gpu::mig;
use crate::placement::mig::Window;
use crate::placement::shares::{self, ShareShapes, SharedGpu};

/// One GPU's free stretches for a request.
#[derive(Debug, Clone)]
pub struct GpuFree {
    pub gpu: Bookable,
    pub free: Vec<Window>,
}

/// The free stretches of `what` (on `model` when given, on `allowed_models`
/// when not empty: a tenant's) within `period`, for every bookable GPU that
/// could ever take it, in node and index order.
pub async fn availability(
    pool: &PgPool,
    what: &Request,
    model: Option<&str>,
    allowed_models: &[String],
    period: Window,
) -> sqlx::Result<Vec<GpuFree>> {
    let kind = match what {
        Request::Mig { .. } => Kind::Mig,
        Request::Share { .. } => Kind::Timeslice,
    };
    // One read-only snapshot for the GPUs and their bookings; no placement
    // lock, nothing written.
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    let fleet = load_fleet(&mut tx, Some(kind), allowed_models, &Asked::default()).await?;
    tx.commit().await?;
    let (what, model) = (what.clone(), model.map(str::to_string));
    // CPU work off the async threads.
    tokio::task::spawn_blocking(move || free_stretches(&fleet, &what, model.as_deref(), period))
        .await
        .map_err(|e| sqlx::Error::Protocol(format!("availability: {e}")))
}

/// See [`availability`]; a function of its arguments.
pub fn free_stretches(
    fleet: &Fleet,
    what: &Request,
    model: Option<&str>,
    period: Window,
) -> Vec<GpuFree> {
    let mut out = Vec::new();
    if period.is_empty() {
        return out;
    }
    match what {
        Request::Mig { profile } => {
            for (i, g) in fleet.mig.gpus().iter().enumerate() {
                if model.is_some_and(|m| g.model.id != m) {
                    continue;
                }
                let Some(p) = g.model.profile(profile) else {
                    continue;
                };
                let Ok(row) = fleet.mig.row(i) else { continue };
                let edges = g
                    .bookings
                    .iter()
                    .flat_map(|b| [b.window.start, b.window.end]);
                let fits =
                    |w: Window| !mig::free_placements(g.model, &g.present(w), p.nvml_id).is_empty();
                out.push(GpuFree {
                    gpu: row.clone(),
                    free: stretches(period, edges, fits),
                });
            }
        }
        Request::Share { memory_gib, .. } => {
            let memory = f64::from(*memory_gib);
            for (i, g) in fleet.shared.gpus().iter().enumerate() {
                if model.is_some_and(|m| g.model != m) || g.memory_gib < memory {
                    continue;
                }
                let Ok(row) = fleet.shared.row(i) else {
                    continue;
                };
                let one: &[SharedGpu] = std::slice::from_ref(g);
                let shapes = ShareShapes::default();
                let edges = g.held.iter().flat_map(|h| [h.window.start, h.window.end]);
                let fits = |w: Window| shares::place_share(one, memory, None, w, &shapes).is_ok();
                out.push(GpuFree {
                    gpu: row.clone(),
                    free: stretches(period, edges, fits),
                });
            }
        }
    }
    out
}

/// Grows free stretches over `period` from the segments between `edges`
/// (the points where what is present changes), extending a stretch by the
/// next segment only while `fits` holds for the whole extended stretch.
fn stretches(
    period: Window,
    edges: impl Iterator<Item = i64>,
    fits: impl Fn(Window) -> bool,
) -> Vec<Window> {
    let mut points: Vec<i64> = edges
        .filter(|&t| t > period.start && t < period.end)
        .chain([period.start, period.end])
        .collect();
    points.sort_unstable();
    points.dedup();
    let mut out = Vec::new();
    let mut current: Option<Window> = None;
    for pair in points.windows(2) {
        let seg = Window {
            start: pair[0],
            end: pair[1],
        };
        if let Some(c) = current {
            let grown = Window {
                start: c.start,
                end: seg.end,
            };
            if fits(grown) {
                current = Some(grown);
                continue;
            }
            out.push(c);
            current = None;
        }
        if fits(seg) {
            current = Some(seg);
        }
    }
    out.extend(current);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::mig::MigGpu;

    fn w(start: i64, end: i64) -> Window {
        Window { start, end }
    }

    #[test]
    fn an_empty_gpu_is_free_all_period() {
        assert_eq!(
            stretches(w(0, 100), [].into_iter(), |_| true),
            vec![w(0, 100)]
        );
    }

    #[test]
    fn a_busy_segment_splits_the_period() {
        // Something holds [30, 60): nothing fits while any of it is present.
        let busy = w(30, 60);
        let got = stretches(w(0, 100), [30, 60].into_iter(), |x| !x.overlaps(busy));
        assert_eq!(got, vec![w(0, 30), w(60, 100)]);
    }

    #[test]
    fn adjacent_stretches_when_one_booking_could_not_span_both() {
        // Room for one of two neighbours at a time: [0, 50) and [50, 100)
        // each fit, the whole does not.
        let got = stretches(w(0, 100), [50].into_iter(), |x| x.len() <= 50);
        assert_eq!(got, vec![w(0, 50), w(50, 100)]);
    }

    fn row(id: i64) -> Bookable {
        Bookable {
            id,
            node_id: 1,
            node: "n".into(),
            idx: id as i32,
            uuid: format!("GPU-{id}"),
            model: "H100-80GB".into(),
            memory_mib: 81_920,
            mode: crate::domain::GpuMode::Mig,
            max_shares: 4,
        }
    }

    /// A MIG GPU with bookings of random profiles at valid free slots, at
    /// random windows within `[0, 1000)`.
    fn mig_gpu(asks: &[(usize, i64, i64)]) -> MigGpu {
        let model = crate::gpu::catalog::model("H100-80GB").unwrap();
        let profiles: Vec<_> = model.profiles.iter().collect();
        let mut g = MigGpu {
            model,
            bookings: Vec::new(),
        };
        for &(p, start, len) in asks {
            let p = profiles[p % profiles.len()];
            let w = Window {
                start,
                end: start + len,
            };
            if let Some(pl) = mig::free_placements(model, &g.present(w), p.nvml_id).first() {
                g.bookings.push(crate::placement::mig::Booked {
                    profile_id: p.nvml_id,
                    placement: *pl,
                    window: w,
                });
            }
        }
        g
    }

    proptest::proptest! {
        /// What the timeline shows is what a booking then gets: a window
        /// inside a reported stretch fits on that GPU (by the placement
        /// engine), and a moment outside every stretch does not.
        #[test]
        fn stretches_agree_with_the_placement_engine(
            asks in proptest::collection::vec((0usize..20, 0i64..900, 1i64..300), 0..14),
            pick in proptest::collection::vec((0.0f64..1.0, 0.0f64..1.0), 1..8),
        ) {
            let mut fleet = Fleet::default();
            fleet.mig.push(row(1), mig_gpu(&asks));
            let period = w(0, 1000);
            let what = Request::Mig { profile: "2g.20gb".into() };
            let found = free_stretches(&fleet, &what, None, period);
            proptest::prop_assert_eq!(found.len(), 1);
            let mix = crate::placement::mig::default_mix(fleet.mig.gpus()[0].model);
            let place = |x: Window| crate::placement::mig::place(
                fleet.mig.gpus(), "2g.20gb", None, x,
                crate::placement::mig::MigPolicy::Gpuslice, &mix,
            ).is_ok();
            for s in &found[0].free {
                proptest::prop_assert!(!s.is_empty());
                for &(a, b) in &pick {
                    let start = s.start + ((s.len() - 1) as f64 * a) as i64;
                    let end = start + 1 + ((s.end - start - 1) as f64 * b) as i64;
                    proptest::prop_assert!(place(w(start, end)), "{start}..{end} in {s:?}");
                }
            }
            for t in (0..1000).step_by(7) {
                if !found[0].free.iter().any(|s| s.start <= t && t < s.end) {
                    proptest::prop_assert!(!place(w(t, t + 1)), "{t} is not shown free");
                }
            }
        }
    }

    #[test]
    fn edges_outside_the_period_are_ignored() {
        let got = stretches(w(10, 20), [0, 5, 25].into_iter(), |_| true);
        assert_eq!(got, vec![w(10, 20)]);
    }
}
