//! The CPU backward pass of the update computes the same bits on every path: all eight
//! gradients of `mlxk_gated_delta_update_vjp` with the portable row loops, with the AVX2 ones
//! (forced where the CPU has AVX-512) and with the fastest, on fresh random inputs: key widths
//! 32 to 256, GQA, masks, initial states, bf16, f16 and f32, and sequences across the 64-token
//! checkpoints. (Widths with a tail past the last group of eight, which the C ABI refuses, are
//! tested in the module.) (It flips process-wide
//! switches: tests/paths/main.rs.)

use crate::support::paths;

use crate::support::vjp_case::vjp;
use crate::support::*;
use std::ptr::null_mut;

fn array_of(values: &[f32], shape: &[usize], dtype: mlxk_dtype) -> H {
    let shape: Vec<i32> = shape.iter().map(|&n| n as i32).collect();
    typed(values, &shape, dtype)
}

/// The eight gradients' bytes for one set of inputs, run on the path the switches select.
fn gradients(inputs: &[H; 11]) -> Vec<Vec<u8>> {
    let [q, k, v, a, b, a_log, dt, state, mask, dy, ds] = *inputs;
    let mut outs = [null_mut(); 8];
    ok(vjp(
        [q, k, v, a, b, a_log, dt, state, mask, dy, ds],
        None,
        &mut outs,
    ));
    outs.iter()
        .map(|&h| {
            let bytes = read_bytes(h);
            free(h);
            bytes
        })
        .collect()
}

#[test]
fn every_path_gives_the_same_gradients() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    const NAMES: [&str; 8] = crate::support::vjp_case::GRADS;
    // B, T, Hk, Hv, Dk, Dv; with state; with mask; dtype.
    let cases: [([usize; 6], bool, bool, mlxk_dtype); 8] = [
        ([1, 130, 2, 4, 128, 128], true, true, MLXK_DTYPE_BFLOAT16),
        ([1, 65, 1, 1, 128, 64], false, false, MLXK_DTYPE_FLOAT32),
        ([2, 70, 1, 3, 32, 5], true, true, MLXK_DTYPE_FLOAT16),
        ([1, 129, 2, 2, 256, 16], true, false, MLXK_DTYPE_FLOAT32),
        ([3, 64, 2, 2, 64, 32], false, true, MLXK_DTYPE_BFLOAT16),
        ([1, 67, 1, 2, 96, 9], true, true, MLXK_DTYPE_FLOAT32),
        ([2, 21, 2, 4, 160, 7], true, false, MLXK_DTYPE_FLOAT16),
        ([1, 3, 1, 1, 224, 3], false, false, MLXK_DTYPE_BFLOAT16),
    ];
    for (dims, with_state, with_mask, dtype) in cases {
        let [b, t, hk, hv, dk, dv] = dims;
        let scale = (dk as f32).powf(-0.5);
        let inputs: [H; 11] = [
            array_of(&rng.vec(b * t * hk * dk, scale), &[b, t, hk, dk], dtype),
            array_of(&rng.vec(b * t * hk * dk, scale), &[b, t, hk, dk], dtype),
            array_of(&rng.vec(b * t * hv * dv, 1.0), &[b, t, hv, dv], dtype),
            array_of(&rng.vec(b * t * hv, 1.5), &[b, t, hv], dtype),
            array_of(&rng.vec(b * t * hv, 2.0), &[b, t, hv], dtype),
            array_of(&rng.vec(hv, 1.0), &[hv], MLXK_DTYPE_FLOAT32),
            array_of(&rng.vec(hv, 0.5), &[hv], dtype),
            if with_state {
                array_of(
                    &rng.vec(b * hv * dv * dk, 0.5),
                    &[b, hv, dv, dk],
                    MLXK_DTYPE_FLOAT32,
                )
            } else {
                null_mut()
            },
            if with_mask {
                let m: Vec<bool> = (0..b * t).map(|_| rng.below(4) != 0).collect();
                new_bool(&m, &[b as i32, t as i32])
            } else {
                null_mut()
            },
            array_of(&rng.vec(b * t * hv * dv, 1.0), &[b, t, hv, dv], dtype),
            array_of(
                &rng.vec(b * hv * dv * dk, 0.5),
                &[b, hv, dv, dk],
                MLXK_DTYPE_FLOAT32,
            ),
        ];
        let (portable, others) = paths::paths(|| gradients(&inputs));
        assert!(
            portable[7].iter().any(|&x| x != 0),
            "the state's gradient is not all zeros ({dims:?})"
        );
        for (path, grads) in others {
            for (i, name) in NAMES.iter().enumerate() {
                assert!(
                    portable[i] == grads[i],
                    "{name}: the {path} path differs from the portable one ({dims:?}, \
                     state {with_state}, mask {with_mask}, dtype {dtype})"
                );
            }
        }
        for h in inputs {
            if !h.is_null() {
                free(h);
            }
        }
    }
}

/// Timing probe (not a test: `cargo test --test gated_delta_update_vjp_paths -- --ignored
/// --nocapture`, threads from MLXK_NUM_THREADS): one call at Qwen3.5-35B-A3B's dims (B = 1,
/// T = 512, Hk 16, Hv 32, Dk = Dv = 128, bf16, no state or mask) with the portable row loops
/// and with the vectorized ones, interleaved so that both see the same load; milliseconds
/// per call (median and best of MLXK_TIMING_REPS, default 7, each).
#[test]
#[ignore]
fn backward_timing() {
    let _serial = serial();
    let mut rng = Rng::seeded(11);
    let [b, t, hk, hv, dk, dv] = [1, 512, 16, 32, 128, 128];
    let bf = MLXK_DTYPE_BFLOAT16;
    let inputs: [H; 11] = [
        array_of(&rng.vec(b * t * hk * dk, 0.088), &[b, t, hk, dk], bf),
        array_of(&rng.vec(b * t * hk * dk, 0.088), &[b, t, hk, dk], bf),
        array_of(&rng.vec(b * t * hv * dv, 1.0), &[b, t, hv, dv], bf),
        array_of(&rng.vec(b * t * hv, 1.5), &[b, t, hv], bf),
        array_of(&rng.vec(b * t * hv, 2.0), &[b, t, hv], bf),
        array_of(&rng.vec(hv, 1.0), &[hv], MLXK_DTYPE_FLOAT32),
        array_of(&rng.vec(hv, 0.5), &[hv], bf),
        null_mut(),
        null_mut(),
        array_of(&rng.vec(b * t * hv * dv, 1.0), &[b, t, hv, dv], bf),
        array_of(
            &rng.vec(b * hv * dv * dk, 0.5),
            &[b, hv, dv, dk],
            MLXK_DTYPE_FLOAT32,
        ),
    ];
    let reps: usize = std::env::var("MLXK_TIMING_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
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
