//! `mlxk_gated_delta_update_from_conv` through the C ABI: the bits of `mlxk_silu_rms_heads`
//! followed by `mlxk_gated_delta_update` on fresh random inputs of several shapes (GQA, Dk 32 to
//! 128, odd Dv, masks, absent state, every float dtype), every argument check naming this
//! call's arguments, and the GPU launch it builds (the Metal and CUDA forms: one node whose
//! kernel reads x and the scales, refused on a CPU stream without a crash).

use crate::support::*;
use mlxkern::capi::silu_rms_heads::mlxk_silu_rms_heads;
use mlxkern::testing::{
    from_conv_one_kernel_any_tokens, gated_delta_update_from_conv_via_gpu, GpuKernels,
};
use std::ptr::null_mut;

/// One call's inputs: x, q_scale, k_scale, a, b, a_log, dt_bias, state, mask (the last two
/// may be NULL), and the head counts.
struct Layer {
    h: [H; 9],
    heads: [i32; 3],
    eps: f32,
}

impl Layer {
    /// `dims`: B, T, Hk, Hv, Dk, Dv.
    fn random(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype, state: bool, mask: bool) -> Self {
        let [_, _, hk, hv, dk, dv] = dims;
        let h = from_conv_arrays(rng, dims, dtype, state, mask);
        Layer {
            h,
            heads: [hk as i32, hv as i32, dv as i32],
            eps: 1e-6 / dk as f32,
        }
    }

    fn args(&self) -> [*const mlxk_array; 9] {
        self.h.map(|h| h as *const mlxk_array)
    }

    /// The entry point: (status, y, state_out).
    fn fused(&self) -> (mlxk_status, H, H) {
        let [x, qs, ks, a, b, al, dt, s, m] = self.args();
        let [hk, hv, dv] = self.heads;
        let (mut y, mut st) = (null_mut(), null_mut());
        let status = unsafe {
            mlxk_gated_delta_update_from_conv(
                x, qs, ks, hk, hv, dv, self.eps, a, b, al, dt, s, m, &mut y, &mut st,
            )
        };
        (status, y, st)
    }

    /// The two calls it stands for: the head split, then the update on its q, k, v.
    fn composed(&self) -> (H, H) {
        let [x, qs, ks, a, b, al, dt, s, m] = self.args();
        let [hk, hv, dv] = self.heads;
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        ok(unsafe { mlxk_silu_rms_heads(x, qs, ks, hk, hv, dv, self.eps, &mut q, &mut k, &mut v) });
        let (mut y, mut st) = (null_mut(), null_mut());
        ok(unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st) });
        free_all(&[q, k, v]);
        (y, st)
    }

    fn free(self) {
        for h in self.h.into_iter().filter(|h| !h.is_null()) {
            free(h);
        }
    }
}

#[test]
fn equals_the_head_split_then_the_update_bit_for_bit() {
    let mut rng = Rng::fresh();
    let (bf16, f16, f32) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32);
    // B, T, Hk, Hv, Dk, Dv: decode at Qwen3.5 dims, prefill, GQA 1 to 4, Dk 32 to 128, odd Dv.
    for (dims, dtype, state, mask) in [
        ([1, 1, 16, 32, 128, 128], bf16, true, false),
        ([3, 1, 2, 4, 128, 64], bf16, true, true),
        ([2, 9, 2, 6, 96, 7], bf16, false, true),
        ([1, 40, 1, 4, 64, 33], f16, true, false),
        ([2, 5, 2, 2, 32, 1], f32, true, true),
        ([2, 3, 3, 3, 128, 128], f32, false, false),
        ([1, 70, 1, 2, 64, 16], bf16, true, true),
        ([2, 0, 2, 4, 64, 8], bf16, true, false),
    ] {
        let layer = Layer::random(&mut rng, dims, dtype, state, mask);
        let (status, y, st) = layer.fused();
        ok(status);
        let [b, t, _, hv, dk, dv] = dims.map(|x| x as i32);
        assert_eq!(shape_of(y), vec![b, t, hv, dv]);
        assert_eq!(shape_of(st), vec![b, hv, dv, dk]);
        assert_eq!(dtype_of(y), dtype);
        assert_eq!(dtype_of(st), MLXK_DTYPE_FLOAT32);
        let (y_ref, st_ref) = layer.composed();
        let (y_bytes, st_bytes) = (read_bytes(y), read_bytes(st));
        assert_eq!(y_bytes, read_bytes(y_ref), "{dims:?}: y");
        assert_eq!(st_bytes, read_bytes(st_ref), "{dims:?}: state");
        // Not a vacuous comparison: the results carry values (bar the empty T = 0 case).
        if t > 0 {
            assert!(y_bytes.iter().any(|&x| x != 0), "{dims:?}: y all zero");
        }
        assert!(st_bytes.iter().any(|&x| x != 0), "{dims:?}: state all zero");
        free_all(&[y, st, y_ref, st_ref]);
        layer.free();
    }
}

