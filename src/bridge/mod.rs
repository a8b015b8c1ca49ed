//! The C++ side: a thin cxx bridge over MLX's C++ API. Every MLX call that can throw is
//! declared `Result`, so C++ exceptions arrive here as `cxx::Exception`, never across the C ABI.
//!
//! Dtype codes on this bridge are the C ABI's `mlxk_dtype` values (see `crate::dtype`).

#[cxx::bridge(namespace = "mlxk")]
pub mod ffi {
    /// A launch of a Metal kernel through `mx::fast::metal_kernel`, described entirely by Rust.
    #[derive(Debug, Clone, PartialEq)]
    pub struct MetalLaunch {
        pub name: String,
        pub source: String,
        pub header: String,
        pub input_names: Vec<String>,
        pub output_names: Vec<String>,
        /// Output shapes, concatenated; `output_ndims[i]` dims belong to output i.
        pub output_dims: Vec<i32>,
        pub output_ndims: Vec<u32>,
        pub output_dtypes: Vec<i32>,
        /// Total threads per axis (MLX dispatches threads, not threadgroups).
        pub grid: [i32; 3],
        pub threadgroup: [i32; 3],
        /// Template arguments: integer ones, then dtype ones (value is an mlxk_dtype code).
        pub template_int_names: Vec<String>,
        pub template_int_values: Vec<i32>,
        pub template_dtype_names: Vec<String>,
        pub template_dtype_values: Vec<i32>,
    }

    /// A node of the CPU kernel primitive: which Rust kernel, its integer parameters, its outputs.
    #[derive(Debug, Clone)]
    pub struct CpuLaunch {
        pub kernel: u32,
        pub params: Vec<i64>,
        pub output_dims: Vec<i32>,
        pub output_ndims: Vec<u32>,
        pub output_dtypes: Vec<i32>,
        /// For each output, the input whose buffer it may take over when MLX says that input
        /// is donatable (same byte size), or -1.
        pub donate_from: Vec<i32>,
    }

    /// The backward node MLX's autograd builds for a forward CPU node (`node::VjpPlan`): its
    /// launch, which backward output is the gradient of each forward input (-1: zeros), and
    /// the dtype each cotangent is passed in.
    #[derive(Debug, Clone)]
    pub struct VjpLaunch {
        pub launch: CpuLaunch,
        pub gradients: Vec<i32>,
        pub cotangent_dtypes: Vec<i32>,
    }

