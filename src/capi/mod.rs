//! The C ABI. One file per group of the header: `status` (status codes, errors, versions),
//! `array` (handles), `device` (devices and memory), then one file per kernel.
//!
//! Every export is thin: it checks its pointers, runs inside [`boundary`] (a panic becomes
//! `MLXK_ERR_PANIC`, an error becomes its status plus this thread's message), and leaves the
//! work to `crate::ops`.

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{Error, Result};

pub mod array;
pub mod device;
pub mod gated_delta;
pub mod gated_rms_norm;
pub mod glm52;
pub mod silu_rms_heads;
pub mod status;

use status::*;

/// An MLX array owned by the caller. Opaque: made by the library (mlxk_array_new,
/// mlxk_array_zeros, mlxk_array_astype and every kernel), released with mlxk_array_free().
/// The value is a registry token, not an address: never dereference it.
pub struct mlxk_array {
    _private: [u8; 0],
}

#[doc(hidden)]
/// Runs `f` as export `function`: catches panics, records the error for mlxk_last_error().
pub fn boundary(function: &str, f: impl FnOnce() -> Result<()>) -> mlxk_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => MLXK_OK,
        Ok(Err(error)) => {
            let status = error.status();
            status::set_last_error(&format!("{function}: {error}"));
            status
        }
        Err(payload) => {
            let detail = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic payload".to_string());
            status::set_last_error(&format!("{function}: internal panic: {detail}"));
            MLXK_ERR_PANIC
        }
    }
}

#[doc(hidden)]
/// Checks an out-parameter before any work is done.
pub fn out_ptr<T>(out: *mut T, arg: &str) -> Result<*mut T> {
    if out.is_null() {
        Err(Error::NullPointer(format!(
            "{arg} is NULL (expected a pointer to write the result to)"
        )))
    } else {
        Ok(out)
    }
}

/// Borrows a caller's buffer of `len` elements, naming it in errors. NULL is allowed when empty.
pub(crate) unsafe fn in_slice<'a, T>(ptr: *const T, len: usize, arg: &str) -> Result<&'a [T]> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(Error::NullPointer(format!(
            "{arg} is NULL but {len} elements were announced"
        )));
    }
    if !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::InvalidArgument(format!(
            "{arg} ({ptr:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    // SAFETY: the caller promises `len` readable elements at `ptr` (documented per function).
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Live handles in this process (tests use it to find leaks).
#[doc(hidden)]
pub fn live_handles() -> usize {
    crate::registry::lock().live()
}
