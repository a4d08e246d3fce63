//! MIG placement over time: which GPU and which memory slices a booking of
//! a MIG profile gets, so that the profile mix tenants ask for keeps fitting.
//!
//! Bookings hold a slot for a time window. A slot is free for a request only
//! if it is free for the whole window: every booking whose window overlaps
//! the request's counts as present (conservative: two of them that never
//! overlap each other are still both counted). NVIDIA's rules come from
//! [`crate::gpu::mig::check_create`].

use crate::gpu::catalog::{Model, Placement, Profile};
use crate::gpu::mig::{self, Existing};

/// A half-open time window `[start, end)` in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

impl Window {
    pub fn overlaps(self, other: Window) -> bool {
        self.start < other.end && other.start < self.end
    }

    pub fn len(self) -> i64 {
        self.end - self.start
    }

    pub fn is_empty(self) -> bool {
        self.end <= self.start
    }

    /// Seconds this window shares with `other` (0 when they do not meet).
    pub fn overlap_len(self, other: Window) -> i64 {
        (self.end.min(other.end) - self.start.max(other.start)).max(0)
    }
}

/// A booking holding a slot on a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booked {
    pub profile_id: u32,
    pub placement: Placement,
    pub window: Window,
}

/// A MIG GPU with its bookings.
#[derive(Debug, Clone)]
pub struct MigGpu {
    pub model: &'static Model,
    pub bookings: Vec<Booked>,
}

impl MigGpu {
    pub fn present(&self, w: Window) -> Vec<Existing> {
        self.bookings
            .iter()
            .filter(|b| b.window.overlaps(w))
            .map(|b| Existing {
                profile_id: b.profile_id,
                placement: b.placement,
            })
            .collect()
    }
}

/// How often each profile is asked for (weights sum to 1), by name.
#[derive(Debug, Clone, Default)]
pub struct ProfileMix(pub Vec<(String, f64)>);

impl ProfileMix {
    /// The mix of asked profiles from (name, count) pairs, once there are
    /// at least 20 asks to go by; None before.
    pub fn from_counts<'a>(counts: impl Iterator<Item = (&'a str, i64)>) -> Option<ProfileMix> {
        let mut by_profile: std::collections::BTreeMap<&str, i64> = Default::default();
        for (name, n) in counts {
            *by_profile.entry(name).or_default() += n.max(0);
        }
        let total: i64 = by_profile.values().sum();
        (total >= 20).then(|| {
            ProfileMix(
                by_profile
                    .into_iter()
                    .map(|(name, n)| (name.to_string(), n as f64 / total as f64))
                    .collect(),
            )
        })
    }
}

/// MIG placement policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigPolicy {
    /// Lowest GPU index, lowest placement: what NVIDIA's tools do by default.
    FirstFit,
    /// The GPU with the fewest free memory slices that fits; lowest placement.
    BestFit,
    /// gpuslice's default: the GPU whose bookings the new one outlasts
    /// least (an empty GPU last), then the GPU and placement that lose
    /// least of the profile mix's capacity, then the lowest index and
    /// placement (`bench mig --key ext,loss`).
    Gpuslice,
    /// Any order of the ranking terms, for comparing orders
    /// (`bench mig --key`); nothing books with it.
    Ordered(KeyOrder),
}

impl MigPolicy {
    pub const ALL: [MigPolicy; 3] = [MigPolicy::FirstFit, MigPolicy::BestFit, MigPolicy::Gpuslice];

    /// Its short name; results name an order by [`MigPolicy::label`].
    pub fn name(self) -> &'static str {
        match self {
            MigPolicy::FirstFit => "first-fit",
            MigPolicy::BestFit => "best-fit",
            MigPolicy::Gpuslice => "gpuslice",
            MigPolicy::Ordered(_) => "ordered",
        }
    }

    /// Its name in results: an order is named by its terms ("key ext,loss").
    pub fn label(self) -> String {
        match self {
            MigPolicy::Ordered(o) => format!("key {o}"),
            p => p.name().to_string(),
        }
    }
}

/// One term of a placement's ranking key, lower first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Term {
    /// How much longer the booking keeps the GPU busy: nothing where the
    /// GPU's bookings in its window run past its end, its whole window on
    /// an empty GPU.
    Extension,
    /// How long the GPU's bookings in the window run past its end: the
    /// GPU whose bookings end soonest after it first, tied at nothing with
    /// GPUs whose bookings end before it and empty GPUs.
    Overhang,
    /// The loss of the profile mix's capacity ([`mix_capacity`]).
    Loss,
    /// The GPU's free memory slices, fewest first (best-fit's).
    FewestFree,
    /// The GPU's free memory slices, most first.
    MostFree,
    /// The GPU's index.
    Index,
}

impl Term {
    const ALL: [Term; 6] = [
        Term::Extension,
        Term::Overhang,
        Term::Loss,
        Term::FewestFree,
        Term::MostFree,
        Term::Index,
    ];

    /// Its name in `bench mig --key`.
    fn name(self) -> &'static str {
        match self {
            Term::Extension => "ext",
            Term::Overhang => "overhang",
            Term::Loss => "loss",
            Term::FewestFree => "free",
            Term::MostFree => "mostfree",
            Term::Index => "idx",
        }
    }
}

/// Terms of a ranking key in order; the GPU's index and the placement's
/// first slice break what ties remain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyOrder {
    terms: [Term; KeyOrder::MAX],
    len: u8,
}

impl KeyOrder {
    /// At most this many terms: what the sweep of orders needs, and a key
    /// small enough to compare fast.
    const MAX: usize = 3;

    const fn of(terms: &[Term]) -> KeyOrder {
        let mut all = [Term::Index; KeyOrder::MAX];
        let mut i = 0;
        while i < terms.len() {
            all[i] = terms[i];
            i += 1;
        }
        KeyOrder {
            terms: all,
            len: terms.len() as u8,
        }
    }

    fn terms(&self) -> &[Term] {
        &self.terms[..usize::from(self.len)]
    }

    /// Reads "ext,loss" (names of [`Term::name`], each at most once).
    pub fn parse(s: &str) -> Result<KeyOrder, String> {
        let mut terms = Vec::new();
        for name in s.split(',').map(str::trim) {
            let t = Term::ALL
                .into_iter()
                .find(|t| t.name() == name)
                .ok_or_else(|| {
                    format!(
                        "unknown term {name:?}: the terms are {}",
                        Term::ALL.map(Term::name).join(", ")
                    )
                })?;
            if terms.contains(&t) {
                return Err(format!("{name} is named twice"));
            }
            terms.push(t);
        }
        if terms.len() > KeyOrder::MAX {
            return Err(format!(
                "at most {} terms, not {}",
                KeyOrder::MAX,
                terms.len()
            ));
        }
        Ok(KeyOrder::of(&terms))
    }
}

impl std::fmt::Display for KeyOrder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.terms().iter().map(|t| t.name()).collect();
        f.write_str(&names.join(","))
    }
}

