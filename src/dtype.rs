//! Element types, numbered as the C ABI's `mlxk_dtype`.

use crate::error::{Error, Result};

/// The element type of an [`Array`](crate::Array); the value is the C ABI's `mlxk_dtype`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(i32)]
pub enum Dtype {
    /// One byte holding 0 or 1 (Rust `bool`).
    Bool = 0,
    /// `u8`.
    Uint8 = 1,
    /// `i8`.
    Int8 = 2,
    /// `i32`.
    Int32 = 3,
    /// `u32`.
    Uint32 = 4,
    /// IEEE binary16 ([`half::f16`]).
    Float16 = 5,
    /// bfloat16, the upper half of an IEEE binary32 ([`half::bf16`]).
    Bfloat16 = 6,
    /// `f32`.
    #[default]
    Float32 = 7,
}

impl Dtype {
    /// Every dtype, in code order.
    pub const ALL: [Dtype; 8] = [
        Dtype::Bool,
        Dtype::Uint8,
        Dtype::Int8,
        Dtype::Int32,
        Dtype::Uint32,
        Dtype::Float16,
        Dtype::Bfloat16,
        Dtype::Float32,
    ];

    /// The dtype of a C `mlxk_dtype` code.
    pub fn from_code(code: i32) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| *d as i32 == code)
    }

    /// Parses a C argument, naming it in the error.
    pub(crate) fn from_arg(code: i32, arg: &str) -> Result<Dtype> {
        Dtype::from_code(code).ok_or_else(|| {
            Error::Dtype(format!(
                "{arg}: unknown dtype code {code} (expected an mlxk_dtype, 0..=7)"
            ))
        })
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float32 => 4,
        }
    }

    /// The name messages use, e.g. "bfloat16".
    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::Uint8 => "uint8",
            Dtype::Int8 => "int8",
            Dtype::Int32 => "int32",
            Dtype::Uint32 => "uint32",
            Dtype::Float16 => "float16",
            Dtype::Bfloat16 => "bfloat16",
            Dtype::Float32 => "float32",
        }
    }

    /// Whether this is float16, bfloat16 or float32.
    pub fn is_float(self) -> bool {
        matches!(self, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
    }
}
