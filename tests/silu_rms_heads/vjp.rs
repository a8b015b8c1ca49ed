//! `mlxk_silu_rms_heads_vjp` through the C ABI: the gradients of x, q_scale and k_scale against
//! a float64 evaluation of their formulas, itself checked against central differences of a
//! float64 forward, on fresh random inputs (the seed is printed): GQA (Hv a multiple of Hk),
//! odd widths, Dk and Dv from 1 to 128 (the head split's range), bf16 / f16 / f32 inputs,
//! cotangents of other dtypes; absent cotangents; argument errors. Prints the error table.
//!
//! Tolerance per element (tests/support/grad.rs): the rounding of the result to its dtype,
//! `unit(T)·|grad|`, plus `32 · 2^-24` of the magnitude of the terms its f32 evaluation adds up
//! (about 14 f32 operations per element, each within 2^-24 of that magnitude; sums are f64),
//! plus half the smallest subnormal of T.

use crate::support::grad;

use crate::support::*;
use grad::*;
use mlxkern::capi::silu_rms_heads::*;
use mlxkern::testing::{silu_rms_heads_vjp_via_gpu, GpuKernels};
use std::ptr::null_mut;

#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    s: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
}

impl Dims {
    fn rows(&self) -> usize {
        self.b * self.s
    }
    fn channels(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
    /// Shapes of x, q_scale (and k_scale), dq (and dk), dv.
    fn shapes(&self) -> [Vec<i32>; 4] {
        let i = |v: usize| v as i32;
        [
            vec![i(self.b), i(self.s), i(self.channels())],
            vec![i(self.dk)],
            vec![i(self.b), i(self.s), i(self.hk), i(self.dk)],
            vec![i(self.b), i(self.s), i(self.hv), i(self.dv)],
        ]
    }
}

/// One call's inputs (values as the arrays hold them).
struct Case {
    d: Dims,
    dtype: Float,
    /// The dtypes of dq, dk, dv.
    cot_dtypes: [Float; 3],
    eps: f32,
    x: Vec<f32>,
    q_scale: Vec<f32>,
    k_scale: Vec<f32>,
    /// dq, dk, dv (None: absent).
    cot: [Option<Vec<f32>>; 3],
}

impl Case {
    fn random(rng: &mut Rng, d: Dims, dtype: Float, cot_dtypes: [Float; 3], eps: f32) -> Case {
        let round = |t: Float, v: Vec<f32>| v.into_iter().map(|x| t.round(x)).collect::<Vec<_>>();
        let qk = d.rows() * d.hk * d.dk;
        Case {
            d,
            dtype,
            cot_dtypes,
            eps,
            x: round(dtype, rng.vec(d.rows() * d.channels(), 3.0)),
            q_scale: round(dtype, rng.vec(d.dk, 1.0)),
            k_scale: round(dtype, rng.vec(d.dk, 1.0)),
            cot: [
                Some(round(cot_dtypes[0], rng.vec(qk, 1.0))),
                Some(round(cot_dtypes[1], rng.vec(qk, 1.0))),
                Some(round(cot_dtypes[2], rng.vec(d.rows() * d.hv * d.dv, 1.0))),
            ],
        }
    }

    fn describe(&self) -> String {
        format!(
            "{:?}, x {}, cotangents {:?}, eps {:e}",
            self.d,
            self.dtype.name(),
            self.cot_dtypes.map(|t| t.name()),
            self.eps
        )
    }

    /// Runs the C function; returns dx, dq_scale, dk_scale as f32 (dtypes and shapes checked).
    fn run(&self) -> [Vec<f32>; 3] {
        self.run_on(None)
    }

