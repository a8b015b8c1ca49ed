//! The safe API's pool calls (`PoolSlots`: `GatedDelta::update_pool`, `_pool_chunked`,
//! `verify_pool`, `update_packed`, `_packed_chunked`, `StateReplay::commit_pool`,
//! `GatedDeltaFromConv::update_pool`) against the C ABI on the same inputs: results bit for
//! bit, errors with the same status and message naming the argument; the pool updated in
//! place (the same buffer) when the caller drops the old one. The tree verify and commit
//! (`GatedDelta::verify_tree_pool`, `StateReplay::commit_tree_pool`) likewise (`tree`).

#[path = "../support/mod.rs"]
mod support;

mod tree;

use std::ptr::{null, null_mut};

use crate::support::api::*;
use crate::support::*;
use mlxkern::testing::{array_data_address, in_place_updates};
use mlxkern::{
    Array, Dtype, Error, GatedDelta, GatedDeltaFromConv, PoolSlots, SiluRmsHeads, StateReplay,
};

/// One call's q, k, v, a, b, a_log, dt_bias (and mask) as twins; B rows of T tokens.
struct Inputs {
    x: [Twin; 7],
    mask: Option<Twin>,
    pool: Twin,
}

impl Inputs {
    /// `dims` = [B, T, Hk, Hv, Dk, Dv]; a pool of `n` states.
    fn random(rng: &mut Rng, dims: [usize; 6], n: usize, dtype: Dtype, mask: bool) -> Inputs {
        let [b, t, hk, hv, dk, dv] = dims;
        let qk = |rng: &mut Rng, scale: f32| Twin::heads(rng, [b, t, hk, dk], scale, dtype);
        Inputs {
            x: [
                qk(rng, (dk as f32).powf(-0.5)),
                qk(rng, 1.0),
                Twin::random(rng, &[b, t, hv, dv], 1.0, dtype),
                Twin::random(rng, &[b, t, hv], 2.0, Dtype::Bfloat16),
                Twin::random(rng, &[b, t, hv], 2.0, Dtype::Float32),
                Twin::random(rng, &[hv], 1.0, Dtype::Float32),
                Twin::random(rng, &[hv], 1.0, Dtype::Bfloat16),
            ],
            mask: mask.then(|| {
                let m: Vec<bool> = (0..b * t).map(|_| rng.below(4) != 0).collect();
                Twin::bools(&m, &[b, t])
            }),
            pool: Twin::random(rng, &[n, hv, dv, dk], 0.5, Dtype::Float32),
        }
    }

    fn c(&self) -> [*const mlxk_array; 7] {
        self.x.each_ref().map(|t| t.c as *const mlxk_array)
    }

    fn safe(&self) -> GatedDelta<'_> {
        let [q, k, v, a, b, a_log, dt_bias] = self.x.each_ref().map(|t| &t.r);
        GatedDelta {
            q,
            k,
            v,
            a,
            b,
            a_log,
            dt_bias,
            state: None,
            mask: r_opt(&self.mask),
        }
    }

    fn replay<'a>(&'a self, lengths: &'a [usize]) -> StateReplay<'a> {
        let [_, k, v, a, b, a_log, dt_bias] = self.x.each_ref().map(|t| &t.r);
        StateReplay {
            k,
            v,
            a,
            b,
            a_log,
            dt_bias,
            state: None,
            accepted_lengths: lengths,
        }
    }
}

/// `rows` distinct slots below `n`, about a quarter negative (padding rows).
fn random_slots(rng: &mut Rng, rows: usize, n: usize) -> Vec<i32> {
    let mut free_slots: Vec<i32> = (0..n as i32).collect();
    (0..rows)
        .map(|_| match free_slots.is_empty() || rng.below(4) == 0 {
            true => -1 - rng.below(3) as i32,
            false => free_slots.swap_remove(rng.below(free_slots.len() as u64) as usize),
        })
        .collect()
}

/// The fresh flags as the C ABI takes them (NULL: none).
fn c_fresh(fresh: &Option<Vec<u8>>) -> *const u8 {
    fresh.as_ref().map_or(null(), |f| f.as_ptr())
}

fn bools(fresh: &Option<Vec<u8>>) -> Option<Vec<bool>> {
    fresh.as_ref().map(|f| f.iter().map(|&x| x != 0).collect())
}