    unsafe extern "C++" {
        include!("src/bridge/mlx_bridge.h");

        /// An `mlx::core::array`.
        type Array;
        /// A `std::vector<mlx::core::array>`: inputs going in, outputs coming out.
        type ArrayList;

        fn array_from_bytes(data: &[u8], shape: &[i32], dtype: i32) -> Result<UniquePtr<Array>>;
        fn array_zeros(shape: &[i32], dtype: i32) -> Result<UniquePtr<Array>>;
        /// Another handle on the same array (MLX arrays are immutable: shared, never copied).
        fn array_share(a: &Array) -> UniquePtr<Array>;
        fn array_ndim(a: &Array) -> usize;
        fn array_dim(a: &Array, axis: usize) -> i32;
        fn array_dtype(a: &Array) -> i32;
        fn array_size(a: &Array) -> usize;
        fn array_nbytes(a: &Array) -> usize;
        /// The address of an evaluated array's data (0 when empty or unevaluated).
        fn array_address(a: &Array) -> usize;
        fn array_eval(a: &Array) -> Result<()>;
        /// MLX's identity of the array (its node), the same for every handle sharing it.
        fn array_id(a: &Array) -> usize;
        /// After a failed evaluation of `a`, a pool call's result made from the pool whose
        /// `array_id` is `given`: that pool, where `a` still reaches it through nodes that did
        /// not run (the step never ran); else `a` itself (the step's node ran and failed, and
        /// left it holding the pool as given).
        fn array_as_given(a: &Array, given: usize) -> UniquePtr<Array>;
        /// Evaluates `a` and copies its elements row-major into `dst` (exactly nbytes long).
        fn array_read(a: &Array, dst: &mut [u8]) -> Result<()>;
        fn array_astype(a: &Array, dtype: i32, gpu: bool) -> Result<UniquePtr<Array>>;
        /// `a` through `mx::stop_gradient`: MLX's autograd does not look past it.
        fn array_stop_gradient(a: &Array, gpu: bool) -> Result<UniquePtr<Array>>;

        fn list_new() -> UniquePtr<ArrayList>;
        fn list_push(list: Pin<&mut ArrayList>, a: &Array);
        fn list_len(list: &ArrayList) -> usize;
        fn list_get(list: &ArrayList, i: usize) -> UniquePtr<Array>;

        /// mlx-lm's `compute_g`: `exp(-exp(f32(A_log)) * softplus(a + dt_bias))`, as MLX ops.
        fn compute_g(
            a_log: &Array,
            a: &Array,
            dt_bias: &Array,
            gpu: bool,
        ) -> Result<UniquePtr<Array>>;
        /// `mx.sigmoid(x)` on the chosen device.
        fn sigmoid(x: &Array, gpu: bool) -> Result<UniquePtr<Array>>;
        /// A pool's rows replaced: `pool[slots[i]] = states[i]` (MLX's scatter along axis 0;
        /// in place when MLX may donate the pool's buffer). slots int32 `[W]`, states
        /// `[W, ...]` shaped as the pool's rows.
        fn pool_scatter(
            pool: &Array,
            slots: &Array,
            states: &Array,
            gpu: bool,
        ) -> Result<UniquePtr<Array>>;
        /// Tokens gathered: `a[0, tokens[...]]` (MLX's take along the token axis). a
        /// `[1, T, ...]`, tokens int32 of any shape, each below T; the result is shaped as
        /// tokens followed by a's dimensions after T.
        fn take_tokens(a: &Array, tokens: &Array, gpu: bool) -> Result<UniquePtr<Array>>;

        /// The head split's backward pass as MLX ops: `mx::vjp` of mlx-lm's SiLU, head split
        /// and `mx::fast::rms_norm(q, q_scale, eps)` (k likewise). `inputs`: x, q_scale,
        /// k_scale, then the given cotangents of q, k, v. Returns dx, dq_scale, dk_scale.
        #[allow(clippy::too_many_arguments)]
        fn silu_rms_heads_vjp_ops(
            inputs: &ArrayList,
            key_heads: i32,
            value_heads: i32,
            value_width: i32,
            eps: f32,
            has_dq: bool,
            has_dk: bool,
            has_dv: bool,
            gpu: bool,
        ) -> Result<UniquePtr<ArrayList>>;
        /// The gated norm's backward pass as MLX ops: `mx::vjp` of Qwen's RMSNormGated
        /// (`mx::fast::rms_norm(x, weight, eps)`, then mlx-lm's `precise_swiglu`). `inputs`: x,
        /// gate, weight, then dout if given. Returns dx, dgate, dweight.
        fn gated_rms_norm_vjp_ops(
            inputs: &ArrayList,
            eps: f32,
            has_dout: bool,
            gpu: bool,
        ) -> Result<UniquePtr<ArrayList>>;

        /// Builds the lazy CPU primitive node that runs `mlxk_cpu_kernel` at eval.
        fn cpu_kernel_op(launch: &CpuLaunch, inputs: &ArrayList) -> Result<UniquePtr<ArrayList>>;
        /// Calls `mx::fast::metal_kernel`; `gpu = false` uses a CPU stream (MLX then refuses with
        /// "No Metal back-end", which tests use to reach this code on Linux).
        ///
        /// `vjp_kernel` (not 0) gives the node a gradient for MLX's autograd: the outputs are
        /// rebuilt on a primitive that evaluates as the kernel's and answers vjp through
        /// `mlxk_gpu_vjp(vjp_kernel, vjp_params, …)` (`crate::node::gpu_vjp`).
        ///
        /// `id` (not 0: a kept launch, `crate::ops::gpu_node`) keeps the node's primitive for
        /// later calls with the same id and stream, which then only make the outputs on it;
        /// such calls must pass the same launch, vjp description and input count.
        fn metal_kernel_op(
            launch: &MetalLaunch,
            id: u64,
            inputs: &ArrayList,
            gpu: bool,
            vjp_kernel: u32,
            vjp_params: &[i64],
        ) -> Result<UniquePtr<ArrayList>>;

        /// Calls `mx::fast::cuda_kernel` with the launch's header and geometry (`crate::cuda`
        /// makes both); `gpu = false` uses a CPU stream (MLX then refuses, which tests use to
        /// reach this code without CUDA). A grid with a zero axis runs nothing: the outputs are
        /// empty arrays of their shapes.
        /// `id`, `vjp_kernel`, `vjp_params` as for `metal_kernel_op`.
        fn cuda_kernel_op(
            launch: &MetalLaunch,
            id: u64,
            inputs: &ArrayList,
            gpu: bool,
            vjp_kernel: u32,
            vjp_params: &[i64],
        ) -> Result<UniquePtr<ArrayList>>;

        /// The pool launch that writes the pool's own rows (`PoolWrite::InPlace`, MLX CUDA): the
        /// kernel's outputs (`launch`'s, its last the state row no thread writes) are rebuilt on
        /// a primitive that, at eval, gives the kernel a pool buffer of its own in the place of
        /// input `pool_input`: the caller's pool buffer when MLX may donate it, else a copy of
        /// the pool (made by `copy_launch`, one thread an element), registered with MLX CUDA's
        /// command encoder as that node's output. Returns the launch's outputs but the last,
        /// then the new pool. `id`: as in `cuda_kernel_op` (a kept launch's node primitive is
        /// reused).
        fn cuda_pool_kernel_op(
            launch: &MetalLaunch,
            copy_launch: &MetalLaunch,
            id: u64,
            inputs: &ArrayList,
            pool_input: usize,
            gpu: bool,
        ) -> Result<UniquePtr<ArrayList>>;
        /// Whether this MLX exports what `cuda_pool_kernel_op` needs (MLX CUDA's command
        /// encoder).
        fn cuda_pool_in_place_available() -> bool;

        /// The GPU backward's last ops: `inputs` q, v, dq_h, dk_h, dv, dg_p, dbeta_p (the
        /// kernel's f32 partial gradients per value head and row partition); returns dq and dk
        /// summed over the partitions and the value heads of each of the `key_heads` key heads,
        /// in q's dtype, dv in v's, and dg and dbeta summed over the partitions (f32).
        fn gated_delta_backward_tail(
            inputs: &ArrayList,
            key_heads: i32,
            gpu: bool,
        ) -> Result<UniquePtr<ArrayList>>;
        /// The gates' chain: `inputs` a, b, a_log, dt_bias, dg, dbeta; returns da, db, da_log,
        /// ddt_bias (each in its input's dtype) by `mx::vjp` of mlx-lm's `compute_g` and
        /// `sigmoid` on the f32 gate inputs.
        fn gates_vjp(inputs: &ArrayList, gpu: bool) -> Result<UniquePtr<ArrayList>>;

        /// A new array sharing the host's `mlx::core::array` at address `host` (same buffer and
        /// graph node; lazy if the host's is).
        ///
        /// # Safety
        /// `host` is the address of a live `mlx::core::array` of this process's libmlx.
        unsafe fn array_from_host(host: usize) -> Result<UniquePtr<Array>>;
        /// A new heap `mlx::core::array` sharing `a`, owned by the host; returns its address.
        fn array_to_host(a: &Array) -> Result<usize>;
        /// Deletes a heap `mlx::core::array` made by `array_to_host` (or by the host).
        ///
        /// # Safety
        /// `host` is the address of a heap `mlx::core::array` nobody uses afterwards.
        unsafe fn host_array_free(host: usize) -> Result<()>;
        /// The version of the libmlx loaded in this process (`mlx::core::version()`).
        fn mlx_version() -> String;
        /// The MLX version whose headers this library was compiled against.
        fn mlx_build_version() -> String;
        /// The loaded objects that define MLX's symbols themselves (libmlx, or a renamed copy, or
        /// a library MLX is compiled into with its symbols visible), as resolved file paths.
        /// Scanned again only when objects were loaded or unloaded since the last call.
        fn loaded_mlx_libraries() -> Vec<String>;
        /// How many objects `loaded_mlx_libraries` would list (no allocation).
        fn loaded_mlx_library_count() -> usize;
        /// Keeps this library loaded for the rest of the process (a dlclose leaves it mapped),
        /// since a host's graph may hold nodes whose code is here. Returns false if it could
        /// not be pinned.
        fn pin_library() -> bool;

        fn metal_available() -> bool;
        fn cuda_available() -> bool;
        fn set_cache_limit(bytes: usize) -> usize;
    }

