#!/usr/bin/env bash
# Creates (or checks) the project-local Python environment that provides MLX's headers and
# libmlx for the build, and mlx-lm + numpy for the oracle tests. Idempotent: a second run with
# everything in place does nothing.
#
#   scripts/bootstrap.sh --mlx VERSION   instead makes .venv-mlx-VERSION with MLX VERSION alone
#                                        (mlx[cpu] on Linux), a second MLX for the host-MLX tests
#                                        (scripts/test/host-mlx.sh); prints its MLX folder.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = --mlx ]; then
  [ -n "${2:-}" ] || { echo "usage: $0 --mlx VERSION" >&2; exit 2; }
  venv=.venv-mlx-$2
  case "$(uname -s)" in Linux) spec="mlx[cpu]==$2" ;; *) spec="mlx==$2" ;; esac
  if ! "$venv/bin/python3" -c "import sys; from importlib.metadata import version; sys.exit(version('mlx') != sys.argv[1])" "$2" 2>/dev/null; then
    echo "bootstrap: creating $venv with $spec" >&2
    [ -x "$venv/bin/python3" ] || "${PYTHON:-python3}" -m venv "$venv"
    "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check "$spec" >&2
  fi
  "$venv/bin/python3" -m mlx --cmake-dir
  exit 0
fi

MLX_VERSION=0.32.4
MLX_LM_VERSION=0.32.2
PYTHON=${PYTHON:-python3}
VENV=.venv

case "$(uname -s)" in
  Linux) mlx_spec="mlx[cpu]==${MLX_VERSION}" ;;
  Darwin) mlx_spec="mlx==${MLX_VERSION}" ;;
  *) echo "bootstrap: unsupported OS $(uname -s)" >&2; exit 1 ;;
esac

have() {
  [ -x "$VENV/bin/python3" ] && "$VENV/bin/python3" - "$MLX_VERSION" "$MLX_LM_VERSION" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
assert version("mlx") == sys.argv[1], "mlx"
assert version("mlx-lm") == sys.argv[2], "mlx-lm"
import numpy  # noqa: F401
PY
}

if have; then
  exit 0
fi
echo "bootstrap: creating $VENV with ${mlx_spec}, mlx-lm==${MLX_LM_VERSION} (no deps), numpy"
[ -x "$VENV/bin/python3" ] || "$PYTHON" -m venv "$VENV"
"$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check "$mlx_spec" "numpy>=1.26,<3"
# mlx-lm's own dependencies (transformers, ...) are not needed: the oracle imports its model
# files directly.
"$VENV/bin/python3" -m pip install --quiet --disable-pip-version-check --no-deps "mlx-lm==${MLX_LM_VERSION}"
have || { echo "bootstrap: the environment is still incomplete" >&2; exit 1; }
echo "bootstrap: ready ($("$VENV/bin/python3" -m mlx --cmake-dir))"
