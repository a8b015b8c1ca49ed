//! The gated-delta family: the update (exact or chunked form) and the prefix-state replay
//! (`mlxk_gated_delta_state`). docs/DESIGN.md §3 gives the arithmetic, §4 the contract.

use super::{Codec, Kernel, Output, Words};
use crate::dtype::Dtype;
use crate::error::{Error, Result};

/// The dimensions of one call: q, k `[B, T, Hk, Dk]`, v `[B, T, Hv, Dv]`, state
/// `[B, Hv, Dv, Dk]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// Which computation a node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Form {
    /// The recurrence in the Metal kernel's order (`mlxk_gated_delta_update`).
    #[default]
    Exact,
    /// The chunked (WY) form, this many tokens per chunk (`mlxk_gated_delta_update_chunked`).
    Chunked { chunk: ChunkSize },
    /// The state after each row's accepted prefix (`mlxk_gated_delta_state`); no q, no y.
    State,
}

/// The chunked form's tokens per chunk: 0 (the default, 32) or a multiple of 16 in [16, 128].
/// The one statement of that rule: a call's `chunk_size` becomes a `ChunkSize` where it enters
/// (`from_c` for the C ABI's `int32_t`, where 0 is the default; the safe API's `Option<usize>`
/// through the same function) and travels as one to the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkSize(usize);

impl ChunkSize {
    /// Every chunk size is a multiple of this, the smallest (the CPU products' panel width).
    pub const MULTIPLE: usize = 16;
    /// The largest chunk size.
    pub const MAX: usize = 128;
    /// The chunk size of a call that passes 0 (C) or None (Rust): 32, measured faster than 64
    /// on an AVX2 machine (fewer intra-chunk multiply-adds, a working set well inside L2).
    pub const DEFAULT: ChunkSize = ChunkSize(32);

    /// `tokens` if the rule allows it.
    pub const fn new(tokens: usize) -> Option<ChunkSize> {
        if tokens >= Self::MULTIPLE && tokens <= Self::MAX && tokens % Self::MULTIPLE == 0 {
            Some(ChunkSize(tokens))
        } else {
            None
        }
    }

    /// The C ABI's `chunk_size` (0: the default), or the error that names it.
    pub fn from_c(chunk_size: i32) -> Result<ChunkSize> {
        match chunk_size {
            0 => Ok(Self::DEFAULT),
            c => usize::try_from(c).ok().and_then(Self::new).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "chunk_size is {c}; expected 0 (the default, {}) or {}",
                    Self::DEFAULT.0,
                    Self::RULE
                ))
            }),
        }
    }

    /// What the rule allows besides the default, as error messages state it.
    pub const RULE: &'static str = "a multiple of 16 in [16, 128]";

    /// Tokens per chunk.
    pub const fn tokens(self) -> usize {
        // What `new` guarantees, stated where the kernels read the size: the optimizer then
        // knows the chunk loops' bounds (it never fails).
        assert!(self.0 >= Self::MULTIPLE && self.0 <= Self::MAX && self.0 % Self::MULTIPLE == 0);
        self.0
    }
}

impl std::fmt::Display for ChunkSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

const _: () = assert!(
    ChunkSize::MULTIPLE == 16 && ChunkSize::MAX == 128,
    "ChunkSize::RULE states these numbers"
);

/// The dtypes of the gate inputs (each is taken in its own dtype).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateDtypes {
    pub a: Dtype,
    pub b: Dtype,
    pub a_log: Dtype,
    pub dt_bias: Dtype,
}

impl Default for GateDtypes {
    fn default() -> Self {
        GateDtypes {
            a: Dtype::Float32,
            b: Dtype::Float32,
            a_log: Dtype::Float32,
            dt_bias: Dtype::Float32,
        }
    }
}

/// One node of the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub dims: Dims,
    /// q, k and v's dtype (and y's).
    pub dtype: Dtype,
    pub gates: GateDtypes,
    /// A state input is given (otherwise the recurrence starts from zeros).
    pub has_state: bool,
    /// A `[B, T]` bool mask is given (update forms only).
    pub has_mask: bool,
    pub form: Form,
    /// The states live in a pool addressed by slot (`rows` input): None for the dense
    /// `[B, Hv, Dv, Dk]` state.
    pub pool: Option<Pool>,
}

