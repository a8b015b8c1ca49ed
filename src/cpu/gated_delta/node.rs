//! The kernel node of the family (`node::gated_delta::Node`): decodes it, finds its buffers
//! in the order the node defines, computes the gates and runs the node's form — the exact
//! recurrence, the chunked form or the prefix-state replay.

use half::{bf16, f16};

use super::chunked::{ChunkedInputs, ChunkedOuts, Products};
use super::exact::{solve, Problem};
use super::gates::{gates, GateInputs};
use super::{chunked, Rows, StateIn};
use crate::cpu::elem::{narrow, widen, Floats, FloatsMut};
use crate::cpu::{typed, typed_mut, Buffers};
use crate::dtype::Dtype;
use crate::node::gated_delta::{Form, Input, Node, PoolWrite};
use crate::node::Words;

/// Entry for every node of the family (`node::gated_delta::Node`): the update in exact or
/// chunked form and the prefix-state replay. The node fixes the inputs' order (`cpu_inputs`)
/// and the outputs: `y` (update forms), then `state_out`.
pub(crate) fn run(params: &[i64], mut buffers: Buffers) {
    let node = Node::decode(params).unwrap_or_else(|e| panic!("{e}"));
    let d = node.dims;
    let inputs = &buffers.inputs;
    let input = |which: Input| node.cpu_slot(which).map(|slot| inputs[slot]);
    let gate = |which: Input| input(which).expect("the gate inputs are always given");
    let gate_inputs = GateInputs {
        a: gate(Input::A),
        a_dtype: node.gates.a,
        b: gate(Input::B),
        b_dtype: node.gates.b,
        a_log: gate(Input::ALog),
        a_log_dtype: node.gates.a_log,
        dt_bias: gate(Input::DtBias),
        dt_bias_dtype: node.gates.dt_bias,
    };
    let (g, beta) = gates(&gate_inputs, node.tokens() * d.hv, d.hv);
    let aliased = node.has_state_output() && buffers.aliased[node.state_output()].is_some();
    let mut outputs = std::mem::take(&mut buffers.outputs).into_iter();
    let y_bytes = match node.form {
        Form::State => &mut [][..],
        _ => outputs.next().expect("y"),
    };
    let state: &mut [f32] = match node.has_state_output() {
        true => typed_mut(outputs.next().expect("state_out")),
        false => &mut [],
    };
    let state_in = match (input(Input::State), aliased) {
        (None, _) => StateIn::Zeros,
        (Some(_), true) => StateIn::InPlace,
        // A pool the caller still holds: the output starts as its copy (every row not named
        // keeps its values), then is updated in place.
        (Some(pool), false) if node.pool.is_some_and(|p| p.write == PoolWrite::Pool) => {
            copy_rows(typed(pool), state, d.hv * d.dv * d.dk);
            StateIn::InPlace
        }
        (Some(state), false) => StateIn::Buffer(typed(state)),
    };
    let mask = input(Input::Mask);
    let rows = match input(Input::Rows) {
        Some(table) => Rows::table(d.t, typed(table)),
        None => Rows::dense(d.t, input(Input::Lengths).map(typed)),
    };
    let q_bytes = input(Input::Q);
    let (k_bytes, v_bytes) = (gate(Input::K), gate(Input::V));
    macro_rules! go {
        ($t:ty) => {{
            let problem = Problem::<$t> {
                d,
                q: q_bytes.map(typed::<$t>),
                k: typed(k_bytes),
                v: typed(v_bytes),
                g: &g,
                beta: &beta,
                state_in,
                mask,
                rows,
            };
            match node.form {
                Form::Chunked { chunk } => chunked::chunked_recurrence_rows(
                    d,
                    problem.q.expect("the update has queries"),
                    problem.k,
                    problem.v,
                    &g,
                    &beta,
                    state_in,
                    mask,
                    rows,
                    typed_mut::<$t>(y_bytes),
                    state,
                    chunked::ChunkedOptions {
                        chunk,
                        ..Default::default()
                    },
                ),
                _ => solve(&problem, typed_mut::<$t>(y_bytes), state),
            }
        }};
    }
    match node.dtype {
        Dtype::Bfloat16 => go!(bf16),
        Dtype::Float16 => go!(f16),
        Dtype::Float32 => go!(f32),
        other => panic!("gated delta: unsupported input dtype {}", other.name()),
    }
}

/// Copies a pool `src` into `dst` (same length), `row` values a state row, over the worker
/// pool.
fn copy_rows(src: &[f32], dst: &mut [f32], row: usize) {
    assert_eq!(
        src.len(),
        dst.len(),
        "the pool and its output differ in size"
    );
    let rows = src.len().checked_div(row).unwrap_or(0);
    let out = crate::cpu::pool::SharedMut(dst.as_mut_ptr());
    let out = &out;
    crate::cpu::pool::run(rows, &|r| {
        let at = r * row;
        // SAFETY: job r alone writes row r of `dst`, which outlives the pool's jobs.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.0.add(at), row) };
        dst.copy_from_slice(&src[at..at + row]);
    });
}

