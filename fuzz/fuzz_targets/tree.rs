//! libFuzzer target `tree`: decodes the input into calls of the tree verify and commit
//! (harness/tree.rs) and checks every status, message, result and handle against chain
//! verifies and commits.
#![no_main]

#[path = "../harness/mod.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::run(harness::Target::Tree, data);
});