/// A call on a pool of states `[N, Hv, Dv, Dk]` (docs/DESIGN.md §4 "Pools and packing"): the
/// node's `rows` input, int32 `[B, 5]`, gives each row `(tok0, span, len, src, dst)`: its first
/// token in the flattened token dimension, the tokens of y it owns, the tokens it runs (y is 0
/// for the rest), the pool row its state starts from (-1: zeros) and the row of the state
/// output it ends in (-1: none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    /// N, the pool's rows (the state input's first dimension).
    pub slots: usize,
    /// Where the final states go.
    pub write: PoolWrite,
    /// q, k, v are `[1, total_T, H, D]` (packed sequences; `dims.t` is total_T): row b's
    /// tokens are `[tok0, tok0 + len)`.
    pub packed: bool,
}

/// The state output of a pool node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolWrite {
    /// None: the pool is only read (speculative verify).
    None,
    /// The pool itself, `[N, Hv, Dv, Dk]`: rows not named keep their values (the CPU node, which
    /// takes over the pool's buffer when MLX allows and updates it in place).
    Pool,
    /// This many rows `[W, Hv, Dv, Dk]`, which MLX's scatter then writes into the pool (GPU).
    Rows(usize),
    /// The pool's own rows, written through the pool input (MLX CUDA: the bridge hands the
    /// launch a pool buffer of its own, `bridge::cuda_pool_kernel_op`); the launch's state
    /// output is one row no thread writes.
    InPlace,
}

impl Default for Node {
    fn default() -> Self {
        Node {
            dims: Dims::default(),
            dtype: Dtype::Float32,
            gates: GateDtypes::default(),
            has_state: false,
            has_mask: false,
            form: Form::Exact,
            pool: None,
        }
    }
}

/// An input of a node, on either backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    Q,
    K,
    V,
    /// The gate inputs (CPU: the kernel computes g and beta itself).
    A,
    B,
    ALog,
    DtBias,
    /// The state: the caller's; on Metal, zeros when none is given.
    State,
    Mask,
    /// The accepted length of each row (`Form::State`), int32 `[B]`.
    Lengths,
    /// A pool node's row table, int32 `[B, 5]` (`Pool`).
    Rows,
    /// Metal only: g and beta computed by MLX ops, and T as a 1-element int32 array.
    G,
    Beta,
    /// The recurrence from the convolution's output (GPU launch only): x and the head split's
    /// scales, in the places of q, k and v (`Node::from_conv_inputs`).
    X,
    QScale,
    KScale,
}

impl Input {
    /// The name the Metal kernels give this input.
    pub fn name(self) -> &'static str {
        match self {
            Input::Q => "q",
            Input::K => "k",
            Input::V => "v",
            Input::A => "a",
            Input::B => "b",
            Input::ALog => "a_log",
            Input::DtBias => "dt_bias",
            Input::State => "state_in",
            Input::Mask => "mask",
            Input::Lengths => "lengths",
            Input::Rows => "rows",
            Input::G => "g",
            Input::Beta => "beta",
            Input::X => "x",
            Input::QScale => "qscale",
            Input::KScale => "kscale",
        }
    }
}

impl Node {
    /// The CPU kernel that runs this node.
    pub fn kernel(&self) -> Kernel {
        match self.form {
            Form::Exact => Kernel::GatedDelta,
            Form::Chunked { .. } => Kernel::GatedDeltaChunked,
            Form::State => Kernel::GatedDeltaState,
        }
    }

    fn updates(&self) -> bool {
        self.form != Form::State
    }

    /// The CPU node's inputs, in order: `[q,] k, v, a, b, a_log, dt_bias, [state,]` then the
    /// mask (if given) or the lengths (`Form::State`).
    pub fn cpu_inputs(&self) -> Vec<Input> {
        let mut inputs = Vec::with_capacity(9);
        if self.updates() {
            inputs.push(Input::Q);
        }
        inputs.extend([
            Input::K,
            Input::V,
            Input::A,
            Input::B,
            Input::ALog,
            Input::DtBias,
        ]);
        if self.has_state {
            inputs.push(Input::State);
        }
        self.push_last(&mut inputs);
        inputs
    }

    /// The Metal launch's inputs, in order: `[q,] k, v, g, beta, state_in,` then the mask (if
    /// given) or the lengths. T comes with k's shape (`k_shape` in the kernel text).
    pub fn metal_inputs(&self) -> Vec<Input> {
        let mut inputs = Vec::with_capacity(8);
        if self.updates() {
            inputs.push(Input::Q);
        }
        inputs.extend([Input::K, Input::V, Input::G, Input::Beta, Input::State]);
        self.push_last(&mut inputs);
        inputs
    }

