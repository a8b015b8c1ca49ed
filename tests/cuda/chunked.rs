//! The chunked update on MLX CUDA (kernels/metal/gated_delta_chunked_{prep,state,out}.metal;
//! tests/cuda/main.rs runs it) within docs/DESIGN.md §4's chunked bounds, which are not bit for bit:
//! - against the exact update on the CPU (same gates: g and beta from MLX's CPU ops, the
//!   `gpu_gates_on_cpu` hook): the state within 2e-5 of its largest magnitude, y within one ulp
//!   of its dtype plus 2e-5 of its largest magnitude; with the kernel's own gates, plus
//!   `gate_bound`;
//! - against the CPU chunked form (same chunk size, same gates): within the sum of the two
//!   forms' bounds (two ulps plus 4e-5; the state 4e-5);
//! - float32 cases also against a float64 recurrence on the CPU's gates (mlxk_compute_g, and
//!   beta as MLX's f32 sigmoid, within an ulp of the exact one): 2e-5 of the largest magnitude,
//!   to T = 16384;
//! - a masked token's y is +0.
//!
//! The three texts multiply on the matrix tiles (kernels/cuda/tiles.cuh), float32 FMAs by
//! default; `chunked_forward_tile_forms` runs cases with tf32 and bf16 tensor cores, whose
//! bounds relative to the largest magnitude add 6 (2δ + δ²) for an input rounding of δ
//! (2^-11, 2^-8): y and the state pass through at most five tile products in sequence (K Kᵀ and
//! Tm [β γ K | β V] in the prep, W H and Kdᵀ U in the state pass, Q H and P U side by side in
//! the output pass), each moving its result by at most 2δ + δ² of the sum of its terms'
//! magnitudes, and a sixth for those sums against the largest magnitude and the earlier
//! chunks' errors, which the gates decay (tests/metal_emu measures the worst at under 0.3 of
//! it).
//!
//! Shapes: Qwen3.5-35B-A3B's heads at T = 4096, GQA, Dk 32 / 128 / 256, odd Dv, masks with a
//! fully masked row, absent state, T not a multiple of the chunk, chunks 16 to 128, T = 0, B = 0.

use super::*;

fn chunked(u: &Update, chunk: i32) -> (H, H) {
    let [q, k, v, a, b, al, dt, s, m] = u.h.map(|h| h as *const mlxk_array);
    let (mut y, mut st) = (null_mut(), null_mut());
    ok(unsafe {
        mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, chunk, &mut y, &mut st)
    });
    ok(mlxk_array_eval(y));
    ok(mlxk_array_eval(st));
    (y, st)
}

/// One ulp of `dtype` at |x|.
fn ulp(dtype: mlxk_dtype, x: f64) -> f64 {
    let mantissa = match dtype {
        MLXK_DTYPE_BFLOAT16 => 7,
        MLXK_DTYPE_FLOAT16 => 10,
        _ => 23,
    };
    if x == 0.0 {
        return 0.0;
    }
    2f64.powi(x.abs().log2().floor() as i32 - mantissa)
}

/// The worst ratio of |got - want| to `ulps · ulp(dtype, want) + rel · max|want|`.
fn worst(got: &[f64], want: &[f64], dtype: mlxk_dtype, ulps: f64, rel: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            // At least the smallest normal float: the GPU flushes subnormal results.
            let bound = (ulps * ulp(dtype, *w) + rel * scale).max(f32::MIN_POSITIVE as f64);
            (g - w).abs() / bound
        })
        .fold(
            0.0,
            |m: f64, r| if r.is_nan() { f64::INFINITY } else { m.max(r) },
        )
}

