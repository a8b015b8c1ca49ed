//! Target `norms`: mlxk_silu_rms_heads, mlxk_gated_rms_norm and
//! mlxk_gated_delta_update_from_conv (against the head split then the update) with random head
//! counts and
//! widths (inside and outside [1, 128]), channel counts that do or do not add up, random
//! dtypes, eps values (0, NaN, ±Inf, negative, subnormal, huge), aliased and NULL
//! out-parameters, NULL / freed / foreign handles, empty arrays with huge other dims, and
//! tight memory limits. Checked properties on success: documented shapes and dtypes; finite
//! inputs of moderate size with eps > 0 give finite outputs; a zero gate gives a zero output.
//!
//! Target `norms_vjp`: their backward passes, mlxk_silu_rms_heads_vjp and
//! mlxk_gated_rms_norm_vjp, with the same argument mix plus optional cotangents (absent, or of
//! random dtypes and perturbed shapes). Checked properties on success: documented shapes and
//! dtypes; absent cotangents give zero gradients; finite moderate inputs with eps > 0 give
//! finite gradients; a zero gate gives zero gradients of x and the weight.

use std::ptr::null_mut;

use super::*;

const MAX_ROUNDS: usize = 4;
const MAX_ELEMENTS: u128 = 1 << 18;

struct Arr {
    name: &'static str,
    kind: Kind,
    shape: Vec<i64>,
    dtype: mlxk_dtype,
    h: H,
    bytes: Vec<u8>,
    mode: DataMode,
}

struct Ctx {
    dead: Vec<H>,
    foreign: Foreign,
}

impl Ctx {
    fn arr(
        &mut self,
        input: &mut Input,
        name: &'static str,
        mut shape: Vec<i64>,
        mut dtype: mlxk_dtype,
        mode: DataMode,
    ) -> Arr {
        let mut kind = Kind::Live;
        if input.chance(14) {
            let old = (shape.clone(), dtype);
            match input.u8() % 7 {
                0 => dtype = (input.u8() % 8) as mlxk_dtype,
                1 => {
                    shape.pop();
                }
                2 => shape.push(input.pick(&[1i64, 2])),
                3 if !shape.is_empty() => {
                    let axis = input.below(shape.len());
                    let d = shape[axis];
                    shape[axis] =
                        (input.pick(&[0i64, 1, 2, d + 1, d * 2, d - 1])).min(i32::MAX as i64);
                }
                4 => kind = Kind::Null,
                5 => kind = Kind::Dead,
                _ => kind = Kind::Foreign,
            }
            if count(&shape).is_none_or(|n| n > MAX_ELEMENTS) {
                (shape, dtype) = old;
            }
        }
        let mut mode = mode;
        if !is_float(dtype) && mode != DataMode::Zeros {
            mode = if dtype == MLXK_DTYPE_BOOL {
                DataMode::Nice
            } else {
                DataMode::Raw
            };
        }
        let mut bytes = Vec::new();
        let h = if kind == Kind::Live {
            let mut fill = Fill::new(input.u16() as u64);
            bytes = make_data(&mut fill, count_usize(&shape), dtype, mode);
            new_array(&bytes, &shape, dtype)
        } else {
            handle_of(kind, null_mut(), &self.dead, &self.foreign, input)
        };
        Arr {
            name,
            kind,
            shape,
            dtype,
            h,
            bytes,
            mode,
        }
    }

    /// An optional argument (a cotangent): absent (NULL) one time in three, else as `arr`.
    fn opt_arr(
        &mut self,
        input: &mut Input,
        name: &'static str,
        shape: Vec<i64>,
        dtype: mlxk_dtype,
        mode: DataMode,
    ) -> Arr {
        if input.u8() % 3 == 0 {
            return Arr {
                name,
                kind: Kind::Null,
                shape,
                dtype,
                h: null_mut(),
                bytes: Vec::new(),
                mode,
            };
        }
        self.arr(input, name, shape, dtype, mode)
    }

    fn release(&mut self, a: Arr) {
        if a.kind == Kind::Live {
            free_ok(a.h);
            self.dead.push(a.h);
        }
    }
}

fn handles(e: &mut Expect, arrs: &[&Arr]) -> bool {
    handles_opt(e, arrs, &[])
}

