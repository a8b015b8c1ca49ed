#!/usr/bin/env bash
# The Metal-text emulation (tests/metal_emu/README.md): compiles each kernel file of
# kernels/metal/ as C++17 inside the signature MLX's metal_kernel generates for the library's
# launch, runs it on CPU fibers with the launch's grid and threadgroup, and compares every output
# bit for bit with the library's CPU kernel (through the C ABI) on fresh random inputs (the
# recurrence's backward pass: within a measured tolerance, its exact invariants bit for bit).
#
#   1. rustc builds tests/metal_emu/launches.rs (with its modules cases.rs and describe.rs)
#      around the library's src/metal/ and prints the launch descriptions of every case;
#   2. tests/metal_emu/signatures.cc asks MLX for the kernel text of each launch and writes the
#      kernels (signature + #include of the kernel file) and launchers;
#   3. the harness runs every case; then the diagnostic variant build re-runs the head split.
#
# Environment: LIBDIR (folder holding libmlxkern.so / .dylib, default target/debug), BUILD
# (output folder, default build), CXX (C++ compiler, default c++; g++ 12 or newer), RUSTC
# (default rustc), MLX_DIR (MLX's pip package folder; default: the project's .venv, found as
# build.rs finds it). Needs a built library (cargo build --lib) and the bootstrap's .venv.
set -euo pipefail

start=$SECONDS
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SCRIPT=$ROOT/scripts/test/metal-emu.sh
cd "$ROOT"
LIBDIR=${LIBDIR:-$ROOT/target/debug}
BUILD=${BUILD:-$ROOT/build}
CXX=${CXX:-c++}
RUSTC=${RUSTC:-rustc}
SRC=$ROOT/tests/metal_emu
OUT=$BUILD/metal_emu
mkdir -p "$OUT"
LIBDIR=$(cd "$LIBDIR" && pwd)

fail() {
  echo "FAIL: metal-emu: $*" >&2
  exit 1
}

case "$(uname -s)" in
  Darwin) LIB=$LIBDIR/libmlxkern.dylib ;;
  *) LIB=$LIBDIR/libmlxkern.so ;;
esac
[ -f "$LIB" ] || fail "$LIB not found: build the library first (cargo build --lib)"

# MLX's package folder (include/mlx, lib/libmlx.*), as build.rs locates it.
mlx_ok() { [ -f "$1/include/mlx/mlx.h" ]; }
MLX=""
if [ -n "${MLX_DIR:-}" ]; then
  for candidate in "$MLX_DIR" "$MLX_DIR/../../.."; do
    if mlx_ok "$candidate"; then MLX=$(cd "$candidate" && pwd); break; fi
  done
  [ -n "$MLX" ] || fail "MLX_DIR=$MLX_DIR does not contain include/mlx/mlx.h"
elif [ -x "$ROOT/.venv/bin/python3" ]; then
  cmake_dir=$("$ROOT/.venv/bin/python3" -m mlx --cmake-dir 2>/dev/null || true)
  for candidate in "$cmake_dir" "$cmake_dir/../../.."; do
    if [ -n "$cmake_dir" ] && mlx_ok "$candidate"; then MLX=$(cd "$candidate" && pwd); break; fi
  done
fi
[ -n "$MLX" ] || fail "MLX not found: run scripts/bootstrap.sh (or set MLX_DIR)"

# Kernels: C++17, no FMA contraction, no fast-math. The Metal attributes ([[kernel]],
# [[buffer(i)]], [[thread_position_in_grid]], ...) mean nothing to C++ and are ignored.
KFLAGS=(-std=c++17 -O1 -ffp-contract=off -fno-fast-math -Wall -Wextra -Wno-attributes
        -I"$ROOT" -I"$ROOT/include" -I"$SRC" -I"$OUT")
