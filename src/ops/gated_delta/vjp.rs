//! The gradients of the update (`mlxk_gated_delta_update_vjp`, and MLX's autograd through the
//! GPU kernels): the CPU backward node, the GPU backward kernel and its MLX-op tail.

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal::gated_delta::{self as metal, chunked};
use crate::node::gated_delta::{Backward, BackwardInput, ChunkSize, Form, Input, Node};
use crate::node::Words;
use crate::ops::shape::ArgInfo;
use crate::ops::{cpu_node, gpu_node, silu_rms_heads, Backend};

use super::chunked_vjp;
use super::graph::{caller_array, gpu_inputs};
use super::{check_update_as, Inputs, Results};

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
    let node = check_update_as(x, Results::Backward)?;
    let backward = check_vjp(&node, dy, dstate_out)?;
    if backend != Backend::Cpu {
        return update_vjp_gpu(x, &node, dy, dstate_out, backend);
    }
    cpu_vjp(x, backward, dy, dstate_out)
}

/// The backward pass of the chunked form (`mlxk_gated_delta_update_chunked_vjp`): on the CPU
/// the chunked form's own backward (`cpu::gated_delta::chunked::chunked_backward`), with chunks
/// of `chunk` tokens; with a GPU backend the chunked GPU backward
/// (`chunked_vjp`, `kernels/metal/gated_delta_chunked_backward.metal`). Lazy.
pub fn update_chunked_vjp(
    x: &Inputs,
    chunk: ChunkSize,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
    backend: Backend,
) -> Result<Gradients> {
    let node = check_update_as(x, Results::Backward)?;
    let mut backward = check_vjp(&node, dy, dstate_out)?;
    if backend != Backend::Cpu {
        // The chunked kernels (`kernels/metal/gated_delta_chunked_backward.metal`).
        let mut node = node;
        node.form = crate::node::gated_delta::Form::Chunked { chunk };
        return update_vjp_gpu(x, &node, dy, dstate_out, backend);
    }
    // The kept states and residuals of the jobs running at once (at most one per worker
    // thread, each a key head's value heads over ceil(T/C) chunks).
    let d = node.dims;
    let (group, dvp) = (d.hv / d.hk.max(1), d.dv.div_ceil(16) * 16);
    let c = chunk.tokens();
    let per_job = (group * d.t.div_ceil(c)) as u64 * ((d.dk + c) * dvp * 4) as u64;
    let jobs = (crate::cpu::pool::threads() as u64).min((d.b * d.hk) as u64);
    memory::check_bytes(
        "the chunked backward's kept states",
        per_job.saturating_mul(jobs),
    )?;
    backward.forward.form = crate::node::gated_delta::Form::Chunked { chunk };
    cpu_vjp(x, backward, dy, dstate_out)
}

/// The CPU backward node `backward` on the caller's arrays and cotangents.
fn cpu_vjp(
    x: &Inputs,
    backward: Backward,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
) -> Result<Gradients> {
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
pub(super) fn update_vjp_gpu(
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
    let [dq, dk, dv, dg, dbeta, dstate] = backward_gpu_any(node, &kernel, dy, dstate_out, backend)?;
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

/// The GPU backward of `node`'s form: the chunked kernels for `Form::Chunked`
/// (`chunked_vjp`), else the exact form's kernel.
fn backward_gpu_any(
    node: &Node,
    x: &KernelInputs,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
    backend: Backend,
) -> Result<[UniquePtr<Array>; 6]> {
    match node.form {
        Form::Chunked { chunk } => {
            let x = chunked_vjp::ChunkedInputs {
                q: x.q,
                k: x.k,
                v: x.v,
                g: x.g,
                beta: x.beta,
                state: x.state,
                mask: x.mask,
            };
            chunked_vjp::backward_gpu_chunked(node, &x, dy, dstate_out, backend, chunk)
        }
        _ => backward_gpu(node, x, dy, dstate_out, backend),
    }
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
    // The chunked form's output node takes P, γ, the kept states and U after the exact
    // update's inputs (graph::build_gpu_chunked); they stand behind stop_gradient and get zeros.
    let extra = matches!(node.form, Form::Chunked { .. })
        && primals.len() == order.len() + chunked::CHUNK_OUT_PARTS.len();
    if (order.len() != primals.len() && !extra) || cotangents.len() != 2 {
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
    let [dq, dk, dv, dg, dbeta, dstate] = backward_gpu_any(
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
    let parts = primals[order.len()..]
        .iter()
        .map(|p| crate::ops::zeros_like(p))
        .collect::<Result<Vec<_>>>()?;
    let mut grads = order
        .iter()
        .zip(primals)
        .map(
            |(&input, primal)| match by_input.iter().position(|(i, _)| *i == input) {
                Some(at) => Ok(by_input.swap_remove(at).1),
                None => crate::ops::zeros_like(primal),
            },
        )
        .collect::<Result<Vec<_>>>()?;
    grads.extend(parts);
    Ok(grads)
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
