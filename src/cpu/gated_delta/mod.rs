//! The gated-delta update and its prefix replay on the CPU: the fused gates (`gates`), the exact
//! recurrence (`exact`, its row kernels in `exact_row`, `exact_avx2` and `exact_avx512`) and
//! the kernel nodes
//! (`node`), which runs the exact form, the chunked form (`cpu::chunked`) or the replay. The
//! types here are shared with the chunked form.

pub mod backward;
#[cfg(target_arch = "x86_64")]
mod backward_avx2;
mod exact;
#[cfg(target_arch = "x86_64")]
mod exact_avx2;
#[cfg(target_arch = "x86_64")]
mod exact_avx512;
mod exact_row;
mod gates;
pub(crate) mod node;

pub use gates::{gates, GateInputs};

use super::pool::SharedMut;

pub use crate::node::gated_delta::Dims;

/// The update's outputs, y `[B, T, Hv, Dv]` and the state `[B, Hv, Dv, Dk]`, shared by the
/// jobs of one call; each job writes a disjoint part.
#[derive(Clone, Copy)]
pub(crate) struct Out<T> {
    pub(crate) y: SharedMut<T>,
    pub(crate) state: SharedMut<f32>,
}

impl<T> Out<T> {
    pub(crate) fn new(y: &mut [T], state: &mut [f32]) -> Self {
        Out {
            y: SharedMut(y.as_mut_ptr()),
            state: SharedMut(state.as_mut_ptr()),
        }
    }
}

/// Where the initial state comes from.
#[derive(Clone, Copy)]
pub enum StateIn<'a> {
    /// No state given: start from zeros.
    Zeros,
    /// A separate input buffer `[B, Hv, Dv, Dk]`.
    Buffer(&'a [f32]),
    /// The output buffer already holds the initial state (MLX donated it).
    InPlace,
}
