//! Typed descriptors of the kernels' graph nodes, one per kernel family (docs/DESIGN.md §2).
//!
//! A node says everything a kernel needs besides its buffers: dimensions, dtypes, which
//! optional inputs are present and which form runs. It is the one definition of
//!
//! - the order of the kernel's inputs, for the CPU node and for the Metal launch;
//! - the shapes and dtypes of its outputs;
//! - the parameter words that carry it through MLX's generic CPU primitive (`encode` in
//!   `ops`, `decode` in `cpu` — both from one field list, `fields`, so they cannot drift).
//!
//! `ops` builds a node from validated arguments; `cpu` decodes it at eval; `metal` builds the
//! launch from it; the Metal-text emulator (tests/metal_emu/) compiles this module as it is.
//! It depends on `dtype` only, so that build needs no MLX.

pub mod gated_delta;
pub mod gated_rms_norm;
pub mod silu_rms_heads;

use crate::dtype::Dtype;

/// Which CPU kernel a primitive node runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Kernel {
    GatedDelta = 1,
    GatedDeltaState = 2,
    SiluRmsHeads = 3,
    GatedRmsNorm = 4,
    /// The update in chunked (WY) form: same inputs and outputs as `GatedDelta`.
    GatedDeltaChunked = 5,
    /// The update's backward pass (`gated_delta::Backward`).
    GatedDeltaBackward = 6,
    /// The head split's backward pass (`silu_rms_heads::Backward`).
    SiluRmsHeadsBackward = 7,
    /// The gated norm's backward pass (`gated_rms_norm::Backward`).
    GatedRmsNormBackward = 8,
    /// The head split and the update in one GPU kernel (`mlxk_gated_delta_update_from_conv`);
    /// on the CPU the two nodes of its parts. Names the GPU node's gradient.
    GatedDeltaFromConv = 9,
    /// Panics on purpose: tests use it to prove a kernel panic becomes an error at eval.
    #[doc(hidden)]
    PanicProbe = 0xFFFF,
}

impl Kernel {
    const ALL: [Kernel; 10] = [
        Kernel::GatedDelta,
        Kernel::GatedDeltaState,
        Kernel::SiluRmsHeads,
        Kernel::GatedRmsNorm,
        Kernel::GatedDeltaChunked,
        Kernel::GatedDeltaBackward,
        Kernel::SiluRmsHeadsBackward,
        Kernel::GatedRmsNormBackward,
        Kernel::GatedDeltaFromConv,
        Kernel::PanicProbe,
    ];

    pub fn from_code(code: u32) -> Option<Kernel> {
        Kernel::ALL.into_iter().find(|k| *k as u32 == code)
    }

    /// The C function whose node this is (for messages).
    pub fn function(self) -> &'static str {
        match self {
            Kernel::GatedDelta => "mlxk_gated_delta_update",
            Kernel::GatedDeltaState => "mlxk_gated_delta_state",
            Kernel::SiluRmsHeads => "mlxk_silu_rms_heads",
            Kernel::GatedRmsNorm => "mlxk_gated_rms_norm",
            Kernel::GatedDeltaChunked => "mlxk_gated_delta_update_chunked",
            Kernel::GatedDeltaBackward => "mlxk_gated_delta_update_vjp",
            Kernel::SiluRmsHeadsBackward => "mlxk_silu_rms_heads_vjp",
            Kernel::GatedRmsNormBackward => "mlxk_gated_rms_norm_vjp",
            Kernel::GatedDeltaFromConv => "mlxk_gated_delta_update_from_conv",
            Kernel::PanicProbe => "the panic probe",
        }
    }
}

/// The C function of CPU kernel `code`, for messages ("kernel `<code>`" if unknown).
pub fn function_name(code: u32) -> String {
    Kernel::from_code(code).map_or_else(|| format!("kernel {code}"), |k| k.function().into())
}

/// How MLX's autograd differentiates a forward CPU node (the bridge's `vjp`): the backward
/// node to build on the forward's inputs followed by the cotangents of all its outputs.
#[derive(Debug, Clone, PartialEq)]
pub struct VjpPlan {
    pub kernel: Kernel,
    pub params: Vec<i64>,
    pub outputs: Vec<Output>,
    /// Per input of the forward node, the backward output holding its gradient (None: the
    /// input has none, e.g. a mask; its gradient is zeros).
    pub gradients: Vec<Option<usize>>,
    /// The dtype each cotangent is passed in (the bridge casts those that differ).
    pub cotangents: Vec<Dtype>,
}

