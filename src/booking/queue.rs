//! The queue planner: places waiting bookings as capacity frees, in the
//! order of [`plan::queue_order`], through the same decision as a new
//! booking.

use std::collections::HashSet;

use sqlx::PgPool;
use time::Duration;

use super::decide::{decide, is_lost_race, Decision};
use super::{now, plan, BookingError};
use crate::db;
use crate::domain::booking::{BookingRequest, Request, Status};
use crate::domain::Slug;

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

/// Tries to place every queued booking once, in queue order. Returns how
/// many were placed.
pub async fn plan_queue(pool: &PgPool) -> Result<usize, BookingError> {
    let queued = db::bookings::queued(pool).await?;
    let mut placed = 0;
    // Shapes that found no room in this pass: an identical request behind
    // them would not either (placing others only takes capacity away).
    let mut no_room: HashSet<String> = HashSet::new();
    for id in plan::queue_order(&queued) {
        match place_one(pool, id, &mut no_room).await {
            Ok(true) => placed += 1,
            Ok(false) => {}
            Err(e) if is_lost_race(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(placed)
}

async fn place_one(
    pool: &PgPool,
    id: i64,
    no_room: &mut HashSet<String>,
) -> Result<bool, BookingError> {
    let now = now();
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
    let index = super::index::for_pool(pool);
    let mut tx = pool.begin().await?;
    let tenant = db::tenants::get_for_update(&mut tx, b.tenant_id).await?;
    if db::bookings::lock(&mut tx, id).await?.0 != Status::Queued {
        return Ok(false);
    }
    let req = BookingRequest {
        tenant: Slug::parse(&b.tenant_slug).map_err(|e| BookingError::Internal(e.to_string()))?,
        what: match &b.profile {
            Some(p) => Request::Mig { profile: p.clone() },
            None => Request::Share {
                memory_gib: b.memory_gib,
                priority: Some(b.priority),
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
    match decide(&mut tx, &index, &tenant, &req, start, end, Some(id)).await? {
        Decision::Place { spot, size } => {
            let ok = db::bookings::place_queued(
                &mut tx,
                id,
                spot.gpu.id,
                &spot.model,
                spot.slices,
                size.compute_slices,
                size.memory_gib,
                start,
                end,
            )
            .await?;
            tx.commit().await?;
            Ok(ok)
        }
        Decision::OverQuota(msg) => {
            db::bookings::set_reason(&mut *tx, id, &format!("waiting for quota: {msg}"), None)
                .await?;
            tx.commit().await?;
            Ok(false)
        }
        Decision::Queue {
            reason, offered, ..
        } => {
            if tenant.quota.allowed_models.is_empty() {
                no_room.insert(shape);
            }
            db::bookings::set_reason(&mut *tx, id, &reason, offered).await?;
            tx.commit().await?;
            Ok(false)
        }
    }
}
