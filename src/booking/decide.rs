//! The one decision a new booking and the queue planner share, in the
//! caller's transaction: read the tenant's quota use over the whole window
//! (the caller holds the tenant's row lock), take the placement lock and
//! bring the placement index up to date, ask the pure rules where the
//! request fits and whether the quota allows it, and lock a share's GPU to
//! confirm it still fits. Then [`create`], which writes a new booking (and
//! the first line of its timeline, in one statement) from that decision.
//! Inside the placement lock a MIG decision makes two round trips: the
//! index's changes and the insert (then the commit).

use sqlx::{PgPool, Postgres, Transaction};
use time::{Duration, OffsetDateTime};

use super::index::{self, PlacementIndex};
use super::plan::{self, Asked, Fleet, MonthUse, Size, Spot};
use super::{at, invalid, ts, ts_end, BookingError, Created, Requester, Settings};
use crate::db::{self, bookings::Booking, fleet::Bookable, tenants::Tenant};
use crate::domain::booking::{self as rules, BookingRequest, Kind, Request, Status};
use crate::placement::mig::Window;
use crate::placement::shares::{self, ShareShapes, SharedGpu};

/// What the rules decided for a request over a window.
#[derive(Debug)]
pub(super) enum Decision {
    /// It fits: this GPU and slot, within quota; a share's GPU is locked.
    Place { spot: Spot, size: Size },
    /// No room now; it may wait.
    Queue {
        reason: String,
        /// The earliest start that would fit, when the engine knows one.
        offered: Option<OffsetDateTime>,
        size: Size,
        /// No GPU of the fleet could ever take it.
        never: bool,
        /// The placement engine's own words.
        refused: String,
    },
    /// The tenant's quota or budget says no (which limit, by how much).
    OverQuota(String),
}

/// A booking ahead is never moved later than this before its start (the
/// worker may be about to claim it, and its owner has read where it is).
pub const MOVE_NOTICE: Duration = Duration::minutes(10);

/// How many plans with moves one decision tries when bookings it would move
/// are held by another transaction.
const MOVE_PLANS: usize = 3;

/// Decides where `req` goes over `[start, end)` for `tenant`, whose row the
/// caller has locked. `except`: the booking being placed again (the queue
/// planner), not counted against itself. A new request is checked against
/// the quota even when it can only wait (it may not queue past its quota);
/// a waiting booking is checked when it is placed.
pub(super) async fn decide(
    tx: &mut Transaction<'_, Postgres>,
    index: &PlacementIndex,
    tenant: &Tenant,
    req: &BookingRequest,
    start: OffsetDateTime,
    end: OffsetDateTime,
    except: Option<i64>,
) -> Result<Decision, BookingError> {
    let window = Window {
        start: ts(start),
        end: ts_end(end),
    };
    // The tenant's held bookings and month use, read before the placement
    // lock (the caller holds the tenant's lock: nothing can add to them
    // meanwhile, only bookings ending can take from them), so that the
    // serialised section does no quota round trips.
    let usage = quota_usage(tx, tenant, start, end, except).await?;
    let fleet = fleet_for(tx, index, req.kind(), tenant).await?;
    let mut spot = plan::find_spot(&fleet, req, window)?;
    // A MIG request that does not fit may fit when bookings ahead move
    // (same window, profile and model; never a live one, never within
    // MOVE_NOTICE of its start).
    let mut moves = Vec::new();
    let notice = MOVE_NOTICE.whole_seconds();
    if spot.is_err() && req.kind() == Kind::Mig {
        let mut movable = db::bookings::movable_mig(tx, start, end, notice).await?;
        // Lock only the bookings a plan moves; one that another transaction
        // holds (its owner cancelling, say) or that no longer qualifies is
        // left out and the plan made again without it (a few times at most;
        // then the request waits like any that does not fit).
        for _ in 0..MOVE_PLANS {
            if movable.is_empty() {
                break;
            }
            let Some((found, planned)) = plan::find_spot_moving(&fleet, req, window, &movable)?
            else {
                break;
            };
            let ids: Vec<i64> = planned.iter().map(|m| m.booking_id).collect();
            let locked = db::bookings::lock_movable(tx, &ids, notice).await?;
            if locked.len() == ids.len() {
                spot = Ok(found);
                moves = planned;
                break;
            }
            movable.retain(|id| !ids.contains(id) || locked.contains(id));
        }
    }
    let size = match &spot {
        Ok(s) => plan::placed_size(req, s),
        Err(_) => plan::unplaced_size(&fleet, req),
    };
    if spot.is_ok() || except.is_none() {
        if let Err(msg) = usage.verdict(tenant, start, end, &size) {
            return Ok(Decision::OverQuota(msg));
        }
    }
    match spot {
        Ok(spot) => {
            if req.kind() == Kind::Timeslice
                && !share_fits(tx, &spot.gpu, size.memory_gib, window, except).await?
            {
                // Another share took the room since the plan: plan again.
                return Err(BookingError::Retry);
            }
            for m in &moves {
                let reason = format!(
                    "moved to {} GPU {} ({}), memory slices {}–{}, to make room for another booking; same time and profile",
                    m.gpu.node, m.gpu.idx, m.gpu.uuid, m.slices.0, m.slices.1
                );
                if !db::bookings::move_scheduled(
                    tx,
                    m.booking_id,
                    m.gpu.id,
                    m.slices,
                    notice,
                    &reason,
                )
                .await?
                {
                    // Its row is locked, but its start came within the
                    // notice meanwhile: plan again.
                    return Err(BookingError::Retry);
                }
            }
            Ok(Decision::Place { spot, size })
        }
        Err(refusal) => Ok(Decision::Queue {
            reason: plan::queued_reason(req, &refusal, start, end),
            offered: refusal.earliest_start.map(at),
            never: !plan::ever_fits(&fleet, req),
            refused: refusal.reason,
            size,
        }),
    }
}