/// The float64 recurrence on the CPU's gates (f32 inputs): y and the state.
fn recurrence64(u: &Update, dims: [usize; 6]) -> (Vec<f64>, Vec<f64>) {
    let [b, t, hk, hv, dk, dv] = dims;
    let [q, k, v, a, bb, al, dt, s, m] = u.h;
    let mut g = null_mut();
    ok(unsafe { mlxk_compute_g(al, a, dt, &mut g) });
    let g64 = values(g);
    free(g);
    let beta: Vec<f64> = values(bb)
        .iter()
        .map(|&x| {
            let e = (x.abs() as f32).exp() as f64;
            let y = 1.0 / (1.0 + e);
            if x < 0.0 {
                y
            } else {
                1.0 - y
            }
        })
        .collect();
    let (q, k, v) = (values(q), values(k), values(v));
    let mask: Vec<bool> = if m.is_null() {
        vec![true; b * t]
    } else {
        read_bytes(m).iter().map(|&x| x != 0).collect()
    };
    let mut state = if s.is_null() {
        vec![0.0; b * hv * dv * dk]
    } else {
        values(s)
    };
    let mut y = vec![0.0; b * t * hv * dv];
    for bi in 0..b {
        for h in 0..hv {
            let kh = h / (hv / hk);
            let st = &mut state[(bi * hv + h) * dv * dk..(bi * hv + h + 1) * dv * dk];
            for ti in 0..t {
                if !mask[bi * t + ti] {
                    continue;
                }
                let gi = (bi * t + ti) * hv + h;
                let (decay, bt) = (g64[gi], beta[gi]);
                let qk0 = ((bi * t + ti) * hk + kh) * dk;
                let v0 = ((bi * t + ti) * hv + h) * dv;
                for d in 0..dv {
                    let row = &mut st[d * dk..(d + 1) * dk];
                    let mut kv = 0.0;
                    for j in 0..dk {
                        row[j] *= decay;
                        kv += row[j] * k[qk0 + j];
                    }
                    let delta = (v[v0 + d] - kv) * bt;
                    let mut out = 0.0;
                    for j in 0..dk {
                        row[j] += k[qk0 + j] * delta;
                        out += row[j] * q[qk0 + j];
                    }
                    y[v0 + d] = out;
                }
            }
        }
    }
    (y, state)
}

/// What the matrix tiles' input rounding adds to a relative bound (module docs).
fn tile_bound(form: Option<mlxkern::cuda::TileForm>) -> f64 {
    let delta = match form {
        Some(mlxkern::cuda::TileForm::Tf32) => 2f64.powi(-11),
        Some(mlxkern::cuda::TileForm::Bf16) => 2f64.powi(-8),
        _ => 0.0,
    };
    6.0 * (2.0 * delta + delta * delta)
}

fn case(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype, state: bool, mask: bool, chunk: i32) {
    case_in(rng, dims, dtype, state, mask, chunk, None);
}

/// One case with the GPU launches' matrix tiles in `form` (None: the configured form).
#[allow(clippy::too_many_arguments)]
fn case_in(
    rng: &mut Rng,
    dims: [usize; 6],
    dtype: mlxk_dtype,
    state: bool,
    mask: bool,
    chunk: i32,
    form: Option<mlxkern::cuda::TileForm>,
) {
    let u = Update::random(rng, dims, dtype, state, mask);
    let label = case_label("chunked", dtype, dims, state, mask)
        + &format!(
            " chunk={chunk} tiles={}",
            form.map_or("configured", |f| f.name())
        );
    on_gpu(false);
    let (ye, se) = u.run();
    let (yc, sc) = chunked(&u, chunk);
    on_gpu(true);
    mlxkern::testing::cuda_tile_form(form);
    gpu_gates_on_cpu(true);
    let (yh, sh) = chunked(&u, chunk);
    gpu_gates_on_cpu(false);
    let (yg, sg) = chunked(&u, chunk);
    mlxkern::testing::cuda_tile_form(None);
    on_gpu(false);
    let v = |h: H| values(h);
    let (ye_, se_, yh_, sh_) = (v(ye), v(se), v(yh), v(sh));
    let tb = tile_bound(form);
    let checks = [
        ("y vs exact", worst(&yh_, &ye_, dtype, 1.0, 2e-5 + tb)),
        ("state vs exact", worst(&sh_, &se_, dtype, 0.0, 2e-5 + tb)),
        (
            "y vs CPU chunked",
            worst(&yh_, &v(yc), dtype, 2.0, 4e-5 + tb),
        ),
        (
            "state vs CPU chunked",
            worst(&sh_, &v(sc), dtype, 0.0, 4e-5 + tb),
        ),
        (
            "y (kernel gates) vs exact",
            worst(
                &v(yg),
                &ye_,
                dtype,
                1.0,
                2e-5 + tb + gate_bound(dtype, true),
            ),
        ),
        (
            "state (kernel gates) vs exact",
            worst(
                &v(sg),
                &se_,
                dtype,
                0.0,
                2e-5 + tb + gate_bound(dtype, false),
            ),
        ),
    ];
    let mut report = checks
        .iter()
        .map(|(what, r)| format!("{what} {r:.3}"))
        .collect::<Vec<_>>()
        .join(", ");
    for (what, r) in checks {
        assert!(r <= 1.0, "{label}: {what}: {r:.3} of the bound ({report})");
    }
    if dtype == MLXK_DTYPE_FLOAT32 && dims[0] * dims[1] > 0 {
        let (y64, s64) = recurrence64(&u, dims);
        let (ry, rs) = (
            worst(&yh_, &y64, dtype, 0.0, 2e-5 + tb),
            worst(&sh_, &s64, dtype, 0.0, 2e-5 + tb),
        );
        report += &format!(", y vs float64 {ry:.3}, state vs float64 {rs:.3}");
        assert!(
            ry <= 1.0 && rs <= 1.0,
            "{label}: against float64 ({report})"
        );
    }
    if mask {
        // Every masked token's y is +0 on the GPU.
        let m: Vec<u8> = read_bytes(u.h[8]);
        let per_token = dims[3] * dims[5];
        let size = read_bytes(yh).len() / (dims[0] * dims[1] * per_token).max(1);
        let (bytes_h, bytes_g) = (read_bytes(yh), read_bytes(yg));
        let mut zeros = 0;
        for (bt, _) in m.iter().enumerate().filter(|(_, &x)| x == 0) {
            let span = bt * per_token * size..(bt + 1) * per_token * size;
            assert!(
                bytes_h[span.clone()].iter().all(|&x| x == 0)
                    && bytes_g[span].iter().all(|&x| x == 0),
                "{label}: masked token {bt}: y is not +0"
            );
            zeros += per_token;
        }
        report += &format!(", {zeros} masked y values +0");
    }
    println!("PASS: {label}: worst error / bound: {report}");
    free_all(&[ye, se, yc, sc, yh, sh, yg, sg]);
    u.free();
}