    extern "Rust" {
        /// The backward node of CPU kernel `kernel` (its forward words `params`) for MLX's vjp,
        /// given the dtype codes of the cotangents of its outputs; an error naming the kernel
        /// for kernels without a gradient.
        fn mlxk_vjp_launch(
            kernel: u32,
            params: &[i64],
            cotangent_dtypes: &[i32],
        ) -> Result<VjpLaunch>;

        /// The gradients of every input of a GPU kernel node made with `vjp_kernel` =
        /// `kernel` and `vjp_params` = `params` (`crate::node::gpu_vjp`), given its inputs
        /// (`primals`) and the cotangents of all its outputs.
        fn mlxk_gpu_vjp(
            kernel: u32,
            params: &[i64],
            primals: &ArrayList,
            cotangents: &ArrayList,
        ) -> Result<UniquePtr<ArrayList>>;

        /// The C function whose node CPU kernel `kernel` is, for messages.
        fn mlxk_kernel_name(kernel: u32) -> String;

        /// Whether the CPU kernel node being evaluated on this thread fails, and where
        /// (`crate::seams::cpu_kernel_fault`: 0 never, 1 its eval, 2 its task).
        fn mlxk_eval_fault() -> u8;

        /// Runs CPU kernel `kernel` on MLX's stream thread. Buffers arrive as addresses and byte
        /// lengths; `aliased` lists, per output, the input whose buffer the output took over
        /// (that input must then be read from the output); `donate_from` the launch's. A
        /// `failed` message (an injected fault, or an earlier node's failure on this stream)
        /// runs no kernel: the node fails with it, each output that takes over an input holding
        /// that input. Never unwinds.
        #[allow(clippy::too_many_arguments)]
        unsafe fn mlxk_cpu_kernel(
            kernel: u32,
            params: &[i64],
            input_ptrs: &[usize],
            input_bytes: &[usize],
            output_ptrs: &[usize],
            output_bytes: &[usize],
            aliased: &[i32],
            donate_from: &[i32],
            failed: &str,
        ) -> Result<()>;
    }
}