/// The terms a ranking uses, in order. The policies' own orders are types
/// of their own, so that their decisions (the booking path's) compile to
/// their terms; an order read at run time ([`KeyOrder`]) runs the same code.
trait Terms: Copy {
    /// The terms of time alone (those GPUs in one state can differ in:
    /// their bookings' times and their index), as compact as the
    /// order allows: GPUs in one state are told apart by it.
    type TimeKey: Copy + Ord;

    fn terms(&self) -> &[Term];

    fn time_key(&self, t: GpuTimes) -> Self::TimeKey;
}

/// The default policy's order: the GPU the booking keeps busy least
/// longer (bookings that end together share a GPU and free it whole,
/// after LAVA/NILAS); of those, the least loss of the mix's capacity,
/// which also picks the slot on the GPU.
#[derive(Debug, Clone, Copy)]
struct DefaultTerms;

impl DefaultTerms {
    const TERMS: &[Term] = &[Term::Extension, Term::Loss];
}

impl Terms for DefaultTerms {
    type TimeKey = i64;

    fn terms(&self) -> &[Term] {
        DefaultTerms::TERMS
    }

    /// Its one term of time is the extension.
    fn time_key(&self, t: GpuTimes) -> i64 {
        t.extends
    }
}

/// Best-fit's: the fewest free slices.
#[derive(Debug, Clone, Copy)]
struct BestFitTerms;

impl Terms for BestFitTerms {
    type TimeKey = ();

    fn terms(&self) -> &[Term] {
        &[Term::FewestFree]
    }

    fn time_key(&self, _: GpuTimes) {}
}

impl Terms for KeyOrder {
    type TimeKey = [i64; KeyOrder::MAX];

    fn terms(&self) -> &[Term] {
        KeyOrder::terms(self)
    }

    fn time_key(&self, t: GpuTimes) -> [i64; KeyOrder::MAX] {
        let mut k = [0; KeyOrder::MAX];
        for (slot, v) in k
            .iter_mut()
            .zip(self.terms().iter().filter_map(|&term| t.value(term)))
        {
            *slot = v;
        }
        k
    }
}

/// Why a request could not be placed, and when it could start instead.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub reason: String,
    /// The earliest start (same duration) at which a slot is free, if any
    /// among the ends of existing bookings.
    pub earliest_start: Option<i64>,
}

/// A GPU state as bits: occupied memory slices, compute slices in use,
/// and how many instances of each profile id exist.
struct Bits {
    occupied: u16,
    compute: u8,
    counts: [u8; 32],
    media: bool,
}

impl Bits {
    fn of(model: &Model, present: &[Existing]) -> Bits {
        let mut b = Bits {
            occupied: 0,
            compute: 0,
            counts: [0; 32],
            media: false,
        };
        for e in present {
            b.occupied |= mask(e.placement);
            if let Some(p) = model.profile_by_id(e.profile_id) {
                // Saturating: a long window may count more bookings than
                // fit at once (each on its own time).
                b.compute = b.compute.saturating_add(p.compute_slices);
                b.media |= p.media_extensions;
            }
            if let Some(c) = b.counts.get_mut(e.profile_id as usize) {
                *c = c.saturating_add(1);
            }
        }
        b
    }
}

fn mask(p: Placement) -> u16 {
    ((1u16 << p.size) - 1) << p.start
}

/// How many more instances of `profile` fit, placing greedily from the
/// lowest placement — what repeatedly taking the first free placement of
/// [`mig::free_placements`] gives, computed on bit masks because scoring
/// runs it for every candidate of every distinct GPU state.
fn capacity(model: &Model, bits: &Bits, profile: &Profile) -> u32 {
    if profile.media_extensions && bits.media {
        return 0;
    }
    let mut occupied = bits.occupied;
    let mut compute = bits.compute;
    let mut count = bits
        .counts
        .get(profile.nvml_id as usize)
        .copied()
        .unwrap_or(0);
    let mut n = 0;
    for pl in profile.placements() {
        if count >= profile.max_count
            || u16::from(compute) + u16::from(profile.compute_slices)
                > u16::from(model.compute_slices)
        {
            break;
        }
        if occupied & mask(pl) == 0 {
            occupied |= mask(pl);
            compute += profile.compute_slices;
            count += 1;
            n += 1;
            if profile.media_extensions {
                break;
            }
        }
    }
    n
}

/// The mix-weighted capacity of a GPU state, in memory slices: how much of
/// what tenants ask for still fits.
pub fn mix_capacity(model: &Model, present: &[Existing], mix: &ProfileMix) -> f64 {
    let bits = Bits::of(model, present);
    mix.0
        .iter()
        .filter_map(|(name, w)| model.profile(name).map(|p| (p, *w)))
        .map(|(p, w)| w * f64::from(capacity(model, &bits, p) * u32::from(p.memory_slices)))
        .sum()
}

/// The MIG counterpart of FGD's measure, in memory slices: for each
/// profile of the mix, the free slices it could occupy on an empty GPU but
/// can no longer reach with any placement NVIDIA allows, weighted by how
/// often the profile is asked for. An empty GPU scores 0 (slices a profile
/// can never reach, like the eighth slice for 1g on an H100, are not
/// fragmentation); a 1g at slice 0 scores what 4g and 7g lost.
pub fn mix_fragmentation(model: &Model, present: &[Existing], mix: &ProfileMix) -> f64 {
    let taken = present.iter().fold(0u16, |m, e| m | mask(e.placement));
    mix.0
        .iter()
        .filter_map(|(name, w)| model.profile(name).map(|p| (p, *w)))
        .map(|(p, w)| {
            let ever = p.placements().fold(0u16, |m, pl| m | mask(pl));
            let now = mig::free_placements(model, present, p.nvml_id)
                .into_iter()
                .fold(0u16, |m, pl| m | mask(pl));
            w * f64::from((ever & !now & !taken).count_ones())
        })
        .sum()
}

/// Free memory slices that no placement of any profile in the mix could use
/// now: capacity stranded by fragmentation.
pub fn stranded_slices(model: &Model, present: &[Existing], mix: &ProfileMix) -> u32 {
    let mut usable = vec![false; usize::from(model.memory_slices)];
    for (name, _) in &mix.0 {
        if let Some(p) = model.profile(name) {
            for pl in mig::free_placements(model, present, p.nvml_id) {
                for s in pl.start..pl.end() {
                    usable[usize::from(s)] = true;
                }
            }
        }
    }
    let mut taken = vec![false; usize::from(model.memory_slices)];
    for e in present {
        for s in e.placement.start..e.placement.end() {
            if let Some(t) = taken.get_mut(usize::from(s)) {
                *t = true;
            }
        }
    }
    (0..usize::from(model.memory_slices))
        .filter(|&s| !taken[s] && !usable[s])
        .count() as u32
}

