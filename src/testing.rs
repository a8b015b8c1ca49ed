//! Hooks for the test suites; not part of the C ABI. The `*_via_gpu` entries run a kernel
//! through its Metal or CUDA launch whatever the default device (`gpu = false`: on a CPU
//! stream, where MLX refuses), so tests build and check both GPU dispatches on machines without
//! a GPU.

use crate::bridge;
use crate::capi::gated_delta::pool::HostRows;
use crate::capi::gated_delta::tree::{commit, verify, Accepted, HostTree};
use crate::capi::gated_delta::{self, Form};
use crate::capi::status::mlxk_status;
use crate::capi::{boundary, mlxk_array, Out};
use crate::dtype::Dtype;
use crate::node::{Kernel, Output};
use crate::ops::gated_delta::PoolForm;
use crate::ops::Backend;
use crate::registry;

/// Makes a lazy node whose CPU kernel panics when evaluated: evaluating it must give
/// MLXK_ERR_PANIC and leave the process intact.
///
/// # Safety
/// `out` is NULL or valid for writing one handle.
pub unsafe fn panic_probe(input: *const mlxk_array, out: *mut *mut mlxk_array) -> mlxk_status {
    boundary("panic_probe", || {
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        let mut mlx = registry::lock();
        let a = mlx.get(input, "input")?;
        let output = Output {
            shape: vec![1],
            dtype: Dtype::Float32,
        };
        let outputs = crate::ops::cpu_node(Kernel::PanicProbe, vec![], &[output], vec![-1], &[a])?;
        let node = outputs.into_iter().next().expect("one output");
        out.write(mlx.insert(node));
        Ok(())
    })
}

/// Where an injected fault makes a CPU kernel node fail (`fail_cpu_kernel`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The node's evaluation raises before its outputs get buffers, as MLX's allocator does
    /// when memory runs out.
    AtEval,
    /// The node's task raises on MLX's stream thread before its kernel runs, as a kernel that
    /// fails at evaluation.
    InTask,
}

/// Makes the CPU kernel node evaluated on this thread after `after` others fail at `fault`
/// (once; `None` clears a fault not yet met). Counts the nodes of every evaluation on this
/// thread: a decode step is one node, the update from the convolution's output two (the head
/// split, then the update).
pub fn fail_cpu_kernel(fault: Option<(usize, Fault)>) {
    use crate::seams::{FAULT_AT_EVAL, FAULT_IN_TASK};
    let code = fault.map(|(after, f)| {
        let stage = match f {
            Fault::AtEval => FAULT_AT_EVAL,
            Fault::InTask => FAULT_IN_TASK,
        };
        (after, stage)
    });
    crate::seams::switches::CPU_KERNEL_FAULT.with(|f| f.set(code));
}

/// Whether the fault `fail_cpu_kernel` set on this thread is still to come.
pub fn cpu_kernel_fault_pending() -> bool {
    crate::seams::switches::CPU_KERNEL_FAULT.with(|f| f.get().is_some())
}

/// Which pool launch the GPU pool calls that write states take on MLX CUDA: `Some(true)` the one
/// that writes the pool's own rows (`PoolWrite::InPlace`) whatever MLX exports, `Some(false)`
/// the written rows then MLX's scatter, `None` the default (in place where MLX exports its CUDA
/// command encoder). Process-wide; tests that set it run in their own binary.
pub fn pool_in_place(mode: Option<bool>) {
    let code = match mode {
        None => 0,
        Some(true) => 1,
        Some(false) => 2,
    };
    crate::seams::switches::POOL_IN_PLACE.store(code, std::sync::atomic::Ordering::Relaxed);
}

/// The address of an array's data after evaluating it (a pool updated in place keeps it).
pub fn data_address(a: *const mlxk_array) -> usize {
    let mlx = crate::registry::lock();
    let Ok(array) = mlx.get(a, "a") else {
        return 0;
    };
    if crate::bridge::array_eval(array).is_err() {
        return 0;
    }
    crate::bridge::array_address(array)
}

/// The address of a safe [`Array`](crate::Array)'s data after evaluating it (0 when that
/// fails): `data_address` for the safe API.
pub fn array_data_address(a: &crate::Array) -> usize {
    let _mlx = crate::registry::lock();
    let Ok(array) = a.get("a") else {
        return 0;
    };
    if crate::bridge::array_eval(array).is_err() {
        return 0;
    }
    crate::bridge::array_address(array)
}

