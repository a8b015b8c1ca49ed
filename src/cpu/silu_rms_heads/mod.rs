//! The SiLU + RMS head split on the CPU, in the Metal kernel's order: one 32-lane group per
//! (row, head), lane `l` owning columns `[4l, 4l + 4)` (zeros past the width), its four squares
//! summed in order, then the xor butterfly; `inv = rsqrt(sum / Dk + eps)`.
//!
//! Work is split over the worker pool by runs of consecutive (row, head) units. With AVX2, FMA
//! and F16C a vectorized kernel runs; elsewhere the portable one. All compute identical bits.
//! The vectorized kernel takes a bf16 or f16 value's SiLU from a table of all 2^16 results
//! (`simd::avx2::silu_table`; f32 computes it eight lanes at a time), holds a head's activations
//! in registers, sums each lane's four squares as a vertical chain after a 4×4 transpose, and
//! runs the butterfly as fixed shuffles. With AVX-512 (bf16 and f16) the same on sixteen lanes,
//! the table read by gathers. On arm64 a NEON kernel (`silu_rms_heads/neon.rs`) on four lanes.

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
use crate::node::silu_rms_heads::Node;
use crate::node::Words;

/// Work (columns) a job should have at least: below it a call runs on the calling thread.
const JOB_COLUMNS: usize = 16384;

#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub rows: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl Dims {
    #[inline(always)]
    pub(crate) fn heads(&self) -> usize {
        2 * self.hk + self.hv
    }
    #[inline(always)]
    pub(crate) fn channels(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }
    /// (width, first channel) of head `head` of a row.
    #[inline(always)]
    pub(crate) fn head(&self, head: usize) -> (usize, usize) {
        if head < 2 * self.hk {
            (self.dk, head * self.dk)
        } else {
            (
                self.dv,
                2 * self.hk * self.dk + (head - 2 * self.hk) * self.dv,
            )
        }
    }
}

/// SiLU with MLX's rounding points for element type `T`: `T(x · T(sigmoid))`.
#[inline(always)]
pub fn silu<T: Elem>(x: f32) -> f32 {
    round_to::<T>(x * sigmoid::<T>(x))
}

/// One call's inputs and outputs, shared by the jobs.
struct Problem<'a, T> {
    d: Dims,
    eps: f32,
    x: &'a [T],
    q_scale: &'a [T],
    k_scale: &'a [T],
    /// Outputs: each (row, head) unit writes its own head of q, k or v.
    q: SharedMut<T>,
    k: SharedMut<T>,
    v: SharedMut<T>,
}

