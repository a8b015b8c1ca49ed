//! `compute_g` and the gated-delta recurrence: argument checks and the entry points of the
//! update (exact and chunked). The update from the convolution's output is in `from_conv`, the
//! prefix replay in `replay`, the gradients in `vjp`, and the graph building all of them share
//! in `graph`.

mod chunked_vjp;
mod from_conv;
mod graph;
mod pool;
mod replay;
mod tables;
mod tree;
mod vjp;

pub use from_conv::{update_from_conv, FromConvInputs};
pub use pool::{state_pool, update_from_conv_pool, update_pool, Layout, PoolForm, Slots};
pub use replay::state;
pub use tree::{commit_tree_pool, verify_tree_pool, Tree};
pub(crate) use vjp::{from_conv_gpu_vjp, gpu_vjp};
pub use vjp::{update_chunked_vjp, update_vjp};

use cxx::UniquePtr;

use super::shape::ArgInfo;
use super::Backend;
use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::node::gated_delta::{ChunkSize, Dims, Form, GateDtypes, Node};
use graph::{build, two_outputs, Arrays};

/// The arrays of one recurrence call (borrowed from the registry).
pub struct Inputs<'a> {
    pub q: &'a Array,
    pub k: &'a Array,
    pub v: &'a Array,
    pub a: &'a Array,
    pub b: &'a Array,
    pub a_log: &'a Array,
    pub dt_bias: &'a Array,
    pub state: Option<&'a Array>,
    pub mask: Option<&'a Array>,
}

/// Checks the gate arguments: `a_log [Hv]`, `a [.., Hv]`, `dt_bias [Hv]`.
fn check_gate(a_log: &ArgInfo, a: &ArgInfo, dt_bias: &ArgInfo, hv: i64) -> Result<()> {
    a_log.rank(1, "[Hv]")?.dim(0, "Hv", hv, "the value heads")?;
    a_log.dtype_in(&[Dtype::Float32, Dtype::Bfloat16])?;
    dt_bias
        .rank(1, "[Hv]")?
        .dim(0, "Hv", hv, "the value heads")?
        .float()?;
    a.float()?;
    Ok(())
}

/// Validates `mlxk_compute_g`'s arguments; returns the shape of g.
pub fn check_compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Vec<i64>> {
    let a_log = ArgInfo::of("a_log", a_log)?;
    let a = ArgInfo::of("a", a)?;
    let dt_bias = ArgInfo::of("dt_bias", dt_bias)?;
    if a.shape.is_empty() {
        return Err(Error::Shape(
            "a: expected rank >= 1 [..., Hv], got a scalar (rank 0)".into(),
        ));
    }
    a_log.rank(1, "[Hv]")?;
    let hv = a_log.shape[0];
    let last = a.shape.len() - 1;
    a.dim(last, "Hv", hv, "a_log")?;
    check_gate(&a_log, &a, &dt_bias, hv)?;
    memory::check_outputs(&[("g", &a.shape, Dtype::Float32)])?;
    Ok(a.shape.clone())
}

pub fn compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<UniquePtr<Array>> {
    check_compute_g(a_log, a, dt_bias)?;
    Ok(bridge::compute_g(
        a_log,
        a,
        dt_bias,
        Backend::current().gpu_stream(),
    )?)
}

/// Validates every argument of `mlxk_gated_delta_update` (before any graph is built).
pub fn check_update(x: &Inputs) -> Result<Node> {
    check_update_as(x, Results::Update)
}

/// What the call that checks the update's arguments makes, for its memory check and its
/// messages, which name only that call's parameters: the update's results (y and state_out);
/// a pool call's (y, and the batch rows' states before they go into the pool, which the pool
/// call checks itself as pool_out); or the backward pass's, which checks its gradients itself.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Results {
    Update,
    Pool,
    Backward,
}

