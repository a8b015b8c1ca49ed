//! The Metal launch descriptions the library would hand to `mx::fast::metal_kernel`, for each
//! case of the Metal-text emulation (tests/metal_emu/README.md).
//!
//! Built with plain `rustc` (no Cargo, no dependencies) by scripts/test/metal-emu.sh. It compiles
//! the library's own `src/metal/` (`mod.rs` and its family modules) and `src/dtype.rs` through
//! `#[path]`, so the names, template
//! arguments, grid and threadgroup come from the functions the library calls, not from a
//! restatement; the launches are built from the library's own typed nodes (`src/node/`, also
//! compiled here), as `src/ops/*.rs` builds them. The two items `src/metal/` and `src/dtype.rs`
//! import from modules that need MLX (`bridge::MetalLaunch`) and `error` are declared here with
//! the same fields; a field added there and missing here stops this build.
//!
//! For each case it checks that the launch's source is the kernel file with the library's
//! textual substitution (the token-active marker), records that substitution as a `#define`, and
//! writes the case, the inputs as the library's ops pass them (names, dtypes, shapes: restated
//! from src/ops/*.rs, which build those arrays with MLX) and the whole launch description.
//!
//! The cases are listed in `cases.rs`; `describe.rs` builds each case's launch and inputs and
//! asserts its geometry; this file holds the stand-ins, the case types and the output.
//!
//! Usage: launches <repo root> <output file>

#![allow(dead_code, unused_imports, clippy::all)]

use std::fmt::Write as _;

mod error {
    #[derive(Debug)]
    pub enum Error {
        Dtype(String),
        InvalidArgument(String),
    }
    pub type Result<T> = std::result::Result<T, Error>;
}

#[path = "../../src/dtype.rs"]
mod dtype;

mod bridge {
    /// Same fields as `src/bridge/mod.rs`'s `MetalLaunch` (a cxx shared struct).
    #[derive(Debug, Clone)]
    pub struct MetalLaunch {
        pub name: String,
        pub source: String,
        pub header: String,
        pub input_names: Vec<String>,
        pub output_names: Vec<String>,
        pub output_dims: Vec<i32>,
        pub output_ndims: Vec<u32>,
        pub output_dtypes: Vec<i32>,
        pub grid: [i32; 3],
        pub threadgroup: [i32; 3],
        pub template_int_names: Vec<String>,
        pub template_int_values: Vec<i32>,
        pub template_dtype_names: Vec<String>,
        pub template_dtype_values: Vec<i32>,
    }
}

#[path = "../../src/node/mod.rs"]
mod node;

/// A recurrence case's dimensions (the library's node takes them as `usize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dims {
    b: i64,
    t: i64,
    hk: i64,
    hv: i64,
    dk: i64,
    dv: i64,
}

/// A head-split case's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeadSplitDims {
    b: i64,
    s: i64,
    hk: i64,
    hv: i64,
    dk: i64,
    dv: i64,
}

#[path = "../../src/metal/mod.rs"]
mod metal;

use metal::gated_delta::chunked_backward as metal_chunked;

/// A case's chunk size as the library's node carries it (0: the default).
fn chunk_size(chunk: usize) -> gd::ChunkSize {
    gd::ChunkSize::from_c(chunk as i32).expect("a valid chunk size")
}

use dtype::Dtype;
use metal::MetalLaunch;
use node::gated_delta::{self as gd, Form};

mod cases;
mod describe;

use cases::cases;
use describe::describe;

const BF16: Dtype = Dtype::Bfloat16;
const F16: Dtype = Dtype::Float16;
const F32: Dtype = Dtype::Float32;

