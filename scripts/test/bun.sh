#!/usr/bin/env bash
# Runs the Bun bindings' tests (bun/test/*.test.ts) against the built library.
#
#   scripts/test/bun.sh [bun test arguments...]
#
# Needs node/npm and the library built by `make build` (target/debug/libmlxkern.so), or
# MLXKERN_LIB pointing at one; it builds nothing. Bun is no dependency of the package:
# scripts/setup/bun.sh fetches the pinned one from the npm registry into build/tools/, once
# (BUN=/path/to/bun uses another, e.g. on macOS or on a CPU without AVX2).
# The type check runs first: `bun check` and `tsc --noEmit` over src/, test/, examples/ and
# scripts/ with Bun's types (@types/bun and typescript, bun/package.json's devDependencies,
# installed by `npm ci` in bun/ when node_modules is missing or older than the lockfile).
# The tests of arrays shared with a host's MLX (bun/test/mlx-interop.test.ts) load a real mlx-c
# into the Bun process: scripts/setup/mlx-c.sh builds it, once, from ../shared/vendor/mlx-c
# into build/mlx-c-shared (MLXKERN_TEST_MLXC=/path/libmlxc.so uses another). Where those
# sources are absent (a checkout without ../shared, as in CI) those tests are skipped, and this
# script says so; the rest run.
# Environment passed through to the tests: MLXK_TEST_SEED (reproduce a run's random inputs),
# STATS=1 (print the measured numeric errors).
set -euo pipefail

cd "$(dirname "$0")/../.."
ROOT=$PWD
PKG=$ROOT/bun

now() { echo "${EPOCHREALTIME/,/.}"; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }
T0=$(now)

# --- the library -----------------------------------------------------------------------------
case "$(uname -s)" in
  Darwin) LIBFILE=libmlxkern.dylib ;;
  *) LIBFILE=libmlxkern.so ;;
esac
if [[ -n "${MLXKERN_LIB:-}" ]]; then
  [[ -f "$MLXKERN_LIB" ]] || { echo "test-bun: MLXKERN_LIB=$MLXKERN_LIB does not exist" >&2; exit 1; }
  echo "test-bun: library $MLXKERN_LIB (MLXKERN_LIB)"
else
  LIB=$ROOT/target/debug/$LIBFILE
  if [[ ! -f "$LIB" ]]; then
    echo "test-bun: $LIB is missing: build it first with \`make build\` (or set MLXKERN_LIB)" >&2
    exit 1
  fi
  echo "test-bun: library $LIB"
fi

# --- Bun -------------------------------------------------------------------------------------
BUN=$("$ROOT/scripts/setup/bun.sh")
echo "test-bun: bun $("$BUN" --version) ($BUN)"

# --- the type check ----------------------------------------------------------------------------
STAMP=$PKG/node_modules/.mlxkern-lock
if [[ ! -f "$STAMP" ]] || ! cmp -s "$PKG/package-lock.json" "$STAMP"; then
  echo "test-bun: installing the type-check tools (npm ci in bun/)"
  T1=$(now)
  npm ci --prefix "$PKG" --no-audit --no-fund --ignore-scripts --loglevel=error
  cp "$PKG/package-lock.json" "$STAMP"
  echo "test-bun: npm ci took $(elapsed "$T1" "$(now)") s"
fi
T1=$(now)
CHECKED=0
if (cd "$PKG" && "$BUN" check --no-script --no-pretty) && (cd "$PKG" && node node_modules/typescript/bin/tsc --noEmit); then
  CHECKED=1
  echo "test-bun: type check clean (bun check, tsc --noEmit), $(elapsed "$T1" "$(now)") s"
else
  echo "test-bun: the type check failed (above)" >&2
fi

# --- mlx-c, the host of the interop tests ------------------------------------------------------
if [[ -n "${MLXKERN_TEST_MLXC:-}" ]]; then
  echo "test-bun: mlx-c $MLXKERN_TEST_MLXC (MLXKERN_TEST_MLXC)"
else
  set +e
  MLXC_OUT=$("$ROOT/scripts/setup/mlx-c.sh")
  MLXC_STATUS=$?
  set -e
  case $MLXC_STATUS in
    0) export MLXKERN_TEST_MLXC=$MLXC_OUT
       echo "test-bun: mlx-c $MLXKERN_TEST_MLXC" ;;
    3) echo "test-bun: SKIP the interop tests with mlx-c: ${MLXC_OUT//$'\n'/ }" ;;
    *) echo "test-bun: building mlx-c failed" >&2; exit 1 ;;
  esac
fi

# --- the tests -------------------------------------------------------------------------------
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
T2=$(now)
set +e
(cd "$PKG" && "$BUN" test "$@") 2>&1 | tee "$LOG"
STATUS=${PIPESTATUS[0]}
set -e
T3=$(now)

PASSED=$(sed -nE 's/^ *([0-9]+) pass$/\1/p' "$LOG" | tail -n1)
FAILED=$(sed -nE 's/^ *([0-9]+) fail$/\1/p' "$LOG" | tail -n1)
SKIPPED=$(sed -nE 's/^ *([0-9]+) skip$/\1/p' "$LOG" | tail -n1)
echo "test-bun: bun test took $(elapsed "$T2" "$T3") s; total $(elapsed "$T0" "$T3") s"
if [[ "$CHECKED" != 1 ]]; then
  echo "test-bun: FAIL: the type check reported errors"
  [[ "$STATUS" != 0 ]] || STATUS=1
fi
echo "bun: ${PASSED:-0} passed, ${FAILED:-?} failed${SKIPPED:+, $SKIPPED skipped}"
exit "$STATUS"
