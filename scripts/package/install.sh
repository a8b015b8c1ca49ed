#!/usr/bin/env bash
# Installs mlxkern into PREFIX (Linux), in one of two link modes (docs/DESIGN.md §2.2, "Link
# modes"):
#
#   scripts/package/install.sh PREFIX                                     bundled (default)
#   MLXKERN_MLX=host MLX_DIR=... LIBDIR=... scripts/package/install.sh PREFIX    host MLX
#
# Both modes install:
#   PREFIX/include/mlxkern.h, mlxkern.hpp       the C header, the C++ RAII layer (with its
#   PREFIX/include/mlxkern_pool.hpp             pool calls) and the
#   PREFIX/include/mlxkern_mlxc.h               helpers for hosts on mlx-c
#   PREFIX/lib/pkgconfig/mlxkern.pc             Cflags/Libs, with an rpath to PREFIX/lib
#   PREFIX/lib/pkgconfig/mlxkern-mlx.pc         mlxkern plus the MLX it runs on (headers, libmlx),
#                                               for C++ engines that share arrays with mlxkern
#   PREFIX/lib/cmake/mlxkern/                   mlxkernConfig.cmake, mlxkernConfigVersion.cmake:
#                                               find_package(mlxkern), targets mlxkern::mlxkern
#                                               (the C ABI) and mlxkern::mlx (engines on MLX)
#   PREFIX/share/doc/mlxkern/                   the license, third-party notices
# The .pc and .cmake files locate PREFIX from their own folder (${pcfiledir},
# CMAKE_CURRENT_LIST_DIR): the installed tree may be moved.
#
# Bundled (for hosts without MLX):
#   PREFIX/lib/libmlxkern.so.<ABI>              the cdylib built by `cargo build --lib`, under
#                                               its SONAME; libmlxkern.so links to it
#   PREFIX/lib/mlxkern/mlx/lib/libmlx.so        a private copy of the MLX the build linked
#   PREFIX/lib/mlxkern/mlx_cpu.libs/            ... and of the BLAS/LAPACK libraries it bundles
#   PREFIX/lib/mlxkern/mlx/include/             ... and MLX's C++ headers (for engines on MLX)
#   PREFIX/lib/mlxkern/mlx/share/cmake/MLX/     ... and its MLXConfig.cmake (mlxkern::mlx)
#   PREFIX/share/doc/mlxkern/mlx-*.dist-info/   MLX's licenses
#
# Host MLX (for engines that bring their own MLX; LIBDIR is a build against MLX_DIR, e.g.
# `MLX_DIR=... CARGO_TARGET_DIR=target/host cargo build --lib`, as `make install
# MLXKERN_MLX=host MLX_DIR=...` does):
#   PREFIX/lib/libmlxkern.a                     MLX's symbols left to the host's final link
#   PREFIX/lib/libmlxkern.so.<ABI>              where the build linked a shared libmlx: the
#                                               cdylib linking the host's libmlx (its RUNPATH
#                                               keeps the host MLX's folder); no MLX is copied
#   The CMake package finds the host's MLX with find_dependency(MLX); mlxkern-mlx.pc names the
#   host MLX's headers and libmlx.
#
# Why a private copy of MLX in the bundled mode: the built library's RUNPATH points at the MLX
# pip package inside the build's .venv, which an install must not depend on (the build tree may
# be moved or deleted). The pip wheel's libmlx carries RPATH $ORIGIN/../../mlx_cpu.libs (its
# bundled BLAS/LAPACK), so the copy keeps the wheel's layout under PREFIX/lib/mlxkern/ (mlx/lib/
# and mlx_cpu.libs/ side by side) and libmlx is installed unmodified. Only libmlxkern's RUNPATH
# changes, to $ORIGIN/mlxkern/mlx/lib: relative, so the whole PREFIX can be relocated. An engine
# on MLX's C++ API must run on that same libmlx (one libmlx per process): mlxkern-mlx.pc and
# mlxkern::mlx compile it against the copy's headers and link the copy. The
# RUNPATH string is rewritten in place (it is always shorter than the build's absolute path),
# after checking that no other dynamic string shares its bytes; where that is not possible,
# patchelf is used if installed (Debian: apt-get install patchelf).
#
# Environment: LIBDIR (folder holding the built libmlxkern.so / .a; default target/debug),
# MLXKERN_MLX (bundled or host; default bundled), MLX_DIR (host: the MLX the library in LIBDIR
# was built against, as given to the build: a pip package folder, an install prefix, an
# MLXConfig.cmake folder or a source tree), PYTHON (a python3 for the ELF edit; default the
# project's .venv, else python3).
# Needs: bash, coreutils, readelf (binutils), python3. Idempotent: re-running overwrites.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
if [ $# -ne 1 ] || [ -z "$1" ]; then
  echo "usage: $0 PREFIX   (environment: LIBDIR, MLXKERN_MLX=bundled|host, MLX_DIR)" >&2
  exit 2
fi
mkdir -p "$1"
PREFIX=$(cd "$1" && pwd)
LIBDIR=${LIBDIR:-$ROOT/target/debug}
MODE=${MLXKERN_MLX:-bundled}

fail() {
  echo "install: $*" >&2
  exit 1
}

[ "$(uname -s)" = Linux ] || fail "only Linux is supported by this script (macOS: use the dylib's @rpath install name)"
command -v readelf >/dev/null || fail "readelf not found (Debian: apt-get install binutils)"
case "$MODE" in
  bundled | host) ;;
  *) fail "MLXKERN_MLX=$MODE: expected bundled (a private MLX copy) or host (the host's MLX)" ;;
