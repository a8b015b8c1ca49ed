//! The engine-shaped calls: the update, its chunked form, the speculative verify, the replay and
//! the update from the convolution's output on a pool of states addressed by slot, and packed
//! variable-length prefill (docs/DESIGN.md §4 "Pools and packing").

use crate::capi::status::mlxk_status;
use crate::capi::{boundary, distinct_outs, in_slice, mlxk_array, Out};
use crate::error::{Error, Result};
use crate::node::gated_delta::ChunkSize;
use crate::ops::gated_delta::{
    self as ops, FromConvInputs, Inputs, Layout, PoolForm, Slots, StateInputs,
};
use crate::ops::Backend;
use crate::registry::{self, Mlx};

/// The caller's host integers of a pool call: slots, fresh flags (NULL: none) and, when
/// packed, the sequence offsets.
#[derive(Clone, Copy)]
pub(crate) struct HostRows {
    pub(crate) slots: *const i32,
    pub(crate) fresh: *const u8,
    pub(crate) n_slots: usize,
}

/// The largest count of slots or offsets a call takes.
const MAX_ROWS: usize = i32::MAX as usize;

/// Borrows a host array of `n` values, refusing counts past `MAX_ROWS` before any read.
///
/// # Safety
/// `ptr` is NULL or holds `n` readable values.
pub(super) unsafe fn host<'a, T>(
    ptr: *const T,
    n: usize,
    arg: &str,
    count: &str,
) -> Result<&'a [T]> {
    if n > MAX_ROWS {
        return Err(Error::InvalidArgument(format!(
            "{count} is {n}; expected at most {MAX_ROWS}"
        )));
    }
    // SAFETY: the caller's contract.
    unsafe { in_slice(ptr, n, arg) }
}

impl HostRows {
    /// The slots and fresh flags, borrowed for the call.
    ///
    /// # Safety
    /// `slots` holds `n_slots` int32 values; `fresh` is NULL or holds `n_slots` bytes.
    pub(super) unsafe fn slots<'a>(
        &self,
        mlx: &'a Mlx,
        pool: *const mlxk_array,
    ) -> Result<Slots<'a>> {
        // SAFETY: the contract above.
        let slots = unsafe { host(self.slots, self.n_slots, "slots", "n_slots") }?;
        let fresh = match self.fresh.is_null() {
            true => None,
            // SAFETY: the contract above.
            false => Some(unsafe { host(self.fresh, self.n_slots, "fresh", "n_slots") }?),
        };
        Ok(Slots {
            pool: mlx.get(pool, "pool")?,
            slots,
            fresh,
        })
    }
}

/// The update's arrays without a state (the pool holds the states).
pub(super) fn update_inputs(mlx: &Mlx, args: [*const mlxk_array; 8]) -> Result<Inputs<'_>> {
    let [q, k, v, a, b, a_log, dt_bias, mask] = args;
    Ok(Inputs {
        q: mlx.get(q, "q")?,
        k: mlx.get(k, "k")?,
        v: mlx.get(v, "v")?,
        a: mlx.get(a, "a")?,
        b: mlx.get(b, "b")?,
        a_log: mlx.get(a_log, "a_log")?,
        dt_bias: mlx.get(dt_bias, "dt_bias")?,
        state: None,
        mask: mlx.get_opt(mask, "mask")?,
    })
}

/// Every pool update (dense or packed, exact, chunked or verify).
///
/// # Safety
/// The host arrays hold what they announce (`HostRows`, `cu_seqlens` with `n_cu` values); `y`
/// and `pool_out` are NULL or valid for writing one handle each (`pool_out` unused for a
/// verify).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn update(
    function: &str,
    form: Result<PoolForm>,
    args: [*const mlxk_array; 9],
    rows: HostRows,
    cu_seqlens: Option<(*const i32, usize)>,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        let (y, pool_out) = if matches!(form, Ok(PoolForm::Verify)) {
            // SAFETY: the documented contract on `y`.
            (unsafe { Out::new(y, "y") }?, None)
        } else {
            // SAFETY: the documented contract on `y` and `pool_out`.
            let [y, p] = unsafe { distinct_outs([y, pool_out], ["y", "pool_out"]) }?;
            (y, Some(p))
        };
        let layout = match cu_seqlens {
            None => Layout::Dense,
            // SAFETY: the documented contract on `cu_seqlens`.
            Some((ptr, n)) => Layout::Packed {
                cu_seqlens: unsafe { host(ptr, n, "cu_seqlens", "n_cu_seqlens") }?,
            },
        };
        let mut mlx = registry::lock();
        let [q, k, v, a, b, a_log, dt_bias, pool, mask] = args;
        let inputs = update_inputs(&mlx, [q, k, v, a, b, a_log, dt_bias, mask])?;
        // SAFETY: the documented contract on the host arrays.
        let slots = unsafe { rows.slots(&mlx, pool) }?;
        let backend = Backend::current();
        // The chunk size, checked where the C call entered, is reported here, after the
        // handles and the host arrays.
        let form = form?;
        let given = crate::ops::array::id(slots.pool);
        let (y_array, pool_array) = ops::update_pool(&inputs, &slots, layout, form, backend)?;
        match (pool_out, pool_array) {
            (Some(out), Some(array)) => {
                let (y_handle, pool_handle) = mlx.insert_pool_step(Some(y_array), array, given);
                y.write(y_handle.expect("an update has y"));
                out.write(pool_handle);
            }
            _ => y.write(mlx.insert(y_array)),
        }
        Ok(())
    })
}

