//! `mlxk_gated_delta_update_vjp` through the C ABI: every gradient (q, k, v, the gate inputs and
//! the initial state) against central differences of a float64 forward on fresh random inputs,
//! masks, GQA, absent state and cotangents, output shapes and dtypes, and argument checks.

mod common;
use common::*;
use std::ptr::{null, null_mut};

/// Inputs of one call, f32 on the host side.
struct Case {
    dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    state: Option<Vec<f32>>,
    mask: Option<Vec<bool>>,
    dy: Vec<f32>,
    dstate_out: Vec<f32>,
}

fn random_case(rng: &mut Rng, dims: [usize; 6], with_state: bool, with_mask: bool) -> Case {
    let [b, t, hk, hv, dk, dv] = dims;
    let scale = (dk as f32).powf(-0.5);
    Case {
        dims,
        q: rng.vec(b * t * hk * dk, scale),
        k: rng.vec(b * t * hk * dk, scale),
        v: rng.vec(b * t * hv * dv, 1.0),
        a: rng.vec(b * t * hv, 1.5),
        b: rng.vec(b * t * hv, 2.0),
        a_log: rng.vec(hv, 1.0),
        dt_bias: rng.vec(hv, 0.5),
        state: with_state.then(|| rng.vec(b * hv * dv * dk, 0.5)),
        mask: with_mask.then(|| (0..b * t).map(|i| i % 4 != 2).collect()),
        dy: rng.vec(b * t * hv * dv, 1.0),
        dstate_out: rng.vec(b * hv * dv * dk, 0.5),
    }
}

/// The float64 loss sum(dy · y) + sum(dstate_out · state_out), gates included.
fn loss(c: &Case, x: &[Vec<f64>; 8]) -> f64 {
    let [q, k, v, a, b, a_log, dt_bias, s0] = x;
    let [bs, t, hk, hv, dk, dv] = c.dims;
    let mut total = 0.0;
    for bi in 0..bs {
        for h in 0..hv {
            let kh = h / (hv / hk);
            for row in 0..dv {
                let base = ((bi * hv + h) * dv + row) * dk;
                let mut s: Vec<f64> = s0[base..base + dk].to_vec();
                for ti in 0..t {
                    if c.mask.as_ref().is_some_and(|m| !m[bi * t + ti]) {
                        continue;
                    }
                    let gi = (bi * t + ti) * hv + h;
                    let z = a[gi] + dt_bias[h];
                    let softplus = z.max(0.0) + (-z.abs()).exp().ln_1p();
                    let g = (-a_log[h].exp() * softplus).exp();
                    let beta = 1.0 / (1.0 + (-b[gi]).exp());
                    let kq = ((bi * t + ti) * hk + kh) * dk;
                    let vi = ((bi * t + ti) * hv + h) * dv + row;
                    s.iter_mut().for_each(|x| *x *= g);
                    let kv: f64 = (0..dk).map(|j| s[j] * k[kq + j]).sum();
                    let delta = (v[vi] - kv) * beta;
                    (0..dk).for_each(|j| s[j] += k[kq + j] * delta);
                    let y: f64 = (0..dk).map(|j| s[j] * q[kq + j]).sum();
                    total += c.dy[vi] as f64 * y;
                }
                total += (0..dk)
                    .map(|j| c.dstate_out[base + j] as f64 * s[j])
                    .sum::<f64>();
            }
        }
    }
    total
}

