//! The safe API's kernels against the C ABI on the same inputs: fresh random inputs, several
//! shapes and dtypes, edge cases; results bit for bit, and bad arguments refused with the same
//! status and message (the C message is the safe one behind the C function's name), naming the
//! argument.

use std::ptr::null_mut;

use crate::support::api::*;
use crate::support::*;
use mlxkern::capi::gated_rms_norm::mlxk_gated_rms_norm;
use mlxkern::capi::silu_rms_heads::mlxk_silu_rms_heads;
use mlxkern::{
    Dtype, Error, GatedDelta, GatedDeltaFromConv, GatedRmsNorm, SiluRmsHeads, StateReplay,
};

/// The update's inputs as twins. `dims` = [B, T, Hk, Hv, Dk, Dv].
struct Rec {
    q: Twin,
    k: Twin,
    v: Twin,
    a: Twin,
    b: Twin,
    a_log: Twin,
    dt_bias: Twin,
    state: Option<Twin>,
    mask: Option<Twin>,
}

impl Rec {
    fn random(rng: &mut Rng, dims: [usize; 6], dtype: Dtype, state: bool, mask: bool) -> Rec {
        let [b, t, hk, hv, dk, dv] = dims;
        let gate = rng.pick(&FLOATS);
        let a_log_dtype = rng.pick(&[Dtype::Float32, Dtype::Bfloat16]);
        let dt_dtype = rng.pick(&FLOATS);
        let qk = |rng: &mut Rng, scale: f32| Twin::heads(rng, [b, t, hk, dk], scale, dtype);
        Rec {
            q: qk(rng, (dk as f32).powf(-0.5)),
            k: qk(rng, 1.0),
            v: Twin::random(rng, &[b, t, hv, dv], 1.0, dtype),
            a: Twin::random(rng, &[b, t, hv], 2.0, gate),
            b: Twin::random(rng, &[b, t, hv], 2.0, gate),
            a_log: Twin::random(rng, &[hv], 1.0, a_log_dtype),
            dt_bias: Twin::random(rng, &[hv], 1.0, dt_dtype),
            state: state.then(|| Twin::random(rng, &[b, hv, dv, dk], 0.5, Dtype::Float32)),
            mask: mask.then(|| {
                let m: Vec<bool> = (0..b * t).map(|_| rng.below(4) != 0).collect();
                Twin::bools(&m, &[b, t])
            }),
        }
    }

    /// The nine arrays, `replace` (index, twin) put in place of one of them.
    fn arrays<'a>(&'a self, replace: Option<(usize, &'a Twin)>) -> [Option<&'a Twin>; 9] {
        let mut all = [
            Some(&self.q),
            Some(&self.k),
            Some(&self.v),
            Some(&self.a),
            Some(&self.b),
            Some(&self.a_log),
            Some(&self.dt_bias),
            self.state.as_ref(),
            self.mask.as_ref(),
        ];
        if let Some((i, t)) = replace {
            all[i] = Some(t);
        }
        all
    }

    fn c_args(&self, replace: Option<(usize, &Twin)>) -> [*const mlxk_array; 9] {
        self.arrays(replace)
            .map(|t| t.map_or(null_mut(), |t| t.c) as *const mlxk_array)
    }

    /// The safe replay of these inputs' first `lengths` tokens per row.
    fn replay<'a>(&'a self, lengths: &'a [usize]) -> StateReplay<'a> {
        StateReplay {
            k: &self.k.r,
            v: &self.v.r,
            a: &self.a.r,
            b: &self.b.r,
            a_log: &self.a_log.r,
            dt_bias: &self.dt_bias.r,
            state: r_opt(&self.state),
            accepted_lengths: lengths,
        }
    }

    fn safe<'a>(&'a self, replace: Option<(usize, &'a Twin)>) -> GatedDelta<'a> {
        let [q, k, v, a, b, a_log, dt_bias, state, mask] = self.arrays(replace);
        GatedDelta {
            q: &q.unwrap().r,
            k: &k.unwrap().r,
            v: &v.unwrap().r,
            a: &a.unwrap().r,
            b: &b.unwrap().r,
            a_log: &a_log.unwrap().r,
            dt_bias: &dt_bias.unwrap().r,
            state: state.map(|t| &t.r),
            mask: mask.map(|t| &t.r),
        }
    }

    /// The exact update through both APIs; the error message if they fail.
    fn update(&self, replace: Option<(usize, &Twin)>) -> Option<String> {
        let [q, k, v, a, b, al, dt, s, m] = self.c_args(replace);
        let (mut y, mut st) = (null_mut(), null_mut());
        let status =
            unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st) };
        let r = self.safe(replace).update().map(|u| vec![u.y, u.state]);
        agree("mlxk_gated_delta_update", status, &[y, st], r)
    }

    fn chunked(&self, chunk: i32) -> Option<String> {
        let [q, k, v, a, b, al, dt, s, m] = self.c_args(None);
        let (mut y, mut st) = (null_mut(), null_mut());
        let status = unsafe {
            mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, chunk, &mut y, &mut st)
        };
        let size = (chunk != 0).then_some(chunk as usize);
        let r = self
            .safe(None)
            .update_chunked(size)
            .map(|u| vec![u.y, u.state]);
        agree("mlxk_gated_delta_update_chunked", status, &[y, st], r)
    }
}

