#!/usr/bin/env bash
# mlxkern against a second MLX and in the host-MLX link mode (docs/DESIGN.md §2.2, "Link
# modes"), run by `make test-host-mlx` (part of `make test`):
#   1. .venv-mlx-0.31.1 with mlx[cpu]==0.31.1 (scripts/bootstrap.sh --mlx 0.31.1);
#   2. the library built against it (CARGO_TARGET_DIR=target/mlx031);
#   3. the C ABI suite (tests/c/run.sh) and the interop suites (scripts/test/interop.sh: the C++
#      host under ASan, dlclose and a second libmlx, mlx-c where its sources are) on MLX 0.31.1;
#   4. engines that bring their own MLX through CMake, for MLX 0.31.1 and 0.32.4 (pip wheels):
#      `scripts/package/install.sh` in host-MLX mode (MLXKERN_MLX=host: no MLX copied), then tests/interop/cmake
#      (find_package(MLX), find_package(mlxkern)) builds the C++ interop host twice, on
#      mlxkern::shared (libmlxkern.so linking the wheel's libmlx) and on mlxkern::static
#      (libmlxkern.a), both under ASan; each checked to load one libmlx, the wheel's; and
#      find_package(mlxkern) checked to refuse the other version's MLX;
#   5. an engine on MLX 0.31.1 built from source as a static library (CPU only; the sources of
#      ../shared/vendor/mlx-swift/Source/Cmlx/mlx, with the fmt and json copies beside them),
#      mlxkern built against it (MLXKERN_LINK_MLX=none) and installed in host-MLX mode, the
#      interop host linked with mlxkern::static and MLX statically, run under ASan (and, where
#      mlx-swift's mlx-c is, the C host on mlx-c and examples/c/mlxc_decode.c, built with mlx-c
#      against that MLX), then the same MLX under add_subdirectory(mlxkern). Skipped, with
#      the reason, where those sources are absent. MLX's build (once, cached in
#      build/host-mlx/mlx-0.31.1-static) needs Debian's BLAS/LAPACK headers, installed here
#      with apt-get when missing (as root).
#
# Environment: CC, CXX, CARGO, BUILD (default build), MLX_SRC (the MLX source tree of step 5;
# default ../shared/vendor/mlx-swift/Source/Cmlx/mlx), MLXC031_SRC (mlx-c sources for MLX 0.31.1;
# default ../shared/vendor/mlx-swift/Source/Cmlx/mlx-c), MLXK_HOST_MLX_STATIC=0 (skip step 5).
# Needs: cargo, g++, python3 (venv, pip), binutils, cmake (else pip's, into .venv).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-cc}
CXX=${CXX:-c++}
CARGO=${CARGO:-cargo}
OUT=${BUILD:-$ROOT/build}/host-mlx
MLX_SRC=${MLX_SRC:-$ROOT/../shared/vendor/mlx-swift/Source/Cmlx/mlx}
export ASAN_OPTIONS=detect_leaks=1:halt_on_error=1

fail() {
  echo "FAIL: test-host-mlx: $*" >&2
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }
[ "$(uname -s)" = Linux ] || fail "runs on Linux"
[ -x "$ROOT/.venv/bin/python3" ] || fail ".venv not found: make bootstrap"
mkdir -p "$OUT"
CMAKE=$("$ROOT/scripts/setup/cmake.sh") || fail "no cmake"
total=$(now)

# Builds the library against MLX_DIR=$2 into target folder $1 (extra environment after);
# a new folder is seeded with target/debug's compiled dependencies (they do not depend on MLX).
cargo_build() {
  local dir=$1 mlx=$2
  shift 2
  if [ ! -d "$ROOT/$dir/debug/deps" ] && [ -d "$ROOT/target/debug/deps" ]; then
    mkdir -p "$ROOT/$dir/debug"
    for part in build deps .fingerprint; do cp -a "$ROOT/target/debug/$part" "$ROOT/$dir/debug/"; done
  fi
  (cd "$ROOT" && env MLX_DIR="$mlx" CARGO_TARGET_DIR="$ROOT/$dir" "$@" "$CARGO" build --lib --quiet) ||
    fail "cargo build against $mlx"
}

