//! The booking rules that need no database: what a request may ask for,
//! the quota verdict over the bookings a tenant holds, where a request fits
//! on the fleet (through the placement engine), why it waits, and the order
//! in which the queue is served. Callers read the rows; everything here is
//! a function of its arguments.

use std::collections::HashMap;

use time::{Duration, OffsetDateTime};

use super::{at, when, BookingError, Settings};
use crate::db::bookings::{Placed, Queued};
use crate::db::fleet::Bookable;
use crate::db::tenants::Tenant;
use crate::domain::booking::{self as rules, BookingRequest, Held, Kind, Request, SLICES_PER_GPU};
use crate::domain::{GpuMode, Priority, Quota};
use crate::gpu::catalog::{self, Placement};
use crate::placement::mig::{self as pmig, Booked, MigGpu, MigPolicy, ProfileMix, Refusal, Window};
use crate::placement::shares::{self, Held as ShareHeld, ShareShapes, SharedGpu};

/// The GPUs of one kind as the placement engine sees them, each paired
/// with its row: the engine answers with an index into `gpus`, and
/// [`Side::row`] turns it back into the GPU (a miss is an error, never
/// another GPU).
#[derive(Debug)]
pub struct Side<T> {
    gpus: Vec<T>,
    rows: Vec<Bookable>,
}

impl<T> Default for Side<T> {
    fn default() -> Self {
        Side {
            gpus: Vec::new(),
            rows: Vec::new(),
        }
    }
}

impl<T> Side<T> {
    pub(crate) fn push(&mut self, row: Bookable, gpu: T) {
        self.rows.push(row);
        self.gpus.push(gpu);
    }

    /// What the placement engine sees.
    pub fn gpus(&self) -> &[T] {
        &self.gpus
    }

    /// The row of the GPU the engine chose.
    pub fn row(&self, i: usize) -> Result<&Bookable, BookingError> {
        self.rows.get(i).ok_or_else(|| {
            BookingError::Internal(format!(
                "placement chose GPU {i} of {} candidates",
                self.rows.len()
            ))
        })
    }
}

/// The fleet a request may land on.
#[derive(Debug, Default)]
pub struct Fleet {
    pub mig: Side<MigGpu>,
    /// The booking id of each entry of each MIG GPU's `bookings`, in the
    /// same order (foreign instances have negative ids).
    pub mig_ids: Vec<Vec<i64>>,
    pub shared: Side<SharedGpu>,
    pub mix: ProfileMix,
    pub shapes: ShareShapes,
}

/// What tenants asked for lately: (model, profile, count) of MIG bookings
/// and (GiB, count) of shares.
#[derive(Debug, Default, Clone)]
pub struct Asked {
    pub profiles: Vec<(String, String, i64)>,
    pub shares: Vec<(i32, i64)>,
}

/// The fleet as the placement engine sees it: the bookable GPUs (of `kind`
/// only, when given, and of `allowed_models` when not empty) with their
/// placed live bookings.
pub fn fleet_of(
    gpus: Vec<Bookable>,
    placed: &[Placed],
    kind: Option<Kind>,
    allowed_models: &[String],
    asked: &Asked,
) -> Fleet {
    let mode = kind.map(Kind::gpu_mode);
    let mut by_gpu: HashMap<i64, Vec<&Placed>> = HashMap::new();
    for p in placed {
        by_gpu.entry(p.gpu_id).or_default().push(p);
    }
    let mut fleet = Fleet {
        shapes: ShareShapes::from_counts(&asked.shares),
        ..Default::default()
    };
    for g in gpus {
        if mode.is_some_and(|m| g.mode != m)
            || !(allowed_models.is_empty() || allowed_models.contains(&g.model))
        {
            continue;
        }
        let here = by_gpu.get(&g.id).map(Vec::as_slice).unwrap_or(&[]);
        match g.mode {
            GpuMode::Mig => {
                let Some(model) = catalog::model(&g.model).filter(|m| m.mig_capable()) else {
                    continue;
                };
                let (bookings, ids): (Vec<Booked>, Vec<i64>) = here
                    .iter()
                    .filter_map(|p| {
                        let profile = model.profile(p.profile.as_deref()?)?;
                        let booked = Booked {
                            profile_id: profile.nvml_id,
                            placement: Placement {
                                start: u8::try_from(p.slice_start?).ok()?,
                                size: profile.memory_slices,
                            },
                            window: Window {
                                start: p.start,
                                end: p.end,
                            },
                        };
                        Some((booked, p.id))
                    })
                    .unzip();
                fleet.mig.push(g, MigGpu { model, bookings });
                fleet.mig_ids.push(ids);
            }
            GpuMode::Timeslice => {
                let shared = SharedGpu {
                    node: g.node_id as usize,
                    model: g.model.clone(),
                    memory_gib: g.memory_mib as f64 / 1024.0,
                    max_shares: g.max_shares as u32,
                    held: here.iter().copied().map(share_held).collect(),
                };
                fleet.shared.push(g, shared);
            }
            GpuMode::Drained => {}
        }
    }
    fleet.mix = profile_mix(&asked.profiles, fleet.mig.gpus());
    fleet
}