fn random_dims(rng: &mut Rng, max_t: u64) -> [usize; 6] {
    let hk = 1 + rng.below(3) as usize;
    [
        1 + rng.below(3) as usize,
        1 + rng.below(max_t) as usize,
        hk,
        hk * (1 + rng.below(2) as usize),
        rng.pick(&[32, 64, 128]),
        1 + rng.below(40) as usize,
    ]
}

#[test]
fn update_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..10 {
        let dims = random_dims(&mut rng, if case < 3 { 1 } else { 24 });
        let dtype = rng.pick(&FLOATS);
        let rec = Rec::random(&mut rng, dims, dtype, case % 2 == 0, case % 3 == 0);
        assert_eq!(rec.update(None), None, "dims {dims:?} {dtype:?}");
        let y = rec.safe(None).update().unwrap().y;
        assert!(floats(&y).iter().all(|v| v.is_finite()));
        // Masked tokens give 0; a call with a real token gives some nonzero output.
        let real = rec
            .mask
            .as_ref()
            .is_none_or(|m| m.r.to_vec::<bool>().unwrap().contains(&true));
        assert_eq!(floats(&y).iter().any(|&v| v != 0.0), real, "dims {dims:?}");
    }
}

#[test]
fn chunked_update_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..6 {
        let dims = random_dims(&mut rng, 70);
        let dtype = rng.pick(&FLOATS);
        let rec = Rec::random(&mut rng, dims, dtype, case % 2 == 1, case == 2);
        let chunk = rng.pick(&[0, 16, 32, 64, 128]);
        assert_eq!(rec.chunked(chunk), None, "dims {dims:?} chunk {chunk}");
    }
    // Bad chunk sizes: the same refusal as the C ABI's for the same number.
    let rec = Rec::random(&mut rng, [1, 4, 1, 1, 32, 4], Dtype::Float32, false, false);
    for chunk in [8, 24, 256] {
        let msg = rec.chunked(chunk).expect("refused");
        assert!(msg.starts_with(&format!("chunk_size is {chunk};")), "{msg}");
    }
    let err = rec.safe(None).update_chunked(Some(0)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)));
    assert!(err.to_string().starts_with("chunk_size is 0"), "{err}");
}

#[test]
fn update_errors_name_the_argument_as_the_c_abi_does() {
    let mut rng = Rng::fresh();
    let dims = [2, 3, 2, 4, 32, 8];
    let rec = Rec::random(&mut rng, dims, Dtype::Bfloat16, true, true);
    let f = Dtype::Float32;
    let cases: Vec<(usize, Twin, &str)> = vec![
        (
            0,
            Twin::random(&mut rng, &[2, 3, 64], 1.0, Dtype::Bfloat16),
            "q: expected rank 4",
        ),
        (
            1,
            Twin::random(&mut rng, &[2, 3, 2, 32], 1.0, f),
            "k: dtype float32 differs",
        ),
        (
            2,
            Twin::random(&mut rng, &[2, 3, 3, 8], 1.0, Dtype::Bfloat16),
            "v: Hv (dimension 2) is 3",
        ),
        (
            3,
            Twin::random(&mut rng, &[2, 4, 4], 1.0, f),
            "a: dimension 1",
        ),
        (
            4,
            Twin::new(&[1.0; 24], &[2, 3, 4], Dtype::Int32),
            "b: dtype int32",
        ),
        (
            5,
            Twin::random(&mut rng, &[4], 1.0, Dtype::Float16),
            "a_log: dtype float16",
        ),
        (
            6,
            Twin::random(&mut rng, &[5], 1.0, f),
            "dt_bias: dimension 0",
        ),
        (
            7,
            Twin::random(&mut rng, &[2, 4, 8, 32], 1.0, Dtype::Bfloat16),
            "state: ",
        ),
        (7, Twin::random(&mut rng, &[2, 4, 8, 64], 1.0, f), "state: "),
        (
            8,
            Twin::random(&mut rng, &[2, 3], 1.0, f),
            "mask: dtype float32",
        ),
    ];
    for (index, bad, start) in &cases {
        let msg = rec.update(Some((*index, bad))).expect("refused");
        assert!(
            msg.starts_with(start),
            "{msg:?} does not start with {start:?}"
        );
    }
    // Dk outside what the kernel takes.
    let rec = Rec::random(&mut rng, [1, 2, 1, 1, 48, 4], f, false, false);
    let msg = rec.update(None).expect("refused");
    assert!(msg.contains("Dk"), "{msg}");
}