    /// The CUDA launch's inputs with the gates fused (`crate::cuda::with_fused_gates`): the
    /// Metal launch's order, with the raw gate inputs a and b in the places (and under the
    /// names) of g and beta, then A_log and dt_bias.
    pub fn cuda_fused_inputs(&self) -> Vec<Input> {
        let mut inputs: Vec<Input> = self
            .metal_inputs()
            .into_iter()
            .map(|input| match input {
                Input::G => Input::A,
                Input::Beta => Input::B,
                other => other,
            })
            .collect();
        inputs.extend([Input::ALog, Input::DtBias]);
        inputs
    }

    /// A GPU launch's inputs (`metal_inputs` or `cuda_fused_inputs`) for the recurrence from
    /// the convolution's output: x, the q scale and the k scale in the places of q, k and v.
    pub fn from_conv_inputs(launch_inputs: Vec<Input>) -> Vec<Input> {
        launch_inputs
            .into_iter()
            .map(|input| match input {
                Input::Q => Input::X,
                Input::K => Input::QScale,
                Input::V => Input::KScale,
                other => other,
            })
            .collect()
    }
    fn push_last(&self, inputs: &mut Vec<Input>) {
        if self.pool.is_some() {
            // The row table carries the replay's lengths.
            if self.has_mask {
                inputs.push(Input::Mask);
            }
            inputs.push(Input::Rows);
        } else if !self.updates() {
            inputs.push(Input::Lengths);
        } else if self.has_mask {
            inputs.push(Input::Mask);
        }
    }

    /// Where `input` sits among the CPU node's inputs.
    pub fn cpu_slot(&self, input: Input) -> Option<usize> {
        self.cpu_inputs().iter().position(|&i| i == input)
    }

    /// Tokens in the flattened token dimension: `B·T`, or total_T for packed sequences.
    pub fn tokens(&self) -> usize {
        match self.pool {
            Some(Pool { packed: true, .. }) => self.dims.t,
            _ => self.dims.b * self.dims.t,
        }
    }

    /// The outputs: y `[B, T, Hv, Dv]` (packed: `[1, total_T, Hv, Dv]`) in the input dtype
    /// (update forms), then the state float32: `[B, Hv, Dv, Dk]`, or a pool node's (`PoolWrite`).
    pub fn outputs(&self) -> Vec<Output> {
        let d = self.dims;
        let mut outputs = Vec::with_capacity(2);
        if self.updates() {
            let (b, t) = match self.pool {
                Some(Pool { packed: true, .. }) => (1, d.t),
                _ => (d.b, d.t),
            };
            outputs.push(Output {
                shape: vec![b, t, d.hv, d.dv],
                dtype: self.dtype,
            });
        }
        let states = match self.pool.map(|p| (p.write, p.slots)) {
            None => Some(d.b),
            Some((PoolWrite::None, _)) => None,
            Some((PoolWrite::Pool, n)) => Some(n),
            Some((PoolWrite::Rows(w), _)) => Some(w),
            Some((PoolWrite::InPlace, _)) => Some(1),
        };
        if let Some(n) = states {
            outputs.push(Output {
                shape: vec![n, d.hv, d.dv, d.dk],
                dtype: Dtype::Float32,
            });
        }
        outputs
    }

    /// The index of the state among the outputs (where `has_state_output`).
    pub fn state_output(&self) -> usize {
        self.updates() as usize
    }

    /// Whether the node has a state output (all but a pool that is only read).
    pub fn has_state_output(&self) -> bool {
        !matches!(
            self.pool,
            Some(Pool {
                write: PoolWrite::None,
                ..
            })
        )
    }

    /// Per output, the CPU input whose buffer it may take over (the state, updated in place
    /// when MLX says the caller's state is donatable), or -1.
    pub fn donations(&self) -> Vec<i32> {
        let mut donate = vec![-1; self.outputs().len()];
        let in_place = match self.pool {
            None => true,
            Some(p) => p.write == PoolWrite::Pool,
        };
        if let (Some(slot), true) = (self.cpu_slot(Input::State), in_place) {
            donate[self.state_output()] = slot as i32;
        }
        donate
    }
}

impl Words for Node {
    const WHAT: &'static str = "gated delta";

