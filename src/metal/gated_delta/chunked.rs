//! The chunked (WY / UT) form's forward launches (docs/DESIGN.md §3 "The chunked form", in
//! docs/backends.md): the prep launch (the work within every chunk) and the scan launch (the walk
//! over the chunks).

use super::super::{launch, names, MetalLaunch};
use crate::dtype::Dtype;
use crate::node::gated_delta::{self, ChunkSize};
use crate::node::Output;

/// The chunked update's first launch (`kernels/metal/gated_delta_chunked_prep.metal`): the work
/// within each chunk, every chunk and value head in parallel.
pub const GATED_DELTA_CHUNKED_PREP_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_chunked_prep.metal");

/// The chunked update's second launch (`kernels/metal/gated_delta_chunked_scan.metal`): the walk
/// over the chunks with the state, per tile of value columns.
pub const GATED_DELTA_CHUNKED_SCAN_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_chunked_scan.metal");

/// The header of a chunked launch on a masked node.
pub const CHUNK_MASK_HEADER: &str = "#define MLXK_MASKED 1\n";

/// The largest chunk the GPU launches run: the prep launch keeps A (`C × C` floats) and two key
/// panels in threadgroup memory, within Metal's 32 KB. Larger requested chunks (up to 128) run
/// as chunks of 64: the chunk size changes only the rounding, within docs/DESIGN.md §4's bounds.
pub const GPU_MAX_CHUNK: usize = 64;

/// The chunk the GPU launches run for a requested chunk size.
pub fn gpu_chunk(chunk: ChunkSize) -> usize {
    chunk.tokens().min(GPU_MAX_CHUNK)
}

/// The chunk the GPU launches of node `n` (`Form::Chunked`) run: `gpu_chunk` of its chunk size.
pub fn launch_chunk(n: &gated_delta::Node) -> usize {
    match n.form {
        gated_delta::Form::Chunked { chunk } => gpu_chunk(chunk),
        other => panic!("a chunked launch of a {other:?} node"),
    }
}

/// The prep launch's outputs (float32; Tp = ceil(T / C)·C rows per batch row and value head): w,
/// u0, kd, p, gam.
pub const CHUNK_PARTS: [&str; 5] = ["w", "u0", "kd", "p", "gam"];

fn chunk_parts(d: gated_delta::Dims, chunk: usize) -> Vec<Output> {
    let rows = d.t.div_ceil(chunk) * chunk;
    let f32 = |shape: Vec<usize>| Output {
        shape,
        dtype: Dtype::Float32,
    };
    vec![
        f32(vec![d.b * d.hv, rows, d.dk]),
        f32(vec![d.b * d.hv, rows, d.dv]),
        f32(vec![d.b * d.hv, rows, d.dk]),
        f32(vec![d.b * d.hv, rows, chunk]),
        f32(vec![d.b * d.hv, rows]),
    ]
}

/// The chunked update's prep launch for node `n` (`Form::Chunked`, dense, T ≥ 1, B ≥ 1): grid
/// (256, ceil(T / C), B·Hv), threadgroup (256, 1, 1), C = `gpu_chunk(chunk)`. Inputs: the
/// exact update's Metal launch inputs without the state (q, k, v, g, beta, then the mask);
/// outputs `CHUNK_PARTS`. `crate::cuda::with_fused_gates` turns it into the CUDA form with the
/// gates inside, as for the recurrence.
pub fn gated_delta_chunked_prep_launch(n: &gated_delta::Node) -> MetalLaunch {
    let d = n.dims;
    let chunk = launch_chunk(n);
    let inputs = n
        .metal_inputs()
        .into_iter()
        .filter(|&i| i != gated_delta::Input::State)
        .map(|i| i.name().to_string())
        .collect();
    let outputs = chunk_parts(d, chunk);
    let mut l = launch(
        "mlxk_gated_delta_chunked_prep",
        GATED_DELTA_CHUNKED_PREP_SOURCE.to_string(),
        inputs,
        (&CHUNK_PARTS, &outputs),
    );
    if n.has_mask {
        l.name.push_str("_mask");
        l.header = CHUNK_MASK_HEADER.to_string();
    }
    l.grid = [256, d.t.div_ceil(chunk) as i32, (d.b * d.hv) as i32];
    l.threadgroup = [256, 1, 1];
    chunk_templates(&mut l, n, chunk);
    l
}

