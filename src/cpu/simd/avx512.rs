//! Everything here is `#[inline(always)]` and meant to be inlined into functions compiled
//! with `#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]`, which may
//! only run when `features::kernels().avx512()` said so. Sixteen lanes per register; each
//! function gives, lane by lane, the bits of its `avx2` counterpart.

// The whole module is intrinsics on pointers whose validity the callers establish.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use half::{bf16, f16};

use super::avx2::Lanes;

/// Mask of the first `n` (≤ 16) lanes.
#[inline(always)]
pub fn first(n: usize) -> __mmask16 {
    if n >= 16 {
        0xFFFF
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// An element type the AVX-512 kernels load and store sixteen at a time.
pub trait Wide: Lanes {
    /// The first `n` (≤ 16) elements at `p`, widened exactly to f32; +0 in the other lanes.
    ///
    /// # Safety
    /// `p` addresses `n` readable elements; AVX-512 (F, BW, VL) is available.
    unsafe fn load16(p: *const Self, n: usize) -> __m512;
    /// `load16` from a register holding the bits of sixteen 16-bit elements (f32: unused).
    ///
    /// # Safety
    /// AVX-512 (F, BW) is available.
    unsafe fn widen16(bits: __m256i) -> __m512;
    /// `Elem::from_f32` of the first `n` (≤ 16) lanes, stored at `p`.
    ///
    /// # Safety
    /// `p` addresses `n` writable elements; AVX-512 (F, BW, VL) is available.
    unsafe fn store16(p: *mut Self, v: __m512, n: usize);
    /// `Lanes::round_inner` on sixteen lanes.
    ///
    /// # Safety
    /// AVX-512 (F, BW) is available.
    unsafe fn round_inner16(v: __m512) -> __m512;
}

impl Wide for f32 {
    #[inline(always)]
    unsafe fn load16(p: *const f32, n: usize) -> __m512 {
        _mm512_maskz_loadu_ps(first(n), p)
    }
    #[inline(always)]
    unsafe fn widen16(_: __m256i) -> __m512 {
        unreachable!("f32 has no 16-bit encoding")
    }
    #[inline(always)]
    unsafe fn store16(p: *mut f32, v: __m512, n: usize) {
        _mm512_mask_storeu_ps(p, first(n), v)
    }
    #[inline(always)]
    unsafe fn round_inner16(v: __m512) -> __m512 {
        v
    }
}

/// `bits + 0x7FFF + bit 16` of each lane: `elem::bf16_bits` before the shift.
#[inline(always)]
unsafe fn bf16_rounded(v: __m512) -> __m512i {
    let bits = _mm512_castps_si512(v);
    let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), _mm512_set1_epi32(1));
    _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), lsb)
}

/// `elem::bf16_bits` of each lane (NaN → 0x7FC0), as sixteen 16-bit values.
#[inline(always)]
unsafe fn bf16_bits(v: __m512) -> __m256i {
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    let high = _mm512_mask_blend_epi32(
        nan,
        _mm512_srli_epi32::<16>(bf16_rounded(v)),
        _mm512_set1_epi32(0x7FC0),
    );
    _mm512_cvtepi32_epi16(high)
}

impl Wide for bf16 {
    #[inline(always)]
    unsafe fn load16(p: *const bf16, n: usize) -> __m512 {
        Self::widen16(_mm256_maskz_loadu_epi16(first(n), p as *const i16))
    }
    #[inline(always)]
    unsafe fn widen16(bits: __m256i) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(bits)))
    }
    #[inline(always)]
    unsafe fn store16(p: *mut bf16, v: __m512, n: usize) {
        _mm256_mask_storeu_epi16(p as *mut i16, first(n), bf16_bits(v))
    }
    #[inline(always)]
    unsafe fn round_inner16(v: __m512) -> __m512 {
        // `avx2::bf16_high_finite`.
        let high = _mm512_and_si512(bf16_rounded(v), _mm512_set1_epi32(0xFFFF_0000u32 as i32));
        _mm512_castsi512_ps(high)
    }
}

