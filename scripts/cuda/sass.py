#!/usr/bin/env python3
"""NVRTC's machine code for the library's CUDA kernel texts, without a GPU: instruction and
register counts per text, to compare kernel-text variants on any machine.

    MLXK_CUDA_TEXT_DIR=build/cuda/text cargo test --test cuda syntax::
    python3 scripts/cuda/sass.py build/cuda/text [--arch sm_90a] [--keep DIR] [PATTERN...]

The texts are the ones tests/cuda/syntax.rs puts together as `mx::fast::cuda_kernel` does. They
are compiled as MLX CUDA compiles them (`--device-as-default-execution-space`, the device's
`sm_XYa` architecture, NVRTC's default `--fmad=true`), with a stand-in for MLX's own device
header (`Shape` / `Strides`: what the kernels use of it). The counts are static (instructions in
the code, not executed), which for the per-element kernels (head split, gated norm) tracks the
work per element.

Needs, from PyPI (no GPU, no CUDA install): nvidia-cuda-nvrtc, nvidia-cuda-runtime,
nvidia-cuda-cccl, nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (the cu13 packages),
pip-installed or unpacked (then with their bin/ executable); their `nvidia/cu13` folder is found
in this Python's site-packages or given as NVIDIA_CU13=<dir>.
"""
import argparse
import ctypes
import os
import pathlib
import re
import subprocess
import sys
import tempfile

# What the kernels use of MLX's mlx/backend/cuda/device/utils.cuh (MAX_NDIM = 10).
MLX_STAND_IN = """#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda/std/array>
#include <cooperative_groups.h>
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, 10>;
using Strides = cuda::std::array<int64_t, 10>;
}
"""


def cu13_dir():
    if os.environ.get("NVIDIA_CU13"):
        return pathlib.Path(os.environ["NVIDIA_CU13"])
    import site
    for root in site.getsitepackages() + [site.getusersitepackages()]:
        d = pathlib.Path(root) / "nvidia" / "cu13"
        if (d / "lib").is_dir():
            return d
    sys.exit("sass.py: no nvidia/cu13 folder (pip install nvidia-cuda-nvrtc nvidia-cuda-runtime "
             "nvidia-cuda-cccl nvidia-cuda-cuobjdump, or set NVIDIA_CU13)")


def compile_cubin(nvrtc, text, name, args):
    prog = ctypes.c_void_p()
    check = lambda r, what: r == 0 or sys.exit(f"sass.py: {what} failed ({r}) on {name}")
    check(nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text.encode(), name.encode(), 0, None,
                                   None), "nvrtcCreateProgram")
    argv = (ctypes.c_char_p * len(args))(*[a.encode() for a in args])
    result = nvrtc.nvrtcCompileProgram(prog, len(args), argv)
    if result != 0:
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(prog, log)
        sys.exit(f"sass.py: {name} does not compile:\n{log.value.decode()}")
    size = ctypes.c_size_t()
    check(nvrtc.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
    cubin = ctypes.create_string_buffer(size.value)
    check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return cubin.raw


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("texts", help="folder of .cu texts (MLXK_CUDA_TEXT_DIR)")
    ap.add_argument("patterns", nargs="*", help="only texts whose name contains one of these")
    ap.add_argument("--arch", default="sm_90a", help="NVRTC architecture (MLX: sm_XYa on 9.x+)")
    ap.add_argument("--keep", help="also write each text's SASS listing into this folder")
    opts = ap.parse_args()
    cu13 = cu13_dir()
    nvrtc = ctypes.CDLL(str(cu13 / "lib" / "libnvrtc.so.13"))
    include = cu13 / "include"
    args = ["--device-as-default-execution-space", f"--gpu-architecture={opts.arch}",
            f"--include-path={include}", f"--include-path={include / 'cccl'}"]
    # cuobjdump runs nvdisasm from PATH.
    env = dict(os.environ, PATH=f"{cu13 / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    files = sorted(pathlib.Path(opts.texts).glob("*.cu"))
    if opts.patterns:
        files = [f for f in files if any(p in f.name for p in opts.patterns)]
    if not files:
        sys.exit(f"sass.py: no .cu texts in {opts.texts}")
    print(f"{'text':<52} {'instructions':>12} {'registers':>9}  (NVRTC, {opts.arch})")
    for path in files:
        text = MLX_STAND_IN + path.read_text()
        cubin = compile_cubin(nvrtc, text, path.stem + ".cu", args)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([str(cu13 / "bin" / "cuobjdump"), "-sass", f.name], env=env,
                                  capture_output=True, text=True, check=True).stdout
            res = subprocess.run([str(cu13 / "bin" / "cuobjdump"), "-res-usage", f.name],
                                 env=env, capture_output=True, text=True, check=True).stdout
        count = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+[^ ]", sass, re.M))
        regs = re.search(r"REG:(\d+)", res)
        print(f"{path.stem:<52} {count:>12} {regs.group(1) if regs else '?':>9}")
        if opts.keep:
            pathlib.Path(opts.keep).mkdir(parents=True, exist_ok=True)
            (pathlib.Path(opts.keep) / (path.stem + ".sass")).write_text(sass)


if __name__ == "__main__":
    main()
