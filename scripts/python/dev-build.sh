#!/usr/bin/env bash
# Builds the mlxkern wheel from this checkout and installs it (without dependencies) into
# build/py-site for the Python suite, which runs with .venv's Python and MLX:
#   PYTHONPATH=build/py-site .venv/bin/python3 -m unittest discover -s python/tests
# The build environment (build/pyenv: nanobind, scikit-build-core, cmake, build) sees .venv's
# packages through a .pth file, so the extension compiles against .venv's MLX, the one the
# crate's build links. MLXKERN_LIB: the libmlxkern.so to bundle (default target/release's,
# built by `cargo build --release --lib` when missing).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
PYENV=build/pyenv
VENV_SITE=$(.venv/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -x $PYENV/bin/python3 ] || ! $PYENV/bin/python3 -c 'import nanobind, scikit_build_core, cmake' 2>/dev/null; then
  echo "python: making the build environment $PYENV" >&2
  .venv/bin/python3 -m venv $PYENV
  $PYENV/bin/pip install --quiet --disable-pip-version-check \
    "nanobind==3.1.0" "scikit-build-core>=0.10" "cmake>=3.25,<5" build
fi
PYENV_SITE=$($PYENV/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if ! $PYENV/bin/python3 -c 'import mlx.core' 2>/dev/null; then
  echo "$VENV_SITE" > "$PYENV_SITE/_mlxkern_dotvenv.pth"
fi
LIB=${MLXKERN_LIB:-$ROOT/target/release/libmlxkern.so}
if [ -z "${MLXKERN_LIB:-}" ]; then
  cargo build --release --lib
fi
rm -rf build/wheel build/py-site
$PYENV/bin/pip wheel --quiet --disable-pip-version-check --no-build-isolation --no-deps \
  -w build/wheel ./python -C cmake.define.MLXKERN_LIB="$LIB"
$PYENV/bin/pip install --quiet --disable-pip-version-check --no-deps --target build/py-site \
  build/wheel/mlxkern-*.whl
ls build/wheel/
