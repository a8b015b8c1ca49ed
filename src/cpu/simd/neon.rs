//! NEON building blocks shared by the arm64 kernels: element loads and stores four lanes at a
//! time with `Elem`'s conversions, MLX's CPU `exp` and `sigmoid` on four lanes, the 32-lane xor
//! butterfly over eight registers, "lane layout" for lanes owning `N` consecutive values, and
//! tables of the SiLUs over every value of a 16-bit type. Each computes, lane by lane, the bits
//! its scalar counterpart in `math`, `elem` and `reduce` computes (NaN payloads aside: NaNs stay
//! NaN); the arm64 tests (`tests/arm64`) check them on every 16-bit value and on edge and
//! random f32 values.
//!
//! NEON is part of the base arm64 architecture, so nothing here needs a run-time check; the
//! kernels built on it still run only where `features::kernels().neon` says so (the portable
//! ones can be forced).
//!
//! Lane layout: 32 lanes sit in eight registers of four (register g holds lanes 4g..4g+4). A
//! lane owning `N` consecutive values (`N` = 1, 2, 3, 4 or 8) has them as element i of register
//! (g, i); `vld1q`..`vld4q` de-interleave exactly that way from natural order (`N` = 8: two
//! `vld4q` and an unzip).

// The whole module is intrinsics on pointers whose validity the callers establish.
#![allow(unsafe_op_in_unsafe_fn)]

use std::any::TypeId;
use std::arch::aarch64::*;
use std::sync::OnceLock;

use half::{bf16, f16};

use crate::cpu::elem::{round_to, Elem};
use crate::cpu::math;

/// An element type the NEON kernels load and store four at a time.
pub trait Quad: Elem {
    /// Four elements at `p`, widened exactly to f32 (`Elem::to_f32`).
    ///
    /// # Safety
    /// `p` addresses 4 readable elements.
    #[inline(always)]
    unsafe fn load4(p: *const Self) -> float32x4_t {
        let x = [0, 1, 2, 3].map(|i| (*p.add(i)).to_f32());
        vld1q_f32(x.as_ptr())
    }
    /// `Elem::from_f32` of each lane, stored at `p`.
    ///
    /// # Safety
    /// `p` addresses 4 writable elements.
    #[inline(always)]
    unsafe fn store4(p: *mut Self, v: float32x4_t) {
        let mut x = [0f32; 4];
        vst1q_f32(x.as_mut_ptr(), v);
        for (i, x) in x.into_iter().enumerate() {
            *p.add(i) = Self::from_f32(x);
        }
    }
    /// `round_to::<Self>` of each lane: the value it takes when stored as `Self`.
    ///
    /// # Safety
    /// NEON is available (always, on arm64).
    #[inline(always)]
    unsafe fn round(v: float32x4_t) -> float32x4_t {
        let mut x = [0f32; 4];
        vst1q_f32(x.as_mut_ptr(), v);
        let x = x.map(round_to::<Self>);
        vld1q_f32(x.as_ptr())
    }
}

impl Quad for f32 {
    #[inline(always)]
    unsafe fn load4(p: *const f32) -> float32x4_t {
        vld1q_f32(p)
    }
    #[inline(always)]
    unsafe fn store4(p: *mut f32, v: float32x4_t) {
        vst1q_f32(p, v)
    }
    #[inline(always)]
    unsafe fn round(v: float32x4_t) -> float32x4_t {
        v
    }
}

/// `elem::bf16_bits` of each lane (NaN → 0x7FC0) in the low 16 bits of each 32-bit lane.
#[inline(always)]
unsafe fn bf16_bits4(v: float32x4_t) -> uint32x4_t {
    let bits = vreinterpretq_u32_f32(v);
    let lsb = vandq_u32(vshrq_n_u32::<16>(bits), vdupq_n_u32(1));
    let rounded = vshrq_n_u32::<16>(vaddq_u32(vaddq_u32(bits, vdupq_n_u32(0x7FFF)), lsb));
    // Not equal to itself: NaN.
    let nan = vmvnq_u32(vceqq_f32(v, v));
    vbslq_u32(nan, vdupq_n_u32(0x7FC0), rounded)
}

