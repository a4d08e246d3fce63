//! Placement: where a request goes, and how fragmented the fleet becomes.
//! Pure code (no IO, no async); time and randomness come in as arguments.
//!
//! [`cluster`] is the node-level engine for GPU-sharing workloads (whole
//! GPUs, several GPUs on one node, fractions of a GPU, CPU and memory on the
//! node, GPU-model constraints), with the fragmentation measure of FGD
//! (Weng et al., USENIX ATC '23) and the policies the replay benchmark
//! compares.

//! [`mig`] places MIG bookings over time (allowed placements, no overlap
//! in space and time, earliest start on refusal) and measures stranded
//! slices; [`shares`] does the same for time-sliced shares, whole GPUs and
//! several GPUs on one node.

pub mod cluster;
pub mod mig;
pub mod shares;
