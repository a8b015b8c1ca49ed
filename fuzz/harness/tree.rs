//! Target `tree`: the tree verify and commit (mlxk_gated_delta_verify_tree_pool,
//! mlxk_gated_delta_commit_tree_pool) on small random draft trees: parents valid or not (after
//! their node, below -1), offsets moved, a node count that disagrees with T, slots (valid,
//! negative, past N, named twice), fresh flags, accepted paths (valid, too long, through a node
//! off the chain, past the tree) and path counts that disagree with the lengths. The header's
//! rules give the statuses a call may return. On success: each node's y equals the last y of
//! mlxk_gated_delta_verify_pool on its path, bit for bit (zeros in a padding tree), and the
//! verify leaves the pool as it was; each tree's slot after the commit equals
//! mlxk_gated_delta_state_pool on its path, and slots not named keep their bits. The pool is
//! freed before the commit's result is read half the time (the in-place path).

use std::ptr::{null, null_mut};

use super::*;
use mlxkern::capi::gated_delta::pool::*;
use mlxkern::capi::gated_delta::tree::*;

/// One call's host values: T = the trees' nodes, packed.
struct Call {
    commit: bool,
    heads: [usize; 4], // Hk, Hv, Dk, Dv
    dtype: mlxk_dtype,
    n: usize,
    sizes: Vec<usize>,
    parents: Vec<i32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    a_log: Vec<u8>,
    dt_bias: Vec<u8>,
    pool: Vec<u8>,
    slots: Vec<i32>,
    fresh: Option<Vec<u8>>,
    /// Each tree's accepted path (node indices in the tree).
    paths: Vec<Vec<i32>>,
}

fn floats(fill: &mut Fill, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| (fill.below(2001) as f32 - 1000.0) / 1000.0 * scale)
        .collect()
}

/// The path root → node `j` of a tree with valid parents.
fn path_to(parents: &[i32], j: usize) -> Vec<i32> {
    let mut path = vec![j as i32];
    while parents[*path.last().unwrap() as usize] >= 0 {
        path.push(parents[*path.last().unwrap() as usize]);
    }
    path.reverse();
    path
}