impl Quad for bf16 {
    #[inline(always)]
    unsafe fn load4(p: *const bf16) -> float32x4_t {
        let bits = vld1_u16(p as *const u16);
        vreinterpretq_f32_u32(vshlq_n_u32::<16>(vmovl_u16(bits)))
    }
    #[inline(always)]
    unsafe fn store4(p: *mut bf16, v: float32x4_t) {
        vst1_u16(p as *mut u16, vmovn_u32(bf16_bits4(v)))
    }
    #[inline(always)]
    unsafe fn round(v: float32x4_t) -> float32x4_t {
        vreinterpretq_f32_u32(vshlq_n_u32::<16>(bf16_bits4(v)))
    }
}

// f16 goes through `Elem`'s scalar conversion lane by lane (the trait's defaults): the same
// bits by construction, whatever FPCR says about half-precision subnormals.
impl Quad for f16 {}

/// Loads the first `n` (≤ 4) elements at `p`, zeros in the other lanes.
///
/// # Safety
/// `p` addresses `n` readable elements.
#[inline(always)]
pub unsafe fn load_n<T: Quad>(p: *const T, n: usize) -> float32x4_t {
    if n >= 4 {
        T::load4(p)
    } else {
        // All-zero bits are +0.0 in every element type.
        let mut buf: [T; 4] = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(p, buf.as_mut_ptr(), n);
        T::load4(buf.as_ptr())
    }
}

/// Stores the first `n` (≤ 4) lanes of `v` at `p` (as `T::store4`).
///
/// # Safety
/// `p` addresses `n` writable elements.
#[inline(always)]
pub unsafe fn store_n<T: Quad>(p: *mut T, v: float32x4_t, n: usize) {
    if n >= 4 {
        T::store4(p, v)
    } else {
        let mut buf: [T; 4] = std::mem::zeroed();
        T::store4(buf.as_mut_ptr(), v);
        std::ptr::copy_nonoverlapping(buf.as_ptr(), p, n);
    }
}

/// MLX's CPU exp (`math::exp`) on `N` registers, for inputs that are +0, positive, +inf or
/// NaN (the `< -88` clamp never applies; a NaN input gives a NaN). The integer part
/// `floor(x + 0.5)`, which MLX evaluates in double, is `floor(x) + (x - floor(x) >= 0.5)`, the
/// fraction being exact for x ≥ 0; the polynomial is MLX's chain of fused multiply-adds.
///
/// # Safety
/// NEON is available (always, on arm64).
#[inline(always)]
// MLX's constants, as MLX writes them (`math::exp`).
#[allow(clippy::approx_constant, clippy::excessive_precision)]
pub unsafe fn exp_nonnegative<const N: usize>(x_init: [float32x4_t; N]) -> [float32x4_t; N] {
    let mut x = x_init;
    let mut fpart = x_init;
    let mut ipart = x_init;
    for i in 0..N {
        x[i] = vmulq_f32(x_init[i], vdupq_n_f32(1.442695f32));
        let floor = vrndmq_f32(x[i]);
        let frac = vsubq_f32(x[i], floor);
        let up = vcgeq_f32(frac, vdupq_n_f32(0.5));
        let one = vandq_u32(up, vreinterpretq_u32_f32(vdupq_n_f32(1.0)));
        ipart[i] = vaddq_f32(floor, vreinterpretq_f32_u32(one));
        fpart[i] = vsubq_f32(x[i], ipart[i]);
    }
    let mut p = [vdupq_n_f32(1.535336188319500e-4f32); N];
    for c in [
        1.339887440266574e-3f32,
        9.618437357674640e-3f32,
        5.550332471162809e-2f32,
        2.402264791363012e-1f32,
        6.931472028550421e-1f32,
        1.000000000000000f32,
    ] {
        for i in 0..N {
            // c + p · fpart, fused (`f32::mul_add`).
            p[i] = vfmaq_f32(vdupq_n_f32(c), p[i], fpart[i]);
        }
    }
    let mut result = p;
    for i in 0..N {
        let epart = vshlq_n_s32::<23>(vaddq_s32(vcvtq_s32_f32(ipart[i]), vdupq_n_s32(127)));
        result[i] = vmulq_f32(vreinterpretq_f32_s32(epart), p[i]);
        let high = vcgtq_f32(x_init[i], vdupq_n_f32(88.0));
        result[i] = vbslq_f32(high, vdupq_n_f32(f32::INFINITY), result[i]);
        // A NaN input gives a NaN (the integer conversion would not).
        let nan = vmvnq_u32(vceqq_f32(x_init[i], x_init[i]));
        result[i] = vbslq_f32(nan, x_init[i], result[i]);
    }
    result
}

