//! Target `pool`: the pool and packed calls (mlxk_gated_delta_update_pool, its chunked form,
//! mlxk_gated_delta_verify_pool, mlxk_gated_delta_update_packed and its chunked form,
//! mlxk_gated_delta_state_pool) on small random dims with random slots (valid, negative,
//! past N, named twice), fresh flags, counts that disagree with B, sequence offsets (valid or
//! not) and accepted lengths (valid or not). The header's rules give the statuses a call may
//! return. On success: the documented shapes, and each row's y and state equal the dense call
//! on that row alone from its slot's state (zeros when fresh), bit for bit; slots not named
//! keep their bits; a verify leaves the pool as it was. The pool is freed before the result is
//! read half the time (the in-place path) and kept otherwise (the copy).

use std::ptr::{null, null_mut};

use super::*;
use mlxkern::capi::gated_delta::pool::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Update,
    Chunked,
    Verify,
    Packed,
    PackedChunked,
    Commit,
}

impl Mode {
    fn function(self) -> &'static str {
        match self {
            Mode::Update => "mlxk_gated_delta_update_pool",
            Mode::Chunked => "mlxk_gated_delta_update_pool_chunked",
            Mode::Verify => "mlxk_gated_delta_verify_pool",
            Mode::Packed => "mlxk_gated_delta_update_packed",
            Mode::PackedChunked => "mlxk_gated_delta_update_packed_chunked",
            Mode::Commit => "mlxk_gated_delta_state_pool",
        }
    }

    fn packed(self) -> bool {
        matches!(self, Mode::Packed | Mode::PackedChunked)
    }

    fn chunk(self) -> Option<i32> {
        matches!(self, Mode::Chunked | Mode::PackedChunked).then_some(16)
    }
}

/// One call's host values: rows of T tokens (packed: the rows' first `lens` tokens).
struct Call {
    mode: Mode,
    dims: [usize; 6], // rows, T, Hk, Hv, Dk, Dv
    dtype: mlxk_dtype,
    n: usize,
    q: Vec<u8>,
    k: Vec<u8>,
    v: Vec<u8>,
    gates: Vec<u8>, // a then b, f32 [rows, T, Hv] each
    a_log: Vec<u8>,
    dt_bias: Vec<u8>,
    pool: Vec<u8>,
    slots: Vec<i32>,
    fresh: Option<Vec<u8>>,
    /// Packed: each row's tokens (the offsets are their running sums).
    lens: Vec<usize>,
    /// Commit: each row's accepted tokens.
    accepted: Vec<i32>,
}

fn nice(fill: &mut Fill, n: usize, dtype: mlxk_dtype) -> Vec<u8> {
    make_data(fill, n, dtype, DataMode::Nice)
}

