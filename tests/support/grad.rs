//! Helpers of the gradient suites of the head split and the gated norm
//! (tests/silu_rms_heads/vjp.rs, tests/gated_rms_norm/vjp.rs): float element kinds, the float64
//! SiLU and its slope, central differences, and the error table each suite prints. Included
//! with `#[path]`.
#![allow(dead_code)]

use super::*;

/// A float dtype of the C ABI.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Float {
    Bf16,
    F16,
    F32,
}

pub const FLOATS: [Float; 3] = [Float::Bf16, Float::F16, Float::F32];

impl Float {
    pub fn code(self) -> mlxk_dtype {
        match self {
            Float::Bf16 => MLXK_DTYPE_BFLOAT16,
            Float::F16 => MLXK_DTYPE_FLOAT16,
            Float::F32 => MLXK_DTYPE_FLOAT32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Float::Bf16 => "bf16",
            Float::F16 => "f16",
            Float::F32 => "f32",
        }
    }

    /// The relative error of rounding to this dtype (round to nearest even): half an ulp of
    /// the significand, 2^-8, 2^-11, 2^-24.
    pub fn unit(self) -> f64 {
        match self {
            Float::Bf16 => 2f64.powi(-8),
            Float::F16 => 2f64.powi(-11),
            Float::F32 => 2f64.powi(-24),
        }
    }

    /// The largest absolute error of rounding a value in the subnormal range: half the
    /// smallest subnormal.
    pub fn floor(self) -> f64 {
        match self {
            Float::Bf16 | Float::F32 => 2f64.powi(-150),
            Float::F16 => 2f64.powi(-25),
        }
    }

    /// `x` rounded to this dtype (as f32).
    pub fn round(self, x: f32) -> f32 {
        match self {
            Float::Bf16 => bf16_to_f32(bf16_bits(x)),
            Float::F16 => half::f16::from_f32(x).to_f32(),
            Float::F32 => x,
        }
    }

    /// A handle holding `values` rounded to this dtype; returns it and the rounded values.
    pub fn array(self, values: &[f32], shape: &[i32]) -> (H, Vec<f32>) {
        let rounded: Vec<f32> = values.iter().map(|&v| self.round(v)).collect();
        let h = match self {
            Float::Bf16 => new_bf16(&rounded, shape),
            Float::F16 => {
                let bits: Vec<u16> = rounded
                    .iter()
                    .map(|&v| half::f16::from_f32(v).to_bits())
                    .collect();
                new_bytes(as_bytes(&bits), shape, MLXK_DTYPE_FLOAT16)
            }
            Float::F32 => new_f32(&rounded, shape),
        };
        (h, rounded)
    }
}

/// A handle's values as f32, whatever its float dtype (checked to be `want`).
pub fn read_as_f32(h: H, want: Float) -> Vec<f32> {
    assert_eq!(dtype_of(h), want.code(), "dtype of a gradient");
    let bytes = read_bytes(h);
    match want {
        Float::F32 => read_f32(h),
        Float::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_ne_bytes([c[0], c[1]])))
            .collect(),
        Float::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_ne_bytes([c[0], c[1]])).to_f32())
            .collect(),
    }
}

pub fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// silu'(x) = σ(1 + x(1 − σ)).
pub fn slope64(x: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    s * (1.0 + x * (1.0 - s))
}

/// The magnitude the f32 evaluation of silu'(x) is accurate to: σ(1 + |x|(1 − σ)).
pub fn slope_mag(x: f64) -> f64 {
    let s = 1.0 / (1.0 + (-x).exp());
    s * (1.0 + x.abs() * (1.0 - s))
}

/// `(f(h) − f(−h)) / 2h`.
pub fn central(h: f64, f: impl Fn(f64) -> f64) -> f64 {
    (f(h) - f(-h)) / (2.0 * h)
}

/// f32 roundings the backward kernels' longest chain of operations may add, counted in units of
/// 2^-24 of the magnitude of its terms (`mag`): each gradient element is at most ~14 f32
/// operations (σ from exp: 4, the slope: 5 more, the products with the cotangent, scale or
/// weight and the normalized value: 3, the normalization's correction: 3), each rounding to
/// within 2^-24 of its result, which the terms' magnitude bounds; f32's `exp` is within 2 ulps.
/// Sums are in float64 (their error is far below). 32 leaves a factor two.
pub const F32_ROUNDINGS: f64 = 32.0;

/// Checks the float64 gradient formulas `reference` (per input: the gradient, and what the
/// suite keeps beside it) against central differences of `loss` on every few elements (about
/// `parts` per input) of the three inputs `base`; `row(which, i)` is the row that element `i`
/// of input `which` alone touches, which `loss` may restrict itself to.
pub fn check_formulas(
    what: &str,
    reference: &[(Vec<f64>, Vec<f64>); 3],
    base: [Vec<f64>; 3],
    parts: usize,
    row: impl Fn(usize, usize) -> Option<usize>,
    loss: impl Fn(&[Vec<f64>; 3], Option<usize>) -> f64,
) {
    for (which, (want, _)) in reference.iter().enumerate() {
        let step = want.len().div_ceil(parts).max(1);
        for i in (0..want.len()).step_by(step) {
            let row = row(which, i);
            let numeric = central(1e-5, |h| {
                let mut a = base.clone();
                a[which][i] += h;
                loss(&a, row)
            });
            assert!(
                (numeric - want[i]).abs() <= 1e-6 * (1.0 + want[i].abs()),
                "{what}: float64 formula for input {which} [{i}]: {} vs central difference {numeric}",
                want[i]
            );
        }
    }
}