# The interop host through CMake against MLX's CMake folder $1 and mlxkern install $2 (build
# folder $3); runs each host built, checking the loaded libmlx is $4 (or none: statically linked).
cmake_hosts() {
  local mlx_cmake=$1 prefix=$2 build=$3 expect=$4 host libs count
  shift 4
  rm -rf "$build"
  "$CMAKE" -S "$ROOT/tests/interop/cmake" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="$(command -v "$CXX")" -DCMAKE_C_COMPILER="$(command -v "$CC")" \
    -DMLX_DIR="$mlx_cmake" -DCMAKE_PREFIX_PATH="$prefix" "$@" >"$build.configure.log" 2>&1 ||
    { cat "$build.configure.log" >&2; fail "tests/interop/cmake does not configure ($mlx_cmake, $prefix)"; }
  "$CMAKE" --build "$build" -j2 >"$build.build.log" 2>&1 ||
    { tail -n 40 "$build.build.log" >&2; fail "tests/interop/cmake does not build ($mlx_cmake, $prefix)"; }
  for host in "$build"/host_cpp_shared "$build"/host_cpp_static "$build"/host_mlxc "$build"/mlxc_decode; do
    [ -x "$host" ] || continue
    libs=$(ldd "$host")
    count=$(echo "$libs" | grep -c 'libmlx\.so' || true)
    if [ "$expect" = none ]; then
      [ "$count" -eq 0 ] || fail "$host loads a libmlx, but its MLX is linked statically: $libs"
      if echo "$libs" | grep -q libmlxkern; then fail "$host loads libmlxkern.so; expected libmlxkern.a"; fi
    else
      [ "$count" -eq 1 ] &&
        [ "$(realpath "$(echo "$libs" | awk '/libmlx\.so/ { print $3 }')")" = "$(realpath "$expect/libmlx.so")" ] ||
        fail "$host does not load exactly one libmlx, $expect/libmlx.so: $(echo "$libs" | grep mlx)"
      case "$host" in
        *_static)
          if echo "$libs" | grep -q libmlxkern; then fail "$host loads libmlxkern.so; expected libmlxkern.a"; fi ;;
        *)
          if ! echo "$libs" | grep -q "libmlxkern.so.* => $prefix/lib/"; then
            fail "$host does not load $prefix/lib's libmlxkern"
          fi ;;
      esac
    fi
    args=()
    case "$host" in *mlxc_decode) args=(8) ;; esac
    "$host" "${args[@]}" >"$host.log" 2>&1 || { tail -n 30 "$host.log" >&2; fail "$(basename "$host") ($prefix)"; }
    if grep -q "Sanitizer" "$host.log"; then cat "$host.log" >&2; fail "sanitizer report from $host"; fi
    echo "PASS: $(basename "$host") (find_package(MLX) + find_package(mlxkern), ASan): $(tail -n 1 "$host.log")"
  done
}

# 1. The second MLX.
start=$(now)
MLX031=$("$ROOT/scripts/bootstrap.sh" --mlx 0.31.1) || fail "scripts/bootstrap.sh --mlx 0.31.1"
MLX032=$("$ROOT/.venv/bin/python3" -m mlx --cmake-dir)
echo "PASS: .venv-mlx-0.31.1 ($MLX031) [$(since "$start")]"

# 2. The library against MLX 0.31.1.
start=$(now)
cargo_build target/mlx031 "$MLX031"
LIB031=$ROOT/target/mlx031/debug
readelf -d "$LIB031/libmlxkern.so" | grep -q "$(cd "$MLX031/lib" && pwd -P)" ||
  fail "$LIB031/libmlxkern.so does not link $MLX031/lib/libmlx.so"
