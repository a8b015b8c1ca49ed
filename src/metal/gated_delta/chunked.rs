//! The chunked (WY / UT) form's forward launches (docs/DESIGN.md §3 "The chunked form", in
//! docs/backends.md): the prep launch (the work within every chunk), the state pass (the walk
//! over the chunks, which keeps the state entering each) and the output pass (y, every chunk in
//! parallel).

use super::super::{launch, names, MetalLaunch};
use crate::dtype::Dtype;
use crate::node::gated_delta::{self, ChunkSize};
use crate::node::Output;

/// The chunked update's first launch (`kernels/metal/gated_delta_chunked_prep.metal`): the work
/// within each chunk, every chunk and value head in parallel.
pub const GATED_DELTA_CHUNKED_PREP_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_chunked_prep.metal");

/// The chunked update's second launch (`kernels/metal/gated_delta_chunked_state.metal`): the
/// walk over the chunks with the state, per tile of value columns, keeping the state entering
/// every chunk and U.
pub const GATED_DELTA_CHUNKED_STATE_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_chunked_state.metal");

/// The chunked update's third launch (`kernels/metal/gated_delta_chunked_out.metal`): y from
/// the kept states, every chunk in parallel.
pub const GATED_DELTA_CHUNKED_OUT_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_chunked_out.metal");

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
/// (256, ceil(T / C), B·Hv), threadgroup (256, 1, 1), C = `gpu_chunk(chunk)`, its products on
/// the matrix tiles (header `tiles::TILES_HEADER`, after `CHUNK_MASK_HEADER` where masked;
/// `cuda::with_fused_gates` puts the gates first). Inputs: the
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
    // The matrix tiles (on MLX CUDA, `cuda::launch` puts their CUDA form in this place).
    l.header.push_str(super::super::tiles::TILES_HEADER);
    l.grid = [256, d.t.div_ceil(chunk) as i32, (d.b * d.hv) as i32];
    l.threadgroup = [256, 1, 1];
    chunk_templates(&mut l, n, chunk);
    l
}

/// The state pass's inputs after the state (float32, the prep launch's outputs it reads).
pub const CHUNK_STATE_INPUTS: [&str; 5] = ["state_in", "w", "u0", "kd", "gam"];

/// The state pass's outputs (float32): the state entering every chunk and the final state,
/// `[B·Hv, NC + 1, Dv, Dk]`, and U, `[B·Hv, Tp, Dv]`.
pub const CHUNK_STATE_OUTPUTS: [&str; 2] = ["states", "u"];

/// What the output pass takes after the exact update's launch inputs: P and γ (the prep's),
/// the kept states and U (the state pass's). The node's gradient gives them zeros
/// (`ops::gated_delta::vjp::gpu_vjp`).
pub const CHUNK_OUT_PARTS: [&str; 4] = ["p", "gam", "states", "u"];

/// The float32 values the state pass keeps for the output pass: the states
/// (`B·Hv·(NC + 1)·Dv·Dk`) and U (`B·Hv·Tp·Dv`), with NC = ceil(T / C), Tp = NC·C.
pub fn chunk_state_floats(d: gated_delta::Dims, chunk: usize) -> u64 {
    let nc = d.t.div_ceil(chunk) as u64;
    let heads = (d.b * d.hv) as u64;
    let states = heads
        .saturating_mul(nc + 1)
        .saturating_mul((d.dv * d.dk) as u64);
    let u = heads
        .saturating_mul(nc.saturating_mul(chunk as u64))
        .saturating_mul(d.dv as u64);
    states.saturating_add(u)
}

