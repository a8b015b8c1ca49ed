//! The gated delta family through the C ABI, one module per form (as in src/): the exact
//! update (`update`) and its backward (`vjp`), the chunked form (`chunked`, its CPU kernel
//! `chunked_kernel`, its backward `chunked_vjp` and the GPU backward's graph without a GPU
//! `chunked_vjp_gpu`), the update from the convolution's output (`from_conv`), the prefix-state
//! replay (`state`), the pool and packed calls (`pool`) and the draft trees on a pool (`tree`).
//!
//! Tests that need the process alone are binaries of their own: `in_place.rs` (counts the
//! in-place updates of the process) and `launch/` (records the last GPU launch, forces the
//! in-place pool launch); the pool's argument errors are in tests/misuse/ (live-handle count).

#[path = "../support/mod.rs"]
mod support;

mod chunked;
mod chunked_kernel;
mod chunked_vjp;
mod chunked_vjp_gpu;
mod from_conv;
mod pool;
mod state;
mod tree;
mod update;
mod vjp;
