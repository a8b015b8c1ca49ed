//! Size limits checked before any graph is built: MLX segfaults rather than throws when the
//! OS refuses memory, so requests above the limit never reach it.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// The most dimensions an array may have (the C ABI's MLXK_MAX_NDIM).
pub const MAX_NDIM: usize = 16;

/// The most elements one array may hold: the Metal kernels index with 32-bit integers.
pub const MAX_ELEMENTS: u64 = i32::MAX as u64;

static LIMIT: AtomicUsize = AtomicUsize::new(0);

pub fn physical_memory() -> usize {
    // Read once: glibc answers _SC_PHYS_PAGES with a sysinfo(2) call, and every kernel call
    // checks its outputs against the limit.
    static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BYTES.get_or_init(read_physical_memory)
}

fn read_physical_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    if pages > 0 && page > 0 {
        (pages as usize).saturating_mul(page as usize)
    } else {
        usize::MAX
    }
}

/// The current limit on the bytes one request may produce (default: physical memory).
pub fn limit() -> usize {
    match LIMIT.load(Ordering::Relaxed) {
        0 => physical_memory(),
        n => n,
    }
}

/// Sets the limit; 0 restores the default. Returns the previous limit.
pub fn set_limit(bytes: usize) -> usize {
    let previous = limit();
    LIMIT.store(bytes, Ordering::Relaxed);
    previous
}

/// Element count of `shape`, refusing negative dims and counts above [`MAX_ELEMENTS`].
pub fn element_count(shape: &[i64], arg: &str) -> Result<u64> {
    let mut count: u64 = 1;
    for (axis, &dim) in shape.iter().enumerate() {
        if dim < 0 {
            return Err(Error::Shape(format!(
                "{arg}: dimension {axis} is {dim}; dimensions must be >= 0"
            )));
        }
        count = count.checked_mul(dim as u64).unwrap_or(u64::MAX);
    }
    if count > MAX_ELEMENTS {
        return Err(Error::InvalidArgument(format!(
            "{arg}: shape {shape:?} has {count} elements (saturated if it overflowed); at most \
             2^31-1 elements are supported"
        )));
    }
    Ok(count)
}

/// Checks that arrays of these shapes and dtypes fit the limits, before anything is built.
pub fn check_outputs(outputs: &[(&str, &[i64], Dtype)]) -> Result<()> {
    let mut total: u64 = 0;
    for (arg, shape, dtype) in outputs {
        let count = element_count(shape, arg)?;
        total = total.saturating_add(count * dtype.size() as u64);
    }
    let limit = limit() as u64;
    if total > limit {
        let names: Vec<&str> = outputs.iter().map(|o| o.0).collect();
        return Err(Error::OutOfMemory(format!(
            "{}: the result needs {total} bytes, above the memory limit of {limit} bytes \
             (mlxk_set_memory_limit)",
            names.join(", ")
        )));
    }
    Ok(())
}

/// Checks a working-set estimate (`bytes`, saturated) against the limit, naming `what`.
pub fn check_bytes(what: &str, bytes: u64) -> Result<()> {
    let limit = limit() as u64;
    if bytes > limit {
        return Err(Error::OutOfMemory(format!(
            "{what} needs about {bytes} bytes, above the memory limit of {limit} bytes \
             (mlxk_set_memory_limit)"
        )));
    }
    Ok(())
}
