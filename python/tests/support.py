"""Test support: mlx-lm's modules without running mlx_lm/__init__.py.

The project's environment installs mlx-lm without its dependencies (its __init__ imports
huggingface_hub and transformers for loading and conversion, which these tests do not use), so
a bare package module is registered over the installed folder when the full import fails."""

from __future__ import annotations

import importlib.util
import os
import sys
import types
import unittest

# mlx-lm's trainer imports rich (its terminal UI) and transformers (datasets, tokenizers): the
# pinned set scripts/python/trainer-deps.sh installs into build/py-deps, searched after .venv's
# own packages so that .venv's numpy and MLX stay the ones imported.
PY_DEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "py-deps")
if os.path.isdir(PY_DEPS) and os.path.abspath(PY_DEPS) not in map(os.path.abspath, sys.path):
    sys.path.append(os.path.abspath(PY_DEPS))


def import_mlx_lm():
    if "mlx_lm" in sys.modules:
        return sys.modules["mlx_lm"]
    try:
        import mlx_lm

        return mlx_lm
    except ImportError:
        pass
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        raise unittest.SkipTest("mlx-lm is not installed")
    package = types.ModuleType("mlx_lm")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["mlx_lm"] = package
    return package


def import_lora_linear():
    """mlx_lm.tuner.lora.LoRALinear. mlx_lm/tuner/__init__.py imports the trainer, whose
    terminal UI needs `rich` (build/py-deps, or absent): without it a bare package is
    registered over the tuner folder, as for mlx_lm itself."""
    import_mlx_lm()
    try:
        import mlx_lm.tuner  # noqa: F401
    except ImportError:
        for name in [n for n in sys.modules if n.startswith("mlx_lm.tuner")]:
            del sys.modules[name]
        spec = importlib.util.find_spec("mlx_lm.tuner")
        package = types.ModuleType("mlx_lm.tuner")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_lm.tuner"] = package
    from mlx_lm.tuner.lora import LoRALinear

    return LoRALinear


def import_trainer():
    """mlx_lm.tuner.trainer (train, TrainingArgs) and mlx_lm.tuner.callbacks.TrainingCallback,
    or SkipTest naming the script that installs what they import."""
    import_mlx_lm()
    try:
        from mlx_lm.tuner.callbacks import TrainingCallback
        from mlx_lm.tuner.trainer import TrainingArgs, train
    except ImportError as e:
        raise unittest.SkipTest(f"mlx-lm's trainer needs {e.name}: run "
                                "scripts/python/trainer-deps.sh (make test-python does)")
    return train, TrainingArgs, TrainingCallback


import_mlx_lm()
