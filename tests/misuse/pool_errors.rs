//! Argument errors of the pool and packed calls: each names the argument and what was
//! expected, leaves the out-parameters untouched and makes no handle.

use crate::support::pool::{pool_update, update_packed_to, update_pool_to};
use crate::support::*;
use std::ptr::{null, null_mut};

/// A small call's handles: q, k `[B, T, 1, 32]`, v `[B, T, 2, 4]`, gates, a pool of `n`.
struct Call {
    x: [H; 7],
    pool: H,
}

impl Call {
    /// The process to itself (the lock held) and a call of `new`.
    fn alone(rng: &mut Rng, b: i32, t: i32, n: i32) -> (std::sync::MutexGuard<'static, ()>, Call) {
        let lock = serial();
        (lock, Call::new(rng, b, t, n))
    }

    fn new(rng: &mut Rng, b: i32, t: i32, n: i32) -> Call {
        let bf = |rng: &mut Rng, shape: &[i32]| {
            let len = shape.iter().product::<i32>() as usize;
            new_bf16(&rng.vec(len, 0.5), shape)
        };
        Call {
            x: [
                bf(rng, &[b, t, 1, 32]),
                bf(rng, &[b, t, 1, 32]),
                bf(rng, &[b, t, 2, 4]),
                bf(rng, &[b, t, 2]),
                bf(rng, &[b, t, 2]),
                new_f32(&rng.vec(2, 1.0), &[2]),
                new_f32(&rng.vec(2, 1.0), &[2]),
            ],
            pool: new_f32(&rng.vec((n * 2 * 4 * 32) as usize, 0.5), &[n, 2, 4, 32]),
        }
    }

    /// mlxk_gated_delta_update_pool with these slots and fresh flags; the out-parameters
    /// must be untouched on failure.
    fn update(&self, pool: H, slots: *const i32, fresh: *const u8, n: usize) -> mlxk_status {
        let [q, k, v, a, b, al, dt] = self.x;
        let sentinel = 0x5a5a as H;
        let (mut y, mut p) = (sentinel, sentinel);
        let (yo, po) = (&mut y as *mut H, &mut p as *mut H);
        let m = null();
        let status = unsafe {
            mlxk_gated_delta_update_pool(q, k, v, a, b, al, dt, pool, slots, fresh, n, m, yo, po)
        };
        if status != MLXK_OK {
            assert_eq!((y, p), (sentinel, sentinel), "out-parameters written");
        } else {
            free(y);
            free(p);
        }
        status
    }

    fn packed(&self, cu: &[i32], slots: &[i32]) -> mlxk_status {
        let [q, k, v, a, b, al, dt] = self.x;
        let (mut y, mut p) = (null_mut(), null_mut());
        let x = [q, k, v, a, b, al, dt, self.pool].map(|h| h.cast_const());
        let rows = (slots.as_ptr(), null());
        let status = update_packed_to(x, cu, rows, None, (&mut y, &mut p));
        if status == MLXK_OK {
            free(y);
            free(p);
        } else {
            assert!(y.is_null() && p.is_null(), "out-parameters written");
        }
        status
    }

    /// mlxk_gated_delta_state_pool on these slots and accepted lengths, one each.
    fn commit(&self, slots: &[i32], lengths: &[i32], out: &mut H) -> mlxk_status {
        let [_, k, v, a, b, al, dt] = self.x;
        let (s, l, n, pool) = (slots.as_ptr(), lengths.as_ptr(), slots.len(), self.pool);
        unsafe { mlxk_gated_delta_state_pool(k, v, a, b, al, dt, pool, s, null(), l, n, out) }
    }

    fn free(self) {
        for h in self.x {
            free(h);
        }
        free(self.pool);
    }
}

#[test]
fn slots_are_checked_and_named() {
    let (_serial, c) = Call::alone(&mut Rng::fresh(), 3, 2, 4);
    let handles = mlxkern::capi::live_handles();
    let p = c.pool;
    expect_err(
        c.update(p, [2, 0, 2].as_ptr(), null(), 3),
        MLXK_ERR_INVALID_ARGUMENT,
        &["slots[2] is 2", "slots[0]"],
    );
    expect_err(
        c.update(p, [0, 4, 1].as_ptr(), null(), 3),
        MLXK_ERR_INVALID_ARGUMENT,
        &["slots[1] is 4", "N = 4"],
    );
    expect_err(
        c.update(p, [0, 1].as_ptr(), null(), 2),
        MLXK_ERR_INVALID_ARGUMENT,
        &["n_slots is 2", "3"],
    );
    expect_err(
        c.update(p, null(), null(), 3),
        MLXK_ERR_NULL_POINTER,
        &["slots"],
    );
    expect_err(
        c.update(p, [0, 1, 2].as_ptr(), null(), usize::MAX),
        MLXK_ERR_INVALID_ARGUMENT,
        &["n_slots"],
    );
    expect_err(
        c.update(null_mut(), [0, 1, 2].as_ptr(), null(), 3),
        MLXK_ERR_NULL_POINTER,
        &["pool"],
    );
    // Several negative slots (padding rows) are fine, as are fresh flags.
    ok(c.update(p, [-1, -1, 3].as_ptr(), [1, 0, 1].as_ptr(), 3));
    ok(c.update(p, [-5, -1, -2].as_ptr(), null(), 3));
    assert_eq!(
        mlxkern::capi::live_handles(),
        handles,
        "a refused call made a handle"
    );
    c.free();
}

