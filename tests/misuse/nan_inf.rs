//! NaN and Inf.

use super::*;

/// f32 recurrence inputs with host copies, for exact NaN bookkeeping.
struct F32Rec {
    dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    state: Vec<f32>,
    mask: Vec<bool>,
}

impl F32Rec {
    fn new(rng: &mut Rng, dims: [usize; 6]) -> Self {
        let [b, t, hk, hv, dk, dv] = dims;
        F32Rec {
            dims,
            q: rng.vec(b * t * hk * dk, 0.2),
            k: rng.vec(b * t * hk * dk, 0.2),
            v: rng.vec(b * t * hv * dv, 1.0),
            a: rng.vec(b * t * hv, 1.0),
            b: rng.vec(b * t * hv, 1.0),
            a_log: rng.vec(hv, 0.5),
            dt_bias: rng.vec(hv, 0.5),
            state: rng.vec(b * hv * dv * dk, 0.5),
            mask: vec![true; b * t],
        }
    }

    /// q, k, v, a, b, a_log, dt_bias, the state and the mask as f32 (and bool) handles.
    fn handles(&self) -> [H; 9] {
        let [b, t, hk, hv, dk, dv] = self.dims.map(|d| d as i32);
        [
            new_f32(&self.q, &[b, t, hk, dk]),
            new_f32(&self.k, &[b, t, hk, dk]),
            new_f32(&self.v, &[b, t, hv, dv]),
            new_f32(&self.a, &[b, t, hv]),
            new_f32(&self.b, &[b, t, hv]),
            new_f32(&self.a_log, &[hv]),
            new_f32(&self.dt_bias, &[hv]),
            new_f32(&self.state, &[b, hv, dv, dk]),
            new_bool(&self.mask, &[b, t]),
        ]
    }

    /// Runs update; returns (y, state_out) as f32.
    fn update(&self) -> (Vec<f32>, Vec<f32>) {
        let hs = self.handles();
        let [q, k, v, a, b, al, dt, st, m] = hs;
        let (mut y, mut s) = (null_mut(), null_mut());
        ok(unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, st, m, &mut y, &mut s) });
        let out = (read_f32(y), read_f32(s));
        hs.into_iter().chain([y, s]).for_each(free);
        out
    }

    fn replay(&self, lengths: &[i32]) -> Vec<f32> {
        let hs = self.handles();
        let (status, s) = replay(hs.map(|h| h as *const mlxk_array), lengths);
        ok(status);
        let out = read_f32(s);
        hs.into_iter().chain([s]).for_each(free);
        out
    }
}

/// Asserts `x[i]` is NaN exactly where `nan(i)` says, and finite elsewhere.
#[track_caller]
fn nan_exactly(what: &str, x: &[f32], nan: impl Fn(usize) -> bool) {
    for (i, v) in x.iter().enumerate() {
        if nan(i) {
            assert!(v.is_nan(), "{what}[{i}] = {v}, expected NaN");
        } else {
            assert!(v.is_finite(), "{what}[{i}] = {v}, expected finite");
        }
    }
}

