#!/usr/bin/env bash
# mlx-c (MLX's C API) as a shared library, for the binding tests that load a real mlx-c host in
# the same process as mlxkern (scripts/test/bun.sh, scripts/test/swift.sh). mlx-c is a test
# fixture: built here from ../shared/vendor/mlx-c (the development checkout's vendored tree,
# never copied into the repository) against the .venv's MLX, once, into build/mlx-c-shared.
#
#   scripts/setup/mlx-c.sh        prints the path of libmlxc.so (built on the first call)
#
# Exit status: 0 with the path on stdout; 3 when the mlx-c sources are absent (the reason on
# stdout: callers skip those tests and say why); 1 on any other failure (logs under
# build/mlx-c-shared/). Environment: MLXC_SRC (mlx-c sources; default ../shared/vendor/mlx-c),
# BUILD (default build).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
MLXC_SRC=${MLXC_SRC:-$ROOT/../shared/vendor/mlx-c}
BUILD=${BUILD:-$ROOT/build}
OUT=$BUILD/mlx-c-shared
PY=$ROOT/.venv/bin/python3
fail() {
  echo "mlxc-shared: $*" >&2
  exit 1
}

if [ ! -f "$MLXC_SRC/CMakeLists.txt" ]; then
  echo "the mlx-c sources ($MLXC_SRC) are not here: they come with the development checkout's"
  echo "../shared/vendor/mlx-c, a test fixture never copied into the repository"
  exit 3
fi
case "$(uname -s)" in
  Darwin) LIBFILE=libmlxc.dylib ;;
  *) LIBFILE=libmlxc.so ;;
esac
if [ -f "$OUT/$LIBFILE" ]; then
  echo "$OUT/$LIBFILE"
  exit 0
fi
mkdir -p "$BUILD"
exec 9>"$OUT.lock"
flock 9 # one build at a time; a second caller finds the library made
if [ -f "$OUT/$LIBFILE" ]; then
  echo "$OUT/$LIBFILE"
  exit 0
fi

[ -x "$PY" ] || fail "$PY not found: run make bootstrap"
MLX=$("$PY" -m mlx --cmake-dir) || fail "the .venv has no MLX: run make bootstrap"
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
  [ -x "$ROOT/.venv/bin/cmake" ] ||
    "$PY" -m pip install --quiet --disable-pip-version-check "cmake>=3.24,<5" >&2 ||
    fail "no cmake, and pip could not install it into the .venv"
  CMAKE=$ROOT/.venv/bin/cmake
fi
mkdir -p "$OUT"
echo "mlxc-shared: building mlx-c (shared) into $OUT (once)" >&2
"$CMAKE" -S "$MLXC_SRC" -B "$OUT" -DBUILD_SHARED_LIBS=ON -DMLX_C_USE_SYSTEM_MLX=ON \
  -DCMAKE_PREFIX_PATH="$MLX" -DMLX_C_BUILD_EXAMPLES=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON \
  -DCMAKE_BUILD_TYPE=Release >"$OUT/configure.log" 2>&1 ||
  fail "mlx-c configure failed (see $OUT/configure.log)"
"$CMAKE" --build "$OUT" -j"${MLXC_JOBS:-2}" >"$OUT/build.log" 2>&1 ||
  fail "mlx-c build failed (see $OUT/build.log)"
[ -f "$OUT/$LIBFILE" ] || fail "the build made no $OUT/$LIBFILE (see $OUT/build.log)"
echo "$OUT/$LIBFILE"
