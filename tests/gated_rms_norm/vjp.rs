//! `mlxk_gated_rms_norm_vjp` through the C ABI: the gradients of x, gate and weight against a
//! float64 evaluation of their formulas, itself checked against central differences of a
//! float64 forward, on fresh random inputs (the seed is printed): widths from 1 to 1000 (odd
//! ones included), leading dimensions of rank 1 to 3, bf16 / f16 / f32 inputs, gates and
//! cotangents of other dtypes; an absent cotangent; argument errors. Prints the error table.
//!
//! Tolerance per element (tests/support/grad.rs): the rounding of the result to its dtype,
//! `unit(T)·|grad|`, plus `32 · 2^-24` of the magnitude of the terms its f32 evaluation adds up
//! (about 14 f32 operations per element, each within 2^-24 of that magnitude; sums are f64),
//! plus half the smallest subnormal of T.

use crate::support::grad;

use crate::support::*;
use grad::*;
use mlxkern::capi::gated_rms_norm::*;
use mlxkern::testing::{gated_rms_norm_vjp_via_gpu, GpuKernels};
use std::ptr::null_mut;

/// One call's inputs (values as the arrays hold them).
struct Case {
    shape: Vec<i32>,
    x_dtype: Float,
    gate_dtype: Float,
    dout_dtype: Float,
    eps: f32,
    x: Vec<f32>,
    gate: Vec<f32>,
    weight: Vec<f32>,
    dout: Vec<f32>,
}

impl Case {
    fn random(rng: &mut Rng, shape: &[i32], dtypes: [Float; 3], eps: f32) -> Case {
        let [x_dtype, gate_dtype, dout_dtype] = dtypes;
        let n: usize = shape.iter().map(|&d| d as usize).product();
        let width = *shape.last().unwrap() as usize;
        let round = |t: Float, v: Vec<f32>| v.into_iter().map(|x| t.round(x)).collect::<Vec<_>>();
        Case {
            shape: shape.to_vec(),
            x_dtype,
            gate_dtype,
            dout_dtype,
            eps,
            x: round(x_dtype, rng.vec(n, 2.0)),
            gate: round(gate_dtype, rng.vec(n, 4.0)),
            weight: round(x_dtype, rng.vec(width, 1.5)),
            dout: round(dout_dtype, rng.vec(n, 1.0)),
        }
    }

    fn width(&self) -> usize {
        *self.shape.last().unwrap() as usize
    }

    fn rows(&self) -> usize {
        self.x.len() / self.width()
    }

    fn describe(&self) -> String {
        format!(
            "shape {:?}, x {}, gate {}, dout {}, eps {:e}",
            self.shape,
            self.x_dtype.name(),
            self.gate_dtype.name(),
            self.dout_dtype.name(),
            self.eps
        )
    }

    /// Runs the C function; returns dx, dgate, dweight as f32 (dtypes and shapes checked).
    fn run(&self, with_dout: bool) -> [Vec<f32>; 3] {
        self.run_on(with_dout, None)
    }

    /// As `run`, through the GPU device's path (MLX ops, on a CPU stream) when `gpu` is given.
    fn run_on(&self, with_dout: bool, gpu: Option<GpuKernels>) -> [Vec<f32>; 3] {
        let (x, _) = self.x_dtype.array(&self.x, &self.shape);
        let (gate, _) = self.gate_dtype.array(&self.gate, &self.shape);
        let (weight, _) = self.x_dtype.array(&self.weight, &[self.width() as i32]);
        let dout = if with_dout {
            self.dout_dtype.array(&self.dout, &self.shape).0
        } else {
            null_mut()
        };
        let mut outs = [null_mut(); 3];
        let [o0, o1, o2] = &mut outs;
        ok(match gpu {
            None => unsafe { mlxk_gated_rms_norm_vjp(x, gate, weight, self.eps, dout, o0, o1, o2) },
            Some(kernels) => unsafe {
                gated_rms_norm_vjp_via_gpu(
                    kernels,
                    false,
                    [x, gate, weight].map(|h| h as _),
                    self.eps,
                    dout,
                    [o0 as *mut H, o1 as *mut H, o2 as *mut H],
                )
            },
        });
        let shapes = [
            self.shape.clone(),
            self.shape.clone(),
            vec![self.width() as i32],
        ];
        let dtypes = [self.x_dtype, self.gate_dtype, self.x_dtype];
        let grads = [0, 1, 2].map(|i| {
            assert_eq!(shape_of(outs[i]), shapes[i]);
            let values = read_as_f32(outs[i], dtypes[i]);
            free(outs[i]);
            values
        });
        for h in [x, gate, weight, dout] {
            if !h.is_null() {
                free(h);
            }
        }
        grads
    }

