//! GPUs: the catalog of models and MIG profiles, NVIDIA's placement rules,
//! the backend trait and the simulated backend.

pub mod backend;
pub mod catalog;
pub mod codes;
pub mod fleet;
pub mod mig;
pub mod nvml;
pub mod sim;

pub use backend::{
    BackendError, DeviceSample, EventKind, GpuBackend, GpuEvent, GpuInfo, GpuProcess, Instance,
    Telemetry,
};