/// One gradient's comparison with its float64 value: with `e = F32_ROUNDINGS·2^-24·mag` (the
/// f32 arithmetic), `|got − want| <= unit(T)·(|want| + e) + e + floor(T)` for every element
/// (the rounding of the f32 result to its dtype T, and the subnormal range).
#[derive(Debug, Clone)]
pub struct Row {
    pub kernel: &'static str,
    pub input: &'static str,
    pub dtype: Float,
    pub values: usize,
    pub max_abs: f64,
    pub max_want: f64,
    /// The largest error as a fraction of its element's tolerance.
    pub max_budget: f64,
}

/// The error table of a suite: one row per (kernel, input, dtype), the worst over all cases.
#[derive(Default)]
pub struct Table {
    rows: Vec<Row>,
}

impl Table {
    /// Checks `got` against `want` element by element (tolerance above) and records the errors;
    /// `what` describes the case for a failure.
    #[allow(clippy::too_many_arguments)]
    #[track_caller]
    pub fn check(
        &mut self,
        kernel: &'static str,
        input: &'static str,
        dtype: Float,
        got: &[f32],
        want: &[f64],
        mag: &[f64],
        what: &str,
    ) {
        assert_eq!(got.len(), want.len(), "{what}: {input} length");
        assert!(
            want.iter().any(|&w| w != 0.0),
            "{what}: {input}: the reference is all zeros (a case that proves nothing)"
        );
        let (mut max_abs, mut max_want, mut max_budget) = (0f64, 0f64, 0f64);
        for i in 0..got.len() {
            let err = (got[i] as f64 - want[i]).abs();
            // The f32 value is within `arithmetic` of want; rounding it moves it by at most
            // unit(T) of its own magnitude.
            let arithmetic = F32_ROUNDINGS * 2f64.powi(-24) * mag[i];
            let tol = dtype.unit() * (want[i].abs() + arithmetic) + arithmetic + dtype.floor();
            assert!(
                err <= tol,
                "{what}: {input}[{i}] = {} ({}), float64 {} (error {err:.3e} > tolerance {tol:.3e})",
                got[i],
                dtype.name(),
                want[i]
            );
            max_abs = max_abs.max(err);
            max_want = max_want.max(want[i].abs());
            max_budget = max_budget.max(err / tol);
        }
        match self
            .rows
            .iter_mut()
            .find(|r| r.kernel == kernel && r.input == input && r.dtype == dtype)
        {
            Some(r) => {
                r.values += got.len();
                r.max_abs = r.max_abs.max(max_abs);
                r.max_want = r.max_want.max(max_want);
                r.max_budget = r.max_budget.max(max_budget);
            }
            None => self.rows.push(Row {
                kernel,
                input,
                dtype,
                values: got.len(),
                max_abs,
                max_want,
                max_budget,
            }),
        }
    }

    pub fn print(&self, title: &str) {
        eprintln!("\n{title}: gradient errors against float64 (worst over every case)");
        eprintln!(
            "| kernel | input | dtype | values | max abs error | max abs error / max |grad| | \
             worst error / tolerance |"
        );
        eprintln!("|---|---|---|---|---|---|---|");
        for r in &self.rows {
            eprintln!(
                "| {} | {} | {} | {} | {:.3e} | {:.3e} | {:.3} |",
                r.kernel,
                r.input,
                r.dtype.name(),
                r.values,
                r.max_abs,
                r.max_abs / r.max_want.max(1e-300),
                r.max_budget
            );
        }
    }
}

/// Compares one gradient of the GPU device's backward pass (MLX ops under `mx::vjp`, run on a
/// CPU stream in the tests) with the CPU kernel's: the largest difference must be at most
/// `bound · u · scale`, scale being the largest magnitude of the CPU gradient (which must not
/// be all zeros) and `u` a unit roundoff. Prints and returns the largest difference in those
/// units.
#[track_caller]
pub fn check_paths(what: &str, u: f64, bound: f64, cpu: &[f32], ops: &[f32]) -> f64 {
    let scale = cpu.iter().fold(0f64, |m, &x| m.max((x as f64).abs()));
    check_paths_at(what, u, bound, cpu, ops, scale)
}

/// [`check_paths`] with a given scale: for a gradient that sums terms over tokens, the
/// magnitude of those terms, since float sums are accurate relative to their terms, not to a
/// (possibly cancelling) result.
#[track_caller]
pub fn check_paths_at(what: &str, u: f64, bound: f64, cpu: &[f32], ops: &[f32], scale: f64) -> f64 {
    assert_eq!(cpu.len(), ops.len(), "{what}: length");
    assert!(
        cpu.iter().any(|&x| x != 0.0),
        "{what}: the CPU gradient is all zeros (a case that proves nothing)"
    );
    assert!(
        ops.iter().all(|x| x.is_finite()),
        "{what}: a non-finite gradient"
    );
    let worst = cpu
        .iter()
        .zip(ops)
        .map(|(&x, &y)| (x as f64 - y as f64).abs())
        .fold(0f64, f64::max);
    let units = worst / (u * scale);
    eprintln!(
        "{what}: max |ops - cpu| = {worst:.3e} = {units:.2} units of {u:e} x scale {scale:.3e}"
    );
    assert!(
        units <= bound,
        "{what}: the GPU path's largest difference from the CPU backward is {units:.1} units \
         (bound {bound})"
    );
    units
}
