//! A MIG benchmark of our own: a fleet of MIG GPUs and a request stream
//! derived from the Alibaba trace, with arrivals and departures.
//!
//! Each GPU task of the trace becomes MIG requests: a fraction of a GPU maps
//! to the smallest profile whose compute share covers it (1g = 1/7 … 4g =
//! 4/7, above that 7g), a whole GPU to 7g, k GPUs to k requests of 7g.
//! Tasks arrive at their `creation_time` and leave at their
//! `deletion_time`; where the trace has no deletion time, a seeded
//! exponential duration with the trace's mean is used. Seeds shift arrival
//! order among equal times and draw the missing durations; with a jitter,
//! each pod also arrives up to that many seconds later (on its own
//! generator, so that the rest of the stream is drawn as without it). A
//! speed-up makes arrivals come faster with the same durations: heavier
//! load on the same fleet. With `advance`, that share of the tasks is booked ahead: the
//! booking is made 1–72 h (uniform, seeded) before the task's own start,
//! for the task's own window; the rest are booked when they start.
//! Requests are decided in the order they are booked. The default policy
//! keeps room for the profile mix the booking path would read at each
//! decision ([`MixSource::Recent`]) unless told to use the whole stream's.

use std::path::Path;

use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::gpu::catalog::{self, Model, Placement};
use crate::gpu::mig::Existing;
use crate::placement::mig::{
    default_mix, place, place_with_moves, stranded_slices, Booked, MigGpu, MigPolicy, Move,
    ProfileMix, Window,
};
use crate::placement::ASKED_WINDOW_DAYS;

/// One MIG request of the stream.
#[derive(Debug, Clone)]
pub struct Request {
    /// When the booking is made (its start, or 1–72 h before).
    pub booked: i64,
    pub arrive: i64,
    pub depart: i64,
    pub profile: &'static str,
}

/// The H100-80GB profile whose compute share covers `milli` of a GPU.
pub fn profile_for(milli: i64) -> &'static str {
    match milli {
        m if m * 7 <= 1000 => "1g.10gb",
        m if m * 7 <= 2000 => "2g.20gb",
        m if m * 7 <= 3000 => "3g.40gb",
        m if m * 7 <= 4000 => "4g.40gb",
        _ => "7g.80gb",
    }
}

/// Mixed into the seed for [`stream`]'s bootstrap draw.
const RESAMPLE_SALT: u64 = 0x5eed_b007;
/// Mixed into the seed for [`stream`]'s arrival shifts.
const JITTER_SALT: u64 = 0x0005_11de;

