//! Validation and graph building, one module per kernel (docs/DESIGN.md §2). Everything here
//! runs under the MLX lock, called from the C ABI in `crate::capi`. Each kernel module checks
//! its arguments (messages name the argument and what was expected), builds the kernel's typed
//! node (`crate::node`) and hands it to the backend: the CPU primitive or the Metal launch.

pub mod array;
pub mod device;
pub mod gated_delta;
pub mod gated_rms_norm;
pub mod host;
pub mod shape;
pub mod silu_rms_heads;

use cxx::UniquePtr;

use crate::bridge::{self, Array, CpuLaunch, MetalLaunch};
use crate::cuda;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::node::{self, Kernel, Output};

/// Where a kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The MLX primitive running the Rust kernel.
    Cpu,
    /// `mx::fast::metal_kernel`; `gpu = false` passes a CPU stream (only tests do that, to
    /// reach the Metal launch on machines without Metal).
    Metal { gpu: bool },
    /// `mx::fast::cuda_kernel` on the same kernel text (`crate::cuda`); `gpu = false` as for
    /// Metal.
    Cuda { gpu: bool },
}

impl Backend {
    /// The default device's backend.
    pub fn current() -> Backend {
        match device::gpu() {
            device::GpuBackend::None => Backend::Cpu,
            device::GpuBackend::Metal => Backend::Metal { gpu: true },
            device::GpuBackend::Cuda => Backend::Cuda { gpu: true },
        }
    }

    /// Whether the kernel's MLX ops (gates, casts) go to a GPU stream.
    pub fn gpu_stream(self) -> bool {
        match self {
            Backend::Cpu => false,
            Backend::Metal { gpu } | Backend::Cuda { gpu } => gpu,
        }
    }
}

/// Builds the lazy CPU primitive node running `kernel` with the node's parameter words; the
/// outputs may take over the inputs named in `donate_from` (-1: none). Returns the outputs.
pub(crate) fn cpu_node(
    kernel: Kernel,
    params: Vec<i64>,
    outputs: &[Output],
    donate_from: Vec<i32>,
    inputs: &[&Array],
) -> Result<Vec<UniquePtr<Array>>> {
    let (output_dims, output_ndims, output_dtypes) = node::flatten(outputs);
    let launch = CpuLaunch {
        kernel: kernel as u32,
        params,
        output_dims,
        output_ndims,
        output_dtypes,
        donate_from,
    };
    Ok(bridge::take(&*bridge::cpu_kernel_op(
        &launch,
        &bridge::list(inputs),
    )?))
}

/// Builds a GPU kernel's launch on the given inputs (in the launch's input order): the Metal
/// launch as it is, or its CUDA form (`crate::cuda::launch`). `backend` is not `Cpu`.
///
/// MLX caches a compiled custom kernel by its name and template arguments alone, so the name
/// gets the dtypes of every input: inputs whose dtype is not a template argument (beta, the
/// gate inputs, the scales, the weight) never meet a kernel compiled for other dtypes.
pub(crate) fn gpu_node(
    mut launch: MetalLaunch,
    inputs: &[&Array],
    backend: Backend,
) -> Result<Vec<UniquePtr<Array>>> {
    for a in inputs {
        let code = bridge::array_dtype(a);
        let tag = Dtype::from_code(code).map_or("unknown", Dtype::name);
        launch.name.push('_');
        launch.name.push_str(tag);
    }
    let list = bridge::list(inputs);
    let outputs = match backend {
        Backend::Metal { gpu } => bridge::metal_kernel_op(&launch, &list, gpu)?,
        Backend::Cuda { gpu } => bridge::cuda_kernel_op(&cuda::launch(launch)?, &list, gpu)?,
        Backend::Cpu => unreachable!("gpu_node takes a GPU backend"),
    };
    Ok(bridge::take(&*outputs))
}