/// A placed share as the share placement sees it: its memory over its
/// window.
pub fn share_held(p: &Placed) -> ShareHeld {
    ShareHeld {
        memory_gib: f64::from(p.memory_gib),
        exclusive: false,
        window: Window {
            start: p.start,
            end: p.end,
        },
    }
}

/// The profile mix placement keeps room for: what tenants asked for in the
/// last 30 days, once there are enough bookings to say; until then every
/// profile equally.
fn profile_mix(counts: &[(String, String, i64)], mig: &[MigGpu]) -> ProfileMix {
    ProfileMix::from_counts(counts.iter().map(|c| (c.1.as_str(), c.2))).unwrap_or_else(|| {
        mig.first()
            .map(|g| pmig::default_mix(g.model))
            .unwrap_or_default()
    })
}

/// Where a request landed.
#[derive(Debug, Clone)]
pub struct Spot {
    pub gpu: Bookable,
    /// MIG memory slices `[start, end)`; `None` for a share.
    pub slices: Option<(i32, i32)>,
    pub model: String,
    pub compute_slices: i32,
}

/// A scheduled booking to move so that a new one fits: to `gpu`, memory
/// slices `[start, end)`, same window and profile.
#[derive(Debug, Clone)]
pub struct PlannedMove {
    pub booking_id: i64,
    pub gpu: Bookable,
    pub slices: (i32, i32),
}

/// Like [`find_spot`] for a MIG request that does not fit as things stand:
/// the spot it gets when bookings in `movable` (not started, beyond the
/// notice; the caller holds their rows) move to other GPUs or slots of
/// their model, and those moves ([`pmig::place_with_moves`]).
pub fn find_spot_moving(
    fleet: &Fleet,
    req: &BookingRequest,
    window: Window,
    movable: &std::collections::HashSet<i64>,
) -> Result<Option<(Spot, Vec<PlannedMove>)>, BookingError> {
    let Request::Mig { profile } = &req.what else {
        return Ok(None);
    };
    let can_move = |g: usize, k: usize| {
        fleet
            .mig_ids
            .get(g)
            .and_then(|ids| ids.get(k))
            .is_some_and(|id| movable.contains(id))
    };
    let Ok((i, placement, moves)) = pmig::place_with_moves(
        fleet.mig.gpus(),
        profile,
        req.model.as_deref(),
        window,
        MigPolicy::Gpuslice,
        &fleet.mix,
        can_move,
    ) else {
        return Ok(None);
    };
    if moves.is_empty() {
        // The engine found room without moving (the caller asked first;
        // a changed fleet): nothing to move.
        return Ok(None);
    }
    let spot = mig_spot(fleet, profile, i, placement)?;
    let mut planned = Vec::with_capacity(moves.len());
    for m in moves {
        let booking_id = *fleet
            .mig_ids
            .get(m.from_gpu)
            .and_then(|ids| ids.get(m.index))
            .ok_or_else(|| BookingError::Internal("a planned move names no booking".into()))?;
        planned.push(PlannedMove {
            booking_id,
            gpu: fleet.mig.row(m.to_gpu)?.clone(),
            slices: (
                i32::from(m.placement.start),
                i32::from(m.placement.start + m.placement.size),
            ),
        });
    }
    Ok(Some((spot, planned)))
}