/// The backward node for forward kernel `kernel` with parameter words `params`, given the
/// dtype codes of the cotangents MLX passes (one per output); an error naming the kernel for
/// nodes without a gradient.
pub fn vjp_plan(kernel: u32, params: &[i64], cotangents: &[i32]) -> Result<VjpPlan, String> {
    let no_vjp = || {
        format!(
            "mlxkern: vjp is not implemented for {}",
            function_name(kernel)
        )
    };
    // A cotangent in a float dtype stays as it is; any other becomes `fallback`.
    let float_or = |i: usize, fallback: Dtype| {
        cotangents
            .get(i)
            .and_then(|&c| Dtype::from_code(c))
            .filter(|d| d.is_float())
            .unwrap_or(fallback)
    };
    let outputs_of = |n: usize| -> Result<(), String> {
        if cotangents.len() != n {
            return Err(format!(
                "mlxkern: {} has {n} outputs, MLX passed {} cotangents",
                function_name(kernel),
                cotangents.len()
            ));
        }
        Ok(())
    };
    match Kernel::from_code(kernel) {
        Some(Kernel::GatedDelta | Kernel::GatedDeltaChunked) => {
            let forward = gated_delta::Node::decode(params)?;
            if forward.pool.is_some() {
                return Err(format!(
                    "mlxkern: vjp is not implemented for the pool and packed calls ({}); \
                     differentiate mlxk_gated_delta_update on the gathered states",
                    function_name(kernel)
                ));
            }
            outputs_of(2)?;
            // Each form's own backward: the exact update's sweep, or the chunked form's
            // chunk-wise pass (the gradient of the same function, in the forward's arithmetic).
            let backward = gated_delta::Backward {
                forward,
                has_dy: true,
                dy_dtype: float_or(0, forward.dtype),
                has_dstate_out: true,
                checkpoint: 0,
            };
            let gradients = forward
                .cpu_inputs()
                .into_iter()
                .map(|input| {
                    use gated_delta::Input::*;
                    match input {
                        Q => Some(0),
                        K => Some(1),
                        V => Some(2),
                        A => Some(3),
                        B => Some(4),
                        ALog => Some(5),
                        DtBias => Some(6),
                        State => Some(7),
                        _ => None,
                    }
                })
                .collect();
            Ok(VjpPlan {
                kernel: backward.kernel(),
                params: backward.encode(),
                outputs: backward.outputs(),
                gradients,
                cotangents: vec![backward.dy_dtype, Dtype::Float32],
            })
        }
        Some(Kernel::SiluRmsHeads) => {
            outputs_of(3)?;
            let forward = silu_rms_heads::Node::decode(params)?;
            let dtypes = [0, 1, 2].map(|i| float_or(i, forward.dtype));
            let backward = silu_rms_heads::Backward {
                forward,
                cotangents: dtypes.map(Some),
            };
            Ok(VjpPlan {
                kernel: backward.kernel(),
                params: backward.encode(),
                outputs: backward.outputs(),
                gradients: vec![Some(0), Some(1), Some(2)],
                cotangents: dtypes.to_vec(),
            })
        }
        Some(Kernel::GatedRmsNorm) => {
            outputs_of(1)?;
            let forward = gated_rms_norm::Node::decode(params)?;
            let dtype = float_or(0, forward.dtype);
            let backward = gated_rms_norm::Backward {
                forward,
                cotangent: Some(dtype),
            };
            Ok(VjpPlan {
                kernel: backward.kernel(),
                params: backward.encode(),
                outputs: backward.outputs(),
                gradients: vec![Some(0), Some(1), Some(2)],
                cotangents: vec![dtype],
            })
        }
        Some(
            Kernel::GatedDeltaBackward
            | Kernel::SiluRmsHeadsBackward
            | Kernel::GatedRmsNormBackward,
        ) => Err(format!(
            "{} (second derivatives are not available)",
            no_vjp()
        )),
        _ => Err(no_vjp()),
    }
}

/// One output of a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    pub shape: Vec<usize>,
    pub dtype: Dtype,
}

