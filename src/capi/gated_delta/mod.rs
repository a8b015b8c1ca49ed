//! The gated-delta recurrence and its gate: `mlxk_compute_g`, `mlxk_gated_delta_update` (and its
//! chunked form), `mlxk_gated_delta_state`.

pub mod pool;

use super::status::mlxk_status;
use super::{boundary, distinct_outs, mlxk_array, Out};
use crate::node::gated_delta::ChunkSize;
use crate::ops::gated_delta::{self as ops, FromConvInputs, Inputs, StateInputs};
use crate::ops::Backend;
use crate::registry::{self, Mlx};

/// g = exp(-exp(float32(a_log)) * softplus(a + dt_bias)), mlx-lm's `compute_g`, bit for bit on
/// the same device. `a + dt_bias` and softplus run in the promoted dtype of a and dt_bias
/// (bfloat16 for bfloat16 inputs), rounding after every step as MLX does:
/// `softplus(x) = T(max(x, 0) + T(log1p(T(exp(T(min(x, 0) - max(x, 0)))))))`; the product and
/// the outer exp are float32. g is float32 with a's shape.
///
/// Shapes: a_log [Hv] (float32 or bfloat16), a [..., Hv] (float), dt_bias [Hv] (float).
/// Ownership: inputs borrowed; `*g` is a new handle. NULL: none may be NULL.
/// Errors: MLXK_ERR_NULL_POINTER, MLXK_ERR_SHAPE, MLXK_ERR_DTYPE, MLXK_ERR_INVALID_HANDLE,
/// MLXK_ERR_INVALID_ARGUMENT (more than 2^31-1 elements), MLXK_ERR_OUT_OF_MEMORY.
/// Thread: any. Lazy: computation errors surface at eval/read.
#[no_mangle]
pub unsafe extern "C" fn mlxk_compute_g(
    a_log: *const mlxk_array,
    a: *const mlxk_array,
    dt_bias: *const mlxk_array,
    g: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary("mlxk_compute_g", || {
        // SAFETY: the documented contract on `g`.
        let g = unsafe { Out::new(g, "g") }?;
        let mut mlx = registry::lock();
        let result = ops::compute_g(
            mlx.get(a_log, "a_log")?,
            mlx.get(a, "a")?,
            mlx.get(dt_bias, "dt_bias")?,
        )?;
        g.write(mlx.insert(result));
        Ok(())
    })
}

/// The update's arrays, looked up in the registry (`state` and `mask` may be NULL).
pub(crate) fn update_inputs(
    mlx: &Mlx,
    args: [*const mlxk_array; 9],
) -> crate::error::Result<Inputs<'_>> {
    let [q, k, v, a, b, a_log, dt_bias, state, mask] = args;
    Ok(Inputs {
        q: mlx.get(q, "q")?,
        k: mlx.get(k, "k")?,
        v: mlx.get(v, "v")?,
        a: mlx.get(a, "a")?,
        b: mlx.get(b, "b")?,
        a_log: mlx.get(a_log, "a_log")?,
        dt_bias: mlx.get(dt_bias, "dt_bias")?,
        state: mlx.get_opt(state, "state")?,
        mask: mlx.get_opt(mask, "mask")?,
    })
}

/// Which form of the update a call builds.
#[derive(Clone, Copy)]
pub(crate) enum Form {
    Exact,
    /// The chunked form with the C call's chunk size (checked here: `ChunkSize::from_c`).
    Chunked(i32),
}

/// # Safety
/// `y` and `state_out` are NULL or valid for writing one handle each.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn update(
    function: &str,
    form: Form,
    args: [*const mlxk_array; 9],
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `y` and `state_out`.
        let [y, state_out] = unsafe { distinct_outs([y, state_out], ["y", "state_out"]) }?;
        let mut mlx = registry::lock();
        let inputs = update_inputs(&mlx, args)?;
        let (y_array, state_array) = match form {
            Form::Exact => ops::update(&inputs, Backend::current())?,
            Form::Chunked(chunk) => {
                let chunk = ChunkSize::from_c(chunk)?;
                ops::update_chunked(&inputs, chunk, Backend::current())?
            }
        };
        y.write(mlx.insert(y_array));
        state_out.write(mlx.insert(state_array));
        Ok(())
    })
}

