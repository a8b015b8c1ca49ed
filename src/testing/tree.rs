//! The draft trees' hooks (`mlxk_gated_delta_verify_tree_pool`, `_commit_tree_pool`) through
//! a GPU launch, as the other `*_via_gpu` entries of `crate::testing`.

use super::{forced, GpuKernels};
use crate::capi::mlxk_array;
use crate::capi::status::mlxk_status;

/// `mlxk_gated_delta_verify_tree_pool` through a GPU launch (see [`super::gated_delta_update_via_gpu`]).
/// `args`: q, k, v, a, b, a_log, dt_bias, pool; `slots` and `fresh`: one per tree.
///
/// # Safety
/// `y` is NULL or valid for writing one handle.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gated_delta_verify_tree_pool_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 8],
    cu_nodes: &[i32],
    parents: &[i32],
    slots: &[i32],
    fresh: Option<&[u8]>,
    y: *mut *mut mlxk_array,
) -> mlxk_status {
    use crate::capi::gated_delta::tree::{verify, HostTree};
    let tree = HostTree {
        cu_nodes: cu_nodes.as_ptr(),
        n_cu_nodes: cu_nodes.len(),
        parents: parents.as_ptr(),
        n_nodes: parents.len(),
    };
    assert_eq!(slots.len() + 1, cu_nodes.len(), "one slot per tree");
    let fresh = fresh.map_or(std::ptr::null(), <[u8]>::as_ptr);
    let label = kernels.label("mlxk_gated_delta_verify_tree_pool");
    // SAFETY: the host arrays come from slices of the lengths given; forwarded contract on `y`.
    forced(kernels, gpu, || unsafe {
        verify(&label, args, tree, slots.as_ptr(), fresh, y)
    })
}

/// `mlxk_gated_delta_commit_tree_pool` through a GPU launch (see
/// [`super::gated_delta_update_via_gpu`]). `args`: k, v, a, b, a_log, dt_bias, pool; `slots`, `fresh`
/// and `accepted_lengths`: one per tree; `accepted_paths`: the trees' paths back to back.
///
/// # Safety
/// `pool_out` is NULL or valid for writing one handle.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gated_delta_commit_tree_pool_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 7],
    (cu_nodes, parents): (&[i32], &[i32]),
    slots: &[i32],
    fresh: Option<&[u8]>,
    (accepted_lengths, accepted_paths): (&[i32], &[i32]),
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    use crate::capi::gated_delta::tree::{commit, Accepted, HostTree};
    let tree = HostTree {
        cu_nodes: cu_nodes.as_ptr(),
        n_cu_nodes: cu_nodes.len(),
        parents: parents.as_ptr(),
        n_nodes: parents.len(),
    };
    assert_eq!(slots.len() + 1, cu_nodes.len(), "one slot per tree");
    assert_eq!(accepted_lengths.len(), slots.len(), "one length per tree");
    let accepted = Accepted {
        lengths: accepted_lengths.as_ptr(),
        paths: accepted_paths.as_ptr(),
        n_accepted: accepted_paths.len(),
    };
    let fresh = fresh.map_or(std::ptr::null(), <[u8]>::as_ptr);
    let label = kernels.label("mlxk_gated_delta_commit_tree_pool");
    // SAFETY: as in `gated_delta_verify_tree_pool_via_gpu`; forwarded contract on `pool_out`.
    forced(kernels, gpu, || unsafe {
        commit(
            &label,
            args,
            tree,
            (slots.as_ptr(), fresh),
            accepted,
            pool_out,
        )
    })
}
