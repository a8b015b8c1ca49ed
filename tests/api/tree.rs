//! The safe API's tree calls (`GatedDelta::verify_tree_pool`, `StateReplay::commit_tree_pool`)
//! against the C ABI on random trees: results bit for bit, errors with the same status and
//! message.

use super::{bools, c_fresh, random_slots, Inputs};
use crate::support::api::*;
use crate::support::tree::{offsets, path_to, random_tree};
use crate::support::*;
use mlxkern::{DraftTrees, Dtype, PoolSlots};
use std::ptr::null_mut;

/// The verify, then the commit of `accepted` (paths back to back, `lengths` a tree), through
/// both APIs: returns the error message where both refused.
fn both(
    x: &Inputs,
    (cu, parents): (&[i32], &[i32]),
    slots: &[i32],
    fresh: &Option<Vec<u8>>,
    (lengths, accepted): (&[i32], &[i32]),
) -> [Option<String>; 2] {
    let [q, k, v, a, b, al, dt] = x.c();
    let pool = x.pool.c as *const mlxk_array;
    let (cp, nc, pp, np) = (cu.as_ptr(), cu.len(), parents.as_ptr(), parents.len());
    let (sp, fp) = (slots.as_ptr(), c_fresh(fresh));
    let flags = bools(fresh);
    let s = PoolSlots {
        pool: &x.pool.r,
        slots,
        fresh: flags.as_deref(),
    };
    let cu_nodes: Vec<usize> = cu.iter().map(|&c| c as usize).collect();
    let tree_parents: Vec<Option<usize>> = parents
        .iter()
        .map(|&p| (p >= 0).then_some(p as usize))
        .collect();
    let trees = DraftTrees {
        cu_nodes: &cu_nodes,
        parents: &tree_parents,
    };
    let mut y = null_mut();
    let status = unsafe {
        mlxk_gated_delta_verify_tree_pool(
            q, k, v, a, b, al, dt, pool, cp, nc, pp, np, sp, fp, &mut y,
        )
    };
    let r = x.safe().verify_tree_pool(s, trees).map(|y| vec![y]);
    let verify = agree("mlxk_gated_delta_verify_tree_pool", status, &[y], r);
    let lens: Vec<usize> = lengths.iter().map(|&l| l as usize).collect();
    let paths: Vec<usize> = accepted.iter().map(|&j| j as usize).collect();
    let mut p = null_mut();
    let (lp, ap, na) = (lengths.as_ptr(), accepted.as_ptr(), accepted.len());
    let status = unsafe {
        mlxk_gated_delta_commit_tree_pool(
            k, v, a, b, al, dt, pool, cp, nc, pp, np, sp, fp, lp, ap, na, &mut p,
        )
    };
    let r = x
        .replay(&lens)
        .commit_tree_pool(s, trees, &paths)
        .map(|p| vec![p]);
    let commit = agree("mlxk_gated_delta_commit_tree_pool", status, &[p], r);
    [verify, commit]
}

#[test]
fn tree_calls_equal_the_c_abi_bit_for_bit() {
    let mut rng = Rng::fresh();
    for (case, heads) in [[1, 2, 32, 8], [2, 4, 64, 5], [1, 1, 128, 16]]
        .into_iter()
        .enumerate()
    {
        let trees: Vec<Vec<i32>> = (0..1 + case)
            .map(|_| {
                let (width, depth) = (1 + rng.below(8) as usize, 1 + rng.below(8) as usize);
                random_tree(&mut rng, width, depth)
            })
            .collect();
        let cu = offsets(&trees);
        let parents = trees.concat();
        let total = parents.len();
        let [hk, hv, dk, dv] = heads;
        let dtype = [Dtype::Bfloat16, Dtype::Float32, Dtype::Float16][case];
        let n = trees.len() + 2;
        let x = Inputs::random(&mut rng, [1, total, hk, hv, dk, dv], n, dtype, false);
        let slots = random_slots(&mut rng, trees.len(), n);
        let fresh = rng
            .chance(50)
            .then(|| (0..trees.len()).map(|_| rng.chance(30) as u8).collect());
        let mut lengths = Vec::new();
        let mut accepted = Vec::new();
        for tree in &trees {
            let path = path_to(tree, rng.below(tree.len() as u64) as usize);
            lengths.push(path.len() as i32);
            accepted.extend(path.iter().map(|&j| j as i32));
        }
        let got = both(&x, (&cu, &parents), &slots, &fresh, (&lengths, &accepted));
        assert_eq!(got, [None, None], "trees {trees:?}");
    }
}

#[test]
fn bad_trees_and_paths_are_refused_alike() {
    let mut rng = Rng::fresh();
    let x = Inputs::random(&mut rng, [1, 5, 1, 2, 32, 4], 4, Dtype::Bfloat16, false);
    let (cu, parents, slots) = ([0, 4, 5], [-1, 0, 0, 1, -1], [2, 0]);
    let fresh = None;
    let late = [-1, 0, 3, 1, -1];
    let got = both(&x, (&cu, &late), &slots, &fresh, (&[0, 0], &[]));
    for (which, msg) in ["verify", "commit"].iter().zip(&got) {
        let msg = msg
            .as_deref()
            .unwrap_or_else(|| panic!("{which} accepted a late parent"));
        assert!(msg.contains("parents[2] is 3"), "{which}: {msg}");
    }
    let got = both(&x, (&cu, &parents), &slots, &fresh, (&[2, 0], &[0, 3]));
    assert_eq!(got[0], None);
    let msg = got[1].as_deref().expect("a path that skips a node refused");
    assert!(msg.contains("accepted_paths[1] is node 3"), "{msg}");
    let got = both(&x, (&[0, 4, 6], &parents), &slots, &fresh, (&[0, 0], &[]));
    for msg in &got {
        assert!(
            msg.as_deref()
                .is_some_and(|m| m.contains("cu_nodes[2] is 6")),
            "{msg:?}"
        );
    }
}
