//! The matrix tiles on MLX CUDA (kernels/cuda/tiles.cuh through `cuda::launch`, the self-test
//! text kernels/metal/tiles_check.metal, src/metal/tiles.rs), in each form (`cuda::TileForm`:
//! fma, tf32, bf16), against float64 products of the same float32 inputs.
//!
//! Bound, per element, relative to S = Σ_k |a_ik| |b_kj| (the sum of the magnitudes of the
//! terms; `bound`): the inputs' rounding — none for fma, 2^-11 per input for tf32
//! (cvt.rna: 10 stored mantissa bits, nearest), 2^-8 for bf16 (7 bits, nearest even) — moves a
//! product by at most 2δ + δ²; the float32 accumulation of k terms by at most k · 2^-23 of S
//! (k additions of relative error 2^-24 each when rounded to nearest; doubled because tensor
//! cores are documented to neither order nor round to nearest: Fasi et al., PeerJ CS 7:e330,
//! measured truncation). y = c0 + gate ⊙ (A B) adds two roundings of 2^-24 of
//! |gate| S + |c0|. Masked elements (column > row) must be c0's bits exactly (c0 + 0).
//!
//! `chunked_backward_in_every_tile_form` runs the chunked backward in each form
//! (tests/cuda/chunked_grad.rs gives its bounds). `tiles_speed` (ignored; run on the device,
//! `scripts/cuda/device.sh tiles`) times a large product in the three forms in one process.

use super::*;
use mlxkern::cuda::TileForm;
use mlxkern::metal::tiles::{tiles_bench_launch, tiles_check_launch};
use mlxkern::testing::gpu_launch;

/// Relative error of one input's rounding in `form`.
fn input_rounding(form: TileForm) -> f64 {
    match form {
        TileForm::Fma => 0.0,
        TileForm::Tf32 => 2f64.powi(-11),
        TileForm::Bf16 => 2f64.powi(-8),
    }
}

/// The bound on |got - exact| / S for a sum of `k` products (see above).
fn bound(form: TileForm, k: usize) -> f64 {
    let d = input_rounding(form);
    2.0 * d + d * d + k as f64 * 2f64.powi(-23)
}

/// Runs `launch` with `form` on the GPU; its outputs, read as f32.
fn run(launch: mlxkern::bridge::MetalLaunch, form: TileForm, inputs: &[H]) -> Vec<Vec<f32>> {
    let launch = mlxkern::cuda::with_tile_form(launch, form);
    let mut outs = vec![null_mut(); launch.output_names.len()];
    let ins: Vec<*const mlxk_array> = inputs.iter().map(|&h| h as *const mlxk_array).collect();
    ok(unsafe { gpu_launch(GpuKernels::Cuda, true, launch, &ins, &mut outs) });
    let values = outs.iter().map(|&h| read_f32(h)).collect();
    outs.into_iter().for_each(free);
    values
}

/// The worst |got - exact| / bound over a product's elements; `exact` and `magnitude` (S) in
/// float64, `extra` the part of the bound that does not scale with S.
fn worst_ratio(got: &[f32], exact: &[f64], magnitude: &[f64], rel: f64, extra: &[f64]) -> f64 {
    got.iter()
        .zip(exact)
        .zip(magnitude.iter().zip(extra))
        .map(|((&g, &e), (&s, &x))| {
            let b = (rel * s + x).max(f32::MIN_POSITIVE as f64);
            let r = (g as f64 - e).abs() / b;
            if r.is_nan() {
                f64::INFINITY
            } else {
                r
            }
        })
        .fold(0.0, f64::max)
}

/// C = A B in float64 (`a` is m x k, `b` k x n, each read through `at`), with Σ |a| |b|.
fn product(
    m: usize,
    k: usize,
    n: usize,
    a: impl Fn(usize, usize) -> f64,
    b: impl Fn(usize, usize) -> f64,
) -> (Vec<f64>, Vec<f64>) {
    let (mut c, mut s) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for l in 0..k {
                c[i * n + j] += a(i, l) * b(l, j);
                s[i * n + j] += (a(i, l) * b(l, j)).abs();
            }
        }
    }
    (c, s)
}