echo "PASS: built against MLX 0.31.1 (target/mlx031) [$(since "$start")]"

# 3. The C ABI and interop suites on MLX 0.31.1. The wheel's libmlx finds its BLAS/LAPACK in
#    ../../mlx_cpu.libs through its RPATH, but mlx[cpu] 0.31.1's liblapack has no RPATH of its
#    own (0.32.4's has $ORIGIN), so GNU ld, linking a program against libmlxkern, cannot find
#    liblapack's libgfortran (the loader can: libmlx's DT_RPATH covers it). ld also searches
#    LD_LIBRARY_PATH: that folder, which holds nothing but the wheel's own libraries.
CPU_LIBS=$(cd "$MLX031/../mlx_cpu.libs" && pwd)
start=$(now)
LD_LIBRARY_PATH=$CPU_LIBS CC=$CC CXX=$CXX LIBDIR=$LIB031 BUILD=$OUT/0.31.1 "$ROOT/tests/c/run.sh" ||
  fail "tests/c on MLX 0.31.1"
echo "PASS: tests/c on MLX 0.31.1 [$(since "$start")]"
start=$(now)
# mlx-c for MLX 0.31.1 is the one mlx-swift pins with it (v0.6.0; ../shared/vendor/mlx-c is
# newer, for MLX 0.32).
LD_LIBRARY_PATH=$CPU_LIBS CC=$CC CXX=$CXX LIBDIR=$LIB031 MLX_DIR=$MLX031 BUILD=$OUT/0.31.1 \
  MLXC_SRC=${MLXC031_SRC:-$ROOT/../shared/vendor/mlx-swift/Source/Cmlx/mlx-c} \
  "$ROOT/scripts/test/interop.sh" || fail "scripts/test/interop.sh on MLX 0.31.1"
echo "PASS: scripts/test/interop.sh on MLX 0.31.1 [$(since "$start")]"

# 4. Engines with their own MLX (pip wheels) through CMake, host-MLX installs.
for pair in "0.31.1 $MLX031 $LIB031" "0.32.4 $MLX032 $ROOT/target/debug"; do
  read -r version mlx libdir <<<"$pair"
  start=$(now)
  [ -f "$libdir/libmlxkern.a" ] || fail "$libdir/libmlxkern.a not found (cargo build --lib)"
  prefix=$OUT/$version/prefix
  rm -rf "$prefix"
  MLXKERN_MLX=host MLX_DIR=$mlx LIBDIR=$libdir "$ROOT/scripts/package/install.sh" "$prefix" >/dev/null ||
    fail "scripts/package/install.sh in host-MLX mode against MLX $version"
  [ ! -e "$prefix/lib/mlxkern" ] || fail "the host-MLX install copied an MLX"
  cmake_hosts "$mlx/share/cmake/MLX" "$prefix" "$OUT/$version/cmake-hosts" "$mlx/lib"
  echo "PASS: MLX $version engines (pip, shared libmlx) on host-MLX mlxkern, shared and static [$(since "$start")]"
done
# The package refuses an MLX other than the one it was built against.
start=$(now)
refused=$OUT/0.31.1/refused
rm -rf "$refused"
if "$CMAKE" -S "$ROOT/tests/interop/cmake" -B "$refused" -DMLX_DIR="$MLX032/share/cmake/MLX" \
  -DCMAKE_PREFIX_PATH="$OUT/0.31.1/prefix" >"$refused.log" 2>&1; then
  fail "find_package(mlxkern) built against MLX 0.31.1 accepted MLX 0.32.4"
fi
tr -s ' \n' '  ' <"$refused.log" | grep -q "built against MLX 0.31.1, but this project's MLX is 0.32.4" ||
  { cat "$refused.log" >&2; fail "find_package(mlxkern) refused MLX 0.32.4 without saying why"; }
echo "PASS: find_package(mlxkern) built against MLX 0.31.1 refuses MLX 0.32.4, naming both [$(since "$start")]"

