//! `mlxk_gated_delta_update_chunked_vjp` through the C ABI: every gradient against central
//! differences of a float64 forward, and against the exact update's backward
//! (`mlxk_gated_delta_update_vjp`) on every entry, on fresh random inputs: GQA 1–4, Dk 32..256,
//! odd Dv, masks (fully masked rows included), absent state, T not a multiple of the chunk,
//! chunk sizes 16..128, gates that underflow to 0; its argument checks; and its GPU path (the
//! chunked GPU backward) up to its first kernel's launch.
//!
//! Bounds are relative to the largest magnitude of each gradient (a gradient's entries span
//! orders of magnitude; float32 rounding is relative to the sums that produce them, which are
//! of the size of the largest entries). Both backwards are float32 with sums over at most
//! T/C + C + Dk terms in each chain of a few products: a few hundred roundings of 6e-8 in the
//! worst case, errors of about 1e-7..7e-7 of the largest magnitude measured (printed with
//! --nocapture); the bound, 2e-5, leaves a margin of about 30.

use crate::support::vjp_case;

use crate::support::*;
use mlxkern::testing::{gated_delta_update_chunked_vjp_via_gpu, GpuKernels};
use std::ptr::{null, null_mut};
use vjp_case::{base64, central_at, run, small_args, vjp_to, Case};

fn random_case(rng: &mut Rng, dims: [usize; 6], state: bool, mask: bool) -> Case {
    let [b, t, hk, _, dk, _] = dims;
    let q = heads(rng, b * t * hk * dk, dk, (dk as f32).powf(-0.5));
    let k = heads(rng, b * t * hk * dk, dk, 1.0);
    // Row 1 (when there is one) fully masked; elsewhere about a quarter of the tokens.
    Case::random_with(rng, dims, [q, k], state, |rng| {
        mask.then(|| {
            (0..b * t)
                .map(|i| i / t != 1 && rng.below(4) != 0)
                .collect()
        })
    })
}

const NAMES: [&str; 8] = vjp_case::GRADS;

/// "name error" for each gradient.
fn table(worst: &[f64; 8]) -> String {
    NAMES
        .iter()
        .zip(worst)
        .map(|(n, e)| format!("{n} {e:.1e}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn largest(x: &[f32]) -> f64 {
    x.iter().fold(0f64, |m, &v| m.max(v.abs() as f64))
}

/// Every entry of each gradient within `bound` of the largest magnitude of the exact
/// backward's; returns the largest error of each, relative to that magnitude.
fn compare(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], bound: f64) -> [f64; 8] {
    let mut worst = [0f64; 8];
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let scale = largest(w).max(1e-30);
        for (j, (&x, &y)) in g.iter().zip(w).enumerate() {
            assert!(x.is_finite(), "{what}: {}[{j}] = {x}", NAMES[i]);
            let err = (x as f64 - y as f64).abs() / scale;
            worst[i] = worst[i].max(err);
            assert!(
                err <= bound,
                "{what}: {}[{j}] {x} vs {y} (largest {scale:e})",
                NAMES[i]
            );
        }
    }
    worst
}

#[test]
fn gradients_match_central_differences_of_a_float64_forward() {
    let mut rng = Rng::fresh();
    let cases = [
        ([2, 21, 1, 2, 32, 3], true, false, 16),
        ([2, 19, 2, 4, 32, 2], false, true, 0),
        ([1, 40, 1, 3, 64, 5], true, true, 16),
    ];
    for (dims, with_state, with_mask, chunk) in cases {
        let c = random_case(&mut rng, dims, with_state, with_mask);
        let got = run(&c, Some(chunk), true);
        let base = base64(&c);
        let mut worst = [0f64; 8];
        for (which, grad) in got.iter().enumerate() {
            let scale = largest(grad).max(1e-12);
            let step = grad.len().div_ceil(10).max(1);
            for i in (0..grad.len()).step_by(step) {
                let want = central_at(&c, &base, which, i, 1e-5);
                let err = (grad[i] as f64 - want).abs() / scale;
                worst[which] = worst[which].max(err);
                // float32 sums against float64 (the differences themselves good to ~1e-9).
                assert!(
                    err <= 2e-5,
                    "{dims:?} chunk {chunk}: {}[{i}] {} vs {want} (largest {scale:e})",
                    NAMES[which],
                    grad[i]
                );
            }
        }
        println!(
            "{dims:?} chunk {chunk}: worst error / largest vs float64: {}",
            table(&worst)
        );
    }
}

