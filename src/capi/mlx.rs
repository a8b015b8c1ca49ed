//! Sharing arrays with the host's MLX: `mlx::core::array`s (what an MLX C++ engine holds, and
//! what an mlx-c `mlx_array` keeps in its `ctx`) in and out without a copy, and the MLX lock for
//! hosts that use MLX on several threads.

use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

use super::status::mlxk_status;
use super::{boundary, mlxk_array, Out};
use crate::ops::host;
use crate::registry;

/// The version of the libmlx loaded in this process, e.g. "0.32.4". Arrays can be shared only
/// with that libmlx, and only when it is the version this library was built against and the
/// only libmlx loaded (mlxk_array_from_mlx and mlxk_array_to_mlx check both).
///
/// Ownership: static string, never NULL. Thread: any.
#[no_mangle]
pub extern "C" fn mlxk_mlx_version() -> *const c_char {
    static VERSION: OnceLock<CString> = OnceLock::new();
    VERSION
        .get_or_init(|| {
            let _mlx = registry::lock();
            CString::new(crate::bridge::mlx_version()).unwrap_or_default()
        })
        .as_ptr()
}

/// Makes a handle that shares the host's MLX array: `mlx_array` is the address of an
/// `mlx::core::array` (a C++ engine's array, or the `ctx` of an mlx-c `mlx_array`). No data is
/// copied: the handle and the host's array are the same MLX array (same buffer; an unevaluated
/// host node stays lazy and becomes an input of the kernels' nodes, computed by whichever
/// evaluation comes first). Views (transposed, broadcast, sliced) are accepted: a kernel
/// makes them contiguous inside the graph.
///
/// Ownership: the host keeps its array; `*out` is a new handle the caller frees with
/// mlxk_array_free() (the array lives while either side holds it). NULL: neither may be NULL.
/// A pointer that is not an `mlx::core::array` cannot be detected: undefined behaviour, as a
/// short buffer is. Errors: MLXK_ERR_NULL_POINTER, MLXK_ERR_UNSUPPORTED (a second libmlx is
/// loaded, or the loaded one is not the version this library was built against),
/// MLXK_ERR_DTYPE (float64, int64 and other dtypes without an mlxk_dtype), MLXK_ERR_SHAPE
/// (more than MLXK_MAX_NDIM dimensions), MLXK_ERR_INVALID_ARGUMENT (more than 2^31-1
/// elements). Thread: any; see mlxk_mlx_lock() when the host uses MLX on several threads.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_from_mlx(
    mlx_array: *const c_void,
    out: *mut *mut mlxk_array,
) -> mlxk_status {
    boundary("mlxk_array_from_mlx", || {
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        let mut mlx = registry::lock();
        // SAFETY: the documented contract on `mlx_array`.
        let array = unsafe { host::from_host(mlx_array, "mlx_array") }?;
        out.write(mlx.insert(array));
        Ok(())
    })
}

/// Gives the host a new `mlx::core::array` (heap-allocated) that shares `array`: the same
/// buffer, or, for a kernel's unevaluated result, the same lazy node, which the host can feed
/// to its own MLX ops and evaluate with its graph (one evaluation computes both).
///
/// Ownership: `array` is borrowed (free it when done; the host's array keeps the data alive);
/// `*mlx_array_out` is the host's: release it with mlxk_mlx_array_free(), C++ `delete`, or
/// wrap it as an mlx-c `mlx_array` (`{ .ctx = ptr }`) and call `mlx_array_free`. NULL: neither
/// may be NULL. Errors: MLXK_ERR_NULL_POINTER, MLXK_ERR_INVALID_HANDLE, MLXK_ERR_UNSUPPORTED
/// (as mlxk_array_from_mlx). Thread: any.
#[no_mangle]
pub unsafe extern "C" fn mlxk_array_to_mlx(
    array: *const mlxk_array,
    mlx_array_out: *mut *mut c_void,
) -> mlxk_status {
    boundary("mlxk_array_to_mlx", || {
        // SAFETY: the documented contract on `mlx_array_out`.
        let out = unsafe { Out::new(mlx_array_out, "mlx_array_out") }?;
        let mlx = registry::lock();
        let a = mlx.get(array, "array")?;
        out.write(host::to_host(a)?);
        Ok(())
    })
}

/// Deletes an `mlx::core::array` made by mlxk_array_to_mlx(). NULL is a no-op returning
/// MLXK_OK. Thread: any.
#[no_mangle]
pub unsafe extern "C" fn mlxk_mlx_array_free(mlx_array: *mut c_void) -> mlxk_status {
    boundary("mlxk_mlx_array_free", || {
        if mlx_array.is_null() {
            return Ok(());
        }
        let _mlx = registry::lock();
        // SAFETY: the documented contract: an array from mlxk_array_to_mlx, freed once.
        unsafe { host::free_host(mlx_array) }
    })
}

/// Takes the lock under which this library builds and evaluates MLX graphs, on the calling
/// thread, until a matching mlxk_mlx_unlock(). MLX itself is not safe for graph building on
/// several threads at once: a host that uses MLX on other threads while mlxkern is called
/// holds this lock around its own MLX work (building ops, evaluating, freeing arrays), so the
/// two never overlap. mlxk_ calls made while holding it run under the same lock (it counts:
/// lock twice, unlock twice). A host that uses MLX on one thread only needs none of this.
///
/// Errors: none (MLXK_OK). Thread: the lock belongs to the calling thread; a thread that ends
/// while holding it releases it.
#[no_mangle]
pub extern "C" fn mlxk_mlx_lock() -> mlxk_status {
    boundary("mlxk_mlx_lock", || {
        registry::host_lock();
        Ok(())
    })
}

/// Releases one mlxk_mlx_lock() of the calling thread. Errors: MLXK_ERR_INVALID_ARGUMENT when
/// the calling thread does not hold the lock. Thread: the thread that took it.
#[no_mangle]
pub extern "C" fn mlxk_mlx_unlock() -> mlxk_status {
    boundary("mlxk_mlx_unlock", registry::host_unlock)
}
