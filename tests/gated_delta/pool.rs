//! The engine-shaped calls through the C ABI: a pool call equals gathering the slots, the
//! dense call and scattering back, bit for bit; packed prefill equals one call per sequence;
//! verify + commit equals the replay of the accepted tokens; the pool is updated in place;
//! argument errors name the argument.

use crate::support::pool::*;
use crate::support::*;
use std::ptr::{null, null_mut};

/// The dense reference: the rows' states gathered from `pool` (zeros for fresh and padding
/// rows), the dense update (or chunked), and (y, states).
fn dense(
    host: &Host,
    pool: &[f32],
    slots: &[i32],
    fresh: &[u8],
    mask: Option<&[bool]>,
    chunk: Option<i32>,
) -> (Vec<u8>, Vec<f32>) {
    let [b, t, ..] = host.dims;
    let per = host.state_len();
    let mut start = vec![0.0f32; b * per];
    for (row, &slot) in slots.iter().enumerate() {
        if slot >= 0 && fresh[row] == 0 {
            let s = slot as usize;
            start[row * per..(row + 1) * per].copy_from_slice(&pool[s * per..(s + 1) * per]);
        }
    }
    let rows: Vec<usize> = (0..b).collect();
    let x = host.arrays(&rows, t, false);
    let state = new_f32(&start, &pool_shape(host, b));
    let mask_h = mask.map(|m| new_bool(m, &[b as i32, t as i32]));
    let m = mask_h.unwrap_or(null_mut());
    let (mut y, mut s) = (null_mut(), null_mut());
    let [q, k, v, a, bb, al, dt] = x;
    ok(unsafe {
        match chunk {
            None => mlxk_gated_delta_update(q, k, v, a, bb, al, dt, state, m, &mut y, &mut s),
            Some(c) => {
                mlxk_gated_delta_update_chunked(q, k, v, a, bb, al, dt, state, m, c, &mut y, &mut s)
            }
        }
    });
    let out = (read_bytes(y), read_f32(s));
    free_all(&x);
    free_all(&[state, y, s]);
    if let Some(m) = mask_h {
        free(m);
    }
    out
}

/// The pool call on the same inputs: (y, new pool).
#[allow(clippy::too_many_arguments)]
fn pooled(
    host: &Host,
    pool: &[f32],
    n: usize,
    slots: &[i32],
    fresh: Option<&[u8]>,
    mask: Option<&[bool]>,
    chunk: Option<i32>,
) -> (Vec<u8>, Vec<f32>) {
    let [b, t, ..] = host.dims;
    let rows: Vec<usize> = (0..b).collect();
    let x = host.arrays(&rows, t, false);
    let pool_h = new_f32(pool, &pool_shape(host, n));
    let mask_h = mask.map(|m| new_bool(m, &[b as i32, t as i32]));
    let m = mask_h.unwrap_or(null_mut());
    let fresh_p = fresh.map_or(null(), |f| f.as_ptr());
    let (mut y, mut p) = (null_mut(), null_mut());
    let xc = x.map(|h| h.cast_const());
    let out = (&mut y as *mut H, &mut p as *mut H);
    ok(pool_update(xc, pool_h, (slots, fresh_p), m, chunk, out));
    free(pool_h);
    assert_eq!(shape_of(p), pool_shape(host, n));
    let out = (read_bytes(y), read_f32(p));
    free_all(&x);
    free_all(&[y, p]);
    if let Some(m) = mask_h {
        free(m);
    }
    out
}

/// Checks a pool call against the dense reference: rows with a slot give the dense y and put
/// the dense state in their slot; padding rows give y = 0; other slots keep their bits.
#[allow(clippy::too_many_arguments)]
fn check_case(
    rng: &mut Rng,
    dims: [usize; 6],
    dtype: mlxk_dtype,
    n: usize,
    masked: bool,
    with_fresh: bool,
    chunk: Option<i32>,
) {
    let [b, t, _, hv, _, dv] = dims;
    let host = Host::random(rng, dims, dtype);
    let per = host.state_len();
    let pool = rng.vec(n * per, 0.5);
    let slots = random_slots(rng, b, n);
    let fresh: Vec<u8> = (0..b)
        .map(|_| (with_fresh && rng.below(3) == 0) as u8)
        .collect();
    let mask: Option<Vec<bool>> = masked.then(|| (0..b * t).map(|_| rng.below(4) != 0).collect());
    let (y_ref, s_ref) = dense(&host, &pool, &slots, &fresh, mask.as_deref(), chunk);
    let fresh_arg = with_fresh.then_some(&fresh[..]);
    let (y, new_pool) = pooled(&host, &pool, n, &slots, fresh_arg, mask.as_deref(), chunk);
    let what = format!("dims {dims:?} dtype {dtype} N {n} slots {slots:?} fresh {fresh:?} mask {masked} chunk {chunk:?}");
    let y_row = t * hv * dv * elem_size(dtype);
    for (row, &slot) in slots.iter().enumerate() {
        let got = &y[row * y_row..(row + 1) * y_row];
        if slot < 0 {
            assert!(got.iter().all(|&x| x == 0), "padding row {row}'s y: {what}");
        } else {
            assert_eq!(
                got,
                &y_ref[row * y_row..(row + 1) * y_row],
                "row {row}s y: {what}"
            );
            let s = slot as usize;
            assert!(
                same_bits(
                    &new_pool[s * per..(s + 1) * per],
                    &s_ref[row * per..(row + 1) * per]
                ),
                "slot {s} (row {row}): {what}"
            );
        }
    }
    for s in 0..n {
        if !slots.contains(&(s as i32)) {
            assert!(
                same_bits(
                    &new_pool[s * per..(s + 1) * per],
                    &pool[s * per..(s + 1) * per]
                ),
                "slot {s} not named changed: {what}"
            );
        }
    }
}

