//! Speculative trees through the C ABI: every node's y from the tree verify equals the last y of
//! a chain verify (`mlxk_gated_delta_verify_pool`) of its path, bit for bit; the commit of a
//! path equals the chain commit (`mlxk_gated_delta_state_pool`) of that path; the pool is read
//! only by the verify and written in place by the commit.

use crate::support::pool::*;
use crate::support::tree::*;
use crate::support::*;
use std::ptr::{null, null_mut};

/// The chain verify of tokens `path` (indices into the host's row) from `slot` (`fresh`): the
/// last token's y.
fn chain_y(host: &Host, pool: H, path: &[usize], slot: i32, fresh: u8) -> Vec<u8> {
    let chain = host.tokens(path);
    let x = chain.arrays(&[0], path.len(), false);
    let [q, k, v, a, bb, al, dt] = x;
    let mut y = null_mut();
    ok(unsafe {
        mlxk_gated_delta_verify_pool(
            q,
            k,
            v,
            a,
            bb,
            al,
            dt,
            pool,
            &slot,
            &fresh,
            1,
            null(),
            &mut y,
        )
    });
    let bytes = read_bytes(y);
    free_all(&x);
    free(y);
    let tok = bytes.len() / path.len();
    bytes[bytes.len() - tok..].to_vec()
}

/// The chain commit of tokens `path` from `slot` (`fresh`): the new pool.
fn chain_commit(host: &Host, pool: H, path: &[usize], slot: i32, fresh: u8) -> Vec<f32> {
    let chain = host.tokens(path);
    let x = chain.arrays(&[0], path.len(), false);
    let [_, k, v, a, bb, al, dt] = x;
    let mut out = null_mut();
    let len = path.len() as i32;
    ok(unsafe {
        mlxk_gated_delta_state_pool(k, v, a, bb, al, dt, pool, &slot, &fresh, &len, 1, &mut out)
    });
    let got = read_f32(out);
    free_all(&x);
    free(out);
    got
}

/// One call on `trees` (packed) in distinct random slots: y of every node against the chain
/// verifies, then a random path a tree committed against the chain commits.
fn check_trees(rng: &mut Rng, trees: &[Vec<i32>], heads: [usize; 4], dtype: mlxk_dtype) {
    let [hk, hv, dk, dv] = heads;
    let cu = offsets(trees);
    let total = *cu.last().unwrap() as usize;
    let parents: Vec<i32> = trees.concat();
    let host = Host::random(rng, [1, total, hk, hv, dk, dv], dtype);
    let per = host.state_len();
    let n = trees.len() + 2;
    let pool = rng.vec(n * per, 0.5);
    let slots = random_slots(rng, trees.len(), n);
    let fresh: Vec<u8> = (0..trees.len()).map(|_| rng.chance(25) as u8).collect();
    let what =
        format!("trees {trees:?} heads {heads:?} dtype {dtype} slots {slots:?} fresh {fresh:?}");
    let x = host.arrays(&[0], total, false);
    let pool_h = new_f32(&pool, &pool_shape(&host, n));
    let tree = TreeHost::of(&cu, &parents, &slots, Some(&fresh));
    let mut y = null_mut();
    ok(verify_tree(x, pool_h, tree, &mut y));
    assert_eq!(
        shape_of(y),
        [1, total as i32, hv as i32, dv as i32],
        "{what}"
    );
    let y_all = read_bytes(y);
    let tok = hv * dv * elem_size(dtype);
    assert!(
        same_bits(&read_f32(pool_h), &pool),
        "the verify wrote the pool: {what}"
    );
    for (i, tree) in trees.iter().enumerate() {
        let c0 = cu[i] as usize;
        for j in 0..tree.len() {
            let got = &y_all[(c0 + j) * tok..(c0 + j + 1) * tok];
            if slots[i] < 0 {
                assert!(
                    got.iter().all(|&b| b == 0),
                    "padding tree {i} node {j}: {what}"
                );
                continue;
            }
            let path: Vec<usize> = path_to(tree, j).iter().map(|&p| c0 + p).collect();
            let want = chain_y(&host, pool_h, &path, slots[i], fresh[i]);
            assert!(
                got == &want[..],
                "tree {i} node {j} (path {path:?}): {what}"
            );
        }
    }
    // A random accepted path a tree (now and then none).
    let mut lengths = Vec::new();
    let mut accepted = Vec::new();
    for tree in trees {
        let path = match tree.is_empty() || rng.chance(15) {
            true => Vec::new(),
            false => path_to(tree, rng.below(tree.len() as u64) as usize),
        };
        lengths.push(path.len() as i32);
        accepted.extend(path.iter().map(|&p| p as i32));
    }
    let mut committed = null_mut();
    let paths = (accepted.as_ptr(), accepted.len());
    ok(commit_tree(
        x,
        pool_h,
        tree,
        lengths.as_ptr(),
        paths,
        &mut committed,
    ));
    let got = read_f32(committed);
    let mut at = 0;
    for (i, &slot) in slots.iter().enumerate() {
        let len = lengths[i] as usize;
        let path: Vec<usize> = accepted[at..at + len]
            .iter()
            .map(|&p| cu[i] as usize + p as usize)
            .collect();
        at += len;
        if slot < 0 {
            continue;
        }
        let s = slot as usize;
        let want = chain_commit(&host, pool_h, &path, slot, fresh[i]);
        assert!(
            same_bits(&got[s * per..(s + 1) * per], &want[s * per..(s + 1) * per]),
            "tree {i}'s commit of {path:?}: {what}"
        );
    }
    for s in 0..n {
        if !slots.contains(&(s as i32)) {
            assert!(
                same_bits(&got[s * per..(s + 1) * per], &pool[s * per..(s + 1) * per]),
                "slot {s} not named changed: {what}"
            );
        }
    }
    free_all(&x);
    free_all(&[pool_h, y, committed]);
}