/// `avx2::f16_bits` on sixteen lanes: round to nearest even, a NaN becomes the quiet NaN
/// 0x7E00 with the NaN's sign.
#[inline(always)]
unsafe fn f16_bits(v: __m512) -> __m256i {
    let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
    let quiet = _mm512_castsi512_ps(_mm512_or_si512(
        _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(i32::MIN)),
        _mm512_set1_epi32(0x7FC0_0000),
    ));
    _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_mask_blend_ps(nan, v, quiet))
}

impl Wide for f16 {
    #[inline(always)]
    unsafe fn load16(p: *const f16, n: usize) -> __m512 {
        Self::widen16(_mm256_maskz_loadu_epi16(first(n), p as *const i16))
    }
    #[inline(always)]
    unsafe fn widen16(bits: __m256i) -> __m512 {
        _mm512_cvtph_ps(bits)
    }
    #[inline(always)]
    unsafe fn store16(p: *mut f16, v: __m512, n: usize) {
        _mm256_mask_storeu_epi16(p as *mut i16, first(n), f16_bits(v))
    }
    #[inline(always)]
    unsafe fn round_inner16(v: __m512) -> __m512 {
        // The conversion keeps every NaN a NaN.
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }
}

/// `[table[bits[0]], ..., table[bits[n - 1]]]` and zeros after, for a table of 16-bit
/// entries, by one 32-bit gather (each read takes its entry and the next one).
///
/// # Safety
/// `bits` addresses `n` (≤ 16) elements; `table` holds 2^16 + 1 entries (`silu_table`).
#[inline(always)]
pub unsafe fn lookup16_u16(table: *const u16, bits: *const u16, n: usize) -> __m256i {
    let m = first(n);
    let idx = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bits as *const i16));
    let words =
        _mm512_mask_i32gather_epi32::<2>(_mm512_setzero_si512(), m, idx, table as *const i32);
    _mm512_cvtepi32_epi16(words)
}

/// `[table[bits[0]], ..., table[bits[n - 1]]]` and zeros after, for a table of f32 entries.
///
/// # Safety
/// `bits` addresses `n` (≤ 16) elements; `table` holds 2^16.
#[inline(always)]
pub unsafe fn lookup16_f32(table: *const f32, bits: *const u16, n: usize) -> __m512 {
    let m = first(n);
    let idx = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, bits as *const i16));
    _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), m, idx, table)
}

/// `avx2::transpose` on sixteen lanes: the 4×4 blocks of each 128-bit quarter, transposed.
/// Applied to four registers holding 64 consecutive values (16 lanes × 4), it gives lane
/// layout: quarter k of register i holds element i of lanes (k, 4 + k, 8 + k, 12 + k).
///
/// # Safety
/// AVX-512 (F) is available.
#[inline(always)]
pub unsafe fn transpose(r: [__m512; 4]) -> [__m512; 4] {
    let t0 = _mm512_unpacklo_ps(r[0], r[1]);
    let t1 = _mm512_unpacklo_ps(r[2], r[3]);
    let t2 = _mm512_unpackhi_ps(r[0], r[1]);
    let t3 = _mm512_unpackhi_ps(r[2], r[3]);
    [
        unpack_pd::<false>(t0, t1),
        unpack_pd::<true>(t0, t1),
        unpack_pd::<false>(t2, t3),
        unpack_pd::<true>(t2, t3),
    ]
}

/// The low (`HIGH` false) or high pairs of floats of each 128-bit quarter of `a` and `b`,
/// interleaved. (Named functions rather than closures throughout this module: a closure
/// is compiled without the features of the function it is written in.)
#[inline(always)]
unsafe fn unpack_pd<const HIGH: bool>(a: __m512, b: __m512) -> __m512 {
    let (a, b) = (_mm512_castps_pd(a), _mm512_castps_pd(b));
    _mm512_castpd_ps(if HIGH {
        _mm512_unpackhi_pd(a, b)
    } else {
        _mm512_unpacklo_pd(a, b)
    })
}

