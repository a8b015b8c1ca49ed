#!/usr/bin/env bash
# On a CUDA machine (H100/H200, no Rust needed), from the repository root with build/cuda/carry
# made by scripts/cuda/build.sh: stages MLX CUDA, then runs
#   test    build/cuda/carry/test_cuda (tests/cuda/), one thread (the device is process-wide),
#           test_vjp (tests/gated_delta/vjp.rs) and gpu_autograd (tests/cpp/gpu_autograd.cc)
#   bench   build/cuda/carry/bench_cuda, the fla peers (benches/peer_fla.py: decode;
#           benches/peer_fla_chunk.py: chunked forward + backward) and the chart
#   grad    test_vjp, gpu_autograd and bench_cuda's grad rows alone, and fla's chunked forward +
#           backward beside them (benches/peer_fla_chunk.py)
#   pool    bench_cuda's pool and packed rows alone (the calls on a pool of states)
#   soak    test_soak (tests/soak/) with every call on the GPU: SOAK_SECONDS (default 120),
#           SOAK_CHUNKED (default 1; 0 for exact calls only)
#   chunked test_cuda's chunked cases alone (MLXK_CUDA_ONLY=chunked), gpu_autograd, bench_cuda's
#           prefill rows and fla's chunked forward beside them
#   tiles   test_cuda's matrix-tile cases (tests/cuda/tiles.rs): every tile form (fma, tf32,
#           bf16) against float64 products and in the chunked backward, their timing on a large
#           product, then bench_cuda's chunked forward + backward rows once per form
#           (gradchunked, MLXK_CUDA_TILES)
# Usage: scripts/cuda/device.sh [test] [bench] [grad] [pool] [soak] [chunked] [tiles] (test and bench by
# default). Logs, JSON and the chart go
# to $OUT (build/cuda/out by default).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-$PWD/build/cuda/out}
mkdir -p "$out"
what=${*:-test bench}
# shellcheck disable=SC1091
source scripts/cuda/carry-env.sh
export MLXK_NUM_THREADS=${MLXK_NUM_THREADS:-8}
# The Python peers print as they go (a run cut short by a limit keeps what it printed).
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  lscpu | grep -m1 'Model name'; } | tee "$out/device.txt"
status=0
if [[ " $what " == *" grad "* ]]; then
  # The gradient checks and rows alone.
  "$carry/test_vjp" --test-threads=1 vjp:: --skip chunked_vjp 2>&1 | tee "$out/test-grad.log"
  status=$((status | PIPESTATUS[0]))
  "$carry/gpu_autograd" 2>&1 | tee -a "$out/test-grad.log"
  status=$((status | PIPESTATUS[0]))
  MLXK_BENCH_ONLY=grad "$carry/bench_cuda" 2>&1 | tee "$out/bench-grad.log"
  status=$((status | PIPESTATUS[0]))
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla-site \
    "$carry"/wheels/*.whl >/dev/null 2>&1
  PYTHONPATH=/tmp/fla-site:${PYTHONPATH:-} python3 benches/peer_fla_chunk.py "$out/fla-grad.jsonl" 2>&1 |
    tee "$out/fla-grad.log"
fi
if [[ " $what " == *" pool "* ]]; then
  MLXK_BENCH_ONLY=pool,packed MLXK_BENCH_JSON=$out/bench-pool.jsonl "$carry/bench_cuda" 2>&1 |
    tee "$out/bench-pool.log"
  status=$((status | PIPESTATUS[0]))
fi
if [[ " $what " == *" soak "* ]]; then
  SOAK_DEVICE=gpu SOAK_SECONDS=${SOAK_SECONDS:-120} "$carry/test_soak" 2>&1 | tee "$out/soak-gpu.log"
  status=$((status | PIPESTATUS[0]))
fi
if [[ " $what " == *" chunked "* ]]; then
  MLXK_CUDA_ONLY=chunked "$carry/test_cuda" --test-threads=1 --nocapture --skip syntax:: \
    --skip text:: 2>&1 |
    tee "$out/test-chunked.log"
  status=$((status | PIPESTATUS[0]))
  "$carry/gpu_autograd" 2>&1 | tee -a "$out/test-chunked.log"
  status=$((status | PIPESTATUS[0]))
  MLXK_BENCH_ONLY=prefill MLXK_BENCH_JSON=$out/bench-prefill.jsonl "$carry/bench_cuda" 2>&1 |
    tee "$out/bench-prefill.log"
  status=$((status | PIPESTATUS[0]))
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla-site \
    "$carry"/wheels/*.whl >/dev/null 2>&1
  PYTHONPATH=/tmp/fla-site:${PYTHONPATH:-} python3 benches/peer_fla.py "$out/fla-prefill.jsonl" \
    prefill 2>&1 | tee "$out/fla-prefill.log"
fi
if [[ " $what " == *" tiles "* ]]; then
  "$carry/test_cuda" --test-threads=1 --nocapture --include-ignored tiles:: 2>&1 |
    tee "$out/test-tiles.log"
  status=$((status | PIPESTATUS[0]))
  for form in fma tf32 bf16; do
    MLXK_CUDA_TILES=$form MLXK_BENCH_ONLY=gradchunked \
      MLXK_BENCH_JSON=$out/bench-gradchunked-$form.jsonl "$carry/bench_cuda" 2>&1 |
      tee "$out/bench-gradchunked-$form.log"
    status=$((status | PIPESTATUS[0]))
  done
fi
if [[ " $what " == *" test "* ]]; then
  start=$(date +%s)
  "$carry/test_cuda" --test-threads=1 --nocapture --skip syntax:: --skip text:: 2>&1 |
    tee "$out/test-cuda.log"
  rc=${PIPESTATUS[0]}; status=$((status | rc))
  "$carry/test_vjp" --test-threads=1 vjp:: --skip chunked_vjp 2>&1 | tee -a "$out/test-cuda.log"
  rc=${PIPESTATUS[0]}; status=$((status | rc))
  "$carry/gpu_autograd" 2>&1 | tee -a "$out/test-cuda.log"
  rc2=${PIPESTATUS[0]}; status=$((status | rc2))
  echo "test-cuda: exit $status in $(( $(date +%s) - start )) s" | tee -a "$out/test-cuda.log"
fi
if [[ " $what " == *" bench "* ]]; then
  MLXK_BENCH_JSON=$out/bench-cuda.jsonl "$carry/bench_cuda" 2>&1 | tee "$out/bench-cuda.log"
  status=$((status | PIPESTATUS[0]))
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/fla-site \
    "$carry"/wheels/*.whl >/dev/null 2>&1
  rm -f "$out/fla.jsonl"  # each batch size's process appends its rows
  PYTHONPATH=/tmp/fla-site:${PYTHONPATH:-} python3 benches/peer_fla.py "$out/fla.jsonl" 2>&1 |
    tee "$out/fla.log"
  PYTHONPATH=/tmp/fla-site:${PYTHONPATH:-} python3 benches/peer_fla_chunk.py "$out/fla.jsonl" 2>&1 |
    tee -a "$out/fla.log"
  python3 benches/chart_cuda.py "$out/bench-cuda.png" "$out/bench-cuda.jsonl" "$out/fla.jsonl"
  python3 benches/tables.py "$out/bench-cuda.jsonl" "$out/fla.jsonl" >"$out/tables-cuda.md"
fi
exit $status
