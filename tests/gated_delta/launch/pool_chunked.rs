//! The chunked pool calls' GPU launches without a GPU: for the Metal and the CUDA descriptions,
//! `mlxk_gated_delta_update_pool_chunked` and `_packed_chunked` build the chunked form's first
//! launch over the pool's chunk table (each chunk one row's), which reaches MLX (refused on a
//! CPU stream): its name, its inputs in order with the row and chunk tables' values, its outputs
//! and its geometry. The later launches' descriptions run in tests/metal_emu (against the dense
//! launches, bit for bit) and compile in tests/cuda/syntax.rs.

use super::pool::{args, for_each_launch, packed_40, refused, rows_and_pool};
use crate::support::pool::*;
use crate::support::*;
use std::ptr::null_mut;

/// Checks the last recorded launch: the prep of a pool node with rows `table` and chunks
/// `chunks` (row, chunk of the row), chunk `c`, dims B, T, Hk, Hv, Dk, Dv of the call.
fn check_prep(
    kernels: GpuKernels,
    masked: bool,
    dims: [usize; 6],
    table: &[i32],
    chunks: &[i32],
    c: i32,
) {
    use mlxkern::testing::last_gpu_launch;
    let (l, inputs) = last_gpu_launch().expect("a launch reached MLX");
    let [_, _, hk, hv, dk, dv] = dims.map(|x| x as i32);
    let cuda = kernels == GpuKernels::Cuda;
    let prefix = format!(
        "mlxk_gated_delta_chunked_prep{}_pool{}_",
        if masked { "_mask" } else { "" },
        if cuda { "_gates" } else { "" }
    );
    assert!(l.name.starts_with(&prefix), "{} is not {prefix}…", l.name);
    let header = resolved(&l.header);
    assert!(header.contains("#define MLXK_POOL 1"), "{kernels:?} header");
    assert_eq!(
        header.contains("#define MLXK_MASKED 1"),
        masked,
        "{kernels:?} header"
    );
    let mut names = vec!["q", "k", "v", "g", "beta", "mask", "rows", "chunks"];
    if !masked {
        names.retain(|&n| n != "mask");
    }
    if cuda {
        names.extend(["a_log", "dt_bias"]);
    }
    assert_eq!(l.input_names, names, "{}", l.name);
    let input = |name: &str| &inputs[names.iter().position(|&n| n == name).unwrap()];
    // The row table (5 columns) and the chunk table (2), shapes and values.
    for (name, want, columns) in [("rows", table, 5), ("chunks", chunks, 2)] {
        let entries = want.len() as i32 / columns;
        assert_eq!(input(name).shape, [entries, columns], "{}: {name}", l.name);
        assert_eq!(
            ints(&input(name).bytes),
            want,
            "{}: the {name} table",
            l.name
        );
    }
    let nch = chunks.len() as i32 / 2;
    assert_eq!(input("q").shape[3], dk);
    if cuda {
        assert_eq!(input("a_log").shape, [hv]);
    }
    // W, U0, Kd, P, γ: [Hv, NCH·C, ·].
    let tp = nch * c;
    let outputs = [
        vec![hv, tp, dk],
        vec![hv, tp, dv],
        vec![hv, tp, dk],
        vec![hv, tp, c],
        vec![hv, tp],
    ]
    .concat();
    assert_eq!(l.output_dims, outputs, "{}: outputs", l.name);
    assert_eq!(l.grid, [256, nch, hv], "{}: grid", l.name);
    assert_eq!(l.template_int_values, [dk, dv, hk, hv, c]);
}

/// The chunked pool and packed calls' first launch is built on every machine and handed to MLX,
/// which refuses it without that GPU: the dense rows (masked, a padding and a fresh row, 40
/// tokens: three chunks of 16 a row) and packed sequences of 0, 1 and 39 tokens (chunk 0 of
/// row 1, chunks 0 and 1 of row 2 at the default 32), with the row table as the exact pool launch's (compact numbering
/// of the written rows); a bad chunk size is named first.
#[test]
fn chunked_pool_gpu_launches_are_built_and_reach_mlx() {
    let _serial = serial();
    use mlxkern::testing::gated_delta_update_pool_chunked_via_gpu;
    let mut rng = Rng::fresh();
    let dims = [3, 40, 1, 2, 32, 8];
    let (host, pool, mask, _) = rows_and_pool(&mut rng, dims);
    let x = host.arrays(&[0, 1, 2], 40, false);
    let packed = packed_40(&mut rng);
    let (slots, fresh) = ([4, -1, 1], [0u8, 0, 1]);
    for_each_launch(|kernels, y, p| {
        refused(kernels, unsafe {
            gated_delta_update_pool_chunked_via_gpu(
                kernels,
                false,
                args(&x, pool, mask),
                &slots,
                Some(&fresh),
                None,
                16,
                y,
                p,
            )
        });
        let table = [0, 40, 40, 4, 0, 40, 40, 0, -1, -1, 80, 40, 40, -1, 1];
        let chunks = [0, 0, 0, 1, 0, 2, 1, 0, 1, 1, 1, 2, 2, 0, 2, 1, 2, 2];
        check_prep(kernels, true, dims, &table, &chunks, 16);
        // Packed sequences of 0, 1 and 39 tokens, the default chunk (32).
        refused(kernels, unsafe {
            gated_delta_update_pool_chunked_via_gpu(
                kernels,
                false,
                args(&packed, pool, null_mut()),
                &[2, 0, 5],
                None,
                Some(&[0, 0, 1, 40]),
                0,
                y,
                p,
            )
        });
        let table = [0, 0, 0, 2, 0, 0, 1, 1, 0, 1, 1, 39, 39, 5, 2];
        check_prep(
            kernels,
            false,
            [1, 40, 1, 2, 32, 8],
            &table,
            &[1, 0, 2, 0, 2, 1],
            32,
        );
        // The chunk size is checked before the launch on this path too.
        expect_err(
            unsafe {
                gated_delta_update_pool_chunked_via_gpu(
                    kernels,
                    false,
                    args(&x, pool, mask),
                    &slots,
                    None,
                    None,
                    24,
                    y,
                    p,
                )
            },
            MLXK_ERR_INVALID_ARGUMENT,
            &["chunk_size"],
        );
        assert!(y.is_null() && p.is_null());
    });
    free_all(&x);
    free_all(&packed);
    free_all(&[pool, mask]);
}