    /// The gradients in float64 and the magnitudes their f32 evaluation is accurate to:
    /// `[(dx, mag), (dgate, mag), (dweight, mag)]`.
    fn reference(&self) -> [(Vec<f64>, Vec<f64>); 3] {
        let (rows, d) = (self.rows(), self.width());
        let mut dx = (vec![0.0; rows * d], vec![0.0; rows * d]);
        let mut dz = (vec![0.0; rows * d], vec![0.0; rows * d]);
        let mut dw = (vec![0.0; d], vec![0.0; d]);
        for r in 0..rows {
            let at = r * d;
            let x: Vec<f64> = self.x[at..at + d].iter().map(|&v| v as f64).collect();
            let inv =
                1.0 / (x.iter().map(|v| v * v).sum::<f64>() / d as f64 + self.eps as f64).sqrt();
            let n: Vec<f64> = x.iter().map(|v| v * inv).collect();
            let mut gn = vec![0.0; d];
            for i in 0..d {
                let (z, g, w) = (
                    self.gate[at + i] as f64,
                    self.dout[at + i] as f64,
                    self.weight[i] as f64,
                );
                dz.0[at + i] = g * w * n[i] * slope64(z);
                dz.1[at + i] = (g * w * n[i]).abs() * slope_mag(z);
                let a = silu64(z);
                dw.0[i] += g * a * n[i];
                dw.1[i] += (g * a * n[i]).abs();
                gn[i] = g * a * w;
            }
            let dot: f64 = (0..d).map(|i| gn[i] * n[i]).sum();
            let dot_mag: f64 = (0..d).map(|i| (gn[i] * n[i]).abs()).sum();
            for i in 0..d {
                dx.0[at + i] = inv * (gn[i] - n[i] * dot / d as f64);
                dx.1[at + i] = inv * (gn[i].abs() + n[i].abs() * dot_mag / d as f64);
            }
        }
        [dx, dz, dw]
    }

    /// sum(dout · out) over row `row` (all rows: None) of the float64 forward on `x`, `gate`,
    /// `weight`.
    fn loss(&self, x: &[f64], gate: &[f64], weight: &[f64], row: Option<usize>) -> f64 {
        let d = self.width();
        let rows = match row {
            Some(r) => r..r + 1,
            None => 0..self.rows(),
        };
        let mut total = 0.0;
        for r in rows {
            let at = r * d;
            let xs = &x[at..at + d];
            let inv =
                1.0 / (xs.iter().map(|v| v * v).sum::<f64>() / d as f64 + self.eps as f64).sqrt();
            for i in 0..d {
                total += self.dout[at + i] as f64 * silu64(gate[at + i]) * weight[i] * xs[i] * inv;
            }
        }
        total
    }

    /// The float64 formulas against central differences of the float64 forward, at a few
    /// elements of each input.
    fn check_reference_by_central_differences(&self, reference: &[(Vec<f64>, Vec<f64>); 3]) {
        let f64v = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let d = self.width();
        check_formulas(
            &self.describe(),
            reference,
            [f64v(&self.x), f64v(&self.gate), f64v(&self.weight)],
            7,
            |which, i| (which < 2).then_some(i / d),
            |a, row| self.loss(&a[0], &a[1], &a[2], row),
        );
    }
}

const NAMES: [&str; 3] = ["dx", "dgate", "dweight"];

