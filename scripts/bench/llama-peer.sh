#!/usr/bin/env bash
# The llama.cpp peer of `make bench`: ggml's CPU GGML_OP_GATED_DELTA_NET, timed by
# benches/llama_peer.c on the same cases and inputs as benches/bench.c.
#
#   scripts/bench/llama-peer.sh            fetch + build ggml once (cached), then build the driver
#                                    $BUILD/bench/llama_peer; exit 0 when it is ready
#
# Sources: the llama-cpp-python 0.3.36 sdist from PyPI, which vendors llama.cpp (ggml 0.25.3),
# fetched with `pip download` into build/llama.cpp/. Only the ggml, ggml-base and ggml-cpu
# targets are built: CPU backend only (no CUDA, Metal, Vulkan or BLAS), Release, GGML_NATIVE
# (-march=native: the host's SIMD, AVX-512 where the CPU has it), OpenMP as in llama.cpp's
# default build, shared libraries. The build is kept in build/llama.cpp/ and reused while its
# stamp (version + options) matches; delete build/llama.cpp/ to rebuild.
#
# Without network (the download fails), cmake or a C/C++ compiler, it prints one line starting
# with "bench: llama.cpp peer skipped:" and exits 1; scripts/bench/run.sh then runs without it.
# Environment: CC, CXX; LIBDIR (folder holding libmlxkern, for the driver's agreement check);
# JOBS (parallel compile jobs for ggml, default 2).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
CC=${CC:-cc}
CXX=${CXX:-c++}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
JOBS=${JOBS:-2}
PY=$ROOT/.venv/bin/python3

VERSION=0.3.36 # llama-cpp-python; vendors llama.cpp with ggml 0.25.3
LLAMA=$ROOT/build/llama.cpp
SDIST=$LLAMA/llama_cpp_python-$VERSION.tar.gz
SRC=$LLAMA/src/llama_cpp_python-$VERSION/vendor/llama.cpp
BLD=$LLAMA/build-$VERSION
STAMP=$BLD/mlxkern-stamp
LOG=$LLAMA/build-$VERSION.log
CMAKE_OPTS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON
  -DGGML_NATIVE=ON -DGGML_OPENMP=ON -DGGML_CPU=ON -DGGML_BACKEND_DL=OFF
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF -DGGML_CCACHE=OFF
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF
)

skip() {
  echo "bench: llama.cpp peer skipped: $*"
  exit 1
}

command -v "$CC" >/dev/null 2>&1 || skip "no C compiler ($CC)"

want_stamp="llama-cpp-python $VERSION; $($CC --version 2>/dev/null | head -1);"
want_stamp+=" $($CXX --version 2>/dev/null | head -1); ${CMAKE_OPTS[*]}"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want_stamp" ]; then
  echo "llama.cpp peer: cached ggml build in ${BLD#"$ROOT"/} (delete build/llama.cpp/ to rebuild)"
else
  command -v "$CXX" >/dev/null 2>&1 || skip "no C++ compiler ($CXX) to build ggml"
  mkdir -p "$LLAMA"
  if [ ! -f "$SDIST" ]; then
    [ -x "$PY" ] || skip "$PY not found (run scripts/bootstrap.sh) to fetch the llama-cpp-python sdist"
    echo "llama.cpp peer: fetching the llama-cpp-python $VERSION sdist (vendors llama.cpp) from PyPI"
    if ! "$PY" -m pip download --quiet --disable-pip-version-check --no-binary llama-cpp-python \
        --no-deps "llama-cpp-python==$VERSION" -d "$LLAMA/dl" >"$LLAMA/download.log" 2>&1 ||
       [ ! -f "$LLAMA/dl/llama_cpp_python-$VERSION.tar.gz" ]; then
      skip "could not download llama-cpp-python==$VERSION with pip (no network?); see ${LLAMA#"$ROOT"/}/download.log"
    fi
    mv "$LLAMA/dl/llama_cpp_python-$VERSION.tar.gz" "$SDIST"
    rm -rf "$LLAMA/dl"
  fi
  if [ ! -f "$SRC/ggml/include/ggml.h" ]; then
    rm -rf "$LLAMA/src"
    mkdir -p "$LLAMA/src"
    tar -xzf "$SDIST" -C "$LLAMA/src" "llama_cpp_python-$VERSION/vendor/llama.cpp" ||
      skip "could not unpack $SDIST"
  fi
  CMAKE=""
  if command -v cmake >/dev/null 2>&1; then
    CMAKE=cmake
  elif [ -x "$ROOT/.venv/bin/cmake" ]; then
    CMAKE=$ROOT/.venv/bin/cmake
  elif [ -x "$PY" ]; then
    echo "llama.cpp peer: installing cmake into .venv (pip) to build ggml"
    "$PY" -m pip install --quiet --disable-pip-version-check "cmake>=3.20,<5" >"$LLAMA/cmake-install.log" 2>&1 &&
      CMAKE=$ROOT/.venv/bin/cmake
  fi
  [ -n "$CMAKE" ] || skip "no cmake (and pip could not install it)"
  echo "llama.cpp peer: building ggml, ggml-base, ggml-cpu (CPU only, Release, -march=native," \
       "$JOBS jobs; once, a few minutes; log in ${LOG#"$ROOT"/})"
  t0=$(date +%s)
  rm -rf "$BLD"
  if ! { CC=$CC CXX=$CXX "$CMAKE" -S "$SRC" -B "$BLD" "${CMAKE_OPTS[@]}" &&
         "$CMAKE" --build "$BLD" --target ggml ggml-base ggml-cpu -j "$JOBS"; } >"$LOG" 2>&1; then
    tail -5 "$LOG" >&2
    skip "building ggml failed; see ${LOG#"$ROOT"/}"
  fi
  echo "$want_stamp" >"$STAMP"
  echo "llama.cpp peer: ggml built in $(( $(date +%s) - t0 )) s"
fi

# The folder holding libggml*.so (bin/ in llama.cpp's layout).
GGML_LIBDIR=$(dirname "$(find "$BLD" -name 'libggml-cpu.so' -o -name 'libggml-cpu.dylib' | head -1)")
[ -d "$GGML_LIBDIR" ] || skip "libggml-cpu not found under ${BLD#"$ROOT"/}"

case "$(uname -s)" in
  Darwin) KERN=$LIBDIR/libmlxkern.dylib ;;
  *) KERN=$LIBDIR/libmlxkern.so ;;
esac
[ -f "$KERN" ] || skip "$KERN not found (cargo build --lib)"
mkdir -p "$ROOT/build/bench"
# ggml's headers are third-party: -isystem keeps their warnings out of -Werror.
if ! "$CC" -O2 -std=c11 -Wall -Wextra -Werror -pthread -I"$ROOT/include" -I"$ROOT/examples/common" \
    -isystem "$SRC/ggml/include" -DLLAMA_SOURCE="\"llama.cpp vendored by the llama-cpp-python $VERSION sdist\"" \
    "$ROOT/benches/llama_peer.c" \
    -L"$GGML_LIBDIR" -lggml -lggml-base -lggml-cpu -Wl,-rpath,"$GGML_LIBDIR" \
    -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -lm -o "$ROOT/build/bench/llama_peer"; then
  skip "benches/llama_peer.c did not compile"
fi
exit 0
