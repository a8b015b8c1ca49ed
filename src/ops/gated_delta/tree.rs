//! Speculative trees on a pool (`mlxk_gated_delta_verify_tree_pool`,
//! `mlxk_gated_delta_commit_tree_pool`; docs/serving.md "Trees"): draft trees packed back to
//! back along the token dimension, one slot a tree, each node with its parent (-1: the slot's
//! state); y for every node from its parent's state, then one accepted root-to-node path a tree
//! committed into its slot.
//!
//! No state per node is kept. Each leaf's path root → leaf is gathered (MLX's take) into one
//! packed sequence, and the pool verify runs those sequences from their tree's slot (the state
//! read by slot, never copied). The exact recurrence is causal: the y at position j of a path
//! is the y a chain verify of its first j + 1 tokens ends with, so each node's y is read at its
//! position on the path of the first leaf below it, bit for bit the last y of a chain verify of
//! root → node. The commit gathers each tree's accepted path into a row of a dense window and
//! replays it into the slot (`state_pool`), bit for bit the chain commit of that path.
//!
//! Memory: the gathered inputs and y of the leaves' paths, P tokens, where P is the sum of the
//! leaves' depths (at most nodes × depth; nodes for a chain, width × depth for `width` disjoint
//! chains); no state per node.

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::dtype::Dtype;
use crate::error::{Error, Result};
use crate::memory;
use crate::node::gated_delta::{Form, Pool};
use crate::ops::shape::ArgInfo;
use crate::ops::Backend;

use super::graph::Arrays;
use super::pool::{
    build_pool, check_fresh, check_offsets, check_pool, check_slots, pool_write, row_table,
    state_pool, Layout, Slots,
};
use super::tables::ints_array;
use super::{check_state_counted, check_update_as, Inputs, Results, StateInputs};

/// Draft trees packed along the token dimension: tree i owns the nodes (tokens)
/// `[cu_nodes[i], cu_nodes[i + 1])` and the slot `slots[i]`; node j of a tree (its token
/// `cu_nodes[i] + j`) has the parent `parents[cu_nodes[i] + j]`, a node of the same tree before
/// it (0 ≤ parent < j), or -1: the tree's slot state.
#[derive(Clone, Copy)]
pub struct Tree<'a> {
    pub cu_nodes: &'a [i32],
    pub parents: &'a [i32],
}

/// The largest count of tokens on the leaves' paths (a token index is int32).
const MAX_PATH_TOKENS: usize = i32::MAX as usize;

/// The q, k, v and gates' token dimension: B must be 1 (the trees are packed along T).
fn check_packed_rows(b: usize, source: &str) -> Result<()> {
    match b {
        1 => Ok(()),
        _ => Err(Error::Shape(format!(
            "{source}: B (dimension 0) is {b}; draft trees take their nodes packed along \
             dimension 1 of a single row ([1, n_nodes, H, D])"
        ))),
    }
}

/// Checks the trees: the offsets, one slot and fresh flag a tree, and one parent a node, each
/// -1 or a node of its tree before it. `t`: the nodes in the token dimension of `source`.
fn check_tree(tree: &Tree, s: &Slots, n: i64, (t, source): (i64, &str)) -> Result<()> {
    check_offsets(tree.cu_nodes, "cu_nodes", "tree", (t, source))?;
    check_slots(s, tree.cu_nodes.len() as i64 - 1, n, "tree")?;
    check_fresh(s)?;
    if tree.parents.len() as i64 != t {
        return Err(Error::InvalidArgument(format!(
            "parents: n_nodes is {}; expected one parent per node ({t}, {source}'s dimension 1)",
            tree.parents.len()
        )));
    }
    for (i, w) in tree.cu_nodes.windows(2).enumerate() {
        for g in w[0]..w[1] {
            let (j, p) = (g - w[0], tree.parents[g as usize]);
            if p < -1 || p >= j {
                return Err(Error::InvalidArgument(format!(
                    "parents[{g}] is {p}; node {j} of tree {i} takes -1 (its slot's state) or \
                     a node of its tree before it (0 to {})",
                    j - 1
                )));
            }
        }
    }
    Ok(())
}

/// The leaves' paths as packed sequences: the tokens gathered (global node indices), their
/// offsets, each sequence's slot and fresh flag, and where each node's y is on them.
struct Paths {
    tokens: Vec<i32>,
    cu: Vec<i32>,
    slots: Vec<i32>,
    fresh: Option<Vec<u8>>,
    at: Vec<i32>,
}