/// One Gated DeltaNet call (mlx-lm's `gated_delta_update` with the Metal kernel's arithmetic):
/// for each token, beta = sigmoid(b), g = mlxk_compute_g(a_log, a, dt_bias), and per value
/// head h (reading key head h / (Hv/Hk)) and row dv, in float32:
/// `s *= g; kv = sum(s*k); delta = (v - kv)*beta; s += k*delta; y = sum(s*q)`. As on Apple
/// GPUs, float32 subnormals count as zero in this arithmetic and subnormal results become zero.
///
/// Shapes: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv]; a, b [B, T, Hv]; a_log [Hv] (float32 or
/// bfloat16); dt_bias [Hv]; state [B, Hv, Dv, Dk] float32 or NULL (zeros); mask [B, T] bool
/// or NULL (all tokens real). Dk is a multiple of 32 in [32, 256]; Hv a multiple of Hk.
/// q, k, v share one float dtype; a, b, dt_bias are any float dtype. Callers pass q and k
/// already normalized (mlx-lm `normalize_qk`); no scale is applied here.
/// Results: `*y` [B, T, Hv, Dv] in q's dtype (0 at masked tokens); `*state_out` float32
/// [B, Hv, Dv, Dk] (a masked token leaves the state untouched).
///
/// Ownership: inputs borrowed; `*y` and `*state_out` are new handles the caller frees.
/// Decode loop: free the old state handle before evaluating the new one and the CPU kernel
/// writes the new state into the old buffer. NULL: `state` and `mask` may be NULL; nothing
/// else. Errors: MLXK_ERR_NULL_POINTER, MLXK_ERR_SHAPE, MLXK_ERR_DTYPE,
/// MLXK_ERR_INVALID_HANDLE, MLXK_ERR_INVALID_ARGUMENT (`y == state_out`, a result above 2^31-1
/// elements), MLXK_ERR_OUT_OF_MEMORY. Thread: any. Lazy: computation errors surface at
/// eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    state: *const mlxk_array,
    mask: *const mlxk_array,
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `y` and `state_out`.
    unsafe {
        update(
            "mlxk_gated_delta_update",
            Form::Exact,
            [q, k, v, a, b, a_log, dt_bias, state, mask],
            y,
            state_out,
        )
    }
}

/// # Safety
/// `y` and `state_out` are NULL or valid for writing one handle each.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn update_from_conv(
    function: &str,
    arrays: [*const mlxk_array; 9],
    heads: [i32; 3],
    eps: f32,
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `y` and `state_out`.
        let [y, state_out] = unsafe { distinct_outs([y, state_out], ["y", "state_out"]) }?;
        let mut mlx = registry::lock();
        let [x, q_scale, k_scale, a, b, a_log, dt_bias, state, mask] = arrays;
        let inputs = FromConvInputs {
            split: super::silu_rms_heads::inputs(&mlx, [x, q_scale, k_scale], heads, eps)?,
            a: mlx.get(a, "a")?,
            b: mlx.get(b, "b")?,
            a_log: mlx.get(a_log, "a_log")?,
            dt_bias: mlx.get(dt_bias, "dt_bias")?,
            state: mlx.get_opt(state, "state")?,
            mask: mlx.get_opt(mask, "mask")?,
        };
        let (y_array, state_array) = ops::update_from_conv(&inputs, Backend::current())?;
        y.write(mlx.insert(y_array));
        state_out.write(mlx.insert(state_array));
        Ok(())
    })
}

