//! The prefix replay (`mlxk_gated_delta_state`) and its accepted-lengths arrays, kept by value.

use std::sync::Mutex;

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::Result;
use crate::ops::Backend;

use super::graph::build;
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
/// immutable, so one array can serve every call with the same values. The last
/// `LENGTHS_KEPT` distinct lengths are kept; the caller holds the MLX lock (every op does).
fn lengths_array(lengths: &[i32]) -> Result<UniquePtr<Array>> {
    ints_array(lengths, &[lengths.len() as i32])
}

/// An int32 array of `shape` holding `values`, kept as `lengths_array` keeps the lengths (a
/// pool node's row table: the layers of one step share it).
pub(super) fn ints_array(values: &[i32], shape: &[i32]) -> Result<UniquePtr<Array>> {
    // The shape goes in the key (in front of the values) so tables of other shapes never match.
    let key: Vec<i32> = [shape.len() as i32]
        .iter()
        .chain(shape)
        .chain(values)
        .copied()
        .collect();
    let lengths = key.as_slice();
    let mut kept = LENGTHS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(at) = kept.iter().position(|(l, _)| l.as_slice() == lengths) {
        let entry = kept.remove(at);
        let shared = bridge::array_share(&entry.1);
        kept.push(entry); // the most recently used last
        return Ok(shared);
    }
    let bytes: Vec<u8> = values.iter().flat_map(|l| l.to_ne_bytes()).collect();
    let array = bridge::array_from_bytes(&bytes, shape, Dtype::Int32 as i32)?;
    if kept.len() >= LENGTHS_KEPT {
        kept.remove(0); // the least recently used
    }
    kept.push((lengths.to_vec(), bridge::array_share(&array)));
    Ok(array)
}

const LENGTHS_KEPT: usize = 16;

/// The kept lengths arrays (`lengths_array`), least recently used first.
static LENGTHS: Mutex<Vec<(Vec<i32>, UniquePtr<Array>)>> = Mutex::new(Vec::new());

#[cfg(test)]
mod tests {
    use super::*;

    fn values(a: &Array) -> Vec<i32> {
        let mut bytes = vec![0u8; bridge::array_nbytes(a)];
        bridge::array_read(a, &mut bytes).unwrap();
        bytes
            .chunks_exact(4)
            .map(|c| i32::from_ne_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn replay_lengths_are_shared_by_value_and_the_kept_set_stays_bounded() {
        let _mlx = crate::registry::lock();
        // Values no other test uses, so tests running at the same time meet other entries only.
        let first = [-9_001, 3, 7];
        let a = lengths_array(&first).unwrap();
        assert_eq!(values(&a), first);
        assert_eq!(bridge::array_dtype(&a), Dtype::Int32 as i32);
        // Other lengths, then more distinct ones than are kept: each comes back with its values.
        for n in 0..12 {
            let other = [-9_002, n, 3 * n];
            assert_eq!(values(&lengths_array(&other).unwrap()), other);
            assert_eq!(
                values(&lengths_array(&first).unwrap()),
                first,
                "after {n} others"
            );
        }
        let longer = [-9_001, 3, 7, 0];
        assert_eq!(values(&lengths_array(&longer).unwrap()), longer);
        assert_eq!(values(&lengths_array(&first[..2]).unwrap()), first[..2]);
        assert!(LENGTHS.lock().unwrap().len() <= LENGTHS_KEPT);
    }
}
