//! Status codes, the per-thread error message, and version information.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};

/// The result of every fallible function: MLXK_OK (0) or one of the MLXK_ERR_* codes.
/// Codes are stable and never reused.
pub type mlxk_status = i32;

/// Success.
pub const MLXK_OK: mlxk_status = 0;
/// A required pointer argument (a handle, a buffer or an out-parameter) was NULL.
pub const MLXK_ERR_NULL_POINTER: mlxk_status = 1;
/// An argument has a value outside what the function accepts (a length, a mask byte, eps).
pub const MLXK_ERR_INVALID_ARGUMENT: mlxk_status = 2;
/// An array has the wrong rank or a dimension that does not match.
pub const MLXK_ERR_SHAPE: mlxk_status = 3;
/// An array or dtype code has a dtype the function does not accept.
pub const MLXK_ERR_DTYPE: mlxk_status = 4;
/// The request is valid but this build or machine cannot run it (e.g. no GPU backend).
pub const MLXK_ERR_UNSUPPORTED: mlxk_status = 5;
/// MLX reported an error (raised while building or evaluating a graph).
pub const MLXK_ERR_BACKEND: mlxk_status = 6;
/// The request would exceed the memory limit (mlxk_set_memory_limit); nothing was allocated.
pub const MLXK_ERR_OUT_OF_MEMORY: mlxk_status = 7;
/// A caller's buffer is smaller than the data to be written into it.
pub const MLXK_ERR_BUFFER_TOO_SMALL: mlxk_status = 8;
/// An internal panic was caught at the boundary; the process is intact.
pub const MLXK_ERR_PANIC: mlxk_status = 9;
/// A handle is not a live mlxk_array (freed, double-freed, or not made by this library).
pub const MLXK_ERR_INVALID_HANDLE: mlxk_status = 10;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

pub(crate) fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', " ")).unwrap_or_default();
    // A call made while this thread is being torn down (from a thread-local destructor that
    // runs after ours) finds the slot gone: the message is dropped rather than panicking
    // across the C boundary, which would abort the caller's process.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = text);
}

/// The message of the last failed call on the calling thread ("" if none failed yet). It names
/// the function and the argument at fault.
///
/// Ownership: borrowed, never NULL; valid until the next failing mlxk_ call on this thread.
/// Copy it if you need it longer. Thread: each thread has its own message.
#[no_mangle]
pub extern "C" fn mlxk_last_error() -> *const c_char {
    LAST_ERROR
        .try_with(|slot| slot.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The name of a status code, e.g. "MLXK_ERR_SHAPE"; "MLXK_UNKNOWN_STATUS" for other values.
///
/// Ownership: static string, never NULL. Thread: any.
#[no_mangle]
pub extern "C" fn mlxk_status_name(status: mlxk_status) -> *const c_char {
    let name: &'static CStr = match status {
        MLXK_OK => c"MLXK_OK",
        MLXK_ERR_NULL_POINTER => c"MLXK_ERR_NULL_POINTER",
        MLXK_ERR_INVALID_ARGUMENT => c"MLXK_ERR_INVALID_ARGUMENT",
        MLXK_ERR_SHAPE => c"MLXK_ERR_SHAPE",
        MLXK_ERR_DTYPE => c"MLXK_ERR_DTYPE",
        MLXK_ERR_UNSUPPORTED => c"MLXK_ERR_UNSUPPORTED",
        MLXK_ERR_BACKEND => c"MLXK_ERR_BACKEND",
        MLXK_ERR_OUT_OF_MEMORY => c"MLXK_ERR_OUT_OF_MEMORY",
        MLXK_ERR_BUFFER_TOO_SMALL => c"MLXK_ERR_BUFFER_TOO_SMALL",
        MLXK_ERR_PANIC => c"MLXK_ERR_PANIC",
        MLXK_ERR_INVALID_HANDLE => c"MLXK_ERR_INVALID_HANDLE",
        _ => c"MLXK_UNKNOWN_STATUS",
    };
    name.as_ptr()
}

/// The library version, e.g. "0.1.0" (equal to MLXK_VERSION for a matching header).
///
/// Ownership: static string, never NULL. Thread: any.
#[no_mangle]
pub extern "C" fn mlxk_version() -> *const c_char {
    static VERSION: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(v) => v,
            Err(_) => panic!("version contains a NUL"),
        };
    VERSION.as_ptr()
}

/// The C ABI version of the loaded library. A caller compiled against a header whose
/// MLXK_ABI_VERSION differs must not use this library.
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn mlxk_abi_version() -> u32 {
    match u32::from_str_radix(env!("MLXK_ABI_VERSION"), 10) {
        Ok(v) => v,
        Err(_) => 0,
    }
}