impl Call {
    fn decode(input: &mut Input) -> Call {
        let mode = input.pick(&[
            Mode::Update,
            Mode::Update,
            Mode::Chunked,
            Mode::Verify,
            Mode::Packed,
            Mode::PackedChunked,
            Mode::Commit,
        ]);
        let rows = input.pick(&[1usize, 2, 3, 0, 2]);
        let t = input.pick(&[1usize, 2, 3, 0, 5, 17]);
        let hk = input.pick(&[1usize, 2]);
        let hv = hk * input.pick(&[1usize, 2]);
        let dk = input.pick(&[32usize, 64]);
        let dv = input.pick(&[1usize, 3, 4, 5]);
        let dtype = input.pick(&FLOATS);
        let n = input.pick(&[1usize, 2, 3, 5, 0, 4]);
        let mut fill = Fill::new(input.u64());
        let tokens = rows * t;
        let norm = |fill: &mut Fill| {
            let mut x: Vec<f32> = (0..tokens * hk * dk)
                .map(|_| (fill.below(2001) as f32 - 1000.0) / 1000.0)
                .collect();
            for head in x.chunks_mut(dk) {
                let s = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-3);
                head.iter_mut().for_each(|v| *v /= s);
            }
            x.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>()
        };
        let q = norm(&mut fill);
        let k = norm(&mut fill);
        // Slots: distinct pool rows mostly, sometimes negative, past N or named twice.
        let mut slots = Vec::with_capacity(rows);
        for r in 0..rows {
            let s = match input.u8() % 16 {
                0 | 1 => -1 - input.below(3) as i32,
                2 => (n + input.below(3)) as i32,
                3 if r > 0 => slots[input.below(r)],
                _ => ((r + input.below(n.max(1))) % n.max(1)) as i32,
            };
            slots.push(s);
        }
        let fresh = input
            .chance(128)
            .then(|| (0..rows).map(|_| (input.u8() % 3 == 0) as u8).collect());
        let lens = (0..rows).map(|_| input.below(t + 1)).collect();
        let accepted = (0..rows)
            .map(|_| match input.u8() % 16 {
                0 => -1,
                1 => t as i32 + 1,
                _ => input.below(t + 1) as i32,
            })
            .collect();
        Call {
            mode,
            dims: [rows, t, hk, hv, dk, dv],
            dtype,
            n,
            q,
            k,
            v: nice(&mut fill, tokens * hv * dv, MLXK_DTYPE_FLOAT32),
            gates: nice(&mut fill, 2 * tokens * hv, MLXK_DTYPE_FLOAT32),
            a_log: nice(&mut fill, hv, MLXK_DTYPE_FLOAT32),
            dt_bias: nice(&mut fill, hv, MLXK_DTYPE_FLOAT32),
            pool: nice(&mut fill, n * hv * dv * dk, MLXK_DTYPE_FLOAT32),
            slots,
            fresh,
            lens,
            accepted,
        }
    }

    fn per_state(&self) -> usize {
        let [_, _, _, hv, dk, dv] = self.dims;
        hv * dv * dk
    }

    /// Handles for rows `rows` (tokens `[0, lens[i])` of each, packed into one row when
    /// `packed`), q, k, v in the call's dtype: q, k, v, a, b, a_log, dt_bias.
    fn arrays(&self, rows: &[usize], lens: &[usize], packed: bool) -> [H; 7] {
        let [_, t, hk, hv, dk, dv] = self.dims;
        let cut = |bytes: &[u8], per: usize, at: usize| -> Vec<u8> {
            rows.iter()
                .zip(lens)
                .flat_map(|(&r, &l)| {
                    bytes[(at + r * t) * per * 4..(at + r * t + l) * per * 4].to_vec()
                })
                .collect()
        };
        let total = lens.iter().sum::<usize>();
        let (b, tt) = match packed {
            true => (1, total as i64),
            false => (rows.len() as i64, lens.first().copied().unwrap_or(t) as i64),
        };
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
        let tokens = self.dims[0] * t;
        [
            cast(cut(&self.q, (hk * dk) as usize, 0), &[b, tt, hk, dk]),
            cast(cut(&self.k, (hk * dk) as usize, 0), &[b, tt, hk, dk]),
            cast(cut(&self.v, (hv * dv) as usize, 0), &[b, tt, hv, dv]),
            new_array(
                &cut(&self.gates, hv as usize, 0),
                &[b, tt, hv],
                MLXK_DTYPE_FLOAT32,
            ),
            new_array(
                &cut(&self.gates, hv as usize, tokens),
                &[b, tt, hv],
                MLXK_DTYPE_FLOAT32,
            ),
            new_array(&self.a_log, &[hv], MLXK_DTYPE_FLOAT32),
            new_array(&self.dt_bias, &[hv], MLXK_DTYPE_FLOAT32),
        ]
    }

    /// The rules of the header for these values.
    fn expect(&self) -> Expect {
        let mut e = Expect::new();
        let bad = |e: &mut Expect, why: String| e.fail(MLXK_ERR_INVALID_ARGUMENT, why);
        let mut named = std::collections::HashSet::new();
        for (i, &s) in self.slots.iter().enumerate() {
            if s >= self.n as i32 {
                bad(&mut e, format!("slots[{i}] = {s} >= N = {}", self.n));
            } else if s >= 0 && !named.insert(s) {
                bad(&mut e, format!("slot {s} named twice"));
            }
        }
        if self.mode == Mode::Commit {
            for (i, &l) in self.accepted.iter().enumerate() {
                if l < 0 || l as usize > self.dims[1] {
                    bad(&mut e, format!("accepted_lengths[{i}] = {l}"));
                }
            }
        }
        e
    }
}

