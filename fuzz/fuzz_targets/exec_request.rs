//! The `exec` socket's request line, which any local user can send:
//! parsing never panics and accepts only a positive booking id.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some(req) = gpuslice::sched::exec::parse_request(data) {
        assert!(req.booking > 0);
    }
});