/// Handle rules for required and optional (NULL allowed) arguments; false when one is unusable.
fn handles_opt(e: &mut Expect, arrs: &[&Arr], optional: &[&Arr]) -> bool {
    let mut usable = true;
    for a in arrs {
        expect_handle(e, a.name, a.kind, false);
        usable &= a.kind == Kind::Live;
    }
    for a in optional {
        expect_handle(e, a.name, a.kind, true);
        usable &= matches!(a.kind, Kind::Live | Kind::Null);
    }
    if !usable {
        e.maybe(MLXK_ERR_SHAPE, "rules over an unusable handle");
        e.maybe(MLXK_ERR_DTYPE, "rules over an unusable handle");
    }
    usable
}

fn pick_dtype(input: &mut Input) -> mlxk_dtype {
    if input.chance(12) {
        input.pick(&[
            MLXK_DTYPE_INT8,
            MLXK_DTYPE_BOOL,
            MLXK_DTYPE_UINT32,
            MLXK_DTYPE_INT32,
        ])
    } else {
        input.pick(&[
            MLXK_DTYPE_BFLOAT16,
            MLXK_DTYPE_BFLOAT16,
            MLXK_DTYPE_FLOAT16,
            MLXK_DTYPE_FLOAT32,
        ])
    }
}

/// The head split's dims (b, s, hk, hv, dk, dv): usually small, sometimes empty with huge head
/// counts, sometimes a Dk outside [1, 128].
fn split_dims(input: &mut Input) -> [i64; 6] {
    let huge = input.chance(12);
    let (b, s) = if huge {
        (0i64, input.pick(&[1i64, 65536, i32::MAX as i64]))
    } else {
        (
            input.pick(&[1i64, 0, 1, 2, 3]),
            input.pick(&[1i64, 0, 1, 2, 3, 5]),
        )
    };
    let mut hk = input.pick(&[1i64, 1, 2, 3]);
    let mut hv = input.pick(&[1i64, 2, 3, 4]);
    let mut dk = input.pick(&[1i64, 2, 3, 7, 16, 32, 64, 100, 128]);
    let mut dv = input.pick(&[1i64, 2, 3, 4, 8, 16, 64, 128]);
    if huge {
        hk = input.pick(&[1i64, 1 << 20, 1 << 25]);
        hv = input.pick(&[1i64, 1 << 20, 1 << 26]);
        dk = input.pick(&[1i64, 128]);
        dv = input.pick(&[1i64, 128]);
    } else if input.chance(24) {
        dk = input.pick(&[0i64, 129, 200]);
    }
    [b, s, hk, hv, dk, dv]
}

/// The rules of the head split's arguments (x, the scales, the head counts, eps) that its
/// backward pass shares; returns Dk when x has rank 3 and Dk is known.
fn split_rules(
    e: &mut Expect,
    x: &Arr,
    q_scale: &Arr,
    k_scale: &Arr,
    heads: [i32; 3],
    eps: f32,
) -> Option<i64> {
    if x.shape.len() != 3 {
        e.fail(MLXK_ERR_SHAPE, "x is not rank 3");
    }
    if !is_float(x.dtype) {
        e.fail(MLXK_ERR_DTYPE, "x is not float");
    }
    for sc in [q_scale, k_scale] {
        if sc.dtype != x.dtype {
            e.fail(MLXK_ERR_DTYPE, format!("{} dtype differs from x", sc.name));
        }
    }
    let dk_got = if q_scale.shape.len() == 1 {
        Some(q_scale.shape[0])
    } else {
        None
    };
    if dk_got.is_none() {
        e.fail(MLXK_ERR_SHAPE, "q_scale is not [Dk]");
    }
    if k_scale.shape.len() != 1 || dk_got.is_some_and(|d| k_scale.shape[0] != d) {
        e.fail(MLXK_ERR_SHAPE, "k_scale is not [Dk]");
    }
    if let Some(d) = dk_got {
        if !(1..=128).contains(&d) {
            e.fail(MLXK_ERR_SHAPE, format!("Dk {d}"));
        }
    }
    let (hk, hv, dv) = (heads[0] as i64, heads[1] as i64, heads[2] as i64);
    if hk < 1 {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "key_heads < 1");
    }
    if hv < 1 {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "value_heads < 1");
    }
    if !(1..=128).contains(&dv) {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "value_width outside [1, 128]");
    }
    if !eps_valid(eps) {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, format!("eps {eps}"));
    }
    if 32 * (2 * hk as i128 + hv as i128) > i32::MAX as i128 {
        e.fail(MLXK_ERR_INVALID_ARGUMENT, "too many heads for one launch");
    }
    let (Some(dk), true) = (dk_got, x.shape.len() == 3) else {
        return None;
    };
    let want = 2 * hk as i128 * dk as i128 + hv as i128 * dv as i128;
    if x.shape[2] as i128 != want {
        e.fail(
            MLXK_ERR_SHAPE,
            format!("x has {} channels, expected {want}", x.shape[2]),
        );
    }
    Some(dk)
}

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

