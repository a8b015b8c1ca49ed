//! `mlxk_silu_rms_heads`: the convolution output split into normalized q, k and activated v.

use super::status::mlxk_status;
use super::{boundary, mlxk_array, Out};
use crate::ops::silu_rms_heads::{self as ops, Inputs};
use crate::ops::Backend;
use crate::registry;

/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn split(
    function: &str,
    backend: Option<Backend>,
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
        let inputs = Inputs {
            x: mlx.get(arrays[0], "x")?,
            q_scale: mlx.get(arrays[1], "q_scale")?,
            k_scale: mlx.get(arrays[2], "k_scale")?,
            key_heads: heads[0],
            value_heads: heads[1],
            value_width: heads[2],
            eps,
        };
        let (qa, ka, va) = ops::split(&inputs, backend.unwrap_or_else(Backend::current))?;
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
            None,
            [x, q_scale, k_scale],
            [key_heads, value_heads, value_width],
            eps,
            [q, k, v],
        )
    }
}
