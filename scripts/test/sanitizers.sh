#!/usr/bin/env bash
# The C clients under sanitizers, valgrind and a resident-memory check (`make test-sanitizers`):
#   1. tests/c/client*.c and tests/c/stress.c (10 000 mixed calls) under AddressSanitizer with
#      LeakSanitizer: no report, exit 0;
#   2. stress.c without instrumentation: resident memory flat after warm-up (--rss-check);
#   3. client.c and stress.c under valgrind memcheck, full leak check: 0 errors, definitely and
#      indirectly lost 0 (tests/c/valgrind.supp suppresses one stack: the TLS block of MLX's
#      scheduler thread, "possibly lost"). The summary numbers are printed.
# Environment: CC, LIBDIR (folder of libmlxkern.so / .dylib; built with cargo if absent),
# BUILD (output folder), STRESS_CALLS (default 10000), VALGRIND_CALLS (stress calls under
# valgrind, default STRESS_CALLS), MLXK_VALGRIND=0 skips the valgrind part.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CC=${CC:-cc}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
BUILD=${BUILD:-$ROOT/build}
OUT=$BUILD/sanitizers
SRC=$ROOT/tests/c
STRESS_CALLS=${STRESS_CALLS:-10000}
VALGRIND_CALLS=${VALGRIND_CALLS:-$STRESS_CALLS}
mkdir -p "$OUT"

case "$(uname -s)" in
  Darwin) LIB=$LIBDIR/libmlxkern.dylib ;;
  *) LIB=$LIBDIR/libmlxkern.so ;;
esac
if [ ! -f "$LIB" ]; then
  (cd "$ROOT" && cargo build --lib)
fi

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

now_ms() { date +%s%3N; }
elapsed() { local ms=$(($(now_ms) - $1)); printf '%d.%d s' $((ms / 1000)) $((ms % 1000 / 100)); }

INCLUDE=(-I"$ROOT/include" -I"$ROOT/examples/common")
LINK=(-L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" -lm -pthread)
WARN=(-std=c11 -Wall -Wextra -Werror -pedantic)
# The client test's files (tests/c/client.c runs the checks of the others).
CLIENT=("$SRC/client.c" "$SRC/client_util.c" "$SRC/client_arrays.c" "$SRC/client_gated_delta.c"
  "$SRC/client_pool.c" "$SRC/client_norms.c" "$SRC/client_host.c")

# 1. AddressSanitizer + LeakSanitizer.
for prog in client stress; do
  case $prog in
    client) sources=("${CLIENT[@]}") ;;
    *) sources=("$SRC/$prog.c") ;;
  esac
  "$CC" "${WARN[@]}" -g -O1 -fsanitize=address -fno-omit-frame-pointer "${INCLUDE[@]}" \
    "${sources[@]}" "${LINK[@]}" -o "$OUT/$prog-asan" || fail "$prog build (ASan)"
done
asan_options=detect_leaks=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1
if [ "$(uname -s)" = Darwin ]; then
  asan_options=${asan_options/detect_leaks=1/detect_leaks=0}
  echo "note: LeakSanitizer is not available on macOS; running under ASan only"
fi
for run in "client" "stress $STRESS_CALLS"; do
  set -- $run
  log=$OUT/$1-asan.log
  start=$(now_ms)
  if ! ASAN_OPTIONS=$asan_options "$OUT/$1-asan" "${@:2}" >"$log" 2>&1; then
    cat "$log" >&2
    fail "$run under AddressSanitizer/LeakSanitizer"
  fi
  if grep -q "Sanitizer" "$log"; then
    cat "$log" >&2
    fail "sanitizer report in the output of $run"
  fi
  echo "PASS: $run under ASan + LSan: 0 errors, 0 leaks ($(elapsed "$start"))"
  [ "$1" = stress ] && sed -n 's/^/    /p' "$log" | head -n 2
done

# 2. Resident memory, uninstrumented.
"$CC" "${WARN[@]}" -g -O2 "${INCLUDE[@]}" "$SRC/stress.c" "${LINK[@]}" -o "$OUT/stress" ||
  fail "stress build"
"$CC" "${WARN[@]}" -g -O1 "${INCLUDE[@]}" "${CLIENT[@]}" "${LINK[@]}" -o "$OUT/client" ||
  fail "client build"
"$OUT/stress" "$STRESS_CALLS" --rss-check >"$OUT/stress-rss.log" 2>&1 ||
  { cat "$OUT/stress-rss.log" >&2; fail "stress: resident memory"; }
echo "PASS: stress $STRESS_CALLS, resident memory flat after warm-up:"
grep "resident memory" "$OUT/stress-rss.log" | sed 's/^/    /'

# 3. valgrind memcheck.
if [ "${MLXK_VALGRIND:-1}" = 0 ]; then
  echo "SKIP: valgrind (MLXK_VALGRIND=0)"
  exit 0
fi
command -v valgrind >/dev/null || fail "valgrind not found (MLXK_VALGRIND=0 skips this part)"
summary() {
  local log=$1
  local errors definite indirect possible reachable suppressed
  errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9,]*\) errors.*/\1/p' "$log" | tail -n 1)
  definite=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1)
  indirect=$(sed -n 's/.*indirectly lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1)
  possible=$(sed -n 's/.*possibly lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1)
  reachable=$(sed -n 's/.*still reachable: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1)
  suppressed=$(sed -n 's/.*suppressed: \([0-9,]*\) bytes.*/\1/p' "$log" | tail -n 1)
  echo "errors ${errors:-?}, definitely lost ${definite:-0} B, indirectly lost ${indirect:-0} B," \
    "possibly lost ${possible:-0} B, still reachable ${reachable:-0} B, suppressed ${suppressed:-0} B"
}
for run in "client" "stress $VALGRIND_CALLS"; do
  set -- $run
  log=$OUT/$1-valgrind.log
  start=$(now_ms)
  if ! valgrind --tool=memcheck --leak-check=full --errors-for-leak-kinds=definite,indirect \
    --error-exitcode=1 --num-callers=30 --suppressions="$SRC/valgrind.supp" \
    "$OUT/$1" "${@:2}" >"$log" 2>&1; then
    cat "$log" >&2
    fail "$run under valgrind memcheck: $(summary "$log")"
  fi
  echo "PASS: $run under valgrind memcheck ($(elapsed "$start")): $(summary "$log")"
done