/// The self-test on `items` random work items; returns the worst ratios of y, z, w, ysum.
fn check(rng: &mut Rng, form: TileForm, items: usize, m: usize, k: usize, n: usize) -> [f64; 4] {
    let a = rng.vec(items * m * k, 1.0);
    let b = rng.vec(items * k * n, 1.0);
    let gate: Vec<f32> = (0..items * m).map(|_| 0.5 + 0.5 * rng.uniform()).collect();
    let c0 = rng.vec(items * m * n, 0.25);
    let dims = |d: &[usize]| d.iter().map(|&x| x as i32).collect::<Vec<_>>();
    let inputs = [
        new_f32(&a, &dims(&[items, m, k])),
        new_f32(&b, &dims(&[items, k, n])),
        new_f32(&gate, &dims(&[items, m])),
        new_f32(&c0, &dims(&[items, m, n])),
    ];
    let out = run(tiles_check_launch(items, m, k, n), form, &inputs);
    inputs.into_iter().for_each(free);
    let mut worst = [0.0f64; 4];
    let u = 2f64.powi(-24);
    for g in 0..items {
        let ag = |i: usize, l: usize| a[(g * m + i) * k + l] as f64;
        let bg = |l: usize, j: usize| b[(g * k + l) * n + j] as f64;
        // y = c0 + mask(diag(gate) A B); masked elements are c0's bits.
        let (ab, s) = product(m, k, n, ag, bg);
        let (mut y, mut sy, mut extra) = (vec![0.0; m * n], vec![0.0; m * n], vec![0.0; m * n]);
        for i in 0..m {
            let gi = gate[g * m + i] as f64;
            for j in 0..n {
                let at = i * n + j;
                let c = c0[g * m * n + at] as f64;
                let got = out[0][g * m * n + at];
                if j > i {
                    assert_eq!(
                        got.to_bits(),
                        c0[g * m * n + at].to_bits(),
                        "{form:?}: masked y[{g}][{i}][{j}] is not c0"
                    );
                }
                let kept = j <= i;
                y[at] = c + if kept { gi * ab[at] } else { 0.0 };
                sy[at] = if kept { gi * s[at] } else { 0.0 };
                extra[at] = 2.0 * u * (sy[at] + c.abs());
            }
        }
        let rel = bound(form, k);
        worst[0] = worst[0].max(worst_ratio(
            &out[0][g * m * n..][..m * n],
            &y,
            &sy,
            rel,
            &extra,
        ));
        // ysum: the kept part of y over each tile's 8 columns (row_sum), ten roundings more.
        let tiles = n / 8;
        let (mut ts, mut tm) = (vec![0.0; m * tiles], vec![0.0; m * tiles]);
        for i in 0..m {
            for j in 0..n {
                ts[i * tiles + j / 8] += y[i * n + j] - c0[g * m * n + i * n + j] as f64;
                tm[i * tiles + j / 8] += sy[i * n + j];
            }
        }
        let zero = vec![0.0; m * tiles];
        let got = &out[3][g * m * tiles..][..m * tiles];
        worst[3] = worst[3].max(worst_ratio(got, &ts, &tm, bound(form, k + 10), &zero));
        // z = Aᵀ A (a sum of m terms), w = A Aᵀ (k terms).
        let (z, sz) = product(k, m, k, |i, l| ag(l, i), ag);
        let zero = vec![0.0; k * k];
        let rz = bound(form, m);
        worst[1] = worst[1].max(worst_ratio(
            &out[1][g * k * k..][..k * k],
            &z,
            &sz,
            rz,
            &zero,
        ));
        let (w, sw) = product(m, k, m, ag, |l, j| ag(j, l));
        let zero = vec![0.0; m * m];
        worst[2] = worst[2].max(worst_ratio(
            &out[2][g * m * m..][..m * m],
            &w,
            &sw,
            rel,
            &zero,
        ));
    }
    worst
}

/// The lock of the tests that need their process alone and a fresh generator, on an MLX with
/// a CUDA backend; elsewhere None, after a line saying the test skipped (`how`: what runs it).
fn on_cuda(how: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Rng)> {
    if !cuda() {
        eprintln!("skipped: the loaded MLX has no CUDA backend{how}");
        return None;
    }
    Some((serial(), Rng::fresh()))
}

