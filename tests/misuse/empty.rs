//! Empty batches and sequences.

use super::*;

#[test]
fn empty_batches_and_sequences_for_every_kernel() {
    let _s = serial();
    let mut rng = Rng::fresh();
    // Recurrence: B = 0, and T = 0 (state returned bit for bit).
    for dims in [
        [0usize, 3, 1, 2, 32, 4],
        [2, 0, 1, 2, 32, 4],
        [0, 0, 2, 4, 64, 8],
    ] {
        let [b, t, _, hv, dk, dv] = dims;
        let r = Recurrence::random(&mut rng, dims, true, true);
        let (st, y, s) = r.run();
        ok(st);
        assert_eq!(shape_of(y), [b, t, hv, dv].map(|d| d as i32));
        assert_eq!(shape_of(s), [b, hv, dv, dk].map(|d| d as i32));
        assert!(read_bytes(y).is_empty());
        assert_eq!(
            read_bytes(s),
            read_bytes(r.state.unwrap()),
            "T = 0 or B = 0: state unchanged"
        );
        free(y);
        free(s);
        // compute_g on the empty a.
        let mut g = null_mut();
        ok(unsafe { mlxk_compute_g(r.a_log, r.a, r.dt_bias, &mut g) });
        assert_eq!(shape_of(g), [b, t, hv].map(|d| d as i32));
        free(g);
        // Replay: lengths all 0 (the only valid ones when T = 0; none when B = 0).
        let lengths = vec![0i32; b];
        let (st, s) = r.replay(&lengths);
        ok(st);
        assert_eq!(read_bytes(s), read_bytes(r.state.unwrap()));
        free(s);
        if b > 0 && t == 0 {
            let n = live_handles();
            let (st, _) = r.replay(&vec![1; b]);
            refused(
                st,
                MLXK_ERR_INVALID_ARGUMENT,
                "mlxk_gated_delta_state",
                &["accepted_lengths[0]", "T (0)"],
                n,
            );
        }
        if b == 0 {
            // n_lengths 0 with a NULL pointer is allowed.
            let [_, k, v, a, bb, al, dt, st_h, _] = r.args();
            let mut s = null_mut();
            ok(unsafe { mlxk_gated_delta_state(k, v, a, bb, al, dt, st_h, null(), 0, &mut s) });
            free(s);
        }
        r.free();
    }
    // Head split with B = 0 and S = 0.
    for (b, s) in [(0, 3), (2, 0)] {
        let x = new_bf16(&[], &[b, s, 14]);
        let qs = new_bf16(&[0.25; 4], &[4]);
        let ks = new_bf16(&[0.5; 4], &[4]);
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        let [hk, hv, dv] = SPLIT;
        ok(unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut q, &mut k, &mut v) });
        assert_eq!(shape_of(q), [b, s, 1, 4]);
        assert_eq!(shape_of(v), [b, s, 2, 3]);
        assert!(read_bytes(k).is_empty());
        for h in [x, qs, ks, q, k, v] {
            free(h);
        }
    }
    // Gated norm with no rows is fine; a zero width D is a clear error.
    for shape in [vec![0, 8], vec![3, 0, 8]] {
        let x = new_bf16(&[], &shape);
        let g = new_bf16(&[], &shape);
        let w = new_bf16(&[1.0; 8], &[8]);
        let mut out = null_mut();
        ok(unsafe { mlxk_gated_rms_norm(x, g, w, 1e-6, &mut out) });
        assert_eq!(shape_of(out), shape);
        assert!(read_bytes(out).is_empty());
        for h in [x, g, w, out] {
            free(h);
        }
    }
    let x = new_bf16(&[], &[3, 0]);
    let w = new_bf16(&[], &[0]);
    let n = live_handles();
    let mut out = sentinel();
    refused(
        unsafe { mlxk_gated_rms_norm(x, x, w, 1e-6, &mut out) },
        MLXK_ERR_SHAPE,
        "mlxk_gated_rms_norm",
        &["x", "(D) is 0"],
        n,
    );
    assert_eq!(out, sentinel());
    free(x);
    free(w);
    // Empty arrays: NULL data, zero-length reads into NULL, casts.
    let mut e = null_mut();
    ok(unsafe { mlxk_array_new(null(), [0i32, 5].as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut e) });
    ok(unsafe { mlxk_array_read(e, null_mut(), 0) });
    let mut c = null_mut();
    ok(unsafe { mlxk_array_astype(e, MLXK_DTYPE_INT8, &mut c) });
    assert_eq!(shape_of(c), [0, 5]);
    free(c);
    free(e);
}
