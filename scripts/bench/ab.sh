#!/usr/bin/env bash
# A/B benchmark of two builds of the library, for changes that must keep speed (refactors):
# benches/ab.c loads both into one process and times them call by call in alternation, so
# both see the same machine load (a shared machine's load swings more than a refactor moves).
#
#   scripts/bench/ab.sh LIBDIR_A LIBDIR_B [ROUNDS]
#
# LIBDIR_*: folders holding libmlxkern.so (e.g. a copy of target/debug made before a change, and
# target/debug). ROUNDS defaults to 15. Prints best and median per side and the median ratio.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { sed -n 2,9p "$0"; exit 2; }
A=$(cd "$1" && pwd)/libmlxkern.so
B=$(cd "$2" && pwd)/libmlxkern.so
ROUNDS=${3:-15}
CC=${CC:-cc}
OUT=$ROOT/build/bench-ab
mkdir -p "$OUT"
"$CC" -O2 -std=gnu11 -Wall -Wextra -Werror -I"$ROOT/include" "$ROOT/benches/ab.c" -ldl \
  -o "$OUT/ab"
echo "A: $A"
echo "B: $B"
lscpu | grep -E 'Model name' | sed 's/^/cpu: /; s/  */ /g'
echo "load at start: $(cut -d' ' -f1-3 /proc/loadavg)"
"$OUT/ab" "$A" "$B" "$ROUNDS"
echo "load at end: $(cut -d' ' -f1-3 /proc/loadavg)"
