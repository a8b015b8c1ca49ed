//! Launch descriptions of the chunked (WY / UT) backward pass of the recurrence on a GPU
//! (`kernels/metal/gated_delta_chunked_backward.metal`, docs/DESIGN.md §4 "Gradients"): five
//! kernels of one text, the stage chosen by the launch's header, run in sequence as nodes of
//! one graph (`ops::gated_delta::chunked_vjp`).
//!
//! Per (batch row, value head) `n` with `NC = ceil(T / C)` chunks, the stages hand each other
//! f32 scratch arrays: per token `[B·Hv, T, X]` (γ; W; Ũ, U, dU and Tmᵀ dU; dβ's and the gates'
//! shares; W `[B·Hv, NC·C, Dk]`, padded to whole chunks), per chunk `[B·Hv, NC, C, C]` (Γ, Γ∘QKᵀ, Γ∘KKᵀ, Tm, dP∘Γ, dA∘βΓ) and the kept
//! states `[B·Hv, NC, Dv, Dk]` (the state entering each chunk, the state gradient leaving it):
//! `backward_chunked_scratch_floats` counts them.

use std::sync::OnceLock;

use super::super::{launch, names, token_variants};
use crate::bridge::MetalLaunch;
use crate::dtype::Dtype;
use crate::node::gated_delta::{ChunkSize, Dims, Node};
use crate::node::Output;

/// The chunked backward's kernel text (all five stages).
pub const GATED_DELTA_CHUNKED_BACKWARD_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_chunked_backward.metal");

/// Threads of every stage's threadgroup (four SIMD groups).
pub const CHUNKED_BACKWARD_THREADS: usize = 128;

/// The largest chunk the GPU backward runs: its stages keep up to five `C x C` f32 matrices in
/// threadgroup memory (20 KiB at 32; Metal allows 32 KiB).
pub const CHUNKED_BACKWARD_MAX_CHUNK: usize = 32;

/// The chunk the GPU backward runs for the forward's chunk size `chunk`: 16 for 16, else 32. The backward's results do not depend on the forward's chunk beyond
/// float32 rounding (both are the same function of the inputs).
pub fn backward_chunk(chunk: ChunkSize) -> usize {
    chunk.tokens().min(CHUNKED_BACKWARD_MAX_CHUNK)
}

/// Value columns of one tile of the sequential stages (2 and 3): the state tile `Dk x TN`
/// stays in threadgroup memory (at most 16 KiB), so 32 up to Dk = 128, 16 at Dk = 256, never
/// more than Dv; halved (down to 8) while there would be fewer than 512 tiles, so that a few
/// heads still spread over a large GPU's cores (these stages walk the chunks one by one, and a
/// thread's share of each chunk's products shrinks with the tile).
pub fn backward_tile(d: Dims) -> usize {
    let mut tile = (4096 / d.dk.max(1)).clamp(1, 32).min(d.dv.max(1));
    while tile > 8 && d.b * d.hv * d.dv.div_ceil(tile) < 512 {
        tile /= 2;
    }
    tile
}

/// The stages' scratch arrays, by name: their shapes (f32), for the chunk `c`.
pub fn backward_chunked_scratch(d: Dims, c: usize) -> Vec<(&'static str, Vec<usize>)> {
    let n = d.b * d.hv;
    let chunks = d.t.div_ceil(c).max(1);
    let square = vec![n, chunks, c, c];
    let kept = vec![n, chunks, d.dv, d.dk];
    vec![
        ("gam", vec![n, d.t]),
        ("gm", square.clone()),
        ("pm", square.clone()),
        ("gkk", square.clone()),
        ("tm", square.clone()),
        ("w", vec![n, chunks * c, d.dk]),
        ("ut", vec![n, d.t, d.dv]),
        ("hs", kept.clone()),
        ("u", vec![n, d.t, d.dv]),
        ("dhs", kept),
        ("du", vec![n, d.t, d.dv]),
        ("dpg", square.clone()),
        ("dak", square),
        ("dbb", vec![n, d.t, 2]),
        ("tdu", vec![n, d.t, d.dv]),
    ]
}

/// The f32 values of the stages' scratch: per value head and batch row
/// `T·(4·Dv + 3) + NC·(C·Dk + 6·C² + 2·Dv·Dk)` (W padded to whole chunks: the tiles read 16
/// of its rows at a time).
pub fn backward_chunked_scratch_floats(d: Dims, c: usize) -> u64 {
    backward_chunked_scratch(d, c)
        .iter()
        .map(|(_, s)| s.iter().fold(1u64, |n, &k| n.saturating_mul(k as u64)))
        .fold(0u64, |n, k| n.saturating_add(k))
}

/// The stages in order: name suffix, inputs (before the mask), outputs, whether the stage
/// reads the mask, and whether it runs per chunk (`true`) or per column tile.
struct Stage {
    name: &'static str,
    inputs: &'static [&'static str],
    outputs: &'static [&'static str],
    masked: bool,
    per_chunk: bool,
}

