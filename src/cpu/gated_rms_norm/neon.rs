//! The NEON kernel (arm64). A row is widened into a zero-padded f32 buffer (a multiple of 128
//! columns); SIMD group g's 32 threads sum the 128 columns `r + 128g ..` of each stride as
//! eight registers in lane layout (`simd::neon::add_squares`: each thread's four squares in
//! order), then meet in the butterfly. A bf16 or f16 gate's activation `g · sigmoid(g)` comes
//! from a table of all 2^16 results (`simd::neon::gate_table`); an f32 gate computes it four
//! lanes at a time. The elementwise part runs four columns a register.

#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;
use std::ops::Range;

use super::super::math::rsqrt;
use super::super::reduce::simd_sum;
use super::super::simd::neon::{
    add_squares, butterfly, gate_table, load_n, sigmoid, store_n, Quad,
};
use super::{threads, Problem};

/// As `rows_portable`.
///
/// # Safety
/// As `rows_portable`.
pub unsafe fn rows<T: Quad, G: Quad>(p: &Problem<T, G>, rows: Range<usize>) {
    let width = p.width;
    let threads = threads(width);
    let stride = 4 * threads;
    let vectors = width.div_ceil(4);
    let zero = vdupq_n_f32(0.0);
    let table = gate_table::<G>();
    // Columns past the width stay +0 (each thread adds their squares, +0).
    let mut row_f32 = vec![0f32; width.div_ceil(128) * 128];
    let mut weight = vec![0f32; 4 * vectors];
    for j in 0..vectors {
        let w = load_n(p.weight.as_ptr().add(4 * j), width - 4 * j);
        vst1q_f32(weight.as_mut_ptr().add(4 * j), w);
    }
    let mut activation = vec![0f32; 4 * vectors];
    let buf = row_f32.as_mut_ptr();
    for row in rows {
        let x = p.x.as_ptr().add(row * width);
        for j in 0..vectors {
            vst1q_f32(buf.add(4 * j), load_n(x.add(4 * j), width - 4 * j));
        }
        let mut group_sums = [0f32; 32];
        for (g, group_sum) in group_sums.iter_mut().enumerate().take(threads / 32) {
            let mut acc = [zero; 8];
            let mut base = 128 * g;
            // A block starting past the width would add only +0 to each thread's sum, which
            // leaves it unchanged (the sums are +0, positive, +inf or NaN).
            while base < width {
                for (s, a) in acc.iter_mut().enumerate() {
                    *a = add_squares(*a, buf.add(base + 16 * s));
                }
                base += stride;
            }
            *group_sum = butterfly(&acc);
        }
        let total = if threads > 32 {
            simd_sum(&group_sums)
        } else {
            group_sums[0]
        };
        let inv = vdupq_n_f32(rsqrt(total / width as f32 + p.eps));
        let gate = p.gate.as_ptr().add(row * width);
        match table {
            Some(table) => {
                let bits = gate as *const u16;
                for (c, a) in activation.iter_mut().enumerate().take(width) {
                    *a = table[*bits.add(c) as usize];
                }
            }
            None => {
                let mut j = 0;
                while j < vectors {
                    let n = (vectors - j).min(4);
                    let mut g = [zero; 4];
                    for (i, g) in g.iter_mut().enumerate().take(n) {
                        *g = load_n(gate.add(4 * (j + i)), width - 4 * (j + i));
                    }
                    let s = sigmoid::<f32, 4>(g);
                    for i in 0..n {
                        let a = vmulq_f32(g[i], s[i]);
                        vst1q_f32(activation.as_mut_ptr().add(4 * (j + i)), a);
                    }
                    j += n;
                }
            }
        }
        let out = p.out.0.add(row * width);
        for j in 0..vectors {
            let c = 4 * j;
            let scaled = T::round(vmulq_f32(vld1q_f32(buf.add(c)), inv));
            let normalized = T::round(vmulq_f32(vld1q_f32(weight.as_ptr().add(c)), scaled));
            let a = vld1q_f32(activation.as_ptr().add(c));
            store_n(out.add(c), vmulq_f32(a, normalized), width - c);
        }
    }
}