/// Runs the C function on f32 handles; returns the eight gradients read back as f32.
fn run(c: &Case, with_cotangents: bool) -> Vec<Vec<f32>> {
    let [b, t, hk, hv, dk, dv] = c.dims;
    let (b, t, hk, hv, dk, dv) = (
        b as i32, t as i32, hk as i32, hv as i32, dk as i32, dv as i32,
    );
    let q = new_f32(&c.q, &[b, t, hk, dk]);
    let k = new_f32(&c.k, &[b, t, hk, dk]);
    let v = new_f32(&c.v, &[b, t, hv, dv]);
    let a = new_f32(&c.a, &[b, t, hv]);
    let bb = new_f32(&c.b, &[b, t, hv]);
    let a_log = new_f32(&c.a_log, &[hv]);
    let dt = new_f32(&c.dt_bias, &[hv]);
    let state = c
        .state
        .as_ref()
        .map_or(null_mut(), |s| new_f32(s, &[b, hv, dv, dk]));
    let mask = c.mask.as_ref().map_or(null_mut(), |m| new_bool(m, &[b, t]));
    let (dy, ds) = if with_cotangents {
        (
            new_f32(&c.dy, &[b, t, hv, dv]),
            new_f32(&c.dstate_out, &[b, hv, dv, dk]),
        )
    } else {
        (null_mut(), null_mut())
    };
    let mut outs = [null_mut(); 8];
    let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut outs;
    ok(unsafe {
        mlxk_gated_delta_update_vjp(
            q, k, v, a, bb, a_log, dt, state, mask, dy, ds, o0, o1, o2, o3, o4, o5, o6, o7,
        )
    });
    let expect_shapes: [Vec<i32>; 8] = [
        vec![b, t, hk, dk],
        vec![b, t, hk, dk],
        vec![b, t, hv, dv],
        vec![b, t, hv],
        vec![b, t, hv],
        vec![hv],
        vec![hv],
        vec![b, hv, dv, dk],
    ];
    let grads = outs
        .iter()
        .zip(&expect_shapes)
        .map(|(&h, shape)| {
            assert_eq!(&shape_of(h), shape);
            assert_eq!(dtype_of(h), MLXK_DTYPE_FLOAT32);
            let values = read_f32(h);
            free(h);
            values
        })
        .collect();
    for h in [q, k, v, a, bb, a_log, dt, state, mask, dy, ds] {
        if !h.is_null() {
            free(h);
        }
    }
    grads
}

#[test]
fn gradients_match_central_differences_of_a_float64_forward() {
    let mut rng = Rng::fresh();
    let cases = [
        ([2, 5, 1, 2, 32, 3], true, false),
        ([1, 9, 2, 4, 32, 2], false, true),
        ([1, 70, 1, 1, 64, 2], true, true), // more tokens than one checkpoint interval
    ];
    for (dims, with_state, with_mask) in cases {
        let c = random_case(&mut rng, dims, with_state, with_mask);
        let got = run(&c, true);
        let f64v = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let [bs, _, _, hv, dk, dv] = dims;
        let s0 = c
            .state
            .as_ref()
            .map_or(vec![0.0; bs * hv * dv * dk], |s| f64v(s));
        let base = [
            f64v(&c.q),
            f64v(&c.k),
            f64v(&c.v),
            f64v(&c.a),
            f64v(&c.b),
            f64v(&c.a_log),
            f64v(&c.dt_bias),
            s0,
        ];
        let names = ["dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"];
        for (which, grad) in got.iter().enumerate() {
            let step = grad.len().div_ceil(12).max(1);
            for i in (0..grad.len()).step_by(step) {
                let h = 1e-5;
                let mut x = base.clone();
                x[which][i] += h;
                let up = loss(&c, &x);
                x[which][i] -= 2.0 * h;
                let down = loss(&c, &x);
                let want = (up - down) / (2.0 * h);
                // f32 arithmetic over up to T · Dk terms, against float64: 1e-3 of the
                // magnitude plus an absolute 1e-4 for gradients near zero.
                assert!(
                    (grad[i] as f64 - want).abs() <= 1e-3 * want.abs() + 1e-4,
                    "{dims:?}: {}[{i}] {} vs {want}",
                    names[which],
                    grad[i]
                );
            }
        }
    }
}

#[test]
fn absent_cotangents_give_zero_gradients() {
    let mut rng = Rng::fresh();
    let c = random_case(&mut rng, [1, 4, 1, 2, 32, 4], true, false);
    for grad in run(&c, false) {
        assert!(grad.iter().all(|&x| x == 0.0));
    }
}

