//! The gated-delta recurrence (Qwen3.5's Gated DeltaNet) and its gate: [`compute_g`],
//! [`GatedDelta`] (exact and chunked update, gradients), [`GatedDeltaFromConv`] and
//! [`StateReplay`].

pub mod pool;
pub mod tree;

use cxx::UniquePtr;

use super::{call, int_arg, locked, Array, SiluRmsHeads};
use crate::bridge;
use crate::error::{Error, Result};
use crate::node::gated_delta::ChunkSize;
use crate::ops::gated_delta::{self as ops, FromConvInputs, Inputs, StateInputs};
use crate::ops::Backend;

/// `g = exp(-exp(float32(a_log)) * softplus(a + dt_bias))`, mlx-lm's `compute_g`, bit for bit
/// on the same device: `a + dt_bias` and the softplus run in the promoted dtype of `a` and
/// `dt_bias` (rounding after every step as MLX does), the product and the outer exp in float32.
///
/// Shapes: `a_log` `[Hv]` (float32 or bfloat16), `a` `[..., Hv]` (float), `dt_bias` `[Hv]`
/// (float). Result: float32 with `a`'s shape, lazy.
///
/// Errors: [`Error::Shape`], [`Error::Dtype`] naming the argument; [`Error::OutOfMemory`].
pub fn compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    call(|| {
        locked(|| ops::compute_g(a_log.get("a_log")?, a.get("a")?, dt_bias.get("dt_bias")?))
            .map(Array::wrap)
    })
}

/// The results of an update: the output `y` and the state after the call.
#[derive(Debug)]
pub struct Update {
    /// `[B, T, Hv, Dv]`, in `q`'s dtype (`x`'s for [`GatedDeltaFromConv`]); 0 at masked tokens.
    pub y: Array,
    /// `[B, Hv, Dv, Dk]` float32; a masked token leaves it untouched.
    pub state: Array,
}

/// The arguments of one Gated DeltaNet call (mlx-lm's `gated_delta_update` with the Metal
/// kernel's arithmetic). For each token, `beta = sigmoid(b)`, `g = compute_g(a_log, a,
/// dt_bias)`, and per value head `h` (reading key head `h / (Hv / Hk)`) and row `dv`, in
/// float32: `s *= g; kv = sum(s*k); delta = (v - kv)*beta; s += k*delta; y = sum(s*q)`.
///
/// Shapes: `q`, `k` `[B, T, Hk, Dk]`; `v` `[B, T, Hv, Dv]`; `a`, `b` `[B, T, Hv]`; `a_log`
/// `[Hv]` (float32 or bfloat16); `dt_bias` `[Hv]`; `state` `[B, Hv, Dv, Dk]` float32 (None:
/// zeros); `mask` `[B, T]` bool (None: every token real). `Dk` is a multiple of 32 in
/// [32, 256]; `Hv` a multiple of `Hk`. `q`, `k`, `v` share one float dtype; `a`, `b`,
/// `dt_bias` are any float dtype. `q` and `k` come already normalized (no scale is applied).
///
/// ```
/// # fn main() -> mlxkern::Result<()> {
/// use mlxkern::{Array, GatedDelta};
/// let (b, t, hk, hv, dk, dv) = (1, 1, 1, 2, 32, 4);
/// let fill = |n: usize| (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 20.0).collect::<Vec<f32>>();
/// let q = Array::from_slice(&fill(b * t * hk * dk), &[b, t, hk, dk])?;
/// let k = Array::from_slice(&fill(b * t * hk * dk), &[b, t, hk, dk])?;
/// let v = Array::from_slice(&fill(b * t * hv * dv), &[b, t, hv, dv])?;
/// let a = Array::from_slice(&fill(b * t * hv), &[b, t, hv])?;
/// let beta = Array::from_slice(&fill(b * t * hv), &[b, t, hv])?;
/// let a_log = Array::from_slice(&fill(hv), &[hv])?;
/// let dt_bias = Array::from_slice(&fill(hv), &[hv])?;
/// let out = GatedDelta {
///     q: &q, k: &k, v: &v, a: &a, b: &beta, a_log: &a_log, dt_bias: &dt_bias,
///     state: None, mask: None,
/// }
/// .update()?;
/// assert_eq!(out.y.shape()?, [b, t, hv, dv]);
/// assert_eq!(out.state.shape()?, [b, hv, dv, dk]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct GatedDelta<'a> {
    /// Queries `[B, T, Hk, Dk]`.
    pub q: &'a Array,
    /// Keys `[B, T, Hk, Dk]`, q's dtype.
    pub k: &'a Array,
    /// Values `[B, T, Hv, Dv]`, q's dtype.
    pub v: &'a Array,
    /// The decay's input `[B, T, Hv]` (any float dtype).
    pub a: &'a Array,
    /// The write strength's logit `[B, T, Hv]` (any float dtype): `beta = sigmoid(b)`.
    pub b: &'a Array,
    /// `[Hv]`, float32 or bfloat16.
    pub a_log: &'a Array,
    /// `[Hv]`, any float dtype.
    pub dt_bias: &'a Array,
    /// The state before the call, `[B, Hv, Dv, Dk]` float32; None is zeros.
    pub state: Option<&'a Array>,
    /// `[B, T]` bool, true for a real token; None: every token is real.
    pub mask: Option<&'a Array>,
}

