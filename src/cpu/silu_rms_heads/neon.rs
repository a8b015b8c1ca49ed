//! The NEON kernel (arm64): a head's activations (zero-padded to 128 columns, the 32 lanes of
//! four) in a row buffer, a bf16 or f16 value's SiLU from a table of all 2^16 results
//! (`simd::neon::silu_table`; f32 computes it four lanes at a time); each lane's four squares
//! summed in order as vertical chains after the de-interleaving load (`simd::neon::
//! add_squares`), the butterfly as pairwise adds, the normalization four columns a register.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;
use std::ops::Range;

use super::super::math::rsqrt;
use super::super::simd::neon::{add_squares, butterfly, load_n, silu, silu_table, store_n, Quad};
use super::Problem;

/// As `heads_portable`.
///
/// # Safety
/// As `heads_portable`.
pub unsafe fn heads<T: Quad>(p: &Problem<T>, units: Range<usize>) {
    let d = p.d;
    let channels = d.channels();
    let table = silu_table::<T>();
    let zero = vdupq_n_f32(0.0);
    // The scales, widened once.
    let mut scales = [[0f32; 128]; 2];
    for (scale, src) in scales.iter_mut().zip([p.q_scale, p.k_scale]) {
        for (c, s) in scale.iter_mut().enumerate().take(d.dk) {
            *s = src[c].to_f32();
        }
    }
    let mut values = [0f32; 128];
    for unit in units {
        let (row, head) = (unit / d.heads(), unit % d.heads());
        let (width, channel) = d.head(head);
        let src = p.x.as_ptr().add(row * channels + channel);
        let vectors = width.div_ceil(4);
        if let (Some(table), true) = (table, head >= 2 * d.hk) {
            // v is the activation itself: its bits from the table.
            let dst = p.v.0.add((row * d.hv + head - 2 * d.hk) * d.dv) as *mut u16;
            let bits = src as *const u16;
            for c in 0..width {
                *dst.add(c) = table[*bits.add(c) as usize];
            }
            continue;
        }
        // Columns past the width are +0, as the lanes add.
        values[4 * vectors..].fill(0.0);
        match table {
            Some(table) => {
                let bits = src as *const u16;
                for c in 0..width {
                    let y: T = std::mem::transmute_copy(&table[*bits.add(c) as usize]);
                    values[c] = y.to_f32();
                }
                values[width..4 * vectors].fill(0.0);
            }
            None => {
                let mut j = 0;
                while j < vectors {
                    let n = (vectors - j).min(4);
                    let mut x = [zero; 4];
                    for (i, x) in x.iter_mut().enumerate().take(n) {
                        *x = load_n(src.add(4 * (j + i)), width - 4 * (j + i));
                    }
                    // The SiLU of +0 (the lanes past the width) is +0.
                    let y = silu::<T, 4>(x);
                    for (i, y) in y.iter().enumerate().take(n) {
                        vst1q_f32(values.as_mut_ptr().add(4 * (j + i)), *y);
                    }
                    j += n;
                }
            }
        }
        if head < 2 * d.hk {
            let mut partials = [zero; 8];
            for (g, partial) in partials.iter_mut().enumerate() {
                *partial = add_squares(zero, values.as_ptr().add(16 * g));
            }
            let inv = vdupq_n_f32(rsqrt(butterfly(&partials) / d.dk as f32 + p.eps));
            let (scale, out) = if head < d.hk {
                (&scales[0], p.q)
            } else {
                (&scales[1], p.k)
            };
            let dst = out.0.add((row * d.hk + head % d.hk) * d.dk);
            for j in 0..vectors {
                let x = vld1q_f32(values.as_ptr().add(4 * j));
                let normalized = T::round(vmulq_f32(x, inv));
                let y = vmulq_f32(vld1q_f32(scale.as_ptr().add(4 * j)), normalized);
                store_n(dst.add(4 * j), y, width - 4 * j);
            }
        } else {
            let dst = p.v.0.add((row * d.hv + head - 2 * d.hk) * d.dv);
            for j in 0..vectors {
                store_n(
                    dst.add(4 * j),
                    vld1q_f32(values.as_ptr().add(4 * j)),
                    width - 4 * j,
                );
            }
        }
    }
}
