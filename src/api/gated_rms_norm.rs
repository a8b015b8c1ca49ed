//! The output norm of a Gated DeltaNet layer, [`GatedRmsNorm`] ([`gated_rms_norm`]), with its
//! gradient.

use super::{call, locked, Array};
use crate::error::Result;
use crate::ops::gated_rms_norm as norm_ops;
use crate::ops::Backend;

/// Gated RMSNorm over the last axis (mlx-lm's `Qwen3NextRMSNormGated`):
/// `out = T(silu_f32(gate) · f32(T(weight · T(x · rsqrt(mean(x²) + eps)))))`.
#[derive(Debug, Clone, Copy)]
pub struct GatedRmsNorm<'a> {
    /// `[..., D]`, float, any width D >= 1.
    pub x: &'a Array,
    /// x's shape, any float dtype.
    pub gate: &'a Array,
    /// `[D]` in x's dtype (cast mlx-lm's float32 module weight to the model dtype).
    pub weight: &'a Array,
    /// Finite and >= 0.
    pub eps: f32,
}

/// The gradients of [`GatedRmsNorm::vjp`].
#[derive(Debug)]
pub struct GatedRmsNormGrads {
    /// x's shape and dtype.
    pub dx: Array,
    /// The gate's shape and dtype.
    pub dgate: Array,
    /// `[D]` in x's dtype.
    pub dweight: Array,
}

impl GatedRmsNorm<'_> {
    fn with_inputs<T>(&self, f: impl FnOnce(&norm_ops::Inputs) -> Result<T>) -> Result<T> {
        locked(|| {
            let inputs = norm_ops::Inputs {
                x: self.x.get("x")?,
                gate: self.gate.get("gate")?,
                weight: self.weight.get("weight")?,
                eps: self.eps,
            };
            f(&inputs)
        })
    }

    /// The norm on the default device: lazy, x's shape and dtype.
    ///
    /// Errors: [`Error::Shape`](crate::Error::Shape), [`Error::Dtype`](crate::Error::Dtype)
    /// naming the argument; [`Error::InvalidArgument`](crate::Error::InvalidArgument) (eps);
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory).
    pub fn forward(&self) -> Result<Array> {
        call(|| {
            self.with_inputs(|x| norm_ops::norm(x, Backend::current()))
                .map(Array::wrap)
        })
    }

    /// The backward pass of [`forward`](GatedRmsNorm::forward): given the cotangent `dout` of
    /// the result (x's shape, any float dtype; None is zeros), the gradients of
    /// `sum(dout · out)` with respect to x, gate and weight. CPU: float32 with every sum in
    /// float64, rounded to each result's dtype; GPU: MLX ops.
    ///
    /// Errors: those of `forward`; [`Error::Shape`](crate::Error::Shape) /
    /// [`Error::Dtype`](crate::Error::Dtype) naming `dout`.
    pub fn vjp(&self, dout: Option<&Array>) -> Result<GatedRmsNormGrads> {
        call(|| {
            let grads = self.with_inputs(|x| {
                let dout = dout.map(|a| a.get("dout")).transpose()?;
                norm_ops::norm_vjp(x, dout, Backend::current())
            })?;
            let [dx, dgate, dweight] = grads.map(Array::wrap);
            Ok(GatedRmsNormGrads { dx, dgate, dweight })
        })
    }
}

/// [`GatedRmsNorm::forward`] in one call.
///
/// ```
/// # fn main() -> mlxkern::Result<()> {
/// use mlxkern::Array;
/// let x = Array::from_slice(&[0.5f32, -1.0, 2.0, 0.25], &[2, 2])?;
/// let gate = Array::from_slice(&[1.0f32, 0.0, -1.0, 3.0], &[2, 2])?;
/// let weight = Array::from_slice(&[1.0f32, 0.5], &[2])?;
/// let out = mlxkern::gated_rms_norm(&x, &gate, &weight, 1e-6)?;
/// assert_eq!(out.to_vec::<f32>()?.len(), 4);
/// # Ok(()) }
/// ```
pub fn gated_rms_norm(x: &Array, gate: &Array, weight: &Array, eps: f32) -> Result<Array> {
    GatedRmsNorm {
        x,
        gate,
        weight,
        eps,
    }
    .forward()
}
