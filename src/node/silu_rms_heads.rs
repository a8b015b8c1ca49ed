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
}
