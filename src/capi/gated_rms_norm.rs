//! `mlxk_gated_rms_norm`: Qwen's RMSNormGated.

use super::status::mlxk_status;
use super::{boundary, mlxk_array, Out};
use crate::ops::gated_rms_norm::{self as ops, Inputs};
use crate::ops::Backend;
use crate::registry;

/// # Safety
/// `out` is NULL or valid for writing one handle.
pub(crate) unsafe fn norm(
    function: &str,
    backend: Option<Backend>,
    arrays: [*const mlxk_array; 3],
    eps: f32,
    out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        let mut mlx = registry::lock();
        let inputs = Inputs {
            x: mlx.get(arrays[0], "x")?,
            gate: mlx.get(arrays[1], "gate")?,
            weight: mlx.get(arrays[2], "weight")?,
            eps,
        };
        let result = ops::norm(&inputs, backend.unwrap_or_else(Backend::current))?;
        out.write(mlx.insert(result));
        Ok(())
    })
}

/// Gated RMSNorm over the last axis (mlx-lm's `Qwen3NextRMSNormGated`):
/// `out = T(silu_f32(gate) · f32(T(weight · T(x · rsqrt(mean(x²) + eps)))))`.
///
/// Arguments: `x [..., D]` (float), `gate` of x's shape (any float dtype), `weight [D]` in x's
/// dtype (MLXK_ERR_DTYPE otherwise: cast mlx-lm's float32 module weight to the model dtype),
/// `eps` finite and >= 0. Any width D >= 1. Result: `*out`, x's shape and dtype.
///
/// Ownership: inputs borrowed; `*out` is a new handle. NULL: none may be NULL. Errors:
/// MLXK_ERR_NULL_POINTER, MLXK_ERR_INVALID_HANDLE, MLXK_ERR_SHAPE, MLXK_ERR_DTYPE,
/// MLXK_ERR_INVALID_ARGUMENT (eps, too many rows for one launch), MLXK_ERR_OUT_OF_MEMORY.
/// Thread: any. Lazy.
#[no_mangle]
pub unsafe extern "C" fn mlxk_gated_rms_norm(
    x: *const mlxk_array,
    gate: *const mlxk_array,
    weight: *const mlxk_array,
    eps: f32,
    out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `out`.
    unsafe { norm("mlxk_gated_rms_norm", None, [x, gate, weight], eps, out) }
}