impl Paths {
    /// One sequence per leaf, in node order; a node's y is at its position on the path of the
    /// first leaf below it. Refuses more than `MAX_PATH_TOKENS` tokens.
    fn of(tree: &Tree, s: &Slots) -> Result<Paths> {
        let n_nodes = tree.parents.len();
        let mut has_child = vec![false; n_nodes];
        for w in tree.cu_nodes.windows(2) {
            for g in w[0]..w[1] {
                let p = tree.parents[g as usize];
                if p >= 0 {
                    has_child[(w[0] + p) as usize] = true;
                }
            }
        }
        let mut paths = Paths {
            tokens: Vec::new(),
            cu: vec![0],
            slots: Vec::new(),
            fresh: s.fresh.map(|_| Vec::new()),
            at: vec![-1; n_nodes],
        };
        let mut path = Vec::new();
        for (i, w) in tree.cu_nodes.windows(2).enumerate() {
            for leaf in (w[0]..w[1]).filter(|&g| !has_child[g as usize]) {
                path.clear();
                let mut g = leaf;
                loop {
                    path.push(g);
                    match tree.parents[g as usize] {
                        -1 => break,
                        p => g = w[0] + p,
                    }
                }
                if paths.tokens.len() + path.len() > MAX_PATH_TOKENS {
                    return Err(Error::InvalidArgument(format!(
                        "parents: the trees' root-to-leaf paths hold more than {MAX_PATH_TOKENS} \
                         tokens; expected at most that many (the sum of the leaves' depths)"
                    )));
                }
                for &g in path.iter().rev() {
                    if paths.at[g as usize] < 0 {
                        paths.at[g as usize] = paths.tokens.len() as i32;
                    }
                    paths.tokens.push(g);
                }
                paths.cu.push(paths.tokens.len() as i32);
                paths.slots.push(s.slots[i]);
                if let (Some(f), Some(flags)) = (&mut paths.fresh, s.fresh) {
                    f.push(flags[i]);
                }
            }
        }
        Ok(paths)
    }
}

/// Gathers the tokens `tokens` (int32, any shape) of each of `arrays` (`[1, T, ...]`).
fn gather<const N: usize>(
    arrays: [&Array; N],
    tokens: &Array,
    backend: Backend,
) -> Result<[UniquePtr<Array>; N]> {
    let mut out = Vec::with_capacity(N);
    for a in arrays {
        out.push(bridge::take_tokens(a, tokens, backend.gpu_stream())?);
    }
    Ok(out.try_into().unwrap_or_else(|_| unreachable!("N arrays")))
}

/// Tree verify on a pool (`mlxk_gated_delta_verify_tree_pool`): q, k, v, a, b hold the trees'
/// nodes `[1, n_nodes, ...]` (`x.state` and `x.mask` None); returns y `[1, n_nodes, Hv, Dv]`,
/// each node's from its parent's state, lazy. Reads the pool, writes nothing.
pub fn verify_tree_pool(
    x: &Inputs,
    s: &Slots,
    tree: &Tree,
    backend: Backend,
) -> Result<UniquePtr<Array>> {
    let mut node = check_update_as(x, Results::Pool)?;
    let d = node.dims;
    check_packed_rows(d.b, "q")?;
    let n = check_pool(s.pool, [d.hv, d.dv, d.dk].map(|v| v as i64), ("q", "v"))?;
    check_tree(tree, s, n, (d.t as i64, "q"))?;
    let paths = Paths::of(tree, s)?;
    let p = paths.tokens.len();
    let [tp, hk, hv, dk, dv] = [p, d.hk, d.hv, d.dk, d.dv].map(|v| v as i64);
    memory::check_outputs(&[
        (
            "the leaves' paths' q and k (internal)",
            &[2, tp, hk, dk],
            node.dtype,
        ),
        (
            "the leaves' paths' v (internal)",
            &[1, tp, hv, dv],
            node.dtype,
        ),
        (
            "the leaves' paths' y (internal)",
            &[1, tp, hv, dv],
            node.dtype,
        ),
        (
            "the leaves' paths' gates (internal)",
            &[2, tp, hv],
            Dtype::Float32,
        ),
    ])?;
    if p == 0 {
        let shape = [1, 0, d.hv as i32, d.dv as i32];
        return Ok(bridge::array_zeros(&shape, node.dtype as i32)?);
    }
    let tokens = ints_array(&paths.tokens, &[1, p as i32])?;
    let [q, k, v, a, b] = gather([x.q, x.k, x.v, x.a, x.b], &tokens, backend)?;
    let rows = Slots {
        pool: s.pool,
        slots: &paths.slots,
        fresh: paths.fresh.as_deref(),
    };
    node.dims.b = paths.slots.len();
    node.dims.t = p;
    node.has_state = true; // the pool
    node.form = Form::Exact;
    node.pool = Some(Pool {
        slots: n as usize,
        write: pool_write(backend, false, 0, false),
        packed: true,
    });
    let layout = Layout::Packed {
        cu_seqlens: &paths.cu,
    };
    let (table, _) = row_table(&rows, layout, p, None, false, false);
    let arrays = Arrays {
        q: Some(&q),
        k: Some(&k),
        v: Some(&v),
        a: Some(&a),
        b: Some(&b),
        ..x.arrays()
    };
    let mut outputs = build_pool(&node, arrays, &rows, (&table, &[]), false, backend)?;
    let y_paths = outputs.swap_remove(0);
    let at = ints_array(&paths.at, &[1, d.t as i32])?;
    let [y] = gather([&*y_paths], &at, backend)?;
    Ok(y)
}

