//! The gated-delta calls on a pool of recurrent states addressed by slot, as engines keep them
//! (`include/mlxkern.h`, `mlxk_gated_delta_update_pool` and after): [`PoolSlots`] names the
//! states, and [`GatedDelta::update_pool`], [`GatedDelta::update_pool_chunked`],
//! [`GatedDelta::verify_pool`], [`GatedDelta::update_packed`],
//! [`GatedDelta::update_packed_chunked`], [`StateReplay::commit_pool`] and
//! [`GatedDeltaFromConv::update_pool`] run on them.

use super::chunk_arg;
use crate::api::{call, int_arg, Array, GatedDelta, GatedDeltaFromConv, StateReplay};
use crate::bridge;
use crate::error::{Error, Result};
use crate::ops::gated_delta::{self as ops, Layout, PoolForm, Slots};
use crate::ops::Backend;

/// The states a pool call reads and writes: every sequence's state lives in one pool and each
/// batch row (each sequence, when packed) names its own by slot.
///
/// A negative slot is a padding row: nothing read or written, its `y` zeros. Two rows may not
/// name one slot. A row whose `fresh` flag is true starts from zeros without reading its slot
/// (a new sequence; the slot is then written).
///
/// # In place
///
/// A call returns a new pool, lazy. Replace the old one with it before evaluating
/// (`pool = out.pool;` drops the old array): when nothing else holds the old pool, the CPU
/// kernel writes the named states into its buffer, reading and writing those states only,
/// never all N. A caller that keeps the old pool gets a copy (N states) with the named ones
/// replaced.
///
/// # Faults
///
/// A refused call (an argument error, [`Error::OutOfMemory`] above the
/// [memory limit](crate::set_memory_limit)) builds nothing. A call whose evaluation fails (an
/// allocation, an input's computation, the kernel raising before it writes) leaves every slot
/// as it was, the old pool kept or dropped: the [`eval`](Array::eval) or read that ran it
/// returns the error; its `y` then returns it on every use, and its new pool holds the pool as
/// given, bit for bit (read it, or pass it to the next call: the step was not applied). No slot
/// is ever half-written. A panic inside a kernel ([`Error::Panic`], a defect) fails the new pool
/// too. docs/serving.md, "Faults", lists the cases.
#[derive(Debug, Clone, Copy)]
pub struct PoolSlots<'a> {
    /// The pool `[N, Hv, Dv, Dk]` float32.
    pub pool: &'a Array,
    /// One slot per batch row (per sequence when packed), each below N; negative: padding.
    pub slots: &'a [i32],
    /// One flag per slot, true: the row starts from zeros. None: no row does.
    pub fresh: Option<&'a [bool]>,
}

/// The results of an update on a pool.
#[derive(Debug)]
pub struct PoolUpdate {
    /// `[B, T, Hv, Dv]` (`[1, total_T, Hv, Dv]` when packed) in q's dtype (x's for
    /// [`GatedDeltaFromConv::update_pool`]); zeros at masked tokens and padding rows.
    pub y: Array,
    /// The new pool `[N, Hv, Dv, Dk]` float32: the named slots replaced, every other slot
    /// keeping its bits.
    pub pool: Array,
}

impl PoolSlots<'_> {
    /// The ops' view of the slots (under the lock), the fresh flags as the bytes in `fresh`.
    pub(super) fn get<'s>(&'s self, fresh: &'s Option<Vec<u8>>) -> Result<Slots<'s>> {
        Ok(Slots {
            pool: self.pool.get("pool")?,
            slots: self.slots,
            fresh: fresh.as_deref(),
        })
    }

    pub(super) fn fresh_bytes(&self) -> Option<Vec<u8>> {
        self.fresh.map(|f| f.iter().map(|&x| u8::from(x)).collect())
    }
}

/// A pool call takes its states from the pool: a state given as well is refused.
pub(super) fn no_state(state: Option<&Array>) -> Result<()> {
    match state {
        None => Ok(()),
        Some(_) => Err(Error::InvalidArgument(
            "state: a pool call starts each row from its slot of the pool (or from zeros where \
             fresh); expected None"
                .into(),
        )),
    }
}

/// A pool call's results: the new pool made from the pool whose id is `given` (a failed
/// evaluation leaves it on that pool: [`PoolSlots`], "Faults").
/// What the ops return for a pool call: y and, unless it is a verify, the new pool.
type PoolResults = (
    cxx::UniquePtr<bridge::Array>,
    Option<cxx::UniquePtr<bridge::Array>>,
);

