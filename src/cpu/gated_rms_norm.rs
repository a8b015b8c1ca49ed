//! Gated RMSNorm on the CPU, in the Metal kernel's order: THREADS = min(1024, ceil(D/128)·32)
//! threads per row; thread `tid` sums, for r = 0, 4·THREADS, ..., the squares of columns
//! `r + 4·tid + i` (i = 0..3) in order; each 32-thread SIMD group meets in the xor butterfly;
//! with more than 32 threads the group sums (zero-padded to 32) meet in a second butterfly.

use half::{bf16, f16};

use super::elem::{round_to, Elem};
use super::math::{rsqrt, sigmoid};
use super::reduce::simd_sum;
use super::{to_f32_vec, typed, typed_mut, Buffers};
use crate::dtype::Dtype;

/// The threads per row the Metal launch uses.
pub fn threads(width: usize) -> usize {
    width.div_ceil(128).saturating_mul(32).min(1024)
}

/// `inv = rsqrt(sum(x²) / D + eps)` with the Metal kernel's reduction order.
pub fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let width = x.len();
    let threads = threads(width);
    let mut group_sums = [0f32; 32];
    let mut lanes = [0f32; 32];
    for (group, group_sum) in group_sums.iter_mut().enumerate().take(threads / 32) {
        for (lane, acc) in lanes.iter_mut().enumerate() {
            let tid = group * 32 + lane;
            let mut sum = 0.0f32;
            let mut r = 0;
            while r < width {
                for i in 0..4 {
                    let col = r + tid * 4 + i;
                    let value = if col < width { x[col] } else { 0.0 };
                    sum += value * value;
                }
                r += threads * 4;
            }
            *acc = sum;
        }
        *group_sum = simd_sum(&lanes);
    }
    let total = if threads > 32 {
        simd_sum(&group_sums)
    } else {
        group_sums[0]
    };
    rsqrt(total / width as f32 + eps)
}

/// `out = T(silu_f32(gate) · f32(T(w · T(x · inv))))` per row of `width` values.
pub fn norm<T: Elem, G: Elem>(
    width: usize,
    eps: f32,
    x: &[T],
    gate: &[G],
    weight: &[T],
    out: &mut [T],
) {
    let mut row_f32 = vec![0f32; width];
    for ((x_row, gate_row), out_row) in x
        .chunks_exact(width)
        .zip(gate.chunks_exact(width))
        .zip(out.chunks_exact_mut(width))
    {
        for (dst, src) in row_f32.iter_mut().zip(x_row) {
            *dst = src.to_f32();
        }
        let inv = inverse_rms(&row_f32, eps);
        for col in 0..width {
            let normalized =
                round_to::<T>(weight[col].to_f32() * round_to::<T>(row_f32[col] * inv));
            let g = gate_row[col].to_f32();
            let silu = g * sigmoid::<f32>(g);
            out_row[col] = T::from_f32(silu * normalized);
        }
    }
}

/// Params: `[width, dtype, gate dtype, eps bits]`; inputs `x, gate, weight`; output `out`.
pub(crate) fn run(params: &[i64], mut buffers: Buffers) {
    let width = params[0] as usize;
    let dtype = super::dtype_param(params[1]);
    let gate_dtype = super::dtype_param(params[2]);
    let eps = f32::from_bits(params[3] as u32);
    let [x, gate, weight] = [buffers.inputs[0], buffers.inputs[1], buffers.inputs[2]];
    if width == 0 {
        return;
    }
    // The gate is read as f32 whatever its dtype (exact widening), like `float(gate[i])`.
    let gate: Vec<f32> = to_f32_vec(gate, gate_dtype);
    let out = &mut *buffers.outputs[0];
    match dtype {
        Dtype::Bfloat16 => {
            norm::<bf16, f32>(width, eps, typed(x), &gate, typed(weight), typed_mut(out))
        }
        Dtype::Float16 => {
            norm::<f16, f32>(width, eps, typed(x), &gate, typed(weight), typed_mut(out))
        }
        Dtype::Float32 => {
            norm::<f32, f32>(width, eps, typed(x), &gate, typed(weight), typed_mut(out))
        }
        other => panic!("gated_rms_norm: unsupported dtype {}", other.name()),
    }
}
