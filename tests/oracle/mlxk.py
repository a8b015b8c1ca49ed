"""A small ctypes binding of the mlxkern C ABI (include/mlxkern.h), for the oracle tests.

Arrays cross the boundary as numpy arrays in their storage form: float32, float16, bool,
integers as themselves; bfloat16 as uint16 bit patterns (numpy has no bfloat16). `Array.read()`
widens bfloat16 to float32 (exact); `Array.read_bits()` returns the raw patterns.

The library is target/debug/libmlxkern.so (.dylib on macOS) unless $MLXKERN_LIB names another.
Every failing call raises `MlxkError` carrying the status, its name and mlxk_last_error().
"""

import ctypes
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# mlxk_status codes (docs/DESIGN.md §5; stable).
OK = 0
ERR_NULL_POINTER = 1
ERR_INVALID_ARGUMENT = 2
ERR_SHAPE = 3
ERR_DTYPE = 4
ERR_UNSUPPORTED = 5
ERR_BACKEND = 6
ERR_OUT_OF_MEMORY = 7
ERR_BUFFER_TOO_SMALL = 8
ERR_PANIC = 9
ERR_INVALID_HANDLE = 10

# mlxk_dtype codes.
BOOL = 0
UINT8 = 1
INT8 = 2
INT32 = 3
UINT32 = 4
FLOAT16 = 5
BFLOAT16 = 6
FLOAT32 = 7

DEVICE_CPU = 0
DEVICE_GPU = 1

# Per dtype code: its name and the numpy type holding its bytes.
_STORAGE = {
    BOOL: ("bool", np.bool_),
    UINT8: ("uint8", np.uint8),
    INT8: ("int8", np.int8),
    INT32: ("int32", np.int32),
    UINT32: ("uint32", np.uint32),
    FLOAT16: ("float16", np.float16),
    BFLOAT16: ("bfloat16", np.uint16),
    FLOAT32: ("float32", np.float32),
}
_BY_NAME = {name: code for code, (name, _) in _STORAGE.items()}
_FROM_NUMPY = {
    np.dtype(np.bool_): BOOL,
    np.dtype(np.uint8): UINT8,
    np.dtype(np.int8): INT8,
    np.dtype(np.int32): INT32,
    np.dtype(np.uint32): UINT32,
    np.dtype(np.float16): FLOAT16,
    np.dtype(np.float32): FLOAT32,
}


def dtype_code(dtype):
    """A dtype code from a code, a name ("bfloat16"), an mlx dtype (mx.bfloat16) or a numpy
    dtype (np.float32)."""
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        if int(dtype) not in _STORAGE:
            raise ValueError(f"unknown mlxk dtype code {dtype}")
        return int(dtype)
    if isinstance(dtype, (np.dtype, type)):
        if np.dtype(dtype) not in _FROM_NUMPY:
            raise ValueError(f"no mlxk dtype for numpy {np.dtype(dtype)}")
        return _FROM_NUMPY[np.dtype(dtype)]
    name = str(dtype).split(".")[-1]
    if name not in _BY_NAME:
        raise ValueError(f"no mlxk dtype for {dtype!r}")
    return _BY_NAME[name]


def dtype_name(code):
    return _STORAGE[code][0]


# ---------------------------------------------------------------------------------------------
# bfloat16 <-> float32, with MLX's conversion rules (round to nearest even; NaN -> 0x7FC0).


def f32_to_bf16_bits(x):
    """float32 values -> bfloat16 bit patterns (uint16), rounding to nearest even as MLX does."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7FC0), rounded)


def bf16_bits_to_f32(bits):
    """bfloat16 bit patterns (uint16) -> float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def round_to(x, dtype):
    """float32 values rounded to `dtype` (code or name) and widened back to float32."""
    code = dtype_code(dtype)
    x = np.asarray(x, dtype=np.float32)
    if code == FLOAT32:
        return x.copy()
    if code == BFLOAT16:
        return bf16_bits_to_f32(f32_to_bf16_bits(x))
    if code == FLOAT16:
        return x.astype(np.float16).astype(np.float32)
    raise ValueError(f"round_to: {dtype_name(code)} is not a float dtype")