/// The chunked update's state pass for node `n` (`Form::Chunked`, dense, T ≥ 1, B ≥ 1;
/// `kernels/metal/gated_delta_chunked_state.metal`): the walk over the chunks, grid
/// (256, ceil(Dv / VT), B·Hv), threadgroup (256, 1, 1), VT = `columns` (8, 16 or 32, see
/// `chunk_state_columns_for`) value columns a threadgroup, its products on the matrix tiles
/// (header `tiles::TILES_HEADER`). Inputs `CHUNK_STATE_INPUTS`
/// (state_in, then the prep's w, u0, kd, gam); outputs `CHUNK_STATE_OUTPUTS`. One text for
/// every node (it reads no mask: a masked token's rows are the prep's identity steps).
pub fn gated_delta_chunked_state_launch(n: &gated_delta::Node, columns: usize) -> MetalLaunch {
    assert!([8, 16, 32].contains(&columns), "VT {columns}");
    let d = n.dims;
    let chunk = launch_chunk(n);
    let nc = d.t.div_ceil(chunk);
    let f32 = |shape: Vec<usize>| Output {
        shape,
        dtype: Dtype::Float32,
    };
    let outputs = [
        f32(vec![d.b * d.hv, nc + 1, d.dv, d.dk]),
        f32(vec![d.b * d.hv, nc * chunk, d.dv]),
    ];
    let mut l = launch(
        "mlxk_gated_delta_chunked_state",
        GATED_DELTA_CHUNKED_STATE_SOURCE.to_string(),
        names(&CHUNK_STATE_INPUTS),
        (&CHUNK_STATE_OUTPUTS, &outputs),
    );
    // The matrix tiles (on MLX CUDA, `cuda::launch` puts their CUDA form in this place).
    l.header = super::super::tiles::TILES_HEADER.to_string();
    l.grid = [256, d.dv.div_ceil(columns) as i32, (d.b * d.hv) as i32];
    l.threadgroup = [256, 1, 1];
    l.template_int_names = names(&["Dk", "Dv", "Hv", "C", "VT"]);
    l.template_int_values = vec![
        d.dk as i32,
        d.dv as i32,
        d.hv as i32,
        chunk as i32,
        columns as i32,
    ];
    l
}

/// The chunked update's output pass for node `n` (`kernels/metal/gated_delta_chunked_out.metal`):
/// every chunk in parallel, grid (NT·NC, ceil(Dv / VO), B·Hv), threadgroup (NT, 1, 1) with
/// VO = `chunk_out_columns(Dv)` value columns a threadgroup and NT = C·VO / 16 threads (256 at
/// C = 64, VO = 64), its products on the matrix tiles (header `tiles::TILES_HEADER`, after
/// `CHUNK_MASK_HEADER` where masked). Inputs: `exact_inputs` (the names of the exact update's launch inputs,
/// which the node's gradient takes), then `CHUNK_OUT_PARTS`; outputs y and state_out, as the
/// exact update's (state_out copied from the state pass's last slot).
pub fn gated_delta_chunked_out_launch(
    n: &gated_delta::Node,
    exact_inputs: Vec<String>,
) -> MetalLaunch {
    let d = n.dims;
    let chunk = launch_chunk(n);
    let columns = chunk_out_columns(d.dv);
    let threads = chunk * columns / 16;
    let mut inputs = exact_inputs;
    inputs.extend(CHUNK_OUT_PARTS.iter().map(|s| s.to_string()));
    let mut l = launch(
        "mlxk_gated_delta_chunked_out",
        GATED_DELTA_CHUNKED_OUT_SOURCE.to_string(),
        inputs,
        (&["y", "state_out"], &n.outputs()),
    );
    if n.has_mask {
        l.name.push_str("_mask");
        l.header = CHUNK_MASK_HEADER.to_string();
    }
    // The matrix tiles (on MLX CUDA, `cuda::launch` puts their CUDA form in this place).
    l.header.push_str(super::super::tiles::TILES_HEADER);
    let grid_x = (threads as u64).saturating_mul(d.t.div_ceil(chunk) as u64);
    l.grid = [
        grid_x.min(i32::MAX as u64) as i32,
        d.dv.div_ceil(columns) as i32,
        (d.b * d.hv) as i32,
    ];
    l.threadgroup = [threads as i32, 1, 1];
    chunk_templates(&mut l, n, chunk);
    l.template_int_names.push("VO".to_string());
    l.template_int_values.push(columns as i32);
    l
}

/// The output pass's threads for chunks of `chunk` tokens and `dv` value columns:
/// `chunk·chunk_out_columns(dv) / 16`.
pub fn chunk_out_threads(chunk: usize, dv: usize) -> usize {
    chunk * chunk_out_columns(dv) / 16
}

/// Value columns an output-pass threadgroup takes: 64, or 32 where Dv ≤ 32 (fewer idle
/// threads). Each SIMD group makes 4 tiles (16 tokens x 8 columns) of the chunk's y.
pub fn chunk_out_columns(dv: usize) -> usize {
    if dv <= 32 {
        32
    } else {
        64
    }
}