/// Entry for the backward node (`node::gated_delta::Backward`): the forward's gates as the
/// forward computes them, the backward of the forward's form (the chunked form's own,
/// `chunked::chunked_backward`, or the recurrence's sweep), the gates' chain; outputs dq, dk,
/// dv, da, db, da_log, ddt_bias in their inputs' dtypes, then dstate.
pub(crate) fn run_backward(params: &[i64], buffers: Buffers) {
    use super::backward::{backward, gate_backward, gate_backward_log, Inputs};
    use crate::node::gated_delta::{Backward, BackwardInput};
    let node = Backward::decode(params).unwrap_or_else(|e| panic!("{e}"));
    let f = node.forward;
    let d = f.dims;
    let inputs = &buffers.inputs;
    let input = |which: BackwardInput| node.cpu_slot(which).map(|slot| inputs[slot]);
    let forward = |which: Input| input(BackwardInput::Forward(which));
    let given = |which: Input| forward(which).expect("the forward's inputs are given");
    let gate_inputs = GateInputs {
        a: given(Input::A),
        a_dtype: f.gates.a,
        b: given(Input::B),
        b_dtype: f.gates.b,
        a_log: given(Input::ALog),
        a_log_dtype: f.gates.a_log,
        dt_bias: given(Input::DtBias),
        dt_bias_dtype: f.gates.dt_bias,
    };
    let (g, beta) = gates(&gate_inputs, d.b * d.t * d.hv, d.hv);
    let state = forward(Input::State).map(typed::<f32>);
    let dstate_out = input(BackwardInput::DstateOut).map(typed::<f32>);
    let zeros;
    let dy = match input(BackwardInput::Dy) {
        Some(bytes) => Floats::new(bytes, node.dy_dtype),
        None => {
            zeros = vec![0.0; d.b * d.t * d.hv * d.dv];
            Floats::F32(&zeros)
        }
    };
    let (a, b, a_log, dt_bias) = (
        widen(given(Input::A), f.gates.a),
        widen(given(Input::B), f.gates.b),
        widen(given(Input::ALog), f.gates.a_log),
        widen(given(Input::DtBias), f.gates.dt_bias),
    );
    let [dq_out, dk_out, dv_out, da_out, db_out, da_log_out, ddt_bias_out, dstate_out_buf]: [&mut [u8]; 8] =
        buffers.outputs.try_into().expect("the backward node has eight outputs");
    // The chunked form's own backward (its gates' cotangent is that of log g), reading q, k, v
    // and dy in their dtypes and writing dq, dk, dv and dstate into the outputs; every other
    // form the exact recurrence's, on float32 copies.
    let gate_grads = match f.form {
        Form::Chunked { chunk } => {
            let x = ChunkedInputs {
                d,
                q: Floats::new(given(Input::Q), f.dtype),
                k: Floats::new(given(Input::K), f.dtype),
                v: Floats::new(given(Input::V), f.dtype),
                g: &g,
                beta: &beta,
                state,
                mask: forward(Input::Mask),
                dy,
                dstate_out,
            };
            let (mut dlog_g, mut dbeta) = (vec![0.0; g.len()], vec![0.0; g.len()]);
            let outs = ChunkedOuts {
                dq: FloatsMut::new(dq_out, f.dtype),
                dk: FloatsMut::new(dk_out, f.dtype),
                dv: FloatsMut::new(dv_out, f.dtype),
                dlog_g: &mut dlog_g,
                dbeta: &mut dbeta,
                dstate: typed_mut(dstate_out_buf),
            };
            chunked::chunked_backward_into(&x, chunk, Products::Fastest, outs);
            gate_backward_log(&a, &b, &a_log, &dt_bias, &dlog_g, &dbeta)
        }
        _ => {
            let (q, k, v) = (
                widen(given(Input::Q), f.dtype),
                widen(given(Input::K), f.dtype),
                widen(given(Input::V), f.dtype),
            );
            let dy = dy.to_vec();
            let x = Inputs {
                d,
                q: &q,
                k: &k,
                v: &v,
                g: &g,
                beta: &beta,
                state,
                mask: forward(Input::Mask),
                dy: &dy,
                dstate_out,
            };
            let grads = backward(&x, node.checkpoint);
            for (out, values) in [
                (dq_out, &grads.dq),
                (dk_out, &grads.dk),
                (dv_out, &grads.dv),
            ] {
                narrow(values, out, f.dtype);
            }
            narrow(&grads.dstate, dstate_out_buf, Dtype::Float32);
            gate_backward(&a, &b, &a_log, &dt_bias, &grads.dg, &grads.dbeta)
        }
    };
    let results: [(&mut [u8], &[f32], Dtype); 4] = [
        (da_out, &gate_grads.da, f.gates.a),
        (db_out, &gate_grads.db, f.gates.b),
        (da_log_out, &gate_grads.da_log, f.gates.a_log),
        (ddt_bias_out, &gate_grads.ddt_bias, f.gates.dt_bias),
    ];
    for (out, values, dtype) in results {
        narrow(values, out, dtype);
    }
}
