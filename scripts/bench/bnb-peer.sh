#!/usr/bin/env bash
# The native CPU training peer of `make bench`'s gradient section: bitsandbytes-cpu-fork's Gated
# DeltaNet kernels (gdn_fwd_cpu / gdn_bwd_cpu), timed by benches/grad_bnb.py through ctypes.
#
#   scripts/bench/bnb-peer.sh          fetch the wheel once (cached) into build/bnb/ and extract it;
#                                prints the extracted folder (benches/grad_bnb.py's LIBDIR) and
#                                exits 0 when it is ready
#
# Source: the bitsandbytes-cpu-fork 0.50.2.dev9 wheel from PyPI (MIT; its native libraries are
# prebuilt: AVX2 and AVX-512 variants, with a bundled libgomp found by $ORIGIN), fetched with
# `pip download --no-deps` (no torch: only the shared libraries are used). Without network it
# prints one line starting with "bench: bitsandbytes-cpu-fork peer skipped:" and exits 1;
# scripts/bench/run.sh then runs the gradient section without it.
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
VERSION=0.50.2.dev9
DIR=$ROOT/build/bnb
PKG=$DIR/pkg-$VERSION
PY=$ROOT/.venv/bin/python3

skip() {
  echo "bench: bitsandbytes-cpu-fork peer skipped: $*" >&2
  exit 1
}

if [ ! -f "$PKG/bitsandbytes/libbitsandbytes_cpu.so" ]; then
  mkdir -p "$DIR/wheel"
  "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d "$DIR/wheel" \
    "bitsandbytes-cpu-fork==$VERSION" >"$DIR/download.log" 2>&1 ||
    skip "pip download failed (see $DIR/download.log)"
  wheel=$(ls "$DIR"/wheel/bitsandbytes_cpu_fork-"$VERSION"-*.whl 2>/dev/null | head -n 1)
  [ -n "$wheel" ] || skip "no wheel in $DIR/wheel"
  rm -rf "$PKG.tmp" && mkdir -p "$PKG.tmp"
  "$PY" -m zipfile -e "$wheel" "$PKG.tmp" || skip "cannot extract $wheel"
  rm -rf "$PKG" && mv "$PKG.tmp" "$PKG"
fi
echo "$PKG"
