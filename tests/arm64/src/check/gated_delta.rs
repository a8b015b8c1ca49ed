//! The recurrence (exact form and replay): NEON row kernels against the portable one, bit for
//! bit, at every key width they take (Dk = 32, 64, 96, 128, 256) and one they do not (160),
//! in every dtype, with and without a state and a mask, decode steps and tiles of tokens.

use super::{neon_and_portable, run_node, same_bits, Buffer, Rng, FLOATS};
use crate::dtype::Dtype;
use crate::node::gated_delta::{Dims, Form, GateDtypes, Node};
use crate::node::Words;

/// One call's inputs, in the CPU node's order.
pub struct Case {
    pub node: Node,
    pub inputs: Vec<Buffer>,
}

impl Case {
    /// Random inputs for `node`; value head 0 decays fast (its state reaches the subnormal
    /// range within a few tokens, where the kernels flush).
    pub fn new(node: Node, lengths: Option<Vec<i32>>, seed: u64) -> Case {
        let d = node.dims;
        let mut rng = Rng(seed);
        let dtype = node.dtype;
        let tokens = d.b * d.t;
        let mut inputs = Vec::new();
        if node.form != Form::State {
            inputs.push(Buffer::floats(
                &rng.values(tokens * d.hk * d.dk, 0.3),
                dtype,
            ));
        }
        // Keys of norm about 1, as the head split makes them.
        let scale = 1.7 / (d.dk as f32).sqrt();
        inputs.push(Buffer::floats(
            &rng.values(tokens * d.hk * d.dk, scale),
            dtype,
        ));
        inputs.push(Buffer::floats(
            &rng.values(tokens * d.hv * d.dv, 1.0),
            dtype,
        ));
        inputs.push(Buffer::floats(
            &rng.values(tokens * d.hv, 2.0),
            Dtype::Float32,
        ));
        inputs.push(Buffer::floats(
            &rng.values(tokens * d.hv, 2.0),
            Dtype::Float32,
        ));
        let mut a_log = rng.values(d.hv, 0.5);
        a_log[0] = 3.5;
        inputs.push(Buffer::floats(&a_log, Dtype::Float32));
        inputs.push(Buffer::floats(&rng.values(d.hv, 0.5), Dtype::Float32));
        if node.has_state {
            let state = rng.values(d.b * d.hv * d.dv * d.dk, 1.0);
            inputs.push(Buffer::floats(&state, Dtype::Float32));
        }
        if node.has_mask {
            // About one token in five masked, never all.
            let mask: Vec<u8> = (0..tokens)
                .map(|i| (i.is_multiple_of(3) || !rng.next().is_multiple_of(5)) as u8)
                .collect();
            inputs.push(Buffer::raw(&mask));
        }
        if let Some(lengths) = lengths {
            let bytes: Vec<u8> = lengths.iter().flat_map(|l| l.to_ne_bytes()).collect();
            inputs.push(Buffer::raw(&bytes));
        }
        Case { node, inputs }
    }

    pub fn run(&self) -> Vec<Buffer> {
        let sizes: Vec<usize> = self
            .node
            .outputs()
            .iter()
            .map(|o| o.shape.iter().product::<usize>() * o.dtype.size())
            .collect();
        run_node(
            self.node.kernel() as u32,
            &self.node.encode(),
            &self.inputs,
            &sizes,
        )
    }
}

pub fn node(dims: Dims, dtype: Dtype, has_state: bool, has_mask: bool, form: Form) -> Node {
    Node {
        dims,
        dtype,
        gates: GateDtypes::default(),
        has_state,
        has_mask,
        form,
        pool: None,
    }
}

fn compare(case: &Case, what: &str) {
    let (neon, portable) = neon_and_portable(|| case.run());
    let node = &case.node;
    for (i, (out, (a, b))) in node
        .outputs()
        .iter()
        .zip(neon.iter().zip(&portable))
        .enumerate()
    {
        let what = format!("{what} output {i}");
        same_bits(&what, &a.widen(out.dtype), &b.widen(out.dtype));
    }
    // Not all zeros: the case computed something.
    let y = neon[0].widen(node.outputs()[0].dtype);
    assert!(y.iter().any(|&x| x != 0.0), "{what}: all zeros");
}

