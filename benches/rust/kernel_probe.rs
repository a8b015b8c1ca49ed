//! Timing probes of the CPU kernels (not a benchmark: `make bench` is). Run with
//! `cargo bench --bench kernel_probe [-- NAME...]` (gated_rms_norm, silu_rms_heads,
//! gated_delta_vjp_paths; all without a name), with `MLXK_NUM_THREADS=1` or `2`.
//! - gated_rms_norm, silu_rms_heads: per-call times (median and best) at Qwen3.5's dimensions,
//!   through the C ABI with eval and as the kernel alone, next to a memory copy of the same
//!   bytes; `MLXK_TIMING_PORTABLE=1` times the portable kernels, `MLXK_TIMING_AVX2=1` the AVX2
//!   kernels on a CPU with AVX-512.
//! - gated_delta_vjp_paths: one `mlxk_gated_delta_update_vjp` at Qwen3.5-35B-A3B's dims (B = 1,
//!   T = 512, Hk 16, Hv 32, Dk = Dv = 128, bf16, no state or mask) with the portable row loops
//!   and with the vectorized ones, interleaved so that both see the same load; milliseconds per
//!   call (median and best of MLXK_TIMING_REPS, default 7, each). Both paths' gradients must be
//!   the same bytes.

mod common;
use common::*;
use half::bf16;
use mlxkern::capi::gated_rms_norm::*;
use mlxkern::capi::silu_rms_heads::*;
use std::ptr::null_mut;

/// An evaluated bf16 array of `values`' bits.
fn bf16_array(values: &[bf16], shape: &[usize]) -> H {
    let f: Vec<f32> = values.iter().map(|v| v.to_f32()).collect();
    array(&f, shape, MLXK_DTYPE_BFLOAT16)
}

fn gated_rms_norm() {
    let (mut rng, portable) = timing_start();
    let width = 128;
    for rows in [32usize, 512 * 32] {
        let iters = match (rows, portable) {
            (32, _) => 2000,
            (_, true) => 5,
            _ => 60,
        };
        let (xs, zs) = (
            bf16_vec(&mut rng, rows * width),
            bf16_vec(&mut rng, rows * width),
        );
        let ws = bf16_vec(&mut rng, width);
        let x = bf16_array(&xs, &[rows, width]);
        let z = bf16_array(&zs, &[rows, width]);
        let w = bf16_array(&ws, &[width]);
        let api = per_call(iters, || {
            let mut out = null_mut();
            ok(unsafe { mlxk_gated_rms_norm(x, z, w, 1e-6, &mut out) });
            ok(mlxk_array_eval(out));
            free(out);
        });
        let mut os = vec![bf16::ZERO; rows * width];
        let kernel = per_call(iters, || {
            mlxkern::cpu::gated_rms_norm::norm(width, 1e-6, &xs, &zs, &ws, &mut os)
        });
        let copy = copy_floor(2 * 2 * rows * width, 2 * rows * width, iters.min(200));
        report(
            &format!("gated norm {} x 32 rows x {width}", rows / 32),
            api,
            kernel,
            copy,
        );
        for h in [x, z, w] {
            free(h);
        }
    }
    eval_round_trip(&mut rng);
    mlxkern::testing::force_portable_kernels(false);
}

fn silu_rms_heads() {
    let (mut rng, portable) = timing_start();
    let (hk, hv, dk, dv) = (16usize, 32usize, 128usize, 128usize);
    let c = 2 * hk * dk + hv * dv;
    for s in [1usize, 512] {
        let iters = match (s, portable) {
            (1, _) => 2000,
            (_, true) => 5,
            _ => 40,
        };
        let xs = bf16_vec(&mut rng, s * c);
        let scale = bf16_vec(&mut rng, dk);
        let x = bf16_array(&xs, &[1, s, c]);
        let qs = bf16_array(&scale, &[dk]);
        let api = per_call(iters, || {
            let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
            ok(unsafe {
                mlxk_silu_rms_heads(
                    x, qs, qs, hk as i32, hv as i32, dv as i32, 1e-6, &mut q, &mut k, &mut v,
                )
            });
            ok(mlxk_array_eval(q));
            for h in [q, k, v] {
                free(h);
            }
        });
        let (mut qo, mut ko, mut vo) = (
            vec![bf16::ZERO; s * hk * dk],
            vec![bf16::ZERO; s * hk * dk],
            vec![bf16::ZERO; s * hv * dv],
        );
        let dims = mlxkern::cpu::silu_rms_heads::Dims {
            rows: s,
            hk,
            hv,
            dk,
            dv,
        };
        let kernel = per_call(iters, || {
            mlxkern::cpu::silu_rms_heads::split(
                dims, 1e-6, &xs, &scale, &scale, &mut qo, &mut ko, &mut vo,
            )
        });
        let bytes = 2 * s * c; // S·C bf16 values in, as many out
        let copy = copy_floor(bytes, bytes, iters.min(200));
        report(&format!("head split S={s}"), api, kernel, copy);
        for h in [x, qs] {
            free(h);
        }
    }
    eval_round_trip(&mut rng);
    mlxkern::testing::force_portable_kernels(false);
}

