#!/usr/bin/env bash
# On the CUDA machine: where the recurrence's and replay's time goes. Nsight Compute on one
# launch each (decode B = 8 and 32, replay T = 8 at B = 32), then, where Nsight Systems is
# installed, the kernels' own durations in a decode B = 32 run (without the profiler's clock
# lock). Usage: scripts/cuda/profile.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/cuda/out}
mkdir -p "$out"
# shellcheck disable=SC1091
source scripts/cuda/carry-env.sh
ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
nsys_bin=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "ncu: ${ncu_bin:-none}; nsys: ${nsys_bin:-none}"
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis
  --section InstructionStats)
profile() {  # name group kernel-regex skip [env...]
  local name=$1 group=$2 kernel=$3 skip=$4
  shift 4
  [ -n "$ncu_bin" ] || return 0
  env MLXK_BENCH_ONLY="$group" MLXK_BENCH_QUICK=1 "$@" timeout 150 "$ncu_bin" \
    --kernel-name "regex:$kernel" --launch-skip "$skip" --launch-count 1 "${sections[@]}" \
    "$carry/bench_cuda" > "$out/ncu-$name.txt" 2>&1
  echo "== $name"
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Executed Instructions  |Grid Size|Waves Per SM" \
    "$out/ncu-$name.txt" | head -20
}
profile decode8 decode mlxk_gated_delta_step 60 MLXK_BENCH_BATCH=8
profile decode32 decode mlxk_gated_delta_step 60 MLXK_BENCH_BATCH=32
# replay group, quick: B = 1 takes 13 evals x 30 layers = 390 launches, then B = 32.
profile replay32 replay mlxk_gated_delta_state 420
if [ -n "$nsys_bin" ]; then
  MLXK_BENCH_ONLY=decode MLXK_BENCH_BATCH=32 MLXK_BENCH_QUICK=1 timeout 200 "$nsys_bin" profile \
    -o "$out/decode32" --force-overwrite true --stats=false "$carry/bench_cuda" > "$out/nsys.log" 2>&1
  timeout 120 "$nsys_bin" stats -r cuda_gpu_kern_sum "$out/decode32.nsys-rep" 2>&1 |
    tee "$out/nsys-kernels.txt" | head -30
  rm -f "$out"/decode32.nsys-rep "$out"/decode32.sqlite
fi
