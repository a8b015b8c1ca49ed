"""mlxkern: Gated DeltaNet (Qwen3.5 / Qwen3-Next) kernels on ``mlx.core`` arrays.

Every function takes and returns ``mx.array`` without copying: the inputs are the same MLX
arrays (or unevaluated nodes) the caller holds, and the results are lazy nodes of MLX's graph,
computed by the next ``mx.eval`` like MLX's own ops. ``mx.grad``, ``mx.vjp`` and
``mx.value_and_grad`` differentiate through the update, the head split and the gated norm (the
kernels' nodes carry their backward passes). Conventions follow mlx-lm's
``gated_delta_update``: ``q, k`` ``[B, T, Hk, Dk]`` (already normalized, ``normalize_qk``),
``v`` ``[B, T, Hv, Dv]``, ``a, b`` ``[B, T, Hv]``, ``A_log, dt_bias`` ``[Hv]``, the state
``[B, Hv, Dv, Dk]`` float32, the mask ``[B, T]`` bool (True = a real token).

A failed call raises :class:`Error` (a subclass per status: :class:`ShapeError`,
:class:`DtypeError`, ...) whose message is the library's and names the argument at fault.

The package is built against one MLX (``MLX_BUILD_VERSION``) and must run with it, as the only
MLX in the process: importing it with another raises ImportError saying so.
``mlxkern.mlx_lm.patch()`` switches mlx-lm's Qwen3.5 / Qwen3-Next models to these kernels.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import mlx.core as mx

from ._errors import (
    BackendError,
    BufferTooSmallError,
    DtypeError,
    Error,
    InvalidArgumentError,
    InvalidHandleError,
    NullPointerError,
    OutOfMemoryError,
    PanicError,
    ShapeError,
    UnsupportedError,
    error_classes,
)

from ._build_info import MLX_BUILD_VERSION

if mx.__version__ != MLX_BUILD_VERSION and not mx.__version__.startswith(MLX_BUILD_VERSION + ".dev"):
    raise ImportError(
        f"mlxkern was built against mlx {MLX_BUILD_VERSION}, but mlx {mx.__version__} is "
        f"loaded: MLX has no stable C++ ABI, so mlxkern shares arrays only with the MLX it was "
        f"built against. Install mlx=={MLX_BUILD_VERSION} (pip install "
        f"'mlx[cpu]=={MLX_BUILD_VERSION}' on Linux) or rebuild mlxkern against mlx {mx.__version__}."
    )

try:
    from . import _ext
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"mlxkern: its compiled module failed to load with mlx {mx.__version__} ({exc}); "
        f"mlxkern was built against mlx {MLX_BUILD_VERSION}."
    ) from exc

__version__ = _ext.version()
if _ext.MLX_BUILD_VERSION != MLX_BUILD_VERSION:  # pragma: no cover - a broken installation
    raise ImportError(f"mlxkern: its compiled module was built against mlx "
                      f"{_ext.MLX_BUILD_VERSION}, its package against {MLX_BUILD_VERSION}")

_ext._set_error_classes(error_classes())

try:
    _ext._check_exchange()
except Error as exc:
    raise ImportError(f"mlxkern: {exc}") from exc


class Update(NamedTuple):
    """The update's results: ``y`` ``[B, T, Hv, Dv]`` in q's dtype, ``state`` float32."""

    y: mx.array
    state: mx.array


class PoolUpdate(NamedTuple):
    """A pool update's results: ``y`` ``[B, T, Hv, Dv]`` and the new ``pool``."""

    y: mx.array
    pool: mx.array


class UpdateGradients(NamedTuple):
    """The update's gradients, each in its primal's shape and dtype (``dstate`` float32)."""

    dq: mx.array
    dk: mx.array
    dv: mx.array
    da: mx.array
    db: mx.array
    dA_log: mx.array
    ddt_bias: mx.array
    dstate: mx.array


class Heads(NamedTuple):
    """The head split's results: ``q, k`` ``[B, S, Hk, Dk]``, ``v`` ``[B, S, Hv, Dv]``."""

    q: mx.array
    k: mx.array
    v: mx.array


class HeadsGradients(NamedTuple):
    """The head split's gradients (x's dtype)."""

    dx: mx.array
    dq_scale: mx.array
    dk_scale: mx.array


class NormGradients(NamedTuple):
    """The gated norm's gradients."""

    dx: mx.array
    dgate: mx.array
    dweight: mx.array


GLM52Layout = _ext.GLM52Layout

_Arr = mx.array
_Opt = Optional[mx.array]


def version() -> str:
    """The library's version, e.g. ``"0.1.0"``."""
    return _ext.version()


def abi_version() -> int:
    """The loaded library's C ABI version."""
    return _ext.abi_version()


