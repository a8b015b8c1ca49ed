//! The head split's launch (`kernels/metal/silu_rms_heads.metal`).

use super::{launch, names, MetalLaunch, SILU_HEADER};
use crate::node::silu_rms_heads;

/// The SiLU + RMS head split kernel body.
pub const SILU_RMS_HEADS_SOURCE: &str = include_str!("../../kernels/metal/silu_rms_heads.metal");

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
