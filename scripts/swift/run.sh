#!/usr/bin/env bash
# scripts/swift/run.sh DIR CMD [ARGS...]
#
# Swift 6 toolchain in a Debian trixie chroot. Runs CMD inside the Swift root made by
# scripts/swift/env.sh, with DIR bind-mounted
# at the same absolute path it has on the host (so absolute paths, .build
# caches, #filePath and -rpath values mean the same inside and outside).
# The working directory is the current one if it lies inside DIR, else DIR.
# The exit status is CMD's.
#
#   scripts/swift/run.sh "$PWD" swift test
#   scripts/swift/run.sh /src/proj sh -c 'cd swift && swift build -c release'
#
# Settings (environment):
#   SWIFT_CHROOT        the root (default /var/cache/swift-chroot/trixie);
#                       made by scripts/swift/env.sh first if it is missing
#   SWIFT_RUN_BINDS     more host paths to bind at the same path, ':'-separated
#                       (e.g. a C library's build folder outside DIR)
#   SWIFT_RUN_ENV       names of host variables to pass in, space-separated
#                       (the command gets a clean environment otherwise:
#                       HOME=/root, LANG=C.UTF-8, PATH, TERM, TMPDIR=/tmp, CI)
#
# Mounts (/proc, /dev, /sys, a fresh tmpfs on /tmp, DIR) are made in a
# private mount namespace: the kernel removes them when CMD ends, on success,
# failure, Ctrl-C or kill -9 alike; nothing is mounted on the host, and two
# runs at once don't see each other's /tmp.
set -euo pipefail

die() { printf 'swift-run: error: %s\n' "$*" >&2; exit 125; }

[ $# -ge 2 ] || die "usage: scripts/swift/run.sh DIR CMD [ARGS...]"
[ "$(id -u)" = 0 ] || die "must run as root (chroot, mount)"
ROOT=${SWIFT_CHROOT:-/var/cache/swift-chroot/trixie}
ROOT=${ROOT%/}
DIR=$(realpath -e -- "$1") || die "no such directory: $1"
shift
[ -d "$DIR" ] || die "not a directory: $DIR"
case "$DIR" in
  /) die "refusing to bind / over the root" ;;
  "$ROOT"|"$ROOT"/*) die "DIR is inside the chroot itself" ;;
esac
case "$ROOT/" in
  "$DIR"/*) die "DIR $DIR contains the chroot; pick the project folder" ;;
esac
case "$DIR" in
  /proc|/proc/*|/dev|/dev/*|/sys|/sys/*|/usr|/usr/*|/bin|/bin/*|/sbin|/sbin/*|/lib|/lib/*|/lib64|/lib64/*|/etc|/etc/*)
    die "DIR $DIR would hide part of the chroot's system" ;;
esac

if [ ! -f "$ROOT/.swift-env-stamp" ]; then
  printf 'swift-run: %s is not set up; running scripts/swift/env.sh\n' "$ROOT" >&2
  "$(dirname -- "$(realpath -e -- "$0")")/env.sh" "$ROOT" || die "scripts/swift/env.sh failed"
fi

# Working directory: keep the caller's if it is inside DIR.
case "$PWD/" in "$DIR"/*) WD=$PWD ;; *) WD=$DIR ;; esac

# Extra binds, validated on the host side.
BINDS=()
if [ -n "${SWIFT_RUN_BINDS:-}" ]; then
  IFS=: read -r -a _b <<< "$SWIFT_RUN_BINDS"
  for b in "${_b[@]}"; do
    [ -n "$b" ] || continue
    rb=$(realpath -e -- "$b") || die "no such path: $b"
    case "$rb/" in "$DIR"/*) continue ;; esac   # already visible through DIR
    BINDS+=("$rb")
  done
fi

# Clean environment for the command.
ENVV=(HOME=/root LANG=C.UTF-8 TMPDIR=/tmp USER=root
      PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      "TERM=${TERM:-dumb}")
[ -z "${CI+x}" ] || ENVV+=("CI=$CI")
for v in ${SWIFT_RUN_ENV:-}; do
  [ -z "${!v+x}" ] || ENVV+=("$v=${!v}")
done

# No PID namespace on purpose: `unshare --fork` blocks SIGTERM/SIGINT in its
# parent, so `timeout` or CI cancellation would not stop the command. Without
# --fork, unshare execs the command in place and signals work as usual.
exec unshare --mount --propagation private -- /bin/bash -euc '
  r=$1 dir=$2 wd=$3 nb=$4; shift 4
  binds=("${@:1:$nb}"); shift "$nb"
  ne=$1; shift
  envv=("${@:1:$ne}"); shift "$ne"
  mount -t proc -o nosuid,nodev,noexec proc "$r/proc"
  mount --rbind /dev "$r/dev"
  mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$r/sys"
  mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/tmp"
  for p in "$dir" "${binds[@]}"; do
    if [ -d "$p" ]; then [ -d "$r$p" ] || mkdir -p "$r$p"
    else [ -d "$(dirname "$r$p")" ] || mkdir -p "$(dirname "$r$p")"; [ -e "$r$p" ] || : > "$r$p"; fi
    mount --bind "$p" "$r$p"
  done
  exec chroot "$r" /usr/bin/env -i "${envv[@]}" /bin/sh -c "cd \"\$1\" && shift && exec \"\$@\"" sh "$wd" "$@"
' swift-run "$ROOT" "$DIR" "$WD" "${#BINDS[@]}" "${BINDS[@]}" "${#ENVV[@]}" "${ENVV[@]}" "$@"
