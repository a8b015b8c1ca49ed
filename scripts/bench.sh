#!/usr/bin/env bash
# Benchmarks, run by `make bench`: mlxkern through its C ABI (benches/bench.c) and MLX's own
# CPU path on the same cases and inputs (benches/peer.py), both in this one invocation, group
# by group; then the merged table (stdout), build/bench/results.json and build/bench/chart.png
# (benches/report.py). Each side's raw figures stay in build/bench/parts/.
#
# Expects the library built (`cargo build --lib`; the Makefile target does it) and .venv made
# by scripts/bootstrap.sh. matplotlib (for the chart only) is installed into .venv on first use.
# Environment: CC; LIBDIR (folder holding libmlxkern.so / .dylib, default target/debug);
# MLXK_BENCH_QUICK=1 (short run); MLXK_BENCH_PEER_FULL=1 (run MLX's prefill at T=4096 too,
# about 10 s a call per path, instead of scaling its T=512 figure).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
CC=${CC:-cc}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
OUT=$ROOT/build/bench
PY=$ROOT/.venv/bin/python3

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
"$CC" -O2 -std=c11 -Wall -Wextra -Werror -pthread -I"$ROOT/include" -I"$ROOT/tests/common" \
  "$ROOT/benches/bench.c" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -lm -o "$OUT/bench"

# One case group at a time, mlxkern then MLX, so that both sides of each ratio are measured
# within seconds of each other (other work on the machine changes over minutes).
PARTS=$OUT/parts
rm -rf "$PARTS"
mkdir -p "$PARTS"
kern_parts=()
peer_parts=()
start=$(date +%s)
for group in decode1 decode4 decode16 prefill replay small; do
  echo "== $group: mlxkern (C ABI) =="
  "$OUT/bench" "$PARTS/mlxkern-$group.json" "$group"
  echo "== $group: MLX CPU peer =="
  "$PY" "$ROOT/benches/peer.py" "$PARTS/peer-$group.json" "$group"
  kern_parts+=("$PARTS/mlxkern-$group.json")
  peer_parts+=("$PARTS/peer-$group.json")
  echo
done
echo "== results =="
"$PY" "$ROOT/benches/report.py" "$OUT" --mlxkern "${kern_parts[@]}" --peer "${peer_parts[@]}"
echo "bench: total $(( $(date +%s) - start )) s"