def mlx_version() -> str:
    """The version of the libmlx loaded in this process (the library's view)."""
    return _ext.mlx_version()


def set_default_device(device: str) -> None:
    """Sets where later kernel calls run: ``"cpu"`` (the default) or ``"gpu"`` (needs the
    loaded MLX's Metal or CUDA backend; UnsupportedError otherwise). Process-wide; independent
    of ``mx.set_default_device``."""
    _ext.set_default_device(device)


def gpu_backend() -> str:
    """The loaded MLX's GPU backend: ``"metal"``, ``"cuda"`` or ``"none"``."""
    return _ext.gpu_backend()


def set_memory_limit(bytes: int) -> None:
    """The most bytes one call may produce (OutOfMemoryError above it, before anything is
    allocated); 0 restores the default, the machine's physical memory."""
    _ext.set_memory_limit(bytes)


def memory_limit() -> int:
    """The current per-call memory limit in bytes."""
    return _ext.memory_limit()


def set_cache_limit(bytes: int) -> None:
    """Sets MLX's cache limit (bytes of freed buffers kept for reuse)."""
    _ext.set_cache_limit(bytes)


def compute_g(A_log: _Arr, a: _Arr, dt_bias: _Arr) -> mx.array:
    """``g = exp(-exp(f32(A_log)) * softplus(a + dt_bias))``: mlx-lm's ``compute_g`` bit for
    bit, float32 with a's shape."""
    return _ext.compute_g(A_log, a, dt_bias)


def gated_delta_update(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr, dt_bias: _Arr,
                       state: _Opt = None, mask: _Opt = None) -> Update:
    """One Gated DeltaNet call, mlx-lm's ``gated_delta_update`` with the Metal kernel's
    arithmetic (exact recurrence, token by token). ``state`` None is zeros, ``mask`` None is
    all tokens real; Dk a multiple of 32 in [32, 256], Hv a multiple of Hk. Returns
    ``Update(y, state)``; masked tokens get y = 0 and leave the state as it was."""
    return Update(*_ext.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask))


def gated_delta_update_chunked(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                               dt_bias: _Arr, state: _Opt = None, mask: _Opt = None,
                               chunk_size: int = 0) -> Update:
    """The same update in chunked (WY / UT) form, the fast prefill: equal to
    :func:`gated_delta_update` up to float32 rounding. ``chunk_size`` 0 (default 32) or a
    multiple of 16 in [16, 128]."""
    return Update(*_ext.gated_delta_update_chunked(q, k, v, a, b, A_log, dt_bias, state, mask,
                                                   chunk_size))


def gated_delta_update_vjp(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                           dt_bias: _Arr, state: _Opt = None, mask: _Opt = None,
                           dy: _Opt = None, dstate: _Opt = None) -> UpdateGradients:
    """The update's backward pass called explicitly: the gradients of
    ``sum(dy * y) + sum(dstate * state_out)`` (None cotangents are zeros). ``mx.vjp`` through
    :func:`gated_delta_update` gives the same bits."""
    return UpdateGradients(*_ext.gated_delta_update_vjp(q, k, v, a, b, A_log, dt_bias, state,
                                                        mask, dy, dstate))


def gated_delta_update_chunked_vjp(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                                   dt_bias: _Arr, state: _Opt = None, mask: _Opt = None,
                                   chunk_size: int = 0, dy: _Opt = None,
                                   dstate: _Opt = None) -> UpdateGradients:
    """The chunked form's backward pass (chunk by chunk); equal to
    :func:`gated_delta_update_vjp` up to float32 rounding."""
    return UpdateGradients(*_ext.gated_delta_update_chunked_vjp(
        q, k, v, a, b, A_log, dt_bias, state, mask, chunk_size, dy, dstate))


def gated_delta_state(k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr, dt_bias: _Arr,
                      state: _Opt, accepted_lengths: Sequence[int]) -> mx.array:
    """Prefix-state replay (speculative decoding): each row's state after its first
    ``accepted_lengths[b]`` tokens from ``state``, bit for bit the update's."""
    return _ext.gated_delta_state(k, v, a, b, A_log, dt_bias, state, list(accepted_lengths))


def gated_delta_update_from_conv(x: _Arr, q_scale: _Arr, k_scale: _Arr, key_heads: int,
                                 value_heads: int, value_width: int, eps: float, a: _Arr,
                                 b: _Arr, A_log: _Arr, dt_bias: _Arr, state: _Opt = None,
                                 mask: _Opt = None) -> Update:
    """:func:`silu_rms_heads` on the convolution's output ``x`` then :func:`gated_delta_update`
    on its q, k, v, bit for bit those two calls."""
    return Update(*_ext.gated_delta_update_from_conv(x, q_scale, k_scale, key_heads, value_heads,
                                                     value_width, eps, a, b, A_log, dt_bias,
                                                     state, mask))


