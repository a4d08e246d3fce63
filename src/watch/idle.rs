//! Idle reclaim: an active booking of a tenant with an idle policy whose
//! device shows no running work (no processes, utilisation under the
//! threshold where it is measured) for the policy's minutes is idle; its
//! owner is warned (e-mail, banner, a line on its timeline) and may answer
//! "still working" (`POST /api/v1/bookings/{id}/keep`), which starts the
//! clock again; without an answer, after the grace minutes, a `release`
//! policy ends the booking with the reason `idle` (its quota is free at
//! once; the queue planner places waiting bookings at its next tick).
//!
//! Only fresh samples count: with no telemetry (a node down, a backend
//! that cannot tell) nothing is warned or released, and a clock that was
//! running stops (a warning is withdrawn). Every write is conditional and
//! re-checked under the booking's lock, so several processes running this
//! round cannot warn or release twice, and an answer or new work that
//! arrives during a round wins.

use sqlx::PgPool;

use crate::booking::when;
use crate::db::{self, idle::Candidate};
use crate::domain::booking::Status;
use crate::domain::lifecycle::{Step, Transition};
use crate::domain::IdleAction;

/// The actor of idle reclaim's timeline lines and audit entries.
pub const ACTOR: &str = "idle-reclaim";
/// The reason a booking released for being idle carries.
pub const REASON: &str = "idle";

/// What one round did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub started: usize,
    pub warned: usize,
    pub released: usize,
    pub cleared: usize,
}

/// Whether a sample shows work: processes on the device, or utilisation at
/// or above `threshold_pct`. `None`: it cannot tell.
pub fn busy(
    processes: Option<i32>,
    utilization_pct: Option<f32>,
    threshold_pct: f32,
) -> Option<bool> {
    match (processes, utilization_pct) {
        (Some(n), _) if n > 0 => Some(true),
        (_, Some(u)) if u >= threshold_pct => Some(true),
        (Some(_), _) => Some(false),
        (None, Some(_)) => Some(false),
        (None, None) => None,
    }
}