def to_storage(x, dtype):
    """float32 values -> the numpy storage of `dtype` (bfloat16 as uint16 bits), rounded."""
    code = dtype_code(dtype)
    if code == BFLOAT16:
        return f32_to_bf16_bits(x)
    return np.asarray(x).astype(_STORAGE[code][1])


def storage_to_f32(x, dtype):
    """The numpy storage of a float `dtype` -> float32 values."""
    code = dtype_code(dtype)
    if code == BFLOAT16:
        return bf16_bits_to_f32(x)
    return np.asarray(x).astype(np.float32)


def bits(x, dtype=None):
    """The bit patterns of float values, as unsigned integers, to compare bit for bit.

    `x` is float32/float16 numpy, or uint16 bfloat16 storage (pass dtype="bfloat16" for a
    float32 array that should be viewed as rounded-to-bfloat16 values instead)."""
    x = np.asarray(x)
    if dtype is not None and dtype_code(dtype) == BFLOAT16 and x.dtype == np.float32:
        return f32_to_bf16_bits(x)
    return np.ascontiguousarray(x).view({2: np.uint16, 4: np.uint32, 1: np.uint8}[x.itemsize])


# mlx interop (optional: only used when mlx is importable).


def from_mx(a):
    """An mlx array -> (numpy storage, dtype code). bfloat16 comes back as uint16 bits."""
    import mlx.core as mx

    code = dtype_code(a.dtype)
    if code == BFLOAT16:
        return np.array(a.view(mx.uint16)), code
    return np.array(a), code


def to_mx(x, dtype):
    """numpy storage of `dtype` -> an mlx array with those exact bits."""
    import mlx.core as mx

    code = dtype_code(dtype)
    if code == BFLOAT16:
        return mx.array(np.ascontiguousarray(x, dtype=np.uint16)).view(mx.bfloat16)
    return mx.array(np.ascontiguousarray(x, dtype=_STORAGE[code][1]))


# ---------------------------------------------------------------------------------------------
# The library.


def library_path():
    env = os.environ.get("MLXKERN_LIB")
    if env:
        return env
    ext = "dylib" if sys.platform == "darwin" else "so"
    return os.path.join(ROOT, "target", "debug", f"libmlxkern.{ext}")


_ARR = ctypes.c_void_p  # mlxk_array * (an opaque token)
_ARR_OUT = ctypes.POINTER(ctypes.c_void_p)
_STATUS = ctypes.c_int32

# name -> (restype, argtypes), following include/mlxkern.h and docs/DESIGN.md §5.
_PROTOTYPES = {
    "mlxk_array_new": (_STATUS, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32),
                                 ctypes.c_size_t, ctypes.c_int32, _ARR_OUT]),
    "mlxk_array_zeros": (_STATUS, [ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t,
                                   ctypes.c_int32, _ARR_OUT]),
    "mlxk_array_free": (_STATUS, [_ARR]),
    "mlxk_array_ndim": (_STATUS, [_ARR, ctypes.POINTER(ctypes.c_size_t)]),
    "mlxk_array_shape": (_STATUS, [_ARR, ctypes.POINTER(ctypes.c_int32), ctypes.c_size_t]),
    "mlxk_array_dtype": (_STATUS, [_ARR, ctypes.POINTER(ctypes.c_int32)]),
    "mlxk_array_nbytes": (_STATUS, [_ARR, ctypes.POINTER(ctypes.c_size_t)]),
    "mlxk_array_eval": (_STATUS, [_ARR]),
    "mlxk_array_read": (_STATUS, [_ARR, ctypes.c_void_p, ctypes.c_size_t]),
    "mlxk_array_astype": (_STATUS, [_ARR, ctypes.c_int32, _ARR_OUT]),
    "mlxk_set_default_device": (_STATUS, [ctypes.c_int32]),
    "mlxk_gpu_backend": (ctypes.c_int32, []),
    "mlxk_set_memory_limit": (_STATUS, [ctypes.c_size_t]),
    "mlxk_get_memory_limit": (_STATUS, [ctypes.POINTER(ctypes.c_size_t)]),
    "mlxk_set_cache_limit": (_STATUS, [ctypes.c_size_t]),
    "mlxk_compute_g": (_STATUS, [_ARR, _ARR, _ARR, _ARR_OUT]),
    "mlxk_gated_delta_update": (_STATUS, [_ARR] * 9 + [_ARR_OUT, _ARR_OUT]),
    "mlxk_gated_delta_update_vjp": (_STATUS, [_ARR] * 11 + [_ARR_OUT] * 8),
    "mlxk_gated_delta_state": (_STATUS, [_ARR] * 7 + [ctypes.POINTER(ctypes.c_int32),
                                                      ctypes.c_size_t, _ARR_OUT]),
    "mlxk_silu_rms_heads": (_STATUS, [_ARR, _ARR, _ARR, ctypes.c_int32, ctypes.c_int32,
                                      ctypes.c_int32, ctypes.c_float,
                                      _ARR_OUT, _ARR_OUT, _ARR_OUT]),
    "mlxk_gated_rms_norm": (_STATUS, [_ARR, _ARR, _ARR, ctypes.c_float, _ARR_OUT]),
    "mlxk_gated_delta_update_vjp": (_STATUS, [_ARR] * 11 + [_ARR_OUT] * 8),
    "mlxk_silu_rms_heads_vjp": (_STATUS, [_ARR, _ARR, _ARR, ctypes.c_int32, ctypes.c_int32,
                                          ctypes.c_int32, ctypes.c_float, _ARR, _ARR, _ARR,
                                          _ARR_OUT, _ARR_OUT, _ARR_OUT]),
    "mlxk_gated_rms_norm_vjp": (_STATUS, [_ARR, _ARR, _ARR, ctypes.c_float, _ARR,
                                          _ARR_OUT, _ARR_OUT, _ARR_OUT]),
    "mlxk_last_error": (ctypes.c_char_p, []),
    "mlxk_status_name": (ctypes.c_char_p, [ctypes.c_int32]),
    "mlxk_version": (ctypes.c_char_p, []),
    "mlxk_abi_version": (ctypes.c_uint32, []),
}