/// MLX's CPU sigmoid for element type `T` (`math::sigmoid::<T>`), rounded to T, as f32, on
/// `N` registers.
///
/// # Safety
/// NEON is available (always, on arm64).
#[inline(always)]
pub unsafe fn sigmoid<T: Quad, const N: usize>(x: [float32x4_t; N]) -> [float32x4_t; N] {
    let mut abs = x;
    for i in 0..N {
        abs[i] = vabsq_f32(x[i]);
    }
    let e = exp_nonnegative(abs);
    let one = vdupq_n_f32(1.0);
    let mut y = e;
    for i in 0..N {
        let s = vdivq_f32(one, vaddq_f32(one, T::round(e[i])));
        let negative = vcltq_f32(x[i], vdupq_n_f32(0.0));
        y[i] = T::round(vbslq_f32(negative, s, vsubq_f32(one, s)));
    }
    y
}

/// SiLU with MLX's rounding points for `T` (`silu_rms_heads::silu::<T>`): `T(x · sigmoid)`.
///
/// # Safety
/// NEON is available (always, on arm64).
#[inline(always)]
pub unsafe fn silu<T: Quad, const N: usize>(x: [float32x4_t; N]) -> [float32x4_t; N] {
    let s = sigmoid::<T, N>(x);
    let mut out = s;
    for i in 0..N {
        out[i] = T::round(vmulq_f32(x[i], s[i]));
    }
    out
}

/// The xor butterfly (`reduce::simd_sum`) over 32 lane partials, lanes 4g..4g+4 in `acc[g]`:
/// its pairwise tree is four levels of pairwise adds (`faddp`) and one add.
///
/// # Safety
/// NEON is available (always, on arm64).
#[inline(always)]
pub unsafe fn butterfly(acc: &[float32x4_t; 8]) -> f32 {
    let l1 = [
        vpaddq_f32(acc[0], acc[1]),
        vpaddq_f32(acc[2], acc[3]),
        vpaddq_f32(acc[4], acc[5]),
        vpaddq_f32(acc[6], acc[7]),
    ];
    let l2 = [vpaddq_f32(l1[0], l1[1]), vpaddq_f32(l1[2], l1[3])];
    let l3 = vpaddq_f32(l2[0], l2[1]);
    let l4 = vpaddq_f32(l3, l3);
    vpadds_f32(vget_low_f32(l4))
}

/// Whether lane layout is defined for lanes of `n` values.
pub const fn lane_layout_fits(n: usize) -> bool {
    matches!(n, 1 | 2 | 3 | 4 | 8)
}

/// The `N` registers of lane group g (4 lanes × N values) from natural order at `p`
/// (`4·N` values): register i holds element i of each lane.
///
/// # Safety
/// `p` addresses `4·N` readable values; `lane_layout_fits(N)`.
#[allow(clippy::needless_range_loop)]
#[inline(always)]
pub unsafe fn load_lanes<const N: usize>(p: *const f32, out: *mut float32x4_t) {
    match N {
        1 => *out = vld1q_f32(p),
        2 => {
            let r = vld2q_f32(p);
            (*out, *out.add(1)) = (r.0, r.1);
        }
        3 => {
            let r = vld3q_f32(p);
            (*out, *out.add(1), *out.add(2)) = (r.0, r.1, r.2);
        }
        4 => {
            let r = vld4q_f32(p);
            (*out, *out.add(1), *out.add(2), *out.add(3)) = (r.0, r.1, r.2, r.3);
        }
        8 => {
            // a.i = values i, 4+i, 8+i, 12+i; b.i the same 16 later: lane m's element i
            // (value 8m + i) is a.i's even lanes then b.i's for i < 4, their odd ones after.
            let a = vld4q_f32(p);
            let b = vld4q_f32(p.add(16));
            let (a, b) = ([a.0, a.1, a.2, a.3], [b.0, b.1, b.2, b.3]);
            for i in 0..4 {
                *out.add(i) = vuzp1q_f32(a[i], b[i]);
                *out.add(4 + i) = vuzp2q_f32(a[i], b[i]);
            }
        }
        _ => unreachable!("no lane layout for {N} values a lane"),
    }
}