/// Outputs as MLX's launch descriptions take them: the shapes concatenated, the rank of each,
/// and the dtype codes.
pub fn flatten(outputs: &[Output]) -> (Vec<i32>, Vec<u32>, Vec<i32>) {
    let dims = outputs
        .iter()
        .flat_map(|o| o.shape.iter().map(|&d| d as i32))
        .collect();
    let ndims = outputs.iter().map(|o| o.shape.len() as u32).collect();
    let dtypes = outputs.iter().map(|o| o.dtype as i32).collect();
    (dims, ndims, dtypes)
}

/// The longest list of sizes a node carries (a shape: the C ABI allows 16 dimensions).
const MAX_SIZES: usize = 64;

/// Visits a node's fields in their fixed order: the encoder reads them into words, the decoder
/// writes them from words. Each node has one `fields` function; encode and decode both use it.
pub trait Codec {
    fn word(&mut self, word: &mut i64);

    fn usize(&mut self, x: &mut usize) {
        let mut w = *x as i64;
        self.word(&mut w);
        *x = usize::try_from(w).unwrap_or_else(|_| {
            self.fail(format!("negative size {w}"));
            0
        });
    }

    fn bool(&mut self, x: &mut bool) {
        let mut w = *x as i64;
        self.word(&mut w);
        *x = w != 0;
    }

    fn f32_bits(&mut self, x: &mut f32) {
        let mut w = x.to_bits() as i64;
        self.word(&mut w);
        *x = f32::from_bits(w as u32);
    }

    fn dtype(&mut self, x: &mut Dtype) {
        let mut w = *x as i64;
        self.word(&mut w);
        match Dtype::from_code(w as i32) {
            Some(d) => *x = d,
            None => self.fail(format!("unknown dtype code {w}")),
        }
    }

    /// A length-prefixed list of sizes.
    fn sizes(&mut self, xs: &mut Vec<usize>) {
        let mut n = xs.len();
        self.usize(&mut n);
        if n > MAX_SIZES {
            self.fail(format!("a list of {n} sizes (at most {MAX_SIZES})"));
            n = 0;
        }
        xs.resize(n, 0);
        for x in xs.iter_mut() {
            self.usize(x);
        }
    }

    /// Records a malformed word (decoding only).
    fn fail(&mut self, _what: String) {}
}

/// A node that travels as parameter words: its fields, visited in one fixed order, give both
/// directions.
pub trait Words: Default + Clone {
    /// What the node is, for decoding errors.
    const WHAT: &'static str;

    /// Visits every field in the node's fixed order.
    fn fields(&mut self, c: &mut impl Codec);

    /// The node as parameter words.
    fn encode(&self) -> Vec<i64> {
        let mut e = Encoder(Vec::new());
        self.clone().fields(&mut e);
        e.0
    }

    /// The node back from `encode`'s words.
    fn decode(words: &[i64]) -> Result<Self, String> {
        let mut node = Self::default();
        let mut d = Decoder::new(words);
        node.fields(&mut d);
        d.finish(Self::WHAT)?;
        Ok(node)
    }
}

/// Reads fields into words.
pub struct Encoder(pub Vec<i64>);

impl Codec for Encoder {
    fn word(&mut self, word: &mut i64) {
        self.0.push(*word);
    }
}

/// Writes fields from words; the first problem found is kept.
pub struct Decoder<'a> {
    words: &'a [i64],
    at: usize,
    error: Option<String>,
}

impl<'a> Decoder<'a> {
    pub fn new(words: &'a [i64]) -> Self {
        Decoder {
            words,
            at: 0,
            error: None,
        }
    }

    /// Ends decoding `what`: every word used, nothing malformed.
    pub fn finish(self, what: &str) -> Result<(), String> {
        if let Some(e) = self.error {
            return Err(format!("{what} node: {e}"));
        }
        if self.at != self.words.len() {
            return Err(format!(
                "{what} node: {} parameter words, {} used",
                self.words.len(),
                self.at
            ));
        }
        Ok(())
    }
}

