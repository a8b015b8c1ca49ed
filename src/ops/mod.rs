//! Validation and graph building, one module per kernel. Everything here runs under the MLX
//! lock, called from the C ABI in `crate::capi`.

pub mod array;
pub mod device;
pub mod gated_delta;
pub mod gated_rms_norm;
pub mod shape;
pub mod silu_rms_heads;
