//! `mlxk_silu_rms_heads` (the head split) through the C ABI: results against a float64
//! reference, every argument check, and the Metal launch.

use crate::support::*;
use mlxkern::capi::silu_rms_heads::*;
use mlxkern::testing::{silu_rms_heads_via_gpu, GpuKernels};
use std::ptr::null_mut;

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

struct Split {
    q: H,
    k: H,
    v: H,
}

fn split(x: H, qs: H, ks: H, heads: [i32; 3], eps: f32) -> (mlxk_status, Split) {
    let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
    let st = unsafe {
        mlxk_silu_rms_heads(
            x, qs, ks, heads[0], heads[1], heads[2], eps, &mut q, &mut k, &mut v,
        )
    };
    (st, Split { q, k, v })
}

#[test]
fn head_split_matches_a_float64_reference() {
    let mut rng = Rng::fresh();
    for (b, s, hk, hv, dk, dv) in [
        (1, 1, 2, 4, 128, 128),
        (2, 3, 1, 3, 64, 96),
        (1, 5, 3, 3, 40, 7),
        (3, 1, 1, 1, 128, 1),
    ] {
        let c = 2 * hk * dk + hv * dv;
        let xv: Vec<f32> = rng
            .vec(b * s * c, 4.0)
            .iter()
            .map(|&x| bf16_to_f32(bf16_bits(x)))
            .collect();
        let eps = 1e-6 / dk as f32;
        let qs_v = vec![bf16_to_f32(bf16_bits((dk as f32).powi(-1))); dk];
        let ks_v = vec![bf16_to_f32(bf16_bits((dk as f32).powf(-0.5))); dk];
        let x = new_bf16(&xv, &[b as i32, s as i32, c as i32]);
        let qs = new_bf16(&qs_v, &[dk as i32]);
        let ks = new_bf16(&ks_v, &[dk as i32]);
        let (st, out) = split(x, qs, ks, [hk as i32, hv as i32, dv as i32], eps);
        ok(st);
        assert_eq!(
            shape_of(out.q),
            vec![b as i32, s as i32, hk as i32, dk as i32]
        );
        assert_eq!(
            shape_of(out.k),
            vec![b as i32, s as i32, hk as i32, dk as i32]
        );
        assert_eq!(
            shape_of(out.v),
            vec![b as i32, s as i32, hv as i32, dv as i32]
        );
        let (q, k, v) = (read_bf16(out.q), read_bf16(out.k), read_bf16(out.v));
        let mut worst = 0f64;
        for row in 0..b * s {
            let xr = &xv[row * c..(row + 1) * c];
            for head in 0..2 * hk {
                let seg: Vec<f64> = xr[head * dk..(head + 1) * dk]
                    .iter()
                    .map(|&x| silu64(x as f64))
                    .collect();
                let inv =
                    1.0 / (seg.iter().map(|x| x * x).sum::<f64>() / dk as f64 + eps as f64).sqrt();
                let (scale, got) = if head < hk {
                    (qs_v[0] as f64, &q)
                } else {
                    (ks_v[0] as f64, &k)
                };
                for col in 0..dk {
                    let expect = seg[col] * inv * scale;
                    let g = got[(row * hk + head % hk) * dk + col] as f64;
                    worst = worst.max((g - expect).abs() / (scale * 4.0));
                }
            }
            for head in 0..hv {
                for col in 0..dv {
                    let xval = xr[2 * hk * dk + head * dv + col] as f64;
                    let g = v[(row * hv + head) * dv + col] as f64;
                    let expect = silu64(xval);
                    assert!(
                        (g - expect).abs() <= expect.abs() * 2.0f64.powi(-7) + 1e-6,
                        "v {g} vs {expect}"
                    );
                }
            }
        }
        // bf16 holds 8 significant bits: three roundings stay well inside 2^-6 of the scale.
        assert!(worst < 2.0f64.powi(-6), "q/k error {worst}");
        free_all(&[x, qs, ks, out.q, out.k, out.v]);
    }
}