/// The spot of `profile` at `placement` on MIG GPU `i` of the fleet.
fn mig_spot(
    fleet: &Fleet,
    profile: &str,
    i: usize,
    placement: Placement,
) -> Result<Spot, BookingError> {
    let gpu = fleet.mig.row(i)?.clone();
    let model = fleet.mig.gpus()[i].model;
    let compute = model
        .profile(profile)
        .map(|p| i32::from(p.compute_slices))
        .unwrap_or(SLICES_PER_GPU);
    Ok(Spot {
        gpu,
        slices: Some((
            i32::from(placement.start),
            i32::from(placement.start + placement.size),
        )),
        model: model.id.to_string(),
        compute_slices: compute,
    })
}

/// Asks the placement engine (gpuslice policy) for a spot over `window`.
/// `Ok(Err(refusal))`: no room; `Err`: the engine's answer names no GPU.
pub fn find_spot(
    fleet: &Fleet,
    req: &BookingRequest,
    window: Window,
) -> Result<Result<Spot, Refusal>, BookingError> {
    match &req.what {
        Request::Mig { profile } => {
            let (i, placement) = match pmig::place(
                fleet.mig.gpus(),
                profile,
                req.model.as_deref(),
                window,
                MigPolicy::Gpuslice,
                &fleet.mix,
            ) {
                Ok(found) => found,
                Err(refusal) => return Ok(Err(refusal)),
            };
            Ok(Ok(mig_spot(fleet, profile, i, placement)?))
        }
        Request::Share { memory_gib, .. } => {
            let i = match shares::place_share(
                fleet.shared.gpus(),
                f64::from(*memory_gib),
                req.model.as_deref(),
                window,
                &fleet.shapes,
            ) {
                Ok(i) => i,
                Err(refusal) => return Ok(Err(refusal)),
            };
            let gpu = fleet.shared.row(i)?.clone();
            let g = &fleet.shared.gpus()[i];
            Ok(Ok(Spot {
                gpu,
                slices: None,
                model: g.model.clone(),
                compute_slices: rules::share_slices(*memory_gib, g.memory_gib),
            }))
        }
    }
}

/// What a booking counts for quota.
#[derive(Debug, Clone, PartialEq)]
pub struct Size {
    pub memory_gib: i32,
    pub compute_slices: i32,
    /// The model it is sized by, when known.
    pub model: Option<String>,
}

/// The size of a placed request.
pub fn placed_size(req: &BookingRequest, spot: &Spot) -> Size {
    let memory_gib = match &req.what {
        Request::Mig { profile } => catalog::model(&spot.model)
            .and_then(|m| m.profile(profile))
            .map(|p| p.memory_gib.ceil() as i32)
            .unwrap_or(1),
        Request::Share { memory_gib, .. } => *memory_gib,
    };
    Size {
        memory_gib,
        compute_slices: spot.compute_slices,
        model: Some(spot.model.clone()),
    }
}

