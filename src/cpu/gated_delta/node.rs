//! The kernel nodes of the update (exact or chunked form) and of the prefix replay: each
//! decodes its parameters and buffers, computes the gates and runs its form.

use half::{bf16, f16};

use super::exact::{solve, Problem};
use super::gates::{gates, GateInputs};
use super::{Dims, StateIn};
use crate::cpu::{chunked, dtype_param, features, typed, typed_mut, Buffers};
use crate::dtype::Dtype;

/// Entry for the update: params `[B, T, Hk, Hv, Dk, Dv, qkv, a, b, a_log, dt_bias dtypes,
/// has_state, has_mask]`; inputs `q, k, v, a, b, a_log, dt_bias, [state], [mask]`; outputs
/// `y, state_out`.
pub(crate) fn run(params: &[i64], buffers: Buffers) {
    run_any(params, buffers, Mode::Exact)
}

/// Entry for the chunked update: the update's params plus the chunk size; same buffers.
pub(crate) fn run_chunked(params: &[i64], buffers: Buffers) {
    let chunk = params[13] as usize;
    run_any(params, buffers, Mode::Chunked(chunk))
}

/// Entry for the replay: params `[B, T, Hk, Hv, Dk, Dv, kv, a, b, a_log, dt_bias dtypes,
/// has_state]`; inputs `k, v, a, b, a_log, dt_bias, [state], lengths`; output `state_out`.
pub(crate) fn run_replay(params: &[i64], buffers: Buffers) {
    run_any(params, buffers, Mode::Replay)
}

/// Which recurrence a node runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Exact,
    /// The chunked (WY) form with this many tokens per chunk.
    Chunked(usize),
    Replay,
}

fn run_any(params: &[i64], mut buffers: Buffers, mode: Mode) {
    let update = mode != Mode::Replay;
    let p: Vec<usize> = params.iter().map(|&x| x as usize).collect();
    let d = Dims {
        b: p[0],
        t: p[1],
        hk: p[2],
        hv: p[3],
        dk: p[4],
        dv: p[5],
    };
    let dtype = dtype_param(params[6]);
    let has_state = params[11] != 0;
    let first = if update { 1 } else { 0 }; // index of k
    let inputs = &buffers.inputs;
    let gate_inputs = GateInputs {
        a: inputs[first + 2],
        a_dtype: dtype_param(params[7]),
        b: inputs[first + 3],
        b_dtype: dtype_param(params[8]),
        a_log: inputs[first + 4],
        a_log_dtype: dtype_param(params[9]),
        dt_bias: inputs[first + 5],
        dt_bias_dtype: dtype_param(params[10]),
    };
    let (g, beta) = gates(&gate_inputs, d.b * d.t * d.hv, d.hv);
    let state_output = if update { 1 } else { 0 };
    let state_index = first + 6;
    let state_in = match (has_state, buffers.aliased[state_output]) {
        (false, _) => StateIn::Zeros,
        (true, Some(_)) => StateIn::InPlace,
        (true, None) => StateIn::Buffer(typed(inputs[state_index])),
    };
    let after_state = state_index + has_state as usize;
    let mask = (update && params[12] != 0).then(|| inputs[after_state]);
    let lengths: Option<&[i32]> = (!update).then(|| typed(inputs[after_state]));
    let mut outputs = std::mem::take(&mut buffers.outputs).into_iter();
    let (y_bytes, state_bytes) = if update {
        (outputs.next().unwrap(), outputs.next().unwrap())
    } else {
        (&mut [][..], outputs.next().unwrap())
    };
    let state: &mut [f32] = typed_mut(state_bytes);
    macro_rules! go {
        ($t:ty) => {{
            let problem = Problem::<$t> {
                d,
                q: update.then(|| typed::<$t>(inputs[0])),
                k: typed(inputs[first]),
                v: typed(inputs[first + 1]),
                g: &g,
                beta: &beta,
                state_in,
                mask,
                lengths,
            };
            match mode {
                Mode::Chunked(chunk) => chunked::chunked_recurrence_with(
                    d,
                    problem.q.expect("the update has queries"),
                    problem.k,
                    problem.v,
                    &g,
                    &beta,
                    state_in,
                    mask,
                    typed_mut::<$t>(y_bytes),
                    state,
                    chunked::ChunkedOptions {
                        chunk,
                        force_portable: features::portable_forced(),
                    },
                ),
                _ => solve(&problem, typed_mut::<$t>(y_bytes), state),
            }
        }};
    }
    match dtype {
        Dtype::Bfloat16 => go!(bf16),
        Dtype::Float16 => go!(f16),
        Dtype::Float32 => go!(f32),
        other => panic!("gated delta: unsupported input dtype {}", other.name()),
    }
}