impl Codec for Decoder<'_> {
    fn word(&mut self, word: &mut i64) {
        match self.words.get(self.at) {
            Some(&w) => *word = w,
            None => self.fail(format!("missing parameter word {}", self.at)),
        }
        self.at += 1;
    }

    fn fail(&mut self, what: String) {
        self.error.get_or_insert(what);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_nodes_have_no_vjp() {
        let node = gated_delta::Node {
            dims: gated_delta::Dims {
                b: 2,
                t: 3,
                hk: 1,
                hv: 2,
                dk: 32,
                dv: 4,
            },
            has_state: true,
            pool: Some(gated_delta::Pool {
                slots: 5,
                write: gated_delta::PoolWrite::Pool,
                packed: false,
            }),
            ..Default::default()
        };
        let f32_code = Dtype::Float32 as i32;
        let err = vjp_plan(
            Kernel::GatedDelta as u32,
            &node.encode(),
            &[f32_code, f32_code],
        )
        .unwrap_err();
        assert!(err.contains("pool"), "{err}");
    }

    #[test]
    fn vjp_plans_map_gradients_to_the_forward_inputs() {
        let update = gated_delta::Node {
            dims: gated_delta::Dims {
                b: 1,
                t: 3,
                hk: 1,
                hv: 2,
                dk: 32,
                dv: 4,
            },
            dtype: Dtype::Bfloat16,
            has_state: true,
            has_mask: true,
            form: gated_delta::Form::Chunked {
                chunk: gated_delta::ChunkSize::DEFAULT,
            },
            pool: None,
            ..Default::default()
        };
        let f32_code = Dtype::Float32 as i32;
        let plan = vjp_plan(
            Kernel::GatedDeltaChunked as u32,
            &update.encode(),
            &[Dtype::Bfloat16 as i32, f32_code],
        )
        .unwrap();
        assert_eq!(plan.kernel, Kernel::GatedDeltaBackward);
        // q, k, v, a, b, a_log, dt_bias, state, then the mask (no gradient).
        let want: Vec<Option<usize>> = (0..8).map(Some).chain([None]).collect();
        assert_eq!(plan.gradients, want);
        assert_eq!(plan.cotangents, [Dtype::Bfloat16, Dtype::Float32]);
        let backward = gated_delta::Backward::decode(&plan.params).unwrap();
        assert_eq!(
            backward.forward.form,
            gated_delta::Form::Chunked {
                chunk: gated_delta::ChunkSize::DEFAULT
            }
        );

        let split = silu_rms_heads::Node {
            dims: silu_rms_heads::Dims {
                b: 1,
                s: 2,
                hk: 1,
                hv: 1,
                dk: 8,
                dv: 8,
            },
            dtype: Dtype::Float16,
            eps: 1e-6,
        };
        // A cotangent of a non-float dtype is passed in the forward's.
        let plan = vjp_plan(
            Kernel::SiluRmsHeads as u32,
            &split.encode(),
            &[f32_code, Dtype::Int32 as i32, Dtype::Float16 as i32],
        )
        .unwrap();
        assert_eq!(
            plan.cotangents,
            [Dtype::Float32, Dtype::Float16, Dtype::Float16]
        );
        assert_eq!(plan.gradients, [Some(0), Some(1), Some(2)]);
        assert_eq!(plan.outputs.len(), 3);

        let norm = gated_rms_norm::Node {
            shape: vec![2, 16],
            dtype: Dtype::Float32,
            gate_dtype: Dtype::Bfloat16,
            eps: 1e-6,
        };
        let plan = vjp_plan(Kernel::GatedRmsNorm as u32, &norm.encode(), &[f32_code]).unwrap();
        assert_eq!(plan.kernel, Kernel::GatedRmsNormBackward);
        assert_eq!(plan.outputs[1].dtype, Dtype::Bfloat16);
    }

    #[test]
    fn kernels_without_a_gradient_are_named() {
        let err = vjp_plan(Kernel::GatedDeltaState as u32, &[], &[]).unwrap_err();
        assert!(err.contains("mlxk_gated_delta_state"), "{err}");
        let err = vjp_plan(Kernel::GatedRmsNormBackward as u32, &[], &[]).unwrap_err();
        assert!(
            err.contains("mlxk_gated_rms_norm_vjp") && err.contains("second"),
            "{err}"
        );
        let norm = gated_rms_norm::Node {
            shape: vec![2, 16],
            ..Default::default()
        };
        let err = vjp_plan(Kernel::GatedRmsNorm as u32, &norm.encode(), &[7, 7]).unwrap_err();
        assert!(err.contains("1 outputs, MLX passed 2"), "{err}");
        assert_eq!(function_name(12345), "kernel 12345");
    }
}
