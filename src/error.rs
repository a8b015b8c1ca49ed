//! One error type for the whole library; each variant is one C status code.

use crate::capi::status::*;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    NullPointer(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    Dtype(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("{0}")]
    Backend(String),
    #[error("{0}")]
    OutOfMemory(String),
    #[error("{0}")]
    BufferTooSmall(String),
    #[error("{0}")]
    Panic(String),
    #[error("{0}")]
    InvalidHandle(String),
}

impl Error {
    pub fn status(&self) -> mlxk_status {
        match self {
            Error::NullPointer(_) => MLXK_ERR_NULL_POINTER,
            Error::InvalidArgument(_) => MLXK_ERR_INVALID_ARGUMENT,
            Error::Shape(_) => MLXK_ERR_SHAPE,
            Error::Dtype(_) => MLXK_ERR_DTYPE,
            Error::Unsupported(_) => MLXK_ERR_UNSUPPORTED,
            Error::Backend(_) => MLXK_ERR_BACKEND,
            Error::OutOfMemory(_) => MLXK_ERR_OUT_OF_MEMORY,
            Error::BufferTooSmall(_) => MLXK_ERR_BUFFER_TOO_SMALL,
            Error::Panic(_) => MLXK_ERR_PANIC,
            Error::InvalidHandle(_) => MLXK_ERR_INVALID_HANDLE,
        }
    }
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

pub type Result<T> = std::result::Result<T, Error>;
