//! Benchmarks that run from the command line (`gpuslice bench ...`).

pub mod cluster;
pub mod history;
pub mod latency;
pub mod launch;
pub mod mig;
pub mod replay;
pub mod scheduler;
pub mod telemetry;
