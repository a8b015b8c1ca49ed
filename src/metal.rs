//! Launch descriptions of the Metal kernels in `kernels/metal/`: the exact source text, the
//! names, template arguments and geometry handed to `mx::fast::metal_kernel`.

pub use crate::bridge::MetalLaunch;
use crate::dtype::Dtype;
pub use crate::ops::gated_delta::Dims;

/// The recurrence kernel body, embedded from its file.
pub const GATED_DELTA_SOURCE: &str = include_str!("../kernels/metal/gated_delta.metal");

/// The prefix-state replay kernel body.
pub const GATED_DELTA_STATE_SOURCE: &str = include_str!("../kernels/metal/gated_delta_state.metal");

/// The marker the recurrence source uses for "this token is processed".
pub const TOKEN_ACTIVE_MARKER: &str = "MLXK_TOKEN_ACTIVE";

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// The recurrence launch: grid (32, Dv, B·Hv), threadgroup (32, 4, 1), as mlx-lm's generic
/// kernel; `masked` selects the padded-prefill variant with a `[B, T]` bool mask input.
pub fn gated_delta_launch(d: Dims, dtype: Dtype, masked: bool) -> MetalLaunch {
    let (name, active, mut inputs) = if masked {
        (
            "mlxk_gated_delta_step_mask",
            "mask[b_idx * T + t]",
            vec!["mask"],
        )
    } else {
        ("mlxk_gated_delta_step", "true", vec![])
    };
    let mut input_names = vec!["q", "k", "v", "g", "beta", "state_in", "Tin"];
    input_names.append(&mut inputs);
    MetalLaunch {
        name: name.to_string(),
        source: GATED_DELTA_SOURCE.replace(TOKEN_ACTIVE_MARKER, active),
        header: String::new(),
        input_names: names(&input_names),
        output_names: names(&["y", "state_out"]),
        output_dims: vec![
            d.b as i32,
            d.t as i32,
            d.hv as i32,
            d.dv as i32, // y
            d.b as i32,
            d.hv as i32,
            d.dv as i32,
            d.dk as i32, // state_out
        ],
        output_ndims: vec![4, 4],
        output_dtypes: vec![dtype as i32, Dtype::Float32 as i32],
        grid: [32, d.dv as i32, (d.b * d.hv) as i32],
        threadgroup: [32, 4, 1],
        template_int_names: names(&["Dk", "Dv", "Hk", "Hv"]),
        template_int_values: vec![d.dk as i32, d.dv as i32, d.hk as i32, d.hv as i32],
        template_dtype_names: names(&["InT", "StT"]),
        template_dtype_values: vec![dtype as i32, Dtype::Float32 as i32],
    }
}

/// The prefix replay launch: the recurrence's geometry; inputs k, v, g, beta, state_in, Tin and
/// the per-row accepted lengths.
pub fn gated_delta_state_launch(d: Dims) -> MetalLaunch {
    MetalLaunch {
        name: "mlxk_gated_delta_prefix_state".to_string(),
        source: GATED_DELTA_STATE_SOURCE.to_string(),
        header: String::new(),
        input_names: names(&["k", "v", "g", "beta", "state_in", "Tin", "lengths"]),
        output_names: names(&["state_out"]),
        output_dims: vec![d.b as i32, d.hv as i32, d.dv as i32, d.dk as i32],
        output_ndims: vec![4],
        output_dtypes: vec![Dtype::Float32 as i32],
        grid: [32, d.dv as i32, (d.b * d.hv) as i32],
        threadgroup: [32, 4, 1],
        template_int_names: names(&["Dk", "Dv", "Hk", "Hv"]),
        template_int_values: vec![d.dk as i32, d.dv as i32, d.hk as i32, d.hv as i32],
        template_dtype_names: vec![],
        template_dtype_values: vec![],
    }
}

/// The SiLU + RMS head split kernel body.
pub const SILU_RMS_HEADS_SOURCE: &str = include_str!("../kernels/metal/silu_rms_heads.metal");
/// The gated RMSNorm kernel body.
pub const GATED_RMS_NORM_SOURCE: &str = include_str!("../kernels/metal/gated_rms_norm.metal");

/// Dimensions of one head split: rows = B·S; channels C = 2·Hk·Dk + Hv·Dv.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadSplitDims {
    pub b: i64,
    pub s: i64,
    pub hk: i64,
    pub hv: i64,
    pub dk: i64,
    pub dv: i64,
}

/// The head split launch: one 32-lane threadgroup per (head, row).
pub fn silu_rms_heads_launch(d: HeadSplitDims, dtype: Dtype, eps: f32) -> MetalLaunch {
    let channels = 2 * d.hk * d.dk + d.hv * d.dv;
    MetalLaunch {
        name: "mlxk_silu_rms_heads".to_string(),
        source: SILU_RMS_HEADS_SOURCE.to_string(),
        header: String::new(),
        input_names: names(&["x", "qscale", "kscale"]),
        output_names: names(&["q", "k", "v"]),
        output_dims: vec![
            d.b as i32,
            d.s as i32,
            d.hk as i32,
            d.dk as i32, // q
            d.b as i32,
            d.s as i32,
            d.hk as i32,
            d.dk as i32, // k
            d.b as i32,
            d.s as i32,
            d.hv as i32,
            d.dv as i32, // v
        ],
        output_ndims: vec![4, 4, 4],
        output_dtypes: vec![dtype as i32; 3],
        grid: [(32 * (2 * d.hk + d.hv)) as i32, (d.b * d.s) as i32, 1],
        threadgroup: [32, 1, 1],
        template_int_names: names(&["C", "HK", "HV", "DK", "DV", "EPS"]),
        template_int_values: vec![
            channels as i32,
            d.hk as i32,
            d.hv as i32,
            d.dk as i32,
            d.dv as i32,
            eps.to_bits() as i32,
        ],
        template_dtype_names: names(&["T"]),
        template_dtype_values: vec![dtype as i32],
    }
}

/// Threads per row of the gated norm: `min(1024, ceil(D / 128) · 32)`.
pub fn gated_rms_norm_threads(width: i64) -> i64 {
    (((width + 127) / 128) * 32).min(1024)
}

/// The gated norm launch: one threadgroup of THREADS per row of `width` values.
pub fn gated_rms_norm_launch(shape: &[i64], dtype: Dtype, eps: f32) -> MetalLaunch {
    let width = *shape.last().expect("rank >= 1");
    let leading = &shape[..shape.len() - 1];
    let rows: i64 = if leading.contains(&0) {
        0
    } else {
        leading.iter().fold(1i64, |n, &d| n.saturating_mul(d))
    };
    let threads = gated_rms_norm_threads(width);
    MetalLaunch {
        name: "mlxk_gated_rms_norm".to_string(),
        source: GATED_RMS_NORM_SOURCE.to_string(),
        header: String::new(),
        input_names: names(&["x", "gate", "weight"]),
        output_names: names(&["out"]),
        output_dims: shape.iter().map(|&d| d as i32).collect(),
        output_ndims: vec![shape.len() as u32],
        output_dtypes: vec![dtype as i32],
        grid: [(rows * threads) as i32, 1, 1],
        threadgroup: [threads as i32, 1, 1],
        template_int_names: names(&["D", "THREADS", "EPS"]),
        template_int_values: vec![width as i32, threads as i32, eps.to_bits() as i32],
        template_dtype_names: names(&["T"]),
        template_dtype_values: vec![dtype as i32],
    }
}
