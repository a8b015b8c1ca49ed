#!/usr/bin/env bash
# The cargo consumer (scripts/test/consumers.sh cargo): a new cargo project in $WORK that
# depends on mlxkern by path as docs/hosts/rust.md says (the dependency and the
# one-line build.rs giving the binary libmlx's rpath), whose main.rs uses only the safe Rust
# API: reference.c's inputs, one decode step and one gated norm, printed in reference.c's
# format. The binary runs without LD_LIBRARY_PATH.
#
# It leaves out docs/hosts/rust.md's `[profile.dev.package.mlxkern] opt-level = 3`: its one small step
# needs no speed, and compiling mlxkern (its build script and C++ bridge included) optimized
# more than doubles this build (two cores: 71 s, 167 s with the line). The build (quiet) would
# print mlxkern's opt-level 0 warning. MLXKERN_CONSUMER_OPT=3 builds it as docs/hosts/rust.md says.
set -euo pipefail
: "${ROOT:?}" "${WORK:?}"

say() { printf 'consumers/cargo: %s\n' "$*" >&2; }
command -v cargo >/dev/null || { say "skipped: no cargo on PATH"; exit 3; }

app=$WORK/app
mkdir -p "$app/src"
cat >"$app/Cargo.toml" <<TOML
[package]
name = "mlxkern-consumer"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
mlxkern = { path = "$ROOT" }
TOML
if [ "${MLXKERN_CONSUMER_OPT:-0}" != 0 ]; then
  printf '\n[profile.dev.package.mlxkern]\nopt-level = %s\n' "$MLXKERN_CONSUMER_OPT" >>"$app/Cargo.toml"
fi
cat >"$app/build.rs" <<'RS'
fn main() {
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", std::env::var("DEP_MLX_LIB_DIR").unwrap());
}
RS
cp "$ROOT/tests/consumers/cargo/main.rs" "$app/src/main.rs"
# The repository's lock file pins the same dependency versions the library is tested with.
cp "$ROOT/Cargo.lock" "$app/Cargo.lock"

export CARGO_TARGET_DIR=$WORK/target
start=$(date +%s.%N)
(cd "$app" && cargo build --quiet) >&2
say "cargo build took $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"

bin=$CARGO_TARGET_DIR/debug/mlxkern-consumer
if command -v readelf >/dev/null; then
  say "$(readelf -d "$bin" | grep -E 'RUNPATH|RPATH' | sed 's/^ *//' | head -n 2 | tr '\n' ' ')"
fi
# No LD_LIBRARY_PATH (nor DYLD_LIBRARY_PATH): libmlx is found through the binary's rpath.
env -u LD_LIBRARY_PATH -u DYLD_LIBRARY_PATH "$bin"