/// The head split and the update of one Gated DeltaNet layer in one call: exactly
/// mlxk_silu_rms_heads(x, q_scale, k_scale, key_heads, value_heads, value_width, eps) followed
/// by mlxk_gated_delta_update(q, k, v, a, b, a_log, dt_bias, state, mask), bit for bit on
/// every device, without q, k and v as results. On a GPU it runs as one kernel node instead of
/// two where that was measured faster (its q, k and v are computed where the recurrence reads
/// them; a decode step pays per node): on MLX CUDA for 1 to 8 tokens and at most 32 (batch,
/// token) pairs (decode up to B = 32, verify windows), on Metal for one token. Otherwise, and
/// on the CPU, it runs the two kernels.
///
/// Shapes: x [B, T, 2·Hk·Dk + Hv·Dv] (the depthwise convolution's output, channels q | k | v,
/// before the SiLU), `q_scale`, `k_scale` [Dk] in x's dtype; a, b [B, T, Hv]; a_log [Hv]
/// (float32 or bfloat16); dt_bias [Hv]; state [B, Hv, Dv, Dk] float32 or NULL (zeros); mask
/// [B, T] bool or NULL. `key_heads` Hk, `value_heads` Hv (a multiple of Hk), `value_width` Dv
/// in [1, 128]; Dk a multiple of 32 in [32, 128]; `eps` finite and >= 0. Results as
/// mlxk_gated_delta_update's: `*y` [B, T, Hv, Dv] in x's dtype, `*state_out` float32.
///
/// Gradients: MLX's autograd differentiates it on every device (on a GPU through the two parts'
/// backward passes). Ownership: inputs borrowed; `*y` and `*state_out` are new handles the
/// caller frees (the decode loop's in-place state as mlxk_gated_delta_update). NULL: `state`
/// and `mask` may be NULL; nothing else. Errors: those of mlxk_silu_rms_heads and
/// mlxk_gated_delta_update, naming this call's arguments (MLXK_ERR_INVALID_ARGUMENT for
/// `value_heads` not a multiple of `key_heads`, MLXK_ERR_SHAPE for a Dk the update does not
/// take). Thread: any. Lazy: computation errors surface at eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_from_conv(
    x: *const mlxk_array,
    q_scale: *const mlxk_array,
    k_scale: *const mlxk_array,
    key_heads: i32,
    value_heads: i32,
    value_width: i32,
    eps: f32,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    state: *const mlxk_array,
    mask: *const mlxk_array,
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `y` and `state_out`.
    unsafe {
        update_from_conv(
            "mlxk_gated_delta_update_from_conv",
            [x, q_scale, k_scale, a, b, a_log, dt_bias, state, mask],
            [key_heads, value_heads, value_width],
            eps,
            y,
            state_out,
        )
    }
}

/// The same update as mlxk_gated_delta_update computed in chunked (WY / UT-transform) form: an
/// explicit, faster prefill option for the CPU. Tokens are taken `chunk_size` at a time and
/// each chunk's recurrence is solved with matrix products, so the arithmetic (and its rounding)
/// differs from the recurrence's: results equal mlxk_gated_delta_update's up to float32
/// rounding, not bit for bit. Measured against a float64 recurrence at Qwen3.5 dims
/// (Dk = Dv = 128, T up to 4096, gates g in (0.3, 1) to (0.999, 1)): y within 8.4e-7 and the
/// state within 4.5e-7 of their largest magnitude, not growing with T (the exact kernel:
/// 6.5e-7 / 1.2e-6 on the same cases). A NaN or infinity in an input makes the same outputs
/// non-finite as in mlxk_gated_delta_update (its rows, from its token on; never an earlier
/// token). The kernel runs with subnormals flushed to zero (FTZ/DAZ on its threads, the
/// caller's floating-point mode restored after), so its speed does not depend on the mode the
/// host leaves set; values below 2^-126 in magnitude count as zero. Use it for long prefills;
/// decode (T = 1) and speculative
/// verification, whose results must match other calls bit for bit, use
/// mlxk_gated_delta_update.
///
/// Arguments, shapes, dtypes, masks, state reuse and results as mlxk_gated_delta_update.
/// `chunk_size`: 0 for the default (32), or a multiple of 16 in [16, 128]. Without a mask, a
/// prefill split into calls at multiples of the chunk size (each passing on the state) gives
/// the same bits as one call.
///
/// Device: the CPU kernel, or with the GPU as the default device three GPU kernels (the work
/// within each chunk; the walk over the chunks, which keeps the state entering each; y from
/// those states, every chunk in parallel; Metal, and MLX CUDA on the same text), which run
/// chunks of at most 64 tokens (a chunk_size of 128 runs as 64) and give results
/// within the same bounds; MLX's autograd through them gives mlxk_gated_delta_update's GPU
/// gradients.
/// Ownership, NULL: as mlxk_gated_delta_update. Errors: those of mlxk_gated_delta_update,
/// MLXK_ERR_INVALID_ARGUMENT (chunk_size).
/// Thread: any. Lazy: computation errors surface at eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_chunked(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    state: *const mlxk_array,
    mask: *const mlxk_array,
    chunk_size: i32,
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `y` and `state_out`.
    unsafe {
        update(
            "mlxk_gated_delta_update_chunked",
            Form::Chunked(chunk_size),
            [q, k, v, a, b, a_log, dt_bias, state, mask],
            y,
            state_out,
        )
    }
}

