//! `mlxk_gated_delta_state` (prefix-state replay) through the C ABI: bit-identity with the
//! update for every prefix, per-row lengths, errors, and a whole speculative step.

use crate::support::*;
use std::ptr::{null, null_mut};

fn copy_state(src: H, dims: [usize; 6]) -> H {
    let [b, _, _, hv, dk, dv] = dims;
    new_bytes(
        &read_bytes(src),
        &[b as i32, hv as i32, dv as i32, dk as i32],
        MLXK_DTYPE_FLOAT32,
    )
}

/// The state after the first `m` tokens of every row, through the update.
fn update_prefix(host: &HostRecurrence, start: Option<H>, m: usize) -> Vec<u8> {
    let mut w = host.window(0, m);
    w.state = start.map(|s| copy_state(s, host.dims));
    let (y, s) = w.outputs();
    let bytes = read_bytes(s);
    free(y);
    free(s);
    w.free();
    bytes
}

#[test]
fn every_prefix_is_bit_identical_to_the_update() {
    let mut rng = Rng::fresh();
    for dims in [
        [2, 8, 2, 4, 128, 32],
        [3, 5, 1, 3, 64, 16],
        [1, 6, 2, 2, 32, 8],
    ] {
        let [b, t, _, hv, dk, dv] = dims;
        let host = HostRecurrence::random(&mut rng, dims);
        let start = new_f32(
            &rng.vec(b * hv * dv * dk, 0.5),
            &[b as i32, hv as i32, dv as i32, dk as i32],
        );
        let per_row = hv * dv * dk * 4;
        let by_m: Vec<Vec<u8>> = (0..=t)
            .map(|m| update_prefix(&host, Some(start), m))
            .collect();
        let mut window = host.window(0, t);
        window.state = Some(start);
        // The same length for every row, each m in 0..=T.
        for m in 0..=t {
            let (status, s) = window.replay(&vec![m as i32; b]);
            ok(status);
            assert!(read_bytes(s) == by_m[m], "prefix {m} of {dims:?}");
            free(s);
        }
        // Mixed lengths per row.
        for _ in 0..4 {
            let lengths: Vec<i32> = (0..b).map(|_| rng.below(t as u64 + 1) as i32).collect();
            let (status, s) = window.replay(&lengths);
            ok(status);
            let got = read_bytes(s);
            for (row, &m) in lengths.iter().enumerate() {
                let range = row * per_row..(row + 1) * per_row;
                assert!(
                    got[range.clone()] == by_m[m as usize][range],
                    "row {row} length {m} of {dims:?}"
                );
            }
            free(s);
        }
        window.free();
    }
}

#[test]
fn absent_state_means_zeros() {
    let mut rng = Rng::fresh();
    let dims = [2, 4, 1, 2, 32, 8];
    let host = HostRecurrence::random(&mut rng, dims);
    let w = host.window(0, 4);
    let (status, s) = w.replay(&[3, 1]);
    ok(status);
    let mut zeros = null_mut();
    ok(unsafe { mlxk_array_zeros([2i32, 2, 8, 32].as_ptr(), 4, MLXK_DTYPE_FLOAT32, &mut zeros) });
    let mut w2 = host.window(0, 4);
    w2.state = Some(zeros);
    let (status2, s2) = w2.replay(&[3, 1]);
    ok(status2);
    assert_eq!(read_bytes(s), read_bytes(s2));
    // Length 0 with no state: zeros.
    let (status3, s3) = w.replay(&[0, 0]);
    ok(status3);
    assert!(read_f32(s3).iter().all(|&x| x == 0.0));
    free_all(&[s, s2, s3]);
    w.free();
    w2.free();
}