def _fresh(fresh):
    return None if fresh is None else [bool(f) for f in fresh]


def gated_delta_update_pool(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                            dt_bias: _Arr, pool: _Arr, slots: Sequence[int],
                            fresh: Optional[Sequence[bool]] = None, mask: _Opt = None,
                            chunk_size: Optional[int] = None) -> PoolUpdate:
    """The update on a pool of states ``[N, Hv, Dv, Dk]``: row b reads and writes
    ``pool[slots[b]]`` (a negative slot is padding; ``fresh[b]`` starts from zeros).
    ``chunk_size`` not None takes the chunked form. Returns ``PoolUpdate(y, pool)``."""
    if chunk_size is None:
        return PoolUpdate(*_ext.gated_delta_update_pool(q, k, v, a, b, A_log, dt_bias, pool,
                                                        list(slots), _fresh(fresh), mask))
    return PoolUpdate(*_ext.gated_delta_update_pool_chunked(
        q, k, v, a, b, A_log, dt_bias, pool, list(slots), _fresh(fresh), mask, chunk_size))


def gated_delta_verify_pool(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                            dt_bias: _Arr, pool: _Arr, slots: Sequence[int],
                            fresh: Optional[Sequence[bool]] = None,
                            mask: _Opt = None) -> mx.array:
    """Speculative verify on a pool: y for every draft token, the pool only read."""
    return _ext.gated_delta_verify_pool(q, k, v, a, b, A_log, dt_bias, pool, list(slots),
                                        _fresh(fresh), mask)


def gated_delta_state_pool(k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr, dt_bias: _Arr,
                           pool: _Arr, slots: Sequence[int], accepted_lengths: Sequence[int],
                           fresh: Optional[Sequence[bool]] = None) -> mx.array:
    """Commit after a verify: row b replays its first ``accepted_lengths[b]`` tokens from
    ``pool[slots[b]]`` and writes the state back. Returns the new pool."""
    return _ext.gated_delta_state_pool(k, v, a, b, A_log, dt_bias, pool, list(slots),
                                       list(accepted_lengths), _fresh(fresh))


def gated_delta_verify_tree_pool(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                                 dt_bias: _Arr, pool: _Arr, cu_nodes: Sequence[int],
                                 parents: Sequence[int], slots: Sequence[int],
                                 fresh: Optional[Sequence[bool]] = None) -> mx.array:
    """Tree verify on a pool: y ``[1, n_nodes, Hv, Dv]`` for every node of draft trees packed
    along T (tree i owns nodes ``[cu_nodes[i], cu_nodes[i+1])`` and slot ``slots[i]``; node j
    follows ``parents[cu_nodes[i] + j]``, an earlier node of its tree, or -1: the slot's state),
    each bit for bit the last y of :func:`gated_delta_verify_pool` on its path. The pool is
    only read; no state per node is kept."""
    return _ext.gated_delta_verify_tree_pool(q, k, v, a, b, A_log, dt_bias, pool,
                                             list(cu_nodes), list(parents), list(slots),
                                             _fresh(fresh))


def gated_delta_commit_tree_pool(k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                                 dt_bias: _Arr, pool: _Arr, cu_nodes: Sequence[int],
                                 parents: Sequence[int], slots: Sequence[int],
                                 accepted_lengths: Sequence[int],
                                 accepted_paths: Sequence[int],
                                 fresh: Optional[Sequence[bool]] = None) -> mx.array:
    """Commit after a tree verify: tree i's accepted path (the next ``accepted_lengths[i]``
    node indices of ``accepted_paths``, a root first, each next a child of the one before)
    replayed from its slot into the slot, bit for bit :func:`gated_delta_state_pool` on that
    chain. Returns the new pool."""
    return _ext.gated_delta_commit_tree_pool(k, v, a, b, A_log, dt_bias, pool, list(cu_nodes),
                                             list(parents), list(slots), list(accepted_lengths),
                                             list(accepted_paths), _fresh(fresh))


def gated_delta_update_packed(q: _Arr, k: _Arr, v: _Arr, a: _Arr, b: _Arr, A_log: _Arr,
                              dt_bias: _Arr, pool: _Arr, cu_seqlens: Sequence[int],
                              slots: Sequence[int], fresh: Optional[Sequence[bool]] = None,
                              chunk_size: Optional[int] = None) -> PoolUpdate:
    """Packed variable-length prefill: sequences back to back in ``[1, total_T, ...]``,
    sequence i owning tokens ``[cu_seqlens[i], cu_seqlens[i+1])`` and pool slot ``slots[i]``.
    Each sequence's results equal one update on it alone. ``chunk_size`` not None: chunked."""
    if chunk_size is None:
        return PoolUpdate(*_ext.gated_delta_update_packed(q, k, v, a, b, A_log, dt_bias, pool,
                                                          list(cu_seqlens), list(slots),
                                                          _fresh(fresh)))
    return PoolUpdate(*_ext.gated_delta_update_packed_chunked(
        q, k, v, a, b, A_log, dt_bias, pool, list(cu_seqlens), list(slots), _fresh(fresh),
        chunk_size))


