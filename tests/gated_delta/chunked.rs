//! `mlxk_gated_delta_update_chunked` through the C ABI: agreement with the exact update over
//! shapes, dtypes, masks, states and chunk sizes; masked rows; continuing a prefill across
//! calls; the in-place state update; every argument check.

use crate::support::*;
use std::ptr::null_mut;

fn run_chunked(r: &Recurrence, chunk: i32) -> (mlxk_status, H, H) {
    let [q, k, v, a, b, al, dt, s, m] = r.args();
    let (mut y, mut st) = (null_mut(), null_mut());
    let status = unsafe {
        mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, chunk, &mut y, &mut st)
    };
    (status, y, st)
}

/// The spacing of `dtype`'s values near |x| (its unit in the last place).
fn ulp(dtype: mlxk_dtype, x: f32) -> f32 {
    let mantissa_bits = match dtype {
        MLXK_DTYPE_BFLOAT16 => 7,
        MLXK_DTYPE_FLOAT16 => 10,
        _ => 23,
    };
    let x = x.abs().max(f32::MIN_POSITIVE);
    let exponent = x.log2().floor();
    let min_exponent = if dtype == MLXK_DTYPE_FLOAT16 {
        -14.0
    } else {
        -126.0
    };
    2f32.powf(exponent.max(min_exponent) - mantissa_bits as f32)
}

/// Replaces q, k, v by copies in `dtype`.
fn cast_qkv(r: &mut Recurrence, dtype: mlxk_dtype) {
    for slot in [&mut r.q, &mut r.k, &mut r.v] {
        let mut cast = null_mut();
        ok(unsafe { mlxk_array_astype(*slot, dtype, &mut cast) });
        free(*slot);
        *slot = cast;
    }
}

fn max_abs(x: &[f32]) -> f32 {
    x.iter().fold(0f32, |m, v| m.max(v.abs()))
}

/// Chunked and exact results of one call agree to float32 rounding: the state within
/// 2e-5 of its largest magnitude, y within one ulp of its dtype plus 2e-5 of its largest
/// magnitude (two float32 values that differ slightly may round to neighbouring values).
/// Masked tokens (by the mask itself) give y = +0 on both paths; an unmasked y may be a zero of
/// one path and a tiny value of the other, within the bound. Returns the worst relative
/// differences seen.
fn compare(r: &Recurrence, chunk: i32, dtype: mlxk_dtype, label: &str) -> (f32, f32) {
    let (status, y_exact, s_exact) = r.run();
    ok(status);
    let (status, y_chunked, s_chunked) = run_chunked(r, chunk);
    ok(status);
    assert_eq!(shape_of(y_chunked), shape_of(y_exact), "{label}: y shape");
    assert_eq!(dtype_of(y_chunked), dtype, "{label}: y dtype");
    assert_eq!(
        shape_of(s_chunked),
        shape_of(s_exact),
        "{label}: state shape"
    );
    assert_eq!(
        dtype_of(s_chunked),
        MLXK_DTYPE_FLOAT32,
        "{label}: state dtype"
    );
    let (ye, yc) = (read_widened(y_exact), read_widened(y_chunked));
    let (se, sc) = (read_f32(s_exact), read_f32(s_chunked));
    for h in [y_exact, y_chunked, s_exact, s_chunked] {
        free(h);
    }
    let (y_scale, s_scale) = (max_abs(&ye).max(1e-30), max_abs(&se).max(1e-30));
    // Which (batch, token) rows the mask drops (y is [B, T, Hv, Dv]).
    let [b, t, _, hv, _, dv] = r.dims;
    let dropped: Vec<bool> = match r.mask {
        Some(m) => read_bytes(m).iter().map(|&keep| keep == 0).collect(),
        None => vec![false; b * t],
    };
    let mut worst_y = 0f32;
    for (i, (&c, &e)) in yc.iter().zip(&ye).enumerate() {
        assert!(c.is_finite(), "{label}: y[{i}] = {c}");
        let diff = (c - e).abs();
        assert!(
            diff <= ulp(dtype, e) + 2e-5 * y_scale,
            "{label}: y[{i}] chunked {c} vs exact {e} (scale {y_scale})"
        );
        if dropped[i / (hv * dv)] {
            // Masked tokens give exactly +0 on both paths.
            assert_eq!(e.to_bits(), 0, "{label}: y[{i}] masked, exact path");
            assert_eq!(c.to_bits(), 0, "{label}: y[{i}] masked, chunked path");
        }
        worst_y = worst_y.max(diff / y_scale);
    }
    let mut worst_s = 0f32;
    for (i, (&c, &e)) in sc.iter().zip(&se).enumerate() {
        let diff = (c - e).abs();
        assert!(
            diff <= 2e-5 * s_scale,
            "{label}: state[{i}] chunked {c} vs exact {e} (scale {s_scale})"
        );
        worst_s = worst_s.max(diff / s_scale);
    }
    (worst_y, worst_s)
}