#[test]
fn a_pool_call_is_gather_dense_call_scatter_bit_for_bit() {
    let mut rng = Rng::fresh();
    let dtypes = [MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32];
    let cases: [([usize; 6], usize); 6] = [
        ([1, 1, 1, 1, 32, 4], 1),
        ([4, 1, 2, 4, 128, 16], 9),
        ([3, 5, 1, 3, 64, 7], 3),
        ([5, 3, 2, 2, 32, 33], 12),
        ([2, 9, 1, 2, 256, 5], 2),
        ([6, 2, 2, 8, 96, 3], 6),
    ];
    for (i, (dims, n)) in cases.into_iter().enumerate() {
        let dtype = dtypes[i % 3];
        for (masked, with_fresh) in [(false, false), (true, true), (false, true)] {
            check_case(&mut rng, dims, dtype, n, masked, with_fresh, None);
        }
    }
}

#[test]
fn a_chunked_pool_call_is_gather_chunked_call_scatter_bit_for_bit() {
    let mut rng = Rng::fresh();
    for (dims, n, chunk) in [
        ([3, 40, 1, 2, 32, 8], 5, 16),
        ([2, 70, 2, 4, 128, 16], 2, 0),
        ([4, 17, 1, 1, 64, 20], 8, 32),
    ] {
        for (masked, with_fresh) in [(false, true), (true, false)] {
            let dtype = MLXK_DTYPE_BFLOAT16;
            check_case(&mut rng, dims, dtype, n, masked, with_fresh, Some(chunk));
        }
    }
}

impl Host {
    /// Handles for rows `rows`, row i's first `lens[i]` tokens, packed as one row.
    fn packed(&self, lens: &[usize]) -> [H; 7] {
        let [_, tt, hk, hv, dk, dv] = self.dims;
        let cut = |x: &[f32], per: usize| -> Vec<f32> {
            lens.iter()
                .enumerate()
                .flat_map(|(r, &l)| x[r * tt * per..(r * tt + l) * per].to_vec())
                .collect()
        };
        let total = lens.iter().sum::<usize>() as i32;
        let (hk, hv, dk, dv) = (hk as i32, hv as i32, dk as i32, dv as i32);
        let qk = (hk * dk) as usize;
        [
            typed(&cut(&self.q, qk), &[1, total, hk, dk], self.dtype),
            typed(&cut(&self.k, qk), &[1, total, hk, dk], self.dtype),
            typed(
                &cut(&self.v, (hv * dv) as usize),
                &[1, total, hv, dv],
                self.dtype,
            ),
            typed(
                &cut(&self.a, hv as usize),
                &[1, total, hv],
                MLXK_DTYPE_BFLOAT16,
            ),
            typed(
                &cut(&self.b, hv as usize),
                &[1, total, hv],
                MLXK_DTYPE_FLOAT32,
            ),
            new_f32(&self.a_log, &[hv]),
            typed(&self.dt_bias, &[hv], MLXK_DTYPE_BFLOAT16),
        ]
    }
}

