//! The process-wide default device.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::bridge;
use crate::capi::device::{MLXK_GPU_CUDA, MLXK_GPU_METAL, MLXK_GPU_NONE};
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
    bridge::set_default_device(gpu)?;
    GPU.store(gpu, Ordering::Relaxed);
    Ok(())
}

pub fn gpu_backend() -> i32 {
    let _mlx = registry::lock();
    if bridge::metal_available() {
        MLXK_GPU_METAL
    } else if bridge::cuda_available() {
        MLXK_GPU_CUDA
    } else {
        MLXK_GPU_NONE
    }
}