#[test]
fn agrees_with_the_exact_update_across_shapes_dtypes_and_chunks() {
    let mut rng = Rng::fresh();
    // [B, T, Hk, Hv, Dk, Dv], chunk size.
    let cases: &[([usize; 6], i32)] = &[
        ([1, 1, 1, 1, 32, 1], 0),
        ([2, 7, 2, 4, 64, 16], 16),
        ([1, 100, 1, 2, 128, 40], 0),
        ([3, 33, 2, 2, 256, 8], 48),
        ([1, 64, 4, 4, 96, 20], 128),
        ([2, 150, 2, 4, 128, 128], 32),
        ([1, 17, 1, 3, 160, 3], 64),
    ];
    let mut worst = (0f32, 0f32);
    for (n, &(dims, chunk)) in cases.iter().enumerate() {
        for (with_state, with_mask) in [(false, false), (true, false), (true, true), (false, true)]
        {
            let dtype = [MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32][n % 3];
            let mut r = Recurrence::random(&mut rng, dims, with_state, with_mask);
            if dtype != MLXK_DTYPE_BFLOAT16 {
                cast_qkv(&mut r, dtype);
            }
            let label =
                format!("{dims:?} chunk {chunk} dtype {dtype} state {with_state} mask {with_mask}");
            let (y, s) = compare(&r, chunk, dtype, &label);
            worst = (worst.0.max(y), worst.1.max(s));
            r.free();
        }
    }
    eprintln!(
        "chunked vs exact: worst |dy| {:.2e}, |ds| {:.2e} of scale",
        worst.0, worst.1
    );
}

#[test]
fn fully_masked_rows_keep_their_state_and_give_zeros() {
    let mut rng = Rng::fresh();
    let dims = [3, 40, 1, 2, 64, 8];
    let [b, t, _, hv, dk, dv] = dims;
    let mut r = Recurrence::random(&mut rng, dims, true, false);
    // Row 1 entirely padding; rows 0 and 2 real with a padded tail.
    let mask: Vec<bool> = (0..b * t)
        .map(|i| {
            let (row, tok) = (i / t, i % t);
            row != 1 && tok < t - 3 * row
        })
        .collect();
    r.mask = Some(new_bool(&mask, &[b as i32, t as i32]));
    let state_in = read_f32(r.state.unwrap());
    let (status, y, st) = run_chunked(&r, 0);
    ok(status);
    let (yv, sv) = (read_widened(y), read_f32(st));
    let per_row_state = hv * dv * dk;
    assert_eq!(
        sv[per_row_state..2 * per_row_state]
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        state_in[per_row_state..2 * per_row_state]
            .iter()
            .map(|x| x.to_bits())
            .collect::<Vec<_>>(),
        "a fully masked row's state passes through bit for bit"
    );
    let per_token = hv * dv;
    for (i, &real) in mask.iter().enumerate() {
        let ys = &yv[i * per_token..(i + 1) * per_token];
        if real {
            assert!(
                ys.iter().any(|&x| x != 0.0),
                "token {i}: real token gives output"
            );
        } else {
            assert!(
                ys.iter().all(|&x| x.to_bits() == 0),
                "token {i}: masked token gives +0"
            );
        }
    }
    free(y);
    free(st);
    compare(&r, 16, MLXK_DTYPE_BFLOAT16, "padded rows");
    r.free();
}

