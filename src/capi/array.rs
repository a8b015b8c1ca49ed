//! Array handles: construction from host data, inspection, evaluation, read-back, casts.

use std::ffi::c_void;

use super::status::mlxk_status;
use super::{boundary, in_slice, mlxk_array, out_slice, Out};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::ops::array as ops;
use crate::registry;

/// Element type of an array. Values are stable.
pub type mlxk_dtype = i32;

/// Booleans, one byte each holding 0 or 1.
pub const MLXK_DTYPE_BOOL: mlxk_dtype = 0;
pub const MLXK_DTYPE_UINT8: mlxk_dtype = 1;
pub const MLXK_DTYPE_INT8: mlxk_dtype = 2;
pub const MLXK_DTYPE_INT32: mlxk_dtype = 3;
pub const MLXK_DTYPE_UINT32: mlxk_dtype = 4;
/// IEEE binary16.
pub const MLXK_DTYPE_FLOAT16: mlxk_dtype = 5;
/// bfloat16 (the upper half of an IEEE binary32), as two bytes.
pub const MLXK_DTYPE_BFLOAT16: mlxk_dtype = 6;
pub const MLXK_DTYPE_FLOAT32: mlxk_dtype = 7;

/// The most dimensions an array may have.
pub const MLXK_MAX_NDIM: usize = 16;
const _: () = assert!(MLXK_MAX_NDIM == crate::memory::MAX_NDIM);

unsafe fn shape_arg<'a>(shape: *const i32, ndim: usize) -> Result<&'a [i32]> {
    if ndim > MLXK_MAX_NDIM {
        return Err(Error::Shape(format!(
            "ndim is {ndim}; at most MLXK_MAX_NDIM ({MLXK_MAX_NDIM}) dimensions are supported"
        )));
    }
    // SAFETY: forwarded contract: `shape` holds `ndim` int32 values.
    unsafe { in_slice(shape, ndim, "shape") }
}

/// Makes an array of `shape` (`ndim` dims) and `dtype`, copying `data`: the row-major elements,
/// `product(shape) * sizeof(dtype)` bytes. Bool data must hold only bytes 0 and 1.
///
/// Ownership: `data` and `shape` are borrowed for the call; `*out` is a new handle the caller
/// frees with mlxk_array_free(). NULL: `data` may be NULL only when the array is empty, `shape`
/// only when `ndim` is 0; `out` must not be NULL. Written only on success.
/// Errors: MLXK_ERR_SHAPE (negative dim, ndim > MLXK_MAX_NDIM), MLXK_ERR_DTYPE,
/// MLXK_ERR_INVALID_ARGUMENT (> 2^31-1 elements, bool byte not 0/1), MLXK_ERR_OUT_OF_MEMORY
/// (above the memory limit). Thread: any.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_new(
    data: *const c_void,
    shape: *const i32,
    ndim: usize,
    dtype: mlxk_dtype,
    out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary("mlxk_array_new", || {
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        // SAFETY: documented contract on `shape`.
        let shape = unsafe { shape_arg(shape, ndim) }?;
        let dtype = Dtype::from_arg(dtype, "dtype")?;
        let nbytes = ops::check_new("shape", shape, dtype)?;
        // SAFETY: documented contract on `data`: nbytes readable bytes.
        let bytes = unsafe { in_slice(data as *const u8, nbytes, "data") }?;
        if dtype == Dtype::Bool {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(Error::InvalidArgument(format!(
                    "data: bool element {i} holds byte {} (expected 0 or 1)",
                    bytes[i]
                )));
            }
        }
        let mut mlx = registry::lock();
        let array = ops::from_bytes(bytes, shape, dtype)?;
        out.write(mlx.insert(array));
        Ok(())
    })
}

/// Makes an array of `shape` and `dtype` filled with zeros.
///
/// Ownership, NULL and errors as mlxk_array_new (without `data`). Thread: any.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_zeros(
    shape: *const i32,
    ndim: usize,
    dtype: mlxk_dtype,
    out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary("mlxk_array_zeros", || {
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        // SAFETY: documented contract on `shape`.
        let shape = unsafe { shape_arg(shape, ndim) }?;
        let dtype = Dtype::from_arg(dtype, "dtype")?;
        ops::check_new("shape", shape, dtype)?;
        let mut mlx = registry::lock();
        let array = ops::zeros(shape, dtype)?;
        out.write(mlx.insert(array));
        Ok(())
    })
}

/// Releases a handle. NULL is a no-op returning MLXK_OK. A handle that is not live (already
/// freed, or not made by this library) gives MLXK_ERR_INVALID_HANDLE and nothing happens.
///
/// Lazy results computed from this array stay valid: MLX keeps what they need. Freeing the old
/// state before evaluating the new one lets the CPU kernels update the state in place.
/// Thread: any; the handle is dead for every thread afterwards.
#[no_mangle]
pub extern "C" fn mlxk_array_free(array: *mut mlxk_array) -> mlxk_status {
    boundary("mlxk_array_free", || {
        if array.is_null() {
            return Ok(());
        }
        registry::lock().remove(array, "array")
    })
}