/// Places a booking of `profile` (on GPUs of `model` when given) for
/// `window`. Returns the GPU index and placement, or a refusal with the
/// earliest start that would fit. (Indexes the fleet first; callers that
/// decide many times on one fleet keep a [`MigFleet`].)
pub fn place(
    gpus: &[MigGpu],
    profile: &str,
    model: Option<&str>,
    window: Window,
    policy: MigPolicy,
    mix: &ProfileMix,
) -> Result<(usize, Placement), Refusal> {
    MigFleet::new(gpus).place(profile, model, window, policy, mix)
}

/// A scheduled booking moved to make room for a new one: the booking at
/// `index` in `gpus[from_gpu].bookings` goes to `placement` on `to_gpu`
/// (a GPU of the same model; possibly the same GPU, another slot), with
/// the same profile and window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from_gpu: usize,
    pub index: usize,
    pub to_gpu: usize,
    pub placement: Placement,
}

/// At most this many GPUs are tried for a plan with moves.
const MOVE_TRIES: usize = 64;

/// Places a request like [`place`]; when it does not fit as things stand,
/// moves bookings that have not started to make room. A plan empties one
/// slot for the request on one GPU: the bookings there that overlap both
/// its window and that slot, all of them `movable(gpu, index)` (the
/// caller's rule: not started, not within the notice before their start),
/// move; the GPU's other bookings stay. Each moved booking gets a new slot
/// on a GPU of the same model with the same window, largest first, by the
/// same policy (never its old slot: the request holds it now). The slot
/// must admit the request by every rule NVIDIA sets, with the GPU's other
/// bookings ([`mig::check_create`]), not only by overlap. GPUs
/// needing the fewest moves are tried first (at most [`MOVE_TRIES`]); the
/// first plan in which every moved booking fits wins. Live bookings are
/// never moved (`movable` says so).
pub fn place_with_moves(
    gpus: &[MigGpu],
    profile: &str,
    model: Option<&str>,
    window: Window,
    policy: MigPolicy,
    mix: &ProfileMix,
    movable: impl Fn(usize, usize) -> bool,
) -> Result<(usize, Placement, Vec<Move>), Refusal> {
    let refusal = match place(gpus, profile, model, window, policy, mix) {
        Ok((i, pl)) => return Ok((i, pl, Vec::new())),
        Err(r) => r,
    };
    // For each GPU, the slot for the request that the fewest moves free:
    // only movable bookings overlapping both its window and that slot
    // move; the rest stay where they are. A plan: the GPU, the request's
    // booking there, and the indices of the bookings that move.
    let mut plans: Vec<(usize, Booked, Vec<usize>)> = Vec::new();
    for (g, gpu) in gpus.iter().enumerate() {
        let Some(p) = gpu.model.profile(profile) else {
            continue;
        };
        if model.is_some_and(|m| gpu.model.id != m) {
            continue;
        }
        let overlapping: Vec<usize> = (0..gpu.bookings.len())
            .filter(|&k| gpu.bookings[k].window.overlaps(window))
            .collect();
        if !overlapping.iter().any(|&k| movable(g, k)) {
            continue;
        }
        // Every slot NVIDIA allows for the request whose overlapping
        // bookings may all move and whose remaining bookings admit it by
        // every rule (overlap, count per profile, one +me, compute).
        let best = p
            .placements()
            .filter_map(|pl| {
                let moving: Vec<usize> = overlapping
                    .iter()
                    .copied()
                    .filter(|&k| mask(gpu.bookings[k].placement) & mask(pl) != 0)
                    .collect();
                if moving.is_empty() || !moving.iter().all(|&k| movable(g, k)) {
                    return None;
                }
                let remaining: Vec<Existing> = overlapping
                    .iter()
                    .filter(|k| !moving.contains(k))
                    .map(|&k| Existing {
                        profile_id: gpu.bookings[k].profile_id,
                        placement: gpu.bookings[k].placement,
                    })
                    .collect();
                mig::check_create(gpu.model, &remaining, p.nvml_id, pl).ok()?;
                let slices: u32 = moving
                    .iter()
                    .map(|&k| u32::from(gpu.bookings[k].placement.size))
                    .sum();
                Some(((moving.len(), slices, pl.start), pl, moving))
            })
            .min_by_key(|c| c.0);
        if let Some((_, placement, moving)) = best {
            let new = Booked {
                profile_id: p.nvml_id,
                placement,
                window,
            };
            plans.push((g, new, moving));
        }
    }
    plans.sort_by_key(|(g, _, moving)| (moving.len(), *g));
    'plan: for (g, new, moving) in plans.into_iter().take(MOVE_TRIES) {
        let mut trial: Vec<MigGpu> = gpus.to_vec();
        let mut removed: Vec<(usize, Booked)> =
            moving.iter().map(|&k| (k, gpus[g].bookings[k])).collect();
        trial[g].bookings = gpus[g]
            .bookings
            .iter()
            .enumerate()
            .filter(|(k, _)| !moving.contains(k))
            .map(|(_, b)| *b)
            .collect();
        trial[g].bookings.push(new);
        let size = |b: &Booked| {
            gpus[g]
                .model
                .profile_by_id(b.profile_id)
                .map_or(0, |p| p.memory_slices)
        };
        removed.sort_by_key(|(_, b)| std::cmp::Reverse(size(b)));
        let mut moves = Vec::with_capacity(removed.len());
        for (index, b) in removed {
            let Some(bp) = gpus[g].model.profile_by_id(b.profile_id) else {
                continue 'plan;
            };
            let Ok((to, to_pl)) = place(
                &trial,
                &bp.name,
                Some(gpus[g].model.id),
                b.window,
                policy,
                mix,
            ) else {
                continue 'plan;
            };
            trial[to].bookings.push(Booked {
                placement: to_pl,
                ..b
            });
            moves.push(Move {
                from_gpu: g,
                index,
                to_gpu: to,
                placement: to_pl,
            });
        }
        return Ok((g, new.placement, moves));
    }
    Err(refusal)
}

/// One booking in the fleet's time index: its window, its GPU and its
/// instance packed as in [`key_of`].
#[derive(Debug, Clone, Copy)]
struct Entry {
    start: i64,
    end: i64,
    gpu: u32,
    item: u16,
}

/// MIG GPUs with every booking indexed by start time, so that a decision
/// reads only the bookings that can overlap its window (those starting
/// less than the longest booking before it) rather than every booking of
/// every GPU.
pub struct MigFleet<'a> {
    pub gpus: &'a [MigGpu],
    by_start: Vec<Entry>,
    longest: i64,
    /// The distinct models (by address; the catalog's are statics) and each
    /// GPU's index into them.
    models: Vec<&'static Model>,
    model_of: Vec<usize>,
}