/// mlxk_gated_delta_update on a pool of states addressed by slot, as engines keep them: row b
/// starts from `pool[slots[b]]` and its final state goes back there. Bit for bit what gathering
/// those rows, mlxk_gated_delta_update on them and scattering the states back gives.
///
/// Shapes and dtypes as mlxk_gated_delta_update, with the state replaced by `pool`
/// [N, Hv, Dv, Dk] float32 and `n_slots` int32 `slots` (n_slots = B). A negative slot is a
/// padding row: nothing read or written, y zeros. Two rows may not name one slot
/// (MLXK_ERR_INVALID_ARGUMENT naming both). `fresh` (NULL: none) holds n_slots flags: a nonzero
/// flag starts that row from zeros, without reading its slot (a new sequence; the slot is
/// then written). Results: `*y` [B, T, Hv, Dv]; `*pool_out` [N, Hv, Dv, Dk], the pool with the
/// named slots replaced (every other slot keeps its bits).
///
/// In place: `slots` and `fresh` are read during the call. On the CPU, when the caller frees
/// its `pool` handle (and holds no other reference to it) before evaluating `*pool_out`, the
/// kernel takes over the pool's buffer and writes the B named states into it, touching nothing
/// else: B states read and written per call, never N. A caller that keeps the old pool gets a
/// new one: N states copied at evaluation, then the B updated. On MLX CUDA the same rule holds
/// (the kernel writes the B rows into the given-up pool's buffer, or into a copy of N). On
/// Metal the kernel writes the B new states to a temporary, which MLX's scatter writes into
/// the pool under the same rule (in place when the old handle is gone, else a copy of N).
///
/// Ownership: inputs borrowed (host arrays only for the call); `*y` and `*pool_out` are new
/// handles. NULL: `fresh` and `mask` may be NULL; `slots` only when n_slots is 0. Errors:
/// MLXK_ERR_NULL_POINTER, MLXK_ERR_SHAPE, MLXK_ERR_DTYPE, MLXK_ERR_INVALID_HANDLE,
/// MLXK_ERR_INVALID_ARGUMENT (slots, `y == pool_out`, sizes), MLXK_ERR_OUT_OF_MEMORY. Thread:
/// any. Lazy: computation errors surface at eval/read.
///
/// Faults lose nothing (docs/serving.md, "Faults"). A refused call (an argument error, or the
/// new pool above mlxk_set_memory_limit: MLXK_ERR_OUT_OF_MEMORY) builds nothing: `*y` and
/// `*pool_out` stay NULL, `pool` is unchanged. A call whose evaluation fails (MLX's allocator,
/// an input's computation, the kernel raising before it writes) leaves every slot as it was,
/// whether the caller kept `pool` or freed it first: the mlxk_array_eval/_read that ran it
/// reports the error (MLXK_ERR_BACKEND); `*y` then reports it on every use, and `*pool_out`
/// holds the pool as given, bit for bit (read it, or pass it to the next call: the step was
/// not applied); a kept `pool` is unchanged. No slot is ever half-written. A panic inside a
/// kernel (MLXK_ERR_PANIC, a defect) leaves `*pool_out` failed too.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_pool(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    slots: *const i32,
    fresh: *const u8,
    n_slots: usize,
    mask: *const mlxk_array,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract.
    unsafe {
        update(
            "mlxk_gated_delta_update_pool",
            Ok(PoolForm::Update),
            [q, k, v, a, b, a_log, dt_bias, pool, mask],
            HostRows {
                slots,
                fresh,
                n_slots,
            },
            None,
            y,
            pool_out,
        )
    }
}

