#!/usr/bin/env bash
# Packs the Bun binding as npm packages (Linux x86-64, glibc):
#
#   scripts/package/bun-pack.sh [--if-changed]
#
#   build/npm/mlxkern-<version>.tgz                the bindings (TypeScript, run by Bun as they
#                                                  are), with mlxkern-linux-x64-gnu as an
#                                                  optional dependency of the same version
#   build/npm/mlxkern-linux-x64-gnu-<version>.tgz  the native library and the MLX it runs on:
#     lib/libmlxkern.so.<ABI>                      RUNPATH $ORIGIN/mlxkern/mlx/lib, debug info
#                                                  stripped
#     lib/mlxkern/mlx/lib/libmlx.so                a private copy of MLX (the one the library
#     lib/mlxkern/mlx_cpu.libs/                    was built against) and its BLAS/LAPACK
#     licenses/                                    mlxkern's, MLX's and the bundled libraries'
#
# The platform package is chosen by the package manager from its os/cpu/libc fields, like the
# platform packages of Bun itself; the bindings find it by resolving its package.json, whose
# field "mlxkern": { "library": ... } names the library file (bun/src/library.ts). Its lib/ is
# what scripts/package/install.sh installs into PREFIX/lib (run here into a staging prefix), less the
# headers and pkg-config files.
#
# --if-changed: do nothing when build/npm holds tarballs packed from the same library and the
# same bindings (a stamp records their checksums).
# Environment: LIBDIR (the folder holding the built libmlxkern.so; default target/debug), OUT
# (default build/npm). Needs: npm, readelf and objcopy (binutils), python3 (for scripts/package/install.sh).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
LIBDIR=${LIBDIR:-$ROOT/target/debug}
OUT=${OUT:-$ROOT/build/npm}
PKG=$ROOT/bun

fail() {
  echo "bun-pack: $*" >&2
  exit 1
}

if_changed=0
case "${1:-}" in
  --if-changed) if_changed=1 ;;
  '') ;;
  *) echo "usage: $0 [--if-changed]" >&2; exit 2 ;;
esac
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] ||
  fail "the platform package is built for Linux x86-64 only (this is $(uname -s)-$(uname -m))"
[ -f "$LIBDIR/libmlxkern.so" ] || fail "$LIBDIR/libmlxkern.so not found: build the library first (cargo build --lib)"
for tool in npm node readelf objcopy; do
  command -v "$tool" >/dev/null || fail "$tool not found"
done

version=$(node -p 'require(process.argv[1]).version' "$PKG/package.json")
header_version=$(sed -n 's/^#define MLXK_VERSION "\(.*\)"$/\1/p' "$ROOT/include/mlxkern.h")
[ "$version" = "$header_version" ] ||
  fail "bun/package.json has version $version, include/mlxkern.h MLXK_VERSION $header_version: make them equal"
PLATFORM=mlxkern-linux-x64-gnu
MAIN_TGZ=$OUT/mlxkern-$version.tgz
PLATFORM_TGZ=$OUT/$PLATFORM-$version.tgz