impl Call {
    fn decode(input: &mut Input) -> Call {
        let commit = input.chance(128);
        let hk = input.pick(&[1usize, 2]);
        let heads = [
            hk,
            hk * input.pick(&[1usize, 2]),
            input.pick(&[32usize, 64]),
            input.pick(&[1usize, 3, 4]),
        ];
        let dtype = input.pick(&FLOATS);
        let n = input.pick(&[1usize, 2, 3, 5, 0]);
        let trees = input.pick(&[1usize, 2, 3, 0, 2]);
        let sizes: Vec<usize> = (0..trees).map(|_| input.below(7)).collect();
        let mut parents = Vec::new();
        let mut paths = Vec::new();
        for &size in &sizes {
            let tree: Vec<i32> = (0..size as i32)
                .map(|j| match input.u8() % 32 {
                    0 => j,
                    1 => j + 2,
                    2 => -2,
                    _ => input.below(j as usize + 1) as i32 - 1,
                })
                .collect();
            let valid = tree
                .iter()
                .enumerate()
                .all(|(j, &p)| p >= -1 && p < j as i32);
            let mut path = match (size, valid, input.u8() % 8) {
                (0, ..) | (_, _, 0) | (_, false, _) => Vec::new(),
                _ => path_to(&tree, input.below(size)),
            };
            match input.u8() % 24 {
                0 => path.push(input.below(size + 2) as i32),
                1 if !path.is_empty() => {
                    let at = input.below(path.len());
                    path[at] = input.below(size + 2) as i32;
                }
                _ => {}
            }
            parents.extend(tree);
            paths.push(path);
        }
        let t = parents.len();
        let [_, hv, dk, dv] = heads;
        let mut fill = Fill::new(input.u64());
        let mut slots = Vec::with_capacity(trees);
        for i in 0..trees {
            let s = match input.u8() % 16 {
                0 | 1 => -1 - input.below(3) as i32,
                2 => (n + input.below(3)) as i32,
                3 if i > 0 => slots[input.below(i)],
                _ => ((i + input.below(n.max(1))) % n.max(1)) as i32,
            };
            slots.push(s);
        }
        let fresh = input.chance(128).then(|| {
            (0..trees)
                .map(|_| input.u8().is_multiple_of(3) as u8)
                .collect()
        });
        let unit = |fill: &mut Fill| {
            let mut x = floats(fill, t * hk * dk, 1.0);
            for head in x.chunks_mut(dk) {
                let s = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-3);
                head.iter_mut().for_each(|v| *v /= s);
            }
            x
        };
        let (q, k) = (unit(&mut fill), unit(&mut fill));
        Call {
            commit,
            heads,
            dtype,
            n,
            sizes,
            parents,
            q,
            k,
            v: floats(&mut fill, t * hv * dv, 1.0),
            a: floats(&mut fill, t * hv, 2.0),
            b: floats(&mut fill, t * hv, 2.0),
            a_log: make_data(&mut fill, hv, MLXK_DTYPE_FLOAT32, DataMode::Nice),
            dt_bias: make_data(&mut fill, hv, MLXK_DTYPE_FLOAT32, DataMode::Nice),
            pool: make_data(
                &mut fill,
                n * hv * dv * dk,
                MLXK_DTYPE_FLOAT32,
                DataMode::Nice,
            ),
            slots,
            fresh,
            paths,
        }
    }

    /// Handles for the tokens `tokens` as one row: q, k, v, a, b, a_log, dt_bias.
    fn arrays(&self, tokens: &[usize]) -> [H; 7] {
        let [hk, hv, dk, dv] = self.heads;
        let pick = |x: &[f32], per: usize| -> Vec<u8> {
            tokens
                .iter()
                .flat_map(|&t| x[t * per..(t + 1) * per].to_vec())
                .flat_map(|v| v.to_ne_bytes())
                .collect()
        };
        let tt = tokens.len() as i64;
        let cast = |bytes: Vec<u8>, shape: &[i64]| -> H {
            let f = new_array(&bytes, shape, MLXK_DTYPE_FLOAT32);
            if self.dtype == MLXK_DTYPE_FLOAT32 {
                return f;
            }
            let mut out = null_mut();
            let st = unsafe { mlxk_array_astype(f, self.dtype, &mut out) };
            assert_eq!(st, MLXK_OK, "astype: {}", last_error());
            free_ok(f);
            out
        };
        let (hk, hv, dk, dv) = (hk as i64, hv as i64, dk as i64, dv as i64);
        [
            cast(pick(&self.q, (hk * dk) as usize), &[1, tt, hk, dk]),
            cast(pick(&self.k, (hk * dk) as usize), &[1, tt, hk, dk]),
            cast(pick(&self.v, (hv * dv) as usize), &[1, tt, hv, dv]),
            new_array(
                &pick(&self.a, hv as usize),
                &[1, tt, hv],
                MLXK_DTYPE_FLOAT32,
            ),
            new_array(
                &pick(&self.b, hv as usize),
                &[1, tt, hv],
                MLXK_DTYPE_FLOAT32,
            ),
            new_array(&self.a_log, &[hv], MLXK_DTYPE_FLOAT32),
            new_array(&self.dt_bias, &[hv], MLXK_DTYPE_FLOAT32),
        ]
    }

    /// The rules of the header for the trees, slots and (for the commit) paths.
    fn expect(&self, e: &mut Expect) {
        let bad = |e: &mut Expect, why: String| e.fail(MLXK_ERR_INVALID_ARGUMENT, why);
        let mut named = std::collections::HashSet::new();
        for (i, &s) in self.slots.iter().enumerate() {
            if s >= self.n as i32 {
                bad(e, format!("slots[{i}] = {s} >= N = {}", self.n));
            } else if s >= 0 && !named.insert(s) {
                bad(e, format!("slot {s} named twice"));
            }
        }
        let mut c0 = 0;
        let mut parents_valid = true;
        for (i, &size) in self.sizes.iter().enumerate() {
            for j in 0..size {
                let p = self.parents[c0 + j];
                if p < -1 || p >= j as i32 {
                    bad(e, format!("tree {i} node {j}: parent {p}"));
                    parents_valid = false;
                }
            }
            c0 += size;
        }
        if !self.commit || !parents_valid {
            return;
        }
        let mut c0 = 0;
        for (i, (&size, path)) in self.sizes.iter().zip(&self.paths).enumerate() {
            if path.len() > size {
                bad(
                    e,
                    format!("tree {i}: a path of {} in {size} nodes", path.len()),
                );
            }
            let mut parent = -1;
            for &j in path {
                if j < 0 || j as usize >= size || self.parents[c0 + j as usize] != parent {
                    bad(
                        e,
                        format!("tree {i}: path {path:?} is not a chain from a root"),
                    );
                    break;
                }
                parent = j;
            }
            c0 += size;
        }
    }
}

