//! The NVML return codes (`nvmlReturn_t` in NVIDIA's `nvml.h`) both GPU
//! backends answer in, so that the simulation, the stand-in library and a
//! real driver can be held to the same answers.

pub const SUCCESS: u32 = 0;
pub const INVALID_ARGUMENT: u32 = 2;
pub const NOT_SUPPORTED: u32 = 3;
pub const NOT_FOUND: u32 = 6;
pub const GPU_IS_LOST: u32 = 15;
pub const IN_USE: u32 = 19;
pub const INSUFFICIENT_RESOURCES: u32 = 23;
