#!/usr/bin/env bash
# scripts/swift/env.sh [CHROOT_DIR]
#
# Swift 6 toolchain in a Debian trixie chroot: the root used by scripts/swift/run.sh and
# scripts/test/swift.sh. Creates, once, a minimal Debian trixie root with Debian's Swift toolchain
# (package swiftlang, Swift 6.0.x) on a Debian bookworm host, whose glibc
# (2.36) is too old for trixie's swiftlang (needs >= 2.38). Idempotent: a
# second call finds the stamp and returns at once. Needs root.
#
# Settings (environment):
#   SWIFT_CHROOT            where the root goes (default /var/cache/swift-chroot/trixie);
#                           the first argument wins over it
#   SWIFT_CHROOT_SUITE      Debian suite (default trixie: swiftlang 6.0.3; sid had
#                           6.2.3, but sid moves daily - prefer trixie for CI)
#   SWIFT_CHROOT_MIRROR     mirror (default: the Debian mirror the host's apt sources use)
#   SWIFT_CHROOT_PACKAGES   extra Debian packages to add (space separated);
#                           adding some later installs just those, in place
#   SWIFT_CHROOT_SLIM=1     don't unpack lldb, sourcekit-lsp/sourcekitd, clangd,
#                           docc, swift-format and the static stdlib (-0.9 GB;
#                           the download is the same). Read at creation only.
#
# All mounts this script needs are made inside a private mount namespace
# (unshare --mount), so the kernel drops them when the command ends, however
# it ends (error, Ctrl-C, kill -9): nothing is ever left mounted on the host.
set -euo pipefail

ROOT=${1:-${SWIFT_CHROOT:-/var/cache/swift-chroot/trixie}}
SUITE=${SWIFT_CHROOT_SUITE:-trixie}
# The host's own Debian mirror: the first URI of a deb822 .sources file, else of sources.list.
host_mirror() {
  local u
  u=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n 1)
  [ -n "$u" ] || u=$(awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; exit}}' /etc/apt/sources.list 2>/dev/null | head -n 1)
  printf '%s' "${u%/}"
}
MIRROR=${SWIFT_CHROOT_MIRROR:-$(host_mirror)}
[ -n "$MIRROR" ] || { echo "swift-env: error: no Debian mirror found in the apt sources; set SWIFT_CHROOT_MIRROR" >&2; exit 1; }
# swiftlang itself does not pull libc6-dev (gcc only Recommends it); without
# it `swift build` warns "libc not found" and `swift test` fails with
# "'sys/param.h' file not found / could not build C module 'CDispatch'".
BASE_PACKAGES="swiftlang libc6-dev"
EXTRA_PACKAGES=${SWIFT_CHROOT_PACKAGES:-}
STAMP="$ROOT/.swift-env-stamp"