impl<'a> MigFleet<'a> {
    pub fn new(gpus: &'a [MigGpu]) -> MigFleet<'a> {
        let mut by_start = Vec::with_capacity(gpus.iter().map(|g| g.bookings.len()).sum());
        let mut longest = 0;
        let mut models: Vec<&'static Model> = Vec::new();
        let mut model_of = Vec::with_capacity(gpus.len());
        for (i, g) in gpus.iter().enumerate() {
            let m = match models.iter().position(|m| std::ptr::eq(*m, g.model)) {
                Some(m) => m,
                None => {
                    models.push(g.model);
                    models.len() - 1
                }
            };
            model_of.push(m);
            for b in &g.bookings {
                longest = longest.max(b.window.len());
                by_start.push(Entry {
                    start: b.window.start,
                    end: b.window.end,
                    gpu: i as u32,
                    item: item_of(b),
                });
            }
        }
        by_start.sort_unstable_by_key(|e| e.start);
        MigFleet {
            gpus,
            by_start,
            longest,
            models,
            model_of,
        }
    }

    /// The bookings whose windows overlap `w`.
    fn overlapping(&self, w: Window) -> impl Iterator<Item = &Entry> {
        // A booking ends at most `longest` after it starts.
        let earliest = w.start.saturating_sub(self.longest);
        let from = self.by_start.partition_point(|e| e.start <= earliest);
        self.by_start[from..]
            .iter()
            .take_while(move |e| e.start < w.end)
            .filter(move |e| e.end > w.start)
    }

    /// See [`place`].
    pub fn place(
        &self,
        profile: &str,
        model: Option<&str>,
        window: Window,
        policy: MigPolicy,
        mix: &ProfileMix,
    ) -> Result<(usize, Placement), Refusal> {
        if window.is_empty() {
            return Err(Refusal {
                reason: "the booking window is empty".into(),
                earliest_start: None,
            });
        }
        let gpus = self.gpus;
        if let Some(found) = best_slot(self, profile, model, window, policy, mix) {
            return Ok(found);
        }
        let eligible = gpus
            .iter()
            .any(|g| model.is_none_or(|m| g.model.id == m) && g.model.profile(profile).is_some());
        if !eligible {
            return Err(Refusal {
                reason: format!(
                    "no GPU{} offers the profile {profile}",
                    model.map(|m| format!(" of model {m}")).unwrap_or_default()
                ),
                earliest_start: None,
            });
        }
        // The earliest start: on each GPU, feasibility changes only where one
        // of its own bookings ends, so try those ends per GPU and take the
        // smallest (the same answer as trying every end in the fleet, at a
        // fraction of the cost).
        let earliest = gpus
            .iter()
            .filter(|g| model.is_none_or(|m| g.model.id == m))
            .filter_map(|g| {
                let p = g.model.profile(profile)?;
                let mut ends: Vec<i64> = g
                    .bookings
                    .iter()
                    .map(|b| b.window.end)
                    .filter(|&e| e > window.start)
                    .collect();
                ends.sort_unstable();
                ends.dedup();
                ends.into_iter().find(|&start| {
                    let w = Window {
                        start,
                        end: start + window.len(),
                    };
                    !mig::free_placements(g.model, &g.present(w), p.nvml_id).is_empty()
                })
            })
            .min();
        Err(Refusal {
            reason: format!("no free slot for {profile} in the requested window"),
            earliest_start: earliest,
        })
    }
}

/// A fast hasher for state keys (two numbers): the default SipHash costs
/// more than the rest of a GPU's evaluation.
#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn write_usize(&mut self, v: usize) {
        self.0 = (self.0.rotate_left(5) ^ v as u64).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_u128(&mut self, v: u128) {
        self.0 = (self.0.rotate_left(5) ^ (v as u64) ^ ((v >> 64) as u64))
            .wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

type BuildKeyHasher = std::hash::BuildHasherDefault<KeyHasher>;

/// A GPU's model (its index in the fleet's models) and its instances in
/// the window, packed (see [`key_of`]).
type StateKey = (usize, u128);

/// A booking's instance in 12 bits: profile id and first memory slice.
fn item_of(b: &Booked) -> u16 {
    ((b.profile_id as u16 & 0xff) << 4) | u16::from(b.placement.start & 0xf)
}

/// The instances of a GPU in a window (`n` items), as one number equal for
/// equal sets, without allocating: sorted, 12 bits each, behind the count.
/// A GPU holds at most 8 (one per memory slice), but bookings that never
/// meet each other all count; beyond 8 there is no key (None).
fn key_of(items: &mut [u16; 8], n: u8) -> Option<u128> {
    let n = usize::from(n);
    if n > items.len() {
        return None;
    }
    items[..n].sort_unstable();
    Some(
        items[..n]
            .iter()
            .fold(n as u128, |k, &i| (k << 12) | u128::from(i)),
    )
}

/// Until tenants' own requests say otherwise: every profile without media
/// extensions, equally likely.
pub fn default_mix(model: &Model) -> ProfileMix {
    let names: Vec<&Profile> = model
        .profiles
        .iter()
        .filter(|p| !p.media_extensions)
        .collect();
    let w = 1.0 / names.len().max(1) as f64;
    ProfileMix(names.iter().map(|p| (p.name.clone(), w)).collect())
}

fn best_slot(
    fleet: &MigFleet,
    profile: &str,
    model: Option<&str>,
    window: Window,
    policy: MigPolicy,
    mix: &ProfileMix,
) -> Option<(usize, Placement)> {
    let gpus = fleet.gpus;
    // The requested profile on each distinct model, None where not allowed.
    let profiles: Vec<Option<&Profile>> = fleet
        .models
        .iter()
        .map(|m| {
            model
                .is_none_or(|want| m.id == want)
                .then(|| m.profile(profile))
                .flatten()
        })
        .collect();
    let profile_of = |i: usize| profiles[fleet.model_of[i]];
    match policy {
        MigPolicy::FirstFit => {
            for (i, g) in gpus.iter().enumerate() {
                let Some(p) = profile_of(i) else { continue };
                let free = mig::free_placements(g.model, &g.present(window), p.nvml_id);
                if let Some(pl) = free.first() {
                    return Some((i, *pl));
                }
            }
            None
        }
        MigPolicy::BestFit => ranked_slot(fleet, &profiles, window, BestFitTerms, mix),
        MigPolicy::Gpuslice => ranked_slot(fleet, &profiles, window, DefaultTerms, mix),
        MigPolicy::Ordered(order) => ranked_slot(fleet, &profiles, window, order, mix),
    }
}

/// The placement that ranks first by `order`, of `profiles` (the profile
/// asked for on each model of the fleet, None where not allowed).
fn ranked_slot<O: Terms>(
    fleet: &MigFleet,
    profiles: &[Option<&Profile>],
    window: Window,
    order: O,
    mix: &ProfileMix,
) -> Option<(usize, Placement)> {
    let gpus = fleet.gpus;
    let profile_of = |i: usize| profiles[fleet.model_of[i]];
    // GPUs in the same state rank alike but for how long their bookings
    // run: evaluate each distinct state once, on the GPU that ranks first.
    // The states come from the time index: only GPUs with a booking near
    // the window are looked at one by one; the rest are empty.
    let mut count = vec![0u8; gpus.len()];
    let mut items = vec![[0u16; 8]; gpus.len()];
    let mut last_end = vec![i64::MIN; gpus.len()];
    let mut touched: Vec<u32> = Vec::new();
    for e in fleet.overlapping(window) {
        let g = e.gpu as usize;
        let c = count[g];
        if c == 0 {
            touched.push(e.gpu);
        }
        last_end[g] = last_end[g].max(e.end);
        if let Some(slot) = items[g].get_mut(usize::from(c)) {
            *slot = e.item;
        }
        count[g] = c.saturating_add(1);
    }
    // What sets GPUs in one state apart: how much longer the booking keeps
    // each busy, how long its bookings outlast it, its index.
    let times = |g: usize| GpuTimes {
        extends: extension(last_end[g], window),
        overhang: overhang(last_end[g], window),
        index: g,
    };
    // Of GPUs in one state, the one the order ranks first.
    let mut first_of: std::collections::HashMap<StateKey, (O::TimeKey, usize), BuildKeyHasher> =
        std::collections::HashMap::default();
    let mut representatives: Vec<usize> = Vec::new();
    for &g in &touched {
        let g = g as usize;
        if profile_of(g).is_none() {
            continue;
        }
        match key_of(&mut items[g], count[g]) {
            Some(key) => {
                let this = (order.time_key(times(g)), g);
                let first = first_of.entry((fleet.model_of[g], key)).or_insert(this);
                if this < *first {
                    *first = this;
                }
            }
            // Too many to key: evaluated on its own (on the models in the
            // catalogue it is full anyway, since the compute slices of all
            // bookings overlapping the window are counted together and
            // nine bookings hold at least nine, more than any GPU has).
            None => representatives.push(g),
        }
    }
    representatives.extend(first_of.into_values().map(|(_, g)| g));
    // The empty state: the first GPU of each model with nothing near.
    let mut empty_found = vec![false; fleet.models.len()];
    let mut left = profiles.iter().filter(|p| p.is_some()).count();
    for (g, &c) in count.iter().enumerate() {
        if left == 0 {
            break;
        }
        let m = fleet.model_of[g];
        if c == 0 && profiles[m].is_some() && !empty_found[m] {
            empty_found[m] = true;
            left -= 1;
            representatives.push(g);
        }
    }

    representatives
        .into_iter()
        .filter_map(|i| rank(&gpus[i], profile_of(i)?, window, order, mix, times(i)))
        .min_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal))
        .map(|(_, i, pl)| (i, pl))
}

