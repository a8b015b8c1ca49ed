#!/usr/bin/env bash
# mlxkern inside an mlx-swift program, on the program's one MLX (swift/MLXKernMLX):
#   1. libmlxkern.a built in host-MLX mode against the MLX sources mlx-swift compiles in
#      (scripts/swift/mlx-lib.sh: target/mlx-swift/debug, plus the mlxkern.pc SwiftPM links it
#      through);
#   2. the references the tests compare with, from the bundled library (target/debug, on the
#      pip MLX): tests/consumers/reference.c's output, and the C++ engine layer
#      (examples/cpp/qwen35_layer) run by tests/cpp/test_qwen35_layer.py on its "small"
#      configuration (MLXKERN_TEST_QWEN35_CONFIG=35b: Qwen3.5-35B-A3B's shapes), which leaves
#      the weights, the token stream and the engine's outputs;
#   3. the package's XCTest suite (swift/MLXKernMLX/Tests) built against mlx-swift and that
#      archive, in the Swift root of scripts/swift/env.sh: MLXArrays into the kernels and back
#      (zero copy, laziness, views, decode loop), the kernels bit-identical to the bundled
#      library's, the Qwen3.5 Gated DeltaNet layer against the C++ engine; then, in a process of
#      its own, the guard: the bundled library (its own libmlx) loaded beside mlx-swift's MLX
#      refuses the exchange, naming both.
#
# mlx-swift is a test fixture: ../shared/vendor/mlx-swift (with ../shared/vendor/swift-numerics
# beside it), never part of the repository. Where it is absent (a clean clone, CI) this script
# says so and exits 0 without testing anything.
#
# Environment: MLX_SWIFT_PATH (an mlx-swift checkout with submodules; default
# ../shared/vendor/mlx-swift), LIBDIR (the bundled library; default target/debug), BUILD
# (default build), CC, CXX (default cc, c++), SWIFT_CHROOT, MLXKERN_TEST_SEED,
# MLXKERN_TEST_QWEN35_CONFIG (small or 35b; default small).
# Linux needs root (the Swift root). macOS: not run here; see docs/hosts/swift.md.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
MLX_SWIFT=${MLX_SWIFT_PATH:-$ROOT/../shared/vendor/mlx-swift}
LIBDIR=$(cd "${LIBDIR:-$ROOT/target/debug}" && pwd -P)
BUILD=${BUILD:-$ROOT/build}
CXX=${CXX:-c++}
PY=$ROOT/.venv/bin/python3
PACKAGE=$ROOT/swift/MLXKernMLX
OUT=$BUILD/mlx-swift
LOG=$OUT/swift.log

die() { printf 'test-mlx-swift: error: %s\n' "$*" >&2; exit 1; }
say() { printf 'test-mlx-swift: %s\n' "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
start=$(now)

if [ ! -f "$MLX_SWIFT/Package.swift" ]; then
  say "SKIP: no mlx-swift at $MLX_SWIFT (a test fixture from the development checkout's ../shared/vendor, never in the repository; set MLX_SWIFT_PATH to a checkout with its submodules)"
  exit 0
fi
MLX_SWIFT=$(cd "$MLX_SWIFT" && pwd -P)
[ "$(uname -s)" = Linux ] || die "this script runs the Swift root of Linux; on macOS follow docs/hosts/swift.md"
[ "$(id -u)" = 0 ] || die "the Swift root needs root (chroot, mount namespaces)"
[ -f "$LIBDIR/libmlxkern.so" ] || die "$LIBDIR/libmlxkern.so not found: build it first (make build)"
[ -x "$PY" ] || die "$PY not found: run make bootstrap"
mkdir -p "$OUT"
export MLXKERN_TEST_QWEN35_CONFIG=${MLXKERN_TEST_QWEN35_CONFIG:-small}
QWEN35=$MLXKERN_TEST_QWEN35_CONFIG
case "$QWEN35" in small|35b) ;; *) die "MLXKERN_TEST_QWEN35_CONFIG=$QWEN35: expected small or 35b" ;; esac

# 1. The static library against mlx-swift's MLX.
t=$(now)
PCDIR=$("$ROOT/scripts/swift/mlx-lib.sh" "$MLX_SWIFT")
say "libmlxkern.a against mlx-swift's MLX: $(since "$t") s"

# 2. The references, from the bundled library on the pip MLX.
t=$(now)
"${CC:-cc}" -std=c11 -Wall -Wextra -Werror -I"$ROOT/include" "$ROOT/tests/consumers/reference.c" \
  -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -o "$OUT/reference"