log() { printf 'swift-env: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (chroot, mount)"
case "$ROOT" in /*) ;; *) die "CHROOT_DIR must be absolute: $ROOT" ;; esac
ROOT=${ROOT%/}
if [ -z "$ROOT" ] || [ "$ROOT" = / ]; then die "refusing CHROOT_DIR=/"; fi

# Everything under $1 that is still a mount point (deepest first).
mounts_under() {
  awk -v p="$1" '{ m = $5; gsub(/\\040/, " ", m); if (m == p || index(m, p "/") == 1) print m }' \
    /proc/self/mountinfo | sort -r
}
# Remove a directory tree safely: never descend into anything mounted there
# (a stale /dev or /sys bind would otherwise be wiped on the host).
safe_rm_tree() {
  local d=$1 m
  [ -e "$d" ] || return 0
  for m in $(mounts_under "$d"); do umount -l "$m" 2>/dev/null || true; done
  [ -z "$(mounts_under "$d")" ] || die "still mounted under $d; not removing it"
  rm -rf --one-file-system -- "$d"
}

# Runs a command inside the root with /proc, /dev and /sys mounted, in a
# private mount namespace (mounts vanish with the process). /proc matters:
# swift's binaries find their libraries through RUNPATH $ORIGIN, which glibc
# resolves through /proc/self/exe; without /proc, `swift` fails with
# "libswiftCore.so: cannot open shared object file".
in_root() {
  local r=$1; shift
  unshare --mount --propagation private -- /bin/sh -euc '
    r=$1; shift
    mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
    mount --rbind /dev "$r/dev"
    mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$r/sys"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/tmp"
    # fresh resolv.conf for apt (the copy taken at creation may be stale)
    cp -L /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
    exec chroot "$r" /usr/bin/env -i HOME=/root LANG=C.UTF-8 \
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      DEBIAN_FRONTEND=noninteractive "$@"
  ' in_root "$r" "$@"
}

want_config() { printf 'suite=%s\nmirror=%s\npackages=%s\n' "$SUITE" "$MIRROR" "$(echo $BASE_PACKAGES $EXTRA_PACKAGES)"; }

mkdir -p "$(dirname "$ROOT")"
exec 9>"$ROOT.lock"
flock -w 3600 9 || die "timed out waiting for $ROOT.lock"

# --- fast path: already there --------------------------------------------
# Whether every wanted package is among those the stamp records (a root made with more
# packages serves callers that want fewer: scripts/test/swift.sh and scripts/test/mlx-swift.sh share one).
has_packages() {
  local have p
  have=" $(sed -n 's/^packages=//p' "$STAMP") "
  for p in $BASE_PACKAGES $EXTRA_PACKAGES; do
    case "$have" in *" $p "*) ;; *) return 1 ;; esac
  done
}
if [ -f "$STAMP" ]; then
  if [ "$(sed -n '1,3p' "$STAMP")" = "$(want_config)" ] ||
     { [ "$(sed -n '1,2p' "$STAMP")" = "$(want_config | sed -n '1,2p')" ] && has_packages; }; then
    log "ready: $ROOT ($(sed -n 's/^swift=//p' "$STAMP"))"
    exit 0
  fi
  # Same suite, other package list: install what is wanted, in place.
  if [ "$(sed -n '1p' "$STAMP")" = "suite=$SUITE" ]; then
    # Keep what is there: the root then serves both the old and the new callers.
    for p in $(sed -n 's/^packages=//p' "$STAMP"); do
      case " $BASE_PACKAGES $EXTRA_PACKAGES " in *" $p "*) ;; *) EXTRA_PACKAGES="$EXTRA_PACKAGES $p" ;; esac
    done
    log "updating packages in place: $BASE_PACKAGES $EXTRA_PACKAGES"
    in_root "$ROOT" apt-get update -q >&2
    # shellcheck disable=SC2086
    in_root "$ROOT" apt-get install -y -q --no-install-recommends $BASE_PACKAGES $EXTRA_PACKAGES >&2
    in_root "$ROOT" apt-get clean
    ver=$(in_root "$ROOT" swift --version 2>/dev/null | head -1)
    { want_config; echo "swift=$ver"; } > "$STAMP"
    log "ready: $ROOT ($ver)"
    exit 0
  fi
  die "$ROOT was made for another suite; remove it or pick another SWIFT_CHROOT"
fi

[ ! -e "$ROOT" ] || [ -z "$(ls -A "$ROOT" 2>/dev/null)" ] ||
  die "$ROOT exists without a stamp (an interrupted run?): remove it first, e.g. rm -rf --one-file-system '$ROOT'"

# --- first creation ---------------------------------------------------------
t0=$(date +%s)
if ! command -v mmdebstrap >/dev/null 2>&1; then
  log "installing mmdebstrap on the host"
  apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends mmdebstrap >/dev/null; } ||
    die "could not install mmdebstrap"
fi

SLIM_OPTS=()
if [ "${SWIFT_CHROOT_SLIM:-0}" = 1 ]; then
  for p in bin/lldb\* lib/liblldb\* bin/sourcekit-lsp lib/libsourcekitd\* bin/clangd \
           bin/docc share/docc\* bin/swift-format bin/repl_swift lib/swift_static\*; do
    SLIM_OPTS+=("--dpkgopt=path-exclude=/usr/libexec/swift/$p")
  done
fi

PARTIAL="$ROOT.partial"
safe_rm_tree "$PARTIAL"
# shellcheck disable=SC2154
trap 'rc=$?; [ $rc = 0 ] || { log "failed (rc=$rc); removing $PARTIAL"; safe_rm_tree "$PARTIAL"; }' EXIT
trap 'exit 129' HUP; trap 'exit 130' INT; trap 'exit 143' TERM

log "creating $SUITE root with: $BASE_PACKAGES $EXTRA_PACKAGES (about 550 MB to download, 2.5 GB on disk)"
# mmdebstrap resolves with apt (fast, parallel downloads) and leaves no
# package lists nor .debs behind; Recommends are not installed. Docs, man
# pages and translations are not unpacked. Run in a private mount namespace
# so that the mounts mmdebstrap makes in the target can never outlive it.
# shellcheck disable=SC2086
unshare --mount --propagation private -- \
  mmdebstrap --mode=root --variant=apt \
    --include="$(echo $BASE_PACKAGES $EXTRA_PACKAGES | tr ' ' ,)" \
    --aptopt='Acquire::Retries "3"' \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "${SLIM_OPTS[@]}" \
    "$SUITE" "$PARTIAL" "$MIRROR" >&2

ver=$(in_root "$PARTIAL" swift --version 2>&1 | head -1)
case "$ver" in "Swift version"*) ;; *) die "swift does not run in the new root: $ver" ;; esac

mv -T "$PARTIAL" "$ROOT"
trap - EXIT
{ want_config; echo "swift=$ver"; } > "$STAMP"
log "ready: $ROOT ($ver) in $(( $(date +%s) - t0 ))s, $(du -sh "$ROOT" | cut -f1) on disk"
