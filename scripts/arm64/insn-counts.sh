#!/usr/bin/env bash
# Instructions qemu-aarch64 executes for one call of each CPU kernel (tests/arm64's
# kernel_probe), with the NEON kernels and with the portable ones: the count of 3 calls less the
# count of 1, halved (no setup, no one-time tables), per unit of work. One thread
# (MLXK_NUM_THREADS=1). A count of instructions, not a time: docs/arm64.md says what it does and
# does not predict. Run after `make test-arm64` (which installs qemu-user and the cross tools).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export CARGO_TARGET_DIR=${ARM64_TARGET_DIR:-$ROOT/target/arm64}
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
(cd "$ROOT/tests/arm64" &&
  ${CARGO:-cargo} build --locked --quiet --target aarch64-unknown-linux-gnu --bin kernel_probe)
BIN=$CARGO_TARGET_DIR/aarch64-unknown-linux-gnu/debug/kernel_probe

count() { # kernel mode calls
  MLXK_NUM_THREADS=1 qemu-aarch64 -L /usr/aarch64-linux-gnu -singlestep -d exec,nochain \
    -D /dev/stderr "$BIN" "$1" "$2" "$3" 2>&1 >/dev/null | grep -c '^Trace'
}

printf '%-8s %14s %14s %8s  %s\n' kernel "portable/unit" "NEON/unit" ratio unit
for kernel in exact decode chunked heads norm; do
  line=$(MLXK_NUM_THREADS=1 qemu-aarch64 -L /usr/aarch64-linux-gnu "$BIN" "$kernel" fastest 1)
  units=$(sed -E 's/.* calls of ([0-9]+) .*/\1/' <<<"$line")
  unit=$(sed -E 's/.*\((.*)\)$/\1/' <<<"$line")
  per=()
  for mode in portable fastest; do
    c1=$(count "$kernel" "$mode" 1)
    c3=$(count "$kernel" "$mode" 3)
    per+=("$(python3 -c "print(f'{($c3 - $c1) / 2 / $units:.2f}')")")
  done
  ratio=$(python3 -c "print(f'{${per[0]} / ${per[1]}:.2f}')")
  printf '%-8s %14s %14s %8s  %s\n' "$kernel" "${per[0]}" "${per[1]}" "$ratio" "$unit"
done