/// The backward pass of mlxk_gated_delta_update (its vector-Jacobian product), for hosts without
/// automatic differentiation: given the cotangents `dy` of y and `dstate_out` of state_out, the
/// gradients of `sum(dy · y) + sum(dstate_out · state_out)` with respect to q, k, v, a, b,
/// a_log, dt_bias and the initial state. The gates' chain is differentiated analytically:
/// `dg/da = dg/ddt_bias = -exp(a_log) · sigmoid(a + dt_bias) · g`,
/// `dg/da_log = -exp(a_log) · softplus(a + dt_bias) · g`, `dbeta/db = beta · (1 - beta)`.
///
/// Arguments as mlxk_gated_delta_update (same shapes, dtypes, mask, GQA), plus `dy`
/// [B, T, Hv, Dv] (any float dtype) and `dstate_out` [B, Hv, Dv, Dk] float32; NULL cotangents
/// are zeros, and a NULL state is the zero state (its gradient is still returned).
/// Results: `*dq`, `*dk` [B, T, Hk, Dk] and `*dv` [B, T, Hv, Dv] in q's dtype; `*da`, `*db` in
/// a's and b's dtypes and shapes; `*da_log`, `*ddt_bias` [Hv] in theirs; `*dstate` float32
/// [B, Hv, Dv, Dk]. A masked token gets zero gradients and passes the state's gradient through;
/// a key head's gradients sum over the value heads that read it.
///
/// Numerics (CPU device): float32 arithmetic in a sequential order (not the forward's
/// bit-exact order), the forward recomputed from states kept every 64 tokens, so memory grows
/// as O((T/64 + 64) · state) per worker, never O(T · state).
/// Device: with the GPU as default device (Metal, MLX CUDA) the same gradients come from the GPU
/// backward kernel (the same checkpointed reverse sweep, kept states every ceil(sqrt(T)) tokens,
/// at most 64) with the gates' chain as MLX ops. They differ from the CPU device's only in
/// summation order (a few units of roundoff of the gradient's scale); the kernel's partial
/// sums take 2 · B · T · Hv · ceil(Dv / 16) · (Dk + 1) float32 values. Same shapes and dtypes
/// either way. A host's MLX autograd through mlxk_gated_delta_update reaches the same
/// backward on either device.
/// Ownership: inputs borrowed; eight new handles.
/// NULL: `state`, `mask`, `dy`, `dstate_out` may be NULL; nothing else. Errors: those of
/// mlxk_gated_delta_update, MLXK_ERR_SHAPE / MLXK_ERR_DTYPE naming `dy` or `dstate_out`,
/// MLXK_ERR_INVALID_ARGUMENT (two out-parameters at the same place).
/// Thread: any. Lazy: computation errors surface at eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_vjp(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    state: *const mlxk_array,
    mask: *const mlxk_array,
    dy: *const mlxk_array,
    dstate_out: *const mlxk_array,
    dq: *mut *mut mlxk_array,
    dk: *mut *mut mlxk_array,
    dv: *mut *mut mlxk_array,
    da: *mut *mut mlxk_array,
    db: *mut *mut mlxk_array,
    da_log: *mut *mut mlxk_array,
    ddt_bias: *mut *mut mlxk_array,
    dstate: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on the out-parameters.
    unsafe {
        update_vjp(
            "mlxk_gated_delta_update_vjp",
            [q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out],
            [dq, dk, dv, da, db, da_log, ddt_bias, dstate],
        )
    }
}

