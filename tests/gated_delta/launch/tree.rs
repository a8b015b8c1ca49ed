//! The tree verify's and commit's GPU launches without a GPU: the pool kernels' own launches,
//! the verify's over the leaves' paths gathered as packed sequences (one row a leaf, nothing
//! written), the commit's the replay over the accepted paths (one row a tree).

use super::pool::{check_launch, for_each_launch, host_and_pool, refused, Expected};
use crate::support::*;

/// Two trees: nodes 0..4 (parents -1, 0, 0, 1; leaves 2 and 3) in slot 4 and one node in a
/// padding slot. The verify's rows: the paths 0 → 2 and 0 → 1 → 3 from slot 4, then the padding
/// tree's node; the commit's: the path 0 → 1 → 3 into slot 4 (written row 0), then nothing.
#[test]
fn tree_gpu_launches_are_the_pool_launches_over_the_paths() {
    let _serial = serial();
    use mlxkern::testing::{
        gated_delta_commit_tree_pool_via_gpu, gated_delta_verify_tree_pool_via_gpu,
    };
    let mut rng = Rng::fresh();
    let dims = [1, 5, 1, 2, 32, 8];
    let (host, pool, n) = host_and_pool(&mut rng, dims);
    let x = host.arrays(&[0], 5, false);
    let [q, k, v, a, b, al, dt] = x.map(|h| h as *const mlxk_array);
    let (cu, parents, slots) = ([0, 4, 5], [-1, 0, 0, 1, -1], [4, -1]);
    for_each_launch(|kernels, y, p| {
        refused(kernels, unsafe {
            gated_delta_verify_tree_pool_via_gpu(
                kernels,
                false,
                [q, k, v, a, b, al, dt, pool],
                &cu,
                &parents,
                &slots,
                None,
                y,
            )
        });
        let verify = Expected {
            name: "mlxk_gated_delta_step_pool",
            replay: false,
            masked: false,
            y: Some([1, 6, 2, 8]),
            table: vec![0, 2, 2, 4, -1, 2, 3, 3, 4, -1, 5, 1, 0, -1, -1],
            written: 0,
            cuda_rows: 1,
        };
        check_launch(kernels, dims, n, &verify);
        refused(kernels, unsafe {
            gated_delta_commit_tree_pool_via_gpu(
                kernels,
                false,
                [k, v, a, b, al, dt, pool],
                (&cu, &parents),
                &slots,
                None,
                (&[3, 0], &[0, 1, 3]),
                p,
            )
        });
        let commit = Expected {
            name: "mlxk_gated_delta_state_pool",
            replay: true,
            y: None,
            table: vec![0, 3, 3, 4, 0, 3, 3, 0, -1, -1],
            written: 1,
            ..verify
        };
        check_launch(kernels, dims, n, &commit);
        // The trees are checked before any launch on this path too.
        expect_err(
            unsafe {
                gated_delta_verify_tree_pool_via_gpu(
                    kernels,
                    false,
                    [q, k, v, a, b, al, dt, pool],
                    &cu,
                    &[-1, 0, 0, 3, -1],
                    &slots,
                    None,
                    y,
                )
            },
            MLXK_ERR_INVALID_ARGUMENT,
            &["parents[3] is 3"],
        );
    });
    free_all(&x);
    free(pool);
}
