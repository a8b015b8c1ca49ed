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

use std::sync::Arc;
#[cfg(feature = "testing")]
use std::sync::Mutex;

use cxx::UniquePtr;

use crate::bridge::{self, Array, CpuLaunch, MetalLaunch};
use crate::cuda;
use crate::dtype::Dtype;
use crate::error::{Error, Result};
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
        if let Some(code) = crate::seams::forced_backend() {
            return Backend::from_code(code).expect("a backend code");
        }
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
    bridge::install_cpu_kernel(crate::cpu::mlxk_cpu_kernel);
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

/// A node whose CPU kernel and GPU launch take the same inputs in the same order (the head
/// split, the gated norm): the CPU primitive running `kernel` with the node's `words`, or the
/// GPU launch `make` builds, kept under those words and differentiable through `kernel`'s
/// backward (`gpu_vjp`).
pub(crate) fn same_inputs_node(
    kernel: Kernel,
    words: Vec<i64>,
    outputs: &[Output],
    donate_from: Vec<i32>,
    inputs: &[&Array],
    backend: Backend,
    make: impl FnOnce() -> MetalLaunch,
) -> Result<Vec<UniquePtr<Array>>> {
    match backend {
        Backend::Cpu => cpu_node(kernel, words, outputs, donate_from, inputs),
        gpu => {
            let vjp = (kernel, gpu_vjp_params(gpu, words.clone()));
            gpu_node(Some(words), make, inputs, gpu, Some(vjp))
        }
    }
}

/// Builds a GPU kernel's launch on the given inputs (in the launch's input order): the Metal
/// launch as it is, or its CUDA form (`crate::cuda::launch`). `backend` is not `Cpu`.
///
/// MLX caches a compiled custom kernel by its name and template arguments alone, so the name
/// gets the dtypes of every input: inputs whose dtype is not a template argument (beta, the
/// gate inputs, the scales, the weight) never meet a kernel compiled for other dtypes.
///
/// `key` (the node's words and whatever else `make` depends on) keeps the finished launch for
/// later calls with the same key, backend and input dtypes, so a decode step does not rebuild
/// the same description (names, sources, geometry) every call; None builds it afresh. A kept
/// launch has an id of its own (never reused), under which the bridge keeps MLX's kernel
/// primitive: later nodes of that launch share it instead of having MLX regenerate and copy
/// the kernel's text per call (docs/DESIGN.md §3, MLX CUDA, "Caches").
///
/// `vjp` (the forward's kernel and its `GpuVjp::params`) gives the node a gradient under MLX's
/// autograd: MLX then asks `gpu_vjp` for it (docs/DESIGN.md §4 "Gradients").
pub(crate) fn gpu_node(
    key: Option<Vec<i64>>,
    make: impl FnOnce() -> MetalLaunch,
    inputs: &[&Array],
    backend: Backend,
    vjp: Option<(Kernel, Vec<i64>)>,
) -> Result<Vec<UniquePtr<Array>>> {
    gpu_node_as(key, make, inputs, backend, vjp, GpuLaunch::Plain)
}

/// How `gpu_node_as` hands its launch to MLX.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum GpuLaunch {
    /// MLX's custom kernel as it is (`gpu_node`).
    Plain,
    /// MLX CUDA: the pool launch that writes the pool's own rows through input `pool`
    /// (`node::gated_delta::PoolWrite::InPlace`, `bridge::cuda_pool_kernel_op`); the outputs are
    /// the launch's but its last, then the new pool.
    PoolInPlace { pool: usize },
}

