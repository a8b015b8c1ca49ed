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
