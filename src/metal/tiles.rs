//! The matrix tiles (`kernels/metal/tiles.h`, its MLX CUDA form `kernels/cuda/tiles.cuh`):
//! the header a launch whose text multiplies matrices with them carries, and the launches of
//! their self-test and benchmark text (`kernels/metal/tiles_check.metal`), which the Metal
//! emulator (tests/metal_emu), the CUDA mock (tests/cuda/syntax.rs) and the GPU tests
//! (tests/cuda/tiles.rs) run.

use super::{launch, names, MetalLaunch};
use crate::dtype::Dtype;
use crate::node::Output;

/// The tiles' Metal form: a header of the launches that use them (on MLX CUDA, `cuda::launch`
/// puts the CUDA form in its place).
pub const TILES_HEADER: &str = include_str!("../../kernels/metal/tiles.h");

/// The tiles' self-test and benchmark text.
pub const TILES_CHECK_SOURCE: &str = include_str!("../../kernels/metal/tiles_check.metal");

/// Threads of the self-test's and benchmark's threadgroups (four SIMD groups).
pub const TILES_CHECK_THREADS: usize = 128;

fn f32_outputs(shapes: Vec<Vec<usize>>) -> Vec<Output> {
    shapes
        .into_iter()
        .map(|shape| Output {
            shape,
            dtype: Dtype::Float32,
        })
        .collect()
}

/// The self-test over `items` work items: inputs a `[items, m, k]`, b `[items, k, n]`, gate
/// `[items, m]`, c0 `[items, m, n]` (f32); outputs y `[items, m, n]` (c0 plus the masked,
/// row-scaled A B), z `[items, k, k]` (Aᵀ A), w `[items, m, m]` (A Aᵀ), ysum
/// `[items, m, n / 8]` (the masked, row-scaled A B summed over each tile's 8 columns). `m`, `n` and `k`
/// are multiples of 16 (the tiles' rows), at most 64, with A, B and A Aᵀ within 32 KiB.
pub fn tiles_check_launch(items: usize, m: usize, k: usize, n: usize) -> MetalLaunch {
    for (name, d) in [("m", m), ("k", k), ("n", n)] {
        assert!(d % 16 == 0 && (16..=64).contains(&d), "{name} = {d}");
    }
    assert!(
        (m * k + k * n + m * m) * 4 <= 32 * 1024,
        "M {m} K {k} N {n}: over Metal's 32 KiB of threadgroup memory"
    );
    let outputs = f32_outputs(vec![
        vec![items, m, n],
        vec![items, k, k],
        vec![items, m, m],
        vec![items, m, n / 8],
    ]);
    let mut l = launch(
        "mlxk_tiles_check",
        TILES_CHECK_SOURCE.to_string(),
        names(&["a", "b", "gate", "c0"]),
        (&["y", "z", "w", "ysum"], &outputs),
    );
    l.header = TILES_HEADER.to_string();
    l.grid = [(TILES_CHECK_THREADS * items) as i32, 1, 1];
    l.threadgroup = [TILES_CHECK_THREADS as i32, 1, 1];
    l.template_int_names = names(&["M", "K", "N", "NT"]);
    l.template_int_values = vec![m as i32, k as i32, n as i32, TILES_CHECK_THREADS as i32];
    l
}

/// The benchmark over `items` work items: inputs a `[items, 64, k]`, b `[items, k, 64]` (f32);
/// output y `[items, 64, 64]` = `reps` A B, made of `2 * 64 * 64 * k * reps` FLOP per item.
/// `k` is a multiple of 8, at most 64.
pub fn tiles_bench_launch(items: usize, k: usize, reps: usize) -> MetalLaunch {
    assert!(k % 8 == 0 && (8..=64).contains(&k), "k = {k}");
    let outputs = f32_outputs(vec![vec![items, 64, 64]]);
    let mut l = launch(
        "mlxk_tiles_bench",
        TILES_CHECK_SOURCE.to_string(),
        names(&["a", "b"]),
        (&["y"], &outputs),
    );
    l.header = format!("#define MLXK_TILES_BENCH 1\n{TILES_HEADER}");
    l.grid = [(TILES_CHECK_THREADS * items) as i32, 1, 1];
    l.threadgroup = [TILES_CHECK_THREADS as i32, 1, 1];
    l.template_int_names = names(&["K", "REPS", "NT"]);
    l.template_int_values = vec![k as i32, reps as i32, TILES_CHECK_THREADS as i32];
    l
}