/// [`check_update`] for the call that makes `results`.
pub(crate) fn check_update_as(x: &Inputs, results: Results) -> Result<Node> {
    let q = ArgInfo::of("q", x.q)?;
    let k = ArgInfo::of("k", x.k)?;
    let v = ArgInfo::of("v", x.v)?;
    let a = ArgInfo::of("a", x.a)?;
    let b = ArgInfo::of("b", x.b)?;
    let a_log = ArgInfo::of("a_log", x.a_log)?;
    let dt_bias = ArgInfo::of("dt_bias", x.dt_bias)?;

    q.rank(4, "[B, T, Hk, Dk]")?.float()?;
    let (bsz, t, hk, dk) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    k.rank(4, "[B, T, Hk, Dk]")?
        .dim(0, "B", bsz, "q")?
        .dim(1, "T", t, "q")?
        .dim(2, "Hk", hk, "q")?
        .dim(3, "Dk", dk, "q")?
        .same_dtype(&q)?;
    v.rank(4, "[B, T, Hv, Dv]")?
        .dim(0, "B", bsz, "q")?
        .dim(1, "T", t, "q")?
        .same_dtype(&q)?;
    let (hv, dv) = (v.shape[2], v.shape[3]);
    check_dims(hk, hv, dk, dv)?;
    let gates = [&a, &b, &a_log, &dt_bias];
    check_update_rest(
        gates,
        x.state,
        x.mask,
        ("q", "v"),
        [bsz, t, hv, dv, dk],
        q.dtype,
        results,
    )?;
    Ok(Node {
        dims: dims(bsz, t, hk, hv, dk, dv),
        dtype: q.dtype,
        gates: gate_dtypes(&a, &b, &a_log, &dt_bias),
        has_state: x.state.is_some(),
        has_mask: x.mask.is_some(),
        form: Form::Exact,
        pool: None,
    })
}

/// The update's arguments besides q, k and v: the gates a, b `[B, T, Hv]` (any float dtype),
/// A_log and dt_bias `[Hv]`, the optional state and mask, then the size of its results (y in
/// `dtype`). `sources`: the arguments B, T, Dk and Hv, Dv come from, for messages.
fn check_update_rest(
    [a, b, a_log, dt_bias]: [&ArgInfo; 4],
    state: Option<&Array>,
    mask: Option<&Array>,
    sources: (&str, &str),
    [bsz, t, hv, dv, dk]: [i64; 5],
    dtype: Dtype,
    results: Results,
) -> Result<()> {
    let (keys, values) = sources;
    for gate in [a, b] {
        gate.rank(3, "[B, T, Hv]")?
            .dim(0, "B", bsz, keys)?
            .dim(1, "T", t, keys)?
            .dim(2, "Hv", hv, values)?
            .float()?;
    }
    check_gate(a_log, a, dt_bias, hv)?;
    check_state_and_mask(state, mask, sources, bsz, t, hv, dv, dk)?;
    let gates: [(&str, &[i64], Dtype); 2] = [
        ("g (internal)", &[bsz, t, hv], Dtype::Float32),
        ("beta (internal)", &[bsz, t, hv], b.dtype),
    ];
    match results {
        Results::Update => memory::check_outputs(&[
            ("y", &[bsz, t, hv, dv], dtype),
            ("state_out", &[bsz, hv, dv, dk], Dtype::Float32),
            gates[0],
            gates[1],
        ]),
        Results::Pool => memory::check_outputs(&[
            ("y", &[bsz, t, hv, dv], dtype),
            (
                "the rows' states (internal)",
                &[bsz, hv, dv, dk],
                Dtype::Float32,
            ),
            gates[0],
            gates[1],
        ]),
        Results::Backward => memory::check_outputs(&gates),
    }
}

