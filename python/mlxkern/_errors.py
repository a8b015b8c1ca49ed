"""The exceptions mlxkern raises: one class per C ABI status, all under :class:`Error`."""

from __future__ import annotations


class Error(RuntimeError):
    """A failed mlxkern call. ``str(e)`` is the library's message (it names the function and
    the argument at fault); ``status`` is the C ABI's code and ``status_name`` its name."""

    def __init__(self, message: str, status: int = -1, status_name: str = "MLXK_UNKNOWN_STATUS"):
        super().__init__(message)
        self.status = status
        self.status_name = status_name


class NullPointerError(Error, ValueError):
    """MLXK_ERR_NULL_POINTER: a required argument was missing."""


class InvalidArgumentError(Error, ValueError):
    """MLXK_ERR_INVALID_ARGUMENT: a value outside what the function accepts."""


class ShapeError(Error, ValueError):
    """MLXK_ERR_SHAPE: an array's rank or a dimension does not match."""


class DtypeError(Error, TypeError):
    """MLXK_ERR_DTYPE: an array has a dtype the function does not accept."""


class UnsupportedError(Error):
    """MLXK_ERR_UNSUPPORTED: valid, but this build or machine cannot run it."""


class BackendError(Error):
    """MLXK_ERR_BACKEND: MLX reported an error."""


class OutOfMemoryError(Error, MemoryError):
    """MLXK_ERR_OUT_OF_MEMORY: the call would exceed the memory limit; nothing was allocated."""


class BufferTooSmallError(Error):
    """MLXK_ERR_BUFFER_TOO_SMALL."""


class PanicError(Error):
    """MLXK_ERR_PANIC: an internal panic was caught; the process is intact."""


class InvalidHandleError(Error):
    """MLXK_ERR_INVALID_HANDLE."""


_BY_STATUS = {
    1: NullPointerError,
    2: InvalidArgumentError,
    3: ShapeError,
    4: DtypeError,
    5: UnsupportedError,
    6: BackendError,
    7: OutOfMemoryError,
    8: BufferTooSmallError,
    9: PanicError,
    10: InvalidHandleError,
}


def error_classes() -> dict:
    """Status -> class, -1 for statuses without a class of their own."""
    return {**_BY_STATUS, -1: Error}
