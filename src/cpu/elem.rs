//! Element conversions with MLX's rounding: round to nearest even, and a float32 NaN becomes
//! the canonical quiet NaN of the narrower type (bfloat16 0x7FC0), as MLX converts.

use half::{bf16, f16};

use super::{typed, typed_mut};
use crate::dtype::Dtype;

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

/// A float buffer whose dtype is known at run time (bfloat16, float16 or float32), read as f32.
#[derive(Clone, Copy)]
pub enum Floats<'a> {
    F32(&'a [f32]),
    Bf16(&'a [bf16]),
    F16(&'a [f16]),
}

impl<'a> Floats<'a> {
    /// `bytes` as elements of `dtype` (a float dtype).
    pub fn new(bytes: &'a [u8], dtype: Dtype) -> Floats<'a> {
        match dtype {
            Dtype::Float32 => Floats::F32(typed(bytes)),
            Dtype::Bfloat16 => Floats::Bf16(typed(bytes)),
            Dtype::Float16 => Floats::F16(typed(bytes)),
            other => panic!("a float buffer of dtype {}", other.name()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Floats::F32(x) => x.len(),
            Floats::Bf16(x) => x.len(),
            Floats::F16(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Widens elements `[start, start + out.len())` into `out` (exactly).
    pub fn widen(&self, start: usize, out: &mut [f32]) {
        fn copy<T: Elem>(src: &[T], out: &mut [f32]) {
            for (o, &s) in out.iter_mut().zip(src) {
                *o = s.to_f32();
            }
        }
        let end = start + out.len();
        match self {
            Floats::F32(x) => out.copy_from_slice(&x[start..end]),
            Floats::Bf16(x) => copy(&x[start..end], out),
            Floats::F16(x) => copy(&x[start..end], out),
        }
    }

    /// Every element as f32.
    pub fn to_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        self.widen(0, &mut out);
        out
    }
}

/// A float buffer whose dtype is known at run time, written from f32 values with MLX's rounding.
pub enum FloatsMut<'a> {
    F32(&'a mut [f32]),
    Bf16(&'a mut [bf16]),
    F16(&'a mut [f16]),
}

impl<'a> FloatsMut<'a> {
    /// `bytes` as elements of `dtype` (a float dtype).
    pub fn new(bytes: &'a mut [u8], dtype: Dtype) -> FloatsMut<'a> {
        match dtype {
            Dtype::Float32 => FloatsMut::F32(typed_mut(bytes)),
            Dtype::Bfloat16 => FloatsMut::Bf16(typed_mut(bytes)),
            Dtype::Float16 => FloatsMut::F16(typed_mut(bytes)),
            other => panic!("a float output of dtype {}", other.name()),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            FloatsMut::F32(x) => x.len(),
            FloatsMut::Bf16(x) => x.len(),
            FloatsMut::F16(x) => x.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `bytes` of float dtype `dtype` as f32 values.
pub fn widen(bytes: &[u8], dtype: Dtype) -> Vec<f32> {
    Floats::new(bytes, dtype).to_vec()
}

/// Writes `values` into `out` as elements of float dtype `dtype`, with MLX's rounding.
pub fn narrow(values: &[f32], out: &mut [u8], dtype: Dtype) {
    fn store<T: Elem>(values: &[f32], out: &mut [T]) {
        assert_eq!(values.len(), out.len(), "narrow: lengths differ");
        for (o, &v) in out.iter_mut().zip(values) {
            *o = T::from_f32(v);
        }
    }
    match dtype {
        Dtype::Float32 => store(values, typed_mut::<f32>(out)),
        Dtype::Bfloat16 => store(values, typed_mut::<bf16>(out)),
        Dtype::Float16 => store(values, typed_mut::<f16>(out)),
        other => panic!("a float output of dtype {}", other.name()),
    }
}