/// How many CPU kernel outputs so far took over an input's buffer (state updated in place).
pub fn in_place_updates() -> usize {
    crate::seams::switches::IN_PLACE_UPDATES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Makes the CPU kernels use their portable (non-SIMD) row code (`true`) or pick the fastest
/// the machine supports (`false`). Process-wide; tests that flip it run in their own binary.
pub fn force_portable_kernels(portable: bool) {
    crate::seams::switches::FORCE_PORTABLE.store(portable, std::sync::atomic::Ordering::Relaxed);
}

/// Makes the CPU kernels use their AVX2 code on a CPU with AVX-512 (`true`) or pick the
/// fastest the machine supports (`false`); `force_portable_kernels(true)` still wins.
/// Process-wide; tests that flip it run in their own binary.
pub fn force_avx2_kernels(avx2: bool) {
    crate::seams::switches::FORCE_AVX2.store(avx2, std::sync::atomic::Ordering::Relaxed);
}

/// The CPU features the kernels use now: `(avx2, avx512)`, after the switches above
/// (`avx2`: AVX2, FMA and F16C; `avx512`: AVX-512 F, BW, DQ and VL as well).
pub fn kernel_features() -> (bool, bool) {
    let f = crate::cpu::features::kernels();
    (f.avx2_fma_f16c(), f.avx512())
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
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        let mut mlx = registry::lock();
        let result = bridge::sigmoid(mlx.get(x, "x")?, false)?;
        out.write(mlx.insert(result));
        Ok(())
    })
}

/// Makes the GPU recurrence and replay take g and beta from MLX's CPU ops (`true`), which equal
/// the CPU kernel's fused gates bit for bit, instead of MLX's GPU ops (`false`, the library's
/// behaviour). With it, a GPU result must equal the CPU kernel's bits. Process-wide.
pub fn gpu_gates_on_cpu(on_cpu: bool) {
    crate::seams::switches::GPU_GATES_ON_CPU.store(on_cpu, std::sync::atomic::Ordering::Relaxed);
}

/// Makes `mlxk_gated_delta_update_from_conv` build its one GPU kernel for any number of tokens
/// (`true`), not only for one (`false`, the library's behaviour), so that tests check that
/// kernel at T > 1 too. Process-wide.
pub fn from_conv_one_kernel_any_tokens(on: bool) {
    crate::seams::switches::FROM_CONV_ANY_T.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Makes MLX CUDA launches that use the matrix tiles take `form` (`None`: the configured one,
/// `MLXK_CUDA_TILES` or fma), so that one process checks every form. Process-wide; the launches
/// made afterwards see it.
pub fn cuda_tile_form(form: Option<crate::cuda::TileForm>) {
    let code = form.map_or(0, |f| {
        1 + crate::cuda::TileForm::ALL
            .iter()
            .position(|&x| x == f)
            .expect("a listed form") as u8
    });
    crate::seams::switches::CUDA_TILE_FORM.store(code, std::sync::atomic::Ordering::Relaxed);
}

/// Threads the CPU kernels use (the calling thread plus the pool's helpers).
pub fn cpu_threads() -> usize {
    crate::cpu::pool::threads()
}

/// Which GPU launch a `*_via_gpu` hook builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuKernels {
    /// `mx::fast::metal_kernel` (`crate::metal`).
    Metal,
    /// `mx::fast::cuda_kernel` on the same text (`crate::cuda`).
    Cuda,
}

/// Runs `call` with this thread's calls taking `kernels`' backend (`gpu = false`: on a CPU
/// stream) instead of the default device's (`crate::seams::forced_backend`).
fn forced<R>(kernels: GpuKernels, gpu: bool, call: impl FnOnce() -> R) -> R {
    use crate::seams::switches::FORCED_BACKEND;
    struct Restore(Option<i64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            FORCED_BACKEND.with(|b| b.set(self.0));
        }
    }
    let code = kernels.backend(gpu).code();
    let _restore = Restore(FORCED_BACKEND.with(|b| b.replace(Some(code))));
    call()
}

impl GpuKernels {
    fn backend(self, gpu: bool) -> Backend {
        match self {
            GpuKernels::Metal => Backend::Metal { gpu },
            GpuKernels::Cuda => Backend::Cuda { gpu },
        }
    }

    fn label(self, entry: &str) -> String {
        format!("{entry} ({self:?})")
    }
}

