//! Hooks for the test suites; not part of the C ABI.

use crate::bridge::{self, CpuLaunch};
use crate::capi::status::mlxk_status;
use crate::capi::{boundary, mlxk_array, out_ptr};
use crate::cpu::CpuKernel;
use crate::dtype::Dtype;
use crate::registry;

/// Makes a lazy node whose CPU kernel panics when evaluated: evaluating it must give
/// MLXK_ERR_PANIC and leave the process intact.
pub fn panic_probe(input: *const mlxk_array, out: *mut *mut mlxk_array) -> mlxk_status {
    boundary("panic_probe", || {
        let out = out_ptr(out, "out")?;
        let mut mlx = registry::lock();
        let a = mlx.get(input, "input")?;
        let launch = CpuLaunch {
            kernel: CpuKernel::PanicProbe as u32,
            params: vec![],
            output_dims: vec![1],
            output_ndims: vec![1],
            output_dtypes: vec![Dtype::Float32 as i32],
            donate_from: vec![-1],
        };
        let list = crate::ops::gated_delta::list(&[a]);
        let outputs = crate::ops::gated_delta::take(&*bridge::cpu_kernel_op(&launch, &list)?);
        let node = outputs.into_iter().next().expect("one output");
        // SAFETY: checked non-NULL.
        unsafe { *out = mlx.insert(node) };
        Ok(())
    })
}

/// How many CPU kernel outputs so far took over an input's buffer (state updated in place).
pub fn in_place_updates() -> usize {
    crate::cpu::IN_PLACE_UPDATES.load(std::sync::atomic::Ordering::Relaxed)
}