/// The sums of squares of 16 lanes owning 4 consecutive values each (64 values in `r`, in
/// natural order), each lane in order from `acc`: `acc + v0² + v1² + v2² + v3²`, in lane
/// layout (`transpose`).
///
/// # Safety
/// AVX-512 (F) is available.
#[inline(always)]
pub unsafe fn add_squares(acc: __m512, r: [__m512; 4]) -> __m512 {
    let t = transpose(r);
    let mut a = acc;
    for v in t {
        a = _mm512_add_ps(a, _mm512_mul_ps(v, v));
    }
    a
}

/// The xor butterfly (`reduce::simd_sum`) over 32 lane partials held in lane layout: lanes
/// 0–15 in `acc[0]`, 16–31 in `acc[1]` (`add_squares`).
///
/// # Safety
/// AVX-512 (F) is available.
#[inline(always)]
pub unsafe fn butterfly(acc: [__m512; 2]) -> f32 {
    let quads = [quad_sums(acc[0]), quad_sums(acc[1])];
    // Levels 3 and 4: neighbouring pairs, as horizontal adds; level 5.
    let l3 = _mm_hadd_ps(quads[0], quads[1]);
    let l4 = _mm_hadd_ps(l3, l3);
    _mm_cvtss_f32(_mm_add_ss(l4, _mm_movehdup_ps(l4)))
}