/// One dense call on sequence `row`'s first `len` tokens from `start` (None: no state).
fn one_sequence(
    host: &Host,
    row: usize,
    len: usize,
    start: Option<&[f32]>,
    chunk: Option<i32>,
) -> (Vec<u8>, Vec<f32>) {
    let x = host.arrays(&[row], len, false);
    let state = start.map(|s| new_f32(s, &pool_shape(host, 1)));
    let st = state.unwrap_or(null_mut());
    let [q, k, v, a, bb, al, dt] = x;
    let (mut y, mut s) = (null_mut(), null_mut());
    ok(unsafe {
        match chunk {
            None => mlxk_gated_delta_update(q, k, v, a, bb, al, dt, st, null(), &mut y, &mut s),
            Some(c) => mlxk_gated_delta_update_chunked(
                q,
                k,
                v,
                a,
                bb,
                al,
                dt,
                st,
                null(),
                c,
                &mut y,
                &mut s,
            ),
        }
    });
    let out = (read_bytes(y), read_f32(s));
    free_all(&x);
    free_all(&[y, s]);
    if let Some(s) = state {
        free(s);
    }
    out
}

#[test]
fn packed_prefill_equals_one_call_per_sequence_bit_for_bit() {
    let mut rng = Rng::fresh();
    for (dims, chunk) in [
        ([5, 70, 2, 4, 64, 9], None),
        ([4, 40, 1, 2, 128, 16], None),
        ([6, 70, 1, 2, 32, 12], Some(16)),
        ([3, 100, 2, 2, 128, 8], Some(0)),
    ] {
        let [n_seq, t, _, hv, _, dv] = dims;
        let dtype = [MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT32][rng.below(2) as usize];
        let host = Host::random(&mut rng, dims, dtype);
        let per = host.state_len();
        // Lengths 0, 1, up to T (past the chunk size), in random order.
        let mut lens: Vec<usize> = (0..n_seq)
            .map(|i| match i {
                0 => 0,
                1 => 1,
                _ => rng.below(t as u64 + 1) as usize,
            })
            .collect();
        lens.rotate_left(rng.below(n_seq as u64) as usize);
        let n = n_seq + 3;
        let pool = rng.vec(n * per, 0.5);
        let slots = random_slots(&mut rng, n_seq, n);
        let fresh: Vec<u8> = (0..n_seq).map(|_| (rng.below(3) == 0) as u8).collect();
        let mut cu = vec![0i32];
        for &l in &lens {
            cu.push(cu.last().unwrap() + l as i32);
        }
        let x = host.packed(&lens);
        let pool_h = new_f32(&pool, &pool_shape(&host, n));
        let (mut y, mut p) = (null_mut(), null_mut());
        let (sp, fp) = (slots.as_ptr(), fresh.as_ptr());
        let [q, k, v, a, bb, al, dt] = x;
        let x_in = [q, k, v, a, bb, al, dt, pool_h].map(|h| h.cast_const());
        ok(update_packed_to(
            x_in,
            &cu,
            (sp, fp),
            chunk,
            (&mut y, &mut p),
        ));
        let total = *cu.last().unwrap();
        assert_eq!(shape_of(y), [1, total, hv as i32, dv as i32]);
        free(pool_h);
        let (y_all, new_pool) = (read_bytes(y), read_f32(p));
        free_all(&x);
        free_all(&[y, p]);
        let tok = hv * dv * elem_size(dtype);
        let what =
            format!("dims {dims:?} lens {lens:?} slots {slots:?} fresh {fresh:?} chunk {chunk:?}");
        for (i, &slot) in slots.iter().enumerate() {
            let got = &y_all[cu[i] as usize * tok..cu[i + 1] as usize * tok];
            if slot < 0 {
                assert!(got.iter().all(|&b| b == 0), "padding sequence {i}: {what}");
                continue;
            }
            let s = slot as usize;
            let start = (fresh[i] == 0).then(|| &pool[s * per..(s + 1) * per]);
            let (y_ref, s_ref) = one_sequence(&host, i, lens[i], start, chunk);
            assert!(got == &y_ref[..], "sequence {i}'s y: {what}");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(&new_pool[s * per..(s + 1) * per]) == bits(&s_ref),
                "sequence {i}'s state: {what}"
            );
        }
        for s in 0..n {
            if !slots.contains(&(s as i32)) {
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert!(
                    bits(&new_pool[s * per..(s + 1) * per]) == bits(&pool[s * per..(s + 1) * per]),
                    "slot {s} not named changed: {what}"
                );
            }
        }
    }
}