#[test]
fn nan_and_inf_in_the_recurrence_propagate_exactly_and_never_past_a_mask() {
    let _s = serial();
    let mut rng = Rng::fresh();
    let dims = [2usize, 4, 1, 2, 32, 3];
    let [_, t, _, hv, dk, dv] = dims;
    let y_index = |b: usize, tt: usize, h: usize, d: usize| ((b * t + tt) * hv + h) * dv + d;
    let s_row = |i: usize| i / dk; // flat state index -> (b, h, dv) row
    let base = F32Rec::new(&mut rng, dims);
    let (y0, s0) = base.update();
    nan_exactly("y", &y0, |_| false);
    nan_exactly("state_out", &s0, |_| false);

    // NaN in v[b=1, t=1, h=0, dv=2]: row dv=2 of head 0 in batch 1, from token 1 on.
    let mut r = F32Rec {
        v: base.v.clone(),
        ..F32Rec::new(&mut rng, dims)
    };
    r.v[y_index(1, 1, 0, 2)] = f32::NAN;
    let (y, s) = r.update();
    nan_exactly("y (NaN in v)", &y, |i| {
        (0..t).any(|tt| tt >= 1 && i == y_index(1, tt, 0, 2))
    });
    nan_exactly("state_out (NaN in v)", &s, |i| {
        s_row(i) == (hv + 0) * dv + 2
    });
    // The same token masked: no NaN anywhere, y 0 there, and the replay over the prefix
    // before it is finite while the one including it is not.
    r.mask[t + 1] = false;
    let (y, s) = r.update();
    nan_exactly("y (NaN in a masked v)", &y, |_| false);
    assert!((0..hv * dv).all(|j| y[y_index(1, 1, 0, 0) + j] == 0.0));
    nan_exactly("state_out (NaN in a masked v)", &s, |_| false);
    r.mask[t + 1] = true;
    nan_exactly("replay before the NaN token", &r.replay(&[4, 1]), |_| false);
    nan_exactly("replay over the NaN token", &r.replay(&[0, 2]), |i| {
        s_row(i) == (hv + 0) * dv + 2
    });

    // NaN in the gate a[b=0, t=2, h=1]: every row of head 1 in batch 0 from token 2 on.
    let mut r = F32Rec::new(&mut rng, dims);
    r.a[2 * hv + 1] = f32::NAN;
    let (y, s) = r.update();
    nan_exactly("y (NaN in a)", &y, |i| {
        let (b, tt, h) = (i / (t * hv * dv), i / (hv * dv) % t, i / dv % hv);
        b == 0 && h == 1 && tt >= 2
    });
    nan_exactly("state_out (NaN in a)", &s, |i| s_row(i) / dv == 1); // (b 0, h 1)
                                                                     // NaN in b (beta) behaves the same.
    let mut r = F32Rec::new(&mut rng, dims);
    r.b[2 * hv + 1] = f32::NAN;
    let (_, s) = r.update();
    nan_exactly("state_out (NaN in b)", &s, |i| s_row(i) / dv == 1);

    // NaN in a_log[0]: head 0 everywhere; with every token masked, nothing at all.
    let mut r = F32Rec::new(&mut rng, dims);
    r.a_log[0] = f32::NAN;
    let (y, s) = r.update();
    nan_exactly("y (NaN in a_log)", &y, |i| i / dv % hv == 0);
    nan_exactly("state_out (NaN in a_log)", &s, |i| s_row(i) / dv % hv == 0);
    r.mask = vec![false; dims[0] * t];
    let (y, s) = r.update();
    assert!(y.iter().all(|&v| v == 0.0), "masked tokens give y = 0");
    assert_eq!(
        bits(&s),
        bits(&r.state),
        "all tokens masked: the state is returned untouched"
    );

    // +Inf in q[b=0, t=1, key head 0]: y at that token is not finite (both value heads read key
    // head 0); the state never sees q.
    let mut r = F32Rec::new(&mut rng, dims);
    r.q[dk + 5] = f32::INFINITY;
    let (y, s) = r.update();
    for (i, v) in y.iter().enumerate() {
        let (b, tt) = (i / (t * hv * dv), i / (hv * dv) % t);
        assert_eq!(v.is_finite(), !(b == 0 && tt == 1), "y[{i}] = {v}");
    }
    nan_exactly("state_out (Inf in q)", &s, |_| false);
    // Huge finite values overflow to Inf/NaN without crashing.
    let mut r = F32Rec::new(&mut rng, dims);
    r.v.iter_mut().for_each(|x| *x *= f32::MAX);
    r.k.iter_mut().for_each(|x| *x = f32::MAX);
    let _ = r.update();
}

