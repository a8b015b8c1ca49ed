#!/usr/bin/env bash
# The Swift consumer (scripts/test/consumers.sh swift): a new SwiftPM package in WORK that
# depends on the repository's Swift package the way a published dependency is taken, pinned to
# a version (SwiftPM refuses unsafe flags in such a dependency), and links the library
# installed by scripts/package/install.sh through the mlxkern.pc it installs. It prints
# tests/consumers/reference.c's results (y, state, norm) made with the package's API.
#
#   1. scripts/package/install.sh WORK/prefix                the library, its header and mlxkern.pc
#   2. WORK/pkg/mlxkern-swift: a git repository holding a copy of swift/ (Package.swift,
#      Sources, Tests), tagged 0.1.0; with the repository's header out of reach, the package
#      reads the installed <mlxkern.h> (pkg-config's include folder)
#   3. WORK/app: Package.swift with .package(url: "file://WORK/pkg/mlxkern-swift", from:
#      "0.1.0"), product MLXKern; `swift build` with PKG_CONFIG_PATH=WORK/prefix/lib/pkgconfig
#      and the rpath to WORK/prefix/lib on the command line (SwiftPM drops mlxkern.pc's rpath
#      flag, with a warning); run it
#   4. the control: the same dependency with an unsafe linker flag added (tag 0.1.1) must be
#      refused by SwiftPM, so step 3 shows what it claims
#
# Linux: Swift 6 runs in the Debian trixie root of scripts/swift/env.sh (needs root; git is
# added to the root for SwiftPM's clones), with WORK bound at its own path. macOS: the
# toolchain's swift. Exit status 3 (skipped) where neither is possible.
set -euo pipefail
: "${ROOT:?}" "${WORK:?}" "${LIBDIR:?}"
say() { printf 'consumer-swift: %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f s", b - a }'; }

case "$(uname -s)" in
  Linux)
    [ "$(id -u)" = 0 ] || { say "SKIP: Swift runs in a chroot here, which needs root"; exit 3; }
    command -v git >/dev/null || { say "SKIP: git not found (apt-get install git)"; exit 3; }
    export SWIFT_CHROOT_PACKAGES="${SWIFT_CHROOT_PACKAGES:+$SWIFT_CHROOT_PACKAGES }git"
    t=$(now)
    "$ROOT/scripts/swift/env.sh" >"$WORK/swift-env.log" 2>&1 ||
      { cat "$WORK/swift-env.log" >&2; say "error: scripts/swift/env.sh failed"; exit 1; }
    say "Swift root ready ($(since "$t"))"
    export SWIFT_RUN_ENV="PKG_CONFIG_PATH"
    swift_in() { local dir=$1; shift; (cd "$dir" && "$ROOT/scripts/swift/run.sh" "$WORK" "$@"); }
    ;;
  Darwin)
    command -v swift >/dev/null || { say "SKIP: swift not found (install Xcode)"; exit 3; }
    swift_in() { local dir=$1; shift; (cd "$dir" && "$@"); }
    ;;
  *) say "SKIP: no Swift route on $(uname -s)"; exit 3 ;;
esac

# 1. The installed library.
t=$(now)
LIBDIR=$LIBDIR "$ROOT/scripts/package/install.sh" "$WORK/prefix" >&2
export PKG_CONFIG_PATH=$WORK/prefix/lib/pkgconfig
say "installed into $WORK/prefix ($(since "$t"))"

# 2. The package, published as a tagged git repository.
PKG=$WORK/pkg/mlxkern-swift
mkdir -p "$PKG"
cp -R "$ROOT/swift/Package.swift" "$ROOT/swift/Sources" "$ROOT/swift/Tests" "$PKG/"
[ ! -e "$PKG/Sources/CMLXKern/../../../include/mlxkern.h" ] || { say "error: the repository's header is reachable from the copy"; exit 1; }
git_pkg() { git -C "$PKG" -c user.name=consumer -c user.email=consumer@localhost "$@" >/dev/null; }
git_pkg init -q
git_pkg add -A
git_pkg commit -q -m "MLXKern"
git_pkg tag 0.1.0

# 3. The consumer.
app() {  # app DIR REQUIREMENT
  mkdir -p "$1/Sources/Consumer"
  cp "$ROOT/tests/consumers/swift/main.swift" "$1/Sources/Consumer/main.swift"
  cat >"$1/Package.swift" <<PKGSWIFT
// swift-tools-version:5.9
import PackageDescription
let package = Package(
    name: "Consumer",
    dependencies: [.package(url: "file://$PKG", $2)],
    targets: [.executableTarget(name: "Consumer", dependencies: [.product(name: "MLXKern", package: "mlxkern-swift")])]
)
PKGSWIFT
}
app "$WORK/app" 'from: "0.1.0"'
t=$(now)
swift_in "$WORK/app" swift build -Xlinker -rpath -Xlinker "$WORK/prefix/lib" >"$WORK/build.log" 2>&1 ||
  { cat "$WORK/build.log" >&2; say "error: swift build failed"; exit 1; }
grep -E 'warning|error' "$WORK/build.log" | sed 's/^/consumer-swift:   /' >&2 || true
grep -E 'resolved at|Computed .* at ' "$WORK/build.log" | sed 's/^/consumer-swift:   /' >&2 || true
grep -qE 'mlxkern-swift.* at 0\.1\.0' "$WORK/build.log" ||
  { cat "$WORK/build.log" >&2; say "error: SwiftPM did not resolve mlxkern-swift at version 0.1.0"; exit 1; }
say "built the consumer against mlxkern-swift 0.1.0 ($(since "$t"))"
swift_in "$WORK/app" ./.build/debug/Consumer

# 4. The control: an unsafe flag in a version-pinned dependency is refused.
sed -i 's|.target(name: "MLXKern", dependencies: \["CMLXKern"\])|.target(name: "MLXKern", dependencies: ["CMLXKern"], linkerSettings: [.unsafeFlags(["-L/nowhere"])])|' "$PKG/Package.swift"
grep -q unsafeFlags "$PKG/Package.swift" || { say "error: the control could not add an unsafe flag"; exit 1; }
git_pkg commit -q -am "MLXKern with an unsafe flag"
git_pkg tag 0.1.1
app "$WORK/control" 'exact: "0.1.1"'
if swift_in "$WORK/control" swift build >"$WORK/control.log" 2>&1; then
  say "error: SwiftPM accepted an unsafe flag in a version-pinned dependency: the check above proves nothing"
  exit 1
fi
grep -i "unsafe" "$WORK/control.log" | head -n 2 | sed 's/^/consumer-swift: control: /' >&2
grep -qi "unsafe" "$WORK/control.log" || { cat "$WORK/control.log" >&2; say "error: the control failed for another reason"; exit 1; }
