//! A booking as a stranger sends it: the booking form's URL-encoded body
//! and the API's JSON body. Parsing never panics, and whatever it accepts
//! is within the documented bounds.
#![no_main]

use gpuslice::domain::booking::{BookingInput, MAX_HOURS};
use libfuzzer_sys::fuzz_target;

fn check(input: &BookingInput) {
    if let Ok(req) = input.parse() {
        assert!((1..=MAX_HOURS).contains(&req.hours));
        assert!(!req.tenant.as_str().is_empty());
    }
}

fuzz_target!(|data: &[u8]| {
    if let Ok(form) = serde_urlencoded::from_bytes::<BookingInput>(data) {
        check(&form);
    }
    if let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) {
        if let Ok(input) = gpuslice::web::api::input_from_json(&json) {
            check(&input);
        }
    }
});
