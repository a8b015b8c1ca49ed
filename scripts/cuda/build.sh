#!/usr/bin/env bash
# Builds here, against MLX CUDA (mlx-cuda-13 0.32.4), everything a CUDA machine without Rust or
# network needs to run `make test-cuda` and `make bench-cuda`'s programs, into build/cuda/carry/:
#   payload.tar.xz   MLX CUDA for sm_90 (H100/H200), ~22 MB (scripts/cuda/make_payload.sh)
#   libmlxkern.so    the library built against MLX CUDA's headers and libmlx
#   test_cuda        tests/cuda/ (every kernel against the CPU kernels)
#   test_vjp         tests/gated_delta/ (run with `vjp:: --skip chunked_vjp`: tests/gated_delta/vjp.rs,
#                    the GPU backward against the CPU's)
#   test_soak        tests/soak/ (the serving soak; `device.sh soak` runs it on the GPU)
#   gpu_autograd     tests/cpp/gpu_autograd.cc (MLX autograd through the GPU kernels)
#   bench_cuda       benches/bench_cuda.cc (with bench_cuda_layers.cc, _dispatch.cc, _pool.cc)
#   wheels/          fla-core 0.6.0, the peer of benches/peer_fla.py
# Then, on the device: `bash scripts/cuda/device.sh` (from the repository root, with
# build/cuda/carry beside it) runs the tests, the benchmark and the chart.
# MLX CUDA's own CUDA libraries are not needed here: executables link with
# --allow-shlib-undefined, and the device provides them (scripts/cuda/stage.sh).
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=build/cuda/carry work=build/cuda/work
mkdir -p "$carry/wheels" "$work"
if [ ! -f "$carry/payload.tar.xz" ] || [ ! -f "$work/x/mlx/lib/libmlx.so" ]; then
  scripts/cuda/make_payload.sh "$carry/payload.tar.xz" "$work"
fi
mlx=$(realpath "$work/x/mlx")
export MLX_DIR=$mlx CARGO_TARGET_DIR=$PWD/target/cuda
export RUSTFLAGS="-C link-arg=-Wl,--allow-shlib-undefined"
cargo build --lib
tests=$(cargo test --test cuda --test gated_delta --test soak --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        print(m["target"]["name"], m["executable"])')
test_bin=$(echo "$tests" | awk '$1 == "cuda" {print $2}')
vjp_bin=$(echo "$tests" | awk '$1 == "gated_delta" {print $2}')
soak_bin=$(echo "$tests" | awk '$1 == "soak" {print $2}')
lib=$CARGO_TARGET_DIR/debug/libmlxkern.so
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
objcopy --strip-debug "$lib" "$carry/libmlxkern.so"
cp "$carry/libmlxkern.so" "$carry/$soname"
objcopy --strip-debug "$test_bin" "$carry/test_cuda"
objcopy --strip-debug "$vjp_bin" "$carry/test_vjp"
objcopy --strip-debug "$soak_bin" "$carry/test_soak"
${CXX:-c++} -O2 -std=c++20 -Wall -Wextra -Iinclude -isystem "$mlx/include" tests/cpp/gpu_autograd.cc \
  -L"$carry" -lmlxkern -L"$mlx/lib" -lmlx -Wl,--allow-shlib-undefined -o "$carry/gpu_autograd"
${CXX:-c++} -O2 -std=c++20 -Wall -Wextra -Iinclude -isystem "$mlx/include" benches/bench_cuda{,_layers,_dispatch,_pool}.cc \
  -L"$carry" -lmlxkern -L"$mlx/lib" -lmlx -Wl,--allow-shlib-undefined -o "$carry/bench_cuda"
ls "$carry"/wheels/fla_core-0.6.0-*.whl >/dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$carry/wheels" fla-core==0.6.0
du -sh "$carry"; ls -la "$carry"
