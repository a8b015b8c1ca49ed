//! The default device, the GPU backend present, and memory limits.

use super::status::mlxk_status;
use super::{boundary, Out};
use crate::error::Error;
use crate::ops::device;

/// Where kernels run. Process-wide; MLXK_DEVICE_CPU by default.
pub type mlxk_device = i32;
pub const MLXK_DEVICE_CPU: mlxk_device = 0;
pub const MLXK_DEVICE_GPU: mlxk_device = 1;

/// The GPU backend of the loaded MLX.
pub type mlxk_gpu_backend_kind = i32;
pub const MLXK_GPU_NONE: mlxk_gpu_backend_kind = 0;
pub const MLXK_GPU_METAL: mlxk_gpu_backend_kind = 1;
pub const MLXK_GPU_CUDA: mlxk_gpu_backend_kind = 2;

/// Sets the device later kernel calls run on (already-built results keep theirs).
/// MLXK_DEVICE_GPU needs a GPU backend in the loaded MLX (Metal on Apple GPUs, CUDA with MLX
/// CUDA on NVIDIA GPUs: the same kernel text runs there): without one it gives
/// MLXK_ERR_UNSUPPORTED and the default stays as it was. The chunked update runs on the CPU
/// only and refuses while the GPU is the default; the backward passes then run on the GPU
/// (the recurrence's as a GPU kernel, the others as MLX ops). Thread: any; process-wide.
#[no_mangle]
pub extern "C" fn mlxk_set_default_device(device: mlxk_device) -> mlxk_status {
    boundary("mlxk_set_default_device", || match device {
        MLXK_DEVICE_CPU => device::set_gpu(false),
        MLXK_DEVICE_GPU => device::set_gpu(true),
        other => Err(Error::InvalidArgument(format!(
            "device is {other} (expected MLXK_DEVICE_CPU (0) or MLXK_DEVICE_GPU (1))"
        ))),
    })
}

/// The GPU backend of the loaded MLX: MLXK_GPU_METAL, MLXK_GPU_CUDA or MLXK_GPU_NONE.
/// Thread: any.
#[no_mangle]
pub extern "C" fn mlxk_gpu_backend() -> mlxk_gpu_backend_kind {
    let mut kind = MLXK_GPU_NONE;
    let _ = boundary("mlxk_gpu_backend", || {
        kind = match device::gpu_backend() {
            device::GpuBackend::None => MLXK_GPU_NONE,
            device::GpuBackend::Metal => MLXK_GPU_METAL,
            device::GpuBackend::Cuda => MLXK_GPU_CUDA,
        };
        Ok(())
    });
    kind
}

/// Sets the most bytes one call may produce; requests above it give MLXK_ERR_OUT_OF_MEMORY
/// before anything is built or allocated (MLX itself crashes when the OS refuses memory).
/// 0 restores the default, the machine's physical memory. Thread: any; process-wide.
#[no_mangle]
pub extern "C" fn mlxk_set_memory_limit(bytes: usize) -> mlxk_status {
    boundary("mlxk_set_memory_limit", || {
        crate::memory::set_limit(bytes);
        Ok(())
    })
}

/// Writes the current memory limit in bytes to `*bytes`. NULL: `bytes` must not be NULL.
#[no_mangle]
pub unsafe extern "C" fn mlxk_get_memory_limit(bytes: *mut usize) -> mlxk_status {
    boundary("mlxk_get_memory_limit", || {
        // SAFETY: the documented contract on `bytes`.
        let bytes = unsafe { Out::new(bytes, "bytes") }?;
        bytes.write(crate::memory::limit());
        Ok(())
    })
}

/// Sets how many bytes of freed buffers MLX keeps cached for reuse (MLX's cache limit).
/// Thread: any; process-wide.
#[no_mangle]
pub extern "C" fn mlxk_set_cache_limit(bytes: usize) -> mlxk_status {
    boundary("mlxk_set_cache_limit", || {
        device::set_cache_limit(bytes);
        Ok(())
    })
}
