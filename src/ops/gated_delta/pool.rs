//! The engine-shaped calls (docs/DESIGN.md §4 "Pools and packing"): the update, its chunked
//! form, the speculative verify and the replay on a pool of states `[N, Hv, Dv, Dk]`
//! addressed by slot, and packed variable-length prefill (`cu_seqlens`).
//!
//! The caller's slots, fresh flags, lengths and sequence offsets are host integers, checked
//! here and turned into one int32 row table `[B, 5]` (`node::gated_delta::Pool`). On the CPU the
//! node's state output is the pool itself, which takes over the caller's buffer when MLX allows
//! and is updated in place; on a GPU the kernel writes the rows' new states and MLX's scatter
//! puts them into the pool (in place under the same rule).

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::node::gated_delta::{ChunkSize, Form, Node, Pool, PoolWrite};
use crate::ops::shape::ArgInfo;
use crate::ops::Backend;

use super::from_conv::{check_update_from_conv, FromConvInputs};
use super::graph::{build, Arrays};
use super::tables::ints_array;
use super::{check_state_counted, check_update_as, Inputs, Results, StateInputs};

/// How the caller names each row's state: pool rows by slot (negative: a padding row), and
/// optionally rows that start from zeros instead of their slot's state.
#[derive(Clone, Copy)]
pub struct Slots<'a> {
    /// The pool `[N, Hv, Dv, Dk]` float32.
    pub pool: &'a Array,
    /// One pool row a row (a sequence, when packed); negative: a padding row.
    pub slots: &'a [i32],
    /// Nonzero: the row starts from zeros (its slot is written, not read). None: no row does.
    pub fresh: Option<&'a [u8]>,
}

/// Where each row's tokens are: `[B, T]` rows (the update's layout, with its optional mask)
/// or sequences packed along T of a `B = 1` call, sequence i owning tokens
/// `[cu_seqlens[i], cu_seqlens[i + 1])`.
#[derive(Clone, Copy)]
pub enum Layout<'a> {
    Dense,
    Packed { cu_seqlens: &'a [i32] },
}

/// Which update a pool call runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum PoolForm {
    /// The exact recurrence; the final states go into the pool.
    Update,
    /// The chunked form with this chunk size.
    Chunked(ChunkSize),
    /// The exact recurrence reading the pool and writing no state (speculative verify).
    Verify,
}

/// Checks the pool against the call's head dimensions: `[N, Hv, Dv, Dk]` float32; returns N.
pub(super) fn check_pool(
    pool: &Array,
    [hv, dv, dk]: [i64; 3],
    (keys, values): (&str, &str),
) -> Result<i64> {
    let p = ArgInfo::of("pool", pool)?;
    p.rank(4, "[N, Hv, Dv, Dk]")?
        .dim(1, "Hv", hv, values)?
        .dim(2, "Dv", dv, values)?
        .dim(3, "Dk", dk, keys)?;
    if p.dtype != Dtype::Float32 {
        return Err(Error::Dtype(format!(
            "pool: dtype {} is not accepted (the recurrent states are float32 only)",
            p.dtype.name()
        )));
    }
    Ok(p.shape[0])
}

/// Checks the slots (one per row, each below N or negative, no pool row named twice) and the
/// fresh flags (one per row, when given).
pub(super) fn check_slots(s: &Slots, rows: i64, n: i64, what: &str) -> Result<()> {
    if s.slots.len() as i64 != rows {
        return Err(Error::InvalidArgument(format!(
            "slots: n_slots is {}, expected one slot per {what} ({rows})",
            s.slots.len()
        )));
    }
    let mut first_row = std::collections::HashMap::with_capacity(s.slots.len());
    for (row, &slot) in s.slots.iter().enumerate() {
        if slot as i64 >= n {
            return Err(Error::InvalidArgument(format!(
                "slots[{row}] is {slot}; expected a pool row below N = {n} (the pool's \
                 dimension 0), or a negative slot for a padding {what}"
            )));
        }
        if slot >= 0 {
            if let Some(other) = first_row.insert(slot, row) {
                return Err(Error::InvalidArgument(format!(
                    "slots[{row}] is {slot}, which slots[{other}] names too; each pool row \
                     may be named by one {what} of a call"
                )));
            }
        }
    }
    Ok(())
}

