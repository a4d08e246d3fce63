//! Ending a booking early (cancel before its start, release while it holds
//! a device) and extending one.

use sqlx::PgPool;
use time::Duration;

use super::decide::{check_quota, share_fits};
use super::plan::Size;
use super::{invalid, ts, ts_end, visible, when, BookingError, Requester};
use crate::db::{self, bookings::Booking};
use crate::domain::booking::{self as rules, Kind, Step, Transition};
use crate::placement::mig::Window;

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
    // Checked as sent (the API document's limits are on the text as sent),
    // then kept trimmed.
    if let Some(r) = reason {
        if r.chars().count() > super::MAX_REASON_CHARS {
            return Err(invalid(
                "reason",
                format!("say it in at most {} characters", super::MAX_REASON_CHARS),
            ));
        }
        if r.chars().any(char::is_control) {
            return Err(invalid(
                "reason",
                "write the reason on one line, without control characters",
            ));
        }
    }
    let reason = reason.map(str::trim).filter(|r| !r.is_empty());
    let b = visible(pool, who, id).await?;
    let owner = b.user_id == who.user_id;
    if !owner {
        if !(who.is_admin || who.manages(b.tenant_id)) {
            return Err(BookingError::NotFound);
        }
        if reason.is_none() {
            return Err(invalid("reason", "say why you end someone else's booking"));
        }
    }
    let mut tx = pool.begin().await?;
    let (status, _) = db::bookings::lock(&mut tx, id).await?;
    let why = reason.unwrap_or(if owner { "released by its owner" } else { "" });
    // Before its start it is cancelled; holding a device, it is released.
    let t = Transition::of(status, Step::Cancel, None)
        .or_else(|_| Transition::of(status, Step::Release, None))
        .map_err(|_| {
            BookingError::Refused(format!(
                "booking {id} is {status}: there is nothing to release"
            ))
        })?;
    let done = db::bookings::transition(&mut tx, id, t, &who.email, Some(why)).await?;
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
    // More time is a new grant: the tenant must still be live and the owner
    // still an active member of it (an admin extends only such bookings too).
    if tenant.archived {
        return Err(BookingError::Refused(format!(
            "tenant {} is archived; its bookings cannot be extended",
            tenant.slug
        )));
    }
    let owner = db::users::get(&mut *tx, b.user_id).await?;
    let member = db::users::memberships(&mut *tx, b.user_id)
        .await?
        .iter()
        .any(|m| m.tenant_id == b.tenant_id);
    if owner.disabled || !member {
        return Err(BookingError::Refused(format!(
            "the booking's owner is no longer an active member of {}; it cannot be extended",
            tenant.slug
        )));
    }
    let (status, _) = db::bookings::lock(&mut tx, id).await?;
    if !status.can_extend() {
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
    let size = Size {
        memory_gib: b.memory_gib,
        compute_slices: b.compute_slices,
        model: b.model.clone(),
    };
    check_quota(&mut tx, &tenant, b.end, new_end, &size, Some(id))
        .await?
        .map_err(BookingError::Refused)?;
    if b.kind == Kind::Timeslice {
        let gpu_id = b.gpu_id.ok_or(BookingError::NotFound)?;
        let gpus = db::fleet::bookable(&mut *tx).await?;
        let gpu = gpus.iter().find(|g| g.id == gpu_id).ok_or_else(|| {
            BookingError::Refused("the booking's GPU takes no new bookings now".into())
        })?;
        let ext = Window {
            start: ts(b.end),
            end: ts_end(new_end),
        };
        if !share_fits(&mut tx, gpu, b.memory_gib, ext, Some(id)).await? {
            return Err(BookingError::Refused(format!(
                "the GPU is booked by others after {}; release and book again elsewhere",
                when(b.end)
            )));
        }
    }
    if b.kind == Kind::Mig {
        // A move of bookings ahead checks the overlap constraint at commit:
        // an extension racing it into the same slot would deadlock with
        // it. Extensions wait for placements instead (tenant, booking row,
        // then placement: no placement waits for a booking row).
        super::decide::lock_placement(&mut tx, Kind::Mig).await?;
    }
    match db::bookings::set_end(&mut tx, id, new_end, total).await {
        Err(e) if db::is_exclusion_violation(&e) => {
            return Err(BookingError::Refused(format!(
                "the slot is booked by someone else after {}",
                when(b.end)
            )))
        }
        other => other?,
    }
    db::bookings::note(
        &mut *tx,
        id,
        &who.email,
        status,
        &format!("extended by {more_hours} h to {}", when(new_end)),
    )
    .await?;
    tx.commit().await?;
    Ok(db::bookings::get(pool, id).await?)
}

/// "Still working": the owner says an idle booking is in use; its idle
/// clock starts again (and a warning is withdrawn).
pub async fn keep(pool: &PgPool, who: &Requester, id: i64) -> Result<Booking, BookingError> {
    let b = visible(pool, who, id).await?;
    if b.user_id != who.user_id {
        return Err(BookingError::Forbidden(
            "only the booking's owner can say it is still in use".into(),
        ));
    }
    let mut tx = pool.begin().await?;
    if !db::idle::keep(&mut *tx, id).await? {
        return Err(BookingError::Refused(format!(
            "booking {id} is {}, not active: there is nothing to keep",
            b.status
        )));
    }
    if b.idle_since.is_some() {
        db::bookings::note(
            &mut *tx,
            id,
            &who.email,
            crate::domain::booking::Status::Active,
            "still working: the idle clock starts again",
        )
        .await?;
    }
    tx.commit().await?;
    Ok(db::bookings::get(pool, id).await?)
}