/// A cotangent's rules: when given, the output's shape `want` (None: unknown, the model cannot
/// tell) and a float dtype.
fn cotangent_rules(e: &mut Expect, a: &Arr, want: Option<&[i64]>) {
    if a.kind != Kind::Live {
        return;
    }
    match want {
        Some(shape) if a.shape != shape => e.fail(
            MLXK_ERR_SHAPE,
            format!("{}: shape {:?}, expected {shape:?}", a.name, a.shape),
        ),
        None => e.maybe(MLXK_ERR_SHAPE, format!("{} against unknown dims", a.name)),
        _ => {}
    }
    if !is_float(a.dtype) {
        e.fail(MLXK_ERR_DTYPE, format!("{} is not float", a.name));
    }
}

/// The out-parameters of a backward pass (three of them): 0..2 NULL, 3..5 two at one place.
fn vjp_outs(input: &mut Input, e: &mut Expect, names: [&str; 3]) -> u8 {
    let outs = 23 - input.u8() % 24;
    match outs {
        0..=2 => e.fail(
            MLXK_ERR_NULL_POINTER,
            format!("{} is NULL", names[outs as usize]),
        ),
        3..=5 => e.fail(
            MLXK_ERR_INVALID_ARGUMENT,
            "two out-parameters are the same pointer",
        ),
        _ => {}
    }
    outs
}

/// Pointers for the three out-parameters as `vjp_outs` chose them.
fn out_ptrs(outs: u8, slots: &mut [H; 3]) -> [*mut H; 3] {
    let [a, b, c] = slots;
    let mut p: [*mut H; 3] = [a, b, c];
    match outs {
        0..=2 => p[outs as usize] = null_mut(),
        3 => p[1] = p[0],
        4 => p[2] = p[0],
        5 => p[2] = p[1],
        _ => {}
    }
    p
}

/// All-zero floats.
fn all_zero(bytes: &[u8], dtype: mlxk_dtype) -> bool {
    (0..bytes.len() / dtype_size(dtype)).all(|i| float_at(bytes, dtype, i) == 0.0)
}

