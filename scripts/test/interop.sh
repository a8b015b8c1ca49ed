#!/usr/bin/env bash
# Hosts that keep their arrays in MLX and share them with mlxkern (docs/DESIGN.md §5, "Host
# arrays"):
#   1. tests/interop/host_cpp.cc, a C++ host on libmlx: zero copy, laziness, views, results
#      consumed by host ops, misuse, the MLX lock with a second host thread, MLX's autograd
#      through the kernels (ASan + LSan);
#   2. tests/interop/host_dlclose.cc: a lazy result evaluated and destroyed after the host
#      dlcloses mlxkern; a second copy of libmlx makes the exchange refuse;
#   3. tests/interop/host_mlxc.c, a C host on mlx-c through include/mlxkern_mlxc.h (ASan +
#      LSan), and the example examples/c/mlxc_decode.c (a Gated DeltaNet layer's decode loop on
#      mlx-c, states carried as mlx-c arrays, one mlx_eval per step; checked against a prefill
#      of the same tokens; ASan + LSan). mlx-c is a test fixture built here from
#      ../shared/vendor/mlx-c (never part of the repository); where that folder is absent this
#      part says so and is skipped.
#
# Environment: CXX, CC, LIBDIR (folder of libmlxkern.so; default target/debug), BUILD (default
# build), MLX_DIR (the MLX pip package folder the library in LIBDIR was built against; default
# the .venv's: scripts/test/host-mlx.sh runs this suite against a second MLX), MLXK_INTEROP_SEED
# (replay the random inputs), MLXC_SRC (mlx-c sources; default ../shared/vendor/mlx-c). Needs
# the library built, the .venv (make bootstrap), g++ >= 10.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CXX=${CXX:-c++}
CC=${CC:-cc}
LIBDIR=$(cd "${LIBDIR:-$ROOT/target/debug}" && pwd)
BUILD=${BUILD:-$ROOT/build}
OUT=$BUILD/interop
PY=$ROOT/.venv/bin/python3
MLXC_SRC=${MLXC_SRC:-$ROOT/../shared/vendor/mlx-c}
fail() {
  echo "FAIL: test-interop: $*" >&2
  exit 1
}
[ "$(uname -s)" = Linux ] || fail "runs on Linux (it reads /proc/self/maps)"
[ -x "$PY" ] || fail "$PY not found: run make bootstrap"
[ -f "$LIBDIR/libmlxkern.so" ] || fail "$LIBDIR/libmlxkern.so not found: cargo build --lib"
MLX=${MLX_DIR:-$("$PY" -m mlx --cmake-dir)}
[ -f "$MLX/lib/libmlx.so" ] || fail "$MLX/lib/libmlx.so not found (MLX_DIR: an MLX pip package folder)"
echo "== interop: MLX $(sed -n 's/^#define MLX_VERSION_[A-Z]* \([0-9]*\)$/\1/p' "$MLX/include/mlx/version.h" | paste -sd.) ($MLX), $LIBDIR"
mkdir -p "$OUT"
SAN=(-g -O1 -fsanitize=address -fno-omit-frame-pointer)
LINK=(-L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib")
export ASAN_OPTIONS=detect_leaks=1

echo "== interop: C++ host on libmlx"
"$CXX" -std=c++20 -Wall -Wextra -Werror "${SAN[@]}" -I"$ROOT/include" -isystem "$MLX/include" \
  "$ROOT/tests/interop/host_cpp.cc" "${LINK[@]}" -o "$OUT/host_cpp" || fail "host_cpp does not build"
"$OUT/host_cpp" || fail "host_cpp"

echo "== interop: dlclose with pending results; a second libmlx"
mkdir -p "$OUT/second-libmlx"
# Renamed: found by the symbols it defines, not by its file name.
cp "$MLX/lib/libmlx.so" "$OUT/second-libmlx/libMLXApp.so"
"$CXX" -std=c++20 -Wall -Wextra -Werror -g -O1 -I"$ROOT/include" -isystem "$MLX/include" \
  "$ROOT/tests/interop/host_dlclose.cc" -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib" -ldl \
  -o "$OUT/host_dlclose" || fail "host_dlclose does not build"
"$OUT/host_dlclose" "$LIBDIR/libmlxkern.so" "$OUT/second-libmlx/libMLXApp.so" || fail "host_dlclose"

echo "== interop: C host on mlx-c"
if [ ! -f "$MLXC_SRC/CMakeLists.txt" ]; then
  echo "SKIP: interop with mlx-c (tests/interop/host_mlxc.c, examples/c/mlxc_decode.c): its"
  echo "      sources ($MLXC_SRC) are not here (they come with the development checkout's"
  echo "      ../shared/vendor/mlx-c, a test fixture never copied into the repository); the C++"
  echo "      host tests above ran"
  exit 0
fi
CMAKE=$(command -v cmake || true)
if [ -z "$CMAKE" ]; then
  [ -x "$ROOT/.venv/bin/cmake" ] || "$PY" -m pip install --quiet --disable-pip-version-check "cmake>=3.24,<5"
  CMAKE=$ROOT/.venv/bin/cmake
fi
MLXC_BUILD=$BUILD/mlx-c-static
if [ ! -f "$MLXC_BUILD/libmlxc.a" ]; then
  echo "building mlx-c (static) into $MLXC_BUILD (once)"
  "$CMAKE" -S "$MLXC_SRC" -B "$MLXC_BUILD" -DMLX_C_USE_SYSTEM_MLX=ON -DCMAKE_PREFIX_PATH="$MLX" \
    -DMLX_C_BUILD_EXAMPLES=OFF -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DCMAKE_BUILD_TYPE=Release \
    >"$OUT/mlx-c-configure.log" 2>&1 || fail "mlx-c configure (see $OUT/mlx-c-configure.log)"
  "$CMAKE" --build "$MLXC_BUILD" -j2 >"$OUT/mlx-c-build.log" 2>&1 ||
    fail "mlx-c build (see $OUT/mlx-c-build.log)"
fi
"$CC" -std=c11 -Wall -Wextra -Werror "${SAN[@]}" -I"$ROOT/include" -I"$ROOT/examples/common" \
  -isystem "$MLXC_SRC" -c "$ROOT/tests/interop/host_mlxc.c" -o "$OUT/host_mlxc.o" ||
  fail "host_mlxc does not build"
"$CXX" "${SAN[@]}" "$OUT/host_mlxc.o" "$MLXC_BUILD/libmlxc.a" "${LINK[@]}" -o "$OUT/host_mlxc" ||
  fail "host_mlxc does not link"
"$OUT/host_mlxc" || fail "host_mlxc"

echo "== interop: examples/c/mlxc_decode.c (a layer's decode loop on mlx-c)"
"$CC" -std=c11 -Wall -Wextra -Werror "${SAN[@]}" -I"$ROOT/include" -isystem "$MLXC_SRC" \
  -c "$ROOT/examples/c/mlxc_decode.c" -o "$OUT/mlxc_decode.o" || fail "mlxc_decode does not build"
"$CXX" "${SAN[@]}" "$OUT/mlxc_decode.o" "$MLXC_BUILD/libmlxc.a" "${LINK[@]}" -lm -o "$OUT/mlxc_decode" ||
  fail "mlxc_decode does not link"
"$OUT/mlxc_decode" 8 || fail "mlxc_decode"
echo "PASS: scripts/test/interop.sh"
