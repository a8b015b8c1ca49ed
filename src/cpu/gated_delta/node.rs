//! The kernel node of the family (`node::gated_delta::Node`): decodes it, finds its buffers
//! in the order the node defines, computes the gates and runs the node's form — the exact
//! recurrence, the chunked form or the prefix-state replay.

use half::{bf16, f16};

use super::exact::{solve, Problem};
use super::gates::{gates, GateInputs};
use super::StateIn;
use crate::cpu::{chunked, typed, typed_mut, Buffers};
use crate::dtype::Dtype;
use crate::node::gated_delta::{Form, Input, Node};
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
    let (g, beta) = gates(&gate_inputs, d.b * d.t * d.hv, d.hv);
    let state_in = match (input(Input::State), buffers.aliased[node.state_output()]) {
        (None, _) => StateIn::Zeros,
        (Some(_), Some(_)) => StateIn::InPlace,
        (Some(state), None) => StateIn::Buffer(typed(state)),
    };
    let mask = input(Input::Mask);
    let lengths: Option<&[i32]> = input(Input::Lengths).map(typed);
    let q_bytes = input(Input::Q);
    let (k_bytes, v_bytes) = (gate(Input::K), gate(Input::V));
    let mut outputs = std::mem::take(&mut buffers.outputs).into_iter();
    let y_bytes = match node.form {
        Form::State => &mut [][..],
        _ => outputs.next().expect("y"),
    };
    let state: &mut [f32] = typed_mut(outputs.next().expect("state_out"));
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
                lengths,
            };
            match node.form {
                Form::Chunked { chunk } => chunked::chunked_recurrence_with(
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
