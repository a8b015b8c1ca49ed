//! The safe API's gradients (the three `vjp`s) against the C ABI's on the same inputs, bit for
//! bit, with and without cotangents, errors naming the cotangent as the C ABI does; and the
//! recurrence's gradient against central differences of its loss.

use std::ptr::{null, null_mut};

use crate::support::api::*;
use crate::support::vjp_case::vjp;
use crate::support::*;
use mlxkern::capi::gated_rms_norm::mlxk_gated_rms_norm_vjp;
use mlxkern::capi::silu_rms_heads::mlxk_silu_rms_heads_vjp;
use mlxkern::{Array, Dtype, GatedDelta, GatedRmsNorm, SiluRmsHeads};

#[test]
fn gated_delta_vjp_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..6 {
        let hk = 1 + rng.below(2) as usize;
        let [b, t, hv, dk, dv] = [
            1 + rng.below(2) as usize,
            1 + rng.below(if case == 0 { 1 } else { 80 }) as usize,
            hk * (1 + rng.below(2) as usize),
            rng.pick(&[32, 64]),
            1 + rng.below(24) as usize,
        ];
        let dtype = rng.pick(&FLOATS);
        let gate = rng.pick(&FLOATS);
        let q = Twin::heads(&mut rng, [b, t, hk, dk], (dk as f32).powf(-0.5), dtype);
        let k = Twin::heads(&mut rng, [b, t, hk, dk], 1.0, dtype);
        let v = Twin::random(&mut rng, &[b, t, hv, dv], 1.0, dtype);
        let a = Twin::random(&mut rng, &[b, t, hv], 2.0, gate);
        let bb = Twin::random(&mut rng, &[b, t, hv], 2.0, gate);
        let a_log = Twin::random(&mut rng, &[hv], 1.0, Dtype::Float32);
        let dt = Twin::random(&mut rng, &[hv], 1.0, gate);
        let state =
            (case % 2 == 1).then(|| Twin::random(&mut rng, &[b, hv, dv, dk], 0.5, Dtype::Float32));
        let mask = (case == 4).then(|| {
            let m: Vec<bool> = (0..b * t).map(|_| rng.below(3) != 0).collect();
            Twin::bools(&m, &[b, t])
        });
        let dy_dtype = rng.pick(&FLOATS);
        let dy = (case != 2).then(|| Twin::random(&mut rng, &[b, t, hv, dv], 1.0, dy_dtype));
        let ds = (case != 3).then(|| Twin::random(&mut rng, &[b, hv, dv, dk], 1.0, Dtype::Float32));
        let mut outs = [null_mut(); 8];
        let c_in = c_args(
            [&q, &k, &v, &a, &bb, &a_log, &dt],
            [&state, &mask, &dy, &ds],
        );
        let status = vjp(c_in, None, &mut outs);
        ok(status);
        let g = safe_update([&q, &k, &v, &a, &bb, &a_log, &dt], &state, &mask)
            .vjp(r_opt(&dy), r_opt(&ds))
            .unwrap();
        let r = grads(&g);
        same_results("mlxk_gated_delta_update_vjp", &outs, &r);
        assert_eq!(g.dq.dtype().unwrap(), dtype);
        assert_eq!(g.da.dtype().unwrap(), gate);
        assert_eq!(g.dstate.shape().unwrap(), [b, hv, dv, dk]);
    }
}

#[test]
fn gated_delta_vjp_errors_name_the_cotangent() {
    let mut rng = Rng::fresh();
    let (b, t, h, dk, dv) = (1, 2, 1, 32, 4);
    let f = Dtype::Float32;
    let q = Twin::random(&mut rng, &[b, t, h, dk], 0.2, f);
    let v = Twin::random(&mut rng, &[b, t, h, dv], 1.0, f);
    let a = Twin::random(&mut rng, &[b, t, h], 1.0, f);
    let hv = Twin::random(&mut rng, &[h], 1.0, f);
    let bad_dy = Twin::random(&mut rng, &[b, t, h, dv + 1], 1.0, f);
    let bad_ds = Twin::random(&mut rng, &[b, h, dv, dk], 1.0, Dtype::Bfloat16);
    for (dy, ds, start) in [
        (Some(&bad_dy), None, "dy: "),
        (None, Some(&bad_ds), "dstate_out: "),
    ] {
        let mut outs = [null_mut(); 8];
        let c = |t: Option<&Twin>| t.map_or(null_mut(), |t| t.c) as *const mlxk_array;
        let status = vjp(
            [
                q.c,
                q.c,
                v.c,
                a.c,
                a.c,
                hv.c,
                hv.c,
                null(),
                null(),
                c(dy),
                c(ds),
            ],
            None,
            &mut outs,
        );
        let err = GatedDelta {
            q: &q.r,
            k: &q.r,
            v: &v.r,
            a: &a.r,
            b: &a.r,
            a_log: &hv.r,
            dt_bias: &hv.r,
            state: None,
            mask: None,
        }
        .vjp(dy.map(|t| &t.r), ds.map(|t| &t.r))
        .unwrap_err();
        let msg = same_error("mlxk_gated_delta_update_vjp", status, err);
        assert!(msg.starts_with(start), "{msg:?} vs {start:?}");
    }
}

