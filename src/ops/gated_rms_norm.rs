//! `mlxk_gated_rms_norm`: argument checks and graph building.

use cxx::UniquePtr;

use super::gated_delta::{list, take};
use super::shape::ArgInfo;
use crate::bridge::{self, Array, CpuLaunch};
use crate::cpu::CpuKernel;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::metal;

pub struct Inputs<'a> {
    pub x: &'a Array,
    pub gate: &'a Array,
    pub weight: &'a Array,
    pub eps: f32,
}

pub fn check(x: &Inputs) -> Result<(Vec<i64>, Dtype, Dtype)> {
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
    super::silu_rms_heads::check_eps(x.eps)?;
    memory::check_outputs(&[("out", &xi.shape, xi.dtype)])?;
    // An empty x may have leading dims whose product overflows i64 ([2^31-1, 2^31-1,
    // 2^31-1, 0, D]); it has no rows. Otherwise the product is at most x's element count.
    let leading = &xi.shape[..xi.shape.len() - 1];
    let rows: i64 = if leading.contains(&0) {
        0
    } else {
        leading.iter().fold(1i64, |n, &d| n.saturating_mul(d))
    };
    if rows.saturating_mul(metal::gated_rms_norm_threads(width)) > i32::MAX as i64 {
        return Err(Error::InvalidArgument(format!(
            "x: {rows} rows of {width} values need more than 2^31-1 threads in one launch"
        )));
    }
    Ok((xi.shape.clone(), xi.dtype, gi.dtype))
}

/// Builds the gated norm: returns `out`, lazy.
pub fn norm(x: &Inputs, gpu: Option<bool>) -> Result<UniquePtr<Array>> {
    let (shape, dtype, gate_dtype) = check(x)?;
    let inputs = list(&[x.x, x.gate, x.weight]);
    let width = *shape.last().unwrap();
    let mut outputs = match gpu {
        None => {
            let launch = CpuLaunch {
                kernel: CpuKernel::GatedRmsNorm as u32,
                params: vec![
                    width,
                    dtype as i64,
                    gate_dtype as i64,
                    x.eps.to_bits() as i64,
                ],
                output_dims: shape.iter().map(|&d| d as i32).collect(),
                output_ndims: vec![shape.len() as u32],
                output_dtypes: vec![dtype as i32],
                donate_from: vec![-1],
            };
            take(&*bridge::cpu_kernel_op(&launch, &inputs)?)
        }
        Some(gpu) => {
            let launch = metal::gated_rms_norm_launch(&shape, dtype, x.eps);
            take(&*bridge::metal_kernel_op(&launch, &inputs, gpu)?)
        }
    };
    Ok(outputs.pop().expect("one output"))
}
