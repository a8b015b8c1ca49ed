//! `mlxk_silu_rms_heads`: the convolution output split into normalized q, k and activated v.

use super::status::mlxk_status;
use super::{boundary, distinct_outs, mlxk_array, Out};
use crate::ops::silu_rms_heads::{self as ops, Inputs};
use crate::ops::Backend;
use crate::registry::{self, Mlx};

/// The head split's arguments, its arrays looked up in the registry: x, q_scale, k_scale, then
/// key_heads, value_heads, value_width, and eps.
pub(crate) fn inputs<'a>(
    mlx: &'a Mlx,
    arrays: [*const mlxk_array; 3],
    heads: [i32; 3],
    eps: f32,
) -> crate::error::Result<Inputs<'a>> {
    Ok(Inputs {
        x: mlx.get(arrays[0], "x")?,
        q_scale: mlx.get(arrays[1], "q_scale")?,
        k_scale: mlx.get(arrays[2], "k_scale")?,
        key_heads: heads[0],
        value_heads: heads[1],
        value_width: heads[2],
        eps,
    })
}

/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn split(
    function: &str,
    arrays: [*const mlxk_array; 3],
    heads: [i32; 3],
    eps: f32,
    outs: [*mut *mut mlxk_array; 3],
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `q`, `k` and `v`.
        let (q, k, v) = unsafe {
            (
                Out::new(outs[0], "q")?,
                Out::new(outs[1], "k")?,
                Out::new(outs[2], "v")?,
            )
        };
        if q.same_place(&k) || k.same_place(&v) || q.same_place(&v) {
            return Err(crate::Error::InvalidArgument(
                "q, k and v must point to three different places".into(),
            ));
        }
        let mut mlx = registry::lock();
        let inputs = inputs(&mlx, arrays, heads, eps)?;
        let (qa, ka, va) = ops::split(&inputs, Backend::current())?;
        q.write(mlx.insert(qa));
        k.write(mlx.insert(ka));
        v.write(mlx.insert(va));
        Ok(())
    })
}

/// The Qwen3.5 head split of the depthwise convolution's output `x [B, S, 2·Hk·Dk + Hv·Dv]`
/// (channels q | k | v, before the SiLU): SiLU on every channel with MLX's rounding points,
/// then q and k RMS-normalized per head and scaled, v activated only:
/// `q = q_scale · T(silu · rsqrt(mean(silu²) + eps))`, likewise k with `k_scale`.
///
/// Arguments: `q_scale`, `k_scale` [Dk] in x's dtype (mlx-lm: Dk^-1 and Dk^-1/2, rounded to
/// the dtype), `key_heads` Hk, `value_heads` Hv, `value_width` Dv; Dk and Dv in [1, 128];
/// `eps` finite and >= 0 (mlx-lm 0.32.2: 1e-6 / Dk). Results: `*q`, `*k` [B, S, Hk, Dk] and
/// `*v` [B, S, Hv, Dv], contiguous, in x's dtype.
///
/// Ownership: inputs borrowed; three new handles. NULL: none may be NULL. Errors:
/// MLXK_ERR_NULL_POINTER, MLXK_ERR_INVALID_HANDLE, MLXK_ERR_SHAPE (ranks, channel count, Dk),
/// MLXK_ERR_DTYPE (scale dtype differs from x), MLXK_ERR_INVALID_ARGUMENT (head counts,
/// value_width, eps, the same out-pointer twice), MLXK_ERR_OUT_OF_MEMORY. Thread: any. Lazy.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_silu_rms_heads(
    x: *const mlxk_array,
    q_scale: *const mlxk_array,
    k_scale: *const mlxk_array,
    key_heads: i32,
    value_heads: i32,
    value_width: i32,
    eps: f32,
    q: *mut *mut mlxk_array,
    k: *mut *mut mlxk_array,
    v: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `q`, `k` and `v`.
    unsafe {
        split(
            "mlxk_silu_rms_heads",
            [x, q_scale, k_scale],
            [key_heads, value_heads, value_width],
            eps,
            [q, k, v],
        )
    }
}

