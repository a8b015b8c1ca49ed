//! libFuzzer target `norms_vjp`: decodes the input into a sequence of calls of the head split's
//! and the gated norm's backward passes (harness/norms/vjp.rs) and checks every status, message,
//! result shape and handle.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::run(harness::Target::NormsVjp, data);
});