#[test]
fn gradients_match_float64_for_every_dtype_and_shape() {
    let mut rng = Rng::fresh();
    let mut table = Table::default();
    use Float::*;
    let shapes: [&[i32]; 7] = [
        &[3, 32],
        &[2, 3, 128],
        &[1, 2, 2, 256],
        &[4, 33],
        &[2, 1000],
        &[5, 1],
        &[7],
    ];
    for (n, shape) in shapes.iter().enumerate() {
        for x_dtype in FLOATS {
            // The gate and the cotangent: x's dtype, or another.
            let other = FLOATS[(n + 1) % 3];
            for (gate_dtype, dout_dtype) in [(x_dtype, x_dtype), (other, F32)] {
                // With D = 1 and eps = 0 the norm is sign(x): dx is exactly 0.
                let eps = if shape.last() == Some(&1) {
                    0.1
                } else {
                    [1e-6, 1e-5, 0.0][n % 3]
                };
                let c = Case::random(&mut rng, shape, [x_dtype, gate_dtype, dout_dtype], eps);
                let got = c.run(true);
                let reference = c.reference();
                if x_dtype == F32 {
                    c.check_reference_by_central_differences(&reference);
                }
                let dtypes = [x_dtype, gate_dtype, x_dtype];
                for i in 0..3 {
                    table.check(
                        "gated_rms_norm",
                        NAMES[i],
                        dtypes[i],
                        &got[i],
                        &reference[i].0,
                        &reference[i].1,
                        &c.describe(),
                    );
                }
            }
        }
    }
    table.print("mlxk_gated_rms_norm_vjp");
}

#[test]
fn absent_cotangent_gives_zeros() {
    let mut rng = Rng::fresh();
    for x_dtype in FLOATS {
        let c = Case::random(&mut rng, &[3, 40], [x_dtype, Float::F32, x_dtype], 1e-6);
        // The same case with its cotangent is not zero: zeros come from the missing dout.
        assert!(c.run(true)[0].iter().any(|&v| v != 0.0));
        for (i, g) in c.run(false).iter().enumerate() {
            assert!(
                g.iter().all(|&v| v == 0.0),
                "{}: {} not zero",
                c.describe(),
                NAMES[i]
            );
        }
    }
}

#[test]
fn results_do_not_depend_on_the_job_split() {
    // Rows enough for several jobs: dweight sums per job, added in job order; the same call
    // twice gives the same bits.
    let mut rng = Rng::fresh();
    let c = Case::random(&mut rng, &[300, 256], [Float::F32; 3], 1e-6);
    assert_eq!(c.run(true), c.run(true));
}

#[test]
fn empty_rows_give_empty_gradients_and_a_zero_dweight() {
    let x = new_bf16(&[], &[0, 8]);
    let w = new_bf16(&[1.0; 8], &[8]);
    let mut outs = [null_mut(); 3];
    let [o0, o1, o2] = &mut outs;
    ok(unsafe { mlxk_gated_rms_norm_vjp(x, x, w, 1e-6, x, o0, o1, o2) });
    assert_eq!(shape_of(outs[0]), [0, 8]);
    assert_eq!(shape_of(outs[1]), [0, 8]);
    assert_eq!(read_bf16(outs[2]), vec![0.0; 8]);
    for h in outs.into_iter().chain([x, w]) {
        free(h);
    }
}

#[test]
fn arguments_are_checked_and_named() {
    let mut rng = Rng::fresh();
    let fn_name = "mlxk_gated_rms_norm_vjp";
    let x = new_f32(&rng.vec(24, 1.0), &[3, 8]);
    let w = new_f32(&rng.vec(8, 1.0), &[8]);
    let w16 = new_bf16(&rng.vec(8, 1.0), &[8]);
    let short = new_f32(&rng.vec(21, 1.0), &[3, 7]);
    let ints = new_bytes(&[0u8; 96], &[3, 8], MLXK_DTYPE_INT32);
    let call = |x: H, g: H, w: H, eps: f32, dout: H, want: mlxk_status, needles: &[&str]| {
        let mut outs = [null_mut(); 3];
        let [o0, o1, o2] = &mut outs;
        let status = unsafe { mlxk_gated_rms_norm_vjp(x, g, w, eps, dout, o0, o1, o2) };
        expect_err(status, want, needles);
        assert!(last_error().starts_with(fn_name), "{}", last_error());
        assert!(
            outs.iter().all(|h| h.is_null()),
            "a refused call wrote a result"
        );
    };
    call(
        x,
        x,
        w,
        1e-6,
        short,
        MLXK_ERR_SHAPE,
        &["dout: shape [3, 7]", "x's shape"],
    );
    call(x, x, w, 1e-6, ints, MLXK_ERR_DTYPE, &["dout: dtype int32"]);
    call(x, short, w, 1e-6, x, MLXK_ERR_SHAPE, &["gate: shape"]);
    call(
        x,
        x,
        w16,
        1e-6,
        x,
        MLXK_ERR_DTYPE,
        &["weight: dtype bfloat16"],
    );
    call(x, x, w, -1.0, x, MLXK_ERR_INVALID_ARGUMENT, &["eps is -1"]);
    call(
        x,
        x,
        w,
        f32::NAN,
        null_mut(),
        MLXK_ERR_INVALID_ARGUMENT,
        &["eps"],
    );
    call(
        null_mut(),
        x,
        w,
        1e-6,
        x,
        MLXK_ERR_NULL_POINTER,
        &["x is NULL"],
    );
    call(
        x,
        x,
        null_mut(),
        1e-6,
        x,
        MLXK_ERR_NULL_POINTER,
        &["weight is NULL"],
    );
    call(ints, ints, w, 1e-6, x, MLXK_ERR_DTYPE, &["x: dtype int32"]);
    // Out-parameters: NULL, and two at the same place.
    let mut a = null_mut();
    let mut b = null_mut();
    let status = unsafe { mlxk_gated_rms_norm_vjp(x, x, w, 1e-6, x, &mut a, &mut b, null_mut()) };
    expect_err(status, MLXK_ERR_NULL_POINTER, &["dweight is NULL"]);
    let status = unsafe { mlxk_gated_rms_norm_vjp(x, x, w, 1e-6, x, &mut a, &mut b, &mut a) };
    expect_err(
        status,
        MLXK_ERR_INVALID_ARGUMENT,
        &["dx and dweight", "same place"],
    );
    assert!(a.is_null() && b.is_null());
    free_all(&[x, w, w16, short, ints]);
}