/// Reads the pod CSV and builds the request stream for `seed`, with
/// arrivals `speedup` times faster than the trace's (durations kept).
/// With `jitter_s`, each pod arrives a uniform 0 to `jitter_s` whole
/// seconds later than that, in replay time (its length kept): the same
/// trace with its arrivals moved by less than a person would notice, to
/// see whether an outcome belongs to the policy or to the stream's exact
/// timing.
pub fn stream(
    pods_csv: &Path,
    seed: u64,
    speedup: f64,
    advance: f64,
    resample: bool,
    jitter_s: u32,
) -> Result<Vec<Request>, String> {
    let text = std::fs::read_to_string(pods_csv)
        .map_err(|e| format!("cannot read {}: {e}", pods_csv.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split(',').collect();
    let col = |name: &str| {
        header
            .iter()
            .position(|h| *h == name)
            .ok_or_else(|| format!("{}: no column \"{name}\"", pods_csv.display()))
    };
    let (cn, cm, cc, cd) = (
        col("num_gpu")?,
        col("gpu_milli")?,
        col("creation_time")?,
        col("deletion_time")?,
    );
    let mut raw: Vec<(i64, Option<i64>, i64, i64)> = Vec::new();
    for line in lines.filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split(',').collect();
        let num: i64 = f.get(cn).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        if num == 0 {
            continue;
        }
        let milli: i64 = f
            .get(cm)
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(1000);
        let created: i64 = f.get(cc).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        let deleted: Option<i64> = f
            .get(cd)
            .and_then(|v| v.trim().parse().ok())
            .filter(|&d| d > created);
        // Faster arrivals, same durations: arrival times are scaled from the
        // first, each task keeps its own length.
        let length = deleted.map(|d| d - created);
        raw.push((created, length, num, milli));
    }
    if resample && !raw.is_empty() {
        // A bootstrap of the trace: as many pods, drawn with replacement,
        // each with its own arrival, length and shape. Its own generator,
        // so that the rest of the stream draws as without it.
        let mut pick = rand::rngs::StdRng::seed_from_u64(seed ^ RESAMPLE_SALT);
        raw = (0..raw.len())
            .map(|_| raw[pick.gen_range(0..raw.len())])
            .collect();
    }
    let known: Vec<i64> = raw.iter().filter_map(|r| r.1).collect();
    let first = raw.iter().map(|r| r.0).min().unwrap_or(0);
    let mean = if known.is_empty() {
        3600.0
    } else {
        known.iter().sum::<i64>() as f64 / known.len() as f64
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // The shifts on their own generator: the lengths drawn, the bookings
    // ahead and the tie-breaks stay what they are without them, so a
    // shifted stream pairs up with the plain one pod by pod.
    let mut shift = rand::rngs::StdRng::seed_from_u64(seed ^ JITTER_SALT);
    let mut out = Vec::new();
    for (created, length, num, milli) in raw {
        let created = first
            + ((created - first) as f64 / speedup) as i64
            + i64::from(shift.gen_range(0..=jitter_s));
        let depart = created
            + length.unwrap_or_else(|| {
                let u: f64 = rng.gen_range(f64::EPSILON..1.0);
                (-u.ln() * mean).max(1.0) as i64
            });
        let (profile, count) = if num == 1 {
            (profile_for(milli), 1)
        } else {
            ("7g.80gb", num)
        };
        let ahead: f64 = rng.gen();
        let booked = if ahead < advance {
            created - rng.gen_range(3600..=72 * 3600)
        } else {
            created
        };
        for _ in 0..count {
            // A random tie-break among equal arrival times, by seed.
            let tie: u32 = rng.gen();
            out.push((
                booked,
                tie,
                Request {
                    booked,
                    arrive: created,
                    depart,
                    profile,
                },
            ));
        }
    }
    out.sort_by_key(|(t, j, _)| (*t, *j));
    Ok(out.into_iter().map(|(_, _, r)| r).collect())
}

/// One policy's outcome over the stream.
#[derive(Debug, Clone, Serialize)]
pub struct MigResult {
    pub policy: String,
    pub gpus: usize,
    pub requests: usize,
    pub accepted: usize,
    pub acceptance_pct: f64,
    /// Compute slices × hours of the accepted requests: the work served.
    pub served_slice_hours: f64,
    /// The same, counted only between the stream's first and last arrival:
    /// the work done while requests were still coming, without the tail of
    /// long bookings that run on after the last one (no one competes for
    /// the fleet then).
    pub served_in_window_slice_hours: f64,
    /// `served_in_window_slice_hours` as a share of the fleet's compute
    /// slice-hours over the same window.
    pub window_busy_pct: f64,
    /// Mean over arrivals of the fleet's stranded memory slices.
    pub mean_stranded_slices: f64,
    /// Mean over refused requests of the share of the fleet's compute
    /// slices booked at the refused request's start: how full the fleet
    /// was when it said no, the limit no placement can pass.
    pub busy_pct_at_refusals: f64,
    /// Compute slices × hours of the refused requests.
    pub refused_slice_hours: f64,
    /// Refused requests that the fleet could have held had its bookings
    /// been placed otherwise: packing every booking present again, largest
    /// first, with the request added ([`run_repack`]'s move) holds them
    /// all. The refusals that were fragmentation's; the others were
    /// capacity's, decided by which requests were taken before.
    /// Counted only when asked for (`--causes`; None otherwise): it packs
    /// the fleet again at each refusal.
    pub refused_fragmented: Option<usize>,
    /// Compute slices × hours of those requests.
    pub refused_fragmented_slice_hours: Option<f64>,
    /// Scheduled bookings moved to let a request in (repacking runs only).
    pub moves: usize,
    /// The least notice a moved booking had before its start, seconds.
    pub least_notice_s: Option<i64>,
}

/// The stream's own profile mix.
fn mix_of(requests: &[Request]) -> ProfileMix {
    let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
    for r in requests {
        *counts.entry(r.profile).or_default() += 1;
    }
    ProfileMix(
        counts
            .iter()
            .map(|(p, n)| (p.to_string(), *n as f64 / requests.len().max(1) as f64))
            .collect(),
    )
}

/// The window of requests the booking path reads its profile mix from,
/// in seconds ([`ASKED_WINDOW_DAYS`]).
pub const MIX_WINDOW_S: i64 = ASKED_WINDOW_DAYS as i64 * 86_400;

/// Which profile mix the default policy keeps room for in the replay
/// (`bench mig --mix`). Each value's `--help` line is given apart: clap
/// would print the doc comment, rustdoc links and all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MixSource {
    /// What the booking path does: the profiles of the requests made in
    /// the last [`MIX_WINDOW_S`] of replay time, those that did not fit
    /// included (the booking path stores them as queued bookings), every
    /// profile equally until there are 20 ([`ProfileMix::from_counts`]).
    #[value(
        help = "the requests of the last 30 days of replay time, those that did not fit included, as the booking path reads it"
    )]
    Recent,
    /// The whole stream's requests, future ones included: a mix the live
    /// system cannot know, kept for comparison.
    #[value(help = "the whole stream's requests, future ones included, known in advance")]
    Stream,
}

/// What the requests made in the last [`MIX_WINDOW_S`] carried (a
/// profile, a duration), in the order they were made.
struct Trailing<T>(std::collections::VecDeque<(i64, T)>);

impl<T: Copy> Trailing<T> {
    fn push(&mut self, at: i64, value: T) {
        self.0.push_back((at, value));
    }

    /// Drops what was made at `now - MIX_WINDOW_S` or before (as the
    /// booking path's `created_at > now() - make_interval(days => $1)`
    /// keeps the rest), handing each dropped value to `gone`.
    fn expire(&mut self, now: i64, mut gone: impl FnMut(T)) {
        while let Some(&(at, value)) = self.0.front() {
            if at > now - MIX_WINDOW_S {
                break;
            }
            self.0.pop_front();
            gone(value);
        }
    }
}

impl<T> Default for Trailing<T> {
    fn default() -> Self {
        Trailing(Default::default())
    }
}

/// The profiles of the requests made in the last [`MIX_WINDOW_S`], kept
/// as running counts.
#[derive(Default)]
struct TrailingMix {
    made: Trailing<&'static str>,
    counts: std::collections::BTreeMap<&'static str, i64>,
}

impl TrailingMix {
    fn push(&mut self, at: i64, profile: &'static str) {
        self.made.push(at, profile);
        *self.counts.entry(profile).or_default() += 1;
    }

