#!/usr/bin/env bash
# The training example, run by `make train-example`: a LoRA adapter on in_proj_qkv of one Qwen3.5
# Gated DeltaNet layer (examples/cpp/qwen35_gdn.hpp, MLX ops + mlxkern kernels), trained from
# C++ with mx::value_and_grad through the gated norm, the recurrence and the head split
# (examples/cpp/qwen35_train.cpp), next to the same model trained in mlx-lm 0.32.2 on the same
# weights, data, adapter initialization and optimizer (tests/cpp/test_qwen35_train.py, which
# also compares the two loss curves and states the tolerance).
#
# Writes build/bench/train_loss.png (both curves and their relative difference, next to the
# bench chart) and build/bench/train_loss.csv / .json (both curves, configuration, timings).
# `make test` runs a short version (scripts/test/cpp.sh).
#
# Expects the library built (`cargo build --lib`; the Makefile target does it) and .venv made
# by scripts/bootstrap.sh. matplotlib (for the plot only) is installed into .venv on first use,
# as for the bench chart. Environment: CXX; LIBDIR (folder of libmlxkern.so / .dylib, default
# target/debug); MLXK_TRAIN_STEPS (default 300); MLXK_TRAIN_SEED (replay a run's data).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CXX=${CXX:-c++}
LIBDIR=${LIBDIR:-$ROOT/target/debug}
BUILD=${BUILD:-$ROOT/build}
OUT=$BUILD/bench
PY=$ROOT/.venv/bin/python3
STEPS=${MLXK_TRAIN_STEPS:-300}

case "$(uname -s)" in
  Darwin) LIB=$LIBDIR/libmlxkern.dylib ;;
  *) LIB=$LIBDIR/libmlxkern.so ;;
esac
[ -f "$LIB" ] || {
  echo "train-example: $LIB not found: build the library first (cargo build --lib)" >&2
  exit 1
}
[ -x "$PY" ] || { echo "train-example: $PY not found: run scripts/bootstrap.sh" >&2; exit 1; }

if ! "$PY" -c "import matplotlib" 2>/dev/null; then
  echo "train-example: installing matplotlib into .venv (used only to draw the plot)"
  "$PY" -m pip install --quiet --disable-pip-version-check "matplotlib>=3.8,<4"
fi

mkdir -p "$OUT"
MLX=$("$PY" -m mlx --cmake-dir)
"$CXX" -O2 -std=c++20 -Wall -Wextra -Werror -pedantic -I"$ROOT/include" -isystem "$MLX/include" \
  "$ROOT/examples/cpp/qwen35_train.cpp" -L"$LIBDIR" -lmlxkern -Wl,-rpath,"$LIBDIR" \
  -L"$MLX/lib" -lmlx -Wl,-rpath,"$MLX/lib" -o "$OUT/qwen35_train"

"$PY" "$ROOT/tests/cpp/test_qwen35_train.py" --binary "$OUT/qwen35_train" --steps "$STEPS" \
  --curves "$OUT/train_loss" --plot "$OUT/train_loss.png"
