//! Array construction, inspection and conversion.

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::Result;
use crate::memory;

/// Checks a new array's shape against the limits; returns its byte size.
pub fn check_new(arg: &str, shape: &[i32], dtype: Dtype) -> Result<usize> {
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    memory::check_outputs(&[(arg, &dims, dtype)])?;
    Ok(memory::element_count(&dims, arg)? as usize * dtype.size())
}

pub fn from_bytes(bytes: &[u8], shape: &[i32], dtype: Dtype) -> Result<UniquePtr<Array>> {
    Ok(bridge::array_from_bytes(bytes, shape, dtype as i32)?)
}

pub fn zeros(shape: &[i32], dtype: Dtype) -> Result<UniquePtr<Array>> {
    Ok(bridge::array_zeros(shape, dtype as i32)?)
}

pub fn shape(array: &Array) -> Vec<i64> {
    (0..bridge::array_ndim(array))
        .map(|axis| bridge::array_dim(array, axis) as i64)
        .collect()
}

pub fn astype(array: &Array, dtype: Dtype) -> Result<UniquePtr<Array>> {
    memory::check_outputs(&[("out", &shape(array), dtype)])?;
    Ok(bridge::array_astype(
        array,
        dtype as i32,
        super::device::gpu(),
    )?)
}