#[test]
fn compute_g_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..8 {
        let hv = 1 + rng.below(8) as usize;
        let mut shape: Vec<usize> = (0..rng.below(3))
            .map(|_| 1 + rng.below(4) as usize)
            .collect();
        shape.push(hv);
        let a_log_dtype = rng.pick(&[Dtype::Float32, Dtype::Bfloat16]);
        let a_log = Twin::random(&mut rng, &[hv], 1.0, a_log_dtype);
        let a_dtype = rng.pick(&FLOATS);
        let a = Twin::random(&mut rng, &shape, 3.0, a_dtype);
        let dt_dtype = rng.pick(&FLOATS);
        let dt = Twin::random(&mut rng, &[hv], 1.0, dt_dtype);
        let bad = Twin::random(&mut rng, &[hv + 1], 1.0, Dtype::Float32);
        let dt = if case == 7 { &bad } else { &dt };
        let mut g = null_mut();
        let status = unsafe { mlxk_compute_g(a_log.c, a.c, dt.c, &mut g) };
        let r = mlxkern::compute_g(&a_log.r, &a.r, &dt.r).map(|g| vec![g]);
        let msg = agree("mlxk_compute_g", status, &[g], r);
        assert_eq!(msg.is_some(), case == 7, "{msg:?}");
        if let Some(msg) = msg {
            assert!(msg.starts_with("dt_bias: dimension 0"), "{msg}");
        }
    }
}

/// x, q_scale, k_scale of the head split for `dims` = [B, S, Hk, Hv, Dk, Dv].
fn split_inputs(rng: &mut Rng, dims: [usize; 6], dtype: Dtype) -> [Twin; 3] {
    let [b, s, hk, hv, dk, dv] = dims;
    let scale = |rng: &mut Rng, base: f32| -> Vec<f32> {
        (0..dk).map(|_| base * (0.5 + rng.uniform())).collect()
    };
    [
        Twin::random(rng, &[b, s, 2 * hk * dk + hv * dv], 4.0, dtype),
        Twin::new(&scale(rng, (dk as f32).recip()), &[dk], dtype),
        Twin::new(&scale(rng, (dk as f32).powf(-0.5)), &[dk], dtype),
    ]
}

fn split_args<'a>(x: &'a [Twin; 3], dims: [usize; 6], eps: f32) -> SiluRmsHeads<'a> {
    SiluRmsHeads {
        x: &x[0].r,
        q_scale: &x[1].r,
        k_scale: &x[2].r,
        key_heads: dims[2],
        value_heads: dims[3],
        value_width: dims[5],
        eps,
    }
}

