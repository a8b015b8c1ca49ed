//! libFuzzer target `gated_delta`: decodes the input into a sequence of C ABI calls
//! (harness/gated_delta/forward.rs) and checks every status, message, result shape and handle.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::run(harness::Target::GatedDelta, data);
});
