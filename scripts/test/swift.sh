#!/usr/bin/env bash
# Builds the Swift package in swift/ and runs its XCTest suite against the library cargo
# already built (target/debug, or MLXKERN_LIB_DIR).
#
#   macOS: `swift test` in swift/ with the Xcode toolchain.
#   Linux: the same inside a Debian trixie root holding Swift 6 (scripts/swift/env.sh makes
#          it once per machine: about 90-120 s and 550 MB of downloads from the Debian mirror
#          the host's apt uses; later runs find it at once). Needs root (chroot, mounts).
#          The repository is bind-mounted at its own path, so the rpaths baked into the test
#          binary (the library folder) and into libmlxkern (the .venv's libmlx) hold inside.
#
# The tests of arrays shared with a host's MLX (Tests/MLXKernTests/HostMLXTests.swift) dlopen a
# real mlx-c in the test process: scripts/setup/mlx-c.sh builds it, once, from
# ../shared/vendor/mlx-c into build/mlx-c-shared, and its path goes to the tests in
# MLXKERN_TEST_MLXC. Where those sources are absent (a checkout without ../shared, as in CI)
# those tests are skipped, and this script says so; the rest run.
#
# Environment: MLXKERN_LIB_DIR (folder holding libmlxkern.so / .dylib; default target/debug),
# SWIFT_CHROOT (where the root lives; default /var/cache/swift-chroot/trixie), MLXKERN_TEST_MLXC
# (another mlx-c shared library to test with).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
LIBDIR=${MLXKERN_LIB_DIR:-${LIBDIR:-$ROOT/target/debug}}
PACKAGE=$ROOT/swift
LOG=$PACKAGE/.build/test-swift.log

die() { printf 'test-swift: error: %s\n' "$*" >&2; exit 1; }
say() { printf 'test-swift: %s\n' "$*"; }

# Seconds since the epoch with a fraction where the shell can (bash >= 5), whole otherwise.
now() { if [ -n "${EPOCHREALTIME:-}" ]; then echo "${EPOCHREALTIME/,/.}"; else date +%s; fi; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

case "$(uname -s)" in
  Darwin) LIB=$LIBDIR/libmlxkern.dylib ;;
  Linux) LIB=$LIBDIR/libmlxkern.so ;;
  *) die "unsupported OS $(uname -s)" ;;
esac
[ -f "$LIB" ] || die "$LIB not found: build the library first (make build, or cargo build --lib)"
LIBDIR=$(cd "$LIBDIR" && pwd -P)
export MLXKERN_LIB_DIR=$LIBDIR

# How SwiftPM finds the library (the package's manifest carries no linker flags, so that it can
# be another package's dependency): an mlxkern.pc for this library folder on PKG_CONFIG_PATH
# (-L, -l: what SwiftPM takes from pkg-config), and the rpath on the command line.
PCDIR=$PACKAGE/.build/pkgconfig
mkdir -p "$PCDIR"
cat >"$PCDIR/mlxkern.pc" <<PC
# Written by scripts/test/swift.sh: the library built in $LIBDIR.
libdir=$LIBDIR
Name: mlxkern
Description: mlxkern built in this repository
Version: $(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n 1)
Libs: -L\${libdir} -lmlxkern
PC
export PKG_CONFIG_PATH=$PCDIR
RPATH="-Xlinker -rpath -Xlinker $LIBDIR"

# The XCTest summary line ("Executed 31 tests, with 0 failures ...") of the whole run.
summary() { grep -E 'Executed [0-9]+ tests?, with' "$LOG" | tail -n 1 | sed 's/^[[:space:]]*//'; }

start=$(now)
mkdir -p "$PACKAGE/.build"

# mlx-c, the host of the interop tests.
if [ -n "${MLXKERN_TEST_MLXC:-}" ]; then
  say "mlx-c $MLXKERN_TEST_MLXC (MLXKERN_TEST_MLXC)"
else
  status=0
  out=$("$ROOT/scripts/setup/mlx-c.sh") || status=$?
  case $status in
    0) MLXKERN_TEST_MLXC=$out; say "mlx-c $MLXKERN_TEST_MLXC" ;;
    3) say "SKIP the interop tests with mlx-c: $(echo $out)" ;;
    *) die "building mlx-c failed" ;;
  esac
