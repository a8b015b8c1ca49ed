//! The tree round of a server: draft trees over random live slots, the tree verify (every
//! node's y against the dense call on its path from the slot's reference copy), then the
//! commit of a random root-to-node path a tree (the slot's copy advanced by the dense call on
//! that path).

use std::ptr::null_mut;

use super::{stack, Form, Seq, Server};
use crate::capi::*;
use crate::support::tree::{commit_tree, offsets, path_to, verify_tree, TreeHost};

impl Seq {
    /// The tokens `tokens`, in that order.
    fn pick(&self, tokens: &[usize]) -> Seq {
        let per = |x: &[f32]| x.len() / self.t.max(1);
        let take = |x: &[f32]| -> Vec<f32> {
            let n = per(x);
            tokens
                .iter()
                .flat_map(|&t| x[t * n..(t + 1) * n].iter().copied())
                .collect()
        };
        Seq {
            t: tokens.len(),
            q: take(&self.q),
            k: take(&self.k),
            v: take(&self.v),
            a: take(&self.a),
            b: take(&self.b),
        }
    }
}

/// A random draft tree of `size` nodes: each node's parent an earlier node or -1 (the slot's
/// state), roots now and then after the first.
fn random_tree(rng: &mut Rng, size: usize) -> Vec<i32> {
    (0..size)
        .map(|j| match j == 0 || rng.chance(0.1) {
            true => -1,
            false => j as i32 - 1 - rng.below(j.min(3)) as i32,
        })
        .collect()
}

impl Server {
    /// Speculative decoding with draft trees: one tree of 0 to 8 nodes per row, verified in
    /// one call, then one accepted path a tree committed.
    pub(super) fn tree(&mut self, rng: &mut Rng) -> Result<(), String> {
        let (d, elem) = (self.d, self.elem);
        let slots = self.batch_slots(rng, 3);
        let trees: Vec<Vec<i32>> = slots
            .iter()
            .map(|_| {
                let size = if rng.chance(0.05) { 0 } else { rng.range(1, 8) };
                random_tree(rng, size)
            })
            .collect();
        let cu = offsets(&trees);
        let parents: Vec<i32> = trees.concat();
        let total = parents.len();
        let seqs: Vec<Seq> = trees
            .iter()
            .map(|t| Seq::random(rng, d, elem, t.len()))
            .collect();
        let refs: Vec<&Seq> = seqs.iter().collect();
        let mut scope = Scope::default();
        let [q, k, v, a, b] = stack(&mut scope, &refs, [1, total], d, elem)?;
        let (al, dt) = (self.a_log, self.dt_bias);
        let x = [q, k, v, a, b, al, dt];
        let host = TreeHost::of(&cu, &parents, &slots, None);
        let mut y = null_mut();
        let status = verify_tree(x, self.pool, host, &mut y);
        check(&format!("tree verify {trees:?}, slots {slots:?}"), status)?;
        scope.keep(y);
        self.count_call(Form::Exact, total);
        self.stats.verify_calls += 1;
        let y_bytes = read_bytes(y)?;
        let tok = d.hv * d.dv * elem.bytes();
        for (i, (&slot, tree)) in slots.iter().zip(&trees).enumerate() {
            let c0 = cu[i] as usize;
            for j in 0..tree.len() {
                let got = &y_bytes[(c0 + j) * tok..(c0 + j + 1) * tok];
                let what = format!("tree {i} node {j} (slot {slot}, parents {tree:?})");
                if slot < 0 {
                    if got.iter().any(|&x| x != 0) {
                        return Err(format!("{what}: a padding tree's y is not zeros"));
                    }
                    continue;
                }
                let path = seqs[i].pick(&path_to(tree, j));
                let start = self.mirror[slot as usize].clone();
                let (y_ref, _) = self.dense(&path, Some(&start), None, Form::Exact)?;
                Self::same_y(got, &y_ref[y_ref.len() - tok..], &what)?;
            }
        }
        // A verify writes nothing.
        self.check_pool()?;

        let paths: Vec<Vec<usize>> = trees
            .iter()
            .map(|t| match t.is_empty() || rng.chance(0.15) {
                true => Vec::new(),
                false => path_to(t, rng.below(t.len())),
            })
            .collect();
        let lengths: Vec<i32> = paths.iter().map(|p| p.len() as i32).collect();
        let accepted: Vec<i32> = paths.iter().flatten().map(|&j| j as i32).collect();
        let mut next = null_mut();
        let picked = (accepted.as_ptr(), accepted.len());
        let status = commit_tree(x, self.pool, host, lengths.as_ptr(), picked, &mut next);
        check(&format!("tree commit {paths:?}, slots {slots:?}"), status)?;
        self.stats.pool_calls += 1;
        self.stats.tokens += accepted.len() as u64;
        for (i, &slot) in slots.iter().enumerate() {
            if slot < 0 || paths[i].is_empty() {
                continue;
            }
            let path = seqs[i].pick(&paths[i]);
            let start = self.mirror[slot as usize].clone();
            let (_, state) = self.dense(&path, Some(&start), None, Form::Exact)?;
            self.mirror[slot as usize] = state;
            self.follow(slot as usize, &path, None, false)?;
        }
        self.swap_and_check(next)
    }
}