/// The size a request counts for quota while it has no GPU (queued): the
/// model asked for, else the first eligible one.
pub fn unplaced_size(fleet: &Fleet, req: &BookingRequest) -> Size {
    match &req.what {
        Request::Mig { profile } => {
            let model = req
                .model
                .as_deref()
                .and_then(catalog::model)
                .or_else(|| {
                    fleet
                        .mig
                        .gpus()
                        .iter()
                        .map(|g| g.model)
                        .find(|m| m.profile(profile).is_some())
                })
                .or_else(|| {
                    catalog::models()
                        .iter()
                        .find(|m| m.profile(profile).is_some())
                });
            match model.and_then(|m| m.profile(profile).map(|p| (m, p))) {
                Some((m, p)) => Size {
                    memory_gib: p.memory_gib.ceil() as i32,
                    compute_slices: i32::from(p.compute_slices),
                    model: Some(m.id.to_string()),
                },
                None => Size {
                    memory_gib: 1,
                    compute_slices: 1,
                    model: None,
                },
            }
        }
        Request::Share { memory_gib, .. } => {
            let gpu_mem = fleet
                .shared
                .gpus()
                .iter()
                .filter(|g| req.model.as_deref().is_none_or(|m| g.model == m))
                .filter(|g| g.memory_gib >= f64::from(*memory_gib))
                .map(|g| g.memory_gib)
                .fold(f64::from(*memory_gib), f64::max);
            Size {
                memory_gib: *memory_gib,
                compute_slices: rules::share_slices(*memory_gib, gpu_mem),
                model: None,
            }
        }
    }
}

/// Some GPU of the fleet could take the request if it were empty.
pub fn ever_fits(fleet: &Fleet, req: &BookingRequest) -> bool {
    let model_ok = |m: &str| req.model.as_deref().is_none_or(|r| r == m);
    match &req.what {
        Request::Mig { profile } => fleet
            .mig
            .gpus()
            .iter()
            .any(|g| model_ok(g.model.id) && g.model.profile(profile).is_some()),
        Request::Share { memory_gib, .. } => fleet
            .shared
            .gpus()
            .iter()
            .any(|g| model_ok(&g.model) && g.memory_gib >= f64::from(*memory_gib)),
    }
}

/// Why a request waits: what, where, when, and the earliest start that
/// would fit.
pub fn queued_reason(
    req: &BookingRequest,
    refusal: &Refusal,
    start: OffsetDateTime,
    end: OffsetDateTime,
) -> String {
    let what = match &req.what {
        Request::Mig { profile } => profile.clone(),
        Request::Share { memory_gib, .. } => format!("a {memory_gib} GiB share"),
    };
    let on = match req.model.as_deref() {
        Some(m) => format!("no {m} capacity"),
        None => "no capacity on any GPU".to_string(),
    };
    let mut s = format!("{on} for {what} between {} and {}", when(start), when(end));
    if let Some(e) = refusal.earliest_start {
        s.push_str(&format!("; earliest start {}", when(at(e))));
    }
    s
}

/// The priority a request runs at: the share's own, else the tenant's
/// default.
pub fn priority_of(req: &BookingRequest, quota: &Quota) -> Priority {
    match req.what {
        Request::Share {
            priority: Some(p), ..
        } => p,
        _ => quota.default_priority,
    }
}

/// Rules that need the tenant but no capacity: length, models, profiles,
/// start time. Returns the start (now when none was asked).
pub fn check_request(
    req: &BookingRequest,
    tenant: &Tenant,
    settings: &Settings,
    now: OffsetDateTime,
) -> Result<OffsetDateTime, BookingError> {
    let q = &tenant.quota;
    let mut errors = Vec::new();
    if req.hours > q.max_booking_hours {
        errors.push((
            "hours",
            format!(
                "{} allows bookings of at most {} hours",
                tenant.slug, q.max_booking_hours
            ),
        ));
    }
    if let Some(m) = &req.model {
        if !q.allowed_models.is_empty() && !q.allowed_models.contains(m) {
            errors.push((
                "model",
                format!(
                    "{} may book only {}",
                    tenant.slug,
                    q.allowed_models.join(", ")
                ),
            ));
        }
    }
    if let Request::Mig { profile } = &req.what {
        if !q.allowed_profiles.is_empty() && !q.allowed_profiles.contains(profile) {
            errors.push((
                "profile",
                format!(
                    "{} may book only {}",
                    tenant.slug,
                    q.allowed_profiles.join(", ")
                ),
            ));
        }
    }
    let start = match req.start {
        None => now,
        Some(s) if s < now - Duration::seconds(settings.past_grace_secs) => {
            errors.push(("start", "the start is in the past".to_string()));
            now
        }
        Some(s) if s > now + Duration::days(settings.max_ahead_days) => {
            errors.push((
                "start",
                format!(
                    "bookings may start at most {} days ahead",
                    settings.max_ahead_days
                ),
            ));
            now
        }
        // On a whole second, as every booking starts (`now` is too).
        Some(s) => s.replace_nanosecond(0).unwrap_or(s).max(now),
    };
    if errors.is_empty() {
        Ok(start)
    } else {
        Err(BookingError::Invalid(errors))
    }
}