fn silu_rms_heads_vjp(ctx: &mut Ctx, input: &mut Input) {
    let [b, s, hk, hv, dk, dv] = split_dims(input);
    let channels = (2 * hk * dk + hv * dv).min(i32::MAX as i64);
    let dtype = pick_dtype(input);
    let mode = DataMode::pick(input);
    let x = ctx.arr(input, "x", vec![b, s, channels], dtype, mode);
    let q_scale = ctx.arr(input, "q_scale", vec![dk], dtype, mode);
    let k_scale = ctx.arr(input, "k_scale", vec![dk], dtype, mode);
    let cot_dtype = |input: &mut Input| {
        if input.chance(4) {
            input.pick(&FLOATS)
        } else {
            dtype
        }
    };
    let (t0, t1, t2) = (cot_dtype(input), cot_dtype(input), cot_dtype(input));
    let cot_mode = DataMode::pick(input);
    let dq = ctx.opt_arr(input, "dq", vec![b, s, hk, dk], t0, cot_mode);
    let dkc = ctx.opt_arr(input, "dk", vec![b, s, hk, dk], t1, cot_mode);
    let dvc = ctx.opt_arr(input, "dv", vec![b, s, hv, dv], t2, cot_mode);
    let mut int_arg = |v: i64| -> i32 {
        if input.chance(12) {
            input.pick(&[0, -1, i32::MIN, i32::MAX, v as i32 + 1, 129, 1 << 20])
        } else {
            v as i32
        }
    };
    let (key_heads, value_heads, value_width) = (int_arg(hk), int_arg(hv), int_arg(dv));
    let eps = pick_eps(input, 1e-6 / dk.max(1) as f32);
    let mut e = Expect::new();
    let outs = vjp_outs(input, &mut e, ["dx", "dq_scale", "dk_scale"]);
    let tight = tight_limit(input);
    let mut dk_ok = None;
    if handles_opt(&mut e, &[&x, &q_scale, &k_scale], &[&dq, &dkc, &dvc]) {
        let heads = [key_heads, value_heads, value_width];
        let dk_got = split_rules(&mut e, &x, &q_scale, &k_scale, heads, eps);
        let lead = (x.shape.len() == 3).then(|| (x.shape[0], x.shape[1]));
        let (hk, hv, dv) = (key_heads as i64, value_heads as i64, value_width as i64);
        let qk_shape = lead.zip(dk_got).map(|((b, s), d)| vec![b, s, hk, d]);
        let v_shape = lead.map(|(b, s)| vec![b, s, hv, dv]);
        cotangent_rules(&mut e, &dq, qk_shape.as_deref());
        cotangent_rules(&mut e, &dkc, qk_shape.as_deref());
        cotangent_rules(&mut e, &dvc, v_shape.as_deref());
        if let (Some(d), false) = (dk_got, e.must_fail()) {
            let size = dtype_size(x.dtype) as u128;
            let results = (count(&x.shape).unwrap() + 2 * d as u128) * size;
            // The kernel's f64 sums of the scales' gradients, 64 jobs at most.
            let sums = 128 * 2 * d as u128 * 4;
            if results > current_limit(tight) {
                e.fail(MLXK_ERR_OUT_OF_MEMORY, "results above the limit");
            } else if results + sums > current_limit(tight) {
                e.maybe(MLXK_ERR_OUT_OF_MEMORY, "internal sums above the limit");
            }
            dk_ok = Some(d);
        }
    }
    let mut slots = [sentinel(); 3];
    let p = out_ptrs(outs, &mut slots);
    let status = unsafe {
        mlxk_silu_rms_heads_vjp(
            x.h,
            q_scale.h,
            k_scale.h,
            key_heads,
            value_heads,
            value_width,
            eps,
            dq.h,
            dkc.h,
            dvc.h,
            p[0],
            p[1],
            p[2],
        )
    };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_silu_rms_heads_vjp", status);
    if status == MLXK_OK {
        let d = dk_ok.expect("a success has valid arguments");
        let results = [
            check_result("dx", slots[0], &x.shape, x.dtype),
            check_result("dq_scale", slots[1], &[d], x.dtype),
            check_result("dk_scale", slots[2], &[d], x.dtype),
        ];
        let cots = [&dq, &dkc, &dvc];
        if cots.iter().all(|c| c.kind == Kind::Null) {
            for r in &results {
                assert!(
                    all_zero(r, x.dtype),
                    "absent cotangents gave a non-zero gradient"
                );
            }
        }
        let nice = [&x, &q_scale, &k_scale]
            .into_iter()
            .chain(cots.into_iter().filter(|c| c.kind == Kind::Live))
            .all(|a| a.mode == DataMode::Nice);
        if nice && eps > 0.0 {
            for r in &results {
                assert!(
                    all_finite(r, x.dtype),
                    "a gradient is not finite for finite moderate inputs"
                );
            }
        }
        for h in slots {
            free_ok(h);
            ctx.dead.push(h);
        }
    } else {
        assert!(
            slots == [sentinel(); 3],
            "mlxk_silu_rms_heads_vjp wrote an out-parameter on failure"
        );
    }
    for a in [x, q_scale, k_scale, dq, dkc, dvc] {
        ctx.release(a);
    }
}

