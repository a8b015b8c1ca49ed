//! The CPU kernels' internals against MLX and against each other: the fused gates equal
//! `mlxk_compute_g` and MLX's sigmoid bit for bit, the vectorized row kernel computes the
//! same bits as the portable one, and the chunked form gives the same bits with its AVX2 and
//! AVX-512 products. (It flips process-wide switches: tests/paths/main.rs.)

use crate::support::paths::default_kernels;
use crate::support::*;
use std::ptr::null_mut;

/// The tests that flip the process-wide switches: one at a time.

fn random_gate_values(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| match i % 11 {
            0 => rng.uniform() * 60.0,
            1 => rng.uniform() * 1e-3,
            2 => [
                f32::INFINITY,
                f32::NEG_INFINITY,
                0.0,
                -0.0,
                88.5,
                -88.5,
                20.0,
            ][rng.below(7) as usize],
            _ => rng.uniform() * 6.0,
        })
        .collect()
}

#[test]
fn fused_gates_equal_mlx_bit_for_bit() {
    let mut rng = Rng::fresh();
    let floats = [MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32];
    let (b, t, hv) = (3, 37, 8);
    let shape = [b, t, hv];
    let n = (b * t * hv) as usize;
    for &a_dtype in &floats {
        for &dt_dtype in &floats {
            for &b_dtype in &floats {
                for a_log_dtype in [MLXK_DTYPE_FLOAT32, MLXK_DTYPE_BFLOAT16] {
                    let a = typed(&random_gate_values(&mut rng, n), &shape, a_dtype);
                    let bb = typed(&random_gate_values(&mut rng, n), &shape, b_dtype);
                    let a_log = typed(&rng.vec(hv as usize, 3.0), &[hv], a_log_dtype);
                    let dt = typed(&random_gate_values(&mut rng, hv as usize), &[hv], dt_dtype);
                    let (g, beta) = mlxkern::testing::fused_gates(a, bb, a_log, dt);
                    let mut g_ref = null_mut();
                    ok(unsafe { mlxk_compute_g(a_log, a, dt, &mut g_ref) });
                    let g_ref = {
                        let v = read_f32(g_ref);
                        free(g_ref);
                        v
                    };
                    let mut s = null_mut();
                    ok(unsafe { mlxkern::testing::mlx_sigmoid(bb, &mut s) });
                    let mut s32 = null_mut();
                    ok(unsafe { mlxk_array_astype(s, MLXK_DTYPE_FLOAT32, &mut s32) });
                    let beta_ref = read_f32(s32);
                    for i in 0..n {
                        let same = |x: f32, y: f32| {
                            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
                        };
                        assert!(
                            same(g[i], g_ref[i]),
                            "g[{i}] {} vs MLX {} (dtypes a {a_dtype} dt {dt_dtype} a_log {a_log_dtype})",
                            g[i],
                            g_ref[i]
                        );
                        assert!(
                            same(beta[i], beta_ref[i]),
                            "beta[{i}] {} vs MLX {} (b dtype {b_dtype})",
                            beta[i],
                            beta_ref[i]
                        );
                    }
                    free_all(&[a, bb, a_log, dt, s, s32]);
                }
            }
        }
    }
}

#[test]
fn vectorized_and_portable_kernels_agree_bit_for_bit() {
    let _switch = serial();
    let mut rng = Rng::fresh();
    // Dv a multiple of the row kernels' 4 rows and not (rows left over), one tile of tokens
    // and several, decode (T = 1), masks, zero states.
    let cases = [
        ([1, 1, 16, 32, 128, 128], true, false),
        ([2, 70, 2, 6, 128, 13], true, true),
        ([3, 5, 1, 4, 128, 9], false, true),
        ([1, 130, 1, 1, 128, 5], true, false),
        ([2, 150, 2, 4, 128, 64], true, true),
        ([1, 65, 1, 2, 128, 3], false, false),
        ([2, 1, 1, 2, 128, 6], true, false),
    ];
    for (dims, with_state, with_mask) in cases {
        let r = Recurrence::random(&mut rng, dims, with_state, with_mask);
        let lengths: Vec<i32> = (0..dims[0])
            .map(|_| rng.below(dims[1] as u64 + 1) as i32)
            .collect();
        let mut results = vec![];
        // Portable, AVX2 (forced on an AVX-512 CPU), the fastest.
        for (portable, avx2) in [(true, false), (false, true), (false, false)] {
            mlxkern::testing::force_portable_kernels(portable);
            mlxkern::testing::force_avx2_kernels(avx2);
            let (y, s) = r.outputs();
            let (st2, replayed) = r.replay(&lengths);
            ok(st2);
            results.push((read_bytes(y), read_bytes(s), read_bytes(replayed)));
            free_all(&[y, s, replayed]);
        }
        default_kernels();
        for other in &results[1..] {
            assert!(results[0].0 == other.0, "y differs for {dims:?}");
            assert!(results[0].1 == other.1, "state differs for {dims:?}");
            assert!(
                results[0].2 == other.2,
                "replayed state differs for {dims:?}"
            );
        }
        r.free();
    }
}

/// The chunked form through the C ABI with the AVX2 products forced and with the fastest (on an
/// AVX-512 CPU, the AVX-512 products): the same bits. The portable products round differently
/// (no fused multiply-adds); their agreement within float32 rounding is
/// tests/gated_delta/chunked_kernel.rs's.
#[test]
fn chunked_products_agree_bit_for_bit() {
    let _switch = serial();
    let mut rng = Rng::fresh();
    let (_, avx512) = mlxkern::testing::kernel_features();
    eprintln!("AVX-512 products: {avx512}");
    let cases = [
        ([1, 200, 2, 4, 128, 128], true, false, 0),
        ([2, 70, 2, 6, 64, 48], true, true, 16),
        ([3, 5, 1, 4, 128, 9], false, true, 64),
        ([1, 130, 1, 1, 32, 130], true, false, 32),
    ];
    for (dims, with_state, with_mask, chunk) in cases {
        let r = Recurrence::random(&mut rng, dims, with_state, with_mask);
        let [q, k, v, a, b, al, dt, s, m] = r.args();
        let mut results = vec![];
        for avx2 in [true, false] {
            mlxkern::testing::force_avx2_kernels(avx2);
            let (mut y, mut st) = (null_mut(), null_mut());
            ok(unsafe {
                mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, chunk, &mut y, &mut st)
            });
            results.push((read_bytes(y), read_bytes(st)));
            free(y);
            free(st);
        }
        mlxkern::testing::force_avx2_kernels(false);
        assert!(results[0].0 == results[1].0, "y differs for {dims:?}");
        assert!(results[0].1 == results[1].1, "state differs for {dims:?}");
        r.free();
    }
}
