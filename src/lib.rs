//! mlxkern: the kernels of Qwen3.5's linear attention (Gated DeltaNet) and the GLM-5.2
//! expert-slot layout, on [MLX](https://github.com/ml-explore/mlx).
//!
//! This crate is a safe Rust API over the kernels, and the C ABI (`include/mlxkern.h`, the
//! `cdylib` and `staticlib` this package also builds) is a second face on the same core: both
//! check arguments the same way and report the same errors.
//!
//! - [`Array`]: an MLX array owned by Rust code (from slices, zeros; shape, dtype, eval, reads,
//!   [`astype`](Array::astype)). Kernels are lazy: results are computed by [`Array::eval`] or a
//!   read.
//! - The recurrence: [`GatedDelta`] ([`update`](GatedDelta::update),
//!   [`update_chunked`](GatedDelta::update_chunked), [`vjp`](GatedDelta::vjp)),
//!   [`GatedDeltaFromConv`], [`StateReplay`] and [`compute_g`].
//! - The normalizations: [`SiluRmsHeads`] (the head split) and [`GatedRmsNorm`]
//!   ([`gated_rms_norm`]), each with its `vjp`.
//! - [`glm52`]: the GLM-5.2 expert-slot layout (pure arithmetic).
//! - Devices and limits: [`set_default_device`], [`gpu_backend`], [`set_memory_limit`],
//!   [`set_cache_limit`]; versions: [`version`], [`mlx_version`]; [`MlxLock`].
//!
//! Every fallible call returns [`Result`]; an [`Error`] names the argument at fault and what
//! was expected, and maps to the C ABI's status code ([`Error::status`]).
//!
//! # Example: one decode step and the output norm
//!
//! ```
//! use mlxkern::{Array, Dtype, GatedDelta, GatedRmsNorm};
//!
//! # fn main() -> mlxkern::Result<()> {
//! let (b, hk, hv, dk, dv) = (1, 2, 4, 32, 8);
//! let mut seed = 7u32;
//! let mut fill = |n: usize| -> Vec<f32> {
//!     (0..n)
//!         .map(|_| {
//!             seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
//!             (seed >> 8) as f32 / 16777216.0 - 0.5
//!         })
//!         .collect()
//! };
//! let a_log = Array::from_slice(&fill(hv), &[hv])?;
//! let dt_bias = Array::from_slice(&fill(hv), &[hv])?;
//! let mut state = Array::zeros(&[b, hv, dv, dk], Dtype::Float32)?;
//! for _step in 0..3 {
//!     // One token: T = 1.
//!     let q = Array::from_slice(&fill(b * hk * dk), &[b, 1, hk, dk])?;
//!     let k = Array::from_slice(&fill(b * hk * dk), &[b, 1, hk, dk])?;
//!     let v = Array::from_slice(&fill(b * hv * dv), &[b, 1, hv, dv])?;
//!     let a = Array::from_slice(&fill(b * hv), &[b, 1, hv])?;
//!     let beta = Array::from_slice(&fill(b * hv), &[b, 1, hv])?;
//!     let out = GatedDelta {
//!         q: &q, k: &k, v: &v, a: &a, b: &beta, a_log: &a_log, dt_bias: &dt_bias,
//!         state: Some(&state), mask: None,
//!     }
//!     .update()?;
//!     // The old state is dropped here, before the new one is computed: the CPU kernel then
//!     // writes the new state into its buffer.
//!     state = out.state;
//!     let gate = Array::from_slice(&fill(b * hv * dv), &[b, 1, hv, dv])?;
//!     let weight = Array::from_slice(&vec![1.0f32; dv], &[dv])?;
//!     let normed = GatedRmsNorm { x: &out.y, gate: &gate, weight: &weight, eps: 1e-6 }.forward()?;
//!     let values: Vec<f32> = normed.to_vec()?;
//!     assert!(values.iter().all(|x| x.is_finite()));
//! }
//! assert_eq!(state.shape()?, [b, hv, dv, dk]);
//!
//! // Errors name the argument and what was expected.
//! let bad = Array::zeros(&[hv, 2], Dtype::Float32)?;
//! let err = mlxkern::compute_g(&bad, &bad, &dt_bias).unwrap_err();
//! assert!(err.to_string().starts_with("a_log: expected rank 1"));
//! # Ok(()) }
//! ```
//!
//! # Depending on mlxkern
//!
//! The build finds MLX (0.31.x or 0.32.x) through `MLX_DIR`: a pip `mlx` package folder (what
//! `python3 -m mlx --cmake-dir` prints), an install prefix (`include/mlx/mlx.h` and
//! `lib/libmlx.*`) or an MLX source tree. Unset, it tries the repository's `.venv`, then the
//! `mlx` pip package of the `python3` on `PATH`. It links `libmlx` with an rpath for its own
//! targets; a binary that depends on mlxkern adds the same rpath with a one-line `build.rs`
//! (the folder comes from this crate's `links = "mlx"` metadata):
//!
//! ```text
//! fn main() {
//!     println!("cargo:rustc-link-arg=-Wl,-rpath,{}", std::env::var("DEP_MLX_LIB_DIR").unwrap());
//! }
//! ```
//!
//! The kernels are loops over every state element: compiled at opt-level 0 (a dependent's
//! default dev profile) they run about 100 times slower (a T = 512 prefill at Qwen3.5 dims took
//! 2.5 s instead of 25 ms). Keep mlxkern optimized in the dependent's `Cargo.toml`:
//!
//! ```toml
//! [profile.dev.package.mlxkern]
//! opt-level = 3
//! ```
//!
//! # Threads
//!
//! [`Array`] is `Send` and `Sync`: every MLX operation runs under one process-wide lock
//! (shared with the C ABI), so calls from several threads are correct and run one at a time.

#![deny(unsafe_op_in_unsafe_fn)]

mod api;
#[doc(hidden)]
pub mod bridge;
mod config;
// The C ABI's doc comments are also the header's comments (cbindgen copies them): their
// shapes are written as C readers read them, `[B, T, Hv]`, not as intra-doc links.
#[doc(hidden)]
#[allow(rustdoc::broken_intra_doc_links)]
pub mod capi;
#[doc(hidden)]
pub mod cpu;
#[doc(hidden)]
pub mod cuda;
mod dtype;
mod error;
pub mod glm52;
mod handle;
mod memory;
#[doc(hidden)]
pub mod metal;
#[doc(hidden)]
pub mod node;
mod ops;
mod registry;
mod seams;
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing;
mod version;

pub use api::*;
pub use dtype::Dtype;
pub use error::{Error, Result};
/// The `half` crate, whose [`f16`](half::f16) and [`bf16`](half::bf16) are the Rust types of
/// float16 and bfloat16 elements.
pub use half;

/// The header cbindgen generated for this build (tests compare it with `include/mlxkern.h`).
#[doc(hidden)]
pub const GENERATED_HEADER: &str = include_str!(concat!(env!("OUT_DIR"), "/mlxkern.h"));

/// The MLX package folder this build links against.
#[doc(hidden)]
pub const MLX_DIR: &str = env!("MLXK_MLX_DIR");