/// Every dense pool call through both APIs on one set of inputs.
fn dense_calls(x: &Inputs, slots: &[i32], fresh: &Option<Vec<u8>>, lengths: &[usize]) {
    let [q, k, v, a, b, al, dt] = x.c();
    let (m, pool) = (c_opt(&x.mask), x.pool.c as *const mlxk_array);
    let (sp, fp, ns) = (slots.as_ptr(), c_fresh(fresh), slots.len());
    let flags = bools(fresh);
    let s = PoolSlots {
        pool: &x.pool.r,
        slots,
        fresh: flags.as_deref(),
    };
    let pair = |u: mlxkern::PoolUpdate| vec![u.y, u.pool];

    let (mut y, mut p) = (null_mut(), null_mut());
    let status = unsafe {
        mlxk_gated_delta_update_pool(q, k, v, a, b, al, dt, pool, sp, fp, ns, m, &mut y, &mut p)
    };
    assert_eq!(
        agree(
            "mlxk_gated_delta_update_pool",
            status,
            &[y, p],
            x.safe().update_pool(s).map(pair)
        ),
        None
    );

    for chunk in [None, Some(16), Some(64)] {
        let (mut y, mut p) = (null_mut(), null_mut());
        let c = chunk.unwrap_or(0) as i32;
        let status = unsafe {
            mlxk_gated_delta_update_pool_chunked(
                q, k, v, a, b, al, dt, pool, sp, fp, ns, m, c, &mut y, &mut p,
            )
        };
        let r = x.safe().update_pool_chunked(s, chunk).map(pair);
        assert_eq!(
            agree("mlxk_gated_delta_update_pool_chunked", status, &[y, p], r),
            None
        );
    }

    let mut y = null_mut();
    let status =
        unsafe { mlxk_gated_delta_verify_pool(q, k, v, a, b, al, dt, pool, sp, fp, ns, m, &mut y) };
    let r = x.safe().verify_pool(s).map(|y| vec![y]);
    assert_eq!(agree("mlxk_gated_delta_verify_pool", status, &[y], r), None);

    let lens: Vec<i32> = lengths.iter().map(|&n| n as i32).collect();
    let mut p = null_mut();
    let status = unsafe {
        mlxk_gated_delta_state_pool(k, v, a, b, al, dt, pool, sp, fp, lens.as_ptr(), ns, &mut p)
    };
    let r = x.replay(lengths).commit_pool(s).map(|p| vec![p]);
    assert_eq!(agree("mlxk_gated_delta_state_pool", status, &[p], r), None);
}

#[test]
fn dense_pool_calls_equal_the_c_abi_bit_for_bit() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    let cases: [([usize; 6], usize, Dtype); 4] = [
        ([3, 4, 1, 2, 32, 8], 5, Dtype::Bfloat16),
        ([4, 1, 2, 4, 64, 16], 4, Dtype::Float32),
        ([2, 6, 1, 1, 32, 5], 7, Dtype::Float16),
        ([5, 33, 1, 2, 32, 3], 6, Dtype::Bfloat16),
    ];
    for (dims, n, dtype) in cases {
        for (mask, with_fresh) in [(false, false), (true, true), (false, true)] {
            let x = Inputs::random(&mut rng, dims, n, dtype, mask);
            let slots = random_slots(&mut rng, dims[0], n);
            let fresh =
                with_fresh.then(|| (0..dims[0]).map(|_| (rng.below(3) == 0) as u8).collect());
            let lengths: Vec<usize> = (0..dims[0])
                .map(|_| rng.below(dims[1] as u64 + 1) as usize)
                .collect();
            dense_calls(&x, &slots, &fresh, &lengths);
        }
    }
}