fn pool_update(((y, pool), given): (PoolResults, usize)) -> PoolUpdate {
    let (y, pool) = Array::pool_step(Some(y), pool.expect("an update writes the pool"), given);
    PoolUpdate {
        y: y.expect("an update has y"),
        pool,
    }
}

/// The id of the pool a call is given (under the lock).
fn given(s: &Slots) -> usize {
    crate::ops::array::id(s.pool)
}

impl GatedDelta<'_> {
    /// Runs one pool form of the update; `cu_seqlens` makes it packed.
    fn pool_call(
        &self,
        s: &PoolSlots,
        cu_seqlens: Option<&[usize]>,
        form: PoolForm,
    ) -> Result<(PoolResults, usize)> {
        no_state(self.state)?;
        let cu = cu_seqlens
            .map(|cu| {
                cu.iter()
                    .enumerate()
                    .map(|(i, &n)| int_arg(n, &format!("cu_seqlens[{i}]")))
                    .collect::<Result<Vec<i32>>>()
            })
            .transpose()?;
        let layout = match &cu {
            None => Layout::Dense,
            Some(cu_seqlens) => Layout::Packed { cu_seqlens },
        };
        let fresh = s.fresh_bytes();
        self.with_inputs(|x| {
            let slots = s.get(&fresh)?;
            let results = ops::update_pool(x, &slots, layout, form, Backend::current())?;
            Ok((results, given(&slots)))
        })
    }

    /// The update on a pool: row `b` starts from `pool[slots[b]]` (zeros where fresh) and its
    /// final state goes back there. Bit for bit what gathering those states, [`update`] on
    /// them and scattering the states back gives. `state` must be None (the pool holds the
    /// states); q ... mask as [`update`], one slot per batch row.
    ///
    /// ```
    /// # fn main() -> mlxkern::Result<()> {
    /// use mlxkern::{Array, GatedDelta, PoolSlots};
    /// let (n, b, hk, hv, dk, dv) = (8, 2, 1, 2, 32, 4); // 8 states in the pool, 2 rows
    /// let fill = |n: usize| (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 20.0).collect::<Vec<f32>>();
    /// let q = Array::from_slice(&fill(b * hk * dk), &[b, 1, hk, dk])?;
    /// let v = Array::from_slice(&fill(b * hv * dv), &[b, 1, hv, dv])?;
    /// let gate = Array::from_slice(&fill(b * hv), &[b, 1, hv])?;
    /// let per_head = Array::from_slice(&fill(hv), &[hv])?;
    /// let mut pool = Array::from_slice(&fill(n * hv * dv * dk), &[n, hv, dv, dk])?;
    /// let step = GatedDelta {
    ///     q: &q, k: &q, v: &v, a: &gate, b: &gate, a_log: &per_head, dt_bias: &per_head,
    ///     state: None, mask: None,
    /// };
    /// // Row 0 continues the sequence in slot 5; row 1 starts a new one in slot 2.
    /// let slots = PoolSlots { pool: &pool, slots: &[5, 2], fresh: Some(&[false, true]) };
    /// let out = step.update_pool(slots)?;
    /// pool = out.pool; // the old pool is dropped first: slots 5 and 2 are written in place
    /// pool.eval()?;
    /// assert_eq!(out.y.shape()?, [b, 1, hv, dv]);
    /// assert_eq!(pool.shape()?, [n, hv, dv, dk]);
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: those of [`update`]; [`Error::InvalidArgument`] for the slots (a count other
    /// than B, a slot not below N, one slot named twice, naming both rows), the fresh flags
    /// (a count other than B) or a state given; [`Error::Shape`] / [`Error::Dtype`] naming
    /// `pool` (`[N, Hv, Dv, Dk]` float32).
    ///
    /// [`update`]: GatedDelta::update
    pub fn update_pool(&self, pool: PoolSlots) -> Result<PoolUpdate> {
        call(|| {
            self.pool_call(&pool, None, PoolForm::Update)
                .map(pool_update)
        })
    }

    /// [`update_pool`](GatedDelta::update_pool) in the chunked (WY) form of
    /// [`update_chunked`](GatedDelta::update_chunked) (`chunk_size` as there): each row's
    /// results equal `update_chunked`'s on the gathered states, bit for bit, on the CPU and on
    /// the GPU.
    pub fn update_pool_chunked(
        &self,
        pool: PoolSlots,
        chunk_size: Option<usize>,
    ) -> Result<PoolUpdate> {
        call(|| {
            let chunk = chunk_arg(chunk_size)?;
            self.pool_call(&pool, None, PoolForm::Chunked(chunk))
                .map(pool_update)
        })
    }

    /// Speculative verify on a pool: [`update_pool`](GatedDelta::update_pool)'s `y` over each
    /// row's draft window (T tokens), bit for bit, reading the pool and writing no state.
    /// Commit each row's accepted prefix with [`StateReplay::commit_pool`] on the same k, v
    /// and gates. Errors as `update_pool`'s.
    pub fn verify_pool(&self, pool: PoolSlots) -> Result<Array> {
        call(|| {
            let ((y, _), _) = self.pool_call(&pool, None, PoolForm::Verify)?;
            Ok(Array::wrap(y))
        })
    }

    /// Packed variable-length prefill on a pool: several sequences of any lengths in one call,
    /// no padding computed. q, k `[1, total_T, Hk, Dk]`, v `[1, total_T, Hv, Dv]`, a, b
    /// `[1, total_T, Hv]` hold the sequences one after another; `cu_seqlens` holds N + 1
    /// offsets (0, then each sequence's end; never decreasing; the last is total_T), sequence
    /// `i` owning tokens `[cu_seqlens[i], cu_seqlens[i + 1])` (zero-length sequences allowed)
    /// and slot `slots[i]`. Each sequence's `y` and state equal one [`update`] on it alone, bit
    /// for bit. `mask` and `state` must be None.
    ///
    /// Errors: those of [`update_pool`](GatedDelta::update_pool), per sequence;
    /// [`Error::InvalidArgument`] naming the offset of `cu_seqlens` at fault or `mask`;
    /// [`Error::Shape`] for a q whose B is not 1.
    ///
    /// [`update`]: GatedDelta::update
    pub fn update_packed(&self, pool: PoolSlots, cu_seqlens: &[usize]) -> Result<PoolUpdate> {
        call(|| {
            self.pool_call(&pool, Some(cu_seqlens), PoolForm::Update)
                .map(pool_update)
        })
    }

    /// [`update_packed`](GatedDelta::update_packed) in the chunked (WY) form (`chunk_size` as
    /// in [`update_chunked`](GatedDelta::update_chunked)): each sequence's results equal
    /// `update_chunked`'s on it alone, bit for bit, on the CPU and on the GPU.
    pub fn update_packed_chunked(
        &self,
        pool: PoolSlots,
        cu_seqlens: &[usize],
        chunk_size: Option<usize>,
    ) -> Result<PoolUpdate> {
        call(|| {
            let chunk = chunk_arg(chunk_size)?;
            self.pool_call(&pool, Some(cu_seqlens), PoolForm::Chunked(chunk))
                .map(pool_update)
        })
    }
}

