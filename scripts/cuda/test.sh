#!/usr/bin/env bash
# `make test-cuda`, on a machine with an NVIDIA GPU, Rust and an MLX CUDA install (pip
# mlx-cuda-13==0.32.4; MLX_DIR = its `mlx` package folder): every kernel on the GPU against the
# CPU kernels (tests/cuda/), the GPU backward against the CPU's
# (tests/gated_delta/vjp.rs) and MLX autograd through the GPU kernels
# (tests/cpp/gpu_autograd.cc). The library builds into target/cuda (its own MLX).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
[ -n "${MLX_DIR:-}" ] || { echo "test-cuda: set MLX_DIR to an MLX CUDA install's mlx folder"; exit 2; }
CARGO=${CARGO:-cargo}
CXX=${CXX:-c++}
BUILD=${BUILD:-$ROOT/build}
export CARGO_TARGET_DIR=$ROOT/target/cuda
"$CARGO" test --test cuda -- --test-threads=1 --nocapture --skip syntax:: --skip text::
"$CARGO" test --test gated_delta -- --test-threads=1 vjp:: --skip chunked_vjp
mkdir -p "$BUILD/cuda"
"$CXX" -O2 -std=c++20 -Iinclude -isystem "$MLX_DIR/include" tests/cpp/gpu_autograd.cc \
  -L"$CARGO_TARGET_DIR/debug" -lmlxkern -Wl,-rpath,"$CARGO_TARGET_DIR/debug" \
  -L"$MLX_DIR/lib" -lmlx -Wl,-rpath,"$MLX_DIR/lib" -o "$BUILD/cuda/gpu_autograd"
"$BUILD/cuda/gpu_autograd"