#[test]
fn a_decode_loop_passes_its_state_on() {
    let mut rng = Rng::fresh();
    let dims = [2, 1, 2, 4, 64, 32];
    let first = Layer::random(&mut rng, dims, MLXK_DTYPE_BFLOAT16, true, false);
    let (mut fused_state, mut composed_state) = (null_mut(), null_mut());
    for step in 0..6 {
        let mut layer = Layer::random(&mut rng, dims, MLXK_DTYPE_BFLOAT16, false, false);
        // Each step starts from the previous step's state on either side.
        let given = if step == 0 { first.h[7] } else { fused_state };
        layer.h[7] = given;
        let (status, y, st) = layer.fused();
        ok(status);
        layer.h[7] = if step == 0 {
            first.h[7]
        } else {
            composed_state
        };
        let (y_ref, st_ref) = layer.composed();
        assert_eq!(read_bytes(y), read_bytes(y_ref), "step {step}: y");
        assert_eq!(read_bytes(st), read_bytes(st_ref), "step {step}: state");
        if step > 0 {
            free(fused_state);
            free(composed_state);
        }
        fused_state = st;
        composed_state = st_ref;
        free(y);
        free(y_ref);
        layer.h[7] = null_mut();
        layer.free();
    }
    free(fused_state);
    free(composed_state);
    first.free();
}

/// The call with one argument replaced (index into `Layer::h`), or the heads / eps changed.
fn call_with(layer: &Layer, replace: Option<(usize, H)>, heads: [i32; 3], eps: f32) -> mlxk_status {
    let mut h = layer.h;
    if let Some((at, with)) = replace {
        h[at] = with;
    }
    let [x, qs, ks, a, b, al, dt, s, m] = h.map(|h| h as *const mlxk_array);
    let (mut y, mut st) = (null_mut(), null_mut());
    let status = unsafe {
        mlxk_gated_delta_update_from_conv(
            x, qs, ks, heads[0], heads[1], heads[2], eps, a, b, al, dt, s, m, &mut y, &mut st,
        )
    };
    if status == MLXK_OK {
        free(y);
        free(st);
    }
    status
}

