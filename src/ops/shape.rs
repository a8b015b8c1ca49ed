//! Shape and dtype checks whose messages name the argument and what was expected.

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// What one array argument looks like.
#[derive(Debug, Clone)]
pub struct ArgInfo {
    pub name: &'static str,
    pub shape: Vec<i64>,
    pub dtype: Dtype,
}

impl ArgInfo {
    pub fn of(name: &'static str, array: &Array) -> Result<ArgInfo> {
        let shape = super::array::shape(array);
        let code = bridge::array_dtype(array);
        let dtype = Dtype::from_code(code)
            .ok_or_else(|| Error::Dtype(format!("{name}: unsupported MLX dtype")))?;
        Ok(ArgInfo { name, shape, dtype })
    }

    /// Checks the rank; `layout` names the axes for the message, e.g. "[B, T, Hk, Dk]".
    pub fn rank(&self, rank: usize, layout: &str) -> Result<&Self> {
        if self.shape.len() != rank {
            return Err(Error::Shape(format!(
                "{}: expected rank {rank} {layout}, got rank {} with shape {:?}",
                self.name,
                self.shape.len(),
                self.shape
            )));
        }
        Ok(self)
    }

    /// Checks dimension `axis` (named `what`) equals `expected`, which came from `source`.
    pub fn dim(&self, axis: usize, what: &str, expected: i64, source: &str) -> Result<&Self> {
        if self.shape[axis] != expected {
            return Err(Error::Shape(format!(
                "{}: dimension {axis} ({what}) is {}, expected {expected} ({what} of {source}); \
                 shape {:?}",
                self.name, self.shape[axis], self.shape
            )));
        }
        Ok(self)
    }

    pub fn float(&self) -> Result<&Self> {
        if !self.dtype.is_float() {
            return Err(Error::Dtype(format!(
                "{}: dtype {} is not a float dtype (expected bfloat16, float16 or float32)",
                self.name,
                self.dtype.name()
            )));
        }
        Ok(self)
    }

    pub fn dtype_in(&self, allowed: &[Dtype]) -> Result<&Self> {
        if !allowed.contains(&self.dtype) {
            let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
            return Err(Error::Dtype(format!(
                "{}: dtype {} is not accepted (expected {})",
                self.name,
                self.dtype.name(),
                names.join(" or ")
            )));
        }
        Ok(self)
    }

    pub fn same_dtype(&self, other: &ArgInfo) -> Result<&Self> {
        if self.dtype != other.dtype {
            return Err(Error::Dtype(format!(
                "{}: dtype {} differs from {}'s dtype {} (they must match)",
                self.name,
                self.dtype.name(),
                other.name,
                other.dtype.name()
            )));
        }
        Ok(self)
    }
}

/// `eps` must be finite and non-negative.
pub fn check_eps(eps: f32) -> Result<()> {
    if !eps.is_finite() || eps < 0.0 {
        return Err(Error::InvalidArgument(format!(
            "eps is {eps}; expected a finite value >= 0"
        )));
    }
    Ok(())
}