    /// As `run`, through the GPU device's path (MLX ops, on a CPU stream) when `gpu` is given.
    fn run_on(&self, gpu: Option<GpuKernels>) -> [Vec<f32>; 3] {
        let d = self.d;
        let [xs, ss, qks, vs] = d.shapes();
        let (x, _) = self.dtype.array(&self.x, &xs);
        let (qs, _) = self.dtype.array(&self.q_scale, &ss);
        let (ks, _) = self.dtype.array(&self.k_scale, &ss);
        let cot_shapes = [&qks, &qks, &vs];
        let cot: Vec<H> = (0..3)
            .map(|i| match &self.cot[i] {
                Some(values) => self.cot_dtypes[i].array(values, cot_shapes[i]).0,
                None => null_mut(),
            })
            .collect();
        let mut outs = [null_mut(); 3];
        let [o0, o1, o2] = &mut outs;
        let (hk, hv, dv) = (d.hk as i32, d.hv as i32, d.dv as i32);
        ok(match gpu {
            None => unsafe {
                mlxk_silu_rms_heads_vjp(
                    x, qs, ks, hk, hv, dv, self.eps, cot[0], cot[1], cot[2], o0, o1, o2,
                )
            },
            Some(kernels) => unsafe {
                silu_rms_heads_vjp_via_gpu(
                    kernels,
                    false,
                    [x, qs, ks].map(|h| h as _),
                    [hk, hv, dv],
                    self.eps,
                    [cot[0], cot[1], cot[2]].map(|h| h as _),
                    [o0 as *mut H, o1 as *mut H, o2 as *mut H],
                )
            },
        });
        let shapes = [xs, ss.clone(), ss];
        let grads = [0, 1, 2].map(|i| {
            assert_eq!(shape_of(outs[i]), shapes[i]);
            let values = read_as_f32(outs[i], self.dtype);
            free(outs[i]);
            values
        });
        for h in [x, qs, ks].into_iter().chain(cot) {
            if !h.is_null() {
                free(h);
            }
        }
        grads
    }

    /// The cotangent `which` at `i`, 0 when absent.
    fn g(&self, which: usize, i: usize) -> f64 {
        self.cot[which].as_ref().map_or(0.0, |c| c[i] as f64)
    }

    /// (width, first channel, kind 0 q / 1 k / 2 v, offset of the head in its output) of head
    /// `head` of row `row`.
    fn head(&self, row: usize, head: usize) -> (usize, usize, usize, usize) {
        let d = self.d;
        if head < 2 * d.hk {
            let kind = head / d.hk;
            (d.dk, head * d.dk, kind, (row * d.hk + head % d.hk) * d.dk)
        } else {
            let h = head - 2 * d.hk;
            (d.dv, 2 * d.hk * d.dk + h * d.dv, 2, (row * d.hv + h) * d.dv)
        }
    }

    /// The gradients in float64 and the magnitudes their f32 evaluation is accurate to:
    /// `[(dx, mag), (dq_scale, mag), (dk_scale, mag)]`.
    fn reference(&self) -> [(Vec<f64>, Vec<f64>); 3] {
        let d = self.d;
        let c = d.channels();
        let mut dx = (vec![0.0; d.rows() * c], vec![0.0; d.rows() * c]);
        let mut dscale = [
            (vec![0.0; d.dk], vec![0.0; d.dk]),
            (vec![0.0; d.dk], vec![0.0; d.dk]),
        ];
        for row in 0..d.rows() {
            for head in 0..2 * d.hk + d.hv {
                let (width, channel, kind, at) = self.head(row, head);
                let x: Vec<f64> = (0..width)
                    .map(|i| self.x[row * c + channel + i] as f64)
                    .collect();
                let out = row * c + channel;
                if kind == 2 {
                    for (i, &xi) in x.iter().enumerate() {
                        let g = self.g(2, at + i);
                        dx.0[out + i] = g * slope64(xi);
                        dx.1[out + i] = g.abs() * slope_mag(xi);
                    }
                    continue;
                }
                let scale = if kind == 0 {
                    &self.q_scale
                } else {
                    &self.k_scale
                };
                let s: Vec<f64> = x.iter().map(|&v| silu64(v)).collect();
                let inv = 1.0
                    / (s.iter().map(|v| v * v).sum::<f64>() / width as f64 + self.eps as f64)
                        .sqrt();
                let n: Vec<f64> = s.iter().map(|v| v * inv).collect();
                let g: Vec<f64> = (0..width).map(|i| self.g(kind, at + i)).collect();
                let gn: Vec<f64> = (0..width).map(|i| g[i] * scale[i] as f64).collect();
                let dot: f64 = (0..width).map(|i| gn[i] * n[i]).sum();
                let dot_mag: f64 = (0..width).map(|i| (gn[i] * n[i]).abs()).sum();
                for i in 0..width {
                    dscale[kind].0[i] += g[i] * n[i];
                    dscale[kind].1[i] += (g[i] * n[i]).abs();
                    dx.0[out + i] = inv * (gn[i] - n[i] * dot / width as f64) * slope64(x[i]);
                    dx.1[out + i] =
                        slope_mag(x[i]) * inv * (gn[i].abs() + n[i].abs() * dot_mag / width as f64);
                }
            }
        }
        let [dq, dk] = dscale;
        [dx, dq, dk]
    }