impl StateReplay<'_> {
    /// The commit after a speculative verify on a pool: row `b` replays its first
    /// `accepted_lengths[b]` tokens of the window from `pool[slots[b]]` (zeros where fresh)
    /// and writes the state back into that slot. Bit for bit [`replay`](StateReplay::replay)
    /// on the gathered states, scattered back. A row with length 0 leaves its slot as it was
    /// (a fresh one becomes zeros). `state` must be None. Returns the new pool, lazy (in place
    /// under the rule of [`PoolSlots`]).
    ///
    /// Errors: those of `replay`, and of [`GatedDelta::update_pool`] for the pool and slots.
    pub fn commit_pool(&self, pool: PoolSlots) -> Result<Array> {
        call(|| {
            no_state(self.state)?;
            let fresh = pool.fresh_bytes();
            let (new_pool, given) = self.with_inputs(|x| {
                let slots = pool.get(&fresh)?;
                Ok((
                    ops::state_pool(x, &slots, Backend::current())?,
                    given(&slots),
                ))
            })?;
            Ok(Array::pool_step(None, new_pool, given).1)
        })
    }
}

impl GatedDeltaFromConv<'_> {
    /// The layer's update on a pool: the head split of the convolution's output, then
    /// [`GatedDelta::update_pool`] on its q, k and v (bit for bit those two calls). `state`
    /// must be None; one slot per batch row.
    ///
    /// Errors: those of [`GatedDeltaFromConv::update`] and [`GatedDelta::update_pool`].
    pub fn update_pool(&self, pool: PoolSlots) -> Result<PoolUpdate> {
        call(|| {
            no_state(self.state)?;
            let fresh = pool.fresh_bytes();
            let (results, given) = self.with_inputs(|x| {
                let slots = pool.get(&fresh)?;
                let results = ops::update_from_conv_pool(x, &slots, Backend::current())?;
                Ok((results, given(&slots)))
            })?;
            Ok(pool_update(((results.0, Some(results.1)), given)))
        })
    }
}