/// The chain verify (`commit` false: the last token's y) or commit (the new pool) of the
/// tokens `path` from `slot`.
fn chain(c: &Call, path: &[usize], slot: i32, fresh: u8, commit: bool) -> Vec<u8> {
    let [_, hv, dk, dv] = c.heads;
    let x = c.arrays(path);
    let pool_shape = [c.n as i64, hv as i64, dv as i64, dk as i64];
    let pool = new_array(&c.pool, &pool_shape, MLXK_DTYPE_FLOAT32);
    let [q, k, v, a, b, al, dt] = x;
    let mut out = null_mut();
    let len = path.len() as i32;
    let status = unsafe {
        match commit {
            false => mlxk_gated_delta_verify_pool(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                &slot,
                &fresh,
                1,
                null(),
                &mut out,
            ),
            true => mlxk_gated_delta_state_pool(
                k, v, a, b, al, dt, pool, &slot, &fresh, &len, 1, &mut out,
            ),
        }
    };
    assert_eq!(status, MLXK_OK, "the chain reference: {}", last_error());
    let bytes = match commit {
        false => {
            let shape = [1, path.len() as i64, hv as i64, dv as i64];
            let y = check_result("the chain's y", out, &shape, c.dtype);
            y[y.len() - hv * dv * dtype_size(c.dtype)..].to_vec()
        }
        true => check_result("the chain's pool", out, &pool_shape, MLXK_DTYPE_FLOAT32),
    };
    free_ok(out);
    free_ok(pool);
    x.into_iter().for_each(free_ok);
    bytes
}

