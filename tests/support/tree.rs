//! Draft trees for the tree verify and commit: random shapes (level by level, then in node order
//! or depth first), the path of a node, and a host window of chosen tokens.
#![allow(dead_code)]

use super::pool::Host;
use super::Rng;
use super::{mlxk_gated_delta_commit_tree_pool, mlxk_gated_delta_verify_tree_pool, mlxk_status, H};

/// A random tree's parents (-1: a root), each before its children: up to `depth` levels of 1 to
/// `width` nodes, each node's parent on the level above, in level order or depth-first order.
pub fn random_tree(rng: &mut Rng, width: usize, depth: usize) -> Vec<i32> {
    // Level by level: (level, parent's index in the level order).
    let mut levels: Vec<Vec<Option<usize>>> = Vec::new();
    let mut order = 0usize;
    let mut previous: Vec<usize> = Vec::new();
    for level in 0..depth {
        let count = 1 + rng.below(width as u64) as usize;
        let nodes: Vec<Option<usize>> = (0..count)
            .map(|_| match level {
                0 => None,
                _ => Some(previous[rng.below(previous.len() as u64) as usize]),
            })
            .collect();
        previous = (order..order + count).collect();
        order += count;
        levels.push(nodes);
    }
    let parents: Vec<i32> = levels
        .into_iter()
        .flatten()
        .map(|p| p.map_or(-1, |p| p as i32))
        .collect();
    match rng.below(2) {
        0 => parents,
        _ => depth_first(&parents),
    }
}

/// The same tree renumbered depth first (children in their first order).
fn depth_first(parents: &[i32]) -> Vec<i32> {
    let n = parents.len();
    let mut new_index = vec![usize::MAX; n];
    let mut out = Vec::with_capacity(n);
    let mut stack: Vec<usize> = (0..n).filter(|&i| parents[i] < 0).rev().collect();
    while let Some(i) = stack.pop() {
        new_index[i] = out.len();
        out.push(match parents[i] {
            -1 => -1,
            p => new_index[p as usize] as i32,
        });
        stack.extend((0..n).filter(|&c| parents[c] == i as i32).rev());
    }
    out
}

/// A chain of `n` nodes (each after the one before).
pub fn chain(n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| i - 1).collect()
}

/// The path root → node `j` (indices within the tree).
pub fn path_to(parents: &[i32], j: usize) -> Vec<usize> {
    let mut path = vec![j];
    while parents[*path.last().unwrap()] >= 0 {
        path.push(parents[*path.last().unwrap()] as usize);
    }
    path.reverse();
    path
}

/// Trees packed back to back: their offsets.
pub fn offsets(trees: &[Vec<i32>]) -> Vec<i32> {
    let mut cu = vec![0i32];
    for t in trees {
        cu.push(cu.last().unwrap() + t.len() as i32);
    }
    cu
}

impl Host {
    /// The tokens `tokens` of row 0, as one row of `tokens.len()` tokens.
    pub fn tokens(&self, tokens: &[usize]) -> Host {
        let [_, tt, hk, hv, dk, dv] = self.dims;
        let _ = tt;
        let pick = |x: &[f32], per: usize| -> Vec<f32> {
            tokens
                .iter()
                .flat_map(|&t| x[t * per..(t + 1) * per].to_vec())
                .collect()
        };
        Host {
            dims: [1, tokens.len(), hk, hv, dk, dv],
            dtype: self.dtype,
            q: pick(&self.q, hk * dk),
            k: pick(&self.k, hk * dk),
            v: pick(&self.v, hv * dv),
            a: pick(&self.a, hv),
            b: pick(&self.b, hv),
            a_log: self.a_log.clone(),
            dt_bias: self.dt_bias.clone(),
        }
    }
}

/// The host arrays of a tree call as the C ABI takes them: the offsets and their count, the
/// parents and their count (n_nodes), the slots, the fresh flags (null: none fresh).
#[derive(Clone, Copy)]
pub struct TreeHost {
    pub cu: (*const i32, usize),
    pub parents: (*const i32, usize),
    pub slots: *const i32,
    pub fresh: *const u8,
}

impl TreeHost {
    /// The host arrays of these slices (fresh `None`: null).
    pub fn of(cu: &[i32], parents: &[i32], slots: &[i32], fresh: Option<&[u8]>) -> TreeHost {
        TreeHost {
            cu: (cu.as_ptr(), cu.len()),
            parents: (parents.as_ptr(), parents.len()),
            slots: slots.as_ptr(),
            fresh: fresh.map_or(std::ptr::null(), |f| f.as_ptr()),
        }
    }
}

/// `mlxk_gated_delta_verify_tree_pool` on `x` (q, k, v, a, b, a_log, dt_bias) and `pool`, y into
/// `*y`.
pub fn verify_tree(x: [H; 7], pool: H, h: TreeHost, y: *mut H) -> mlxk_status {
    let [q, k, v, a, b, al, dt] = x;
    let ((c, nc), (p, np)) = (h.cu, h.parents);
    unsafe {
        mlxk_gated_delta_verify_tree_pool(
            q, k, v, a, b, al, dt, pool, c, nc, p, np, h.slots, h.fresh, y,
        )
    }
}

/// `mlxk_gated_delta_commit_tree_pool` on `x` (its q unread) and `pool`, the accepted lengths and
/// paths (pointer, n_accepted), the new pool into `*out`.
pub fn commit_tree(
    x: [H; 7],
    pool: H,
    h: TreeHost,
    lengths: *const i32,
    (paths, n): (*const i32, usize),
    out: *mut H,
) -> mlxk_status {
    let [_, k, v, a, b, al, dt] = x;
    let ((c, nc), (p, np)) = (h.cu, h.parents);
    unsafe {
        mlxk_gated_delta_commit_tree_pool(
            k, v, a, b, al, dt, pool, c, nc, p, np, h.slots, h.fresh, lengths, paths, n, out,
        )
    }
}
