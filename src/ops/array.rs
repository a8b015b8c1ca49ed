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

pub fn ndim(array: &Array) -> usize {
    bridge::array_ndim(array)
}

/// The array's dtype as an `mlxk_dtype` code.
pub fn dtype_code(array: &Array) -> i32 {
    bridge::array_dtype(array)
}

pub fn nbytes(array: &Array) -> usize {
    bridge::array_nbytes(array)
}

/// Computes the array now; MLX's error (a kernel's included) comes back as ours.
pub fn eval(array: &Array) -> Result<()> {
    Ok(bridge::array_eval(array)?)
}

/// A pool call's new pool after its evaluation failed: the pool it was given (`given`, that
/// pool's `id`), or the array itself where the call's node ran and failed, leaving the pool as
/// given in it (docs/serving.md, "Faults").
pub fn as_given(array: &Array, given: usize) -> UniquePtr<Array> {
    bridge::array_as_given(array, given)
}

/// MLX's identity of an array (its graph node), shared by every handle on it.
pub fn id(array: &Array) -> usize {
    bridge::array_id(array)
}

/// Evaluates the array and copies its elements, row-major, into `dst` (exactly nbytes long).
pub fn read(array: &Array, dst: &mut [u8]) -> Result<()> {
    Ok(bridge::array_read(array, dst)?)
}

pub fn astype(array: &Array, dtype: Dtype) -> Result<UniquePtr<Array>> {
    memory::check_outputs(&[("out", &shape(array), dtype)])?;
    Ok(bridge::array_astype(
        array,
        dtype as i32,
        super::device::gpu() != super::device::GpuBackend::None,
    )?)
}
