//! Exchange with the host's MLX (docs/DESIGN.md §5, "Host arrays"): a handle shares the host's
//! `mlx::core::array` and the host gets new `mlx::core::array`s sharing a handle's; no copy,
//! lazy nodes stay lazy. Only one libmlx may be in the process — the one this library was built
//! against — and every exchange checks that first.

use std::ffi::c_void;

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;

/// Refuses the exchange unless the process has exactly one libmlx loaded and its version is
/// the one this library was built against.
pub fn check_one_mlx() -> Result<()> {
    static VERSIONS: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    let (built, loaded) =
        VERSIONS.get_or_init(|| (bridge::mlx_build_version(), bridge::mlx_version()));
    let same = loaded == built
        || loaded
            .strip_prefix(built.as_str())
            .is_some_and(|rest| rest.starts_with(".dev"));
    if !same {
        return Err(Error::Unsupported(format!(
            "the loaded libmlx is version {loaded}, this library was built against MLX {built}: \
             arrays can only be shared with the MLX this library was built against"
        )));
    }
    // One object per copy (the scan is cached until objects are loaded or unloaded); the
    // paths only for the message.
    if bridge::loaded_mlx_library_count() > 1 {
        let paths = bridge::loaded_mlx_libraries();
        return Err(Error::Unsupported(format!(
            "{} copies of libmlx are loaded (objects defining MLX: {}): each has its own \
             scheduler, allocator and streams, so arrays cannot be shared between them; load one \
             libmlx, the one this library was built against",
            paths.len(),
            paths
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(())
}

/// A new array sharing the host's.
///
/// # Safety
/// `host` is NULL or points to a live `mlx::core::array` (checked: NULL only).
pub unsafe fn from_host(host: *const c_void, arg: &str) -> Result<UniquePtr<Array>> {
    if host.is_null() {
        return Err(Error::NullPointer(format!(
            "{arg} is NULL (expected the address of an mlx::core::array, e.g. an mlx_array's ctx)"
        )));
    }
    check_one_mlx()?;
    // SAFETY: the caller's contract.
    let array = unsafe { bridge::array_from_host(host as usize) }?;
    let code = bridge::array_dtype(&array);
    if Dtype::from_code(code).is_none() {
        return Err(Error::Dtype(format!(
            "{arg}: the array's dtype has no mlxk_dtype (expected bool, uint8, int8, int32, \
             uint32, float16, bfloat16 or float32)"
        )));
    }
    let shape: Vec<i64> = super::array::shape(&array);
    if shape.len() > memory::MAX_NDIM {
        return Err(Error::Shape(format!(
            "{arg}: {} dimensions; at most MLXK_MAX_NDIM ({}) are supported",
            shape.len(),
            memory::MAX_NDIM
        )));
    }
    memory::element_count(&shape, arg)?;
    Ok(array)
}

/// A new heap `mlx::core::array` sharing `array`, which the host owns.
pub fn to_host(array: &Array) -> Result<*mut c_void> {
    check_one_mlx()?;
    Ok(bridge::array_to_host(array)? as *mut c_void)
}

/// Deletes a host array made by `to_host` (or by the host).
///
/// # Safety
/// `host` is a heap `mlx::core::array` nobody uses afterwards.
pub unsafe fn free_host(host: *mut c_void) -> Result<()> {
    // SAFETY: the caller's contract.
    Ok(unsafe { bridge::host_array_free(host as usize) }?)
}
