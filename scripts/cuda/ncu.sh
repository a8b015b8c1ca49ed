#!/usr/bin/env bash
# On the CUDA machine with Nsight Compute: one launch of each kernel at a bandwidth-bound size
# (decode B = 32, head split S = 512, gated norm S = 512), speed of light, occupancy, warp
# stalls and memory workload. Usage: scripts/cuda/ncu.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/cuda/out}
mkdir -p "$out"
# shellcheck disable=SC1091
source scripts/cuda/carry-env.sh
ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
[ -n "$ncu_bin" ] || { echo "ncu: not installed"; exit 0; }
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis)
profile() {  # name group kernel-regex skip [env...]
  local name=$1 group=$2 kernel=$3 skip=$4
  shift 4
  env MLXK_BENCH_ONLY="$group" MLXK_BENCH_QUICK=1 "$@" timeout 150 "$ncu_bin" \
    --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 "${sections[@]}" \
    "$carry/bench_cuda" > "$out/ncu-$name.txt" 2>&1
  echo "== $name"
  grep -E "Duration|DRAM Throughput|L1/TEX Cache Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|stall|Block Size|Grid Size|L1/TEX Hit|Mem Busy" \
    "$out/ncu-$name.txt" | head -40
  grep -E "^ +(OPT|WRN)" -A3 "$out/ncu-$name.txt" | head -30
}
profile decode32 decode mlxk_gated_delta_step 60 MLXK_BENCH_BATCH=32
profile split512 "head split" mlxk_silu_rms_heads 400
profile norm512 "gated norm" mlxk_gated_rms_norm 400
