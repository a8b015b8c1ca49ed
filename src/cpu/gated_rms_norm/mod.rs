//! Gated RMSNorm on the CPU, in the Metal kernel's order: THREADS = min(1024, ceil(D/128)·32)
//! threads per row; thread `tid` sums, for r = 0, 4·THREADS, ..., the squares of columns
//! `r + 4·tid + i` (i = 0..3) in order; each 32-thread SIMD group meets in the xor butterfly;
//! with more than 32 threads the group sums (zero-padded to 32) meet in a second butterfly.
//!
//! Rows are split over the worker pool in runs. With AVX2, FMA and F16C a vectorized kernel
//! runs; elsewhere the portable one. All compute identical bits. The vectorized kernel holds a
//! SIMD group's 32 threads as four registers in lane layout, does the elementwise part eight
//! columns at a time, and takes a bf16 or f16 gate's activation `g · sigmoid(g)` from a table
//! of all 2^16 results (`simd::avx2::gate_table`; an f32 gate computes it). With AVX-512 and a
//! 16-bit gate the same on sixteen lanes (two registers per SIMD group), the table read by
//! gathers. On arm64 a NEON kernel (`gated_rms_norm/neon.rs`) on four lanes.

pub mod backward;

use std::ops::Range;

use half::{bf16, f16};

use crate::cpu::elem::{round_to, Elem};
use crate::cpu::features;
use crate::cpu::math::{rsqrt, sigmoid};
use crate::cpu::pool::{self, SharedMut};
use crate::cpu::reduce::simd_sum;
use crate::cpu::simd::Lanes;
use crate::cpu::{typed, typed_mut, Buffers};
use crate::dtype::Dtype;
use crate::node::gated_rms_norm::Node;
use crate::node::Words;

/// Work (columns) a job should have at least: below it a call runs on the calling thread.
const JOB_COLUMNS: usize = 16384;

pub use crate::node::gated_rms_norm::threads;

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

/// One call's inputs and output, shared by the jobs.
struct Problem<'a, T, G> {
    width: usize,
    eps: f32,
    x: &'a [T],
    gate: &'a [G],
    weight: &'a [T],
    /// Each row is written by one job.
    out: SharedMut<T>,
}

