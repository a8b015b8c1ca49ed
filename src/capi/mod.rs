//! The C ABI. One file per group of the header: `status` (status codes, errors, versions),
//! `array` (handles), `device` (devices and memory), then one file per kernel.
//!
//! Every export is thin: it checks its pointers, runs inside [`boundary`] (a panic becomes
//! `MLXK_ERR_PANIC`, an error becomes its status plus this thread's message), and leaves the
//! work to `crate::ops`.

#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;

use crate::error::{Error, Result};

pub mod array;
pub mod device;
pub mod gated_delta;
pub mod gated_rms_norm;
pub mod glm52;
pub mod mlx;
pub mod silu_rms_heads;
pub mod status;

use status::*;

pub use crate::handle::mlxk_array;

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
            let detail = crate::error::panic_message(&*payload);
            status::set_last_error(&format!("{function}: internal panic: {detail}"));
            MLXK_ERR_PANIC
        }
    }
}

/// An out-parameter of an export (`T *out` in C): checked before any work is done, written
/// once on success. Creating one is where the export's contract ("`out` is NULL or valid for
/// writing one T") is relied on; writing it is then safe.
pub struct Out<T> {
    ptr: NonNull<T>,
}

impl<T> Out<T> {
    /// Takes argument `arg`; NULL gives MLXK_ERR_NULL_POINTER naming it.
    ///
    /// # Safety
    /// `ptr` is NULL or valid for writing one `T` until the export returns.
    #[doc(hidden)]
    pub unsafe fn new(ptr: *mut T, arg: &str) -> Result<Out<T>> {
        NonNull::new(ptr).map(|ptr| Out { ptr }).ok_or_else(|| {
            Error::NullPointer(format!(
                "{arg} is NULL (expected a pointer to write the result to)"
            ))
        })
    }

    /// Whether two out-parameters point to the same place.
    pub fn same_place(&self, other: &Out<T>) -> bool {
        self.ptr == other.ptr
    }

    /// Writes the result (consumes the out-parameter: one write per call).
    pub fn write(self, value: T) {
        // SAFETY: `new`'s contract: valid for writing one T while the export runs.
        unsafe { self.ptr.as_ptr().write_unaligned(value) }
    }
}

/// The out-parameters of an export that returns several handles, taken in order (a NULL one
/// gives MLXK_ERR_NULL_POINTER naming it) and checked to point to distinct places (two at the
/// same place give MLXK_ERR_INVALID_ARGUMENT naming both), before any work.
///
/// # Safety
/// Each of `ptrs` is NULL or valid for writing one handle until the export returns.
pub(crate) unsafe fn distinct_outs<const N: usize>(
    ptrs: [*mut *mut mlxk_array; N],
    names: [&str; N],
) -> Result<[Out<*mut mlxk_array>; N]> {
    let mut outs = Vec::with_capacity(N);
    for (ptr, name) in ptrs.into_iter().zip(names) {
        // SAFETY: the caller's contract on each pointer.
        outs.push(unsafe { Out::new(ptr, name) }?);
    }
    for i in 0..N {
        for j in i + 1..N {
            if outs[i].same_place(&outs[j]) {
                return Err(Error::InvalidArgument(format!(
                    "{} and {} point to the same place ({} handles are returned)",
                    names[i],
                    names[j],
                    match N {
                        2 => "two",
                        3 => "three",
                        8 => "eight",
                        _ => "several",
                    }
                )));
            }
        }
    }
    Ok(outs
        .try_into()
        .unwrap_or_else(|_| unreachable!("one out-parameter per name")))
}

/// Checks a caller's buffer of `len` elements (argument `arg`): NULL is allowed when empty.
fn check_buffer<T>(ptr: *const T, len: usize, arg: &str) -> Result<()> {
    if len != 0 && ptr.is_null() {
        return Err(Error::NullPointer(format!(
            "{arg} is NULL but {len} elements were announced"
        )));
    }
    if len != 0 && !(ptr as usize).is_multiple_of(std::mem::align_of::<T>()) {
        return Err(Error::InvalidArgument(format!(
            "{arg} ({ptr:p}) is not aligned to {} bytes",
            std::mem::align_of::<T>()
        )));
    }
    Ok(())
}

/// Borrows a caller's buffer of `len` elements, naming it in errors. NULL is allowed when empty.
///
/// # Safety
/// `ptr` is NULL or holds `len` readable elements for the rest of the call.
pub(crate) unsafe fn in_slice<'a, T>(ptr: *const T, len: usize, arg: &str) -> Result<&'a [T]> {
    check_buffer(ptr, len, arg)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: checked non-NULL and aligned; the caller promises `len` readable elements.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Borrows a caller's buffer of `len` elements for writing, naming it in errors.
///
/// # Safety
/// `ptr` is NULL or holds `len` writable elements for the rest of the call.
pub(crate) unsafe fn out_slice<'a, T>(ptr: *mut T, len: usize, arg: &str) -> Result<&'a mut [T]> {
    check_buffer(ptr, len, arg)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: checked non-NULL and aligned; the caller promises `len` writable elements.
    Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
}

/// Live handles in this process (tests use it to find leaks).
#[doc(hidden)]
pub fn live_handles() -> usize {
    crate::registry::lock().live()
}