/// The chunked update on the GPU against the exact update, the CPU chunked form and a float64
/// recurrence (module docs).
pub fn chunked_within_bounds(rng: &mut Rng) {
    let (bf16, f16, f32) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32);
    for (dims, dtype, state, mask, chunk) in [
        ([1, 4096, 16, 32, 128, 128], bf16, true, false, 64),
        ([2, 100, 2, 4, 128, 128], f32, true, true, 0),
        ([1, 4096, 2, 4, 128, 128], f32, true, false, 64),
        ([1, 16384, 1, 2, 128, 128], f32, false, false, 64),
        ([2, 77, 2, 6, 256, 33], f16, true, true, 16),
        ([3, 50, 1, 2, 32, 7], bf16, false, true, 128),
        ([2, 45, 2, 4, 64, 5], f32, false, true, 48),
        ([1, 1, 16, 32, 128, 128], bf16, true, false, 0),
        ([2, 0, 2, 4, 64, 64], bf16, true, false, 0),
        ([0, 5, 2, 4, 64, 64], f32, true, false, 32),
    ] {
        case(rng, dims, dtype, state, mask, chunk);
    }
}

/// Cases with each matrix-tile form (fma, tf32, bf16), within that form's bounds (module docs),
/// then the chunked pool and packed calls bit for bit the dense ones in each form.
pub fn chunked_forward_tile_forms(rng: &mut Rng) {
    let (bf16, f16, f32) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32);
    for form in mlxkern::cuda::TileForm::ALL {
        for (dims, dtype, state, mask, chunk) in [
            ([1, 4096, 16, 32, 128, 128], bf16, true, false, 64),
            ([2, 100, 2, 4, 128, 128], f32, true, true, 0),
            ([1, 4096, 2, 4, 128, 128], f32, true, false, 64),
            ([2, 77, 2, 6, 256, 33], f16, true, true, 16),
            ([3, 50, 1, 2, 32, 7], bf16, false, true, 128),
        ] {
            case_in(rng, dims, dtype, state, mask, chunk, Some(form));
        }
        mlxkern::testing::cuda_tile_form(Some(form));
        crate::pool::chunked_pool_calls_match_the_dense_calls(rng);
        mlxkern::testing::cuda_tile_form(None);
    }
}
