//! The gated-delta update and its prefix replay on the CPU: the fused gates (`gates`), the exact
//! recurrence (`exact`, its row kernels in `exact_row`, `exact_avx2`, `exact_avx512` and
//! `exact_neon`) and the kernel nodes (`node`), which runs the exact form, the chunked form
//! (`chunked`) or the replay. The types here are shared with the chunked form.

pub mod backward;
#[cfg(target_arch = "x86_64")]
mod backward_avx2;
#[cfg(target_arch = "aarch64")]
mod backward_neon;
pub mod chunked;
mod exact;
#[cfg(target_arch = "x86_64")]
mod exact_avx2;
#[cfg(target_arch = "x86_64")]
mod exact_avx512;
#[cfg(target_arch = "aarch64")]
mod exact_neon;
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

/// Each row's tokens and states: the dense layout (row b runs tokens `[b·T, b·T + T)`, or its
/// accepted length, from state row b into state row b), or a pool node's row table
/// (`node::gated_delta::Pool`: int32 `[B, 5]` of `(tok0, span, len, src, dst)`).
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    t: usize,
    table: Option<&'a [i32]>,
    lengths: Option<&'a [i32]>,
}

impl<'a> Rows<'a> {
    /// The dense layout with T tokens a row, each row running `lengths[b]` of them (the
    /// replay) or all T.
    pub fn dense(t: usize, lengths: Option<&'a [i32]>) -> Rows<'a> {
        Rows {
            t,
            table: None,
            lengths,
        }
    }

    /// A pool node's row table (validated by the caller: tokens in range, `len <= span`).
    pub fn table(t: usize, table: &'a [i32]) -> Rows<'a> {
        Rows {
            t,
            table: Some(table),
            lengths: None,
        }
    }

    /// Whether the rows come from a row table.
    pub fn is_table(&self) -> bool {
        self.table.is_some()
    }

    fn field(&self, b: usize, i: usize) -> Option<i32> {
        self.table.map(|t| t[5 * b + i])
    }

    /// Row b's first token in the flattened token dimension.
    pub fn tok0(&self, b: usize) -> usize {
        self.field(b, 0).map_or(b * self.t, |x| x as usize)
    }

    /// The tokens of y row b owns (y is 0 past `len`).
    pub fn span(&self, b: usize) -> usize {
        self.field(b, 1).map_or(self.t, |x| x as usize)
    }

    /// The tokens row b runs.
    pub fn len(&self, b: usize) -> usize {
        let len = match (self.field(b, 2), self.lengths) {
            (Some(x), _) => x as usize,
            (None, Some(l)) => l[b] as usize,
            (None, None) => self.t,
        };
        assert!(
            len <= self.span(b),
            "row {b} runs {len} tokens of its {}",
            self.span(b)
        );
        len
    }

    /// The state row row b starts from (None: zeros). Dense: row b, where a state is given.
    pub fn src(&self, b: usize) -> Option<usize> {
        self.field(b, 3)
            .map_or(Some(b), |x| usize::try_from(x).ok())
    }

    /// The state-output row row b ends in (None: not written).
    pub fn dst(&self, b: usize) -> Option<usize> {
        self.field(b, 4)
            .map_or(Some(b), |x| usize::try_from(x).ok())
    }
}
