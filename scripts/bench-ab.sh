#!/usr/bin/env bash
# A/B benchmark of two builds of the library through the C ABI (benches/bench.c), for changes
# that must keep speed (refactors): the same cases, the two libraries alternated group by group
# and round by round, so both see the same machine load. Prints, per case, the median over
# rounds of each side's median, and their ratio B/A.
#
#   scripts/bench-ab.sh LIBDIR_A LIBDIR_B [ROUNDS] [GROUP...]
#
# LIBDIR_*: folders holding libmlxkern.so (e.g. a copy of target/debug made before a change, and
# target/debug). ROUNDS defaults to 3; groups default to all (decode1 decode4 decode16 prefill
# replay small). MLXK_BENCH_QUICK=1 shortens each run. Output: build/bench-ab/.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
[ $# -ge 2 ] || { sed -n 2,12p "$0"; exit 2; }
A=$(cd "$1" && pwd)
B=$(cd "$2" && pwd)
ROUNDS=${3:-3}
shift $(( $# >= 3 ? 3 : 2 ))
GROUPS_=("$@")
[ ${#GROUPS_[@]} -gt 0 ] || GROUPS_=(decode1 decode4 decode16 prefill replay small)
CC=${CC:-cc}
PY=$ROOT/.venv/bin/python3
[ -x "$PY" ] || PY=python3
OUT=$ROOT/build/bench-ab
rm -rf "$OUT"
mkdir -p "$OUT"
for side in A B; do
  dir=$A
  [ "$side" = B ] && dir=$B
  "$CC" -O2 -std=c11 -Wall -Wextra -Werror -pthread -I"$ROOT/include" -I"$ROOT/tests/common" \
    "$ROOT/benches/bench.c" -L"$dir" -lmlxkern -Wl,-rpath,"$dir" -lm -o "$OUT/bench-$side"
done
echo "A: $A"
echo "B: $B"
lscpu | grep -E 'Model name' | sed 's/^/cpu: /; s/  */ /g'
for round in $(seq 1 "$ROUNDS"); do
  for group in "${GROUPS_[@]}"; do
    order="A B"
    [ $((round % 2)) -eq 0 ] && order="B A"
    for side in $order; do
      "$OUT/bench-$side" "$OUT/$side-$group-$round.json" "$group" >/dev/null
    done
  done
  echo "round $round of $ROUNDS done, load $(cut -d' ' -f1-3 /proc/loadavg)"
done
"$PY" - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
med = {"A": {}, "B": {}}
for side in med:
    for path in sorted(glob.glob(os.path.join(out, f"{side}-*.json"))):
        for r in json.load(open(path))["records"]:
            if r["impl"].startswith("mlxkern"):
                med[side].setdefault((r["id"], r["impl"]), []).append(r["median_us"])
print(f"{'case':58s} {'A us':>11s} {'B us':>11s} {'B/A':>6s}")
ratios = []
for key in med["A"]:
    if key not in med["B"]:
        continue
    a, b = statistics.median(med["A"][key]), statistics.median(med["B"][key])
    ratios.append(b / a)
    print(f"{key[0] + ' ' + key[1]:58.58s} {a:11.1f} {b:11.1f} {b / a:6.3f}")
if ratios:
    print(f"geometric mean B/A over {len(ratios)} cases: "
          f"{statistics.geometric_mean(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
PY