#[test]
fn bad_arguments_are_refused_with_their_names() {
    let mut rng = Rng::fresh();
    let layer = Layer::random(
        &mut rng,
        [2, 3, 2, 4, 64, 8],
        MLXK_DTYPE_BFLOAT16,
        true,
        true,
    );
    let (heads, eps) = (layer.heads, layer.eps);
    assert_eq!(call_with(&layer, None, heads, eps), MLXK_OK);
    let bf = |shape: &[i32]| {
        let n = shape.iter().product::<i32>() as usize;
        typed(&vec![0.25; n], shape, MLXK_DTYPE_BFLOAT16)
    };
    // NULL for every required array.
    for (at, name) in [
        (0, "x"),
        (1, "q_scale"),
        (2, "k_scale"),
        (3, "a"),
        (4, "b"),
        (5, "a_log"),
        (6, "dt_bias"),
    ] {
        expect_err(
            call_with(&layer, Some((at, null_mut())), heads, eps),
            MLXK_ERR_NULL_POINTER,
            &[name],
        );
    }
    let bad: Vec<(usize, H, mlxk_status, &[&str])> = vec![
        (0, bf(&[2, 3]), MLXK_ERR_SHAPE, &["x", "rank 3"]),
        (0, bf(&[2, 3, 100]), MLXK_ERR_SHAPE, &["x", "channels"]),
        (
            3,
            bf(&[2, 3, 5]),
            MLXK_ERR_SHAPE,
            &["a", "Hv", "value_heads"],
        ),
        (4, bf(&[2, 4, 4]), MLXK_ERR_SHAPE, &["b", "T", "x"]),
        (5, bf(&[3]), MLXK_ERR_SHAPE, &["a_log"]),
        (7, bf(&[2, 4, 8, 64]), MLXK_ERR_DTYPE, &["state", "float32"]),
        (
            7,
            new_f32(&vec![0.0; 2 * 4 * 7 * 64], &[2, 4, 7, 64]),
            MLXK_ERR_SHAPE,
            &["state", "Dv", "value_heads"],
        ),
        (
            8,
            new_bool(&[true; 6], &[3, 2]),
            MLXK_ERR_SHAPE,
            &["mask", "B", "x"],
        ),
        (8, bf(&[2, 3]), MLXK_ERR_DTYPE, &["mask", "bool"]),
        (
            1,
            typed(&[0.5; 64], &[64], MLXK_DTYPE_FLOAT32),
            MLXK_ERR_DTYPE,
            &["q_scale"],
        ),
    ];
    for (at, with, status, needles) in bad {
        expect_err(
            call_with(&layer, Some((at, with)), heads, eps),
            status,
            needles,
        );
        free(with);
    }
    // Head counts, widths and eps.
    expect_err(
        call_with(&layer, None, [2, 3, 8], eps),
        MLXK_ERR_SHAPE,
        &["x", "channels"],
    );
    expect_err(
        call_with(&layer, None, [0, 4, 8], eps),
        MLXK_ERR_INVALID_ARGUMENT,
        &["key_heads"],
    );
    expect_err(
        call_with(&layer, None, [2, 4, 0], eps),
        MLXK_ERR_INVALID_ARGUMENT,
        &["value_width"],
    );
    expect_err(
        call_with(&layer, None, heads, f32::NAN),
        MLXK_ERR_INVALID_ARGUMENT,
        &["eps"],
    );
    expect_err(
        call_with(&layer, None, heads, -1.0),
        MLXK_ERR_INVALID_ARGUMENT,
        &["eps"],
    );
    // Value heads not a multiple of the key heads (the split alone would take it), and a head
    // width the split takes and the update does not (Dk = 40).
    for (dims, status, needles) in [
        (
            [1, 2, 2, 3, 64, 8],
            MLXK_ERR_INVALID_ARGUMENT,
            &["value_heads", "multiple of key_heads"][..],
        ),
        (
            [1, 2, 1, 2, 40, 8],
            MLXK_ERR_SHAPE,
            &["q_scale", "Dk", "multiple of 32"][..],
        ),
    ] {
        let bad = Layer::random(&mut rng, dims, MLXK_DTYPE_BFLOAT16, false, false);
        expect_err(call_with(&bad, None, bad.heads, bad.eps), status, needles);
        bad.free();
    }
    // Both results into one place.
    let [x, qs, ks, a, b, al, dt, s, m] = layer.args();
    let [hk, hv, dv] = heads;
    let call_to = |y: *mut H, s_out: *mut H| unsafe {
        mlxk_gated_delta_update_from_conv(x, qs, ks, hk, hv, dv, eps, a, b, al, dt, s, m, y, s_out)
    };
    let mut same = null_mut();
    expect_err(
        call_to(&mut same, &mut same),
        MLXK_ERR_INVALID_ARGUMENT,
        &["y", "state_out"],
    );
    expect_err(
        call_to(null_mut(), &mut same),
        MLXK_ERR_NULL_POINTER,
        &["y"],
    );
    // A freed handle.
    let gone = bf(&[2, 3, 4]);
    free(gone);
    expect_err(
        call_with(&layer, Some((3, gone)), heads, eps),
        MLXK_ERR_INVALID_HANDLE,
        &["a"],
    );
    layer.free();
}