/// The dense reference of one row: the update (or replay) of its `len` tokens from its slot's
/// state (None: zeros). Returns y's bytes and the state.
fn reference(c: &Call, row: usize, len: usize, start: Option<&[u8]>) -> (Vec<u8>, Vec<u8>) {
    let [_, t, _, hv, dk, dv] = c.dims;
    let x = c.arrays(&[row], &[len], false);
    let state =
        start.map(|s| new_array(s, &[1, hv as i64, dv as i64, dk as i64], MLXK_DTYPE_FLOAT32));
    let st = state.unwrap_or(null_mut());
    let [q, k, v, a, b, al, dt] = x;
    let (mut y, mut s) = (null_mut(), null_mut());
    let status = unsafe {
        match (c.mode, c.mode.chunk()) {
            (Mode::Commit, _) => {
                // The replay over the whole window's first `len` tokens.
                let w = c.arrays(&[row], &[t], false);
                let lens = [len as i32];
                let status = mlxk_gated_delta_state(
                    w[1],
                    w[2],
                    w[3],
                    w[4],
                    w[5],
                    w[6],
                    st,
                    lens.as_ptr(),
                    1,
                    &mut s,
                );
                w.into_iter().for_each(free_ok);
                status
            }
            (_, None) => mlxk_gated_delta_update(q, k, v, a, b, al, dt, st, null(), &mut y, &mut s),
            (_, Some(ch)) => mlxk_gated_delta_update_chunked(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                st,
                null(),
                ch,
                &mut y,
                &mut s,
            ),
        }
    };
    assert_eq!(status, MLXK_OK, "reference: {}", last_error());
    let y_bytes = if y.is_null() {
        Vec::new()
    } else {
        let bytes = check_result(
            "reference y",
            y,
            &[1, len as i64, hv as i64, dv as i64],
            c.dtype,
        );
        free_ok(y);
        bytes
    };
    let s_bytes = check_result(
        "reference state",
        s,
        &[1, hv as i64, dv as i64, dk as i64],
        MLXK_DTYPE_FLOAT32,
    );
    free_ok(s);
    x.into_iter().for_each(free_ok);
    if let Some(h) = state {
        free_ok(h);
    }
    (y_bytes, s_bytes)
}

