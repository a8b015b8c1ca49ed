#!/usr/bin/env bash
# The mlxkern Python sdist (build/wheel/mlxkern-<v>.tar.gz): python/ with the crate's sources
# under crate/ (what Cargo.toml's `include` ships, plus Cargo.lock), so that
# `pip install mlxkern-<v>.tar.gz` builds the extension and libmlxkern (cargo build --release)
# wherever Rust, a C++20 compiler and the package index are at hand.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
STAGE=build/sdist-stage
rm -rf "$STAGE"
mkdir -p "$STAGE/crate" build/wheel
git ls-files python | grep -v '^python/tests/' | tar -cf - -T - | tar -xf - -C "$STAGE" --strip-components=1
cp -r python/tests "$STAGE/tests"
rm -rf "$STAGE/tests/__pycache__"
git ls-files Cargo.toml Cargo.lock build.rs cbindgen.toml src kernels include examples/rust \
  README.md CHANGELOG.md LICENSE THIRD_PARTY_NOTICES.md | tar -cf - -T - | tar -xf - -C "$STAGE/crate"
cp LICENSE "$STAGE/LICENSE"
PYENV=build/pyenv
[ -x $PYENV/bin/python3 ] || ./scripts/python/dev-build.sh
$PYENV/bin/python3 -m build --sdist --outdir build/wheel "$STAGE"