/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn split_vjp(
    function: &str,
    arrays: [*const mlxk_array; 3],
    heads: [i32; 3],
    eps: f32,
    cotangents: [*const mlxk_array; 3],
    outs: [*mut *mut mlxk_array; 3],
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `dx`, `dq_scale` and `dk_scale`.
        let [dx, dqs, dks] = unsafe { distinct_outs(outs, ["dx", "dq_scale", "dk_scale"]) }?;
        let mut mlx = registry::lock();
        let inputs = inputs(&mlx, arrays, heads, eps)?;
        let cotangents = [
            mlx.get_opt(cotangents[0], "dq")?,
            mlx.get_opt(cotangents[1], "dk")?,
            mlx.get_opt(cotangents[2], "dv")?,
        ];
        let grads = ops::split_vjp(&inputs, cotangents, Backend::current())?;
        for (out, grad) in [dx, dqs, dks].into_iter().zip(grads) {
            out.write(mlx.insert(grad));
        }
        Ok(())
    })
}

/// The backward pass of mlxk_silu_rms_heads (its vector-Jacobian product), for hosts without
/// automatic differentiation: given the cotangents `dq`, `dk`, `dv` of q, k and v, the
/// gradients of `sum(dq · q) + sum(dk · k) + sum(dv · v)` with respect to x, q_scale and
/// k_scale. With `s = silu(x)` per head, `n = s · inv`, `inv = rsqrt(mean(s²) + eps)`:
/// `dq_scale = sum over rows and q heads of dq · n` (k_scale likewise),
/// `dx = inv · (g − n · mean(g · n)) · silu'(x)` with `g = dq · q_scale` on q heads (k heads
/// likewise), and `dx = dv · silu'(x)` on v heads.
///
/// Arguments as mlxk_silu_rms_heads (x, q_scale, k_scale, key_heads, value_heads,
/// value_width, eps; the same checks), plus `dq`, `dk` [B, S, Hk, Dk] and `dv` [B, S, Hv, Dv]
/// in any float dtype; a NULL cotangent is zeros. Results: `*dx` with x's shape,
/// `*dq_scale` and `*dk_scale` [Dk], all in x's dtype.
///
/// Numerics: the forward's formula differentiated in exact arithmetic (its roundings to x's
/// dtype are not differentiated), evaluated in float32 with every sum in float64, then rounded
/// to x's dtype. The results do not depend on the thread count. Device: that is the CPU
/// device's kernel; with the GPU as default device (Metal, MLX CUDA) the gradients come from
/// MLX ops on the GPU stream: mx::vjp of mlx-lm's formulation (SiLU, the split into heads,
/// mx::fast::rms_norm with the scales as weights), in x's dtype (the cotangents cast to it),
/// within a few units of x's dtype of the CPU kernel's results. A host's MLX autograd through
/// mlxk_silu_rms_heads reaches the same backward on either device. Ownership: inputs borrowed; three new handles. NULL: `dq`, `dk`, `dv` may be NULL; nothing else. Errors: those of
/// mlxk_silu_rms_heads, MLXK_ERR_SHAPE / MLXK_ERR_DTYPE naming `dq`, `dk` or `dv`,
/// MLXK_ERR_INVALID_ARGUMENT (two out-parameters at the same place). Thread: any. Lazy:
/// computation errors surface at eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_silu_rms_heads_vjp(
    x: *const mlxk_array,
    q_scale: *const mlxk_array,
    k_scale: *const mlxk_array,
    key_heads: i32,
    value_heads: i32,
    value_width: i32,
    eps: f32,
    dq: *const mlxk_array,
    dk: *const mlxk_array,
    dv: *const mlxk_array,
    dx: *mut *mut mlxk_array,
    dq_scale: *mut *mut mlxk_array,
    dk_scale: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `dx`, `dq_scale` and `dk_scale`.
    unsafe {
        split_vjp(
            "mlxk_silu_rms_heads_vjp",
            [x, q_scale, k_scale],
            [key_heads, value_heads, value_width],
            eps,
            [dq, dk, dv],
            [dx, dq_scale, dk_scale],
        )
    }
}