/// A long prefill split into calls at multiples of the chunk size, each continuing from the
/// previous call's state, computes the same bits as one call (no masks: every chunk holds the
/// same tokens either way). Split elsewhere, the results still agree to rounding.
#[test]
fn a_prefill_continues_across_calls() {
    let mut rng = Rng::fresh();
    let dims = [2, 96, 2, 4, 128, 16];
    let [b, t, _, hv, dk, dv] = dims;
    let host = HostRecurrence::random(&mut rng, dims);
    let whole = host.window(0, t);
    let (status, y_whole, s_whole) = run_chunked(&whole, 32);
    ok(status);
    let (y_whole_v, s_whole_v) = (read_bf16(y_whole), read_f32(s_whole));
    free(y_whole);
    free(s_whole);
    whole.free_inputs();

    for (split, exact_bits) in [(64, true), (50, false)] {
        let first = host.window(0, split);
        let (status, y1, s1) = run_chunked(&first, 32);
        ok(status);
        first.free_inputs();
        let mut second = host.window(split, t);
        second.state = Some(s1);
        let (status, y2, s2) = run_chunked(&second, 32);
        ok(status);
        let (y1v, y2v, s2v) = (read_bf16(y1), read_bf16(y2), read_f32(s2));
        let per_token = hv * dv;
        let mut y_split = Vec::with_capacity(y_whole_v.len());
        for row in 0..b {
            y_split.extend_from_slice(&y1v[row * split * per_token..(row + 1) * split * per_token]);
            let rest = t - split;
            y_split.extend_from_slice(&y2v[row * rest * per_token..(row + 1) * rest * per_token]);
        }
        if exact_bits {
            assert!(
                same_bits(&y_split, &y_whole_v),
                "split at {split}: y bit-identical"
            );
            assert!(
                same_bits(&s2v, &s_whole_v),
                "split at {split}: state bit-identical"
            );
        } else {
            let ys = max_abs(&y_whole_v);
            for (i, (a, e)) in y_split.iter().zip(&y_whole_v).enumerate() {
                assert!(
                    (a - e).abs() <= ulp(MLXK_DTYPE_BFLOAT16, *e) + 2e-5 * ys,
                    "split at {split}: y[{i}] {a} vs {e}"
                );
            }
            let ss = max_abs(&s_whole_v);
            for (i, (a, e)) in s2v.iter().zip(&s_whole_v).enumerate() {
                assert!(
                    (a - e).abs() <= 2e-5 * ss,
                    "split at {split}: state[{i}] {a} vs {e}"
                );
            }
        }
        assert_eq!(s2v.len(), b * hv * dv * dk);
        for h in [y1, y2, s2] {
            free(h);
        }
        second.state = None;
        second.free_inputs();
        free(s1);
    }
}

/// Freeing the old state before evaluating lets the kernel write the new state into its
/// buffer; the values are the same bits as when the old state is kept.
#[test]
fn the_state_is_updated_in_place_when_the_old_handle_is_freed() {
    let mut rng = Rng::fresh();
    let dims = [1, 40, 2, 4, 128, 32];
    let r = Recurrence::random(&mut rng, dims, true, true);
    let (status, y_kept, s_kept) = run_chunked(&r, 0);
    ok(status);
    let (y_kept_v, s_kept_v) = (read_bf16(y_kept), read_f32(s_kept));
    free(y_kept);
    free(s_kept);

    let copy = new_bytes(
        &read_bytes(r.state.unwrap()),
        &shape_of(r.state.unwrap()),
        MLXK_DTYPE_FLOAT32,
    );
    let mut args = r.args();
    args[7] = copy;
    let [q, k, v, a, b, al, dt, s, m] = args;
    let (mut y, mut st) = (null_mut(), null_mut());
    ok(unsafe { mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, 0, &mut y, &mut st) });
    free(copy);
    let before = mlxkern::testing::in_place_updates();
    ok(mlxk_array_eval(st));
    assert!(
        mlxkern::testing::in_place_updates() > before,
        "the freed state's buffer should hold the new state"
    );
    let (yv, sv) = (read_bf16(y), read_f32(st));
    assert!(same_bits(&yv, &y_kept_v));
    assert!(same_bits(&sv, &s_kept_v));
    free(y);
    free(st);
    r.free();
}

