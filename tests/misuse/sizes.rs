//! Sizes: overflowing dims, > 2^31-1 elements, the memory limit.

use super::*;

#[test]
fn overflowing_dims_and_oversized_arrays_are_refused_before_allocating() {
    let _s = serial();
    let n = live_handles();
    let one = [0u8; 16]; // never read: the shape is refused first
    let max = i32::MAX;
    let cases: Vec<(Vec<i32>, mlxk_dtype, mlxk_status, &str)> = vec![
        (
            vec![max, max, max],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^93
        (
            vec![max, max, max, max, 2],
            MLXK_DTYPE_UINT8,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // > 2^64
        (
            vec![65536, 65536],
            MLXK_DTYPE_BOOL,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^32
        (
            vec![46341, 46341],
            MLXK_DTYPE_INT8,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^31 + 9
        (
            vec![1 << 16, 1 << 15],
            MLXK_DTYPE_UINT8,
            MLXK_ERR_INVALID_ARGUMENT,
            "2^31-1 elements",
        ), // 2^31
        (
            vec![-1, 4],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_SHAPE,
            "dimension 0 is -1",
        ),
        (
            vec![4, i32::MIN],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_SHAPE,
            "dimension 1",
        ),
        (
            vec![1; 17],
            MLXK_DTYPE_FLOAT32,
            MLXK_ERR_SHAPE,
            "MLXK_MAX_NDIM",
        ),
    ];
    for (shape, dtype, want, needle) in &cases {
        let arg = if shape.len() > 16 { "ndim" } else { "shape" };
        let mut out = sentinel();
        let st = array_new_into(as_bytes(&one), shape, *dtype, &mut out);
        refused(st, *want, "mlxk_array_new", &[arg, needle], n);
        assert_eq!(out, sentinel());
        let st = unsafe { mlxk_array_zeros(shape.as_ptr(), shape.len(), *dtype, &mut out) };
        refused(st, *want, "mlxk_array_zeros", &[arg, needle], n);
    }
    // Exactly 2^31-1 elements is within the element cap; 2 GiB of bool is then refused by a
    // 1 GiB memory limit (and would be allocated under the default one: not done here).
    ok(mlxk_set_memory_limit(1 << 30));
    let mut out = sentinel();
    let st = unsafe { mlxk_array_zeros([max].as_ptr(), 1, MLXK_DTYPE_BOOL, &mut out) };
    ok(mlxk_set_memory_limit(0));
    refused(
        st,
        MLXK_ERR_OUT_OF_MEMORY,
        "mlxk_array_zeros",
        &["2147483647 bytes", "memory limit"],
        n,
    );

    // Empty arrays may carry huge dims (their products overflow i64 on the way); every kernel
    // takes them and gives empty results.
    let huge = [max, max, max, 0];
    let z = |shape: &[i32], dtype| {
        let mut h = null_mut();
        ok(unsafe { mlxk_array_zeros(shape.as_ptr(), shape.len(), dtype, &mut h) });
        h
    };
    let x = z(&[huge.as_slice(), &[8]].concat(), MLXK_DTYPE_BFLOAT16);
    let w = z(&[8], MLXK_DTYPE_BFLOAT16);
    let mut out = null_mut();
    ok(unsafe { mlxk_gated_rms_norm(x, x, w, 1e-6, &mut out) });
    assert_eq!(shape_of(out), [max, max, max, 0, 8]);
    assert!(read_bytes(out).is_empty());
    free(out);
    let a_log = z(&[8], MLXK_DTYPE_FLOAT32);
    let mut g = null_mut();
    ok(unsafe { mlxk_compute_g(a_log, x, w, &mut g) });
    assert_eq!(shape_of(g), [max, max, max, 0, 8]);
    free(g);
    let sx = z(&[0, max, 14], MLXK_DTYPE_BFLOAT16);
    let sc = z(&[4], MLXK_DTYPE_BFLOAT16);
    let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
    let [hk, hv, dv] = SPLIT;
    ok(unsafe { mlxk_silu_rms_heads(sx, sc, sc, hk, hv, dv, 1e-6, &mut q, &mut k, &mut v) });
    assert_eq!(shape_of(v), [0, max, 2, 3]);
    for h in [q, k, v, sx, sc, x, w, a_log] {
        free(h);
    }
    // Recurrence with B = 0 and huge T, Hk, Dv.
    let (b, t, hk, hv, dk, dv) = (0, max, 4096, 8192, 32, max);
    let q = z(&[b, t, hk, dk], MLXK_DTYPE_BFLOAT16);
    let v = z(&[b, t, hv, dv], MLXK_DTYPE_BFLOAT16);
    let a = z(&[b, t, hv], MLXK_DTYPE_BFLOAT16);
    let al = z(&[hv], MLXK_DTYPE_FLOAT32);
    let dt = z(&[hv], MLXK_DTYPE_BFLOAT16);
    let (mut y, mut s) = (null_mut(), null_mut());
    ok(unsafe { mlxk_gated_delta_update(q, q, v, a, a, al, dt, null(), null(), &mut y, &mut s) });
    assert_eq!(shape_of(y), [b, t, hv, dv]);
    assert_eq!(shape_of(s), [b, hv, dv, dk]);
    assert!(read_bytes(s).is_empty());
    free(y);
    free(s);
    ok(unsafe { mlxk_gated_delta_state(q, v, a, a, al, dt, null(), null(), 0, &mut s) });
    assert!(read_bytes(s).is_empty());
    free(s);
    for h in [q, v, a, al, dt] {
        free(h);
    }

    // Small inputs whose result would hold more than 2^31-1 elements: B = 1, T = 0,
    // Hv = Dv = 65536 makes a state of 2^37 elements (512 GiB). Refused before anything is
    // built: neither MLX nor the OS is ever asked for it.
    let (b, t, hk, hv, dk, dv) = (1, 0, 1, 65536, 32, 65536);
    let q = z(&[b, t, hk, dk], MLXK_DTYPE_BFLOAT16);
    let v = z(&[b, t, hv, dv], MLXK_DTYPE_BFLOAT16);
    let a = z(&[b, t, hv], MLXK_DTYPE_BFLOAT16);
    let al = z(&[hv], MLXK_DTYPE_FLOAT32);
    let dt = z(&[hv], MLXK_DTYPE_BFLOAT16);
    let n = live_handles();
    let (mut y, mut s) = (sentinel(), sentinel());
    let st =
        unsafe { mlxk_gated_delta_update(q, q, v, a, a, al, dt, null(), null(), &mut y, &mut s) };
    refused(
        st,
        MLXK_ERR_INVALID_ARGUMENT,
        "mlxk_gated_delta_update",
        &["state_out", "2^31-1 elements"],
        n,
    );
    assert_eq!((y, s), (sentinel(), sentinel()));
    let lengths = [0i32];
    let st =
        unsafe { mlxk_gated_delta_state(q, v, a, a, al, dt, null(), lengths.as_ptr(), 1, &mut s) };
    refused(
        st,
        MLXK_ERR_INVALID_ARGUMENT,
        "mlxk_gated_delta_state",
        &["state_out", "2^31-1 elements"],
        n,
    );
    for h in [q, v, a, al, dt] {
        free(h);
    }
}

#[test]
fn every_constructor_and_kernel_refuses_results_above_the_memory_limit() {
    let _s = serial();
    let fx = Fixture::new();
    // Every result of the fixture is more than 8 bytes.
    let entries = fx.entries();
    let makers = [
        "mlxk_array_astype",
        "mlxk_compute_g",
        "mlxk_gated_delta_update",
        "mlxk_gated_delta_state",
        "mlxk_silu_rms_heads",
        "mlxk_gated_rms_norm",
        "mlxk_gated_delta_update_vjp",
        "mlxk_gated_delta_update_chunked_vjp",
        "mlxk_silu_rms_heads_vjp",
        "mlxk_gated_rms_norm_vjp",
        "mlxk_gated_delta_update_pool",
        "mlxk_gated_delta_update_pool_chunked",
        "mlxk_gated_delta_verify_pool",
        "mlxk_gated_delta_update_packed",
        "mlxk_gated_delta_update_packed_chunked",
        "mlxk_gated_delta_state_pool",
        "mlxk_gated_delta_update_from_conv_pool",
        "mlxk_gated_delta_verify_tree_pool",
        "mlxk_gated_delta_commit_tree_pool",
    ];
    ok(mlxk_set_memory_limit(8));
    let mut refused_count = 0;
    for e in entries.iter().filter(|e| makers.contains(&e.function)) {
        let n = live_handles();
        let (st, _, untouched) = (e.call)(&e.handles());
        refused(
            st,
            MLXK_ERR_OUT_OF_MEMORY,
            e.function,
            &["memory limit", "8 bytes"],
            n,
        );
        assert!(untouched, "{}: out-parameter written", e.function);
        refused_count += 1;
    }
    let shape = [2i32, 3];
    let data = [0f32; 6];
    let n = live_handles();
    let mut out = sentinel();
    refused(
        array_new_into(as_bytes(&data), &shape, MLXK_DTYPE_FLOAT32, &mut out),
        MLXK_ERR_OUT_OF_MEMORY,
        "mlxk_array_new",
        &["24 bytes"],
        n,
    );
    refused(
        unsafe { mlxk_array_zeros(shape.as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut out) },
        MLXK_ERR_OUT_OF_MEMORY,
        "mlxk_array_zeros",
        &["24 bytes"],
        n,
    );
    assert_eq!(out, sentinel());
    // Reading, evaluating and inspecting existing arrays is not limited.
    ok(mlxk_array_eval(fx.arr));
    assert_eq!(read_f32(fx.arr).len(), 6);
    ok(mlxk_set_memory_limit(0));
    for e in entries.iter().filter(|e| makers.contains(&e.function)) {
        e.succeeds();
    }
    eprintln!(
        "{} kernels + 2 constructors refused above the limit, then succeeded",
        refused_count
    );
    fx.free();
}