/// The gradients of [`GatedDelta::vjp`], each with its input's shape.
#[derive(Debug)]
pub struct GatedDeltaGrads {
    /// `[B, T, Hk, Dk]`, q's dtype.
    pub dq: Array,
    /// `[B, T, Hk, Dk]`, q's dtype.
    pub dk: Array,
    /// `[B, T, Hv, Dv]`, q's dtype.
    pub dv: Array,
    /// a's shape and dtype.
    pub da: Array,
    /// b's shape and dtype.
    pub db: Array,
    /// `[Hv]`, a_log's dtype.
    pub da_log: Array,
    /// `[Hv]`, dt_bias's dtype.
    pub ddt_bias: Array,
    /// `[B, Hv, Dv, Dk]` float32 (also when no state was given: the zero state's gradient).
    pub dstate: Array,
}

impl<'a> GatedDelta<'a> {
    pub(super) fn with_inputs<T>(&self, f: impl FnOnce(&Inputs) -> Result<T>) -> Result<T> {
        locked(|| {
            let inputs = Inputs {
                q: self.q.get("q")?,
                k: self.k.get("k")?,
                v: self.v.get("v")?,
                a: self.a.get("a")?,
                b: self.b.get("b")?,
                a_log: self.a_log.get("a_log")?,
                dt_bias: self.dt_bias.get("dt_bias")?,
                state: self.state.map(|s| s.get("state")).transpose()?,
                mask: self.mask.map(|m| m.get("mask")).transpose()?,
            };
            f(&inputs)
        })
    }

    /// The update, on the default device: lazy `y` and new state.
    ///
    /// Errors: [`Error::Shape`], [`Error::Dtype`] naming the argument and what was expected;
    /// [`Error::InvalidArgument`] (a result above 2^31-1 elements); [`Error::OutOfMemory`].
    /// Computation errors surface at [`Array::eval`] or a read.
    pub fn update(&self) -> Result<Update> {
        call(|| {
            self.with_inputs(|x| ops::update(x, Backend::current()))
                .map(two)
        })
    }

    /// The same update computed in chunked (WY / UT-transform) form, `chunk_size` tokens at a
    /// time (None: the default, 32; else a multiple of 16 in [16, 128]): the faster prefill on
    /// the CPU. Its results equal [`update`](GatedDelta::update)'s up to float32 rounding,
    /// not bit for bit (decode and speculative verification use `update`). Without a mask, a
    /// prefill split into calls at multiples of the chunk size gives the same bits as one call.
    ///
    /// With the GPU as the default device it runs the GPU chunked kernels (chunks of at most 64
    /// tokens there; docs/DESIGN.md §3).
    ///
    /// Errors: those of `update`; [`Error::InvalidArgument`] (chunk_size).
    pub fn update_chunked(&self, chunk_size: Option<usize>) -> Result<Update> {
        call(|| {
            let chunk = chunk_arg(chunk_size)?;
            self.with_inputs(|x| ops::update_chunked(x, chunk, Backend::current()))
                .map(two)
        })
    }

