//! The booking rules, one set for pages, API and planner: quota over the
//! whole window in every dimension, the monthly budget, placement through
//! the placement engine (time-aware), the queue, release, cancel and
//! extension. Two independent guards keep bookings apart: the tenant's row
//! lock around check and insert, and the database's exclusion constraint
//! on MIG slots (a share locks its GPU's row for its capacity check).

use std::collections::HashMap;

use sqlx::{PgPool, Postgres, Transaction};
use time::{Duration, OffsetDateTime};

use crate::db::{self, bookings::Booking, fleet::Bookable, tenants::Tenant};
use crate::domain::booking::{self as rules, BookingRequest, Kind, Request, SLICES_PER_GPU};
use crate::domain::Priority;
use crate::gpu::catalog::{self, Placement};
use crate::placement::mig::{self as pmig, Booked, MigGpu, MigPolicy, ProfileMix, Refusal, Window};
use crate::placement::shares::{self, Held as ShareHeld, ShareShapes, SharedGpu};

/// Limits on when bookings may start.
#[derive(Debug, Clone)]
pub struct Settings {
    /// A start this far in the past still counts as now (clocks and forms lag).
    pub past_grace_secs: i64,
    /// How far ahead a booking may start.
    pub max_ahead_days: i64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            past_grace_secs: 300,
            max_ahead_days: 90,
        }
    }
}

/// Who asks.
#[derive(Debug, Clone)]
pub struct Requester {
    pub user_id: i64,
    pub email: String,
    pub is_admin: bool,
    /// Finance staff read every booking (usage reports link to them) but
    /// change none.
    pub is_finance: bool,
    /// (tenant id, slug, is manager) of the tenants the user belongs to.
    pub tenants: Vec<(i64, String, bool)>,
}

impl Requester {
    fn manages(&self, tenant_id: i64) -> bool {
        self.tenants.iter().any(|t| t.0 == tenant_id && t.2)
    }

