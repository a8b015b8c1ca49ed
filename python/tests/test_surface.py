"""The package's surface against the C ABI and its stubs: every function of include/mlxkern.h
has its Python call (or is one the package has no use for: handles, host exchange, locking,
which mx.array and the package do themselves), and _ext.pyi declares exactly the compiled
module's names."""

from __future__ import annotations

import ast
import os
import re
import unittest

import mlxkern
from mlxkern import _ext

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
HEADER = os.path.join(ROOT, "include", "mlxkern.h")

# C functions without a Python counterpart of the same name, and why.
NOT_BOUND = {
    # arrays are mx.array: made, read, converted and evaluated by MLX itself
    "array_new", "array_zeros", "array_free", "array_ndim", "array_shape", "array_dtype",
    "array_nbytes", "array_eval", "array_read", "array_astype",
    # the exchange the package does for every argument and result
    "array_from_mlx", "array_to_mlx", "mlx_array_free",
    # Python calls hold the GIL; the package builds no graph on other threads
    "mlx_lock", "mlx_unlock",
    # errors are exceptions carrying the message
    "last_error",
}
RENAMED = {"get_memory_limit": "memory_limit",
           "gated_delta_update_pool_chunked": "gated_delta_update_pool",  # chunk_size=...
           "gated_delta_update_packed_chunked": "gated_delta_update_packed"}


@unittest.skipUnless(os.path.exists(HEADER), "run from the repository")
class Surface(unittest.TestCase):
    def test_every_c_function_has_its_python_call(self):
        with open(HEADER) as f:
            names = re.findall(r"^\S.*?\bmlxk_(\w+)\(", f.read(), re.M)
        self.assertGreater(len(names), 40)
        missing = []
        for name in names:
            if name in NOT_BOUND:
                continue
            py = RENAMED.get(name, name)
            if not callable(getattr(mlxkern, py, None)) and py != "status_name":
                missing.append(name)
            if not hasattr(_ext, name if name != "get_memory_limit" else "memory_limit"):
                missing.append("_ext." + name)
        self.assertEqual(missing, [])

    def test_stubs_match_the_module(self):
        with open(os.path.join(os.path.dirname(_ext.__file__), "_ext.pyi")) as f:
            tree = ast.parse(f.read())
        declared = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        declared |= {t.id for n in tree.body if isinstance(n, ast.AnnAssign)
                     for t in [n.target] if isinstance(t, ast.Name)}
        public = {n for n in dir(_ext) if not n.startswith("__")}
        self.assertEqual(declared, public)

    def test_public_calls_have_docstrings(self):
        for name in mlxkern.__all__:
            obj = getattr(mlxkern, name)
            if callable(obj) and not isinstance(obj, type(_ext.GLM52Layout)):
                self.assertTrue((obj.__doc__ or "").strip(), name)


if __name__ == "__main__":
    unittest.main()
