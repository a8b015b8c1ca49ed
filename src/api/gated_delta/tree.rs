//! Speculative trees on a pool (`include/mlxkern.h`, `mlxk_gated_delta_verify_tree_pool` and
//! `mlxk_gated_delta_commit_tree_pool`): [`DraftTrees`] describes the trees,
//! [`GatedDelta::verify_tree_pool`] gives y for every node and
//! [`StateReplay::commit_tree_pool`] commits one accepted path a tree.

use super::pool::{no_state, PoolSlots};
use crate::api::{call, int_arg, Array, GatedDelta, StateReplay};
use crate::error::Result;
use crate::ops::gated_delta::{self as ops, Tree};
use crate::ops::Backend;

/// Draft trees packed one after another along the token dimension of a `B = 1` call, one slot
/// a tree: tree `i` owns nodes (tokens) `cu_nodes[i]..cu_nodes[i + 1]`, and node `j` of a tree
/// (token `cu_nodes[i] + j`) follows `parents[cu_nodes[i] + j]`: `Some(p)`, a node of the same
/// tree with `p < j`, or `None`, the tree's slot state.
#[derive(Debug, Clone, Copy)]
pub struct DraftTrees<'a> {
    /// Trees + 1 offsets: 0, then each tree's end (never decreasing; the last is the node
    /// count).
    pub cu_nodes: &'a [usize],
    /// One parent a node, an index within its tree; None: the slot's state.
    pub parents: &'a [Option<usize>],
}

/// The trees as the ops take them (int32, -1 for the slot's state).
fn tree_ints(t: &DraftTrees) -> Result<(Vec<i32>, Vec<i32>)> {
    let cu = t
        .cu_nodes
        .iter()
        .enumerate()
        .map(|(i, &n)| int_arg(n, &format!("cu_nodes[{i}]")))
        .collect::<Result<Vec<i32>>>()?;
    let parents = t
        .parents
        .iter()
        .enumerate()
        .map(|(g, p)| p.map_or(Ok(-1), |p| int_arg(p, &format!("parents[{g}]"))))
        .collect::<Result<Vec<i32>>>()?;
    Ok((cu, parents))
}