/// The fleet a request of `kind` by `tenant` may land on, from the
/// placement index under the placement lock (the profile-mix statistic is
/// read before it, at most once a minute: a statistic over 30 days a minute
/// old serves as well, and the serialised section stays short).
async fn fleet_for(
    tx: &mut Transaction<'_, Postgres>,
    index: &PlacementIndex,
    kind: Kind,
    tenant: &Tenant,
) -> sqlx::Result<Fleet> {
    let asked = index.asked(tx, kind).await?;
    lock_placement(tx, kind).await?;
    let snap = index.snapshot(tx, kind).await?;
    Ok(plan::fleet_of(
        snap.gpus,
        &snap.placed,
        Some(kind),
        &tenant.quota.allowed_models,
        &asked,
    ))
}

/// The bookable GPUs (of `kind` only, when given) with their live bookings.
pub(super) async fn load_fleet(
    tx: &mut Transaction<'_, Postgres>,
    kind: Option<Kind>,
    allowed_models: &[String],
    asked: &Asked,
) -> sqlx::Result<Fleet> {
    let gpus = db::fleet::bookable(&mut **tx).await?;
    let placed = db::bookings::placed_live(tx, kind).await?;
    Ok(plan::fleet_of(gpus, &placed, kind, allowed_models, asked))
}

/// Serialises placement decisions of one kind across every process:
/// bookings that would all pick the same best slot queue here instead of
/// colliding on the exclusion constraint and planning again (which costs
/// O(n²) plans under a burst). Taken after the tenant's lock, always in
/// that order, and released at commit.
pub(super) async fn lock_placement(
    tx: &mut Transaction<'_, Postgres>,
    kind: Kind,
) -> sqlx::Result<()> {
    db::bookings::advisory_xact_lock(&mut **tx, &format!("gpuslice-placement:{}", kind.as_str()))
        .await
}

/// What a tenant holds beside a request over `[start, end)`: its live
/// bookings overlapping it and its booked slice-hours in each month it
/// touches (not counting booking `except`).
pub(super) struct QuotaUsage {
    held: Vec<rules::Held>,
    months: Vec<MonthUse>,
}

impl QuotaUsage {
    /// The quota verdict for adding `size` over `[start, end)`: `Err(msg)`
    /// when a limit says no.
    pub(super) fn verdict(
        &self,
        tenant: &Tenant,
        start: OffsetDateTime,
        end: OffsetDateTime,
        size: &Size,
    ) -> Result<(), String> {
        plan::quota_verdict(
            &tenant.quota,
            &tenant.slug,
            &self.held,
            &self.months,
            ts(start),
            ts(end),
            size,
        )
    }
}

