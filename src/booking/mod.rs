//! The booking rules, one set for pages, API and queue planner: quota over
//! the whole window in every dimension, the monthly budget, placement
//! through the placement engine (time-aware), the queue, release, cancel
//! and extension. Two independent guards keep bookings apart: the
//! tenant's row lock around check and insert, and the database's exclusion
//! constraint on MIG slots (a share locks its GPU's row for its capacity
//! check).
//!
//! - [`plan`]: the pure rules (request checks, quota over the held
//!   bookings, where a request fits, why it waits, queue order);
//! - `decide`: the one transactional decision a new booking and the queue
//!   planner share (read the fleet under the placement lock, plan, check
//!   quota, lock a share's GPU), and [`create`];
//! - `queue`: the queue planner;
//! - `lifecycle`: release, cancel and extension;
//! - `offerings`: what can be booked now, and a tenant's use for the bars;
//! - [`availability`]: when a request would fit, GPU by GPU (timeline, API);
//! - [`index`]: the placement index (the fleet in memory, kept exact by a
//!   change log the database writes).

pub mod availability;
mod decide;
pub mod index;
mod lifecycle;
mod offerings;
pub mod plan;
mod queue;

use sqlx::PgPool;
use time::OffsetDateTime;

use crate::db::{self, bookings::Booking};

pub use decide::create;

/// The longest reason for ending a booking (it goes to the audit log and
/// the owner's e-mail).
pub const MAX_REASON_CHARS: usize = 500;
pub use lifecycle::{extend, keep, release};
pub use offerings::{offerings, quota_use, Offering, QuotaUse};
pub use queue::{plan_queue, Planner};

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
    /// The rules contradict themselves (a bug, logged; the user sees a
    /// plain 500).
    #[error("{0}")]
    Internal(String),
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

/// Unix seconds, rounded up: a window's end, so that a window in whole
/// seconds covers the booking (as placement reads them: `Placed`).
fn ts_end(t: OffsetDateTime) -> i64 {
    t.unix_timestamp() + i64::from(t.nanosecond() > 0)
}

fn at(secs: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(secs).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// Now, to the second (bookings start and end on whole seconds).
fn now() -> OffsetDateTime {
    let t = OffsetDateTime::now_utc();
    t.replace_nanosecond(0).unwrap_or(t)
}

/// `2026-12-24 14:00 UTC` style for messages.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_in_whole_seconds_covers_the_booking() {
        let whole = at(1_800_000_000);
        assert_eq!((ts(whole), ts_end(whole)), (1_800_000_000, 1_800_000_000));
        // 0.3 s into a second: the start from that second, the end to the
        // next one.
        let inside = whole + time::Duration::milliseconds(300);
        assert_eq!((ts(inside), ts_end(inside)), (1_800_000_000, 1_800_000_001));
    }
}
