//! The MLX CUDA pool launch that writes the pool's own rows (`PoolWrite::InPlace`), reached
//! without a GPU: forced on (`testing::pool_in_place`), a pool update and a commit build the
//! in-place text (its header defines MLXK_POOL_IN_PLACE), number the written rows by slot, and
//! reach MLX's `cuda_kernel`, which refuses on a CPU stream. The switch is process-wide:
//! tests/gated_delta/launch/main.rs.

use crate::support::pool::*;
use crate::support::*;
use std::ptr::null_mut;

#[test]
fn the_in_place_pool_launch_numbers_rows_by_slot_and_reaches_cuda_kernel() {
    let _serial = serial();
    use mlxkern::testing::{
        gated_delta_state_pool_via_gpu, gated_delta_update_pool_via_gpu, last_gpu_launch,
        pool_in_place, record_gpu_launches,
    };
    let mut rng = Rng::fresh();
    let dims = [3, 4, 1, 2, 32, 8];
    let host = Host::random(&mut rng, dims, MLXK_DTYPE_BFLOAT16);
    let n = 6;
    let pool = new_f32(&rng.vec(n * host.state_len(), 0.5), &pool_shape(&host, n));
    let x = host.arrays(&[0, 1, 2], 4, false);
    let [q, k, v, a, b, al, dt] = x;
    let (slots, fresh) = ([4, -1, 1], [0u8, 0, 1]);
    pool_in_place(Some(true));
    record_gpu_launches(true);
    let cuda = GpuKernels::Cuda;
    let refused = |status| expect_err(status, MLXK_ERR_BACKEND, &[refused_launch(cuda)]);
    let check = |what: &str, table: &[i32]| {
        let (l, inputs) = last_gpu_launch().expect("a launch reached MLX");
        assert!(l.name.contains("_pool_in_place"), "{what}: {}", l.name);
        assert!(
            resolved(&l.header).contains("#define MLXK_POOL_IN_PLACE(p) const_cast<float*>(p)"),
            "{what}: the in-place header"
        );
        let rows = l.input_names.iter().position(|n| n == "rows").unwrap();
        assert_eq!(ints(&inputs[rows].bytes), table, "{what}: the row table");
        // The launch's state output: the one row no thread writes.
        let ndim = *l.output_ndims.last().unwrap() as usize;
        let dims = &l.output_dims[l.output_dims.len() - ndim..];
        assert_eq!(dims[0], 1, "{what}: the state output");
    };
    let (mut y, mut p) = (null_mut(), null_mut());
    let args = [q, k, v, a, b, al, dt, pool, null_mut()].map(|h| h as *const mlxk_array);
    refused(unsafe {
        gated_delta_update_pool_via_gpu(
            cuda,
            false,
            false,
            args,
            &slots,
            Some(&fresh),
            None,
            &mut y,
            &mut p,
        )
    });
    // Rows by slot (dst = the slot itself): row 0 from slot 4 into 4, row 1 padding, row 2
    // fresh into 1.
    check("update", &[0, 4, 4, 4, 4, 4, 4, 0, -1, -1, 8, 4, 4, -1, 1]);
    let mut p = null_mut();
    let rargs = [k, v, a, b, al, dt, pool].map(|h| h as *const mlxk_array);
    refused(unsafe {
        gated_delta_state_pool_via_gpu(cuda, false, rargs, &slots, None, &[2, 3, 0], &mut p)
    });
    check("commit", &[0, 4, 2, 4, 4, 4, 4, 0, -1, -1, 8, 4, 0, 1, 1]);
    // A verify writes nothing: the launch of written rows (none) as before.
    let mut y = null_mut();
    refused(unsafe {
        gated_delta_update_pool_via_gpu(
            cuda,
            false,
            true,
            args,
            &slots,
            None,
            None,
            &mut y,
            null_mut(),
        )
    });
    let (l, _) = last_gpu_launch().unwrap();
    assert!(!l.name.contains("_in_place"), "verify: {}", l.name);
    record_gpu_launches(false);
    pool_in_place(None);
    free_all(&x);
    free(pool);
}