/// One emulated launch.
enum Kind {
    /// The recurrence; `aux` is b's dtype (beta = sigmoid(b) keeps it).
    Recurrence {
        d: Dims,
        masked: bool,
        with_state: bool,
        /// Value rows per SIMD group (1: the Metal launch; more: the CUDA launch's text path).
        rows: usize,
    },
    /// The prefix replay with the accepted lengths.
    Replay {
        d: Dims,
        with_state: bool,
        lengths: Vec<i32>,
        rows: usize,
    },
    /// The recurrence computing q, k, v from the convolution's output (the head split's
    /// arithmetic in the recurrence's kernel; `metal::gated_delta_from_conv_launch`), the case's
    /// eps the split's.
    FromConv {
        d: Dims,
        masked: bool,
        with_state: bool,
        rows: usize,
    },
    /// A pool call (`node::gated_delta::Pool`, src/ops/gated_delta/pool.rs) on a pool of `n`
    /// states: row r takes slot `slots[r]` (negative: a padding row) and starts from zeros where
    /// `fresh[r]` is nonzero. `d` holds the tensors' B and T: the rows and T, or 1 and total_T
    /// for packed sequences (`PoolCall::Packed`).
    Pool {
        d: Dims,
        call: PoolCall,
        masked: bool,
        n: usize,
        slots: Vec<i32>,
        fresh: Vec<u8>,
        rows: usize,
    },
    /// The SiLU + RMS head split.
    /// `grouped`: with the CUDA launch's threadgroup (up to eight heads a block, src/cuda.rs).
    HeadSplit { d: HeadSplitDims, grouped: bool },
    /// The gated norm over the last axis of `shape`; `aux` is the gate's dtype.
    /// `grouped`: with the CUDA launch's threadgroup (up to eight one-SIMD-group rows a block).
    GatedNorm { shape: Vec<i64>, grouped: bool },
    /// One launch of the chunked update's GPU form (src/ops/gated_delta/graph.rs
    /// `build_gpu_chunked`): `stage` 0 the prep launch, 1 the state pass, 2 the output pass; the
    /// three cases follow each other (same draws) and run together from the output pass's case;
    /// `chunk` as the caller passes it.
    Chunked {
        d: Dims,
        masked: bool,
        with_state: bool,
        chunk: usize,
        stage: usize,
        /// The state pass's tile of value columns (8, 16 or 32).
        columns: usize,
    },
    /// One launch of the chunked update on a pool (src/ops/gated_delta/graph.rs
    /// `build_gpu_chunked_pool`): `stage` 0 the prep, 1 the state pass, 2 the output pass over
    /// the chunk table of the rows `slots` (`fresh` flags; `cu`: packed sequences, B = 1) of a
    /// pool of `n` rows. The three cases follow the three of the dense call they must equal
    /// (`Kind::Chunked`: every row padded to the longest, the padding masked) and run together,
    /// with those, from the output pass's case.
    ChunkedPool {
        d: Dims,
        masked: bool,
        chunk: usize,
        stage: usize,
        n: usize,
        slots: Vec<i32>,
        fresh: Vec<u8>,
        cu: Option<Vec<i32>>,
    },
    /// The recurrence's backward pass (`aux` is b's dtype) with `dy` in `dy_dtype` and
    /// `checkpoint` tokens between kept states (None: `backward_checkpoint(T)`, the library's
    /// choice). `twin`: the id of a case with the same inputs (same draws) and another
    /// checkpoint, whose outputs must be the same bits.
    Backward {
        d: Dims,
        masked: bool,
        with_state: bool,
        dy_dtype: Dtype,
        checkpoint: Option<usize>,
        twin: Option<usize>,
    },
    /// The chunked form's backward pass (src/metal/gated_delta/chunked_backward.rs, `aux` is b's dtype) with the
    /// forward's chunk size `chunk`: five launches, one case each (`stage` 0..4, the ids
    /// `first`..`first + 4`, all with the draws of `first`); the harness runs them in sequence
    /// from stage 0's case.
    ChunkedBackward {
        d: Dims,
        masked: bool,
        with_state: bool,
        dy_dtype: Dtype,
        chunk: usize,
        stage: usize,
        first: usize,
    },
    /// The matrix tiles' self-test (src/metal/tiles.rs `tiles_check_launch`): `items` work
    /// items of an M x K by K x N product, Aᵀ A and A Aᵀ.
    Tiles { items: i64, m: i64, k: i64, n: i64 },
}

/// Which pool call a `Kind::Pool` case makes.
#[derive(Debug, Clone, PartialEq, Eq)]
enum PoolCall {
    /// `mlxk_gated_delta_update_pool`.
    Update,
    /// `mlxk_gated_delta_verify_pool`: no state written.
    Verify,
    /// `mlxk_gated_delta_update_packed` with these `cu_seqlens`.
    Packed(Vec<i32>),
    /// `mlxk_gated_delta_state_pool` with these accepted lengths.
    Replay(Vec<i32>),
}

struct Case {
    kind: Kind,
    dtype: Dtype,
    aux: Dtype,
    eps: f32,
}