class MlxkError(Exception):
    """A call returned a status other than MLXK_OK."""

    def __init__(self, function, status, message):
        self.function = function
        self.status = status
        self.status_name = status_name(status)
        self.message = message
        super().__init__(f"{function}: {self.status_name} ({status}): {message}")


class _Lib:
    """The loaded library; functions get their prototypes on first use (a kernel this build
    lacks fails with AttributeError when called, not at load)."""

    def __init__(self, path):
        self.path = path
        self.dll = ctypes.CDLL(path)
        self._fns = {}

    def __getattr__(self, name):
        if name.startswith("mlxk_"):
            fn = self._fns.get(name)
            if fn is None:
                fn = getattr(self.dll, name)
                fn.restype, fn.argtypes = _PROTOTYPES[name]
                self._fns[name] = fn
            return fn
        raise AttributeError(name)

    def has(self, name):
        return hasattr(self.dll, name)


_lib = None


def lib():
    global _lib
    if _lib is None:
        _lib = _Lib(library_path())
    return _lib


def last_error():
    return lib().mlxk_last_error().decode("utf-8", "replace")


def status_name(status):
    return lib().mlxk_status_name(status).decode()


def check(function, status):
    """Raises MlxkError for a failing status."""
    if status != OK:
        raise MlxkError(function, status, last_error())


def call(function, *args):
    """Calls `function` (a name) and raises on failure."""
    check(function, getattr(lib(), function)(*args))


def version():
    return lib().mlxk_version().decode()


def abi_version():
    return lib().mlxk_abi_version()


# ---------------------------------------------------------------------------------------------
# Array handles.