    /// The mix at `now`: requests made after `now - MIX_WINDOW_S`, or
    /// every profile of `model` equally while they are fewer than 20.
    fn at(&mut self, now: i64, model: &Model) -> ProfileMix {
        let counts = &mut self.counts;
        self.made.expire(now, |profile| {
            if let Some(n) = counts.get_mut(profile) {
                *n -= 1;
                if *n == 0 {
                    counts.remove(profile);
                }
            }
        });
        ProfileMix::from_counts(self.counts.iter().map(|(p, n)| (*p, *n)))
            .unwrap_or_else(|| default_mix(model))
    }
}

/// What every replay of a stream shares: the fleet's size (H100-80GB) and
/// whether refusals are split by cause ([`MigResult::refused_fragmented`]).
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub gpus: usize,
    pub causes: bool,
}

/// Replays the stream on the fleet under `policy`, keeping room for the
/// profile mix of `mix`.
pub fn run(requests: &[Request], setup: Setup, policy: MigPolicy, mix: MixSource) -> MigResult {
    replay(
        requests,
        setup,
        &policy.label(),
        mix,
        |fleet, booking, mix, _| place_on(fleet, booking, policy, mix).then_some(Vec::new()),
    )
}

/// Bookings ahead are moved no later than this before their start.
pub const MOVE_NOTICE_S: i64 = 600;

/// `policy` with repacking of bookings that have not started: when a
/// request does not fit, bookings that start more than
/// [`MOVE_NOTICE_S`] after the request is made may move to another GPU or
/// slot (same window and profile) to let it in ([`place_with_moves`]).
pub fn run_moving(
    requests: &[Request],
    setup: Setup,
    policy: MigPolicy,
    mix: MixSource,
) -> MigResult {
    let name = format!("{} + moves", policy.label());
    replay(requests, setup, &name, mix, |fleet, booking, mix, now| {
        let p = fleet.first()?.model.profile_by_id(booking.profile_id)?;
        let profile = p.name.clone();
        let (g, placement, moves) = {
            let view: &[MigGpu] = fleet;
            let movable =
                |g: usize, k: usize| view[g].bookings[k].window.start > now + MOVE_NOTICE_S;
            place_with_moves(view, &profile, None, booking.window, policy, mix, movable).ok()?
        };
        let mut notices = Vec::with_capacity(moves.len());
        // Apply: take the moved bookings out (highest index first per GPU),
        // then put them and the new one in. Nothing from here on refuses:
        // a refusal leaves the fleet as it was (its cause is read from it).
        let mut taken = moves;
        taken.sort_by_key(|m| std::cmp::Reverse((m.from_gpu, m.index)));
        let mut moved: Vec<(Booked, Move)> = Vec::new();
        for m in taken {
            let b = fleet[m.from_gpu].bookings.remove(m.index);
            notices.push(b.window.start - now);
            moved.push((b, m));
        }
        for (b, m) in moved {
            fleet[m.to_gpu].bookings.push(Booked {
                placement: m.placement,
                ..b
            });
        }
        fleet[g].bookings.push(Booked {
            placement,
            ..booking
        });
        Some(notices)
    })
}

/// A reference no placement policy can reach, to show the headroom: when a
/// request does not fit where it is, every live instance may move (as if
/// MIG instances could migrate) and the lot is packed again, largest
/// first, each on the first GPU and placement NVIDIA allows. A request is
/// refused only when that fails too (so, split by cause, every refusal of
/// the reference is capacity's).
pub fn run_repack(requests: &[Request], setup: Setup) -> MigResult {
    replay(
        requests,
        setup,
        "repack-reference",
        MixSource::Stream, // first-fit keeps room for no mix
        |fleet, booking, mix, _| {
            if place_on(fleet, booking, MigPolicy::FirstFit, mix) {
                return Some(Vec::new());
            }
            *fleet = repacked(fleet, booking, mix)?;
            Some(Vec::new())
        },
    )
}

/// An admission rule, to measure what refusing requests that fit would
/// buy (`bench mig --admit`); gpuslice does not book with it. A request
/// that fits is refused anyway when its placement takes a GPU with
/// nothing booked over its window, leaving fewer than `keep_whole` such
/// GPUs, and it is shorter than the `quantile` of the durations of the
/// requests made in the last [`MIX_WINDOW_S`] (none is refused before
/// there are 20): the room kept for a longer request that may come. It
/// judges whole-GPU requests only, or every profile with
/// `every_profile` (a request placed beside others takes no free GPU
/// and is never refused).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Admission {
    pub keep_whole: usize,
    pub quantile: f64,
    pub every_profile: bool,
}

impl Admission {
    /// From `KEEP,QUANTILE` or `KEEP,QUANTILE,all` (as `--admit` takes it).
    pub fn parse(s: &str) -> Result<Admission, String> {
        let parts: Vec<&str> = s.split(',').map(str::trim).collect();
        let (keep, quantile, every_profile) = match parts.as_slice() {
            [k, q] => (*k, *q, false),
            [k, q, "all"] => (*k, *q, true),
            _ => {
                return Err(format!(
                    "{s:?} is not KEEP,QUANTILE or KEEP,QUANTILE,all (for example 1,0.5)"
                ))
            }
        };
        let keep_whole = keep
            .parse::<usize>()
            .ok()
            .filter(|&k| k >= 1)
            .ok_or_else(|| {
                format!("the GPUs to keep free must be a whole number of at least 1, not {keep:?}")
            })?;
        let quantile = quantile
            .parse::<f64>()
            .ok()
            .filter(|q| (0.0..=1.0).contains(q))
            .ok_or_else(|| {
                format!("the quantile must be a number from 0 to 1, not {quantile:?}")
            })?;
        Ok(Admission {
            keep_whole,
            quantile,
            every_profile,
        })
    }

