#!/usr/bin/env bash
# The C++ side of mlxkern, end to end:
#   1. include/mlxkern.hpp: its tests (tests/cpp/test_mlxkern_hpp.cpp, and the tree calls'
#      tests/cpp/test_mlxkern_tree.cpp) built with strict warnings (-Werror, conversions,
#      old-style casts) and run under ASan + LSan + UBSan; then
#      its MLX part (MLXKERN_WITH_MLX: Array::from_mlx / to_mlx) the same way, built against
#      libmlx with MLX's headers as -isystem (tests/cpp/test_mlxkern_hpp_mlx.cpp);
#   2. the example engine layer (examples/cpp/qwen35_layer.cpp: MLX ops and mlxkern kernels in
#      one graph) and the training example (examples/cpp/qwen35_train.cpp) built against the
#      in-tree headers and the .venv's MLX;
#   3. the acceptance test (tests/cpp/test_qwen35_layer.py): the engine against mlx-lm 0.32.2's
#      Qwen3.5 GatedDeltaNet (small shapes, Qwen3.5-35B-A3B's, and a chunked-prefill run),
#      prefill, decode, speculative rollback; then a short training run
#      (tests/cpp/test_qwen35_train.py, 25 steps, exact and chunked recurrence): a LoRA adapter
#      trained from C++ through the kernels' gradients against the same training in mlx-lm, the
#      loss curves equal within tolerance and decreasing (`make train-example` runs it long and
#      plots it);
#   4. scripts/package/install.sh into a temporary PREFIX;
#   5. the example rebuilt from a copy of its sources with only
#      `pkg-config --cflags --libs mlxkern-mlx` (PKG_CONFIG_PATH=PREFIX/lib/pkgconfig: mlxkern
#      plus the MLX headers and libmlx installed with it), checked to read every header and
#      load every library from PREFIX, run without LD_LIBRARY_PATH on the acceptance inputs,
#      and its outputs compared byte for byte with the in-tree build's.
#
# Environment: CXX (default c++), LIBDIR (folder of the built libmlxkern.so; default
# target/debug), BUILD (output folder; default build), MLXK_CPP_SEED (replay the acceptance
# test's random inputs), MLXK_TRAIN_SEED (replay the training run's), KEEP_PREFIX=1 (keep the
# temporary install).
# Needs: the library built (cargo build --lib), the .venv (make bootstrap), g++ >= 8 (C++17),
# pkg-config and binutils (Debian: apt-get install g++ pkg-config binutils).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CXX=${CXX:-c++}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
BUILD=${BUILD:-$ROOT/build}
OUT=$BUILD/cpp
PY=$ROOT/.venv/bin/python3
LIB=$LIBDIR/libmlxkern.so

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

[ "$(uname -s)" = Linux ] || fail "scripts/test/cpp.sh runs on Linux (the install step is Linux-only)"
for tool in "$CXX" pkg-config readelf ldd cmp; do
  command -v "$tool" >/dev/null || case "$tool" in
    pkg-config) fail "pkg-config not found: apt-get install pkg-config" ;;
    readelf) fail "readelf not found: apt-get install binutils" ;;
    ldd) fail "ldd not found: apt-get install libc-bin" ;;
    cmp) fail "cmp not found: apt-get install diffutils" ;;
    *) fail "C++ compiler '$tool' not found: apt-get install g++ (or set CXX)" ;;
  esac
done
[ -x "$PY" ] || fail "$PY not found: run make bootstrap"
[ -f "$LIB" ] || fail "$LIB not found: build the library first (cargo build --lib)"
mkdir -p "$OUT"
total_start=$(now)