fn bits(x: &[f32]) -> Vec<u32> {
    x.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn nan_and_inf_in_compute_g() {
    let _s = serial();
    let hv = 4;
    let mut a = vec![0.3f32; 3 * hv];
    a[hv + 2] = f32::NAN;
    a[1] = f32::INFINITY;
    a[2 * hv + 3] = f32::NEG_INFINITY;
    let mut a_log = vec![0.1f32; hv];
    a_log[0] = f32::NAN;
    let ha = new_f32(&a, &[3, hv as i32]);
    let hl = new_f32(&a_log, &[hv as i32]);
    let hd = new_f32(&[0.0; 4], &[hv as i32]);
    let mut g = null_mut();
    ok(unsafe { mlxk_compute_g(hl, ha, hd, &mut g) });
    let g = {
        let v = read_f32(g);
        free(g);
        v
    };
    for (i, &x) in g.iter().enumerate() {
        match i {
            _ if i % hv == 0 => assert!(x.is_nan(), "g[{i}] = {x}: a_log NaN"),
            6 => assert!(x.is_nan(), "g[{i}] = {x}: a NaN"),
            1 => assert_eq!(x, 0.0, "a = +Inf gives g = 0"),
            11 => assert_eq!(x, 1.0, "a = -Inf gives g = 1"),
            _ => assert!(x > 0.0 && x < 1.0, "g[{i}] = {x}"),
        }
    }
    for h in [ha, hl, hd] {
        free(h);
    }
}

#[test]
fn nan_and_inf_in_the_norms() {
    let _s = serial();
    // Head split: Hk 2, Dk 4, Hv 2, Dv 3: channels q 0..8, k 8..16, v 16..22.
    let (hk, dk, hv, dv) = (2usize, 4usize, 2usize, 3usize);
    let c = 2 * hk * dk + hv * dv;
    let mut rng = Rng::fresh();
    let mut x = rng.vec(2 * c, 1.0);
    x[c + 5] = f32::NAN; // s 1, q head 1
    x[9] = f32::INFINITY; // s 0, k head 0, element 1
    x[16 + 4] = f32::NAN; // s 0, v head 1, element 1
    let hx = new_f32(&x, &[1, 2, c as i32]);
    let qs = new_f32(&[0.5; 4], &[4]);
    let ks = new_f32(&[0.5; 4], &[4]);
    let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
    ok(unsafe {
        mlxk_silu_rms_heads(
            hx, qs, ks, hk as i32, hv as i32, dv as i32, 1e-6, &mut q, &mut k, &mut v,
        )
    });
    let (qv, kv, vv) = (read_f32(q), read_f32(k), read_f32(v));
    nan_exactly("q", &qv, |i| i / dk == hk + 1); // (s 1, head 1)
                                                 // +Inf in one k element: mean(silu^2) is Inf, rsqrt 0: that element NaN (Inf * 0), the
                                                 // rest of the head 0.
    for (i, &val) in kv.iter().enumerate() {
        match i {
            1 => assert!(val.is_nan(), "k[1] = {val}"),
            0 | 2 | 3 => assert_eq!(val, 0.0, "k[{i}]"),
            _ => assert!(val.is_finite(), "k[{i}] = {val}"),
        }
    }
    nan_exactly("v", &vv, |i| i == dv + 1);
    for h in [hx, qs, ks, q, k, v] {
        free(h);
    }

    // Gated norm, x [3, 8]: NaN in x row 1 -> row 1 NaN; +Inf in x row 2 -> that element NaN,
    // the rest of row 2 zero; NaN in the gate at row 0 -> that element only.
    let mut x = rng.vec(24, 1.0);
    let mut gate = rng.vec(24, 1.0);
    x[8 + 2] = f32::NAN;
    x[16 + 5] = f32::INFINITY;
    gate[3] = f32::NAN;
    let (hx, hg, hw) = (
        new_f32(&x, &[3, 8]),
        new_f32(&gate, &[3, 8]),
        new_f32(&rng.vec(8, 1.0), &[8]),
    );
    let mut out = null_mut();
    ok(unsafe { mlxk_gated_rms_norm(hx, hg, hw, 1e-6, &mut out) });
    let o = read_f32(out);
    for (i, &val) in o.iter().enumerate() {
        match i {
            3 | 8..=15 | 21 => assert!(val.is_nan(), "out[{i}] = {val}"),
            16..=23 => assert_eq!(val, 0.0, "out[{i}]"),
            _ => assert!(val.is_finite(), "out[{i}] = {val}"),
        }
    }
    for h in [hx, hg, hw, out] {
        free(h);
    }
}