# 5. An engine on MLX built from source, statically.
if [ "${MLXK_HOST_MLX_STATIC:-1}" = 0 ]; then
  echo "SKIP: MLX built from source (MLXK_HOST_MLX_STATIC=0)"
elif [ ! -f "$MLX_SRC/mlx/mlx.h" ] || [ ! -d "$MLX_SRC/../fmt" ] || [ ! -d "$MLX_SRC/../json" ]; then
  echo "SKIP: an engine on MLX built from source (static): the sources ($MLX_SRC, with ../fmt"
  echo "      and ../json beside them) are not here (they come with the development checkout's"
  echo "      ../shared/vendor/mlx-swift, a test fixture never copied into the repository); the"
  echo "      pip MLX engines above ran"
else
  STATIC=$OUT/mlx-0.31.1-static
  if [ ! -f "$STATIC/prefix/lib/libmlx.a" ]; then
    if [ ! -f /usr/include/lapacke.h ] || ! ls /usr/include/cblas.h /usr/include/*/cblas.h >/dev/null 2>&1; then
      [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null ||
        fail "MLX's build needs BLAS/LAPACK headers: apt-get install libblas-dev liblapack-dev liblapacke-dev"
      apt-get install -y --no-install-recommends libblas-dev liblapack-dev liblapacke-dev >"$OUT/apt.log" 2>&1 ||
        fail "apt-get install libblas-dev liblapack-dev liblapacke-dev (see $OUT/apt.log)"
    fi
    start=$(now)
    echo "building MLX 0.31.1 from $MLX_SRC (static, CPU only; once) into $STATIC"
    # MLX fetches fmt and json at configure time; the copies beside the sources stand in (the
    # json copy under the single_include/nlohmann path MLX's build names).
    shim=$STATIC/json/single_include/nlohmann
    mkdir -p "$shim"
    ln -sfn "$(cd "$MLX_SRC/../json/include/nlohmann" && pwd)" "$shim/nlohmann"
    ln -sf "$(cd "$MLX_SRC/../json/include/nlohmann" && pwd)/json.hpp" "$shim/json.hpp"
    "$CMAKE" -S "$MLX_SRC" -B "$STATIC/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
      -DMLX_BUILD_TESTS=OFF -DMLX_BUILD_EXAMPLES=OFF -DMLX_BUILD_BENCHMARKS=OFF \
      -DMLX_BUILD_PYTHON_BINDINGS=OFF -DMLX_BUILD_PYTHON_STUBS=OFF -DMLX_BUILD_GGUF=OFF \
      -DMLX_BUILD_METAL=OFF -DMLX_BUILD_CUDA=OFF -DMLX_USE_CCACHE=OFF \
      -DFETCHCONTENT_FULLY_DISCONNECTED=ON -DFETCHCONTENT_SOURCE_DIR_JSON="$STATIC/json" \
      -DFETCHCONTENT_SOURCE_DIR_FMT="$(cd "$MLX_SRC/../fmt" && pwd)" \
      -DCMAKE_INSTALL_PREFIX="$STATIC/prefix" >"$STATIC/configure.log" 2>&1 ||
      fail "MLX configure (see $STATIC/configure.log)"
    "$CMAKE" --build "$STATIC/build" -j2 >"$STATIC/build.log" 2>&1 || fail "MLX build (see $STATIC/build.log)"
    "$CMAKE" --install "$STATIC/build" >>"$STATIC/build.log" 2>&1 || fail "MLX install (see $STATIC/build.log)"
    echo "MLX 0.31.1 from source, static: built in $(since "$start")" | tee "$STATIC/build-time.txt"
  else
    echo "MLX 0.31.1 from source, static: $STATIC/prefix (cached; $(cat "$STATIC/build-time.txt" 2>/dev/null || echo 'build time not recorded'))"
  fi
  start=$(now)
  cargo_build target/mlx031-static "$STATIC/prefix" MLXKERN_LINK_MLX=none
  prefix=$OUT/static/prefix
  rm -rf "$prefix"
  MLXKERN_MLX=host MLX_DIR=$STATIC/prefix LIBDIR=$ROOT/target/mlx031-static/debug \
    "$ROOT/scripts/package/install.sh" "$prefix" >/dev/null 2>&1 || fail "scripts/package/install.sh in host-MLX mode against the static MLX"
  [ -f "$prefix/lib/libmlxkern.a" ] && [ ! -e "$prefix/lib/libmlxkern.so" ] ||
    fail "the install against a static MLX should hold libmlxkern.a only"
  # With mlx-c (v0.6.0, mlx-swift's, for MLX 0.31.1) where its sources are: the C hosts too.
  MLXC031=${MLXC031_SRC:-$ROOT/../shared/vendor/mlx-swift/Source/Cmlx/mlx-c}
  mlxc=()
  if [ -f "$MLXC031/CMakeLists.txt" ]; then mlxc=(-DHOST_MLXC_SRC="$MLXC031"); else
    echo "SKIP: the C hosts on mlx-c with the static MLX: mlx-c's sources ($MLXC031) are not here"; fi
  cmake_hosts "$STATIC/prefix/share/cmake/MLX" "$prefix" "$OUT/static/cmake-hosts" none "${mlxc[@]}"
  [ -x "$OUT/static/cmake-hosts/host_cpp_static" ] || fail "no static host was built"
  if [ ${#mlxc[@]} -gt 0 ] && [ ! -x "$OUT/static/cmake-hosts/host_mlxc" ]; then fail "no mlx-c host was built"; fi
  # The same MLX taken by add_subdirectory of these sources (tests/consumers/cmake's engine):
  # the parent's static `mlx` target decides the mode (cargo's folder: the one above, unchanged).
  sub=$OUT/static/subdirectory
  rm -rf "$sub"
  mkdir -p "$sub/src"
  cp "$ROOT/tests/consumers/cmake/project/"* "$sub/src/"
  "$CMAKE" -S "$sub/src" -B "$sub/build" -DMLXKERN_SOURCE_DIR="$ROOT" \
    -DMLX_DIR="$STATIC/prefix/share/cmake/MLX" -DMLXKERN_CARGO_TARGET_DIR="$ROOT/target/mlx031-static" \
    >"$sub/configure.log" 2>&1 || { cat "$sub/configure.log" >&2; fail "add_subdirectory with a static MLX: configure"; }
  "$CMAKE" --build "$sub/build" -j2 >"$sub/build.log" 2>&1 ||
    { tail -n 30 "$sub/build.log" >&2; fail "add_subdirectory with a static MLX: build"; }
  if ldd "$sub/build/consumer" | grep -q mlx; then fail "the add_subdirectory engine loads a shared MLX or mlxkern"; fi
  "$CC" -std=c11 -I"$ROOT/include" "$ROOT/tests/consumers/reference.c" -L"$ROOT/target/debug" -lmlxkern \
    -Wl,-rpath,"$ROOT/target/debug" -o "$sub/reference" || fail "tests/consumers/reference.c does not build"
  "$sub/build/consumer" >"$sub/consumer.out" 2>/dev/null || fail "the add_subdirectory engine (static MLX) failed"
  cmp -s "$sub/consumer.out" <("$sub/reference") ||
    fail "the add_subdirectory engine on static MLX 0.31.1 differs from the C ABI on MLX 0.32.4"
  echo "PASS: add_subdirectory(mlxkern) under a static MLX 0.31.1: mlxkern::mlx is libmlxkern.a;" \
    "results bit-identical to reference.c's on MLX 0.32.4"
  echo "PASS: MLX 0.31.1 built from source (static) engine on host-MLX mlxkern (libmlxkern.a) [$(since "$start")]"
fi
echo "PASS: scripts/test/host-mlx.sh [$(since "$total") total]"
