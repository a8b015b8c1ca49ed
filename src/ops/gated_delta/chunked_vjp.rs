//! The chunked (WY / UT) form's backward pass on a GPU (docs/DESIGN.md §4 "Gradients"): the
//! five stages of `kernels/metal/gated_delta_chunked_backward.metal` (`crate::metal::gated_delta::chunked_backward`)
//! as nodes of one graph, then the tail the exact GPU backward uses (the sums over each key
//! head's value heads, the casts).

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal::gated_delta::chunked_backward::{
    backward_chunk, backward_chunked_scratch_floats, gated_delta_chunked_backward_launch,
    CHUNKED_BACKWARD_STAGES, CHUNKED_BACKWARD_THREADS,
};
use crate::node::gated_delta::{ChunkSize, Node};
use crate::ops::{gpu_node, Backend};

/// The arrays the chunked backward reads besides the cotangents: q, k, v, g and β (as the
/// GPU forward gets them), the state (None: zeros) and the mask.
pub(super) struct ChunkedInputs<'a> {
    pub(super) q: &'a Array,
    pub(super) k: &'a Array,
    pub(super) v: &'a Array,
    pub(super) g: &'a Array,
    pub(super) beta: &'a Array,
    pub(super) state: Option<&'a Array>,
    pub(super) mask: Option<&'a Array>,
}

/// The chunked backward and its tail: dq, dk (in q's dtype), dv (in v's), dg, dβ and dstate
/// (f32) of `node`'s update, with the forward's chunk size `chunk` (the kernels run
/// `backward_chunk(chunk)`), lazy. Same contract as the exact form's
/// `backward_gpu`: absent cotangents are zeros; without a token, a batch row or a cotangent the
/// gradients are zeros (dstate is dstate_out) and nothing is launched. dg is d/dg: the kernels
/// compute d(log g) and divide by g where g is a normal float (g ≥ 2⁻¹²⁶), 0 elsewhere.
pub(super) fn backward_gpu_chunked(
    node: &Node,
    x: &ChunkedInputs,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
    backend: Backend,
    chunk: ChunkSize,
) -> Result<[UniquePtr<Array>; 6]> {
    let d = node.dims;
    let c = backward_chunk(chunk);
    let shape = |dims: &[usize]| dims.iter().map(|&n| n as i32).collect::<Vec<i32>>();
    let f32_zeros = |dims: &[usize]| bridge::array_zeros(&shape(dims), Dtype::Float32 as i32);
    let state_shape = [d.b, d.hv, d.dv, d.dk];
    let gate_shape = [d.b, d.t, d.hv];
    // The stages' outputs: dq_h, dk_h, dv, dg, dβ, dstate and the scratch, all f32.
    let outputs = (d.b as u64)
        .saturating_mul(d.t as u64)
        .saturating_mul(d.hv as u64)
        .saturating_mul((2 * d.dk + d.dv + 2) as u64)
        .saturating_add((d.b * d.hv * d.dv * d.dk) as u64);
    let floats = outputs.saturating_add(backward_chunked_scratch_floats(d, c));
    memory::check_bytes(
        "the chunked GPU backward pass (its gradients, kept states and per-chunk matrices)",
        floats.saturating_mul(4),
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
    // Work items per stage launch: grid x = 128 threads each, an i32.
    let items = d.b * d.hv * d.t.div_ceil(c).max(d.dv);
    if items.saturating_mul(CHUNKED_BACKWARD_THREADS) > i32::MAX as usize {
        return Err(Error::Unsupported(format!(
            "the chunked GPU backward's launches would need {items} threadgroups (B·Hv·ceil(T / \
             {c})), over a grid of 2^31 threads; split the call along B or T"
        )));
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
    let tin = bridge::array_from_bytes(&(d.t as i32).to_ne_bytes(), &[1], Dtype::Int32 as i32)?;
    let mut forward = *node;
    forward.has_mask = x.mask.is_some();
    // Every array by the name the stages give it: the inputs, then each stage's outputs.
    let mut named: Vec<(String, UniquePtr<Array>)> = Vec::new();
    let given: Vec<(&str, &Array)> = vec![
        ("q", x.q),
        ("k", x.k),
        ("v", x.v),
        ("g", x.g),
        ("beta", x.beta),
        (
            "state_in",
            x.state
                .unwrap_or_else(|| zero_state.as_deref().expect("made above")),
        ),
        (
            "dy",
            dy.unwrap_or_else(|| zero_dy.as_deref().expect("made above")),
        ),
        (
            "dstate_out",
            dstate_out.unwrap_or_else(|| zero_dstate.as_deref().expect("made above")),
        ),
        ("Tin", &tin),
    ];
    for stage in 0..CHUNKED_BACKWARD_STAGES {
        let launch = gated_delta_chunked_backward_launch(&forward, c, stage);
        let find = |name: &str| -> Result<&Array> {
            if name == "mask" {
                return x
                    .mask
                    .ok_or_else(|| Error::Backend("the masked stage has no mask".into()));
            }
            given
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, a)| *a)
                .or_else(|| named.iter().find(|(n, _)| n == name).map(|(_, a)| &**a))
                .ok_or_else(|| Error::Backend(format!("the chunked backward has no array {name}")))
        };
        let inputs: Vec<&Array> = launch
            .input_names
            .iter()
            .map(|n| find(n))
            .collect::<Result<_>>()?;
        let output_names = launch.output_names.clone();
        let out = gpu_node(None, || launch, &inputs, backend, None)?;
        if out.len() != output_names.len() {
            return Err(Error::Backend(
                "a chunked backward stage made the wrong number of outputs".into(),
            ));
        }
        named.extend(output_names.into_iter().zip(out));
    }
    let mut take = |name: &str| -> Result<UniquePtr<Array>> {
        let at = named
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| Error::Backend(format!("the chunked backward made no {name}")))?;
        Ok(named.swap_remove(at).1)
    };
    let (dq_h, dk_h, dv, dg_p, dbeta_p, dstate) = (
        take("dq_h")?,
        take("dk_h")?,
        take("dv")?,
        take("dg_part")?,
        take("dbeta_part")?,
        take("dstate")?,
    );
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
