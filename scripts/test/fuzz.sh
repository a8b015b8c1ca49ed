#!/usr/bin/env bash
# Fuzzes every C ABI target under AddressSanitizer (libFuzzer's LeakSanitizer on), `make fuzz`.
#
#   scripts/test/fuzz.sh [seconds per target] [target ...]     (default: 600 s, every target)
#
# Targets (fuzz/fuzz_targets/): array, gated_delta, norms, norms_vjp, gated_delta_vjp,
# glm52, pool, tree. Each decodes its input into C
# ABI calls and checks them against the header's contract (fuzz/harness/). New coverage is
# added to fuzz/corpus/<target>/ (committed; `cargo test --test fuzz_corpus` replays it); a
# crash lands in fuzz/artifacts/<target>/ and fails the run: copy it to
# fuzz/regressions/<target>/ with a descriptive name once it is fixed.
#
# Environment:
#   FUZZ_JOBS=N      run N targets at a time (default 1; each target is one process)
#   FUZZ_MAX_LEN=N   largest input in bytes (default 1024)
#   FUZZ_CMIN=1      minimize each corpus afterwards (libFuzzer -merge on edge coverage)
#   FUZZ_ARGS=...    extra libFuzzer flags
#
# Stable Rust: cargo fuzz passes -Zsanitizer=address, which needs RUSTC_BOOTSTRAP=1. cargo-fuzz
# itself is installed (pinned) into fuzz/.tools on first use. libmlx and the C++ bridge are not
# instrumented: ASan checks the Rust side and every heap access it makes; MLX's own allocations
# are tracked through the intercepted malloc.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"

CARGO_FUZZ_VERSION=0.13.2
SECONDS_PER_TARGET=${1:-600}
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(array gated_delta norms norms_vjp gated_delta_vjp glm52 pool tree)
JOBS=${FUZZ_JOBS:-1}
MAX_LEN=${FUZZ_MAX_LEN:-1024}

export RUSTC_BOOTSTRAP=1
export PATH="$ROOT/fuzz/.tools/bin:$PATH"
if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "installing cargo-fuzz $CARGO_FUZZ_VERSION into fuzz/.tools"
  CARGO_INSTALL_ROOT="$ROOT/fuzz/.tools" cargo install cargo-fuzz --version "$CARGO_FUZZ_VERSION" --locked
fi

echo "building the fuzz targets with AddressSanitizer"
cargo fuzz build

LOGS=$ROOT/fuzz/target/logs
mkdir -p "$LOGS"

run_target() {
  local target=$1
  mkdir -p "fuzz/corpus/$target"
  # New inputs go to the first folder; the crash reproducers are replayed first (this build
  # has overflow checks and ASan, which `cargo test`'s replay has not).
  local dirs=("fuzz/corpus/$target")
  [ -d "fuzz/regressions/$target" ] && dirs+=("fuzz/regressions/$target")
  # -detect_leaks=1 (libFuzzer's default with ASan): a leak in one input is a crash.
  cargo fuzz run "$target" "${dirs[@]}" -- -max_total_time="$SECONDS_PER_TARGET" \
    -max_len="$MAX_LEN" -print_final_stats=1 ${FUZZ_ARGS:-} >"$LOGS/$target.log" 2>&1
}

status=0
pids=()
names=()
for target in "${TARGETS[@]}"; do
  echo "fuzzing $target for $SECONDS_PER_TARGET s (log: fuzz/target/logs/$target.log)"
  run_target "$target" &
  pids+=($!)
  names+=("$target")
  if [ ${#pids[@]} -ge "$JOBS" ]; then
    wait "${pids[0]}" || { echo "FAIL: $target: see fuzz/target/logs/${names[0]}.log" >&2; status=1; }
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "FAIL: ${names[$i]}: see fuzz/target/logs/${names[$i]}.log" >&2; status=1; }
done

if [ "${FUZZ_CMIN:-0}" = 1 ]; then
  # Minimize on edge coverage only (-use_counters=0): one input per new edge, which keeps the
  # committed corpus at a few hundred files per target with the coverage of the full one.
  triple=$(rustc -vV | sed -n 's/^host: //p')
  for target in "${TARGETS[@]}"; do
    merged=$(mktemp -d)
    if "fuzz/target/$triple/release/$target" -merge=1 -use_counters=0 "$merged" \
      "fuzz/corpus/$target" >"$LOGS/$target.cmin.log" 2>&1; then
      rm -rf "fuzz/corpus/$target"
      mv "$merged" "fuzz/corpus/$target"
      echo "minimized fuzz/corpus/$target: $(tail -n 1 "$LOGS/$target.cmin.log")"
    else
      echo "FAIL: minimizing $target: see $LOGS/$target.cmin.log" >&2
      rm -rf "$merged"
      status=1
    fi
  done
fi

printf '\n%-12s %12s %9s %10s %8s %s\n' target executions seconds exec/s corpus result
for target in "${TARGETS[@]}"; do
  log=$LOGS/$target.log
  runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$log" | tail -n 1)
  secs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -n 1)
  files=$(find "fuzz/corpus/$target" -type f | wc -l | tr -d ' ')
  if [ -n "$runs" ] && [ -n "$secs" ] && [ "$secs" -gt 0 ]; then
    result=ok
    [ -z "$(ls -A "fuzz/artifacts/$target" 2>/dev/null)" ] || result="artifacts in fuzz/artifacts/$target"
    printf '%-12s %12s %9s %10s %8s %s\n' "$target" "$runs" "$secs" "$((runs / secs))" "$files" "$result"
  else
    printf '%-12s %12s %9s %10s %8s %s\n' "$target" - - - "$files" "CRASH: fuzz/target/logs/$target.log"
    grep -m 1 -E "panicked at|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)" "$log" >&2 || true
    status=1
  fi
done
exit $status
