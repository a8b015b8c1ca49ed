//! The process-wide default device.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::bridge;
use crate::error::{Error, Result};
use crate::registry;

/// The default device: `GpuBackend::None` for the CPU, else the GPU backend kernels run on.
static GPU: AtomicU8 = AtomicU8::new(GpuBackend::None as u8);

/// The GPU backend kernels run on, or `GpuBackend::None` when the default device is the CPU.
pub fn gpu() -> GpuBackend {
    match GPU.load(Ordering::Relaxed) {
        x if x == GpuBackend::Metal as u8 => GpuBackend::Metal,
        x if x == GpuBackend::Cuda as u8 => GpuBackend::Cuda,
        _ => GpuBackend::None,
    }
}

pub fn set_gpu(gpu: bool) -> Result<()> {
    let backend =
        if gpu {
            match gpu_backend() {
                GpuBackend::None => return Err(Error::Unsupported(
                    "MLXK_DEVICE_GPU: the loaded MLX has no GPU backend (no Metal device and no \
                     CUDA device; the Linux mlx[cpu] build is CPU only); the default device stays \
                     CPU"
                    .into(),
                )),
                b => b,
            }
        } else {
            GpuBackend::None
        };
    // Every node names its stream explicitly: MLX's own default device (the host's, when the
    // host uses MLX too) is left as it is.
    GPU.store(backend as u8, Ordering::Relaxed);
    Ok(())
}

/// The GPU backend of the loaded MLX.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum GpuBackend {
    None = 0,
    Metal = 1,
    Cuda = 2,
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