/// A ranking key, lower first: the order's terms (the rest 0), then the
/// GPU's index.
type Key = ([f64; KeyOrder::MAX], usize);

/// A ranking key with the placement's first slice, the GPU and the
/// placement.
type Ranked = ((Key, u8), usize, Placement);

/// How much longer a booking of `window` keeps a GPU busy whose bookings
/// in that window end at `last_end` at the latest (`i64::MIN`: none):
/// nothing where they already run past its end.
fn extension(last_end: i64, window: Window) -> i64 {
    window.end - last_end.clamp(window.start, window.end)
}

/// How long the bookings of a GPU (in the window, ending at `last_end` at
/// the latest) outlast a booking of `window`: nothing where none do.
fn overhang(last_end: i64, window: Window) -> i64 {
    last_end.saturating_sub(window.end).max(0)
}

/// What the terms of time are for one GPU and window.
#[derive(Debug, Clone, Copy)]
struct GpuTimes {
    extends: i64,
    overhang: i64,
    index: usize,
}

impl GpuTimes {
    /// A term of time's value; None for the terms of a GPU's state.
    fn value(self, term: Term) -> Option<i64> {
        match term {
            Term::Extension => Some(self.extends),
            Term::Overhang => Some(self.overhang),
            Term::Index => Some(self.index as i64),
            Term::Loss | Term::FewestFree | Term::MostFree => None,
        }
    }
}

