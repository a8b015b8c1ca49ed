//! The process-wide default device.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::bridge;
use crate::error::{Error, Result};
use crate::registry;

static GPU: AtomicBool = AtomicBool::new(false);

/// True when kernels should run on the GPU.
pub fn gpu() -> bool {
    GPU.load(Ordering::Relaxed)
}

pub fn set_gpu(gpu: bool) -> Result<()> {
    let _mlx = registry::lock();
    if gpu {
        if bridge::cuda_available() {
            return Err(Error::Unsupported(
                "MLXK_DEVICE_GPU: this MLX has a CUDA backend, and mlxkern's kernels have no CUDA \
                 path yet; the default device stays CPU"
                    .into(),
            ));
        }
        if !bridge::metal_available() {
            return Err(Error::Unsupported(
                "MLXK_DEVICE_GPU: the loaded MLX has no GPU backend (no Metal device; the Linux \
                 mlx[cpu] build is CPU only); the default device stays CPU"
                    .into(),
            ));
        }
    }
    // Every node names its stream explicitly: MLX's own default device (the host's, when the
    // host uses MLX too) is left as it is.
    GPU.store(gpu, Ordering::Relaxed);
    Ok(())
}

/// The GPU backend of the loaded MLX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuBackend {
    None,
    Metal,
    Cuda,
}

pub fn gpu_backend() -> GpuBackend {
    let _mlx = registry::lock();
    if bridge::metal_available() {
        GpuBackend::Metal
    } else if bridge::cuda_available() {
        GpuBackend::Cuda
    } else {
        GpuBackend::None
    }
}

/// Sets how many bytes of freed buffers MLX keeps cached for reuse.
pub fn set_cache_limit(bytes: usize) {
    let _mlx = registry::lock();
    bridge::set_cache_limit(bytes);
}