#[test]
fn verify_then_commit_equals_the_update_over_the_accepted_tokens() {
    let mut rng = Rng::fresh();
    for dims in [
        [4, 6, 2, 4, 128, 16],
        [3, 9, 1, 3, 64, 5],
        [2, 40, 1, 1, 32, 33],
    ] {
        let [b, t, ..] = dims;
        let host = Host::random(&mut rng, dims, MLXK_DTYPE_BFLOAT16);
        let per = host.state_len();
        let n = b + 2;
        let pool = rng.vec(n * per, 0.5);
        let slots = random_slots(&mut rng, b, n);
        let fresh: Vec<u8> = (0..b).map(|_| (rng.below(4) == 0) as u8).collect();
        let accepted: Vec<i32> = (0..b).map(|_| rng.below(t as u64 + 1) as i32).collect();
        let what = format!("dims {dims:?} slots {slots:?} fresh {fresh:?} accepted {accepted:?}");
        let rows: Vec<usize> = (0..b).collect();
        let x = host.arrays(&rows, t, false);
        let pool_h = new_f32(&pool, &pool_shape(&host, n));
        let [q, k, v, a, bb, al, dt] = x;
        let (sp, fp, ns) = (slots.as_ptr(), fresh.as_ptr(), slots.len());
        // Verify: y of every draft token, the pool only read.
        let mut y = null_mut();
        ok(unsafe {
            mlxk_gated_delta_verify_pool(q, k, v, a, bb, al, dt, pool_h, sp, fp, ns, null(), &mut y)
        });
        let (y_ref, _) = pooled(&host, &pool, n, &slots, Some(&fresh), None, None);
        assert!(read_bytes(y) == y_ref, "verify's y: {what}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&read_f32(pool_h)) == bits(&pool),
            "verify changed the pool: {what}"
        );
        // Commit: the accepted prefix of every row into its slot, in place.
        let mut committed = null_mut();
        ok(unsafe {
            mlxk_gated_delta_state_pool(
                k,
                v,
                a,
                bb,
                al,
                dt,
                pool_h,
                sp,
                fp,
                accepted.as_ptr(),
                ns,
                &mut committed,
            )
        });
        let got = read_f32(committed);
        for (row, &slot) in slots.iter().enumerate() {
            if slot < 0 {
                continue;
            }
            let s = slot as usize;
            let start = (fresh[row] == 0).then(|| &pool[s * per..(s + 1) * per]);
            let (_, s_ref) = one_sequence(&host, row, accepted[row] as usize, start, None);
            assert!(
                bits(&got[s * per..(s + 1) * per]) == bits(&s_ref),
                "row {row}'s committed state: {what}"
            );
        }
        for s in 0..n {
            if !slots.contains(&(s as i32)) {
                assert!(
                    bits(&got[s * per..(s + 1) * per]) == bits(&pool[s * per..(s + 1) * per]),
                    "slot {s} not named changed: {what}"
                );
            }
        }
        free_all(&x);
        free_all(&[pool_h, y, committed]);
    }
}

#[test]
fn a_pool_given_up_before_eval_is_updated_in_its_own_buffer() {
    let mut rng = Rng::fresh();
    let dims = [3, 1, 2, 4, 128, 16];
    let host = Host::random(&mut rng, dims, MLXK_DTYPE_BFLOAT16);
    let per = host.state_len();
    let n = 7;
    let pool0 = rng.vec(n * per, 0.5);
    let slots = [4, -1, 1];
    let rows: Vec<usize> = (0..3).collect();
    let x = host.arrays(&rows, 1, false);
    let [q, k, v, a, bb, al, dt] = x;
    // Decode steps chained: each step frees the old pool before the new one is evaluated.
    let mut pool = new_f32(&pool0, &pool_shape(&host, n));
    let address = mlxkern::testing::data_address(pool);
    assert_ne!(address, 0);
    let (_, expect) = pooled(&host, &pool0, n, &slots, None, None, None);
    let update = |pool: H| {
        let (mut y, mut next) = (null_mut(), null_mut());
        let x = [q, k, v, a, bb, al, dt].map(|h| h as *const mlxk_array);
        ok(update_pool_to(
            x,
            pool,
            &slots,
            null(),
            null(),
            &mut y,
            &mut next,
        ));
        (y, next)
    };
    for step in 0..3 {
        let (y, next) = update(pool);
        free(pool);
        free(y);
        pool = next;
        assert_eq!(
            mlxkern::testing::data_address(pool),
            address,
            "step {step}: the pool moved"
        );
        if step == 0 {
            let got = read_f32(pool);
            assert!(same_bits(&got, &expect));
        }
    }
    // Slots not named keep their bits after every step.
    let got = read_f32(pool);
    for s in [0, 2, 3, 5, 6] {
        assert!(same_bits(
            &got[s * per..(s + 1) * per],
            &pool0[s * per..(s + 1) * per]
        ));
    }
    // A pool the caller keeps is not written: the new pool is a copy.
    let (y, next) = update(pool);
    ok(mlxk_array_eval(next));
    assert_ne!(mlxkern::testing::data_address(next), address);
    assert!(same_bits(&read_f32(pool), &got));
    free_all(&x);
    free_all(&[pool, y, next]);
}