#[test]
fn empty_inputs() {
    let mut rng = Rng::fresh();
    // T = 0: y is empty and the state passes through unchanged.
    let r = Recurrence::random(&mut rng, [2, 0, 1, 2, 32, 4], true, false);
    let (status, y, st) = run_chunked(&r, 0);
    ok(status);
    assert_eq!(shape_of(y), vec![2, 0, 2, 4]);
    let given = read_f32(r.state.unwrap());
    assert_eq!(read_f32(st), given);
    free(y);
    free(st);
    r.free();
    // B = 0: both outputs empty.
    let r = Recurrence::random(&mut rng, [0, 3, 1, 1, 64, 8], false, false);
    let (status, y, st) = run_chunked(&r, 16);
    ok(status);
    assert_eq!(shape_of(y), vec![0, 3, 1, 8]);
    assert_eq!(shape_of(st), vec![0, 1, 8, 64]);
    ok(mlxk_array_eval(st));
    free(y);
    free(st);
    r.free();
}

#[test]
fn arguments_are_checked_and_named() {
    let mut rng = Rng::fresh();
    let r = Recurrence::random(&mut rng, [1, 5, 1, 2, 64, 8], true, true);
    let [q, k, v, a, b, al, dt, s, m] = r.args();
    let untouched = |y: H, st: H| assert!(y.is_null() && st.is_null(), "outputs untouched");

    for bad in [-16, -1, 1, 8, 24, 136, 144, 256, i32::MIN, i32::MAX] {
        let (mut y, mut st) = (null_mut(), null_mut());
        let status = unsafe {
            mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, bad, &mut y, &mut st)
        };
        expect_err(
            status,
            MLXK_ERR_INVALID_ARGUMENT,
            &[
                "mlxk_gated_delta_update_chunked",
                "chunk_size",
                &bad.to_string(),
                "multiple of 16",
            ],
        );
        untouched(y, st);
    }
    for good in [16, 32, 112, 128] {
        let (status, y, st) = run_chunked(&r, good);
        ok(status);
        ok(mlxk_array_eval(st));
        free(y);
        free(st);
    }

    // The update's checks apply unchanged: NULL inputs, outputs, shapes, dtypes, handles.
    let (mut y, mut st) = (null_mut(), null_mut());
    let status = unsafe {
        mlxk_gated_delta_update_chunked(
            std::ptr::null(),
            k,
            v,
            a,
            b,
            al,
            dt,
            s,
            m,
            0,
            &mut y,
            &mut st,
        )
    };
    expect_err(status, MLXK_ERR_NULL_POINTER, &["q"]);
    untouched(y, st);
    let status = unsafe {
        mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, 0, null_mut(), &mut st)
    };
    expect_err(status, MLXK_ERR_NULL_POINTER, &["y"]);
    let status = unsafe {
        mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, 0, &mut y, null_mut())
    };
    expect_err(status, MLXK_ERR_NULL_POINTER, &["state_out"]);
    let status =
        unsafe { mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, 0, &mut y, &mut y) };
    expect_err(status, MLXK_ERR_INVALID_ARGUMENT, &["y and state_out"]);
    untouched(y, st);
    // k with the wrong T; v as int32.
    let wrong_t = new_bf16(&rng.vec(6 * 64, 1.0), &[1, 6, 1, 64]);
    let status = unsafe {
        mlxk_gated_delta_update_chunked(q, wrong_t, v, a, b, al, dt, s, m, 0, &mut y, &mut st)
    };
    expect_err(status, MLXK_ERR_SHAPE, &["k", "dimension 1 (T)"]);
    free(wrong_t);
    let int_v = new_bytes(&[0u8; 5 * 2 * 8 * 4], &[1, 5, 2, 8], MLXK_DTYPE_INT32);
    let status = unsafe {
        mlxk_gated_delta_update_chunked(q, k, int_v, a, b, al, dt, s, m, 0, &mut y, &mut st)
    };
    expect_err(status, MLXK_ERR_DTYPE, &["v"]);
    free(int_v);
    // A freed handle.
    let gone = new_f32(&[1.0; 2], &[2]);
    free(gone);
    let status = unsafe {
        mlxk_gated_delta_update_chunked(q, k, v, a, b, gone, dt, s, m, 0, &mut y, &mut st)
    };
    expect_err(status, MLXK_ERR_INVALID_HANDLE, &["a_log"]);
    untouched(y, st);

    // The GPU launches (prep, state pass, output pass) are built and reach MLX, which refuses them here (no
    // such GPU); the arguments are checked before, on this path too.
    for kernels in GPU_KERNELS {
        let status = unsafe {
            gated_delta_update_chunked_via_gpu(kernels, false, r.args(), 0, &mut y, &mut st)
        };
        expect_err(status, MLXK_ERR_BACKEND, &[refused_launch(kernels)]);
        untouched(y, st);
        let status = unsafe {
            gated_delta_update_chunked_via_gpu(kernels, false, r.args(), 8, &mut y, &mut st)
        };
        expect_err(status, MLXK_ERR_INVALID_ARGUMENT, &["chunk_size"]);
        untouched(y, st);
    }
    r.free();
}