/// `gpu_node` with the way the launch reaches MLX.
pub(crate) fn gpu_node_as(
    key: Option<Vec<i64>>,
    make: impl FnOnce() -> MetalLaunch,
    inputs: &[&Array],
    backend: Backend,
    vjp: Option<(Kernel, Vec<i64>)>,
    how: GpuLaunch,
) -> Result<Vec<UniquePtr<Array>>> {
    let (vjp_kernel, vjp_params) = match vjp {
        Some((kernel, params)) => {
            bridge::install_gpu_vjp(gpu_vjp);
            (kernel as u32, params)
        }
        None => (0, Vec::new()),
    };
    let dtypes: Vec<i32> = inputs.iter().map(|a| bridge::array_dtype(a)).collect();
    let finish = |mut launch: MetalLaunch| -> Result<MetalLaunch> {
        for &code in &dtypes {
            let tag = Dtype::from_code(code).map_or("unknown", Dtype::name);
            launch.name.push('_');
            launch.name.push_str(tag);
        }
        match backend {
            Backend::Cuda { .. } => cuda::launch(launch),
            _ => Ok(launch),
        }
    };
    let (id, launch) = match key {
        Some(mut key) => {
            key.push(backend.code());
            key.extend(dtypes.iter().map(|&d| d as i64));
            launches::get(key, || finish(make()))?
        }
        None => (0, Arc::new(finish(make())?)),
    };
    #[cfg(feature = "testing")]
    if crate::seams::record_gpu_launches() {
        let shared = inputs.iter().map(|a| bridge::array_share(a)).collect();
        *LAST_GPU_LAUNCH
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some((Arc::clone(&launch), shared));
    }
    let list = bridge::list(inputs);
    let outputs = match (backend, how) {
        (Backend::Cuda { gpu }, GpuLaunch::PoolInPlace { pool }) => {
            bridge::cuda_pool_kernel_op(&launch, &cuda::pool_copy_launch(), id, &list, pool, gpu)?
        }
        (_, GpuLaunch::PoolInPlace { .. }) => {
            unreachable!("the in-place pool launch is MLX CUDA's")
        }
        (Backend::Metal { gpu }, _) => {
            bridge::metal_kernel_op(&launch, id, &list, gpu, vjp_kernel, &vjp_params)?
        }
        (Backend::Cuda { gpu }, _) => {
            bridge::cuda_kernel_op(&launch, id, &list, gpu, vjp_kernel, &vjp_params)?
        }
        (Backend::Cpu, _) => unreachable!("gpu_node takes a GPU backend"),
    };
    Ok(bridge::take(&*outputs))
}

/// The last GPU launch `gpu_node` handed to MLX, with its inputs (in the launch's order), kept
/// while `crate::seams::record_gpu_launches()` (tests: `crate::testing::record_gpu_launches`).
#[cfg(feature = "testing")]
pub(crate) type RecordedLaunch = (Arc<MetalLaunch>, Vec<UniquePtr<Array>>);
#[cfg(feature = "testing")]
pub(crate) static LAST_GPU_LAUNCH: Mutex<Option<RecordedLaunch>> = Mutex::new(None);

/// The finished GPU launches by key (`gpu_node`).
mod launches {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use crate::bridge::MetalLaunch;
    use crate::error::Result;

    /// At most this many launches are kept (each holds its kernel's text); past it the cache
    /// starts over. Shapes are part of a key, so a stream of new sequence lengths would
    /// otherwise grow it without end.
    const CAPACITY: usize = 256;

    type Kept = (u64, Arc<MetalLaunch>);

    static LAUNCHES: Mutex<Option<HashMap<Vec<i64>, Kept>>> = Mutex::new(None);

    /// Ids of kept launches: from 1 (0 is "not kept"), never reused.
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);

    /// The launch kept under `key`, or `make`'s, kept; with its id.
    pub fn get(key: Vec<i64>, make: impl FnOnce() -> Result<MetalLaunch>) -> Result<Kept> {
        let mut guard = LAUNCHES
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let map = guard.get_or_insert_with(HashMap::new);
        if let Some((id, launch)) = map.get(&key) {
            return Ok((*id, Arc::clone(launch)));
        }
        let launch = Arc::new(make()?);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        if map.len() >= CAPACITY {
            map.clear();
        }
        map.insert(key, (id, Arc::clone(&launch)));
        Ok((id, launch))
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        fn named(name: &str) -> MetalLaunch {
            MetalLaunch::empty(name, [1; 3], [1; 3])
        }

        #[test]
        fn a_key_builds_its_launch_once_and_the_cache_stays_bounded() {
            // Keys no library call makes (negative first word), so tests running at the same
            // time cannot meet them.
            let base = -7_000_000i64;
            let mut built = 0;
            let (first_id, first) = get(vec![base, 1], || {
                built += 1;
                Ok(named("one"))
            })
            .unwrap();
            let (again_id, again) = get(vec![base, 1], || {
                built += 1;
                Ok(named("other"))
            })
            .unwrap();
            assert_eq!(built, 1);
            assert!(Arc::ptr_eq(&first, &again));
            assert!(first_id > 0 && first_id == again_id);
            let (second_id, second) = get(vec![base, 2], || {
                built += 1;
                Ok(named("two"))
            })
            .unwrap();
            assert_eq!((built, second.name.as_str()), (2, "two"));
            assert!(second_id > 0 && second_id != first_id);
            // An error is returned and nothing is kept.
            let err = get(vec![base, 3], || {
                Err(crate::error::Error::Backend("no".into()))
            });
            assert!(err.is_err());
            let (_, kept) = get(vec![base, 3], || Ok(named("three"))).unwrap();
            assert_eq!(kept.name, "three");

            // Past its capacity the cache starts over (in the same test: a clear in between
            // would rebuild the launches above).
            let base = -8_000_000i64;
            for i in 0..=CAPACITY as i64 {
                get(vec![base, i], || Ok(named("n"))).unwrap();
            }
            let len = LAUNCHES.lock().unwrap().as_ref().map_or(0, |m| m.len());
            assert!(len <= CAPACITY, "{len} launches kept");
        }
    }
}