/// The backward pass of mlxk_gated_delta_update_chunked (its vector-Jacobian product): the
/// gradients of `sum(dy · y) + sum(dstate_out · state_out)` for the chunked form, computed
/// chunk by chunk through the chunked form's own products (the WY/UT form's backward: the
/// states entering the chunks kept by a forward sweep, then a reverse sweep over the chunks
/// that recomputes each chunk's quantities and carries the state's gradient back): at
/// Qwen3.5-35B-A3B dims (one thread, T = 512 to 4096) 2.3–2.5× faster than
/// mlxk_gated_delta_update_vjp's token-by-token sweep.
///
/// Arguments, shapes, dtypes, NULL cotangents, masks, GQA and results as
/// mlxk_gated_delta_update_vjp; `chunk_size` as in mlxk_gated_delta_update_chunked (0 for the
/// default, 32, or a multiple of 16 in [16, 128]).
///
/// Numerics (CPU device): float32 products in the chunked form's order; the gradients equal
/// mlxk_gated_delta_update_vjp's up to float32 rounding (float32 inputs at Dk = Dv = 128,
/// T = 512 and 4096: within 9e-7 of each gradient's largest magnitude, not growing with T;
/// see docs/DESIGN.md §4). The gates enter as running products and the gradient of log g is
/// formed without dividing by a gate, so gates that underflow to 0 give finite gradients.
/// Memory per worker: the state entering each chunk and the chunk's delta-rule residuals,
/// O((T/C + C) · state), never O(T · state).
/// Device: with the GPU as default device (Metal, MLX CUDA) it runs the chunked GPU backward
/// (kernels/metal/gated_delta_chunked_backward.metal: five kernels, chunks of 32 tokens, or 16
/// where chunk_size is 16), equal to mlxk_gated_delta_update_vjp's GPU gradients up to float32
/// rounding. A host's MLX autograd through mlxk_gated_delta_update_chunked reaches the same
/// backward on either device.
/// Ownership: inputs borrowed; eight new handles.
/// NULL: `state`, `mask`, `dy`, `dstate_out` may be NULL; nothing else. Errors: those of
/// mlxk_gated_delta_update_vjp, MLXK_ERR_INVALID_ARGUMENT (chunk_size).
/// Thread: any. Lazy: computation errors surface at eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_chunked_vjp(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    state: *const mlxk_array,
    mask: *const mlxk_array,
    chunk_size: i32,
    dy: *const mlxk_array,
    dstate_out: *const mlxk_array,
    dq: *mut *mut mlxk_array,
    dk: *mut *mut mlxk_array,
    dv: *mut *mut mlxk_array,
    da: *mut *mut mlxk_array,
    db: *mut *mut mlxk_array,
    da_log: *mut *mut mlxk_array,
    ddt_bias: *mut *mut mlxk_array,
    dstate: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on the out-parameters.
    unsafe {
        update_vjp_form(
            "mlxk_gated_delta_update_chunked_vjp",
            Some(chunk_size),
            [q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out],
            [dq, dk, dv, da, db, da_log, ddt_bias, dstate],
        )
    }
}

/// `mlxk_gated_delta_update_vjp` on `backend` (None: the default device's).
///
/// # Safety
/// Each of `ptrs` is NULL or valid for writing one handle.
pub(crate) unsafe fn update_vjp(
    function: &str,
    args: [*const mlxk_array; 11],
    ptrs: [*mut *mut mlxk_array; 8],
) -> mlxk_status {
    // SAFETY: forwarded contract on `ptrs`.
    unsafe { update_vjp_form(function, None, args, ptrs) }
}