/// `load_lanes` undone: the `N` registers of a lane group stored in natural order at `p`.
///
/// # Safety
/// `p` addresses `4·N` writable values; `lane_layout_fits(N)`.
#[inline(always)]
pub unsafe fn store_lanes<const N: usize>(r: *const float32x4_t, p: *mut f32) {
    match N {
        1 => vst1q_f32(p, *r),
        2 => vst2q_f32(p, float32x4x2_t(*r, *r.add(1))),
        3 => vst3q_f32(p, float32x4x3_t(*r, *r.add(1), *r.add(2))),
        4 => vst4q_f32(p, float32x4x4_t(*r, *r.add(1), *r.add(2), *r.add(3))),
        8 => {
            let mut a = [vdupq_n_f32(0.0); 4];
            let mut b = a;
            for i in 0..4 {
                a[i] = vzip1q_f32(*r.add(i), *r.add(4 + i));
                b[i] = vzip2q_f32(*r.add(i), *r.add(4 + i));
            }
            vst4q_f32(p, float32x4x4_t(a[0], a[1], a[2], a[3]));
            vst4q_f32(p.add(16), float32x4x4_t(b[0], b[1], b[2], b[3]));
        }
        _ => unreachable!("no lane layout for {N} values a lane"),
    }
}

/// Rewrites `32·N` values (32 lanes of `N`) from natural order into lane layout in place:
/// register (g, i) at `4·(N·g + i)`.
///
/// # Safety
/// `lane_layout_fits(N)`; `x` holds `32·N` values.
#[inline(always)]
pub unsafe fn to_lane_layout<const N: usize>(x: &mut [f32]) {
    debug_assert_eq!(x.len(), 32 * N);
    let mut r = [vdupq_n_f32(0.0); 8];
    for g in 0..8 {
        let p = x.as_mut_ptr().add(4 * N * g);
        load_lanes::<N>(p, r.as_mut_ptr());
        for (i, v) in r.iter().enumerate().take(N) {
            vst1q_f32(p.add(4 * i), *v);
        }
    }
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

/// `f` of every value of the 16-bit type `T`, by bit pattern.
fn over_all_values<T: Elem, U>(f: impl Fn(f32) -> U) -> Box<[U]> {
    (0..=u16::MAX)
        .map(|bits| {
            // SAFETY: T is a 16-bit float type for which every bit pattern is a value.
            let x: T = unsafe { std::mem::transmute_copy(&bits) };
            f(x.to_f32())
        })
        .collect()
}

fn build_silu_table<T: Elem>() -> Box<[u16]> {
    over_all_values::<T, u16>(|x| {
        let y = T::from_f32(round_to::<T>(x * math::sigmoid::<T>(x)));
        // SAFETY: T is a 16-bit type.
        unsafe { std::mem::transmute_copy(&y) }
    })
}

fn build_gate_table<G: Elem>() -> Box<[f32]> {
    over_all_values::<G, f32>(|g| g * math::sigmoid::<f32>(g))
}

static SILU_BF16: OnceLock<Box<[u16]>> = OnceLock::new();
static SILU_F16: OnceLock<Box<[u16]>> = OnceLock::new();
static GATE_BF16: OnceLock<Box<[f32]>> = OnceLock::new();
static GATE_F16: OnceLock<Box<[f32]>> = OnceLock::new();

/// For a 16-bit `T`, the table of the SiLU over every value: entry `bits` holds the bits of
/// `T::from_f32(silu::<T>(x))` for x of bits `bits`, built once from the scalar formula.
/// `None` for f32.
pub fn silu_table<T: Elem>() -> Option<&'static [u16]> {
    Some(match sixteen_bits::<T>()? {
        true => SILU_BF16.get_or_init(build_silu_table::<bf16>),
        false => SILU_F16.get_or_init(build_silu_table::<f16>),
    })
}

/// For a 16-bit `G`, the table of the f32 gate activation `g · sigmoid::<f32>(g)` over every
/// value g of G, built once from the scalar formula. `None` for f32.
pub fn gate_table<G: Elem>() -> Option<&'static [f32]> {
    Some(match sixteen_bits::<G>()? {
        true => GATE_BF16.get_or_init(build_gate_table::<bf16>),
        false => GATE_F16.get_or_init(build_gate_table::<f16>),
    })
}

