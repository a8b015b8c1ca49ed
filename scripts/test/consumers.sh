#!/usr/bin/env bash
# Consumers of each kind, built the way a user builds them, in fresh folders outside the
# repository (docs/install.md):
#
#   scripts/test/consumers.sh [KIND...]      KIND: cmake cargo bun swift (default: all)
#
# Each tests/consumers/<kind>/run.sh is run with ROOT (this repository), WORK (an empty folder
# of its own under a fresh temporary folder) and LIBDIR (the built library's folder). It builds
# its consumer from the installed or packed artifact, runs it, and prints the consumer's
# results on stdout in the format of tests/consumers/reference.c (lines "y ...", "state ...",
# "norm ..."), which this script compares, bit for bit, with what reference.c prints through
# the C ABI. Its progress goes to stderr. Exit status 3 means "skipped" (the reason on stderr).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
LIBDIR=${LIBDIR:-$ROOT/target/debug}
CC=${CC:-cc}
kinds=("$@")
[ ${#kinds[@]} -gt 0 ] || kinds=(cmake cargo bun swift)

say() { printf 'test-consumers: %s\n' "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

[ -f "$LIBDIR/libmlxkern.so" ] || [ -f "$LIBDIR/libmlxkern.dylib" ] ||
  { say "error: no libmlxkern in $LIBDIR: build it first (make build)"; exit 1; }

TOP=$(mktemp -d "${TMPDIR:-/tmp}/mlxkern-consumers.XXXXXX")
case "$TOP/" in "$ROOT"/*) say "error: the temporary folder $TOP is inside the repository"; exit 1 ;; esac
trap 'rm -rf "$TOP"' EXIT

"$CC" -std=c11 -Wall -Wextra -Werror -I"$ROOT/include" "$ROOT/tests/consumers/reference.c" \
  -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -o "$TOP/reference"
"$TOP/reference" >"$TOP/expected.txt"

failed=0
summary=()
for kind in "${kinds[@]}"; do
  script=$ROOT/tests/consumers/$kind/run.sh
  if [ ! -f "$script" ]; then
    say "error: no consumer of kind '$kind' ($script)"
    failed=1
    continue
  fi
  mkdir -p "$TOP/$kind"
  say "== $kind"
  t=$(now)
  status=0
  ROOT=$ROOT WORK=$TOP/$kind LIBDIR=$LIBDIR bash "$script" >"$TOP/$kind.out" || status=$?
  took=$(since "$t")
  if [ "$status" -eq 3 ]; then
    summary+=("$kind: SKIP (${took} s)")
  elif [ "$status" -ne 0 ]; then
    summary+=("$kind: FAIL, exit $status (${took} s)")
    failed=1
  elif ! diff <(grep -E '^(y|state|norm) ' "$TOP/$kind.out") "$TOP/expected.txt" >/dev/null; then
    say "$kind: results differ from the C ABI's:"
    diff <(grep -E '^(y|state|norm) ' "$TOP/$kind.out") "$TOP/expected.txt" | cut -c1-160 | head -n 8 || true
    summary+=("$kind: FAIL, results differ (${took} s)")
    failed=1
  else
    summary+=("$kind: PASS, bit-identical to the C ABI (${took} s)")
  fi
done
for line in "${summary[@]}"; do say "$line"; done
exit $failed