/// Checks the packed layout: `cu_seqlens` `[N + 1]`, starting at 0, never decreasing, ending
/// at total_T; q's B is 1.
fn check_packed(cu: &[i32], b: i64, total: i64, mask: bool) -> Result<()> {
    if b != 1 {
        return Err(Error::Shape(format!(
            "q: B (dimension 0) is {b}; packed sequences take q, k, v [1, total_T, H, D]"
        )));
    }
    if mask {
        return Err(Error::InvalidArgument(
            "mask: packed sequences take no mask (no token is padding)".into(),
        ));
    }
    check_offsets(cu, "cu_seqlens", "sequence", (total, "q"))
}

/// Checks offsets `name` (`[N + 1]`: FlashAttention's convention) of `what`s packed along
/// the token dimension: starting at 0, never decreasing, ending at `total`, the dimension 1 of
/// the argument `source`.
pub(super) fn check_offsets(
    cu: &[i32],
    name: &str,
    what: &str,
    (total, source): (i64, &str),
) -> Result<()> {
    if cu.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "{name}: n_{name} is 0; expected N + 1 offsets (at least [0])"
        )));
    }
    if cu[0] != 0 {
        return Err(Error::InvalidArgument(format!(
            "{name}[0] is {}; expected 0 (the first {what} starts at token 0)",
            cu[0]
        )));
    }
    for i in 1..cu.len() {
        if cu[i] < cu[i - 1] {
            return Err(Error::InvalidArgument(format!(
                "{name}[{i}] is {} < {name}[{}] = {}; expected offsets that never decrease",
                cu[i],
                i - 1,
                cu[i - 1]
            )));
        }
    }
    let last = *cu.last().expect("not empty") as i64;
    if last != total {
        return Err(Error::InvalidArgument(format!(
            "{name}[{}] is {last}; expected total_T = {total} ({source}'s dimension 1)",
            cu.len() - 1
        )));
    }
    Ok(())
}

/// The row table of a pool node (`node::gated_delta::Pool`): per row
/// `(tok0, span, len, src, dst)`. `lengths`: the tokens each row runs (the replay), else all.
/// `compact`: number the written rows 0, 1, … (the GPU's state rows) instead of by slot.
/// Returns the table and the written rows' slots, in the order of the compact numbering.
pub(super) fn row_table(
    s: &Slots,
    layout: Layout,
    t: usize,
    lengths: Option<&[i32]>,
    writes: bool,
    compact: bool,
) -> (Vec<i32>, Vec<i32>) {
    let mut table = Vec::with_capacity(5 * s.slots.len());
    let mut written = Vec::new();
    for (row, &slot) in s.slots.iter().enumerate() {
        let (tok0, span) = match layout {
            Layout::Dense => (row * t, t as i32),
            Layout::Packed { cu_seqlens } => (
                cu_seqlens[row] as usize,
                cu_seqlens[row + 1] - cu_seqlens[row],
            ),
        };
        let fresh = s.fresh.is_some_and(|f| f[row] != 0);
        let len = match (slot < 0, lengths) {
            (true, _) => 0,
            (false, Some(l)) => l[row],
            (false, None) => span,
        };
        let src = if slot < 0 || fresh { -1 } else { slot };
        let dst = if slot < 0 || !writes {
            -1
        } else {
            written.push(slot);
            match compact {
                true => written.len() as i32 - 1,
                false => slot,
            }
        };
        table.extend([tok0 as i32, span, len, src, dst]);
    }
    (table, written)
}

/// Whether a GPU pool call that writes states on `backend` takes the in-place launch
/// (`PoolWrite::InPlace`: MLX CUDA, its command encoder found).
fn in_place_launch(backend: Backend) -> bool {
    matches!(backend, Backend::Cuda { .. })
        && crate::seams::pool_in_place().unwrap_or_else(bridge::cuda_pool_in_place_available)
}

/// The node's state output and the row numbering for a call on `backend` that `writes`
/// states: (write, compact).
pub(super) fn pool_plan(backend: Backend, writes: bool) -> (bool, bool) {
    let in_place = writes && in_place_launch(backend);
    (in_place, backend != Backend::Cpu && !in_place)
}