/// `sum(dy · y) + sum(ds · state)` of the update at `inputs` (float32, in float64).
fn loss(dims: [usize; 5], inputs: &[Vec<f32>; 8], dy: &[f32], ds: &[f32]) -> f64 {
    let [b, t, h, dk, dv] = dims;
    let shapes: [&[usize]; 8] = [
        &[b, t, h, dk],
        &[b, t, h, dk],
        &[b, t, h, dv],
        &[b, t, h],
        &[b, t, h],
        &[h],
        &[h],
        &[b, h, dv, dk],
    ];
    let arrays: Vec<Array> = inputs
        .iter()
        .zip(shapes)
        .map(|(x, s)| Array::from_slice(x, s).unwrap())
        .collect();
    let out = recurrence(&arrays).update().unwrap();
    let dot = |a: &Array, c: &[f32]| -> f64 {
        a.to_vec::<f32>()
            .unwrap()
            .iter()
            .zip(c)
            .map(|(x, y)| *x as f64 * *y as f64)
            .sum()
    };
    dot(&out.y, dy) + dot(&out.state, ds)
}

/// The update over q, k, v, a, b, a_log, dt_bias and the state, in that order.
fn recurrence(arrays: &[Array]) -> GatedDelta<'_> {
    GatedDelta {
        q: &arrays[0],
        k: &arrays[1],
        v: &arrays[2],
        a: &arrays[3],
        b: &arrays[4],
        a_log: &arrays[5],
        dt_bias: &arrays[6],
        state: Some(&arrays[7]),
        mask: None,
    }
}

#[test]
fn gated_delta_vjp_agrees_with_central_differences() {
    let mut rng = Rng::fresh();
    let dims = [1, 5, 2, 32, 6];
    let [b, t, h, dk, dv] = dims;
    let inputs: [Vec<f32>; 8] = [
        heads(&mut rng, b * t * h * dk, dk, 0.2),
        heads(&mut rng, b * t * h * dk, dk, 1.0),
        rng.vec(b * t * h * dv, 1.0),
        rng.vec(b * t * h, 1.0),
        rng.vec(b * t * h, 1.0),
        rng.vec(h, 0.5),
        rng.vec(h, 0.5),
        rng.vec(b * h * dv * dk, 0.5),
    ];
    let dy = rng.vec(b * t * h * dv, 1.0);
    let ds = rng.vec(b * h * dv * dk, 1.0);
    let shape = |i: usize| -> Vec<usize> {
        match i {
            0 | 1 => vec![b, t, h, dk],
            2 => vec![b, t, h, dv],
            3 | 4 => vec![b, t, h],
            5 | 6 => vec![h],
            _ => vec![b, h, dv, dk],
        }
    };
    let arrays: Vec<Array> = (0..8)
        .map(|i| Array::from_slice(&inputs[i], &shape(i)).unwrap())
        .collect();
    let g = recurrence(&arrays)
        .vjp(
            Some(&Array::from_slice(&dy, &[b, t, h, dv]).unwrap()),
            Some(&Array::from_slice(&ds, &[b, h, dv, dk]).unwrap()),
        )
        .unwrap();
    let grads = grads(&g).map(|a| a.to_vec::<f32>().unwrap());
    // For each input, a random direction: <grad, e> against (L(x + he) - L(x - he)) / 2h.
    let hstep = 1e-2f32;
    for i in 0..8 {
        let e = rng.vec(inputs[i].len(), 1.0);
        let moved = |sign: f32| {
            let mut x = inputs.clone();
            x[i].iter_mut()
                .zip(&e)
                .for_each(|(v, d)| *v += sign * hstep * d);
            loss(dims, &x, &dy, &ds)
        };
        let numeric = (moved(1.0) - moved(-1.0)) / (2.0 * hstep as f64);
        let analytic: f64 = grads[i]
            .iter()
            .zip(&e)
            .map(|(g, d)| *g as f64 * *d as f64)
            .sum();
        let err = (numeric - analytic).abs() / (1.0 + analytic.abs());
        assert!(
            err < 2e-2,
            "input {i}: vjp {analytic} vs central difference {numeric}"
        );
    }
}

