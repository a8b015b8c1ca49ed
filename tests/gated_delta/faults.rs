//! Faults lose nothing (docs/serving.md, "Faults"), through the C ABI: every pool call, with a
//! kept pool and a donated one (freed before the evaluation), under each fault — the memory
//! limit at the call, the node's evaluation raising before its outputs are allocated, its task
//! raising before the kernel runs, the node feeding it (the head split) failing first, a step
//! of a chain failing — leaves every slot as the contract says, bit for bit: the failed call's
//! new pool holds the pool as given, its y reports the failure, no handle leaks, and the same
//! call then gives what a call that never failed gives. Its own binary: the live-handle count
//! and the memory limit are process-wide (every test holds `serial`).

#[path = "../support/mod.rs"]
mod support;

use crate::support::pool::*;
use crate::support::pool::{PoolCall as Call, POOL_CALLS as CALLS};
use crate::support::*;
use mlxkern::capi::live_handles;
use mlxkern::testing::{cpu_kernel_fault_pending, fail_cpu_kernel, Fault};
use std::ptr::{null, null_mut};

/// One call's inputs: a pool of N random states, B rows of T tokens with random slots (a
/// padding row among them), fresh flags and accepted lengths; the head split's inputs for
/// `FromConv`.
struct Case {
    host: Host,
    conv: [H; 9],
    heads: [i32; 3],
    eps: f32,
    n: usize,
    pool0: Vec<f32>,
    slots: Vec<i32>,
    fresh: Vec<u8>,
    accepted: Vec<i32>,
}

impl Case {
    fn random(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype) -> Case {
        let [b, t, hk, hv, dk, dv] = dims;
        let host = Host::random(rng, dims, dtype);
        let n = b + 3;
        let mut slots = random_slots(rng, b, n);
        if slots.iter().all(|&s| s < 0) {
            slots[0] = rng.below(n as u64) as i32;
        }
        Case {
            pool0: rng.vec(n * host.state_len(), 0.5),
            fresh: (0..b).map(|_| (rng.below(3) == 0) as u8).collect(),
            accepted: (0..b).map(|_| rng.below(t as u64 + 1) as i32).collect(),
            conv: from_conv_arrays(rng, dims, dtype, false, false),
            heads: [hk as i32, hv as i32, dv as i32],
            eps: 1e-6 / dk as f32,
            host,
            n,
            slots,
        }
    }

    fn new_pool(&self, values: &[f32]) -> H {
        new_f32(values, &pool_shape(&self.host, self.n))
    }

    /// `which` on `pool`: (status, y, new pool), NULL where the call has none.
    fn call(&self, which: Call, pool: H) -> (mlxk_status, H, H) {
        let x = self.inputs(which);
        let out = self.call_on(which, x, pool);
        free_all(&x);
        out
    }

    /// The arrays of `which` but the pool (the head split's are the case's own).
    fn inputs(&self, which: Call) -> [H; 7] {
        let [b, t, ..] = self.host.dims;
        let rows: Vec<usize> = (0..b).collect();
        let packed = matches!(which, Call::Packed | Call::PackedChunked);
        self.host.arrays(&rows, t, packed)
    }

    /// `which` on its arrays `x` and `pool`: (status, y, new pool), NULL where it has none.
    fn call_on(&self, which: Call, x: [H; 7], pool: H) -> (mlxk_status, H, H) {
        let [b, t, ..] = self.host.dims;
        let [q, k, v, a, bb, al, dt] = x;
        let xc = x.map(|h| h.cast_const());
        let cu: Vec<i32> = (0..=b).map(|i| (i * t) as i32).collect();
        let (sp, fp, n) = (self.slots.as_ptr(), self.fresh.as_ptr(), self.slots.len());
        let (y, p) = (&mut null_mut(), &mut null_mut());
        let status = unsafe {
            match which {
                Call::Update => update_pool_to(xc, pool, &self.slots, fp, null(), y, p),
                Call::UpdateChunked => {
                    pool_update(xc, pool, (&self.slots, fp), null(), Some(16), (y, p))
                }
                Call::Verify => {
                    mlxk_gated_delta_verify_pool(q, k, v, a, bb, al, dt, pool, sp, fp, n, null(), y)
                }
                Call::Packed | Call::PackedChunked => {
                    let chunk = (which == Call::PackedChunked).then_some(0);
                    let with_pool = [q, k, v, a, bb, al, dt, pool].map(|h| h.cast_const());
                    update_packed_to(with_pool, &cu, (sp, fp), chunk, (y, p))
                }
                Call::Commit => mlxk_gated_delta_state_pool(
                    k,
                    v,
                    a,
                    bb,
                    al,
                    dt,
                    pool,
                    sp,
                    fp,
                    self.accepted.as_ptr(),
                    n,
                    p,
                ),
                Call::FromConv => {
                    let [xc, qs, ks, ca, cb, cal, cdt, _, _] = self.conv;
                    let [hk, hv, dv] = self.heads;
                    mlxk_gated_delta_update_from_conv_pool(
                        xc,
                        qs,
                        ks,
                        hk,
                        hv,
                        dv,
                        self.eps,
                        ca,
                        cb,
                        cal,
                        cdt,
                        pool,
                        sp,
                        fp,
                        n,
                        null(),
                        y,
                        p,
                    )
                }
            }
        };
        (status, *y, *p)
    }