/// `out = T(silu_f32(gate) · f32(T(w · T(x · inv))))` per row of `width` values; the gate is
/// read as f32 whatever its dtype (exact widening), like `float(gate[i])`.
pub fn norm<T: Lanes, G: Lanes>(
    width: usize,
    eps: f32,
    x: &[T],
    gate: &[G],
    weight: &[T],
    out: &mut [T],
) {
    if width == 0 {
        return;
    }
    let rows = x.len() / width;
    assert!(
        gate.len() >= rows * width && weight.len() >= width && out.len() >= rows * width,
        "gated_rms_norm: buffers too small for {rows} rows of {width}"
    );
    let p = Problem {
        width,
        eps,
        x,
        gate,
        weight,
        out: SharedMut(out.as_mut_ptr()),
    };
    let (jobs, per_job) = pool::jobs(rows, width, JOB_COLUMNS);
    let kernels = features::kernels();
    let vectorized = kernels.avx2_fma_f16c();
    let avx512 = kernels.avx512();
    pool::run(jobs, &|job| {
        let range = job * per_job..((job + 1) * per_job).min(rows);
        if kernels.neon {
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the buffer sizes were checked above and each job writes only its own
            // rows.
            unsafe {
                neon::rows(&p, range)
            };
            #[cfg(not(target_arch = "aarch64"))]
            unreachable!("NEON is arm64's");
        } else if vectorized {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `features::kernels()` checked AVX2, FMA and F16C (and AVX-512 for its
            // kernel); the buffer sizes were checked above and each job writes only its own
            // rows.
            unsafe {
                if avx512 {
                    avx512::rows(&p, range)
                } else {
                    avx2::rows(&p, range)
                }
            };
            let _ = avx512;
        } else {
            // SAFETY: as above.
            unsafe { rows_portable(&p, range) };
        }
    });
}

/// The portable kernel over rows `rows`.
///
/// # Safety
/// The buffers hold `rows`; no other job writes these rows.
unsafe fn rows_portable<T: Elem, G: Elem>(p: &Problem<T, G>, rows: Range<usize>) {
    let width = p.width;
    let mut row_f32 = vec![0f32; width];
    for row in rows {
        let x_row = &p.x[row * width..(row + 1) * width];
        let gate_row = &p.gate[row * width..(row + 1) * width];
        // SAFETY: this job's row, within the checked size.
        let out_row = unsafe { std::slice::from_raw_parts_mut(p.out.0.add(row * width), width) };
        for (dst, src) in row_f32.iter_mut().zip(x_row) {
            *dst = src.to_f32();
        }
        let inv = inverse_rms(&row_f32, p.eps);
        for col in 0..width {
            let normalized =
                round_to::<T>(p.weight[col].to_f32() * round_to::<T>(row_f32[col] * inv));
            let g = gate_row[col].to_f32();
            let silu = g * sigmoid::<f32>(g);
            out_row[col] = T::from_f32(silu * normalized);
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The vectorized kernel. A row is widened into a zero-padded f32 buffer (a multiple of 128
    //! columns); SIMD group g's 32 threads sum the 128 columns `r + 128g ..` of each stride as
    //! four registers in lane layout (`simd::avx2::add_squares`), then meet in the butterfly.

    #![allow(unsafe_op_in_unsafe_fn)]

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{threads, Problem};
    use crate::cpu::math::rsqrt;
    use crate::cpu::reduce::simd_sum;
    use crate::cpu::simd::avx2::{
        add_squares, butterfly, gate_table, load_n, lookup, lookup8, sigmoid, store_n, Lanes,
    };

    /// As `rows_portable`.
    ///
    /// # Safety
    /// As `rows_portable`; AVX2, FMA and F16C are available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn rows<T: Lanes, G: Lanes>(p: &Problem<T, G>, rows: Range<usize>) {
        // Qwen3.5 normalizes heads of 128: a copy of the kernel with the width known.
        match (gate_table::<G>(), p.width == 128) {
            (Some(table), true) => rows_with::<T, G, true, 128>(p, rows, table),
            (Some(table), false) => rows_with::<T, G, true, 0>(p, rows, table),
            (None, true) => rows_with::<T, G, false, 128>(p, rows, &[]),
            (None, false) => rows_with::<T, G, false, 0>(p, rows, &[]),
        }
    }

    /// The kernel; with `TABLE` the gate activation `g · sigmoid(g)` comes from `table` (its
    /// value for every bit pattern of a 16-bit G), else it is computed. `WIDTH`, unless 0, is
    /// the width.
    #[inline(always)]
    unsafe fn rows_with<T: Lanes, G: Lanes, const TABLE: bool, const WIDTH: usize>(
        p: &Problem<T, G>,
        rows: Range<usize>,
        table: &[f32],
    ) {
        let width = if WIDTH > 0 { WIDTH } else { p.width };
        let threads = threads(width);
        let stride = 4 * threads;
        let vectors = width.div_ceil(8);
        let zero = _mm256_setzero_ps();
        // Columns past the width stay +0 (each thread adds their squares, +0).
        let mut row_f32 = vec![0f32; width.div_ceil(128) * 128];
        let mut weight = vec![0f32; 8 * vectors];
        for j in 0..vectors {
            let w = load_n(p.weight.as_ptr().add(8 * j), width - 8 * j);
            _mm256_storeu_ps(weight.as_mut_ptr().add(8 * j), w);
        }
        let mut activation = vec![0f32; if TABLE { 8 * vectors } else { 0 }];
        let buf = row_f32.as_mut_ptr();
        let weight = weight.as_ptr();
        for row in rows {
            let x = p.x.as_ptr().add(row * width);
            for j in 0..vectors {
                _mm256_storeu_ps(buf.add(8 * j), load_n(x.add(8 * j), width - 8 * j));
            }
            let mut group_sums = [0f32; 32];
            for (g, group_sum) in group_sums.iter_mut().enumerate().take(threads / 32) {
                let mut acc = [zero; 4];
                let mut base = 128 * g;
                // A block starting past the width would add only +0 to each thread's sum,
                // which leaves it unchanged (the sums are +0, positive, +inf or NaN).
                while base < width {
                    for (s, a) in acc.iter_mut().enumerate() {
                        let c = buf.add(base + 32 * s);
                        let r = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(c.add(o)));
                        *a = add_squares(*a, r);
                    }
                    base += stride;
                }
                *group_sum = butterfly(acc);
            }
            let total = if threads > 32 {
                simd_sum(&group_sums)
            } else {
                group_sums[0]
            };
            let inv = _mm256_set1_ps(rsqrt(total / width as f32 + p.eps));
            let gate = p.gate.as_ptr().add(row * width);
            // Full blocks of 32 columns read the table directly; the rest goes through
            // `activation`.
            let tail = 32 * (width / 32);
            if TABLE && tail < width {
                let (bits, dst) = (
                    (gate as *const u16).add(tail),
                    activation.as_mut_ptr().add(tail),
                );
                lookup(table.as_ptr(), bits, dst, width - tail);
            }
            let activation = activation.as_ptr();
            let out = p.out.0.add(row * width);
            let mut j = 0;
            while 8 * (j + 4) <= width {
                let src = (buf as *const f32, weight, gate, table.as_ptr(), activation);
                finish::<T, G, 4, true, TABLE>(src, out, inv, j, width);
                j += 4;
            }
            while j < vectors {
                let src = (buf as *const f32, weight, gate, table.as_ptr(), activation);
                finish::<T, G, 1, false, TABLE>(src, out, inv, j, width);
                j += 1;
            }
        }
    }

    /// A row's x (f32), the weight (f32), the row's gate, the gate table and the row's gate
    /// activations past the last full block of 32 (`TABLE` only).
    type Sources<G> = (*const f32, *const f32, *const G, *const f32, *const f32);

    /// The elementwise part for registers `j .. j + N` (columns `8j ..`, at most `width`;
    /// all of them when `FULL`): `out = T(silu_f32(gate) · f32(T(w · T(x · inv))))`. With
    /// `TABLE`, the gate activation comes from the table (`FULL`) or the row's activations.
    #[inline(always)]
    unsafe fn finish<T: Lanes, G: Lanes, const N: usize, const FULL: bool, const TABLE: bool>(
        (x, weight, gate, table, activation): Sources<G>,
        out: *mut T,
        inv: __m256,
        j: usize,
        width: usize,
    ) {
        let mut g = [inv; N];
        let mut normalized = [inv; N];
        for i in 0..N {
            let c = 8 * (j + i);
            let scaled = T::round_inner(_mm256_mul_ps(_mm256_loadu_ps(x.add(c)), inv));
            normalized[i] = T::round_inner(_mm256_mul_ps(_mm256_loadu_ps(weight.add(c)), scaled));
            g[i] = if TABLE && FULL {
                lookup8(table, gate.add(c) as *const u16)
            } else if TABLE {
                _mm256_loadu_ps(activation.add(c))
            } else if FULL {
                G::load(gate.add(c))
            } else {
                load_n(gate.add(c), width - c)
            };
        }
        let mut y = g;
        if TABLE {
            for i in 0..N {
                y[i] = _mm256_mul_ps(g[i], normalized[i]);
            }
        } else {
            let s = sigmoid::<f32, N>(g);
            for i in 0..N {
                y[i] = _mm256_mul_ps(_mm256_mul_ps(g[i], s[i]), normalized[i]);
            }
        }
        if FULL {
            let mut i = 0;
            while i + 2 <= N {
                T::store2(out.add(8 * (j + i)), y[i], y[i + 1]);
                i += 2;
            }
            if i < N {
                T::store(out.add(8 * (j + i)), y[i]);
            }
        } else {
            for (i, y) in y.into_iter().enumerate() {
                let c = 8 * (j + i);
                store_n(out.add(c), y, width - c);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The AVX-512 kernel for 16-bit gates (an f32 gate runs the AVX2 one): as `avx2`, sixteen
    //! lanes a register; SIMD group g's 32 threads are two registers in lane layout
    //! (`simd::avx512::add_squares`); the gate table read by gathers, tails by masks.

    #![allow(unsafe_op_in_unsafe_fn)]

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{threads, Problem};
    use crate::cpu::math::rsqrt;
    use crate::cpu::reduce::simd_sum;
    use crate::cpu::simd::avx2::gate_table;
    use crate::cpu::simd::avx512::{add_squares, butterfly, lookup16_f32};
    use crate::cpu::simd::Lanes;

    /// As `rows_portable`.
    ///
    /// # Safety
    /// As `rows_portable`; AVX-512 (F, BW, VL), AVX2, FMA and F16C are available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn rows<T: Lanes, G: Lanes>(p: &Problem<T, G>, rows: Range<usize>) {
        match (gate_table::<G>(), p.width == 128) {
            (Some(table), true) => rows_with::<T, G, 128>(p, rows, table),
            (Some(table), false) => rows_with::<T, G, 0>(p, rows, table),
            (None, _) => super::avx2::rows(p, rows),
        }
    }

    /// The kernel for a 16-bit G; `table` holds `gate_table::<G>()`. `WIDTH`, unless 0, is
    /// the width.
    #[inline(always)]
    unsafe fn rows_with<T: Lanes, G: Lanes, const WIDTH: usize>(
        p: &Problem<T, G>,
        rows: Range<usize>,
        table: &[f32],
    ) {
        let width = if WIDTH > 0 { WIDTH } else { p.width };
        let threads = threads(width);
        let stride = 4 * threads;
        let vectors = width.div_ceil(16);
        let n = |j: usize| (width - 16 * j).min(16);
        let zero = _mm512_setzero_ps();
        // Columns past the width stay +0 (each thread adds their squares, +0).
        let mut row_f32 = vec![0f32; width.div_ceil(128) * 128];
        let mut weight = vec![0f32; 16 * vectors];
        for j in 0..vectors {
            let w = T::load16(p.weight.as_ptr().add(16 * j), n(j));
            _mm512_storeu_ps(weight.as_mut_ptr().add(16 * j), w);
        }
        let (buf, weight, table) = (row_f32.as_mut_ptr(), weight.as_ptr(), table.as_ptr());
        for row in rows {
            let x = p.x.as_ptr().add(row * width);
            for j in 0..vectors {
                _mm512_storeu_ps(buf.add(16 * j), T::load16(x.add(16 * j), n(j)));
            }
            let mut group_sums = [0f32; 32];
            for (g, group_sum) in group_sums.iter_mut().enumerate().take(threads / 32) {
                let mut acc = [zero; 2];
                let mut base = 128 * g;
                // A block starting past the width would add only +0 to each thread's sum,
                // which leaves it unchanged (the sums are +0, positive, +inf or NaN).
                while base < width {
                    for (s, a) in acc.iter_mut().enumerate() {
                        let c = buf.add(base + 64 * s);
                        let r = [
                            _mm512_loadu_ps(c),
                            _mm512_loadu_ps(c.add(16)),
                            _mm512_loadu_ps(c.add(32)),
                            _mm512_loadu_ps(c.add(48)),
                        ];
                        *a = add_squares(*a, r);
                    }
                    base += stride;
                }
                *group_sum = butterfly(acc);
            }
            let total = if threads > 32 {
                simd_sum(&group_sums)
            } else {
                group_sums[0]
            };
            let inv = _mm512_set1_ps(rsqrt(total / width as f32 + p.eps));
            let gate = p.gate.as_ptr().add(row * width) as *const u16;
            let out = p.out.0.add(row * width);
            // out = T(silu_f32(gate) · f32(T(w · T(x · inv)))).
            for j in 0..vectors {
                let c = 16 * j;
                let scaled = T::round_inner16(_mm512_mul_ps(_mm512_loadu_ps(buf.add(c)), inv));
                let normalized =
                    T::round_inner16(_mm512_mul_ps(_mm512_loadu_ps(weight.add(c)), scaled));
                let g = lookup16_f32(table, gate.add(c), n(j));
                T::store16(out.add(c), _mm512_mul_ps(g, normalized), n(j));
            }
        }
    }
}

/// Entry for a `node::gated_rms_norm::Node`: inputs `x, gate, weight`; output `out`.
pub(crate) fn run(params: &[i64], mut buffers: Buffers) {
    let node = Node::decode(params).unwrap_or_else(|e| panic!("{e}"));
    let (width, eps) = (node.width(), node.eps);
    let (dtype, gate_dtype) = (node.dtype, node.gate_dtype);
    let [x, gate, weight] = [buffers.inputs[0], buffers.inputs[1], buffers.inputs[2]];
    if width == 0 {
        return;
    }
    let out = &mut *buffers.outputs[0];
    macro_rules! go {
        ($t:ty, $g:ty) => {
            norm::<$t, $g>(
                width,
                eps,
                typed(x),
                typed(gate),
                typed(weight),
                typed_mut(out),
            )
        };
    }
    macro_rules! gate {
        ($t:ty) => {
            match gate_dtype {
                Dtype::Bfloat16 => go!($t, bf16),
                Dtype::Float16 => go!($t, f16),
                Dtype::Float32 => go!($t, f32),
                other => panic!("gated_rms_norm: unsupported gate dtype {}", other.name()),
            }
        };
    }
    match dtype {
        Dtype::Bfloat16 => gate!(bf16),
        Dtype::Float16 => gate!(f16),
        Dtype::Float32 => gate!(f32),
        other => panic!("gated_rms_norm: unsupported dtype {}", other.name()),
    }
}
