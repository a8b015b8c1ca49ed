#!/usr/bin/env bash
# The Gated DeltaNet layer sharded by heads across processes on MLX's distributed layer
# (examples/cpp/qwen35_tp.cpp, docs/sharding.md): R processes on this machine joined by MLX's
# ring backend over TCP on 127.0.0.1, each running its share of the heads with its own state
# pools and one all_sum per step, then the one-process layer on the same random weights and
# inputs and the comparison (the engine test's bounds; every rank's output the same bits).
#
#   scripts/test/distributed.sh                 the default cases (below)
#   MLXK_DIST_CASES="2:small:float32 4:35b:model" scripts/test/distributed.sh
#
# A case is RANKS:CONFIG:REDUCE (CONFIG small or 35b: Qwen3.5-35B-A3B's layer; REDUCE float32 or
# model: the all_sum's dtype). Ports: free ones are asked of the kernel for each run; a run
# whose rank could not bind its port is tried again on others (3 tries). Every process runs
# under a time limit (MLXK_DIST_TIMEOUT seconds, default 300); when one rank fails the others
# are stopped at once, and on any exit no process of the run is left behind.
#
# Environment: CXX (default c++), LIBDIR (folder of libmlxkern.so; default target/debug), BUILD
# (default build), MLXK_DIST_SEED (default: random, printed), MLXK_DIST_CASES,
# MLXK_DIST_TIMEOUT. Needs the library built (cargo build --lib) and the .venv (make bootstrap).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CXX=${CXX:-c++}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
BUILD=${BUILD:-$ROOT/build}
OUT=$BUILD/distributed
PY=$ROOT/.venv/bin/python3
CASES=${MLXK_DIST_CASES:-"2:small:float32 2:small:model 4:small:float32 4:small:model
  2:35b:float32 2:35b:model"}
CASES=$(echo $CASES)  # one line
LIMIT=${MLXK_DIST_TIMEOUT:-300}
SEED=${MLXK_DIST_SEED:-$((RANDOM * 32768 + RANDOM))}

fail() {
  echo "FAIL: test-distributed: $*" >&2
  exit 1
}
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

[ "$(uname -s)" = Linux ] || [ "$(uname -s)" = Darwin ] || fail "runs on Linux or macOS"
command -v "$CXX" >/dev/null ||
  fail "C++ compiler '$CXX' not found: apt-get install g++ (or set CXX)"
command -v timeout >/dev/null || fail "timeout not found: apt-get install coreutils"
[ -x "$PY" ] || fail "$PY not found: run make bootstrap"
case "$(uname -s)" in
  Darwin) LIB=$LIBDIR/libmlxkern.dylib ;;
  *) LIB=$LIBDIR/libmlxkern.so ;;
esac
[ -f "$LIB" ] || fail "$LIB not found: build the library first (cargo build --lib)"
MLX=$("$PY" -m mlx --cmake-dir) || fail "$PY -m mlx --cmake-dir failed: run make bootstrap"
"$PY" -c 'import mlx.core as mx, sys; sys.exit(0 if mx.distributed.is_available() else 1)' ||
  fail "the .venv's MLX has no distributed backend"
mkdir -p "$OUT"
total_start=$(now)

# Processes this script started (rank processes under timeout); stopped on any exit.
PIDS=()
stop_ranks() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null && kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
trap stop_ranks EXIT
trap 'stop_ranks; exit 130' INT TERM

start=$(now)
"$CXX" -std=c++20 -Wall -Wextra -Werror -pedantic -Wold-style-cast -Wshadow -O2 \
  -I"$ROOT/include" -isystem "$MLX/include" "$ROOT/examples/cpp/qwen35_tp.cpp" \
  -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib" \
  -o "$OUT/qwen35_tp" || fail "examples/cpp/qwen35_tp.cpp does not build"
echo "PASS: examples/cpp/qwen35_tp builds (-std=c++20 -Werror -pedantic) [$(since "$start")]"

# RANKS free TCP ports on 127.0.0.1, held open together while they are chosen.
free_ports() {
  "$PY" - "$1" <<'EOF'
import socket, sys
held = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    held.append(s)
print(" ".join(str(s.getsockname()[1]) for s in held))
EOF
}