/// Head counts and widths every recurrence kernel needs.
pub fn check_dims(hk: i64, hv: i64, dk: i64, dv: i64) -> Result<()> {
    if hk < 1 {
        return Err(Error::Shape(format!(
            "q: Hk (dimension 2) is {hk}; at least one key head"
        )));
    }
    if hv < 1 || hv % hk != 0 {
        return Err(Error::Shape(format!(
            "v: Hv (dimension 2) is {hv}; it must be a positive multiple of Hk = {hk} (each \
             value head h reads key head h / (Hv / Hk))"
        )));
    }
    if !(32..=256).contains(&dk) || dk % 32 != 0 {
        return Err(Error::Shape(format!(
            "q: Dk (dimension 3) is {dk}; it must be a multiple of 32 in [32, 256] (each of \
             the 32 SIMD lanes owns Dk/32 state elements)"
        )));
    }
    if dv < 1 {
        return Err(Error::Shape(format!(
            "v: Dv (dimension 3) is {dv}; it must be at least 1"
        )));
    }
    Ok(())
}

/// The optional state `[B, Hv, Dv, Dk]` f32 and mask `[B, T]` bool.
pub fn check_state_and_mask(
    state: Option<&Array>,
    mask: Option<&Array>,
    (keys, values): (&str, &str),
    bsz: i64,
    t: i64,
    hv: i64,
    dv: i64,
    dk: i64,
) -> Result<()> {
    if let Some(state) = state {
        let s = ArgInfo::of("state", state)?;
        s.rank(4, "[B, Hv, Dv, Dk]")?
            .dim(0, "B", bsz, keys)?
            .dim(1, "Hv", hv, values)?
            .dim(2, "Dv", dv, values)?
            .dim(3, "Dk", dk, keys)?;
        if s.dtype != Dtype::Float32 {
            return Err(Error::Dtype(format!(
                "state: dtype {} is not accepted (the recurrent state is float32 only)",
                s.dtype.name()
            )));
        }
    }
    if let Some(mask) = mask {
        let m = ArgInfo::of("mask", mask)?;
        m.rank(2, "[B, T]")?
            .dim(0, "B", bsz, keys)?
            .dim(1, "T", t, keys)?;
        if m.dtype != Dtype::Bool {
            return Err(Error::Dtype(format!(
                "mask: dtype {} is not accepted (expected bool, true = real token)",
                m.dtype.name()
            )));
        }
    }
    Ok(())
}

/// The arrays of one prefix-state replay (borrowed from the registry) and the accepted lengths.
pub struct StateInputs<'a> {
    pub k: &'a Array,
    pub v: &'a Array,
    pub a: &'a Array,
    pub b: &'a Array,
    pub a_log: &'a Array,
    pub dt_bias: &'a Array,
    pub state: Option<&'a Array>,
    pub accepted_lengths: &'a [i32],
}

/// Validates every argument of `mlxk_gated_delta_state`.
pub fn check_state(x: &StateInputs) -> Result<Node> {
    check_state_counted(x, "n_lengths", Results::Update)
}