/// The GPU device's path (`mx::vjp` of mlx-lm's Qwen RMSNormGated in MLX ops, run here on a
/// CPU stream) against the CPU backward: shapes and dtypes equal, and each gradient within
/// `bound · u · scale` of the CPU kernel's, scale being the CPU gradient's largest magnitude and
/// u the unit roundoff of x's dtype (MLX works in it, the cotangent arrives cast to it, dx and
/// dweight are in it), for dgate the coarser of x's and the gate's (dgate is in the gate's).
/// 16-bit: MLX rounds some six intermediate values to the dtype, each within one unit of the
/// scale, the weight's gradient sums over rows: bound 8 (measured <= 3.3). f32: another
/// order of f32 sums of up to D terms: bound 64 (measured <= 9.5).
#[test]
fn the_gpu_path_matches_the_cpu_backward() {
    let mut rng = Rng::fresh();
    use Float::*;
    let shapes: [&[i32]; 4] = [&[3, 32], &[2, 3, 128], &[4, 33], &[2, 1000]];
    for (n, shape) in shapes.iter().enumerate() {
        for x_dtype in FLOATS {
            let other = FLOATS[(n + 1) % 3];
            for (gate_dtype, dout_dtype) in [(x_dtype, x_dtype), (other, F32)] {
                let eps = [1e-6, 1e-5, 0.0][n % 3];
                let c = Case::random(&mut rng, shape, [x_dtype, gate_dtype, dout_dtype], eps);
                let kernels = if n % 2 == 0 {
                    GpuKernels::Metal
                } else {
                    GpuKernels::Cuda
                };
                let cpu = c.run(true);
                let ops = c.run_on(true, Some(kernels));
                for i in 0..3 {
                    let u = if i == 1 {
                        x_dtype.unit().max(gate_dtype.unit())
                    } else {
                        x_dtype.unit()
                    };
                    let bound = if u == F32.unit() { 64.0 } else { 8.0 };
                    let what = format!("{}: {}", c.describe(), NAMES[i]);
                    check_paths(&what, u, bound, &cpu[i], &ops[i]);
                }
            }
        }
    }
}

#[test]
fn the_gpu_path_without_dout_or_rows_gives_zeros() {
    let mut rng = Rng::fresh();
    let c = Case::random(
        &mut rng,
        &[3, 40],
        [Float::Bf16, Float::F32, Float::Bf16],
        1e-6,
    );
    assert!(c.run_on(true, Some(GpuKernels::Metal))[0]
        .iter()
        .any(|&v| v != 0.0));
    for (i, g) in c.run_on(false, Some(GpuKernels::Metal)).iter().enumerate() {
        assert!(
            !g.is_empty() && g.iter().all(|&v| v == 0.0),
            "{} not zero",
            NAMES[i]
        );
    }
    let empty = Case::random(&mut rng, &[0, 8], [Float::F32; 3], 1e-6);
    let [dx, dgate, dweight] = empty.run_on(true, Some(GpuKernels::Cuda));
    assert!(dx.is_empty() && dgate.is_empty());
    assert_eq!(dweight, vec![0.0; 8]);
}