#[test]
fn head_split_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for _ in 0..8 {
        let hk = 1 + rng.below(3) as usize;
        let dims = [
            1 + rng.below(2) as usize,
            1 + rng.below(6) as usize,
            hk,
            hk + rng.below(3) as usize,
            1 + rng.below(128) as usize,
            1 + rng.below(128) as usize,
        ];
        let dtype = rng.pick(&FLOATS);
        let x = split_inputs(&mut rng, dims, dtype);
        let eps = 1e-6 / dims[4] as f32;
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        let status = unsafe {
            mlxk_silu_rms_heads(
                x[0].c,
                x[1].c,
                x[2].c,
                dims[2] as i32,
                dims[3] as i32,
                dims[5] as i32,
                eps,
                &mut q,
                &mut k,
                &mut v,
            )
        };
        let r = split_args(&x, dims, eps)
            .split()
            .map(|s| vec![s.q, s.k, s.v]);
        assert_eq!(
            agree("mlxk_silu_rms_heads", status, &[q, k, v], r),
            None,
            "{dims:?}"
        );
    }
    // Errors: the argument named, as the C ABI names it.
    let dims = [1, 2, 2, 2, 16, 8];
    let x = split_inputs(&mut rng, dims, Dtype::Float32);
    let cases: [(usize, usize, usize, f32, &str); 5] = [
        (0, 2, 8, 1e-6, "key_heads is 0"),
        (2, 0, 8, 1e-6, "value_heads is 0"),
        (2, 2, 129, 1e-6, "value_width is 129"),
        (2, 2, 8, -1.0, "eps is -1"),
        (2, 3, 8, 1e-6, "x: dimension 2 (channels)"),
    ];
    for (hk, hv, dv, eps, start) in cases {
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        let status = unsafe {
            mlxk_silu_rms_heads(
                x[0].c, x[1].c, x[2].c, hk as i32, hv as i32, dv as i32, eps, &mut q, &mut k,
                &mut v,
            )
        };
        let err = split_args(&x, [1, 2, hk, hv, 16, dv], eps)
            .split()
            .unwrap_err();
        let msg = same_error("mlxk_silu_rms_heads", status, err);
        assert!(msg.starts_with(start), "{msg:?} vs {start:?}");
    }
    let huge = split_args(&x, [1, 2, usize::MAX, 2, 16, 8], 1e-6)
        .split()
        .unwrap_err();
    assert!(matches!(huge, Error::InvalidArgument(_)));
    assert!(
        huge.to_string()
            .starts_with("key_heads is 18446744073709551615"),
        "{huge}"
    );
    let bf = Twin::random(&mut rng, &[16], 1.0, Dtype::Bfloat16);
    let mut args = split_args(&x, dims, 1e-6);
    args.k_scale = &bf.r;
    let err = args.split().unwrap_err();
    assert!(
        err.to_string()
            .starts_with("k_scale: dtype bfloat16 differs"),
        "{err}"
    );
}

/// The update from the convolution's output on the same twins through the C ABI (its status,
/// y and state) and through the safe API: x, q_scale, k_scale (`x`), then a, b, a_log, dt_bias
/// (`gates`), the optional state and mask.
fn from_conv_both(
    x: &[Twin; 3],
    dims: [usize; 6],
    eps: f32,
    gates: [&Twin; 4],
    state: &Option<Twin>,
    mask: &Option<Twin>,
) -> (mlxk_status, [H; 2], Result<mlxkern::Update, Error>) {
    let [a, b, a_log, dt] = gates;
    let [_, _, hk, hv, _, dv] = dims.map(|d| d as i32);
    let (mut y, mut st) = (null_mut(), null_mut());
    let status = unsafe {
        mlxk_gated_delta_update_from_conv(
            x[0].c,
            x[1].c,
            x[2].c,
            hk,
            hv,
            dv,
            eps,
            a.c,
            b.c,
            a_log.c,
            dt.c,
            c_opt(state),
            c_opt(mask),
            &mut y,
            &mut st,
        )
    };
    let safe = GatedDeltaFromConv {
        split: split_args(x, dims, eps),
        a: &a.r,
        b: &b.r,
        a_log: &a_log.r,
        dt_bias: &dt.r,
        state: r_opt(state),
        mask: r_opt(mask),
    }
    .update();
    (status, [y, st], safe)
}

#[test]
fn from_conv_update_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for case in 0..6 {
        let hk = 1 + rng.below(2) as usize;
        let dims = [
            1 + rng.below(3) as usize,
            1 + rng.below(if case < 2 { 1 } else { 9 }) as usize,
            hk,
            hk * (1 + rng.below(2) as usize),
            rng.pick(&[32, 64, 128]),
            1 + rng.below(64) as usize,
        ];
        let [b, t, _, hv, dk, dv] = dims;
        let dtype = rng.pick(&FLOATS);
        let x = split_inputs(&mut rng, dims, dtype);
        let a = Twin::random(&mut rng, &[b, t, hv], 3.0, dtype);
        let bb = Twin::random(&mut rng, &[b, t, hv], 3.0, dtype);
        let a_log = Twin::random(&mut rng, &[hv], 1.5, Dtype::Float32);
        let dt = Twin::random(&mut rng, &[hv], 1.0, dtype);
        let state =
            (case % 2 == 0).then(|| Twin::random(&mut rng, &[b, hv, dv, dk], 0.5, Dtype::Float32));
        let mask = (case == 3).then(|| {
            let m: Vec<bool> = (0..b * t)
                .map(|i| i + 1 == b * t || rng.below(4) != 0)
                .collect();
            Twin::bools(&m, &[b, t])
        });
        let eps = 1e-6 / dk as f32;
        let (status, outs, r) =
            from_conv_both(&x, dims, eps, [&a, &bb, &a_log, &dt], &state, &mask);
        let r = r.map(|u| vec![u.y, u.state]);
        assert_eq!(
            agree("mlxk_gated_delta_update_from_conv", status, &outs, r),
            None,
            "{dims:?}"
        );
    }
    // Dk the update does not take (48), refused naming it.
    let dims = [1, 1, 1, 1, 48, 4];
    let x = split_inputs(&mut rng, dims, Dtype::Float32);
    let g = Twin::random(&mut rng, &[1, 1, 1], 1.0, Dtype::Float32);
    let h = Twin::random(&mut rng, &[1], 1.0, Dtype::Float32);
    let (status, _, r) = from_conv_both(&x, dims, 1e-6, [&g, &g, &h, &h], &None, &None);
    let err = r.unwrap_err();
    assert!(matches!(err, Error::Shape(_)));
    same_error("mlxk_gated_delta_update_from_conv", status, err);
}