class Array:
    """An owned mlxk_array handle. Free it with free() or use it as a context manager; a
    forgotten one is freed when garbage collected."""

    def __init__(self, handle):
        if not handle:
            raise ValueError("NULL mlxk_array handle")
        self.handle = ctypes.c_void_p(handle)

    @property
    def _as_arg(self):
        if self.handle is None:
            raise ValueError("use of a freed Array")
        return self.handle

    def free(self):
        if self.handle is not None:
            handle, self.handle = self.handle, None
            call("mlxk_array_free", handle)

    def __del__(self):
        try:
            if self.handle is not None and _lib is not None:
                _lib.mlxk_array_free(self.handle)
                self.handle = None
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()

    def _query(self, fn, ctype):
        """The value `fn` (an inspection entry point) writes to its out-parameter."""
        out = ctype()
        call(fn, self._as_arg, ctypes.byref(out))
        return out.value

    @property
    def ndim(self):
        return self._query("mlxk_array_ndim", ctypes.c_size_t)

    @property
    def shape(self):
        ndim = self.ndim
        dims = (ctypes.c_int32 * max(ndim, 1))()
        call("mlxk_array_shape", self._as_arg, dims, ndim)
        return tuple(dims[i] for i in range(ndim))

    @property
    def dtype(self):
        """The dtype code (see dtype_name)."""
        return self._query("mlxk_array_dtype", ctypes.c_int32)

    @property
    def nbytes(self):
        return self._query("mlxk_array_nbytes", ctypes.c_size_t)

    def eval(self):
        call("mlxk_array_eval", self._as_arg)
        return self

    def read_bits(self):
        """Evaluates and copies the elements out in their storage form (bfloat16: uint16)."""
        code = self.dtype
        out = np.empty(self.shape, dtype=_STORAGE[code][1])
        call("mlxk_array_read", self._as_arg, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
        return out

    def read(self):
        """Evaluates and copies the elements out; bfloat16 is widened to float32 (exact)."""
        code = self.dtype
        raw = self.read_bits()
        return bf16_bits_to_f32(raw) if code == BFLOAT16 else raw

    def astype(self, dtype):
        out = ctypes.c_void_p()
        call("mlxk_array_astype", self._as_arg, dtype_code(dtype), ctypes.byref(out))
        return Array(out.value)

    def __repr__(self):
        if self.handle is None:
            return "mlxk.Array(freed)"
        return f"mlxk.Array(shape={self.shape}, dtype={dtype_name(self.dtype)})"


def array(x, dtype=None, raw=False):
    """A new handle holding a copy of numpy `x`.

    dtype: None takes x's own dtype (float32, float16, bool, int/uint types). With "bfloat16"
    (or BFLOAT16), a uint16 `x` is taken as bit patterns and any float `x` is rounded to
    bfloat16 with MLX's rule. With another dtype, x is converted by numpy (round to nearest
    even). raw=True passes x's bytes unchanged as `dtype` (e.g. a uint8 array holding bool
    bytes other than 0 and 1, to test validation); the item sizes must agree."""
    x = np.asarray(x)
    if dtype is None:
        if x.dtype not in _FROM_NUMPY:
            raise ValueError(f"no mlxk dtype for numpy {x.dtype}; pass dtype=")
        code = _FROM_NUMPY[x.dtype]
    else:
        code = dtype_code(dtype)
    if raw:
        if x.itemsize != np.dtype(_STORAGE[code][1]).itemsize:
            raise ValueError(f"raw: {x.dtype} items are not {dtype_name(code)}-sized")
        data = x
    elif code == BFLOAT16:
        data = x if x.dtype == np.uint16 else f32_to_bf16_bits(x.astype(np.float32))
    else:
        data = x.astype(_STORAGE[code][1], copy=False)
    data = np.ascontiguousarray(data)
    shape = (ctypes.c_int32 * max(data.ndim, 1))(*data.shape)
    out = ctypes.c_void_p()
    ptr = data.ctypes.data_as(ctypes.c_void_p) if data.size else None
    call("mlxk_array_new", ptr, shape, data.ndim, code, ctypes.byref(out))
    return Array(out.value)


def zeros(shape, dtype):
    dims = (ctypes.c_int32 * max(len(shape), 1))(*shape)
    out = ctypes.c_void_p()
    call("mlxk_array_zeros", dims, len(shape), dtype_code(dtype), ctypes.byref(out))
    return Array(out.value)


def free(*arrays):
    """Frees every Array given (None entries are skipped)."""
    for a in arrays:
        if a is not None:
            a.free()


def _arg(a):
    """An optional input: an Array or None (NULL)."""
    return None if a is None else a._as_arg


def _outs(n):
    return [ctypes.c_void_p() for _ in range(n)]


# ---------------------------------------------------------------------------------------------
# Kernels. Inputs are Arrays (borrowed); results are new Arrays the caller frees.


def set_default_device(device):
    call("mlxk_set_default_device", device)


def gpu_backend():
    return lib().mlxk_gpu_backend()


def set_memory_limit(nbytes):
    call("mlxk_set_memory_limit", nbytes)


def get_memory_limit():
    n = ctypes.c_size_t()
    call("mlxk_get_memory_limit", ctypes.byref(n))
    return n.value


def compute_g(a_log, a, dt_bias):
    (g,) = _outs(1)
    call("mlxk_compute_g", _arg(a_log), _arg(a), _arg(dt_bias), ctypes.byref(g))
    return Array(g.value)


def gated_delta_update(q, k, v, a, b, a_log, dt_bias, state=None, mask=None):
    """Returns (y, state_out)."""
    y, s = _outs(2)
    call("mlxk_gated_delta_update", *map(_arg, (q, k, v, a, b, a_log, dt_bias, state, mask)),
         ctypes.byref(y), ctypes.byref(s))
    return Array(y.value), Array(s.value)


VJP_NAMES = ("dq", "dk", "dv", "da", "db", "da_log", "ddt_bias", "dstate")


def gated_delta_update_vjp(q, k, v, a, b, a_log, dt_bias, state=None, mask=None, dy=None,
                           dstate_out=None):
    """The update's backward pass: returns the eight gradients as Arrays, in VJP_NAMES' order
    (dq, dk, dv, da, db, da_log, ddt_bias, dstate). state, mask, dy and dstate_out may be None
    (NULL: a zero state, no mask, zero cotangents); dstate is returned either way."""
    outs = _outs(8)
    call("mlxk_gated_delta_update_vjp",
         *map(_arg, (q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out)),
         *(ctypes.byref(o) for o in outs))
    return tuple(Array(o.value) for o in outs)


def gated_delta_state(k, v, a, b, a_log, dt_bias, state, accepted_lengths):
    """Prefix replay: returns state_out. accepted_lengths: a sequence of ints, one per row."""
    lengths = np.ascontiguousarray(accepted_lengths, dtype=np.int32)
    ptr = lengths.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)) if lengths.size else None
    (s,) = _outs(1)
    call("mlxk_gated_delta_state", *map(_arg, (k, v, a, b, a_log, dt_bias, state)),
         ptr, lengths.size, ctypes.byref(s))
    return Array(s.value)


