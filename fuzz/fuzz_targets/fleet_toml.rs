//! The fleet file of the simulated backend (TOML an admin writes): parsing
//! never panics, and an accepted fleet has GPUs of catalog models only.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(fleet) = gpuslice::gpu::fleet::Fleet::parse(text) {
        let _ = format!("{fleet:?}");
    }
});
