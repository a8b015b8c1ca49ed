#!/usr/bin/env bash
# On the CUDA machine with Nsight Compute: one launch of each kernel at a bandwidth-bound size,
# speed of light, occupancy, launch, warp stalls, scheduler, memory and instruction statistics,
# at the GPU's own clocks (--clock-control none: Nsight Compute otherwise locks them to base,
# ~1.45 GHz on an H200), and MLX's floor op on the same decode B = 32 states beside them;
# then, where Nsight Systems is installed, the kernels' own durations in a decode B = 32 run
# (without the profiler's clock lock).
# Usage: scripts/cuda/ncu.sh OUT_DIR [LAUNCH...]
#   LAUNCH: decode8, decode32, floor32, replay32, split512, norm512 (default: all six),
#   fromconv32 (mlxk_gated_delta_update_from_conv's kernel at B = 32), or
#   rowsB.R: the dispatch group's rows sweep, recurrence text at batch B (8, 32 or 256) with R
#   value rows a warp (1, 2, 4, 8, 16); replay32.R: its replay sweep (T = 8, B = 32; R = 2, 4,
#   8, 16); chunked4096: every kernel of one chunked prefill (C = 64, T = 4096: the launches
#   named mlxk_gated_delta_chunked*, after two calls' warm-up), with each kernel's FLOP rate
#   against the float32 FMA, tf32 and bf16 tensor-core floors (scripts/cuda/ncu_flops.py);
#   chunkedgrad4096: every kernel of one chunked forward + backward at T = 4096.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/cuda/out}
shift || true
mkdir -p "$out"
# shellcheck disable=SC1091
source scripts/cuda/carry-env.sh
ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
nsys_bin=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems*/bin/nsys 2>/dev/null | head -1)
echo "ncu: ${ncu_bin:-none}; nsys: ${nsys_bin:-none}"
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats
  --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis
  --section InstructionStats)
profile() {  # name group kernel-regex skip [env...]; name_base=demangled matches the full name
  local name=$1 group=$2 kernel=$3 skip=$4
  shift 4
  [ -n "$ncu_bin" ] || return 0
  env MLXK_BENCH_ONLY="$group" MLXK_BENCH_QUICK=1 "$@" timeout 150 "$ncu_bin" \
    --kernel-name-base "${name_base:-function}" --kernel-name "regex:$kernel" \
    --launch-skip "$skip" --launch-count 1 --clock-control none "${sections[@]}" \
    "$carry/bench_cuda" > "$out/ncu-$name.txt" 2>&1
  echo "== $name"
  grep -E "Duration|DRAM Throughput|Compute \(SM\)|L1/TEX Cache Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Executed Instructions  |No Eligible|Block Size|Grid Size|Waves Per SM|Mem Busy" \
    "$out/ncu-$name.txt" | head -40
  grep -E "^ +(OPT|WRN)" -A3 "$out/ncu-$name.txt" | head -30
}
profile_many() {  # as profile, `count` launches, and a line per kernel: duration, FLOP rate
  local name=$1 group=$2 kernel=$3 skip=$4
  shift 4
  [ -n "$ncu_bin" ] || return 0
  env MLXK_BENCH_ONLY="$group" MLXK_BENCH_QUICK=1 "$@" timeout 400 "$ncu_bin" \
    --kernel-name-base function --kernel-name "regex:$kernel" --launch-skip "$skip" \
    --launch-count "${count:-8}" --clock-control none --section SpeedOfLight \
    --section LaunchStats --section Occupancy \
    "$carry/bench_cuda" > "$out/ncu-$name.txt" 2>&1
  echo "== $name"
  python3 scripts/cuda/ncu_flops.py "$out/ncu-$name.txt" 4096 "${flops_kind:-fwd}" | tee "$out/ncu-$name-flops.txt"
}
launches=${*:-decode8 decode32 floor32 replay32 split512 norm512}
for launch in $launches; do
  case $launch in
    decode8) profile decode8 decode mlxk_gated_delta_step 60 MLXK_BENCH_BATCH=8 ;;
    decode32) profile decode32 decode mlxk_gated_delta_step 60 MLXK_BENCH_BATCH=32 ;;
    # MLX's unary kernel of the floor op (mx::negative), which the decode group runs first
    # (the inputs' setup runs other unary kernels before it: the op is in the template).
    floor32) name_base=demangled profile floor32 decode "unary.*Negative" 60 MLXK_BENCH_BATCH=32 ;;
    # replay group, quick: B = 1 takes 13 evals x 30 layers = 390 launches, then B = 32.
    replay32) profile replay32 replay mlxk_gated_delta_state 420 ;;
    split512) profile split512 "head split" mlxk_silu_rms_heads 400 ;;
    norm512) profile norm512 "gated norm" mlxk_gated_rms_norm 400 ;;
    # layer group, quick: the update from the convolution's output at B = 1 and 8 takes 13
    # evals x 30 layers = 390 launches each, then B = 32.
    fromconv32) profile fromconv32 layer mlxk_gated_delta_from_conv 800 ;;
    rows*)
      # The sweep runs batch 8, 32, 256 in turn, each quick config 13 evals x 30 layers = 390
      # launches of the same kernel name (ROWS is in the name, the batch only in the grid).
      spec=${launch#rows} b=${spec%.*} r=${spec#*.}
      case $b in 8) before=0 ;; 32) before=390 ;; 256) before=780 ;; *) before=-1 ;; esac
      [ "$before" -ge 0 ] || { echo "ncu.sh: $launch: batch 8, 32 or 256"; exit 2; }
      profile "$launch" dispatch "mlxk_probe_recurrence_128_128_16_32_${r}_" $((before + 60)) ;;
    replay32.*)
      # The dispatch group's replay sweep (T = 8, B = 32), R value rows a warp.
      profile "$launch" dispatch "mlxk_probe_replay_128_128_16_32_${launch#replay32.}\$" 60 ;;
    chunked4096)
      count=12 profile_many chunked4096 prefill "mlxk_gated_delta_chunked" 24 MLXK_BENCH_T=4096 \
        MLXK_BENCH_CHUNK=64 ;;
    chunkedgrad4096)
      flops_kind=fwdbwd count=16 profile_many chunkedgrad4096 gradchunked "mlxk_gated_delta_chunked" 14 MLXK_BENCH_T=4096 ;;
    *) echo "ncu.sh: unknown launch $launch (decode8, decode32, floor32, replay32, split512, norm512, fromconv32, rowsB.R, replay32.R)"; exit 2 ;;
  esac
done
if [ -n "$nsys_bin" ]; then
  MLXK_BENCH_ONLY=decode MLXK_BENCH_BATCH=32 MLXK_BENCH_QUICK=1 timeout 200 "$nsys_bin" profile \
    -o "$out/decode32" --force-overwrite true --stats=false "$carry/bench_cuda" > "$out/nsys.log" 2>&1
  timeout 120 "$nsys_bin" stats -r cuda_gpu_kern_sum "$out/decode32.nsys-rep" 2>&1 |
    tee "$out/nsys-kernels.txt" | head -30
  rm -f "$out"/decode32.nsys-rep "$out"/decode32.sqlite
fi