STRICT=(-std=c++17 -Wall -Wextra -Werror -pedantic -Wold-style-cast -Wshadow)
IN_TREE=(-I"$ROOT/include" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR")
# Programs on MLX's C++ API: MLX 0.32's headers need C++20; they are system headers here, so
# the strict warnings apply to this project's code only. libmlx is the one mlxkern links.
MLX=$("$PY" -m mlx --cmake-dir) || fail "$PY -m mlx --cmake-dir failed: run make bootstrap"
STRICT_MLX=(-std=c++20 "${STRICT[@]:1}")
WITH_MLX=(-isystem "$MLX/include" -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib")

# 1. The header-only layer's own tests.
start=$(now)
"$CXX" "${STRICT[@]}" -Wconversion -Wsign-conversion -g -O1 -fsanitize=address,undefined \
  -fno-sanitize-recover=all -fno-omit-frame-pointer "$ROOT/tests/cpp/test_mlxkern_hpp.cpp" \
  "${IN_TREE[@]}" -o "$OUT/test_mlxkern_hpp" || fail "tests/cpp/test_mlxkern_hpp.cpp does not build"
log=$OUT/test_mlxkern_hpp.log
if ! ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 "$OUT/test_mlxkern_hpp" >"$log" 2>&1; then
  cat "$log" >&2
  fail "tests/cpp/test_mlxkern_hpp under ASan + LSan + UBSan"
fi
grep -q "Sanitizer\|runtime error" "$log" && { cat "$log" >&2; fail "sanitizer report"; }
echo "PASS: include/mlxkern.hpp: $(tail -n 1 "$log") under ASan + LSan + UBSan" \
  "(-Werror -Wconversion -Wold-style-cast -pedantic, included twice) [$(since "$start")]"

start=$(now)
"$CXX" "${STRICT[@]}" -Wconversion -Wsign-conversion -g -O1 -fsanitize=address,undefined \
  -fno-sanitize-recover=all -fno-omit-frame-pointer "$ROOT/tests/cpp/test_mlxkern_tree.cpp" \
  "${IN_TREE[@]}" -o "$OUT/test_mlxkern_tree" || fail "tests/cpp/test_mlxkern_tree.cpp does not build"
log=$OUT/test_mlxkern_tree.log
if ! ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 "$OUT/test_mlxkern_tree" >"$log" 2>&1; then
  cat "$log" >&2
  fail "tests/cpp/test_mlxkern_tree under ASan + LSan + UBSan"
fi
grep -q "Sanitizer\|runtime error" "$log" && { cat "$log" >&2; fail "sanitizer report"; }
echo "PASS: include/mlxkern_pool.hpp's tree calls: $(tail -n 1 "$log") under ASan + LSan +" \
  "UBSan [$(since "$start")]"

start=$(now)
"$CXX" "${STRICT_MLX[@]}" -Wconversion -Wsign-conversion -g -O1 -fsanitize=address,undefined \
  -fno-sanitize-recover=all -fno-omit-frame-pointer "$ROOT/tests/cpp/test_mlxkern_hpp_mlx.cpp" \
  "${IN_TREE[@]}" "${WITH_MLX[@]}" -o "$OUT/test_mlxkern_hpp_mlx" ||
  fail "tests/cpp/test_mlxkern_hpp_mlx.cpp does not build"
log=$OUT/test_mlxkern_hpp_mlx.log
if ! ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 "$OUT/test_mlxkern_hpp_mlx" >"$log" 2>&1; then
  cat "$log" >&2
  fail "tests/cpp/test_mlxkern_hpp_mlx under ASan + LSan + UBSan"
fi
grep -q "Sanitizer\|runtime error" "$log" && { cat "$log" >&2; fail "sanitizer report"; }
echo "PASS: include/mlxkern.hpp with MLXKERN_WITH_MLX (from_mlx / to_mlx against libmlx):" \
  "$(tail -n 1 "$log") under ASan + LSan + UBSan [$(since "$start")]"

# 2. The example against the in-tree headers.
start=$(now)
"$CXX" "${STRICT_MLX[@]}" -O2 "$ROOT/examples/cpp/qwen35_layer.cpp" "${IN_TREE[@]}" "${WITH_MLX[@]}" \
  -o "$OUT/qwen35_layer" || fail "examples/cpp/qwen35_layer.cpp does not build against include/"
"$CXX" "${STRICT_MLX[@]}" -O2 "$ROOT/examples/cpp/qwen35_train.cpp" "${IN_TREE[@]}" "${WITH_MLX[@]}" \
  -o "$OUT/qwen35_train" || fail "examples/cpp/qwen35_train.cpp does not build against include/"
echo "PASS: examples/cpp/qwen35_layer and qwen35_train build against include/ and MLX $("$PY" -c 'import mlx.core as mx; print(mx.__version__)')" \
  "(-std=c++20 -Werror -pedantic) [$(since "$start")]"

# The CUDA benchmark driver builds on every machine (it runs its rows only on MLX CUDA).
start=$(now)
"$CXX" "${STRICT_MLX[@]}" -O2 "$ROOT"/benches/bench_cuda{,_layers,_dispatch,_pool}.cc "${IN_TREE[@]}" \
  "${WITH_MLX[@]}" -o "$OUT/bench_cuda" || fail "benches/bench_cuda*.cc do not build"
"$OUT/bench_cuda" | grep -q "skipped, the loaded MLX has no CUDA backend" ||
  fail "benches/bench_cuda without CUDA should skip"
echo "PASS: benches/bench_cuda*.cc build (-std=c++20 -Werror -pedantic) and skips without CUDA" \
  "[$(since "$start")]"
# So does the GPU autograd test (it runs with make test-cuda).
start=$(now)
"$CXX" "${STRICT_MLX[@]}" -O2 "$ROOT/tests/cpp/gpu_autograd.cc" "${IN_TREE[@]}" "${WITH_MLX[@]}" \
  -o "$OUT/gpu_autograd" || fail "tests/cpp/gpu_autograd.cc does not build"
"$OUT/gpu_autograd" | grep -q "skipped, the loaded MLX has no GPU backend" ||
  fail "tests/cpp/gpu_autograd without a GPU should skip"
echo "PASS: tests/cpp/gpu_autograd.cc builds (-std=c++20 -Werror -pedantic) and skips without a GPU" \
  "[$(since "$start")]"

# 3. The acceptance test.
start=$(now)
WORK=$OUT/acceptance
rm -rf "$WORK"
mkdir -p "$WORK"
"$PY" "$ROOT/tests/cpp/test_qwen35_layer.py" --binary "$OUT/qwen35_layer" --workdir "$WORK" \
  || fail "acceptance test (tests/cpp/test_qwen35_layer.py)"
echo "PASS: acceptance test against mlx-lm 0.32.2 (small and 35B-A3B shapes, chunked prefill)" \
  "[$(since "$start")]"

start=$(now)
for recurrence in exact chunked; do
  "$PY" "$ROOT/tests/cpp/test_qwen35_train.py" --binary "$OUT/qwen35_train" --steps 25 \
    --recurrence "$recurrence" || fail "training test, $recurrence recurrence (tests/cpp/test_qwen35_train.py)"
done
echo "PASS: LoRA training from C++ through the kernels' gradients matches mlx-lm's loss curve" \
  "(25 steps, exact and chunked recurrence) [$(since "$start")]"

# 4. Install into a temporary PREFIX.
start=$(now)
PREFIX=$(mktemp -d "${TMPDIR:-/tmp}/mlxkern-prefix.XXXXXX")
if [ "${KEEP_PREFIX:-0}" = 1 ]; then
  echo "note: keeping $PREFIX"
else
  trap 'rm -rf "$PREFIX"' EXIT
fi
LIBDIR=$LIBDIR "$ROOT/scripts/package/install.sh" "$PREFIX" >/dev/null || fail "scripts/package/install.sh $PREFIX"
for file in include/mlxkern.h include/mlxkern.hpp include/mlxkern_pool.hpp include/mlxkern_mlxc.h lib/libmlxkern.so \
  lib/pkgconfig/mlxkern.pc lib/pkgconfig/mlxkern-mlx.pc lib/mlxkern/mlx/lib/libmlx.so \
  lib/mlxkern/mlx/include/mlx/mlx.h; do
  [ -f "$PREFIX/$file" ] || fail "install: $file missing"
done
# The library sits under its SONAME, libmlxkern.so.<C ABI version>, with libmlxkern.so -> it.
abi=$(sed -n 's/^#define MLXK_ABI_VERSION \([0-9][0-9]*\)$/\1/p' "$ROOT/include/mlxkern.h")
[ -n "$abi" ] || fail "MLXK_ABI_VERSION not found in include/mlxkern.h"
[ -L "$PREFIX/lib/libmlxkern.so" ] && [ "$(readlink "$PREFIX/lib/libmlxkern.so")" = "libmlxkern.so.$abi" ] \
  || fail "install: lib/libmlxkern.so is not a link to libmlxkern.so.$abi"
soname=$(readelf -d "$PREFIX/lib/libmlxkern.so.$abi" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
[ "$soname" = "libmlxkern.so.$abi" ] || fail "install: SONAME is '$soname', expected libmlxkern.so.$abi"
echo "PASS: scripts/package/install.sh: headers, lib (SONAME $soname), private MLX copy and pkg-config file" \
  "in PREFIX [$(since "$start")]"

# 5. Build and run the example against the installed copy, with pkg-config alone. The example
#    is an engine on MLX: mlxkern-mlx gives mlxkern's flags plus the headers and libmlx of the
#    MLX installed with it (the process's one libmlx), so no flag comes from the .venv.
start=$(now)
export PKG_CONFIG_PATH=$PREFIX/lib/pkgconfig
unset LD_LIBRARY_PATH
# The .pc files find PREFIX from their own folder; --define-prefix prints it without "/../..".
flags=$(pkg-config --define-prefix --cflags --libs mlxkern-mlx) || fail "pkg-config does not find mlxkern-mlx"
MLX_REAL=$(cd "$MLX" && pwd -P)
case " $flags " in
  *"$ROOT"* | *"$MLX"* | *"$MLX_REAL"*) fail "pkg-config flags point into the build tree or the .venv: $flags" ;;
esac
c_flags=$(pkg-config --cflags --libs mlxkern)
case " $c_flags " in
  *mlx/include* | *-lmlx\ *) fail "pkg-config's mlxkern module (C clients) carries MLX's flags: $c_flags" ;;
esac
CONSUMER=$OUT/consumer
rm -rf "$CONSUMER"
mkdir -p "$CONSUMER"
cp "$ROOT"/examples/cpp/*.cpp "$ROOT"/examples/cpp/*.hpp "$CONSUMER/"
# shellcheck disable=SC2086  # pkg-config output is a list of flags
"$CXX" "${STRICT_MLX[@]}" -O2 -MD "$CONSUMER/qwen35_layer.cpp" $flags -o "$CONSUMER/qwen35_layer" \
  || fail "the example does not build with pkg-config --cflags --libs mlxkern-mlx"
grep -q "$PREFIX/include/mlxkern.hpp" "$CONSUMER"/*.d || fail "the consumer build did not use PREFIX's mlxkern.hpp"
grep -q "$PREFIX/lib/mlxkern/mlx/include/mlx/mlx.h" "$CONSUMER"/*.d ||
  fail "the consumer build did not use PREFIX's MLX headers"
grep -q "$ROOT/include" "$CONSUMER"/*.d && fail "the consumer build read headers from the build tree"
grep -q "$MLX/include\|$MLX_REAL/include" "$CONSUMER"/*.d && fail "the consumer build read MLX headers from the .venv"
libs=$(ldd "$CONSUMER/qwen35_layer")
for name in libmlxkern.so libmlx.so libblas liblapack; do
  echo "$libs" | grep "$name" | grep -q "=> $PREFIX/" \
    || fail "$name is not loaded from $PREFIX: $(echo "$libs" | grep "$name" || echo 'not found')"
done
echo "$libs" | grep -q "not found" && fail "unresolved libraries: $libs"
echo "PASS: the example builds with only \`pkg-config --cflags --libs mlxkern-mlx\`: $flags" \
  "[$(since "$start")]"

start=$(now)
for config in small 35b chunked; do
  "$CONSUMER/qwen35_layer" "$WORK/$config.weights.safetensors" "$WORK/$config.inputs.safetensors" \
    "$CONSUMER/$config.outputs.safetensors" --quiet >/dev/null \
    || fail "the installed-copy build failed on the $config inputs"
  cmp -s "$WORK/$config.outputs.safetensors" "$CONSUMER/$config.outputs.safetensors" \
    || fail "the installed-copy build's $config outputs differ from the in-tree build's"
done
echo "PASS: the installed-copy build runs without LD_LIBRARY_PATH (libmlxkern, libmlx, BLAS from" \
  "PREFIX); outputs byte-identical to the in-tree build's [$(since "$start")]"

echo "PASS: scripts/test/cpp.sh [$(since "$total_start") total]"