/// A month's slice-hours a tenant used or booked, beside the request:
/// `[from, to)` in Unix seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MonthUse {
    pub from: i64,
    pub to: i64,
    pub used: f64,
}

/// The quota verdict for holding `size` over `[start, end)` beside the
/// tenant's other live bookings `held` and what each month touched has used
/// (`months`, as [`rules::months_touched`] gives them). `Err` says which
/// limit and by how much.
pub fn quota_verdict(
    quota: &Quota,
    slug: &str,
    held: &[Held],
    months: &[MonthUse],
    start: i64,
    end: i64,
    size: &Size,
) -> Result<(), String> {
    let q = quota;
    let (memory_gib, compute_slices) = (size.memory_gib, size.compute_slices);
    let mut with_new = held.to_vec();
    with_new.push(Held {
        start,
        end,
        memory_gib,
        compute_slices,
    });
    let (before_n, before_mem, before_slices) = rules::peak_use(held, start, end);
    let (n, mem, slices) = rules::peak_use(&with_new, start, end);
    if n > q.max_active_bookings {
        return Err(format!(
            "quota: {before_n} of {} active bookings in use during that time ({slug})",
            q.max_active_bookings
        ));
    }
    if mem > q.max_gpu_memory_gib {
        return Err(format!(
            "quota: {before_mem} of {} GiB of GPU memory in use during that time ({slug}); this booking needs {memory_gib} GiB, {} more than is left",
            q.max_gpu_memory_gib, mem - q.max_gpu_memory_gib
        ));
    }
    if slices > q.max_compute_slices {
        return Err(format!(
            "quota: {before_slices} of {} compute slices in use during that time ({slug}); this booking needs {compute_slices}, {} more than is left",
            q.max_compute_slices, slices - q.max_compute_slices
        ));
    }
    for m in months {
        let needs = rules::slice_hours_within(compute_slices, start, end, m.from, m.to);
        if m.used + needs > f64::from(q.monthly_slice_hours) + 1e-9 {
            let month = at(m.from);
            return Err(format!(
                "budget: {:.0} of {} slice-hours used or booked in {} {} ({slug}); this booking needs {:.0} more",
                m.used,
                q.monthly_slice_hours,
                month.month(),
                month.year(),
                needs
            ));
        }
    }
    Ok(())
}

