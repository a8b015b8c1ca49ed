//! The tree verify and commit in the misuse suite: their handle arguments (with valid trees),
//! and every host argument refused with a status and a message naming it: offsets, parents,
//! slots, accepted lengths and paths, NULL host arrays, a B other than 1.

use super::*;
use crate::support::tree::{commit_tree, verify_tree, TreeHost};
use std::sync::MutexGuard;

/// Two trees on B = 1, T = 7 tokens (q [1, 7, 1, 32], v [1, 7, 2, 4]): nodes 0..4 with parents
/// -1, 0, 0, 1 in slot 2; nodes 4..7 with -1, -1, 1 in slot 0, on a pool of 4.
struct Trees {
    x: [H; 7],
    pool: H,
    cu: Vec<i32>,
    parents: Vec<i32>,
    slots: Vec<i32>,
}

const VERIFY: &str = "mlxk_gated_delta_verify_tree_pool";
const COMMIT: &str = "mlxk_gated_delta_commit_tree_pool";

/// What a call gets: (cu_nodes, n_cu_nodes), (parents, n_nodes), slots.
type Host<'a> = ((*const i32, usize), (*const i32, usize), *const i32);

/// `host` as the shared tree call takes it (no fresh flags).
fn tree_host(((c, nc), (p, np), s): Host) -> TreeHost {
    TreeHost {
        cu: (c, nc),
        parents: (p, np),
        slots: s,
        fresh: null(),
    }
}

impl Trees {
    /// The process to itself (the lock held), trees on B = 1 and the live handles before.
    fn alone() -> (MutexGuard<'static, ()>, Trees, usize) {
        let lock = serial();
        let t = Trees::new(1);
        (lock, t, live_handles())
    }

    fn new(b: i32) -> Trees {
        let mut rng = Rng::fresh();
        let t = 7;
        let bf = |rng: &mut Rng, shape: &[i32]| {
            let len = shape.iter().product::<i32>() as usize;
            new_bf16(&rng.vec(len, 0.5), shape)
        };
        Trees {
            x: [
                bf(&mut rng, &[b, t, 1, 32]),
                bf(&mut rng, &[b, t, 1, 32]),
                bf(&mut rng, &[b, t, 2, 4]),
                bf(&mut rng, &[b, t, 2]),
                bf(&mut rng, &[b, t, 2]),
                new_f32(&rng.vec(2, 1.0), &[2]),
                new_f32(&rng.vec(2, 1.0), &[2]),
            ],
            pool: new_f32(&rng.vec(4 * 2 * 4 * 32, 0.5), &[4, 2, 4, 32]),
            cu: vec![0, 4, 7],
            parents: vec![-1, 0, 0, 1, -1, -1, 1],
            slots: vec![2, 0],
        }
    }

    fn host(&self) -> Host<'_> {
        (
            (self.cu.as_ptr(), self.cu.len()),
            (self.parents.as_ptr(), self.parents.len()),
            self.slots.as_ptr(),
        )
    }

    /// The verify with these host arrays; the out-parameter must be untouched on failure.
    fn verify(&self, host: Host) -> mlxk_status {
        let mut y = sentinel();
        let st = verify_tree(self.x, self.pool, tree_host(host), &mut y);
        match st {
            MLXK_OK => free(y),
            _ => assert_eq!(y, sentinel(), "{VERIFY}: y written"),
        }
        st
    }

    /// The commit with these host arrays, lengths and paths (`n_accepted` as given).
    fn commit(&self, host: Host, lengths: *const i32, paths: &[i32], n: usize) -> mlxk_status {
        let mut out = sentinel();
        let pp = match paths.is_empty() && n > 0 {
            true => null(),
            false => paths.as_ptr(),
        };
        let st = commit_tree(
            self.x,
            self.pool,
            tree_host(host),
            lengths,
            (pp, n),
            &mut out,
        );
        match st {
            MLXK_OK => free(out),
            _ => assert_eq!(out, sentinel(), "{COMMIT}: pool_out written"),
        }
        st
    }

    fn free(self) {
        for h in self.x {
            free(h);
        }
        free(self.pool);
    }
}

/// Every refusal of `host` by both calls (the commit with an empty path a tree).
#[track_caller]
fn both_refuse(t: &Trees, host: Host, want: mlxk_status, needles: &[&str]) {
    let before = live_handles();
    refused(t.verify(host), want, VERIFY, needles, before);
    let lengths = [0i32; 8];
    refused(
        t.commit(host, lengths.as_ptr(), &[], 0),
        want,
        COMMIT,
        needles,
        before,
    );
}

