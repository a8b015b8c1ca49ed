//! Launch descriptions of the Metal kernels in `kernels/metal/`: the exact source text, and the
//! names, template arguments and geometry handed to `mx::fast::metal_kernel`, all built from a
//! kernel's typed node (`crate::node`), which also fixes the input order and output shapes.

pub use crate::bridge::MetalLaunch;
use std::sync::OnceLock;

use crate::dtype::Dtype;
use crate::node::gated_delta::{Pool, PoolWrite};
use crate::node::{self, gated_delta, gated_rms_norm, silu_rms_heads, Output};

/// The recurrence kernel body, embedded from its file.
pub const GATED_DELTA_SOURCE: &str = include_str!("../kernels/metal/gated_delta.metal");

/// The prefix-state replay kernel body.
pub const GATED_DELTA_STATE_SOURCE: &str = include_str!("../kernels/metal/gated_delta_state.metal");

/// The SiLU + RMS head split kernel body.
pub const SILU_RMS_HEADS_SOURCE: &str = include_str!("../kernels/metal/silu_rms_heads.metal");

/// The SiLU both the head split and the recurrence from the convolution's output compute: the
/// header of their launches.
pub const SILU_HEADER: &str = include_str!("../kernels/metal/silu.h");

/// The gated RMSNorm kernel body.
pub const GATED_RMS_NORM_SOURCE: &str = include_str!("../kernels/metal/gated_rms_norm.metal");

/// The marker the recurrence source uses for "this token is processed".
pub const TOKEN_ACTIVE_MARKER: &str = "MLXK_TOKEN_ACTIVE";

/// The header of a pool node's launch (`node::gated_delta::Pool`): the recurrence and replay
/// texts read the row table `rows` (each row's first token, span, length, source and
/// destination state rows) instead of the dense layout.
pub const POOL_HEADER: &str = "#define MLXK_POOL 1\n";

/// What a pool launch that writes the pool's own rows adds to `POOL_HEADER`
/// (`PoolWrite::InPlace`, MLX CUDA): the final states go through the pool input's pointer.
pub const POOL_IN_PLACE_HEADER: &str = "#define MLXK_POOL_IN_PLACE(p) const_cast<float*>(p)\n";

/// The masked recurrence's token test on a pool node: the mask flattened over the token
/// dimension, from the row's first token (`tok0` in the text).
pub const POOL_MASK_TEST: &str = "mask[tok0 + t]";

/// A recurrence text with its token-active marker made `true` (unmasked) and
/// `mask[b_idx * T + t]` (masked), in that order.
pub(crate) fn token_variants(text: &str) -> [String; 2] {
    [
        text.replace(TOKEN_ACTIVE_MARKER, "true"),
        text.replace(TOKEN_ACTIVE_MARKER, "mask[b_idx * T + t]"),
    ]
}

pub(crate) fn names<S: AsRef<str>>(list: &[S]) -> Vec<String> {
    list.iter().map(|s| s.as_ref().to_string()).collect()
}

/// A launch with everything but the kernel-specific text and geometry.
pub(crate) fn launch(
    name: &str,
    source: String,
    inputs: Vec<String>,
    outputs: (&[&str], &[Output]),
) -> MetalLaunch {
    let (output_dims, output_ndims, output_dtypes) = node::flatten(outputs.1);
    MetalLaunch {
        name: name.to_string(),
        source,
        header: String::new(),
        input_names: inputs,
        output_names: names(outputs.0),
        output_dims,
        output_ndims,
        output_dtypes,
        grid: [0; 3],
        threadgroup: [0; 3],
        template_int_names: vec![],
        template_int_values: vec![],
        template_dtype_names: vec![],
        template_dtype_values: vec![],
    }
}

/// The gated-delta family: grid (32, Dv, B·Hv), threadgroup (32, 4, 1), as mlx-lm's generic
/// kernel. The update (exact form) runs `gated_delta.metal`, whose masked variant takes the
/// `[B, T]` bool mask; `Form::State` runs `gated_delta_state.metal`. There is no Metal form of
/// the chunked update.
///
/// A pool node (`node.pool`) runs the same texts with `POOL_HEADER` (name suffix `_pool`), one
/// grid row per row of its table (B = R): inputs as the node lists them (the pool as
/// `state_in`, the table as `rows`), its state output the written rows `[W, Hv, Dv, Dk]`
/// (`PoolWrite::Rows`). Where W is 0 (a verify, or every row padding) the launch still has a
/// state output, of one row that no thread writes (every row's dst is -1) and the caller drops:
/// MLX allocates no memory for an output of no elements, which would leave the Metal kernel a
/// buffer argument bound to no buffer and the CUDA kernel a null pointer, neither documented as
/// allowed for a custom kernel.
pub fn gated_delta_launch(n: &gated_delta::Node) -> MetalLaunch {
    gated_delta_launch_rows(n, 1)
}

