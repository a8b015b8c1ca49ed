#!/usr/bin/env bash
# Installs the built wheel (build/wheel/ from scripts/python/dev-build.sh, or MLXK_PY_WHEEL) as
# a user would: a new virtual environment outside the repository ($TMPDIR), mlx[cpu]==0.32.4
# from the package index, then the wheel; runs python/tests/smoke.py there from outside the
# checkout (no repository path on sys.path). Then the refusal: the same environment with another
# MLX version must fail at import with the message naming both versions (MLXK_PY_OTHER_MLX,
# default 0.31.1; skipped with MLXK_PY_OTHER_MLX=none).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WHEEL=${MLXK_PY_WHEEL:-$(ls "$ROOT"/build/wheel/mlxkern-*.whl | head -1)}
PY=${PYTHON:-$(command -v python3)}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/mlxkern-venv.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "fresh venv: $WORK (python $("$PY" --version 2>&1 | cut -d' ' -f2))"
"$PY" -m venv "$WORK/venv"
PIP=("$WORK/venv/bin/pip" install --quiet --disable-pip-version-check)
"${PIP[@]}" "mlx[cpu]==0.32.4" numpy
"${PIP[@]}" "$WHEEL"
cp "$ROOT/python/tests/smoke.py" "$WORK/smoke.py"
(cd "$WORK" && env -u PYTHONPATH "$WORK/venv/bin/python" smoke.py)

OTHER=${MLXK_PY_OTHER_MLX:-0.31.1}
if [ "$OTHER" != none ]; then
  "${PIP[@]}" "mlx[cpu]==$OTHER"
  if out=$(cd "$WORK" && env -u PYTHONPATH "$WORK/venv/bin/python" -c 'import mlxkern' 2>&1); then
    echo "FAIL: mlxkern imported with mlx $OTHER"; exit 1
  fi
  echo "$out" | tail -1
  echo "$out" | grep -q "built against mlx 0.32.4, but mlx $OTHER is loaded" ||
    { echo "FAIL: the import error does not name both versions"; exit 1; }
  echo "fresh venv: mlx $OTHER refused at import, as expected"
fi
