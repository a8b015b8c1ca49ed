#!/usr/bin/env bash
# On the CUDA machine, after scripts/cuda/device.sh has staged MLX (or with MLX_DIR set): where
# decode's time goes. Runs bench_cuda's decode and dispatch rows, and, where Nsight Compute is
# installed, profiles one recurrence launch at B = 32 (memory throughput, occupancy).
# Usage: scripts/cuda/probe.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/cuda/out}
mkdir -p "$out"
# shellcheck disable=SC1091
source scripts/cuda/carry-env.sh
{ for tool in ncu nsys perf; do printf '%s: %s\n' "$tool" "$(command -v $tool || echo none)"; done
  ls -d /usr/local/cuda*/bin 2>/dev/null; lscpu | grep -m1 'Model name'; uptime; } |
  tee "$out/probe-env.txt"
MLXK_BENCH_ONLY=decode "$carry/bench_cuda" 2>&1 | tee "$out/probe-decode.log"
MLXK_BENCH_ONLY=dispatch "$carry/bench_cuda" 2>&1 | tee "$out/probe-dispatch.log"
ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu_bin" ]; then
  MLXK_BENCH_ONLY=decode MLXK_BENCH_BATCH=32 MLXK_BENCH_QUICK=1 timeout 240 "$ncu_bin" \
    --kernel-name regex:mlxk_gated_delta_step --launch-skip 60 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis \
    --section LaunchStats "$carry/bench_cuda" > "$out/probe-ncu.txt" 2>&1
  tail -80 "$out/probe-ncu.txt"
fi
