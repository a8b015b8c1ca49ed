//! The gated-delta family's launches: the update (exact form, dense or over a pool's row
//! table), the recurrence from the convolution's output, the prefix-state replay and the exact
//! form's backward; the chunked form's in `chunked` (forward) and `chunked_backward`.

pub mod chunked;
pub mod chunked_backward;

use std::sync::OnceLock;

use super::{launch, names, token_variants, MetalLaunch, SILU_HEADER, TOKEN_ACTIVE_MARKER};
use crate::dtype::Dtype;
use crate::node::gated_delta::{self, Pool, PoolWrite};
use crate::node::silu_rms_heads;
use crate::node::Output;

/// The recurrence kernel body, embedded from its file.
pub const GATED_DELTA_SOURCE: &str = include_str!("../../../kernels/metal/gated_delta.metal");

/// The prefix-state replay kernel body.
pub const GATED_DELTA_STATE_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_state.metal");

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

/// The recurrence's backward kernel body (`kernels/metal/gated_delta_backward.metal`).
pub const GATED_DELTA_BACKWARD_SOURCE: &str =
    include_str!("../../../kernels/metal/gated_delta_backward.metal");

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
