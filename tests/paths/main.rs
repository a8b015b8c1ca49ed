//! The CPU kernels' paths against each other, bit for bit: the portable code, the AVX2 code
//! (forced where the CPU has AVX-512) and the fastest, for the gated delta update and its
//! backward, the head split and the gated norm. The switches that force a path are
//! process-wide: every test here holds `support::serial`, and nothing else shares the binary.

#[path = "../support/mod.rs"]
mod support;

mod gated_delta;
mod gated_delta_vjp;
mod gated_rms_norm;
mod silu_rms_heads;