/// The gated-delta launch with `rows` value rows per SIMD group (a divisor of Dv): grid
/// (32, Dv / rows, B·Hv). Each row's arithmetic is that of the one-row launch, so the bits do not
/// depend on `rows`; more rows give a SIMD group more state loads in flight (the CUDA launch,
/// `crate::cuda::rows_per_simd_group`).
pub fn gated_delta_launch_rows(n: &gated_delta::Node, rows: usize) -> MetalLaunch {
    let d = n.dims;
    assert!(
        rows >= 1 && d.dv % rows == 0,
        "rows {rows} must divide Dv {}",
        d.dv
    );
    let inputs = n
        .metal_inputs()
        .iter()
        .map(|i| i.name().to_string())
        .collect();
    assert!(
        matches!(
            n.pool,
            None | Some(Pool {
                write: PoolWrite::Rows(_) | PoolWrite::InPlace,
                ..
            })
        ),
        "a GPU pool node writes its rows' states (PoolWrite::Rows) or the pool's (InPlace)"
    );
    let mut outputs = n.outputs();
    if let Some(Pool {
        write: PoolWrite::Rows(0),
        ..
    }) = n.pool
    {
        let state = outputs
            .last_mut()
            .expect("a GPU pool node has a state output");
        state.shape[0] = 1; // the row no thread writes (see above)
    }
    let mut l = match n.form {
        gated_delta::Form::State => launch(
            "mlxk_gated_delta_state",
            GATED_DELTA_STATE_SOURCE.to_string(),
            inputs,
            (&["state_out"], &outputs),
        ),
        _ => {
            // Unmasked, masked, masked on a pool.
            static SOURCES: OnceLock<[String; 3]> = OnceLock::new();
            let sources = SOURCES.get_or_init(|| {
                let [plain, masked] = token_variants(GATED_DELTA_SOURCE);
                let pool = GATED_DELTA_SOURCE.replace(TOKEN_ACTIVE_MARKER, POOL_MASK_TEST);
                [plain, masked, pool]
            });
            let name = if n.has_mask {
                "mlxk_gated_delta_step_mask"
            } else {
                "mlxk_gated_delta_step"
            };
            let variant = match (n.has_mask, n.pool.is_some()) {
                (false, _) => 0,
                (true, false) => 1,
                (true, true) => 2,
            };
            let mut l = launch(
                name,
                sources[variant].clone(),
                inputs,
                (&["y", "state_out"], &outputs),
            );
            l.template_dtype_names = names(&["InT", "StT"]);
            l.template_dtype_values = vec![n.dtype as i32, Dtype::Float32 as i32];
            l
        }
    };
    if let Some(pool) = n.pool {
        l.name.push_str("_pool");
        l.header = POOL_HEADER.to_string();
        if pool.write == PoolWrite::InPlace {
            l.name.push_str("_in_place");
            l.header.push_str(POOL_IN_PLACE_HEADER);
        }
    }
    l.grid = [32, (d.dv / rows) as i32, (d.b * d.hv) as i32];
    l.threadgroup = [32, 4, 1];
    l.template_int_names = names(&["Dk", "Dv", "Hk", "Hv", "ROWS"]);
    l.template_int_values = vec![
        d.dk as i32,
        d.dv as i32,
        d.hk as i32,
        d.hv as i32,
        rows as i32,
    ];
    l
}

/// The recurrence computing q, k and v from the convolution's output x (gated_delta.metal with
/// `MLXK_FROM_CONV`; `mlxk_gated_delta_update_from_conv`): `recurrence`, a launch of
/// `gated_delta_launch_rows` for the update's node, with x, qscale and kscale in the places of
/// q, k and v, the head split's eps as the template EPS (its float32 bits), and the SiLU header.
/// Same grid, same threadgroups: each lane computes the head split's values for the columns
/// it owns, with the split's own sums (Dk <= 128).
pub fn gated_delta_from_conv_launch(mut recurrence: MetalLaunch, eps: f32) -> MetalLaunch {
    let l = &mut recurrence;
    assert!(
        l.name.starts_with("mlxk_gated_delta_step")
            && l.input_names[..3] == ["q", "k", "v"]
            && l.header.is_empty(),
        "the recurrence's launch (a dense one: the text has no pool form from the convolution)"
    );
    l.name = l
        .name
        .replace("mlxk_gated_delta_step", "mlxk_gated_delta_from_conv");
    for (slot, name) in silu_rms_heads::INPUTS.iter().enumerate() {
        l.input_names[slot] = name.to_string();
    }
    l.header = format!("#define MLXK_FROM_CONV 1\n{SILU_HEADER}");
    l.template_int_names.push("EPS".to_string());
    l.template_int_values.push(eps.to_bits() as i32);
    recurrence
}