fn gated_rms_norm_vjp(ctx: &mut Ctx, input: &mut Input) {
    let rank = input.pick(&[2usize, 1, 0, 2, 3]);
    let mut shape: Vec<i64> = (0..rank.saturating_sub(1))
        .map(|_| input.pick(&[1i64, 0, 2, 3]))
        .collect();
    if rank > 0 {
        shape.push(input.pick(&[8i64, 1, 2, 3, 5, 16, 100, 128, 129, 300]));
        if input.chance(12) {
            *shape.last_mut().unwrap() = 0;
        }
    }
    let dtype = pick_dtype(input);
    let mode = DataMode::pick(input);
    let gate_mode = if input.chance(16) {
        DataMode::Zeros
    } else {
        DataMode::pick(input)
    };
    let gate_dtype = input.pick(&FLOATS);
    let width = shape.last().copied().unwrap_or(1);
    let x = ctx.arr(input, "x", shape.clone(), dtype, mode);
    let gate = ctx.arr(input, "gate", shape.clone(), gate_dtype, gate_mode);
    let weight = ctx.arr(input, "weight", vec![width], dtype, mode);
    let dout_dtype = if input.chance(4) {
        input.pick(&FLOATS)
    } else {
        dtype
    };
    let dout_mode = DataMode::pick(input);
    let dout = ctx.opt_arr(input, "dout", shape, dout_dtype, dout_mode);
    let eps = pick_eps(input, 1e-6);
    let mut e = Expect::new();
    let outs = vjp_outs(input, &mut e, ["dx", "dgate", "dweight"]);
    let tight = tight_limit(input);
    if handles_opt(&mut e, &[&x, &gate, &weight], &[&dout]) {
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
        cotangent_rules(&mut e, &dout, Some(&x.shape));
        if let (Some(d), false) = (d, e.must_fail()) {
            let n = count(&x.shape).unwrap();
            let results = n * dtype_size(x.dtype) as u128
                + n * dtype_size(gate.dtype) as u128
                + d as u128 * dtype_size(x.dtype) as u128;
            // The kernel's f64 sums of the weight's gradient, 64 jobs at most.
            let sums = 128 * d as u128 * 4;
            if results > current_limit(tight) {
                e.fail(MLXK_ERR_OUT_OF_MEMORY, "results above the limit");
            } else if results + sums > current_limit(tight) {
                e.maybe(MLXK_ERR_OUT_OF_MEMORY, "internal sums above the limit");
            }
        }
    }
    let mut slots = [sentinel(); 3];
    let p = out_ptrs(outs, &mut slots);
    let status =
        unsafe { mlxk_gated_rms_norm_vjp(x.h, gate.h, weight.h, eps, dout.h, p[0], p[1], p[2]) };
    if tight.is_some() {
        restore_limit();
    }
    e.check("mlxk_gated_rms_norm_vjp", status);
    if status == MLXK_OK {
        let d = *x.shape.last().unwrap();
        let dx = check_result("dx", slots[0], &x.shape, x.dtype);
        let dgate = check_result("dgate", slots[1], &x.shape, gate.dtype);
        let dweight = check_result("dweight", slots[2], &[d], x.dtype);
        if dout.kind == Kind::Null {
            assert!(
                all_zero(&dx, x.dtype)
                    && all_zero(&dgate, gate.dtype)
                    && all_zero(&dweight, x.dtype),
                "an absent dout gave a non-zero gradient"
            );
        }
        let moderate = x.mode == DataMode::Nice && weight.mode == DataMode::Nice && eps > 0.0;
        let dout_nice = dout.kind == Kind::Null || dout.mode == DataMode::Nice;
        if moderate && dout_nice && gate.mode == DataMode::Nice {
            assert!(
                all_finite(&dx, x.dtype)
                    && all_finite(&dgate, gate.dtype)
                    && all_finite(&dweight, x.dtype),
                "a gradient is not finite for finite moderate inputs"
            );
        }
        if moderate && dout_nice && gate.mode == DataMode::Zeros {
            // silu(0) = 0: out does not depend on x or the weight.
            assert!(
                all_zero(&dx, x.dtype) && all_zero(&dweight, x.dtype),
                "a zero gate gave a non-zero gradient of x or weight"
            );
        }
        for h in slots {
            free_ok(h);
            ctx.dead.push(h);
        }
    } else {
        assert!(
            slots == [sentinel(); 3],
            "mlxk_gated_rms_norm_vjp wrote an out-parameter on failure"
        );
    }
    for a in [x, gate, weight, dout] {
        ctx.release(a);
    }
}

/// Target `norms_vjp`: the backward passes mlxk_silu_rms_heads_vjp and
/// mlxk_gated_rms_norm_vjp with the forward's argument mix plus optional cotangents of random
/// dtypes and shapes, and three out-parameters (NULL, aliased).
pub fn run_vjp(input: &mut Input) {
    let mut ctx = Ctx {
        dead: Vec::new(),
        foreign: Foreign::new(),
    };
    for _ in 0..MAX_ROUNDS {
        if input.exhausted() {
            break;
        }
        if input.u8() % 2 == 0 {
            silu_rms_heads_vjp(&mut ctx, input);
        } else {
            gated_rms_norm_vjp(&mut ctx, input);
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
        match input.u8() % 3 {
            0 => silu_rms_heads(&mut ctx, input),
            1 => gated_rms_norm(&mut ctx, input),
            _ => gated_delta_update_from_conv(&mut ctx, input),
        }
    }
}
