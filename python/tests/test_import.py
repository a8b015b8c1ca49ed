"""Import-time refusal of a second MLX: a process holding two copies of libmlx (a copy of the
mlx package's libmlx loaded by path beside the one mlx.core uses) gets ImportError naming both
files when it imports mlxkern; with one copy the import succeeds and arrays go both ways."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

CHILD = r"""
import ctypes, os, sys
import mlx.core as mx
lib = os.path.join(os.path.dirname(mx.__file__), "lib", "libmlx.so")
if sys.argv[1] == "two":
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_LOCAL)
try:
    import mlxkern
except ImportError as e:
    print("IMPORT-ERROR", e)
    sys.exit(3)
y, s = mlxkern.gated_delta_update(*[mx.ones(sh) for sh in
    [(1, 2, 1, 32), (1, 2, 1, 32), (1, 2, 1, 8), (1, 2, 1), (1, 2, 1), (1,), (1,)]])
mx.eval(y, s)
print("OK", y.shape)
"""


@unittest.skipUnless(sys.platform.startswith("linux"), "the second copy is an ELF file")
class SecondMlx(unittest.TestCase):
    def run_child(self, *args):
        return subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True,
                              text=True, env=os.environ.copy(), timeout=120)

    def test_one_copy_imports(self):
        r = self.run_child("one")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("OK (1, 2, 1, 8)", r.stdout)

    def test_second_copy_refused(self):
        import mlx.core as mx

        lib = os.path.join(os.path.dirname(mx.__file__), "lib", "libmlx.so")
        with tempfile.TemporaryDirectory() as tmp:
            copy = os.path.join(tmp, "libmlx-copy.so")
            shutil.copy(lib, copy)
            r = self.run_child("two", copy)
        self.assertEqual(r.returncode, 3, r.stdout + r.stderr)
        self.assertIn("IMPORT-ERROR", r.stdout)
        self.assertIn("copies of libmlx are loaded", r.stdout)
        self.assertIn("libmlx-copy.so", r.stdout)


if __name__ == "__main__":
    unittest.main()
