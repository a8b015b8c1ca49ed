#!/usr/bin/env bash
# scripts/swift/mlx-lib.sh MLX_SWIFT_DIR
#
# libmlxkern for an mlx-swift app: builds the static library in host-MLX mode against the MLX
# sources that mlx-swift compiles into the app (MLX_SWIFT_DIR/Source/Cmlx/mlx, a checkout with
# its submodules), so that the app holds one MLX and arrays cross without a copy
# (swift/MLXKernMLX). Then makes a folder for SwiftPM holding only that archive and an
# mlxkern.pc pointing at it, and prints the folder's path on stdout:
#
#   OUT/libmlxkern.a   a link to CARGO_TARGET_DIR/<profile>/libmlxkern.a
#   OUT/mlxkern.pc     Libs: -LOUT -lmlxkern and the system libraries the archive needs
#
# Build the app with PKG_CONFIG_PATH=OUT (SwiftPM then links this archive; the folder holds no
# shared libmlxkern for the linker to prefer).
#
# Environment: CARGO_TARGET_DIR (default target/mlx-swift: apart from the bundled build in
# target/), PROFILE (debug or release; default debug, which is optimized too), OUT (default
# CARGO_TARGET_DIR/<profile>/swiftpm), CARGO (default cargo).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd -P)
die() { printf 'swift-mlx-lib: error: %s\n' "$*" >&2; exit 1; }
say() { printf 'swift-mlx-lib: %s\n' "$*" >&2; }

[ $# -eq 1 ] || die "usage: scripts/swift/mlx-lib.sh MLX_SWIFT_DIR (an mlx-swift checkout with its submodules)"
MLX_SWIFT=$(cd "$1" 2>/dev/null && pwd -P) || die "no such folder: $1"
MLX_SRC=$MLX_SWIFT/Source/Cmlx/mlx
[ -f "$MLX_SRC/mlx/mlx.h" ] ||
  die "$MLX_SRC/mlx/mlx.h not found: MLX_SWIFT_DIR must be an mlx-swift checkout with its submodules (git submodule update --init)"
TARGET=${CARGO_TARGET_DIR:-$ROOT/target/mlx-swift}
case "$TARGET" in /*) ;; *) TARGET=$ROOT/$TARGET ;; esac
PROFILE=${PROFILE:-debug}
case "$PROFILE" in
  debug) flags=() ;;
  release) flags=(--release) ;;
  *) die "PROFILE=$PROFILE: expected debug or release" ;;
esac
OUT=${OUT:-$TARGET/$PROFILE/swiftpm}

version=$(awk '/#define MLX_VERSION_(MAJOR|MINOR|PATCH)/ { v = v (v == "" ? "" : ".") $3 } END { print v }' \
  "$MLX_SRC/mlx/version.h")
say "building libmlxkern.a against MLX $version from $MLX_SRC (MLX's symbols left to the app's link)"
(cd "$ROOT" && MLX_DIR=$MLX_SRC MLXKERN_LINK_MLX=none CARGO_TARGET_DIR=$TARGET \
  "${CARGO:-cargo}" build --lib ${flags[@]+"${flags[@]}"} >&2)
ARCHIVE=$TARGET/$PROFILE/libmlxkern.a
[ -f "$ARCHIVE" ] || die "cargo did not produce $ARCHIVE"

case "$(uname -s)" in
  Linux) system="-lstdc++ -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc" ;;
  Darwin) system="-lc++ -liconv" ;;
  *) die "unsupported OS $(uname -s)" ;;
esac
mkdir -p "$OUT"
ln -sfn "$ARCHIVE" "$OUT/libmlxkern.a"
cat >"$OUT/mlxkern.pc" <<PC
# libmlxkern's static archive built against MLX $version from $MLX_SRC
# (host-MLX mode: MLX's symbols come from the app, which compiles that MLX in). Written by
# scripts/swift/mlx-lib.sh.
libdir=$OUT
includedir=$ROOT/include

Name: mlxkern
Description: mlxkern (static, on the app's MLX $version)
Version: $(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n 1)
Cflags: -I\${includedir}
Libs: -L\${libdir} -lmlxkern $system
PC
say "ready: $OUT (libmlxkern.a, mlxkern.pc): build the app with PKG_CONFIG_PATH=$OUT"
echo "$OUT"
