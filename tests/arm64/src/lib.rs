//! The library's CPU kernels and what they depend on, compiled from the library's own files:
//! the crate's `cpu` tree with its unit tests, and `check/` here (arm64 only), which runs the
//! kernels through the entry MLX's CPU stream calls (`cpu::mlxk_cpu_kernel`) with the NEON
//! kernels and with the portable ones forced, and compares the outputs.

#![allow(dead_code, unused_imports)]

#[path = "../../../src/error.rs"]
pub mod error;

#[path = "../../../src/dtype.rs"]
pub mod dtype;

#[path = "../../../src/node/mod.rs"]
pub mod node;

#[path = "../../../src/seams.rs"]
pub mod seams;

#[path = "../../../src/config.rs"]
pub mod config;

#[path = "../../../src/cpu/mod.rs"]
pub mod cpu;

pub mod reference;

#[cfg(all(test, target_arch = "aarch64"))]
mod check;

pub mod probe;
