//! `compute_g` and the gated-delta recurrence: argument checks and graph building.

use cxx::UniquePtr;

use super::shape::ArgInfo;
use crate::bridge::{self, Array, ArrayList, CpuLaunch};
use crate::cpu::CpuKernel;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal;

/// The dimensions of one recurrence call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub b: i64,
    pub t: i64,
    pub hk: i64,
    pub hv: i64,
    pub dk: i64,
    pub dv: i64,
}

/// Where the recurrence runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The MLX primitive running the Rust kernel.
    Cpu,
    /// `mx::fast::metal_kernel`; `gpu = false` passes a CPU stream (only tests do that, to
    /// reach the Metal launch on machines without Metal).
    Metal { gpu: bool },
}

impl Backend {
    pub fn current() -> Backend {
        if super::device::gpu() {
            Backend::Metal { gpu: true }
        } else {
            Backend::Cpu
        }
    }
}

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
    Ok(bridge::compute_g(a_log, a, dt_bias, super::device::gpu())?)
}

/// Validates every argument of `mlxk_gated_delta_update` (before any graph is built).
pub fn check_update(x: &Inputs) -> Result<(Dims, Dtype)> {
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
    for gate in [&a, &b] {
        gate.rank(3, "[B, T, Hv]")?
            .dim(0, "B", bsz, "q")?
            .dim(1, "T", t, "q")?
            .dim(2, "Hv", hv, "v")?
            .float()?;
    }
    check_gate(&a_log, &a, &dt_bias, hv)?;
    check_state_and_mask(x.state, x.mask, "q", bsz, t, hv, dv, dk)?;
    let dims = Dims {
        b: bsz,
        t,
        hk,
        hv,
        dk,
        dv,
    };
    memory::check_outputs(&[
        ("y", &[bsz, t, hv, dv], q.dtype),
        ("state_out", &[bsz, hv, dv, dk], Dtype::Float32),
        ("g (internal)", &[bsz, t, hv], Dtype::Float32),
        ("beta (internal)", &[bsz, t, hv], b.dtype),
    ])?;
    Ok((dims, q.dtype))
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
    keys: &str,
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
            .dim(1, "Hv", hv, "v")?
            .dim(2, "Dv", dv, "v")?
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
            .dim(0, "B", bsz, "q")?
            .dim(1, "T", t, "q")?;
        if m.dtype != Dtype::Bool {
            return Err(Error::Dtype(format!(
                "mask: dtype {} is not accepted (expected bool, true = real token)",
                m.dtype.name()
            )));
        }
    }
    Ok(())
}

pub fn list(arrays: &[&Array]) -> UniquePtr<ArrayList> {
    let mut list = bridge::list_new();
    for a in arrays {
        bridge::list_push(list.pin_mut(), a);
    }
    list
}

pub fn take(list: &ArrayList) -> Vec<UniquePtr<Array>> {
    (0..bridge::list_len(list))
        .map(|i| bridge::list_get(list, i))
        .collect()
}

/// Builds the recurrence: returns `(y, state_out)`, lazy.
pub fn update(x: &Inputs, backend: Backend) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    let (d, dtype) = check_update(x)?;
    let outputs = match backend {
        Backend::Cpu => cpu_update(x, d, dtype, CpuKernel::GatedDelta, &[])?,
        Backend::Metal { gpu } => {
            let m = MetalInputs::new(d, x.a_log, x.a, x.dt_bias, x.b, x.state, gpu)?;
            let (g, beta, state, t_in) = (&*m.g, &*m.beta, m.state(x.state), &*m.t_in);
            let mut inputs: Vec<&Array> = vec![x.q, x.k, x.v, g, beta, state, t_in];
            if let Some(m) = x.mask {
                inputs.push(m);
            }
            let launch = metal::gated_delta_launch(d, dtype, x.mask.is_some());
            take(&*bridge::metal_kernel_op(&launch, &list(&inputs), gpu)?)
        }
    };
    Ok(two_outputs(outputs))
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
    gpu: bool,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    // The chunk size first: it is an argument, the memory check in check_update a resource.
    let chunk = check_chunk(chunk)?;
    let (d, dtype) = check_update(x)?;
    if gpu {
        return Err(Error::Unsupported(
            "the chunked form runs on the CPU only and the default device is the GPU; use \
             mlxk_gated_delta_update there (its Metal kernel is the fast path), or select \
             MLXK_DEVICE_CPU"
                .into(),
        ));
    }
    let outputs = cpu_update(x, d, dtype, CpuKernel::GatedDeltaChunked, &[chunk as i64])?;
    Ok(two_outputs(outputs))
}

fn two_outputs(mut outputs: Vec<UniquePtr<Array>>) -> (UniquePtr<Array>, UniquePtr<Array>) {
    let state_out = outputs.pop().expect("two outputs");
    let y = outputs.pop().expect("two outputs");
    (y, state_out)
}

/// The CPU primitive node of an update (exact or chunked). The kernel computes g and beta
/// itself (MLX's formulas, bit for bit). `extra` follows the common parameters.
fn cpu_update(
    x: &Inputs,
    d: Dims,
    dtype: Dtype,
    kernel: CpuKernel,
    extra: &[i64],
) -> Result<Vec<UniquePtr<Array>>> {
    let mut inputs: Vec<&Array> = vec![x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias];
    let state_index = x.state.map(|s| {
        inputs.push(s);
        inputs.len() as i32 - 1
    });
    if let Some(m) = x.mask {
        inputs.push(m);
    }
    let mut params = cpu_params(d, dtype, x.a, x.b, x.a_log, x.dt_bias, x.state.is_some());
    params.push(x.mask.is_some() as i64);
    params.extend_from_slice(extra);
    let launch = CpuLaunch {
        kernel: kernel as u32,
        params,
        output_dims: vec![
            d.b as i32,
            d.t as i32,
            d.hv as i32,
            d.dv as i32, // y
            d.b as i32,
            d.hv as i32,
            d.dv as i32,
            d.dk as i32, // state_out
        ],
        output_ndims: vec![4, 4],
        output_dtypes: vec![dtype as i32, Dtype::Float32 as i32],
        donate_from: vec![-1, state_index.unwrap_or(-1)],
    };
    Ok(take(&*bridge::cpu_kernel_op(&launch, &list(&inputs))?))
}