/// `mlxk_gated_delta_update_chunked` forced through the GPU launches (the prep, state and
/// output kernels; see [`gated_delta_update_via_gpu`]).
///
/// # Safety
/// `y` and `state_out` are NULL or valid for writing one handle each.
pub unsafe fn gated_delta_update_chunked_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 9],
    chunk_size: i32,
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `y` and `state_out`.
    forced(kernels, gpu, || unsafe {
        gated_delta::update(
            &kernels.label("mlxk_gated_delta_update_chunked"),
            Form::Chunked(chunk_size),
            args,
            y,
            state_out,
        )
    })
}

/// `mlxk_gated_delta_update` forced through a GPU launch (`gpu = false`: on a CPU stream,
/// where MLX refuses, e.g. "No Metal back-end"). Lets tests build and check the GPU dispatch
/// on machines without that GPU.
///
/// # Safety
/// `y` and `state_out` are NULL or valid for writing one handle each.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gated_delta_update_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 9],
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `y` and `state_out`.
    forced(kernels, gpu, || unsafe {
        gated_delta::update(
            &kernels.label("mlxk_gated_delta_update"),
            Form::Exact,
            args,
            y,
            state_out,
        )
    })
}

/// `mlxk_gated_delta_state` forced through a GPU launch (see [`gated_delta_update_via_gpu`]).
///
/// # Safety
/// `state_out` is NULL or valid for writing one handle.
pub unsafe fn gated_delta_state_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 7],
    accepted_lengths: &[i32],
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: the lengths come from a slice; forwarded contract on `state_out`.
    forced(kernels, gpu, || unsafe {
        gated_delta::build_state(
            &kernels.label("mlxk_gated_delta_state"),
            args,
            accepted_lengths.as_ptr(),
            accepted_lengths.len(),
            state_out,
        )
    })
}

/// `mlxk_silu_rms_heads` through a GPU launch (`gpu = false`: a CPU stream, which MLX
/// refuses).
///
/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
pub unsafe fn silu_rms_heads_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    arrays: [*const mlxk_array; 3],
    heads: [i32; 3],
    eps: f32,
    outs: [*mut *mut mlxk_array; 3],
) -> mlxk_status {
    // SAFETY: forwarded contract on `outs`.
    forced(kernels, gpu, || unsafe {
        crate::capi::silu_rms_heads::split(
            &kernels.label("mlxk_silu_rms_heads"),
            arrays,
            heads,
            eps,
            outs,
        )
    })
}

/// `mlxk_gated_delta_update_from_conv` through a GPU launch (`gpu = false`: a CPU stream, which
/// MLX refuses). `arrays`: x, q_scale, k_scale, a, b, a_log, dt_bias, state, mask.
///
/// # Safety
/// `y` and `state_out` are NULL or valid for writing one handle each.
pub unsafe fn gated_delta_update_from_conv_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    arrays: [*const mlxk_array; 9],
    heads: [i32; 3],
    eps: f32,
    y: *mut *mut mlxk_array,
    state_out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `y` and `state_out`.
    forced(kernels, gpu, || unsafe {
        gated_delta::update_from_conv(
            &kernels.label("mlxk_gated_delta_update_from_conv"),
            arrays,
            heads,
            eps,
            y,
            state_out,
        )
    })
}

/// `mlxk_gated_rms_norm` through a GPU launch.
///
/// # Safety
/// `out` is NULL or valid for writing one handle.
pub unsafe fn gated_rms_norm_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    arrays: [*const mlxk_array; 3],
    eps: f32,
    out: *mut *mut mlxk_array,
) -> mlxk_status {
    // SAFETY: forwarded contract on `out`.
    forced(kernels, gpu, || unsafe {
        crate::capi::gated_rms_norm::norm(&kernels.label("mlxk_gated_rms_norm"), arrays, eps, out)
    })
}

/// `mlxk_gated_delta_update_vjp` through its GPU path, the MLX ops backward (`gpu = false`: on
/// a CPU stream, where MLX runs `mx::fast::gated_delta_update`'s ops fallback), whatever the
/// default device. `args`: q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out.
///
/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
pub unsafe fn gated_delta_update_vjp_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 11],
    outs: [*mut *mut mlxk_array; 8],
) -> mlxk_status {
    // SAFETY: forwarded contract on `outs`.
    forced(kernels, gpu, || unsafe {
        gated_delta::update_vjp(&kernels.label("mlxk_gated_delta_update_vjp"), args, outs)
    })
}

