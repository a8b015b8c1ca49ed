//! `compute_g` and the gated-delta recurrence: argument checks and graph building.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use cxx::UniquePtr;

use super::shape::ArgInfo;
use super::{cpu_node, gpu_node, silu_rms_heads, Backend};
use crate::bridge::{self, Array};
use crate::cuda;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal;
use crate::node::gated_delta::{Backward, BackwardInput, Dims, Form, GateDtypes, Input, Node};
use crate::node::silu_rms_heads::Node as SplitNode;
use crate::node::{Kernel, Words};

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
    )?;
    Ok(Node {
        dims: dims(bsz, t, hk, hv, dk, dv),
        dtype: q.dtype,
        gates: gate_dtypes(&a, &b, &a_log, &dt_bias),
        has_state: x.state.is_some(),
        has_mask: x.mask.is_some(),
        form: Form::Exact,
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
    memory::check_outputs(&[
        ("y", &[bsz, t, hv, dv], dtype),
        ("state_out", &[bsz, hv, dv, dk], Dtype::Float32),
        ("g (internal)", &[bsz, t, hv], Dtype::Float32),
        ("beta (internal)", &[bsz, t, hv], b.dtype),
    ])
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
            "accepted_lengths: n_lengths is {}, expected one length per batch row (B = {bsz})",
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
    memory::check_outputs(&[
        ("state_out", &[bsz, hv, dv, dk], Dtype::Float32),
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

/// The arrays and arguments of one update from the convolution's output
/// (`mlxk_gated_delta_update_from_conv`): the head split's, then the update's without q, k, v.
pub struct FromConvInputs<'a> {
    pub split: silu_rms_heads::Inputs<'a>,
    pub a: &'a Array,
    pub b: &'a Array,
    pub a_log: &'a Array,
    pub dt_bias: &'a Array,
    pub state: Option<&'a Array>,
    pub mask: Option<&'a Array>,
}

/// Validates every argument of `mlxk_gated_delta_update_from_conv`: the head split's (its
/// checks and messages, the size of its q, k and v included), then what the update needs
/// beyond them, named by the caller's arguments, and the size of the update's results: the
/// checks of the two calls it stands for, in their order. Returns the update's node and the
/// head split's.
pub fn check_update_from_conv(x: &FromConvInputs) -> Result<(Node, SplitNode)> {
    let split = silu_rms_heads::check(&x.split)?;
    let d = split.dims;
    let [bsz, t, hk, hv, dk, dv] = [d.b, d.s, d.hk, d.hv, d.dk, d.dv].map(|v| v as i64);
    if hv % hk != 0 {
        return Err(Error::InvalidArgument(format!(
            "value_heads is {hv}; expected a multiple of key_heads = {hk} (each value head h \
             reads key head h / (value_heads / key_heads))"
        )));
    }
    if dk % 32 != 0 || dk < 32 {
        return Err(Error::Shape(format!(
            "q_scale: Dk (its length) is {dk}; the update needs a multiple of 32 in [32, {}] \
             (each of the 32 SIMD lanes owns Dk/32 state elements)",
            silu_rms_heads::MAX_HEAD_WIDTH
        )));
    }
    let a = ArgInfo::of("a", x.a)?;
    let b = ArgInfo::of("b", x.b)?;
    let a_log = ArgInfo::of("a_log", x.a_log)?;
    let dt_bias = ArgInfo::of("dt_bias", x.dt_bias)?;
    let gates = [&a, &b, &a_log, &dt_bias];
    let sources = ("x", "value_heads");
    check_update_rest(
        gates,
        x.state,
        x.mask,
        sources,
        [bsz, t, hv, dv, dk],
        split.dtype,
    )?;
    let node = Node {
        dims: dims(bsz, t, hk, hv, dk, dv),
        dtype: split.dtype,
        gates: gate_dtypes(&a, &b, &a_log, &dt_bias),
        has_state: x.state.is_some(),
        has_mask: x.mask.is_some(),
        form: Form::Exact,
    };
    Ok((node, split))
}

/// Builds the head split and the update in one (`mlxk_gated_delta_update_from_conv`): returns
/// `(y, state_out)`, lazy, the bits of `silu_rms_heads::split` followed by `update`. On a GPU,
/// for the calls `one_kernel` picks, one kernel computes each token's q, k and v where the
/// recurrence reads them (`metal::gated_delta_from_conv_launch`): one node instead of two.
/// Otherwise the two nodes (always on the CPU).
pub fn update_from_conv(
    x: &FromConvInputs,
    backend: Backend,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    let (node, split) = check_update_from_conv(x)?;
    if !one_kernel(backend, node.dims) {
        // The two nodes, from the nodes checked above (the update's is the one `check_update`
        // makes for the split's q, k and v).
        let (q, k, v) = silu_rms_heads::build(&split, &x.split, backend)?;
        let arrays = Arrays {
            q: Some(&q),
            k: Some(&k),
            v: Some(&v),
            ..x.gate_arrays()
        };
        return Ok(two_outputs(build(&node, &arrays, backend)?));
    }
    let arrays = Arrays {
        x: Some(x.split.x),
        q_scale: Some(x.split.q_scale),
        k_scale: Some(x.split.k_scale),
        ..x.gate_arrays()
    };
    Ok(two_outputs(build_gpu(
        &node,
        &arrays,
        backend,
        Some(split.eps),
    )?))
}

/// Whether `update_from_conv` takes its one kernel. That kernel saves a node's dispatch (the
/// host's work per node sets a small batch's pace) and adds each token's x, SiLU and norm to
/// the latency of its sequential token loop, recomputed by every threadgroup of a head (more
/// GPU work, which counts once the GPU sets the pace). On an H200, µs a layer, pipelined, one
/// kernel against two: bench-cuda's `fromconvtokens` (over two and three runs) B = 1, T = 8
/// 24.8–25.1 / 29.6–42.7; B = 8, T = 4 28.6–29.0 / 38.7–44.4, T = 8 52.1 / 42.6–48.8; B = 32,
/// T = 2 49.7 / 43.8–44.3; its `layer` group (the library's calls) B = 32, T = 1 38.2 / 37.1–38.4
/// (serial 59.8–64.1 / 66.9–71.4), B = 256, T = 1 299.0 / 283.3. So on MLX CUDA: 1 to 8
/// tokens and at most 32 (batch, token) pairs. Metal takes it for one token a call (not
/// measured there).
fn one_kernel(backend: Backend, d: Dims) -> bool {
    if FROM_CONV_ANY_T.load(Ordering::Relaxed) {
        return backend != Backend::Cpu;
    }
    match backend {
        Backend::Cpu => false,
        Backend::Metal { .. } => d.t == 1,
        // No tokens: the two nodes (nothing to save).
        Backend::Cuda { .. } => (1..=8).contains(&d.t) && d.b * d.t <= 32,
    }
}

impl FromConvInputs<'_> {
    /// The update's arrays besides q, k and v.
    fn gate_arrays(&self) -> Arrays<'_> {
        Arrays {
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

/// Tokens per chunk of the chunked recurrence when the caller passes 0.
pub const DEFAULT_CHUNK: i32 = crate::cpu::chunked::DEFAULT_CHUNK as i32;

/// Validates the chunk size of `mlxk_gated_delta_update_chunked` (0 = the default).
pub fn check_chunk(chunk: i32) -> Result<usize> {
    let min = crate::cpu::chunked::MIN_CHUNK as i32;
    let max = crate::cpu::chunked::MAX_CHUNK as i32;
    match chunk {
        0 => Ok(DEFAULT_CHUNK as usize),
        c if (min..=max).contains(&c) && c % min == 0 => Ok(c as usize),
        c => Err(Error::InvalidArgument(format!(
            "chunk_size is {c}; expected 0 (the default, {DEFAULT_CHUNK}) or a multiple of \
             {min} in [{min}, {max}]"
        ))),
    }
}

/// Builds the chunked (WY-form) recurrence on the CPU: returns `(y, state_out)`, lazy. The
/// same arguments as `update` plus the chunk size (0 = default); no Metal form exists.
pub fn update_chunked(
    x: &Inputs,
    chunk: i32,
    backend: Backend,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    // The chunk size first: it is an argument, the memory check in check_update a resource.
    let chunk = check_chunk(chunk)?;
    let mut node = check_update(x)?;
    if backend != Backend::Cpu {
        return Err(Error::Unsupported(
            "the chunked form runs on the CPU only and the default device is the GPU; use \
             mlxk_gated_delta_update there (its Metal kernel is the fast path), or select \
             MLXK_DEVICE_CPU"
                .into(),
        ));
    }
    node.form = Form::Chunked { chunk };
    Ok(two_outputs(build(&node, &x.arrays(), Backend::Cpu)?))
}

fn two_outputs(mut outputs: Vec<UniquePtr<Array>>) -> (UniquePtr<Array>, UniquePtr<Array>) {
    let state_out = outputs.pop().expect("two outputs");
    let y = outputs.pop().expect("two outputs");
    (y, state_out)
}

/// The gradients of one update, as `mlxk_gated_delta_update_vjp` returns them: dq, dk, dv, da,
/// db, da_log, ddt_bias, dstate (lazy).
pub type Gradients = [UniquePtr<Array>; 8];

/// Validates the cotangents of `mlxk_gated_delta_update_vjp` against the forward's node.
pub fn check_vjp(node: &Node, dy: Option<&Array>, dstate_out: Option<&Array>) -> Result<Backward> {
    let d = node.dims;
    let (b, t, hv, dv, dk) = (
        d.b as i64,
        d.t as i64,
        d.hv as i64,
        d.dv as i64,
        d.dk as i64,
    );
    let mut dy_dtype = Dtype::Float32;
    if let Some(dy) = dy {
        let info = ArgInfo::of("dy", dy)?;
        info.rank(4, "[B, T, Hv, Dv]")?
            .dim(0, "B", b, "q")?
            .dim(1, "T", t, "q")?
            .dim(2, "Hv", hv, "v")?
            .dim(3, "Dv", dv, "v")?
            .float()?;
        dy_dtype = info.dtype;
    }
    if let Some(ds) = dstate_out {
        let info = ArgInfo::of("dstate_out", ds)?;
        info.rank(4, "[B, Hv, Dv, Dk]")?
            .dim(0, "B", b, "q")?
            .dim(1, "Hv", hv, "v")?
            .dim(2, "Dv", dv, "v")?
            .dim(3, "Dk", dk, "q")?
            .dtype_in(&[Dtype::Float32])?;
    }
    let backward = Backward {
        forward: *node,
        has_dy: dy.is_some(),
        dy_dtype,
        has_dstate_out: dstate_out.is_some(),
        checkpoint: 0,
    };
    let outputs: Vec<(String, Vec<i64>, Dtype)> = backward
        .outputs()
        .into_iter()
        .zip(["dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"])
        .map(|(o, name)| {
            (
                name.to_string(),
                o.shape.iter().map(|&x| x as i64).collect(),
                o.dtype,
            )
        })
        .collect();
    // The kernel's own f32 buffers: q, k, v and dy widened, the gradients of q, k, v, g and beta.
    let internal = [b, t, 4 * d.hk as i64 * dk + 3 * hv * dv + 4 * hv];
    let mut refs: Vec<(&str, &[i64], Dtype)> = outputs
        .iter()
        .map(|(n, s, d)| (n.as_str(), s.as_slice(), *d))
        .collect();
    refs.push(("f32 working copies (internal)", &internal, Dtype::Float32));
    memory::check_outputs(&refs)?;
    Ok(backward)
}

/// Builds the update's backward pass (CPU kernel; with a GPU backend, MLX ops on its
/// stream): the gradients of `sum(dy · y) + sum(dstate_out
/// · state_out)` with respect to every input (NULL cotangents are zeros), lazy.
pub fn update_vjp(
    x: &Inputs,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
    backend: Backend,
) -> Result<Gradients> {
    let node = check_update(x)?;
    let backward = check_vjp(&node, dy, dstate_out)?;
    if backend != Backend::Cpu {
        return update_vjp_gpu(x, &node, dy, dstate_out, backend);
    }
    let arrays = x.arrays();
    let inputs: Vec<&Array> = backward
        .cpu_inputs()
        .into_iter()
        .map(|input| match input {
            BackwardInput::Forward(i) => caller_array(&arrays, i),
            BackwardInput::Dy => dy.expect("listed only when given"),
            BackwardInput::DstateOut => dstate_out.expect("listed only when given"),
        })
        .collect();
    let outputs = cpu_node(
        backward.kernel(),
        backward.encode(),
        &backward.outputs(),
        vec![-1; 8],
        &inputs,
    )?;
    let grads: [UniquePtr<Array>; 8] = outputs
        .try_into()
        .map_err(|_| Error::Backend("the backward node made the wrong number of outputs".into()))?;
    Ok(grads)
}

/// The update's backward pass with a GPU as default device (docs/DESIGN.md §4 "Gradients"):
/// g and β as MLX ops, the backward kernel (`kernels/metal/gated_delta_backward.metal`, on
/// Metal or CUDA), then the sums over each key head's value heads and the gates' chain as MLX
/// ops. Arguments already checked.
fn update_vjp_gpu(
    x: &Inputs,
    node: &Node,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
    backend: Backend,
) -> Result<Gradients> {
    let gpu = backend.gpu_stream();
    let g = bridge::compute_g(x.a_log, x.a, x.dt_bias, gpu)?;
    let beta = bridge::sigmoid(x.b, gpu)?;
    let kernel = KernelInputs {
        q: x.q,
        k: x.k,
        v: x.v,
        g: &g,
        beta: &beta,
        state: x.state,
        mask: x.mask,
    };
    let [dq, dk, dv, dg, dbeta, dstate] = backward_gpu(node, &kernel, dy, dstate_out, backend)?;
    let gates = bridge::gates_vjp(
        &bridge::list(&[x.a, x.b, x.a_log, x.dt_bias, &dg, &dbeta]),
        gpu,
    )?;
    let [da, db, da_log, ddt_bias]: [UniquePtr<Array>; 4] =
        bridge::take(&gates).try_into().map_err(|_| {
            Error::Backend("the gates' backward made the wrong number of outputs".into())
        })?;
    Ok([dq, dk, dv, da, db, da_log, ddt_bias, dstate])
}

/// The inputs of the GPU backward kernel besides the cotangents: the forward kernel's.
struct KernelInputs<'a> {
    q: &'a Array,
    k: &'a Array,
    v: &'a Array,
    g: &'a Array,
    beta: &'a Array,
    state: Option<&'a Array>,
    mask: Option<&'a Array>,
}

/// The GPU backward kernel and its tail: dq, dk (in q's dtype), dv (in v's), dg, dβ and dstate
/// (f32) of `node`'s exact update, lazy. Absent cotangents are zeros; without a token, a batch
/// row or a cotangent the gradients are zeros (dstate is dstate_out) and nothing is launched.
fn backward_gpu(
    node: &Node,
    x: &KernelInputs,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
    backend: Backend,
) -> Result<[UniquePtr<Array>; 6]> {
    let d = node.dims;
    let shape = |dims: &[usize]| dims.iter().map(|&n| n as i32).collect::<Vec<i32>>();
    let f32_zeros = |dims: &[usize]| bridge::array_zeros(&shape(dims), Dtype::Float32 as i32);
    let state_shape = [d.b, d.hv, d.dv, d.dk];
    let gate_shape = [d.b, d.t, d.hv];
    let c = metal::backward_checkpoint(d.t);
    let scratch = metal::backward_scratch(d, c);
    let parts = metal::backward_geometry(d.dv).1;
    // The kernel's buffers: its outputs (partial dq, dk, dg and dβ per value head and row
    // partition, dv, dstate) and its scratch (the kept states and one chunk's token states),
    // all f32.
    let f32_bytes = |dims: &[usize]| dims.iter().fold(4u64, |n, &k| n.saturating_mul(k as u64));
    let bytes = [
        f32_bytes(&[d.b, d.t, d.hv, 2 * parts * (d.dk + 1) + d.dv]),
        f32_bytes(&state_shape),
        f32_bytes(&scratch[0]),
        f32_bytes(&scratch[1]),
    ]
    .iter()
    .fold(0u64, |n, &k| n.saturating_add(k));
    memory::check_bytes(
        "the GPU backward pass (its gradients and kept states)",
        bytes,
    )?;
    if d.b == 0 || d.t == 0 || (dy.is_none() && dstate_out.is_none()) {
        let dtype = |a: &Array| bridge::array_dtype(a);
        return Ok([
            bridge::array_zeros(&shape(&[d.b, d.t, d.hk, d.dk]), dtype(x.q))?,
            bridge::array_zeros(&shape(&[d.b, d.t, d.hk, d.dk]), dtype(x.q))?,
            bridge::array_zeros(&shape(&[d.b, d.t, d.hv, d.dv]), dtype(x.v))?,
            f32_zeros(&gate_shape)?,
            f32_zeros(&gate_shape)?,
            match dstate_out {
                Some(ds) => bridge::array_astype(ds, Dtype::Float32 as i32, backend.gpu_stream())?,
                None => f32_zeros(&state_shape)?,
            },
        ]);
    }
    let zero_state = match x.state {
        Some(_) => None,
        None => Some(f32_zeros(&state_shape)?),
    };
    let zero_dy = match dy {
        Some(_) => None,
        None => Some(f32_zeros(&[d.b, d.t, d.hv, d.dv])?),
    };
    let zero_dstate = match dstate_out {
        Some(_) => None,
        None => Some(f32_zeros(&state_shape)?),
    };
    let tin: Vec<u8> = [d.t as i32, c as i32]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    let tin = bridge::array_from_bytes(&tin, &[2], Dtype::Int32 as i32)?;
    let mut inputs: Vec<&Array> = vec![
        x.q,
        x.k,
        x.v,
        x.g,
        x.beta,
        x.state
            .unwrap_or_else(|| zero_state.as_deref().expect("made above")),
        dy.unwrap_or_else(|| zero_dy.as_deref().expect("made above")),
        dstate_out.unwrap_or_else(|| zero_dstate.as_deref().expect("made above")),
        &tin,
    ];
    inputs.extend(x.mask);
    let mut forward = *node;
    forward.has_mask = x.mask.is_some();
    let make = || metal::gated_delta_backward_launch(&forward, c);
    let mut out = gpu_node(None, make, &inputs, backend, None)?.into_iter();
    let mut next = || {
        out.next()
            .ok_or_else(|| Error::Backend("the backward kernel made too few outputs".into()))
    };
    let (dq_h, dk_h, dv, dg_p, dbeta_p, dstate) =
        (next()?, next()?, next()?, next()?, next()?, next()?);
    let tail = bridge::gated_delta_backward_tail(
        &bridge::list(&[x.q, x.v, &dq_h, &dk_h, &dv, &dg_p, &dbeta_p]),
        d.hk as i32,
        backend.gpu_stream(),
    )?;
    let [dq, dk, dv, dg, dbeta]: [UniquePtr<Array>; 5] =
        bridge::take(&tail).try_into().map_err(|_| {
            Error::Backend("the backward's tail made the wrong number of outputs".into())
        })?;
    Ok([dq, dk, dv, dg, dbeta, dstate])
}

/// MLX's autograd through a GPU recurrence node (`ops::gpu_vjp`): `words` are the GPU
/// gradient description (fused gates or not, then the forward node), `primals` the launch's
/// inputs (`Node::metal_inputs` or `Node::cuda_fused_inputs`), `cotangents` those of y and the
/// state. Returns a gradient per primal (zeros for T and the mask).
pub(crate) fn gpu_vjp(
    words: &[i64],
    primals: &[&Array],
    cotangents: &[&Array],
    backend: Backend,
) -> Result<Vec<UniquePtr<Array>>> {
    let malformed =
        || Error::Backend("the recurrence's GPU gradient description is malformed".into());
    let (&fused, words) = words.split_first().ok_or_else(malformed)?;
    let node = Node::decode(words).map_err(Error::Backend)?;
    let order = if fused != 0 {
        node.cuda_fused_inputs()
    } else {
        node.metal_inputs()
    };
    if order.len() != primals.len() || cotangents.len() != 2 {
        return Err(malformed());
    }
    let find = |input: Input| order.iter().position(|&i| i == input).map(|i| primals[i]);
    let get = |input: Input| find(input).ok_or_else(malformed);
    let gpu = backend.gpu_stream();
    let (g, beta) = if fused != 0 {
        (
            Some(bridge::compute_g(
                get(Input::ALog)?,
                get(Input::A)?,
                get(Input::DtBias)?,
                gpu,
            )?),
            Some(bridge::sigmoid(get(Input::B)?, gpu)?),
        )
    } else {
        (None, None)
    };
    let kernel = KernelInputs {
        q: get(Input::Q)?,
        k: get(Input::K)?,
        v: get(Input::V)?,
        g: g.as_deref().map_or_else(|| get(Input::G), Ok)?,
        beta: beta.as_deref().map_or_else(|| get(Input::Beta), Ok)?,
        state: find(Input::State),
        mask: find(Input::Mask),
    };
    let [dq, dk, dv, dg, dbeta, dstate] = backward_gpu(
        &node,
        &kernel,
        Some(cotangents[0]),
        Some(cotangents[1]),
        backend,
    )?;
    let mut by_input: Vec<(Input, UniquePtr<Array>)> = vec![
        (Input::Q, dq),
        (Input::K, dk),
        (Input::V, dv),
        (Input::State, dstate),
    ];
    if fused != 0 {
        let gates = bridge::gates_vjp(
            &bridge::list(&[
                get(Input::A)?,
                get(Input::B)?,
                get(Input::ALog)?,
                get(Input::DtBias)?,
                &dg,
                &dbeta,
            ]),
            gpu,
        )?;
        for (input, grad) in [Input::A, Input::B, Input::ALog, Input::DtBias]
            .into_iter()
            .zip(bridge::take(&gates))
        {
            by_input.push((input, grad));
        }
    } else {
        // g and β are MLX ops of the caller's gate inputs: MLX's autograd chains these.
        let g_dtype = bridge::array_dtype(get(Input::G)?);
        let beta_dtype = bridge::array_dtype(get(Input::Beta)?);
        by_input.push((Input::G, bridge::array_astype(&dg, g_dtype, gpu)?));
        by_input.push((Input::Beta, bridge::array_astype(&dbeta, beta_dtype, gpu)?));
    }
    order
        .iter()
        .zip(primals)
        .map(
            |(&input, primal)| match by_input.iter().position(|(i, _)| *i == input) {
                Some(at) => Ok(by_input.swap_remove(at).1),
                None => super::zeros_like(primal),
            },
        )
        .collect()
}

/// MLX's autograd through a GPU node of the update from the convolution's output
/// (`ops::gpu_vjp`): `words` are fused gates or not, the head split's eps bits, then the
/// update's node; `primals` the launch's inputs (`gpu_inputs` with x and the scales). The
/// chain rule through the two parts: q, k and v again from the head split's GPU node, the
/// recurrence's backward on them (`gpu_vjp`), then the head split's backward of dq, dk, dv.
pub(crate) fn from_conv_gpu_vjp(
    words: &[i64],
    primals: &[&Array],
    cotangents: &[&Array],
    backend: Backend,
) -> Result<Vec<UniquePtr<Array>>> {
    let malformed = || {
        Error::Backend(
            "the gradient description of mlxk_gated_delta_update_from_conv's GPU node is \
             malformed"
                .into(),
        )
    };
    let [fused, eps_bits] = match words {
        [f, e, ..] => [*f, *e],
        _ => return Err(malformed()),
    };
    let node = Node::decode(&words[2..]).map_err(Error::Backend)?;
    let order = gpu_inputs(&node, fused != 0, true);
    if order.len() != primals.len() || order[..3] != [Input::X, Input::QScale, Input::KScale] {
        return Err(malformed());
    }
    let d = node.dims;
    let split = silu_rms_heads::Inputs {
        x: primals[0],
        q_scale: primals[1],
        k_scale: primals[2],
        key_heads: d.hk as i32,
        value_heads: d.hv as i32,
        value_width: d.dv as i32,
        eps: f32::from_bits(eps_bits as u32),
    };
    let split_node = silu_rms_heads::check_args(&split)?;
    let (q, k, v) = silu_rms_heads::build(&split_node, &split, backend)?;
    let mut recurrence_primals = vec![&*q, &*k, &*v];
    recurrence_primals.extend_from_slice(&primals[3..]);
    let mut recurrence_words = vec![fused];
    recurrence_words.extend_from_slice(&words[2..]);
    let mut grads = gpu_vjp(&recurrence_words, &recurrence_primals, cotangents, backend)?;
    let rest = grads.split_off(3);
    let [dq, dk, dv]: [UniquePtr<Array>; 3] = grads.try_into().map_err(|_| malformed())?;
    let mut out = silu_rms_heads::gpu_vjp(
        &split_node.encode(),
        &primals[..3],
        &[&*dq, &*dk, &*dv],
        backend,
    )?;
    out.extend(rest);
    Ok(out)
}

/// Builds the prefix replay: returns the state after each row's accepted prefix, lazy.
pub fn state(x: &StateInputs, backend: Backend) -> Result<UniquePtr<Array>> {
    let node = check_state(x)?;
    let lengths = lengths_array(x.accepted_lengths)?;
    let mut arrays = x.arrays();
    arrays.lengths = Some(&lengths);
    let mut outputs = build(&node, &arrays, backend)?;
    Ok(outputs.pop().expect("one output"))
}

/// The replay's accepted lengths as an int32 array [B], shared by calls with the same lengths.
///
/// The layers of one decode step replay the same lengths, and an array made from host memory
/// costs an allocation and a copy per call. On MLX CUDA that copy can also wait for the GPU:
/// when MLX's buffer cache hands back a device buffer of the size, MLX moves it to unified
/// memory with a synchronous `cudaMemcpy` (mlx/backend/cuda/allocator.cpp), so a pipelined
/// decode loop stalled on every layer (docs/DESIGN.md §3, MLX CUDA, "Caches"). MLX arrays are
/// immutable, so one array can serve every call with the same values. The last
/// `LENGTHS_KEPT` distinct lengths are kept; the caller holds the MLX lock (every op does).
fn lengths_array(lengths: &[i32]) -> Result<UniquePtr<Array>> {
    let mut kept = LENGTHS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(at) = kept.iter().position(|(l, _)| l.as_slice() == lengths) {
        let entry = kept.remove(at);
        let shared = bridge::array_share(&entry.1);
        kept.push(entry); // the most recently used last
        return Ok(shared);
    }
    let bytes: Vec<u8> = lengths.iter().flat_map(|l| l.to_ne_bytes()).collect();
    let array = bridge::array_from_bytes(&bytes, &[lengths.len() as i32], Dtype::Int32 as i32)?;
    if kept.len() >= LENGTHS_KEPT {
        kept.remove(0); // the least recently used
    }
    kept.push((lengths.to_vec(), bridge::array_share(&array)));
    Ok(array)
}

const LENGTHS_KEPT: usize = 8;

/// The kept lengths arrays (`lengths_array`), least recently used first.
static LENGTHS: Mutex<Vec<(Vec<i32>, UniquePtr<Array>)>> = Mutex::new(Vec::new());

/// The caller's arrays of one call, by input (None: not given).
#[derive(Default)]
struct Arrays<'a> {
    q: Option<&'a Array>,
    k: Option<&'a Array>,
    v: Option<&'a Array>,
    a: Option<&'a Array>,
    b: Option<&'a Array>,
    a_log: Option<&'a Array>,
    dt_bias: Option<&'a Array>,
    state: Option<&'a Array>,
    mask: Option<&'a Array>,
    lengths: Option<&'a Array>,
    /// The recurrence from the convolution's output: x and the head split's scales.
    x: Option<&'a Array>,
    q_scale: Option<&'a Array>,
    k_scale: Option<&'a Array>,
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

/// Builds `node` on `backend` from the caller's arrays, taking them in the order the node
/// defines for that backend.
fn build(node: &Node, x: &Arrays, backend: Backend) -> Result<Vec<UniquePtr<Array>>> {
    match backend {
        Backend::Cpu => {
            let inputs = node
                .cpu_inputs()
                .into_iter()
                .map(|input| caller_array(x, input))
                .collect::<Vec<_>>();
            cpu_node(
                node.kernel(),
                node.encode(),
                &node.outputs(),
                node.donations(),
                &inputs,
            )
        }
        gpu => build_gpu(node, x, gpu, None),
    }
}

/// The GPU node of `node` on `backend` (not the CPU). `from_conv`: the head split's eps when
/// the launch computes q, k and v from the convolution's output (`update_from_conv`; the
/// arrays then hold x and the scales instead of q, k and v).
fn build_gpu(
    node: &Node,
    x: &Arrays,
    gpu: Backend,
    from_conv: Option<f32>,
) -> Result<Vec<UniquePtr<Array>>> {
    // On CUDA the kernel computes the gates itself (crate::cuda::with_fused_gates).
    let fused = matches!(gpu, Backend::Cuda { .. }) && !GPU_GATES_ON_CPU.load(Ordering::Relaxed);
    let m = MetalInputs::new(node, x, gpu.gpu_stream(), !fused)?;
    let order = gpu_inputs(node, fused, from_conv.is_some());
    let inputs = order
        .into_iter()
        .map(|input| match input {
            Input::G => m.g.as_deref().expect("gates made for this launch"),
            Input::Beta => m.beta.as_deref().expect("gates made for this launch"),
            Input::State => x.state.unwrap_or_else(|| m.zeros()),
            other => caller_array(x, other),
        })
        .collect::<Vec<_>>();
    let make = || {
        let mut launch = match gpu {
            Backend::Cuda { .. } => {
                metal::gated_delta_launch_rows(node, cuda::rows_per_simd_group(node.dims))
            }
            _ => metal::gated_delta_launch(node),
        };
        if let Some(eps) = from_conv {
            launch = metal::gated_delta_from_conv_launch(launch, eps);
        }
        if fused {
            cuda::with_fused_gates(launch)
        } else {
            launch
        }
    };
    // The launch depends on the node, on whether the gates are fused and on the head split.
    let mut words = vec![fused as i64];
    if let Some(eps) = from_conv {
        words.push(i64::from(eps.to_bits()));
    }
    words.extend(node.encode());
    let mut key = words.clone();
    if from_conv.is_some() {
        key.push(-1); // never the key of a recurrence of its own (one word shorter)
    }
    // Exact updates carry a gradient for MLX's autograd (the replay has none).
    let kernel = if from_conv.is_some() {
        Kernel::GatedDeltaFromConv
    } else {
        Kernel::GatedDelta
    };
    let vjp = (node.form == Form::Exact).then(|| (kernel, super::gpu_vjp_params(gpu, words)));
    gpu_node(Some(key), make, &inputs, gpu, vjp)
}

/// A GPU launch's inputs in order: the Metal launch's, or with the gates fused on CUDA, and
/// with x and the scales for q, k and v when it computes them from the convolution's output.
fn gpu_inputs(node: &Node, fused: bool, from_conv: bool) -> Vec<Input> {
    let order = if fused {
        node.cuda_fused_inputs()
    } else {
        node.metal_inputs()
    };
    if from_conv {
        Node::from_conv_inputs(order)
    } else {
        order
    }
}

/// The caller's array for `input`; the node lists only inputs the call has.
fn caller_array<'a>(x: &Arrays<'a>, input: Input) -> &'a Array {
    let array = match input {
        Input::Q => x.q,
        Input::K => x.k,
        Input::V => x.v,
        Input::A => x.a,
        Input::B => x.b,
        Input::ALog => x.a_log,
        Input::DtBias => x.dt_bias,
        Input::State => x.state,
        Input::Mask => x.mask,
        Input::Lengths => x.lengths,
        Input::X => x.x,
        Input::QScale => x.q_scale,
        Input::KScale => x.k_scale,
        Input::G | Input::Beta => None,
    };
    array.unwrap_or_else(|| panic!("the node lists input {input:?}, which the call lacks"))
}

/// Tests only (`crate::testing::from_conv_one_kernel_any_tokens`): the update from the
/// convolution's output takes its one GPU kernel at any T.
pub(crate) static FROM_CONV_ANY_T: AtomicBool = AtomicBool::new(false);

/// Tests only (`crate::testing::gpu_gates_on_cpu`): the GPU kernels' g and beta come from MLX's
/// CPU ops, which give the CPU kernel's fused gates bit for bit, so a GPU result can be compared
/// with the CPU kernel's bits where only the gates' transcendentals differ.
pub(crate) static GPU_GATES_ON_CPU: AtomicBool = AtomicBool::new(false);

/// What the Metal recurrence kernels take besides the caller's arrays: g and beta (MLX ops)
/// and a zero state when none is given (T comes with k's shape).
struct MetalInputs {
    g: Option<UniquePtr<Array>>,
    beta: Option<UniquePtr<Array>>,
    zeros: Option<UniquePtr<Array>>,
}

impl MetalInputs {
    /// `gates`: whether to make g and beta (not when the kernel computes them).
    fn new(node: &Node, x: &Arrays, gpu: bool, gates: bool) -> Result<MetalInputs> {
        let d = node.dims;
        let zeros = match x.state {
            Some(_) => None,
            None => Some(bridge::array_zeros(
                &[d.b as i32, d.hv as i32, d.dv as i32, d.dk as i32],
                Dtype::Float32 as i32,
            )?),
        };
        let gate = |input| caller_array(x, input);
        let gates_gpu = gpu && !GPU_GATES_ON_CPU.load(Ordering::Relaxed);
        let (g, beta) = if gates {
            (
                Some(bridge::compute_g(
                    gate(Input::ALog),
                    gate(Input::A),
                    gate(Input::DtBias),
                    gates_gpu,
                )?),
                Some(bridge::sigmoid(gate(Input::B), gates_gpu)?),
            )
        } else {
            (None, None)
        };
        Ok(MetalInputs { g, beta, zeros })
    }

    /// The zero state made when the call gives none.
    fn zeros(&self) -> &Array {
        self.zeros
            .as_deref()
            .expect("zeros made when no state is given")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(a: &Array) -> Vec<i32> {
        let mut bytes = vec![0u8; bridge::array_nbytes(a)];
        bridge::array_read(a, &mut bytes).unwrap();
        bytes
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn replay_lengths_are_shared_by_value_and_the_kept_set_stays_bounded() {
        let _mlx = crate::registry::lock();
        // Values no other test uses, so tests running at the same time meet other entries only.
        let first = [-9_001, 3, 7];
        let a = lengths_array(&first).unwrap();
        assert_eq!(values(&a), first);
        assert_eq!(bridge::array_dtype(&a), Dtype::Int32 as i32);
        // Other lengths, then more distinct ones than are kept: each comes back with its values.
        for n in 0..12 {
            let other = [-9_002, n, 3 * n];
            assert_eq!(values(&lengths_array(&other).unwrap()), other);
            assert_eq!(
                values(&lengths_array(&first).unwrap()),
                first,
                "after {n} others"
            );
        }
        let longer = [-9_001, 3, 7, 0];
        assert_eq!(values(&lengths_array(&longer).unwrap()), longer);
        assert_eq!(values(&lengths_array(&first[..2]).unwrap()), first[..2]);
        assert!(LENGTHS.lock().unwrap().len() <= LENGTHS_KEPT);
    }

    #[test]
    fn the_update_from_conv_takes_one_kernel_where_it_was_measured_faster() {
        let d = |b, t| Dims {
            b,
            t,
            hk: 16,
            hv: 32,
            dk: 128,
            dv: 128,
        };
        let (cuda, metal) = (Backend::Cuda { gpu: true }, Backend::Metal { gpu: true });
        for (b, t, on_cuda) in [
            (1, 1, true),
            (32, 1, true),
            (33, 1, false),
            (256, 1, false),
            (1, 0, false),
            (1, 8, true),
            (4, 8, true),
            (8, 4, true),
            (16, 2, true),
            (1, 9, false),
            (8, 8, false),
            (32, 2, false),
            (1, 4096, false),
        ] {
            assert_eq!(one_kernel(cuda, d(b, t)), on_cuda, "CUDA B={b} T={t}");
            assert_eq!(one_kernel(metal, d(b, t)), t == 1, "Metal B={b} T={t}");
            assert!(!one_kernel(Backend::Cpu, d(b, t)), "CPU B={b} T={t}");
        }
    }
}