pub(super) async fn quota_usage(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &Tenant,
    start: OffsetDateTime,
    end: OffsetDateTime,
    except: Option<i64>,
) -> Result<QuotaUsage, BookingError> {
    let held = db::bookings::tenant_live_between(&mut **tx, tenant.id, start, end, except).await?;
    let mut months = Vec::new();
    for (from, to) in rules::months_touched(ts(start), ts(end)) {
        let used = db::bookings::tenant_slice_hours(&mut **tx, tenant.id, at(from), at(to), except)
            .await?;
        months.push(MonthUse { from, to, used });
    }
    Ok(QuotaUsage { held, months })
}

/// The quota verdict for holding `size` over `[start, end)` beside the
/// tenant's other live bookings: `Ok(Err(msg))` when a limit says no.
pub(super) async fn check_quota(
    tx: &mut Transaction<'_, Postgres>,
    tenant: &Tenant,
    start: OffsetDateTime,
    end: OffsetDateTime,
    size: &Size,
    except: Option<i64>,
) -> Result<Result<(), String>, BookingError> {
    Ok(quota_usage(tx, tenant, start, end, except)
        .await?
        .verdict(tenant, start, end, size))
}

/// Locks a share's GPU and says whether a share of `memory_gib` fits on it
/// over `window` (memory and share count) beside what is on it now, not
/// counting booking `except`.
pub(super) async fn share_fits(
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
        .map(|p| plan::share_held(&p))
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

/// Another booking took the slot first (the exclusion constraint, by its
/// SQLSTATE) or the share's GPU filled up: plan again.
pub(super) fn is_lost_race(e: &BookingError) -> bool {
    matches!(e, BookingError::Retry)
        || matches!(e, BookingError::Db(err) if db::is_exclusion_violation(err) || db::is_deadlock(err))
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
        // Printable ASCII only, as the API's schema says: a header value may
        // also carry tabs, which would make two keys that look the same.
        if key.is_empty() || key.len() > 200 || !key.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
            return Err(BookingError::Invalid(vec![(
                "Idempotency-Key",
                "give 1 to 200 printable ASCII characters (no tabs)".into(),
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
    let index = index::for_pool(pool);
    let mut tx = pool.begin().await?;
    let tenant = db::tenants::get_for_update(&mut tx, tenant_id).await?;
    if tenant.archived {
        return Err(invalid(
            "tenant",
            format!("{} is archived and takes no bookings", tenant.slug),
        ));
    }
    let start = plan::check_request(req, &tenant, settings, super::now())?;
    let end = start + Duration::hours(i64::from(req.hours));
    let (status, size, spot, reason, offered) =
        match decide(&mut tx, &index, &tenant, req, start, end, None).await? {
            Decision::OverQuota(msg) => return Err(BookingError::Refused(msg)),
            Decision::Place { spot, size } => (Status::Scheduled, size, Some(spot), None, None),
            // Nothing in the fleet could ever take it: say so, book nothing.
            Decision::Queue {
                never: true,
                refused,
                ..
            } => return Err(BookingError::Refused(refused)),
            Decision::Queue {
                reason,
                offered,
                size,
                ..
            } => (Status::Queued, size, None, Some(reason), offered),
        };
    let id = db::bookings::insert(
        &mut *tx,
        &db::bookings::NewBooking {
            tenant_id,
            user_id: who.user_id,
            kind: req.kind(),
            requested_model: req.model.as_deref(),
            model: size.model.as_deref(),
            profile: match &req.what {
                Request::Mig { profile } => Some(profile),
                Request::Share { .. } => None,
            },
            memory_gib: size.memory_gib,
            compute_slices: size.compute_slices,
            priority: plan::priority_of(req, &tenant.quota),
            hours: req.hours,
            start,
            end,
            status,
            gpu_id: spot.as_ref().map(|s| s.gpu.id),
            slices: spot.as_ref().and_then(|s| s.slices),
            reason: reason.as_deref(),
            offered_start: offered,
            idempotency_key,
        },
        &who.email,
        reason.as_deref().unwrap_or("booked"),
    )
    .await?;
    tx.commit().await?;
    Ok(db::bookings::get(pool, id).await?)
}