    /// Its name in results: "admit 1,0.5" or "admit 1,0.5,all".
    pub fn label(&self) -> String {
        let all = if self.every_profile { ",all" } else { "" };
        format!("admit {},{}{all}", self.keep_whole, self.quantile)
    }
}

/// The durations of the requests made in the last [`MIX_WINDOW_S`], kept
/// sorted.
#[derive(Default)]
struct TrailingDurations {
    made: Trailing<i64>,
    sorted: Vec<i64>,
}

impl TrailingDurations {
    fn push(&mut self, at: i64, secs: i64) {
        self.made.push(at, secs);
        let i = self.sorted.partition_point(|&d| d < secs);
        self.sorted.insert(i, secs);
    }

    /// The `q` quantile (nearest rank below) of the durations of the
    /// requests made after `now - MIX_WINDOW_S`; None while fewer than 20.
    fn quantile(&mut self, now: i64, q: f64) -> Option<i64> {
        let sorted = &mut self.sorted;
        self.made.expire(now, |secs| {
            sorted.remove(sorted.partition_point(|&d| d < secs));
        });
        let n = self.sorted.len();
        (n >= 20).then(|| self.sorted[((n - 1) as f64 * q) as usize])
    }
}

/// `policy` with an [`Admission`] rule in front of it: a request that fits
/// is placed as `policy` places it unless the rule refuses it.
pub fn run_admitting(
    requests: &[Request],
    setup: Setup,
    policy: MigPolicy,
    mix: MixSource,
    admission: Admission,
) -> MigResult {
    let name = format!("{} {}", policy.label(), admission.label());
    let mut made = TrailingDurations::default();
    replay(requests, setup, &name, mix, |fleet, booking, mix, now| {
        let secs = booking.window.len();
        let threshold = made.quantile(now, admission.quantile);
        made.push(now, secs);
        let (g, placement) = choose(fleet, booking, policy, mix)?;
        let model = fleet[g].model;
        let whole = |gpu: &MigGpu| {
            !gpu.bookings
                .iter()
                .any(|b| b.window.overlaps(booking.window))
        };
        let judged = admission.every_profile
            || model
                .profile_by_id(booking.profile_id)
                .is_some_and(|p| p.compute_slices == model.compute_slices);
        // Only a placement on a free GPU uses up the room the rule keeps.
        if judged && whole(&fleet[g]) && threshold.is_some_and(|t| secs < t) {
            let free_after = fleet.iter().filter(|gpu| whole(gpu)).count() - 1;
            if free_after < admission.keep_whole {
                return None;
            }
        }
        fleet[g].bookings.push(Booked {
            placement,
            ..booking
        });
        Some(Vec::new())
    })
}

/// The fleet packed again from scratch with `booking` added: every booking
/// present (started or not), largest first, each on the first GPU and
/// placement NVIDIA allows over its window; None when that does not hold
/// them all. The repack reference's move, and the test of whether a
/// refusal was fragmentation's.
fn repacked(fleet: &[MigGpu], booking: Booked, mix: &ProfileMix) -> Option<Vec<MigGpu>> {
    let model = fleet.first()?.model;
    let mut all: Vec<Booked> = fleet.iter().flat_map(|g| g.bookings.clone()).collect();
    all.push(booking);
    let size = |b: &Booked| {
        model
            .profile_by_id(b.profile_id)
            .map_or((0, 0), |p| (p.memory_slices, p.compute_slices))
    };
    all.sort_by_key(|b| std::cmp::Reverse(size(b)));
    let mut fresh: Vec<MigGpu> = fleet
        .iter()
        .map(|g| MigGpu {
            model: g.model,
            bookings: Vec::new(),
        })
        .collect();
    all.into_iter()
        .all(|b| place_on(&mut fresh, b, MigPolicy::FirstFit, mix))
        .then_some(fresh)
}

/// Where `policy` would place `booking` (its profile and window) on the
/// fleet: the GPU and the placement; None when it does not fit.
fn choose(
    fleet: &[MigGpu],
    booking: Booked,
    policy: MigPolicy,
    mix: &ProfileMix,
) -> Option<(usize, Placement)> {
    let p = fleet.first()?.model.profile_by_id(booking.profile_id)?;
    place(fleet, &p.name, None, booking.window, policy, mix).ok()
}

/// Places `booking` on the fleet where `policy` chooses ([`choose`]);
/// false when it does not fit.
fn place_on(fleet: &mut [MigGpu], booking: Booked, policy: MigPolicy, mix: &ProfileMix) -> bool {
    let Some((i, placement)) = choose(fleet, booking, policy, mix) else {
        return false;
    };
    fleet[i].bookings.push(Booked {
        placement,
        ..booking
    });
    true
}

