"""Runs every tests/oracle/test_*.py with unittest (verbosity 2); exits non-zero on failure.

Invoked as `.venv/bin/python3 tests/oracle/run.py` from the repository root (`make test-oracle`).
Set MLXK_ORACLE_SEED to replay a failing run's random inputs, MLXKERN_LIB to test another build
of the library.
"""

import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    sys.path.insert(0, HERE)
    suite = unittest.defaultTestLoader.discover(HERE, pattern="test_*.py", top_level_dir=HERE)
    start = time.monotonic()
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    print(f"oracle tests: {result.testsRun} run in {time.monotonic() - start:.1f} s")
    if result.testsRun == 0:
        print("no oracle tests found", file=sys.stderr)
        return 1
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