#[test]
fn head_split_vjp_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..6 {
        let hk = 1 + rng.below(2) as usize;
        let [b, s, hv, dk, dv] = [
            1 + rng.below(2) as usize,
            1 + rng.below(5) as usize,
            hk + rng.below(2) as usize,
            1 + rng.below(128) as usize,
            1 + rng.below(64) as usize,
        ];
        let dtype = rng.pick(&FLOATS);
        let x = Twin::random(&mut rng, &[b, s, 2 * hk * dk + hv * dv], 3.0, dtype);
        let qs = Twin::random(&mut rng, &[dk], 1.0, dtype);
        let ks = Twin::random(&mut rng, &[dk], 1.0, dtype);
        let cot = |rng: &mut Rng, shape: &[usize], on: bool| {
            let dtype = rng.pick(&FLOATS);
            on.then(|| Twin::random(rng, shape, 1.0, dtype))
        };
        let dq = cot(&mut rng, &[b, s, hk, dk], case != 1);
        let dk_ = cot(&mut rng, &[b, s, hk, dk], case != 2);
        let dv_ = cot(&mut rng, &[b, s, hv, dv], case != 3);
        let eps = 1e-6;
        // The C call on these inputs and the given cotangents: its status and results.
        let c_vjp = |dq: *const mlxk_array, dk: *const mlxk_array, dv_: *const mlxk_array| {
            let mut outs = [null_mut(); 3];
            let [o0, o1, o2] = &mut outs;
            let (hk, hv, dv) = (hk as i32, hv as i32, dv as i32);
            let status = unsafe {
                mlxk_silu_rms_heads_vjp(x.c, qs.c, ks.c, hk, hv, dv, eps, dq, dk, dv_, o0, o1, o2)
            };
            (status, outs)
        };
        let (status, outs) = c_vjp(c_opt(&dq), c_opt(&dk_), c_opt(&dv_));
        ok(status);
        let split = SiluRmsHeads {
            x: &x.r,
            q_scale: &qs.r,
            k_scale: &ks.r,
            key_heads: hk,
            value_heads: hv,
            value_width: dv,
            eps,
        };
        let g = split.vjp(r_opt(&dq), r_opt(&dk_), r_opt(&dv_)).unwrap();
        same_results(
            "mlxk_silu_rms_heads_vjp",
            &outs,
            &[&g.dx, &g.dq_scale, &g.dk_scale],
        );
        if case == 5 {
            let bad = Twin::random(&mut rng, &[b, s, hv, dv + 1], 1.0, dtype);
            let (status, _) = c_vjp(null_mut(), null_mut(), bad.c);
            let err = split.vjp(None, None, Some(&bad.r)).unwrap_err();
            let msg = same_error("mlxk_silu_rms_heads_vjp", status, err);
            assert!(msg.starts_with("dv: "), "{msg}");
        }
    }
}

#[test]
fn gated_norm_vjp_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..6 {
        let shape = random_shape(&mut rng, 3, 4, 200);
        let (dtype, [x, gate, w]) = norm_twins(&mut rng, &shape, [2.0, 3.0, 1.0]);
        let dout_dtype = rng.pick(&FLOATS);
        let dout = (case != 0).then(|| Twin::random(&mut rng, &shape, 1.0, dout_dtype));
        let mut outs = [null_mut(); 3];
        let [o0, o1, o2] = &mut outs;
        let status =
            unsafe { mlxk_gated_rms_norm_vjp(x.c, gate.c, w.c, 1e-6, c_opt(&dout), o0, o1, o2) };
        ok(status);
        let norm = GatedRmsNorm {
            x: &x.r,
            gate: &gate.r,
            weight: &w.r,
            eps: 1e-6,
        };
        let g = norm.vjp(r_opt(&dout)).unwrap();
        same_results(
            "mlxk_gated_rms_norm_vjp",
            &outs,
            &[&g.dx, &g.dgate, &g.dweight],
        );
        if case == 0 {
            // No cotangent: zero gradients.
            assert!(floats(&g.dx).iter().all(|&v| v == 0.0));
        } else {
            assert!(floats(&g.dx).iter().any(|&v| v != 0.0));
        }
        if case == 5 {
            let mut bad_shape = shape.clone();
            bad_shape.insert(0, 2);
            let bad = Twin::random(&mut rng, &bad_shape, 1.0, dtype);
            let mut outs = [null_mut(); 3];
            let [o0, o1, o2] = &mut outs;
            let status =
                unsafe { mlxk_gated_rms_norm_vjp(x.c, gate.c, w.c, 1e-6, bad.c, o0, o1, o2) };
            let err = norm.vjp(Some(&bad.r)).unwrap_err();
            let msg = same_error("mlxk_gated_rms_norm_vjp", status, err);
            assert!(msg.starts_with("dout: shape"), "{msg}");
        }
    }
}