/// A NaN or inf in one value of v spreads as in the exact update: to that value row of that
/// head, from that token on (y and the state), and nowhere else; in k, to every row of the heads
/// reading that key head, from that token on. (Which values are not finite is compared: where
/// infinities meet, the two forms may differ between inf and NaN.)
#[test]
fn nan_inputs_spread_as_in_the_exact_update() {
    let mut rng = Rng::fresh();
    let dims = [2, 40, 2, 4, 64, 8];
    let [_, t, hk, hv, dk, dv] = dims;
    // 0x7FC0: NaN; 0x7F80: +inf (bf16). Compared: which values are not finite.
    for (what, token, bits) in [
        ("v", 5usize, 0x7FC0u16),
        ("v", 20, 0x7FC0),
        ("k", 5, 0x7FC0),
        ("k", 33, 0x7FC0),
        ("v", 9, 0x7F80),
        ("k", 17, 0x7F80),
    ] {
        let mut host = HostRecurrence::random(&mut rng, dims);
        match what {
            "v" => host.v[((t + token) * hv + 1) * dv + 2] = bits, // b 1, head 1, row 2
            _ => host.k[((t + token) * hk + 1) * dk + 7] = bits,   // b 1, key head 1
        }
        let r = host.window(0, t);
        let (status, ye, se) = r.run();
        ok(status);
        for chunk in [0, 16, 64] {
            let (status, yc, sc) = run_chunked(&r, chunk);
            ok(status);
            let (ye_v, yc_v) = (read_widened(ye), read_widened(yc));
            let (se_v, sc_v) = (read_f32(se), read_f32(sc));
            for (i, (e, c)) in ye_v.iter().zip(&yc_v).enumerate() {
                assert_eq!(
                    e.is_finite(),
                    c.is_finite(),
                    "{what} {bits:#x} at {token}, chunk {chunk}: y[{i}] exact {e} chunked {c}"
                );
            }
            for (i, (e, c)) in se_v.iter().zip(&sc_v).enumerate() {
                assert_eq!(
                    e.is_finite(),
                    c.is_finite(),
                    "{what} {bits:#x} at {token}, chunk {chunk}: state[{i}] exact {e} chunked {c}"
                );
            }
            assert!(ye_v.iter().any(|x| !x.is_finite()) && ye_v.iter().any(|x| x.is_finite()));
            free(yc);
            free(sc);
        }
        free(ye);
        free(se);
        r.free_inputs();
    }
}

/// Heads whose gates decay strongly (g far below 1, down to the subnormal range and zero, as
/// some heads of real checkpoints have): the chunked form, which flushes subnormals, agrees with
/// the exact update (which keeps them) within the same bounds.
#[test]
fn strongly_decaying_heads() {
    let mut rng = Rng::fresh();
    for (dims, a_log) in [
        ([1, 200, 2, 4, 128, 32], [0.5f32, 4.5, 3.0, 4.6]),
        ([2, 70, 1, 4, 64, 16], [4.4, 4.5, 4.55, 5.0]),
    ] {
        for with_state in [false, true] {
            let mut r = Recurrence::random(&mut rng, dims, with_state, false);
            free(r.a_log);
            r.a_log = new_f32(&a_log, &[4]);
            let label = format!("{dims:?} a_log {a_log:?} state {with_state}");
            let (y, s) = compare(&r, 0, MLXK_DTYPE_BFLOAT16, &label);
            eprintln!("{label}: |dy| {y:.2e}, |ds| {s:.2e} of scale");
            r.free();
        }
    }
}
