//! One error type for the whole library and the one table of C status codes it maps to.
//!
//! The table below is the only place a status is written: `statuses!` turns it into the
//! constants (`codes`, re-exported by the C ABI), their names (`status_name`) and the error
//! variants with their codes (`Error`, `Error::status`). cbindgen cannot expand macros, so
//! `build.rs` reads the same rows from this file to put the constants in the header.
//! docs/DESIGN.md §5 gives the contract behind each code.

use std::ffi::CStr;

/// Generates the constants, names and error variants from the status rows.
macro_rules! statuses {
    ($( $(#[doc = $doc:literal])* $name:ident = $code:literal $(=> $variant:ident)? ; )*) => {
        /// The status codes, as the C ABI exports them (`mlxk_status` values).
        pub mod codes {
            $( $(#[doc = $doc])* pub const $name: i32 = $code; )*
        }

        /// The name of a status code, e.g. "MLXK_ERR_SHAPE"; "MLXK_UNKNOWN_STATUS" otherwise.
        pub fn status_name(status: i32) -> &'static CStr {
            let name: &'static str = match status {
                $( $code => concat!(stringify!($name), "\0"), )*
                _ => "MLXK_UNKNOWN_STATUS\0",
            };
            CStr::from_bytes_with_nul(name.as_bytes()).unwrap_or(c"MLXK_UNKNOWN_STATUS")
        }

        /// Every failure the library reports; each variant is one status code of the C ABI
        /// ([`Error::status`]) and holds the message, which names the argument at fault and
        /// what was expected: `NullPointer` (a required pointer of the C ABI was NULL),
        /// `InvalidArgument` (a value outside what the function accepts), `Shape` (a rank or
        /// dimension), `Dtype`, `Unsupported` (this build or machine cannot run the request),
        /// `Backend` (MLX raised an error), `OutOfMemory` (above the memory limit; nothing was
        /// allocated), `BufferTooSmall`, `Panic` (an internal panic, caught), `InvalidHandle`
        /// (a C handle that is not live).
        #[derive(Debug, thiserror::Error)]
        pub enum Error {
            $( $( #[error("{0}")] $variant(String), )? )*
        }

        impl Error {
            /// The C status code of this error.
            pub fn status(&self) -> i32 {
                match self {
                    $( $( Error::$variant(_) => codes::$name, )? )*
                }
            }
        }
    };
}

// The rows: `/// doc`, `NAME = code [=> Error variant];`. Codes are stable and never reused.
statuses! {
    /// Success.
    MLXK_OK = 0;
    /// A required pointer argument (a handle, a buffer or an out-parameter) was NULL.
    MLXK_ERR_NULL_POINTER = 1 => NullPointer;
    /// An argument has a value outside what the function accepts (a length, a mask byte, eps).
    MLXK_ERR_INVALID_ARGUMENT = 2 => InvalidArgument;
    /// An array has the wrong rank or a dimension that does not match.
    MLXK_ERR_SHAPE = 3 => Shape;
    /// An array or dtype code has a dtype the function does not accept.
    MLXK_ERR_DTYPE = 4 => Dtype;
    /// The request is valid but this build or machine cannot run it (e.g. no GPU backend).
    MLXK_ERR_UNSUPPORTED = 5 => Unsupported;
    /// MLX reported an error (raised while building or evaluating a graph).
    MLXK_ERR_BACKEND = 6 => Backend;
    /// The request would exceed the memory limit (mlxk_set_memory_limit); nothing was allocated.
    MLXK_ERR_OUT_OF_MEMORY = 7 => OutOfMemory;
    /// A caller's buffer is smaller than the data to be written into it.
    MLXK_ERR_BUFFER_TOO_SMALL = 8 => BufferTooSmall;
    /// An internal panic was caught at the boundary; the process is intact.
    MLXK_ERR_PANIC = 9 => Panic;
    /// A handle is not a live mlxk_array (freed, double-freed, or not made by this library).
    MLXK_ERR_INVALID_HANDLE = 10 => InvalidHandle;
}

/// Prefix marking an error raised by one of our CPU kernels (so it maps back to its status
/// after travelling through MLX as a C++ exception).
pub(crate) const KERNEL_PANIC_TAG: &str = "mlxkern kernel panic: ";

impl From<cxx::Exception> for Error {
    fn from(e: cxx::Exception) -> Self {
        let what = e.what();
        if let Some(rest) = what.strip_prefix(KERNEL_PANIC_TAG) {
            Error::Panic(format!("a CPU kernel panicked: {rest}"))
        } else {
            Error::Backend(format!("MLX: {what}"))
        }
    }
}

/// The message a caught panic carried (`panic!` with a literal or a formatted string).
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic payload".to_string())
}

/// The result of every fallible call of this library.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_maps_to_its_named_code() {
        let cases = [
            (Error::NullPointer(String::new()), "MLXK_ERR_NULL_POINTER"),
            (
                Error::InvalidHandle(String::new()),
                "MLXK_ERR_INVALID_HANDLE",
            ),
            (Error::Panic(String::new()), "MLXK_ERR_PANIC"),
        ];
        for (error, name) in cases {
            assert_eq!(status_name(error.status()).to_str().unwrap(), name);
        }
        assert_eq!(status_name(codes::MLXK_OK).to_str().unwrap(), "MLXK_OK");
        assert_eq!(status_name(11).to_str().unwrap(), "MLXK_UNKNOWN_STATUS");
    }
}