# What the tarballs are made of: the library, the bindings' sources and manifest, this script.
stamp=$( (sha256sum <"$LIBDIR/libmlxkern.so"
  cd "$ROOT" && sha256sum bun/package.json bun/README.md LICENSE scripts/package/bun-pack.sh scripts/package/install.sh
  find bun/src -type f -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1)
if [ "$if_changed" = 1 ] && [ -f "$MAIN_TGZ" ] && [ -f "$PLATFORM_TGZ" ] &&
  [ "$(cat "$OUT/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "bun-pack: $MAIN_TGZ and $PLATFORM_TGZ are up to date"
  exit 0
fi

mkdir -p "$OUT"
STAGE=$(mktemp -d "$OUT/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT

# --- the platform package ---------------------------------------------------------------------
LIBDIR=$LIBDIR "$ROOT/scripts/package/install.sh" "$STAGE/prefix" >&2
P=$STAGE/$PLATFORM
mkdir -p "$P/lib/mlxkern/mlx/lib" "$P/licenses"
soname=$(readelf -d "$STAGE/prefix/lib/libmlxkern.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
[ -n "$soname" ] || soname=libmlxkern.so
cp "$STAGE/prefix/lib/$soname" "$P/lib/$soname"
objcopy --strip-debug "$P/lib/$soname"
runpath=$(readelf -d "$P/lib/$soname" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p')
[ "$runpath" = '$ORIGIN/mlxkern/mlx/lib' ] || fail "the packed library's RUNPATH is '$runpath'"
cp "$STAGE/prefix/lib/mlxkern/mlx/lib/libmlx.so" "$P/lib/mlxkern/mlx/lib/"
cp -R "$STAGE/prefix/lib/mlxkern/mlx_cpu.libs" "$P/lib/mlxkern/"
cp -R "$STAGE/prefix/share/doc/mlxkern/." "$P/licenses/"
mlx_version=$(sed -n 's/^#define MLX_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' \
  "$STAGE/prefix/lib/mlxkern/mlx/include/mlx/version.h" | paste -sd.)

# The newest glibc and libstdc++ symbol versions the packed libraries need (what the machine
# needs at least), from their dynamic symbol tables.
needs() {
  find "$P/lib" -name '*.so*' -type f -exec readelf --dyn-syms -W {} + |
    grep -o "@$1_[0-9.]*" | sed "s/^@$1_//" | sort -uV | tail -n 1
}
glibc=$(needs GLIBC)
glibcxx=$(needs GLIBCXX)
[ -n "$glibc" ] && [ -n "$glibcxx" ] || fail "could not read the glibc/libstdc++ versions the libraries need"

node - "$P/package.json" "$PLATFORM" "$version" "lib/$soname" "$mlx_version" "$glibc" "$glibcxx" <<'JS'
const [file, name, version, library, mlx, glibc, glibcxx] = process.argv.slice(2);
const manifest = {
  name,
  version,
  description: `libmlxkern ${version} for Linux x86-64 (glibc), with the MLX ${mlx} (CPU) it runs on: the native part of the npm package mlxkern`,
  license: "SEE LICENSE IN licenses/README.md",
  os: ["linux"],
  cpu: ["x64"],
  libc: ["glibc"],
  files: ["lib", "licenses"],
  mlxkern: { library, mlx, glibc, glibcxx },
};
require("node:fs").writeFileSync(file, JSON.stringify(manifest, null, 2) + "\n");
JS
cat >"$P/README.md" <<EOF
# $PLATFORM

The native part of the npm package \`mlxkern\` (Bun
bindings to libmlxkern: Gated DeltaNet kernels on MLX) for Linux x86-64 with glibc. Install
\`mlxkern\`, not this package: the package manager picks this one from its \`os\`, \`cpu\` and
\`libc\` fields. It needs glibc $glibc or later and a libstdc++ with GLIBCXX_$glibcxx.

- \`lib/$soname\`: libmlxkern $version (its RUNPATH is \`\$ORIGIN/mlxkern/mlx/lib\`)
- \`lib/mlxkern/mlx/lib/libmlx.so\`: MLX $mlx_version (CPU), unmodified, as in the \`mlx\` Python wheel
- \`lib/mlxkern/mlx_cpu.libs/\`: the BLAS/LAPACK runtime that MLX wheel bundles
- \`licenses/\`: the licenses (see licenses/README.md)
EOF
cat >"$P/licenses/README.md" <<EOF
# Licenses

- libmlxkern: MIT (LICENSE; THIRD_PARTY_NOTICES.md for the code whose arithmetic it follows).
- MLX $mlx_version (lib/mlxkern/mlx/lib/libmlx.so): MIT, Copyright © 2023 Apple Inc.
  (mlx-$mlx_version.dist-info/).
- The BLAS/LAPACK runtime bundled with MLX's wheel (lib/mlxkern/mlx_cpu.libs/: reference
  BLAS and LAPACK, libgfortran, libquadmath), as the wheel ships it; the bill of materials
  naming each library's origin and version is mlx_cpu-$mlx_version.dist-info/auditwheel.cdx.json.
  Reference BLAS/LAPACK are under a BSD-style license; libgfortran under the GPL version 3
  with the GCC Runtime Library Exception; libquadmath under the LGPL version 2.1.
EOF

# --- the bindings -----------------------------------------------------------------------------
M=$STAGE/mlxkern
mkdir -p "$M"
cp -R "$PKG/src" "$M/src"
cp "$PKG/README.md" "$ROOT/LICENSE" "$M/"
node - "$PKG/package.json" "$M/package.json" "$PLATFORM" <<'JS'
const [source, file, platform] = process.argv.slice(2);
const fs = require("node:fs");
const p = JSON.parse(fs.readFileSync(source, "utf8"));
// What a user installs: the sources, the platform package; not the repository's scripts, tests
// or the tools they need.
delete p.scripts;
delete p.devDependencies;
p.files = ["src", "README.md", "LICENSE"];
p.optionalDependencies = { [platform]: p.version };
fs.writeFileSync(file, JSON.stringify(p, null, 2) + "\n");
JS

rm -f "$MAIN_TGZ" "$PLATFORM_TGZ" "$OUT/.stamp"
for dir in "$P" "$M"; do
  npm pack "$dir" --pack-destination "$OUT" --ignore-scripts --loglevel=error >/dev/null
done
[ -f "$MAIN_TGZ" ] && [ -f "$PLATFORM_TGZ" ] || fail "npm pack did not write $MAIN_TGZ and $PLATFORM_TGZ"
echo "$stamp" >"$OUT/.stamp"
for tgz in "$PLATFORM_TGZ" "$MAIN_TGZ"; do
  echo "bun-pack: $tgz ($(du -k "$tgz" | cut -f1) KiB packed)"
done