/// The eight gradients' bytes of one `mlxk_gated_delta_update_vjp` call on the path the
/// switches select.
fn gradients(inputs: &[H; 11]) -> Vec<Vec<u8>> {
    let [q, k, v, a, b, a_log, dt, state, mask, dy, ds] = *inputs;
    let mut g = [null_mut(); 8];
    let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut g;
    ok(unsafe {
        mlxk_gated_delta_update_vjp(
            q, k, v, a, b, a_log, dt, state, mask, dy, ds, o0, o1, o2, o3, o4, o5, o6, o7,
        )
    });
    g.into_iter()
        .map(|h| {
            let bytes = read_bytes(h);
            free(h);
            bytes
        })
        .collect()
}

fn gated_delta_vjp_paths() {
    let mut rng = Rng::seeded(11);
    let [b, t, hk, hv, dk, dv] = [1, 512, 16, 32, 128, 128];
    let (bf, f32_) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT32);
    let inputs: [H; 11] = [
        array(&rng.vec(b * t * hk * dk, 0.088), &[b, t, hk, dk], bf),
        array(&rng.vec(b * t * hk * dk, 0.088), &[b, t, hk, dk], bf),
        array(&rng.vec(b * t * hv * dv, 1.0), &[b, t, hv, dv], bf),
        array(&rng.vec(b * t * hv, 1.5), &[b, t, hv], bf),
        array(&rng.vec(b * t * hv, 2.0), &[b, t, hv], bf),
        array(&rng.vec(hv, 1.0), &[hv], f32_),
        array(&rng.vec(hv, 0.5), &[hv], bf),
        null_mut(),
        null_mut(),
        array(&rng.vec(b * t * hv * dv, 1.0), &[b, t, hv, dv], bf),
        array(&rng.vec(b * hv * dv * dk, 0.5), &[b, hv, dv, dk], f32_),
    ];
    let reps: usize = env_or("MLXK_TIMING_REPS", 7);
    let mut times = [Vec::new(), Vec::new()];
    let mut first: [Option<Vec<Vec<u8>>>; 2] = [None, None];
    for rep in 0..reps + 1 {
        for (i, portable) in [true, false].into_iter().enumerate() {
            mlxkern::testing::force_portable_kernels(portable);
            let start = std::time::Instant::now();
            let grads = gradients(&inputs);
            let ms = start.elapsed().as_secs_f64() * 1e3;
            if rep > 0 {
                times[i].push(ms);
            }
            first[i].get_or_insert(grads);
        }
    }
    mlxkern::testing::force_portable_kernels(false);
    assert!(first[0] == first[1], "the paths differ");
    println!("threads {}", mlxkern::testing::cpu_threads());
    for (name, mut ts) in ["portable", "vectorized"].into_iter().zip(times) {
        ts.sort_by(f64::total_cmp);
        println!(
            "{name:>10}: median {:.1} ms, best {:.1} ms ({} calls)",
            ts[ts.len() / 2],
            ts[0],
            ts.len()
        );
    }
    for h in inputs.into_iter().filter(|h| !h.is_null()) {
        free(h);
    }
}

fn main() {
    run_probes(&[
        ("gated_rms_norm", gated_rms_norm),
        ("silu_rms_heads", silu_rms_heads),
        ("gated_delta_vjp_paths", gated_delta_vjp_paths),
    ]);
}
