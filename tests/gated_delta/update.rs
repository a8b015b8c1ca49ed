//! `mlxk_compute_g` and `mlxk_gated_delta_update` through the C ABI: every argument check,
//! the Metal launch, edge sizes, and the sequential semantics (decode chain == prefill).

use crate::support::*;
use std::ptr::{null, null_mut};

fn dims_shape(d: [usize; 6]) -> [i32; 6] {
    d.map(|x| x as i32)
}

/// Runs the update with one argument replaced by `bad` and checks the error.
fn expect_arg_error(base: &Recurrence, slot: usize, bad: H, status: mlxk_status, needles: &[&str]) {
    let mut args = base.args();
    args[slot] = bad;
    let [q, k, v, a, b, al, dt, s, m] = args;
    let (mut y, mut st) = (null_mut(), null_mut());
    let got = unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st) };
    expect_err(got, status, needles);
    assert!(y.is_null() && st.is_null(), "outputs untouched on failure");
}

#[test]
fn every_argument_is_checked_and_named() {
    let mut rng = Rng::fresh();
    let d = [2, 3, 2, 4, 64, 16];
    let [b, t, hk, hv, dk, dv] = dims_shape(d);
    let base = Recurrence::random(&mut rng, d, true, true);
    let f = |rng: &mut Rng, shape: &[i32]| {
        new_bf16(&rng.vec(shape.iter().product::<i32>() as usize, 1.0), shape)
    };
    let f32a = |rng: &mut Rng, shape: &[i32]| {
        new_f32(&rng.vec(shape.iter().product::<i32>() as usize, 1.0), shape)
    };

    #[rustfmt::skip]
    let cases: Vec<(usize, H, mlxk_status, Vec<&str>)> = vec![
        // q: rank, dtype, Dk rules
        (0, f(&mut rng, &[b, t, hk]), MLXK_ERR_SHAPE, vec!["q", "rank 4"]),
        (0, new_bytes(&vec![0u8; (b * t * hk * dk * 4) as usize], &[b, t, hk, dk], MLXK_DTYPE_INT32), MLXK_ERR_DTYPE, vec!["q", "int32"]),
        // k: each dimension, dtype
        (1, f(&mut rng, &[b + 1, t, hk, dk]), MLXK_ERR_SHAPE, vec!["k", "dimension 0 (B)"]),
        (1, f(&mut rng, &[b, t + 1, hk, dk]), MLXK_ERR_SHAPE, vec!["k", "dimension 1 (T)"]),
        (1, f(&mut rng, &[b, t, hk + 1, dk]), MLXK_ERR_SHAPE, vec!["k", "dimension 2 (Hk)"]),
        (1, f(&mut rng, &[b, t, hk, dk + 32]), MLXK_ERR_SHAPE, vec!["k", "dimension 3 (Dk)"]),
        (1, f32a(&mut rng, &[b, t, hk, dk]), MLXK_ERR_DTYPE, vec!["k", "float32", "q"]),
        (1, f(&mut rng, &[b, t, hk, dk, 1]), MLXK_ERR_SHAPE, vec!["k", "rank 4"]),
        // v
        (2, f(&mut rng, &[b + 1, t, hv, dv]), MLXK_ERR_SHAPE, vec!["v", "dimension 0 (B)"]),
        (2, f(&mut rng, &[b, t + 2, hv, dv]), MLXK_ERR_SHAPE, vec!["v", "dimension 1 (T)"]),
        (2, f(&mut rng, &[b, t, 3, dv]), MLXK_ERR_SHAPE, vec!["Hv", "multiple of Hk"]),
        (2, f32a(&mut rng, &[b, t, hv, dv]), MLXK_ERR_DTYPE, vec!["v", "float32"]),
        (2, f(&mut rng, &[b, t, hv]), MLXK_ERR_SHAPE, vec!["v", "rank 4"]),
        // a, b
        (3, f(&mut rng, &[b, t, hv + 1]), MLXK_ERR_SHAPE, vec!["a", "dimension 2 (Hv)"]),
        (3, f(&mut rng, &[b, t + 1, hv]), MLXK_ERR_SHAPE, vec!["a", "dimension 1 (T)"]),
        (3, new_bytes(&vec![1u8; (b * t * hv) as usize], &[b, t, hv], MLXK_DTYPE_UINT8), MLXK_ERR_DTYPE, vec!["a", "uint8"]),
        (4, f(&mut rng, &[b + 1, t, hv]), MLXK_ERR_SHAPE, vec!["b", "dimension 0 (B)"]),
        (4, f(&mut rng, &[b, t, hv, 1]), MLXK_ERR_SHAPE, vec!["b", "rank 3"]),
        // a_log, dt_bias
        (5, f32a(&mut rng, &[hv + 1]), MLXK_ERR_SHAPE, vec!["a_log", "Hv"]),
        (5, new_bytes(&vec![0u8; (hv * 2) as usize], &[hv], MLXK_DTYPE_FLOAT16), MLXK_ERR_DTYPE, vec!["a_log", "float16"]),
        (5, f32a(&mut rng, &[1, hv]), MLXK_ERR_SHAPE, vec!["a_log", "rank 1"]),
        (6, f(&mut rng, &[hv - 1]), MLXK_ERR_SHAPE, vec!["dt_bias", "Hv"]),
        (6, new_bytes(&vec![0u8; (hv * 4) as usize], &[hv], MLXK_DTYPE_INT32), MLXK_ERR_DTYPE, vec!["dt_bias", "int32"]),
        // state
        (7, f32a(&mut rng, &[b, hv, dv, dk + 32]), MLXK_ERR_SHAPE, vec!["state", "dimension 3 (Dk)"]),
        (7, f32a(&mut rng, &[b, hv, dv + 1, dk]), MLXK_ERR_SHAPE, vec!["state", "dimension 2 (Dv)"]),
        (7, f32a(&mut rng, &[b, hv / 2, dv, dk]), MLXK_ERR_SHAPE, vec!["state", "dimension 1 (Hv)"]),
        (7, f32a(&mut rng, &[b + 1, hv, dv, dk]), MLXK_ERR_SHAPE, vec!["state", "dimension 0 (B)"]),
        (7, f(&mut rng, &[b, hv, dv, dk]), MLXK_ERR_DTYPE, vec!["state", "float32 only"]),
        (7, f32a(&mut rng, &[b, hv, dv]), MLXK_ERR_SHAPE, vec!["state", "rank 4"]),
        // mask
        (8, new_bool(&vec![true; (b * (t + 1)) as usize], &[b, t + 1]), MLXK_ERR_SHAPE, vec!["mask", "dimension 1 (T)"]),
        (8, new_bool(&vec![true; (b * t) as usize], &[b * t]), MLXK_ERR_SHAPE, vec!["mask", "rank 2"]),
        (8, f32a(&mut rng, &[b, t]), MLXK_ERR_DTYPE, vec!["mask", "expected bool"]),
    ];
    for (slot, bad, status, needles) in cases {
        expect_arg_error(&base, slot, bad, status, &needles);
        free(bad);
    }
    // NULL and dead handles for every required argument.
    let names = ["q", "k", "v", "a", "b", "a_log", "dt_bias"];
    let dead = new_f32(&[0.0], &[1]);
    free(dead);
    for (slot, name) in names.iter().enumerate() {
        expect_arg_error(
            &base,
            slot,
            null_mut(),
            MLXK_ERR_NULL_POINTER,
            &[name, "NULL"],
        );
        expect_arg_error(
            &base,
            slot,
            dead,
            MLXK_ERR_INVALID_HANDLE,
            &[name, "not a live"],
        );
    }
    expect_arg_error(&base, 7, dead, MLXK_ERR_INVALID_HANDLE, &["state"]);
    expect_arg_error(&base, 8, dead, MLXK_ERR_INVALID_HANDLE, &["mask"]);
    // Out-parameters.
    let [q, k, v, a, b2, al, dt, s, m] = base.args();
    let mut y = null_mut();
    expect_err(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b2, al, dt, s, m, &mut y, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["state_out"],
    );
    expect_err(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b2, al, dt, s, m, null_mut(), &mut y) },
        MLXK_ERR_NULL_POINTER,
        &["y"],
    );
    expect_err(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b2, al, dt, s, m, &mut y, &mut y) },
        MLXK_ERR_INVALID_ARGUMENT,
        &["same place"],
    );
    base.free();
}

