#!/usr/bin/env bash
# The Bun consumer (scripts/test/consumers.sh bun): a new Bun project outside the repository
# installs the packed npm tarballs the way bun/README.md ("Installing") tells a user to, then
# runs consumer.ts, which uses only the package's public API, with no MLXKERN_LIB: the library
# must come from the platform package. Results on stdout in tests/consumers/reference.c's format.
#
# Environment (from scripts/test/consumers.sh): ROOT (the repository), WORK (an empty folder of
# its own), LIBDIR (the built library's folder). The tarballs are build/npm's, packed from
# LIBDIR by scripts/package/bun-pack.sh when missing or stale; Bun is scripts/setup/bun.sh's (BUN=...
# uses another). The install is made with an unreachable registry and an empty package cache:
# the two local tarballs must be all it needs. Exit 3 (skip) where the platform package is not
# built (anything but Linux x86-64), node/npm are missing, or the CPU cannot run the pinned Bun.
set -euo pipefail

: "${ROOT:?}" "${WORK:?}" "${LIBDIR:?}"
say() { echo "consumer-bun: $*" >&2; }
now() { echo "${EPOCHREALTIME/,/.}"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

if [ "$(uname -s)-$(uname -m)" != Linux-x86_64 ]; then
  say "SKIP: the platform package is built for Linux x86-64 only (this is $(uname -s)-$(uname -m))"
  exit 3
fi
for tool in node npm; do
  command -v "$tool" >/dev/null || { say "SKIP: $tool not found (it fetches Bun and packs the tarballs)"; exit 3; }
done
if [ -z "${BUN:-}" ] && [ -r /proc/cpuinfo ] && ! grep -qw avx2 /proc/cpuinfo; then
  say "SKIP: this CPU lacks AVX2, which the pinned Bun needs (set BUN to a -baseline build)"
  exit 3
fi
BUN=$("$ROOT/scripts/setup/bun.sh")
say "bun $("$BUN" --version) ($BUN)"

# The tarballs, as `make bun-pack` makes them.
t=$(now)
LIBDIR=$LIBDIR OUT=$ROOT/build/npm "$ROOT/scripts/package/bun-pack.sh" --if-changed >&2 2>&1
version=$(node -p 'require(process.argv[1]).version' "$ROOT/bun/package.json")
MAIN=mlxkern-$version.tgz
PLATFORM=mlxkern-linux-x64-gnu-$version.tgz
say "tarballs ready in $(since "$t") s: $MAIN ($(du -k "$ROOT/build/npm/$MAIN" | cut -f1) KiB), $PLATFORM ($(du -k "$ROOT/build/npm/$PLATFORM" | cut -f1) KiB)"

# A new project, as in bun/README.md: the tarballs in vendor/, the platform package (mlxkern's
# optional dependency, not on the registry) pointed at its tarball in "overrides", then `bun add`
# of mlxkern. (The README starts from `bun init -y`; its package.json is written here instead,
# as `bun init` would fetch its own devDependencies from the registry.)
APP=$WORK/app
mkdir -p "$APP/vendor"
cp "$ROOT/build/npm/$MAIN" "$ROOT/build/npm/$PLATFORM" "$APP/vendor/"
cd "$APP"
echo '{ "name": "app", "private": true, "type": "module" }' >package.json
npm pkg set "overrides.mlxkern-linux-x64-gnu=./vendor/$PLATFORM"
t=$(now)
env -u MLXKERN_LIB BUN_CONFIG_REGISTRY=http://127.0.0.1:9/ NPM_CONFIG_REGISTRY=http://127.0.0.1:9/ \
  BUN_INSTALL_CACHE_DIR="$WORK/bun-cache" "$BUN" add "./vendor/$MAIN" >"$WORK/add.log" 2>&1 ||
  { cat "$WORK/add.log" >&2; say "bun add failed"; exit 1; }
say "bun add took $(since "$t") s"
if grep -qiE 'warn|error' "$WORK/add.log"; then
  cat "$WORK/add.log" >&2
  say "bun add reported a warning or an error"
  exit 1
fi
installed=$(cd node_modules && find . -mindepth 1 -maxdepth 2 -name package.json | sed 's|^\./||; s|/package.json$||' | sort | paste -sd' ')
if [ "$installed" != "mlxkern mlxkern-linux-x64-gnu" ]; then
  say "node_modules holds '$installed', expected exactly mlxkern and mlxkern-linux-x64-gnu"
  exit 1
fi
say "installed: $installed ($(du -sk node_modules | cut -f1) KiB)"

# The library and the MLX it loads are the platform package's, not the build's.
PLATFORM_LIB=$APP/node_modules/mlxkern-linux-x64-gnu/lib/libmlxkern.so.1
for dep in libmlx.so libblas libgfortran; do
  resolved=$(ldd "$PLATFORM_LIB" | awk -v d="$dep" 'index($1, d) == 1 { print $3 }')
  case "$resolved" in
    "$APP"/node_modules/mlxkern-linux-x64-gnu/lib/mlxkern/*) ;;
    *) say "$dep of $PLATFORM_LIB resolves to '$resolved', not inside the package"; exit 1 ;;
  esac
done

cp "$ROOT/tests/consumers/bun/consumer.ts" "$APP/consumer.ts"
t=$(now)
env -u MLXKERN_LIB "$BUN" run consumer.ts 2>"$WORK/consumer.err" || { cat "$WORK/consumer.err" >&2; exit 1; }
say "consumer ran in $(since "$t") s"
cat "$WORK/consumer.err" >&2
if ! grep -qxF "library: $PLATFORM_LIB" "$WORK/consumer.err"; then
  say "the consumer did not load $PLATFORM_LIB"
  exit 1
fi
