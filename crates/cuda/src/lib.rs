//! What gpuslice's launch-layer shim, the worker that schedules it and the
//! stand-in `libcuda.so` share: the CUDA driver API's types and constants
//! (declared from NVIDIA's public CUDA Driver API reference, so no CUDA
//! toolkit is needed to build), and the memory layouts they exchange
//! through shared files.
//!
//! Everything here is plain data and atomics in `#[repr(C)]` structs that
//! several processes map at once; nothing allocates or locks.

pub mod api;
pub mod region;
pub mod standin;

/// CLOCK_MONOTONIC in nanoseconds: one clock for every process on the
/// machine (the shim's gate, the worker's turns, the stand-in's timeline).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