#[test]
fn the_gpu_launch_is_one_node_refused_on_a_cpu_stream() {
    // Without that GPU, MLX refuses the kernel on a CPU stream: a status and a message, never
    // a crash; the launch itself (texts, inputs, geometry) is built on the way.
    // One token (the one kernel the library takes), and three with that kernel forced (on
    // Metal the library takes the two kernels there; on CUDA the one, B·T being 6).
    let mut rng = Rng::fresh();
    for (kernels, tokens) in [
        (GpuKernels::Metal, 1),
        (GpuKernels::Cuda, 1),
        (GpuKernels::Metal, 3),
        (GpuKernels::Cuda, 3),
    ] {
        from_conv_one_kernel_any_tokens(tokens > 1);
        for mask in [false, true] {
            let dims = [2, tokens, 2, 4, 128, 16];
            let layer = Layer::random(&mut rng, dims, MLXK_DTYPE_BFLOAT16, true, mask);
            let (mut y, mut st) = (null_mut(), null_mut());
            let status = unsafe {
                gated_delta_update_from_conv_via_gpu(
                    kernels,
                    false,
                    layer.args(),
                    layer.heads,
                    layer.eps,
                    &mut y,
                    &mut st,
                )
            };
            assert_ne!(
                status, MLXK_OK,
                "{kernels:?}: a CPU stream cannot run the GPU kernel"
            );
            let message = last_error();
            assert!(
                message.contains("mlxk_gated_delta_update_from_conv"),
                "{kernels:?}: {message}"
            );
            eprintln!("{kernels:?} T={tokens} mask={mask}: {message}");
            assert!(y.is_null() && st.is_null());
            layer.free();
        }
    }
    from_conv_one_kernel_any_tokens(false);
}

/// `mlxk_gated_delta_update_from_conv_pool`: the head split, then `mlxk_gated_delta_update_pool`
/// on its q, k and v, bit for bit (the pool freed before the read: in place).
#[test]
fn on_a_pool_equals_the_head_split_then_the_pool_update() {
    use mlxkern::capi::gated_delta::pool::{
        mlxk_gated_delta_update_from_conv_pool, mlxk_gated_delta_update_pool,
    };
    let mut rng = Rng::fresh();
    for (dims, dtype, mask) in [
        ([3, 1, 2, 4, 128, 64], MLXK_DTYPE_BFLOAT16, false),
        ([2, 5, 1, 2, 64, 7], MLXK_DTYPE_FLOAT32, true),
    ] {
        let [b, _, _, hv, dk, dv] = dims;
        let layer = Layer::random(&mut rng, dims, dtype, false, mask);
        let n = b + 2;
        let pool0 = rng.vec(n * hv * dv * dk, 0.5);
        let shape = [n as i32, hv as i32, dv as i32, dk as i32];
        let slots: Vec<i32> = match b {
            3 => vec![4, -1, 0],
            _ => vec![1, 3],
        };
        let fresh: Vec<u8> = (0..b).map(|i| (i == 1) as u8).collect();
        let [x, qs, ks, a, bb, al, dt, _, m] = layer.args();
        let [hk, hvi, dvi] = layer.heads;
        let (sp, fp) = (slots.as_ptr(), fresh.as_ptr());
        // The one call.
        let pool = new_f32(&pool0, &shape);
        let (mut y, mut p) = (null_mut(), null_mut());
        ok(unsafe {
            mlxk_gated_delta_update_from_conv_pool(
                x, qs, ks, hk, hvi, dvi, layer.eps, a, bb, al, dt, pool, sp, fp, b, m, &mut y,
                &mut p,
            )
        });
        free(pool);
        let (y1, p1) = (read_bytes(y), read_bytes(p));
        free(y);
        free(p);
        // The two calls.
        let pool = new_f32(&pool0, &shape);
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        ok(unsafe {
            mlxk_silu_rms_heads(x, qs, ks, hk, hvi, dvi, layer.eps, &mut q, &mut k, &mut v)
        });
        let (mut y, mut p) = (null_mut(), null_mut());
        ok(unsafe {
            mlxk_gated_delta_update_pool(q, k, v, a, bb, al, dt, pool, sp, fp, b, m, &mut y, &mut p)
        });
        free(pool);
        assert!(read_bytes(y) == y1, "y of {dims:?}");
        assert!(read_bytes(p) == p1, "pool of {dims:?}");
        free_all(&[q, k, v, y, p]);
        // Its arguments are checked with the pool's rules: a slot named twice.
        let pool = new_f32(&pool0, &shape);
        let twice = vec![0i32; b];
        expect_err(
            unsafe {
                mlxk_gated_delta_update_from_conv_pool(
                    x,
                    qs,
                    ks,
                    hk,
                    hvi,
                    dvi,
                    layer.eps,
                    a,
                    bb,
                    al,
                    dt,
                    pool,
                    twice.as_ptr(),
                    std::ptr::null(),
                    b,
                    m,
                    &mut y,
                    &mut p,
                )
            },
            MLXK_ERR_INVALID_ARGUMENT,
            &["mlxk_gated_delta_update_from_conv_pool", "slots[1] is 0"],
        );
        free(pool);
        layer.free();
    }
}
