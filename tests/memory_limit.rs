//! The process-wide memory limit (its own test binary: the limit is global, and other tests
//! running in parallel threads must not see it lowered; its two tests hold `support::serial`,
//! since each reads the limit the other sets).

mod support;

use crate::support::vjp_case::vjp;
use crate::support::*;
use mlxkern::testing::gated_delta_update_pool_chunked_via_gpu;
use std::ptr::null_mut;

/// `f` run under a memory limit of `bytes`; the limit is lifted (0) after it.
fn under_limit<R>(bytes: usize, f: impl FnOnce() -> R) -> R {
    ok(mlxk_set_memory_limit(bytes));
    let out = f();
    ok(mlxk_set_memory_limit(0));
    out
}

#[test]
fn memory_limit_refuses_before_allocating() {
    let _serial = serial();
    let mut previous = 0usize;
    ok(unsafe { mlxk_get_memory_limit(&mut previous) });
    assert!(previous > 0);
    ok(mlxk_set_memory_limit(1024));
    let mut out: H = null_mut();
    expect_err(
        unsafe { mlxk_array_zeros([16i32, 17].as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut out) },
        MLXK_ERR_OUT_OF_MEMORY,
        &["1088", "1024"],
    );
    ok(unsafe { mlxk_array_zeros([16i32, 16].as_ptr(), 2, MLXK_DTYPE_FLOAT32, &mut out) });
    free(out);
    ok(mlxk_set_memory_limit(0));
    let mut restored = 0usize;
    ok(unsafe { mlxk_get_memory_limit(&mut restored) });
    assert_eq!(restored, previous);
    expect_err(
        unsafe { mlxk_get_memory_limit(null_mut()) },
        MLXK_ERR_NULL_POINTER,
        &["bytes"],
    );
    ok(mlxk_set_cache_limit(1 << 20));
}

#[test]
fn kernels_refuse_results_above_the_limit_before_building() {
    let _serial = serial();
    let mut rng = Rng::fresh();
    let r = Recurrence::random(&mut rng, [2, 64, 2, 4, 128, 128], true, false);
    // The new state alone is 2*4*128*128*4 = 512 KiB.
    let (status, y, s) = under_limit(256 * 1024, || r.run());
    expect_err(
        status,
        MLXK_ERR_OUT_OF_MEMORY,
        &["y, state_out", "memory limit"],
    );
    assert!(y.is_null() && s.is_null());
    let (status, y, s) = r.run();
    ok(status);
    free(y);
    free(s);

    // The backward pass with a GPU as default device keeps every token's state (MLX's ops):
    // about 2 * 65 * 512 KiB here, refused under an 8 MiB limit that the CPU backward fits.
    let [q, k, v, a, b, al, dt, st, m] = r.args();
    let args = [q, k, v, a, b, al, dt, st, m, null_mut(), null_mut()];
    let mut grads: [H; 8] = [null_mut(); 8];
    let (cpu, ops) = under_limit(8 << 20, || {
        let cpu = vjp(args.map(|h| h as *const mlxk_array), None, &mut grads);
        let outs = grads.each_mut().map(|g| g as *mut H);
        let ops = unsafe {
            mlxkern::testing::gated_delta_update_vjp_via_gpu(GpuKernels::Cuda, false, args, outs)
        };
        (cpu, ops)
    });
    ok(cpu);
    expect_err(
        ops,
        MLXK_ERR_OUT_OF_MEMORY,
        &["GPU backward pass", "memory limit"],
    );
    for g in grads {
        free(g);
    }

    // The chunked form on a GPU keeps per-chunk matrices: 2 * 4 * 64 * (2 * 128 + 128 + 32 + 1)
    // floats (854 KB) here, refused under an 800 KiB limit that its results (y, state) fit.
    let (mut y, mut s) = (null_mut(), null_mut());
    let status = under_limit(800 * 1024, || unsafe {
        gated_delta_update_chunked_via_gpu(GpuKernels::Cuda, false, r.args(), 0, &mut y, &mut s)
    });
    expect_err(
        status,
        MLXK_ERR_OUT_OF_MEMORY,
        &["GPU chunked form's per-chunk matrices", "memory limit"],
    );
    assert!(y.is_null() && s.is_null());
    // With them, the state pass keeps the state entering each of the 2 chunks and the final one
    // (2 * 4 * 3 * 128 * 128 floats) and U (2 * 4 * 64 * 128): 2.69 MB in all, refused under
    // 2 MiB, which the per-chunk matrices fit.
    let status = under_limit(2 << 20, || unsafe {
        gated_delta_update_chunked_via_gpu(GpuKernels::Cuda, false, r.args(), 0, &mut y, &mut s)
    });
    expect_err(
        status,
        MLXK_ERR_OUT_OF_MEMORY,
        &[
            "GPU chunked form's kept states",
            "each of its 2 chunks",
            "2689024 bytes",
            "memory limit",
        ],
    );
    assert!(y.is_null() && s.is_null());
    let status = unsafe {
        gated_delta_update_chunked_via_gpu(GpuKernels::Cuda, false, r.args(), 0, &mut y, &mut s)
    };
    expect_err(
        status,
        MLXK_ERR_BACKEND,
        &[refused_launch(GpuKernels::Cuda)],
    );

    // The same rows as a chunked pool call (a pool of 3, slots 0 and 2): 4 chunks over the two
    // rows, 6 kept states a value head, the same 2.69 MB, refused under 2 MiB; without the
    // limit the launch reaches MLX.
    let pool = new_f32(&rng.vec(3 * 4 * 128 * 128, 0.5), &[3, 4, 128, 128]);
    let mut args = r.args();
    args[7] = pool as *const mlxk_array;
    let pool_call = |y: &mut H, p: &mut H| unsafe {
        gated_delta_update_pool_chunked_via_gpu(
            GpuKernels::Cuda,
            false,
            args,
            &[0, 2],
            None,
            None,
            0,
            y,
            p,
        )
    };
    let status = under_limit(2 << 20, || pool_call(&mut y, &mut s));
    expect_err(
        status,
        MLXK_ERR_OUT_OF_MEMORY,
        &[
            "GPU chunked form's kept states",
            "each of its 4 chunks",
            "2689024 bytes",
        ],
    );
    assert!(y.is_null() && s.is_null());
    expect_err(
        pool_call(&mut y, &mut s),
        MLXK_ERR_BACKEND,
        &[refused_launch(GpuKernels::Cuda)],
    );
    free(pool);
    r.free();
}
