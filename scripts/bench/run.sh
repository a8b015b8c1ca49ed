#!/usr/bin/env bash
# Benchmarks, run by `make bench`: mlxkern through its C ABI (benches/bench.c), MLX's own CPU
# path (benches/peer.py) and llama.cpp's CPU GGML_OP_GATED_DELTA_NET (benches/llama_peer.c,
# decode and prefill groups) on the same cases and inputs, all in this one invocation, group by
# group; then the merged table (stdout), build/bench/results.json and build/bench/chart.png
# (benches/report.py). Each side's raw figures stay in build/bench/parts/.
# build/bench/tables.md holds the same figures as markdown tables (benches/tables.py).
#
# Last, the engine layer: a whole Qwen3.5 layer (examples/cpp/qwen35_gdn.hpp) at 35B-A3B dims,
# decode and a 512-token prefill: (a) MLX ops + mlxkern kernels with zero-copy exchange, (b) the
# same through host memory, its parts alone (benches/engine.cpp, C++ on the .venv's MLX), and
# (c) mlx-lm's module (benches/engine_peer.py); its own table and results.json's "engine_layer".
#
# Then gradients: one layer's forward and backward at T = 512, 2048, 4096 (Qwen3.5-35B-A3B dims,
# B = 1): mlxkern's mlxk_gated_delta_update and mlxk_gated_delta_update_vjp (benches/grad.cpp)
# and MLX's paths under mx.value_and_grad (benches/grad_peer.py), each measurement in a fresh
# process (time and peak memory), T by T; an MLX path is skipped, with the reason printed, where
# its estimated memory or time would not fit. Their tables, results.json's "gradients" and
# build/bench/grad_chart.png.
#
# With them, the chunked form's forward + backward (mlxk_gated_delta_update_chunked and
# mlxk_gated_delta_update_chunked_vjp, benches/grad.cpp's cfwd / cbwd phases) beside
# bitsandbytes-cpu-fork's native CPU kernels (benches/grad_bnb.py through ctypes, its wheel fetched
# once by scripts/bench/bnb-peer.sh; skipped with one line without network), and the machine's float32
# multiply-add peak (benches/fma_peak.cpp), the yardstick of the chunked forward's efficiency.
#
# Then the pool section (benches/pool.cpp, C++ on the .venv's MLX; cases in benches/pool_cases.h):
# mlxkern's calls on a pool of states by slot at Qwen3.5-35B-A3B dims, one layer: continuous
# batching (64 slots, 32 decoding, a join with a 16-64 token prefill every 8 steps) through
# mlxk_gated_delta_update_pool, mlxk_gated_delta_update_packed, gather -> dense kernel -> scatter
# as MLX ops, and the dense kernel alone; packed prefill of 16 prompts (64-2048 tokens) packed,
# padded and one call per prompt, exact and chunked. Its table and results.json's "pool".
#
# With it, on macOS with an Apple GPU, the Metal chunked forward beside MLX 0.32.4's own
# gated-delta Metal kernels (benches/metal_chunked.py, build/bench/metal_chunked.jsonl).
#
# Last, the Python row (scripts/python/bench.py on the wheel scripts/python/dev-build.sh builds
# with this LIBDIR's library into build/py-site): mlx-lm's own Qwen3.5 model, prefill and
# generation tokens/s with and without mlxkern.mlx_lm.patch(), and one layer's update alone.
# Short by default (a 128-token prompt, 16 generated tokens, one repeat: minutes here, where
# mlx[cpu]'s reference BLAS makes the model's projections slow); MLXK_BENCH_PYTHON_FULL=1 runs
# the full one (512-token prompt, 64 tokens, 3 repeats; about 20 min here). Its log and json in
# build/bench/python.{log,json}, results.json's "python". Building the wheel needs the package
# index once (nanobind, scikit-build-core, cmake into build/pyenv); where that fails the row is
# skipped with one line and the rest is kept.
#
# The llama.cpp peer needs ggml, fetched and built once into build/llama.cpp/ by
# scripts/bench/llama-peer.sh (network for the first `pip download`, cmake, a C++ compiler); without
# them it is skipped with one line and the rest runs. A disagreement of its outputs with
# mlxkern's (checked before timing) drops its figures for that group, loudly.
#
# Expects the library built (`cargo build --lib`; the Makefile target does it) and .venv made
# by scripts/bootstrap.sh. matplotlib (for the chart only) is installed into .venv on first use.
# Environment: CC, CXX; LIBDIR (folder holding libmlxkern.so / .dylib, default target/debug);
# MLXK_BENCH_QUICK=1 (short run; gradients at T = 512 only); MLXK_BENCH_PEER_FULL=1 (run MLX's
# prefill at T=4096 too, about 10 s a call per path, instead of scaling its T=512 figure);
# MLXK_BENCH_ONLY=grad (the gradient section alone), MLXK_BENCH_ONLY=pool (the pool section
# alone; results.json then holds only it), MLXK_BENCH_ONLY=python (the Python row alone, the
# same way); MLXK_BENCH_GRAD_PEER_MAX_S and
# MLXK_BENCH_GRAD_PEER_MEM_GIB (benches/grad_peer.py's limits).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
CC=${CC:-cc}
CXX=${CXX:-c++}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
OUT=$ROOT/build/bench
PY=$ROOT/.venv/bin/python3
ONLY=${MLXK_BENCH_ONLY:-}
case $ONLY in
  ""|grad|pool|python) ;;
  *) echo "bench: MLXK_BENCH_ONLY must be empty, grad, pool or python, not $ONLY" >&2; exit 2 ;;
