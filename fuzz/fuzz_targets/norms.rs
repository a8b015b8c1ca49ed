//! libFuzzer target `norms`: decodes the input into a sequence of C ABI calls
//! (harness/norms/forward.rs) and checks every status, message, result shape and handle.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::run(harness::Target::Norms, data);
});
