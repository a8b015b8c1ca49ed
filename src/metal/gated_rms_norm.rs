//! The gated RMSNorm's launch (`kernels/metal/gated_rms_norm.metal`).

use super::{launch, names, MetalLaunch};
use crate::node::gated_rms_norm;

/// The gated RMSNorm kernel body.
pub const GATED_RMS_NORM_SOURCE: &str = include_str!("../../kernels/metal/gated_rms_norm.metal");

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
