//! Everything here is `#[inline(always)]` and meant to be inlined into functions compiled
//! with `#[target_feature(enable = "avx2,fma,f16c")]`, which may only run when
//! `features::kernels().avx2_fma_f16c()` (or the CPU features themselves) said so;
//! `transpose` and `butterfly` need only AVX2 (the exact recurrence's row kernels, compiled
//! for AVX2 alone, use them too). (A closure does not take
//! the features of the function it is written in: intrinsics go in named functions.)

// The whole module is intrinsics on pointers whose validity the callers establish.
#![allow(unsafe_op_in_unsafe_fn)]

use std::any::TypeId;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use half::{bf16, f16};

use crate::cpu::elem::Elem;

/// An element type the AVX2 kernels load and store eight at a time.
pub trait Lanes: Elem {
    /// Eight elements at `p`, widened exactly to f32 (`Elem::to_f32`).
    ///
    /// # Safety
    /// `p` addresses 8 readable elements; AVX2 and F16C are available.
    unsafe fn load(p: *const Self) -> __m256;
    /// `load` from a register holding the bits of eight 16-bit elements (f32: unused).
    ///
    /// # Safety
    /// AVX2 and F16C are available.
    unsafe fn widen(bits: __m128i) -> __m256;
    /// `Elem::from_f32` of each lane, stored at `p`.
    ///
    /// # Safety
    /// `p` addresses 8 writable elements; AVX2 and F16C are available.
    unsafe fn store(p: *mut Self, v: __m256);
    /// `store` of 16 lanes: `a` at `p`, `b` at `p + 8`.
    ///
    /// # Safety
    /// `p` addresses 16 writable elements; AVX2 and F16C are available.
    #[inline(always)]
    unsafe fn store2(p: *mut Self, a: __m256, b: __m256) {
        Self::store(p, a);
        Self::store(p.add(8), b);
    }
    /// `round_to::<Self>` of each lane: the value it takes when stored as `Self`.
    ///
    /// # Safety
    /// AVX2 and F16C are available.
    unsafe fn round(v: __m256) -> __m256;
    /// `round` for values inside a kernel: the same bits for every non-NaN value, and a NaN
    /// stays a NaN (not necessarily the canonical one) provided its low 16 bits are zero.
    /// That holds for every NaN of a kernel computing from 16-bit data: a NaN input's
    /// widening, the default NaN of an invalid operation, and what either propagates to.
    ///
    /// # Safety
    /// AVX2 and F16C are available.
    unsafe fn round_inner(v: __m256) -> __m256;
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn widen(_: __m128i) -> __m256 {
        unreachable!("f32 has no 16-bit encoding")
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m256) {
        _mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn round(v: __m256) -> __m256 {
        v
    }
    #[inline(always)]
    unsafe fn round_inner(v: __m256) -> __m256 {
        v
    }
}

/// `elem::bf16_bits` of each non-NaN lane, in the upper 16 bits of each 32-bit lane (lower
/// bits 0): `(bits + 0x7FFF + bit 16) & 0xFFFF0000`. A NaN whose low 16 bits are zero keeps
/// its upper bits (the addend is below 2^16).
#[inline(always)]
unsafe fn bf16_high_finite(v: __m256) -> __m256i {
    let bits = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
    _mm256_and_si256(rounded, _mm256_set1_epi32(0xFFFF_0000u32 as i32))
}

/// `elem::bf16_bits` of each lane (NaN → 0x7FC0) in the upper 16 bits of each 32-bit lane.
#[inline(always)]
unsafe fn bf16_high(v: __m256) -> __m256i {
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    _mm256_blendv_epi8(bf16_high_finite(v), _mm256_set1_epi32(0x7FC0_0000), nan)
}

/// `elem::bf16_bits` of each lane (NaN → 0x7FC0) in the lower 16 bits of each 32-bit lane
/// (upper bits 0).
#[inline(always)]
unsafe fn bf16_low(v: __m256) -> __m256i {
    let bits = _mm256_castps_si256(v);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), lsb);
    let nan = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
    _mm256_blendv_epi8(
        _mm256_srli_epi32::<16>(rounded),
        _mm256_set1_epi32(0x7FC0),
        nan,
    )
}

