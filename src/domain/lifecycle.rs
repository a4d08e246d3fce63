//! The life of a booking: its statuses and the one table of legal moves
//! between them. Nothing else decides whether a move is allowed or which
//! statuses are live; the database layer takes a [`Transition`], which
//! only [`Transition::of`] makes.
//!
//! ```text
//! (new) ──> queued ──Place──> scheduled ──Start──> provisioning ──Ready──> active
//!             │                  │                    │                     │
//!             └──Cancel──────────┴─> cancelled        │                     │
//!                                 Release | Fail ─────┴─────> releasing <───┘ Release | Expire | Fail
//!                                                               │
//!                                                               └──Finish──> released | expired | failed
//! ```
//! A `scheduled` booking that cannot be set up fails through `releasing`
//! too, so the worker tears down whatever it half made.

text_enum! {
    /// The statuses of a booking (see architecture.md). Stored as lower-case
    /// text in `bookings.status` and `booking_events`.
    pub enum Status {
        Queued = "queued",
        Scheduled = "scheduled",
        Provisioning = "provisioning",
        Active = "active",
        Releasing = "releasing",
        Released = "released",
        Expired = "expired",
        Cancelled = "cancelled",
        Failed = "failed",
    }
}

impl Status {
    /// The statuses that hold or wait for capacity and count against quota.
    /// The schema's exclusion constraint and partial indexes repeat the
    /// placed part of this list (all but `queued`) in SQL; a test checks
    /// the two agree.
    pub const LIVE: [Status; 5] = [
        Status::Queued,
        Status::Scheduled,
        Status::Provisioning,
        Status::Active,
        Status::Releasing,
    ];

    /// The statuses a booking ends in.
    pub const FINAL: [Status; 4] = [
        Status::Released,
        Status::Expired,
        Status::Cancelled,
        Status::Failed,
    ];

    /// Holds (or waits for) capacity and counts against quota.
    pub fn is_live(self) -> bool {
        Status::LIVE.contains(&self)
    }

    /// Holds a slot on a GPU (live and placed): what the schema's
    /// exclusion constraint covers.
    pub fn is_placed(self) -> bool {
        self.is_live() && self != Status::Queued
    }

    /// May be made longer: before its start or while it runs.
    pub fn can_extend(self) -> bool {
        matches!(self, Status::Scheduled | Status::Active)
    }

    /// Whether `step` is a legal move from here.
    pub fn allows(self, step: Step) -> bool {
        Transition::of(self, step, None).is_ok()
    }
}

/// What happens to a booking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// The queue planner found it a slot.
    Place,
    /// Its start came; the node's worker sets up the device.
    Start,
    /// The device is ready.
    Ready,
    /// Ended before it started.
    Cancel,
    /// Ended early by a person (or reclaimed): torn down, then `released`.
    Release,
    /// Reached its end: torn down, then `expired`.
    Expire,
    /// Could not be set up or lost its device: torn down, then `failed`.
    Fail,
    /// Torn down: becomes what the release asked for.
    Finish,
}

/// A legal move, made only by [`Transition::of`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    from: Status,
    to: Status,
    /// For moves into `releasing`: the status it ends as once torn down.
    ending: Option<Status>,
}

/// A move the table does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a booking that is {from} cannot {step:?}")]
pub struct Illegal {
    pub from: Status,
    pub step: Step,
}

impl Transition {
    /// The move `step` makes from `from`. `ending` is what a `releasing`
    /// booking was to become (only read by [`Step::Finish`]; `None` there
    /// means `released`).
    pub fn of(from: Status, step: Step, ending: Option<Status>) -> Result<Transition, Illegal> {
        use Status::*;
        let to = |to: Status, ending: Option<Status>| Transition { from, to, ending };
        let t = match (from, step) {
            (Queued, Step::Place) => to(Scheduled, None),
            (Scheduled, Step::Start) => to(Provisioning, None),
            (Provisioning, Step::Ready) => to(Active, None),
            (Queued | Scheduled, Step::Cancel) => to(Cancelled, None),
            (Provisioning | Active, Step::Release) => to(Releasing, Some(Released)),
            (Active, Step::Expire) => to(Releasing, Some(Expired)),
            (Scheduled | Provisioning | Active, Step::Fail) => to(Releasing, Some(Failed)),
            (Releasing, Step::Finish) => match ending.unwrap_or(Released) {
                e @ (Released | Expired | Failed) => to(e, None),
                _ => return Err(Illegal { from, step }),
            },
            _ => return Err(Illegal { from, step }),
        };
        Ok(t)
    }

    pub fn from(self) -> Status {
        self.from
    }

    pub fn to(self) -> Status {
        self.to
    }

    /// For a move into `releasing`: the status after the teardown.
    pub fn ending(self) -> Option<Status> {
        self.ending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STEPS: [Step; 8] = [
        Step::Place,
        Step::Start,
        Step::Ready,
        Step::Cancel,
        Step::Release,
        Step::Expire,
        Step::Fail,
        Step::Finish,
    ];

    #[test]
    fn final_statuses_have_no_way_out() {
        for s in Status::FINAL {
            assert!(!s.is_live());
            for step in STEPS {
                assert!(Transition::of(s, step, None).is_err(), "{s} {step:?}");
            }
        }
    }

    #[test]
    fn every_live_status_can_end() {
        // Each live status reaches a final one by legal moves.
        for s in Status::LIVE {
            let mut at = s;
            let mut ending = None;
            for _ in 0..6 {
                if Status::FINAL.contains(&at) {
                    break;
                }
                let t = STEPS
                    .iter()
                    .find_map(|step| Transition::of(at, *step, ending).ok())
                    .unwrap();
                ending = t.ending().or(ending);
                at = t.to();
            }
            assert!(Status::FINAL.contains(&at), "{s} got stuck at {at}");
        }
    }

    #[test]
    fn releasing_ends_as_asked() {
        let t = Transition::of(Status::Active, Step::Expire, None).unwrap();
        assert_eq!(
            (t.to(), t.ending()),
            (Status::Releasing, Some(Status::Expired))
        );
        let f = Transition::of(Status::Releasing, Step::Finish, t.ending()).unwrap();
        assert_eq!(f.to(), Status::Expired);
        assert!(Transition::of(Status::Releasing, Step::Finish, Some(Status::Active)).is_err());
    }

    #[test]
    fn names_round_trip() {
        for s in Status::ALL {
            assert_eq!(Status::named(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert!(Status::is_placed(Status::Active) && !Status::is_placed(Status::Queued));
    }
}
