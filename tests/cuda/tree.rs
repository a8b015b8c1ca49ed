//! The tree verify and commit on MLX CUDA against the CPU's (tests/cuda/main.rs runs them): random
//! trees (a chain, a star, shared prefixes, several trees with a padding one), with the in-place
//! pool launch and with the written rows and MLX's scatter. With g and beta from MLX's CPU ops
//! the GPU's y and new pool equal the CPU's bit for bit; with the kernel's own gates within
//! `gate_bound`. On the GPU each node's y also equals the last y of the chain verify of its path,
//! and each tree's committed slot the chain commit of its path, bit for bit.

use super::pool::against_the_cpu;
use super::*;
use crate::support::free_all;
use crate::support::pool::{pool_shape, random_slots, Host};
use crate::support::tree::{
    chain, commit_tree, offsets, path_to, random_tree, verify_tree, TreeHost,
};
use std::ptr::null;

/// One call's trees on random inputs and a pool of `n`.
struct TreeCall {
    host: Host,
    x: [H; 7],
    pool: H,
    cu: Vec<i32>,
    parents: Vec<i32>,
    trees: Vec<Vec<i32>>,
    slots: Vec<i32>,
    fresh: Vec<u8>,
}

impl TreeCall {
    fn random(
        rng: &mut Rng,
        trees: Vec<Vec<i32>>,
        heads: [usize; 4],
        n: usize,
        dtype: mlxk_dtype,
    ) -> Self {
        let [hk, hv, dk, dv] = heads;
        let cu = offsets(&trees);
        let parents = trees.concat();
        let total = parents.len();
        let host = Host::random(rng, [1, total, hk, hv, dk, dv], dtype);
        let x = host.arrays(&[0], total, false);
        let pool = new_f32(&rng.vec(n * host.state_len(), 0.5), &pool_shape(&host, n));
        let slots = random_slots(rng, trees.len(), n);
        let fresh = (0..trees.len())
            .map(|_| (rng.below(4) == 0) as u8)
            .collect();
        TreeCall {
            host,
            x,
            pool,
            cu,
            parents,
            trees,
            slots,
            fresh,
        }
    }

    /// The tree arrays as the C calls take them.
    fn tree_host(&self) -> TreeHost {
        TreeHost::of(&self.cu, &self.parents, &self.slots, Some(&self.fresh))
    }

    fn verify(&self) -> H {
        let mut y = null_mut();
        ok(verify_tree(self.x, self.pool, self.tree_host(), &mut y));
        ok(mlxk_array_eval(y));
        y
    }

    fn commit(&self, lengths: &[i32], accepted: &[i32]) -> H {
        let mut p = null_mut();
        let (host, paths) = (self.tree_host(), (accepted.as_ptr(), accepted.len()));
        ok(commit_tree(
            self.x,
            self.pool,
            host,
            lengths.as_ptr(),
            paths,
            &mut p,
        ));
        ok(mlxk_array_eval(p));
        p
    }

    /// The chain verify (its y) or commit (the new pool) of the tokens `path` from tree i's slot.
    fn chain(&self, i: usize, path: &[usize], commit: bool) -> H {
        let one = self.host.tokens(path);
        let x = one.arrays(&[0], path.len(), false);
        let [q, k, v, a, b, al, dt] = x;
        let (slot, fresh, len) = (&self.slots[i], &self.fresh[i], path.len() as i32);
        let mut out = null_mut();
        ok(unsafe {
            match commit {
                false => mlxk_gated_delta_verify_pool(
                    q,
                    k,
                    v,
                    a,
                    b,
                    al,
                    dt,
                    self.pool,
                    slot,
                    fresh,
                    1,
                    null(),
                    &mut out,
                ),
                true => mlxk_gated_delta_state_pool(
                    k, v, a, b, al, dt, self.pool, slot, fresh, &len, 1, &mut out,
                ),
            }
        });
        ok(mlxk_array_eval(out));
        free_all(&x);
        out
    }

    fn free(self) {
        free_all(&self.x);
        free(self.pool);
    }
}