/// Value columns a state-pass threadgroup takes: the most of 32, 16 and 8 whose threadgroup
/// memory (the state tile `Dk × (VT + 1)`, rows padded, and U's tile `C × VT` floats; the
/// matrix tiles read W and Kd from device memory) fits in `limit` bytes (Metal: 32 KB; 8 fits
/// it for every Dk ≤ 256 and C ≤ 64).
pub fn chunk_state_columns(dk: usize, chunk: usize, limit: usize) -> usize {
    let bytes = |vt: usize| 4 * (dk * (vt + 1) + chunk * vt);
    [32, 16]
        .into_iter()
        .find(|&vt| bytes(vt) <= limit)
        .unwrap_or(8)
}

/// Threadgroups the state pass aims at on MLX CUDA: about two per SM of an H100 or H200
/// (132 SMs), so that a long sequence with few heads still fills the card.
pub const CUDA_STATE_THREADGROUPS: usize = 256;

/// Threadgroups the state pass aims at on Metal: at least three per GPU core of an M-series
/// Max (up to 40 cores).
pub const METAL_STATE_THREADGROUPS: usize = 128;

/// The state pass's tile for node dims `d` on MLX CUDA (`cuda`) or Metal: the widest that fits
/// the threadgroup memory (`chunk_state_columns`; Metal 32 KB, CUDA 48 KB and at most 16),
/// halved (down to 8) while B·Hv·ceil(Dv / VT) is under `CUDA_STATE_THREADGROUPS` or
/// `METAL_STATE_THREADGROUPS`: the pass walks the chunks one by one, so its parallelism is the
/// tiles alone. At Qwen3.5-35B-A3B's heads (B = 1, Hv 32, Dk = Dv = 128, C = 64): 16 on CUDA
/// (256 threadgroups), 32 on Metal (128).
pub fn chunk_state_columns_for(d: gated_delta::Dims, chunk: usize, cuda: bool) -> usize {
    let (mut vt, target) = if cuda {
        (
            chunk_state_columns(d.dk, chunk, 48 * 1024).min(16),
            CUDA_STATE_THREADGROUPS,
        )
    } else {
        (
            chunk_state_columns(d.dk, chunk, 32 * 1024),
            METAL_STATE_THREADGROUPS,
        )
    };
    while vt > 8 && d.b * d.hv * d.dv.div_ceil(vt) < target {
        vt /= 2;
    }
    vt
}

/// A pool node's chunk table (`node.pool`, `Form::Chunked`), from its row table `[R, 5]`
/// (`node::gated_delta::Pool`: tok0, span, len, src, dst): row r's ceil(span / C) chunks in
/// order, as `chunks` `[NCH, 2]` (row, chunk of the row) and `firsts` `[R + 1]` (row r's chunks
/// are `firsts[r] .. firsts[r + 1]`). Each chunk belongs to one row, so a sequence's chunks
/// start at its first token whatever the lengths before it.
pub fn pool_chunk_table(table: &[i32], chunk: usize) -> (Vec<i32>, Vec<i32>) {
    let mut chunks = Vec::new();
    let mut firsts = vec![0];
    for (r, row) in table.chunks_exact(5).enumerate() {
        let count = (row[1].max(0) as usize).div_ceil(chunk);
        for c in 0..count {
            chunks.extend([r as i32, c as i32]);
        }
        firsts.push((chunks.len() / 2) as i32);
    }
    (chunks, firsts)
}

/// The header of a chunked launch on a pool node: `CHUNK_MASK_HEADER` where masked, then
/// `super::POOL_HEADER`.
fn pool_header(n: &gated_delta::Node) -> String {
    let mask = if n.has_mask { CHUNK_MASK_HEADER } else { "" };
    format!("{mask}{}", super::POOL_HEADER)
}