#[test]
fn packed_pool_calls_equal_the_c_abi_bit_for_bit() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    for lengths in [vec![5usize, 0, 3, 7], vec![1], vec![2, 40, 1, 0, 17]] {
        let (seqs, total) = (lengths.len(), lengths.iter().sum::<usize>());
        let n = seqs + 2;
        let x = Inputs::random(&mut rng, [1, total, 1, 2, 32, 6], n, Dtype::Bfloat16, false);
        let slots = random_slots(&mut rng, seqs, n);
        let fresh: Option<Vec<u8>> = Some((0..seqs).map(|_| (rng.below(3) == 0) as u8).collect());
        let mut cu = vec![0usize];
        lengths
            .iter()
            .for_each(|&l| cu.push(cu.last().unwrap() + l));
        let cu32: Vec<i32> = cu.iter().map(|&o| o as i32).collect();
        let flags = bools(&fresh);
        let s = PoolSlots {
            pool: &x.pool.r,
            slots: &slots,
            fresh: flags.as_deref(),
        };
        let [q, k, v, a, b, al, dt] = x.c();
        let pool = x.pool.c as *const mlxk_array;
        let pair = |u: mlxkern::PoolUpdate| vec![u.y, u.pool];
        let (c, n, s_ptr, f) = (cu32.as_ptr(), cu32.len(), slots.as_ptr(), c_fresh(&fresh));
        let (mut y, mut p) = (null_mut(), null_mut());
        let status = unsafe {
            mlxk_gated_delta_update_packed(
                q, k, v, a, b, al, dt, pool, c, n, s_ptr, f, &mut y, &mut p,
            )
        };
        let r = x.safe().update_packed(s, &cu).map(pair);
        assert_eq!(
            agree("mlxk_gated_delta_update_packed", status, &[y, p], r),
            None
        );
        for chunk in [None, Some(16)] {
            let (mut y, mut p) = (null_mut(), null_mut());
            let size = chunk.unwrap_or(0) as i32;
            let status = unsafe {
                mlxk_gated_delta_update_packed_chunked(
                    q, k, v, a, b, al, dt, pool, c, n, s_ptr, f, size, &mut y, &mut p,
                )
            };
            let r = x.safe().update_packed_chunked(s, &cu, chunk).map(pair);
            assert_eq!(
                agree("mlxk_gated_delta_update_packed_chunked", status, &[y, p], r),
                None
            );
        }
    }
}

/// The convolution's output and the head split's scales of one layer: x [B, T, 2·Hk·Dk + Hv·Dv].
struct Conv {
    x: Twin,
    q_scale: Twin,
    k_scale: Twin,
    heads: [usize; 3],
}

impl Conv {
    fn random(rng: &mut Rng, b: usize, t: usize, [hk, hv, dk, dv]: [usize; 4]) -> Conv {
        Conv {
            x: Twin::random(rng, &[b, t, 2 * hk * dk + hv * dv], 1.0, Dtype::Bfloat16),
            q_scale: Twin::random(rng, &[dk], 0.2, Dtype::Bfloat16),
            k_scale: Twin::random(rng, &[dk], 0.2, Dtype::Bfloat16),
            heads: [hk, hv, dv],
        }
    }

    fn split(&self, eps: f32) -> SiluRmsHeads<'_> {
        let [key_heads, value_heads, value_width] = self.heads;
        SiluRmsHeads {
            x: &self.x.r,
            q_scale: &self.q_scale.r,
            k_scale: &self.k_scale.r,
            key_heads,
            value_heads,
            value_width,
            eps,
        }
    }
}

#[test]
fn the_update_from_conv_on_a_pool_equals_the_c_abi_bit_for_bit() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    for (b, t, dims, n) in [
        (3, 1, [1, 2, 32, 8], 4),
        (2, 5, [2, 4, 64, 16], 2),
        (4, 3, [1, 1, 128, 5], 9),
    ] {
        let [hk, hv, dk, dv] = dims;
        let conv = Conv::random(&mut rng, b, t, dims);
        let masked = rng.below(2) == 0;
        let x = Inputs::random(&mut rng, [b, t, hk, hv, dk, dv], n, Dtype::Bfloat16, masked);
        let slots = random_slots(&mut rng, b, n);
        let fresh: Option<Vec<u8>> = Some((0..b).map(|_| rng.below(2) as u8).collect());
        let flags = bools(&fresh);
        let eps = 1e-6 / dk as f32;
        let [_, _, _, a, bb, al, dt] = x.c();
        let (mut y, mut p) = (null_mut(), null_mut());
        let status = unsafe {
            mlxk_gated_delta_update_from_conv_pool(
                conv.x.c,
                conv.q_scale.c,
                conv.k_scale.c,
                hk as i32,
                hv as i32,
                dv as i32,
                eps,
                a,
                bb,
                al,
                dt,
                x.pool.c,
                slots.as_ptr(),
                c_fresh(&fresh),
                b,
                c_opt(&x.mask),
                &mut y,
                &mut p,
            )
        };
        let [_, _, _, ra, rb, ral, rdt] = x.x.each_ref().map(|t| &t.r);
        let safe = GatedDeltaFromConv {
            split: conv.split(eps),
            a: ra,
            b: rb,
            a_log: ral,
            dt_bias: rdt,
            state: None,
            mask: r_opt(&x.mask),
        };
        let s = PoolSlots {
            pool: &x.pool.r,
            slots: &slots,
            fresh: flags.as_deref(),
        };
        let r = safe.update_pool(s).map(|u| vec![u.y, u.pool]);
        assert_eq!(
            agree("mlxk_gated_delta_update_from_conv_pool", status, &[y, p], r),
            None
        );
    }
}

