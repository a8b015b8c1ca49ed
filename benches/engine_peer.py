"""(c) of the engine-layer benchmark: mlx-lm 0.32.2's Qwen3.5 GatedDeltaNet module on MLX's CPU.

Run by scripts/bench/run.sh right after benches/engine.cpp, on the same case: one layer at
Qwen3.5-35B-A3B's dims (hidden 2048, Hk 16, Hv 32, Dk = Dv = 128, conv kernel 4), B = 1,
random weights cast like a converted bfloat16 checkpoint (A_log float32), eval mode, an
ArraysCache carrying the conv and recurrent states: a decode step (T = 1; samples of 8 steps)
and a 512-token prefill. Each step is one `mx.eval(y, cache)`; everything stays in MLX (no
bytes cross a boundary). Medians per step, as engine.cpp.

    .venv/bin/python3 benches/engine_peer.py OUTPUT.json      (MLXK_BENCH_QUICK=1: fewer rounds)
"""

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peer  # noqa: E402  (mlx-lm imported without its package __init__; host description)

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

import mlx_lm.models.qwen3_5 as qwen3_5  # noqa: E402  (peer made mlx_lm importable)
from mlx_lm.models.cache import ArraysCache  # noqa: E402

FIELDS = dict(hidden_size=2048, linear_num_key_heads=16, linear_num_value_heads=32,
              linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
              rms_norm_eps=1e-6)


def make_layer():
    mx.random.seed(20250601)
    layer = qwen3_5.GatedDeltaNet(qwen3_5.TextModelArgs(**FIELDS))
    layer.A_log = mx.log(mx.random.uniform(0.02, 1.0, (FIELDS["linear_num_value_heads"],)))
    layer.set_dtype(mx.bfloat16)
    layer.A_log = layer.A_log.astype(mx.float32)
    layer.eval()
    mx.eval(layer.parameters())
    return layer


def run_case(layer, tokens, rounds, steps_per_sample):
    x = mx.random.normal((1, tokens, FIELDS["hidden_size"]), key=mx.random.key(100 + tokens)).astype(mx.bfloat16)
    mx.eval(x)
    cache = ArraysCache(2)

    def step():
        y = layer(x, cache=cache)
        mx.eval(y, cache.cache)  # the step's one evaluation

    step()
    if tokens == 1:
        step()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(steps_per_sample):
            step()
        samples.append((time.perf_counter() - start) / steps_per_sample)
    s = np.sort(np.array(samples))
    median = float(np.quantile(s, 0.5))
    rec = dict(case="decode" if tokens == 1 else "prefill", T=tokens, impl="mlx_lm_module",
               note="mlx-lm 0.32.2 qwen3_5.GatedDeltaNet (Python), ArraysCache, one mx.eval per step",
               median_us=median * 1e6, p10_us=float(np.quantile(s, 0.1)) * 1e6,
               p90_us=float(np.quantile(s, 0.9)) * 1e6, min_us=float(s[0]) * 1e6, max_us=float(s[-1]) * 1e6,
               samples=len(samples), steps_per_sample=steps_per_sample, evals_per_step=1,
               bytes_copied_per_step=0, tokens_per_s=tokens / median)
    print(f"  {rec['case']:<8} T={tokens:<4} {'mlx_lm_module':<17} {median * 1e3:10.3f} ms/step  "
          f"[p10 {rec['p10_us'] / 1e3:9.3f}  p90 {rec['p90_us'] / 1e3:9.3f}  n {len(samples):2d} x{steps_per_sample}]"
          "  1 eval/step, 0 bytes copied/step")
    return rec


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: engine_peer.py OUTPUT.json")
    start = time.perf_counter()
    load_start = peer.loadavg()
    host = peer.host_info()
    print(f"mlx-lm {peer.mlx_lm_version()} GatedDeltaNet module on MLX {mx.__version__} CPU; "
          f"{peer.host_line(host)}; load {load_start}")
    layer = make_layer()
    records = [run_case(layer, 1, 3 if peer.QUICK else 12, 8),
               run_case(layer, 512, 1 if peer.QUICK else 3, 1)]
    total = time.perf_counter() - start
    out = dict(tool="mlxkern benches/engine_peer.py", mlx_version=mx.__version__,
               mlx_lm_version=peer.mlx_lm_version(), quick=peer.QUICK, host=host, loadavg_start=load_start,
               loadavg_end=peer.loadavg(), total_s=total, records=records)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    print(f"engine_peer.py: {total:.1f} s -> {sys.argv[1]}")


if __name__ == "__main__":
    main()