const HEADS: [[usize; 4]; 4] = [
    [1, 1, 32, 4],
    [2, 4, 64, 8],
    [1, 2, 128, 16],
    [2, 2, 256, 5],
];
const DTYPES: [mlxk_dtype; 3] = [MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32];

#[test]
fn each_node_is_the_chain_verify_of_its_path_on_random_trees() {
    let mut rng = Rng::fresh();
    for case in 0..12 {
        let n_trees = 1 + rng.below(3) as usize;
        let trees: Vec<Vec<i32>> = (0..n_trees)
            .map(|_| {
                let width = 1 + rng.below(8) as usize;
                let depth = 1 + rng.below(8) as usize;
                random_tree(&mut rng, width, depth)
            })
            .collect();
        check_trees(&mut rng, &trees, HEADS[case % 4], DTYPES[case % 3]);
    }
}

#[test]
fn single_nodes_chains_stars_and_empty_trees() {
    let mut rng = Rng::fresh();
    let star: Vec<i32> = std::iter::once(-1)
        .chain(std::iter::repeat_n(0, 7))
        .collect();
    let roots = vec![-1; 5];
    let shapes: [Vec<Vec<i32>>; 6] = [
        vec![vec![-1]],
        vec![chain(8)],
        vec![chain(1), chain(8), vec![-1]],
        vec![star.clone(), roots],
        vec![Vec::new(), chain(3), Vec::new()],
        vec![
            random_tree(&mut rng, 8, 8),
            random_tree(&mut rng, 1, 8),
            star,
        ],
    ];
    for (i, trees) in shapes.iter().enumerate() {
        check_trees(&mut rng, trees, HEADS[i % 4], DTYPES[i % 3]);
    }
}

#[test]
fn trees_without_nodes_give_an_empty_y_and_leave_the_pool() {
    let mut rng = Rng::fresh();
    check_trees(
        &mut rng,
        &[Vec::new(), Vec::new()],
        HEADS[1],
        MLXK_DTYPE_BFLOAT16,
    );
}

#[test]
fn a_commit_given_the_pool_writes_the_slots_in_its_buffer() {
    let mut rng = Rng::fresh();
    let trees = [random_tree(&mut rng, 3, 4), chain(4)];
    let cu = offsets(&trees);
    let total = *cu.last().unwrap() as usize;
    let parents: Vec<i32> = trees.concat();
    let host = Host::random(&mut rng, [1, total, 1, 2, 32, 8], MLXK_DTYPE_BFLOAT16);
    let per = host.state_len();
    let n = 5;
    let pool0 = rng.vec(n * per, 0.5);
    let slots = [3, 0];
    let x = host.arrays(&[0], total, false);
    let mut pool = new_f32(&pool0, &pool_shape(&host, n));
    let address = mlxkern::testing::data_address(pool);
    let path0 = path_to(&trees[0], trees[0].len() - 1);
    let lengths = [path0.len() as i32, 2];
    let accepted: Vec<i32> = path0.iter().map(|&p| p as i32).chain([0, 1]).collect();
    let want0 = chain_commit(&host, pool, &path0, 3, 0);
    let path1: Vec<usize> = vec![cu[1] as usize, cu[1] as usize + 1];
    let want1 = chain_commit(&host, pool, &path1, 0, 0);
    let mut next = null_mut();
    let tree = TreeHost::of(&cu, &parents, &slots, None);
    let paths = (accepted.as_ptr(), accepted.len());
    ok(commit_tree(
        x,
        pool,
        tree,
        lengths.as_ptr(),
        paths,
        &mut next,
    ));
    free(pool);
    pool = next;
    let got = read_f32(pool);
    assert_eq!(
        mlxkern::testing::data_address(pool),
        address,
        "the pool moved"
    );
    assert!(same_bits(&got[3 * per..4 * per], &want0[3 * per..4 * per]));
    assert!(same_bits(&got[..per], &want1[..per]));
    for s in [1, 2, 4] {
        assert!(same_bits(
            &got[s * per..(s + 1) * per],
            &pool0[s * per..(s + 1) * per]
        ));
    }
    free_all(&x);
    free(pool);
}