fn one(input: &mut Input) {
    let c = Call::decode(input);
    let [rows, t, _, hv, dk, dv] = c.dims;
    let mut e = c.expect();
    let function = c.mode.function();
    // A count that disagrees with the rows (not for packed calls, whose count is N + 1).
    let mut n_slots = rows;
    if !c.mode.packed() && input.chance(16) {
        n_slots = rows + 1;
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "n_slots = B + 1");
    }
    let mut slots = c.slots.clone();
    slots.resize(n_slots, 0);
    let fresh = c.fresh.clone().map(|mut f| {
        f.resize(n_slots, 0);
        f
    });
    let lens: Vec<usize> = if c.mode.packed() {
        c.lens.clone()
    } else {
        vec![t; rows]
    };
    let mut cu: Vec<i32> = std::iter::once(0)
        .chain(lens.iter().scan(0, |acc, &l| {
            *acc += l as i32;
            Some(*acc)
        }))
        .collect();
    if c.mode.packed() && input.chance(16) {
        // The first offset or the last: either breaks the rules (a middle one might not).
        let i = if input.chance(128) { 0 } else { cu.len() - 1 };
        cu[i] += 1;
        e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("cu_seqlens[{i}] moved"));
    }
    let all: Vec<usize> = (0..rows).collect();
    let x = c.arrays(&all, &lens, c.mode.packed());
    let pool_shape = [c.n as i64, hv as i64, dv as i64, dk as i64];
    let pool = new_array(&c.pool, &pool_shape, MLXK_DTYPE_FLOAT32);
    let [q, k, v, a, b, al, dt] = x;
    let (sp, fp) = (
        slots.as_ptr(),
        fresh.as_ref().map_or(null(), |f| f.as_ptr()),
    );
    let (mut y, mut p) = (sentinel(), sentinel());
    let status = unsafe {
        match c.mode {
            Mode::Update => mlxk_gated_delta_update_pool(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                sp,
                fp,
                n_slots,
                null(),
                &mut y,
                &mut p,
            ),
            Mode::Chunked => mlxk_gated_delta_update_pool_chunked(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                sp,
                fp,
                n_slots,
                null(),
                16,
                &mut y,
                &mut p,
            ),
            Mode::Verify => mlxk_gated_delta_verify_pool(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                sp,
                fp,
                n_slots,
                null(),
                &mut y,
            ),
            Mode::Packed => mlxk_gated_delta_update_packed(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                cu.as_ptr(),
                cu.len(),
                sp,
                fp,
                &mut y,
                &mut p,
            ),
            Mode::PackedChunked => mlxk_gated_delta_update_packed_chunked(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                cu.as_ptr(),
                cu.len(),
                sp,
                fp,
                16,
                &mut y,
                &mut p,
            ),
            Mode::Commit => mlxk_gated_delta_state_pool(
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                sp,
                fp,
                c.accepted.as_ptr(),
                n_slots,
                &mut p,
            ),
        }
    };
    e.check(function, status);
    x.into_iter().for_each(free_ok);
    if status != MLXK_OK {
        assert!(
            y == sentinel() && p == sentinel(),
            "{function}: a failure wrote an out-parameter"
        );
        free_ok(pool);
        return;
    }
    // The pool freed before the results are read (in place) or kept (a copy).
    let keep = input.chance(128);
    if !keep {
        free_ok(pool);
    }
    let total = cu.last().copied().unwrap_or(0) as i64;
    let y_shape: Vec<i64> = match c.mode.packed() {
        true => vec![1, total, hv as i64, dv as i64],
        false => vec![rows as i64, t as i64, hv as i64, dv as i64],
    };
    let y_bytes = (c.mode != Mode::Commit).then(|| {
        let bytes = check_result("y", y, &y_shape, c.dtype);
        free_ok(y);
        bytes
    });
    let new_pool = (c.mode != Mode::Verify).then(|| {
        let bytes = check_result("pool_out", p, &pool_shape, MLXK_DTYPE_FLOAT32);
        free_ok(p);
        bytes
    });
    if keep {
        let old = check_result("pool", pool, &pool_shape, MLXK_DTYPE_FLOAT32);
        assert!(
            old == c.pool,
            "{function}: the pool the caller kept changed"
        );
        free_ok(pool);
    }
    // Each row against its dense reference; slots not named keep their bits.
    let per = c.per_state() * 4;
    let tok = hv * dv * dtype_size(c.dtype);
    for (row, &slot) in c.slots.iter().enumerate() {
        let len = match c.mode {
            Mode::Commit => c.accepted[row] as usize,
            _ => lens[row],
        };
        let y0 = match c.mode.packed() {
            true => cu[row] as usize * tok,
            false => row * t * tok,
        };
        if slot < 0 {
            if let Some(y) = &y_bytes {
                assert!(
                    y[y0..y0 + lens[row] * tok].iter().all(|&x| x == 0),
                    "{function}: padding row {row}'s y is not zero"
                );
            }
            continue;
        }
        let s = slot as usize;
        let fresh_row = c.fresh.as_ref().is_some_and(|f| f[row] != 0);
        let start = (!fresh_row).then(|| &c.pool[s * per..(s + 1) * per]);
        let (y_ref, s_ref) = reference(&c, row, len, start);
        if let Some(y) = &y_bytes {
            assert!(
                y[y0..y0 + len * tok] == y_ref[..],
                "{function}: row {row}'s y"
            );
        }
        if let Some(np) = &new_pool {
            assert!(
                np[s * per..(s + 1) * per] == s_ref[..],
                "{function}: row {row}'s state"
            );
        }
    }
    if let Some(np) = &new_pool {
        for s in 0..c.n {
            if !c.slots.contains(&(s as i32)) {
                assert!(
                    np[s * per..(s + 1) * per] == c.pool[s * per..(s + 1) * per],
                    "{function}: slot {s}, not named, changed"
                );
            }
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