    fn fields(&mut self, c: &mut impl Codec) {
        let d = &mut self.dims;
        for x in [
            &mut d.b, &mut d.t, &mut d.hk, &mut d.hv, &mut d.dk, &mut d.dv,
        ] {
            c.usize(x);
        }
        c.dtype(&mut self.dtype);
        let g = &mut self.gates;
        for x in [&mut g.a, &mut g.b, &mut g.a_log, &mut g.dt_bias] {
            c.dtype(x);
        }
        c.bool(&mut self.has_state);
        c.bool(&mut self.has_mask);
        let (mut code, mut chunk) = match self.form {
            Form::Exact => (0, 0),
            Form::Chunked { chunk } => (1, chunk.tokens()),
            Form::State => (2, 0),
        };
        c.usize(&mut code);
        c.usize(&mut chunk);
        self.form = match code {
            0 => Form::Exact,
            1 => match ChunkSize::new(chunk) {
                Some(chunk) => Form::Chunked { chunk },
                None => {
                    c.fail(format!("chunk size {chunk} outside the rule"));
                    Form::Exact
                }
            },
            2 => Form::State,
            other => {
                c.fail(format!("unknown form {other}"));
                Form::Exact
            }
        };
        // The pool: has one, N, write code (0 none, 1 pool, 2 rows), W, packed.
        let (mut has, mut n, mut write, mut w, mut packed) = match self.pool {
            None => (false, 0, 0, 0, false),
            Some(p) => {
                let (code, w) = match p.write {
                    PoolWrite::None => (0, 0),
                    PoolWrite::Pool => (1, 0),
                    PoolWrite::Rows(w) => (2, w),
                    PoolWrite::InPlace => (3, 0),
                };
                (true, p.slots, code, w, p.packed)
            }
        };
        c.bool(&mut has);
        c.usize(&mut n);
        c.usize(&mut write);
        c.usize(&mut w);
        c.bool(&mut packed);
        self.pool = has.then(|| Pool {
            slots: n,
            write: match write {
                0 => PoolWrite::None,
                1 => PoolWrite::Pool,
                2 => PoolWrite::Rows(w),
                3 => PoolWrite::InPlace,
                other => {
                    c.fail(format!("unknown pool write {other}"));
                    PoolWrite::None
                }
            },
            packed,
        });
    }
}

/// The update's backward pass: gradients of y and the final state with respect to every input
/// of the update, given their cotangents (`mlxk_gated_delta_update_vjp`,
/// `mlxk_gated_delta_update_chunked_vjp`). CPU only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backward {
    /// The forward it differentiates (form exact, or chunked: that form's own backward).
    pub forward: Node,
    /// dy `[B, T, Hv, Dv]` is given (else zeros), in this dtype.
    pub has_dy: bool,
    pub dy_dtype: Dtype,
    /// dstate_out `[B, Hv, Dv, Dk]` float32 is given (else zeros).
    pub has_dstate_out: bool,
    /// Tokens between kept forward states (0: the kernel's default).
    pub checkpoint: usize,
}

impl Backward {
    pub fn kernel(&self) -> Kernel {
        Kernel::GatedDeltaBackward
    }

    /// The CPU node's inputs: the forward's, then dy and dstate_out when given.
    pub fn cpu_inputs(&self) -> Vec<BackwardInput> {
        let mut inputs: Vec<BackwardInput> = self
            .forward
            .cpu_inputs()
            .into_iter()
            .map(BackwardInput::Forward)
            .collect();
        if self.has_dy {
            inputs.push(BackwardInput::Dy);
        }
        if self.has_dstate_out {
            inputs.push(BackwardInput::DstateOut);
        }
        inputs
    }

    /// Where `input` sits among the CPU node's inputs.
    pub fn cpu_slot(&self, input: BackwardInput) -> Option<usize> {
        self.cpu_inputs().iter().position(|&i| i == input)
    }

    /// dq, dk, dv, da, db, da_log, ddt_bias (each in its input's shape and dtype), then dstate
    /// (float32).
    pub fn outputs(&self) -> Vec<Output> {
        let n = &self.forward;
        let d = n.dims;
        let out = |shape: Vec<usize>, dtype: Dtype| Output { shape, dtype };
        vec![
            out(vec![d.b, d.t, d.hk, d.dk], n.dtype),
            out(vec![d.b, d.t, d.hk, d.dk], n.dtype),
            out(vec![d.b, d.t, d.hv, d.dv], n.dtype),
            out(vec![d.b, d.t, d.hv], n.gates.a),
            out(vec![d.b, d.t, d.hv], n.gates.b),
            out(vec![d.hv], n.gates.a_log),
            out(vec![d.hv], n.gates.dt_bias),
            out(vec![d.b, d.hv, d.dv, d.dk], Dtype::Float32),
        ]
    }
}

/// An input of the backward node: one of the forward's, or a cotangent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackwardInput {
    Forward(Input),
    Dy,
    DstateOut,
}

impl Words for Backward {
    const WHAT: &'static str = "gated delta backward";

