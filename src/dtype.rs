//! Element types, numbered as the C ABI's `mlxk_dtype`.

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(i32)]
pub enum Dtype {
    Bool = 0,
    Uint8 = 1,
    Int8 = 2,
    Int32 = 3,
    Uint32 = 4,
    Float16 = 5,
    Bfloat16 = 6,
    #[default]
    Float32 = 7,
}

impl Dtype {
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

    pub fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::Uint8 | Dtype::Int8 => 1,
            Dtype::Float16 | Dtype::Bfloat16 => 2,
            Dtype::Int32 | Dtype::Uint32 | Dtype::Float32 => 4,
        }
    }

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

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::Float16 | Dtype::Bfloat16 | Dtype::Float32)
    }
}