/// The node's state output on `backend`: the pool itself on the CPU, the pool's own rows on MLX
/// CUDA (`in_place`), else the written rows on a GPU.
pub(super) fn pool_write(
    backend: Backend,
    writes: bool,
    written: usize,
    in_place: bool,
) -> PoolWrite {
    if in_place && written > 0 {
        return PoolWrite::InPlace;
    }
    match (writes, backend) {
        (false, Backend::Cpu) => PoolWrite::None,
        (true, Backend::Cpu) => PoolWrite::Pool,
        // A GPU launch always has its state output; a verify's has no rows.
        (false, _) => PoolWrite::Rows(0),
        (true, _) => PoolWrite::Rows(written),
    }
}

/// Builds `node` over the pool and returns its outputs; where `writes`, the last is the new
/// pool (on a GPU: the written rows' states scattered into the pool).
pub(super) fn build_pool(
    node: &Node,
    arrays: Arrays,
    s: &Slots,
    (table, written): (&[i32], &[i32]),
    writes: bool,
    backend: Backend,
) -> Result<Vec<UniquePtr<Array>>> {
    let rows = ints_array(table, &[s.slots.len() as i32, 5])?;
    let arrays = Arrays {
        state: Some(s.pool),
        rows: Some(&rows),
        ..arrays
    };
    let mut outputs = match node.form {
        Form::Chunked { .. } if backend != Backend::Cpu => {
            super::graph::build_gpu_chunked_pool(node, &arrays, backend, table)?
        }
        _ => build(node, &arrays, backend)?,
    };
    if let Some(PoolWrite::Rows(_)) = node.pool.map(|p| p.write) {
        let states = outputs.pop().expect("the rows' states");
        if writes {
            outputs.push(if written.is_empty() {
                bridge::array_share(s.pool)
            } else {
                let slots = ints_array(written, &[written.len() as i32])?;
                bridge::pool_scatter(s.pool, &slots, &states, backend.gpu_stream())?
            });
        }
    }
    Ok(outputs)
}

/// The update on a pool (`mlxk_gated_delta_update_pool`, `_pool_chunked`, `_verify_pool`,
/// `_update_packed`, `_packed_chunked`): returns y and, unless `form` is `Verify`, the new
/// pool, lazy. `x.state` must be None (the pool holds the states).
pub fn update_pool(
    x: &Inputs,
    s: &Slots,
    layout: Layout,
    form: PoolForm,
    backend: Backend,
) -> Result<(UniquePtr<Array>, Option<UniquePtr<Array>>)> {
    let chunk = match form {
        PoolForm::Chunked(c) => Some(c),
        _ => None,
    };
    let mut node = check_update_as(x, Results::Pool)?;
    let d = node.dims;
    let n = check_pool(s.pool, [d.hv, d.dv, d.dk].map(|v| v as i64), ("q", "v"))?;
    let (rows, what) = match layout {
        Layout::Dense => (d.b as i64, "batch row"),
        Layout::Packed { cu_seqlens } => {
            check_packed(cu_seqlens, d.b as i64, d.t as i64, x.mask.is_some())?;
            (cu_seqlens.len() as i64 - 1, "sequence")
        }
    };
    check_slots(s, rows, n, what)?;
    check_fresh(s)?;
    let writes = form != PoolForm::Verify;
    // On a GPU the chunked form runs over a chunk table (graph::build_gpu_chunked_pool) and
    // writes its rows' states; without a token or a row, the exact launch (as the dense GPU
    // chunked call).
    let chunk = chunk.filter(|_| backend == Backend::Cpu || (d.t > 0 && rows > 0));
    let gpu_chunked = chunk.is_some() && backend != Backend::Cpu;
    let (in_place, compact) = match gpu_chunked {
        true => (false, true),
        false => pool_plan(backend, writes),
    };
    let (table, written) = row_table(s, layout, d.t, None, writes, compact);
    node.dims.b = rows as usize;
    node.has_state = true; // the pool
    node.form = chunk.map_or(Form::Exact, |chunk| Form::Chunked { chunk });
    node.pool = Some(Pool {
        slots: n as usize,
        write: pool_write(backend, writes, written.len(), in_place),
        packed: matches!(layout, Layout::Packed { .. }),
    });
    check_pool_memory(&node, n, writes)?;
    if gpu_chunked {
        let c = crate::metal::gated_delta::chunked::launch_chunk(&node);
        let (chunks, _) = crate::metal::gated_delta::chunked::pool_chunk_table(&table, c);
        let chunks = (chunks.len() / 2) as u64;
        let slots = chunks + rows as u64;
        super::check_chunked_gpu_scratch(node.dims, c, d.hv as u64, chunks, slots)?;
    }
    let built = build_pool(&node, x.arrays(), s, (&table, &written), writes, backend)?;
    let mut outputs = built.into_iter();
    let y = outputs.next().expect("y");
    Ok((y, if writes { outputs.next() } else { None }))
}