/// The order the queue is served in: highest priority first; within a
/// priority, tenants take turns — each tenant's first waiting booking
/// before anyone's second, and among those the tenant served longest ago
/// (or never) first — then oldest first (`queued` comes oldest first).
pub fn queue_order(queued: &[Queued]) -> Vec<i64> {
    let mut turns: HashMap<(u8, i64), usize> = HashMap::new();
    let mut order: Vec<(u8, usize, Option<i128>, usize, i64)> = queued
        .iter()
        .enumerate()
        .map(|(pos, q)| {
            let r = q.priority.rank();
            let turn = turns.entry((r, q.tenant_id)).or_default();
            *turn += 1;
            (
                r,
                *turn,
                q.last_placed.map(|t| t.unix_timestamp_nanos()),
                pos,
                q.id,
            )
        })
        .collect();
    order.sort();
    order.into_iter().map(|o| o.4).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn gpu(id: i64, model: &str, mode: GpuMode, memory_mib: i64) -> Bookable {
        Bookable {
            id,
            node_id: 1,
            node: "node-1".into(),
            idx: id as i32,
            uuid: format!("GPU-{id}"),
            model: model.into(),
            memory_mib,
            mode,
            max_shares: 4,
        }
    }

    fn request(what: Request, model: Option<&str>) -> BookingRequest {
        BookingRequest {
            tenant: crate::domain::Slug::parse("lab").unwrap(),
            what,
            model: model.map(str::to_string),
            start: None,
            hours: 2,
        }
    }

    const HOUR: Window = Window {
        start: 1_800_000_000,
        end: 1_800_003_600,
    };

    /// A 7g.80gb instance holding all of GPU `gpu_id` for [`HOUR`].
    fn whole_gpu_booked(gpu_id: i64) -> Placed {
        Placed {
            id: 1,
            gpu_id,
            kind: Kind::Mig,
            profile: Some("7g.80gb".into()),
            slice_start: Some(0),
            memory_gib: 80,
            start: HOUR.start,
            end: HOUR.end,
        }
    }

    #[test]
    fn a_spot_names_the_gpu_the_engine_chose() {
        // GPU 10 is full (a 7g instance), so the request lands on GPU 20.
        let gpus = vec![
            gpu(10, "H100-80GB", GpuMode::Mig, 81_559),
            gpu(20, "H100-80GB", GpuMode::Mig, 81_559),
            gpu(30, "L40S-48GB", GpuMode::Timeslice, 46_068),
        ];
        let full = whole_gpu_booked(10);
        let fleet = fleet_of(gpus, &[full], None, &[], &Asked::default());
        let req = request(
            Request::Mig {
                profile: "3g.40gb".into(),
            },
            None,
        );
        let spot = find_spot(&fleet, &req, HOUR).unwrap().unwrap();
        assert_eq!(spot.gpu.id, 20);
        assert_eq!(spot.model, "H100-80GB");
        assert_eq!(spot.compute_slices, 3);
        let share = request(
            Request::Share {
                memory_gib: 10,
                priority: None,
            },
            None,
        );
        let spot = find_spot(&fleet, &share, HOUR).unwrap().unwrap();
        assert_eq!((spot.gpu.id, spot.slices), (30, None));
    }

    #[test]
    fn a_kind_sees_only_its_gpus_and_allowed_models() {
        let gpus = vec![
            gpu(1, "H100-80GB", GpuMode::Mig, 81_559),
            gpu(2, "A100-40GB", GpuMode::Mig, 40_960),
            gpu(3, "L40S-48GB", GpuMode::Timeslice, 46_068),
            gpu(4, "L40S-48GB", GpuMode::Drained, 46_068),
        ];
        let fleet = fleet_of(
            gpus,
            &[],
            Some(Kind::Mig),
            &["A100-40GB".into()],
            &Asked::default(),
        );
        assert_eq!(fleet.mig.gpus().len(), 1);
        assert_eq!(fleet.mig.row(0).unwrap().id, 2);
        assert!(fleet.shared.gpus().is_empty());
        assert!(matches!(fleet.mig.row(1), Err(BookingError::Internal(_))));
    }

    #[test]
    fn no_room_says_why_and_when() {
        let gpus = vec![gpu(1, "H100-80GB", GpuMode::Mig, 81_559)];
        let full = whole_gpu_booked(1);
        let fleet = fleet_of(gpus, &[full], Some(Kind::Mig), &[], &Asked::default());
        let req = request(
            Request::Mig {
                profile: "1g.10gb".into(),
            },
            Some("H100-80GB"),
        );
        let refusal = find_spot(&fleet, &req, HOUR).unwrap().unwrap_err();
        assert_eq!(refusal.earliest_start, Some(HOUR.end));
        assert!(ever_fits(&fleet, &req));
        let reason = queued_reason(&req, &refusal, at(HOUR.start), at(HOUR.end));
        assert!(
            reason.starts_with("no H100-80GB capacity for 1g.10gb"),
            "{reason}"
        );
        assert!(reason.contains("earliest start"), "{reason}");
        assert_eq!(unplaced_size(&fleet, &req).compute_slices, 1);
        let never = request(
            Request::Mig {
                profile: "1g.6gb".into(),
            },
            None,
        );
        assert!(!ever_fits(&fleet, &never));
    }

    fn waiting(id: i64, tenant_id: i64, priority: Priority, last: Option<i64>) -> Queued {
        Queued {
            id,
            tenant_id,
            priority,
            last_placed: last.map(at),
        }
    }

    #[test]
    fn the_queue_takes_priority_then_turns_then_age() {
        let q = vec![
            waiting(1, 7, Priority::Normal, Some(100)),
            waiting(2, 7, Priority::Normal, Some(100)),
            waiting(3, 8, Priority::Normal, None),
            waiting(4, 9, Priority::Low, None),
            waiting(5, 9, Priority::High, Some(500)),
        ];
        // High first; then each normal tenant's first booking (tenant 8,
        // never served, before tenant 7); then tenant 7's second; low last.
        assert_eq!(queue_order(&q), vec![5, 3, 1, 2, 4]);
    }

    fn quota(max_active: i32, memory: i32, slices: i32, budget: i32) -> Quota {
        Quota {
            max_active_bookings: max_active,
            max_gpu_memory_gib: memory,
            max_compute_slices: slices,
            monthly_slice_hours: budget,
            ..Quota::default()
        }
    }

    #[test]
    fn quota_says_which_limit_and_by_how_much() {
        let held = [Held {
            start: 0,
            end: 7200,
            memory_gib: 40,
            compute_slices: 3,
        }];
        let size = Size {
            memory_gib: 40,
            compute_slices: 3,
            model: None,
        };
        let q = quota(5, 60, 100, 1000);
        let e = quota_verdict(&q, "lab", &held, &[], 3600, 7200, &size).unwrap_err();
        assert_eq!(e, "quota: 40 of 60 GiB of GPU memory in use during that time (lab); this booking needs 40 GiB, 20 more than is left");
        // After the held booking ends there is room.
        assert!(quota_verdict(&q, "lab", &held, &[], 7200, 9000, &size).is_ok());
        let month = MonthUse {
            from: 0,
            to: 30 * 86_400,
            used: 999.0,
        };
        let e = quota_verdict(
            &quota(5, 500, 100, 1000),
            "lab",
            &[],
            &[month],
            0,
            3600,
            &size,
        )
        .unwrap_err();
        assert!(e.starts_with("budget: 999 of 1000 slice-hours"), "{e}");
    }

    proptest! {
        /// The verdict admits a booking exactly when no limit is passed at
        /// any moment of its window.
        #[test]
        fn quota_admits_only_within_every_limit(
            held in proptest::collection::vec((0i64..20, 1i64..20, 1i32..40, 1i32..7), 0..8),
            start in 0i64..20,
            len in 1i64..20,
            memory in 1i32..40,
            slices in 1i32..7,
            limits in (1i32..6, 1i32..120, 1i32..20),
        ) {
            let held: Vec<Held> = held
                .into_iter()
                .map(|(s, l, m, c)| Held { start: s * 600, end: (s + l) * 600, memory_gib: m, compute_slices: c })
                .collect();
            let (start, end) = (start * 600, (start + len) * 600);
            let size = Size { memory_gib: memory, compute_slices: slices, model: None };
            let q = quota(limits.0, limits.1, limits.2, 1_000_000);
            let ok = quota_verdict(&q, "lab", &held, &[], start, end, &size).is_ok();
            // Brute force: every 10-minute step of the window.
            let fits = (start / 600..end / 600).all(|t| {
                let at = |h: &&Held| h.start <= t * 600 && t * 600 < h.end;
                let here: Vec<&Held> = held.iter().filter(at).collect();
                (here.len() as i32) < q.max_active_bookings
                    && here.iter().map(|h| h.memory_gib).sum::<i32>() + memory <= q.max_gpu_memory_gib
                    && here.iter().map(|h| h.compute_slices).sum::<i32>() + slices <= q.max_compute_slices
            });
            prop_assert_eq!(ok, fits);
        }
    }
}
