#!/usr/bin/env bash
# `make bench-cuda`, on a machine with an NVIDIA GPU, Rust and an MLX CUDA install (MLX_DIR =
# its `mlx` package folder): benches/bench_cuda*.cc beside MLX's own paths and fla (where
# installed), into build/bench/: bench-cuda.{log,jsonl}, fla.jsonl, the chart bench-cuda.png
# and the same rows as markdown tables, tables-cuda.md (benches/tables.py).
set -eu  # no pipefail: as under make, a failing bench_cuda leaves its log and the peers still run
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
[ -n "${MLX_DIR:-}" ] || { echo "bench-cuda: set MLX_DIR to an MLX CUDA install's mlx folder"; exit 2; }
CARGO=${CARGO:-cargo}
CXX=${CXX:-c++}
OUT=${BUILD:-$ROOT/build}/bench
export CARGO_TARGET_DIR=$ROOT/target/cuda
"$CARGO" build --lib
mkdir -p "$OUT"
"$CXX" -O2 -std=c++20 -Iinclude -isystem "$MLX_DIR/include" benches/bench_cuda{,_layers,_dispatch,_pool}.cc \
  -L"$CARGO_TARGET_DIR/debug" -lmlxkern -Wl,-rpath,"$CARGO_TARGET_DIR/debug" \
  -L"$MLX_DIR/lib" -lmlx -Wl,-rpath,"$MLX_DIR/lib" -o "$OUT/bench_cuda"
MLXK_BENCH_JSON=$OUT/bench-cuda.jsonl "$OUT/bench_cuda" | tee "$OUT/bench-cuda.log"
rm -f "$OUT/fla.jsonl"
python3 benches/peer_fla.py "$OUT/fla.jsonl" || echo "bench-cuda: benches/peer_fla.py failed (fla rows left out)"
python3 benches/peer_fla_chunk.py "$OUT/fla.jsonl" || echo "bench-cuda: benches/peer_fla_chunk.py failed (fla rows left out)"
python3 benches/chart_cuda.py "$OUT/bench-cuda.png" "$OUT/bench-cuda.jsonl" "$OUT/fla.jsonl"
python3 benches/tables.py "$OUT/bench-cuda.jsonl" "$OUT/fla.jsonl" >"$OUT/tables-cuda.md"
