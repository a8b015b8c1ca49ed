//! Hooks for the test suites; not part of the C ABI.

use crate::bridge::{self, CpuLaunch};
use crate::capi::status::mlxk_status;
use crate::capi::{boundary, mlxk_array, out_ptr};
use crate::cpu::CpuKernel;
use crate::dtype::Dtype;
use crate::registry;

/// Makes a lazy node whose CPU kernel panics when evaluated: evaluating it must give
/// MLXK_ERR_PANIC and leave the process intact.
///
/// # Safety
/// `out` is NULL or valid for writing one handle.
pub unsafe fn panic_probe(input: *const mlxk_array, out: *mut *mut mlxk_array) -> mlxk_status {
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

/// Makes the CPU kernels use their portable (non-SIMD) row code (`true`) or pick the fastest
/// the machine supports (`false`). Process-wide; tests that flip it run in their own binary.
pub fn force_portable_kernels(portable: bool) {
    crate::cpu::features::FORCE_PORTABLE.store(portable, std::sync::atomic::Ordering::Relaxed);
}

/// The gates the CPU recurrence computes internally (g, beta as f32), for comparison with
/// `mlxk_compute_g` and MLX's sigmoid.
pub fn fused_gates(
    a: *const mlxk_array,
    b: *const mlxk_array,
    a_log: *const mlxk_array,
    dt_bias: *const mlxk_array,
) -> (Vec<f32>, Vec<f32>) {
    let mlx = registry::lock();
    let read = |h: *const mlxk_array, name: &str| {
        let array = mlx.get(h, name).expect("live handle");
        let mut bytes = vec![0u8; bridge::array_nbytes(array)];
        bridge::array_read(array, &mut bytes).expect("read");
        let dtype = Dtype::from_code(bridge::array_dtype(array)).expect("dtype");
        (bytes, dtype, bridge::array_size(array))
    };
    let (a, a_dtype, count) = read(a, "a");
    let (b, b_dtype, _) = read(b, "b");
    let (a_log, a_log_dtype, hv) = read(a_log, "a_log");
    let (dt_bias, dt_bias_dtype, _) = read(dt_bias, "dt_bias");
    let inputs = crate::cpu::gated_delta::GateInputs {
        a: &a,
        a_dtype,
        b: &b,
        b_dtype,
        a_log: &a_log,
        a_log_dtype,
        dt_bias: &dt_bias,
        dt_bias_dtype,
    };
    crate::cpu::gated_delta::gates(&inputs, count, hv)
}

/// MLX's own `sigmoid` of an array, on the CPU (a new handle).
///
/// # Safety
/// `out` is NULL or valid for writing one handle.
pub unsafe fn mlx_sigmoid(x: *const mlxk_array, out: *mut *mut mlxk_array) -> mlxk_status {
    boundary("mlx_sigmoid", || {
        let out = out_ptr(out, "out")?;
        let mut mlx = registry::lock();
        let result = bridge::sigmoid(mlx.get(x, "x")?, false)?;
        // SAFETY: checked non-NULL.
        unsafe { *out = mlx.insert(result) };
        Ok(())
    })
}

/// Threads the CPU kernels use (the calling thread plus the pool's helpers).
pub fn cpu_threads() -> usize {
    crate::cpu::pool::threads()
}