impl Lanes for bf16 {
    #[inline(always)]
    unsafe fn load(p: *const bf16) -> __m256 {
        Self::widen(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn widen(bits: __m128i) -> __m256 {
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(bits)))
    }
    #[inline(always)]
    unsafe fn store(p: *mut bf16, v: __m256) {
        let h = bf16_low(v);
        let packed = _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
        _mm_storeu_si128(p as *mut __m128i, packed)
    }
    #[inline(always)]
    unsafe fn store2(p: *mut bf16, a: __m256, b: __m256) {
        // Packing works within 128-bit halves: a0-3 b0-3 | a4-7 b4-7; reorder the quarters.
        let packed = _mm256_packus_epi32(bf16_low(a), bf16_low(b));
        let ordered = _mm256_permute4x64_epi64::<0b11_01_10_00>(packed);
        _mm256_storeu_si256(p as *mut __m256i, ordered)
    }
    #[inline(always)]
    unsafe fn round(v: __m256) -> __m256 {
        _mm256_castsi256_ps(bf16_high(v))
    }
    #[inline(always)]
    unsafe fn round_inner(v: __m256) -> __m256 {
        _mm256_castsi256_ps(bf16_high_finite(v))
    }
}

/// `f16::from_f32` of each lane as `Elem` does it: round to nearest even (F16C, as the
/// half crate converts), and a NaN becomes the quiet NaN 0x7E00 with the NaN's sign.
#[inline(always)]
unsafe fn f16_bits(v: __m256) -> __m128i {
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v);
    // A quiet NaN without payload keeps only its sign through the conversion.
    let quiet = _mm256_or_ps(
        _mm256_and_ps(v, _mm256_set1_ps(-0.0)),
        _mm256_castsi256_ps(_mm256_set1_epi32(0x7FC0_0000)),
    );
    _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_blendv_ps(v, quiet, nan))
}

impl Lanes for f16 {
    #[inline(always)]
    unsafe fn load(p: *const f16) -> __m256 {
        Self::widen(_mm_loadu_si128(p as *const __m128i))
    }
    #[inline(always)]
    unsafe fn widen(bits: __m128i) -> __m256 {
        _mm256_cvtph_ps(bits)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f16, v: __m256) {
        _mm_storeu_si128(p as *mut __m128i, f16_bits(v))
    }
    #[inline(always)]
    unsafe fn round(v: __m256) -> __m256 {
        _mm256_cvtph_ps(f16_bits(v))
    }
    #[inline(always)]
    unsafe fn round_inner(v: __m256) -> __m256 {
        // The conversion keeps every NaN a NaN.
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }
}

/// Loads the first `n` (≤ 8) elements at `p`, zeros in the other lanes.
///
/// # Safety
/// `p` addresses `n` readable elements.
#[inline(always)]
pub unsafe fn load_n<T: Lanes>(p: *const T, n: usize) -> __m256 {
    if n >= 8 {
        T::load(p)
    } else {
        // All-zero bits are +0.0 in every element type.
        let mut buf: [T; 8] = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
        T::load(buf.as_ptr())
    }
}

/// Stores the first `n` (≤ 8) lanes of `v` at `p` (as `T::store`).
///
/// # Safety
/// `p` addresses `n` writable elements.
#[inline(always)]
pub unsafe fn store_n<T: Lanes>(p: *mut T, v: __m256, n: usize) {
    if n >= 8 {
        T::store(p, v)
    } else {
        let mut buf: [T; 8] = std::mem::zeroed();
        T::store(buf.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n);
    }
}