/// [`check_state`] for a call whose count of accepted lengths is the parameter `count`
/// (`n_lengths` for `mlxk_gated_delta_state`, `n_slots` for `mlxk_gated_delta_state_pool`),
/// which a message about that count names, and that makes `results` (`Update`: state_out;
/// `Pool`: the rows' states, which the pool call checks itself as pool_out).
pub(crate) fn check_state_counted(x: &StateInputs, count: &str, results: Results) -> Result<Node> {
    let k = ArgInfo::of("k", x.k)?;
    let v = ArgInfo::of("v", x.v)?;
    let a = ArgInfo::of("a", x.a)?;
    let b = ArgInfo::of("b", x.b)?;
    let a_log = ArgInfo::of("a_log", x.a_log)?;
    let dt_bias = ArgInfo::of("dt_bias", x.dt_bias)?;
    k.rank(4, "[B, T, Hk, Dk]")?.float()?;
    let (bsz, t, hk, dk) = (k.shape[0], k.shape[1], k.shape[2], k.shape[3]);
    v.rank(4, "[B, T, Hv, Dv]")?
        .dim(0, "B", bsz, "k")?
        .dim(1, "T", t, "k")?
        .same_dtype(&k)?;
    let (hv, dv) = (v.shape[2], v.shape[3]);
    check_dims(hk, hv, dk, dv).map_err(|e| match e {
        Error::Shape(m) => Error::Shape(m.replace("q: ", "k: ")),
        other => other,
    })?;
    for gate in [&a, &b] {
        gate.rank(3, "[B, T, Hv]")?
            .dim(0, "B", bsz, "k")?
            .dim(1, "T", t, "k")?
            .dim(2, "Hv", hv, "v")?
            .float()?;
    }
    check_gate(&a_log, &a, &dt_bias, hv)?;
    check_state_and_mask(x.state, None, ("k", "v"), bsz, t, hv, dv, dk)?;
    if x.accepted_lengths.len() as i64 != bsz {
        return Err(Error::InvalidArgument(format!(
            "accepted_lengths: {count} is {}, expected one length per batch row (B = {bsz})",
            x.accepted_lengths.len()
        )));
    }
    for (row, &len) in x.accepted_lengths.iter().enumerate() {
        if len < 0 || len as i64 > t {
            return Err(Error::InvalidArgument(format!(
                "accepted_lengths[{row}] is {len}; expected 0 <= length <= T ({t})"
            )));
        }
    }
    let states = match results {
        Results::Pool => "the rows' states (internal)",
        Results::Update | Results::Backward => "state_out",
    };
    memory::check_outputs(&[
        (states, &[bsz, hv, dv, dk], Dtype::Float32),
        ("g (internal)", &[bsz, t, hv], Dtype::Float32),
        ("beta (internal)", &[bsz, t, hv], b.dtype),
    ])?;
    Ok(Node {
        dims: dims(bsz, t, hk, hv, dk, dv),
        dtype: k.dtype,
        gates: gate_dtypes(&a, &b, &a_log, &dt_bias),
        has_state: x.state.is_some(),
        has_mask: false,
        form: Form::State,
        pool: None,
    })
}

/// The validated dimensions as the node carries them (all non-negative: they are checked
/// array dimensions).
fn dims(b: i64, t: i64, hk: i64, hv: i64, dk: i64, dv: i64) -> Dims {
    let u = |x: i64| x as usize;
    Dims {
        b: u(b),
        t: u(t),
        hk: u(hk),
        hv: u(hv),
        dk: u(dk),
        dv: u(dv),
    }
}

fn gate_dtypes(a: &ArgInfo, b: &ArgInfo, a_log: &ArgInfo, dt_bias: &ArgInfo) -> GateDtypes {
    GateDtypes {
        a: a.dtype,
        b: b.dtype,
        a_log: a_log.dtype,
        dt_bias: dt_bias.dtype,
    }
}

/// Builds the recurrence: returns `(y, state_out)`, lazy.
pub fn update(x: &Inputs, backend: Backend) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    let node = check_update(x)?;
    Ok(two_outputs(build(&node, &x.arrays(), backend)?))
}

/// Builds the chunked (WY-form) recurrence: returns `(y, state_out)`, lazy. The same arguments
/// as `update` plus the chunk size. On the CPU the chunked kernel
/// (`crate::cpu::gated_delta::chunked`); on a GPU the two chunked launches
/// (`graph::build_gpu_chunked`), which run chunks of at most
/// `metal::gated_delta::chunked::GPU_MAX_CHUNK` tokens; a call without a token or a batch row
/// runs the exact update's launch (its results: y empty, the state unchanged).
pub fn update_chunked(
    x: &Inputs,
    chunk: ChunkSize,
    backend: Backend,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    let mut node = check_update(x)?;
    if backend == Backend::Cpu {
        node.form = Form::Chunked { chunk };
        return Ok(two_outputs(build(&node, &x.arrays(), Backend::Cpu)?));
    }
    if node.dims.b == 0 || node.dims.t == 0 {
        return Ok(two_outputs(build(&node, &x.arrays(), backend)?));
    }
    node.form = Form::Chunked { chunk };
    check_chunked_gpu(&node)?;
    Ok(two_outputs(graph::build_gpu_chunked(
        &node,
        &x.arrays(),
        backend,
    )?))
}