/// mlxk_gated_delta_update_pool in the chunked (WY) form of mlxk_gated_delta_update_chunked
/// (`chunk_size` as there): each row's results equal that call's on the gathered rows bit for
/// bit, on the CPU and on the GPU (there over a chunk table, each chunk one row's). Faults as
/// mlxk_gated_delta_update_pool's.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_pool_chunked(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    slots: *const i32,
    fresh: *const u8,
    n_slots: usize,
    mask: *const mlxk_array,
    chunk_size: i32,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract.
    unsafe {
        update(
            "mlxk_gated_delta_update_pool_chunked",
            ChunkSize::from_c(chunk_size).map(PoolForm::Chunked),
            [q, k, v, a, b, a_log, dt_bias, pool, mask],
            HostRows {
                slots,
                fresh,
                n_slots,
            },
            None,
            y,
            pool_out,
        )
    }
}

/// Speculative verify on a pool: mlxk_gated_delta_update_pool over each row's draft window
/// (T tokens) that only reads the pool: `*y` [B, T, Hv, Dv] for every draft token, no state
/// written (y bit for bit as mlxk_gated_delta_update_pool's). Commit the accepted prefix of
/// each row with mlxk_gated_delta_state_pool on the same k, v and gates. Arguments as
/// mlxk_gated_delta_update_pool, without `pool_out`. A failed evaluation fails `*y` and
/// leaves the pool as it was (it is only read).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_verify_pool(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    slots: *const i32,
    fresh: *const u8,
    n_slots: usize,
    mask: *const mlxk_array,
    y: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract.
    unsafe {
        update(
            "mlxk_gated_delta_verify_pool",
            Ok(PoolForm::Verify),
            [q, k, v, a, b, a_log, dt_bias, pool, mask],
            HostRows {
                slots,
                fresh,
                n_slots,
            },
            None,
            y,
            std::ptr::null_mut(),
        )
    }
}

/// Packed variable-length prefill on a pool: N sequences of any lengths in one call, no padding
/// computed. q, k [1, total_T, Hk, Dk], v [1, total_T, Hv, Dv], a, b [1, total_T, Hv] (the
/// sequences one after another); `cu_seqlens` holds `n_cu_seqlens` = N + 1 int32 offsets
/// (FlashAttention's convention: 0, then each sequence's end; never decreasing; the last is
/// total_T), sequence i owning tokens [cu_seqlens[i], cu_seqlens[i + 1]) (zero-length
/// sequences allowed). `slots` and `fresh` hold N values each, one per sequence, with the rules
/// of mlxk_gated_delta_update_pool (a negative slot: the sequence's y is zeros). Results:
/// `*y` [1, total_T, Hv, Dv]; `*pool_out` as in mlxk_gated_delta_update_pool. Each sequence's
/// y and state equal one mlxk_gated_delta_update call on it alone, bit for bit. No mask.
/// Faults as mlxk_gated_delta_update_pool's.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_packed(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    cu_seqlens: *const i32,
    n_cu_seqlens: usize,
    slots: *const i32,
    fresh: *const u8,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract.
    unsafe {
        update(
            "mlxk_gated_delta_update_packed",
            Ok(PoolForm::Update),
            [q, k, v, a, b, a_log, dt_bias, pool, std::ptr::null()],
            HostRows {
                slots,
                fresh,
                n_slots: n_cu_seqlens.saturating_sub(1),
            },
            Some((cu_seqlens, n_cu_seqlens)),
            y,
            pool_out,
        )
    }
}

/// mlxk_gated_delta_update_packed in the chunked (WY) form (`chunk_size` as in
/// mlxk_gated_delta_update_chunked): each sequence's results equal
/// mlxk_gated_delta_update_chunked on it alone, bit for bit, on the CPU and on the GPU (there
/// over a chunk table, each chunk one sequence's). Faults
/// as mlxk_gated_delta_update_pool's.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_packed_chunked(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    cu_seqlens: *const i32,
    n_cu_seqlens: usize,
    slots: *const i32,
    fresh: *const u8,
    chunk_size: i32,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract.
    unsafe {
        update(
            "mlxk_gated_delta_update_packed_chunked",
            ChunkSize::from_c(chunk_size).map(PoolForm::Chunked),
            [q, k, v, a, b, a_log, dt_bias, pool, std::ptr::null()],
            HostRows {
                slots,
                fresh,
                n_slots: n_cu_seqlens.saturating_sub(1),
            },
            Some((cu_seqlens, n_cu_seqlens)),
            y,
            pool_out,
        )
    }
}