/// The prep launch of a pool node `n` (`Form::Chunked`, `n.pool` set; R = `n.dims.b` rows)
/// with `chunks` chunks in its table (`pool_chunk_table`, at least one): grid (256, NCH, Hv).
/// Inputs: the pool node's Metal inputs without the state (q, k, v, g, beta, the mask where
/// given, rows), then `chunks`; outputs `CHUNK_PARTS`, `[Hv, NCH·C, ·]`.
pub fn gated_delta_chunked_pool_prep_launch(n: &gated_delta::Node, chunks: usize) -> MetalLaunch {
    assert!(n.pool.is_some() && chunks > 0, "a pool node with chunks");
    let chunk = launch_chunk(n);
    let mut l = gated_delta_chunked_prep_launch(n);
    l.input_names.push("chunks".to_string());
    let d = gated_delta::Dims {
        b: 1,
        t: chunks * chunk,
        ..n.dims
    };
    let (output_dims, output_ndims, _) = crate::node::flatten(&chunk_parts(d, chunk));
    l.output_dims = output_dims;
    l.output_ndims = output_ndims;
    l.name.push_str("_pool");
    l.header = format!("{}{}", pool_header(n), super::super::tiles::TILES_HEADER);
    l.grid = [256, chunks as i32, n.dims.hv as i32];
    l
}

/// The state pass of a pool node (R = `n.dims.b` rows, `chunks` chunks in its table): grid
/// (256, ceil(Dv / VT), R·Hv). Inputs `CHUNK_STATE_INPUTS` (the pool as state_in), rows,
/// firsts; outputs `CHUNK_STATE_OUTPUTS` (`[Hv, NCH + R, Dv, Dk]`, `[Hv, NCH·C, Dv]`) and the
/// node's state output (the written rows `[W, Hv, Dv, Dk]`, one row no thread writes where W
/// is 0, as for the exact pool launch).
pub fn gated_delta_chunked_pool_state_launch(
    n: &gated_delta::Node,
    chunks: usize,
    columns: usize,
) -> MetalLaunch {
    assert!(n.pool.is_some(), "a pool node");
    let d = n.dims;
    let chunk = launch_chunk(n);
    let mut l = gated_delta_chunked_state_launch(n, columns);
    l.input_names
        .extend(["rows".to_string(), "firsts".to_string()]);
    let f32 = |shape: Vec<usize>| Output {
        shape,
        dtype: Dtype::Float32,
    };
    let mut rows = n.outputs().pop().expect("a pool node's state output");
    rows.shape[0] = rows.shape[0].max(1);
    let outputs = [
        f32(vec![d.hv, chunks + d.b, d.dv, d.dk]),
        f32(vec![d.hv, chunks * chunk, d.dv]),
        rows,
    ];
    let (output_dims, output_ndims, output_dtypes) = crate::node::flatten(&outputs);
    l.output_names.push("state_out".to_string());
    l.output_dims = output_dims;
    l.output_ndims = output_ndims;
    l.output_dtypes = output_dtypes;
    l.name.push_str("_pool");
    l.header = format!("{}{}", super::POOL_HEADER, l.header);
    l
}

