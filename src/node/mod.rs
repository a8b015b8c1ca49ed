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
    /// Panics on purpose: tests use it to prove a kernel panic becomes an error at eval.
    #[doc(hidden)]
    PanicProbe = 0xFFFF,
}

impl Kernel {
    const ALL: [Kernel; 9] = [
        Kernel::GatedDelta,
        Kernel::GatedDeltaState,
        Kernel::SiluRmsHeads,
        Kernel::GatedRmsNorm,
        Kernel::GatedDeltaChunked,
        Kernel::GatedDeltaBackward,
        Kernel::SiluRmsHeadsBackward,
        Kernel::GatedRmsNormBackward,
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
            Kernel::PanicProbe => "the panic probe",
        }
    }
}

/// The C function of CPU kernel `code`, for messages ("kernel <code>" if unknown).
pub fn function_name(code: u32) -> String {
    Kernel::from_code(code).map_or_else(|| format!("kernel {code}"), |k| k.function().into())
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
