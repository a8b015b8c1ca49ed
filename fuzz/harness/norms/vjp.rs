//! Target `norms_vjp`: the backward passes of `norms`' kernels, mlxk_silu_rms_heads_vjp and
//! mlxk_gated_rms_norm_vjp, with the forward's argument mix plus optional cotangents (absent,
//! or of random dtypes and perturbed shapes). Checked properties on success: documented shapes and
//! dtypes; absent cotangents give zero gradients; finite moderate inputs with eps > 0 give
//! finite gradients; a zero gate gives zero gradients of x and the weight.

use std::ptr::null_mut;

use super::*;

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