MFLAGS=(-std=c++20 -O0 -I"$MLX/include" -Wno-deprecated-declarations)
MLX_LINK=(-L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib")
LIB_LINK=(-L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR")

# stale TARGET DEPS...: true when TARGET is missing or older than a dependency.
stale() {
  local target=$1 dep
  shift
  [ -e "$target" ] || return 0
  for dep in "$@" "$SCRIPT"; do
    [ "$dep" -nt "$target" ] && return 0
  done
  return 1
}

HEADERS=("$SRC"/*.h)

# 1. The launch descriptions, from src/metal/.
if stale "$OUT/launches" "$SRC/launches.rs" "$SRC/cases.rs" "$SRC/describe.rs" \
  "$ROOT"/src/metal/*.rs "$ROOT"/src/metal/*/*.rs "$ROOT/src/dtype.rs" "$ROOT"/kernels/metal/*.metal \
  "$ROOT"/kernels/metal/*.h "$ROOT"/src/node/*.rs; then
  "$RUSTC" --edition 2021 -O --crate-name metal_emu_launches -o "$OUT/launches" \
    "$SRC/launches.rs" || fail "building tests/metal_emu/launches.rs"
fi
"$OUT/launches" "$ROOT" "$OUT/launches.txt" || fail "launch descriptions"

# MLX-side programs (C++20) build in the background meanwhile.
pids=()
if stale "$OUT/signatures" "$SRC/signatures.cc" "$MLX/include/mlx/mlx.h"; then
  "$CXX" "${MFLAGS[@]}" "$SRC/signatures.cc" "${MLX_LINK[@]}" -o "$OUT/signatures" &
  pids+=($!)
fi
if stale "$OUT/mlx_cpu_ops.o" "$SRC/mlx_cpu_ops.cc" "$MLX/include/mlx/mlx.h"; then
  "$CXX" "${MFLAGS[@]}" -c "$SRC/mlx_cpu_ops.cc" -o "$OUT/mlx_cpu_ops.o" &
  pids+=($!)
fi
if stale "$OUT/executor.o" "$SRC/executor.cc" "${HEADERS[@]}"; then
  "$CXX" "${KFLAGS[@]}" -c "$SRC/executor.cc" -o "$OUT/executor.o" || fail "executor.cc"
fi
HARNESS_O=()  # the harness's files (harness.h), compiled
for part in harness harness_cases harness_backward harness_backward_chunked harness_pool harness_chunked harness_tiles; do
  HARNESS_O+=("$OUT/$part.o")
  if stale "$OUT/$part.o" "$SRC/$part.cc" "${HEADERS[@]}" "$ROOT/include/mlxkern.h"; then
    "$CXX" "${KFLAGS[@]}" -c "$SRC/$part.cc" -o "$OUT/$part.o" || fail "$part.cc"
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || fail "building the MLX-side programs"; done

# 2. The kernels MLX generates for those launches (rewritten only when they change).
"$OUT/signatures" "$OUT/launches.txt" "$OUT/emu_gen.inc.new" || fail "kernel signatures"
if cmp -s "$OUT/emu_gen.inc.new" "$OUT/emu_gen.inc"; then
  rm "$OUT/emu_gen.inc.new"
else
  mv "$OUT/emu_gen.inc.new" "$OUT/emu_gen.inc"
fi

# 3. The kernels on the Metal shim, and the diagnostic variant (exp of half/bfloat widened).
KDEPS=("$SRC/emu_kernels.cc" "${HEADERS[@]}" "$OUT/emu_gen.inc" "$ROOT"/kernels/metal/*.metal)
pids=()
if stale "$OUT/emu_kernels.o" "${KDEPS[@]}"; then
  "$CXX" "${KFLAGS[@]}" -c "$SRC/emu_kernels.cc" -o "$OUT/emu_kernels.o" &
  pids+=($!)
fi
if stale "$OUT/emu_kernels_variant.o" "${KDEPS[@]}"; then
  "$CXX" "${KFLAGS[@]}" -DMLXK_EMU_EXP_RETURNS_FLOAT -c "$SRC/emu_kernels.cc" \
    -o "$OUT/emu_kernels_variant.o" &
  pids+=($!)
fi
# The matrix tiles' CUDA form (CUDA's lane layouts; cuda_tiles_host.h) in each of its forms.
for form in fma:0 tf32:1 bf16:2; do
  if stale "$OUT/emu_kernels_${form%:*}.o" "${KDEPS[@]}" "$ROOT"/kernels/cuda/tiles.cuh; then
    "$CXX" "${KFLAGS[@]}" -DMLXK_EMU_TILE_FORM="${form#*:}" -c "$SRC/emu_kernels.cc" \
      -o "$OUT/emu_kernels_${form%:*}.o" &
    pids+=($!)
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || fail "compiling the kernel files on the Metal shim"; done

for variant in "" _variant _fma _tf32 _bf16; do
  "$CXX" "${HARNESS_O[@]}" "$OUT/emu_kernels$variant.o" "$OUT/executor.o" "$OUT/mlx_cpu_ops.o" \
    "${LIB_LINK[@]}" "${MLX_LINK[@]}" -o "$OUT/harness$variant" || fail "linking the harness"
done

"$OUT/harness"
# Evidence for the known differences: widening exp's result to float (nothing else changes)
# makes the head split bit-identical in every dtype.
"$OUT/harness_variant" --kind head_split
# The kernels that multiply on the matrix tiles, with the tiles' CUDA form: CUDA's lane layouts
# and inputs rounded to tf32 or bf16, each within its bounds (the chunked pool calls still bit
# for bit the dense chunked calls).
for form in fma tf32 bf16; do
  "$OUT/harness_$form" --kind tiles --kind backward_chunked --kind backward_chunked_masked \
    --kind chunk_out --kind chunk_pool_out
done

echo "PASS: scripts/test/metal-emu.sh ($((SECONDS - start)) s)"