    /// The results of `which` on the pool as given, from a call no fault touches: (y bytes,
    /// new pool; the pool as given for a verify).
    fn reference(&self, which: Call) -> (Vec<u8>, Vec<f32>) {
        let pool = self.new_pool(&self.pool0);
        let (status, y, p) = self.call(which, pool);
        ok(status);
        let y_bytes = if which.has_y() { read_bytes(y) } else { vec![] };
        let new_pool = if which.writes() {
            read_f32(p)
        } else {
            self.pool0.clone()
        };
        free_all(
            &[y, p]
                .into_iter()
                .filter(|h| !h.is_null())
                .collect::<Vec<_>>(),
        );
        free(pool);
        (y_bytes, new_pool)
    }

    /// `which` on `pool` (then freed) gives `want` (y bytes, new pool), bit for bit.
    #[track_caller]
    fn again(&self, which: Call, pool: H, (y_ref, pool_ref): (&[u8], &[f32]), what: &str) {
        let (status, y, p) = self.call(which, pool);
        ok(status);
        free(pool);
        if which.has_y() {
            assert!(read_bytes(y) == y_ref, "{what}: y");
            free(y);
        }
        if which.writes() {
            assert!(same_bits(&read_f32(p), pool_ref), "{what}: the pool");
            free(p);
        }
    }

    fn free(self) {
        free_all(
            &self
                .conv
                .into_iter()
                .filter(|h| !h.is_null())
                .collect::<Vec<_>>(),
        );
    }
}

/// Which slots of `after` hold their state of `old` and which that of `new`: panics naming
/// the first slot that holds neither, bit for bit. Returns the count of new slots (a slot
/// equal in both counts as old).
#[track_caller]
fn old_or_new(what: &str, after: &[f32], old: &[f32], new: &[f32], per: usize) -> usize {
    assert_eq!(after.len(), old.len(), "{what}: the pool's size");
    let mut updated = 0;
    for (slot, ((a, o), n)) in after
        .chunks(per)
        .zip(old.chunks(per))
        .zip(new.chunks(per))
        .enumerate()
    {
        if same_bits(a, o) {
            continue;
        }
        assert!(
            same_bits(a, n),
            "{what}: slot {slot} holds neither its old nor its new state"
        );
        updated += 1;
    }
    updated
}

/// Which of a failed call's results is evaluated first.
#[derive(Clone, Copy, Debug)]
enum First {
    Pool,
    Y,
}

/// `which` on `case` with `fault` injected into the node `after` nodes into the evaluation,
/// the pool kept or `donated`, the results evaluated `first` one way: the contract, then the
/// same call on the new pool as a call that never failed.
fn faulted_call(case: &Case, which: Call, fault: Fault, after: usize, donated: bool, first: First) {
    let what =
        format!("{which:?}, {fault:?} after {after} nodes, donated {donated}, {first:?} first");
    let (y_ref, pool_ref) = case.reference(which);
    let live = live_handles();
    let pool = case.new_pool(&case.pool0);
    fail_cpu_kernel(Some((after, fault)));
    let (status, y, p) = case.call(which, pool);
    ok(status);
    if donated {
        free(pool);
    }
    let failing = match (first, which.has_y(), which.writes()) {
        (First::Y, true, _) | (_, true, false) => y,
        _ => p,
    };
    let failed = mlxk_array_eval(failing);
    expect_err(failed, MLXK_ERR_BACKEND, &["injected fault"]);
    assert!(!cpu_kernel_fault_pending(), "{what}: the fault was met");
    // The call failed: y reports it, whichever array was evaluated.
    if which.has_y() {
        let mut byte = [0u8; 1];
        let status = unsafe { mlxk_array_read(y, byte.as_mut_ptr().cast(), 0) };
        expect_err(
            status,
            MLXK_ERR_BACKEND,
            &["failed earlier", "injected fault"],
        );
        free(y);
    }
    // The new pool holds the pool as given: every slot untouched.
    let per = case.host.state_len();
    let next_pool = if which.writes() {
        let after_fault = read_f32(p);
        let updated = old_or_new(&what, &after_fault, &case.pool0, &pool_ref, per);
        assert_eq!(updated, 0, "{what}: slots updated by a failed call");
        p
    } else {
        pool
    };
    if !donated && which.writes() {
        assert!(
            same_bits(&read_f32(pool), &case.pool0),
            "{what}: the kept pool"
        );
        free(pool);
    }
    // The same call again on what the failed one left: the results of a call that never
    // failed, bit for bit.
    case.again(
        which,
        next_pool,
        (&y_ref, &pool_ref),
        &format!("{what}: after the fault"),
    );
    assert_eq!(live_handles(), live, "{what}: handles left behind");
}