/// MLX's CPU exp (`math::exp`) on `N` registers, for inputs that are +0, positive, +inf or
/// NaN (the `< -88` clamp never applies; a NaN input gives a NaN). Written step by step
/// across the registers so their dependency chains interleave.
///
/// The integer part `floor(x + 0.5)`, which MLX evaluates in double, is
/// `floor(x) + (x - floor(x) >= 0.5)`, the fraction `x - floor(x)` being exact for x ≥ 0.
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[inline(always)]
// MLX's constants, as MLX writes them (`math::exp`).
#[allow(clippy::approx_constant, clippy::excessive_precision)]
pub unsafe fn exp_nonnegative<const N: usize>(x_init: [__m256; N]) -> [__m256; N] {
    let mut x = x_init;
    let mut floor = x_init;
    let mut fpart = x_init;
    let mut ipart = [_mm256_setzero_ps(); N];
    for i in 0..N {
        x[i] = _mm256_mul_ps(x_init[i], _mm256_set1_ps(1.442695f32));
        floor[i] = _mm256_floor_ps(x[i]);
    }
    for i in 0..N {
        let frac = _mm256_sub_ps(x[i], floor[i]);
        let up = _mm256_cmp_ps::<_CMP_GE_OQ>(frac, _mm256_set1_ps(0.5));
        ipart[i] = _mm256_add_ps(floor[i], _mm256_and_ps(up, _mm256_set1_ps(1.0)));
        fpart[i] = _mm256_sub_ps(x[i], ipart[i]);
    }
    let mut p = [_mm256_set1_ps(1.535336188319500e-4f32); N];
    for c in [
        1.339887440266574e-3f32,
        9.618437357674640e-3f32,
        5.550332471162809e-2f32,
        2.402264791363012e-1f32,
        6.931472028550421e-1f32,
        1.000000000000000f32,
    ] {
        for i in 0..N {
            p[i] = _mm256_fmadd_ps(p[i], fpart[i], _mm256_set1_ps(c));
        }
    }
    let mut result = p;
    for i in 0..N {
        let epart = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvttps_epi32(ipart[i]),
            _mm256_set1_epi32(127),
        ));
        result[i] = _mm256_mul_ps(_mm256_castsi256_ps(epart), p[i]);
        let high = _mm256_cmp_ps::<_CMP_GT_OQ>(x_init[i], _mm256_set1_ps(88.0));
        result[i] = _mm256_blendv_ps(result[i], _mm256_set1_ps(f32::INFINITY), high);
    }
    result
}

/// MLX's CPU sigmoid for element type `T` (`math::sigmoid::<T>`), rounded to T, as f32, on
/// `N` registers. A NaN input gives a NaN.
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[inline(always)]
pub unsafe fn sigmoid<T: Lanes, const N: usize>(x: [__m256; N]) -> [__m256; N] {
    let mut abs = x;
    for i in 0..N {
        abs[i] = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x[i]);
    }
    let e = exp_nonnegative(abs);
    let one = _mm256_set1_ps(1.0);
    let mut y = e;
    for i in 0..N {
        y[i] = _mm256_div_ps(one, _mm256_add_ps(one, T::round_inner(e[i])));
    }
    for i in 0..N {
        let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(x[i], _mm256_setzero_ps());
        y[i] = T::round_inner(_mm256_blendv_ps(_mm256_sub_ps(one, y[i]), y[i], negative));
    }
    y
}

/// SiLU with MLX's rounding points for `T` (`silu_rms_heads::silu::<T>`): `T(x · sigmoid)`,
/// on `N` registers. NaN results may be any NaN (`Lanes::round_inner`).
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[inline(always)]
pub unsafe fn silu<T: Lanes, const N: usize>(x: [__m256; N]) -> [__m256; N] {
    let s = sigmoid::<T, N>(x);
    let mut out = s;
    for i in 0..N {
        out[i] = T::round_inner(_mm256_mul_ps(x[i], s[i]));
    }
    out
}

/// Whether `T` is one of the 16-bit element types (whose every value a table can hold).
#[inline(always)]
fn sixteen_bits<T: 'static>() -> Option<bool> {
    let t = TypeId::of::<T>();
    if t == TypeId::of::<bf16>() {
        Some(true)
    } else if t == TypeId::of::<f16>() {
        Some(false)
    } else {
        None
    }
}