#[test]
fn gradients_match_the_exact_backward() {
    let mut rng = Rng::fresh();
    // (B, T, Hk, Hv, Dk, Dv), state, mask, chunk.
    let cases = [
        ([1, 1, 1, 1, 32, 1], true, false, 0),
        ([2, 45, 1, 1, 32, 7], true, true, 16),
        ([1, 100, 2, 4, 64, 16], false, false, 32),
        ([3, 77, 2, 6, 96, 9], true, true, 64),
        ([1, 150, 1, 4, 128, 33], true, false, 128),
        ([2, 61, 2, 2, 256, 5], false, true, 16),
        ([1, 130, 4, 16, 32, 3], true, false, 48),
    ];
    for (dims, with_state, with_mask, chunk) in cases {
        let c = random_case(&mut rng, dims, with_state, with_mask);
        let exact = run(&c, None, true);
        let chunked = run(&c, Some(chunk), true);
        let what = format!("{dims:?} state {with_state} mask {with_mask} chunk {chunk}");
        let worst = compare(&what, &chunked, &exact, 2e-5);
        println!("{what}: worst error / largest vs exact: {}", table(&worst));
        if with_mask && dims[0] > 1 {
            // Row 1 is fully masked: zero gradients, dstate = dstate_out.
            let [_, t, hk, hv, dk, dv] = dims;
            let row = |x: &[f32], per: usize| x[t * per..2 * t * per].iter().all(|&v| v == 0.0);
            assert!(row(&chunked[0], hk * dk) && row(&chunked[1], hk * dk));
            assert!(row(&chunked[2], hv * dv) && row(&chunked[3], hv) && row(&chunked[4], hv));
            let s = hv * dv * dk;
            let ds = c.dstate_out.as_ref().unwrap();
            assert_eq!(&chunked[7][s..2 * s], &ds[s..2 * s]);
        }
    }
}

#[test]
fn without_cotangents_or_tokens_the_gradients_are_zeros() {
    let mut rng = Rng::fresh();
    for dims in [
        [1, 0, 1, 2, 32, 3],
        [0, 5, 1, 2, 32, 3],
        [2, 9, 1, 2, 32, 3],
    ] {
        let mut c = random_case(&mut rng, dims, true, false);
        let t = dims[1];
        if t == 9 {
            c.dy.iter_mut().for_each(|x| *x = 0.0);
            c.dstate_out = None;
        }
        let got = run(&c, Some(16), true);
        for (i, g) in got.iter().enumerate() {
            if i == 7 && t == 0 {
                assert_eq!(
                    g,
                    c.dstate_out.as_ref().unwrap(),
                    "T = 0: dstate = dstate_out"
                );
            } else {
                assert_zeros(g, &format!("{dims:?}: {}", NAMES[i]));
            }
        }
    }
}

/// Gates that underflow to 0 (g = exp(−exp(A_log) · softplus(a + dt_bias)) with a rate of
/// e^6 and a large a) on some tokens, others near 1: finite gradients equal to the exact
/// backward's within the bound.
#[test]
fn gates_that_underflow_give_finite_gradients() {
    let mut rng = Rng::fresh();
    for (dims, chunk) in [([1, 50, 1, 2, 32, 4], 16), ([2, 70, 2, 4, 64, 3], 32)] {
        let mut c = random_case(&mut rng, dims, true, false);
        c.a_log = vec![6.0; dims[3]];
        c.dt_bias = vec![0.0; dims[3]];
        for (i, a) in c.a.iter_mut().enumerate() {
            // Every seventh gate exactly 0 (exp(-e^6 · 30) underflows), the rest tiny rates.
            *a = if i % 7 == 3 {
                30.0
            } else {
                -12.0 + rng.uniform()
            };
        }
        let exact = run(&c, None, true);
        let chunked = run(&c, Some(chunk), true);
        let worst = compare(&format!("{dims:?} tiny gates"), &chunked, &exact, 2e-5);
        println!(
            "{dims:?} underflowing gates: worst error / largest vs exact: {}",
            table(&worst)
        );
        assert!(chunked[3].iter().any(|&x| x != 0.0));
    }
}