impl Backend {
    /// The backend as the first word of a GPU node's gradient description.
    pub(crate) fn code(self) -> i64 {
        match self {
            Backend::Cpu => 0,
            Backend::Metal { gpu } => 1 + !gpu as i64,
            Backend::Cuda { gpu } => 3 + !gpu as i64,
        }
    }

    fn from_code(code: i64) -> Option<Backend> {
        Some(match code {
            1 => Backend::Metal { gpu: true },
            2 => Backend::Metal { gpu: false },
            3 => Backend::Cuda { gpu: true },
            4 => Backend::Cuda { gpu: false },
            _ => return None,
        })
    }
}

/// The gradient description of a GPU node: its backend's code, then `words` (the kernel's).
pub(crate) fn gpu_vjp_params(backend: Backend, words: Vec<i64>) -> Vec<i64> {
    let mut params = Vec::with_capacity(words.len() + 1);
    params.push(backend.code());
    params.extend(words);
    params
}

/// MLX's autograd through a GPU kernel node made with a gradient (`gpu_node`'s `vjp`): the
/// gradients of all its inputs (`primals`, in the launch's order), given the cotangents of all
/// its outputs. Called by the bridge (`mlxk_gpu_vjp`) from inside the host's `mx::vjp`.
pub(crate) fn gpu_vjp(
    kernel: u32,
    params: &[i64],
    primals: &[UniquePtr<Array>],
    cotangents: &[UniquePtr<Array>],
) -> Result<Vec<UniquePtr<Array>>> {
    let bad = || {
        crate::error::Error::Backend(format!(
            "the gradient description of GPU node {} is malformed",
            node::function_name(kernel)
        ))
    };
    let (&code, words) = params.split_first().ok_or_else(bad)?;
    let backend = Backend::from_code(code).ok_or_else(bad)?;
    let primals: Vec<&Array> = primals.iter().map(|a| &**a).collect();
    let cotangents: Vec<&Array> = cotangents.iter().map(|a| &**a).collect();
    match Kernel::from_code(kernel) {
        Some(Kernel::GatedDelta) => gated_delta::gpu_vjp(words, &primals, &cotangents, backend),
        Some(Kernel::GatedDeltaFromConv) => {
            gated_delta::from_conv_gpu_vjp(words, &primals, &cotangents, backend)
        }
        Some(Kernel::SiluRmsHeads) => {
            silu_rms_heads::gpu_vjp(words, &primals, &cotangents, backend)
        }
        Some(Kernel::GatedRmsNorm) => {
            gated_rms_norm::gpu_vjp(words, &primals, &cotangents, backend)
        }
        _ => Err(Error::Unsupported(format!(
            "vjp is not implemented for {} on the GPU",
            node::function_name(kernel)
        ))),
    }
}

/// A GPU gradient request for a node with a fixed count of primals and cotangents (`counts`):
/// the node decoded from `words`, and the primals followed by the cotangents, the input order
/// of the bridge's `*_vjp_ops`. `what` names the node in the error.
pub(crate) fn gpu_vjp_inputs<'a, N: node::Words>(
    what: &str,
    words: &[i64],
    primals: &[&'a Array],
    cotangents: &[&'a Array],
    counts: (usize, usize),
) -> Result<(N, Vec<&'a Array>)> {
    let node = N::decode(words).map_err(Error::Backend)?;
    if (primals.len(), cotangents.len()) != counts {
        return Err(Error::Backend(format!(
            "{what}'s GPU gradient description is malformed"
        )));
    }
    Ok((node, [primals, cotangents].concat()))
}

/// Zeros of `a`'s shape and dtype (the gradient of an input that has none).
pub(crate) fn zeros_like(a: &Array) -> Result<UniquePtr<Array>> {
    let shape: Vec<i32> = (0..bridge::array_ndim(a))
        .map(|i| bridge::array_dim(a, i))
        .collect();
    Ok(bridge::array_zeros(&shape, bridge::array_dtype(a))?)
}