fi
export MLXKERN_TEST_MLXC=${MLXKERN_TEST_MLXC:-}

if [ "$(uname -s)" = Darwin ]; then
  flags=()
  if swift test --help 2>/dev/null | grep -q -- --disable-swift-testing; then
    flags+=(--disable-swift-testing)  # XCTest only: keep the summary about the tests that ran
  fi
  t=$(now)
  (cd "$PACKAGE" && swift build --build-tests $RPATH) 2>&1 | tee "$LOG"
  say "build: $(since "$t") s"
  t=$(now)
  (cd "$PACKAGE" && swift test --skip-build ${flags[@]+"${flags[@]}"}) 2>&1 | tee -a "$LOG"
  say "test: $(since "$t") s; $(summary)"
  say "total: $(since "$start") s"
  exit 0
fi

# --- Linux: in the Swift 6 chroot ---------------------------------------------------------
[ "$(id -u)" = 0 ] || die "the Swift chroot needs root (chroot, mount namespaces); run as root"
MLXLIB=$(ldd "$LIB" | awk '$1 == "libmlx.so" { print $3 }')
[ -n "$MLXLIB" ] && [ -f "$MLXLIB" ] ||
  die "$LIB does not find libmlx.so (ldd: '${MLXLIB:-nothing}'); rebuild it after make bootstrap"

# Paths outside the repository that the chroot must see at the same place: the library
# folder and MLX's site-packages folder (libmlx and, beside it, mlx_cpu.libs with BLAS); for
# mlx-c, its folder and that of the libmlx it finds (the same file, reached by another path).
paths=("$LIBDIR" "$(dirname "$(dirname "$(dirname "$MLXLIB")")")")
if [ -n "$MLXKERN_TEST_MLXC" ]; then
  MLXC_MLXLIB=$(ldd "$MLXKERN_TEST_MLXC" | awk '$1 == "libmlx.so" { print $3 }')
  [ -n "$MLXC_MLXLIB" ] && [ -f "$MLXC_MLXLIB" ] ||
    die "$MLXKERN_TEST_MLXC does not find libmlx.so (ldd: '${MLXC_MLXLIB:-nothing}')"
  paths+=("$(dirname "$MLXKERN_TEST_MLXC")" "$(dirname "$(dirname "$(dirname "$MLXC_MLXLIB")")")")
fi
binds=()
for path in "${paths[@]}"; do
  path=$(realpath -e "$path") # a folder reached through a link (.venv) is bound where it lies
  case "$path/" in "$ROOT"/*) ;; *) binds+=("$path") ;; esac
done
export SWIFT_RUN_BINDS
SWIFT_RUN_BINDS=$(IFS=:; echo "${binds[*]-}")
export SWIFT_RUN_ENV="MLXKERN_LIB_DIR MLXKERN_TEST_MLXC PKG_CONFIG_PATH"

t=$(now)
"$ROOT/scripts/swift/env.sh"
say "Swift chroot ready: $(since "$t") s"

run() { "$ROOT/scripts/swift/run.sh" "$ROOT" "$@"; }

# Both libraries must resolve inside the root through their rpaths alone.
unresolved=$(run ldd "$LIB" | grep 'not found' || true)
[ -z "$unresolved" ] || die "inside the chroot, $LIB misses: $unresolved"
if [ -n "$MLXKERN_TEST_MLXC" ]; then
  unresolved=$(run ldd "$MLXKERN_TEST_MLXC" | grep 'not found' || true)
  [ -z "$unresolved" ] || die "inside the chroot, $MLXKERN_TEST_MLXC misses: $unresolved"
fi

t=$(now)
run sh -c "cd swift && swift build --build-tests $RPATH" 2>&1 | tee "$LOG"
say "build: $(since "$t") s"

t=$(now)
run sh -c 'cd swift && swift test --skip-build --disable-swift-testing' 2>&1 | tee -a "$LOG"
say "test: $(since "$t") s; $(summary)"
say "total: $(since "$start") s"
