//! The update from the convolution's output (`mlxk_gated_delta_update_from_conv`): the head
//! split and the update in one call, and which calls take the one GPU kernel.

use cxx::UniquePtr;

use crate::bridge::Array;
use crate::error::{Error, Result};
use crate::node::gated_delta::{Dims, Form, Node};
use crate::node::silu_rms_heads::Node as SplitNode;
use crate::ops::shape::ArgInfo;
use crate::ops::{silu_rms_heads, Backend};

use super::graph::{build, build_gpu, two_outputs, Arrays};
use super::{check_update_rest, dims, gate_dtypes, Results};

/// The arrays and arguments of one update from the convolution's output
/// (`mlxk_gated_delta_update_from_conv`): the head split's, then the update's without q, k, v.
pub struct FromConvInputs<'a> {
    pub split: silu_rms_heads::Inputs<'a>,
    pub a: &'a Array,
    pub b: &'a Array,
    pub a_log: &'a Array,
    pub dt_bias: &'a Array,
    pub state: Option<&'a Array>,
    pub mask: Option<&'a Array>,
}

/// Validates every argument of `mlxk_gated_delta_update_from_conv`: the head split's (its
/// checks and messages, the size of its q, k and v included, named as this call's buffers), then what the update needs
/// beyond them, named by the caller's arguments, and the size of the update's results: the
/// checks of the two calls it stands for, in their order. Returns the update's node and the
/// head split's.
pub(super) fn check_update_from_conv(x: &FromConvInputs) -> Result<(Node, SplitNode)> {
    let split =
        silu_rms_heads::check_named(&x.split, ["q (internal)", "k (internal)", "v (internal)"])?;
    let d = split.dims;
    let [bsz, t, hk, hv, dk, dv] = [d.b, d.s, d.hk, d.hv, d.dk, d.dv].map(|v| v as i64);
    if hv % hk != 0 {
        return Err(Error::InvalidArgument(format!(
            "value_heads is {hv}; expected a multiple of key_heads = {hk} (each value head h \
             reads key head h / (value_heads / key_heads))"
        )));
    }
    if dk % 32 != 0 || dk < 32 {
        return Err(Error::Shape(format!(
            "q_scale: Dk (its length) is {dk}; the update needs a multiple of 32 in [32, {}] \
             (each of the 32 SIMD lanes owns Dk/32 state elements)",
            silu_rms_heads::MAX_HEAD_WIDTH
        )));
    }
    let a = ArgInfo::of("a", x.a)?;
    let b = ArgInfo::of("b", x.b)?;
    let a_log = ArgInfo::of("a_log", x.a_log)?;
    let dt_bias = ArgInfo::of("dt_bias", x.dt_bias)?;
    let gates = [&a, &b, &a_log, &dt_bias];
    let sources = ("x", "value_heads");
    check_update_rest(
        gates,
        x.state,
        x.mask,
        sources,
        [bsz, t, hv, dv, dk],
        split.dtype,
        Results::Update,
    )?;
    let node = Node {
        dims: dims(bsz, t, hk, hv, dk, dv),
        dtype: split.dtype,
        gates: gate_dtypes(&a, &b, &a_log, &dt_bias),
        has_state: x.state.is_some(),
        has_mask: x.mask.is_some(),
        form: Form::Exact,
        pool: None,
    };
    Ok((node, split))
}

/// Builds the head split and the update in one (`mlxk_gated_delta_update_from_conv`): returns
/// `(y, state_out)`, lazy, the bits of `silu_rms_heads::split` followed by `update`. On a GPU,
/// for the calls `one_kernel` picks, one kernel computes each token's q, k and v where the
/// recurrence reads them (`metal::gated_delta_from_conv_launch`): one node instead of two.
/// Otherwise the two nodes (always on the CPU).
pub fn update_from_conv(
    x: &FromConvInputs,
    backend: Backend,
) -> Result<(UniquePtr<Array>, UniquePtr<Array>)> {
    let (node, split) = check_update_from_conv(x)?;
    if !one_kernel(backend, node.dims) {
        // The two nodes, from the nodes checked above (the update's is the one `check_update`
        // makes for the split's q, k and v).
        let (q, k, v) = silu_rms_heads::build(&split, &x.split, backend)?;
        let arrays = Arrays {
            q: Some(&q),
            k: Some(&k),
            v: Some(&v),
            ..x.gate_arrays()
        };
        return Ok(two_outputs(build(&node, &arrays, backend)?));
    }
    let arrays = Arrays {
        x: Some(x.split.x),
        q_scale: Some(x.split.q_scale),
        k_scale: Some(x.split.k_scale),
        ..x.gate_arrays()
    };
    Ok(two_outputs(build_gpu(
        &node,
        &arrays,
        backend,
        Some(split.eps),
    )?))
}

/// Whether `update_from_conv` takes its one kernel. That kernel saves a node's dispatch (the
/// host's work per node sets a small batch's pace) and adds each token's x, SiLU and norm to
/// the latency of its sequential token loop, recomputed by every threadgroup of a head (more
/// GPU work, which counts once the GPU sets the pace). On an H200, µs a layer, pipelined, one
/// kernel against two: bench-cuda's `fromconvtokens` (over two and three runs) B = 1, T = 8
/// 24.8–25.1 / 29.6–42.7; B = 8, T = 4 28.6–29.0 / 38.7–44.4, T = 8 52.1 / 42.6–48.8; B = 32,
/// T = 2 49.7 / 43.8–44.3; its `layer` group (the library's calls) B = 32, T = 1 38.2 / 37.1–38.4
/// (serial 59.8–64.1 / 66.9–71.4), B = 256, T = 1 299.0 / 283.3. So on MLX CUDA: 1 to 8
/// tokens and at most 32 (batch, token) pairs. Metal takes it for one token a call (not
/// measured there).
fn one_kernel(backend: Backend, d: Dims) -> bool {
    if crate::seams::from_conv_any_tokens() {
        return backend != Backend::Cpu;
    }
    match backend {
        Backend::Cpu => false,
        Backend::Metal { .. } => d.t == 1,
        // No tokens: the two nodes (nothing to save).
        Backend::Cuda { .. } => (1..=8).contains(&d.t) && d.b * d.t <= 32,
    }
}

impl FromConvInputs<'_> {
    /// The update's arrays besides q, k and v.
    fn gate_arrays(&self) -> Arrays<'_> {
        Arrays {
            a: Some(self.a),
            b: Some(self.b),
            a_log: Some(self.a_log),
            dt_bias: Some(self.dt_bias),
            state: self.state,
            mask: self.mask,
            ..Arrays::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_update_from_conv_takes_one_kernel_where_it_was_measured_faster() {
        let d = |b, t| Dims {
            b,
            t,
            hk: 16,
            hv: 32,
            dk: 128,
            dv: 128,
        };
        let (cuda, metal) = (Backend::Cuda { gpu: true }, Backend::Metal { gpu: true });
        for (b, t, on_cuda) in [
            (1, 1, true),
            (32, 1, true),
            (33, 1, false),
            (256, 1, false),
            (1, 0, false),
            (1, 8, true),
            (4, 8, true),
            (8, 4, true),
            (16, 2, true),
            (1, 9, false),
            (8, 8, false),
            (32, 2, false),
            (1, 4096, false),
        ] {
            assert_eq!(one_kernel(cuda, d(b, t)), on_cuda, "CUDA B={b} T={t}");
            assert_eq!(one_kernel(metal, d(b, t)), t == 1, "Metal B={b} T={t}");
            assert!(!one_kernel(Backend::Cpu, d(b, t)), "CPU B={b} T={t}");
        }
    }
}
