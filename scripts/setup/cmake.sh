#!/usr/bin/env bash
# Prints the path of a cmake >= 3.25 (what MLX's own CMakeLists needs; mlxkern's need 3.16):
# the one on PATH, else the project's .venv/bin/cmake, installed there from PyPI
# (pip's `cmake` package) when absent. Progress goes to stderr.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
new_enough() {
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$v" ] && awk -v v="$v" 'BEGIN { split(v, p, "."); exit !(p[1] > 3 || (p[1] == 3 && p[2] >= 25)) }'
}
if command -v cmake >/dev/null && new_enough "$(command -v cmake)"; then
  command -v cmake
  exit 0
fi
CMAKE=$ROOT/.venv/bin/cmake
if [ ! -x "$CMAKE" ] || ! new_enough "$CMAKE"; then
  [ -x "$ROOT/.venv/bin/python3" ] || { echo "find-cmake: no cmake and no .venv (make bootstrap)" >&2; exit 1; }
  echo "find-cmake: installing cmake from PyPI into .venv" >&2
  "$ROOT/.venv/bin/python3" -m pip install --quiet --disable-pip-version-check "cmake>=3.25,<5" >&2
fi
echo "$CMAKE"