/// The best placement of `p` on GPU `times.index` by `order`, with its key.
fn rank(
    g: &MigGpu,
    p: &Profile,
    window: Window,
    order: impl Terms,
    mix: &ProfileMix,
    times: GpuTimes,
) -> Option<Ranked> {
    let present = g.present(window);
    let free = mig::free_placements(g.model, &present, p.nvml_id);
    let terms = order.terms();
    // Summed wide: a long window can overlap many bookings.
    let used: u32 = present.iter().map(|e| u32::from(e.placement.size)).sum();
    let free_slices = f64::from(u32::from(g.model.memory_slices).saturating_sub(used));
    // The mix's capacity only where the order asks for the loss: it is
    // most of the work.
    let before = terms
        .contains(&Term::Loss)
        .then(|| mix_capacity(g.model, &present, mix));
    // Every term but the loss is the GPU's: set once, the loss per slot.
    let mut base = [0.0; KeyOrder::MAX];
    let mut loss_at = None;
    for (at, (slot, &t)) in base.iter_mut().zip(terms).enumerate() {
        *slot = match t {
            Term::FewestFree => free_slices,
            Term::MostFree => -free_slices,
            Term::Loss => {
                loss_at = Some(at);
                0.0
            }
            Term::Extension | Term::Overhang | Term::Index => {
                times.value(t).map_or(0.0, |v| v as f64)
            }
        };
    }
    let mut best: Option<Ranked> = None;
    for pl in free {
        let mut k = base;
        if let (Some(at), Some(before)) = (loss_at, before) {
            let mut after = present.clone();
            after.push(Existing {
                profile_id: p.nvml_id,
                placement: pl,
            });
            k[at] = before - mix_capacity(g.model, &after, mix);
        }
        let key = ((k, times.index), pl.start);
        if best.as_ref().is_none_or(|b| key < b.0) {
            best = Some((key, times.index, pl));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::catalog::model;
    use proptest::prelude::*;

    fn h100s(n: usize) -> Vec<MigGpu> {
        (0..n)
            .map(|_| MigGpu {
                model: model("H100-80GB").unwrap(),
                bookings: Vec::new(),
            })
            .collect()
    }

    fn mix() -> ProfileMix {
        ProfileMix(vec![
            ("1g.10gb".into(), 0.5),
            ("2g.20gb".into(), 0.2),
            ("3g.40gb".into(), 0.2),
            ("4g.40gb".into(), 0.05),
            ("7g.80gb".into(), 0.05),
        ])
    }

    const W: Window = Window {
        start: 0,
        end: 3600,
    };

    fn book(
        gpus: &mut [MigGpu],
        profile: &str,
        w: Window,
        policy: MigPolicy,
    ) -> Result<(usize, Placement), Refusal> {
        let r = place(gpus, profile, None, w, policy, &mix())?;
        let pid = gpus[r.0].model.profile(profile).unwrap().nvml_id;
        gpus[r.0].bookings.push(Booked {
            profile_id: pid,
            placement: r.1,
            window: w,
        });
        Ok(r)
    }

    #[test]
    fn overlap_len_counts_only_the_shared_seconds() {
        let w = |start, end| Window { start, end };
        assert_eq!(w(0, 10).overlap_len(w(5, 20)), 5);
        assert_eq!(w(5, 20).overlap_len(w(0, 10)), 5);
        assert_eq!(w(2, 4).overlap_len(w(0, 10)), 2);
        assert_eq!(w(0, 10).overlap_len(w(10, 20)), 0);
        assert_eq!(w(30, 40).overlap_len(w(0, 10)), 0);
    }

    #[test]
    fn the_default_keeps_the_4g_slot_free() {
        // A 1g first: first-fit takes slice 0 and kills the 4g slot.
        let mut g = h100s(1);
        assert_eq!(
            book(&mut g, "1g.10gb", W, MigPolicy::FirstFit).unwrap().1,
            Placement { start: 0, size: 1 }
        );
        assert!(book(&mut g, "4g.40gb", W, MigPolicy::FirstFit).is_err());
        let mut g = h100s(1);
        let (_, p) = book(&mut g, "1g.10gb", W, MigPolicy::Gpuslice).unwrap();
        assert!(p.start >= 4, "{p:?}");
        assert!(book(&mut g, "4g.40gb", W, MigPolicy::Gpuslice).is_ok());
    }

    #[test]
    fn the_default_goes_where_it_keeps_a_gpu_busy_least_longer() {
        let hours = |a: i64, b: i64| Window {
            start: a * 3600,
            end: b * 3600,
        };
        // Two H100s in the same state (one 1g, at the same slot), but GPU
        // 0's 1g ends at 2 h and GPU 1's at 10 h; where a 1g for `w` goes.
        let gpu_for = |w: Window, policy: MigPolicy| {
            let mut g = h100s(2);
            for (gpu, end) in [(0, 2), (1, 10)] {
                book(
                    &mut g[gpu..=gpu],
                    "1g.10gb",
                    hours(0, end),
                    MigPolicy::FirstFit,
                )
                .unwrap();
            }
            book(&mut g, "1g.10gb", w, policy).unwrap().0
        };
        // A 1g for 0-5 h would keep GPU 0 busy 3 h longer; GPU 1 is busy
        // past its end anyway, so the default puts it there.
        assert_eq!(gpu_for(hours(0, 5), MigPolicy::Gpuslice), 1);
        // Best-fit does not look at ends: equally full, the lowest index.
        assert_eq!(gpu_for(hours(0, 5), MigPolicy::BestFit), 0);
        // A 1g for 0-1 h extends neither: the lowest index.
        assert_eq!(gpu_for(hours(0, 1), MigPolicy::Gpuslice), 0);
    }

    #[test]
    fn key_orders_read_their_terms_and_refuse_others() {
        let o = KeyOrder::parse("ext, loss").unwrap();
        assert_eq!(o, KeyOrder::of(DefaultTerms::TERMS));
        assert_eq!(MigPolicy::Ordered(o).label(), "key ext,loss");
        for order in ["overhang,free,idx", "mostfree", "loss,ext"] {
            assert_eq!(KeyOrder::parse(order).unwrap().to_string(), order);
        }
        assert_eq!(
            KeyOrder::parse("ext,loss,free,idx").unwrap_err(),
            "at most 3 terms, not 4"
        );
        let e = KeyOrder::parse("ext,fullest").unwrap_err();
        assert!(e.contains("\"fullest\"") && e.contains("mostfree"), "{e}");
        assert_eq!(
            KeyOrder::parse("loss,ext,loss").unwrap_err(),
            "loss is named twice"
        );
        assert!(KeyOrder::parse("").is_err());
    }

    #[test]
    fn how_much_longer_comes_before_the_mix_loss() {
        let hours = |a: i64, b: i64| Window {
            start: a * 3600,
            end: b * 3600,
        };
        // GPU 0 holds a 1g at slot 4 until 10 h: a 3g for 0-5 h fits only
        // at slots 0-3 there and takes all the room left (for a 4g, 2gs
        // and 1gs). GPU 1 holds a 1g at slot 0 until 2 h: the 3g fits only
        // at 4-7 and leaves slots 1-3 for a 2g or 1gs, so the mix loses
        // less there, but it would keep GPU 1 busy 3 h longer.
        let mut g = h100s(2);
        let three_g = g[0].model.profile("3g.40gb").unwrap();
        let one_g = g[0].model.profile("1g.10gb").unwrap();
        for (gpu, slot, end) in [(0, 4, 10), (1, 0, 2)] {
            g[gpu].bookings.push(Booked {
                profile_id: one_g.nvml_id,
                placement: Placement {
                    start: slot,
                    size: 1,
                },
                window: hours(0, end),
            });
        }
        let loss = |gpu: &MigGpu, at: u8| {
            let present = gpu.present(hours(0, 5));
            let mut after = present.clone();
            after.push(Existing {
                profile_id: three_g.nvml_id,
                placement: Placement { start: at, size: 4 },
            });
            mix_capacity(gpu.model, &present, &mix()) - mix_capacity(gpu.model, &after, &mix())
        };
        assert!(
            loss(&g[1], 4) < loss(&g[0], 0),
            "GPU 1 loses less of the mix"
        );
        assert_eq!(
            book(&mut g, "3g.40gb", hours(0, 5), MigPolicy::Gpuslice).unwrap(),
            (0, Placement { start: 0, size: 4 }),
            "the default goes where the booking ends inside the GPU's busy time"
        );
    }

    #[test]
    fn time_windows_free_slots_and_refusals_offer_the_earliest_start() {
        let mut g = h100s(1);
        book(&mut g, "7g.80gb", W, MigPolicy::Gpuslice).unwrap();
        // Overlapping: refused, with the earliest start at the end of the 7g.
        let r = book(
            &mut g,
            "3g.40gb",
            Window {
                start: 1800,
                end: 5400,
            },
            MigPolicy::Gpuslice,
        )
        .unwrap_err();
        assert_eq!(r.earliest_start, Some(3600));
        // After it: free.
        assert!(book(
            &mut g,
            "3g.40gb",
            Window {
                start: 3600,
                end: 7200
            },
            MigPolicy::Gpuslice
        )
        .is_ok());
        let r = place(&g, "9g.90gb", None, W, MigPolicy::Gpuslice, &mix()).unwrap_err();
        assert!(r.reason.contains("no GPU offers the profile 9g.90gb"));
        let empty = Window {
            start: 600,
            end: 600,
        };
        for policy in MigPolicy::ALL {
            let r = place(&g, "1g.10gb", None, empty, policy, &mix()).unwrap_err();
            assert_eq!(r.reason, "the booking window is empty");
        }
    }

    #[test]
    fn stranded_slices_count_what_no_profile_can_use() {
        let m = model("H100-80GB").unwrap();
        let at = |name: &str, start| Existing {
            profile_id: m.profile(name).unwrap().nvml_id,
            placement: Placement {
                start,
                size: m.profile(name).unwrap().memory_slices,
            },
        };
        // 1g at 2 and 5: only 1g profiles fit the rest; slice 7 is stranded.
        let present = vec![at("1g.10gb", 2), at("1g.10gb", 5)];
        assert_eq!(stranded_slices(m, &present, &mix()), 1);
        let only_big = ProfileMix(vec![("4g.40gb".into(), 1.0)]);
        assert_eq!(
            stranded_slices(m, &present, &only_big),
            6,
            "no 4g fits: all six free slices are stranded"
        );
    }

    #[test]
    fn mix_fragmentation_counts_what_the_asked_profiles_lost() {
        let m = model("H100-80GB").unwrap();
        let at = |name: &str, start| Existing {
            profile_id: m.profile(name).unwrap().nvml_id,
            placement: Placement {
                start,
                size: m.profile(name).unwrap().memory_slices,
            },
        };
        let half = ProfileMix(vec![("4g.40gb".into(), 0.5), ("1g.10gb".into(), 0.5)]);
        assert_eq!(
            mix_fragmentation(m, &[], &half),
            0.0,
            "an empty GPU loses nothing"
        );
        // 1g at slice 0: 4g (only at slice 0) lost slices 1-3; 1g lost none.
        assert_eq!(mix_fragmentation(m, &[at("1g.10gb", 0)], &half), 1.5);
        // 1g at slice 6 instead: 4g still fits at 0, 1g still reaches the rest.
        assert_eq!(mix_fragmentation(m, &[at("1g.10gb", 6)], &half), 0.0);
    }

    proptest! {
        /// The bit-mask capacity equals taking the first free placement of
        /// NVIDIA's rules again and again.
        #[test]
        fn bit_capacity_matches_the_rule_book(ops in proptest::collection::vec((0usize..7, 0u8..8), 0..12)) {
            let m = model("H100-80GB").unwrap();
            let mut present: Vec<Existing> = Vec::new();
            for (pi, start) in ops {
                let p = &m.profiles[pi];
                let pl = Placement { start, size: p.memory_slices };
                if mig::check_create(m, &present, p.nvml_id, pl).is_ok() {
                    present.push(Existing { profile_id: p.nvml_id, placement: pl });
                }
            }
            for p in &m.profiles {
                let mut ex = present.clone();
                let mut slow = 0;
                while let Some(pl) = mig::free_placements(m, &ex, p.nvml_id).first().copied() {
                    ex.push(Existing { profile_id: p.nvml_id, placement: pl });
                    slow += 1;
                }
                prop_assert_eq!(capacity(m, &Bits::of(m, &present), p), slow, "{}", p.name);
            }
        }

        /// Whatever arrives, a returned placement is one NVIDIA allows and
        /// never overlaps a booking that overlaps it in time.
        #[test]
        fn placements_are_valid_in_space_and_time(reqs in proptest::collection::vec((0usize..5, 0i64..10, 1i64..5, 0usize..3), 1..60)) {
            let names = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"];
            let mut gpus = h100s(3);
            for (pi, start, len, pol) in reqs {
                let w = Window { start: start * 600, end: (start + len) * 600 };
                let _ = book(&mut gpus, names[pi], w, MigPolicy::ALL[pol]);
            }
            for g in &gpus {
                for (i, a) in g.bookings.iter().enumerate() {
                    let p = g.model.profile_by_id(a.profile_id).unwrap();
                    prop_assert!(p.allows(a.placement));
                    for b in &g.bookings[i + 1..] {
                        prop_assert!(!(a.window.overlaps(b.window) && a.placement.overlaps(b.placement)));
                    }
                }
            }
        }

        /// A refusal happens only when an exhaustive search of every GPU and
        /// placement also finds nothing.
        #[test]
        fn refusals_are_real(reqs in proptest::collection::vec((0usize..5, 0usize..3), 1..30)) {
            let names = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"];
            let mut gpus = h100s(2);
            for (pi, pol) in reqs {
                if book(&mut gpus, names[pi], W, MigPolicy::ALL[pol]).is_err() {
                    let p = gpus[0].model.profile(names[pi]).unwrap();
                    for g in &gpus {
                        let present = g.present(W);
                        for pl in p.placements() {
                            prop_assert!(mig::check_create(g.model, &present, p.nvml_id, pl).is_err());
                        }
                    }
                }
            }
        }
    }

    proptest! {
        // Twins that differ only in time come up in a few of the cases:
        // enough of them that an indexed decision which tells them apart
        // wrongly fails every run.
        #![proptest_config(ProptestConfig::with_cases(1024))]

        /// The indexed decision (each distinct state once, found through the
        /// time index) is the one scoring every GPU one by one would make.
        #[test]
        fn indexed_decision_equals_scoring_every_gpu(
            booked in proptest::collection::vec((0usize..8, 0usize..5, 0i64..20, 1i64..12), 0..60),
            req in (0usize..5, 0i64..20, 1i64..6, 0usize..5, proptest::bool::ANY),
            twin_later in proptest::collection::vec(0i64..8, 3),
        ) {
            let names = ["1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"];
            let a100 = model("A100-40GB").unwrap();
            let mut gpus = h100s(8);
            for g in gpus.iter_mut().skip(5) {
                g.model = a100;
            }
            for (gi, pi, start, len) in booked {
                let w = Window { start: start * 600, end: (start + len) * 600 };
                let g = &mut gpus[gi];
                let Some(p) = g.model.profile(names[pi]).or_else(|| g.model.profiles.first()) else { continue };
                if let Some(pl) = mig::free_placements(g.model, &g.present(w), p.nvml_id).first() {
                    g.bookings.push(Booked { profile_id: p.nvml_id, placement: *pl, window: w });
                }
            }
            // Twins: GPUs 1, 2 and 4 hold GPU 0's (2 and 4: 3's) bookings,
            // each ending the same time later, so that GPUs of one state
            // that differ only in time (what the indexed decision tells
            // apart without scoring them) are common.
            for (twin, (of, later)) in [1, 2, 4].into_iter().zip([0, 3, 3].into_iter().zip(twin_later)) {
                let mut bookings = gpus[of].bookings.clone();
                for b in &mut bookings {
                    b.window.end += later * 600;
                }
                gpus[twin].bookings = bookings;
            }
            let (pi, start, len, pol, only_h100) = req;
            let w = Window { start: start * 600, end: (start + len) * 600 };
            // The three policies and two orders whose terms of time the
            // default's lacks (the overhang, the index before the loss).
            let policy = [
                MigPolicy::FirstFit,
                MigPolicy::BestFit,
                MigPolicy::Gpuslice,
                MigPolicy::Ordered(KeyOrder::parse("overhang,mostfree,loss").unwrap()),
                MigPolicy::Ordered(KeyOrder::parse("free,idx,ext").unwrap()),
            ][pol];
            let want_model = only_h100.then_some("H100-80GB");
            let got = place(&gpus, names[pi], want_model, w, policy, &mix()).ok();
            let brute = gpus
                .iter()
                .enumerate()
                .filter(|(_, g)| want_model.is_none_or(|m| g.model.id == m))
                .filter_map(|(i, g)| {
                    let p = g.model.profile(names[pi])?;
                    let present = g.present(w);
                    let free = mig::free_placements(g.model, &present, p.nvml_id);
                    // The terms of time from the GPU's own bookings (the
                    // fast path reads them off the time index).
                    let last_end = g.bookings.iter().filter(|b| b.window.overlaps(w)).map(|b| b.window.end).max();
                    let last_end = last_end.unwrap_or(i64::MIN);
                    // The policies' keys written out by hand, apart from
                    // the ranking code; an order through it.
                    let ranked = |k: [f64; KeyOrder::MAX], pl: Placement| (((k, i), pl.start), i, pl);
                    match policy {
                        MigPolicy::FirstFit => free.first().map(|&pl| ranked([0.0; KeyOrder::MAX], pl)),
                        MigPolicy::BestFit => {
                            let used: u32 = present.iter().map(|e| u32::from(e.placement.size)).sum();
                            let left = f64::from(u32::from(g.model.memory_slices).saturating_sub(used));
                            free.first().map(|&pl| ranked([left, 0.0, 0.0], pl))
                        }
                        MigPolicy::Gpuslice => {
                            let before = mix_capacity(g.model, &present, &mix());
                            free.into_iter()
                                .map(|pl| {
                                    let mut after = present.clone();
                                    after.push(Existing { profile_id: p.nvml_id, placement: pl });
                                    let loss = before - mix_capacity(g.model, &after, &mix());
                                    ranked([extension(last_end, w) as f64, loss, 0.0], pl)
                                })
                                .min_by(|a, b| a.0.partial_cmp(&b.0).unwrap())
                        }
                        MigPolicy::Ordered(o) => {
                            let times = GpuTimes { extends: extension(last_end, w), overhang: overhang(last_end, w), index: i };
                            rank(g, p, w, o, &mix(), times)
                        }
                    }
                })
                .min_by(|a, b| a.0.partial_cmp(&b.0).unwrap())
                .map(|(_, i, pl)| (i, pl));
            prop_assert_eq!(got, brute);
        }
    }

    #[test]
    fn bookings_ahead_move_to_let_a_request_in_and_only_when_movable() {
        let mut gpus = h100s(2);
        let p3 = gpus[0].model.profile("3g.40gb").unwrap().nvml_id;
        for g in gpus.iter_mut() {
            g.bookings.push(Booked {
                profile_id: p3,
                placement: Placement { start: 0, size: 4 },
                window: W,
            });
        }
        let refused = place(&gpus, "7g.80gb", None, W, MigPolicy::Gpuslice, &mix());
        assert!(refused.is_err());
        let none = place_with_moves(
            &gpus,
            "7g.80gb",
            None,
            W,
            MigPolicy::Gpuslice,
            &mix(),
            |_, _| false,
        );
        assert!(none.is_err(), "nothing movable: refused");
        let (g, pl, moves) = place_with_moves(
            &gpus,
            "7g.80gb",
            None,
            W,
            MigPolicy::Gpuslice,
            &mix(),
            |_, _| true,
        )
        .unwrap();
        assert_eq!(pl.start, 0);
        assert_eq!(moves.len(), 1, "{moves:?}");
        let m = moves[0];
        assert_eq!(m.from_gpu, g);
        assert_ne!(m.to_gpu, g);
        assert_eq!(
            m.placement,
            Placement { start: 4, size: 4 },
            "the other GPU's free half"
        );
        // Only the GPU whose booking may move can be emptied.
        let (g, _, moves) = place_with_moves(
            &gpus,
            "7g.80gb",
            None,
            W,
            MigPolicy::Gpuslice,
            &mix(),
            |g, _| g == 1,
        )
        .unwrap();
        assert_eq!((g, moves[0].from_gpu, moves[0].to_gpu), (1, 1, 0));
        // A request that fits moves nothing.
        let (_, _, moves) = place_with_moves(
            &gpus,
            "1g.10gb",
            None,
            W,
            MigPolicy::Gpuslice,
            &mix(),
            |_, _| true,
        )
        .unwrap();
        assert!(moves.is_empty());
    }

    #[test]
    fn moves_keep_every_nvidia_rule_not_only_overlap() {
        let mut gpus = h100s(2);
        let id = |name: &str| gpus[0].model.profile(name).unwrap().nvml_id;
        let (p1, me) = (id("1g.10gb"), id("1g.10gb+me"));
        let at = |profile_id, start| Booked {
            profile_id,
            placement: Placement { start, size: 1 },
            window: W,
        };
        // GPU 0 holds the one +me it may have (slice 3) and free slice 6;
        // GPU 1 is full of plain 1g. A second +me may not join GPU 0 even
        // where a slot is free or freed: it goes on GPU 1, whose 1g in the
        // way moves to GPU 0's free slice.
        gpus[0].bookings = [0, 1, 2, 4, 5].map(|s| at(p1, s)).to_vec();
        gpus[0].bookings.push(at(me, 3));
        gpus[1].bookings = (0..7).map(|s| at(p1, s)).collect();
        assert!(place(&gpus, "1g.10gb+me", None, W, MigPolicy::Gpuslice, &mix()).is_err());
        let (g, _, moves) = place_with_moves(
            &gpus,
            "1g.10gb+me",
            None,
            W,
            MigPolicy::Gpuslice,
            &mix(),
            |_, _| true,
        )
        .unwrap();
        assert_eq!(g, 1, "{moves:?}");
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!(
            (moves[0].to_gpu, moves[0].placement.start),
            (0, 6),
            "{moves:?}"
        );
    }

    #[test]
    fn only_the_bookings_in_the_way_move() {
        let mut gpus = h100s(2);
        let id = |name: &str| gpus[0].model.profile(name).unwrap().nvml_id;
        let (p1, p3) = (id("1g.10gb"), id("3g.40gb"));
        let at = |profile_id, start, size| Booked {
            profile_id,
            placement: Placement { start, size },
            window: W,
        };
        // GPU 0: a 3g at 0 and a 1g at 6; GPU 1: a 3g at 0. A 4g.40gb
        // (slices 0–3 only) fits on neither until a 3g moves.
        gpus[0].bookings = vec![at(p3, 0, 4), at(p1, 6, 1)];
        gpus[1].bookings = vec![at(p3, 0, 4)];
        let (g, pl, moves) = place_with_moves(
            &gpus,
            "4g.40gb",
            None,
            W,
            MigPolicy::Gpuslice,
            &mix(),
            |_, _| true,
        )
        .unwrap();
        assert_eq!(pl, Placement { start: 0, size: 4 });
        assert_eq!(moves.len(), 1, "only the 3g in the way moves: {moves:?}");
        let m = moves[0];
        assert_eq!(gpus[m.from_gpu].bookings[m.index].profile_id, p3);
        assert_eq!(m.from_gpu, g);
        assert_ne!(
            (m.to_gpu, m.placement),
            (m.from_gpu, gpus[g].bookings[m.index].placement),
            "a move goes somewhere else"
        );
    }
}
