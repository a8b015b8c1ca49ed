//! NULL out-parameters (and other NULL pointers) in every entry point.

use super::*;

#[test]
fn null_out_parameters_everywhere() {
    let _s = serial();
    let fx = Fixture::new();
    let r = &fx.rec;
    let n = live_handles();
    let shape = [2i32, 3];
    let data = [0f32; 6];
    let f = "mlxk_array_to_mlx";
    refused(
        unsafe { mlxk_array_to_mlx(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["mlx_array_out"],
        n,
    );
    let mut host = null_mut();
    assert_eq!(unsafe { mlxk_array_to_mlx(fx.arr, &mut host) }, MLXK_OK);
    let f = "mlxk_array_from_mlx";
    refused(
        unsafe { mlxk_array_from_mlx(host, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["out"],
        n,
    );
    let mut out = sentinel();
    refused(
        unsafe { mlxk_array_from_mlx(std::ptr::null(), &mut out) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["mlx_array"],
        n,
    );
    assert_eq!(
        out,
        sentinel(),
        "{f}: a refused call wrote its out-parameter"
    );
    assert_eq!(unsafe { mlxk_mlx_array_free(host) }, MLXK_OK);
    let f = "mlxk_array_new";
    refused(
        array_new_into(as_bytes(&data), &shape, MLXK_DTYPE_FLOAT32, null_mut()),
        MLXK_ERR_NULL_POINTER,
        f,
        &["out"],
        n,
    );
    refused(
        unsafe {
            mlxk_array_new(
                null(),
                shape.as_ptr(),
                2,
                MLXK_DTYPE_FLOAT32,
                &mut null_mut(),
            )
        },
        MLXK_ERR_NULL_POINTER,
        f,
        &["data"],
        n,
    );
    refused(
        unsafe {
            mlxk_array_new(
                data.as_ptr().cast(),
                null(),
                2,
                MLXK_DTYPE_FLOAT32,
                &mut null_mut(),
            )
        },
        MLXK_ERR_NULL_POINTER,
        f,
        &["shape"],
        n,
    );
    refused(
        unsafe { mlxk_array_zeros(shape.as_ptr(), 2, MLXK_DTYPE_FLOAT32, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_zeros",
        &["out"],
        n,
    );
    refused(
        unsafe { mlxk_array_zeros(null(), 2, MLXK_DTYPE_FLOAT32, &mut null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_zeros",
        &["shape"],
        n,
    );
    refused(
        unsafe { mlxk_array_ndim(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_ndim",
        &["ndim"],
        n,
    );
    refused(
        unsafe { mlxk_array_shape(fx.arr, null_mut(), 2) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_shape",
        &["dims"],
        n,
    );
    refused(
        unsafe { mlxk_array_dtype(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_dtype",
        &["dtype"],
        n,
    );
    refused(
        unsafe { mlxk_array_nbytes(fx.arr, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_nbytes",
        &["nbytes"],
        n,
    );
    refused(
        unsafe { mlxk_array_read(fx.arr, null_mut(), 24) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_read",
        &["dst"],
        n,
    );
    refused(
        unsafe { mlxk_array_astype(fx.arr, MLXK_DTYPE_FLOAT16, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_array_astype",
        &["out"],
        n,
    );
    refused(
        unsafe { mlxk_get_memory_limit(null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_get_memory_limit",
        &["bytes"],
        n,
    );
    refused(
        unsafe { mlxk_compute_g(r.a_log, r.a, r.dt_bias, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_compute_g",
        &["g"],
        n,
    );
    let [q, k, v, a, b, al, dt, s, m] = r.args();
    let mut h = sentinel();
    let f = "mlxk_gated_delta_update";
    refused(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, null_mut(), &mut h) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["y"],
        n,
    );
    refused(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut h, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["state_out"],
        n,
    );
    assert_eq!(h, sentinel());
    let same: *mut H = &mut h;
    refused(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, same, same) },
        MLXK_ERR_INVALID_ARGUMENT,
        f,
        &["y and state_out"],
        n,
    );
    assert_eq!(h, sentinel());
    let lengths = [1i32, 2];
    let f = "mlxk_gated_delta_state";
    refused(
        unsafe { mlxk_gated_delta_state(k, v, a, b, al, dt, s, lengths.as_ptr(), 2, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["state_out"],
        n,
    );
    refused(
        unsafe { mlxk_gated_delta_state(k, v, a, b, al, dt, s, null(), 2, &mut h) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["accepted_lengths"],
        n,
    );
    let [hk, hv, dv] = SPLIT;
    let (mut o1, mut o2) = (sentinel(), sentinel());
    let f = "mlxk_silu_rms_heads";
    let (x, qs, ks) = (fx.sx, fx.q_scale, fx.k_scale);
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, null_mut(), &mut o1, &mut o2) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["q"],
        n,
    );
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut o1, null_mut(), &mut o2) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["k"],
        n,
    );
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, &mut o1, &mut o2, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["v"],
        n,
    );
    let p1: *mut H = &mut o1;
    refused(
        unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, 1e-6, p1, &mut o2, p1) },
        MLXK_ERR_INVALID_ARGUMENT,
        f,
        &["different"],
        n,
    );
    assert_eq!((o1, o2), (sentinel(), sentinel()));
    refused(
        unsafe { mlxk_gated_rms_norm(fx.x, fx.gate, fx.weight, 1e-6, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        "mlxk_gated_rms_norm",
        &["out"],
        n,
    );
    // The backward passes: each out-parameter NULL in turn, then two at one place.
    let (dqk, dvc) = (fx.dqk, fx.dv);
    for (slot, name) in ["dx", "dq_scale", "dk_scale"].into_iter().enumerate() {
        let mut o = [sentinel(); 3];
        let [a, b, c] = &mut o;
        let ptrs = [a as *mut H, b as *mut H, c as *mut H];
        let mut args = ptrs;
        args[slot] = null_mut();
        refused(
            unsafe {
                mlxk_silu_rms_heads_vjp(
                    x, qs, ks, hk, hv, dv, 1e-6, dqk, dqk, dvc, args[0], args[1], args[2],
                )
            },
            MLXK_ERR_NULL_POINTER,
            "mlxk_silu_rms_heads_vjp",
            &[name],
            n,
        );
        args = ptrs;
        args[(slot + 1) % 3] = args[slot];
        refused(
            unsafe {
                mlxk_silu_rms_heads_vjp(
                    x, qs, ks, hk, hv, dv, 1e-6, dqk, dqk, dvc, args[0], args[1], args[2],
                )
            },
            MLXK_ERR_INVALID_ARGUMENT,
            "mlxk_silu_rms_heads_vjp",
            &["same place"],
            n,
        );
        assert_eq!(o, [sentinel(); 3]);
    }
    for (slot, name) in ["dx", "dgate", "dweight"].into_iter().enumerate() {
        let mut o = [sentinel(); 3];
        let [a, b, c] = &mut o;
        let ptrs = [a as *mut H, b as *mut H, c as *mut H];
        let mut args = ptrs;
        args[slot] = null_mut();
        let (x, g, w) = (fx.x, fx.gate, fx.weight);
        refused(
            unsafe { mlxk_gated_rms_norm_vjp(x, g, w, 1e-6, g, args[0], args[1], args[2]) },
            MLXK_ERR_NULL_POINTER,
            "mlxk_gated_rms_norm_vjp",
            &[name],
            n,
        );
        args = ptrs;
        args[(slot + 1) % 3] = args[slot];
        refused(
            unsafe { mlxk_gated_rms_norm_vjp(x, g, w, 1e-6, g, args[0], args[1], args[2]) },
            MLXK_ERR_INVALID_ARGUMENT,
            "mlxk_gated_rms_norm_vjp",
            &["same place"],
            n,
        );
        assert_eq!(o, [sentinel(); 3]);
    }
    let f = "mlxk_glm52_layout_canonical";
    refused(
        unsafe { mlxkern::capi::glm52::mlxk_glm52_layout_canonical(6144, 2048, 4, 64, null_mut()) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["out"],
        n,
    );
    let f = "mlxk_glm52_layout_validate";
    refused(
        unsafe { mlxkern::capi::glm52::mlxk_glm52_layout_validate(null(), 4, 64) },
        MLXK_ERR_NULL_POINTER,
        f,
        &["layout"],
        n,
    );
    fx.free();
}