#[test]
fn tiles_products_within_bounds() {
    let Some((_serial, mut rng)) = on_cuda("; `make test-cuda` runs this") else {
        return;
    };
    for form in TileForm::ALL {
        for (items, m, k, n) in [
            (3, 32, 64, 32),
            (2, 16, 16, 64),
            (5, 64, 32, 16),
            (1, 48, 48, 48),
        ] {
            let w = check(&mut rng, form, items, m, k, n);
            println!(
                "tiles {} items {items} M {m} K {k} N {n}: worst error / bound y {:.3} z {:.3} w {:.3} \
                 ysum {:.3} (bound {:.2e} of Σ|a||b| at K)",
                form.name(),
                w[0],
                w[1],
                w[2],
                w[3],
                bound(form, k)
            );
            for (what, r) in ["y", "z", "w", "ysum"].iter().zip(w) {
                assert!(
                    r <= 1.0,
                    "{form:?} M {m} K {k} N {n}: {what} {r:.3} of its bound"
                );
            }
        }
    }
    println!("PASS: tiles: every form within its bounds, masks exact");
}

/// The chunked backward, whose sequential stages multiply on the tiles, in each tile form
/// within that form's bounds (tests/cuda/chunked_grad.rs).
#[test]
fn chunked_backward_in_every_tile_form() {
    let Some((_serial, mut rng)) = on_cuda("; `make test-cuda` runs this") else {
        return;
    };
    crate::chunked_grad::chunked_backward_tile_forms(&mut rng);
    println!("PASS: tiles: the chunked backward within its bounds in every tile form");
}

/// The chunked forward, whose state and output passes multiply on the tiles, in each tile form
/// within that form's bounds, and its pool and packed calls bit for bit the dense ones
/// (tests/cuda/chunked.rs).
#[test]
fn chunked_forward_in_every_tile_form() {
    let Some((_serial, mut rng)) = on_cuda("; `make test-cuda` runs this") else {
        return;
    };
    crate::chunked::chunked_forward_tile_forms(&mut rng);
    println!("PASS: tiles: the chunked forward within its bounds in every tile form");
}

/// Times `reps` repetitions of a 64 x k x 64 product per work item over `items` items in each
/// form (the same inputs), after a warm-up; prints ms and TFLOP/s, and checks each result
/// against the fma form's within the forms' bounds.
#[test]
#[ignore = "timing: run on the device (scripts/cuda/device.sh tiles)"]
fn tiles_speed() {
    let Some((_serial, mut rng)) = on_cuda("") else {
        return;
    };
    let (items, k, reps) = (4096usize, 32usize, 64usize);
    let a = new_f32(&rng.vec(items * 64 * k, 1.0), &[items as i32, 64, k as i32]);
    let b = new_f32(&rng.vec(items * k * 64, 1.0), &[items as i32, k as i32, 64]);
    let flop = 2.0 * 64.0 * 64.0 * k as f64 * reps as f64 * items as f64;
    let mut first: Option<Vec<f32>> = None;
    for form in TileForm::ALL {
        let launch = mlxkern::cuda::with_tile_form(tiles_bench_launch(items, k, reps), form);
        let mut times = Vec::new();
        let mut last = Vec::new();
        for i in 0..12 {
            let mut out = [null_mut()];
            let start = std::time::Instant::now();
            ok(unsafe { gpu_launch(GpuKernels::Cuda, true, launch.clone(), &[a, b], &mut out) });
            ok(mlxk_array_eval(out[0]));
            let t = start.elapsed().as_secs_f64();
            if i >= 2 {
                times.push(t);
            }
            if i == 11 {
                last = read_f32(out[0]);
            }
            free(out[0]);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        println!(
            "tiles bench {}: {items} items x {reps} x (64 x {k} x 64): median {:.3} ms, min {:.3} ms, \
             {:.1} TFLOP/s",
            form.name(),
            median * 1e3,
            times[0] * 1e3,
            flop / times[0] / 1e12
        );
        // Each result is reps · A B: against the first form's, within both bounds.
        match &first {
            None => first = Some(last),
            Some(reference) => {
                let scale = reference.iter().fold(0.0f32, |m, x| m.max(x.abs())) as f64;
                let worst = reference
                    .iter()
                    .zip(&last)
                    .fold(0.0f64, |m, (r, g)| m.max((*r as f64 - *g as f64).abs()));
                println!(
                    "  largest difference from fma: {:.2e} of the largest |y|",
                    worst / scale
                );
                // Each element sums reps · k terms of magnitude <= 1, so S <= reps · k.
                let allowed =
                    (bound(form, reps * k) + bound(TileForm::Fma, reps * k)) * (reps * k) as f64;
                assert!(worst <= allowed, "{form:?}: {worst} > {allowed}");
            }
        }
    }
    free(a);
    free(b);
}