/// `mlxk_gated_delta_update_chunked_vjp` through its GPU path (see
/// [`gated_delta_update_vjp_via_gpu`]): the chunked GPU backward's five launches, after the
/// chunk size is checked.
///
/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
pub unsafe fn gated_delta_update_chunked_vjp_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    chunk_size: i32,
    args: [*const mlxk_array; 11],
    outs: [*mut *mut mlxk_array; 8],
) -> mlxk_status {
    // SAFETY: forwarded contract on `outs`.
    forced(kernels, gpu, || unsafe {
        gated_delta::update_vjp_form(
            &kernels.label("mlxk_gated_delta_update_chunked_vjp"),
            Some(chunk_size),
            args,
            outs,
        )
    })
}

/// `mlxk_silu_rms_heads_vjp` through its GPU path (see [`gated_delta_update_vjp_via_gpu`]).
///
/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
pub unsafe fn silu_rms_heads_vjp_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    arrays: [*const mlxk_array; 3],
    heads: [i32; 3],
    eps: f32,
    cotangents: [*const mlxk_array; 3],
    outs: [*mut *mut mlxk_array; 3],
) -> mlxk_status {
    // SAFETY: forwarded contract on `outs`.
    forced(kernels, gpu, || unsafe {
        crate::capi::silu_rms_heads::split_vjp(
            &kernels.label("mlxk_silu_rms_heads_vjp"),
            arrays,
            heads,
            eps,
            cotangents,
            outs,
        )
    })
}

/// `mlxk_gated_rms_norm_vjp` through its GPU path (see [`gated_delta_update_vjp_via_gpu`]).
///
/// # Safety
/// Each of `outs` is NULL or valid for writing one handle.
pub unsafe fn gated_rms_norm_vjp_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    arrays: [*const mlxk_array; 3],
    eps: f32,
    dout: *const mlxk_array,
    outs: [*mut *mut mlxk_array; 3],
) -> mlxk_status {
    // SAFETY: forwarded contract on `outs`.
    forced(kernels, gpu, || unsafe {
        crate::capi::gated_rms_norm::norm_vjp(
            &kernels.label("mlxk_gated_rms_norm_vjp"),
            arrays,
            eps,
            dout,
            outs,
        )
    })
}

/// Pool calls through a GPU launch (see [`gated_delta_update_via_gpu`]): the update
/// (`mlxk_gated_delta_update_pool`), the verify (`verify`: `mlxk_gated_delta_verify_pool`, no
/// `pool_out`) or, with `cu_seqlens`, the packed update (`mlxk_gated_delta_update_packed`).
/// `args`: q, k, v, a, b, a_log, dt_bias, pool, mask (NULL: none). `fresh`: one flag per slot.
///
/// # Safety
/// `y` and `pool_out` are NULL or valid for writing one handle each.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gated_delta_update_pool_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    verify: bool,
    args: [*const mlxk_array; 9],
    slots: &[i32],
    fresh: Option<&[u8]>,
    cu_seqlens: Option<&[i32]>,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    if let Some(f) = fresh {
        assert_eq!(f.len(), slots.len(), "one fresh flag per slot");
    }
    let (entry, form) = match (verify, cu_seqlens) {
        (true, _) => ("mlxk_gated_delta_verify_pool", PoolForm::Verify),
        (false, None) => ("mlxk_gated_delta_update_pool", PoolForm::Update),
        (false, Some(_)) => ("mlxk_gated_delta_update_packed", PoolForm::Update),
    };
    // SAFETY: the host arrays come from slices of the lengths given; forwarded contract on `y`
    // and `pool_out`.
    forced(kernels, gpu, || unsafe {
        crate::capi::gated_delta::pool::update(
            &kernels.label(entry),
            Ok(form),
            args,
            HostRows {
                slots: slots.as_ptr(),
                fresh: fresh.map_or(std::ptr::null(), <[u8]>::as_ptr),
                n_slots: slots.len(),
            },
            cu_seqlens.map(|c| (c.as_ptr(), c.len())),
            y,
            pool_out,
        )
    })
}