esac
quick=0
case ${MLXK_BENCH_QUICK:-} in ""|0) ;; *) quick=1 ;; esac

case "$(uname -s)" in
  Darwin) LIB=$LIBDIR/libmlxkern.dylib ;;
  *) LIB=$LIBDIR/libmlxkern.so ;;
esac
[ -f "$LIB" ] || { echo "bench: $LIB not found: build the library first (cargo build --lib)" >&2; exit 1; }
[ -x "$PY" ] || { echo "bench: $PY not found: run scripts/bootstrap.sh" >&2; exit 1; }

if ! "$PY" -c "import matplotlib" 2>/dev/null; then
  echo "bench: installing matplotlib into .venv (used only to draw the chart)"
  "$PY" -m pip install --quiet --disable-pip-version-check "matplotlib>=3.8,<4"
fi

mkdir -p "$OUT"
"$CC" -O2 -std=c11 -Wall -Wextra -Werror -pthread -I"$ROOT/include" -I"$ROOT/examples/common" \
  "$ROOT/benches/bench.c" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -lm -o "$OUT/bench"
MLX=$("$PY" -m mlx --cmake-dir)
"$CXX" -O2 -std=c++20 -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/examples/cpp" \
  -isystem "$MLX/include" "$ROOT/benches/engine.cpp" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" \
  -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib" -o "$OUT/engine"
"$CXX" -O2 -std=c++20 -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/examples/common" \
  -isystem "$MLX/include" "$ROOT/benches/grad.cpp" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" \
  -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib" -o "$OUT/grad"
"$CXX" -O2 -std=c++20 -Wall -Wextra -Werror -I"$ROOT/include" -I"$ROOT/examples/common" \
  -isystem "$MLX/include" "$ROOT/benches/pool.cpp" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" \
  -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib" -o "$OUT/pool"
"$CXX" -O2 -std=c++17 -Wall -Wextra -Werror -pthread "$ROOT/benches/fma_peak.cpp" -o "$OUT/fma_peak"

llama=0
if [ -z "$ONLY" ] && CC=$CC LIBDIR=$LIBDIR "$ROOT/scripts/bench/llama-peer.sh"; then
  llama=1
fi

# The 1-minute load average as a JSON list, or null.
loadavg() {
  if [ -r /proc/loadavg ]; then
    awk '{printf "[%s, %s, %s]", $1, $2, $3}' /proc/loadavg
  else
    printf null
  fi
}

# One case group at a time, mlxkern then MLX then llama.cpp, so that every side of each ratio
# is measured within seconds of the others (other work on the machine changes over minutes).
PARTS=$OUT/parts
rm -rf "$PARTS"
mkdir -p "$PARTS"
kern_parts=()
peer_parts=()
llama_parts=()
start=$(date +%s)
load_start=$(loadavg)
groups=(decode1 decode4 decode16 prefill replay small)
if [ -n "$ONLY" ]; then
  groups=()
