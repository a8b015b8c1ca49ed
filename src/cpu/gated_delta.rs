//! The gated-delta recurrence on the CPU, in the Metal kernel's order: per value row, lane `l`
//! of 32 owns state elements `[l·n, (l+1)·n)` (n = Dk/32) and sums its products sequentially in
//! f32; the lane partials meet in the xor butterfly (`reduce::simd_sum`). No FMA contraction.

use half::{bf16, f16};

use super::elem::Elem;
use super::reduce::simd_sum;
use super::{to_f32_vec, typed, typed_mut, Buffers};
use crate::dtype::Dtype;

/// Dimensions of one call (see `ops::gated_delta::Dims`), as usize.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// Where the initial state comes from.
pub enum StateIn<'a> {
    /// No state given: start from zeros.
    Zeros,
    /// A separate input buffer `[B, Hv, Dv, Dk]`.
    Buffer(&'a [f32]),
    /// The output buffer already holds the initial state (MLX donated it).
    InPlace,
}

/// One value row's state update for one token; returns (new row in `s`, y value in f32).
#[inline(always)]
fn token_step<T: Elem>(s: &mut [f32], k: &[T], q: &[T], v: f32, g: f32, beta: f32) -> f32 {
    let n = s.len() / 32;
    let mut partials = [0f32; 32];
    for (lane, partial) in partials.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for i in lane * n..(lane + 1) * n {
            s[i] *= g;
            acc += s[i] * k[i].to_f32();
        }
        *partial = acc;
    }
    let kv_mem = simd_sum(&partials);
    let delta = (v - kv_mem) * beta;
    for (lane, partial) in partials.iter_mut().enumerate() {
        let mut acc = 0.0f32;
        for i in lane * n..(lane + 1) * n {
            s[i] += k[i].to_f32() * delta;
            acc += s[i] * q[i].to_f32();
        }
        *partial = acc;
    }
    simd_sum(&partials)
}

/// The recurrence over all rows, tokens and heads. `g`, `beta` are `[B, T, Hv]` (f32 values),
/// `mask` `[B, T]` bytes (0 = padding). Writes `y [B, T, Hv, Dv]` and `state [B, Hv, Dv, Dk]`.
#[allow(clippy::too_many_arguments)]
pub fn recurrence<T: Elem>(
    d: Dims,
    q: &[T],
    k: &[T],
    v: &[T],
    g: &[f32],
    beta: &[f32],
    state_in: StateIn,
    mask: Option<&[u8]>,
    y: &mut [T],
    state: &mut [f32],
) {
    let group = d.hv / d.hk;
    let mut row = vec![0f32; d.dk];
    for b in 0..d.b {
        for hv in 0..d.hv {
            let hk = hv / group;
            for dv in 0..d.dv {
                let at = ((b * d.hv + hv) * d.dv + dv) * d.dk;
                match &state_in {
                    StateIn::Zeros => row.fill(0.0),
                    StateIn::Buffer(s) => row.copy_from_slice(&s[at..at + d.dk]),
                    StateIn::InPlace => row.copy_from_slice(&state[at..at + d.dk]),
                }
                for t in 0..d.t {
                    let y_at = ((b * d.t + t) * d.hv + hv) * d.dv + dv;
                    if mask.is_some_and(|m| m[b * d.t + t] == 0) {
                        y[y_at] = T::from_f32(0.0);
                        continue;
                    }
                    let gate = (b * d.t + t) * d.hv + hv;
                    let qk_at = ((b * d.t + t) * d.hk + hk) * d.dk;
                    let out = token_step(
                        &mut row,
                        &k[qk_at..qk_at + d.dk],
                        &q[qk_at..qk_at + d.dk],
                        v[((b * d.t + t) * d.hv + hv) * d.dv + dv].to_f32(),
                        g[gate],
                        beta[gate],
                    );
                    y[y_at] = T::from_f32(out);
                }
                state[at..at + d.dk].copy_from_slice(&row);
            }
        }
    }
}

/// Decodes the primitive's parameters and buffers, then runs [`recurrence`].
/// Params: `[B, T, Hk, Hv, Dk, Dv, qkv dtype, beta dtype, has_state, has_mask]`;
/// inputs: `q, k, v, g, beta, [state], [mask]`; outputs: `y, state_out`.
pub(crate) fn run(params: &[i64], mut buffers: Buffers) {
    let p: Vec<usize> = params.iter().map(|&x| x as usize).collect();
    let d = Dims {
        b: p[0],
        t: p[1],
        hk: p[2],
        hv: p[3],
        dk: p[4],
        dv: p[5],
    };
    let dtype = super::dtype_param(params[6]);
    let beta_dtype = super::dtype_param(params[7]);
    let (has_state, has_mask) = (params[8] != 0, params[9] != 0);
    let inputs = &buffers.inputs;
    let g: &[f32] = typed(inputs[3]);
    let beta = to_f32_vec(inputs[4], beta_dtype);
    let state_in = match (has_state, buffers.aliased[1]) {
        (false, _) => StateIn::Zeros,
        (true, Some(_)) => StateIn::InPlace,
        (true, None) => StateIn::Buffer(typed(inputs[5])),
    };
    let mask = has_mask.then(|| inputs[5 + has_state as usize]);
    let (y, rest) = buffers.outputs.split_at_mut(1);
    let state: &mut [f32] = typed_mut(rest[0]);
    match dtype {
        Dtype::Bfloat16 => recurrence::<bf16>(
            d,
            typed(inputs[0]),
            typed(inputs[1]),
            typed(inputs[2]),
            g,
            &beta,
            state_in,
            mask,
            typed_mut(y[0]),
            state,
        ),
        Dtype::Float16 => recurrence::<f16>(
            d,
            typed(inputs[0]),
            typed(inputs[1]),
            typed(inputs[2]),
            g,
            &beta,
            state_in,
            mask,
            typed_mut(y[0]),
            state,
        ),
        Dtype::Float32 => recurrence::<f32>(
            d,
            typed(inputs[0]),
            typed(inputs[1]),
            typed(inputs[2]),
            g,
            &beta,
            state_in,
            mask,
            typed_mut(y[0]),
            state,
        ),
        other => panic!("gated delta: unsupported input dtype {}", other.name()),
    }
}