#[test]
fn head_split_errors_name_the_argument() {
    let mut rng = Rng::fresh();
    let (hk, hv, dk, dv) = (2i32, 2i32, 32i32, 16i32);
    let c = 2 * hk * dk + hv * dv;
    let x = new_bf16(&rng.vec(2 * c as usize, 1.0), &[1, 2, c]);
    let qs = new_bf16(&rng.vec(dk as usize, 1.0), &[dk]);
    let ks = new_bf16(&rng.vec(dk as usize, 1.0), &[dk]);
    let ks_short = new_bf16(&rng.vec(16, 1.0), &[16]);
    let qs_f32 = new_f32(&rng.vec(dk as usize, 1.0), &[dk]);
    let wide = new_bf16(&rng.vec(129, 1.0), &[129]);
    let x2 = new_bf16(&rng.vec(2 * c as usize, 1.0), &[2, c]);
    let heads = [hk, hv, dv];
    expect_err(
        split(x, qs, ks, heads, f32::NAN).0,
        MLXK_ERR_INVALID_ARGUMENT,
        &["eps"],
    );
    expect_err(
        split(x, qs, ks, heads, -1e-6).0,
        MLXK_ERR_INVALID_ARGUMENT,
        &["eps"],
    );
    expect_err(
        split(x, qs, ks, heads, f32::INFINITY).0,
        MLXK_ERR_INVALID_ARGUMENT,
        &["eps"],
    );
    expect_err(
        split(x, qs, ks, [hk, hv, dv + 1], 1e-6).0,
        MLXK_ERR_SHAPE,
        &["x", "channels", "2*2*32 + 2*17"],
    );
    expect_err(
        split(x, qs, ks, [hk, hv, 129], 1e-6).0,
        MLXK_ERR_INVALID_ARGUMENT,
        &["value_width", "128"],
    );
    expect_err(
        split(x, qs, ks, [0, hv, dv], 1e-6).0,
        MLXK_ERR_INVALID_ARGUMENT,
        &["key_heads"],
    );
    expect_err(
        split(x, qs, ks, [hk, -1, dv], 1e-6).0,
        MLXK_ERR_INVALID_ARGUMENT,
        &["value_heads"],
    );
    expect_err(
        split(x, qs, ks_short, heads, 1e-6).0,
        MLXK_ERR_SHAPE,
        &["k_scale", "Dk"],
    );
    expect_err(
        split(x, qs_f32, ks, heads, 1e-6).0,
        MLXK_ERR_DTYPE,
        &["q_scale", "float32", "x"],
    );
    expect_err(
        split(x, wide, wide, [1, 1, 1], 1e-6).0,
        MLXK_ERR_SHAPE,
        &["q_scale", "128"],
    );
    expect_err(
        split(x2, qs, ks, heads, 1e-6).0,
        MLXK_ERR_SHAPE,
        &["x", "rank 3"],
    );
    expect_err(
        split(null_mut(), qs, ks, heads, 1e-6).0,
        MLXK_ERR_NULL_POINTER,
        &["x"],
    );
    let (mut q, mut k) = (null_mut(), null_mut());
    expect_err(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut q, &mut k, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["v"],
    );
    expect_err(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut q, &mut q, &mut k) },
        MLXK_ERR_INVALID_ARGUMENT,
        &["different places"],
    );
    let (mut a, mut b2, mut c2) = (null_mut(), null_mut(), null_mut());
    for (kernels, refused) in [
        (GpuKernels::Metal, "No Metal back-end"),
        (GpuKernels::Cuda, "No CUDA back-end"),
    ] {
        let outs = [&mut a as *mut _, &mut b2 as *mut _, &mut c2 as *mut _];
        expect_err(
            unsafe { silu_rms_heads_via_gpu(kernels, false, [x, qs, ks], heads, 1e-6, outs) },
            MLXK_ERR_BACKEND,
            &[refused],
        );
    }
    free_all(&[x, qs, ks, ks_short, qs_f32, wide, x2]);
}
