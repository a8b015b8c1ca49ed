//! Timing probe of the chunked form's gradient (not a benchmark: `make bench` is): forward +
//! backward in ms at Qwen3.5-35B-A3B's dims (B = 1, Hk = 16, Hv = 32, Dk = Dv = 128, bf16
//! inputs) for the chunked path (mlxk_gated_delta_update_chunked, then
//! mlxk_gated_delta_update_chunked_vjp) and the exact path (mlxk_gated_delta_update, then
//! mlxk_gated_delta_update_vjp). Run with
//! `cargo bench --bench chunked_vjp_probe [-- NAME...]` (chunked_and_exact_forward_plus_backward,
//! chunked_against_exact_at_qwen_dims; both without a name); PROBE_T (lengths,
//! comma-separated), PROBE_CHUNK, PROBE_NO_EXACT and PROBE_AVX2 vary it.

mod common;
use common::*;
use std::ptr::{null, null_mut};
use std::time::Instant;

fn first_line(path: &str, key: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

/// Forward then backward of one path; (forward ms, backward ms, CPU ms of both, the
/// backward's minor page faults).
fn time_path(r: &Inputs, dy: H, chunked: bool) -> (f64, f64, f64, i64) {
    let [q, k, v, a, b, al, dt, s, m] = r.args();
    // PROBE_CHUNK: the chunk size of both chunked calls (default 0: the library's).
    let chunk: i32 = env_or("PROBE_CHUNK", 0);
    let c0 = cpu_seconds();
    let t0 = Instant::now();
    let (mut y, mut st) = (null_mut(), null_mut());
    ok(unsafe {
        match chunked {
            true => {
                mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, chunk, &mut y, &mut st)
            }
            false => mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st),
        }
    });
    ok(mlxk_array_eval(y));
    ok(mlxk_array_eval(st));
    let fwd = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = Instant::now();
    let f1 = minor_faults();
    let mut g = [null_mut(); 8];
    let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut g;
    ok(unsafe {
        match chunked {
            true => mlxk_gated_delta_update_chunked_vjp(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                s,
                m,
                chunk,
                dy,
                null(),
                o0,
                o1,
                o2,
                o3,
                o4,
                o5,
                o6,
                o7,
            ),
            false => mlxk_gated_delta_update_vjp(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                s,
                m,
                dy,
                null(),
                o0,
                o1,
                o2,
                o3,
                o4,
                o5,
                o6,
                o7,
            ),
        }
    });
    for h in g {
        ok(mlxk_array_eval(h));
    }
    let bwd = t1.elapsed().as_secs_f64() * 1e3;
    let faults = minor_faults() - f1;
    let cpu = (cpu_seconds() - c0) * 1e3;
    for h in g.into_iter().chain([y, st]) {
        free(h);
    }
    (fwd, bwd, cpu, faults)
}

fn chunked_and_exact_forward_plus_backward() {
    println!(
        "cpu: {}; threads: {}; load before: {}",
        first_line("/proc/cpuinfo", "model name"),
        mlxkern::testing::cpu_threads(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let mut rng = Rng::fresh();
    let lengths: Vec<usize> = match std::env::var("PROBE_T") {
        Ok(t) => t.split(',').filter_map(|x| x.parse().ok()).collect(),
        Err(_) => vec![512, 2048, 4096],
    };
    let exact = std::env::var_os("PROBE_NO_EXACT").is_none();
    // PROBE_AVX2: the AVX2 product kernels even where the CPU has AVX-512.
    mlxkern::testing::force_avx2_kernels(std::env::var_os("PROBE_AVX2").is_some());
    for t in lengths {
        let r = Inputs::random(
            &mut rng,
            [1, t, 16, 32, 128, 128],
            false,
            MLXK_DTYPE_BFLOAT16,
        );
        let dy = array(
            &rng.vec(t * 32 * 128, 1.0),
            &[1, t, 32, 128],
            MLXK_DTYPE_BFLOAT16,
        );
        for (name, chunked) in [("chunked", true), ("exact", false)] {
            if !chunked && !exact {
                continue;
            }
            let mut best = (f64::MAX, f64::MAX, f64::MAX, f64::MAX);
            // The backward's minor page faults, fewest over the runs (the first run's include
            // its buffers' first pages).
            let mut faults = i64::MAX;
            for _ in 0..3 {
                let (f, b, cpu, pf) = time_path(&r, dy, chunked);
                faults = faults.min(pf);
                if f + b < best.2 {
                    best = (f, b, f + b, cpu);
                }
            }
            println!(
                "T={t:5} {name:8} fwd {:7.1} ms  bwd {:7.1} ms  fwd+bwd {:7.1} ms wall, \
                 {:7.1} ms cpu (best of 3); bwd minor page faults {faults}",
                best.0, best.1, best.2, best.3
            );
        }
        free(dy);
        r.free();
    }
    println!(
        "load after: {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}

/// The chunked backward's gradients against the exact backward's at the same dims (float32
/// inputs, an initial state, gates from random a, b), for T = 512 and 4096: the largest
/// difference of each gradient relative to its largest magnitude.
fn chunked_against_exact_at_qwen_dims() {
    let mut rng = Rng::fresh();
    let names = ["dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"];
    for t in [512usize, 4096] {
        // float32 inputs and gradients: the comparison sees the backwards, not a rounding to
        // bf16.
        let f32_ = MLXK_DTYPE_FLOAT32;
        let inputs = Inputs::random(&mut rng, [1, t, 16, 32, 128, 128], true, f32_);
        let [q, k, v, a, b, al, dt, s, m] = inputs.args();
        let dy = array(&rng.vec(t * 32 * 128, 1.0), &[1, t, 32, 128], f32_);
        let ds = array(&rng.vec(32 * 128 * 128, 0.5), &[1, 32, 128, 128], f32_);
        let grads = |chunked: bool| -> Vec<Vec<f32>> {
            let mut g = [null_mut(); 8];
            let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut g;
            ok(unsafe {
                match chunked {
                    true => mlxk_gated_delta_update_chunked_vjp(
                        q, k, v, a, b, al, dt, s, m, 0, dy, ds, o0, o1, o2, o3, o4, o5, o6, o7,
                    ),
                    false => mlxk_gated_delta_update_vjp(
                        q, k, v, a, b, al, dt, s, m, dy, ds, o0, o1, o2, o3, o4, o5, o6, o7,
                    ),
                }
            });
            g.into_iter()
                .map(|h| {
                    let mut f = null_mut();
                    ok(unsafe { mlxk_array_astype(h, MLXK_DTYPE_FLOAT32, &mut f) });
                    let values = read_f32(f);
                    free(f);
                    free(h);
                    values
                })
                .collect()
        };
        let (exact, chunked) = (grads(false), grads(true));
        let table: Vec<String> = names
            .iter()
            .zip(exact.iter().zip(&chunked))
            .map(|(n, (e, c))| {
                let scale = e.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-30);
                let err = e.iter().zip(c).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
                format!("{n} {:.1e}", err / scale)
            })
            .collect();
        println!(
            "T={t}: chunked vs exact, error / largest: {}",
            table.join(", ")
        );
        for h in [dy, ds] {
            free(h);
        }
        inputs.free();
    }
}

fn main() {
    run_probes(&[
        (
            "chunked_and_exact_forward_plus_backward",
            chunked_and_exact_forward_plus_backward,
        ),
        (
            "chunked_against_exact_at_qwen_dims",
            chunked_against_exact_at_qwen_dims,
        ),
    ]);
}