fn one(input: &mut Input) {
    let c = Call::decode(input);
    let [_, hv, dk, dv] = c.heads;
    let mut e = Expect::new();
    c.expect(&mut e);
    let function = match c.commit {
        false => "mlxk_gated_delta_verify_tree_pool",
        true => "mlxk_gated_delta_commit_tree_pool",
    };
    let t = c.parents.len();
    let mut cu: Vec<i32> = std::iter::once(0)
        .chain(c.sizes.iter().scan(0, |acc, &s| {
            *acc += s as i32;
            Some(*acc)
        }))
        .collect();
    if input.chance(16) {
        let i = if input.chance(128) { 0 } else { cu.len() - 1 };
        cu[i] += 1;
        e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("cu_nodes[{i}] moved"));
    }
    let mut parents = c.parents.clone();
    if input.chance(16) {
        parents.push(-1);
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "n_nodes = T + 1");
    }
    let lengths: Vec<i32> = c.paths.iter().map(|p| p.len() as i32).collect();
    let mut accepted: Vec<i32> = c.paths.concat();
    if c.commit && input.chance(16) {
        accepted.push(0);
        e.fail(
            MLXK_ERR_INVALID_ARGUMENT,
            "n_accepted = the lengths' sum + 1",
        );
    }
    let all: Vec<usize> = (0..t).collect();
    let x = c.arrays(&all);
    let pool_shape = [c.n as i64, hv as i64, dv as i64, dk as i64];
    let pool = new_array(&c.pool, &pool_shape, MLXK_DTYPE_FLOAT32);
    let [q, k, v, a, b, al, dt] = x;
    let (cp, nc, pp, np) = (cu.as_ptr(), cu.len(), parents.as_ptr(), parents.len());
    let (sp, fp) = (
        c.slots.as_ptr(),
        c.fresh.as_ref().map_or(null(), |f| f.as_ptr()),
    );
    let mut out = sentinel();
    let status = unsafe {
        match c.commit {
            false => mlxk_gated_delta_verify_tree_pool(
                q, k, v, a, b, al, dt, pool, cp, nc, pp, np, sp, fp, &mut out,
            ),
            true => mlxk_gated_delta_commit_tree_pool(
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                cp,
                nc,
                pp,
                np,
                sp,
                fp,
                lengths.as_ptr(),
                accepted.as_ptr(),
                accepted.len(),
                &mut out,
            ),
        }
    };
    e.check(function, status);
    x.into_iter().for_each(free_ok);
    if status != MLXK_OK {
        assert!(
            out == sentinel(),
            "{function}: a failure wrote an out-parameter"
        );
        free_ok(pool);
        return;
    }
    let per = hv * dv * dk * 4;
    let tok = hv * dv * dtype_size(c.dtype);
    let fresh_of = |i: usize| c.fresh.as_ref().map_or(0, |f| f[i]);
    if !c.commit {
        let y = check_result("y", out, &[1, t as i64, hv as i64, dv as i64], c.dtype);
        free_ok(out);
        let kept = check_result("pool", pool, &pool_shape, MLXK_DTYPE_FLOAT32);
        assert!(kept == c.pool, "{function}: the verify changed the pool");
        free_ok(pool);
        let mut c0 = 0;
        for (i, &size) in c.sizes.iter().enumerate() {
            for j in 0..size {
                let got = &y[(c0 + j) * tok..(c0 + j + 1) * tok];
                if c.slots[i] < 0 {
                    assert!(
                        got.iter().all(|&x| x == 0),
                        "{function}: padding tree {i}'s y"
                    );
                    continue;
                }
                let tree = &c.parents[c0..c0 + size];
                let path: Vec<usize> = path_to(tree, j).iter().map(|&p| c0 + p as usize).collect();
                let want = chain(&c, &path, c.slots[i], fresh_of(i), false);
                assert!(got == &want[..], "{function}: tree {i} node {j}'s y");
            }
            c0 += size;
        }
        return;
    }
    // The pool freed before the result is read (in place) or kept (a copy).
    if !input.chance(128) {
        free_ok(pool);
    } else {
        let kept = check_result("pool", pool, &pool_shape, MLXK_DTYPE_FLOAT32);
        assert!(
            kept == c.pool,
            "{function}: the pool the caller kept changed"
        );
        free_ok(pool);
    }
    let got = check_result("pool_out", out, &pool_shape, MLXK_DTYPE_FLOAT32);
    free_ok(out);
    let mut c0 = 0;
    for (i, (&size, path)) in c.sizes.iter().zip(&c.paths).enumerate() {
        let s = c.slots[i];
        if s >= 0 {
            let tokens: Vec<usize> = path.iter().map(|&p| c0 + p as usize).collect();
            let want = chain(&c, &tokens, s, fresh_of(i), true);
            let at = s as usize * per;
            assert!(
                got[at..at + per] == want[at..at + per],
                "{function}: tree {i}'s slot"
            );
        }
        c0 += size;
    }
    for s in 0..c.n {
        if !c.slots.contains(&(s as i32)) {
            let at = s * per;
            assert!(
                got[at..at + per] == c.pool[at..at + per],
                "{function}: slot {s} changed"
            );
        }
    }
}

pub fn run(input: &mut Input) {
    for _ in 0..3 {
        one(input);
        if input.exhausted() {
            break;
        }
    }
}