impl GatedDelta<'_> {
    /// Tree verify on a pool: `y` for every node of the draft trees, each from its parent's
    /// state, bit for bit the last `y` of [`verify_pool`](GatedDelta::verify_pool) on the chain
    /// of the node's path (root, ..., node) from the tree's slot. Reads the pool, writes no
    /// state. q, k `[1, n_nodes, Hk, Dk]`, v `[1, n_nodes, Hv, Dv]`, a, b `[1, n_nodes, Hv]`,
    /// one slot (and fresh flag) a tree; `state` and `mask` must be None. Returns y
    /// `[1, n_nodes, Hv, Dv]`, lazy.
    ///
    /// No state per node is kept: each leaf's path is verified as one packed sequence, so the
    /// call holds the inputs and y of the sum of the leaves' depths in tokens (at most nodes ×
    /// depth).
    ///
    /// ```
    /// # fn main() -> mlxkern::Result<()> {
    /// use mlxkern::{Array, DraftTrees, GatedDelta, PoolSlots, StateReplay};
    /// let (n, nodes, hk, hv, dk, dv) = (4, 4, 1, 2, 32, 4);
    /// let fill = |n: usize| (0..n).map(|i| ((i * 7 % 13) as f32 - 6.0) / 20.0).collect::<Vec<f32>>();
    /// let q = Array::from_slice(&fill(nodes * hk * dk), &[1, nodes, hk, dk])?;
    /// let v = Array::from_slice(&fill(nodes * hv * dv), &[1, nodes, hv, dv])?;
    /// let gate = Array::from_slice(&fill(nodes * hv), &[1, nodes, hv])?;
    /// let per_head = Array::from_slice(&fill(hv), &[hv])?;
    /// let mut pool = Array::from_slice(&fill(n * hv * dv * dk), &[n, hv, dv, dk])?;
    /// // One tree in slot 3: node 0 from the slot's state, nodes 1 and 2 both after node 0,
    /// // node 3 after node 2.
    /// let trees = DraftTrees { cu_nodes: &[0, 4], parents: &[None, Some(0), Some(0), Some(2)] };
    /// let drafts = GatedDelta {
    ///     q: &q, k: &q, v: &v, a: &gate, b: &gate, a_log: &per_head, dt_bias: &per_head,
    ///     state: None, mask: None,
    /// };
    /// let y = drafts.verify_tree_pool(PoolSlots { pool: &pool, slots: &[3], fresh: None }, trees)?;
    /// assert_eq!(y.shape()?, [1, nodes, hv, dv]);
    /// // The path 0 → 2 → 3 is accepted.
    /// let commit = StateReplay {
    ///     k: &q, v: &v, a: &gate, b: &gate, a_log: &per_head, dt_bias: &per_head,
    ///     state: None, accepted_lengths: &[3],
    /// };
    /// pool = commit.commit_tree_pool(PoolSlots { pool: &pool, slots: &[3], fresh: None },
    ///                                trees, &[0, 2, 3])?;
    /// pool.eval()?;
    /// # Ok(()) }
    /// ```
    ///
    /// Errors: those of [`verify_pool`](GatedDelta::verify_pool) for the arrays, the pool and
    /// the slots (one a tree); [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming
    /// `cu_nodes` (offsets as `update_packed`'s `cu_seqlens`) or the parent at fault (not in
    /// its tree, or not before its child), or a parent count other than the node count.
    pub fn verify_tree_pool(&self, pool: PoolSlots, trees: DraftTrees) -> Result<Array> {
        call(|| {
            no_state(self.state)?;
            let (cu_nodes, parents) = tree_ints(&trees)?;
            let tree = Tree {
                cu_nodes: &cu_nodes,
                parents: &parents,
            };
            let fresh = pool.fresh_bytes();
            self.with_inputs(|x| {
                ops::verify_tree_pool(x, &pool.get(&fresh)?, &tree, Backend::current())
            })
            .map(Array::wrap)
        })
    }
}

impl StateReplay<'_> {
    /// The commit after [`GatedDelta::verify_tree_pool`]: tree `i`'s accepted path (the next
    /// `accepted_lengths[i]` entries of `accepted_paths`, node indices within the tree from a
    /// root down to a node, each a child of the one before) replayed from its slot (zeros where
    /// fresh) into the slot, bit for bit [`commit_pool`](StateReplay::commit_pool) on the chain
    /// of that path. k, v, a, b and the trees as the verify's; `state` must be None. Returns
    /// the new pool, lazy (in place under the rule of [`PoolSlots`]).
    ///
    /// Errors: those of [`verify_tree_pool`](GatedDelta::verify_tree_pool);
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a length count other than
    /// the trees', a length above its tree's node count, a path count other than the lengths'
    /// sum, or a path that does not run from a root down its tree.
    pub fn commit_tree_pool(
        &self,
        pool: PoolSlots,
        trees: DraftTrees,
        accepted_paths: &[usize],
    ) -> Result<Array> {
        call(|| {
            no_state(self.state)?;
            let (cu_nodes, parents) = tree_ints(&trees)?;
            let tree = Tree {
                cu_nodes: &cu_nodes,
                parents: &parents,
            };
            let paths = accepted_paths
                .iter()
                .enumerate()
                .map(|(i, &j)| int_arg(j, &format!("accepted_paths[{i}]")))
                .collect::<Result<Vec<i32>>>()?;
            let fresh = pool.fresh_bytes();
            self.with_inputs(|x| {
                ops::commit_tree_pool(x, &pool.get(&fresh)?, &tree, &paths, Backend::current())
            })
            .map(Array::wrap)
        })
    }
}