#[test]
fn bf16_inputs_give_gradients_in_their_dtypes() {
    let mut rng = Rng::fresh();
    let (b, t, hk, hv, dk, dv) = (1, 3, 1, 2, 32, 4);
    let q = new_bf16(&rng.vec(b * t * hk * dk, 0.2), &[1, 3, 1, 32]);
    let k = new_bf16(&rng.vec(b * t * hk * dk, 0.2), &[1, 3, 1, 32]);
    let v = new_bf16(&rng.vec(b * t * hv * dv, 1.0), &[1, 3, 2, 4]);
    let a = new_bf16(&rng.vec(b * t * hv, 1.0), &[1, 3, 2]);
    let bb = new_f32(&rng.vec(b * t * hv, 1.0), &[1, 3, 2]);
    let a_log = new_f32(&rng.vec(hv, 1.0), &[2]);
    let dt = new_bf16(&rng.vec(hv, 1.0), &[2]);
    let dy = new_bf16(&rng.vec(b * t * hv * dv, 1.0), &[1, 3, 2, 4]);
    let mut outs = [null_mut(); 8];
    let [o0, o1, o2, o3, o4, o5, o6, o7] = &mut outs;
    ok(unsafe {
        mlxk_gated_delta_update_vjp(
            q,
            k,
            v,
            a,
            bb,
            a_log,
            dt,
            null(),
            null(),
            dy,
            null(),
            o0,
            o1,
            o2,
            o3,
            o4,
            o5,
            o6,
            o7,
        )
    });
    let want = [
        MLXK_DTYPE_BFLOAT16,
        MLXK_DTYPE_BFLOAT16,
        MLXK_DTYPE_BFLOAT16,
        MLXK_DTYPE_BFLOAT16,
        MLXK_DTYPE_FLOAT32,
        MLXK_DTYPE_FLOAT32,
        MLXK_DTYPE_BFLOAT16,
        MLXK_DTYPE_FLOAT32,
    ];
    for (h, dtype) in outs.into_iter().zip(want) {
        assert_eq!(dtype_of(h), dtype);
        let mut as_f32 = null_mut();
        ok(unsafe { mlxk_array_astype(h, MLXK_DTYPE_FLOAT32, &mut as_f32) });
        assert!(read_f32(as_f32).iter().all(|x| x.is_finite()));
        free(as_f32);
        free(h);
    }
    for h in [q, k, v, a, bb, a_log, dt, dy] {
        free(h);
    }
}

#[test]
fn arguments_are_checked_and_named() {
    let mut rng = Rng::fresh();
    let q = new_f32(&rng.vec(32, 0.2), &[1, 1, 1, 32]);
    let v = new_f32(&rng.vec(4, 1.0), &[1, 1, 1, 4]);
    let g = new_f32(&rng.vec(1, 1.0), &[1, 1, 1]);
    let hv1 = new_f32(&rng.vec(1, 1.0), &[1]);
    let bad_dy = new_f32(&rng.vec(3, 1.0), &[1, 1, 1, 3]);
    let bf16_ds = new_bf16(&rng.vec(128, 1.0), &[1, 1, 4, 32]);
    let mut outs = [null_mut(); 8];
    let call = |dy: H, ds: H, outs: &mut [H; 8], same: bool| {
        let [o0, o1, o2, o3, o4, o5, o6, o7] = outs;
        let o7: *mut H = if same { &mut *o0 } else { o7 };
        unsafe {
            mlxk_gated_delta_update_vjp(
                q,
                q,
                v,
                g,
                g,
                hv1,
                hv1,
                null(),
                null(),
                dy,
                ds,
                o0,
                o1,
                o2,
                o3,
                o4,
                o5,
                o6,
                o7,
            )
        }
    };
    assert_eq!(call(bad_dy, null_mut(), &mut outs, false), MLXK_ERR_SHAPE);
    assert!(
        last_error().contains("dy: dimension 3 (Dv)"),
        "{}",
        last_error()
    );
    assert_eq!(call(null_mut(), bf16_ds, &mut outs, false), MLXK_ERR_DTYPE);
    assert!(last_error().contains("dstate_out"), "{}", last_error());
    assert_eq!(
        call(null_mut(), null_mut(), &mut outs, true),
        MLXK_ERR_INVALID_ARGUMENT
    );
    assert!(last_error().contains("dq and dstate"), "{}", last_error());
    assert!(
        outs.iter().all(|h| h.is_null()),
        "a refused call wrote an out-parameter"
    );
    let mut o = [null_mut(); 8];
    let [o0, o1, o2, o3, o4, o5, o6, _] = &mut o;
    let status = unsafe {
        mlxk_gated_delta_update_vjp(
            q,
            q,
            v,
            g,
            g,
            hv1,
            hv1,
            null(),
            null(),
            null(),
            null(),
            o0,
            o1,
            o2,
            o3,
            o4,
            o5,
            o6,
            null_mut(),
        )
    };
    assert_eq!(status, MLXK_ERR_NULL_POINTER);
    assert!(last_error().contains("dstate is NULL"), "{}", last_error());
    for h in [q, v, g, hv1, bad_dy, bf16_ds] {
        free(h);
    }
}
