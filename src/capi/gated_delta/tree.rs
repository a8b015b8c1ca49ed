//! Speculative trees on a pool: the verify of draft trees (y for every node from its parent's
//! state) and the commit of one accepted root-to-node path a tree (docs/serving.md "Trees").

use super::pool::{host, update_inputs, HostRows};
use crate::capi::status::mlxk_status;
use crate::capi::{boundary, mlxk_array, Out};
use crate::error::Result;
use crate::ops::gated_delta::{self as ops, StateInputs, Tree};
use crate::ops::Backend;

/// The caller's trees: `n_cu_nodes` offsets and `n_nodes` parents.
#[derive(Clone, Copy)]
pub(crate) struct HostTree {
    pub(crate) cu_nodes: *const i32,
    pub(crate) n_cu_nodes: usize,
    pub(crate) parents: *const i32,
    pub(crate) n_nodes: usize,
}

impl HostTree {
    /// The offsets and parents, borrowed for the call.
    ///
    /// # Safety
    /// Each pointer holds the count of values it announces (NULL only for a count of 0).
    unsafe fn get<'a>(&self) -> Result<Tree<'a>> {
        Ok(Tree {
            // SAFETY: the contract above.
            cu_nodes: unsafe { host(self.cu_nodes, self.n_cu_nodes, "cu_nodes", "n_cu_nodes") }?,
            // SAFETY: the contract above.
            parents: unsafe { host(self.parents, self.n_nodes, "parents", "n_nodes") }?,
        })
    }

    /// The slots and fresh flags: one a tree.
    fn rows(&self, slots: *const i32, fresh: *const u8) -> HostRows {
        HostRows {
            slots,
            fresh,
            n_slots: self.n_cu_nodes.saturating_sub(1),
        }
    }
}

/// The accepted paths of a commit: one length a tree, `n_accepted` node indices.
#[derive(Clone, Copy)]
pub(crate) struct Accepted {
    pub(crate) lengths: *const i32,
    pub(crate) paths: *const i32,
    pub(crate) n_accepted: usize,
}

/// The tree verify under the name `function`.
///
/// # Safety
/// The host arrays hold what they announce (`HostTree`, one slot and fresh flag a tree); `y`
/// is NULL or valid for writing one handle.
pub(crate) unsafe fn verify(
    function: &str,
    args: [*const mlxk_array; 8],
    tree: HostTree,
    slots: *const i32,
    fresh: *const u8,
    y: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `y`.
        let y = unsafe { Out::new(y, "y") }?;
        // SAFETY: the documented contract on the host arrays.
        let trees = unsafe { tree.get() }?;
        let mut mlx = crate::registry::lock();
        let [q, k, v, a, b, a_log, dt_bias, pool] = args;
        let inputs = update_inputs(&mlx, [q, k, v, a, b, a_log, dt_bias, std::ptr::null()])?;
        // SAFETY: the documented contract on the host arrays.
        let slots = unsafe { tree.rows(slots, fresh).slots(&mlx, pool) }?;
        let result = ops::verify_tree_pool(&inputs, &slots, &trees, Backend::current())?;
        y.write(mlx.insert(result));
        Ok(())
    })
}

/// The tree commit under the name `function`.
///
/// # Safety
/// As `verify`; `accepted` holds one length a tree and `n_accepted` node indices; `pool_out`
/// is NULL or valid for writing one handle.
pub(crate) unsafe fn commit(
    function: &str,
    args: [*const mlxk_array; 7],
    tree: HostTree,
    (slots, fresh): (*const i32, *const u8),
    accepted: Accepted,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary(function, || {
        // SAFETY: the documented contract on `pool_out`.
        let pool_out = unsafe { Out::new(pool_out, "pool_out") }?;
        // SAFETY: the documented contract on the host arrays.
        let trees = unsafe { tree.get() }?;
        let rows = tree.rows(slots, fresh);
        // SAFETY: the documented contract on the host arrays.
        let lengths = unsafe {
            host(
                accepted.lengths,
                rows.n_slots,
                "accepted_lengths",
                "n_cu_nodes",
            )
        }?;
        let (paths, n) = (accepted.paths, accepted.n_accepted);
        // SAFETY: the documented contract on the host arrays.
        let paths = unsafe { host(paths, n, "accepted_paths", "n_accepted") }?;
        let mut mlx = crate::registry::lock();
        let [k, v, a, b, a_log, dt_bias, pool] = args;
        let inputs = StateInputs {
            k: mlx.get(k, "k")?,
            v: mlx.get(v, "v")?,
            a: mlx.get(a, "a")?,
            b: mlx.get(b, "b")?,
            a_log: mlx.get(a_log, "a_log")?,
            dt_bias: mlx.get(dt_bias, "dt_bias")?,
            state: None,
            accepted_lengths: lengths,
        };
        // SAFETY: the documented contract on the host arrays.
        let slots = unsafe { rows.slots(&mlx, pool) }?;
        let given = crate::ops::array::id(slots.pool);
        let result = ops::commit_tree_pool(&inputs, &slots, &trees, paths, Backend::current())?;
        // A failed evaluation leaves the pool as given (mlxk_gated_delta_update_pool's Faults).
        pool_out.write(mlx.insert_pool_step(None, result, given).1);
        Ok(())
    })
}