/// The chunked update's scan launch for node `n`: grid (256, ceil(Dv / VT), B·Hv), threadgroup
/// (256, 1, 1), VT = `columns` (8, 16 or 32) value columns a threadgroup. Inputs: `exact_inputs`
/// (the names of the exact update's launch inputs, which the node's gradient takes), then
/// `CHUNK_PARTS`; outputs y and state_out, as the exact update's.
pub fn gated_delta_chunked_scan_launch(
    n: &gated_delta::Node,
    exact_inputs: Vec<String>,
    columns: usize,
) -> MetalLaunch {
    assert!([8, 16, 32].contains(&columns), "VT {columns}");
    let d = n.dims;
    let chunk = launch_chunk(n);
    let mut inputs = exact_inputs;
    inputs.extend(CHUNK_PARTS.iter().map(|s| s.to_string()));
    let mut l = launch(
        "mlxk_gated_delta_chunked_scan",
        GATED_DELTA_CHUNKED_SCAN_SOURCE.to_string(),
        inputs,
        (&["y", "state_out"], &n.outputs()),
    );
    if n.has_mask {
        l.name.push_str("_mask");
        l.header = CHUNK_MASK_HEADER.to_string();
    }
    l.grid = [256, d.dv.div_ceil(columns) as i32, (d.b * d.hv) as i32];
    l.threadgroup = [256, 1, 1];
    chunk_templates(&mut l, n, chunk);
    l.template_int_names.push("VT".to_string());
    l.template_int_values.push(columns as i32);
    l
}

/// Value columns a scan threadgroup takes: the most of 32, 16 and 8 whose threadgroup memory
/// (the state tile `Dk × VT`, U's tile `C × VT` and the panel buffer, `max(2·16·(C + 1), 16·Dk)`
/// floats) fits in `limit` bytes (Metal: 32 KB; 8 fits it for every Dk ≤ 256 and C ≤ 64).
pub fn chunk_scan_columns(dk: usize, chunk: usize, limit: usize) -> usize {
    let panels = (2 * 16 * (chunk + 1)).max(16 * dk);
    let bytes = |vt: usize| 4 * (dk * vt + chunk * vt + panels);
    [32, 16]
        .into_iter()
        .find(|&vt| bytes(vt) <= limit)
        .unwrap_or(8)
}

/// The scan's tile for a launch on MLX CUDA (`cuda`) or Metal: on Metal the widest that fits its
/// 32 KB of threadgroup memory (`chunk_scan_columns`); on CUDA at most 16 of the widest that fits
/// 48 KB, twice the threadgroups of 32-column tiles. Measured on an H200 (B = 1, Hk 16, Hv 32,
/// Dk = Dv = 128, C = 64; ms a layer at VT = 32 / 16 / 8): T = 512 0.73 / 0.46 / 0.68,
/// T = 4096 4.00 / 3.15 / 3.14, T = 16384 14.7 / 11.8 / 11.8 (before the kernels loaded their
/// panels a step ahead).
pub fn chunk_scan_columns_for(dk: usize, chunk: usize, cuda: bool) -> usize {
    if cuda {
        chunk_scan_columns(dk, chunk, 48 * 1024).min(16)
    } else {
        chunk_scan_columns(dk, chunk, 32 * 1024)
    }
}

fn chunk_templates(l: &mut MetalLaunch, n: &gated_delta::Node, chunk: usize) {
    let d = n.dims;
    l.template_int_names = names(&["Dk", "Dv", "Hk", "Hv", "C"]);
    l.template_int_values = vec![
        d.dk as i32,
        d.dv as i32,
        d.hk as i32,
        d.hv as i32,
        chunk as i32,
    ];
    l.template_dtype_names = names(&["InT"]);
    l.template_dtype_values = vec![n.dtype as i32];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_launches_fit_threadgroup_memory() {
        for dk in (32..=256).step_by(32) {
            for requested in (16..=128).step_by(16) {
                let c = gpu_chunk(ChunkSize::new(requested).unwrap());
                assert!(c <= GPU_MAX_CHUNK && c.is_multiple_of(16) && c == requested.min(64));
                let panels = (2 * 16 * (c + 1)).max(16 * dk);
                let scan = |vt: usize| 4 * (dk * vt + c * vt + panels);
                let metal = chunk_scan_columns_for(dk, c, false);
                let cuda = chunk_scan_columns_for(dk, c, true);
                assert!([8, 16, 32].contains(&metal) && scan(metal) <= 32 * 1024);
                assert!([8, 16].contains(&cuda) && scan(cuda) <= 48 * 1024);
                // The prep: A, the panel buffer and five gate rows.
                let prep = 4 * (c * (c + 1) + (2 * 16 * (c + 1)).max(8 * 256) + 5 * c);
                assert!(prep <= 32 * 1024, "Dk {dk} C {c}: {prep} bytes");
            }
        }
        // The widest tile that fits is taken.
        assert_eq!(chunk_scan_columns(128, 32, 32 * 1024), 32);
        assert_eq!(chunk_scan_columns(128, 64, 32 * 1024), 16);
        assert_eq!(chunk_scan_columns(256, 64, 32 * 1024), 8);
        assert_eq!(chunk_scan_columns_for(128, 64, true), 16);
    }
}