/// Checks the accepted paths: one length a tree, their sum `paths.len()`, and each tree's path
/// a chain from a root (parent -1) down its tree.
fn check_accepted(tree: &Tree, lengths: &[i32], paths: &[i32]) -> Result<()> {
    let trees = tree.cu_nodes.len() - 1;
    if lengths.len() != trees {
        return Err(Error::InvalidArgument(format!(
            "accepted_lengths: {} lengths for {trees} trees; expected one per tree",
            lengths.len()
        )));
    }
    let mut at = 0usize;
    for (i, w) in tree.cu_nodes.windows(2).enumerate() {
        let (len, size) = (lengths[i], w[1] - w[0]);
        if len < 0 || len > size {
            return Err(Error::InvalidArgument(format!(
                "accepted_lengths[{i}] is {len}; expected 0 to {size} (the nodes of tree {i})"
            )));
        }
        if at + len as usize > paths.len() {
            return Err(Error::InvalidArgument(format!(
                "accepted_paths: n_accepted is {}; the accepted_lengths of trees 0 to {i} \
                 already sum to {}",
                paths.len(),
                at + len as usize
            )));
        }
        let mut parent = -1;
        for step in 0..len as usize {
            let j = paths[at + step];
            if j < 0 || j >= size {
                return Err(Error::InvalidArgument(format!(
                    "accepted_paths[{}] is {j}; expected a node of tree {i} (0 to {})",
                    at + step,
                    size - 1
                )));
            }
            let pj = tree.parents[(w[0] + j) as usize];
            if pj != parent {
                let expected = match parent {
                    -1 => "a root (a node whose parent is -1)".to_string(),
                    p => format!("a child of node {p}, the step before it"),
                };
                return Err(Error::InvalidArgument(format!(
                    "accepted_paths[{}] is node {j} of tree {i}, whose parent is {pj}; a path \
                     runs from a root down the tree: expected {expected}",
                    at + step
                )));
            }
            parent = j;
        }
        at += len as usize;
    }
    if at != paths.len() {
        return Err(Error::InvalidArgument(format!(
            "accepted_paths: n_accepted is {}; expected the sum of accepted_lengths ({at})",
            paths.len()
        )));
    }
    Ok(())
}

/// The commit of a tree verify (`mlxk_gated_delta_commit_tree_pool`): k, v, a, b hold the
/// trees' nodes `[1, n_nodes, ...]` (`x.state` None), `x.accepted_lengths` one path length a
/// tree and `paths` the trees' accepted paths back to back (node indices within each tree, root
/// first). Each tree's path is replayed from its slot (zeros where fresh) into the slot; returns
/// the new pool, lazy (in place under `state_pool`'s rule).
pub fn commit_tree_pool(
    x: &StateInputs,
    s: &Slots,
    tree: &Tree,
    paths: &[i32],
    backend: Backend,
) -> Result<UniquePtr<Array>> {
    let k = ArgInfo::of("k", x.k)?;
    k.rank(4, "[B, T, Hk, Dk]")?;
    check_packed_rows(k.shape[0] as usize, "k")?;
    // The shapes and dtypes, checked as the replay of one row that accepts nothing.
    let shapes = StateInputs {
        accepted_lengths: &[0],
        ..*x
    };
    let node = check_state_counted(&shapes, "accepted_lengths", Results::Pool)?;
    let d = node.dims;
    let n = check_pool(s.pool, [d.hv, d.dv, d.dk].map(|v| v as i64), ("k", "v"))?;
    check_tree(tree, s, n, (d.t as i64, "k"))?;
    check_accepted(tree, x.accepted_lengths, paths)?;
    let trees = x.accepted_lengths.len();
    let width = x.accepted_lengths.iter().copied().max().unwrap_or(0) as usize;
    let [rows, cols, hk, hv, dk, dv] = [trees, width, d.hk, d.hv, d.dk, d.dv].map(|v| v as i64);
    memory::check_outputs(&[
        (
            "the accepted paths' k (internal)",
            &[rows, cols, hk, dk],
            node.dtype,
        ),
        (
            "the accepted paths' v (internal)",
            &[rows, cols, hv, dv],
            node.dtype,
        ),
    ])?;
    // Row i: tree i's path, then token 0 (any token: the replay never reads past the length).
    let mut tokens = vec![0i32; trees * width];
    let mut at = 0usize;
    for (i, &len) in x.accepted_lengths.iter().enumerate() {
        for step in 0..len as usize {
            tokens[i * width + step] = tree.cu_nodes[i] + paths[at + step];
        }
        at += len as usize;
    }
    let window = ints_array(&tokens, &[trees as i32, width as i32])?;
    let [k, v, a, b] = gather([x.k, x.v, x.a, x.b], &window, backend)?;
    let rows = StateInputs {
        k: &k,
        v: &v,
        a: &a,
        b: &b,
        ..*x
    };
    state_pool(&rows, s, backend)
}