/// Tree verify on a pool, for speculative decoding with a tree of drafts (EAGLE-style or
/// multi-token-prediction drafters): y for every node of one or several draft trees, each node
/// from its parent's state, reading the pool and writing nothing. Node y is bit for bit the last
/// y of mlxk_gated_delta_verify_pool on the chain of its path (root, ..., node) from the tree's
/// slot.
///
/// The trees are packed along T, one after another: q, k [1, n_nodes, Hk, Dk], v [1, n_nodes,
/// Hv, Dv], a, b [1, n_nodes, Hv] (dtypes as mlxk_gated_delta_update); `cu_nodes` holds
/// `n_cu_nodes` = trees + 1 int32 offsets (0, then each tree's end; never decreasing; the last
/// is n_nodes), tree i owning nodes [cu_nodes[i], cu_nodes[i + 1]) (an empty tree allowed).
/// `parents` holds n_nodes int32 values: node j of tree i (its index in the tree; token
/// cu_nodes[i] + j) has parent `parents[cu_nodes[i] + j]`, an index in the same tree below j
/// (a parent comes before its children), or -1: it follows the tree's slot state (several roots
/// allowed). `slots` and `fresh` (NULL: none) hold one value a tree, with the rules of
/// mlxk_gated_delta_update_pool (a negative slot: the tree's y is zeros; two trees may not name
/// one slot; a fresh tree starts from zeros). Result: `*y` [1, n_nodes, Hv, Dv] in q's dtype.
/// Commit the accepted path of each tree with mlxk_gated_delta_commit_tree_pool.
///
/// Memory and work: no state per node. Each leaf's path is gathered into one packed sequence
/// and verified from the tree's slot (the state read in place), so the call holds the inputs
/// and y of P tokens, P the sum of the leaves' depths: at most n_nodes × depth, n_nodes for a
/// chain, width × depth for `width` chains from one root; it runs P recurrence steps (a state
/// per node would take n_nodes × Hv × Dv × Dk × 4 bytes).
///
/// Ownership: inputs borrowed (host arrays only for the call); `*y` a new handle. NULL: `fresh`
/// may be NULL; a host array only when its count is 0. Errors: MLXK_ERR_NULL_POINTER,
/// MLXK_ERR_SHAPE, MLXK_ERR_DTYPE, MLXK_ERR_INVALID_HANDLE, MLXK_ERR_INVALID_ARGUMENT
/// (`cu_nodes`, `parents`, `n_nodes` other than q's T, `slots`), MLXK_ERR_OUT_OF_MEMORY.
/// Thread: any. Lazy: computation errors surface at eval/read.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_verify_tree_pool(
    q: *const mlxk_array,
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    cu_nodes: *const i32,
    n_cu_nodes: usize,
    parents: *const i32,
    n_nodes: usize,
    slots: *const i32,
    fresh: *const u8,
    y: *mut *mut mlxk_array,
) -> mlxk_status {
    let tree = HostTree {
        cu_nodes,
        n_cu_nodes,
        parents,
        n_nodes,
    };
    let args = [q, k, v, a, b, a_log, dt_bias, pool];
    // SAFETY: forwarded contract.
    unsafe {
        verify(
            "mlxk_gated_delta_verify_tree_pool",
            args,
            tree,
            slots,
            fresh,
            y,
        )
    }
}

/// The commit after a tree verify on a pool: tree i's accepted path, root to leaf, replayed from
/// its slot's state (zeros where `fresh` says so) and written into that slot. Bit for bit
/// mlxk_gated_delta_state_pool on the chain of that path with its length accepted.
///
/// k, v, a, b, `cu_nodes`, `parents`, `slots` and `fresh` as the verify's (the same trees).
/// `accepted_lengths` holds one int32 length a tree (n_cu_nodes - 1 values, each from 0 to the
/// tree's node count); `accepted_paths` holds `n_accepted` int32 node indices, each tree's path
/// one after another (`accepted_lengths[i]` of them for tree i; n_accepted is their sum): node
/// indices within the tree, the first a root (parent -1), each next a child of the one before.
/// A length of 0 leaves the slot unchanged (a fresh one becomes zeros); a negative slot is a
/// padding tree (its path checked, nothing written). Result: `*pool_out` [N, Hv, Dv, Dk], with
/// the in-place rule of mlxk_gated_delta_update_pool (free the old pool before evaluating and
/// the trees' slots are written into its buffer). Faults as mlxk_gated_delta_update_pool's: an
/// evaluation that fails leaves every slot as given.
///
/// Memory: the accepted paths' k, v and gates as a window of trees × the longest path tokens.
/// Errors as mlxk_gated_delta_verify_tree_pool, and MLXK_ERR_INVALID_ARGUMENT for a length out
/// of range, `n_accepted` other than the lengths' sum, or a path that is not a chain from a
/// root. NULL: `fresh`; a host array only when its count is 0.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn mlxk_gated_delta_commit_tree_pool(
    k: *const mlxk_array,
    v: *const mlxk_array,
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
    pool: *const mlxk_array,
    cu_nodes: *const i32,
    n_cu_nodes: usize,
    parents: *const i32,
    n_nodes: usize,
    slots: *const i32,
    fresh: *const u8,
    accepted_lengths: *const i32,
    accepted_paths: *const i32,
    n_accepted: usize,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    let tree = HostTree {
        cu_nodes,
        n_cu_nodes,
        parents,
        n_nodes,
    };
    let accepted = Accepted {
        lengths: accepted_lengths,
        paths: accepted_paths,
        n_accepted,
    };
    let args = [k, v, a, b, a_log, dt_bias, pool];
    let function = "mlxk_gated_delta_commit_tree_pool";
    // SAFETY: forwarded contract.
    unsafe { commit(function, args, tree, (slots, fresh), accepted, pool_out) }
}
