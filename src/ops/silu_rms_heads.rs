//! `mlxk_silu_rms_heads`: argument checks and graph building.

use cxx::UniquePtr;

use super::shape::{check_eps, ArgInfo};
use super::{cpu_node, same_inputs_node, Backend};
use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal;
use crate::node::silu_rms_heads::{Backward, BackwardInput, Dims, Node};
use crate::node::Words;

/// The widest head the kernel handles (32 lanes × 4 values).
pub const MAX_HEAD_WIDTH: i64 = 128;

pub struct Inputs<'a> {
    pub x: &'a Array,
    pub q_scale: &'a Array,
    pub k_scale: &'a Array,
    pub key_heads: i32,
    pub value_heads: i32,
    pub value_width: i32,
    pub eps: f32,
}

/// Validates `mlxk_silu_rms_heads`'s arguments, then the size of its results.
pub fn check(x: &Inputs) -> Result<Node> {
    check_named(x, ["q", "k", "v"])
}

/// [`check`] for a call whose q, k and v are called `names` in its messages: the head split's
/// own results, or another call's buffers (`q (internal)` in the update from the convolution's
/// output, whose parameters have no q, k or v).
pub(crate) fn check_named(x: &Inputs, [q, k, v]: [&str; 3]) -> Result<Node> {
    let node = check_args(x)?;
    let d = node.dims;
    let shape = |heads: usize, width: usize| [d.b, d.s, heads, width].map(|v| v as i64);
    memory::check_outputs(&[
        (q, &shape(d.hk, d.dk), node.dtype),
        (k, &shape(d.hk, d.dk), node.dtype),
        (v, &shape(d.hv, d.dv), node.dtype),
    ])?;
    Ok(node)
}

/// Validates the arguments the forward and its backward pass share (no sizes of results).
pub(crate) fn check_args(x: &Inputs) -> Result<Node> {
    let xi = ArgInfo::of("x", x.x)?;
    let qs = ArgInfo::of("q_scale", x.q_scale)?;
    let ks = ArgInfo::of("k_scale", x.k_scale)?;
    xi.rank(3, "[B, S, 2*Hk*Dk + Hv*Dv]")?.float()?;
    qs.rank(1, "[Dk]")?;
    let dk = qs.shape[0];
    ks.rank(1, "[Dk]")?.dim(0, "Dk", dk, "q_scale")?;
    qs.same_dtype(&xi)?;
    ks.same_dtype(&xi)?;
    if !(1..=MAX_HEAD_WIDTH).contains(&dk) {
        return Err(Error::Shape(format!(
            "q_scale: Dk (its length) is {dk}; heads of 1 to {MAX_HEAD_WIDTH} values are supported"
        )));
    }
    let (hk, hv, dv) = (
        x.key_heads as i64,
        x.value_heads as i64,
        x.value_width as i64,
    );
    if hk < 1 {
        return Err(Error::InvalidArgument(format!(
            "key_heads is {hk}; expected >= 1"
        )));
    }
    if hv < 1 {
        return Err(Error::InvalidArgument(format!(
            "value_heads is {hv}; expected >= 1"
        )));
    }
    if !(1..=MAX_HEAD_WIDTH).contains(&dv) {
        return Err(Error::InvalidArgument(format!(
            "value_width is {dv}; heads of 1 to {MAX_HEAD_WIDTH} values are supported"
        )));
    }
    check_eps(x.eps)?;
    let channels = 2 * hk * dk + hv * dv;
    if xi.shape[2] != channels {
        return Err(Error::Shape(format!(
            "x: dimension 2 (channels) is {}, expected 2*key_heads*Dk + value_heads*value_width \
             = 2*{hk}*{dk} + {hv}*{dv} = {channels}",
            xi.shape[2]
        )));
    }
    let (b, s) = (xi.shape[0], xi.shape[1]);
    if 32 * (2 * hk + hv) > i32::MAX as i64 {
        return Err(Error::InvalidArgument(format!(
            "key_heads {hk} and value_heads {hv}: too many heads for one launch"
        )));
    }
    let u = |x: i64| x as usize;
    Ok(Node {
        dims: Dims {
            b: u(b),
            s: u(s),
            hk: u(hk),
            hv: u(hv),
            dk: u(dk),
            dv: u(dv),
        },
        dtype: xi.dtype,
        eps: x.eps,
    })
}

/// Builds the head split: returns `(q, k, v)`, lazy.
pub fn split(
    x: &Inputs,
    backend: Backend,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>, UniquePtr<Array>)> {
    build(&check(x)?, x, backend)
}

/// The head split's node for checked arguments (`check`): `(q, k, v)`, lazy.
pub(crate) fn build(
    node: &Node,
    x: &Inputs,
    backend: Backend,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>, UniquePtr<Array>)> {
    // The CPU node and the Metal launch take the inputs in one order (node::silu_rms_heads::INPUTS).
    let inputs = [x.x, x.q_scale, x.k_scale];
    let mut outputs = same_inputs_node(
        node.kernel(),
        node.encode(),
        &node.outputs(),
        vec![-1; 3],
        &inputs,
        backend,
        || metal::silu_rms_heads::silu_rms_heads_launch(node),
    )?;
    let v = outputs.pop().expect("three outputs");
    let k = outputs.pop().expect("three outputs");
    let q = outputs.pop().expect("three outputs");
    Ok((q, k, v))
}