# Runs RANKS rank processes into DIR; returns 0, 1 (a rank failed), or 3 (a port was taken).
run_ranks() {
  local ranks=$1 config=$2 reduce=$3 dir=$4 ports hosts rank pid rc status=0 alive
  read -r -a ports <<<"$(free_ports "$ranks")"
  hosts=$(printf '["127.0.0.1:%s"],' "${ports[@]}")
  echo "[${hosts%,}]" >"$dir/hosts.json"
  rm -f "$dir"/rank*.safetensors "$dir"/rank*.log
  PIDS=()
  for ((rank = 0; rank < ranks; rank++)); do
    MLX_RANK=$rank MLX_HOSTFILE=$dir/hosts.json timeout -k 5 "$LIMIT" \
      "$OUT/qwen35_tp" rank --ranks "$ranks" --config "$config" --reduce "$reduce" \
      --seed "$SEED" --out "$dir" >"$dir/rank$rank.log" 2>&1 &
    PIDS+=($!)
  done
  # Wait for all; the first failure stops the rest (a rank whose peer is gone waits for it).
  alive=$ranks
  while [ "$alive" -gt 0 ]; do
    alive=0
    for rank in "${!PIDS[@]}"; do
      pid=${PIDS[$rank]}
      [ "$pid" = done ] && continue
      if kill -0 "$pid" 2>/dev/null; then
        alive=$((alive + 1))
        continue
      fi
      rc=0
      wait "$pid" || rc=$?
      PIDS[$rank]=done
      if [ "$rc" != 0 ]; then
        if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
          echo "rank $rank: no result within ${LIMIT} s" >>"$dir/rank$rank.log"
        fi
        echo "rank $rank exited with status $rc" >>"$dir/rank$rank.log"
        status=1
      fi
    done
    if [ "$status" != 0 ]; then
      for pid in "${PIDS[@]}"; do [ "$pid" = done ] || kill "$pid" 2>/dev/null || true; done
      for pid in "${PIDS[@]}"; do [ "$pid" = done ] || wait "$pid" 2>/dev/null || true; done
      PIDS=()
      grep -q "Couldn't bind" "$dir"/rank*.log && return 3
      return 1
    fi
    [ "$alive" -gt 0 ] && sleep 0.1
  done
  PIDS=()
  return 0
}

echo "seed $SEED (MLXK_DIST_SEED to replay); cases: $CASES"
for case in $CASES; do
  IFS=: read -r ranks config reduce <<<"$case"
  [ -n "$reduce" ] || fail "case '$case': expected RANKS:CONFIG:REDUCE"
  dir=$OUT/$ranks-$config-$reduce
  mkdir -p "$dir"
  start=$(now)
  for try in 1 2 3; do
    rc=0
    run_ranks "$ranks" "$config" "$reduce" "$dir" || rc=$?
    [ "$rc" = 3 ] || break
    echo "note: $case: a port was taken before rank could bind it; try $((try + 1)) on others"
  done
  if [ "$rc" != 0 ]; then
    for log in "$dir"/rank*.log; do echo "--- $log" >&2; cat "$log" >&2; done
    fail "$case: a rank failed (logs above, and in $dir)"
  fi
  ranks_time=$(since "$start")
  cat "$dir"/rank*.log
  timeout -k 5 "$LIMIT" "$OUT/qwen35_tp" reference --ranks "$ranks" --config "$config" \
    --reduce "$reduce" --seed "$SEED" --out "$dir" ||
    fail "$case: the sharded layer does not agree with the one-process layer (above)"
  echo "PASS: $case: $ranks ranks over the ring backend on 127.0.0.1 agree with the one-process" \
    "layer [ranks $ranks_time, total $(since "$start")]"
done
# The comparison is not vacuous: the one-process layer on other weights (seed + 1) must fail
# it, and a split that breaks a GQA group must be refused with a message naming --ranks.
start=$(now)
IFS=: read -r ranks config reduce <<<"${CASES%% *}"
dir=$OUT/$ranks-$config-$reduce
rc=0
"$OUT/qwen35_tp" reference --ranks "$ranks" --config "$config" --reduce "$reduce" \
  --seed "$((SEED + 1))" --out "$dir" >"$OUT/other-weights.log" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "^FAIL: " "$OUT/other-weights.log" ||
  { cat "$OUT/other-weights.log" >&2; fail "other weights were not caught (status $rc)"; }
rc=0
msg=$("$OUT/qwen35_tp" reference --ranks 3 --out "$dir" 2>&1) || rc=$?
[ "$rc" = 2 ] && [[ "$msg" == *"ranks: 3 does not divide the 4 key heads"* ]] ||
  fail "--ranks 3 on 4 key heads: status $rc, '$msg'"
echo "PASS: the one-process layer on other weights fails the comparison" \
  "($(grep -o 'worst |d|/tolerance [0-9.e+]*' "$OUT/other-weights.log")); --ranks 3 on 4 key" \
  "heads is refused: '$msg' [$(since "$start")]"

# No rank process outlives its run (pgrep where present, else /proc).
if command -v pgrep >/dev/null; then
  left=$(pgrep -f "^$OUT/qwen35_tp rank" || true)
else
  left=$(for f in /proc/[0-9]*/cmdline; do
    tr '\0' ' ' <"$f" 2>/dev/null | grep -q "^$OUT/qwen35_tp rank" && basename "$(dirname "$f")"
  done || true)
fi
[ -z "$left" ] || fail "rank processes left behind: $(echo $left)"
echo "PASS: scripts/test/distributed.sh [$(since "$total_start") total]"