#[test]
fn the_pool_is_checked_and_named() {
    let mut rng = Rng::fresh();
    let (_serial, c) = Call::alone(&mut rng, 2, 2, 3);
    let slots = [0, 1];
    for (shape, needles) in [
        (vec![3, 2, 4], vec!["pool", "rank 4", "[N, Hv, Dv, Dk]"]),
        (vec![3, 1, 4, 32], vec!["pool", "Hv"]),
        (vec![3, 2, 5, 32], vec!["pool", "Dv"]),
        (vec![3, 2, 4, 64], vec!["pool", "Dk"]),
    ] {
        let len = shape.iter().product::<i32>() as usize;
        let bad = new_f32(&rng.vec(len, 1.0), &shape);
        expect_err(
            c.update(bad, slots.as_ptr(), null(), 2),
            MLXK_ERR_SHAPE,
            &needles,
        );
        free(bad);
    }
    let bf = new_bf16(&rng.vec(3 * 2 * 4 * 32, 1.0), &[3, 2, 4, 32]);
    expect_err(
        c.update(bf, slots.as_ptr(), null(), 2),
        MLXK_ERR_DTYPE,
        &["pool", "float32"],
    );
    free(bf);
    // The same handle for y and pool_out.
    let [q, k, v, a, b, al, dt] = c.x;
    let pool = c.pool;
    let mut out = null_mut();
    let same = &mut out as *mut H;
    let x = [q, k, v, a, b, al, dt].map(|h| h as *const mlxk_array);
    expect_err(
        update_pool_to(x, pool, &slots, null(), null(), same, same),
        MLXK_ERR_INVALID_ARGUMENT,
        &["y", "pool_out"],
    );
    // A chunk size the chunked form refuses.
    let (mut y, mut p) = (null_mut(), null_mut());
    let st = pool_update(
        x,
        pool,
        (&slots, null()),
        null(),
        Some(17),
        (&mut y, &mut p),
    );
    expect_err(st, MLXK_ERR_INVALID_ARGUMENT, &["chunk_size is 17"]);
    c.free();
}

#[test]
fn packed_offsets_are_checked_and_named() {
    let mut rng = Rng::fresh();
    let (_serial, c) = Call::alone(&mut rng, 1, 7, 4);
    ok(c.packed(&[0, 3, 3, 7], &[2, -1, 0]));
    for (cu, slots, needles) in [
        (vec![1, 3, 7], vec![0, 1], vec!["cu_seqlens[0] is 1"]),
        (
            vec![0, 4, 3, 7],
            vec![0, 1, 2],
            vec!["cu_seqlens[2] is 3", "never decrease"],
        ),
        (
            vec![0, 3, 6],
            vec![0, 1],
            vec!["cu_seqlens[2] is 6", "total_T = 7"],
        ),
        (
            vec![0, 3, 7],
            vec![1, 1],
            vec!["slots[1] is 1", "slots[0]", "sequence"],
        ),
    ] {
        expect_err(c.packed(&cu, &slots), MLXK_ERR_INVALID_ARGUMENT, &needles);
    }
    expect_err(
        c.packed(&[], &[]),
        MLXK_ERR_INVALID_ARGUMENT,
        &["cu_seqlens", "N + 1"],
    );
    c.free();
    // Packed sequences take B = 1.
    let c = Call::new(&mut rng, 2, 3, 4);
    expect_err(
        c.packed(&[0, 3], &[0]),
        MLXK_ERR_SHAPE,
        &["q", "B (dimension 0) is 2", "[1, total_T, H, D]"],
    );
    c.free();
}

#[test]
fn commit_lengths_are_checked_and_named() {
    let (_serial, c) = Call::alone(&mut Rng::fresh(), 2, 3, 3);
    let mut out = null_mut();
    for (lengths, needles) in [
        ([0, 4], vec!["accepted_lengths[1] is 4", "T (3)"]),
        ([-1, 0], vec!["accepted_lengths[0] is -1"]),
    ] {
        expect_err(
            c.commit(&[0, 2], &lengths, &mut out),
            MLXK_ERR_INVALID_ARGUMENT,
            &needles,
        );
        crate::names::names_only_its_parameters("mlxk_gated_delta_state_pool", &last_error());
        assert!(out.is_null());
    }
    // One slot (and so one length) for two batch rows: the message counts them by this call's
    // own parameter, n_slots.
    expect_err(
        c.commit(&[0], &[1], &mut out),
        MLXK_ERR_INVALID_ARGUMENT,
        &["n_slots is 1", "B = 2"],
    );
    crate::names::names_only_its_parameters("mlxk_gated_delta_state_pool", &last_error());
    assert!(out.is_null());
    c.free();
}
