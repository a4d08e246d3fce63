//! Time-sliced GPUs on a node: the scheduler's pure state machine
//! ([`scheduler`]), the per-booking cgroups it enforces with ([`cgroup`]), the
//! enforcer thread that freezes and thaws them in turn ([`enforce`]), the
//! node's share supervisor that runs one enforcer per shared GPU and
//! reports to the database ([`shares`]), and `gpuslice exec`, which moves a
//! user's process into its booking's cgroup ([`exec`]).

pub mod cgroup;
pub mod container;
pub mod devices;
pub mod enforce;
pub mod exec;
pub mod launch;
pub mod lockdown;
pub mod procfs;
pub mod scheduler;
pub mod shares;
