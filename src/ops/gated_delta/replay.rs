//! The prefix replay (`mlxk_gated_delta_state`) and its accepted-lengths arrays, kept by value.

use cxx::UniquePtr;

use crate::bridge::Array;
use crate::error::Result;
use crate::ops::Backend;

use super::graph::build;
use super::tables::ints_array;
use super::{check_state, StateInputs};

/// Builds the prefix replay: returns the state after each row's accepted prefix, lazy.
pub fn state(x: &StateInputs, backend: Backend) -> Result<UniquePtr<Array>> {
    let node = check_state(x)?;
    let lengths = lengths_array(x.accepted_lengths)?;
    let mut arrays = x.arrays();
    arrays.lengths = Some(&lengths);
    let mut outputs = build(&node, &arrays, backend)?;
    Ok(outputs.pop().expect("one output"))
}

/// The replay's accepted lengths as an int32 array [B], shared by calls with the same lengths.
///
/// The layers of one decode step replay the same lengths, and an array made from host memory
/// costs an allocation and a copy per call. On MLX CUDA that copy can also wait for the GPU:
/// when MLX's buffer cache hands back a device buffer of the size, MLX moves it to unified
/// memory with a synchronous `cudaMemcpy` (mlx/backend/cuda/allocator.cpp), so a pipelined
/// decode loop stalled on every layer (docs/DESIGN.md §3, MLX CUDA, "Caches"). MLX arrays are
/// immutable, so one array can serve every call with the same values (`tables::ints_array`,
/// which keeps the last few distinct tables); the caller holds the MLX lock (every op does).
fn lengths_array(lengths: &[i32]) -> Result<UniquePtr<Array>> {
    ints_array(lengths, &[lengths.len() as i32])
}