/// Splits `x [rows, 2·Hk·Dk + Hv·Dv]` into q, k `[rows, Hk, Dk]` (normalized, scaled) and
/// v `[rows, Hv, Dv]` (activated).
#[allow(clippy::too_many_arguments)]
pub fn split<T: Lanes>(
    d: Dims,
    eps: f32,
    x: &[T],
    q_scale: &[T],
    k_scale: &[T],
    q: &mut [T],
    k: &mut [T],
    v: &mut [T],
) {
    assert!(
        (1..=128).contains(&d.dk) && (1..=128).contains(&d.dv),
        "silu_rms_heads: head widths {} and {} (1 to 128 supported)",
        d.dk,
        d.dv
    );
    assert!(
        x.len() >= d.rows * d.channels()
            && q_scale.len() >= d.dk
            && k_scale.len() >= d.dk
            && q.len() >= d.rows * d.hk * d.dk
            && k.len() >= d.rows * d.hk * d.dk
            && v.len() >= d.rows * d.hv * d.dv,
        "silu_rms_heads: buffers too small for {d:?}"
    );
    let p = Problem {
        d,
        eps,
        x,
        q_scale,
        k_scale,
        q: SharedMut(q.as_mut_ptr()),
        k: SharedMut(k.as_mut_ptr()),
        v: SharedMut(v.as_mut_ptr()),
    };
    let units = d.rows * d.heads();
    let (jobs, per_job) = pool::jobs(units, d.channels() / d.heads().max(1), JOB_COLUMNS);
    let kernels = features::kernels();
    let vectorized = kernels.avx2_fma_f16c();
    let avx512 = kernels.avx512();
    pool::run(jobs, &|job| {
        let range = job * per_job..((job + 1) * per_job).min(units);
        if kernels.neon {
            #[cfg(target_arch = "aarch64")]
            // SAFETY: the buffer sizes were checked above and each unit writes only its own
            // head.
            unsafe {
                neon::heads(&p, range)
            };
            #[cfg(not(target_arch = "aarch64"))]
            unreachable!("NEON is arm64's");
        } else if vectorized {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `features::kernels()` checked AVX2, FMA and F16C (and AVX-512 for its
            // kernel); the buffer sizes were checked above and each unit writes only its own
            // head.
            unsafe {
                if avx512 {
                    avx512::heads(&p, range);
                } else {
                    avx2::heads(&p, range);
                }
            }
            let _ = avx512;
        } else {
            // SAFETY: as above.
            unsafe { heads_portable(&p, range) };
        }
    });
}

/// The portable kernel over (row, head) units `units` (`row · heads + head`).
///
/// # Safety
/// The buffers hold `p.d`'s sizes; no other job writes these units' heads.
unsafe fn heads_portable<T: Elem>(p: &Problem<T>, units: Range<usize>) {
    let d = p.d;
    let channels = d.channels();
    let mut values = [0f32; 128];
    let mut partials = [0f32; 32];
    for unit in units {
        let (row, head) = (unit / d.heads(), unit % d.heads());
        let x_row = &p.x[row * channels..(row + 1) * channels];
        let normalize = head < 2 * d.hk;
        let (width, channel) = d.head(head);
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
            let inv = rsqrt(simd_sum(&partials) / d.dk as f32 + p.eps);
            let (scale, out) = if head < d.hk {
                (p.q_scale, p.q)
            } else {
                (p.k_scale, p.k)
            };
            let at = (row * d.hk + head % d.hk) * d.dk;
            // SAFETY: this unit's head of q or k, within the checked size.
            let out = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), d.dk) };
            for col in 0..d.dk {
                let normalized = round_to::<T>(values[col] * inv);
                out[col] = T::from_f32(scale[col].to_f32() * normalized);
            }
        } else {
            let at = (row * d.hv + head - 2 * d.hk) * d.dv;
            // SAFETY: this unit's head of v, within the checked size.
            let out = unsafe { std::slice::from_raw_parts_mut(p.v.0.add(at), d.dv) };
            for col in 0..d.dv {
                out[col] = T::from_f32(values[col]);
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The vectorized kernel: a head's (≤ 128) values live in 16 registers; the per-lane sums
    //! of four squares are vertical add chains in lane layout (`simd::avx2::add_squares`).

    #![allow(unsafe_op_in_unsafe_fn)]

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::Problem;
    use crate::cpu::math::rsqrt;
    use crate::cpu::simd::avx2::{
        add_squares, butterfly, load_n, lookup, lookup8_u16, silu, silu_table, store_n, Lanes,
    };

    /// As `heads_portable`.
    ///
    /// # Safety
    /// As `heads_portable`; AVX2, FMA and F16C are available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn heads<T: Lanes>(p: &Problem<T>, units: Range<usize>) {
        match silu_table::<T>() {
            // Qwen3.5's heads are 128 wide: a copy of the kernel with the width known.
            Some(table) if p.d.dk == 128 && p.d.dv == 128 => {
                heads_with::<T, true, 128>(p, units, table)
            }
            Some(table) => heads_with::<T, true, 0>(p, units, table),
            None => heads_with::<T, false, 0>(p, units, &[]),
        }
    }

    /// The kernel; with `TABLE` the SiLU of each value comes from `table` (the bits of
    /// `T::from_f32(silu::<T>(x))` for every bit pattern of a 16-bit T), else it is computed.
    /// `WIDTH`, unless 0, is every head's width.
    #[inline(always)]
    unsafe fn heads_with<T: Lanes, const TABLE: bool, const WIDTH: usize>(
        p: &Problem<T>,
        units: Range<usize>,
        table: &[u16],
    ) {
        let d = p.d;
        let channels = d.channels();
        let zero = _mm256_setzero_ps();
        // The scales, widened once.
        let mut scales = [[zero; 16]; 2];
        for (scale, src) in scales.iter_mut().zip([p.q_scale, p.k_scale]) {
            for (j, s) in scale.iter_mut().enumerate().take(d.dk.div_ceil(8)) {
                *s = load_n(src.as_ptr().add(8 * j), d.dk - 8 * j);
            }
        }
        let mut values = [zero; 16];
        for unit in units {
            let (row, head) = (unit / d.heads(), unit % d.heads());
            let (width, channel) = d.head(head);
            let width = if WIDTH > 0 { WIDTH } else { width };
            let src = p.x.as_ptr().add(row * channels + channel);
            let vectors = width.div_ceil(8);
            // Blocks of 4 registers: 32 columns, the 8 lanes of one lane-layout register.
            let blocks = vectors.div_ceil(4);
            if TABLE {
                let (table, bits) = (table.as_ptr(), src as *const u16);
                if head >= 2 * d.hk {
                    // v is the activation itself.
                    let dst = p.v.0.add((row * d.hv + head - 2 * d.hk) * d.dv) as *mut u16;
                    let mut c = 0;
                    while c + 8 <= width {
                        _mm_storeu_si128(
                            dst.add(c) as *mut __m128i,
                            lookup8_u16(table, bits.add(c)),
                        );
                        c += 8;
                    }
                    lookup(table, bits.add(c), dst.add(c), width - c);
                    continue;
                }
                for (j, v) in values.iter_mut().enumerate().take(4 * blocks) {
                    let c = 8 * j;
                    *v = if c + 8 <= width {
                        T::widen(lookup8_u16(table, bits.add(c)))
                    } else if c < width {
                        // Columns past the width are +0, as the lanes add.
                        let mut part = [0u16; 8];
                        lookup(table, bits.add(c), part.as_mut_ptr(), width - c);
                        T::widen(_mm_loadu_si128(part.as_ptr() as *const __m128i))
                    } else {
                        zero
                    };
                }
            } else {
                for (j, v) in values.iter_mut().enumerate().take(4 * blocks) {
                    // Columns past the width are +0, whose SiLU is +0, as the lanes add.
                    *v = if j < vectors {
                        load_n(src.add(8 * j), width - 8 * j)
                    } else {
                        zero
                    };
                }
                for b in 0..blocks {
                    let r = silu::<T, 4>([
                        values[4 * b],
                        values[4 * b + 1],
                        values[4 * b + 2],
                        values[4 * b + 3],
                    ]);
                    values[4 * b..4 * b + 4].copy_from_slice(&r);
                }
            }
            if head < 2 * d.hk {
                let mut partials = [zero; 4];
                for (b, partial) in partials.iter_mut().enumerate().take(blocks) {
                    let r = [
                        values[4 * b],
                        values[4 * b + 1],
                        values[4 * b + 2],
                        values[4 * b + 3],
                    ];
                    *partial = add_squares(zero, r);
                }
                let inv = _mm256_set1_ps(rsqrt(butterfly(partials) / d.dk as f32 + p.eps));
                let (scale, out) = if head < d.hk {
                    (&scales[0], p.q)
                } else {
                    (&scales[1], p.k)
                };
                let dst = out.0.add((row * d.hk + head % d.hk) * d.dk);
                let mut y = values;
                for j in 0..vectors {
                    let normalized = T::round_inner(_mm256_mul_ps(values[j], inv));
                    y[j] = _mm256_mul_ps(scale[j], normalized);
                }
                let mut j = 0;
                while 8 * (j + 2) <= width {
                    T::store2(dst.add(8 * j), y[j], y[j + 1]);
                    j += 2;
                }
                while j < vectors {
                    store_n(dst.add(8 * j), y[j], width - 8 * j);
                    j += 1;
                }
            } else {
                let dst = p.v.0.add((row * d.hv + head - 2 * d.hk) * d.dv);
                for (j, v) in values.iter().enumerate().take(vectors) {
                    store_n(dst.add(8 * j), *v, width - 8 * j);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The AVX-512 kernel for bf16 and f16 (f32 runs the AVX2 one): as `avx2`, sixteen lanes a
    //! register, the SiLU table read by 32-bit gathers, a head's (≤ 128) values in 8 registers,
    //! tails by masks.

    #![allow(unsafe_op_in_unsafe_fn)]

    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::Problem;
    use crate::cpu::math::rsqrt;
    use crate::cpu::simd::avx2::silu_table;
    use crate::cpu::simd::avx512::{add_squares, butterfly, first, lookup16_u16};
    use crate::cpu::simd::Lanes;

    /// As `heads_portable`.
    ///
    /// # Safety
    /// As `heads_portable`; AVX-512 (F, BW, VL), AVX2, FMA and F16C are available.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn heads<T: Lanes>(p: &Problem<T>, units: Range<usize>) {
        match silu_table::<T>() {
            Some(table) if p.d.dk == 128 && p.d.dv == 128 => heads_with::<T, 128>(p, units, table),
            Some(table) => heads_with::<T, 0>(p, units, table),
            None => super::avx2::heads(p, units),
        }
    }

    /// The kernel over 16-bit T; `table` holds `silu_table::<T>()`. `WIDTH`, unless 0, is
    /// every head's width.
    #[inline(always)]
    unsafe fn heads_with<T: Lanes, const WIDTH: usize>(
        p: &Problem<T>,
        units: Range<usize>,
        table: &[u16],
    ) {
        let d = p.d;
        let channels = d.channels();
        let zero = _mm512_setzero_ps();
        let table = table.as_ptr();
        // The scales, widened once.
        let mut scales = [[zero; 8]; 2];
        for (scale, src) in scales.iter_mut().zip([p.q_scale, p.k_scale]) {
            for (j, s) in scale.iter_mut().enumerate().take(d.dk.div_ceil(16)) {
                *s = T::load16(src.as_ptr().add(16 * j), (d.dk - 16 * j).min(16));
            }
        }
        for unit in units {
            let (row, head) = (unit / d.heads(), unit % d.heads());
            let (width, channel) = d.head(head);
            let width = if WIDTH > 0 { WIDTH } else { width };
            let bits = p.x.as_ptr().add(row * channels + channel) as *const u16;
            let vectors = width.div_ceil(16);
            let n = |j: usize| (width - 16 * j).min(16);
            if head >= 2 * d.hk {
                // v is the activation itself.
                let dst = p.v.0.add((row * d.hv + head - 2 * d.hk) * d.dv) as *mut i16;
                for j in 0..vectors {
                    let v = lookup16_u16(table, bits.add(16 * j), n(j));
                    _mm256_mask_storeu_epi16(dst.add(16 * j), first(n(j)), v);
                }
                continue;
            }
            // Columns past the width are +0, as the lanes add; 64 columns are 16 lanes.
            let mut values = [zero; 8];
            for (j, v) in values.iter_mut().enumerate().take(vectors) {
                *v = T::widen16(lookup16_u16(table, bits.add(16 * j), n(j)));
            }
            let mut partials = [zero; 2];
            for (g, partial) in partials.iter_mut().enumerate().take(vectors.div_ceil(4)) {
                let r = [
                    values[4 * g],
                    values[4 * g + 1],
                    values[4 * g + 2],
                    values[4 * g + 3],
                ];
                *partial = add_squares(zero, r);
            }
            let inv = _mm512_set1_ps(rsqrt(butterfly(partials) / d.dk as f32 + p.eps));
            let (scale, out) = if head < d.hk {
                (&scales[0], p.q)
            } else {
                (&scales[1], p.k)
            };
            let dst = out.0.add((row * d.hk + head % d.hk) * d.dk);
            for j in 0..vectors {
                let normalized = T::round_inner16(_mm512_mul_ps(values[j], inv));
                T::store16(dst.add(16 * j), _mm512_mul_ps(scale[j], normalized), n(j));
            }
        }
    }
}

/// Entry for a `node::silu_rms_heads::Node`: inputs `x, q_scale, k_scale`; outputs `q, k, v`.
pub(crate) fn run(params: &[i64], buffers: Buffers) {
    let node = Node::decode(params).unwrap_or_else(|e| panic!("{e}"));
    let n = node.dims;
    let d = Dims {
        rows: n.rows(),
        hk: n.hk,
        hv: n.hv,
        dk: n.dk,
        dv: n.dv,
    };
    let (dtype, eps) = (node.dtype, node.eps);
    if d.rows == 0 {
        return;
    }
    let [x, qs, ks] = [buffers.inputs[0], buffers.inputs[1], buffers.inputs[2]];
    let mut outputs = buffers.outputs.into_iter();
    let (q, k, v) = (
        outputs.next().unwrap(),
        outputs.next().unwrap(),
        outputs.next().unwrap(),
    );
    macro_rules! go {
        ($t:ty) => {
            split::<$t>(
                d,
                eps,
                typed(x),
                typed(qs),
                typed(ks),
                typed_mut(q),
                typed_mut(k),
                typed_mut(v),
            )
        };
    }
    match dtype {
        Dtype::Bfloat16 => go!(bf16),
        Dtype::Float16 => go!(f16),
        Dtype::Float32 => go!(f32),
        other => panic!("silu_rms_heads: unsupported dtype {}", other.name()),
    }
}
