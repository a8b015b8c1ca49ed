# Device side, sourced from the repository root by the scripts that run the carry
# (scripts/cuda/device.sh, scripts/cuda/probe.sh, scripts/cuda/ncu.sh): stages MLX CUDA from
# build/cuda/carry's payload (scripts/cuda/stage.sh) and puts the carried libraries on the
# loader's path. Sets `carry`.
carry=$PWD/build/cuda/carry
# shellcheck disable=SC1091
source scripts/cuda/stage.sh "$carry/payload.tar.xz"
export LD_LIBRARY_PATH=$carry:$MLX_DIR/lib:${LD_LIBRARY_PATH:-}