/// The update from the convolution's output on a pool (`mlxk_gated_delta_update_from_conv_pool`):
/// the head split, then `update_pool` on its q, k and v (two nodes on every backend). `x.state`
/// must be None.
pub fn update_from_conv_pool(
    x: &FromConvInputs,
    s: &Slots,
    backend: Backend,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    let (node, split) = check_update_from_conv(x)?;
    let d = node.dims;
    let n = check_pool(
        s.pool,
        [d.hv, d.dv, d.dk].map(|v| v as i64),
        ("x", "value_heads"),
    )?;
    check_slots(s, d.b as i64, n, "batch row")?;
    check_fresh(s)?;
    let (q, k, v) = crate::ops::silu_rms_heads::build(&split, &x.split, backend)?;
    let inputs = Inputs {
        q: &q,
        k: &k,
        v: &v,
        a: x.a,
        b: x.b,
        a_log: x.a_log,
        dt_bias: x.dt_bias,
        state: None,
        mask: x.mask,
    };
    let (y, pool) = update_pool(&inputs, s, Layout::Dense, PoolForm::Update, backend)?;
    Ok((y, pool.expect("an update writes the pool")))
}

/// The replay on a pool (`mlxk_gated_delta_state_pool`): each row's accepted prefix, from its
/// slot's state (or zeros), committed into its slot; returns the new pool, lazy.
pub fn state_pool(x: &StateInputs, s: &Slots, backend: Backend) -> Result<UniquePtr<Array>> {
    let mut node = check_state_counted(x, "n_slots", Results::Pool)?;
    let d = node.dims;
    let n = check_pool(s.pool, [d.hv, d.dv, d.dk].map(|v| v as i64), ("k", "v"))?;
    check_slots(s, d.b as i64, n, "batch row")?;
    check_fresh(s)?;
    let (in_place, compact) = pool_plan(backend, true);
    let (table, written) = row_table(
        s,
        Layout::Dense,
        d.t,
        Some(x.accepted_lengths),
        true,
        compact,
    );
    node.has_state = true; // the pool
    node.pool = Some(Pool {
        slots: n as usize,
        write: pool_write(backend, true, written.len(), in_place),
        packed: false,
    });
    check_pool_memory(&node, n, true)?;
    let mut outputs = build_pool(&node, x.arrays(), s, (&table, &written), true, backend)?;
    Ok(outputs.pop().expect("the new pool"))
}

/// The fresh flags: one per slot when given.
pub(super) fn check_fresh(s: &Slots) -> Result<()> {
    match s.fresh {
        Some(f) if f.len() != s.slots.len() => Err(Error::InvalidArgument(format!(
            "fresh: {} flags for {} slots; expected one flag per slot (or NULL: none fresh)",
            f.len(),
            s.slots.len()
        ))),
        _ => Ok(()),
    }
}

/// A pool call's own results on top of the checks `check_update_as` / `check_state_counted` made: the new
/// pool when the caller may keep the old one (a copy of N states).
pub(super) fn check_pool_memory(node: &Node, n: i64, writes: bool) -> Result<()> {
    let d = node.dims;
    if !writes {
        return Ok(());
    }
    memory::check_outputs(&[(
        "pool_out",
        &[n, d.hv as i64, d.dv as i64, d.dk as i64],
        Dtype::Float32,
    )])
}
