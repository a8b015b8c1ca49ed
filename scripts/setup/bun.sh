#!/usr/bin/env bash
# The pinned Bun, for the repository's tests (Bun is no dependency of the mlxkern package):
#
#   scripts/setup/bun.sh        prints the path of the bun binary (fetched on the first call)
#
# Fetches Bun BUN_VERSION (below) from its npm platform package @oven/bun-linux-x64 (`npm pack`,
# no install script; checked against the pinned sha512) into build/tools/bun-<version>/bin/bun,
# once. BUN=/path/to/bun: prints that instead (e.g. on macOS, or the -baseline build on a CPU
# without AVX2). Progress and errors on stderr. Needs node and npm.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
BUN_VERSION=1.4.5
BUN_INTEGRITY=sha512-IWX9BELoGHAUtMonkeSaNaZwXzRk+oDw6Mk+HBFXd3KHYIBNBsIGRupMZPcgNoDbJpLu6gAJjIoIVPZtt1aJ1g==

say() { echo "bun-tool: $*" >&2; }

if [[ -n "${BUN:-}" ]]; then
  [[ -x "$BUN" ]] || { say "BUN=$BUN is not an executable"; exit 1; }
  echo "$BUN"
  exit 0
fi
if [[ "$(uname -s)-$(uname -m)" != "Linux-x86_64" ]]; then
  say "the pinned Bun package is @oven/bun-linux-x64; on $(uname -s)-$(uname -m) set BUN=/path/to/bun"
  exit 1
fi
if [[ -r /proc/cpuinfo ]] && ! grep -qw avx2 /proc/cpuinfo; then
  say "this CPU lacks AVX2, which @oven/bun-linux-x64 needs; install @oven/bun-linux-x64-baseline@$BUN_VERSION and set BUN"
  exit 1
fi
TOOL=$ROOT/build/tools/bun-$BUN_VERSION
BIN=$TOOL/bin/bun
if [[ ! -x "$BIN" ]]; then
  say "fetching @oven/bun-linux-x64@$BUN_VERSION into $TOOL"
  start=${EPOCHREALTIME/,/.}
  FETCH=$(mktemp -d)
  trap 'rm -rf "$FETCH"' EXIT
  npm pack "@oven/bun-linux-x64@$BUN_VERSION" --pack-destination "$FETCH" --ignore-scripts --loglevel=error >/dev/null
  TGZ=$FETCH/oven-bun-linux-x64-$BUN_VERSION.tgz
  GOT=sha512-$(node -e 'const c = require("node:crypto"), fs = require("node:fs");
    process.stdout.write(c.createHash("sha512").update(fs.readFileSync(process.argv[1])).digest("base64"))' "$TGZ")
  if [[ "$GOT" != "$BUN_INTEGRITY" ]]; then
    say "@oven/bun-linux-x64@$BUN_VERSION has integrity $GOT, expected $BUN_INTEGRITY"
    exit 1
  fi
  tar -xzf "$TGZ" -C "$FETCH" package/bin/bun
  mkdir -p "$TOOL/bin"
  chmod 0755 "$FETCH/package/bin/bun"
  mv "$FETCH/package/bin/bun" "$BIN.tmp.$$"
  mv "$BIN.tmp.$$" "$BIN"
  say "fetched in $(awk -v a="$start" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }') s"
fi
VERSION=$("$BIN" --version)
if [[ "$VERSION" != "$BUN_VERSION" ]]; then
  say "$BIN reports $VERSION, but $BUN_VERSION is pinned; remove $TOOL and retry"
  exit 1
fi
echo "$BIN"
