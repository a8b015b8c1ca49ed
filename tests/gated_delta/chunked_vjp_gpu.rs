//! The chunked form's GPU backward (`testing::gated_delta_update_chunked_vjp_via_gpu`) where
//! no GPU is needed: its graph on a CPU stream is refused by MLX at the first of its five
//! kernels (both launches), nothing is written on an error, a bad chunk size is named, and the
//! cases that launch nothing (no token, no batch row, no cotangent) give zeros and
//! dstate = dstate_out. Its numbers: tests/metal_emu (the kernel text on the CPU) and
//! tests/cuda/chunked_grad.rs (MLX CUDA).

use crate::support::*;
use mlxkern::testing::{gated_delta_update_chunked_vjp_via_gpu, GpuKernels};
use std::ptr::null_mut;

/// bf16 arguments for `dims` = B, T, Hk, Hv, Dk, Dv (no state, no mask) and f32 cotangents
/// (or NULL).
fn arrays(rng: &mut Rng, dims: [usize; 6], cotangents: bool) -> ([H; 11], Vec<f32>) {
    let [b, t, _, hv, dk, dv] = dims;
    let i = |x: usize| x as i32;
    let [q, k, v, a, bb, a_log, dt] = recurrence_arrays(rng, dims, 0.3, |v, s| new_bf16(&v, s));
    let ds_values = rng.vec(b * hv * dv * dk, 0.5);
    let (dy, ds) = if cotangents {
        (
            new_f32(&rng.vec(b * t * hv * dv, 1.0), &[i(b), i(t), i(hv), i(dv)]),
            new_f32(&ds_values, &[i(b), i(hv), i(dv), i(dk)]),
        )
    } else {
        (null_mut(), null_mut())
    };
    (
        [q, k, v, a, bb, a_log, dt, null_mut(), null_mut(), dy, ds],
        ds_values,
    )
}

fn run(kernels: GpuKernels, chunk: usize, args: &[H; 11]) -> (mlxk_status, [H; 8]) {
    let mut grads: [H; 8] = [null_mut(); 8];
    let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut grads;
    let outs = [o0, o1, o2, o3, o4, o5, o6, o7].map(|o| o as *mut H);
    let args = args.map(|h| h as *const mlxk_array);
    let status =
        unsafe { gated_delta_update_chunked_vjp_via_gpu(kernels, false, chunk as i32, args, outs) };
    (status, grads)
}

fn release(handles: impl IntoIterator<Item = H>) {
    for h in handles {
        if !h.is_null() {
            free(h);
        }
    }
}

#[test]
fn the_graph_reaches_mlx_and_is_refused_on_a_cpu_stream() {
    let mut rng = Rng::fresh();
    for kernels in GPU_KERNELS {
        for chunk in [0, 16, 64] {
            let (args, _) = arrays(&mut rng, [2, 37, 2, 4, 64, 9], true);
            let (status, grads) = run(kernels, chunk, &args);
            let kernel = match kernels {
                GpuKernels::Metal => "metal_kernel",
                GpuKernels::Cuda => "cuda_kernel",
            };
            expect_err(status, MLXK_ERR_BACKEND, &[kernel, refused_launch(kernels)]);
            assert!(
                grads.iter().all(|g| g.is_null()),
                "no gradient is written on an error"
            );
            release(args);
        }
    }
}

#[test]
fn a_bad_chunk_size_is_named() {
    let mut rng = Rng::fresh();
    for chunk in [8, 17, 144] {
        let (args, _) = arrays(&mut rng, [1, 5, 1, 2, 32, 4], true);
        let (status, grads) = run(GpuKernels::Cuda, chunk, &args);
        expect_err(
            status,
            MLXK_ERR_INVALID_ARGUMENT,
            &["chunk", &chunk.to_string()],
        );
        assert!(grads.iter().all(|g| g.is_null()));
        release(args);
    }
}

#[test]
fn nothing_to_launch_gives_zeros_and_dstate_out() {
    let mut rng = Rng::fresh();
    // No token (T = 0), no batch row (B = 0), no cotangent (dy and dstate_out NULL).
    for (dims, cotangents) in [
        ([2, 0, 1, 2, 32, 5], true),
        ([0, 3, 1, 2, 32, 5], true),
        ([2, 6, 2, 4, 64, 3], false),
    ] {
        let (args, ds_values) = arrays(&mut rng, dims, cotangents);
        let (status, grads) = run(GpuKernels::Metal, 0, &args);
        ok(status);
        let shapes = crate::support::vjp_case::grad_shapes(dims);
        for (g, shape) in grads.iter().zip(&shapes) {
            let got: Vec<usize> = shape_of(*g).iter().map(|&d| d as usize).collect();
            assert_eq!(&got, shape, "{dims:?}: a gradient's shape");
        }
        for (n, g) in grads[..7].iter().enumerate() {
            // +0 or -0 (a sum over no token).
            let values = match dtype_of(*g) {
                MLXK_DTYPE_FLOAT32 => read_f32(*g),
                _ => read_bf16(*g),
            };
            assert_zeros(&values, &format!("{dims:?}: gradient {n}"));
        }
        let dstate = read_f32(grads[7]);
        if cotangents {
            assert_eq!(dstate, ds_values, "{dims:?}: dstate is dstate_out");
        } else {
            assert_zeros(&dstate, &format!("{dims:?}: dstate"));
        }
        release(grads);
        release(args);
    }
}