fn tree_case(rng: &mut Rng, trees: Vec<Vec<i32>>, heads: [usize; 4], n: usize, dtype: mlxk_dtype) {
    let c = TreeCall::random(rng, trees, heads, n, dtype);
    let [_, hv, dk, dv] = heads;
    let label = format!(
        "tree verify {} trees {:?} Hk={} Hv={hv} Dk={dk} Dv={dv} N={n} slots {:?} fresh {:?}",
        dtype_name(dtype),
        c.trees,
        heads[0],
        c.slots,
        c.fresh
    );
    against_the_cpu(&label, dtype, &["y"], || vec![c.verify()]);
    // On the GPU: every node's y is the chain verify's of its path.
    on_gpu(true);
    let y = read_bytes(c.verify());
    let tok = y.len() / c.parents.len().max(1);
    for (i, tree) in c.trees.iter().enumerate() {
        if c.slots[i] < 0 {
            continue;
        }
        let c0 = c.cu[i] as usize;
        for j in 0..tree.len() {
            let path: Vec<usize> = path_to(tree, j).iter().map(|&p| c0 + p).collect();
            let h = c.chain(i, &path, false);
            let want = read_bytes(h);
            free(h);
            assert!(
                want[want.len() - tok..] == y[(c0 + j) * tok..(c0 + j + 1) * tok],
                "{label}: node {j} of tree {i} on the GPU vs its chain verify"
            );
        }
    }
    // The commit of a random path a tree.
    let (mut lengths, mut accepted, mut paths) = (Vec::new(), Vec::new(), Vec::new());
    for (i, tree) in c.trees.iter().enumerate() {
        let path = match tree.is_empty() {
            true => Vec::new(),
            false => path_to(tree, rng.below(tree.len() as u64) as usize),
        };
        lengths.push(path.len() as i32);
        accepted.extend(path.iter().map(|&p| p as i32));
        paths.push(
            path.iter()
                .map(|&p| c.cu[i] as usize + p)
                .collect::<Vec<usize>>(),
        );
    }
    let got = c.commit(&lengths, &accepted);
    let per = hv * dv * dk * 4;
    let pool = read_bytes(got);
    free(got);
    for (i, path) in paths.iter().enumerate() {
        if c.slots[i] < 0 {
            continue;
        }
        let h = c.chain(i, path, true);
        let want = read_bytes(h);
        free(h);
        let at = c.slots[i] as usize * per;
        assert!(
            want[at..at + per] == pool[at..at + per],
            "{label}: tree {i}'s commit on the GPU"
        );
    }
    on_gpu(false);
    println!(
        "PASS: {label}: every node and commit on the GPU equal to its chain call, bit for bit"
    );
    let label = format!("tree commit {} lengths {lengths:?}", dtype_name(dtype));
    against_the_cpu(&label, dtype, &["pool"], || {
        vec![c.commit(&lengths, &accepted)]
    });
    c.free();
}

/// Every tree case (tests/cuda/main.rs calls it on a CUDA machine), with the in-place launch and
/// with the written rows and MLX's scatter.
pub fn tree_calls_match_the_cpu(rng: &mut Rng) {
    use mlxkern::testing::pool_in_place;
    let (bf16, f16, f32) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32);
    let star: Vec<i32> = std::iter::once(-1)
        .chain(std::iter::repeat_n(0, 7))
        .collect();
    for mode in [None, Some(false)] {
        pool_in_place(mode);
        let shared = vec![random_tree(rng, 4, 4), chain(3)];
        tree_case(rng, shared, [16, 32, 128, 128], 6, bf16);
        tree_case(
            rng,
            vec![chain(8), star.clone(), vec![-1]],
            [2, 4, 64, 24],
            5,
            f16,
        );
        let many: Vec<Vec<i32>> = (0..4).map(|_| random_tree(rng, 8, 8)).collect();
        tree_case(rng, many, [1, 2, 32, 16], 6, f32);
    }
    pool_in_place(None);
}
