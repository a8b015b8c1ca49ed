//! The SiLU + RMS head split on the CPU, in the Metal kernel's order: one 32-lane group per
//! (row, head), lane `l` owning columns `[4l, 4l + 4)` (zeros past the width), its four squares
//! summed in order, then the xor butterfly; `inv = rsqrt(sum / Dk + eps)`.

use half::{bf16, f16};

use super::elem::{round_to, Elem};
use super::math::{rsqrt, sigmoid};
use super::reduce::simd_sum;
use super::{typed, typed_mut, Buffers};
use crate::dtype::Dtype;

#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub rows: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// SiLU with MLX's rounding points for element type `T`: `T(x · T(sigmoid))`.
#[inline(always)]
pub fn silu<T: Elem>(x: f32) -> f32 {
    round_to::<T>(x * sigmoid::<T>(x))
}

/// Splits `x [rows, 2·Hk·Dk + Hv·Dv]` into q, k `[rows, Hk, Dk]` (normalized, scaled) and
/// v `[rows, Hv, Dv]` (activated).
#[allow(clippy::too_many_arguments)]
pub fn split<T: Elem>(
    d: Dims,
    eps: f32,
    x: &[T],
    q_scale: &[T],
    k_scale: &[T],
    q: &mut [T],
    k: &mut [T],
    v: &mut [T],
) {
    let channels = 2 * d.hk * d.dk + d.hv * d.dv;
    let mut values = [0f32; 128];
    let mut partials = [0f32; 32];
    for row in 0..d.rows {
        let x_row = &x[row * channels..(row + 1) * channels];
        for head in 0..2 * d.hk + d.hv {
            let normalize = head < 2 * d.hk;
            let (width, channel) = if normalize {
                (d.dk, head * d.dk)
            } else {
                (d.dv, 2 * d.hk * d.dk + (head - 2 * d.hk) * d.dv)
            };
            for (lane, partial) in partials.iter_mut().enumerate() {
                let mut sum = 0.0f32;
                for i in 0..4 {
                    let col = lane * 4 + i;
                    let activated = if col < width {
                        silu::<T>(x_row[channel + col].to_f32())
                    } else {
                        0.0
                    };
                    values[col] = activated;
                    sum += activated * activated;
                }
                *partial = sum;
            }
            if normalize {
                let inv = rsqrt(simd_sum(&partials) / d.dk as f32 + eps);
                let (scale, out) = if head < d.hk {
                    (q_scale, &mut *q)
                } else {
                    (k_scale, &mut *k)
                };
                let at = (row * d.hk + head % d.hk) * d.dk;
                for col in 0..d.dk {
                    let normalized = round_to::<T>(values[col] * inv);
                    out[at + col] = T::from_f32(scale[col].to_f32() * normalized);
                }
            } else {
                let at = (row * d.hv + head - 2 * d.hk) * d.dv;
                for col in 0..d.dv {
                    v[at + col] = T::from_f32(values[col]);
                }
            }
        }
    }
}

/// Params: `[rows, Hk, Hv, Dk, Dv, dtype, eps bits]`; inputs `x, q_scale, k_scale`;
/// outputs `q, k, v`.
pub(crate) fn run(params: &[i64], buffers: Buffers) {
    let d = Dims {
        rows: params[0] as usize,
        hk: params[1] as usize,
        hv: params[2] as usize,
        dk: params[3] as usize,
        dv: params[4] as usize,
    };
    let dtype = super::dtype_param(params[5]);
    let eps = f32::from_bits(params[6] as u32);
    let [x, qs, ks] = [buffers.inputs[0], buffers.inputs[1], buffers.inputs[2]];
    let mut outputs = buffers.outputs.into_iter();
    let (q, k, v) = (
        outputs.next().unwrap(),
        outputs.next().unwrap(),
        outputs.next().unwrap(),
    );
    match dtype {
        Dtype::Bfloat16 => split::<bf16>(
            d,
            eps,
            typed(x),
            typed(qs),
            typed(ks),
            typed_mut(q),
            typed_mut(k),
            typed_mut(v),
        ),
        Dtype::Float16 => split::<f16>(
            d,
            eps,
            typed(x),
            typed(qs),
            typed(ks),
            typed_mut(q),
            typed_mut(k),
            typed_mut(v),
        ),
        Dtype::Float32 => split::<f32>(
            d,
            eps,
            typed(x),
            typed(qs),
            typed(ks),
            typed_mut(q),
            typed_mut(k),
            typed_mut(v),
        ),
        other => panic!("silu_rms_heads: unsupported dtype {}", other.name()),
    }
}