#[test]
fn head_dimension_rules() {
    let mut rng = Rng::fresh();
    for (dk, ok_expected) in [
        (16, false),
        (32, true),
        (48, false),
        (96, true),
        (256, true),
        (288, false),
    ] {
        let r = Recurrence::random(&mut rng, [1, 2, 1, 1, dk, 8], false, false);
        let (status, y, s) = r.run();
        if ok_expected {
            ok(status);
            free(y);
            free(s);
        } else {
            expect_err(
                status,
                MLXK_ERR_SHAPE,
                &["Dk", "multiple of 32 in [32, 256]"],
            );
        }
        r.free();
    }
    for (hk, hv, ok_expected) in [(2, 4, true), (2, 6, true), (4, 6, false), (3, 2, false)] {
        let r = Recurrence::random(&mut rng, [1, 2, hk, hv, 32, 8], false, false);
        let (status, y, s) = r.run();
        if ok_expected {
            ok(status);
            free(y);
            free(s);
        } else {
            expect_err(status, MLXK_ERR_SHAPE, &["Hv", "multiple of Hk"]);
        }
        r.free();
    }
}

#[test]
fn outputs_have_the_documented_shapes_and_dtypes() {
    let mut rng = Rng::fresh();
    let r = Recurrence::random(&mut rng, [3, 5, 2, 6, 64, 24], true, true);
    let (y, s) = r.outputs();
    assert_eq!(shape_of(y), vec![3, 5, 6, 24]);
    assert_eq!(dtype_of(y), MLXK_DTYPE_BFLOAT16);
    assert_eq!(shape_of(s), vec![3, 6, 24, 64]);
    assert_eq!(dtype_of(s), MLXK_DTYPE_FLOAT32);
    free(y);
    free(s);
    r.free();
}

