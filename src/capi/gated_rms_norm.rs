//! `mlxk_gated_rms_norm`: Qwen's RMSNormGated.

use super::status::mlxk_status;
use super::{boundary, distinct_outs, mlxk_array, Out};
use crate::ops::gated_rms_norm::{self as ops, Inputs};
use crate::ops::Backend;
use crate::registry;

/// # Safety
/// `out` is NULL or valid for writing one handle.
pub(crate) unsafe fn norm(
    function: &str,
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
        let result = ops::norm(&inputs, Backend::current())?;
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
    unsafe { norm("mlxk_gated_rms_norm", [x, gate, weight], eps, out) }
}

/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
pub(crate) unsafe fn norm_vjp(
    function: &str,
    arrays: [*const mlxk_array; 3],
    eps: f32,
    dout: *const mlxk_array,
    outs: [*mut *mut mlxk_array; 3],
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `dx`, `dgate` and `dweight`.
        let [dx, dgate, dweight] = unsafe { distinct_outs(outs, ["dx", "dgate", "dweight"]) }?;
        let mut mlx = registry::lock();
        let inputs = Inputs {
            x: mlx.get(arrays[0], "x")?,
            gate: mlx.get(arrays[1], "gate")?,
            weight: mlx.get(arrays[2], "weight")?,
            eps,
        };
        let dout = mlx.get_opt(dout, "dout")?;
        let grads = ops::norm_vjp(&inputs, dout, Backend::current())?;
        for (out, grad) in [dx, dgate, dweight].into_iter().zip(grads) {
            out.write(mlx.insert(grad));
        }
        Ok(())
    })
}

/// The backward pass of mlxk_gated_rms_norm (its vector-Jacobian product), for hosts without
/// automatic differentiation: given the cotangent `dout` of out, the gradients of
/// `sum(dout · out)` with respect to x, gate and weight. Per row, with `n = x · inv`,
/// `inv = rsqrt(mean(x²) + eps)`, `a = silu(gate)`: `dgate = dout · weight · n · silu'(gate)`,
/// `dweight = sum over rows of dout · a · n`, and
/// `dx = inv · (g − n · mean(g · n))` with `g = dout · a · weight`.
///
/// Arguments as mlxk_gated_rms_norm (x [..., D], gate of x's shape, weight [D] in x's dtype,
/// eps; the same checks), plus `dout` of x's shape in any float dtype; NULL is zeros.
/// Results: `*dx` (x's shape and dtype), `*dgate` (the gate's shape and dtype), `*dweight`
/// [D] in x's dtype.
///
/// Numerics: the forward's formula differentiated in exact arithmetic (its roundings are not
/// differentiated), evaluated in float32 with every sum in float64, then rounded to each
/// result's dtype. The results do not depend on the thread count. Device: that is the CPU
/// device's kernel; with the GPU as default device (Metal, MLX CUDA) the gradients come from
/// MLX ops on the GPU stream: mx::vjp of Qwen's RMSNormGated as mlx-lm writes it
/// (mx::fast::rms_norm(x, weight, eps), then silu(f32(gate)) · f32(normed) in x's dtype), the
/// cotangent cast to x's dtype, within a few units of x's (for dgate also the gate's) dtype of
/// the CPU kernel's results. A host's MLX autograd through mlxk_gated_rms_norm reaches the
/// same backward on either device. Ownership: inputs borrowed; three new handles.
/// NULL: `dout` may be NULL; nothing else. Errors: those of mlxk_gated_rms_norm,
/// MLXK_ERR_SHAPE / MLXK_ERR_DTYPE naming `dout`, MLXK_ERR_INVALID_ARGUMENT (two
/// out-parameters at the same place). Thread: any. Lazy: computation errors surface at
/// eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_rms_norm_vjp(
    x: *const mlxk_array,
    gate: *const mlxk_array,
    weight: *const mlxk_array,
    eps: f32,
    dout: *const mlxk_array,
    dx: *mut *mut mlxk_array,
    dgate: *mut *mut mlxk_array,
    dweight: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `dx`, `dgate` and `dweight`.
    unsafe {
        norm_vjp(
            "mlxk_gated_rms_norm_vjp",
            [x, gate, weight],
            eps,
            dout,
            [dx, dgate, dweight],
        )
    }
}