/// The chunked pool calls through the GPU launches (see [`gated_delta_update_via_gpu`]):
/// `mlxk_gated_delta_update_pool_chunked` or, with `cu_seqlens`,
/// `mlxk_gated_delta_update_packed_chunked`; arguments as [`gated_delta_update_pool_via_gpu`]
/// plus the chunk size.
///
/// # Safety
/// `y` and `pool_out` are NULL or valid for writing one handle each.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gated_delta_update_pool_chunked_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 9],
    slots: &[i32],
    fresh: Option<&[u8]>,
    cu_seqlens: Option<&[i32]>,
    chunk_size: i32,
    y: *mut *mut mlxk_array,
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    if let Some(f) = fresh {
        assert_eq!(f.len(), slots.len(), "one fresh flag per slot");
    }
    let entry = match cu_seqlens {
        None => "mlxk_gated_delta_update_pool_chunked",
        Some(_) => "mlxk_gated_delta_update_packed_chunked",
    };
    // SAFETY: as in `gated_delta_update_pool_via_gpu`.
    forced(kernels, gpu, || unsafe {
        crate::capi::gated_delta::pool::update(
            &kernels.label(entry),
            crate::node::gated_delta::ChunkSize::from_c(chunk_size).map(PoolForm::Chunked),
            args,
            HostRows {
                slots: slots.as_ptr(),
                fresh: fresh.map_or(std::ptr::null(), <[u8]>::as_ptr),
                n_slots: slots.len(),
            },
            cu_seqlens.map(|c| (c.as_ptr(), c.len())),
            y,
            pool_out,
        )
    })
}

/// `mlxk_gated_delta_state_pool` through a GPU launch (see [`gated_delta_update_via_gpu`]).
/// `args`: k, v, a, b, a_log, dt_bias, pool; `fresh` and `accepted_lengths`: one per slot.
///
/// # Safety
/// `pool_out` is NULL or valid for writing one handle.
pub unsafe fn gated_delta_state_pool_via_gpu(
    kernels: GpuKernels,
    gpu: bool,
    args: [*const mlxk_array; 7],
    slots: &[i32],
    fresh: Option<&[u8]>,
    accepted_lengths: &[i32],
    pool_out: *mut *mut mlxk_array,
) -> mlxk_status {
    assert_eq!(accepted_lengths.len(), slots.len(), "one length per slot");
    if let Some(f) = fresh {
        assert_eq!(f.len(), slots.len(), "one fresh flag per slot");
    }
    // SAFETY: as in `gated_delta_update_pool_via_gpu`.
    forced(kernels, gpu, || unsafe {
        crate::capi::gated_delta::pool::state(
            &kernels.label("mlxk_gated_delta_state_pool"),
            args,
            HostRows {
                slots: slots.as_ptr(),
                fresh: fresh.map_or(std::ptr::null(), <[u8]>::as_ptr),
                n_slots: slots.len(),
            },
            accepted_lengths.as_ptr(),
            pool_out,
        )
    })
}

/// Makes every GPU launch the library hands to MLX be kept, with its inputs, for
/// [`last_gpu_launch`] (`true`), or not (`false`, the library's behaviour). Process-wide.
pub fn record_gpu_launches(on: bool) {
    crate::seams::switches::RECORD_GPU_LAUNCHES.store(on, std::sync::atomic::Ordering::Relaxed);
    if !on {
        let _mlx = registry::lock();
        *crate::ops::LAST_GPU_LAUNCH
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = None;
    }
}

/// One input of a recorded GPU launch: its shape, dtype and (evaluated on the CPU) bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchInput {
    pub shape: Vec<i32>,
    pub dtype: Dtype,
    pub bytes: Vec<u8>,
}

/// The last GPU launch handed to MLX while [`record_gpu_launches`] was on (its description as
/// `mx::fast::metal_kernel` / `cuda_kernel` received it, name with the input dtypes), and its
/// inputs in order. Inputs are evaluated to read them: record launches made on a CPU stream.
pub fn last_gpu_launch() -> Option<(crate::bridge::MetalLaunch, Vec<LaunchInput>)> {
    let _mlx = registry::lock();
    let kept = crate::ops::LAST_GPU_LAUNCH
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let (launch, inputs) = kept.as_ref()?;
    let inputs = inputs
        .iter()
        .map(|a| {
            let shape = (0..bridge::array_ndim(a))
                .map(|axis| bridge::array_dim(a, axis))
                .collect();
            let mut bytes = vec![0u8; bridge::array_nbytes(a)];
            bridge::array_eval(a).expect("a recorded input evaluates");
            bridge::array_read(a, &mut bytes).expect("a recorded input reads");
            let dtype = Dtype::from_code(bridge::array_dtype(a)).expect("a known dtype");
            LaunchInput {
                shape,
                dtype,
                bytes,
            }
        })
        .collect();
    Some(((**launch).clone(), inputs))
}