#[test]
fn masked_tokens_write_zero_and_keep_the_state() {
    let mut rng = Rng::fresh();
    let d = [2, 6, 1, 2, 32, 8];
    let mut r = Recurrence::random(&mut rng, d, true, false);
    // Row 0: real tokens 0..3 then padding; row 1: all padding.
    let mask: Vec<bool> = (0..12).map(|i| i < 3).collect();
    r.mask = Some(new_bool(&mask, &[2, 6]));
    let (y, s) = r.outputs();
    let yv = read_bf16(y);
    for bt in 0..12 {
        let row = &yv[bt * 16..(bt + 1) * 16];
        if !mask[bt] {
            assert!(
                row.iter().all(|&x| x == 0.0 && x.is_sign_positive()),
                "masked y must be +0"
            );
        } else {
            assert!(row.iter().any(|&x| x != 0.0));
        }
    }
    let before = read_f32(r.state.unwrap());
    let after = read_f32(s);
    let half = before.len() / 2;
    assert_eq!(
        before[half..],
        after[half..],
        "a fully masked row keeps its state bit for bit"
    );
    assert_ne!(before[..half], after[..half]);
    free(y);
    free(s);
    r.free();
}

/// One T-token call equals T one-token calls chained through the state handle, bit for bit:
/// each token only reads the previous token's state. Also proves the in-place state update
/// (old handle freed before eval) computes the same bits as the copying path.
#[test]
fn decode_chain_equals_prefill_and_in_place_update_is_exact() {
    let mut rng = Rng::fresh();
    for dims in [
        [1, 5, 2, 4, 128, 16],
        [3, 4, 1, 3, 64, 8],
        [2, 3, 2, 4, 128, 7],
    ] {
        let [b, t, hk, hv, dk, dv] = dims;
        let full = Recurrence::random(&mut rng, dims, true, false);
        let (y_full, s_full) = full.outputs();
        let y_values = read_bf16(y_full);
        free(y_full);
        let y_full = y_values;
        let s_full = read_f32(s_full);

        // Slice the same inputs per token (read back, rebuild with T = 1).
        let qv = read_bytes(full.q);
        let kv = read_bytes(full.k);
        let vv = read_bytes(full.v);
        let av = read_bytes(full.a);
        let bv = read_bytes(full.b);
        let mut state = {
            let bytes = read_bytes(full.state.unwrap());
            new_bytes(
                &bytes,
                &[b as i32, hv as i32, dv as i32, dk as i32],
                MLXK_DTYPE_FLOAT32,
            )
        };
        let mut y_steps = vec![0f32; y_full.len()];
        let in_place_before = mlxkern::testing::in_place_updates();
        for step in 0..t {
            let pick = |bytes: &[u8], per: usize| -> Vec<u8> {
                (0..b)
                    .flat_map(|row| {
                        bytes[(row * t + step) * per..(row * t + step + 1) * per].to_vec()
                    })
                    .collect()
            };
            let q = new_bytes(
                &pick(&qv, hk * dk * 2),
                &[b as i32, 1, hk as i32, dk as i32],
                MLXK_DTYPE_BFLOAT16,
            );
            let k = new_bytes(
                &pick(&kv, hk * dk * 2),
                &[b as i32, 1, hk as i32, dk as i32],
                MLXK_DTYPE_BFLOAT16,
            );
            let v = new_bytes(
                &pick(&vv, hv * dv * 2),
                &[b as i32, 1, hv as i32, dv as i32],
                MLXK_DTYPE_BFLOAT16,
            );
            let a = new_bytes(
                &pick(&av, hv * 2),
                &[b as i32, 1, hv as i32],
                MLXK_DTYPE_BFLOAT16,
            );
            let bb = new_bytes(
                &pick(&bv, hv * 2),
                &[b as i32, 1, hv as i32],
                MLXK_DTYPE_BFLOAT16,
            );
            let (mut y, mut next) = (null_mut(), null_mut());
            ok(unsafe {
                mlxk_gated_delta_update(
                    q,
                    k,
                    v,
                    a,
                    bb,
                    full.a_log,
                    full.dt_bias,
                    state,
                    null(),
                    &mut y,
                    &mut next,
                )
            });
            // The decode-loop pattern: free the old state before evaluating the new one.
            free(state);
            state = next;
            ok(mlxk_array_eval(state));
            let yv = read_bf16(y);
            for row in 0..b {
                let n = hv * dv;
                y_steps[(row * t + step) * n..(row * t + step + 1) * n]
                    .copy_from_slice(&yv[row * n..(row + 1) * n]);
            }
            free_all(&[q, k, v, a, bb, y]);
        }
        assert!(
            mlxkern::testing::in_place_updates() >= in_place_before + t,
            "each decode step should have updated the freed state's buffer in place"
        );
        assert_eq!(bits(&y_steps), bits(&y_full), "y differs for {dims:?}");
        assert_eq!(
            bits(&read_f32(state)),
            bits(&s_full),
            "state differs for {dims:?}"
        );
        free(state);
        full.free();
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn absent_state_equals_zero_state() {
    let mut rng = Rng::fresh();
    let d = [2, 3, 1, 2, 32, 4];
    let mut r = Recurrence::random(&mut rng, d, false, true);
    let (y1, s1) = r.outputs();
    let mut zeros = null_mut();
    ok(unsafe { mlxk_array_zeros([2i32, 2, 4, 32].as_ptr(), 4, MLXK_DTYPE_FLOAT32, &mut zeros) });
    r.state = Some(zeros);
    let (y2, s2) = r.outputs();
    assert_eq!(read_bytes(y1), read_bytes(y2));
    assert_eq!(read_bytes(s1), read_bytes(s2));
    free_all(&[y1, s1, y2, s2]);
    r.free();
}

#[test]
fn empty_batches_and_sequences() {
    let mut rng = Rng::fresh();
    // T = 0: y is empty and the state passes through unchanged.
    let r = Recurrence::random(&mut rng, [2, 0, 1, 2, 32, 4], true, false);
    let (y, s) = r.outputs();
    assert_eq!(shape_of(y), vec![2, 0, 2, 4]);
    assert_eq!(read_bytes(y).len(), 0);
    assert_eq!(read_bytes(s), read_bytes(r.state.unwrap()));
    free(y);
    free(s);
    r.free();
    // B = 0: both outputs empty.
    let r = Recurrence::random(&mut rng, [0, 3, 1, 2, 32, 4], false, false);
    let (y, s) = r.outputs();
    assert_eq!(shape_of(s), vec![0, 2, 4, 32]);
    assert_eq!(read_bytes(s).len(), 0);
    free(y);
    free(s);
    r.free();
}

#[test]
fn compute_g_checks() {
    let mut rng = Rng::fresh();
    let a_log = new_f32(&rng.vec(4, 1.0), &[4]);
    let a = new_bf16(&rng.vec(24, 2.0), &[2, 3, 4]);
    let dt = new_bf16(&rng.vec(4, 1.0), &[4]);
    let mut g = null_mut();
    ok(unsafe { mlxk_compute_g(a_log, a, dt, &mut g) });
    assert_eq!(shape_of(g), vec![2, 3, 4]);
    assert_eq!(dtype_of(g), MLXK_DTYPE_FLOAT32);
    let gv = read_f32(g);
    assert!(
        gv.iter().all(|&x| x > 0.0 && x < 1.0),
        "g is a decay in (0, 1): {gv:?}"
    );
    free(g);
    let bad_dt = new_bf16(&rng.vec(5, 1.0), &[5]);
    expect_err(
        unsafe { mlxk_compute_g(a_log, a, bad_dt, &mut g) },
        MLXK_ERR_SHAPE,
        &["dt_bias", "Hv"],
    );
    let scalar = new_f32(&[1.0], &[]);
    expect_err(
        unsafe { mlxk_compute_g(a_log, scalar, dt, &mut g) },
        MLXK_ERR_SHAPE,
        &["a", "rank >= 1"],
    );
    let int_a = new_bytes(&[0u8; 96], &[2, 3, 4], MLXK_DTYPE_INT32);
    expect_err(
        unsafe { mlxk_compute_g(a_log, int_a, dt, &mut g) },
        MLXK_ERR_DTYPE,
        &["a", "int32"],
    );
    expect_err(
        unsafe { mlxk_compute_g(null(), a, dt, &mut g) },
        MLXK_ERR_NULL_POINTER,
        &["a_log"],
    );
    expect_err(
        unsafe { mlxk_compute_g(a_log, a, dt, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["g"],
    );
    free_all(&[a_log, a, dt, bad_dt, scalar, int_a]);
}

/// The Metal and CUDA launches are built and handed to MLX on every machine; without that GPU,
/// MLX refuses them — so the arguments reached `mx::fast::metal_kernel` / `cuda_kernel`.
#[test]
fn gpu_dispatch_is_built_and_reaches_mlx() {
    let mut rng = Rng::fresh();
    for kernels in GPU_KERNELS {
        for masked in [false, true] {
            let r = Recurrence::random(&mut rng, [2, 3, 2, 4, 64, 8], masked, masked);
            let (mut y, mut s) = (null_mut(), null_mut());
            let status =
                unsafe { gated_delta_update_via_gpu(kernels, false, r.args(), &mut y, &mut s) };
            expect_err(status, MLXK_ERR_BACKEND, &[refused_launch(kernels)]);
            // Argument checks run before the launch on this path too.
            let mut args = r.args();
            args[0] = args[2];
            let status =
                unsafe { gated_delta_update_via_gpu(kernels, false, args, &mut y, &mut s) };
            expect_err(status, MLXK_ERR_SHAPE, &["q"]);
            r.free();
        }
    }
}