fi
for group in ${groups[@]+"${groups[@]}"}; do
  echo "== $group: mlxkern (C ABI) =="
  "$OUT/bench" "$PARTS/mlxkern-$group.json" "$group"
  echo "== $group: MLX CPU peer =="
  "$PY" "$ROOT/benches/peer.py" "$PARTS/peer-$group.json" "$group"
  kern_parts+=("$PARTS/mlxkern-$group.json")
  peer_parts+=("$PARTS/peer-$group.json")
  case $group in
    decode*|prefill)
      if [ "$llama" = 1 ]; then
        echo "== $group: llama.cpp CPU peer =="
        rc=0
        "$OUT/llama_peer" "$PARTS/llama-$group.json" "$group" || rc=$?
        if [ "$rc" = 3 ]; then
          echo "bench: LLAMA.CPP PEER FAILED its agreement check with mlxkern on $group (above):" \
               "its figures for the failed case are left out" >&2
        elif [ "$rc" != 0 ]; then
          echo "bench: LLAMA.CPP PEER FAILED on $group (exit status $rc): left out" >&2
        fi
        if [ -f "$PARTS/llama-$group.json" ]; then
          llama_parts+=("$PARTS/llama-$group.json")
        fi
      fi
      ;;
  esac
  echo
done
if [ -z "$ONLY" ]; then
  echo "== engine layer: (a) zero copy, (b) through host memory, the parts alone =="
  "$OUT/engine" "$PARTS/engine.json"
  echo "== engine layer: (c) mlx-lm's module =="
  "$PY" "$ROOT/benches/engine_peer.py" "$PARTS/engine-peer.json"
  echo
fi

# The pool section: its own table; merged into results.json at the end.
pool_rc=0
if [ -z "$ONLY" ] || [ "$ONLY" = pool ]; then
  echo "== pool: continuous batching and packed prefill (C ABI on a pool of states) =="
  "$OUT/pool" "$PARTS/pool.json" || pool_rc=$?
  if [ "$pool_rc" = 3 ]; then
    echo "bench: POOL: a documented bit-for-bit equality FAILED (above); its figures are kept" >&2
  elif [ "$pool_rc" != 0 ]; then
    echo "bench: POOL FAILED (exit status $pool_rc)" >&2
  fi
  echo
fi

# Gradients, T by T: mlxkern's forward and backward (a process each), then MLX's paths (which
# estimate their memory and time from the smaller T already measured, in the earlier parts).
grad_lengths=(512 2048 4096)
if [ "$quick" = 1 ]; then
  grad_lengths=(512)
fi
if [ "$ONLY" = pool ] || [ "$ONLY" = python ]; then
  grad_lengths=()
fi
grad_parts=()
grad_peer_parts=()
native_parts=()
bnb=""
if [ "${#grad_lengths[@]}" -gt 0 ]; then
  bnb=$("$ROOT/scripts/bench/bnb-peer.sh") || bnb=""
  echo "== float32 multiply-add peak =="
  "$OUT/fma_peak" "$PARTS/fma-peak.json" && native_parts+=("$PARTS/fma-peak.json")
fi
for t in ${grad_lengths[@]+"${grad_lengths[@]}"}; do
  for phase in cfwd cbwd; do
    echo "== gradients T=$t: mlxkern chunked ${phase#c} (C ABI, own process) =="
    "$OUT/grad" "$PARTS/grad-$phase-T$t.json" "$t" "$phase"
    native_parts+=("$PARTS/grad-$phase-T$t.json")
  done
  if [ -n "$bnb" ]; then
    echo "== gradients T=$t: bitsandbytes-cpu-fork native CPU kernels (own process) =="
    OMP_NUM_THREADS=${MLXK_NUM_THREADS:-$(( $(nproc) < 8 ? $(nproc) : 8 ))} \
      "$PY" "$ROOT/benches/grad_bnb.py" "$bnb" "$PARTS/grad-bnb-T$t.json" "$t"
    native_parts+=("$PARTS/grad-bnb-T$t.json")
  fi
  for phase in fwd bwd; do
    echo "== gradients T=$t: mlxkern $phase (C ABI, own process) =="
    "$OUT/grad" "$PARTS/grad-$phase-T$t.json" "$t" "$phase"
    grad_parts+=("$PARTS/grad-$phase-T$t.json")
  done
  echo "== gradients T=$t: MLX CPU paths (a process per measurement) =="
  "$PY" "$ROOT/benches/grad_peer.py" "$PARTS/grad-peer-T$t.json" "$t" ${grad_peer_parts[@]+"${grad_peer_parts[@]}"}
  grad_peer_parts+=("$PARTS/grad-peer-T$t.json")
  echo