/// The replay on a pool.
///
/// # Safety
/// As `update`; `accepted_lengths` holds `rows.n_slots` values.
pub(crate) unsafe fn state(
    function: &str,
    args: [*const mlxk_array; 7],
    rows: HostRows,
    accepted_lengths: *const i32,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `pool_out`.
        let pool_out = unsafe { Out::new(pool_out, "pool_out") }?;
        // SAFETY: the documented contract on `accepted_lengths`.
        let lengths = unsafe {
            host(
                accepted_lengths,
                rows.n_slots,
                "accepted_lengths",
                "n_slots",
            )
        }?;
        let mut mlx = registry::lock();
        let [k, v, a, b, a_log, dt_bias, pool] = args;
        let inputs = StateInputs {
            k: mlx.get(k, "k")?,
            v: mlx.get(v, "v")?,
            a: mlx.get(a, "a")?,
            b: mlx.get(b, "b")?,
            a_log: mlx.get(a_log, "a_log")?,
            dt_bias: mlx.get(dt_bias, "dt_bias")?,
            state: None,
            accepted_lengths: lengths,
        };
        // SAFETY: the documented contract on the host arrays.
        let slots = unsafe { rows.slots(&mlx, pool) }?;
        let given = crate::ops::array::id(slots.pool);
        let result = ops::state_pool(&inputs, &slots, Backend::current())?;
        pool_out.write(mlx.insert_pool_step(None, result, given).1);
        Ok(())
    })
}

/// Commit after a speculative verify on a pool (mlxk_gated_delta_state on a pool, in place):
/// row b replays its first `accepted_lengths[b]` tokens of the window from `pool[slots[b]]`
/// (zeros where `fresh` says so) and writes the state back into that slot. Bit for bit
/// mlxk_gated_delta_state on the gathered rows, scattered back. A row with length 0 leaves its
/// slot unchanged (a fresh one becomes zeros); a negative slot is a padding row.
///
/// Shapes as mlxk_gated_delta_state with `pool` [N, Hv, Dv, Dk] float32 for the state;
/// `slots`, `fresh` (NULL: none) and `accepted_lengths` hold n_slots = B values each, lengths
/// in [0, T]. Result: `*pool_out` [N, Hv, Dv, Dk] (the in-place rule of
/// mlxk_gated_delta_update_pool). Errors and faults as mlxk_gated_delta_update_pool's (a failed
/// evaluation leaves `*pool_out` holding the pool as given: nothing committed).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_state_pool(
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    slots: *const i32,
    fresh: *const u8,
    accepted_lengths: *const i32,
    n_slots: usize,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract.
    unsafe {
        state(
            "mlxk_gated_delta_state_pool",
            [k, v, a, b, a_log, dt_bias, pool],
            HostRows {
                slots,
                fresh,
                n_slots,
            },
            accepted_lengths,
            pool_out,
        )
    }
}

/// mlxk_gated_delta_update_from_conv on a pool: the head split of the convolution's output, then
/// mlxk_gated_delta_update_pool on its q, k and v (bit for bit those two calls). Arguments as
/// mlxk_gated_delta_update_from_conv with `pool`, `slots`, `fresh` and `n_slots` (= B) for the
/// state, as in mlxk_gated_delta_update_pool. Results: `*y` [B, T, Hv, Dv]; `*pool_out`.
/// Faults as mlxk_gated_delta_update_pool's (the head split failing first included).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_update_from_conv_pool(
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
    pool: *const mlxk_array,
    slots: *const i32,
    fresh: *const u8,
    n_slots: usize,
    mask: *const mlxk_array,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    let rows = HostRows {
        slots,
        fresh,
        n_slots,
    };
    boundary("mlxk_gated_delta_update_from_conv_pool", || {
        // SAFETY: the documented contract on `y` and `pool_out`.
        let [y, pool_out] = unsafe { distinct_outs([y, pool_out], ["y", "pool_out"]) }?;
        let mut mlx = registry::lock();
        let heads = [key_heads, value_heads, value_width];
        let inputs = FromConvInputs {
            split: crate::capi::silu_rms_heads::inputs(&mlx, [x, q_scale, k_scale], heads, eps)?,
            a: mlx.get(a, "a")?,
            b: mlx.get(b, "b")?,
            a_log: mlx.get(a_log, "a_log")?,
            dt_bias: mlx.get(dt_bias, "dt_bias")?,
            state: None,
            mask: mlx.get_opt(mask, "mask")?,
        };
        // SAFETY: the documented contract on the host arrays.
        let slots = unsafe { rows.slots(&mlx, pool) }?;
        let given = crate::ops::array::id(slots.pool);
        let (y_array, pool_array) =
            ops::update_from_conv_pool(&inputs, &slots, Backend::current())?;
        let (y_handle, pool_handle) = mlx.insert_pool_step(Some(y_array), pool_array, given);
        y.write(y_handle.expect("an update has y"));
        pool_out.write(pool_handle);
        Ok(())
    })
}