/// Applies `f` to every value of the 16-bit type `T`, in bit-pattern order, 32 at a time.
#[inline(always)]
unsafe fn over_all_values<T: Lanes>(mut f: impl FnMut(usize, [__m256; 4])) {
    assert_eq!(std::mem::size_of::<T>(), 2);
    let mut bits = [0u16; 32];
    for base in (0..1usize << 16).step_by(32) {
        for (i, b) in bits.iter_mut().enumerate() {
            *b = (base + i) as u16;
        }
        // SAFETY: T is a 16-bit float type for which every bit pattern is a value.
        let p = bits.as_ptr() as *const T;
        f(
            base,
            [
                T::load(p),
                T::load(p.add(8)),
                T::load(p.add(16)),
                T::load(p.add(24)),
            ],
        );
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn build_silu_table<T: Lanes>() -> Box<[u16]> {
    // One entry more: a 32-bit read at entry 2^16 - 1 (`avx512::lookup16_u16`) stays inside.
    let mut table = vec![0u16; (1 << 16) + 1];
    let out = table.as_mut_ptr() as *mut T;
    over_all_values::<T>(|base, x| {
        for (i, y) in silu::<T, 4>(x).into_iter().enumerate() {
            T::store(out.add(base + 8 * i), y);
        }
    });
    table.into_boxed_slice()
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn build_gate_table<G: Lanes>() -> Box<[f32]> {
    let mut table = vec![0f32; 1 << 16];
    let out = table.as_mut_ptr();
    over_all_values::<G>(|base, g| {
        let s = sigmoid::<f32, 4>(g);
        for i in 0..4 {
            _mm256_storeu_ps(out.add(base + 8 * i), _mm256_mul_ps(g[i], s[i]));
        }
    });
    table.into_boxed_slice()
}

static SILU_BF16: OnceLock<Box<[u16]>> = OnceLock::new();
static SILU_F16: OnceLock<Box<[u16]>> = OnceLock::new();
static GATE_BF16: OnceLock<Box<[f32]>> = OnceLock::new();
static GATE_F16: OnceLock<Box<[f32]>> = OnceLock::new();

/// For a 16-bit `T`, the table of `silu::<T>` over every value: entry `bits` holds the bits
/// of `T::from_f32(silu::<T>(x))` for x of bits `bits` (built once, with `silu`, which
/// the tests check against the scalar formula on every value), and one zero entry past
/// them. `None` for f32.
///
/// # Safety
/// AVX2, FMA and F16C are available.
pub unsafe fn silu_table<T: Lanes>() -> Option<&'static [u16]> {
    let (cell, build): (_, unsafe fn() -> Box<[u16]>) = match sixteen_bits::<T>()? {
        true => (&SILU_BF16, build_silu_table::<bf16>),
        false => (&SILU_F16, build_silu_table::<f16>),
    };
    // SAFETY: the caller's guarantee.
    Some(cell.get_or_init(|| unsafe { build() }))
}

/// For a 16-bit `G`, the table of the f32 gate activation `g · sigmoid::<f32>(g)` over every
/// value g of G (as f32 bits' values). `None` for f32.
///
/// # Safety
/// AVX2, FMA and F16C are available.
pub unsafe fn gate_table<G: Lanes>() -> Option<&'static [f32]> {
    let (cell, build): (_, unsafe fn() -> Box<[f32]>) = match sixteen_bits::<G>()? {
        true => (&GATE_BF16, build_gate_table::<bf16>),
        false => (&GATE_F16, build_gate_table::<f16>),
    };
    // SAFETY: the caller's guarantee.
    Some(cell.get_or_init(|| unsafe { build() }))
}

/// `out[c] = table[bits[c]]` for c < n (a table of every value of a 16-bit type).
///
/// # Safety
/// `bits` and `out` address `n` elements; `table` holds 2^16.
#[inline(always)]
pub unsafe fn lookup<U: Copy>(table: *const U, bits: *const u16, out: *mut U, n: usize) {
    let mut c = 0;
    while c + 8 <= n {
        for i in 0..8 {
            *out.add(c + i) = *table.add(*bits.add(c + i) as usize);
        }
        c += 8;
    }
    while c < n {
        *out.add(c) = *table.add(*bits.add(c) as usize);
        c += 1;
    }
}

/// `[table[bits[0]], ..., table[bits[7]]]` (a table of every value of a 16-bit type).
///
/// # Safety
/// `bits` addresses 8 elements; `table` holds 2^16.
#[inline(always)]
pub unsafe fn lookup8(table: *const f32, bits: *const u16) -> __m256 {
    let t = |i: usize| *table.add(*bits.add(i) as usize);
    _mm256_set_ps(t(7), t(6), t(5), t(4), t(3), t(2), t(1), t(0))
}

/// `[table[bits[0]], ..., table[bits[7]]]` for a table of 16-bit entries.
///
/// # Safety
/// `bits` addresses 8 elements; `table` holds 2^16.
#[inline(always)]
pub unsafe fn lookup8_u16(table: *const u16, bits: *const u16) -> __m128i {
    let t = |i: usize| *table.add(*bits.add(i) as usize) as i16;
    _mm_set_epi16(t(7), t(6), t(5), t(4), t(3), t(2), t(1), t(0))
}

/// Transposes the 4×4 blocks of each 128-bit half (an involution). Applied to four
/// registers holding 32 consecutive values (8 lanes × 4), it gives "lane layout": register
/// i holds element i of lanes (0, 2, 4, 6 | 1, 3, 5, 7).
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
pub unsafe fn transpose(r: [__m256; 4]) -> [__m256; 4] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpacklo_ps(r[2], r[3]);
    let t2 = _mm256_unpackhi_ps(r[0], r[1]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let lo = |a: __m256, b: __m256| {
        _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)))
    };
    let hi = |a: __m256, b: __m256| {
        _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(a), _mm256_castps_pd(b)))
    };
    [lo(t0, t1), hi(t0, t1), lo(t2, t3), hi(t2, t3)]
}