/// The replay loop: in booking order, ended bookings leave, each request
/// is offered to `decide` (which places it on the fleet, returning the
/// notice each booking it moved had before its start, or refuses it with
/// None); served work, moves, stranded slices and how busy the fleet was
/// at each refusal are counted.
fn replay(
    requests: &[Request],
    Setup { gpus, causes }: Setup,
    name: &str,
    mix_source: MixSource,
    mut decide: impl FnMut(&mut Vec<MigGpu>, Booked, &ProfileMix, i64) -> Option<Vec<i64>>,
) -> MigResult {
    let model = catalog::model("H100-80GB").unwrap_or(&catalog::models()[1]);
    let mut fleet: Vec<MigGpu> = (0..gpus)
        .map(|_| MigGpu {
            model,
            bookings: Vec::new(),
        })
        .collect();
    // Stranding is measured against the stream's mix whatever the policy
    // keeps room for, so that every run is measured alike.
    let stranding_mix = mix_of(requests);
    // The booking path's mix, kept only when the policy reads it.
    let mut trailing = (mix_source == MixSource::Recent).then(TrailingMix::default);
    let mut accepted = 0;
    let mut served = 0.0;
    let mut served_in_window = 0.0;
    // From the first arrival to the last: while requests still compete.
    let arrivals = Window {
        start: requests.iter().map(|r| r.arrive).min().unwrap_or(0),
        end: requests.iter().map(|r| r.arrive).max().unwrap_or(0),
    };
    let slice_hours = |compute: u8, secs: i64| f64::from(compute) * secs as f64 / 3600.0;
    let mut stranded_sum = 0.0;
    let mut busy_sum = 0.0;
    let mut refused = 0usize;
    let mut refused_sh = 0.0;
    let mut refused_fragmented = 0usize;
    let mut refused_fragmented_sh = 0.0;
    let mut moves = 0usize;
    let mut least_notice: Option<i64> = None;
    let n = u32::try_from(gpus).unwrap_or(u32::MAX);
    let fleet_slices = (
        u32::from(model.compute_slices).saturating_mul(n),
        u32::from(model.memory_slices).saturating_mul(n),
    );
    let fleet_compute = f64::from(fleet_slices.0);
    for (k, r) in requests.iter().enumerate() {
        for g in fleet.iter_mut() {
            g.bookings.retain(|b| b.window.end > r.booked);
        }
        let window = Window {
            start: r.arrive,
            end: r.depart.max(r.arrive + 1),
        };
        if let Some(p) = model.profile(r.profile) {
            let booking = Booked {
                profile_id: p.nvml_id,
                placement: Placement {
                    start: 0,
                    size: p.memory_slices,
                },
                window,
            };
            let recent_mix = trailing.as_mut().map(|t| t.at(r.booked, model));
            let mix = recent_mix.as_ref().unwrap_or(&stranding_mix);
            let decided = decide(&mut fleet, booking, mix, r.booked);
            // Counted once decided, fitted or not, as the booking path's
            // row (scheduled or queued) is.
            if let Some(t) = trailing.as_mut() {
                t.push(r.booked, r.profile);
            }
            if let Some(notices) = decided {
                accepted += 1;
                served += slice_hours(p.compute_slices, window.len());
                served_in_window += slice_hours(p.compute_slices, window.overlap_len(arrivals));
                moves += notices.len();
                least_notice = notices.into_iter().chain(least_notice).min();
            } else {
                refused += 1;
                refused_sh += slice_hours(p.compute_slices, window.len());
                // Compute and memory slices booked at the request's start:
                // how full the fleet was, and whether packing again can help.
                let (busy, busy_memory) = fleet
                    .iter()
                    .flat_map(|g| &g.bookings)
                    .filter(|b| b.window.start <= r.arrive && r.arrive < b.window.end)
                    .filter_map(|b| model.profile_by_id(b.profile_id))
                    .fold((0u32, 0u32), |(c, m), p| {
                        (
                            c + u32::from(p.compute_slices),
                            m + u32::from(p.memory_slices),
                        )
                    });
                busy_sum += f64::from(busy) / fleet_compute;
                // Packing again cannot help where the slices at the start
                // alone are too few (most refusals under load): skip it.
                if causes
                    && busy + u32::from(p.compute_slices) <= fleet_slices.0
                    && busy_memory + u32::from(p.memory_slices) <= fleet_slices.1
                    && repacked(&fleet, booking, mix).is_some()
                {
                    refused_fragmented += 1;
                    refused_fragmented_sh += slice_hours(p.compute_slices, window.len());
                }
            }
        }
        // Sample stranding every 50 arrivals (it costs a pass over the fleet).
        if k % 50 == 0 {
            let s: u32 = fleet
                .iter()
                .map(|g| {
                    let present: Vec<Existing> = g
                        .bookings
                        .iter()
                        .map(|b| Existing {
                            profile_id: b.profile_id,
                            placement: b.placement,
                        })
                        .collect();
                    stranded_slices(model, &present, &stranding_mix)
                })
                .sum();
            stranded_sum += f64::from(s);
        }
    }
    let samples = requests.len().div_ceil(50).max(1) as f64;
    MigResult {
        policy: name.to_string(),
        gpus,
        requests: requests.len(),
        accepted,
        acceptance_pct: 100.0 * accepted as f64 / requests.len().max(1) as f64,
        served_slice_hours: served,
        served_in_window_slice_hours: served_in_window,
        window_busy_pct: {
            let capacity = fleet_compute * arrivals.len() as f64 / 3600.0;
            if capacity > 0.0 {
                100.0 * served_in_window / capacity
            } else {
                0.0
            }
        },
        mean_stranded_slices: stranded_sum / samples,
        busy_pct_at_refusals: if refused == 0 {
            0.0
        } else {
            100.0 * busy_sum / refused as f64
        },
        refused_slice_hours: refused_sh,
        refused_fragmented: causes.then_some(refused_fragmented),
        refused_fragmented_slice_hours: causes.then_some(refused_fragmented_sh),
        moves,
        least_notice_s: least_notice,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(gpus: usize, causes: bool) -> Setup {
        Setup { gpus, causes }
    }

    /// The default policy behind the admission rule `rule` on `gpus` H100s.
    fn admit(stream: &[Request], gpus: usize, rule: &str) -> MigResult {
        let rule = Admission::parse(rule).unwrap();
        run_admitting(
            stream,
            on(gpus, false),
            MigPolicy::Gpuslice,
            MixSource::Recent,
            rule,
        )
    }

    fn request(arrive: i64, hours: i64, profile: &'static str) -> Request {
        Request {
            booked: arrive,
            arrive,
            depart: arrive + hours * 3600,
            profile,
        }
    }

    #[test]
    fn served_work_counts_the_window_of_arrivals_apart_from_the_tail() {
        // Two GPUs: a 7g for 2 h from 0, a 1g for 10 h from 1 h. The
        // arrivals span one hour, in which only the 7g runs: 7 of the
        // fleet's 14 compute slice-hours.
        let stream = [request(0, 2, "7g.80gb"), request(3600, 10, "1g.10gb")];
        let r = run(
            &stream,
            on(2, false),
            MigPolicy::FirstFit,
            MixSource::Recent,
        );
        assert_eq!(r.accepted, 2);
        assert!((r.served_slice_hours - 24.0).abs() < 1e-9, "{r:?}");
        assert!((r.served_in_window_slice_hours - 7.0).abs() < 1e-9, "{r:?}");
        assert!((r.window_busy_pct - 50.0).abs() < 1e-9, "{r:?}");
    }

    #[test]
    fn refusals_are_split_into_fragmentation_and_capacity() {
        // Two H100s, everything from 0 for 10 h. First-fit puts the 1g at
        // slot 0 of GPU 0, so the first 4g (slot 0 only) goes to GPU 1 and
        // the 3g to slot 4 of GPU 0; the second 4g then finds no slot 0
        // free, though packed again (4g, 4g, 3g, 1g) the four fit: a
        // refusal of fragmentation, 40 slice-hours. The 7g fits no way
        // (15 compute slices of 14): capacity's, not counted.
        let at_once = |profiles: &[&'static str]| -> Vec<Request> {
            profiles.iter().map(|p| request(0, 10, p)).collect()
        };
        let stream = at_once(&["1g.10gb", "4g.40gb", "3g.40gb", "4g.40gb", "7g.80gb"]);
        let r = run(&stream, on(2, true), MigPolicy::FirstFit, MixSource::Recent);
        assert_eq!((r.accepted, r.refused_fragmented), (3, Some(1)), "{r:?}");
        assert_eq!(r.refused_fragmented_slice_hours, Some(40.0), "{r:?}");
        assert!((r.refused_slice_hours - 110.0).abs() < 1e-9, "{r:?}");
        // The repack reference takes the second 4g and, by its own
        // definition, never refuses what packing again would hold.
        let r = run_repack(&stream, on(2, true));
        assert_eq!((r.accepted, r.refused_fragmented), (4, Some(0)), "{r:?}");
        assert_eq!(r.refused_fragmented_slice_hours, Some(0.0));
        // Three 4g on two GPUs: 12 of 14 compute slices, room by the sums,
        // but a 4g fits only at slot 0, once per GPU: capacity's.
        let three = at_once(&["4g.40gb"; 3]);
        let r = run(&three, on(2, true), MigPolicy::FirstFit, MixSource::Recent);
        assert_eq!((r.accepted, r.refused_fragmented), (2, Some(0)), "{r:?}");
        assert_eq!(r.refused_slice_hours, 40.0, "{r:?}");
        // Not asked for, not counted (and not reported as zero).
        let r = run(
            &stream,
            on(2, false),
            MigPolicy::FirstFit,
            MixSource::Recent,
        );
        assert_eq!(
            (r.refused_fragmented, r.refused_fragmented_slice_hours),
            (None, None)
        );
    }

    #[test]
    fn an_admission_rule_refuses_short_requests_that_would_take_the_last_whole_gpus() {
        // Two H100s. A short 7g before there are 20 durations to go by;
        // twenty 1g of 10 h one after another (the median duration is then
        // 10 h); then, at once, a 7g of 1 h, a 7g of 20 h and a 1g of 1 h.
        let h = 3600;
        let mut stream = vec![request(0, 1, "7g.80gb")];
        stream.extend((1..=20).map(|i| request(i * 11 * h, 10, "1g.10gb")));
        let t = 21 * 11 * h;
        stream.extend([
            request(t, 1, "7g.80gb"),
            request(t + 1, 20, "7g.80gb"),
            request(t + 2, 1, "1g.10gb"),
        ]);
        let admitting = |rule: &str| admit(&stream, 2, rule);
        // Keep two GPUs whole: the short 7g would leave one, so it is
        // refused (7 slice-hours); the long one is not short, and the 1g is
        // not a whole-GPU request.
        let r = admitting("2,0.5");
        assert_eq!((r.accepted, r.refused_slice_hours), (23, 7.0), "{r:?}");
        assert_eq!(r.policy, "gpuslice admit 2,0.5");
        // Judging every profile: the last short 1g would take the last free
        // GPU too and is refused; the 1g of 10 h before it were placed (the
        // first nineteen had fewer than 20 durations before them, and the
        // twentieth is not shorter than their median).
        let r = admitting("2,0.5,all");
        assert_eq!((r.accepted, r.refused_slice_hours), (22, 8.0), "{r:?}");
        // Keep one: the short 7g leaves one whole GPU and is placed; the
        // 1g then finds no room at all (1 slice-hour, capacity's).
        let r = admitting("1,0.5");
        assert_eq!((r.accepted, r.refused_slice_hours), (23, 1.0), "{r:?}");
        // Without a rule the default serves what it serves keeping one.
        let plain = run(
            &stream,
            on(2, false),
            MigPolicy::Gpuslice,
            MixSource::Recent,
        );
        assert_eq!((plain.accepted, plain.refused_slice_hours), (23, 1.0));

        // One GPU, keep it free: nineteen 1g of 10 h one after another,
        // then two 7g of 1 h. The first has only nineteen durations before
        // it (its own is not one of them) and is placed; the second has
        // twenty, is shorter than their median and is refused.
        let mut stream: Vec<Request> = (0..19)
            .map(|i| request(i * 11 * h, 10, "1g.10gb"))
            .collect();
        stream.extend([
            request(19 * 11 * h, 1, "7g.80gb"),
            request(20 * 11 * h, 1, "7g.80gb"),
        ]);
        let r = admit(&stream, 1, "1,0.5");
        assert_eq!((r.accepted, r.refused_slice_hours), (20, 7.0), "{r:?}");
        // A 1g beside a booking takes no free GPU: never judged, even with
        // ",all" (a 1g of 1 h beside a 1g of 10 h, the only GPU not free).
        let mut stream: Vec<Request> = (0..20)
            .map(|i| request(i * 11 * h, 10, "1g.10gb"))
            .collect();
        stream.push(request(19 * 11 * h + 1, 1, "1g.10gb"));
        let r = admit(&stream, 1, "1,0.5,all");
        assert_eq!(r.accepted, 21, "{r:?}");
    }

    #[test]
    fn trailing_durations_are_the_last_30_days_and_none_before_20() {
        let mut d = TrailingDurations::default();
        for i in 0..19 {
            d.push(i, 100);
        }
        assert_eq!(d.quantile(19, 0.5), None, "nineteen durations");
        d.push(19, 100);
        d.push(20, 5);
        d.push(21, 5);
        // [5, 5, 100 × 20]: nearest rank below.
        assert_eq!(d.quantile(21, 0.0), Some(5));
        assert_eq!(d.quantile(21, 0.05), Some(5));
        assert_eq!(d.quantile(21, 0.1), Some(100));
        assert_eq!(d.quantile(21, 1.0), Some(100));
        // A request made exactly 30 days ago is out (as the booking path's
        // `created_at > now() - 30 days`): at 30 days and 1 s the first two
        // are gone (20 left), at 30 days and 2 s the third too (19 left).
        assert_eq!(d.quantile(MIX_WINDOW_S + 1, 0.0), Some(5));
        assert_eq!(d.quantile(MIX_WINDOW_S + 2, 0.0), None);
        assert_eq!(d.sorted, [vec![5; 2], vec![100; 17]].concat());
    }

    #[test]
    fn an_admission_rule_is_keep_and_quantile_with_every_profile_optional() {
        let a = Admission::parse("2, 0.75,all").unwrap();
        assert_eq!(
            (a.keep_whole, a.quantile, a.every_profile, a.label()),
            (2, 0.75, true, "admit 2,0.75,all".to_string())
        );
        assert_eq!(Admission::parse("1,0.5").unwrap().label(), "admit 1,0.5");
        for (bad, says) in [
            ("0,0.5", "at least 1"),
            ("x,0.5", "at least 1"),
            ("1,1.5", "from 0 to 1"),
            ("1,NaN", "from 0 to 1"),
            ("1", "KEEP,QUANTILE"),
            ("1,0.5,some", "KEEP,QUANTILE"),
            ("1,0.5,all,all", "KEEP,QUANTILE"),
        ] {
            let e = Admission::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_recent_mix_is_the_last_30_days_of_requests_and_equal_before_20() {
        let model = catalog::model("H100-80GB").expect("H100-80GB in the catalog");
        let weight = |m: &ProfileMix, name: &str| {
            m.0.iter().find(|(p, _)| p == name).map_or(0.0, |(_, w)| *w)
        };
        let equal = default_mix(model);
        let mut t = TrailingMix::default();
        for k in 0..19 {
            t.push(k, "1g.10gb");
        }
        // 19 requests: too few to say, every profile equally.
        assert_eq!(t.at(100, model).0, equal.0);
        t.push(200, "7g.80gb");
        let mixed = t.at(300, model);
        assert_eq!(mixed.0.len(), 2, "{mixed:?}");
        assert!((weight(&mixed, "1g.10gb") - 0.95).abs() < 1e-9, "{mixed:?}");
        assert!((weight(&mixed, "7g.80gb") - 0.05).abs() < 1e-9, "{mixed:?}");
        // A request made at k counts until k + 30 days, not at it (the
        // booking path's `created_at > now() - 30 days`): one second before,
        // all 20 are in; at it, the one made at 0 has left.
        assert_eq!(t.at(MIX_WINDOW_S - 1, model).0.len(), 2);
        assert_eq!(t.at(MIX_WINDOW_S, model).0, equal.0);
        // And the profiles that left are gone, not kept at zero.
        assert_eq!(t.at(MIX_WINDOW_S + 150, model).0, equal.0);
        assert_eq!(t.counts.len(), 1);
    }

    #[test]
    fn the_replay_keeps_room_only_for_what_the_booking_path_knows() {
        // Two 2g then a 3g on one H100. Three requests are too few for the
        // booking path's mix, so the 2g go where every profile loses least
        // and the 3g no longer fits; knowing the stream's mix ahead, the
        // replay would keep the 3g's slot.
        let stream = [
            request(0, 1, "2g.20gb"),
            request(60, 1, "2g.20gb"),
            request(120, 2, "3g.40gb"),
        ];
        assert_eq!(
            run(
                &stream,
                on(1, false),
                MigPolicy::Gpuslice,
                MixSource::Recent
            )
            .accepted,
            2
        );
        assert_eq!(
            run(
                &stream,
                on(1, false),
                MigPolicy::Gpuslice,
                MixSource::Stream
            )
            .accepted,
            3
        );
    }

    /// Writes a pod list with the trace's columns, one row per item, into
    /// a fresh temporary folder named by `tag`: (the folder, the list).
    /// The caller removes the folder.
    fn pod_list(
        tag: &str,
        rows: impl Iterator<Item = String>,
    ) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("gpuslice-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let pods = dir.join("pods.csv");
        let mut csv = String::from("name,num_gpu,gpu_milli,creation_time,deletion_time\n");
        for row in rows {
            csv += &row;
            csv.push('\n');
        }
        std::fs::write(&pods, csv).expect("the pod list written");
        (dir, pods)
    }

    #[test]
    fn a_resampled_stream_draws_the_traces_own_pods_with_replacement() {
        // Twelve pods, each with its own arrival, length and shape; all
        // one GPU or less, so that each pod is one request.
        let shapes = [100, 300, 500, 1000];
        let (dir, pods) = pod_list(
            "resample",
            (0..12i64).map(|i| {
                let milli = shapes[i as usize % 4];
                format!("p{i},1,{milli},{},{}", i * 600, i * 600 + 3600 * (i + 1))
            }),
        );
        let key = |r: &Request| (r.arrive, r.depart, r.profile);
        let trace: Vec<_> = stream(&pods, 1, 1.0, 0.0, false, 0)
            .expect("the trace read")
            .iter()
            .map(key)
            .collect();
        assert_eq!(trace.len(), 12);
        let draws: Vec<Vec<_>> = (1..=4)
            .map(|seed| {
                let s = stream(&pods, seed, 1.0, 0.0, true, 0).expect("a resample drawn");
                s.iter().map(key).collect()
            })
            .collect();
        for d in &draws {
            // As many requests, each one of the trace's pods as it is, in
            // arrival order.
            assert_eq!(d.len(), 12);
            assert!(d.iter().all(|r| trace.contains(r)), "{d:?}");
            assert!(d.windows(2).all(|w| w[0].0 <= w[1].0), "{d:?}");
        }
        // Drawn with replacement: some pods twice, so some left out; and
        // each seed draws its own.
        assert!(draws.iter().any(|d| {
            let mut u = d.clone();
            u.dedup();
            u.len() < 12
        }));
        assert!(draws.windows(2).any(|w| w[0] != w[1]));
        // The same seed draws the same stream.
        let again: Vec<_> = stream(&pods, 1, 1.0, 0.0, true, 0)
            .expect("a resample drawn")
            .iter()
            .map(key)
            .collect();
        assert_eq!(again, draws[0]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_jittered_stream_moves_each_pod_by_at_most_the_jitter_and_draws_the_rest_as_before() {
        // Arrivals 10 minutes apart; every third pod has no deletion time
        // (its length is drawn), every fifth asks for two GPUs.
        let (dir, pods) = pod_list(
            "jitter",
            (0..40i64).map(|i| {
                let (num, milli) = if i % 5 == 0 {
                    (2, 1000)
                } else {
                    (1, 250 + 25 * (i % 4))
                };
                let end = if i % 3 == 0 {
                    String::new()
                } else {
                    (i * 600 + 3600 + i).to_string()
                };
                format!("p{i},{num},{milli},{},{end}", i * 600)
            }),
        );
        // With bookings ahead too: their lead times must not change.
        let plain = stream(&pods, 3, 1.0, 0.3, false, 0).expect("the trace read");
        let moved = stream(&pods, 3, 1.0, 0.3, false, 60).expect("the trace read");
        assert_eq!(plain.len(), 48, "32 one-GPU pods and 8 two-GPU pods");
        // Shifts of at most 60 s cannot reorder arrivals 600 s apart, and
        // the lead times are kept: pair the two streams by arrival order.
        let by_arrival = |s: &[Request]| {
            let mut v: Vec<Request> = s.to_vec();
            v.sort_by_key(|r| r.arrive);
            v
        };
        let (plain, moved) = (by_arrival(&plain), by_arrival(&moved));
        for (p, m) in plain.iter().zip(&moved) {
            let by = m.arrive - p.arrive;
            assert!((0..=60).contains(&by), "moved by {by} s");
            assert_eq!(
                m.depart - m.arrive,
                p.depart - p.arrive,
                "the length is kept, drawn ones too"
            );
            assert_eq!(
                m.arrive - m.booked,
                p.arrive - p.booked,
                "the lead time is kept"
            );
            assert_eq!(m.profile, p.profile);
        }
        assert!(plain.iter().zip(&moved).any(|(p, m)| p.arrive != m.arrive));
        assert!(
            plain.iter().any(|r| r.booked < r.arrive),
            "some booked ahead"
        );
        // A two-GPU pod's two requests move together.
        let sevens: Vec<i64> = moved
            .iter()
            .filter(|r| r.profile == "7g.80gb")
            .map(|r| r.arrive)
            .collect();
        assert_eq!(sevens.len(), 16);
        assert!(sevens.chunks(2).all(|c| c[0] == c[1]), "{sevens:?}");
        // Another seed moves them otherwise; the same seed the same way.
        let arrivals = |seed| {
            let s = stream(&pods, seed, 1.0, 0.3, false, 60).expect("the trace read");
            by_arrival(&s).iter().map(|r| r.arrive).collect::<Vec<_>>()
        };
        assert_ne!(arrivals(4), arrivals(3));
        assert_eq!(
            arrivals(3),
            moved.iter().map(|r| r.arrive).collect::<Vec<_>>()
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
