#!/usr/bin/env bash
# Installs what mlx-lm's trainer (mlx_lm.tuner.trainer) imports and .venv lacks (mlx-lm is
# installed there without its dependencies) into build/py-deps, pinned: rich (its terminal UI),
# transformers and huggingface_hub (its datasets, tokenizer wrapper and loading helpers, imported
# at module level). python/tests/support.py appends the folder to sys.path, after .venv's own
# packages, so .venv's numpy and MLX stay the ones imported. Needs the package index the first
# time; a stamp holding the pins skips the install while they are unchanged.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
DEPS=build/py-deps
PINS=("rich==15.0.0" "transformers==5.25.0" "huggingface_hub==2.5.0")
STAMP=$DEPS/.pins
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "${PINS[*]}" ]; then
  exit 0
fi
echo "python: installing mlx-lm's trainer dependencies into $DEPS (${PINS[*]})" >&2
rm -rf "$DEPS"
NUMPY=$(.venv/bin/python3 -c 'import numpy; print(numpy.__version__)')
# numpy pinned to .venv's: the copy pip puts beside transformers is never the one imported.
# pip then lists mlx-lm's other requirements (jinja2, protobuf, sentencepiece) as not installed:
# the trainer does not import them, and the status stays 0.
.venv/bin/python3 -m pip install --quiet --disable-pip-version-check --target "$DEPS" \
  "${PINS[@]}" "numpy==$NUMPY"
rm -rf "$DEPS/numpy" "$DEPS/numpy.libs" "$DEPS"/numpy-*.dist-info
echo "${PINS[*]}" >"$STAMP"
