//! `mlxk_gated_rms_norm`: argument checks and graph building.

use cxx::UniquePtr;

use super::shape::{check_eps, ArgInfo};
use super::{cpu_node, gpu_node, Backend};
use crate::bridge::Array;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal;
use crate::node::gated_rms_norm::Node;
use crate::node::Words;

pub struct Inputs<'a> {
    pub x: &'a Array,
    pub gate: &'a Array,
    pub weight: &'a Array,
    pub eps: f32,
}

pub fn check(x: &Inputs) -> Result<Node> {
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
    memory::check_outputs(&[("out", &xi.shape, xi.dtype)])?;
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
    let mut outputs = match backend {
        Backend::Cpu => cpu_node(
            node.kernel(),
            node.encode(),
            &node.outputs(),
            vec![-1],
            &inputs,
        )?,
        gpu => gpu_node(metal::gated_rms_norm_launch(&node), &inputs, gpu)?,
    };
    Ok(outputs.pop().expect("one output"))
}
