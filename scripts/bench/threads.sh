#!/usr/bin/env bash
# The worker pool on a shared machine: decode (B = 1, 30 chained steps) and prefill (T = 4096,
# exact and chunked) through the C ABI (benches/bench.c) with 1 and 2 threads
# (MLXK_NUM_THREADS), on a quiet machine and with 1 and 2 competing CPU-bound processes (busy
# loops started here). Prints the medians and the 2-thread / 1-thread speed-up per setting.
#
#   scripts/bench/threads.sh [ROUNDS]      (default 3; results in build/bench-threads/)
# BENCH_GROUPS (default "decode1 prefill") picks the benches/bench.c groups.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
LIBDIR=${LIBDIR:-$ROOT/target/debug}
ROUNDS=${1:-3}
CC=${CC:-cc}
OUT=$ROOT/build/bench-threads
PY=$ROOT/.venv/bin/python3
[ -x "$PY" ] || PY=python3
rm -rf "$OUT"
mkdir -p "$OUT"
"$CC" -O2 -std=c11 -Wall -Wextra -Werror -pthread -I"$ROOT/include" -I"$ROOT/examples/common" \
  "$ROOT/benches/bench.c" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -lm -o "$OUT/bench"
lscpu | grep -E 'Model name' | sed 's/^/cpu: /; s/  */ /g'
echo "cpus online: $(nproc)"
busy=()
stop_busy() {
  for p in "${busy[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  busy=()
}
trap stop_busy EXIT
for round in $(seq 1 "$ROUNDS"); do
  for load in 0 1 2; do
    stop_busy
    for _ in $(seq 1 "$load"); do
      (while :; do :; done) &
      busy+=($!)
    done
    for threads in 1 2; do
      MLXK_NUM_THREADS=$threads MLXK_BENCH_QUICK=1 "$OUT/bench" \
        "$OUT/r$round-load$load-t$threads.json" ${BENCH_GROUPS:-decode1 prefill} >/dev/null
    done
  done
  stop_busy
  echo "round $round of $ROUNDS done, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
"$PY" - "$OUT" <<'PY'
import glob, json, os, re, statistics, sys
out = sys.argv[1]
rows = {}
for path in glob.glob(os.path.join(out, "r*-load*-t*.json")):
    m = re.search(r"load(\d)-t(\d)", path)
    load, threads = int(m.group(1)), int(m.group(2))
    for r in json.load(open(path))["records"]:
        if r["impl"] != "mlxkern" or r["id"] not in (
                "decode_hot_chained_B1", "prefill_T4096_B1", "prefill_chunked_T4096_B1"):
            continue
        rows.setdefault((r["id"], load), {}).setdefault(threads, []).append(r["median_us"])
print(f"{'case':28s} {'competing':>9s} {'1 thread':>12s} {'2 threads':>12s} {'2t speed-up':>11s}")
for (case, load) in sorted(rows):
    t = rows[(case, load)]
    if 1 in t and 2 in t:
        a, b = statistics.median(t[1]), statistics.median(t[2])
        print(f"{case:28s} {load:9d} {a:10.1f}us {b:10.1f}us {a / b:10.2f}x")
PY