#[test]
fn bad_arguments_are_refused_naming_them() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    let x = Inputs::random(&mut rng, [3, 2, 1, 2, 32, 4], 4, Dtype::Bfloat16, false);
    let [q, k, v, a, b, al, dt] = x.c();
    let update = |slots: &[i32], pool: &Twin| -> Option<String> {
        let (mut y, mut p) = (null_mut(), null_mut());
        let status = unsafe {
            mlxk_gated_delta_update_pool(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool.c,
                slots.as_ptr(),
                null(),
                slots.len(),
                null(),
                &mut y,
                &mut p,
            )
        };
        let s = PoolSlots {
            pool: &pool.r,
            slots,
            fresh: None,
        };
        agree(
            "mlxk_gated_delta_update_pool",
            status,
            &[y, p],
            x.safe().update_pool(s).map(|u| vec![u.y, u.pool]),
        )
    };
    let message = update(&[1, 3, 1], &x.pool).expect("duplicate slots refused");
    assert!(
        message.starts_with("slots[2] is 1, which slots[0] names too"),
        "{message}"
    );
    let message = update(&[0, 4, -1], &x.pool).expect("a slot past N refused");
    assert!(
        message.starts_with("slots[1] is 4; expected a pool row below N = 4"),
        "{message}"
    );
    let message = update(&[0, 1], &x.pool).expect("a slot count other than B refused");
    assert!(message.starts_with("slots: n_slots is 2"), "{message}");
    let bf16_pool = Twin::random(&mut rng, &[4, 2, 4, 32], 1.0, Dtype::Bfloat16);
    let message = update(&[0, 1, 2], &bf16_pool).expect("a bfloat16 pool refused");
    assert!(message.starts_with("pool: dtype bfloat16"), "{message}");
    let narrow = Twin::random(&mut rng, &[4, 2, 4, 64], 1.0, Dtype::Float32);
    let message = update(&[0, 1, 2], &narrow).expect("a pool of another Dk refused");
    assert!(message.starts_with("pool:"), "{message}");

    // The accepted lengths of a commit, each in [0, T].
    let lens = [1i32, 3, 0];
    let mut p = null_mut();
    let status = unsafe {
        mlxk_gated_delta_state_pool(
            k,
            v,
            a,
            b,
            al,
            dt,
            x.pool.c,
            [0, 1, 2].as_ptr(),
            null(),
            lens.as_ptr(),
            3,
            &mut p,
        )
    };
    let s = PoolSlots {
        pool: &x.pool.r,
        slots: &[0, 1, 2],
        fresh: None,
    };
    let message = agree(
        "mlxk_gated_delta_state_pool",
        status,
        &[p],
        x.replay(&[1, 3, 0]).commit_pool(s).map(|p| vec![p]),
    );
    assert!(message
        .expect("a length past T refused")
        .contains("accepted_lengths"));

    // Packed offsets: the first must be 0, the last total_T, none decreasing.
    let packed = Inputs::random(&mut rng, [1, 6, 1, 2, 32, 4], 4, Dtype::Bfloat16, false);
    let [q, k, v, a, b, al, dt] = packed.c();
    for (cu, needle) in [
        (vec![1usize, 6], "cu_seqlens[0] is 1"),
        (vec![0, 4, 2, 6], "cu_seqlens[2] is 2"),
        (vec![0, 5], "cu_seqlens[1] is 5"),
    ] {
        let cu32: Vec<i32> = cu.iter().map(|&o| o as i32).collect();
        let slots: Vec<i32> = (0..cu.len() as i32 - 1).collect();
        let (mut y, mut p) = (null_mut(), null_mut());
        let status = unsafe {
            mlxk_gated_delta_update_packed(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                packed.pool.c,
                cu32.as_ptr(),
                cu32.len(),
                slots.as_ptr(),
                null(),
                &mut y,
                &mut p,
            )
        };
        let s = PoolSlots {
            pool: &packed.pool.r,
            slots: &slots,
            fresh: None,
        };
        let r = packed
            .safe()
            .update_packed(s, &cu)
            .map(|u| vec![u.y, u.pool]);
        let message = agree("mlxk_gated_delta_update_packed", status, &[y, p], r)
            .expect("bad offsets refused");
        assert!(message.starts_with(needle), "{message}");
    }

    // The safe API's own checks: fresh flags of another count, a state beside the pool, a mask
    // on packed sequences, chunk_size 0.
    let s = PoolSlots {
        pool: &x.pool.r,
        slots: &[0, 1, 2],
        fresh: Some(&[true, false]),
    };
    let err = x.safe().update_pool(s).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_))
            && err.to_string().starts_with("fresh: 2 flags for 3 slots"),
        "{err}"
    );
    let s = PoolSlots {
        pool: &x.pool.r,
        slots: &[0, 1, 2],
        fresh: None,
    };
    let state = Array::zeros(&[3, 2, 4, 32], Dtype::Float32).unwrap();
    let with_state = GatedDelta {
        state: Some(&state),
        ..x.safe()
    };
    let err = with_state.update_pool(s).unwrap_err();
    assert!(
        matches!(err, Error::InvalidArgument(_)) && err.to_string().starts_with("state:"),
        "{err}"
    );
    let replay = StateReplay {
        state: Some(&state),
        ..x.replay(&[1, 1, 1])
    };
    let err = replay.commit_pool(s).unwrap_err();
    assert!(err.to_string().starts_with("state:"), "{err}");
    let err = x.safe().update_pool_chunked(s, Some(0)).unwrap_err();
    assert!(err.to_string().starts_with("chunk_size is 0"), "{err}");
    let mask = Array::from_slice(&[true; 6], &[1, 6]).unwrap();
    let s = PoolSlots {
        pool: &packed.pool.r,
        slots: &[0],
        fresh: None,
    };
    let err = GatedDelta {
        mask: Some(&mask),
        ..packed.safe()
    }
    .update_packed(s, &[0, 6])
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("mask: packed sequences take no mask"),
        "{err}"
    );
}

