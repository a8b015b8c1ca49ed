//! `mlxk_silu_rms_heads`: argument checks and graph building.

use cxx::UniquePtr;

use super::shape::{check_eps, ArgInfo};
use super::{cpu_node, gpu_node, Backend};
use crate::bridge::Array;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal;
use crate::node::silu_rms_heads::{Dims, Node};
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

pub fn check(x: &Inputs) -> Result<Node> {
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
    memory::check_outputs(&[
        ("q", &[b, s, hk, dk], xi.dtype),
        ("k", &[b, s, hk, dk], xi.dtype),
        ("v", &[b, s, hv, dv], xi.dtype),
    ])?;
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
    let node = check(x)?;
    // The CPU node and the Metal launch take the inputs in one order (node::silu_rms_heads::INPUTS).
    let inputs = [x.x, x.q_scale, x.k_scale];
    let mut outputs = match backend {
        Backend::Cpu => cpu_node(
            node.kernel(),
            node.encode(),
            &node.outputs(),
            vec![-1; 3],
            &inputs,
        )?,
        gpu => gpu_node(metal::silu_rms_heads_launch(&node), &inputs, gpu)?,
    };
    let v = outputs.pop().expect("three outputs");
    let k = outputs.pop().expect("three outputs");
    let q = outputs.pop().expect("three outputs");
    Ok((q, k, v))
}