    /// May see the booking: its owner, its tenant's managers, admins and
    /// finance (read only).
    pub fn can_see(&self, b: &Booking) -> bool {
        self.is_admin || self.is_finance || b.user_id == self.user_id || self.manages(b.tenant_id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BookingError {
    /// Bad input, one message per field.
    #[error("{}", .0.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<(&'static str, String)>),
    /// A quota, budget or capacity rule says no.
    #[error("{0}")]
    Refused(String),
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Forbidden(String),
    /// Someone changed the capacity between our look and our write; the
    /// caller plans again.
    #[error("capacity changed while booking; try again")]
    Retry,
    #[error(transparent)]
    Db(#[from] sqlx::Error),
}

fn invalid(field: &'static str, message: impl Into<String>) -> BookingError {
    BookingError::Invalid(vec![(field, message.into())])
}

/// The result of a create: a new booking, or the one an earlier request
/// with the same idempotency key made.
#[derive(Debug)]
pub enum Created {
    New(Booking),
    Replayed(Booking),
}

fn ts(t: OffsetDateTime) -> i64 {
    t.unix_timestamp()
}

fn at(secs: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(secs).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// `14:00 UTC, 24 Dec 2026` style for messages.
pub fn when(t: OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02} UTC",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute()
    )
}

fn priority_of(req: &BookingRequest, tenant: &Tenant) -> Priority {
    match req.what {
        Request::Share {
            priority: Some(p), ..
        } => p,
        _ => tenant.quota.default_priority,
    }
}

/// The fleet as the placement engine sees it, from the database.
struct Fleet {
    gpus: Vec<Bookable>,
    mig: Vec<MigGpu>,
    mig_ids: Vec<i64>,
    shared: Vec<SharedGpu>,
    shared_ids: Vec<i64>,
    mix: ProfileMix,
    shapes: ShareShapes,
}

/// What tenants asked for lately: MIG profiles by model, share sizes.
#[derive(Default)]
struct Asked {
    profiles: Vec<(String, String, i64)>,
    shares: Vec<(i32, i64)>,
}

/// The fleet a request of `kind` by `tenant` may land on, read under the
/// placement lock (the profile-mix statistic is read just before it, so the
/// serialised section stays short).
async fn fleet_for(
    tx: &mut Transaction<'_, Postgres>,
    kind: Kind,
    tenant: &Tenant,
) -> sqlx::Result<Fleet> {
    let asked = match kind {
        Kind::Mig => Asked {
            profiles: db::bookings::recent_profile_counts(&mut **tx).await?,
            shares: Vec::new(),
        },
        Kind::Timeslice => Asked {
            profiles: Vec::new(),
            shares: db::bookings::recent_share_counts(&mut **tx).await?,
        },
    };
    lock_placement(tx, kind).await?;
    load_fleet(tx, Some(kind), &tenant.quota.allowed_models, &asked).await
}

/// Loads the bookable GPUs (of `kind` only, when given) with their live
/// bookings.
async fn load_fleet(
    tx: &mut Transaction<'_, Postgres>,
    kind: Option<Kind>,
    allowed_models: &[String],
    asked: &Asked,
) -> sqlx::Result<Fleet> {
    let mode = kind.map(|k| if k == Kind::Mig { "mig" } else { "timeslice" });
    let gpus: Vec<Bookable> = db::fleet::bookable(&mut **tx)
        .await?
        .into_iter()
        .filter(|g| mode.is_none_or(|m| g.mode == m))
        .filter(|g| allowed_models.is_empty() || allowed_models.contains(&g.model))
        .collect();
    let placed = db::bookings::placed_live(&mut **tx, kind.map(Kind::as_str)).await?;
    let mut by_gpu: HashMap<i64, Vec<&db::bookings::Placed>> = HashMap::new();
    for p in &placed {
        by_gpu.entry(p.gpu_id).or_default().push(p);
    }
    let mut fleet = Fleet {
        gpus: Vec::new(),
        mig: Vec::new(),
        mig_ids: Vec::new(),
        shared: Vec::new(),
        shared_ids: Vec::new(),
        mix: ProfileMix::default(),
        shapes: ShareShapes::from_counts(&asked.shares),
    };
    for g in &gpus {
        let here = by_gpu.get(&g.id).map(Vec::as_slice).unwrap_or(&[]);
        if g.mode == "mig" {
            let Some(model) = catalog::model(&g.model).filter(|m| m.mig_capable()) else {
                continue;
            };
            let bookings = here
                .iter()
                .filter_map(|p| {
                    let profile = model.profile(p.profile.as_deref()?)?;
                    Some(Booked {
                        profile_id: profile.nvml_id,
                        placement: Placement {
                            start: u8::try_from(p.slice_start?).ok()?,
                            size: profile.memory_slices,
                        },
                        window: Window {
                            start: p.start,
                            end: p.end,
                        },
                    })
                })
                .collect();
            fleet.mig.push(MigGpu { model, bookings });
            fleet.mig_ids.push(g.id);
        } else {
            fleet.shared.push(SharedGpu {
                node: g.node_id as usize,
                model: g.model.clone(),
                memory_gib: g.memory_mib as f64 / 1024.0,
                max_shares: g.max_shares as u32,
                held: here
                    .iter()
                    .map(|p| ShareHeld {
                        memory_gib: f64::from(p.memory_gib),
                        exclusive: false,
                        window: Window {
                            start: p.start,
                            end: p.end,
                        },
                    })
                    .collect(),
            });
            fleet.shared_ids.push(g.id);
        }
    }
    fleet.mix = profile_mix(&asked.profiles, &fleet.mig);
    fleet.gpus = gpus;
    Ok(fleet)
}

/// The profile mix placement keeps room for: what tenants asked for in the
/// last 30 days, once there are enough bookings to say; until then every
/// profile equally. It is read before the placement lock: a statistic a
/// moment old serves as well, and the serialised section stays short.
fn profile_mix(counts: &[(String, String, i64)], mig: &[MigGpu]) -> ProfileMix {
    ProfileMix::from_counts(counts.iter().map(|c| (c.1.as_str(), c.2))).unwrap_or_else(|| {
        mig.first()
            .map(|g| pmig::default_mix(g.model))
            .unwrap_or_default()
    })
}

/// Where a request landed.
struct Spot {
    gpu: usize,
    slices: Option<(i32, i32)>,
    model: String,
    compute_slices: i32,
}

/// Asks the placement engine (gpuslice policy) for a spot over `window`.
fn find_spot(fleet: &Fleet, req: &BookingRequest, window: Window) -> Result<Spot, Refusal> {
    match &req.what {
        Request::Mig { profile } => {
            let (i, placement) = pmig::place(
                &fleet.mig,
                profile,
                req.model.as_deref(),
                window,
                MigPolicy::Gpuslice,
                &fleet.mix,
            )?;
            let model = fleet.mig[i].model;
            let compute = model
                .profile(profile)
                .map(|p| i32::from(p.compute_slices))
                .unwrap_or(SLICES_PER_GPU);
            Ok(Spot {
                gpu: fleet
                    .gpus
                    .iter()
                    .position(|g| g.id == fleet.mig_ids[i])
                    .unwrap_or(0),
                slices: Some((
                    i32::from(placement.start),
                    i32::from(placement.start + placement.size),
                )),
                model: model.id.to_string(),
                compute_slices: compute,
            })
        }
        Request::Share { memory_gib, .. } => {
            let i = shares::place_share(
                &fleet.shared,
                f64::from(*memory_gib),
                req.model.as_deref(),
                window,
                &fleet.shapes,
            )?;
            let g = &fleet.shared[i];
            Ok(Spot {
                gpu: fleet
                    .gpus
                    .iter()
                    .position(|b| b.id == fleet.shared_ids[i])
                    .unwrap_or(0),
                slices: None,
                model: g.model.clone(),
                compute_slices: rules::share_slices(*memory_gib, g.memory_gib),
            })
        }
    }
}

/// Memory and compute slices a request counts for quota when it has no GPU
/// yet (queued): the model asked for, else the first eligible one.
fn unplaced_size(fleet: &Fleet, req: &BookingRequest) -> (i32, i32, Option<String>) {
    match &req.what {
        Request::Mig { profile } => {
            let model = req
                .model
                .as_deref()
                .and_then(catalog::model)
                .or_else(|| {
                    fleet
                        .mig
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
                Some((m, p)) => (
                    p.memory_gib.ceil() as i32,
                    i32::from(p.compute_slices),
                    Some(m.id.to_string()),
                ),
                None => (1, 1, None),
            }
        }
        Request::Share { memory_gib, .. } => {
            let gpu_mem = fleet
                .shared
                .iter()
                .filter(|g| req.model.as_deref().is_none_or(|m| g.model == m))
                .filter(|g| g.memory_gib >= f64::from(*memory_gib))
                .map(|g| g.memory_gib)
                .fold(f64::from(*memory_gib), f64::max);
            (*memory_gib, rules::share_slices(*memory_gib, gpu_mem), None)
        }
    }
}

fn memory_of(req: &BookingRequest, model: Option<&str>) -> i32 {
    match &req.what {
        Request::Mig { profile } => model
            .and_then(catalog::model)
            .and_then(|m| m.profile(profile))
            .map(|p| p.memory_gib.ceil() as i32)
            .unwrap_or(1),
        Request::Share { memory_gib, .. } => *memory_gib,
    }
}

/// Checks a tenant's quota and budget for holding `memory_gib` and
/// `compute_slices` over `[start, end)` beside its other live bookings.
async fn check_quota(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &Tenant,
    start: OffsetDateTime,
    end: OffsetDateTime,
    memory_gib: i32,
    compute_slices: i32,
    except: Option<i64>,
) -> Result<(), BookingError> {
    let q = &tenant.quota;
    let held = db::bookings::tenant_live_between(&mut **tx, tenant.id, start, end, except).await?;
    let mut with_new = held.clone();
    with_new.push(rules::Held {
        start: ts(start),
        end: ts(end),
        memory_gib,
        compute_slices,
    });
    let (before_n, before_mem, before_slices) = rules::peak_use(&held, ts(start), ts(end));
    let (n, mem, slices) = rules::peak_use(&with_new, ts(start), ts(end));
    if n > q.max_active_bookings {
        return Err(BookingError::Refused(format!(
            "quota: {before_n} of {} active bookings in use during that time ({})",
            q.max_active_bookings, tenant.slug
        )));
    }
    if mem > q.max_gpu_memory_gib {
        return Err(BookingError::Refused(format!(
            "quota: {before_mem} of {} GiB of GPU memory in use during that time ({}); this booking needs {memory_gib} GiB, {} more than is left",
            q.max_gpu_memory_gib, tenant.slug, mem - q.max_gpu_memory_gib
        )));
    }
    if slices > q.max_compute_slices {
        return Err(BookingError::Refused(format!(
            "quota: {before_slices} of {} compute slices in use during that time ({}); this booking needs {compute_slices}, {} more than is left",
            q.max_compute_slices, tenant.slug, slices - q.max_compute_slices
        )));
    }
    for (from, to) in rules::months_touched(ts(start), ts(end)) {
        let used = db::bookings::tenant_slice_hours(&mut **tx, tenant.id, at(from), at(to), except)
            .await?;
        let needs = rules::slice_hours_within(compute_slices, ts(start), ts(end), from, to);
        if used + needs > f64::from(q.monthly_slice_hours) + 1e-9 {
            let month = at(from);
            return Err(BookingError::Refused(format!(
                "budget: {:.0} of {} slice-hours used or booked in {} {} ({}); this booking needs {:.0} more",
                used,
                q.monthly_slice_hours,
                month.month(),
                month.year(),
                tenant.slug,
                needs
            )));
        }
    }
    Ok(())
}

/// Rules that need the tenant but no capacity: length, models, profiles,
/// start time.
fn check_request(
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
        Some(s) => s.max(now),
    };
    if errors.is_empty() {
        Ok(start)
    } else {
        Err(BookingError::Invalid(errors))
    }
}

/// Another booking took the slot first (exclusion constraint) or the
/// share's GPU filled up: plan again.
fn is_lost_race(e: &BookingError) -> bool {
    matches!(e, BookingError::Retry)
        || matches!(e, BookingError::Db(sqlx::Error::Database(d)) if d.code().as_deref() == Some("23P01"))
}

/// Serialises placement decisions of one kind across every process:
/// bookings that would all pick the same best slot queue here instead of
/// colliding on the exclusion constraint and planning again (which costs
/// O(n²) plans under a burst). Taken after the tenant's lock, always in
/// that order, and released at commit.
async fn lock_placement(tx: &mut Transaction<'_, Postgres>, kind: Kind) -> sqlx::Result<()> {
    db::bookings::advisory_xact_lock(&mut **tx, &format!("gpuslice-placement:{}", kind.as_str()))
        .await
}

/// Creates a booking: scheduled on a GPU when capacity allows, queued with
/// its reason otherwise.
pub async fn create(
    pool: &PgPool,
    who: &Requester,
    req: &BookingRequest,
    idempotency_key: Option<&str>,
    settings: &Settings,
) -> Result<Created, BookingError> {
    if let Some(key) = idempotency_key {
        if key.is_empty() || key.len() > 200 {
            return Err(BookingError::Invalid(vec![(
                "Idempotency-Key",
                "give 1 to 200 characters".into(),
            )]));
        }
        if let Some(id) = db::bookings::by_idempotency_key(pool, who.user_id, key).await? {
            return Ok(Created::Replayed(db::bookings::get(pool, id).await?));
        }
    }
    let tenant_id = who
        .tenants
        .iter()
        .find(|t| t.1 == req.tenant.as_str())
        .map(|t| t.0)
        .ok_or_else(|| {
            invalid(
                "tenant",
                format!("you are not a member of a tenant \"{}\"", req.tenant),
            )
        })?;
    // An overlapping MIG booking committed between our read and our insert
    // trips the exclusion constraint: plan again with what is there now.
    let mut last = None;
    for _ in 0..5 {
        match try_create(pool, who, tenant_id, req, idempotency_key, settings).await {
            Err(e) if is_lost_race(&e) => last = Some(e),
            Err(BookingError::Db(sqlx::Error::Database(d)))
                if d.constraint() == Some("bookings_idempotency_key") =>
            {
                let key = idempotency_key.unwrap_or_default();
                if let Some(id) = db::bookings::by_idempotency_key(pool, who.user_id, key).await? {
                    return Ok(Created::Replayed(db::bookings::get(pool, id).await?));
                }
                return Err(BookingError::Refused(
                    "the same request is in progress; try again".into(),
                ));
            }
            other => return other.map(Created::New),
        }
    }
    Err(last
        .unwrap_or_else(|| BookingError::Refused("too many bookings at once; try again".into())))
}

async fn try_create(
    pool: &PgPool,
    who: &Requester,
    tenant_id: i64,
    req: &BookingRequest,
    idempotency_key: Option<&str>,
    settings: &Settings,
) -> Result<Booking, BookingError> {
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or(OffsetDateTime::now_utc());
    let mut tx = pool.begin().await?;
    let tenant = db::tenants::get_for_update(&mut tx, tenant_id).await?;
    if tenant.archived {
        return Err(invalid(
            "tenant",
            format!("{} is archived and takes no bookings", tenant.slug),
        ));
    }
    let start = check_request(req, &tenant, settings, now)?;
    let end = start + Duration::hours(i64::from(req.hours));
    let window = Window {
        start: ts(start),
        end: ts(end),
    };
    let fleet = fleet_for(&mut tx, req.kind(), &tenant).await?;
    let priority = priority_of(req, &tenant);
    let spot = find_spot(&fleet, req, window);
    let (memory, slices, model) = match &spot {
        Ok(s) => (
            memory_of(req, Some(&s.model)),
            s.compute_slices,
            Some(s.model.clone()),
        ),
        Err(_) => unplaced_size(&fleet, req),
    };
    check_quota(&mut tx, &tenant, start, end, memory, slices, None).await?;
    let (status, gpu_id, slot, reason, offered) = match spot {
        Ok(s) => {
            let gpu = &fleet.gpus[s.gpu];
            if req.kind() == Kind::Timeslice {
                lock_and_check_share(&mut tx, gpu, memory, window).await?;
            }
            ("scheduled", Some(gpu.id), s.slices, None, None)
        }
        Err(refusal) => {
            if !ever_fits(&fleet, req) {
                // Nothing in the fleet could ever take it: say so, book nothing.
                return Err(BookingError::Refused(refusal.reason));
            }
            let offered = refusal.earliest_start.map(at);
            let reason = queued_reason(req, &refusal, start, end);
            ("queued", None, None, Some(reason), offered)
        }
    };
    let id = db::bookings::insert(
        &mut *tx,
        &db::bookings::NewBooking {
            tenant_id,
            user_id: who.user_id,
            kind: req.kind().as_str(),
            requested_model: req.model.as_deref(),
            model: model.as_deref(),
            profile: match &req.what {
                Request::Mig { profile } => Some(profile),
                Request::Share { .. } => None,
            },
            memory_gib: memory,
            compute_slices: slices,
            priority: priority.as_str(),
            hours: req.hours,
            start,
            end,
            status,
            gpu_id,
            slices: slot,
            reason: reason.as_deref(),
            offered_start: offered,
            idempotency_key,
        },
    )
    .await?;
    db::bookings::event(
        &mut *tx,
        id,
        &who.email,
        None,
        status,
        reason.as_deref().unwrap_or("booked"),
    )
    .await?;
    tx.commit().await?;
    Ok(db::bookings::get(pool, id).await?)
}

/// Some GPU of the fleet could take the request if it were empty.
fn ever_fits(fleet: &Fleet, req: &BookingRequest) -> bool {
    let model_ok = |m: &str| req.model.as_deref().is_none_or(|r| r == m);
    match &req.what {
        Request::Mig { profile } => fleet
            .mig
            .iter()
            .any(|g| model_ok(g.model.id) && g.model.profile(profile).is_some()),
        Request::Share { memory_gib, .. } => fleet
            .shared
            .iter()
            .any(|g| model_ok(&g.model) && g.memory_gib >= f64::from(*memory_gib)),
    }
}

fn queued_reason(
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

/// Locks a share's GPU and says whether a share of `memory_gib` fits on it
/// over `window` (memory and share count) beside what is on it now, not
/// counting booking `except`.
async fn share_fits(
    tx: &mut Transaction<'_, Postgres>,
    gpu: &Bookable,
    memory_gib: i32,
    window: Window,
    except: Option<i64>,
) -> Result<bool, BookingError> {
    db::fleet::lock_gpu(&mut **tx, gpu.id).await?;
    let held = db::bookings::placed_live_on(&mut **tx, gpu.id)
        .await?
        .into_iter()
        .filter(|p| Some(p.id) != except)
        .map(|p| ShareHeld {
            memory_gib: f64::from(p.memory_gib),
            exclusive: false,
            window: Window {
                start: p.start,
                end: p.end,
            },
        })
        .collect();
    let one = [SharedGpu {
        node: 0,
        model: gpu.model.clone(),
        memory_gib: gpu.memory_mib as f64 / 1024.0,
        max_shares: gpu.max_shares as u32,
        held,
    }];
    // Whether it fits; where does not matter on one GPU.
    let shapes = ShareShapes::default();
    Ok(shares::place_share(&one, f64::from(memory_gib), None, window, &shapes).is_ok())
}

/// Locks a share's GPU and checks that the share still fits; if another
/// share took the room since the plan, the caller plans again.
async fn lock_and_check_share(
    tx: &mut Transaction<'_, Postgres>,
    gpu: &Bookable,
    memory_gib: i32,
    window: Window,
) -> Result<(), BookingError> {
    if share_fits(tx, gpu, memory_gib, window, None).await? {
        Ok(())
    } else {
        Err(BookingError::Retry)
    }
}

/// Remembers what the queue planner last saw, so that a pass runs only
/// when capacity may have freed: a booking ended (released, expired,
/// cancelled, failed), the bookable fleet changed, or a minute passed.
#[derive(Debug, Default)]
pub struct Planner {
    seen: Option<(i64, i64)>,
    last_pass: Option<std::time::Instant>,
}

impl Planner {
    /// Plans the queue if anything may have changed since the last pass.
    pub async fn tick(&mut self, pool: &PgPool) -> Result<usize, BookingError> {
        let now_seen = db::bookings::capacity_fingerprint(pool).await?;
        let stale = self
            .last_pass
            .is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(60));
        if self.seen == Some(now_seen) && !stale {
            return Ok(0);
        }
        let placed = plan_queue(pool).await?;
        self.seen = Some(now_seen);
        self.last_pass = Some(std::time::Instant::now());
        Ok(placed)
    }
}

/// Tries to place queued bookings: highest priority first; within a
/// priority, tenants take turns — each tenant's first waiting booking before
/// anyone's second, and among those the tenant served longest ago (or
/// never) first — then oldest first. Returns how many were placed.
pub async fn plan_queue(pool: &PgPool) -> Result<usize, BookingError> {
    let queued = db::bookings::queued(pool).await?;
    let rank = |p: &str| match p {
        "high" => 0,
        "normal" => 1,
        _ => 2,
    };
    let mut turns: HashMap<(i32, i64), usize> = HashMap::new();
    let mut order: Vec<(i32, usize, Option<OffsetDateTime>, usize, i64)> = queued
        .iter()
        .enumerate()
        .map(|(pos, (id, tenant, prio, last))| {
            let r = rank(prio);
            let turn = turns.entry((r, *tenant)).or_default();
            *turn += 1;
            (r, *turn, *last, pos, *id)
        })
        .collect();
    order.sort();
    let mut placed = 0;
    // Shapes that found no room in this pass: an identical request behind
    // them would not either (placing others only takes capacity away).
    let mut no_room: std::collections::HashSet<String> = Default::default();
    for (_, _, _, _, id) in order {
        match place_one_queued(pool, id, &mut no_room).await {
            Ok(true) => placed += 1,
            Ok(false) => {}
            Err(e) if is_lost_race(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(placed)
}

async fn place_one_queued(
    pool: &PgPool,
    id: i64,
    no_room: &mut std::collections::HashSet<String>,
) -> Result<bool, BookingError> {
    let now = OffsetDateTime::now_utc()
        .replace_nanosecond(0)
        .unwrap_or(OffsetDateTime::now_utc());
    let b = db::bookings::get(pool, id).await?;
    let shape = format!(
        "{}/{:?}/{}/{:?}/{}/{}",
        b.kind,
        b.profile,
        b.memory_gib,
        b.requested_model,
        b.hours,
        b.start.max(now).unix_timestamp() / 60
    );
    if no_room.contains(&shape) {
        return Ok(false);
    }
    let mut tx = pool.begin().await?;
    let tenant = db::tenants::get_for_update(&mut tx, b.tenant_id).await?;
    if db::bookings::lock(&mut tx, id).await? != "queued" {
        return Ok(false);
    }
    let req = BookingRequest {
        tenant: crate::domain::Slug::parse(&b.tenant_slug).map_err(|e| invalid("tenant", e))?,
        what: match &b.profile {
            Some(p) => Request::Mig { profile: p.clone() },
            None => Request::Share {
                memory_gib: b.memory_gib,
                priority: crate::domain::Priority::parse(&b.priority).ok(),
            },
        },
        model: b.requested_model.clone(),
        start: None,
        hours: b.hours,
    };
    // A booking asked for "now" that waited starts when placed, for its
    // full length; one asked for later keeps its start.
    let start = b.start.max(now);
    let end = start + Duration::hours(i64::from(b.hours));
    let window = Window {
        start: ts(start),
        end: ts(end),
    };
    let fleet = fleet_for(&mut tx, req.kind(), &tenant).await?;
    match find_spot(&fleet, &req, window) {
        Ok(s) => {
            let memory = memory_of(&req, Some(&s.model));
            if let Err(e) = check_quota(
                &mut tx,
                &tenant,
                start,
                end,
                memory,
                s.compute_slices,
                Some(id),
            )
            .await
            {
                if let BookingError::Refused(msg) = &e {
                    db::bookings::set_reason(
                        &mut *tx,
                        id,
                        &format!("waiting for quota: {msg}"),
                        None,
                    )
                    .await?;
                    tx.commit().await?;
                    return Ok(false);
                }
                return Err(e);
            }
            let gpu = &fleet.gpus[s.gpu];
            if b.kind == "timeslice" {
                lock_and_check_share(&mut tx, gpu, memory, window).await?;
            }
            let ok = db::bookings::place_queued(
                &mut tx,
                id,
                gpu.id,
                &s.model,
                s.slices,
                s.compute_slices,
                memory,
                start,
                end,
            )
            .await?;
            tx.commit().await?;
            Ok(ok)
        }
        Err(refusal) => {
            if tenant.quota.allowed_models.is_empty() {
                no_room.insert(shape);
            }
            let reason = queued_reason(&req, &refusal, start, end);
            db::bookings::set_reason(&mut *tx, id, &reason, refusal.earliest_start.map(at)).await?;
            tx.commit().await?;
            Ok(false)
        }
    }
}

/// Loads a booking the requester may see; others' bookings are not found.
pub async fn visible(pool: &PgPool, who: &Requester, id: i64) -> Result<Booking, BookingError> {
    let b = db::bookings::get(pool, id).await.map_err(|e| match e {
        sqlx::Error::RowNotFound => BookingError::NotFound,
        e => e.into(),
    })?;
    if who.can_see(&b) {
        Ok(b)
    } else {
        Err(BookingError::NotFound)
    }
}

/// Ends a booking early: cancels one that has not started, releases one
/// that holds a device. The owner, the tenant's managers and admins may;
/// for anyone but the owner a reason is required and the audit log records it.
pub async fn release(
    pool: &PgPool,
    who: &Requester,
    id: i64,
    reason: Option<&str>,
    client_addr: Option<&str>,
) -> Result<Booking, BookingError> {
    let b = visible(pool, who, id).await?;
    let owner = b.user_id == who.user_id;
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    if !owner {
        if !(who.is_admin || who.manages(b.tenant_id)) {
            return Err(BookingError::NotFound);
        }
        if reason.is_none() {
            return Err(invalid("reason", "say why you end someone else's booking"));
        }
    }
    let mut tx = pool.begin().await?;
    let status = db::bookings::lock(&mut tx, id).await?;
    let why = reason.unwrap_or(if owner { "released by its owner" } else { "" });
    let done = match status.as_str() {
        "queued" | "scheduled" => {
            db::bookings::transition(&mut tx, id, &status, "cancelled", &who.email, Some(why))
                .await?
        }
        "provisioning" | "active" => {
            db::bookings::begin_release(&mut tx, id, &status, "released", &who.email, why).await?
        }
        other => {
            return Err(BookingError::Refused(format!(
                "booking {id} is {other}: there is nothing to release"
            )))
        }
    };
    if done && !owner {
        db::audit::record(
            &mut *tx,
            &db::audit::Actor {
                user_id: Some(who.user_id),
                email: Some(who.email.clone()),
                client_addr: client_addr.map(str::to_string),
            },
            "booking.force_release",
            &format!("booking {id}"),
            serde_json::json!({ "owner": b.user_email, "tenant": b.tenant_slug, "reason": why }),
        )
        .await?;
    }
    tx.commit().await?;
    Ok(db::bookings::get(pool, id).await?)
}

/// Extends a scheduled or active booking by `more_hours`, if the tenant's
/// quota and the slot allow.
pub async fn extend(
    pool: &PgPool,
    who: &Requester,
    id: i64,
    more_hours: i32,
) -> Result<Booking, BookingError> {
    let b = visible(pool, who, id).await?;
    if b.user_id != who.user_id && !who.is_admin {
        return Err(BookingError::Forbidden(
            "only the booking's owner can extend it".into(),
        ));
    }
    if !(1..=rules::MAX_HOURS).contains(&more_hours) {
        return Err(invalid("hours", "give a whole number of hours, at least 1"));
    }
    let mut tx = pool.begin().await?;
    let tenant = db::tenants::get_for_update(&mut tx, b.tenant_id).await?;
    let status = db::bookings::lock(&mut tx, id).await?;
    if status != "scheduled" && status != "active" {
        return Err(BookingError::Refused(format!(
            "booking {id} is {status} and cannot be extended"
        )));
    }
    let total = b.hours + more_hours;
    if total > tenant.quota.max_booking_hours {
        return Err(invalid(
            "hours",
            format!(
                "{} allows bookings of at most {} hours; this one would last {total}",
                tenant.slug, tenant.quota.max_booking_hours
            ),
        ));
    }
    let new_end = b.end + Duration::hours(i64::from(more_hours));
    check_quota(
        &mut tx,
        &tenant,
        b.end,
        new_end,
        b.memory_gib,
        b.compute_slices,
        Some(id),
    )
    .await?;
    if b.kind == "timeslice" {
        let gpu_id = b.gpu_id.ok_or(BookingError::NotFound)?;
        let gpus = db::fleet::bookable(&mut *tx).await?;
        let gpu = gpus.iter().find(|g| g.id == gpu_id).ok_or_else(|| {
            BookingError::Refused("the booking's GPU takes no new bookings now".into())
        })?;
        let ext = Window {
            start: ts(b.end),
            end: ts(new_end),
        };
        if !share_fits(&mut tx, gpu, b.memory_gib, ext, Some(id)).await? {
            return Err(BookingError::Refused(format!(
                "the GPU is booked by others after {}; release and book again elsewhere",
                when(b.end)
            )));
        }
    }
    match db::bookings::set_end(&mut tx, id, new_end, total).await {
        Err(sqlx::Error::Database(d)) if d.code().as_deref() == Some("23P01") => {
            return Err(BookingError::Refused(format!(
                "the slot is booked by someone else after {}",
                when(b.end)
            )))
        }
        other => other?,
    }
    db::bookings::event(
        &mut *tx,
        id,
        &who.email,
        Some(&status),
        &status,
        &format!("extended by {more_hours} h to {}", when(new_end)),
    )
    .await?;
    tx.commit().await?;
    Ok(db::bookings::get(pool, id).await?)
}

/// What can be booked, with how much of it is free now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Offering {
    pub kind: &'static str,
    pub model: String,
    /// MIG profile; `None` for time-sliced shares.
    pub profile: Option<String>,
    /// The profile's memory; for shares, the largest share free now.
    pub memory_gib: f64,
    /// The profile's compute slices (7 for a whole GPU).
    pub compute_slices: i32,
    /// GPUs that offer it.
    pub gpus: usize,
    /// GPUs that could take one more right now (for the next hour).
    pub available_now: usize,
}

/// Every profile and share kind the fleet offers, with availability now.
pub async fn offerings(pool: &PgPool) -> sqlx::Result<Vec<Offering>> {
    let mut tx = pool.begin().await?;
    let fleet = load_fleet(&mut tx, None, &[], &Asked::default()).await?;
    tx.rollback().await?;
    let now = ts(OffsetDateTime::now_utc());
    let next_hour = Window {
        start: now,
        end: now + 3600,
    };
    let mut out: Vec<Offering> = Vec::new();
    let mut models: Vec<&'static catalog::Model> = fleet.mig.iter().map(|g| g.model).collect();
    models.sort_by_key(|m| m.id);
    models.dedup_by_key(|m| m.id);
    for model in models {
        let gpus: Vec<&MigGpu> = fleet
            .mig
            .iter()
            .filter(|g| g.model.id == model.id)
            .collect();
        for p in &model.profiles {
            let available = gpus
                .iter()
                .filter(|g| {
                    let present: Vec<crate::gpu::mig::Existing> = g
                        .bookings
                        .iter()
                        .filter(|b| b.window.overlaps(next_hour))
                        .map(|b| crate::gpu::mig::Existing {
                            profile_id: b.profile_id,
                            placement: b.placement,
                        })
                        .collect();
                    !crate::gpu::mig::free_placements(model, &present, p.nvml_id).is_empty()
                })
                .count();
            out.push(Offering {
                kind: "mig",
                model: model.id.to_string(),
                profile: Some(p.name.clone()),
                memory_gib: p.memory_gib,
                compute_slices: i32::from(p.compute_slices),
                gpus: gpus.len(),
                available_now: available,
            });
        }
    }
    let mut share_models: Vec<&str> = fleet.shared.iter().map(|g| g.model.as_str()).collect();
    share_models.sort_unstable();
    share_models.dedup();
    for model in share_models {
        let gpus: Vec<&SharedGpu> = fleet.shared.iter().filter(|g| g.model == model).collect();
        let free: Vec<f64> = gpus
            .iter()
            .filter_map(|g| {
                let here: Vec<&ShareHeld> = g
                    .held
                    .iter()
                    .filter(|h| h.window.overlaps(next_hour))
                    .collect();
                (here.len() < g.max_shares as usize)
                    .then(|| g.memory_gib - here.iter().map(|h| h.memory_gib).sum::<f64>())
                    .filter(|m| *m >= 1.0)
            })
            .collect();
        out.push(Offering {
            kind: "timeslice",
            model: model.to_string(),
            profile: None,
            memory_gib: free.iter().copied().fold(0.0, f64::max).floor(),
            compute_slices: SLICES_PER_GPU,
            gpus: gpus.len(),
            available_now: free.len(),
        });
    }
    Ok(out)
}

/// A tenant's use now and this month, for the quota bars.
#[derive(Debug, Clone)]
pub struct QuotaUse {
    pub active_bookings: i32,
    pub memory_gib: i32,
    pub compute_slices: i32,
    /// Slice-hours used and booked this calendar month (UTC).
    pub slice_hours: f64,
}

pub async fn quota_use(pool: &PgPool, tenant_id: i64) -> sqlx::Result<QuotaUse> {
    let now = OffsetDateTime::now_utc();
    let held =
        db::bookings::tenant_live_between(pool, tenant_id, now, now + Duration::seconds(1), None)
            .await?;
    let (n, mem, slices) = rules::peak_use(&held, ts(now), ts(now) + 1);
    let month = rules::months_touched(ts(now), ts(now) + 1)
        .first()
        .copied()
        .unwrap_or((ts(now), ts(now) + 1));
    let hours =
        db::bookings::tenant_slice_hours(pool, tenant_id, at(month.0), at(month.1), None).await?;
    Ok(QuotaUse {
        active_bookings: n,
        memory_gib: mem,
        compute_slices: slices,
        slice_hours: hours,
    })
}