#[test]
fn tree_offsets_parents_and_slots_are_checked_and_named() {
    let _s = serial();
    let t = Trees::new(1);
    ok(t.verify(t.host()));
    let ((c, nc), (p, np), s) = t.host();
    let bad_cu: [(&[i32], &[&str]); 4] = [
        (&[1, 4, 7], &["cu_nodes[0] is 1", "expected 0"]),
        (&[0, 5, 4, 7], &["cu_nodes[2] is 4", "never decrease"]),
        (&[0, 4, 6], &["cu_nodes[2] is 6", "total_T = 7"]),
        (&[], &["cu_nodes", "n_cu_nodes is 0"]),
    ];
    let three_slots = [2i32, 0, 1];
    for (cu, needles) in bad_cu {
        let slots = match cu.len() {
            4 => three_slots.as_ptr(),
            _ => s,
        };
        both_refuse(
            &t,
            ((cu.as_ptr(), cu.len()), (p, np), slots),
            MLXK_ERR_INVALID_ARGUMENT,
            needles,
        );
    }
    let bad_parents: [(&[i32], &[&str]); 4] = [
        (
            &[-1, 0, 0, 1, -1, -1, 2],
            &["parents[6] is 2", "node 2 of tree 1", "before it"],
        ),
        (
            &[-1, 0, 0, 4, -1, -1, 1],
            &["parents[3] is 4", "node 3 of tree 0"],
        ),
        (&[-1, 0, -2, 1, -1, -1, 1], &["parents[2] is -2", "-1"]),
        (
            &[0, 0, 0, 1, -1, -1, 1],
            &["parents[0] is 0", "node 0 of tree 0"],
        ),
    ];
    for (parents, needles) in bad_parents {
        let host = ((c, nc), (parents.as_ptr(), np), s);
        both_refuse(&t, host, MLXK_ERR_INVALID_ARGUMENT, needles);
    }
    let six = &t.parents[..6];
    let host = ((c, nc), (six.as_ptr(), 6), s);
    both_refuse(
        &t,
        host,
        MLXK_ERR_INVALID_ARGUMENT,
        &["parents", "n_nodes is 6", "(7"],
    );
    for (slots, needles) in [
        ([2, 2], &["slots[1] is 2", "slots[0]", "tree"][..]),
        ([4, 0], &["slots[0] is 4", "N = 4"][..]),
    ] {
        let host = ((c, nc), (p, np), slots.as_ptr());
        both_refuse(&t, host, MLXK_ERR_INVALID_ARGUMENT, needles);
    }
    // NULL host arrays with a count.
    both_refuse(
        &t,
        ((null(), nc), (p, np), s),
        MLXK_ERR_NULL_POINTER,
        &["cu_nodes"],
    );
    both_refuse(
        &t,
        ((c, nc), (null(), np), s),
        MLXK_ERR_NULL_POINTER,
        &["parents"],
    );
    both_refuse(
        &t,
        ((c, nc), (p, np), null()),
        MLXK_ERR_NULL_POINTER,
        &["slots"],
    );
    t.free();
    // The trees are packed along T of one row.
    let t = Trees::new(2);
    both_refuse(
        &t,
        t.host(),
        MLXK_ERR_SHAPE,
        &["B (dimension 0) is 2", "n_nodes"],
    );
    t.free();
}

