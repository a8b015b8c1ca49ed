//! `mlxk_gated_rms_norm`: argument checks and graph building.

use cxx::UniquePtr;

use super::shape::{check_eps, ArgInfo};
use super::{cpu_node, same_inputs_node, Backend};
use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal;
use crate::node::gated_rms_norm::{Backward, Node};
use crate::node::Words;

pub struct Inputs<'a> {
    pub x: &'a Array,
    pub gate: &'a Array,
    pub weight: &'a Array,
    pub eps: f32,
}

/// Validates `mlxk_gated_rms_norm`'s arguments, then the size of its result.
pub fn check(x: &Inputs) -> Result<Node> {
    let node = check_args(x)?;
    let shape: Vec<i64> = node.shape.iter().map(|&d| d as i64).collect();
    memory::check_outputs(&[("out", &shape, node.dtype)])?;
    Ok(node)
}

/// Validates the arguments the forward and its backward pass share (no sizes of results).
fn check_args(x: &Inputs) -> Result<Node> {
    let xi = ArgInfo::of("x", x.x)?;
    let gi = ArgInfo::of("gate", x.gate)?;
    let wi = ArgInfo::of("weight", x.weight)?;
    if xi.shape.is_empty() {
        return Err(Error::Shape(
            "x: expected rank >= 1 [..., D], got a scalar".into(),
        ));
    }
    xi.float()?;
    let width = *xi.shape.last().unwrap();
    if width < 1 {
        return Err(Error::Shape(format!(
            "x: the last dimension (D) is {width}; expected >= 1"
        )));
    }
    if gi.shape != xi.shape {
        return Err(Error::Shape(format!(
            "gate: shape {:?} differs from x's shape {:?} (they must be equal)",
            gi.shape, xi.shape
        )));
    }
    gi.float()?;
    wi.rank(1, "[D]")?
        .dim(0, "D", width, "x's last dimension")?;
    if wi.dtype != xi.dtype {
        return Err(Error::Dtype(format!(
            "weight: dtype {} differs from x's dtype {} (cast the weight to the input dtype, as \
             a converted checkpoint stores it)",
            wi.dtype.name(),
            xi.dtype.name()
        )));
    }
    check_eps(x.eps)?;
    let node = Node {
        shape: xi.shape.iter().map(|&d| d as usize).collect(),
        dtype: xi.dtype,
        gate_dtype: gi.dtype,
        eps: x.eps,
    };
    // An empty x may have leading dims whose product overflows ([2^31-1, 2^31-1, 2^31-1, 0,
    // D]); it has no rows (Node::rows). Otherwise the product is at most x's element count.
    if (node.rows() as u64).saturating_mul(node.threads() as u64) > i32::MAX as u64 {
        return Err(Error::InvalidArgument(format!(
            "x: {} rows of {width} values need more than 2^31-1 threads in one launch",
            node.rows()
        )));
    }
    Ok(node)
}

/// Builds the gated norm: returns `out`, lazy.
pub fn norm(x: &Inputs, backend: Backend) -> Result<UniquePtr<Array>> {
    let node = check(x)?;
    // The CPU node and the Metal launch take the inputs in one order (node::gated_rms_norm::INPUTS).
    let inputs = [x.x, x.gate, x.weight];
    let mut outputs = same_inputs_node(
        node.kernel(),
        node.encode(),
        &node.outputs(),
        vec![-1],
        &inputs,
        backend,
        || metal::gated_rms_norm::gated_rms_norm_launch(&node),
    )?;
    Ok(outputs.pop().expect("one output"))
}

/// The gated norm's gradients as `mlxk_gated_rms_norm_vjp` returns them: dx, dgate, dweight
/// (lazy).
pub type Gradients = [UniquePtr<Array>; 3];

/// Validates the cotangent of `mlxk_gated_rms_norm_vjp` against the forward's node: dout of
/// x's shape, any float dtype, optional.
pub fn check_vjp(node: &Node, dout: Option<&Array>) -> Result<Backward> {
    let shape: Vec<i64> = node.shape.iter().map(|&d| d as i64).collect();
    let mut cotangent = None;
    if let Some(dout) = dout {
        let info = ArgInfo::of("dout", dout)?;
        if info.shape != shape {
            return Err(Error::Shape(format!(
                "dout: shape {:?} differs from x's shape {shape:?} (the cotangent has out's \
                 shape, which is x's)",
                info.shape
            )));
        }
        info.float()?;
        cotangent = Some(info.dtype);
    }
    let width = node.width() as i64;
    // dweight as f64 sums per job (at most 64 jobs): 2 · 64 f32 words per column.
    memory::check_outputs(&[
        ("dx", &shape, node.dtype),
        ("dgate", &shape, node.gate_dtype),
        ("dweight", &[width], node.dtype),
        ("weight sums (internal)", &[2 * 64, width], Dtype::Float32),
    ])?;
    Ok(Backward {
        forward: node.clone(),
        cotangent,
    })
}

/// Builds the gated norm's backward pass (CPU kernel; with a GPU backend, MLX ops on its
/// stream): the gradients of `sum(dout · out)` with
/// respect to x, gate and weight (an absent dout is zeros), lazy.
pub fn norm_vjp(x: &Inputs, dout: Option<&Array>, backend: Backend) -> Result<Gradients> {
    let node = check_args(x)?;
    let backward = check_vjp(&node, dout)?;
    let mut inputs = vec![x.x, x.gate, x.weight];
    inputs.extend(dout);
    if backend != Backend::Cpu {
        // With a GPU as default device: MLX ops on its stream (docs/DESIGN.md §4 "Gradients").
        let outputs = bridge::gated_rms_norm_vjp_ops(
            &bridge::list(&inputs),
            x.eps,
            dout.is_some(),
            backend.gpu_stream(),
        )?;
        return bridge::take(&outputs).try_into().map_err(|_| {
            Error::Backend("the backward pass made the wrong number of outputs".into())
        });
    }
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

/// MLX's autograd through a GPU gated-norm node (`ops::gpu_vjp`): `words` are the forward node,
/// `primals` its inputs (x, gate, weight), `cotangents` that of out. The MLX-ops backward on
/// the node's stream.
pub(crate) fn gpu_vjp(
    words: &[i64],
    primals: &[&Array],
    cotangents: &[&Array],
    backend: Backend,
) -> Result<Vec<UniquePtr<Array>>> {
    let (node, inputs): (Node, _) =
        super::gpu_vjp_inputs("the gated norm", words, primals, cotangents, (3, 1))?;
    let outputs = bridge::gated_rms_norm_vjp_ops(
        &bridge::list(&inputs),
        node.eps,
        true,
        backend.gpu_stream(),
    )?;
    Ok(bridge::take(&outputs))
}
