//! The gated norm (`mlxk_gated_rms_norm`) through the C ABI: the forward (`forward`) and its
//! backward (`vjp`). Its vectorized kernels against the portable ones are in tests/paths/.

#[path = "../support/mod.rs"]
mod support;

mod forward;
mod vjp;