    /// The backward pass of [`update`](GatedDelta::update): given the cotangents `dy` of `y`
    /// (`[B, T, Hv, Dv]`, any float dtype) and `dstate_out` of the new state
    /// (`[B, Hv, Dv, Dk]` float32), None being zeros, the gradients of
    /// `sum(dy · y) + sum(dstate_out · state)` with respect to every input. A masked token gets
    /// zero gradients and passes the state's gradient through; a key head's gradients sum over
    /// the value heads that read it. On the CPU, float32 arithmetic with the forward recomputed
    /// from states kept every 64 tokens; on a GPU, the GPU backward kernel (the same sums in
    /// another order).
    ///
    /// Errors: those of `update`; [`Error::Shape`] / [`Error::Dtype`] naming `dy` or
    /// `dstate_out`.
    pub fn vjp(&self, dy: Option<&Array>, dstate_out: Option<&Array>) -> Result<GatedDeltaGrads> {
        self.vjp_form(None, dy, dstate_out)
    }

    /// The backward pass of [`update_chunked`](GatedDelta::update_chunked) (`chunk_size` as
    /// there): the gradients [`vjp`](GatedDelta::vjp) gives, computed on the CPU chunk by chunk
    /// through the chunked form's own products (its states kept per chunk, O((T/C + C) ·
    /// state) memory), equal to `vjp`'s up to float32 rounding. With a GPU as the default
    /// device, `vjp`'s GPU backward (the gradient of the same function).
    ///
    /// Errors: those of `vjp`; [`Error::InvalidArgument`] (chunk_size).
    pub fn vjp_chunked(
        &self,
        chunk_size: Option<usize>,
        dy: Option<&Array>,
        dstate_out: Option<&Array>,
    ) -> Result<GatedDeltaGrads> {
        self.vjp_form(Some(chunk_size), dy, dstate_out)
    }

    /// `vjp` (`chunked` None) or `vjp_chunked` (Some(chunk_size)).
    fn vjp_form(
        &self,
        chunked: Option<Option<usize>>,
        dy: Option<&Array>,
        dstate_out: Option<&Array>,
    ) -> Result<GatedDeltaGrads> {
        call(|| {
            let chunk = chunked.map(chunk_arg).transpose()?;
            let grads = self.with_inputs(|x| {
                let dy = dy.map(|a| a.get("dy")).transpose()?;
                let dstate_out = dstate_out.map(|a| a.get("dstate_out")).transpose()?;
                match chunk {
                    None => ops::update_vjp(x, dy, dstate_out, Backend::current()),
                    Some(c) => ops::update_chunked_vjp(x, c, dy, dstate_out, Backend::current()),
                }
            })?;
            let [dq, dk, dv, da, db, da_log, ddt_bias, dstate] = grads.map(Array::wrap);
            Ok(GatedDeltaGrads {
                dq,
                dk,
                dv,
                da,
                db,
                da_log,
                ddt_bias,
                dstate,
            })
        })
    }
}

/// The safe API's `chunk_size`: None is the default (0 in the C ABI); 0 is refused; any other
/// value is checked as the C ABI checks it.
pub(super) fn chunk_arg(chunk_size: Option<usize>) -> Result<ChunkSize> {
    match chunk_size {
        None => Ok(ChunkSize::DEFAULT),
        Some(0) => Err(Error::InvalidArgument(format!(
            "chunk_size is 0; expected None (the default) or {}",
            ChunkSize::RULE
        ))),
        Some(c) => ChunkSize::from_c(int_arg(c, "chunk_size")?),
    }
}

fn two((y, state): (UniquePtr<bridge::Array>, UniquePtr<bridge::Array>)) -> Update {
    Update {
        y: Array::wrap(y),
        state: Array::wrap(state),
    }
}

/// The head split and the update of one Gated DeltaNet layer in one call: exactly
/// [`SiluRmsHeads::split`] followed by [`GatedDelta::update`], bit for bit on every device,
/// without q, k and v as results. On a GPU it runs as one kernel where that was measured
/// faster; on the CPU as the two kernels. Differentiable by MLX's autograd on every device.
///
/// Shapes: as the two parts': `split.x` `[B, T, 2·Hk·Dk + Hv·Dv]`, the scales `[Dk]` in x's
/// dtype (Dk a multiple of 32 in [32, 128]); `a`, `b` `[B, T, Hv]`; `a_log`, `dt_bias` `[Hv]`;
/// `state` `[B, Hv, Dv, Dk]` float32 or None; `mask` `[B, T]` bool or None. Results as
/// [`GatedDelta::update`]'s, `y` in x's dtype.
#[derive(Debug, Clone, Copy)]
pub struct GatedDeltaFromConv<'a> {
    /// The head split's arguments: the convolution's output and the head geometry.
    pub split: SiluRmsHeads<'a>,
    /// As [`GatedDelta::a`].
    pub a: &'a Array,
    /// As [`GatedDelta::b`].
    pub b: &'a Array,
    /// As [`GatedDelta::a_log`].
    pub a_log: &'a Array,
    /// As [`GatedDelta::dt_bias`].
    pub dt_bias: &'a Array,
    /// As [`GatedDelta::state`].
    pub state: Option<&'a Array>,
    /// As [`GatedDelta::mask`].
    pub mask: Option<&'a Array>,
}