/// `[table[bits[0]], ..., table[bits[3]]]` (a table of every value of a 16-bit type).
///
/// # Safety
/// `bits` addresses 4 elements; `table` holds 2^16.
#[inline(always)]
pub unsafe fn lookup4(table: *const f32, bits: *const u16) -> float32x4_t {
    let x = [0, 1, 2, 3].map(|i| *table.add(*bits.add(i) as usize));
    vld1q_f32(x.as_ptr())
}

/// The sums of squares of 4 lanes owning 4 consecutive values each (16 values at `p`, natural
/// order), each lane in order from `acc`: `acc + v0² + v1² + v2² + v3²`, products and sums
/// rounded one by one.
///
/// # Safety
/// `p` addresses 16 readable values.
#[inline(always)]
pub unsafe fn add_squares(acc: float32x4_t, p: *const f32) -> float32x4_t {
    let r = vld4q_f32(p);
    let mut a = acc;
    for v in [r.0, r.1, r.2, r.3] {
        a = vaddq_f32(a, vmulq_f32(v, v));
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::reduce::simd_sum;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Inputs covering every class: random bit patterns, the exp/sigmoid edges, and values
    /// near the x·log2(e) half-integers where the integer part's rounding flips.
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

    /// Compares `vector` with `scalar` over `inputs()` mapped into `domain`.
    fn check(
        name: &str,
        domain: fn(f32) -> f32,
        vector: impl Fn(float32x4_t) -> float32x4_t,
        scalar: impl Fn(f32) -> f32,
    ) {
        let x: Vec<f32> = inputs().into_iter().map(domain).collect();
        for c in x.chunks(4) {
            let mut got = [0f32; 4];
            // SAFETY: `c` holds up to 4 values, `got` 4.
            unsafe { store_n::<f32>(got.as_mut_ptr(), vector(load_n(c.as_ptr(), c.len())), 4) };
            for (&x, &g) in c.iter().zip(&got) {
                let want = scalar(x);
                assert!(
                    same(g, want),
                    "{name}({x:e} = {:#x}): {g:e} vs {want:e}",
                    x.to_bits()
                );
            }
        }
    }

    #[test]
    fn exp_sigmoid_and_silu_match_the_scalar_formulas() {
        check(
            "exp",
            |x| x,
            |v| unsafe { exp_nonnegative([vabsq_f32(v)])[0] },
            |x| math::exp(x.abs()),
        );
        check(
            "sigmoid f32",
            |x| x,
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
        check(
            "silu f32 ×4",
            |x| x,
            |v| unsafe { silu::<f32, 4>([v, v, v, v])[3] },
            |x| x * math::sigmoid::<f32>(x),
        );
        check(
            "silu bf16",
            round_to::<bf16>,
            |v| unsafe { silu::<bf16, 1>([v])[0] },
            |x| round_to::<bf16>(x * math::sigmoid::<bf16>(x)),
        );
    }

    #[test]
    fn conversions_match_elem_bit_for_bit() {
        let x = inputs();
        check(
            "bf16 round",
            |x| x,
            |v| unsafe { bf16::round(v) },
            round_to::<bf16>,
        );
        check(
            "f16 round",
            |x| x,
            |v| unsafe { f16::round(v) },
            round_to::<f16>,
        );
        for c in x.chunks(4) {
            let v = unsafe { load_n::<f32>(c.as_ptr(), c.len()) };
            let mut b = [bf16::from_bits(0); 4];
            let mut h = [f16::from_bits(0); 4];
            // SAFETY: 4 elements each.
            unsafe {
                (
                    bf16::store4(b.as_mut_ptr(), v),
                    f16::store4(h.as_mut_ptr(), v),
                )
            };
            for (i, &x) in c.iter().enumerate() {
                assert_eq!(
                    b[i].to_bits(),
                    crate::cpu::elem::bf16_bits(x),
                    "bf16 of {x:e}"
                );
                assert_eq!(
                    h[i].to_bits(),
                    <f16 as Elem>::from_f32(x).to_bits(),
                    "f16 of {x:e}"
                );
            }
        }
        for bits in (0..=u16::MAX).step_by(4) {
            let b: [bf16; 4] = std::array::from_fn(|i| bf16::from_bits(bits + i as u16));
            let h: [f16; 4] = std::array::from_fn(|i| f16::from_bits(bits + i as u16));
            let mut wb = [0f32; 4];
            let mut wh = [0f32; 4];
            // SAFETY: 4 elements each.
            unsafe {
                vst1q_f32(wb.as_mut_ptr(), bf16::load4(b.as_ptr()));
                vst1q_f32(wh.as_mut_ptr(), f16::load4(h.as_ptr()));
            }
            for i in 0..4 {
                assert_eq!(
                    wb[i].to_bits(),
                    Elem::to_f32(b[i]).to_bits(),
                    "bf16 {:#x}",
                    bits
                );
                assert_eq!(
                    wh[i].to_bits(),
                    Elem::to_f32(h[i]).to_bits(),
                    "f16 {:#x}",
                    bits
                );
            }
        }
    }

    #[test]
    fn tables_hold_the_scalar_results_for_every_value() {
        let (sb, sh) = (silu_table::<bf16>().unwrap(), silu_table::<f16>().unwrap());
        let (gb, gh) = (gate_table::<bf16>().unwrap(), gate_table::<f16>().unwrap());
        assert!(silu_table::<f32>().is_none() && gate_table::<f32>().is_none());
        for bits in 0..=u16::MAX {
            let i = bits as usize;
            let x = Elem::to_f32(bf16::from_bits(bits));
            let y = <bf16 as Elem>::from_f32(x * math::sigmoid::<bf16>(x));
            assert_eq!(sb[i], y.to_bits(), "bf16 silu of {bits:#x}");
            assert!(
                same(gb[i], x * math::sigmoid::<f32>(x)),
                "bf16 gate {bits:#x}"
            );
            let x = Elem::to_f32(f16::from_bits(bits));
            let y = <f16 as Elem>::from_f32(x * math::sigmoid::<f16>(x));
            assert_eq!(sh[i], y.to_bits(), "f16 silu of {bits:#x}");
            assert!(
                same(gh[i], x * math::sigmoid::<f32>(x)),
                "f16 gate {bits:#x}"
            );
        }
    }

    #[test]
    fn squares_and_butterfly_match_the_lane_order() {
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
            // SAFETY: x holds 8 groups of 16.
            let got = unsafe {
                let acc: [float32x4_t; 8] =
                    std::array::from_fn(|g| add_squares(vdupq_n_f32(0.0), x.as_ptr().add(16 * g)));
                butterfly(&acc)
            };
            assert_eq!(got.to_bits(), simd_sum(&partials).to_bits());
        }
    }

    /// Lane layout: lane l's element i (natural index l·N + i) in register (g, i) lane l % 4,
    /// g = l / 4; `store_lanes` undoes `load_lanes`.
    #[test]
    fn lane_layout_puts_each_lanes_values_in_its_lane() {
        fn check<const N: usize>() {
            let x: Vec<f32> = (0..32 * N).map(|i| i as f32).collect();
            // SAFETY: NEON is part of arm64.
            let mut r = [unsafe { vdupq_n_f32(0.0) }; 64];
            let mut back = vec![0f32; 32 * N];
            for g in 0..8 {
                // SAFETY: 4·N values a group; 8·N registers.
                unsafe { load_lanes::<N>(x.as_ptr().add(4 * N * g), r.as_mut_ptr().add(N * g)) };
            }
            for l in 0..32 {
                for i in 0..N {
                    let mut lanes = [0f32; 4];
                    unsafe { vst1q_f32(lanes.as_mut_ptr(), r[N * (l / 4) + i]) };
                    assert_eq!(lanes[l % 4], x[l * N + i], "N = {N}: lane {l} element {i}");
                }
            }
            for g in 0..8 {
                // SAFETY: as above.
                unsafe {
                    store_lanes::<N>(r.as_ptr().add(N * g), back.as_mut_ptr().add(4 * N * g))
                };
            }
            assert_eq!(back, x, "N = {N}: stored back");
            let mut y = x.clone();
            // SAFETY: 32·N values.
            unsafe { to_lane_layout::<N>(&mut y) };
            for (j, reg) in r.iter().enumerate().take(8 * N) {
                let mut lanes = [0f32; 4];
                unsafe { vst1q_f32(lanes.as_mut_ptr(), *reg) };
                assert_eq!(
                    &y[4 * j..4 * j + 4],
                    &lanes,
                    "N = {N}: in place, register {j}"
                );
            }
        }
        check::<1>();
        check::<2>();
        check::<3>();
        check::<4>();
        check::<8>();
    }
}