"$OUT/reference" >"$OUT/reference.txt"
MLX=$("$PY" -m mlx --cmake-dir)
if [ ! -x "$OUT/qwen35_layer" ] || [ "$ROOT/examples/cpp/qwen35_layer.cpp" -nt "$OUT/qwen35_layer" ] ||
   [ "$ROOT/examples/cpp/qwen35_gdn.hpp" -nt "$OUT/qwen35_layer" ] || [ "$LIBDIR/libmlxkern.so" -nt "$OUT/qwen35_layer" ]; then
  "$CXX" -std=c++20 -O2 "$ROOT/examples/cpp/qwen35_layer.cpp" -I"$ROOT/include" -L"$LIBDIR" -lmlxkern \
    -Wl,-rpath,"$LIBDIR" -isystem "$MLX/include" -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib" -o "$OUT/qwen35_layer"
fi
rm -rf "$OUT/qwen35" && mkdir -p "$OUT/qwen35"
"$PY" "$ROOT/tests/cpp/test_qwen35_layer.py" --binary "$OUT/qwen35_layer" --config "$QWEN35" \
  --workdir "$OUT/qwen35" ${MLXKERN_TEST_SEED:+--seed "$MLXKERN_TEST_SEED"} >"$OUT/qwen35.log" 2>&1 ||
  { cat "$OUT/qwen35.log"; die "the C++ engine's acceptance test failed"; }
grep -E '^(seed|PASS)' "$OUT/qwen35.log" | sed 's/^/test-mlx-swift: C++ engine vs mlx-lm: /'
say "references (reference.c, the C++ engine layer): $(since "$t") s"

# 3. The Swift tests, in the Swift root.
t=$(now)
SWIFT_CHROOT_PACKAGES="libstdc++-14-dev libblas-dev liblapack-dev liblapacke-dev libopenblas-dev gfortran" \
  "$ROOT/scripts/swift/env.sh"
MLXLIB=$(ldd "$LIBDIR/libmlxkern.so" | awk '$1 == "libmlx.so" { print $3 }')
[ -n "$MLXLIB" ] || die "$LIBDIR/libmlxkern.so does not find libmlx.so"
binds=()
for path in "$MLX_SWIFT" "$(dirname "$MLX_SWIFT")/swift-numerics" "$LIBDIR" "$OUT" \
            "$(dirname "$(dirname "$(dirname "$MLXLIB")")")"; do
  [ -e "$path" ] || continue
  path=$(realpath -e "$path")
  case "$path/" in "$ROOT"/*) ;; *) binds+=("$path") ;; esac
done
export SWIFT_RUN_BINDS
SWIFT_RUN_BINDS=$(IFS=:; echo "${binds[*]-}")
export MLX_SWIFT_PATH=$MLX_SWIFT PKG_CONFIG_PATH=$PCDIR
export MLXKERN_TEST_REFERENCE=$OUT/reference.txt MLXKERN_TEST_QWEN35_DIR=$OUT/qwen35
export SWIFT_RUN_ENV="MLX_SWIFT_PATH PKG_CONFIG_PATH MLXKERN_TEST_REFERENCE MLXKERN_TEST_QWEN35_DIR
  MLXKERN_TEST_QWEN35_CONFIG MLXKERN_TEST_SEED MLXKERN_TEST_BUNDLED_LIB"
say "Swift root ready: $(since "$t") s"
run() { "$ROOT/scripts/swift/run.sh" "$ROOT" "$@"; }

t=$(now)
run sh -c 'cd swift/MLXKernMLX && swift build --build-tests' >"$LOG" 2>&1 ||
  { tail -n 60 "$LOG"; die "swift build failed (log: $LOG)"; }
say "build (mlx-swift, MLX, the package, the tests): $(since "$t") s"

summary() { grep -E 'Executed [0-9]+ tests?, with' "$1" | tail -n 1 | sed 's/^[[:space:]]*//'; }
t=$(now)
status=0
run sh -c 'cd swift/MLXKernMLX && swift test --skip-build --disable-swift-testing --skip GuardTests' \
  >"$OUT/tests.log" 2>&1 || status=$?
grep -E '^(InteropTests|ReferenceTests|Qwen35LayerTests):|error:|failed' "$OUT/tests.log" || true
say "tests: $(since "$t") s; $(summary "$OUT/tests.log")"
[ "$status" = 0 ] || { tail -n 40 "$OUT/tests.log"; die "swift test failed"; }

t=$(now)
export MLXKERN_TEST_BUNDLED_LIB=$LIBDIR/libmlxkern.so
run sh -c 'cd swift/MLXKernMLX && swift test --skip-build --disable-swift-testing --filter GuardTests' \
  >"$OUT/guard.log" 2>&1 || status=$?
grep -E '^GuardTests:|error:' "$OUT/guard.log" || true
say "guard: $(since "$t") s; $(summary "$OUT/guard.log")"
[ "$status" = 0 ] || { tail -n 40 "$OUT/guard.log"; die "the guard test failed"; }
say "total: $(since "$start") s"