def gated_delta_update_from_conv_pool(x: _Arr, q_scale: _Arr, k_scale: _Arr, key_heads: int,
                                      value_heads: int, value_width: int, eps: float, a: _Arr,
                                      b: _Arr, A_log: _Arr, dt_bias: _Arr, pool: _Arr,
                                      slots: Sequence[int],
                                      fresh: Optional[Sequence[bool]] = None,
                                      mask: _Opt = None) -> PoolUpdate:
    """:func:`gated_delta_update_from_conv` on a pool (slots and fresh as in
    :func:`gated_delta_update_pool`)."""
    return PoolUpdate(*_ext.gated_delta_update_from_conv_pool(
        x, q_scale, k_scale, key_heads, value_heads, value_width, eps, a, b, A_log, dt_bias,
        pool, list(slots), _fresh(fresh), mask))


def silu_rms_heads(x: _Arr, q_scale: _Arr, k_scale: _Arr, key_heads: int, value_heads: int,
                   value_width: int, eps: float) -> Heads:
    """Qwen3.5's head split of the convolution's output ``x [B, S, 2*Hk*Dk + Hv*Dv]``: SiLU,
    then q and k RMS-normalized per head and scaled by ``q_scale``/``k_scale`` ``[Dk]``."""
    return Heads(*_ext.silu_rms_heads(x, q_scale, k_scale, key_heads, value_heads, value_width,
                                      eps))


def silu_rms_heads_vjp(x: _Arr, q_scale: _Arr, k_scale: _Arr, key_heads: int, value_heads: int,
                       value_width: int, eps: float, dq: _Opt = None, dk: _Opt = None,
                       dv: _Opt = None) -> HeadsGradients:
    """The head split's backward pass called explicitly (None cotangents are zeros)."""
    return HeadsGradients(*_ext.silu_rms_heads_vjp(x, q_scale, k_scale, key_heads, value_heads,
                                                   value_width, eps, dq, dk, dv))


def gated_rms_norm(x: _Arr, gate: _Arr, weight: _Arr, eps: float) -> mx.array:
    """Gated RMSNorm over the last axis (mlx-lm's ``Qwen3NextRMSNormGated``); ``weight`` in
    x's dtype."""
    return _ext.gated_rms_norm(x, gate, weight, eps)


def gated_rms_norm_vjp(x: _Arr, gate: _Arr, weight: _Arr, eps: float,
                       dout: _Opt = None) -> NormGradients:
    """The gated norm's backward pass called explicitly."""
    return NormGradients(*_ext.gated_rms_norm_vjp(x, gate, weight, eps, dout))


def glm52_layout_canonical(hidden: int, intermediate: int, bits: int,
                           group_size: int) -> GLM52Layout:
    """The canonical layout of one GLM-5.2 expert slot (Q4 or Q8, group 32/64/128)."""
    return _ext.glm52_layout_canonical(hidden, intermediate, bits, group_size)


def glm52_layout_validate(layout: GLM52Layout, bits: int, group_size: int) -> None:
    """Raises InvalidArgumentError naming the field or regions when ``layout`` is unsafe."""
    _ext.glm52_layout_validate(layout, bits, group_size)


__all__ = [
    "BackendError", "BufferTooSmallError", "DtypeError", "Error", "GLM52Layout", "Heads",
    "HeadsGradients", "InvalidArgumentError", "InvalidHandleError", "MLX_BUILD_VERSION",
    "NormGradients", "NullPointerError", "OutOfMemoryError", "PanicError", "PoolUpdate",
    "ShapeError", "UnsupportedError", "Update", "UpdateGradients", "abi_version", "compute_g",
    "gated_delta_state", "gated_delta_state_pool", "gated_delta_update",
    "gated_delta_update_chunked", "gated_delta_update_chunked_vjp",
    "gated_delta_update_from_conv", "gated_delta_update_from_conv_pool",
    "gated_delta_update_packed", "gated_delta_update_pool", "gated_delta_update_vjp",
    "gated_delta_verify_pool", "gated_delta_verify_tree_pool", "gated_delta_commit_tree_pool",
    "gated_rms_norm", "gated_rms_norm_vjp", "glm52_layout_canonical",
    "glm52_layout_validate", "gpu_backend", "memory_limit", "mlx_version", "set_cache_limit",
    "set_default_device", "set_memory_limit", "silu_rms_heads", "silu_rms_heads_vjp", "version",
]