/// What the Metal recurrence kernels take besides the caller's arrays: g and beta (MLX ops),
/// a zero state when none is given, and T as a 1-element int32 input.
struct MetalInputs {
    g: UniquePtr<Array>,
    beta: UniquePtr<Array>,
    zeros: Option<UniquePtr<Array>>,
    t_in: UniquePtr<Array>,
}

impl MetalInputs {
    #[allow(clippy::too_many_arguments)]
    fn new(
        d: Dims,
        a_log: &Array,
        a: &Array,
        dt_bias: &Array,
        b: &Array,
        state: Option<&Array>,
        gpu: bool,
    ) -> Result<MetalInputs> {
        let zeros = match state {
            Some(_) => None,
            None => Some(bridge::array_zeros(
                &[d.b as i32, d.hv as i32, d.dv as i32, d.dk as i32],
                Dtype::Float32 as i32,
            )?),
        };
        Ok(MetalInputs {
            g: bridge::compute_g(a_log, a, dt_bias, gpu)?,
            beta: bridge::sigmoid(b, gpu)?,
            zeros,
            t_in: bridge::array_from_bytes(&(d.t as i32).to_ne_bytes(), &[1], Dtype::Int32 as i32)?,
        })
    }

    /// The state input: the caller's, or zeros.
    fn state<'a>(&'a self, given: Option<&'a Array>) -> &'a Array {
        given.unwrap_or_else(|| {
            self.zeros
                .as_deref()
                .expect("zeros made when no state is given")
        })
    }
}

/// The CPU kernels' leading parameters: dims, the q/k/v dtype, the gate input dtypes and
/// whether a state is given.
fn cpu_params(
    d: Dims,
    dtype: Dtype,
    a: &Array,
    b: &Array,
    a_log: &Array,
    dt_bias: &Array,
    has_state: bool,
) -> Vec<i64> {
    vec![
        d.b,
        d.t,
        d.hk,
        d.hv,
        d.dk,
        d.dv,
        dtype as i64,
        bridge::array_dtype(a) as i64,
        bridge::array_dtype(b) as i64,
        bridge::array_dtype(a_log) as i64,
        bridge::array_dtype(dt_bias) as i64,
        has_state as i64,
    ]
}

/// The arrays of one prefix replay (borrowed from the registry) and the accepted lengths.
pub struct ReplayInputs<'a> {
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
pub fn check_replay(x: &ReplayInputs) -> Result<(Dims, Dtype)> {
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
    check_state_and_mask(x.state, None, "k", bsz, t, hv, dv, dk)?;
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
    let dims = Dims {
        b: bsz,
        t,
        hk,
        hv,
        dk,
        dv,
    };
    memory::check_outputs(&[
        ("state_out", &[bsz, hv, dv, dk], Dtype::Float32),
        ("g (internal)", &[bsz, t, hv], Dtype::Float32),
        ("beta (internal)", &[bsz, t, hv], b.dtype),
    ])?;
    Ok((dims, k.dtype))
}

/// Builds the prefix replay: returns the state after each row's accepted prefix, lazy.
pub fn replay(x: &ReplayInputs, backend: Backend) -> Result<UniquePtr<Array>> {
    let (d, dtype) = check_replay(x)?;
    let lengths: Vec<u8> = x
        .accepted_lengths
        .iter()
        .flat_map(|l| l.to_ne_bytes())
        .collect();
    let lengths = bridge::array_from_bytes(&lengths, &[d.b as i32], Dtype::Int32 as i32)?;
    let mut outputs = match backend {
        Backend::Cpu => {
            let mut inputs: Vec<&Array> = vec![x.k, x.v, x.a, x.b, x.a_log, x.dt_bias];
            let state_index = x.state.map(|s| {
                inputs.push(s);
                inputs.len() as i32 - 1
            });
            inputs.push(&lengths);
            let launch = CpuLaunch {
                kernel: CpuKernel::GatedDeltaState as u32,
                params: cpu_params(d, dtype, x.a, x.b, x.a_log, x.dt_bias, x.state.is_some()),
                output_dims: vec![d.b as i32, d.hv as i32, d.dv as i32, d.dk as i32],
                output_ndims: vec![4],
                output_dtypes: vec![Dtype::Float32 as i32],
                donate_from: vec![state_index.unwrap_or(-1)],
            };
            take(&*bridge::cpu_kernel_op(&launch, &list(&inputs))?)
        }
        Backend::Metal { gpu } => {
            let m = MetalInputs::new(d, x.a_log, x.a, x.dt_bias, x.b, x.state, gpu)?;
            let (g, beta, state, t_in) = (&*m.g, &*m.beta, m.state(x.state), &*m.t_in);
            let inputs: Vec<&Array> = vec![x.k, x.v, g, beta, state, t_in, &lengths];
            let launch = metal::gated_delta_state_launch(d);
            take(&*bridge::metal_kernel_op(&launch, &list(&inputs), gpu)?)
        }
    };
    Ok(outputs.pop().expect("one output"))
}
