//! The update's gradient suites' shared case (tests/gated_delta/vjp.rs,
//! tests/gated_delta/chunked_vjp.rs): one call's host inputs, the float64 loss whose
//! gradients the VJPs compute, and the C call of the exact or the chunked VJP. Included with
//! `#[path]`.
#![allow(dead_code)]

use super::*;
use mlxkern::capi::gated_delta::{
    mlxk_gated_delta_update_chunked_vjp, mlxk_gated_delta_update_vjp,
};
use std::ptr::null_mut;

/// Inputs of one call, f32 on the host side.
pub struct Case {
    pub dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<f32>,
    pub state: Option<Vec<f32>>,
    pub mask: Option<Vec<bool>>,
    pub dy: Vec<f32>,
    pub dstate_out: Option<Vec<f32>>,
}

impl Case {
    /// A case on the given q and k: v, a (scale 1.5), b (2), a_log, dt_bias (0.5), the state
    /// (when `state`), the mask (`mask`), dy and dstate_out drawn in this order.
    pub fn random_with(
        rng: &mut Rng,
        dims: [usize; 6],
        [q, k]: [Vec<f32>; 2],
        state: bool,
        mask: impl FnOnce(&mut Rng) -> Option<Vec<bool>>,
    ) -> Case {
        let [b, t, _, hv, dk, dv] = dims;
        Case {
            dims,
            q,
            k,
            v: rng.vec(b * t * hv * dv, 1.0),
            a: rng.vec(b * t * hv, 1.5),
            b: rng.vec(b * t * hv, 2.0),
            a_log: rng.vec(hv, 1.0),
            dt_bias: rng.vec(hv, 0.5),
            state: state.then(|| rng.vec(b * hv * dv * dk, 0.5)),
            mask: mask(rng),
            dy: rng.vec(b * t * hv * dv, 1.0),
            dstate_out: Some(rng.vec(b * hv * dv * dk, 0.5)),
        }
    }
}

/// The float64 loss sum(dy · y) + sum(dstate_out · state_out), gates included.
pub fn loss(c: &Case, x: &[Vec<f64>; 8]) -> f64 {
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
                if let Some(ds) = &c.dstate_out {
                    total += (0..dk).map(|j| ds[base + j] as f64 * s[j]).sum::<f64>();
                }
            }
        }
    }
    total
}

/// `mlxk_gated_delta_update_chunked_vjp` (`chunk` Some) or `mlxk_gated_delta_update_vjp` on
/// q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out (NULL where absent); the eight
/// gradients go to `outs`.
pub fn vjp(inputs: [*const mlxk_array; 11], chunk: Option<i32>, outs: &mut [H; 8]) -> mlxk_status {
    vjp_to(inputs, chunk, outs.each_mut().map(|o| o as *mut H))
}

/// Small f32 arguments for the VJPs' argument checks (B = 1, Hk = Hv = 1, Dk = 32, Dv = 4, `t`
/// tokens), drawn in this order: q (k too) [1, t, 1, 32], v [1, t, 1, 4], g (a and b too)
/// [1, t, 1] and one head's value (a_log and dt_bias) [1].
pub fn small_args(rng: &mut Rng, t: usize) -> [H; 4] {
    let ti = t as i32;
    [
        new_f32(&rng.vec(32 * t, 0.2), &[1, ti, 1, 32]),
        new_f32(&rng.vec(4 * t, 1.0), &[1, ti, 1, 4]),
        new_f32(&rng.vec(t, 1.0), &[1, ti, 1]),
        new_f32(&rng.vec(1, 1.0), &[1]),
    ]
}

/// `vjp` with the out-parameters as pointers (NULL or the same one twice where a test wants).
pub fn vjp_to(
    inputs: [*const mlxk_array; 11],
    chunk: Option<i32>,
    outs: [*mut H; 8],
) -> mlxk_status {
    let [q, k, v, a, b, a_log, dt, state, mask, dy, ds] = inputs;
    let [o0, o1, o2, o3, o4, o5, o6, o7] = outs;
    unsafe {
        match chunk {
            Some(chunk) => mlxk_gated_delta_update_chunked_vjp(
                q, k, v, a, b, a_log, dt, state, mask, chunk, dy, ds, o0, o1, o2, o3, o4, o5, o6,
                o7,
            ),
            None => mlxk_gated_delta_update_vjp(
                q, k, v, a, b, a_log, dt, state, mask, dy, ds, o0, o1, o2, o3, o4, o5, o6, o7,
            ),
        }
    }
}

