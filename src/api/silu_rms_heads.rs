//! The head split of a Gated DeltaNet layer, [`SiluRmsHeads`], with its gradient.

use super::{call, int_arg, locked, Array};
use crate::error::Result;
use crate::ops::silu_rms_heads as split_ops;
use crate::ops::Backend;

/// The Qwen3.5 head split of the depthwise convolution's output `x [B, S, 2·Hk·Dk + Hv·Dv]`
/// (channels q | k | v, before the SiLU): SiLU on every channel with MLX's rounding points,
/// then q and k RMS-normalized per head and scaled, v activated only:
/// `q = q_scale · T(silu · rsqrt(mean(silu²) + eps))`, likewise k with `k_scale`.
///
/// `Dk` is the scales' length, `Dk` and `Dv` in [1, 128].
#[derive(Debug, Clone, Copy)]
pub struct SiluRmsHeads<'a> {
    /// The convolution's output `[B, S, 2·Hk·Dk + Hv·Dv]` (float).
    pub x: &'a Array,
    /// `[Dk]` in x's dtype (mlx-lm: Dk^-1, rounded to the dtype).
    pub q_scale: &'a Array,
    /// `[Dk]` in x's dtype (mlx-lm: Dk^-1/2, rounded to the dtype).
    pub k_scale: &'a Array,
    /// Hk, at least 1.
    pub key_heads: usize,
    /// Hv, at least 1 (a multiple of Hk where the update follows).
    pub value_heads: usize,
    /// Dv, in [1, 128].
    pub value_width: usize,
    /// Finite and >= 0 (mlx-lm 0.32.2: 1e-6 / Dk).
    pub eps: f32,
}

/// The results of [`SiluRmsHeads::split`], contiguous, in x's dtype.
#[derive(Debug)]
pub struct Split {
    /// `[B, S, Hk, Dk]`.
    pub q: Array,
    /// `[B, S, Hk, Dk]`.
    pub k: Array,
    /// `[B, S, Hv, Dv]`.
    pub v: Array,
}

/// The gradients of [`SiluRmsHeads::vjp`], in x's dtype.
#[derive(Debug)]
pub struct SiluRmsHeadsGrads {
    /// x's shape.
    pub dx: Array,
    /// `[Dk]`.
    pub dq_scale: Array,
    /// `[Dk]`.
    pub dk_scale: Array,
}

impl<'a> SiluRmsHeads<'a> {
    /// The ops' arguments (under the lock).
    pub(crate) fn inputs(&self) -> Result<split_ops::Inputs<'a>> {
        Ok(split_ops::Inputs {
            x: self.x.get("x")?,
            q_scale: self.q_scale.get("q_scale")?,
            k_scale: self.k_scale.get("k_scale")?,
            key_heads: int_arg(self.key_heads, "key_heads")?,
            value_heads: int_arg(self.value_heads, "value_heads")?,
            value_width: int_arg(self.value_width, "value_width")?,
            eps: self.eps,
        })
    }

    /// The split on the default device: lazy q, k and v.
    ///
    /// Errors: [`Error::Shape`](crate::Error::Shape) (ranks, channel count, Dk),
    /// [`Error::Dtype`](crate::Error::Dtype) (a scale's dtype differs from x's),
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (head counts, value_width,
    /// eps), [`Error::OutOfMemory`](crate::Error::OutOfMemory).
    pub fn split(&self) -> Result<Split> {
        call(|| {
            let (q, k, v) = locked(|| split_ops::split(&self.inputs()?, Backend::current()))?;
            Ok(Split {
                q: Array::wrap(q),
                k: Array::wrap(k),
                v: Array::wrap(v),
            })
        })
    }

    /// The backward pass of [`split`](SiluRmsHeads::split): given the cotangents `dq`, `dk`
    /// (`[B, S, Hk, Dk]`) and `dv` (`[B, S, Hv, Dv]`), any float dtype, None being zeros, the
    /// gradients of `sum(dq · q) + sum(dk · k) + sum(dv · v)` with respect to x, q_scale and
    /// k_scale. CPU: float32 with every sum in float64, rounded to x's dtype; GPU: MLX ops.
    ///
    /// Errors: those of `split`; [`Error::Shape`](crate::Error::Shape) /
    /// [`Error::Dtype`](crate::Error::Dtype) naming `dq`, `dk` or `dv`.
    pub fn vjp(
        &self,
        dq: Option<&Array>,
        dk: Option<&Array>,
        dv: Option<&Array>,
    ) -> Result<SiluRmsHeadsGrads> {
        call(|| {
            let grads = locked(|| {
                let inputs = self.inputs()?;
                let cotangents = [
                    dq.map(|a| a.get("dq")).transpose()?,
                    dk.map(|a| a.get("dk")).transpose()?,
                    dv.map(|a| a.get("dv")).transpose()?,
                ];
                split_ops::split_vjp(&inputs, cotangents, Backend::current())
            })?;
            let [dx, dq_scale, dk_scale] = grads.map(Array::wrap);
            Ok(SiluRmsHeadsGrads {
                dx,
                dq_scale,
                dk_scale,
            })
        })
    }
}
