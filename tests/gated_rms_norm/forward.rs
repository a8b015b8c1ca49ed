//! `mlxk_gated_rms_norm` through the C ABI: results against a float64 reference, every
//! argument check, and the Metal launch.

use crate::support::*;
use mlxkern::capi::gated_rms_norm::*;
use mlxkern::testing::{gated_rms_norm_via_gpu, GpuKernels};
use std::ptr::{null, null_mut};

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn gated(x: H, gate: H, weight: H, eps: f32) -> (mlxk_status, H) {
    let mut out = null_mut();
    let status = unsafe { mlxk_gated_rms_norm(x, gate, weight, eps, &mut out) };
    (status, out)
}

#[test]
fn gated_norm_matches_a_float64_reference() {
    let mut rng = Rng::fresh();
    for (rows, width) in [(3, 64), (2, 128), (4, 256), (2, 1000), (1, 5000), (2, 1)] {
        let q =
            |v: Vec<f32>| -> Vec<f32> { v.iter().map(|&x| bf16_to_f32(bf16_bits(x))).collect() };
        let xv = q(rng.vec(rows * width, 3.0));
        let zv = q(rng.vec(rows * width, 3.0));
        let wv = q(rng.vec(width, 2.0));
        let x = new_bf16(&xv, &[rows as i32, width as i32]);
        let z = new_bf16(&zv, &[rows as i32, width as i32]);
        let w = new_bf16(&wv, &[width as i32]);
        let (st, out) = gated(x, z, w, 1e-6);
        ok(st);
        let got = read_bf16(out);
        for r in 0..rows {
            let xr = &xv[r * width..(r + 1) * width];
            let inv = 1.0
                / (xr.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / width as f64 + 1e-6)
                    .sqrt();
            for c in 0..width {
                let expect = silu64(zv[r * width + c] as f64) * wv[c] as f64 * xr[c] as f64 * inv;
                let g = got[r * width + c] as f64;
                let scale = (wv[c] as f64).abs() * 4.0 + 1e-3;
                assert!(
                    (g - expect).abs() <= scale * 2.0f64.powi(-6),
                    "row {r} col {c}: {g} vs {expect}"
                );
            }
        }
        free_all(&[x, z, w, out]);
    }
}

#[test]
fn gated_norm_errors_name_the_argument() {
    let mut rng = Rng::fresh();
    let x = new_bf16(&rng.vec(12, 1.0), &[3, 4]);
    let z = new_bf16(&rng.vec(12, 1.0), &[3, 4]);
    let z_shape = new_bf16(&rng.vec(12, 1.0), &[4, 3]);
    let w = new_bf16(&rng.vec(4, 1.0), &[4]);
    let w_f32 = new_f32(&rng.vec(4, 1.0), &[4]);
    let w_len = new_bf16(&rng.vec(3, 1.0), &[3]);
    let w_rank = new_bf16(&rng.vec(4, 1.0), &[1, 4]);
    let ints = new_bytes(&[0u8; 48], &[3, 4], MLXK_DTYPE_INT32);
    expect_err(
        gated(x, z, w_f32, 1e-6).0,
        MLXK_ERR_DTYPE,
        &["weight", "float32", "bfloat16"],
    );
    expect_err(gated(x, z, w_len, 1e-6).0, MLXK_ERR_SHAPE, &["weight", "D"]);
    expect_err(
        gated(x, z, w_rank, 1e-6).0,
        MLXK_ERR_SHAPE,
        &["weight", "rank 1"],
    );
    expect_err(
        gated(x, z_shape, w, 1e-6).0,
        MLXK_ERR_SHAPE,
        &["gate", "shape"],
    );
    expect_err(
        gated(x, ints, w, 1e-6).0,
        MLXK_ERR_DTYPE,
        &["gate", "int32"],
    );
    expect_err(gated(ints, z, w, 1e-6).0, MLXK_ERR_DTYPE, &["x", "int32"]);
    expect_err(
        gated(x, z, w, f32::NAN).0,
        MLXK_ERR_INVALID_ARGUMENT,
        &["eps"],
    );
    expect_err(gated(x, z, w, -0.5).0, MLXK_ERR_INVALID_ARGUMENT, &["eps"]);
    expect_err(
        gated(x, null_mut(), w, 1e-6).0,
        MLXK_ERR_NULL_POINTER,
        &["gate"],
    );
    expect_err(
        unsafe { mlxk_gated_rms_norm(x, z, w, 1e-6, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["out"],
    );
    let scalar = new_f32(&[1.0], &[]);
    expect_err(
        gated(scalar, scalar, w, 1e-6).0,
        MLXK_ERR_SHAPE,
        &["x", "rank >= 1"],
    );
    let mut out = null_mut();
    for (kernels, refused) in [
        (GpuKernels::Metal, "No Metal back-end"),
        (GpuKernels::Cuda, "No CUDA back-end"),
    ] {
        expect_err(
            unsafe { gated_rms_norm_via_gpu(kernels, false, [x, z, w], 1e-6, &mut out) },
            MLXK_ERR_BACKEND,
            &[refused],
        );
    }
    // A float32 gate with a bfloat16 x is accepted (the gate is read as f32).
    let z32 = new_f32(&rng.vec(12, 1.0), &[3, 4]);
    let (st, o) = gated(x, z32, w, 1e-6);
    ok(st);
    assert_eq!(dtype_of(o), MLXK_DTYPE_BFLOAT16);
    free_all(&[x, z, z_shape, w, w_f32, w_len, w_rank, ints, scalar, z32, o]);
    let _ = null::<u8>();
}
