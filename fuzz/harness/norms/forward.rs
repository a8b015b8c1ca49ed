//! Target `norms`: mlxk_silu_rms_heads, mlxk_gated_rms_norm and
//! mlxk_gated_delta_update_from_conv (against the head split then the update) with random head
//! counts and
//! widths (inside and outside [1, 128]), channel counts that do or do not add up, random
//! dtypes, eps values (0, NaN, ±Inf, negative, subnormal, huge), aliased and NULL
//! out-parameters, NULL / freed / foreign handles, empty arrays with huge other dims, and
//! tight memory limits. Checked properties on success: documented shapes and dtypes; finite
//! inputs of moderate size with eps > 0 give finite outputs; a zero gate gives a zero output.

use std::ptr::null_mut;

use super::*;

fn silu_rms_heads(ctx: &mut Ctx, input: &mut Input) {
    let [b, s, hk, hv, dk, dv] = split_dims(input);
    let channels = (2 * hk * dk + hv * dv).min(i32::MAX as i64);
    let dtype = pick_dtype(input);
    let mode = DataMode::pick(input);
    let x = ctx.arr(input, "x", vec![b, s, channels], dtype, mode);
    let q_scale = ctx.arr(input, "q_scale", vec![dk], dtype, mode);
    let k_scale = ctx.arr(input, "k_scale", vec![dk], dtype, mode);
    // Integer arguments: usually the ones x was built for.
    let mut int_arg = |v: i64| -> i32 {
        if input.chance(12) {
            input.pick(&[0, -1, i32::MIN, i32::MAX, v as i32 + 1, 129, 1 << 20])
        } else {
            v as i32
        }
    };
    let (key_heads, value_heads, value_width) = (int_arg(hk), int_arg(hv), int_arg(dv));
    let eps = pick_eps(input, 1e-6 / dk.max(1) as f32);
    let outs = 23 - input.u8() % 24;

    let mut e = Expect::new();
    match outs {
        0 => e.fail(MLXK_ERR_NULL_POINTER, "q is NULL"),
        1 => e.fail(MLXK_ERR_NULL_POINTER, "k is NULL"),
        2 => e.fail(MLXK_ERR_NULL_POINTER, "v is NULL"),
        3 | 4 => e.fail(
            MLXK_ERR_INVALID_ARGUMENT,
            "two out-parameters are the same pointer",
        ),
        _ => {}
    }
    let tight = tight_limit(input);
    let mut dims = None;
    if handles(&mut e, &[&x, &q_scale, &k_scale]) {
        let heads = [key_heads, value_heads, value_width];
        if let Some(dk) = split_rules(&mut e, &x, &q_scale, &k_scale, heads, eps) {
            let (hk, hv, dv) = (key_heads as i64, value_heads as i64, value_width as i64);
            if !e.must_fail() {
                let (b, s) = (x.shape[0], x.shape[1]);
                let size = dtype_size(x.dtype);
                let qk = count(&[b, s, hk, dk]).unwrap();
                let vv = count(&[b, s, hv, dv]).unwrap();
                if qk > i32::MAX as u128 || vv > i32::MAX as u128 {
                    e.fail(MLXK_ERR_INVALID_ARGUMENT, "an output above 2^31-1 elements");
                } else if (2 * qk + vv) * size as u128 > current_limit(tight) {
                    e.fail(MLXK_ERR_OUT_OF_MEMORY, "results above the limit");
                }
                dims = Some((b, s, hk, hv, dk, dv));
            }
        }
    }
    let (mut q, mut k, mut v) = (sentinel(), sentinel(), sentinel());
    let qp: *mut H = if outs == 0 { null_mut() } else { &mut q };
    let kp: *mut H = match outs {
        1 => null_mut(),
        3 => qp,
        _ => &mut k,
    };
    let vp: *mut H = match outs {
        2 => null_mut(),
        4 => kp,
        _ => &mut v,
    };
    let status = unsafe {
        mlxk_silu_rms_heads(
            x.h,
            q_scale.h,
            k_scale.h,
            key_heads,
            value_heads,
            value_width,
            eps,
            qp,
            kp,
            vp,
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_silu_rms_heads", status);
    if status == MLXK_OK {
        let (b, s, hk, hv, dk, dv) = dims.expect("a success has valid arguments");
        let qb = check_result("q", q, &[b, s, hk, dk], x.dtype);
        let kb = check_result("k", k, &[b, s, hk, dk], x.dtype);
        let vb = check_result("v", v, &[b, s, hv, dv], x.dtype);
        if x.mode == DataMode::Nice
            && q_scale.mode == DataMode::Nice
            && k_scale.mode == DataMode::Nice
            && eps > 0.0
        {
            assert!(
                all_finite(&qb, x.dtype),
                "q is not finite for finite moderate inputs"
            );
            assert!(
                all_finite(&kb, x.dtype),
                "k is not finite for finite moderate inputs"
            );
            assert!(
                all_finite(&vb, x.dtype),
                "v is not finite for finite moderate inputs"
            );
        }
        for h in [q, k, v] {
            free_ok(h);
            ctx.dead.push(h);
        }
    } else {
        assert!(
            q == sentinel() && k == sentinel() && v == sentinel(),
            "mlxk_silu_rms_heads wrote an out-parameter on failure"
        );
    }
    for a in [x, q_scale, k_scale] {
        ctx.release(a);
    }
}

/// mlxk_gated_delta_update_from_conv against its definition, the head split followed by the
/// update on its q, k and v, called with the same arguments: the fused call succeeds exactly
/// when the two do (tight memory limits included: it checks what they check, in their order),
/// and then gives their bits; a failure names the function and leaves both out-parameters in
/// place. NULL and aliased out-parameters fail on their own.
fn gated_delta_update_from_conv(ctx: &mut Ctx, input: &mut Input) {
    let [b, s, hk, mut hv, mut dk, dv] = split_dims(input);
    // Mostly shapes the update takes too: Dk a multiple of 32, Hv a multiple of Hk.
    if !input.chance(4) && hk < 1 << 20 {
        dk = input.pick(&[32i64, 64, 96, 128]);
        hv = hk * input.pick(&[1i64, 2]);
    }
    let channels = (2 * hk * dk + hv * dv).min(i32::MAX as i64);
    let dtype = pick_dtype(input);
    let mode = DataMode::pick(input);
    let x = ctx.arr(input, "x", vec![b, s, channels], dtype, mode);
    let q_scale = ctx.arr(input, "q_scale", vec![dk], dtype, mode);
    let k_scale = ctx.arr(input, "k_scale", vec![dk], dtype, mode);
    let a = ctx.arr(input, "a", vec![b, s, hv], dtype, mode);
    let gate_b = ctx.arr(input, "b", vec![b, s, hv], dtype, mode);
    // Per-head arrays of the huge head counts (with B = 0) would not fit: four heads, a
    // mismatch both paths refuse.
    let per_head = if hv > 1 << 16 { 4 } else { hv };
    let a_log = ctx.arr(input, "a_log", vec![per_head], MLXK_DTYPE_FLOAT32, mode);
    let dt_bias = ctx.arr(input, "dt_bias", vec![per_head], dtype, mode);
    let state = ctx.opt_arr(
        input,
        "state",
        vec![b, hv, dv, dk],
        MLXK_DTYPE_FLOAT32,
        mode,
    );
    let mask = ctx.opt_arr(input, "mask", vec![b, s], MLXK_DTYPE_BOOL, mode);
    let mut int_arg = |v: i64| -> i32 {
        if input.chance(12) {
            input.pick(&[0, -1, i32::MIN, i32::MAX, v as i32 + 1, 129, 1 << 20])
        } else {
            v as i32
        }
    };
    let heads = [int_arg(hk), int_arg(hv), int_arg(dv)];
    let eps = pick_eps(input, 1e-6 / dk.max(1) as f32);
    let outs = input.u8() % 16;
    let tight = tight_limit(input);
    let args = [
        &x, &q_scale, &k_scale, &a, &gate_b, &a_log, &dt_bias, &state, &mask,
    ]
    .map(|a| a.h);

    let (mut y, mut st) = (sentinel(), sentinel());
    let yp: *mut H = if outs == 0 { null_mut() } else { &mut y };
    let sp: *mut H = if outs == 1 { yp } else { &mut st };
    let status = unsafe {
        mlxk_gated_delta_update_from_conv(
            args[0], args[1], args[2], heads[0], heads[1], heads[2], eps, args[3], args[4],
            args[5], args[6], args[7], args[8], yp, sp,
        )
    };
    let message = last_error();
    check_status("mlxk_gated_delta_update_from_conv", status);
    // The two calls it stands for.
    let (mut q, mut k, mut v) = (sentinel(), sentinel(), sentinel());
    let split = unsafe {
        mlxk_silu_rms_heads(
            args[0], args[1], args[2], heads[0], heads[1], heads[2], eps, &mut q, &mut k, &mut v,
        )
    };
    check_status("mlxk_silu_rms_heads", split);
    let (mut y2, mut st2) = (sentinel(), sentinel());
    let mut update = MLXK_ERR_INVALID_ARGUMENT;
    if split == MLXK_OK {
        update = unsafe {
            mlxk_gated_delta_update(
                q, k, v, args[3], args[4], args[5], args[6], args[7], args[8], &mut y2, &mut st2,
            )
        };
        check_status("mlxk_gated_delta_update", update);
        for h in [q, k, v] {
            free_ok(h);
        }
    }
    if tight.is_some() {
        restore_limit();
    }
    let composed = split == MLXK_OK && update == MLXK_OK;
    if outs <= 1 {
        assert_ne!(
            status, MLXK_OK,
            "an out-parameter NULL or aliased was accepted"
        );
    } else {
        assert_eq!(
            status == MLXK_OK,
            composed,
            "mlxk_gated_delta_update_from_conv: {} where the head split then the update give \
             {split} / {update} ({message})",
            status
        );
    }
    if status == MLXK_OK {
        let [bi, si, hvi, dki, dvi] = [
            x.shape[0],
            x.shape[1],
            heads[1] as i64,
            q_scale.shape[0],
            heads[2] as i64,
        ];
        let yb = check_result("y", y, &[bi, si, hvi, dvi], x.dtype);
        let sb = check_result("state_out", st, &[bi, hvi, dvi, dki], MLXK_DTYPE_FLOAT32);
        let yb2 = check_result("y of the two calls", y2, &[bi, si, hvi, dvi], x.dtype);
        let sb2 = check_result(
            "state of the two calls",
            st2,
            &[bi, hvi, dvi, dki],
            MLXK_DTYPE_FLOAT32,
        );
        assert!(yb == yb2, "y differs from the head split then the update");
        assert!(
            sb == sb2,
            "state_out differs from the head split then the update"
        );
        for h in [y, st] {
            free_ok(h);
            ctx.dead.push(h);
        }
    } else {
        assert!(
            message.starts_with("mlxk_gated_delta_update_from_conv"),
            "the message names the function: {message}"
        );
        assert!(
            (yp.is_null() || y == sentinel()) && st == sentinel(),
            "mlxk_gated_delta_update_from_conv wrote an out-parameter on failure"
        );
    }
    if composed {
        free_ok(y2);
        free_ok(st2);
    }
    for a in [x, q_scale, k_scale, a, gate_b, a_log, dt_bias, state, mask] {
        ctx.release(a);
    }
}

fn gated_rms_norm(ctx: &mut Ctx, input: &mut Input) {
    let rank = input.pick(&[2usize, 1, 0, 2, 3, 4]);
    let huge = input.chance(12);
    let mut shape: Vec<i64> = (0..rank.saturating_sub(1))
        .map(|_| input.pick(&[1i64, 0, 2, 3]))
        .collect();
    if huge && !shape.is_empty() {
        // Empty, with leading dims whose product overflows i64 on the way.
        shape = vec![i32::MAX as i64, i32::MAX as i64, i32::MAX as i64, 0];
        shape.truncate(input.pick(&[2usize, 4]));
        if !shape.contains(&0) {
            shape.push(0);
        }
    }
    if rank > 0 {
        shape.push(input.pick(&[8i64, 1, 2, 3, 5, 16, 100, 128, 129, 300]));
        if input.chance(12) {
            *shape.last_mut().unwrap() = 0;
        }
    }
    let dtype = pick_dtype(input);
    let mode = DataMode::pick(input);
    let gate_mode = if input.chance(32) {
        DataMode::Zeros
    } else {
        DataMode::pick(input)
    };
    let gate_dtype = input.pick(&FLOATS);
    let width = shape.last().copied().unwrap_or(1);
    let x = ctx.arr(input, "x", shape.clone(), dtype, mode);
    let gate = ctx.arr(input, "gate", shape, gate_dtype, gate_mode);
    let weight = ctx.arr(input, "weight", vec![width], dtype, mode);
    let eps = pick_eps(input, 1e-6);
    let out_null = input.chance(10);

    let mut e = Expect::new();
    if out_null {
        e.fail(MLXK_ERR_NULL_POINTER, "out is NULL");
    }
    let tight = tight_limit(input);
    if handles(&mut e, &[&x, &gate, &weight]) {
        if x.shape.is_empty() {
            e.fail(MLXK_ERR_SHAPE, "x is a scalar");
        }
        if !is_float(x.dtype) {
            e.fail(MLXK_ERR_DTYPE, "x is not float");
        }
        let d = x.shape.last().copied();
        if d.is_some_and(|d| d < 1) {
            e.fail(MLXK_ERR_SHAPE, "D < 1");
        }
        if gate.shape != x.shape {
            e.fail(MLXK_ERR_SHAPE, "gate's shape differs from x's");
        }
        if !is_float(gate.dtype) {
            e.fail(MLXK_ERR_DTYPE, "gate is not float");
        }
        if weight.shape.len() != 1 || d.is_some_and(|d| weight.shape[0] != d) {
            e.fail(MLXK_ERR_SHAPE, "weight is not [D]");
        }
        if weight.dtype != x.dtype {
            e.fail(MLXK_ERR_DTYPE, "weight's dtype differs from x's");
        }
        if !eps_valid(eps) {
            e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("eps {eps}"));
        }
        if !e.must_fail() {
            let bytes = count(&x.shape).unwrap() * dtype_size(x.dtype) as u128;
            if bytes > current_limit(tight) {
                e.fail(MLXK_ERR_OUT_OF_MEMORY, "result above the limit");
            }
        }
    }
    let mut out = sentinel();
    let status = unsafe {
        mlxk_gated_rms_norm(
            x.h,
            gate.h,
            weight.h,
            eps,
            if out_null { null_mut() } else { &mut out },
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_gated_rms_norm", status);
    if status == MLXK_OK {
        let ob = check_result("out", out, &x.shape, x.dtype);
        let moderate = x.mode == DataMode::Nice && weight.mode == DataMode::Nice && eps > 0.0;
        if moderate && gate.mode == DataMode::Nice {
            assert!(
                all_finite(&ob, x.dtype),
                "out is not finite for finite moderate inputs"
            );
        }
        if moderate && gate.mode == DataMode::Zeros {
            let n = ob.len() / dtype_size(x.dtype);
            assert!(
                (0..n).all(|i| float_at(&ob, x.dtype, i) == 0.0),
                "a zero gate gave a non-zero output"
            );
        }
        free_ok(out);
        ctx.dead.push(out);
    } else {
        assert_eq!(
            out,
            sentinel(),
            "mlxk_gated_rms_norm wrote its out-parameter on failure"
        );
    }
    for a in [x, gate, weight] {
        ctx.release(a);
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
        match input.u8() % 3 {
            0 => silu_rms_heads(&mut ctx, input),
            1 => gated_rms_norm(&mut ctx, input),
            _ => gated_delta_update_from_conv(&mut ctx, input),
        }
    }
}