/// The output pass of a pool node (`chunks` chunks in its table): grid (NT·NCH,
/// ceil(Dv / VO), Hv). Inputs q, the mask where given, rows, chunks, then
/// `CHUNK_OUT_PARTS`; output y (the node's, `[R, T, Hv, Dv]` or packed `[1, T, Hv, Dv]`).
pub fn gated_delta_chunked_pool_out_launch(n: &gated_delta::Node, chunks: usize) -> MetalLaunch {
    assert!(n.pool.is_some() && chunks > 0, "a pool node with chunks");
    let d = n.dims;
    let chunk = launch_chunk(n);
    let columns = chunk_out_columns(d.dv);
    let threads = chunk_out_threads(chunk, d.dv);
    let mut inputs = vec!["q".to_string()];
    if n.has_mask {
        inputs.push("mask".to_string());
    }
    inputs.extend(["rows".to_string(), "chunks".to_string()]);
    inputs.extend(CHUNK_OUT_PARTS.iter().map(|s| s.to_string()));
    let y = n.outputs().swap_remove(0);
    let mut l = launch(
        "mlxk_gated_delta_chunked_out_pool",
        GATED_DELTA_CHUNKED_OUT_SOURCE.to_string(),
        inputs,
        (&["y"], &[y]),
    );
    if n.has_mask {
        l.name.push_str("_mask");
    }
    l.header = format!("{}{}", pool_header(n), super::super::tiles::TILES_HEADER);
    let grid_x = (threads as u64).saturating_mul(chunks as u64);
    l.grid = [
        grid_x.min(i32::MAX as u64) as i32,
        d.dv.div_ceil(columns) as i32,
        d.hv as i32,
    ];
    l.threadgroup = [threads as i32, 1, 1];
    chunk_templates(&mut l, n, chunk);
    l.template_int_names.push("VO".to_string());
    l.template_int_values.push(columns as i32);
    l
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

    fn dims(b: usize, hv: usize, dk: usize, dv: usize) -> gated_delta::Dims {
        gated_delta::Dims {
            b,
            t: 4096,
            hk: 1,
            hv,
            dk,
            dv,
        }
    }

    #[test]
    fn chunked_launches_fit_threadgroup_memory() {
        for dk in (32..=256).step_by(32) {
            for requested in (16..=128).step_by(16) {
                let c = gpu_chunk(ChunkSize::new(requested).unwrap());
                assert!(c <= GPU_MAX_CHUNK && c.is_multiple_of(16) && c == requested.min(64));
                let state = |vt: usize| 4 * (dk * (vt + 1) + c * vt);
                for heads in [1, 32, 512] {
                    let metal = chunk_state_columns_for(dims(1, heads, dk, 128), c, false);
                    let cuda = chunk_state_columns_for(dims(1, heads, dk, 128), c, true);
                    assert!([8, 16, 32].contains(&metal) && state(metal) <= 32 * 1024);
                    assert!([8, 16].contains(&cuda) && state(cuda) <= 48 * 1024);
                }
                // The output pass: the two panels, at most 256 threads.
                for dv in [1, 32, 33, 128, 300] {
                    let vo = chunk_out_columns(dv);
                    let out = 4 * (16 * (c + 1) + 16 * (vo + 1));
                    assert!(out <= 32 * 1024 && chunk_out_threads(c, dv) <= 256);
                    assert!(chunk_out_threads(c, dv) >= 32 && chunk_out_threads(c, dv) % 32 == 0);
                }
                // The prep: A, the panel buffer and five gate rows.
                let prep = 4 * (c * (c + 1) + (2 * 16 * (c + 1)).max(8 * 256) + 5 * c);
                assert!(prep <= 32 * 1024, "Dk {dk} C {c}: {prep} bytes");
            }
        }
        // The widest tile that fits is taken.
        assert_eq!(chunk_state_columns(128, 64, 32 * 1024), 32);
        assert_eq!(chunk_state_columns(256, 64, 32 * 1024), 16);
        assert_eq!(chunk_state_columns(256, 64, 48 * 1024), 32);
        assert_eq!(chunk_state_columns(256, 64, 16 * 1024), 8);
    }

    #[test]
    fn state_pass_tiles_fill_the_card() {
        // Qwen3.5-35B-A3B's heads at B = 1: 16 columns on CUDA (256 threadgroups), 32 on Metal.
        assert_eq!(chunk_state_columns_for(dims(1, 32, 128, 128), 64, true), 16);
        assert_eq!(
            chunk_state_columns_for(dims(1, 32, 128, 128), 64, false),
            32
        );
        // Fewer heads: narrower tiles, down to 8.
        assert_eq!(chunk_state_columns_for(dims(1, 16, 128, 128), 64, true), 8);
        assert_eq!(
            chunk_state_columns_for(dims(1, 16, 128, 128), 64, false),
            16
        );
        assert_eq!(chunk_state_columns_for(dims(1, 2, 128, 128), 64, true), 8);
        // Many rows: the widest that fits.
        assert_eq!(chunk_state_columns_for(dims(8, 32, 128, 128), 64, true), 16);
        assert_eq!(
            chunk_state_columns_for(dims(8, 32, 128, 128), 32, false),
            32
        );
        // The output pass takes the state pass's outputs as its last two inputs.
        assert_eq!(CHUNK_OUT_PARTS[2..], CHUNK_STATE_OUTPUTS);
        // The kept states and U: 32 heads x (65 states of 128 x 128 + 4096 rows of 128).
        assert_eq!(
            chunk_state_floats(dims(1, 32, 128, 128), 64),
            32 * (65 * 128 * 128 + 4096 * 128)
        );
    }
}