esac
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python3" ]; then PYTHON=$ROOT/.venv/bin/python3; else PYTHON=python3; fi
fi

version=$(sed -n 's/^#define MLXK_VERSION "\(.*\)"$/\1/p' "$ROOT/include/mlxkern.h")
[ -n "$version" ] || fail "MLXK_VERSION not found in include/mlxkern.h"
abi=$(sed -n 's/^#define MLXK_ABI_VERSION \([0-9][0-9]*\)$/\1/p' "$ROOT/include/mlxkern.h")
[ -n "$abi" ] || fail "MLXK_ABI_VERSION not found in include/mlxkern.h"
runpath_of() { readelf -d "$1" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p' | head -n 1; }
needs_libmlx() { readelf -d "$1" | grep -q '(NEEDED).*\[libmlx\.so'; }
mlx_version_of() {  # the folder holding mlx/version.h
  sed -n 's/^#define MLX_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$1/mlx/version.h" | paste -sd.
}

DEST_LIB=$PREFIX/lib
DEST_MLX=$DEST_LIB/mlxkern  # bundled: mirrors the wheel's site-packages layout
mkdir -p "$PREFIX/include" "$DEST_LIB/pkgconfig" "$DEST_LIB/cmake/mlxkern" "$PREFIX/share/doc/mlxkern"

# 1. Headers, license.
install -m 0644 "$ROOT/include/mlxkern.h" "$ROOT/include/mlxkern.hpp" "$ROOT/include/mlxkern_pool.hpp" \
  "$ROOT/include/mlxkern_mlxc.h" "$PREFIX/include/"
for doc in LICENSE THIRD_PARTY_NOTICES.md; do
  if [ -f "$ROOT/$doc" ]; then install -m 0644 "$ROOT/$doc" "$PREFIX/share/doc/mlxkern/"; fi
done

set_runpath_in_place() {
  "$PYTHON" - "$1" "$2" <<'PY'
"""Rewrites the DT_RUNPATH (or DT_RPATH) string of a 64-bit little-endian ELF shared library in
place. The new string must not be longer than the old one; the rest is filled with NULs. Refuses
(exit 3) when any other dynamic string reference (DT_NEEDED, DT_SONAME, symbol names, version
names) points into the old string's bytes (linkers merge string suffixes)."""
import struct
import sys

path, new = sys.argv[1], sys.argv[2].encode()
data = bytearray(open(path, "rb").read())
if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
    sys.exit("not a 64-bit little-endian ELF file")
phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)

loads, dynamic = [], None
for i in range(phnum):
    p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
        "<IIQQQQQQ", data, phoff + i * phentsize)
    if p_type == 1:
        loads.append((p_vaddr, p_offset, p_filesz))
    elif p_type == 2:
        dynamic = (p_offset, p_filesz)
