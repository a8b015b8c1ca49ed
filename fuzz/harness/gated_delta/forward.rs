//! Target `gated_delta`: mlxk_gated_delta_update (and its chunked form), mlxk_compute_g and
//! mlxk_gated_delta_state on small random dims (usually valid, sometimes not: Dk off the multiples of 32, Hv not a
//! multiple of Hk, empty batches and sequences, empty arrays with huge other dims), random
//! dtypes, optional state and mask, perturbed shapes, NULL / freed / foreign handles, random
//! accepted lengths and tight memory limits. Checked properties on success: documented result
//! shapes and dtypes; y is 0 at masked tokens; a call whose tokens are all masked (or T = 0)
//! returns the start state bit for bit; g is NaN or in [0, 1]; the replay over all T tokens
//! equals the update's state and the replay over none the start state.

use std::ptr::null_mut;

use super::*;

/// The start state of a call, as bytes of `len`: the given state, zeros when absent, None
/// when the state argument is not usable.
fn start_state(state: &Arg, len: usize) -> Option<Vec<u8>> {
    match state.kind {
        Kind::Live => Some(state.bytes.clone()),
        Kind::Null => Some(vec![0u8; len]),
        _ => None,
    }
}

fn round(ctx: &mut Ctx, input: &mut Input) {
    // Which calls come first, so that short inputs reach every function.
    let mut ops = input.u8();
    let mut r = new_round(ctx, input);

    let mut update_state: Option<Vec<u8>> = None;
    for _ in 0..3 {
        match ops % 4 {
            0 | 3 => update(ctx, input, &mut r, &mut update_state),
            1 => replay(input, &r, update_state.as_deref()),
            _ => compute_g(ctx, input, &r),
        }
        ops /= 4;
    }
    release_round(ctx, &mut r);
}

fn update(ctx: &mut Ctx, input: &mut Input, r: &mut Round, update_state: &mut Option<Vec<u8>>) {
    let mut e = Expect::new();
    let byte = input.u8();
    let outs = byte % 16;
    let (y_null, s_null, same) = (outs == 15, outs == 14, outs == 13);
    // The high bits pick the form: mostly the exact update, else the chunked form with a chunk
    // size valid (0 = default, multiples of 16 up to 128) or not.
    const CHUNKS: [i32; 6] = [0, 16, 32, 128, 8, -16];
    let chunk = (byte / 16 >= 10).then(|| CHUNKS[(byte / 16 - 10) as usize]);
    let function = if chunk.is_some() {
        "mlxk_gated_delta_update_chunked"
    } else {
        "mlxk_gated_delta_update"
    };
    if let Some(c) = chunk {
        if !(c == 0 || ((16..=128).contains(&c) && c % 16 == 0)) {
            e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("chunk_size {c}"));
        }
    }
    if y_null {
        e.fail(MLXK_ERR_NULL_POINTER, "y is NULL");
    }
    if s_null {
        e.fail(MLXK_ERR_NULL_POINTER, "state_out is NULL");
    }
    if same {
        e.fail(
            MLXK_ERR_INVALID_ARGUMENT,
            "y and state_out are the same pointer",
        );
    }
    let tight = tight_limit(input);
    let dims = expect_forward(&mut e, r, &[], tight);
    let state_given = r.state.clone();
    let (mut y, mut s) = (sentinel(), sentinel());
    let y_ptr: *mut H = if y_null { null_mut() } else { &mut y };
    let s_ptr: *mut H = if s_null {
        null_mut()
    } else if same {
        y_ptr
    } else {
        &mut s
    };
    let status = match chunk {
        // SAFETY: handles are tokens (any value is safe to pass); the out-pointers are NULL or
        // point at the locals above.
        None => unsafe {
            mlxk_gated_delta_update(
                r.q.h,
                r.k.h,
                r.v.h,
                r.a.h,
                r.b.h,
                r.a_log.h,
                r.dt_bias.h,
                r.state.h,
                r.mask.h,
                y_ptr,
                s_ptr,
            )
        },
        // SAFETY: as above.
        Some(c) => unsafe {
            mlxk_gated_delta_update_chunked(
                r.q.h,
                r.k.h,
                r.v.h,
                r.a.h,
                r.b.h,
                r.a_log.h,
                r.dt_bias.h,
                r.state.h,
                r.mask.h,
                c,
                y_ptr,
                s_ptr,
            )
        },
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check(function, status);
    if status != MLXK_OK {
        assert!(
            y == sentinel() && s == sentinel(),
            "{function} wrote an out-parameter on failure"
        );
        return;
    }
    let d = dims.expect("a success has valid dims");
    // The decode-loop pattern: free the old state before evaluating the new one.
    if r.state.live() && input.chance(64) {
        ctx.release(&mut r.state);
    }
    let yb = check_result("y", y, &[d.b, d.t, d.hv, d.dv], r.q.dtype);
    let sb = check_result("state_out", s, &[d.b, d.hv, d.dv, d.dk], MLXK_DTYPE_FLOAT32);
    free_ok(y);
    free_ok(s);
    ctx.dead.extend([y, s]);
    let per_token = (d.hv * d.dv) as usize;
    let mut all_masked = d.t == 0;
    let mut none_masked = true;
    if r.mask.live() {
        all_masked = true;
        for (token, &m) in r.mask.bytes.iter().enumerate() {
            if m == 0 {
                none_masked = false;
                for i in token * per_token..(token + 1) * per_token {
                    assert!(
                        is_zero(&yb, r.q.dtype, i),
                        "y is not 0 at masked token {token}"
                    );
                }
            } else {
                all_masked = false;
            }
        }
    }
    if all_masked {
        if let Some(start) = start_state(&state_given, sb.len()) {
            assert!(
                same_floats(&sb, &start, MLXK_DTYPE_FLOAT32),
                "state_out differs from the start state although no token was real"
            );
        }
    }
    // The replay must reproduce the exact update bit for bit (the chunked form only to rounding).
    if none_masked && chunk.is_none() {
        *update_state = Some(sb);
    }
}