def silu_rms_heads(x, q_scale, k_scale, key_heads, value_heads, value_width, eps):
    """Returns (q, k, v)."""
    q, k, v = _outs(3)
    call("mlxk_silu_rms_heads", _arg(x), _arg(q_scale), _arg(k_scale), key_heads, value_heads,
         value_width, ctypes.c_float(eps), ctypes.byref(q), ctypes.byref(k), ctypes.byref(v))
    return Array(q.value), Array(k.value), Array(v.value)


def gated_rms_norm(x, gate, weight, eps):
    (out,) = _outs(1)
    call("mlxk_gated_rms_norm", _arg(x), _arg(gate), _arg(weight), ctypes.c_float(eps),
         ctypes.byref(out))
    return Array(out.value)


def gated_delta_update_vjp(q, k, v, a, b, a_log, dt_bias, state=None, mask=None, dy=None,
                           dstate_out=None):
    """Returns (dq, dk, dv, da, db, da_log, ddt_bias, dstate); None cotangents are zeros."""
    outs = _outs(8)
    call("mlxk_gated_delta_update_vjp",
         *map(_arg, (q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out)),
         *map(ctypes.byref, outs))
    return tuple(Array(o.value) for o in outs)


def silu_rms_heads_vjp(x, q_scale, k_scale, key_heads, value_heads, value_width, eps, dq=None,
                       dk=None, dv=None):
    """Returns (dx, dq_scale, dk_scale); None cotangents are zeros."""
    outs = _outs(3)
    call("mlxk_silu_rms_heads_vjp", _arg(x), _arg(q_scale), _arg(k_scale), key_heads,
         value_heads, value_width, ctypes.c_float(eps), _arg(dq), _arg(dk), _arg(dv),
         *map(ctypes.byref, outs))
    return tuple(Array(o.value) for o in outs)


def gated_rms_norm_vjp(x, gate, weight, eps, dout=None):
    """Returns (dx, dgate, dweight); a None dout is zeros."""
    outs = _outs(3)
    call("mlxk_gated_rms_norm_vjp", _arg(x), _arg(gate), _arg(weight), ctypes.c_float(eps),
         _arg(dout), *map(ctypes.byref, outs))
    return tuple(Array(o.value) for o in outs)