#[test]
fn arguments_are_checked_and_named() {
    let mut rng = Rng::fresh();
    let [q, v, g, hv1] = small_args(&mut rng, 2);
    let flat = new_f32(&rng.vec(64, 0.2), &[2, 32]);
    let bad_dy = new_f32(&rng.vec(6, 1.0), &[1, 2, 1, 3]);
    let call = |q_arg: H, chunk: i32, dy: H, outs: &mut [H; 8], null_last: bool| {
        let mut o = outs.each_mut().map(|o| o as *mut H);
        if null_last {
            o[7] = null_mut();
        }
        let inputs: [*const mlxk_array; 11] =
            [q_arg, q, v, g, g, hv1, hv1, null(), null(), dy, null()];
        vjp_to(inputs, Some(chunk), o)
    };
    let mut outs = [null_mut(); 8];
    for chunk in [8, 24, -16, 144, 256] {
        expect_err(
            call(q, chunk, null_mut(), &mut outs, false),
            MLXK_ERR_INVALID_ARGUMENT,
            &[
                "mlxk_gated_delta_update_chunked_vjp",
                "chunk_size",
                &chunk.to_string(),
            ],
        );
    }
    expect_err(
        call(flat, 0, null_mut(), &mut outs, false),
        MLXK_ERR_SHAPE,
        &["mlxk_gated_delta_update_chunked_vjp", "q"],
    );
    expect_err(
        call(null_mut(), 0, null_mut(), &mut outs, false),
        MLXK_ERR_NULL_POINTER,
        &["q"],
    );
    expect_err(
        call(q, 16, bad_dy, &mut outs, false),
        MLXK_ERR_SHAPE,
        &["dy"],
    );
    expect_err(
        call(q, 16, null_mut(), &mut outs, true),
        MLXK_ERR_NULL_POINTER,
        &["dstate"],
    );
    assert!(
        outs.iter().all(|h| h.is_null()),
        "a refused call wrote an out-parameter"
    );
    // A good call after the refusals.
    ok(call(q, 16, null_mut(), &mut outs, false));
    for h in outs {
        free(h);
    }
    free_all(&[q, v, g, hv1, flat, bad_dy]);
}

/// With a GPU as default device the chunked VJP is the chunked GPU backward: without a GPU
/// (MLX's CPU stream) it gets as far as its first kernel's launch, which MLX refuses, after
/// checking the chunk size like the CPU path.
#[test]
fn the_gpu_path_reaches_the_gpu_backward_kernel() {
    let mut rng = Rng::fresh();
    let mut c = random_case(&mut rng, [1, 9, 1, 2, 32, 3], true, false);
    c.dstate_out = None;
    let hs = vjp_case::handles(&c, true);
    let args = hs.map(|h| h as *const mlxk_array);
    for (kernels, launch, back_end) in [
        (GpuKernels::Metal, "metal_kernel", "No Metal back-end"),
        (GpuKernels::Cuda, "cuda_kernel", "No CUDA back-end"),
    ] {
        for (chunk, status, needles) in [
            (16, MLXK_ERR_BACKEND, [launch, back_end]),
            (20, MLXK_ERR_INVALID_ARGUMENT, ["chunk_size", "20"]),
        ] {
            let mut grads: [H; 8] = [null_mut(); 8];
            let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut grads;
            let outs = [o0, o1, o2, o3, o4, o5, o6, o7].map(|o| o as *mut H);
            let got = unsafe {
                gated_delta_update_chunked_vjp_via_gpu(kernels, false, chunk, args, outs)
            };
            expect_err(got, status, &needles);
            assert!(grads.iter().all(|g| g.is_null()));
        }
    }
    for h in hs.into_iter().filter(|h| !h.is_null()) {
        free(h);
    }
}
