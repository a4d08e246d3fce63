//! gpuslice: book slices of NVIDIA GPUs (MIG instances and time-sliced
//! shares) in a browser. The library holds everything; `main.rs` only parses
//! the command line. Tests drive [`web::router`] and the CLI functions.

pub mod bench;
pub mod booking;
pub mod cli;
pub mod db;
pub mod domain;
pub mod gpu;
pub mod placement;
pub mod sched;
pub mod watch;
pub mod web;
pub mod worker;

pub use web::{router, AppState};