/// Writes the number of dimensions of `array` to `*ndim`.
///
/// NULL: neither may be NULL. Thread: any. Never evaluates.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_ndim(
    array: *const mlxk_array,
    ndim: *mut usize,
) -> mlxk_status {
    boundary("mlxk_array_ndim", || {
        // SAFETY: the documented contract on `ndim`.
        let ndim = unsafe { Out::new(ndim, "ndim") }?;
        let mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        ndim.write(ops::ndim(a));
        Ok(())
    })
}

/// Writes the dimensions of `array` to `dims[0..ndim]`. `capacity` is the length of `dims`;
/// fewer than ndim gives MLXK_ERR_BUFFER_TOO_SMALL and writes nothing.
///
/// NULL: `dims` may be NULL only when `capacity` is 0. Thread: any. Never evaluates.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_shape(
    array: *const mlxk_array,
    dims: *mut i32,
    capacity: usize,
) -> mlxk_status {
    boundary("mlxk_array_shape", || {
        let mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        let shape = ops::shape(a);
        if capacity < shape.len() {
            return Err(Error::BufferTooSmall(format!(
                "dims: capacity {capacity} is smaller than the array's {} dimensions",
                shape.len()
            )));
        }
        if shape.is_empty() {
            return Ok(());
        }
        // SAFETY: the documented contract: `capacity` (>= ndim) writable int32 values at `dims`.
        let dims = unsafe { out_slice(dims, shape.len(), "dims") }?;
        for (slot, &d) in dims.iter_mut().zip(&shape) {
            *slot = d as i32;
        }
        Ok(())
    })
}

/// Writes the dtype of `array` to `*dtype`.
///
/// NULL: neither may be NULL. Thread: any. Never evaluates.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_dtype(
    array: *const mlxk_array,
    dtype: *mut mlxk_dtype,
) -> mlxk_status {
    boundary("mlxk_array_dtype", || {
        // SAFETY: the documented contract on `dtype`.
        let dtype = unsafe { Out::new(dtype, "dtype") }?;
        let mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        dtype.write(ops::dtype_code(a));
        Ok(())
    })
}

/// Writes the size of `array`'s data in bytes (elements times dtype size) to `*nbytes`.
///
/// NULL: neither may be NULL. Thread: any. Never evaluates.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_nbytes(
    array: *const mlxk_array,
    nbytes: *mut usize,
) -> mlxk_status {
    boundary("mlxk_array_nbytes", || {
        // SAFETY: the documented contract on `nbytes`.
        let nbytes = unsafe { Out::new(nbytes, "nbytes") }?;
        let mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        nbytes.write(ops::nbytes(a));
        Ok(())
    })
}

/// Computes `array` (and whatever it depends on) now. Errors raised by the computation — of
/// this call or of the kernels that produced `array` — are reported here; the handle then
/// reports the failure on every use, except a pool call's new pool, which holds the pool the
/// call was given (mlxk_gated_delta_update_pool, "Faults lose nothing").
///
/// NULL: `array` must not be NULL. Thread: any; blocks other mlxk_ calls while computing.
#[no_mangle]
pub extern "C" fn mlxk_array_eval(array: *const mlxk_array) -> mlxk_status {
    boundary("mlxk_array_eval", || {
        let mut mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        if let Err(error) = ops::eval(a) {
            mlx.mark_failed(array, &error);
            return Err(error);
        }
        Ok(())
    })
}

/// Evaluates `array` and copies its elements, row-major, into `dst` (`dst_bytes` long). A
/// buffer shorter than mlxk_array_nbytes() gives MLXK_ERR_BUFFER_TOO_SMALL and copies nothing;
/// a longer one keeps its tail. Computation errors are reported here (see mlxk_array_eval).
///
/// NULL: `dst` may be NULL only for an empty array. Thread: any.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_read(
    array: *const mlxk_array,
    dst: *mut c_void,
    dst_bytes: usize,
) -> mlxk_status {
    boundary("mlxk_array_read", || {
        let mut mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        let nbytes = ops::nbytes(a);
        if dst_bytes < nbytes {
            return Err(Error::BufferTooSmall(format!(
                "dst_bytes is {dst_bytes}; the array holds {nbytes} bytes"
            )));
        }
        if nbytes == 0 {
            return Ok(());
        }
        // SAFETY: the documented contract: `dst_bytes` (>= nbytes) writable bytes at `dst`.
        let dst = unsafe { out_slice(dst as *mut u8, nbytes, "dst") }?;
        if let Err(error) = ops::read(a, dst) {
            mlx.mark_failed(array, &error);
            return Err(error);
        }
        Ok(())
    })
}

/// Makes a lazy copy of `array` converted to `dtype` (MLX's conversion rules: round to nearest
/// even; float to integer truncates).
///
/// Ownership: `array` is borrowed; `*out` is a new handle. NULL: neither may be NULL.
/// Errors: MLXK_ERR_DTYPE, MLXK_ERR_OUT_OF_MEMORY. Thread: any. Lazy.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_astype(
    array: *const mlxk_array,
    dtype: mlxk_dtype,
    out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary("mlxk_array_astype", || {
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        let dtype = Dtype::from_arg(dtype, "dtype")?;
        let mut mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        let converted = ops::astype(a, dtype)?;
        out.write(mlx.insert(converted));
        Ok(())
    })
}
