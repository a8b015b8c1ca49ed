//! The gated RMSNorm (`mlxk_gated_rms_norm`): `out = rmsnorm(x) · weight · silu(gate)` per row
//! of D values. docs/DESIGN.md §3, §4.

use super::{Codec, Kernel, Output, Words};
use crate::dtype::Dtype;

/// One gated-norm node. Inputs x `[..., D]`, gate (x's shape, any float dtype), weight `[D]`
/// (x's dtype); output of x's shape and dtype.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// x's shape (rank >= 1; the last dimension is D).
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    pub gate_dtype: Dtype,
    pub eps: f32,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            shape: vec![],
            dtype: Dtype::Float32,
            gate_dtype: Dtype::Float32,
            eps: 0.0,
        }
    }
}

/// The Metal kernel's input names, in order (the CPU node takes the same order).
pub const INPUTS: [&str; 3] = ["x", "gate", "weight"];

/// Threads per row of the Metal kernel: `min(1024, ceil(D / 128) · 32)`. The CPU kernel sums
/// in the same per-thread blocks, so both use this one definition.
pub fn threads(width: usize) -> usize {
    (width.div_ceil(128) * 32).min(1024)
}

impl Node {
    pub fn kernel(&self) -> Kernel {
        Kernel::GatedRmsNorm
    }

    /// D, the row width.
    pub fn width(&self) -> usize {
        self.shape.last().copied().unwrap_or(0)
    }

    /// Rows: the product of the leading dimensions (0 when any is 0, even if the others'
    /// product would overflow).
    pub fn rows(&self) -> usize {
        let leading = &self.shape[..self.shape.len().saturating_sub(1)];
        if leading.contains(&0) {
            0
        } else {
            leading.iter().fold(1usize, |n, &d| n.saturating_mul(d))
        }
    }

    pub fn threads(&self) -> usize {
        threads(self.width())
    }

    pub fn outputs(&self) -> Vec<Output> {
        vec![Output {
            shape: self.shape.clone(),
            dtype: self.dtype,
        }]
    }
}

impl Words for Node {
    const WHAT: &'static str = "gated norm";

    fn fields(&mut self, c: &mut impl Codec) {
        c.sizes(&mut self.shape);
        c.dtype(&mut self.dtype);
        c.dtype(&mut self.gate_dtype);
        c.f32_bits(&mut self.eps);
    }
}

/// The gated norm's backward pass (`mlxk_gated_rms_norm_vjp`): the gradients of x, gate and
/// weight from the cotangent of out. CPU only.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Backward {
    /// The forward it differentiates.
    pub forward: Node,
    /// The dtype of out's cotangent (x's shape) when one is given (absent: zeros).
    pub cotangent: Option<Dtype>,
}

impl Backward {
    pub fn kernel(&self) -> Kernel {
        Kernel::GatedRmsNormBackward
    }

    /// Inputs: x, gate, weight (the forward's, `INPUTS`), then dout when given.
    pub fn inputs(&self) -> usize {
        3 + self.cotangent.is_some() as usize
    }

    /// dx (x's shape and dtype), dgate (the gate's shape and dtype), dweight `[D]` (x's dtype).
    pub fn outputs(&self) -> Vec<Output> {
        let f = &self.forward;
        vec![
            Output {
                shape: f.shape.clone(),
                dtype: f.dtype,
            },
            Output {
                shape: f.shape.clone(),
                dtype: f.gate_dtype,
            },
            Output {
                shape: vec![f.width()],
                dtype: f.dtype,
            },
        ]
    }
}

impl Words for Backward {
    const WHAT: &'static str = "gated norm backward";

    fn fields(&mut self, c: &mut impl Codec) {
        self.forward.fields(c);
        let mut given = self.cotangent.is_some();
        let mut dtype = self.cotangent.unwrap_or(Dtype::Float32);
        c.bool(&mut given);
        c.dtype(&mut dtype);
        self.cotangent = given.then_some(dtype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_then_decode_is_identity() {
        let n = Node {
            shape: vec![2, 3, 4096],
            dtype: Dtype::Bfloat16,
            gate_dtype: Dtype::Float32,
            eps: 1e-5,
        };
        assert_eq!(Node::decode(&n.encode()), Ok(n.clone()));
        assert_eq!((n.rows(), n.width(), n.threads()), (6, 4096, 1024));
        assert_eq!(threads(1), 32);
        assert_eq!(threads(129), 64);
        let mut huge = n.encode();
        huge[0] = 1 << 40; // an absurd rank
        assert!(Node::decode(&huge).is_err());
    }

    #[test]
    fn backward_words() {
        let forward = Node {
            shape: vec![3, 5, 33],
            dtype: Dtype::Float16,
            gate_dtype: Dtype::Bfloat16,
            eps: 1e-6,
        };
        for cotangent in [None, Some(Dtype::Float32)] {
            let n = Backward {
                forward: forward.clone(),
                cotangent,
            };
            assert_eq!(Backward::decode(&n.encode()), Ok(n.clone()));
            assert_eq!(n.inputs(), 3 + cotangent.is_some() as usize);
        }
        let n = Backward {
            forward: forward.clone(),
            cotangent: None,
        };
        let outputs = n.outputs();
        assert_eq!(outputs[1].dtype, Dtype::Bfloat16);
        assert_eq!(outputs[2].shape, [33]);
        assert!(Backward::decode(&forward.encode()).is_err());
    }
}
