//! Status codes, the per-thread error message, and version information.

use std::cell::RefCell;
use std::ffi::{c_char, CString};

/// The result of every fallible function: MLXK_OK (0) or one of the MLXK_ERR_* codes.
/// Codes are stable and never reused.
pub type mlxk_status = i32;

// The codes themselves come from the one status table in src/error.rs (build.rs hands the
// same rows to cbindgen for the header).

pub use crate::error::codes::*;

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
    crate::error::status_name(status).as_ptr()
}

/// The library version, e.g. "0.1.0" (equal to MLXK_VERSION for a matching header).
///
/// Ownership: static string, never NULL. Thread: any.
#[no_mangle]
pub extern "C" fn mlxk_version() -> *const c_char {
    crate::version::VERSION_C.as_ptr()
}

/// The C ABI version of the loaded library. A caller compiled against a header whose
/// MLXK_ABI_VERSION differs must not use this library.
///
/// Thread: any.
#[no_mangle]
pub extern "C" fn mlxk_abi_version() -> u32 {
    crate::version::ABI_VERSION
}
