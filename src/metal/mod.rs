//! Launch descriptions of the Metal kernels in `kernels/metal/`: the exact source text, and the
//! names, template arguments and geometry handed to `mx::fast::metal_kernel`, all built from a
//! kernel's typed node (`crate::node`), which also fixes the input order and output shapes.
//! One module per kernel family, named as the family is in every layer (`gated_delta`, with
//! its chunked form and backward passes inside; `silu_rms_heads`; `gated_rms_norm`); this file
//! holds what the families share.

pub mod gated_delta;
pub mod gated_rms_norm;
pub mod silu_rms_heads;
pub mod tiles;

pub use crate::bridge::MetalLaunch;

use crate::node::{self, Output};

/// The SiLU both the head split and the recurrence from the convolution's output compute: the
/// header of their launches.
pub const SILU_HEADER: &str = include_str!("../../kernels/metal/silu.h");

/// The marker the recurrence source uses for "this token is processed".
pub const TOKEN_ACTIVE_MARKER: &str = "MLXK_TOKEN_ACTIVE";

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
