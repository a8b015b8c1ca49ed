//! libFuzzer target `pool`: decodes the input into calls of the pool and packed functions
//! (harness/pool.rs) and checks every status, message, result and handle against the dense
//! calls.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::run(harness::Target::Pool, data);
});
