"""One call switches mlx-lm's Qwen3.5 / Qwen3-Next models to mlxkern's Gated DeltaNet update.

    import mlxkern.mlx_lm
    mlxkern.mlx_lm.patch()          # every later (and earlier-built) model uses mlxkern
    ...                             # mlx_lm.load / generate / the trainer, unchanged
    mlxkern.mlx_lm.unpatch()        # back to mlx-lm's own update

mlx-lm's linear-attention layers call ``gated_delta_update`` (``mlx_lm.models.gated_delta``)
by the name they import into their module; :func:`patch` rebinds that name in
``mlx_lm.models.qwen3_5`` and ``mlx_lm.models.qwen3_next`` (Qwen3.5-MoE reuses qwen3_5's layer)
to :func:`gated_delta_update` below, which takes the same arguments. Calls of ``chunked_min_tokens``
tokens or more (long prompts) take the chunked form, shorter ones (decode, short prompts) the
exact recurrence. Gradients (training, LoRA) go through the kernels' own backward passes, so
``model.train()`` no longer falls back to mlx-lm's per-token ops loop. A call mlxkern does not
take (``lower_bound``, ``allow_neg_eigval``, a key width that is not a multiple of 32 in
[32, 256], Hv not a multiple of Hk) goes to mlx-lm's own function.
"""

from __future__ import annotations

import importlib
from typing import Optional

import mlx.core as mx

import mlxkern as _mk

MODULES = ("mlx_lm.models.qwen3_5", "mlx_lm.models.qwen3_next")

_originals: dict = {}
_settings = {"chunked_min_tokens": 64, "chunk_size": 0}
_FLOATS = (mx.float32, mx.bfloat16, mx.float16)


def _takes(q, k, v, lower_bound, allow_neg_eigval) -> bool:
    if lower_bound is not None or allow_neg_eigval:
        return False
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        return False
    dk, hk, hv = k.shape[-1], k.shape[-2], v.shape[-2]
    return (32 <= dk <= 256 and dk % 32 == 0 and hk > 0 and hv % hk == 0
            and q.dtype in _FLOATS and k.dtype == q.dtype and v.dtype == q.dtype)


def _fallback():
    from mlx_lm.models import gated_delta

    return gated_delta.gated_delta_update


def gated_delta_update(q: mx.array, k: mx.array, v: mx.array, a: mx.array, b: mx.array,
                       A_log: mx.array, dt_bias: mx.array, state: Optional[mx.array] = None,
                       mask: Optional[mx.array] = None, *, use_kernel: bool = True,
                       lower_bound: Optional[float] = None, allow_neg_eigval: bool = False):
    """mlx-lm's ``gated_delta_update`` signature on mlxkern's kernels (``use_kernel`` is
    accepted and ignored: mlxkern's kernels have their backward passes, training included).
    Returns ``(y, state)`` as mlx-lm does: y in q's dtype, the state float32."""
    if not _takes(q, k, v, lower_bound, allow_neg_eigval):
        return _fallback()(q, k, v, a, b, A_log, dt_bias, state, mask, use_kernel=use_kernel,
                           lower_bound=lower_bound, allow_neg_eigval=allow_neg_eigval)
    if state is not None and state.dtype != mx.float32:
        state = state.astype(mx.float32)
    if mask is not None and mask.dtype != mx.bool_:
        mask = mask.astype(mx.bool_)
    threshold = _settings["chunked_min_tokens"]
    if threshold and q.shape[1] >= threshold:
        return tuple(_mk.gated_delta_update_chunked(q, k, v, a, b, A_log, dt_bias, state, mask,
                                                    _settings["chunk_size"]))
    return tuple(_mk.gated_delta_update(q, k, v, a, b, A_log, dt_bias, state, mask))


def patch(chunked_min_tokens: int = 64, chunk_size: int = 0, device: str = "auto") -> None:
    """Makes mlx-lm's Qwen3.5 / Qwen3-Next models use mlxkern's update.

    ``chunked_min_tokens``: calls with at least this many tokens take the chunked form (0: never;
    default 64). ``chunk_size``: the chunked form's chunk (0: its default, 32). ``device``:
    ``"auto"`` runs the kernels on the GPU when MLX's default device is the GPU and the loaded
    MLX has a GPU backend (Metal, CUDA), else on the CPU; ``"cpu"`` or ``"gpu"`` choose.
    Calling it again changes the settings; :func:`unpatch` restores mlx-lm's function."""
    if chunked_min_tokens < 0:
        raise ValueError(f"patch: chunked_min_tokens is {chunked_min_tokens}, expected >= 0")
    if chunk_size != 0 and (chunk_size % 16 != 0 or not 16 <= chunk_size <= 128):
        raise ValueError(f"patch: chunk_size is {chunk_size}, expected 0 or a multiple of 16 "
                         "in [16, 128]")
    if device == "auto":
        gpu = mx.default_device() == mx.gpu and _mk.gpu_backend() != "none"
        device = "gpu" if gpu else "cpu"
    if device not in ("cpu", "gpu"):
        raise ValueError(f"patch: device is {device!r}, expected 'auto', 'cpu' or 'gpu'")
    _mk.set_default_device(device)
    _settings.update(chunked_min_tokens=chunked_min_tokens, chunk_size=chunk_size)
    modules = {}
    for name in MODULES:  # all imported before any is patched
        try:
            modules[name] = importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"patch: mlx-lm's {name} cannot be imported ({e}); mlxkern.mlx_lm "
                              "patches an installed mlx-lm: pip install mlx-lm") from e
    for name, module in modules.items():
        if name not in _originals:
            _originals[name] = module.gated_delta_update
        module.gated_delta_update = gated_delta_update


def unpatch() -> None:
    """Restores mlx-lm's own ``gated_delta_update`` in every patched module."""
    for name, original in list(_originals.items()):
        importlib.import_module(name).gated_delta_update = original
        del _originals[name]


def is_patched() -> bool:
    """Whether :func:`patch` is in effect."""
    return bool(_originals)


class patched:
    """``with mlxkern.mlx_lm.patched(): ...``: :func:`patch` for the block (same arguments),
    restoring the previous state after."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def __enter__(self):
        self.was = is_patched()
        self.settings = dict(_settings)
        patch(**self.kwargs)
        return self

    def __exit__(self, *exc):
        if self.was:
            _settings.update(self.settings)
        else:
            unpatch()
        return False