pub use ffi::*;

use cxx::UniquePtr;

#[cfg(test)]
impl MetalLaunch {
    /// A launch with only a name and a geometry (unit tests of what reads those alone).
    pub(crate) fn empty(name: &str, grid: [i32; 3], threadgroup: [i32; 3]) -> MetalLaunch {
        MetalLaunch {
            name: name.into(),
            source: String::new(),
            header: String::new(),
            input_names: vec![],
            output_names: vec![],
            output_dims: vec![],
            output_ndims: vec![],
            output_dtypes: vec![],
            grid,
            threadgroup,
            template_int_names: vec![],
            template_int_values: vec![],
            template_dtype_names: vec![],
            template_dtype_values: vec![],
        }
    }
}

/// The arrays as an input list for a node.
pub fn list(arrays: &[&Array]) -> UniquePtr<ArrayList> {
    let mut list = list_new();
    for a in arrays {
        list_push(list.pin_mut(), a);
    }
    list
}

/// A node's outputs, each as its own array.
pub fn take(list: &ArrayList) -> Vec<UniquePtr<Array>> {
    (0..list_len(list)).map(|i| list_get(list, i)).collect()
}

fn mlxk_vjp_launch(
    kernel: u32,
    params: &[i64],
    cotangent_dtypes: &[i32],
) -> Result<VjpLaunch, String> {
    let plan = crate::node::vjp_plan(kernel, params, cotangent_dtypes)?;
    let (output_dims, output_ndims, output_dtypes) = crate::node::flatten(&plan.outputs);
    Ok(VjpLaunch {
        launch: CpuLaunch {
            kernel: plan.kernel as u32,
            params: plan.params,
            output_dims,
            output_ndims,
            output_dtypes,
            donate_from: vec![-1; plan.outputs.len()],
        },
        gradients: plan
            .gradients
            .iter()
            .map(|g| g.map_or(-1, |i| i as i32))
            .collect(),
        cotangent_dtypes: plan.cotangents.iter().map(|&d| d as i32).collect(),
    })
}

