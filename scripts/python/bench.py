"""mlx-lm prefill and generation speed with and without mlxkern.mlx_lm.patch().

mlx-lm's own qwen3_5.Model from a random configuration (Qwen3.5's linear-attention heads:
Hk 16, Hv 32, Dk = Dv = 128; 3 linear-attention layers and 1 full-attention layer, hidden 2048)
in bfloat16, as mlx-lm's generate_step drives it: the prompt in one call, then one token per
call, argmax, each step evaluated. Prefill tokens/s = prompt tokens / prefill time, generation
tokens/s = generated tokens / their time (median of MLXK_BENCH_REPEATS runs after a warm-up).
Runs on MLX's default device: on a machine with MLX CUDA or Metal, the GPU (the patch then runs
mlxkern's GPU kernels); here, the CPU.

    PYTHONPATH=build/py-site .venv/bin/python3 scripts/python/bench.py [out.json]

On Linux, mlx[cpu]'s matrix products use the reference BLAS it ships (libblas 3.10), so the
model's projections take most of the time there and the whole-model rows change little; the
last rows time one layer's update alone, mlx-lm's against the patched one.

MLXK_BENCH_QUICK=1: a 128-token prompt, 16 generated tokens, 1 repeat.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time

import mlx.core as mx

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "python", "tests"))
import support  # noqa: E402,F401  (mlx_lm importable without its loading dependencies)

import mlxkern  # noqa: E402
import mlxkern.mlx_lm as mkl  # noqa: E402
from mlx_lm.models import qwen3_5  # noqa: E402

QUICK = os.environ.get("MLXK_BENCH_QUICK") == "1"
PROMPT = int(os.environ.get("MLXK_BENCH_PROMPT", 128 if QUICK else 512))
GEN = int(os.environ.get("MLXK_BENCH_GEN", 16 if QUICK else 64))
REPEATS = int(os.environ.get("MLXK_BENCH_REPEATS", 1 if QUICK else 3))

DTYPE = getattr(mx, os.environ.get("MLXK_BENCH_DTYPE", "bfloat16" if mx.default_device() == mx.gpu
                                   else "float32"))
TEXT = dict(model_type="qwen3_5_text", hidden_size=1024, intermediate_size=2048,
            num_hidden_layers=4, num_attention_heads=16, num_key_value_heads=2, head_dim=128,
            rms_norm_eps=1e-6, vocab_size=4096, linear_num_value_heads=32,
            linear_num_key_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
            linear_conv_kernel_dim=4, full_attention_interval=4, tie_word_embeddings=False,
            max_position_embeddings=8192)


def build():
    from mlx.utils import tree_flatten, tree_unflatten

    mx.random.seed(0)
    model = qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=dict(TEXT)))
    keep = model.cast_predicate
    model.update(tree_unflatten([(n, p.astype(DTYPE) if keep(n) else p)
                                 for n, p in tree_flatten(model.parameters())]))
    model.eval()
    mx.eval(model.parameters())
    return model


def run(model, prompt):
    cache = model.make_cache()
    t0 = time.perf_counter()
    logits = model(prompt[None], cache=cache)
    tok = mx.argmax(logits[:, -1], axis=-1)
    mx.eval(tok, [c.state for c in cache])
    t1 = time.perf_counter()
    for _ in range(GEN):
        logits = model(tok[:, None], cache=cache)
        tok = mx.argmax(logits[:, -1], axis=-1)
        mx.eval(tok)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1


def measure(model, prompt):
    run(model, prompt[:16])  # warm-up (compiles mlx-lm's compiled steps for these shapes)
    run(model, prompt)
    pre, gen = zip(*(run(model, prompt) for _ in range(REPEATS)))
    return PROMPT / statistics.median(pre), GEN / statistics.median(gen)


def update_alone(T):
    """One layer's update alone, as a linear-attention layer calls it (mlx-lm's function and the
    patched one on the same inputs): seconds per call, median of 3 after a warm-up."""
    from mlx_lm.models import gated_delta

    Hk, Hv = TEXT["linear_num_key_heads"], TEXT["linear_num_value_heads"]
    Dk, Dv = TEXT["linear_key_head_dim"], TEXT["linear_value_head_dim"]
    q, k = (mx.random.normal((1, T, Hk, Dk)).astype(DTYPE) * Dk**-0.5 for _ in range(2))
    v = mx.random.normal((1, T, Hv, Dv)).astype(DTYPE)
    a, b = (mx.random.normal((1, T, Hv)).astype(DTYPE) for _ in range(2))
    A_log, dt_bias = mx.random.uniform(-1, 1, (Hv,)), mx.random.normal((Hv,)).astype(DTYPE)
    state = mx.zeros((1, Hv, Dv, Dk))
    mx.eval(q, k, v, a, b, A_log, dt_bias, state)
    out = []
    for fn in (gated_delta.gated_delta_update, mkl.gated_delta_update):
        def call():
            mx.eval(*fn(q, k, v, a, b, A_log, dt_bias, state))
        call()
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            call()
            times.append(time.perf_counter() - t0)
        out.append(statistics.median(times))
    return out


def machine():
    info = {"device": str(mx.default_device()), "gpu_backend": mxkern_backend(),
            "mlx": mx.__version__, "mlxkern": mlxkern.__version__, "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
        info["load_average"] = os.getloadavg()
    except (OSError, StopIteration):
        info["cpu"] = platform.processor()
    return info


def mxkern_backend():
    return mlxkern.gpu_backend()


def main():
    model = build()
    prompt = mx.random.randint(0, TEXT["vocab_size"], (PROMPT,))
    mkl.unpatch()
    base = measure(model, prompt)
    mkl.patch()
    fast = measure(model, prompt)
    mkl.unpatch()
    alone = {T: update_alone(T) for T in (1, PROMPT)}
    info = machine()
    rows = {"mlx-lm": base, "mlx-lm + mlxkern.mlx_lm.patch()": fast}
    print(f"mlx-lm {TEXT['num_hidden_layers']}-layer Qwen3.5 (3 linear-attention + 1 attention, "
          f"Hk 16, Hv 32, Dk = Dv = 128, hidden 1024), {DTYPE}, on {info['device']} "
          f"({info.get('cpu', '')}; load {info.get('load_average', '?')})")
    print(f"{'':34s} {'prefill ' + str(PROMPT) + ' tok/s':>20s} {'generate tok/s':>16s}")
    for name, (p, g) in rows.items():
        print(f"{name:34s} {p:20.1f} {g:16.1f}")
    print(f"{'speed-up':34s} {fast[0] / base[0]:19.2f}x {fast[1] / base[1]:15.2f}x")
    print("one layer's gated_delta_update alone (ms per call):")
    for T, (ref, ours) in alone.items():
        form = "exact" if T < mkl._settings["chunked_min_tokens"] else "chunked"
        print(f"  T {T:5d}: mlx-lm {ref * 1e3:9.2f}   mlxkern ({form}) {ours * 1e3:9.2f}   "
              f"{ref / ours:6.1f}x")
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump({"machine": info, "dtype": str(DTYPE), "prompt": PROMPT, "generated": GEN, "repeats": REPEATS,
                       "rows": {k: {"prefill_tok_s": v[0], "generate_tok_s": v[1]}
                                for k, v in rows.items()},
                       "update_alone_ms": {str(T): {"mlx-lm": r * 1e3, "mlxkern": o * 1e3}
                                           for T, (r, o) in alone.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