/// The forward of a GPU node whose autograd entry [`gpu_node_vjp`] calls.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GpuForward {
    /// `mlxk_gated_rms_norm` (eps): primals x, gate, weight; one cotangent (out's).
    GatedRmsNorm { eps: f32 },
    /// `mlxk_silu_rms_heads`: primals x, q_scale, k_scale; cotangents of q, k, v.
    SiluRmsHeads {
        key_heads: i32,
        value_heads: i32,
        value_width: i32,
        eps: f32,
    },
    /// `mlxk_gated_delta_update` (exact) with its gates fused (the CUDA launch's inputs: q, k,
    /// v, a, b, state, T, then the mask if `masked`, then a_log, dt_bias) or not (the Metal
    /// launch's: q, k, v, g, beta, state, T, mask); cotangents of y and the state.
    GatedDelta { fused: bool, masked: bool },
}

/// What MLX's autograd runs for a GPU node (`GpuKernelWithVjp::vjp` → `mlxk_gpu_vjp`), on
/// `kernels` with a CPU stream: the node's description made as the forward makes it, then the
/// gradients of every primal (one handle each into `outs`, in the primals' order). For the
/// recurrence, `node_args` are the caller's arrays the forward would check (q, k, v, a, b,
/// a_log, dt_bias, state, mask; NULL where absent), since its launch's primals are not the
/// caller's arrays; for the norms they are the primals.
///
/// # Safety
/// `outs` has room for one handle per primal.
pub unsafe fn gpu_node_vjp(
    forward: GpuForward,
    kernels: GpuKernels,
    node_args: &[*const mlxk_array],
    primals: &[*const mlxk_array],
    cotangents: &[*const mlxk_array],
    outs: &mut [*mut mlxk_array],
) -> mlxk_status {
    boundary("gpu_node_vjp", || {
        let mut mlx = registry::lock();
        let get = |mlx: &registry::Guard, list: &[*const mlxk_array], what: &str| {
            list.iter()
                .enumerate()
                .map(|(i, &h)| {
                    mlx.get(h, &format!("{what} {i}"))
                        .map(|a| bridge::list(&[a]))
                })
                .collect::<crate::error::Result<Vec<_>>>()
        };
        let backend = kernels.backend(false);
        let (kernel, words) = match forward {
            GpuForward::GatedRmsNorm { eps } => {
                let [x, gate, weight] = node_args else {
                    panic!("three arrays: x, gate, weight")
                };
                let node =
                    crate::ops::gated_rms_norm::check(&crate::ops::gated_rms_norm::Inputs {
                        x: mlx.get(*x, "x")?,
                        gate: mlx.get(*gate, "gate")?,
                        weight: mlx.get(*weight, "weight")?,
                        eps,
                    })?;
                (Kernel::GatedRmsNorm, crate::node::Words::encode(&node))
            }
            GpuForward::SiluRmsHeads {
                key_heads,
                value_heads,
                value_width,
                eps,
            } => {
                let [x, q_scale, k_scale] = node_args else {
                    panic!("three arrays: x, q_scale, k_scale")
                };
                let node =
                    crate::ops::silu_rms_heads::check(&crate::ops::silu_rms_heads::Inputs {
                        x: mlx.get(*x, "x")?,
                        q_scale: mlx.get(*q_scale, "q_scale")?,
                        k_scale: mlx.get(*k_scale, "k_scale")?,
                        key_heads,
                        value_heads,
                        value_width,
                        eps,
                    })?;
                (Kernel::SiluRmsHeads, crate::node::Words::encode(&node))
            }
            GpuForward::GatedDelta { fused, .. } => {
                let [q, k, v, a, b, a_log, dt_bias, state, mask] = node_args else {
                    panic!("nine arrays: q, k, v, a, b, a_log, dt_bias, state, mask")
                };
                let optional = |h: *const mlxk_array, name: &str| {
                    if h.is_null() {
                        Ok(None)
                    } else {
                        mlx.get(h, name).map(Some)
                    }
                };
                let node =
                    crate::ops::gated_delta::check_update(&crate::ops::gated_delta::Inputs {
                        q: mlx.get(*q, "q")?,
                        k: mlx.get(*k, "k")?,
                        v: mlx.get(*v, "v")?,
                        a: mlx.get(*a, "a")?,
                        b: mlx.get(*b, "b")?,
                        a_log: mlx.get(*a_log, "a_log")?,
                        dt_bias: mlx.get(*dt_bias, "dt_bias")?,
                        state: optional(*state, "state")?,
                        mask: optional(*mask, "mask")?,
                    })?;
                let mut words = vec![fused as i64];
                words.extend(crate::node::Words::encode(&node));
                (Kernel::GatedDelta, words)
            }
        };
        let params = crate::ops::gpu_vjp_params(backend, words);
        let primals: Vec<_> = get(&mlx, primals, "primal")?
            .iter()
            .map(|l| bridge::list_get(l, 0))
            .collect();
        let cotangents: Vec<_> = get(&mlx, cotangents, "cotangent")?
            .iter()
            .map(|l| bridge::list_get(l, 0))
            .collect();
        let grads = crate::ops::gpu_vjp(kernel as u32, &params, &primals, &cotangents)?;
        assert_eq!(grads.len(), outs.len(), "one gradient per primal");
        for (out, grad) in outs.iter_mut().zip(grads) {
            *out = mlx.insert(grad);
        }
        Ok(())
    })
}

