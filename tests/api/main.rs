//! The safe Rust API (`mlxkern::Array` and the kernels' builders) against the C ABI on the same
//! inputs: the kernels (`kernels`), their gradients (`grad`) and the chunked form's
//! (`vjp_chunked`); the pool calls' faults (`faults`).
//!
//! Own binaries beside this one, since they need the process alone: `array.rs` (sets the
//! process's memory limit), `decode.rs` and `pool.rs` (count the process's in-place updates).

#[path = "../support/mod.rs"]
mod support;

mod faults;
mod grad;
mod kernels;
mod vjp_chunked;