/// One round over every candidate. `fresh_secs`: how old a sample may be
/// and still count.
pub async fn round(pool: &PgPool, threshold_pct: f32, fresh_secs: f64) -> anyhow::Result<Round> {
    let mut out = Round::default();
    for c in db::idle::candidates(pool).await? {
        let (Some(at), Some(age)) = (c.sample_at, c.sample_age_secs) else {
            continue;
        };
        if age > fresh_secs {
            // Telemetry stopped: the clock does not run on without it.
            if c.idle_since.is_some() || c.warned_at.is_some() {
                db::idle::clear(pool, c.id).await?;
                out.cleared += 1;
            }
            continue;
        }
        if c.kept_at.is_some_and(|k| at <= k) {
            continue;
        }
        match busy(c.processes, c.utilization_pct, threshold_pct) {
            None => continue,
            Some(true) => {
                if c.idle_since.is_some() || c.warned_at.is_some() {
                    db::idle::clear(pool, c.id).await?;
                    out.cleared += 1;
                }
            }
            Some(false) => {
                if c.idle_since.is_none() {
                    db::idle::start(pool, c.id, at).await?;
                    out.started += 1;
                    continue;
                }
                let idle_secs = c.idle_secs.unwrap_or(0.0);
                match c.warned_secs {
                    None if idle_secs >= f64::from(c.after_minutes) * 60.0 => {
                        out.warned += usize::from(warn(pool, &c).await?);
                    }
                    Some(w)
                        if c.action == IdleAction::Release
                            && w >= f64::from(c.grace_minutes) * 60.0 =>
                    {
                        out.released += usize::from(release(pool, &c).await?);
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(out)
}

async fn warn(pool: &PgPool, c: &Candidate) -> anyhow::Result<bool> {
    let mut tx = pool.begin().await?;
    if !db::idle::mark_warned(&mut tx, c.id, c.after_minutes).await? {
        return Ok(false);
    }
    let b = db::bookings::get(&mut *tx, c.id).await?;
    let then = match c.action {
        IdleAction::Release => format!(
            "it will be released in {} minutes unless you say you are still working",
            c.grace_minutes
        ),
        IdleAction::Notify => "please release it if you are done".to_string(),
    };
    let line = format!(
        "idle for {} minutes (no processes, GPU under the idle threshold); {then}",
        c.after_minutes
    );
    db::bookings::note(&mut *tx, c.id, ACTOR, Status::Active, &line).await?;
    let body = format!(
        "Your booking {} ({} on {}, until {}) has had no work on its GPU for {} minutes.\n\
         Tenant {} gives idle GPUs back to others: {then}.\n\n\
         Still working? Open the booking and press \"Still working\", or run\n  \
         curl -X POST -H 'Authorization: Bearer <token>' <gpuslice>/api/v1/bookings/{}/keep\n",
        c.id,
        b.profile.as_deref().unwrap_or("a share"),
        b.model.as_deref().unwrap_or("a GPU"),
        when(b.end),
        c.after_minutes,
        c.tenant_slug,
        c.id
    );
    db::notify::email_user(
        &mut tx,
        c.user_id,
        &db::notify::Message {
            topic: "booking_idle",
            subject: &format!("Booking {} is idle", c.id),
            body: &body,
            alert_id: None,
            booking_id: Some(c.id),
        },
    )
    .await?;
    db::audit::record(
        &mut *tx,
        &db::audit::Actor::system(ACTOR),
        "booking.idle_warned",
        &format!("booking {}", c.id),
        serde_json::json!({ "owner": b.user_email, "tenant": c.tenant_slug, "idle_minutes": c.after_minutes, "action": c.action }),
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

async fn release(pool: &PgPool, c: &Candidate) -> anyhow::Result<bool> {
    let mut tx = pool.begin().await?;
    let (status, _) = db::bookings::lock(&mut tx, c.id).await?;
    let Ok(t) = Transition::of(status, Step::Release, None) else {
        return Ok(false);
    };
    // Under the lock: an answer or new work since the round read it wins.
    if !db::idle::release_due(&mut tx, c.id, c.grace_minutes).await? {
        return Ok(false);
    }
    let why = format!(
        "{REASON}: no work on its GPU for {} minutes and no answer to the warning within {} minutes",
        c.after_minutes, c.grace_minutes
    );
    if !db::bookings::transition(&mut tx, c.id, t, ACTOR, Some(&why)).await? {
        return Ok(false);
    }
    db::idle::set_reason(&mut tx, c.id, REASON).await?;
    let b = db::bookings::get(&mut *tx, c.id).await?;
    db::audit::record(
        &mut *tx,
        &db::audit::Actor::system(ACTOR),
        "booking.idle_released",
        &format!("booking {}", c.id),
        serde_json::json!({ "owner": b.user_email, "tenant": c.tenant_slug, "reason": why }),
    )
    .await?;
    db::notify::email_user(
        &mut tx,
        c.user_id,
        &db::notify::Message {
            topic: "booking_idle",
            subject: &format!("Booking {} was released: idle", c.id),
            body: &format!(
                "Your booking {} ({} on {}) was released because {}.\n\
                 Its quota is free again; book again when you need a GPU.\n",
                c.id,
                b.profile.as_deref().unwrap_or("a share"),
                b.model.as_deref().unwrap_or("a GPU"),
                why.trim_start_matches("idle: ")
            ),
            alert_id: None,
            booking_id: Some(c.id),
        },
    )
    .await?;
    tx.commit().await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::busy;

    #[test]
    fn work_is_processes_or_utilisation_and_unknown_is_not_idle() {
        assert_eq!(busy(Some(1), None, 5.0), Some(true));
        assert_eq!(busy(Some(0), Some(40.0), 5.0), Some(true));
        assert_eq!(busy(Some(0), Some(4.9), 5.0), Some(false));
        assert_eq!(busy(Some(0), None, 5.0), Some(false));
        assert_eq!(busy(None, Some(2.0), 5.0), Some(false));
        assert_eq!(busy(None, None, 5.0), None);
    }
}