impl GatedDeltaFromConv<'_> {
    /// The layer's update on the default device: lazy `y` and new state.
    ///
    /// Errors: those of [`SiluRmsHeads::split`] and [`GatedDelta::update`], naming this
    /// call's arguments.
    pub fn update(&self) -> Result<Update> {
        call(|| {
            self.with_inputs(|x| ops::update_from_conv(x, Backend::current()))
                .map(two)
        })
    }

    pub(super) fn with_inputs<T>(&self, f: impl FnOnce(&FromConvInputs) -> Result<T>) -> Result<T> {
        locked(|| {
            let inputs = FromConvInputs {
                split: self.split.inputs()?,
                a: self.a.get("a")?,
                b: self.b.get("b")?,
                a_log: self.a_log.get("a_log")?,
                dt_bias: self.dt_bias.get("dt_bias")?,
                state: self.state.map(|s| s.get("state")).transpose()?,
                mask: self.mask.map(|m| m.get("mask")).transpose()?,
            };
            f(&inputs)
        })
    }
}

/// Prefix-state replay for speculative decoding: after a verify window of T draft tokens in
/// which row `b` accepted `accepted_lengths[b]` of them, recomputes each row's state from the
/// pre-verify `state` over exactly that prefix, bit-identical to the state
/// [`GatedDelta::update`] returns for those first tokens from the same start state.
///
/// Shapes as [`GatedDelta`]'s (without q and mask); `accepted_lengths` holds B values, each in
/// [0, T].
#[derive(Debug, Clone, Copy)]
pub struct StateReplay<'a> {
    /// Keys `[B, T, Hk, Dk]`.
    pub k: &'a Array,
    /// Values `[B, T, Hv, Dv]`, k's dtype.
    pub v: &'a Array,
    /// `[B, T, Hv]`.
    pub a: &'a Array,
    /// `[B, T, Hv]`.
    pub b: &'a Array,
    /// `[Hv]`, float32 or bfloat16.
    pub a_log: &'a Array,
    /// `[Hv]`.
    pub dt_bias: &'a Array,
    /// The pre-verify state `[B, Hv, Dv, Dk]` float32; None is zeros.
    pub state: Option<&'a Array>,
    /// Tokens accepted per row: B values, each in [0, T].
    pub accepted_lengths: &'a [usize],
}

impl StateReplay<'_> {
    /// The state `[B, Hv, Dv, Dk]` float32 after each row's accepted prefix, lazy.
    ///
    /// Errors: as [`GatedDelta::update`]'s; [`Error::InvalidArgument`] for a length count
    /// other than B or a length outside [0, T], naming the row.
    pub fn replay(&self) -> Result<Array> {
        call(|| {
            self.with_inputs(|x| ops::state(x, Backend::current()))
                .map(Array::wrap)
        })
    }

    pub(super) fn with_inputs<T>(&self, f: impl FnOnce(&StateInputs) -> Result<T>) -> Result<T> {
        let lengths = self
            .accepted_lengths
            .iter()
            .enumerate()
            .map(|(row, &n)| int_arg(n, &format!("accepted_lengths[{row}]")))
            .collect::<Result<Vec<i32>>>()?;
        locked(|| {
            let inputs = StateInputs {
                k: self.k.get("k")?,
                v: self.v.get("v")?,
                a: self.a.get("a")?,
                b: self.b.get("b")?,
                a_log: self.a_log.get("a_log")?,
                dt_bias: self.dt_bias.get("dt_bias")?,
                state: self.state.map(|s| s.get("state")).transpose()?,
                accepted_lengths: &lengths,
            };
            f(&inputs)
        })
    }
}