/// Builds the gradients of a GPU kernel node's inputs: `(kernel, params, primals, cotangents)`
/// as `mlxk_gpu_vjp` receives them.
pub type GpuVjp = fn(
    u32,
    &[i64],
    &[UniquePtr<Array>],
    &[UniquePtr<Array>],
) -> crate::error::Result<Vec<UniquePtr<Array>>>;

static GPU_VJP: std::sync::OnceLock<GpuVjp> = std::sync::OnceLock::new();

/// Installs the GPU backward builder (`crate::ops` does, before it makes a GPU node with a
/// gradient): the bridge calls upward only through its `extern "Rust"` entries, and this one
/// reaches the ops layer through the pointer, not an import.
pub fn install_gpu_vjp(build: GpuVjp) {
    let _ = GPU_VJP.set(build);
}

fn mlxk_gpu_vjp(
    kernel: u32,
    params: &[i64],
    primals: &ArrayList,
    cotangents: &ArrayList,
) -> Result<UniquePtr<ArrayList>, String> {
    let primals = take(primals);
    let cotangents = take(cotangents);
    let build = GPU_VJP
        .get()
        .ok_or_else(|| "mlxkern: no GPU backward is installed".to_string())?;
    let grads =
        build(kernel, params, &primals, &cotangents).map_err(|e| format!("mlxkern: {e}"))?;
    let refs: Vec<&Array> = grads.iter().map(|g| &**g).collect();
    Ok(list(&refs))
}

/// Runs CPU kernel `kernel` on buffers MLX allocated: `mlxk_cpu_kernel`'s arguments, with the
/// same contract.
pub type CpuKernel = unsafe fn(
    u32,
    &[i64],
    &[usize],
    &[usize],
    &[usize],
    &[usize],
    &[i32],
    &[i32],
    &str,
) -> std::result::Result<(), String>;

static CPU_KERNEL: std::sync::OnceLock<CpuKernel> = std::sync::OnceLock::new();

/// Installs the CPU kernels' entry (`crate::ops` does, before it makes a CPU node): like the GPU
/// backward builder, the bridge reaches the CPU kernels through the pointer, not an import.
pub fn install_cpu_kernel(run: CpuKernel) {
    let _ = CPU_KERNEL.set(run);
}

/// # Safety
/// The contract of `ffi::mlxk_cpu_kernel`.
#[allow(clippy::too_many_arguments)]
unsafe fn mlxk_cpu_kernel(
    kernel: u32,
    params: &[i64],
    input_ptrs: &[usize],
    input_bytes: &[usize],
    output_ptrs: &[usize],
    output_bytes: &[usize],
    aliased: &[i32],
    donate_from: &[i32],
    failed: &str,
) -> std::result::Result<(), String> {
    let run = CPU_KERNEL
        .get()
        .ok_or_else(|| "mlxkern: no CPU kernel entry is installed".to_string())?;
    // SAFETY: forwarded contract.
    unsafe {
        run(
            kernel,
            params,
            input_ptrs,
            input_bytes,
            output_ptrs,
            output_bytes,
            aliased,
            donate_from,
            failed,
        )
    }
}

fn mlxk_eval_fault() -> u8 {
    crate::seams::cpu_kernel_fault()
}

fn mlxk_kernel_name(kernel: u32) -> String {
    crate::node::function_name(kernel)
}
