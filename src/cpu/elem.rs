//! Element conversions with MLX's rounding: round to nearest even, and a float32 NaN becomes
//! the canonical quiet NaN of the narrower type (bfloat16 0x7FC0), as MLX converts.

use half::{bf16, f16};

/// A float element the kernels read and write; arithmetic happens in f32.
pub trait Elem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Elem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from_bits((self.to_bits() as u32) << 16)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        bf16::from_bits(bf16_bits(x))
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        if x.is_nan() {
            f16::from_bits(0x7E00 | ((x.to_bits() >> 16) as u16 & 0x8000))
        } else {
            f16::from_f32(x)
        }
    }
}

/// MLX's float32 → bfloat16 conversion (round to nearest even; NaN → 0x7FC0).
#[inline(always)]
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        0x7FC0
    } else {
        ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16) as u16
    }
}

/// Rounds an f32 to `T` and back: the value an f32 takes when stored as `T`.
#[inline(always)]
pub fn round_to<T: Elem>(x: f32) -> f32 {
    T::from_f32(x).to_f32()
}