/// The head split launch: one 32-lane threadgroup per (head, row).
pub fn silu_rms_heads_launch(n: &silu_rms_heads::Node) -> MetalLaunch {
    let d = n.dims;
    let mut l = launch(
        "mlxk_silu_rms_heads",
        SILU_RMS_HEADS_SOURCE.to_string(),
        names(&silu_rms_heads::INPUTS),
        (&["q", "k", "v"], &n.outputs()),
    );
    l.header = SILU_HEADER.to_string();
    l.grid = [(32 * d.heads()) as i32, d.rows() as i32, 1];
    l.threadgroup = [32, 1, 1];
    l.template_int_names = names(&["C", "HK", "HV", "DK", "DV", "EPS"]);
    l.template_int_values = vec![
        d.channels() as i32,
        d.hk as i32,
        d.hv as i32,
        d.dk as i32,
        d.dv as i32,
        n.eps.to_bits() as i32,
    ];
    l.template_dtype_names = names(&["T"]);
    l.template_dtype_values = vec![n.dtype as i32];
    l
}

/// The gated norm launch: one threadgroup of `threads(D)` per row of D values.
pub fn gated_rms_norm_launch(n: &gated_rms_norm::Node) -> MetalLaunch {
    let threads = n.threads();
    let mut l = launch(
        "mlxk_gated_rms_norm",
        GATED_RMS_NORM_SOURCE.to_string(),
        names(&gated_rms_norm::INPUTS),
        (&["out"], &n.outputs()),
    );
    l.grid = [(n.rows() * threads) as i32, 1, 1];
    l.threadgroup = [threads as i32, 1, 1];
    l.template_int_names = names(&["D", "THREADS", "EPS"]);
    l.template_int_values = vec![n.width() as i32, threads as i32, n.eps.to_bits() as i32];
    l.template_dtype_names = names(&["T"]);
    l.template_dtype_values = vec![n.dtype as i32];
    l
}

/// The recurrence's backward kernel body (`kernels/metal/gated_delta_backward.metal`).
pub const GATED_DELTA_BACKWARD_SOURCE: &str =
    include_str!("../kernels/metal/gated_delta_backward.metal");

/// Tokens between the GPU backward's kept states for a sequence of `t` tokens: about √T, at
/// most 64, so its scratch holds `ceil(T / C) + C ≤ 2 √T + 1` states per value head instead of
/// T. The bits do not depend on it (every recomputation repeats the forward's arithmetic).
pub fn backward_checkpoint(t: usize) -> usize {
    let mut c = 1;
    while c < 64 && c * c < t {
        c += 1;
    }
    c
}

/// Value rows each SIMD group of the GPU backward holds at most (its state and state gradient
/// stay in registers: `2 · ROWS · Dk / 32` floats a lane).
const BACKWARD_ROWS: usize = 4;

/// The GPU backward's geometry for Dv value rows: `(NSG, P, RP)`, NSG SIMD groups per
/// threadgroup (4, or Dv if smaller: 128 threads, whose registers fit any GPU's limits), P
/// threadgroups per (batch row, value head) splitting the rows, RP rows per SIMD group at most.
pub fn backward_geometry(dv: usize) -> (usize, usize, usize) {
    let nsg = dv.clamp(1, 4);
    let parts = dv.div_ceil(nsg * BACKWARD_ROWS).max(1);
    let rows = dv.div_ceil(parts * nsg).max(1);
    (nsg, parts, rows)
}

/// The scratch outputs' shapes of the GPU backward with `checkpoint` tokens between kept
/// states: the kept states `[B·Hv, ceil(T / C), Dv, Dk]`, then one chunk's token states
/// `[B·Hv, C, Dv, Dk]` (f32).
pub fn backward_scratch(d: gated_delta::Dims, checkpoint: usize) -> [Vec<usize>; 2] {
    let chunks = d.t.div_ceil(checkpoint).max(1);
    [
        vec![d.b * d.hv, chunks, d.dv, d.dk],
        vec![d.b * d.hv, checkpoint, d.dv, d.dk],
    ]
}