#[test]
fn exact_update_matches_the_portable_kernel_bit_for_bit() {
    let mut seed = 1;
    for dk in [32, 64, 96, 128, 256, 160] {
        for (b, t, hk, hv, dv) in [(1, 1, 1, 2, 9), (2, 5, 2, 4, 8), (1, 70, 1, 2, 5)] {
            for dtype in FLOATS {
                for (has_state, has_mask) in [(true, false), (false, true), (true, true)] {
                    let dims = Dims {
                        b,
                        t,
                        hk,
                        hv,
                        dk,
                        dv,
                    };
                    seed += 1;
                    let case = Case::new(
                        node(dims, dtype, has_state, has_mask, Form::Exact),
                        None,
                        seed,
                    );
                    let what = format!(
                        "{dims:?} {} state {has_state} mask {has_mask}",
                        dtype.name()
                    );
                    compare(&case, &what);
                }
            }
        }
    }
}

#[test]
fn replay_matches_the_portable_kernel_bit_for_bit() {
    let mut seed = 100;
    for dk in [64, 128, 256] {
        for dtype in FLOATS {
            let dims = Dims {
                b: 3,
                t: 9,
                hk: 2,
                hv: 4,
                dk,
                dv: 7,
            };
            seed += 1;
            let case = Case::new(
                node(dims, dtype, true, false, Form::State),
                Some(vec![9, 0, 4]),
                seed,
            );
            let (neon, portable) = neon_and_portable(|| case.run());
            let what = format!("replay {dims:?} {}", dtype.name());
            same_bits(
                &what,
                &neon[0].widen(Dtype::Float32),
                &portable[0].widen(Dtype::Float32),
            );
        }
    }
}

/// Head 0's gates drive the state into subnormals; flushed, they are zeros (an unflushed
/// kernel leaves tiny nonzero values there), and both paths flush alike.
#[test]
fn decaying_heads_flush_subnormals() {
    let dims = Dims {
        b: 1,
        t: 40,
        hk: 1,
        hv: 2,
        dk: 128,
        dv: 4,
    };
    let case = Case::new(
        node(dims, Dtype::Float32, true, false, Form::Exact),
        None,
        77,
    );
    let (neon, portable) = neon_and_portable(|| case.run());
    let state = neon[1].widen(Dtype::Float32);
    same_bits("state", &state, &portable[1].widen(Dtype::Float32));
    let head0 = &state[..dims.dv * dims.dk];
    assert!(
        head0
            .iter()
            .all(|x| *x == 0.0 || x.abs() >= f32::MIN_POSITIVE),
        "a subnormal in the flushed state"
    );
}

/// `a` and `b` within `tol` of the largest magnitude of `b`, and not all zeros.
fn close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "{what}: all zeros");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: NEON {x:e} vs portable {y:e} (scale {scale:e})"
        );
    }
}

/// The chunked form promises float32 rounding, not bits (its NEON products are fused, the
/// portable ones are not; `gemm`'s own test checks the products' bits): NEON and portable
/// agree to a few units of the output dtype, and the state to float32 rounding.
#[test]
fn chunked_update_matches_the_portable_kernel_to_rounding() {
    let mut seed = 300;
    for (dims, chunk) in [
        (
            Dims {
                b: 1,
                t: 70,
                hk: 1,
                hv: 2,
                dk: 128,
                dv: 128,
            },
            32,
        ),
        (
            Dims {
                b: 2,
                t: 33,
                hk: 2,
                hv: 4,
                dk: 64,
                dv: 20,
            },
            16,
        ),
        (
            Dims {
                b: 1,
                t: 100,
                hk: 1,
                hv: 1,
                dk: 32,
                dv: 16,
            },
            64,
        ),
    ] {
        for dtype in FLOATS {
            for (has_state, has_mask) in [(false, false), (true, true)] {
                seed += 1;
                let form = Form::Chunked {
                    chunk: crate::node::gated_delta::ChunkSize::new(chunk).unwrap(),
                };
                let case = Case::new(node(dims, dtype, has_state, has_mask, form), None, seed);
                let (neon, portable) = neon_and_portable(|| case.run());
                let what = format!(
                    "chunked {chunk} {dims:?} {} state {has_state}",
                    dtype.name()
                );
                let tol = match dtype {
                    Dtype::Bfloat16 => 2f32.powi(-7),
                    Dtype::Float16 => 2f32.powi(-9),
                    _ => 2f32.powi(-14),
                };
                close(
                    &format!("{what} y"),
                    &neon[0].widen(dtype),
                    &portable[0].widen(dtype),
                    tol,
                );
                let (s1, s2) = (
                    neon[1].widen(Dtype::Float32),
                    portable[1].widen(Dtype::Float32),
                );
                close(&format!("{what} state"), &s1, &s2, 2f32.powi(-14));
            }
        }
    }
}
