//! Placement: where a request goes, and how fragmented the fleet becomes.
//! Pure code (no IO, no async); time and randomness come in as arguments.
//!
//! The node-level engine of FGD's trace replay, used only by the benchmark,
//! lives in `bench::cluster`.
//!
//! [`mig`] places MIG bookings over time (allowed placements, no overlap
//! in space and time, earliest start on refusal) and measures stranded
//! slices; [`shares`] does the same for time-sliced shares, whole GPUs and
//! several GPUs on one node.

pub mod mig;
pub mod shares;

/// Placement keeps room for what tenants asked for in this many days (MIG
/// profiles, share sizes): the window the booking path's counts cover
/// (`db::bookings::recent_profile_counts`, `recent_share_counts`) and
/// `bench mig` replays.
pub const ASKED_WINDOW_DAYS: i32 = 30;
