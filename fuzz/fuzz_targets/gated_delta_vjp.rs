//! libFuzzer target `gated_delta_vjp`: decodes the input into a sequence of calls of the
//! update's backward pass (harness/gated_delta/vjp.rs) and checks every status, message, result
//! shape and handle.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::run(harness::Target::GatedDeltaVjp, data);
});
