//! Small int32 tables (a replay's accepted lengths, a pool's row table, a chunk table, a tree's
//! paths) as MLX arrays, kept by value: the layers of one step build the same tables, and an
//! array made from host memory costs an allocation and a copy per call (on MLX CUDA, possibly a
//! synchronous copy: `replay::lengths_array`).

use std::sync::Mutex;

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::Result;

/// An int32 array of `shape` holding `values`, shared by calls with the same shape and values;
/// the last `LENGTHS_KEPT` distinct tables are kept. The caller holds the MLX lock.
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

/// The kept tables (`ints_array`), least recently used first.
static LENGTHS: Mutex<Vec<(Vec<i32>, UniquePtr<Array>)>> = Mutex::new(Vec::new());

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths(values: &[i32]) -> Result<UniquePtr<Array>> {
        ints_array(values, &[values.len() as i32])
    }

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
        let a = lengths(&first).unwrap();
        assert_eq!(values(&a), first);
        assert_eq!(bridge::array_dtype(&a), Dtype::Int32 as i32);
        // Other lengths, then more distinct ones than are kept: each comes back with its values.
        for n in 0..12 {
            let other = [-9_002, n, 3 * n];
            assert_eq!(values(&lengths(&other).unwrap()), other);
            assert_eq!(values(&lengths(&first).unwrap()), first, "after {n} others");
        }
        let longer = [-9_001, 3, 7, 0];
        assert_eq!(values(&lengths(&longer).unwrap()), longer);
        assert_eq!(values(&lengths(&first[..2]).unwrap()), first[..2]);
        assert!(LENGTHS.lock().unwrap().len() <= LENGTHS_KEPT);
    }
}