    fn fields(&mut self, c: &mut impl Codec) {
        self.forward.fields(c);
        c.bool(&mut self.has_dy);
        c.dtype(&mut self.dy_dtype);
        c.bool(&mut self.has_dstate_out);
        c.usize(&mut self.checkpoint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(form: Form, has_state: bool, has_mask: bool) -> Node {
        Node {
            dims: Dims {
                b: 2,
                t: 7,
                hk: 2,
                hv: 4,
                dk: 64,
                dv: 3,
            },
            dtype: Dtype::Bfloat16,
            gates: GateDtypes {
                a: Dtype::Float16,
                b: Dtype::Bfloat16,
                a_log: Dtype::Float32,
                dt_bias: Dtype::Bfloat16,
            },
            has_state,
            has_mask,
            form,
            pool: None,
        }
    }

    #[test]
    fn encode_then_decode_is_identity() {
        let pools = [
            None,
            Some(Pool {
                slots: 9,
                write: PoolWrite::None,
                packed: false,
            }),
            Some(Pool {
                slots: 1,
                write: PoolWrite::Pool,
                packed: true,
            }),
            Some(Pool {
                slots: 64,
                write: PoolWrite::Rows(5),
                packed: false,
            }),
            Some(Pool {
                slots: 3,
                write: PoolWrite::InPlace,
                packed: true,
            }),
        ];
        for form in [
            Form::Exact,
            Form::Chunked {
                chunk: ChunkSize::new(48).unwrap(),
            },
            Form::State,
        ] {
            for (s, m) in [(false, false), (true, false), (false, true), (true, true)] {
                for pool in pools {
                    let n = Node {
                        pool,
                        ..node(form, s, m)
                    };
                    assert_eq!(Node::decode(&n.encode()), Ok(n));
                }
            }
        }
    }

    #[test]
    fn pool_nodes_inputs_and_outputs() {
        use Input::*;
        let pool = |write, packed| {
            Some(Pool {
                slots: 6,
                write,
                packed,
            })
        };
        let n = Node {
            pool: pool(PoolWrite::Pool, false),
            ..node(Form::Exact, true, true)
        };
        assert_eq!(
            n.cpu_inputs(),
            [Q, K, V, A, B, ALog, DtBias, State, Mask, Rows]
        );
        assert_eq!(n.outputs()[1].shape, [6, 4, 3, 64]);
        assert_eq!(n.donations(), [-1, 7]);
        let verify = Node {
            pool: pool(PoolWrite::None, false),
            ..n
        };
        assert_eq!(verify.outputs().len(), 1);
        assert_eq!(verify.donations(), [-1]);
        let packed = Node {
            pool: pool(PoolWrite::Rows(2), true),
            ..node(Form::Exact, true, false)
        };
        assert_eq!(packed.outputs()[0].shape, [1, 7, 4, 3]);
        assert_eq!(packed.outputs()[1].shape, [2, 4, 3, 64]);
        assert_eq!(packed.donations(), [-1, -1]);
        assert_eq!(packed.tokens(), 7);
        let replay = Node {
            pool: pool(PoolWrite::Pool, false),
            ..node(Form::State, true, false)
        };
        assert_eq!(replay.cpu_inputs(), [K, V, A, B, ALog, DtBias, State, Rows]);
        assert_eq!(replay.metal_inputs(), [K, V, G, Beta, State, Rows]);
        assert_eq!(replay.donations(), [6]);
    }

    #[test]
    fn malformed_words_are_refused() {
        let words = node(Form::Exact, true, true).encode();
        assert!(Node::decode(&words[..words.len() - 1]).is_err());
        let mut longer = words.clone();
        longer.push(0);
        assert!(Node::decode(&longer).is_err());
        let mut bad = words.clone();
        bad[6] = 99; // the dtype word
        assert!(Node::decode(&bad).unwrap_err().contains("dtype"));
    }

    #[test]
    fn input_orders() {
        use Input::*;
        let n = node(Form::Exact, true, true);
        assert_eq!(n.cpu_inputs(), [Q, K, V, A, B, ALog, DtBias, State, Mask]);
        assert_eq!(n.metal_inputs(), [Q, K, V, G, Beta, State, Mask]);
        assert_eq!(n.donations(), [-1, 7]);
        let r = node(Form::State, false, false);
        assert_eq!(r.cpu_inputs(), [K, V, A, B, ALog, DtBias, Lengths]);
        assert_eq!(r.metal_inputs(), [K, V, G, Beta, State, Lengths]);
        assert_eq!(r.outputs().len(), 1);
        assert_eq!(r.donations(), [-1]);
    }
}
