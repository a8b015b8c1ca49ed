#!/usr/bin/env bash
# The CPU kernels on arm64 (tests/arm64): the library's src/cpu tree, built alone (no MLX
# bridge, so no aarch64 libmlx is needed), with its unit tests and tests/arm64's checks of the
# NEON kernels against the portable ones. On an x86-64 host it cross-builds for
# aarch64-unknown-linux-gnu and runs the tests under qemu-aarch64; on an arm64 Linux host it
# runs them natively. On x86-64 it first runs the chunked case of tests/arm64/src/reference.rs
# on this machine's AVX2 (or AVX-512) kernels, and the arm64 run checks that the NEON kernels
# give the same bits.
#
# Installs what it needs when missing: the Rust target (rustup) and, on Debian/Ubuntu as root,
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user. Environment: CARGO (default
# cargo), ARM64_TARGET_DIR (default target/arm64).
set -euo pipefail

start=$SECONDS
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CARGO=${CARGO:-cargo}
TARGET=aarch64-unknown-linux-gnu
export CARGO_TARGET_DIR=${ARM64_TARGET_DIR:-$ROOT/target/arm64}

fail() {
  echo "FAIL: test-arm64: $*" >&2
  exit 1
}

args=()
case "$(uname -m)" in
  aarch64 | arm64)
    [[ "$(uname -s)" == Linux ]] || fail "native runs are set up for Linux only"
    ;;
  x86_64)
    if ! rustup target list --installed 2>/dev/null | grep -qx "$TARGET"; then
      command -v rustup >/dev/null || fail "rustup is needed to add the $TARGET target"
      rustup target add "$TARGET"
    fi
    missing=()
    command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
    [[ -e /usr/aarch64-linux-gnu/lib/libc.so && -e /usr/aarch64-linux-gnu/lib/Scrt1.o ]] ||
      missing+=(libc6-dev-arm64-cross)
    command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
    if ((${#missing[@]})); then
      command -v apt-get >/dev/null || fail "install ${missing[*]} (Debian names)"
      sudo=()
      if [[ $(id -u) != 0 ]]; then
        command -v sudo >/dev/null || fail "run as root or install ${missing[*]}"
        sudo=(sudo)
      fi
      echo "== test-arm64: installing ${missing[*]}"
      "${sudo[@]}" apt-get update -qq
      DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}" >/dev/null
    fi
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
    args=(--target "$TARGET")
    ;;
  *) fail "no arm64 runner for a $(uname -m) host" ;;
esac

cd "$ROOT/tests/arm64"
test_args=()
if ((${#args[@]})); then
  echo "== test-arm64: the chunked case on this x86-64 machine's kernels"
  reference=$CARGO_TARGET_DIR/chunked_reference.bin
  rm -f "$reference"
  "$CARGO" run --locked --quiet --bin chunked_reference -- "$reference"
  if [[ -f $reference ]]; then
    export MLXK_CHUNKED_REFERENCE=$reference
    test_args=(-- --include-ignored)
  fi
else
  echo "== test-arm64: native run; no x86-64 reference for the chunked case"
fi
echo "== test-arm64: build"
"$CARGO" test --locked "${args[@]}" --no-run
echo "== test-arm64: run"
"$CARGO" test --locked "${args[@]}" "${test_args[@]}"
echo "== test-arm64: passed in $((SECONDS - start)) s"