/// `update_vjp` of the exact form (`chunk` None) or of the chunked form with that chunk size
/// (`mlxk_gated_delta_update_chunked_vjp`).
///
/// # Safety
/// Each of `ptrs` is NULL or valid for writing one handle.
pub(crate) unsafe fn update_vjp_form(
    function: &str,
    chunk: Option<i32>,
    args: [*const mlxk_array; 11],
    ptrs: [*mut *mut mlxk_array; 8],
) -> mlxk_status {
    let [q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out] = args;
    boundary(function, || {
        let names = ["dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"];
        // SAFETY: the documented contract on each out-parameter.
        let outs = unsafe { distinct_outs(ptrs, names) }?;
        let mut mlx = registry::lock();
        let inputs = update_inputs(&mlx, [q, k, v, a, b, a_log, dt_bias, state, mask])?;
        let dy = mlx.get_opt(dy, "dy")?;
        let dstate_out = mlx.get_opt(dstate_out, "dstate_out")?;
        let backend = Backend::current();
        let grads = match chunk {
            None => ops::update_vjp(&inputs, dy, dstate_out, backend)?,
            Some(c) => {
                let chunk = ChunkSize::from_c(c)?;
                ops::update_chunked_vjp(&inputs, chunk, dy, dstate_out, backend)?
            }
        };
        for (out, grad) in outs.into_iter().zip(grads) {
            out.write(mlx.insert(grad));
        }
        Ok(())
    })
}

/// # Safety
/// `accepted_lengths` is NULL or holds `n_lengths` readable int32 values; `state_out` is NULL or
/// valid for writing one handle.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn build_state(
    function: &str,
    args: [*const mlxk_array; 7],
    accepted_lengths: *const i32,
    n_lengths: usize,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `state_out`.
        let state_out = unsafe { Out::new(state_out, "state_out") }?;
        // SAFETY: documented contract: `n_lengths` int32 values at `accepted_lengths`.
        let lengths = unsafe { super::in_slice(accepted_lengths, n_lengths, "accepted_lengths") }?;
        let mut mlx = registry::lock();
        let [k, v, a, b, a_log, dt_bias, state] = args;
        let inputs = StateInputs {
            k: mlx.get(k, "k")?,
            v: mlx.get(v, "v")?,
            a: mlx.get(a, "a")?,
            b: mlx.get(b, "b")?,
            a_log: mlx.get(a_log, "a_log")?,
            dt_bias: mlx.get(dt_bias, "dt_bias")?,
            state: mlx.get_opt(state, "state")?,
            accepted_lengths: lengths,
        };
        let result = ops::state(&inputs, Backend::current())?;
        state_out.write(mlx.insert(result));
        Ok(())
    })
}

/// Prefix-state replay for speculative decoding: after a verify window of T draft tokens in
/// which row b accepted `accepted_lengths[b]` of them, recomputes each row's state from the
/// pre-verify `state` over exactly that prefix. The result is bit-identical to the state
/// mlxk_gated_delta_update returns for those first tokens from the same start state.
///
/// Shapes and dtypes as mlxk_gated_delta_update (without q and mask): k [B, T, Hk, Dk],
/// v [B, T, Hv, Dv], a, b [B, T, Hv], a_log [Hv], dt_bias [Hv], state [B, Hv, Dv, Dk] float32
/// or NULL (zeros). `accepted_lengths` holds `n_lengths` values: n_lengths must equal B and
/// each length lie in [0, T] (MLXK_ERR_INVALID_ARGUMENT naming the row otherwise).
/// Result: `*state_out` float32 [B, Hv, Dv, Dk].
///
/// Ownership: inputs borrowed (`accepted_lengths` only for the call; int32-aligned);
/// `*state_out` is a new handle. NULL: `state` may be NULL; `accepted_lengths` only when
/// n_lengths is 0. Errors: MLXK_ERR_NULL_POINTER, MLXK_ERR_SHAPE, MLXK_ERR_DTYPE,
/// MLXK_ERR_INVALID_HANDLE, MLXK_ERR_INVALID_ARGUMENT (lengths, a misaligned
/// `accepted_lengths`), MLXK_ERR_OUT_OF_MEMORY. Thread: any. Lazy: computation errors surface
/// at eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_state(
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    state: *const mlxk_array,
    accepted_lengths: *const i32,
    n_lengths: usize,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `accepted_lengths` and `state_out`.
    unsafe {
        build_state(
            "mlxk_gated_delta_state",
            [k, v, a, b, a_log, dt_bias, state],
            accepted_lengths,
            n_lengths,
            state_out,
        )
    }
}
