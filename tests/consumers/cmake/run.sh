#!/usr/bin/env bash
# The CMake consumer (scripts/test/consumers.sh cmake): in WORK, outside the repository,
#   1. `make install PREFIX=WORK/prefix` (the bundled install: the library and its private MLX);
#   2. a fresh CMake project (project/: a C++ engine on MLX) with find_package(mlxkern) and
#      target mlxkern::mlx, nothing else: it makes reference.c's inputs as MLX arrays, hands them
#      to mlxkern (from_mlx), runs one decode step and one gated norm and prints the results;
#      checked to load libmlxkern and libmlx from PREFIX only; then the same with PREFIX moved
#      (the package locates itself);
#   3. the same project with add_subdirectory(ROOT) instead, built against the MLX it finds with
#      find_package(MLX) (this repository's .venv): its output must equal step 2's.
# Its stdout is step 2's results (compared with reference.c's by the driver).
# Environment (from the driver): ROOT, WORK, LIBDIR.
set -euo pipefail
: "${ROOT:?}" "${WORK:?}" "${LIBDIR:?}"
say() { echo "cmake consumer: $*" >&2; }
fail() { say "FAIL: $*"; exit 1; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

[ "$(uname -s)" = Linux ] || { say "SKIP: the install script is Linux-only"; exit 3; }
CMAKE=$("$ROOT/scripts/setup/cmake.sh") || fail "no cmake"
PY=$ROOT/.venv/bin/python3
[ -x "$PY" ] || fail "$PY not found: make bootstrap"
case "$WORK/" in "$ROOT"/*) fail "WORK ($WORK) is inside the repository" ;; esac

# 1. Install.
t=$(now)
make -s -C "$ROOT" install PREFIX="$WORK/prefix" LIBDIR="$LIBDIR" >&2 || fail "make install"
say "installed into $WORK/prefix [$(since "$t")]"

# 2. find_package(mlxkern).
build_project() {  # $1: build folder; the rest: cmake arguments
  local dir=$1
  shift
  mkdir -p "$WORK/src"
  cp "$ROOT/tests/consumers/cmake/project/CMakeLists.txt" "$ROOT/tests/consumers/cmake/project/consumer.cpp" "$WORK/src/"
  "$CMAKE" -S "$WORK/src" -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log" >&2; fail "cmake configure ($*)"; }
  "$CMAKE" --build "$dir" -j2 >"$dir.build.log" 2>&1 || { tail -n 40 "$dir.build.log" >&2; fail "cmake build ($*)"; }
}
t=$(now)
unset LD_LIBRARY_PATH MLX_DIR
build_project "$WORK/build" -DCMAKE_PREFIX_PATH="$WORK/prefix"
libs=$(ldd "$WORK/build/consumer")
for name in libmlxkern.so libmlx.so; do
  echo "$libs" | grep "$name" | grep -q "=> $WORK/prefix/" ||
    fail "$name is not loaded from $WORK/prefix: $(echo "$libs" | grep "$name" || echo 'not found')"
done
grep -q -- "-std=gnu++20\|-std=c++20" "$WORK/build/CMakeFiles/consumer.dir/flags.make" ||
  fail "mlxkern::mlx did not bring C++20 (flags: $(grep CXX_FLAGS "$WORK/build/CMakeFiles/consumer.dir/flags.make"))"
"$WORK/build/consumer" >"$WORK/find_package.out" || fail "the find_package consumer failed"
say "find_package(mlxkern) + mlxkern::mlx: built and ran, libmlxkern and libmlx from PREFIX [$(since "$t")]"

# The installed tree moved: the package and the libraries locate themselves.
t=$(now)
mv "$WORK/prefix" "$WORK/moved"
rm -rf "$WORK/build"*
build_project "$WORK/build" -DCMAKE_PREFIX_PATH="$WORK/moved"
"$WORK/build/consumer" >"$WORK/moved.out" || fail "the consumer of the moved install failed"
cmp -s "$WORK/find_package.out" "$WORK/moved.out" || fail "the moved install's results differ"
PKG_CONFIG_PATH=$WORK/moved/lib/pkgconfig pkg-config --cflags --libs mlxkern-mlx | grep -q "$WORK/moved/" ||
  fail "mlxkern-mlx.pc does not follow the moved PREFIX"
say "the install moved elsewhere: found there (CMake and pkg-config), same results [$(since "$t")]"

# 3. add_subdirectory of the sources, against the MLX find_package(MLX) finds. The cargo target
#    folder is the repository's (the .venv's MLX is build.rs's default: nothing rebuilds).
t=$(now)
build_project "$WORK/sub" -DMLXKERN_SOURCE_DIR="$ROOT" \
  -DMLX_DIR="$("$PY" -m mlx --cmake-dir)/share/cmake/MLX" -DMLXKERN_CARGO_TARGET_DIR="$(dirname "$LIBDIR")"
"$WORK/sub/consumer" >"$WORK/sub.out" || fail "the add_subdirectory consumer failed"
cmp -s "$WORK/find_package.out" "$WORK/sub.out" || fail "the add_subdirectory consumer's results differ"
say "add_subdirectory(mlxkern) against find_package(MLX): same results [$(since "$t")]"

cat "$WORK/find_package.out"