/// The SIMD groups src/cuda.rs `launch` puts in one block for `n` heads or one-group rows: the
/// largest k <= 8 dividing n (restated: cuda.rs needs MLX-bound modules).
fn cuda_group(n: i64) -> i32 {
    (1..=8).rev().find(|k| n % k == 0).unwrap_or(1) as i32
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Which kernel file the launch's source comes from, and the substitution (marker, text) the
/// library made, verified by rebuilding the source from the file.
fn locate_source(root: &str, l: &MetalLaunch) -> (String, Vec<(String, String)>) {
    let files = [
        "kernels/metal/gated_delta.metal",
        "kernels/metal/gated_delta_state.metal",
        "kernels/metal/silu_rms_heads.metal",
        "kernels/metal/gated_rms_norm.metal",
        "kernels/metal/gated_delta_backward.metal",
        "kernels/metal/gated_delta_chunked_backward.metal",
        "kernels/metal/gated_delta_chunked_prep.metal",
        "kernels/metal/gated_delta_chunked_state.metal",
        "kernels/metal/gated_delta_chunked_out.metal",
        "kernels/metal/tiles_check.metal",
    ];
    for file in files {
        let text = std::fs::read_to_string(format!("{root}/{file}")).expect("kernel file");
        if text == l.source {
            return (file.to_string(), vec![]);
        }
        let marker = metal::TOKEN_ACTIVE_MARKER;
        let count = text.matches(marker).count();
        if count >= 1 {
            // Every occurrence must be a whole identifier, so a #define replaces exactly this
            // text (an occurrence in a comment changes nothing the compiler sees).
            let ident = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            for (at, _) in text.match_indices(marker) {
                let (pre, post) = (&text[..at], &text[at + marker.len()..]);
                assert!(!ident(pre.chars().last()) && !ident(post.chars().next()));
            }
            // All occurrences take the same text, so its length follows from the lengths.
            let at = text.find(marker).unwrap();
            let grown = l.source.len() as i64 - text.len() as i64;
            let active_len = marker.len() as i64 + grown / count as i64;
            if grown % count as i64 == 0
                && active_len >= 0
                && l.source.len() >= at + active_len as usize
                && l.source.starts_with(&text[..at])
                && l.source.is_char_boundary(at + active_len as usize)
            {
                let active = &l.source[at..at + active_len as usize];
                if text.replace(marker, active) == l.source {
                    assert!(
                        !active.contains('\n'),
                        "substitution spans lines: {active:?}"
                    );
                    return (
                        file.to_string(),
                        vec![(marker.to_string(), active.to_string())],
                    );
                }
            }
        }
    }
    panic!(
        "launch {}: its source is none of the kernel files (with the marker substituted)",
        l.name
    );
}

fn shape_str(shape: &[i64]) -> String {
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert_eq!(args.len(), 3, "usage: launches <repo root> <output file>");
    let root = &args[1];
    let mut out = String::new();
    for (id, case) in cases().into_iter().enumerate() {
        let (launch, kind, label, case_dims, inputs, extra) = describe(&case);
        // Twins draw the same inputs: the seed of the case they repeat.
        let seed_id = match case.kind {
            Kind::Backward { twin: Some(t), .. } => t,
            Kind::ChunkedBackward { first, .. } => first,
            Kind::Chunked { stage, .. } => id - stage,
            Kind::ChunkedPool { stage, .. } => id - stage,
            _ => id,
        };
        let (file, defines) = locate_source(root, &launch);
        writeln!(out, "case {id}").unwrap();
        writeln!(out, "kind {kind}").unwrap();
        writeln!(out, "label {label}").unwrap();
        writeln!(out, "dtype {}", case.dtype as i32).unwrap();
        writeln!(out, "aux_dtype {}", case.aux as i32).unwrap();
        writeln!(out, "dims {}", shape_str(&case_dims)).unwrap();
        out.push_str(&extra);
        writeln!(out, "eps_bits {}", case.eps.to_bits()).unwrap();
        writeln!(out, "seed {}", 0x5EED_0000u64 + seed_id as u64 * 7919).unwrap();
        writeln!(out, "name {}", launch.name).unwrap();
        writeln!(out, "file {file}").unwrap();
        for (marker, text) in &defines {
            writeln!(out, "define {marker} {text}").unwrap();
        }
        assert_eq!(inputs.len(), launch.input_names.len());
        for (name, (input, dtype, shape)) in launch.input_names.iter().zip(&inputs) {
            assert_eq!(name, input, "input order of {}", launch.name);
            writeln!(out, "input {name} {} {}", *dtype as i32, shape_str(shape)).unwrap();
        }
        let mut at = 0usize;
        for (i, name) in launch.output_names.iter().enumerate() {
            let n = launch.output_ndims[i] as usize;
            let shape: Vec<i64> = launch.output_dims[at..at + n]
                .iter()
                .map(|&d| d as i64)
                .collect();
            at += n;
            writeln!(
                out,
                "output {name} {} {}",
                launch.output_dtypes[i],
                shape_str(&shape)
            )
            .unwrap();
        }
        let [gx, gy, gz] = launch.grid;
        let [tx, ty, tz] = launch.threadgroup;
        writeln!(out, "grid {gx} {gy} {gz}").unwrap();
        writeln!(out, "threadgroup {tx} {ty} {tz}").unwrap();
        for (n, v) in launch
            .template_int_names
            .iter()
            .zip(&launch.template_int_values)
        {
            writeln!(out, "tint {n} {v}").unwrap();
        }
        for (n, v) in launch
            .template_dtype_names
            .iter()
            .zip(&launch.template_dtype_values)
        {
            writeln!(out, "tdtype {n} {v}").unwrap();
        }
        writeln!(out, "header {}", hex(&launch.header)).unwrap();
        writeln!(out, "source {}", hex(&launch.source)).unwrap();
        writeln!(out, "end").unwrap();
    }
    std::fs::write(&args[2], out).expect("write the launch list");
}
