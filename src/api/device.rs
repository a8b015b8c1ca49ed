//! The default device, the GPU backend present, memory and cache limits, versions, and the MLX
//! lock for programs that use MLX on other threads.

use std::marker::PhantomData;

use crate::error::Result;
use crate::ops::device as ops;

/// Where kernels run. Process-wide; [`Device::Cpu`] by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Device {
    /// MLX's CPU stream, running the library's Rust kernels.
    #[default]
    Cpu,
    /// The GPU backend of the loaded MLX ([`gpu_backend`]).
    Gpu,
}

/// A GPU backend of the loaded MLX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBackend {
    /// Apple GPUs: the kernels' Metal sources.
    Metal,
    /// NVIDIA GPUs with MLX CUDA: the same kernel text, compiled by MLX CUDA.
    Cuda,
}

/// Sets the device later kernel calls run on (results already built keep theirs).
/// [`Device::Gpu`] needs a GPU backend in the loaded MLX: without one it gives
/// [`Error::Unsupported`](crate::Error::Unsupported) and the default stays as it was. The
/// chunked pool and packed calls run on the CPU only and refuse while the GPU is the default.
pub fn set_default_device(device: Device) -> Result<()> {
    super::call(|| ops::set_gpu(device == Device::Gpu))
}

/// The device kernels run on now.
pub fn default_device() -> Device {
    match ops::gpu() {
        ops::GpuBackend::None => Device::Cpu,
        _ => Device::Gpu,
    }
}

/// The GPU backend of the loaded MLX, if any (the Linux `mlx[cpu]` build has none).
pub fn gpu_backend() -> Option<GpuBackend> {
    match ops::gpu_backend() {
        ops::GpuBackend::None => None,
        ops::GpuBackend::Metal => Some(GpuBackend::Metal),
        ops::GpuBackend::Cuda => Some(GpuBackend::Cuda),
    }
}

/// Whether [`set_default_device`]`(`[`Device::Gpu`]`)` can succeed.
pub fn gpu_available() -> bool {
    gpu_backend().is_some()
}

/// Sets the most bytes one call may produce; larger requests give
/// [`Error::OutOfMemory`](crate::Error::OutOfMemory) before anything is built or allocated
/// (MLX itself crashes when the OS refuses memory). 0 restores the default, the machine's
/// physical memory. Returns the previous limit. Process-wide.
pub fn set_memory_limit(bytes: usize) -> usize {
    crate::memory::set_limit(bytes)
}

/// The current memory limit in bytes ([`set_memory_limit`]).
pub fn memory_limit() -> usize {
    crate::memory::limit()
}

/// Sets how many bytes of freed buffers MLX keeps cached for reuse (MLX's cache limit).
/// Process-wide.
pub fn set_cache_limit(bytes: usize) {
    ops::set_cache_limit(bytes)
}

/// This library's version, e.g. "0.1.0".
pub fn version() -> &'static str {
    crate::version::VERSION
}

/// The version of this library's C ABI (the header's `MLXK_ABI_VERSION`).
pub fn abi_version() -> u32 {
    crate::version::ABI_VERSION
}

/// The version of the libmlx loaded in this process, e.g. "0.32.4".
pub fn mlx_version() -> String {
    let _mlx = crate::registry::lock();
    crate::bridge::mlx_version()
}

/// The MLX version whose headers this library was compiled against.
pub fn mlx_build_version() -> String {
    crate::bridge::mlx_build_version()
}

/// The library's MLX lock, held by the calling thread while this value lives.
///
/// MLX is not safe for graph building on several threads at once. This library takes its
/// process-wide lock around every MLX operation (each [`Array`](crate::Array) method, kernel
/// and drop). A program that also uses MLX directly (through another binding) on other
/// threads holds an `MlxLock` around that work, so the two never overlap. Calls into this
/// library made while holding it run under the same lock; it can be taken again on the same
/// thread (it counts). A program that uses MLX only through this library needs none of this.
///
/// It belongs to the thread that took it, so it is neither `Send` nor `Sync`.
#[derive(Debug)]
pub struct MlxLock {
    _thread_bound: PhantomData<*const ()>,
}

impl MlxLock {
    /// Takes the lock on the calling thread (blocks while another thread holds it).
    pub fn acquire() -> MlxLock {
        crate::registry::host_lock();
        MlxLock {
            _thread_bound: PhantomData,
        }
    }
}

impl Drop for MlxLock {
    fn drop(&mut self) {
        // Taken by `acquire` on this thread (the value cannot leave it): always held here.
        let _ = crate::registry::host_unlock();
    }
}
