//! MLX's CPU transcendental formulas, ported operation for operation, so the CPU kernels
//! compute the same bits as MLX's own CPU ops (`mx.exp`, `mx.sigmoid`) and as mlx-lm on CPU.
//! Formulas from MLX's `backend/cpu/simd/math.h` and `unary_ops.h` (MIT, THIRD_PARTY_NOTICES.md).

use super::elem::Elem;

/// MLX's CPU `exp` for float32: 2^(x·log2 e) split into an integer power (built in the
/// exponent bits) and a degree-6 polynomial (fused multiply-adds) for the fraction.
#[inline(always)]
pub fn exp(x_init: f32) -> f32 {
    // MLX writes log2(e) as the literal 1.442695, which rounds to the same f32 as LOG2_E.
    let x = x_init * std::f32::consts::LOG2_E;
    // MLX adds the double 0.5, so the rounding happens in double precision.
    let ipart = ((x as f64) + 0.5).floor() as f32;
    let fpart = x - ipart;
    let mut p = 1.535336188319500e-4f32;
    p = p.mul_add(fpart, 1.339887440266574e-3f32);
    p = p.mul_add(fpart, 9.618437357674640e-3f32);
    p = p.mul_add(fpart, 5.550332471162809e-2f32);
    p = p.mul_add(fpart, 2.402264791363012e-1f32);
    p = p.mul_add(fpart, 6.931472028550421e-1f32);
    p = p.mul_add(fpart, 1.000000000000000f32);
    let epart = (ipart as i32).wrapping_add(127).wrapping_shl(23);
    let mut result = if x_init.is_nan() {
        x_init
    } else {
        f32::from_bits(epart as u32) * p
    };
    if x_init > 88.0 {
        result = f32::INFINITY;
    }
    if x_init < -88.0 {
        result = 0.0;
    }
    result
}

/// MLX's CPU sigmoid for element type `T`: `e = T(exp(|x|))`, `y = 1 / (1 + e)` in f32,
/// `T(x < 0 ? y : 1 - y)`. Returns the value as f32 (already rounded to T).
#[inline(always)]
pub fn sigmoid<T: Elem>(x: f32) -> f32 {
    let e = T::from_f32(exp(x.abs())).to_f32();
    let y = 1.0f32 / (1.0f32 + e);
    T::from_f32(if x < 0.0 { y } else { 1.0 - y }).to_f32()
}

/// `rsqrt` as the CPU computes it: `1 / sqrt(x)` (Metal's `precise::rsqrt` is its own).
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    1.0f32 / x.sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_accurate_and_handles_the_edges() {
        let mut x = -80.0f32;
        while x < 87.5 {
            // Below -80 results approach the subnormal range and lose relative precision.
            let rel = ((exp(x) as f64) - (x as f64).exp()).abs() / (x as f64).exp();
            // The float product x·log2(e) carries a relative error up to |x|·2^-24, as in MLX.
            assert!(
                rel < 2e-7 * (1.0 + x.abs() as f64),
                "exp({x}) relative error {rel}"
            );
            x += 0.173;
        }
        assert_eq!(exp(89.0), f32::INFINITY);
        assert_eq!(exp(-89.0), 0.0);
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(0.0), 1.0);
    }
}

/// MLX's CPU `logaddexp(x, 0)` (mlx-lm's softplus) for element type `T`: every operation
/// rounds to T as MLX's `Simd<T>` ops do.
#[inline(always)]
pub fn softplus<T: Elem>(x: f32) -> f32 {
    let r = |v: f32| T::from_f32(v).to_f32();
    let maxval = if x.is_nan() || x > 0.0 { x } else { 0.0 };
    let minval = if x.is_nan() || x < 0.0 { x } else { 0.0 };
    if minval == f32::NEG_INFINITY || maxval == f32::INFINITY {
        return maxval;
    }
    let e = r(exp(r(minval - maxval)));
    r(maxval + r(e.ln_1p()))
}
