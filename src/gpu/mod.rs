//! GPUs: the catalog of models and MIG profiles, and the rules NVIDIA
//! applies to GPU-instance placement.

pub mod catalog;
pub mod mig;