/// The sums of squares of 8 lanes owning 4 consecutive values each (32 values in `r`, in
/// natural order), each lane in order from `acc`: `acc + v0² + v1² + v2² + v3²`, in lane
/// layout.
///
/// # Safety
/// AVX2, FMA and F16C are available.
#[inline(always)]
pub unsafe fn add_squares(acc: __m256, r: [__m256; 4]) -> __m256 {
    let t = transpose(r);
    let mut a = acc;
    for v in t {
        a = _mm256_add_ps(a, _mm256_mul_ps(v, v));
    }
    a
}

/// The xor butterfly (`reduce::simd_sum`) over 32 lane partials held in lane layout by
/// `acc` (lanes 8g..8g+8 in `acc[g]`).
///
/// # Safety
/// AVX2 is available.
#[inline(always)]
pub unsafe fn butterfly(acc: [__m256; 4]) -> f32 {
    // Level 1: lanes 2j and 2j+1 sit in the two halves of one register.
    let half = |a: __m256| _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
    let l1 = [half(acc[0]), half(acc[1]), half(acc[2]), half(acc[3])];
    // Levels 2-4: neighbouring pairs, as horizontal adds.
    let l2a = _mm_hadd_ps(l1[0], l1[1]);
    let l2b = _mm_hadd_ps(l1[2], l1[3]);
    let l3 = _mm_hadd_ps(l2a, l2b);
    let l4 = _mm_hadd_ps(l3, l3);
    // Level 5.
    _mm_cvtss_f32(_mm_add_ss(l4, _mm_movehdup_ps(l4)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::elem::round_to;
    use crate::cpu::math;
    use crate::cpu::reduce::simd_sum;

    fn available() -> bool {
        crate::cpu::features::cpu().avx2_fma_f16c()
    }

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Inputs covering every class: random bit patterns, the exp/sigmoid edges, and
    /// values near the x·log2(e) half-integers where the integer part's rounding flips.
    #[allow(clippy::approx_constant)]
    fn inputs() -> Vec<f32> {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let mut v = vec![
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(1),
            f32::from_bits(0x8000_0001),
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            88.0,
            -88.0,
            88.000_01,
            -88.000_01,
            87.999_99,
            -87.999_99,
        ];
        for _ in 0..200_000 {
            let r = rng.next();
            let x = match r % 4 {
                0 => f32::from_bits((r >> 32) as u32),
                1 => ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 200.0,
                2 => ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0,
                _ => {
                    // Within a few ulps of (k + 0.5) / log2(e).
                    let k = (r >> 8) % 256;
                    let base = (k as f32 - 127.5) / 1.442695f32;
                    let step = ((r >> 32) % 17) as i32 - 8;
                    f32::from_bits((base.to_bits() as i32 + step) as u32)
                }
            };
            v.push(x);
        }
        v
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn each(x: &[f32], f: impl Fn(__m256) -> __m256) -> Vec<f32> {
        let mut out = vec![0f32; x.len()];
        for (src, dst) in x.chunks(8).zip(out.chunks_mut(8)) {
            let v = load_n::<f32>(src.as_ptr(), src.len());
            store_n::<f32>(dst.as_mut_ptr(), f(v), dst.len());
        }
        out
    }

    /// Compares `vector` with `scalar` over `inputs()` mapped into `domain` (a kernel
    /// applies the T-typed functions to values of T only).
    fn check(
        name: &str,
        domain: fn(f32) -> f32,
        vector: impl Fn(__m256) -> __m256,
        scalar: impl Fn(f32) -> f32,
    ) {
        let x: Vec<f32> = inputs().into_iter().map(domain).collect();
        // SAFETY: the features were detected.
        let got = unsafe { each(&x, vector) };
        for (&x, &g) in x.iter().zip(&got) {
            let want = scalar(x);
            assert!(
                same(g, want),
                "{name}({x:e} = {:#x}): {g:e} vs {want:e}",
                x.to_bits()
            );
        }
    }

    #[test]
    fn exp_matches_the_scalar_formula() {
        if !available() {
            return;
        }
        check(
            "exp",
            |x| x,
            |v| unsafe { exp_nonnegative([_mm256_andnot_ps(_mm256_set1_ps(-0.0), v)])[0] },
            |x| math::exp(x.abs()),
        );
    }

    #[test]
    fn sigmoid_and_silu_match_the_scalar_formulas() {
        if !available() {
            return;
        }
        check(
            "sigmoid f32",
            round_to::<f32>,
            |v| unsafe { sigmoid::<f32, 1>([v])[0] },
            math::sigmoid::<f32>,
        );
        check(
            "sigmoid bf16",
            round_to::<bf16>,
            |v| unsafe { sigmoid::<bf16, 1>([v])[0] },
            math::sigmoid::<bf16>,
        );
        check(
            "sigmoid f16",
            round_to::<f16>,
            |v| unsafe { sigmoid::<f16, 1>([v])[0] },
            math::sigmoid::<f16>,
        );
        let scalar = |x: f32| round_to::<bf16>(x * math::sigmoid::<bf16>(x));
        check(
            "silu bf16",
            round_to::<bf16>,
            |v| unsafe { silu::<bf16, 1>([v])[0] },
            scalar,
        );
        let scalar = |x: f32| round_to::<f16>(x * math::sigmoid::<f16>(x));
        check(
            "silu f16",
            round_to::<f16>,
            |v| unsafe { silu::<f16, 1>([v])[0] },
            scalar,
        );
        // Four registers at once, as the kernels call them.
        let scalar = |x: f32| round_to::<bf16>(x * math::sigmoid::<bf16>(x));
        check(
            "silu bf16 ×4",
            round_to::<bf16>,
            |v| unsafe { silu::<bf16, 4>([v, v, v, v])[3] },
            scalar,
        );
    }

    #[test]
    fn conversions_match_elem_bit_for_bit() {
        if !available() {
            return;
        }
        let x = inputs();
        // Rounding: NaNs included, compared by bits (the canonical NaNs).
        for (name, f, g) in [
            (
                "bf16",
                (|v| unsafe { <bf16 as Lanes>::round(v) }) as fn(__m256) -> __m256,
                round_to::<bf16> as fn(f32) -> f32,
            ),
            (
                "f16",
                |v| unsafe { <f16 as Lanes>::round(v) },
                round_to::<f16>,
            ),
        ] {
            // SAFETY: the features were detected.
            let got = unsafe { each(&x, f) };
            for (&x, &r) in x.iter().zip(&got) {
                assert_eq!(r.to_bits(), g(x).to_bits(), "{name} round of {x:e}");
            }
        }
        // Stores and loads of every bit pattern of the 16-bit types.
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn roundtrip<T: Lanes>(x: &[f32]) -> (Vec<T>, Vec<f32>) {
            let mut stored = vec![T::from_f32(0.0); x.len()];
            let mut loaded = vec![0f32; x.len()];
            for (i, c) in x.chunks(8).enumerate() {
                let v = load_n::<f32>(c.as_ptr(), c.len());
                store_n::<T>(stored.as_mut_ptr().add(8 * i), v, c.len());
                let back = load_n::<T>(stored.as_ptr().add(8 * i), c.len());
                store_n::<f32>(loaded.as_mut_ptr().add(8 * i), back, c.len());
            }
            (stored, loaded)
        }
        // SAFETY: the features were detected.
        let (b, _) = unsafe { roundtrip::<bf16>(&x) };
        for (&x, &b) in x.iter().zip(&b) {
            assert_eq!(b.to_bits(), crate::cpu::elem::bf16_bits(x), "bf16 of {x:e}");
        }
        let (h, _) = unsafe { roundtrip::<f16>(&x) };
        for (&x, &h) in x.iter().zip(&h) {
            assert_eq!(
                h.to_bits(),
                <f16 as Elem>::from_f32(x).to_bits(),
                "f16 of {x:e}"
            );
        }
        let all: Vec<u16> = (0..=u16::MAX).collect();
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn widen<T: Lanes>(bits: &[u16]) -> Vec<f32> {
            let mut out = vec![0f32; bits.len()];
            for (i, c) in bits.chunks(8).enumerate() {
                let v = load_n::<T>(c.as_ptr() as *const T, c.len());
                store_n::<f32>(out.as_mut_ptr().add(8 * i), v, c.len());
            }
            out
        }
        // SAFETY: the features were detected; u16 and the 16-bit types share a layout.
        let (wb, wh) = unsafe { (widen::<bf16>(&all), widen::<f16>(&all)) };
        for &b in &all {
            let want = Elem::to_f32(bf16::from_bits(b));
            assert_eq!(wb[b as usize].to_bits(), want.to_bits(), "bf16 {b:#x}");
            let want = Elem::to_f32(f16::from_bits(b));
            assert_eq!(wh[b as usize].to_bits(), want.to_bits(), "f16 {b:#x}");
        }
    }

    #[test]
    fn tables_hold_the_scalar_results_for_every_value() {
        if !available() {
            return;
        }
        fn silu<T: Lanes>(bits: u16) -> u16 {
            let x = from_bits::<T>(bits).to_f32();
            let y = T::from_f32(round_to::<T>(x * math::sigmoid::<T>(x)));
            // SAFETY: T is a 16-bit type.
            unsafe { std::mem::transmute_copy::<T, u16>(&y) }
        }
        fn from_bits<T: Lanes>(bits: u16) -> T {
            // SAFETY: T is a 16-bit float type.
            unsafe { std::mem::transmute_copy::<u16, T>(&bits) }
        }
        // SAFETY: the features were detected.
        let (sb, sh) = unsafe { (silu_table::<bf16>().unwrap(), silu_table::<f16>().unwrap()) };
        let (gb, gh) = unsafe { (gate_table::<bf16>().unwrap(), gate_table::<f16>().unwrap()) };
        assert!(unsafe { silu_table::<f32>().is_none() && gate_table::<f32>().is_none() });
        for bits in 0..=u16::MAX {
            let i = bits as usize;
            assert_eq!(sb[i], silu::<bf16>(bits), "bf16 silu of {bits:#x}");
            assert_eq!(sh[i], silu::<f16>(bits), "f16 silu of {bits:#x}");
            let g = from_bits::<bf16>(bits).to_f32();
            assert!(
                same(gb[i], g * math::sigmoid::<f32>(g)),
                "bf16 gate {bits:#x}"
            );
            let g = Elem::to_f32(from_bits::<f16>(bits));
            assert!(
                same(gh[i], g * math::sigmoid::<f32>(g)),
                "f16 gate {bits:#x}"
            );
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn lanes_sum(x: &[f32; 128]) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 4];
        for (g, a) in acc.iter_mut().enumerate() {
            let p = x.as_ptr().add(32 * g);
            let r = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(p.add(o)));
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
        for _ in 0..5000 {
            let mut x = [0f32; 128];
            for v in x.iter_mut() {
                let r = rng.next();
                let scale = [1e-3f32, 1.0, 1e3, 1e19][(r % 4) as usize];
                *v = ((r >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale;
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
            assert_eq!(got.to_bits(), simd_sum(&partials).to_bits());
        }
    }
}
