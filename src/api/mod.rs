//! The safe Rust API: [`Array`] and the kernels as functions and argument structs, on the same
//! validation and graph building (`crate::ops`) as the C ABI, so arguments are checked the
//! same way and errors carry the same messages (without the C function's name in front).

mod array;
mod device;
mod gated_delta;
mod gated_rms_norm;
mod silu_rms_heads;

use std::panic::{catch_unwind, AssertUnwindSafe};

pub use array::{Array, Element};
pub use device::{
    abi_version, default_device, gpu_available, gpu_backend, memory_limit, mlx_build_version,
    mlx_version, set_cache_limit, set_default_device, set_memory_limit, version, Device,
    GpuBackend, MlxLock,
};
pub use gated_delta::pool::{PoolSlots, PoolUpdate};
pub use gated_delta::tree::DraftTrees;
pub use gated_delta::{
    compute_g, GatedDelta, GatedDeltaFromConv, GatedDeltaGrads, StateReplay, Update,
};
pub use gated_rms_norm::{gated_rms_norm, GatedRmsNorm, GatedRmsNormGrads};
pub use silu_rms_heads::{SiluRmsHeads, SiluRmsHeadsGrads, Split};

use crate::error::{Error, Result};

/// Runs one API call: a panic inside the library becomes [`Error::Panic`] (as the C ABI's
/// boundary makes it `MLXK_ERR_PANIC`) instead of unwinding into the caller.
pub(crate) fn call<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(result) => result,
        Err(payload) => Err(Error::Panic(format!(
            "internal panic: {}",
            crate::error::panic_message(&*payload)
        ))),
    }
}

/// Runs `f` under the MLX lock (the registry's, shared with the C ABI). `f` must not drop an
/// [`Array`] (its drop takes the lock): results come out as MLX arrays and are wrapped after.
pub(crate) fn locked<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let _mlx = crate::registry::lock();
    f()
}

/// A value that must fit an `i32` argument of the kernels (head counts, widths, lengths).
pub(crate) fn int_arg(value: usize, arg: &str) -> Result<i32> {
    i32::try_from(value).map_err(|_| {
        Error::InvalidArgument(format!("{arg} is {value}; expected at most {}", i32::MAX))
    })
}