#[test]
fn a_pool_call_that_fails_at_evaluation_leaves_every_slot_as_given() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    for (dims, dtype) in [
        ([3, 1, 1, 2, 32, 8], MLXK_DTYPE_BFLOAT16),
        ([2, 5, 2, 4, 64, 16], MLXK_DTYPE_FLOAT32),
        ([4, 3, 1, 1, 128, 4], MLXK_DTYPE_FLOAT16),
    ] {
        let case = Case::random(&mut rng, dims, dtype);
        for which in CALLS {
            for fault in [Fault::AtEval, Fault::InTask] {
                for donated in [false, true] {
                    for first in [First::Pool, First::Y] {
                        // A verify reads its pool only: nothing to donate.
                        if donated && !which.writes() {
                            continue;
                        }
                        for after in 0..=which.nodes_before() {
                            faulted_call(&case, which, fault, after, donated, first);
                        }
                    }
                }
            }
        }
        case.free();
    }
}

#[test]
fn the_memory_limit_refuses_a_pool_call_before_it_builds_anything() {
    let _serial = serial();
    let case = Case::random(&mut Rng::fresh(), [2, 3, 1, 2, 64, 32], MLXK_DTYPE_BFLOAT16);
    let pool_bytes = case.pool0.len() * 4;
    for which in CALLS {
        let (y_ref, pool_ref) = case.reference(which);
        let live = live_handles();
        let pool = case.new_pool(&case.pool0);
        let x = case.inputs(which);
        // Room for y, not for a new pool; a verify writes no pool: room for no y.
        let limit = match which.writes() {
            true => pool_bytes - 1,
            false => 16,
        };
        ok(mlxk_set_memory_limit(limit));
        let (status, y, p) = case.call_on(which, x, pool);
        ok(mlxk_set_memory_limit(0));
        free_all(&x);
        expect_err(status, MLXK_ERR_OUT_OF_MEMORY, &["memory limit"]);
        assert!(
            y.is_null() && p.is_null(),
            "{which:?}: no result on a refusal"
        );
        assert_eq!(live_handles(), live + 1, "{which:?}: only the pool is new");
        assert!(
            same_bits(&read_f32(pool), &case.pool0),
            "{which:?}: the pool as given"
        );
        // The same call under no limit: as if the refused one never happened.
        case.again(which, pool, (&y_ref, &pool_ref), &format!("{which:?}"));
        assert_eq!(live_handles(), live, "{which:?}: handles left behind");
    }
    case.free();
}

/// Two decode steps chained on one donated pool and evaluated once (an engine's way): a fault
/// in the second leaves the first applied and the second not; a fault in the first leaves
/// every slot of either step old or new — never a mix within a step, never NaN.
#[test]
fn a_fault_in_a_chain_of_steps_leaves_each_step_applied_or_not() {
    let _serial = serial();
    let case = Case::random(&mut Rng::fresh(), [3, 1, 1, 2, 32, 8], MLXK_DTYPE_BFLOAT16);
    let per = case.host.state_len();
    let (_, once) = case.reference(Call::Update);
    let twice = {
        let pool = case.new_pool(&once);
        let (status, y, p) = case.call(Call::Update, pool);
        ok(status);
        free(pool);
        let out = read_f32(p);
        free_all(&[y, p]);
        out
    };
    for fault in [Fault::AtEval, Fault::InTask] {
        for failing_step in 0..2 {
            let what = format!("{fault:?} in step {failing_step}");
            let live = live_handles();
            let pool = case.new_pool(&case.pool0);
            fail_cpu_kernel(Some((failing_step, fault)));
            let (status, y1, p1) = case.call(Call::Update, pool);
            ok(status);
            free(pool);
            let (status, y2, p2) = case.call(Call::Update, p1);
            ok(status);
            free(p1);
            expect_err(mlxk_array_eval(p2), MLXK_ERR_BACKEND, &["injected fault"]);
            let left = read_f32(p2);
            if failing_step == 1 {
                let updated = old_or_new(&what, &left, &once, &twice, per);
                assert_eq!(updated, 0, "{what}: the failed step's slots");
            } else {
                // The first step never ran (its node raised at evaluation: reading the second's
                // pool runs it now) or ran and failed (its pool as given).
                let updated = old_or_new(&what, &left, &case.pool0, &once, per);
                let written = case.slots.iter().filter(|&&s| s >= 0).count();
                assert!(
                    updated == 0 || same_bits(&left, &once),
                    "{what}: {updated} of {written}"
                );
            }
            free_all(&[y1, y2, p2]);
            assert_eq!(live_handles(), live, "{what}: handles left behind");
        }
    }
    case.free();
}