/// The recurrence's backward launch (`gated_delta_backward.metal`) for the exact update `n`:
/// grid (32, NSG, B·Hv·P), threadgroup (32, NSG, 1) (`backward_geometry`). Inputs q, k, v, g,
/// beta, state_in, dy, dstate_out, Tin (`{T, checkpoint}`), then the mask if the node has one;
/// outputs dq_h, dk_h `[B, T, Hv, P, Dk]` and dg_part, dbeta_part `[B, T, Hv, P]` (partial sums
/// per value head and row partition), dv, dstate (all f32) and the two scratch buffers.
pub fn gated_delta_backward_launch(n: &gated_delta::Node, checkpoint: usize) -> MetalLaunch {
    static SOURCES: OnceLock<[String; 2]> = OnceLock::new();
    let sources = SOURCES.get_or_init(|| token_variants(GATED_DELTA_BACKWARD_SOURCE));
    let d = n.dims;
    let f32 = |shape: Vec<usize>| Output {
        shape,
        dtype: Dtype::Float32,
    };
    let [kept, work] = backward_scratch(d, checkpoint);
    let (nsg, parts, rows) = backward_geometry(d.dv);
    let outputs = [
        f32(vec![d.b, d.t, d.hv, parts, d.dk]),
        f32(vec![d.b, d.t, d.hv, parts, d.dk]),
        f32(vec![d.b, d.t, d.hv, d.dv]),
        f32(vec![d.b, d.t, d.hv, parts]),
        f32(vec![d.b, d.t, d.hv, parts]),
        f32(vec![d.b, d.hv, d.dv, d.dk]),
        f32(kept),
        f32(work),
    ];
    let mut inputs = vec![
        "q",
        "k",
        "v",
        "g",
        "beta",
        "state_in",
        "dy",
        "dstate_out",
        "Tin",
    ];
    if n.has_mask {
        inputs.push("mask");
    }
    let name = if n.has_mask {
        "mlxk_gated_delta_backward_mask"
    } else {
        "mlxk_gated_delta_backward"
    };
    let mut l = launch(
        name,
        sources[n.has_mask as usize].clone(),
        names(&inputs),
        (
            &[
                "dq_h",
                "dk_h",
                "dv",
                "dg_part",
                "dbeta_part",
                "dstate",
                "ckpt",
                "work",
            ],
            &outputs,
        ),
    );
    l.grid = [32, nsg as i32, (d.b * d.hv * parts) as i32];
    l.threadgroup = [32, nsg as i32, 1];
    l.template_int_names = names(&["Dk", "Dv", "Hk", "Hv", "NSG", "P", "RP"]);
    l.template_int_values = vec![
        d.dk as i32,
        d.dv as i32,
        d.hk as i32,
        d.hv as i32,
        nsg as i32,
        parts as i32,
        rows as i32,
    ];
    l
}

/// The chunked update's first launch (`kernels/metal/gated_delta_chunk_prep.metal`): the work
/// within each chunk, every chunk and value head in parallel.
pub const GATED_DELTA_CHUNK_PREP_SOURCE: &str =
    include_str!("../kernels/metal/gated_delta_chunk_prep.metal");

/// The chunked update's second launch (`kernels/metal/gated_delta_chunk_scan.metal`): the walk
/// over the chunks with the state, per tile of value columns.
pub const GATED_DELTA_CHUNK_SCAN_SOURCE: &str =
    include_str!("../kernels/metal/gated_delta_chunk_scan.metal");

/// The header of a chunked launch on a masked node.
pub const CHUNK_MASK_HEADER: &str = "#define MLXK_MASKED 1\n";

/// The largest chunk the GPU launches run: the prep launch keeps A (`C × C` floats) and two key
/// panels in threadgroup memory, within Metal's 32 KB. Larger requested chunks (up to 128) run
/// as chunks of 64: the chunk size changes only the rounding, within docs/DESIGN.md §4's bounds.
pub const GPU_MAX_CHUNK: usize = 64;

/// The chunk the GPU launches run for a requested (validated) chunk size.
pub fn gpu_chunk(chunk: usize) -> usize {
    chunk.min(GPU_MAX_CHUNK)
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
pub fn gated_delta_chunk_prep_launch(n: &gated_delta::Node) -> MetalLaunch {
    let d = n.dims;
    let chunk = chunk_of(n);
    let inputs = n
        .metal_inputs()
        .into_iter()
        .filter(|&i| i != gated_delta::Input::State)
        .map(|i| i.name().to_string())
        .collect();
    let outputs = chunk_parts(d, chunk);
    let mut l = launch(
        "mlxk_gated_delta_chunk_prep",
        GATED_DELTA_CHUNK_PREP_SOURCE.to_string(),
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
pub fn gated_delta_chunk_scan_launch(
    n: &gated_delta::Node,
    exact_inputs: Vec<String>,
    columns: usize,
) -> MetalLaunch {
    assert!([8, 16, 32].contains(&columns), "VT {columns}");
    let d = n.dims;
    let chunk = chunk_of(n);
    let mut inputs = exact_inputs;
    inputs.extend(CHUNK_PARTS.iter().map(|s| s.to_string()));
    let mut l = launch(
        "mlxk_gated_delta_chunk_scan",
        GATED_DELTA_CHUNK_SCAN_SOURCE.to_string(),
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

fn chunk_of(n: &gated_delta::Node) -> usize {
    match n.form {
        gated_delta::Form::Chunked { chunk } => gpu_chunk(chunk),
        other => panic!("a chunked launch of a {other:?} node"),
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
                let c = gpu_chunk(requested);
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
