//! The head split (`mlxk_silu_rms_heads`): SiLU over the fused q/k/v projection, then per
//! head an RMS norm of q and k. docs/DESIGN.md §3, §4.

use super::{Codec, Kernel, Output, Words};
use crate::dtype::Dtype;

/// x `[B, S, C]` with C = 2·Hk·Dk + Hv·Dv; q, k `[B, S, Hk, Dk]`; v `[B, S, Hv, Dv]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dims {
    pub b: usize,
    pub s: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

impl Dims {
    /// Rows of x: B·S.
    pub fn rows(&self) -> usize {
        self.b * self.s
    }

    /// Channels of x: 2·Hk·Dk + Hv·Dv.
    pub fn channels(&self) -> usize {
        2 * self.hk * self.dk + self.hv * self.dv
    }

    /// Heads per row: Hk query heads, Hk key heads, Hv value heads.
    pub fn heads(&self) -> usize {
        2 * self.hk + self.hv
    }
}

/// One head-split node. Inputs: x, q_scale `[Dk]`, k_scale `[Dk]` (Metal names "x", "qscale",
/// "kscale"), all of `dtype`; outputs q, k, v of `dtype`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Node {
    pub dims: Dims,
    pub dtype: Dtype,
    pub eps: f32,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            dims: Dims::default(),
            dtype: Dtype::Float32,
            eps: 0.0,
        }
    }
}

/// The Metal kernel's input names, in order (the CPU node takes the same order).
pub const INPUTS: [&str; 3] = ["x", "qscale", "kscale"];

impl Node {
    pub fn kernel(&self) -> Kernel {
        Kernel::SiluRmsHeads
    }

    /// q, k `[B, S, Hk, Dk]` and v `[B, S, Hv, Dv]`, all in the input dtype.
    pub fn outputs(&self) -> Vec<Output> {
        let d = self.dims;
        let out = |heads: usize, width: usize| Output {
            shape: vec![d.b, d.s, heads, width],
            dtype: self.dtype,
        };
        vec![out(d.hk, d.dk), out(d.hk, d.dk), out(d.hv, d.dv)]
    }
}

impl Words for Node {
    const WHAT: &'static str = "head split";

    fn fields(&mut self, c: &mut impl Codec) {
        let d = &mut self.dims;
        for x in [
            &mut d.b, &mut d.s, &mut d.hk, &mut d.hv, &mut d.dk, &mut d.dv,
        ] {
            c.usize(x);
        }
        c.dtype(&mut self.dtype);
        c.f32_bits(&mut self.eps);
    }
}

/// The head split's backward pass (`mlxk_silu_rms_heads_vjp`): the gradients of x, q_scale and
/// k_scale from the cotangents of q, k and v. CPU only.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Backward {
    /// The forward it differentiates.
    pub forward: Node,
    /// Per output q, k, v: its cotangent's dtype when one is given (absent: zeros). Cotangents
    /// have the outputs' shapes.
    pub cotangents: [Option<Dtype>; 3],
}

/// An input of the backward node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackwardInput {
    X,
    QScale,
    KScale,
    /// The cotangent of output q (0), k (1) or v (2).
    Cotangent(usize),
}

/// The outputs the cotangents belong to, in order.
pub const OUTPUTS: [&str; 3] = ["q", "k", "v"];

impl Backward {
    pub fn kernel(&self) -> Kernel {
        Kernel::SiluRmsHeadsBackward
    }

    /// The CPU node's inputs: x, q_scale, k_scale, then the given cotangents in the order of
    /// the outputs (dq, dk, dv).
    pub fn cpu_inputs(&self) -> Vec<BackwardInput> {
        let mut inputs = vec![
            BackwardInput::X,
            BackwardInput::QScale,
            BackwardInput::KScale,
        ];
        for (i, c) in self.cotangents.iter().enumerate() {
            if c.is_some() {
                inputs.push(BackwardInput::Cotangent(i));
            }
        }
        inputs
    }

    /// Where `input` sits among the CPU node's inputs.
    pub fn cpu_slot(&self, input: BackwardInput) -> Option<usize> {
        self.cpu_inputs().iter().position(|&i| i == input)
    }

    /// dx `[B, S, C]`, dq_scale and dk_scale `[Dk]`, all in the input dtype.
    pub fn outputs(&self) -> Vec<Output> {
        let (d, dtype) = (self.forward.dims, self.forward.dtype);
        vec![
            Output {
                shape: vec![d.b, d.s, d.channels()],
                dtype,
            },
            Output {
                shape: vec![d.dk],
                dtype,
            },
            Output {
                shape: vec![d.dk],
                dtype,
            },
        ]
    }
}

impl Words for Backward {
    const WHAT: &'static str = "head split backward";

    fn fields(&mut self, c: &mut impl Codec) {
        self.forward.fields(c);
        for cotangent in self.cotangents.iter_mut() {
            let mut given = cotangent.is_some();
            let mut dtype = cotangent.unwrap_or(Dtype::Float32);
            c.bool(&mut given);
            c.dtype(&mut dtype);
            *cotangent = given.then_some(dtype);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_decode_is_identity() {
        let n = Node {
            dims: Dims {
                b: 3,
                s: 5,
                hk: 2,
                hv: 4,
                dk: 128,
                dv: 96,
            },
            dtype: Dtype::Float16,
            eps: 1e-6,
        };
        assert_eq!(Node::decode(&n.encode()), Ok(n));
        assert_eq!(n.dims.channels(), 2 * 2 * 128 + 4 * 96);
        assert!(Node::decode(&n.encode()[1..]).is_err());
    }

    #[test]
    fn backward_words_and_inputs() {
        let forward = Node {
            dims: Dims {
                b: 2,
                s: 3,
                hk: 1,
                hv: 2,
                dk: 7,
                dv: 5,
            },
            dtype: Dtype::Bfloat16,
            eps: 1e-5,
        };
        let n = Backward {
            forward,
            cotangents: [Some(Dtype::Float32), None, Some(Dtype::Bfloat16)],
        };
        assert_eq!(Backward::decode(&n.encode()), Ok(n));
        use BackwardInput::*;
        assert_eq!(
            n.cpu_inputs(),
            [X, QScale, KScale, Cotangent(0), Cotangent(2)]
        );
        assert_eq!(n.cpu_slot(Cotangent(1)), None);
        let shapes: Vec<Vec<usize>> = n.outputs().into_iter().map(|o| o.shape).collect();
        assert_eq!(shapes, [vec![2, 3, 2 * 7 + 2 * 5], vec![7], vec![7]]);
        assert!(Backward::decode(&forward.encode()).is_err());
    }
}