/// The prefix replay: the state after row b's first `lengths[b]` tokens, computed exactly as
/// [`recurrence`] computes it (same per-element operations, same lane order), without y.
#[allow(clippy::too_many_arguments)]
pub fn replay<T: Elem>(
    d: Dims,
    k: &[T],
    v: &[T],
    g: &[f32],
    beta: &[f32],
    state_in: StateIn,
    lengths: &[i32],
    state: &mut [f32],
) {
    let group = d.hv / d.hk;
    let mut row = vec![0f32; d.dk];
    let n = d.dk / 32;
    for b in 0..d.b {
        let keep = lengths[b] as usize;
        assert!(keep <= d.t, "accepted length {keep} exceeds T = {}", d.t);
        for hv in 0..d.hv {
            let hk = hv / group;
            for dv in 0..d.dv {
                let at = ((b * d.hv + hv) * d.dv + dv) * d.dk;
                match &state_in {
                    StateIn::Zeros => row.fill(0.0),
                    StateIn::Buffer(s) => row.copy_from_slice(&s[at..at + d.dk]),
                    StateIn::InPlace => row.copy_from_slice(&state[at..at + d.dk]),
                }
                for t in 0..keep {
                    let gate = (b * d.t + t) * d.hv + hv;
                    let qk_at = ((b * d.t + t) * d.hk + hk) * d.dk;
                    let k = &k[qk_at..qk_at + d.dk];
                    let (gt, bt) = (g[gate], beta[gate]);
                    let mut partials = [0f32; 32];
                    for (lane, partial) in partials.iter_mut().enumerate() {
                        let mut acc = 0.0f32;
                        for i in lane * n..(lane + 1) * n {
                            row[i] *= gt;
                            acc += row[i] * k[i].to_f32();
                        }
                        *partial = acc;
                    }
                    let kv_mem = simd_sum(&partials);
                    let delta = (v[((b * d.t + t) * d.hv + hv) * d.dv + dv].to_f32() - kv_mem) * bt;
                    for i in 0..d.dk {
                        row[i] += k[i].to_f32() * delta;
                    }
                }
                state[at..at + d.dk].copy_from_slice(&row);
            }
        }
    }
}

/// Params: `[B, T, Hk, Hv, Dk, Dv, k/v dtype, beta dtype, has_state]`; inputs:
/// `k, v, g, beta, [state], lengths (int32 [B])`; output: `state_out`.
pub(crate) fn run_replay(params: &[i64], mut buffers: Buffers) {
    let p: Vec<usize> = params.iter().map(|&x| x as usize).collect();
    let d = Dims {
        b: p[0],
        t: p[1],
        hk: p[2],
        hv: p[3],
        dk: p[4],
        dv: p[5],
    };
    let dtype = super::dtype_param(params[6]);
    let beta_dtype = super::dtype_param(params[7]);
    let has_state = params[8] != 0;
    let inputs = &buffers.inputs;
    let g: &[f32] = typed(inputs[2]);
    let beta = to_f32_vec(inputs[3], beta_dtype);
    let state_in = match (has_state, buffers.aliased[0]) {
        (false, _) => StateIn::Zeros,
        (true, Some(_)) => StateIn::InPlace,
        (true, None) => StateIn::Buffer(typed(inputs[4])),
    };
    let lengths: &[i32] = typed(inputs[4 + has_state as usize]);
    let state: &mut [f32] = typed_mut(buffers.outputs[0]);
    match dtype {
        Dtype::Bfloat16 => replay::<bf16>(
            d,
            typed(inputs[0]),
            typed(inputs[1]),
            g,
            &beta,
            state_in,
            lengths,
            state,
        ),
        Dtype::Float16 => replay::<f16>(
            d,
            typed(inputs[0]),
            typed(inputs[1]),
            g,
            &beta,
            state_in,
            lengths,
            state,
        ),
        Dtype::Float32 => replay::<f32>(
            d,
            typed(inputs[0]),
            typed(inputs[1]),
            g,
            &beta,
            state_in,
            lengths,
            state,
        ),
        other => panic!(
            "gated delta state: unsupported input dtype {}",
            other.name()
        ),
    }
}
