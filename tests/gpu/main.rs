//! The GPU launches without a GPU: the Metal launch descriptions of every family
//! (`metal_launch`) and MLX's autograd entry for the GPU kernel nodes (`node_vjp`). The kernel
//! texts themselves are checked by tests/cuda/ (syntax, comments) and tests/metal_emu/.

#[path = "../support/mod.rs"]
mod support;

mod metal_launch;
mod node_vjp;
