//! mlxkern: the inference kernels of Qwen3.5's linear attention (Gated DeltaNet) and the
//! GLM-5.2 expert-slot layout, on MLX, behind a C ABI.
//!
//! The C surface is in [`capi`] (and `include/mlxkern.h`, generated from it). Underneath:
//! [`bridge`] (MLX's C++ API through cxx), [`registry`] (live handles and the MLX lock),
//! `ops/` (validation and graph building per kernel), `cpu/` (the CPU kernels in Rust) and
//! `metal` (launch descriptions for the Metal sources in `kernels/metal/`).

#![deny(unsafe_op_in_unsafe_fn)]

#[doc(hidden)]
pub mod bridge;
pub mod capi;
pub mod cpu;
pub mod cuda;
mod dtype;
mod error;
pub mod glm52;
mod handle;
mod memory;
pub mod metal;
pub mod node;
mod ops;
mod registry;
#[doc(hidden)]
pub mod testing;

pub use dtype::Dtype;
pub use error::Error;

/// The header cbindgen generated for this build (tests compare it with `include/mlxkern.h`).
#[doc(hidden)]
pub const GENERATED_HEADER: &str = include_str!(concat!(env!("OUT_DIR"), "/mlxkern.h"));

/// The MLX package folder this build links against.
#[doc(hidden)]
pub const MLX_DIR: &str = env!("MLXK_MLX_DIR");