#[test]
fn state_replay_matches_the_c_abi_and_the_update() {
    let mut rng = Rng::fresh();
    for case in 0..5 {
        let dims = random_dims(&mut rng, 10);
        let [b, t, ..] = dims;
        let dtype = rng.pick(&FLOATS);
        let rec = Rec::random(&mut rng, dims, dtype, case != 1, false);
        let lengths: Vec<usize> = (0..b).map(|_| rng.below(t as u64 + 1) as usize).collect();
        let lengths32: Vec<i32> = lengths.iter().map(|&n| n as i32).collect();
        let (status, out) = replay(rec.c_args(None), &lengths32);
        let replay = rec.replay(&lengths);
        assert_eq!(
            agree(
                "mlxk_gated_delta_state",
                status,
                &[out],
                replay.replay().map(|s| vec![s])
            ),
            None
        );
        // Every row accepted: the update's own state.
        let all = vec![t; b];
        let full = StateReplay {
            accepted_lengths: &all,
            ..replay
        }
        .replay()
        .unwrap();
        let update = rec.safe(None).update().unwrap();
        assert_eq!(full.to_bytes().unwrap(), update.state.to_bytes().unwrap());
    }
    // Bad lengths: the row named, as the C ABI names it.
    let rec = Rec::random(&mut rng, [2, 3, 1, 1, 32, 4], Dtype::Float32, true, false);
    for lengths in [vec![1usize], vec![1, 4]] {
        let l32: Vec<i32> = lengths.iter().map(|&n| n as i32).collect();
        let (status, _) = replay(rec.c_args(None), &l32);
        let err = rec.replay(&lengths).replay().unwrap_err();
        let msg = same_error("mlxk_gated_delta_state", status, err);
        assert!(msg.contains("accepted_lengths"), "{msg}");
    }
}

#[test]
fn gated_norm_matches_the_c_abi() {
    let mut rng = Rng::fresh();
    for _ in 0..8 {
        let shape = random_shape(&mut rng, 3, 5, 300);
        let (_, [x, gate, w]) = norm_twins(&mut rng, &shape, [3.0, 3.0, 1.5]);
        let eps = rng.pick(&[0.0, 1e-6, 1e-3]);
        let mut out = null_mut();
        let status = unsafe { mlxk_gated_rms_norm(x.c, gate.c, w.c, eps, &mut out) };
        let r = mlxkern::gated_rms_norm(&x.r, &gate.r, &w.r, eps).map(|o| vec![o]);
        assert_eq!(
            agree("mlxk_gated_rms_norm", status, &[out], r),
            None,
            "{shape:?}"
        );
    }
    let x = Twin::random(&mut rng, &[3, 8], 1.0, Dtype::Bfloat16);
    let w32 = Twin::random(&mut rng, &[8], 1.0, Dtype::Float32);
    let w9 = Twin::random(&mut rng, &[9], 1.0, Dtype::Bfloat16);
    let g2 = Twin::random(&mut rng, &[3, 9], 1.0, Dtype::Bfloat16);
    let w8 = Twin::random(&mut rng, &[8], 1.0, Dtype::Bfloat16);
    let cases: [(&Twin, &Twin, f32, &str); 4] = [
        (&x, &w32, 1e-6, "weight: dtype float32"),
        (&x, &w9, 1e-6, "weight: "),
        (&x, &w8, f32::NAN, "eps is NaN"),
        (&g2, &w9, f32::NAN, "gate: shape [3, 9] differs"),
    ];
    for (gate, w, eps, start) in cases {
        let mut out = null_mut();
        let status = unsafe { mlxk_gated_rms_norm(x.c, gate.c, w.c, eps, &mut out) };
        let err = GatedRmsNorm {
            x: &x.r,
            gate: &gate.r,
            weight: &w.r,
            eps,
        }
        .forward()
        .unwrap_err();
        let msg = same_error("mlxk_gated_rms_norm", status, err);
        assert!(msg.starts_with(start), "{msg:?} vs {start:?}");
    }
}