const STAGES: [Stage; 5] = [
    Stage {
        name: "prep",
        inputs: &["q", "k", "v", "g", "beta", "Tin"],
        outputs: &["gam", "gm", "pm", "gkk", "tm", "w", "ut"],
        masked: true,
        per_chunk: true,
    },
    Stage {
        name: "states",
        inputs: &["k", "w", "ut", "gam", "gm", "state_in", "Tin"],
        outputs: &["hs", "u"],
        masked: false,
        per_chunk: false,
    },
    Stage {
        name: "dstates",
        inputs: &["q", "k", "w", "gam", "gm", "pm", "dy", "dstate_out", "Tin"],
        outputs: &["dhs", "du", "dstate"],
        masked: true,
        per_chunk: false,
    },
    Stage {
        name: "square",
        inputs: &["v", "beta", "dy", "gm", "pm", "gkk", "tm", "u", "du", "Tin"],
        outputs: &["dpg", "dak", "dbb", "tdu", "dv"],
        masked: true,
        per_chunk: true,
    },
    Stage {
        name: "keys",
        inputs: &[
            "q", "k", "g", "beta", "dy", "gam", "gm", "dpg", "dak", "u", "tdu", "hs", "dhs", "dbb",
            "Tin",
        ],
        outputs: &["dq_h", "dk_h", "dg_part", "dbeta_part"],
        masked: true,
        per_chunk: true,
    },
];

/// Number of stages (launches) of the chunked backward.
pub const CHUNKED_BACKWARD_STAGES: usize = STAGES.len();

/// The output shapes of stage outputs that are not scratch: dstate `[B, Hv, Dv, Dk]`, dv
/// `[B, T, Hv, Dv]`, dq_h and dk_h `[B, T, Hv, 1, Dk]` (per value head; the caller sums a key
/// head's), dg_part and dbeta_part `[B, T, Hv, 1]`.
fn output_shape(d: Dims, c: usize, name: &str) -> Vec<usize> {
    match name {
        "dstate" => vec![d.b, d.hv, d.dv, d.dk],
        "dv" => vec![d.b, d.t, d.hv, d.dv],
        "dq_h" | "dk_h" => vec![d.b, d.t, d.hv, 1, d.dk],
        "dg_part" | "dbeta_part" => vec![d.b, d.t, d.hv, 1],
        _ => backward_chunked_scratch(d, c)
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s)
            .expect("every stage output is listed"),
    }
}

/// The launch of stage `stage` (0..5) of the chunked backward of the update `n` (its dims, its
/// mask) with chunk `c` (`backward_chunk`): grid x = 128 threads per work item (per (head,
/// chunk), or per (head, column tile) for stages 1 and 2), threadgroup (128, 1, 1). Inputs
/// and outputs by name (`Tin` is `{T}` int32; the mask last, where the stage reads it); the
/// outputs f32.
pub fn gated_delta_chunked_backward_launch(n: &Node, c: usize, stage: usize) -> MetalLaunch {
    static SOURCES: OnceLock<[String; 2]> = OnceLock::new();
    let sources = SOURCES.get_or_init(|| token_variants(GATED_DELTA_CHUNKED_BACKWARD_SOURCE));
    assert!(
        c.is_multiple_of(16) && (16..=CHUNKED_BACKWARD_MAX_CHUNK).contains(&c),
        "chunk {c}"
    );
    let s = &STAGES[stage];
    let d = n.dims;
    let masked = n.has_mask && s.masked;
    let mut inputs = s.inputs.to_vec();
    if masked {
        inputs.push("mask");
    }
    let outputs: Vec<Output> = s
        .outputs
        .iter()
        .map(|name| Output {
            shape: output_shape(d, c, name),
            dtype: Dtype::Float32,
        })
        .collect();
    let name = format!(
        "mlxk_gated_delta_cbwd_{}{}",
        s.name,
        if masked { "_mask" } else { "" }
    );
    let mut l = launch(
        &name,
        sources[masked as usize].clone(),
        names(&inputs),
        (s.outputs, &outputs),
    );
    // The stage, then the matrix tiles (the sequential stages' products; on MLX CUDA,
    // `cuda::launch` puts their CUDA form in this place).
    l.header = format!(
        "#define MLXK_CBWD_STAGE {}\n{}",
        stage + 1,
        super::super::tiles::TILES_HEADER
    );
    let tile = backward_tile(d);
    let items = if s.per_chunk {
        d.b * d.hv * d.t.div_ceil(c).max(1)
    } else {
        d.b * d.hv * d.dv.div_ceil(tile)
    };
    let threads = CHUNKED_BACKWARD_THREADS;
    l.grid = [(threads * items) as i32, 1, 1];
    l.threadgroup = [threads as i32, 1, 1];
    l.template_int_names = names(&["Dk", "Dv", "Hk", "Hv", "C", "TN", "NT"]);
    l.template_int_values = vec![
        d.dk as i32,
        d.dv as i32,
        d.hk as i32,
        d.hv as i32,
        c as i32,
        tile as i32,
        threads as i32,
    ];
    l
}