#[test]
fn lengths_are_validated_per_row() {
    let mut rng = Rng::fresh();
    let host = HostRecurrence::random(&mut rng, [3, 8, 1, 2, 32, 8]);
    let w = host.window(0, 8);
    let (st, _) = w.replay(&[1, 2]);
    expect_err(
        st,
        MLXK_ERR_INVALID_ARGUMENT,
        &["accepted_lengths", "n_lengths is 2", "B = 3"],
    );
    let (st, _) = w.replay(&[1, 2, 3, 4]);
    expect_err(st, MLXK_ERR_INVALID_ARGUMENT, &["n_lengths is 4"]);
    let (st, _) = w.replay(&[1, -1, 3]);
    expect_err(
        st,
        MLXK_ERR_INVALID_ARGUMENT,
        &["accepted_lengths[1] is -1", "0 <= length <= T (8)"],
    );
    let (st, _) = w.replay(&[8, 0, 9]);
    expect_err(st, MLXK_ERR_INVALID_ARGUMENT, &["accepted_lengths[2] is 9"]);
    let [_, k, v, a, b, al, dt, _, _] = w.args();
    let mut out = null_mut();
    let st = unsafe { mlxk_gated_delta_state(k, v, a, b, al, dt, null(), null(), 3, &mut out) };
    expect_err(st, MLXK_ERR_NULL_POINTER, &["accepted_lengths"]);
    let lengths = [1i32, 1, 1];
    let st = unsafe {
        mlxk_gated_delta_state(k, v, a, b, al, dt, null(), lengths.as_ptr(), 3, null_mut())
    };
    expect_err(st, MLXK_ERR_NULL_POINTER, &["state_out"]);
    let st = unsafe {
        mlxk_gated_delta_state(
            null(),
            v,
            a,
            b,
            al,
            dt,
            null(),
            lengths.as_ptr(),
            3,
            &mut out,
        )
    };
    expect_err(st, MLXK_ERR_NULL_POINTER, &["k"]);
    // Shape and dtype errors name the argument.
    let st = unsafe {
        mlxk_gated_delta_state(k, k, a, b, al, dt, null(), lengths.as_ptr(), 3, &mut out)
    };
    expect_err(st, MLXK_ERR_SHAPE, &["Hv"]);
    let bad_state = new_f32(&[0.0; 16], &[1, 1, 4, 4]);
    let st = unsafe {
        mlxk_gated_delta_state(k, v, a, b, al, dt, bad_state, lengths.as_ptr(), 3, &mut out)
    };
    expect_err(st, MLXK_ERR_SHAPE, &["state"]);
    let st = unsafe {
        mlxk_gated_delta_state(k, v, v, b, al, dt, null(), lengths.as_ptr(), 3, &mut out)
    };
    expect_err(st, MLXK_ERR_SHAPE, &["a", "rank 3"]);
    free(bad_state);
    w.free();
    // B = 0: no lengths needed.
    let empty = HostRecurrence::random(&mut rng, [0, 4, 1, 1, 32, 4]).window(0, 4);
    let (st, s) = empty.replay(&[]);
    ok(st);
    assert_eq!(shape_of(s), vec![0, 1, 4, 32]);
    free(s);
    empty.free();
}

/// A speculative step: verify 8 draft tokens with the update (from the pre-verify state),
/// accept m per row, roll back with the replay, then keep decoding. The states and outputs
/// equal decoding only the accepted tokens, bit for bit.
#[test]
fn speculative_step_equals_decoding_the_accepted_tokens() {
    let mut rng = Rng::fresh();
    let dims = [2, 8 + 3, 2, 4, 128, 16];
    let [b, _, _, hv, dk, dv] = dims;
    let host = HostRecurrence::random(&mut rng, dims);
    let pre = new_f32(
        &rng.vec(b * hv * dv * dk, 0.5),
        &[b as i32, hv as i32, dv as i32, dk as i32],
    );
    let accepted = [5i32, 5];
    // Speculative path: verify tokens 0..8, roll back to 5 accepted, decode tokens 5..8 again
    // (the corrected continuation here re-uses the same tokens), then 8..11.
    let mut verify = host.window(0, 8);
    verify.state = Some(copy_state(pre, dims));
    let (y_verify, _verify_state) = verify.outputs();
    let y_verify = read_bf16(y_verify);
    let (st, rolled) = verify.replay(&accepted);
    ok(st);
    let mut cont = host.window(5, 11);
    cont.state = Some(rolled);
    let (y_cont, s_spec) = cont.outputs();
    // Reference: decode tokens 0..11 one call.
    let mut reference = host.window(0, 11);
    reference.state = Some(copy_state(pre, dims));
    let (y_ref, s_ref) = reference.outputs();
    assert_eq!(
        read_bytes(s_spec),
        read_bytes(s_ref),
        "state after the speculative step"
    );
    let y_ref = read_bf16(y_ref);
    let y_cont = read_bf16(y_cont);
    let per = hv * dv;
    for row in 0..b {
        for t in 0..5 {
            assert_eq!(
                y_verify[(row * 8 + t) * per..(row * 8 + t + 1) * per],
                y_ref[(row * 11 + t) * per..(row * 11 + t + 1) * per]
            );
        }
        for t in 5..11 {
            assert_eq!(
                y_cont[(row * 6 + t - 5) * per..(row * 6 + t - 4) * per],
                y_ref[(row * 11 + t) * per..(row * 11 + t + 1) * per]
            );
        }
    }
    free(pre);
    verify.free();
    cont.free();
    reference.free();
}

#[test]
fn gpu_replay_dispatch_is_built_and_reaches_mlx() {
    let mut rng = Rng::fresh();
    let host = HostRecurrence::random(&mut rng, [2, 4, 1, 2, 64, 8]);
    let w = host.window(0, 4);
    let [_, k, v, a, b, al, dt, s, _] = w.args();
    let mut out = null_mut();
    for kernels in GPU_KERNELS {
        let args = [k, v, a, b, al, dt, s];
        let st = unsafe { gated_delta_state_via_gpu(kernels, false, args, &[2, 4], &mut out) };
        expect_err(st, MLXK_ERR_BACKEND, &[refused_launch(kernels)]);
        let st = unsafe { gated_delta_state_via_gpu(kernels, false, args, &[2, 5], &mut out) };
        expect_err(st, MLXK_ERR_INVALID_ARGUMENT, &["accepted_lengths[1]"]);
    }
    w.free();
}