done

# The Python row: mlx-lm with and without mlxkern.mlx_lm.patch() (scripts/python/bench.py).
python_rc=0
if [ -z "$ONLY" ] || [ "$ONLY" = python ]; then
  echo "== python: mlx-lm prefill and generation, with and without mlxkern.mlx_lm.patch() =="
  py_quick=1
  case ${MLXK_BENCH_PYTHON_FULL:-} in ""|0) ;; *) py_quick=0 ;; esac
  if MLXKERN_LIB=$LIB "$ROOT/scripts/python/dev-build.sh" >"$PARTS/python-build.log" 2>&1; then
    MLXK_BENCH_QUICK=$py_quick PYTHONPATH="$ROOT/build/py-site:$ROOT/python/tests" \
      "$PY" "$ROOT/scripts/python/bench.py" "$PARTS/python.json" >"$OUT/python.log" \
      || python_rc=$?
    cat "$OUT/python.log"
    if [ "$python_rc" = 0 ]; then
      cp "$PARTS/python.json" "$OUT/python.json"
    else
      echo "bench: PYTHON ROW FAILED (exit status $python_rc)" >&2
    fi
    # On an Apple GPU: the Metal chunked forward beside MLX's own Metal gated-delta kernels
    # (benches/metal_chunked.py; one line and nothing else elsewhere).
    PYTHONPATH="$ROOT/build/py-site" "$PY" "$ROOT/benches/metal_chunked.py" "$OUT/metal_chunked.jsonl" ||
      echo "bench: the Metal chunked rows failed (above)" >&2
  else
    echo "bench: python row skipped: the wheel did not build (log: $PARTS/python-build.log)" >&2
  fi
  echo
fi
load_end=$(loadavg)
printf '{"loadavg_start": %s, "loadavg_end": %s, "seconds": %d}\n' "$load_start" "$load_end" \
  "$(( $(date +%s) - start ))" >"$PARTS/run.json"
echo "== results =="
llama_args=()
if [ "${#llama_parts[@]}" -gt 0 ]; then
  llama_args=(--llama "${llama_parts[@]}")
fi
kernel_args=()
if [ -z "$ONLY" ]; then
  kernel_args=(--mlxkern "${kern_parts[@]}" --peer "${peer_parts[@]}" ${llama_args[@]+"${llama_args[@]}"}
               --engine "$PARTS/engine.json" "$PARTS/engine-peer.json")
fi
if [ -z "$ONLY" ] || [ "$ONLY" = grad ]; then
  "$PY" "$ROOT/benches/report.py" "$OUT" --run "$PARTS/run.json" ${kernel_args[@]+"${kernel_args[@]}"} \
    --grad "${grad_parts[@]}" --grad-peer "${grad_peer_parts[@]}" \
    ${native_parts[@]+--grad-native "${native_parts[@]}"}
fi
# results.json's "pool" and "python": the parts as written (MLXK_BENCH_ONLY=pool or python:
# results.json holds that one alone).
for key in pool python; do
  [ -f "$PARTS/$key.json" ] || continue
  "$PY" - "$OUT/results.json" "$PARTS/$key.json" "$key" "$ONLY" <<'EOF'
import json, sys
path, part, key, only = sys.argv[1:]
results = {}
if not only:
    with open(path) as f:
        results = json.load(f)
with open(part) as f:
    results[key] = json.load(f)
with open(path, "w") as f:
    json.dump(results, f, indent=1)
print(f"bench: results.json's \"{key}\" from {part}")
EOF
done
# The same figures as markdown tables in docs/performance-cpu.md's layout, with the run's context.
if [ -f "$OUT/results.json" ]; then
  "$PY" "$ROOT/benches/tables.py" "$OUT/results.json" >"$OUT/tables.md" && echo "bench: wrote $OUT/tables.md"
fi
echo "bench: total $(( $(date +%s) - start )) s"
if [ "$pool_rc" != 0 ]; then
  exit "$pool_rc"
fi
exit "$python_rc"