fn compute_g(ctx: &mut Ctx, input: &mut Input, r: &Round) {
    // Usually the recurrence's own a [B, T, Hv]; sometimes an a of another rank.
    let mut extra = None;
    let a = if input.chance(64) {
        let hv = r.a_log.shape.first().copied().unwrap_or(1);
        let rank = input.below(4);
        let mut shape: Vec<i64> = (0..rank).map(|_| input.pick(&[0i64, 1, 2, 3])).collect();
        if rank > 0 {
            *shape.last_mut().unwrap() = if input.chance(32) { hv + 1 } else { hv };
        }
        let dtype = input.pick(&FLOATS);
        let arg = ctx.arg(input, "a", shape, dtype, true);
        extra = Some(arg);
        extra.as_ref().unwrap()
    } else {
        &r.a
    };
    let out_null = input.chance(10);
    let mut e = Expect::new();
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "g is NULL");
    }
    let tight = tight_limit(input);
    if expect_handles(&mut e, &[&r.a_log, a, &r.dt_bias], &[]) {
        if a.shape.is_empty() {
            e.fail(MLXK_ERR_SHAPE, "a is a scalar");
        }
        if r.a_log.shape.len() != 1 {
            e.fail(MLXK_ERR_SHAPE, "a_log is not [Hv]");
            e.maybe(MLXK_ERR_SHAPE, "later rules");
            e.maybe(MLXK_ERR_DTYPE, "later rules");
        } else {
            let hv = r.a_log.shape[0];
            if a.shape.last().is_some_and(|&l| l != hv) {
                e.fail(MLXK_ERR_SHAPE, "a's last dim is not Hv");
            }
            want_shape(&mut e, &r.dt_bias, &[hv]);
        }
        if !matches!(r.a_log.dtype, MLXK_DTYPE_FLOAT32 | MLXK_DTYPE_BFLOAT16) {
            e.fail(MLXK_ERR_DTYPE, "a_log is neither float32 nor bfloat16");
        }
        want_float(&mut e, a);
        want_float(&mut e, &r.dt_bias);
        if !e.must_fail() {
            expect_sizes(
                &mut e,
                &[(count(&a.shape).unwrap(), 4)],
                0,
                current_limit(tight),
            );
        }
    }
    let mut g = sentinel();
    let status = unsafe {
        mlxk_compute_g(
            r.a_log.h,
            a.h,
            r.dt_bias.h,
            if out_null { null_mut() } else { &mut g },
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_compute_g", status);
    if status == MLXK_OK {
        let gb = check_result("g", g, &a.shape, MLXK_DTYPE_FLOAT32);
        for i in 0..gb.len() / 4 {
            let x = float_at(&gb, MLXK_DTYPE_FLOAT32, i);
            assert!(
                x.is_nan() || (0.0..=1.0).contains(&x),
                "g[{i}] = {x} is outside [0, 1]"
            );
        }
        free_ok(g);
        ctx.dead.push(g);
    } else {
        assert_eq!(
            g,
            sentinel(),
            "mlxk_compute_g wrote its out-parameter on failure"
        );
    }
    if let Some(mut arg) = extra {
        ctx.release(&mut arg);
    }
}

fn replay(input: &mut Input, r: &Round, update_state: Option<&[u8]>) {
    let bsz = r.k.shape.first().copied().unwrap_or(0).clamp(0, 64) as usize;
    let t = r.k.shape.get(1).copied().unwrap_or(0);
    let ti = t.clamp(0, i32::MAX as i64) as i32;
    let mode = input.u8() % 8;
    let mut lengths: Vec<i32> = match mode {
        0 | 1 => vec![ti; bsz],
        2 => vec![0; bsz],
        _ => (0..bsz)
            .map(|_| input.below(ti as usize + 1) as i32)
            .collect(),
    };
    let mut lengths_null = false;
    match input.u8() % 16 {
        15 if bsz > 0 => {
            let row = input.below(bsz);
            lengths[row] = input.pick(&[-1, ti.saturating_add(1), i32::MAX, i32::MIN]);
        }
        14 => lengths.push(0),
        13 => {
            lengths.pop();
        }
        12 => lengths_null = true,
        _ => {}
    }
    let out_null = input.chance(10);
    let mut e = Expect::new();
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "state_out is NULL");
    }
    if lengths_null && !lengths.is_empty() {
        e.fail(MLXK_ERR_NULL_POINTER, "accepted_lengths is NULL");
    }
    let tight = tight_limit(input);
    let mut dims = None;
    if expect_handles(
        &mut e,
        &[&r.k, &r.v, &r.a, &r.b, &r.a_log, &r.dt_bias],
        &[&r.state],
    ) {
        dims = expect_recurrence(
            &mut e, &r.k, None, &r.v, &r.a, &r.b, &r.a_log, &r.dt_bias, &r.state,
        );
        if let Some(d) = dims {
            if lengths.len() as i64 != d.b {
                e.fail(
                    MLXK_ERR_INVALID_ARGUMENT,
                    format!("n_lengths {} != B {}", lengths.len(), d.b),
                );
            } else if lengths.iter().any(|&l| l < 0 || l as i64 > d.t) {
                e.fail(MLXK_ERR_INVALID_ARGUMENT, "a length outside [0, T]");
            }
            if !e.must_fail() {
                let bt_hv = count(&[d.b, d.t, d.hv]).unwrap();
                expect_sizes(
                    &mut e,
                    &[(count(&[d.b, d.hv, d.dv, d.dk]).unwrap(), 4)],
                    bt_hv * (4 + dtype_size(r.b.dtype) as u128),
                    current_limit(tight),
                );
            }
        }
    }
    let mut s = sentinel();
    let status = unsafe {
        mlxk_gated_delta_state(
            r.k.h,
            r.v.h,
            r.a.h,
            r.b.h,
            r.a_log.h,
            r.dt_bias.h,
            r.state.h,
            if lengths_null {
                std::ptr::null()
            } else {
                lengths.as_ptr()
            },
            lengths.len(),
            if out_null { null_mut() } else { &mut s },
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_gated_delta_state", status);
    if status != MLXK_OK {
        assert_eq!(
            s,
            sentinel(),
            "mlxk_gated_delta_state wrote its out-parameter on failure"
        );
        return;
    }
    let d = dims.expect("a success has valid dims");
    let sb = check_result("state_out", s, &[d.b, d.hv, d.dv, d.dk], MLXK_DTYPE_FLOAT32);
    free_ok(s);
    if lengths.iter().all(|&l| l == 0) {
        if let Some(start) = start_state(&r.state, sb.len()) {
            assert!(
                same_floats(&sb, &start, MLXK_DTYPE_FLOAT32),
                "replay over no token changed the state"
            );
        }
    }
    if lengths.iter().all(|&l| l as i64 == d.t) {
        if let Some(u) = update_state {
            assert!(
                same_floats(&sb, u, MLXK_DTYPE_FLOAT32),
                "replay over all T tokens differs from the update's state"
            );
        }
    }
}

pub fn run(input: &mut Input) {
    let mut ctx = Ctx {
        dead: Vec::new(),
        foreign: Foreign::new(),
    };
    for _ in 0..MAX_ROUNDS {
        if input.exhausted() {
            break;
        }
        round(&mut ctx, input);
    }
}