/// Levels 1 and 2 of the butterfly over 16 lane partials in lane layout: the sums of lanes
/// 4m..4m+4 at position m.
#[inline(always)]
unsafe fn quad_sums(p: __m512) -> __m128 {
    // Level 1: lanes 2j and 2j + 1 sit in quarters (0, 1) and (2, 3).
    let l1 = _mm512_add_ps(p, _mm512_shuffle_f32x4::<0b10_11_00_01>(p, p));
    // Level 2: quarter 0 + quarter 2.
    let l2 = _mm512_add_ps(l1, _mm512_shuffle_f32x4::<0b01_00_11_10>(l1, l1));
    _mm512_castps512_ps128(l2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::elem::round_to;
    use crate::cpu::reduce::simd_sum;

    fn available() -> bool {
        crate::cpu::features::cpu().avx512()
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Every class: random bits, ±0, ±inf, NaNs, values at several scales (subnormal
        /// included).
        fn value(&mut self) -> f32 {
            let r = self.next();
            match r % 8 {
                0 => f32::from_bits((r >> 32) as u32),
                1 => [
                    0.0,
                    -0.0,
                    f32::INFINITY,
                    f32::NEG_INFINITY,
                    f32::NAN,
                    -f32::NAN,
                ][((r >> 8) % 6) as usize],
                _ => {
                    let scale = [1e-3f32, 1.0, 1e3, 1e19, 1e-39][((r >> 8) % 5) as usize];
                    ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale
                }
            }
        }
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    /// The bytes of an element (NaNs compared by their bits: `Elem`'s canonical ones).
    fn bytes<T: Copy>(v: &T) -> Vec<u8> {
        // SAFETY: T is a plain float type.
        unsafe { std::slice::from_raw_parts(v as *const T as *const u8, std::mem::size_of::<T>()) }
            .to_vec()
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn conversions<T: Wide>(x: &[f32]) -> (Vec<T>, Vec<f32>, Vec<f32>) {
        let mut stored = vec![T::from_f32(0.0); x.len()];
        let mut loaded = vec![0f32; x.len()];
        let mut rounded = vec![0f32; x.len()];
        for (i, c) in x.chunks(16).enumerate() {
            let v = f32::load16(c.as_ptr(), c.len());
            T::store16(stored.as_mut_ptr().add(16 * i), v, c.len());
            let back = T::load16(stored.as_ptr().add(16 * i), c.len());
            f32::store16(loaded.as_mut_ptr().add(16 * i), back, c.len());
            let r = T::round_inner16(v);
            f32::store16(rounded.as_mut_ptr().add(16 * i), r, c.len());
        }
        (stored, loaded, rounded)
    }

    fn check_conversions<T: Wide>(x: &[f32]) {
        // SAFETY: the features were detected.
        let (stored, loaded, rounded) = unsafe { conversions::<T>(x) };
        for (i, &x) in x.iter().enumerate() {
            let want = T::from_f32(x);
            if std::mem::size_of::<T>() == 2 {
                assert_eq!(bytes(&stored[i]), bytes(&want), "store of {x:e}");
            } else {
                assert!(same(stored[i].to_f32(), x), "store of {x:e}");
            }
            assert!(same(loaded[i], want.to_f32()), "load of {x:e}");
            assert!(same(rounded[i], round_to::<T>(x)), "round of {x:e}");
        }
    }

    #[test]
    fn conversions_match_elem_bit_for_bit() {
        if !available() {
            return;
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let x: Vec<f32> = (0..100_003).map(|_| rng.value()).collect();
        check_conversions::<f32>(&x);
        check_conversions::<bf16>(&x);
        check_conversions::<f16>(&x);
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn lookups(t16: &[u16], t32: &[f32], bits: &[u16]) -> (Vec<u16>, Vec<f32>) {
        let (mut a, mut b) = (vec![0u16; bits.len()], vec![0f32; bits.len()]);
        for (i, c) in bits.chunks(16).enumerate() {
            let v = lookup16_u16(t16.as_ptr(), c.as_ptr(), c.len());
            let dst = a.as_mut_ptr().add(16 * i) as *mut i16;
            _mm256_mask_storeu_epi16(dst, first(c.len()), v);
            let w = lookup16_f32(t32.as_ptr(), c.as_ptr(), c.len());
            f32::store16(b.as_mut_ptr().add(16 * i), w, c.len());
        }
        (a, b)
    }

    #[test]
    fn lookups_read_every_entry() {
        if !available() {
            return;
        }
        let t16: Vec<u16> = (0..=1u32 << 16)
            .map(|i| (i as u16).wrapping_mul(40503))
            .collect();
        let t32: Vec<f32> = (0..1u32 << 16).map(|i| i as f32 * 0.5 - 7.0).collect();
        let mut bits: Vec<u16> = (0..=u16::MAX).rev().collect();
        bits.extend([0xFFFF, 0, 0xFFFF, 1, 0xFFFE]);
        // SAFETY: the features were detected; the tables hold 2^16 (+ 1) entries.
        let (a, b) = unsafe { lookups(&t16, &t32, &bits) };
        for (i, &x) in bits.iter().enumerate() {
            assert_eq!(a[i], t16[x as usize], "u16 entry {x:#x}");
            assert_eq!(
                b[i].to_bits(),
                t32[x as usize].to_bits(),
                "f32 entry {x:#x}"
            );
        }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn lanes_sum(x: &[f32; 128]) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 2];
        for (g, a) in acc.iter_mut().enumerate() {
            let p = x.as_ptr().add(64 * g);
            let r = [0, 16, 32, 48].map(|o| _mm512_loadu_ps(p.add(o)));
            *a = add_squares(*a, r);
        }
        butterfly(acc)
    }

    #[test]
    fn squares_and_butterfly_match_the_lane_order() {
        if !available() {
            return;
        }
        let mut rng = Rng(12345);
        for _ in 0..20000 {
            let mut x = [0f32; 128];
            for v in x.iter_mut() {
                *v = rng.value();
            }
            let mut partials = [0f32; 32];
            for (lane, p) in partials.iter_mut().enumerate() {
                let mut s = 0.0f32;
                for i in 0..4 {
                    s += x[4 * lane + i] * x[4 * lane + i];
                }
                *p = s;
            }
            // SAFETY: the features were detected.
            let got = unsafe { lanes_sum(&x) };
            assert!(same(got, simd_sum(&partials)), "{got:e}");
        }
    }
}