if dynamic is None:
    sys.exit("no PT_DYNAMIC segment")


def offset_of(vaddr):
    for start, offset, size in loads:
        if start <= vaddr < start + size:
            return offset + vaddr - start
    sys.exit(f"address {vaddr:#x} is in no PT_LOAD segment")


entries = []
for i in range(dynamic[1] // 16):
    tag, value = struct.unpack_from("<qQ", data, dynamic[0] + 16 * i)
    if tag == 0:
        break
    entries.append((tag, value))
tags = dict(entries)
DT_STRTAB, DT_STRSZ, DT_RPATH, DT_RUNPATH = 5, 10, 15, 29
strtab = offset_of(tags[DT_STRTAB])
strsz = tags[DT_STRSZ]
targets = [value for tag, value in entries if tag in (DT_RPATH, DT_RUNPATH)]
if not targets:
    sys.exit("no DT_RUNPATH or DT_RPATH entry")

# Every other reference into the dynamic string table.
refs = [value for tag, value in entries
        if tag in (1, 14, 0x7FFFFFFD, 0x7FFFFFFF)]  # NEEDED, SONAME, AUXILIARY, FILTER
for i in range(shnum):
    sh_name, sh_type, _, _, sh_offset, sh_size, _, _, _, sh_entsize = struct.unpack_from(
        "<IIQQQQIIQQ", data, shoff + i * shentsize)
    if sh_type == 11 and sh_entsize:  # SHT_DYNSYM: st_name is each entry's first word
        refs += [struct.unpack_from("<I", data, sh_offset + j * sh_entsize)[0]
                 for j in range(sh_size // sh_entsize)]
if 0x6FFFFFFE in tags:  # DT_VERNEED: vn_file, vna_name
    at = offset_of(tags[0x6FFFFFFE])
    for _ in range(tags.get(0x6FFFFFFF, 0)):
        _, count, vn_file, vn_aux, vn_next = struct.unpack_from("<HHIII", data, at)
        refs.append(vn_file)
        aux = at + vn_aux
        for _ in range(count):
            _, _, _, vna_name, vna_next = struct.unpack_from("<IHHII", data, aux)
            refs.append(vna_name)
            aux += vna_next
        at += vn_next
if 0x6FFFFFFC in tags:  # DT_VERDEF: vda_name
    at = offset_of(tags[0x6FFFFFFC])
    for _ in range(tags.get(0x6FFFFFFD, 0)):
        _, _, _, count, _, vd_aux, vd_next = struct.unpack_from("<HHHHIII", data, at)
        aux = at + vd_aux
        for _ in range(count):
            vda_name, vda_next = struct.unpack_from("<II", data, aux)
            refs.append(vda_name)
            aux += vda_next
        at += vd_next

for target in targets:
    start = strtab + target
    end = data.index(b"\0", start)
    if target >= strsz or end >= strtab + strsz:
        sys.exit("RUNPATH string outside the string table")
    length = end - start
    if len(new) > length:
        print(f"new RUNPATH longer than the old one ({len(new)} > {length})", file=sys.stderr)
        sys.exit(3)
    if any(target < ref < target + length for ref in refs if ref not in targets):
        print("another dynamic string shares the RUNPATH's bytes", file=sys.stderr)
        sys.exit(3)
    data[start:end + 1] = new + b"\0" * (length + 1 - len(new))
open(path, "wb").write(data)
PY
}
# Installs a copy of the cdylib $1 under its SONAME (libmlxkern.so.<ABI>, what linked programs
# ask for), with the development link libmlxkern.so -> it (what -lmlxkern finds); $2: the
# RUNPATH to give it, or "" to keep the built one.
install_shared() {
  local lib=$1 new_runpath=$2 tmp=$DEST_LIB/.libmlxkern.so.tmp status=0 soname got
  cp "$lib" "$tmp"
  chmod 0755 "$tmp"
  if [ -n "$new_runpath" ]; then
    set_runpath_in_place "$tmp" "$new_runpath" || status=$?
    if [ "$status" -ne 0 ]; then
      if [ "$status" -eq 3 ] && command -v patchelf >/dev/null; then
        cp "$lib" "$tmp"
        patchelf --set-rpath "$new_runpath" "$tmp"
      else
        rm -f "$tmp"
        fail "could not set the RUNPATH of the installed library (install patchelf: apt-get install patchelf)"
      fi
    fi
  fi
  soname=$(readelf -d "$tmp" | sed -n 's/.*(SONAME).*\[\(.*\)\]$/\1/p')
  [ -n "$soname" ] || soname=libmlxkern.so
  if [ "$soname" != libmlxkern.so ]; then
    rm -f "$DEST_LIB/libmlxkern.so"
    mv -f "$tmp" "$DEST_LIB/$soname"
    ln -s "$soname" "$DEST_LIB/libmlxkern.so"
  else
    mv -f "$tmp" "$DEST_LIB/libmlxkern.so"
  fi
  if [ -n "$new_runpath" ]; then
    got=$(runpath_of "$DEST_LIB/$soname")
    [ "$got" = "$new_runpath" ] || fail "RUNPATH of the installed library is '$got', expected '$new_runpath'"
  fi
}

if [ "$MODE" = bundled ]; then
  LIB=$LIBDIR/libmlxkern.so
  [ -f "$LIB" ] || fail "$LIB not found: build the library first (cargo build --lib)"
  # The MLX the build linked: the library's RUNPATH names the folder holding libmlx.so.
  runpath=$(runpath_of "$LIB")
  [ -n "$runpath" ] || fail "$LIB has no RUNPATH/RPATH: cannot tell which libmlx it was built against"
  needs_libmlx "$LIB" || fail "$LIB does not link a shared libmlx (built with MLXKERN_LINK_MLX=none?): a bundled install needs one; for an MLX of the host's own use MLXKERN_MLX=host"
  MLX_LIB=
  IFS=: read -r -a entries <<<"$runpath"
  for entry in "${entries[@]}"; do
    if [ -f "$entry/libmlx.so" ]; then
      MLX_LIB=$(cd "$entry" && pwd)
      break
    fi
  done
  [ -n "$MLX_LIB" ] || fail "libmlx.so not found in $LIB's RUNPATH ($runpath)"
  rm -f "$DEST_LIB/libmlxkern.a"  # a host-MLX install's, if one was here
  mkdir -p "$DEST_MLX/mlx/lib"

  # 2. MLX: libmlx.so unmodified, plus every $ORIGIN-relative folder its RPATH/RUNPATH names
  #    (the wheel: $ORIGIN/../../mlx_cpu.libs), at the same relative place.
  install -m 0755 "$MLX_LIB/libmlx.so" "$DEST_MLX/mlx/lib/libmlx.so"
  mlx_runpath=$(runpath_of "$MLX_LIB/libmlx.so")
  IFS=: read -r -a mlx_entries <<<"$mlx_runpath"
  for entry in "${mlx_entries[@]}"; do
    case "$entry" in
      '$ORIGIN'/*)
        relative=${entry#\$ORIGIN/}
        source=$(realpath -m "$MLX_LIB/$relative")
        target=$(realpath -m "$DEST_MLX/mlx/lib/$relative")
        case "$target" in
          "$DEST_MLX"/*) ;;
          *) fail "libmlx's RPATH entry $entry would land outside $DEST_MLX" ;;
        esac
        if [ -d "$source" ]; then
          mkdir -p "$target"
          cp -p "$source"/* "$target/"
        fi
        ;;
      '') ;;
      *) echo "install: note: libmlx's RPATH entry $entry is absolute; left as is" >&2 ;;
    esac
  done

  # MLX's C++ headers and CMake package, those of the libmlx copied above (the wheel keeps them
  # in mlx/include and mlx/share/cmake/MLX; its MLXConfig.cmake locates itself, so it works
  # from the copy).
  MLX_ROOT=$(dirname "$MLX_LIB")
  MLX_INCLUDE=$MLX_ROOT/include
  [ -f "$MLX_INCLUDE/mlx/mlx.h" ] || fail "MLX's headers not found next to $MLX_LIB (expected $MLX_INCLUDE/mlx/mlx.h)"
  rm -rf "$DEST_MLX/mlx/include" "$DEST_MLX/mlx/share"
  cp -R "$MLX_INCLUDE" "$DEST_MLX/mlx/include"
  if [ -f "$MLX_ROOT/share/cmake/MLX/MLXConfig.cmake" ]; then
    mkdir -p "$DEST_MLX/mlx/share/cmake"
    cp -R "$MLX_ROOT/share/cmake/MLX" "$DEST_MLX/mlx/share/cmake/MLX"
  else
    echo "install: note: $MLX_ROOT has no share/cmake/MLX: the CMake package gets no mlxkern::mlx target" >&2
  fi
  chmod -R u+w,go-w,a+rX "$DEST_MLX/mlx/include" "$DEST_MLX/mlx/share" 2>/dev/null || true
  mlx_version=$(mlx_version_of "$MLX_INCLUDE")
  [ -n "$mlx_version" ] || fail "MLX's version not found in $MLX_INCLUDE/mlx/version.h"

  # The licenses of what is redistributed (MLX, its bundled BLAS/LAPACK runtime).
  site=$(dirname "$MLX_ROOT")  # the site-packages folder holding mlx/
  for info in "$site"/mlx-*.dist-info "$site"/mlx_cpu-*.dist-info; do
    [ -d "$info" ] || continue
    name=$(basename "$info")
    mkdir -p "$PREFIX/share/doc/mlxkern/$name"
    find "$info" \( -path '*/licenses/*' -o -path '*/sboms/*' \) -type f \
      -exec cp -p {} "$PREFIX/share/doc/mlxkern/$name/" \;
  done

  # 3. libmlxkern.so with RUNPATH $ORIGIN/mlxkern/mlx/lib.
  NEW_RUNPATH='$ORIGIN/mlxkern/mlx/lib'
  install_shared "$LIB" "$NEW_RUNPATH"
  mlx_cflags='-isystem ${mlxdir}/include'
  mlx_libs='-L${mlxdir}/lib -lmlx -Wl,-rpath,${mlxdir}/lib'
  # mlx[cpu] 0.31.1's liblapack has no RPATH of its own: GNU ld needs the folder named to find
  # its libgfortran when linking against libmlx (the loader finds it through libmlx's RPATH).
  rpath_link=
  [ -d "$DEST_MLX/mlx_cpu.libs" ] && rpath_link=' -Wl,-rpath-link,${libdir}/mlxkern/mlx_cpu.libs'
  mlx_cmake_hint=
  summary="MLX $mlx_version from $MLX_LIB, copied; RUNPATH $NEW_RUNPATH"
else
  # 2. Host MLX: the MLX named by MLX_DIR, as build.rs reads it.
  [ -n "${MLX_DIR:-}" ] || fail "MLXKERN_MLX=host needs MLX_DIR, the MLX the library in $LIBDIR was built against"
  [ -d "$MLX_DIR" ] || fail "MLX_DIR=$MLX_DIR is not a folder"
  MLX_DIR=$(cd "$MLX_DIR" && pwd)
  MLX_INCLUDE=
  for candidate in "$MLX_DIR/include" "$MLX_DIR/../../../include" "$MLX_DIR"; do
    if [ -f "$candidate/mlx/mlx.h" ]; then MLX_INCLUDE=$(cd "$candidate" && pwd); break; fi
  done
  [ -n "$MLX_INCLUDE" ] || fail "MLX_DIR=$MLX_DIR holds neither include/mlx/mlx.h nor mlx/mlx.h"
  mlx_version=$(mlx_version_of "$MLX_INCLUDE")
  [ -n "$mlx_version" ] || fail "MLX's version not found in $MLX_INCLUDE/mlx/version.h"
  mlx_cmake_hint=
  for candidate in "$MLX_DIR" "$MLX_DIR/share/cmake/MLX" "$MLX_DIR/lib/cmake/MLX"; do
    if [ -f "$candidate/MLXConfig.cmake" ]; then mlx_cmake_hint=$(cd "$candidate" && pwd); break; fi
  done
  [ -f "$LIBDIR/libmlxkern.a" ] || fail "$LIBDIR/libmlxkern.a not found: build the library against MLX_DIR first (MLX_DIR=$MLX_DIR cargo build --lib)"
  rm -rf "$DEST_MLX" "$DEST_LIB"/libmlxkern.so*  # a bundled install's, if one was here
  install -m 0644 "$LIBDIR/libmlxkern.a" "$DEST_LIB/libmlxkern.a"
  LIB=$LIBDIR/libmlxkern.so
  MLX_LIB=
  if [ -f "$LIB" ] && needs_libmlx "$LIB"; then
    IFS=: read -r -a entries <<<"$(runpath_of "$LIB")"
    for entry in "${entries[@]}"; do
      if [ -f "$entry/libmlx.so" ]; then MLX_LIB=$(cd "$entry" && pwd); break; fi
    done
    [ -n "$MLX_LIB" ] || fail "$LIB links libmlx but its RUNPATH names no folder holding it"
    [ -f "$MLX_LIB/../include/mlx/mlx.h" ] &&
      [ "$(cd "$MLX_LIB/../include" && pwd -P)" = "$(cd "$MLX_INCLUDE" && pwd -P)" ] ||
      fail "$LIB links $MLX_LIB/libmlx.so, not the MLX of MLX_DIR=$MLX_DIR: install the build made against MLX_DIR"
    install_shared "$LIB" ""  # its RUNPATH keeps the host MLX's folder
    mlx_libs="-L$MLX_LIB -lmlx -Wl,-rpath,$MLX_LIB"
    rpath_link=
    [ -d "$MLX_LIB/../../mlx_cpu.libs" ] && rpath_link=" -Wl,-rpath-link,$(cd "$MLX_LIB/../../mlx_cpu.libs" && pwd)"
    summary="the shared library links the host's libmlx ($MLX_LIB) and"
  else
    echo "install: note: no shared libmlx linked by the build in $LIBDIR (a static or source MLX):" \
      "only libmlxkern.a is installed" >&2
    mlx_libs=
    rpath_link=
    summary="no shared library;"
  fi
  mlx_cflags="-isystem $MLX_INCLUDE"
  summary="host MLX $mlx_version ($MLX_DIR): $summary libmlxkern.a; no MLX copied"
fi

# 4. pkg-config files (relocatable: prefix from ${pcfiledir}).
for pc in mlxkern mlxkern-mlx; do
  sed -e "s|@VERSION@|$version|g" -e "s|@MLX_VERSION@|$mlx_version|g" -e "s|@MLX_MODE@|$MODE|g" \
    -e "s|@MLX_CFLAGS@|$mlx_cflags|g" -e "s|@MLX_LIBS@|$mlx_libs|g" -e "s|@RPATH_LINK@|$rpath_link|g" \
    "$ROOT/$pc.pc.in" >"$DEST_LIB/pkgconfig/$pc.pc"
  chmod 0644 "$DEST_LIB/pkgconfig/$pc.pc"
done

# 5. CMake package (relocatable: prefix from the file's own folder).
sed -e "s|@VERSION@|$version|g" -e "s|@ABI_VERSION@|$abi|g" -e "s|@MLX_VERSION@|$mlx_version|g" \
  -e "s|@MLX_MODE@|$MODE|g" -e "s|@MLX_CMAKE_HINT@|$mlx_cmake_hint|g" \
  "$ROOT/cmake/mlxkernConfig.cmake.in" >"$DEST_LIB/cmake/mlxkern/mlxkernConfig.cmake"
sed -e "s|@VERSION@|$version|g" "$ROOT/cmake/mlxkernConfigVersion.cmake.in" \
  >"$DEST_LIB/cmake/mlxkern/mlxkernConfigVersion.cmake"
chmod 0644 "$DEST_LIB/cmake/mlxkern/"*.cmake

echo "install: mlxkern $version into $PREFIX ($MODE: $summary)"