/// The head split's gradients as `mlxk_silu_rms_heads_vjp` returns them: dx, dq_scale, dk_scale
/// (lazy).
pub type Gradients = [UniquePtr<Array>; 3];

/// Validates the cotangents of `mlxk_silu_rms_heads_vjp` against the forward's node: dq, dk
/// `[B, S, Hk, Dk]` and dv `[B, S, Hv, Dv]`, any float dtype, each optional.
pub fn check_vjp(node: &Node, cotangents: [Option<&Array>; 3]) -> Result<Backward> {
    let d = node.dims;
    let (b, s, hk, hv, dk, dv) = (
        d.b as i64,
        d.s as i64,
        d.hk as i64,
        d.hv as i64,
        d.dk as i64,
        d.dv as i64,
    );
    let names = ["dq", "dk", "dv"];
    let mut dtypes = [None; 3];
    for (i, cotangent) in cotangents.iter().enumerate() {
        let Some(array) = cotangent else { continue };
        let info = ArgInfo::of(names[i], array)?;
        let (layout, heads, width, heads_from, width_from) = if i < 2 {
            ("[B, S, Hk, Dk]", hk, dk, "key_heads", "q_scale")
        } else {
            ("[B, S, Hv, Dv]", hv, dv, "value_heads", "value_width")
        };
        info.rank(4, layout)?
            .dim(0, "B", b, "x")?
            .dim(1, "S", s, "x")?
            .dim(2, if i < 2 { "Hk" } else { "Hv" }, heads, heads_from)?
            .dim(3, if i < 2 { "Dk" } else { "Dv" }, width, width_from)?
            .float()?;
        dtypes[i] = Some(info.dtype);
    }
    let backward = Backward {
        forward: *node,
        cotangents: dtypes,
    };
    let outputs = backward.outputs();
    let shape = |i: usize| {
        outputs[i]
            .shape
            .iter()
            .map(|&x| x as i64)
            .collect::<Vec<_>>()
    };
    let (dx, dscale) = (shape(0), shape(1));
    // The scales' gradients as f64 sums per job (at most 64 jobs): 2 · 64 f32 words each.
    let sums = [2 * 64, 2 * dk];
    memory::check_outputs(&[
        ("dx", &dx, node.dtype),
        ("dq_scale", &dscale, node.dtype),
        ("dk_scale", &dscale, node.dtype),
        ("scale sums (internal)", &sums, Dtype::Float32),
    ])?;
    Ok(backward)
}

/// Builds the head split's backward pass (CPU kernel; with a GPU backend, MLX ops on its
/// stream): the gradients of `sum(dq · q) + sum(dk ·
/// k) + sum(dv · v)` with respect to x, q_scale and k_scale (absent cotangents are zeros), lazy.
pub fn split_vjp(
    x: &Inputs,
    cotangents: [Option<&Array>; 3],
    backend: Backend,
) -> Result<Gradients> {
    let node = check_args(x)?;
    let backward = check_vjp(&node, cotangents)?;
    if backend != Backend::Cpu {
        // With a GPU as default device: MLX ops on its stream (docs/DESIGN.md §4 "Gradients").
        let mut inputs = vec![x.x, x.q_scale, x.k_scale];
        inputs.extend(cotangents.iter().flatten());
        let outputs = bridge::silu_rms_heads_vjp_ops(
            &bridge::list(&inputs),
            x.key_heads,
            x.value_heads,
            x.value_width,
            x.eps,
            cotangents[0].is_some(),
            cotangents[1].is_some(),
            cotangents[2].is_some(),
            backend.gpu_stream(),
        )?;
        return bridge::take(&outputs).try_into().map_err(|_| {
            Error::Backend("the backward pass made the wrong number of outputs".into())
        });
    }
    let inputs: Vec<&Array> = backward
        .cpu_inputs()
        .into_iter()
        .map(|input| match input {
            BackwardInput::X => x.x,
            BackwardInput::QScale => x.q_scale,
            BackwardInput::KScale => x.k_scale,
            BackwardInput::Cotangent(i) => cotangents[i].expect("listed only when given"),
        })
        .collect();
    let outputs = cpu_node(
        backward.kernel(),
        backward.encode(),
        &backward.outputs(),
        vec![-1; 3],
        &inputs,
    )?;
    outputs
        .try_into()
        .map_err(|_| Error::Backend("the backward node made the wrong number of outputs".into()))
}

/// MLX's autograd through a GPU head-split node (`ops::gpu_vjp`): `words` are the forward node,
/// `primals` its inputs (x, q_scale, k_scale), `cotangents` those of q, k, v. The MLX-ops
/// backward on the node's stream.
pub(crate) fn gpu_vjp(
    words: &[i64],
    primals: &[&Array],
    cotangents: &[&Array],
    backend: Backend,
) -> Result<Vec<UniquePtr<Array>>> {
    let (node, inputs): (Node, _) =
        super::gpu_vjp_inputs("the head split", words, primals, cotangents, (3, 3))?;
    let d = node.dims;
    let outputs = bridge::silu_rms_heads_vjp_ops(
        &bridge::list(&inputs),
        d.hk as i32,
        d.hv as i32,
        d.dv as i32,
        node.eps,
        true,
        true,
        true,
        backend.gpu_stream(),
    )?;
    Ok(bridge::take(&outputs))
}