/// The GPU chunked form's scratch for a dense node, checked against the memory limit before
/// anything is built (`check_chunked_gpu_scratch` with B·Hv heads of NC chunks and NC + 1
/// kept states each).
fn check_chunked_gpu(node: &Node) -> Result<()> {
    let d = node.dims;
    let c = crate::metal::gated_delta::chunked::launch_chunk(node);
    let chunks = d.t.div_ceil(c) as u64;
    check_chunked_gpu_scratch(d, c, (d.b * d.hv) as u64, chunks, chunks + 1)
}

/// The GPU chunked form's scratch, checked against the memory limit: the prep launch's outputs
/// (float32: W, U0, the decayed keys, P and γ, `heads·chunks·C·(2 Dk + Dv + C + 1)` floats),
/// then with them the state pass's (the kept states, `heads·slots·Dv·Dk` floats, and U,
/// `heads·chunks·C·Dv`), each refusal naming what does not fit; `heads` rows of `chunks`
/// chunks each (a pool node: Hv heads over its whole chunk table, `slots` = chunks + rows).
/// Also refuses an output pass whose grid would pass 2^31 threads.
pub(super) fn check_chunked_gpu_scratch(
    d: Dims,
    c: usize,
    heads: u64,
    chunks: u64,
    slots: u64,
) -> Result<()> {
    use crate::metal::gated_delta::chunked;
    let rows = heads.saturating_mul(chunks).saturating_mul(c as u64);
    let per_row = (2 * d.dk + d.dv + c + 1) as u64;
    let parts = rows.saturating_mul(per_row).saturating_mul(4);
    memory::check_bytes(
        "the GPU chunked form's per-chunk matrices (internal)",
        parts,
    )?;
    let states = heads
        .saturating_mul(slots)
        .saturating_mul((d.dv * d.dk) as u64);
    let kept = states
        .saturating_add(rows.saturating_mul(d.dv as u64))
        .saturating_mul(4);
    memory::check_bytes(
        &format!(
            "the GPU chunked form's kept states (the state entering each of its {chunks} \
             chunks and the final ones, {slots} states of Dv·Dk floats a head) and U, with its \
             per-chunk matrices (internal)"
        ),
        kept.saturating_add(parts),
    )?;
    let threads = (chunked::chunk_out_threads(c, d.dv) as u64).saturating_mul(chunks);
    if threads > i32::MAX as u64 {
        return Err(Error::Unsupported(format!(
            "the GPU chunked form's output pass would need {threads} threads along its grid's \
             x axis ({} per chunk of {c} tokens, {chunks} chunks), over 2^31 - 1; split the \
             call along T",
            chunked::chunk_out_threads(c, d.dv),
        )));
    }
    Ok(())
}

impl Inputs<'_> {
    fn arrays(&self) -> Arrays<'_> {
        Arrays {
            q: Some(self.q),
            k: Some(self.k),
            v: Some(self.v),
            a: Some(self.a),
            b: Some(self.b),
            a_log: Some(self.a_log),
            dt_bias: Some(self.dt_bias),
            state: self.state,
            mask: self.mask,
            ..Arrays::default()
        }
    }
}

impl StateInputs<'_> {
    fn arrays(&self) -> Arrays<'_> {
        Arrays {
            k: Some(self.k),
            v: Some(self.v),
            a: Some(self.a),
            b: Some(self.b),
            a_log: Some(self.a_log),
            dt_bias: Some(self.dt_bias),
            state: self.state,
            ..Arrays::default()
        }
    }
}