/// Any launch description (`crate::metal`'s, e.g. `metal::tiles::tiles_check_launch`) run as
/// the library runs its own: through `mx::fast::metal_kernel`, or through `cuda::launch` (the
/// CUDA header, the tiles' CUDA form, CUDA's geometry) and `mx::fast::cuda_kernel` (`gpu =
/// false`: on a CPU stream, where MLX refuses). One handle per launch output into `outs`.
///
/// # Safety
/// `outs` has room for one handle per output of `launch`.
pub unsafe fn gpu_launch(
    kernels: GpuKernels,
    gpu: bool,
    launch: crate::bridge::MetalLaunch,
    inputs: &[*const mlxk_array],
    outs: &mut [*mut mlxk_array],
) -> mlxk_status {
    boundary("gpu_launch", || {
        assert_eq!(
            launch.input_names.len(),
            inputs.len(),
            "one array per launch input"
        );
        assert_eq!(
            launch.output_names.len(),
            outs.len(),
            "one handle per launch output"
        );
        let mut mlx = registry::lock();
        let arrays = inputs
            .iter()
            .zip(&launch.input_names)
            .map(|(&h, name)| mlx.get(h, name))
            .collect::<crate::error::Result<Vec<_>>>()?;
        let outputs = crate::ops::gpu_node(None, || launch, &arrays, kernels.backend(gpu), None)?;
        for (out, array) in outs.iter_mut().zip(outputs) {
            *out = mlx.insert(array);
        }
        Ok(())
    })
}

/// The trees of `cu_nodes` and `parents` as the C ABI takes them, one slot a tree.
fn host_tree(cu_nodes: &[i32], parents: &[i32], slots: &[i32]) -> HostTree {
    assert_eq!(slots.len() + 1, cu_nodes.len(), "one slot per tree");
    HostTree {
        cu_nodes: cu_nodes.as_ptr(),
        n_cu_nodes: cu_nodes.len(),
        parents: parents.as_ptr(),
        n_nodes: parents.len(),
    }
}

/// `mlxk_gated_delta_verify_tree_pool` through a GPU launch (see [`gated_delta_update_via_gpu`]).
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
    let tree = host_tree(cu_nodes, parents, slots);
    let fresh = fresh.map_or(std::ptr::null(), <[u8]>::as_ptr);
    let label = kernels.label("mlxk_gated_delta_verify_tree_pool");
    // SAFETY: the host arrays come from slices of the lengths given; forwarded contract on `y`.
    forced(kernels, gpu, || unsafe {
        verify(&label, args, tree, slots.as_ptr(), fresh, y)
    })
}

/// `mlxk_gated_delta_commit_tree_pool` through a GPU launch (as [`gated_delta_update_via_gpu`]).
/// `args`: k, v, a, b, a_log, dt_bias, pool; `slots`, `fresh`
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
    let tree = host_tree(cu_nodes, parents, slots);
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
        let rows = (slots.as_ptr(), fresh);
        commit(&label, args, tree, rows, accepted, pool_out)
    })
}