    /// sum(dq·q) + sum(dk·k) + sum(dv·v) of the float64 forward, over row `row` (all: None).
    fn loss(&self, x: &[f64], q_scale: &[f64], k_scale: &[f64], row: Option<usize>) -> f64 {
        let d = self.d;
        let c = d.channels();
        let rows = match row {
            Some(r) => r..r + 1,
            None => 0..d.rows(),
        };
        let mut total = 0.0;
        for row in rows {
            for head in 0..2 * d.hk + d.hv {
                let (width, channel, kind, at) = self.head(row, head);
                let s: Vec<f64> = (0..width)
                    .map(|i| silu64(x[row * c + channel + i]))
                    .collect();
                if kind == 2 {
                    total += (0..width).map(|i| self.g(2, at + i) * s[i]).sum::<f64>();
                    continue;
                }
                let scale = if kind == 0 { q_scale } else { k_scale };
                let inv = 1.0
                    / (s.iter().map(|v| v * v).sum::<f64>() / width as f64 + self.eps as f64)
                        .sqrt();
                total += (0..width)
                    .map(|i| self.g(kind, at + i) * scale[i] * s[i] * inv)
                    .sum::<f64>();
            }
        }
        total
    }

    /// The float64 formulas against central differences of the float64 forward, at a few
    /// elements of each input.
    fn check_reference_by_central_differences(&self, reference: &[(Vec<f64>, Vec<f64>); 3]) {
        let f64v = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let c = self.d.channels();
        check_formulas(
            &self.describe(),
            reference,
            [f64v(&self.x), f64v(&self.q_scale), f64v(&self.k_scale)],
            9,
            |which, i| (which == 0).then_some(i / c),
            |a, row| self.loss(&a[0], &a[1], &a[2], row),
        );
    }
}

const NAMES: [&str; 3] = ["dx", "dq_scale", "dk_scale"];

fn dims(b: usize, s: usize, hk: usize, hv: usize, dk: usize, dv: usize) -> Dims {
    Dims {
        b,
        s,
        hk,
        hv,
        dk,
        dv,
    }
}

#[test]
fn gradients_match_float64_for_every_dtype_and_shape() {
    let mut rng = Rng::fresh();
    let mut table = Table::default();
    use Float::*;
    let cases = [
        dims(2, 3, 2, 4, 32, 32),     // GQA
        dims(1, 4, 16, 32, 128, 128), // Qwen3.5's heads
        dims(2, 2, 1, 3, 64, 96),
        dims(3, 1, 2, 2, 7, 33), // odd widths
        dims(1, 5, 1, 2, 128, 1),
        dims(2, 2, 3, 6, 40, 128),
        dims(1, 3, 1, 1, 1, 5),
    ];
    for (n, &d) in cases.iter().enumerate() {
        for dtype in FLOATS {
            let other = FLOATS[(n + 1) % 3];
            for cot_dtypes in [[dtype; 3], [F32, other, dtype]] {
                // With Dk = 1 and eps = 0 q and k are sign(silu): their gradients are 0.
                let eps = if d.dk == 1 {
                    0.1
                } else {
                    [1e-6 / d.dk as f32, 1e-5, 0.0][n % 3]
                };
                let c = Case::random(&mut rng, d, dtype, cot_dtypes, eps);
                let got = c.run();
                let reference = c.reference();
                if dtype == F32 {
                    c.check_reference_by_central_differences(&reference);
                }
                for i in 0..3 {
                    table.check(
                        "silu_rms_heads",
                        NAMES[i],
                        dtype,
                        &got[i],
                        &reference[i].0,
                        &reference[i].1,
                        &c.describe(),
                    );
                }
            }
        }
    }
    table.print("mlxk_silu_rms_heads_vjp");
}

#[test]
fn absent_cotangents_are_zeros() {
    let mut rng = Rng::fresh();
    let d = dims(2, 2, 2, 4, 16, 8);
    for dtype in FLOATS {
        let full = Case::random(&mut rng, d, dtype, [dtype; 3], 1e-6);
        for absent in 1..8usize {
            // The same case with the absent cotangents given as zeros, and left out.
            let mut zeros = Case::random(&mut rng, d, dtype, [dtype; 3], 1e-6);
            zeros.x = full.x.clone();
            zeros.q_scale = full.q_scale.clone();
            zeros.k_scale = full.k_scale.clone();
            let mut missing = Case::random(&mut rng, d, dtype, [dtype; 3], 1e-6);
            missing.x = full.x.clone();
            missing.q_scale = full.q_scale.clone();
            missing.k_scale = full.k_scale.clone();
            for i in 0..3 {
                zeros.cot[i] = full.cot[i].clone();
                missing.cot[i] = full.cot[i].clone();
                if absent & (1 << i) != 0 {
                    zeros.cot[i] = Some(vec![0.0; full.cot[i].as_ref().unwrap().len()]);
                    missing.cot[i] = None;
                }
            }
            let (with_zeros, without) = (zeros.run(), missing.run());
            assert_eq!(
                with_zeros,
                without,
                "{}: absent set {absent:03b}",
                full.describe()
            );
            // Whatever is given shows up in the gradients.
            let any = without[0].iter().any(|&v| v != 0.0);
            assert_eq!(
                any,
                absent != 7,
                "{}: absent set {absent:03b}",
                full.describe()
            );
        }
    }
}

#[test]
fn results_do_not_depend_on_the_job_split() {
    let mut rng = Rng::fresh();
    let c = Case::random(
        &mut rng,
        dims(4, 64, 4, 8, 128, 128),
        Float::F32,
        [Float::F32; 3],
        1e-6,
    );
    assert_eq!(c.run(), c.run());
}

#[test]
fn empty_batches_give_empty_dx_and_zero_scales() {
    for (b, s) in [(0, 3), (2, 0)] {
        let x = new_bf16(&[], &[b, s, 14]);
        let sc = new_bf16(&[0.5; 4], &[4]);
        let mut outs = [null_mut(); 3];
        let [o0, o1, o2] = &mut outs;
        ok(unsafe {
            mlxk_silu_rms_heads_vjp(
                x,
                sc,
                sc,
                1,
                2,
                3,
                1e-6,
                null_mut(),
                null_mut(),
                null_mut(),
                o0,
                o1,
                o2,
            )
        });
        assert_eq!(shape_of(outs[0]), [b, s, 14]);
        assert_eq!(read_bf16(outs[1]), vec![0.0; 4]);
        assert_eq!(read_bf16(outs[2]), vec![0.0; 4]);
        for h in outs.into_iter().chain([x, sc]) {
            free(h);
        }
    }
}

#[test]
fn arguments_are_checked_and_named() {
    let mut rng = Rng::fresh();
    let fn_name = "mlxk_silu_rms_heads_vjp";
    // Hk 1, Hv 2, Dk 4, Dv 3: x [2, 3, 14].
    let x = new_f32(&rng.vec(84, 1.0), &[2, 3, 14]);
    let sc = new_f32(&rng.vec(4, 1.0), &[4]);
    let dq = new_f32(&rng.vec(24, 1.0), &[2, 3, 1, 4]);
    let dv = new_f32(&rng.vec(36, 1.0), &[2, 3, 2, 3]);
    let dq_s = new_f32(&rng.vec(18, 1.0), &[2, 3, 1, 3]);
    let dv_b = new_f32(&rng.vec(36, 1.0), &[2, 3, 3, 2]);
    let rank3 = new_f32(&rng.vec(24, 1.0), &[2, 3, 4]);
    let ints = new_bytes(&[0u8; 96], &[2, 3, 1, 4], MLXK_DTYPE_INT32);
    let call = |heads: [i32; 3], eps: f32, cot: [H; 3], want: mlxk_status, needles: &[&str]| {
        let mut outs = [null_mut(); 3];
        let [o0, o1, o2] = &mut outs;
        let [hk, hv, w] = heads;
        let status = unsafe {
            mlxk_silu_rms_heads_vjp(
                x, sc, sc, hk, hv, w, eps, cot[0], cot[1], cot[2], o0, o1, o2,
            )
        };
        expect_err(status, want, needles);
        assert!(last_error().starts_with(fn_name), "{}", last_error());
        assert!(
            outs.iter().all(|h| h.is_null()),
            "a refused call wrote a result"
        );
    };
    let ok_heads = [1, 2, 3];
    let none = null_mut();
    // (key_heads, value_heads, Dv), eps, (dq, dk, dv), the status, words of the message.
    #[rustfmt::skip]
    let refused: [([i32; 3], f32, [H; 3], mlxk_status, &[&str]); 8] = [
        (ok_heads, 1e-6, [dq_s, none, none], MLXK_ERR_SHAPE, &["dq: dimension 3 (Dk) is 3"]),
        (ok_heads, 1e-6, [none, rank3, none], MLXK_ERR_SHAPE, &["dk: expected rank 4"]),
        (ok_heads, 1e-6, [none, none, dv_b], MLXK_ERR_SHAPE, &["dv: dimension 2 (Hv) is 3"]),
        (ok_heads, 1e-6, [none, ints, none], MLXK_ERR_DTYPE, &["dk: dtype int32"]),
        (ok_heads, 1e-6, [dv, none, none], MLXK_ERR_SHAPE, &["dq: dimension 2 (Hk) is 2"]),
        ([1, 2, 4], 1e-6, [dq, none, dv], MLXK_ERR_SHAPE, &["x: dimension 2 (channels)"]),
        ([0, 2, 3], 1e-6, [dq, none, dv], MLXK_ERR_INVALID_ARGUMENT, &["key_heads is 0"]),
        (ok_heads, -1.0, [dq, none, dv], MLXK_ERR_INVALID_ARGUMENT, &["eps is -1"]),
    ];
    for (heads, eps, cot, want, needles) in refused {
        call(heads, eps, cot, want, needles);
    }
    // Out-parameters: NULL, and two at the same place.
    let (mut a, mut b) = (null_mut(), null_mut());
    let status = unsafe {
        mlxk_silu_rms_heads_vjp(
            x,
            sc,
            sc,
            1,
            2,
            3,
            1e-6,
            dq,
            none,
            dv,
            &mut a,
            null_mut(),
            &mut b,
        )
    };
    expect_err(status, MLXK_ERR_NULL_POINTER, &["dq_scale is NULL"]);
    let status = unsafe {
        mlxk_silu_rms_heads_vjp(
            x, sc, sc, 1, 2, 3, 1e-6, dq, none, dv, &mut a, &mut b, &mut a,
        )
    };
    expect_err(
        status,
        MLXK_ERR_INVALID_ARGUMENT,
        &["dx and dk_scale", "same place"],
    );
    assert!(a.is_null() && b.is_null());
    free_all(&[x, sc, dq, dv, dq_s, dv_b, rank3, ints]);
}

/// The GPU device's path (`mx::vjp` of mlx-lm's SiLU, head split and `mx::fast::rms_norm`
/// with the scales as weights, in MLX ops, run here on a CPU stream) against the CPU backward:
/// shapes and dtypes equal, and each gradient within `bound · u · scale` of the CPU kernel's,
/// scale being the CPU gradient's largest magnitude and u the unit roundoff of x's dtype (MLX
/// works in it; the cotangents arrive cast to it, the gradients are in it). 16-bit: MLX rounds
/// some six intermediate values to the dtype, each within one unit of the scale, and sums the
/// scales' gradients over rows and heads: bound 8 (measured <= 2.4). f32: f32 sums in
/// another order: bound 64 (measured <= 8.4).
#[test]
fn the_gpu_path_matches_the_cpu_backward() {
    let mut rng = Rng::fresh();
    use Float::*;
    let cases = [
        dims(2, 3, 2, 4, 32, 32), // GQA
        dims(1, 4, 16, 32, 128, 128),
        dims(3, 1, 2, 2, 7, 33), // odd widths
        dims(1, 5, 1, 2, 128, 1),
    ];
    for (n, &d) in cases.iter().enumerate() {
        for dtype in FLOATS {
            let other = FLOATS[(n + 1) % 3];
            for (k, cot_dtypes) in [[dtype; 3], [F32, other, dtype]].into_iter().enumerate() {
                let eps = [1e-6 / d.dk as f32, 1e-5, 0.0][n % 3];
                let mut c = Case::random(&mut rng, d, dtype, cot_dtypes, eps);
                if k == 1 {
                    c.cot[n % 3] = None; // an absent cotangent is zeros on both paths
                }
                let kernels = if n % 2 == 0 {
                    GpuKernels::Metal
                } else {
                    GpuKernels::Cuda
                };
                let cpu = c.run();
                let ops = c.run_on(Some(kernels));
                let (u, bound) = (dtype.unit(), if dtype == F32 { 64.0 } else { 8.0 });
                for i in 0..3 {
                    let absent: Vec<bool> = c.cot.iter().map(Option::is_none).collect();
                    let what = format!("{}, absent {absent:?}: {}", c.describe(), NAMES[i]);
                    let zero = cpu[i].iter().all(|&v| v == 0.0);
                    if zero && i > 0 && c.cot[i - 1].is_none() {
                        // The scale's gradient with its cotangent absent.
                        assert!(ops[i].iter().all(|&v| v == 0.0), "{what}: not zero");
                        continue;
                    }
                    check_paths(&what, u, bound, &cpu[i], &ops[i]);
                }
            }
        }
    }
}