/// The loss's eight inputs in float64 (q, k, v, a, b, a_log, dt_bias, the initial state or
/// zeros), the point the central differences start from.
pub fn base64(c: &Case) -> [Vec<f64>; 8] {
    let f64v = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
    let [bs, _, _, hv, dk, dv] = c.dims;
    let s0 = c
        .state
        .as_ref()
        .map_or(vec![0.0; bs * hv * dv * dk], |s| f64v(s));
    [
        f64v(&c.q),
        f64v(&c.k),
        f64v(&c.v),
        f64v(&c.a),
        f64v(&c.b),
        f64v(&c.a_log),
        f64v(&c.dt_bias),
        s0,
    ]
}

/// The central difference (step `h`) of the loss along input `which`, entry `i`, at `base`.
pub fn central_at(c: &Case, base: &[Vec<f64>; 8], which: usize, i: usize, h: f64) -> f64 {
    let mut x = base.clone();
    x[which][i] += h;
    let up = loss(c, &x);
    x[which][i] -= 2.0 * h;
    let down = loss(c, &x);
    (up - down) / (2.0 * h)
}

/// The shapes of the eight gradients (those of q, k, v, a, b, a_log, dt_bias, the state) for
/// `dims` = B, T, Hk, Hv, Dk, Dv.
pub fn grad_shapes(dims: [usize; 6]) -> [Vec<usize>; 8] {
    let [b, t, hk, hv, dk, dv] = dims;
    [
        vec![b, t, hk, dk],
        vec![b, t, hk, dk],
        vec![b, t, hv, dv],
        vec![b, t, hv],
        vec![b, t, hv],
        vec![hv],
        vec![hv],
        vec![b, hv, dv, dk],
    ]
}

/// The names of the eight gradients, in the VJPs' order.
pub const GRADS: [&str; 8] = ["dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate"];

/// `c` as f32 handles: q, k, v, a, b, a_log, dt_bias, the state and the mask (NULL where
/// absent), then dy and dstate_out (NULL where absent or without `cotangents`).
pub fn handles(c: &Case, cotangents: bool) -> [H; 11] {
    let [b, t, hk, hv, dk, dv] = c.dims.map(|x| x as i32);
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
    let (dy, ds) = match cotangents {
        true => (
            new_f32(&c.dy, &[b, t, hv, dv]),
            c.dstate_out
                .as_ref()
                .map_or(null_mut(), |s| new_f32(s, &[b, hv, dv, dk])),
        ),
        false => (null_mut(), null_mut()),
    };
    [q, k, v, a, bb, a_log, dt, state, mask, dy, ds]
}

/// The eight gradients (read back as f32) of `mlxk_gated_delta_update_chunked_vjp` (`chunk`
/// Some) or `mlxk_gated_delta_update_vjp`, on f32 handles; without `cotangents`, dy and
/// dstate_out are NULL.
pub fn run(c: &Case, chunk: Option<i32>, cotangents: bool) -> Vec<Vec<f32>> {
    let hs = handles(c, cotangents);
    let mut outs = [null_mut(); 8];
    ok(vjp(hs.map(|h| h as *const mlxk_array), chunk, &mut outs));
    let shapes = grad_shapes(c.dims).map(|s| s.iter().map(|&d| d as i32).collect::<Vec<_>>());
    let grads = outs
        .iter()
        .zip(&shapes)
        .map(|(&h, shape)| {
            assert_eq!(&shape_of(h), shape);
            assert_eq!(dtype_of(h), MLXK_DTYPE_FLOAT32);
            let values = read_f32(h);
            free(h);
            values
        })
        .collect();
    for h in hs {
        if !h.is_null() {
            free(h);
        }
    }
    grads
}