#[test]
fn accepted_lengths_and_paths_are_checked_and_named() {
    let (_s, t, before) = Trees::alone();
    // Valid: tree 0 accepts 0 → 1 → 3, tree 1 accepts node 1 → 2; or nothing.
    ok(t.commit(t.host(), [3, 2].as_ptr(), &[0, 1, 3, 1, 2], 5));
    ok(t.commit(t.host(), [0, 0].as_ptr(), &[], 0));
    ok(t.commit(t.host(), [1, 1].as_ptr(), &[0, 0], 2));
    // (accepted_lengths, accepted_paths, n_accepted, what the message says)
    type Case<'a> = ([i32; 2], &'a [i32], usize, &'a [&'a str]);
    let cases: [Case; 8] = [
        (
            [5, 0],
            &[0, 1, 3, 0, 0],
            5,
            &["accepted_lengths[0] is 5", "0 to 4"],
        ),
        ([-1, 0], &[], 0, &["accepted_lengths[0] is -1"]),
        (
            [3, 2],
            &[0, 1, 3, 1],
            4,
            &["n_accepted is 4", "accepted_lengths"],
        ),
        (
            [1, 0],
            &[0, 1],
            2,
            &["n_accepted is 2", "sum of accepted_lengths (1)"],
        ),
        (
            [2, 0],
            &[1, 3],
            2,
            &["accepted_paths[0] is node 1 of tree 0", "a root"],
        ),
        (
            [3, 0],
            &[0, 2, 3],
            3,
            &["accepted_paths[2] is node 3", "child of node 2"],
        ),
        (
            [0, 2],
            &[1, 7],
            2,
            &["accepted_paths[1] is 7", "node of tree 1 (0 to 2)"],
        ),
        (
            [0, 2],
            &[2, 1],
            2,
            &["accepted_paths[0] is node 2 of tree 1", "parent is 1"],
        ),
    ];
    for (lengths, paths, n, needles) in cases {
        let st = t.commit(t.host(), lengths.as_ptr(), paths, n);
        refused(st, MLXK_ERR_INVALID_ARGUMENT, COMMIT, needles, before);
    }
    refused(
        t.commit(t.host(), null(), &[0], 1),
        MLXK_ERR_NULL_POINTER,
        COMMIT,
        &["accepted_lengths"],
        before,
    );
    refused(
        t.commit(t.host(), [1, 0].as_ptr(), &[], 1),
        MLXK_ERR_NULL_POINTER,
        COMMIT,
        &["accepted_paths"],
        before,
    );
    t.free();
}

/// The leaves' paths are checked against the memory limit too: one tree of 7 nodes whose three
/// leaves share a chain of 4 (15 path tokens: 2640 bytes of gathered inputs, y and gates) under a
/// limit of 2000 bytes, which the call's own results (1220 bytes) fit.
#[test]
fn the_leaves_paths_count_against_the_memory_limit() {
    let _s = serial();
    let t = Trees::new(1);
    let (cu, parents, slot) = ([0i32, 7], [-1i32, 0, 1, 2, 3, 3, 3], [2i32]);
    let host = ((cu.as_ptr(), 2), (parents.as_ptr(), 7), slot.as_ptr());
    let before = live_handles();
    ok(mlxk_set_memory_limit(2000));
    let st = t.verify(host);
    ok(mlxk_set_memory_limit(0));
    let needles = [
        "the leaves' paths' q and k (internal)",
        "2640 bytes",
        "2000 bytes",
    ];
    refused(st, MLXK_ERR_OUT_OF_MEMORY, VERIFY, &needles, before);
    ok(t.verify(host));
    t.free();
}

#[test]
fn tree_calls_refuse_null_out_parameters() {
    let (_s, t, before) = Trees::alone();
    let host = tree_host(t.host());
    let st = verify_tree(t.x, t.pool, host, null_mut());
    refused(st, MLXK_ERR_NULL_POINTER, VERIFY, &["y"], before);
    let lengths = [0i32, 0];
    let st = commit_tree(t.x, t.pool, host, lengths.as_ptr(), (null(), 0), null_mut());
    refused(st, MLXK_ERR_NULL_POINTER, COMMIT, &["pool_out"], before);
    t.free();
}

/// The tree calls' handle arguments on `p` (B = 1, T = 5; two trees, nodes 0..3 and 3..5)
/// with r's pool of two slots.
pub(super) fn entries(p: &Recurrence, pool: H) -> Vec<Entry> {
    let args = update_args(p, &[("pool", pool)]);
    let (cu, parents, slots) = ([0i32, 3, 5], [-1i32, 0, 0, -1, 0], [1i32, 0]);
    vec![
        Entry::new(
            VERIFY,
            &args,
            outs(move |h, [y]| {
                let [q, k, v, a, b, al, dt, pool] = h[..8].try_into().unwrap();
                let host = TreeHost::of(&cu, &parents, &slots, None);
                verify_tree([q, k, v, a, b, al, dt], pool, host, y)
            }),
        ),
        Entry::new(
            COMMIT,
            &args[1..8],
            outs(move |h, [st]| {
                let [k, v, a, b, al, dt, pool] = h[..7].try_into().unwrap();
                let host = TreeHost::of(&cu, &parents, &slots, None);
                let (lengths, paths) = ([2i32, 2], [0i32, 2, 0, 1]);
                let x = [null_mut(), k, v, a, b, al, dt];
                commit_tree(x, pool, host, lengths.as_ptr(), (paths.as_ptr(), 4), st)
            }),
        ),
    ]
}