#[test]
fn the_pool_is_updated_in_place_when_the_old_one_is_dropped() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    let (n, b, t, hv, dk, dv) = (6, 3, 4, 2, 32, 8);
    let x = Inputs::random(&mut rng, [b, t, 1, hv, dk, dv], 1, Dtype::Bfloat16, false);
    let mut pool = Array::from_slice(&rng.vec(n * hv * dv * dk, 0.5), &[n, hv, dv, dk]).unwrap();
    let address = array_data_address(&pool);
    assert_ne!(address, 0);
    let slots = [4, -1, 1];
    let fresh = [true, false, false];
    let before = in_place_updates();
    // Exact, chunked, packed and commit steps, each replacing the pool before evaluation.
    for step in 0..4 {
        let s = PoolSlots {
            pool: &pool,
            slots: &slots,
            fresh: (step == 0).then_some(&fresh[..]),
        };
        pool = match step {
            0 => x.safe().update_pool(s).unwrap().pool,
            1 => x.safe().update_pool_chunked(s, Some(16)).unwrap().pool,
            2 => x.replay(&[2, 0, 4]).commit_pool(s).unwrap(),
            _ => {
                let one =
                    Inputs::random(&mut rng, [1, 5, 1, hv, dk, dv], 1, Dtype::Bfloat16, false);
                let s = PoolSlots {
                    slots: &[1, 4],
                    ..s
                };
                one.safe().update_packed(s, &[0, 2, 5]).unwrap().pool
            }
        };
        assert_eq!(
            array_data_address(&pool),
            address,
            "step {step}: the pool moved"
        );
    }
    assert_eq!(
        in_place_updates() - before,
        4,
        "steps that updated the pool in place"
    );

    // A pool still held elsewhere is copied, and the copy held keeps its bits.
    let kept = pool.try_clone().unwrap();
    let bits = kept.to_vec::<f32>().unwrap();
    let out = x
        .safe()
        .update_pool(PoolSlots {
            pool: &pool,
            slots: &slots,
            fresh: None,
        })
        .unwrap();
    drop(pool);
    assert_ne!(array_data_address(&out.pool), array_data_address(&kept));
    assert_eq!(kept.to_vec::<f32>().unwrap(), bits);
    let new_bits = out.pool.to_vec::<f32>().unwrap();
    let per = hv * dv * dk;
    for slot in [0, 2, 3, 5] {
        assert_eq!(
            new_bits[slot * per..(slot + 1) * per],
            bits[slot * per..(slot + 1) * per],
            "slot {slot}"
        );
    }
    assert_ne!(new_bits[4 * per..5 * per], bits[4 * per..5 * per]);
}
