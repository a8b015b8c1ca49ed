"""mlxkern's Metal chunked forward beside MLX's own gated-delta Metal kernels, on an Apple GPU.

`make bench` runs this on macOS (scripts/bench/run.sh, after the Python row, with the wheel it
builds on build/py-site); elsewhere it prints one line and exits 0. Qwen3.5-35B-A3B dims
(Hk 16, Hv 32, Dk = Dv = 128), B = 1, one layer, bfloat16 inputs, a float32 state in and out,
T = 512, 4096, 16384 (MLXK_BENCH_QUICK=1: 512 and 4096), each timed as a median of evaluated calls
after a warm-up:
  mlxkern chunked   mlxkern.gated_delta_update_chunked on the GPU (chunk sizes 32 and 64)
  mlxkern exact     mlxkern.gated_delta_update on the GPU (the recurrence, token by token)
  mlx fast          mx.fast.gated_delta_update (MLX 0.32.4's Metal kernels: its simdgroup 8x8
                    chunked kernel, or the NAX one on M5 GPUs, or its sequential kernel; MLX picks)
with the same g (mlxkern.compute_g, mlx-lm's formula) and beta = sigmoid(b) for MLX. Before timing,
each path's y is compared with mlxkern's exact y (largest |difference|, printed). Writes JSON lines
to argv[1] (if given) and prints a table; docs/performance.md says where its figures go.
"""
import json
import os
import platform
import statistics
import sys
import time


def main() -> int:
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else None
    if platform.system() != "Darwin":
        print("metal_chunked: needs an Apple GPU (Metal, macOS); skipped")
        return 0
    import mlx.core as mx

    import mlxkern

    if not mx.metal.is_available() or mlxkern.gpu_backend() != "metal":
        print("metal_chunked: MLX's Metal backend is not available here; skipped")
        return 0
    mlxkern.set_default_device("gpu")
    mx.set_default_device(mx.gpu)
    hk, hv, d = 16, 32, 128
    quick = os.environ.get("MLXK_BENCH_QUICK") == "1"
    lengths = (512, 4096) if quick else (512, 4096, 16384)
    info = mx.metal.device_info()
    print(f"metal_chunked: {info.get('device_name', 'Apple GPU')}, MLX {mx.__version__}, "
          f"mlxkern {mlxkern.version()}; B = 1, Hk {hk}, Hv {hv}, Dk = Dv = {d}, bf16")
    key = mx.random.key(7)
    for t in lengths:
        ks = mx.random.split(key, 8)
        unit = lambda a: a / mx.sqrt(mx.sum(a * a, axis=-1, keepdims=True))  # noqa: E731
        q = unit(mx.random.normal((1, t, hk, d), key=ks[0])).astype(mx.bfloat16)
        k = unit(mx.random.normal((1, t, hk, d), key=ks[1])).astype(mx.bfloat16)
        v = mx.random.normal((1, t, hv, d), key=ks[2]).astype(mx.bfloat16)
        a = mx.random.normal((1, t, hv), key=ks[3]).astype(mx.bfloat16)
        b = mx.random.normal((1, t, hv), key=ks[4]).astype(mx.bfloat16)
        a_log = mx.random.uniform(shape=(hv,), key=ks[5])
        dt_bias = mx.random.uniform(shape=(hv,), key=ks[6])
        state = mx.random.normal((1, hv, d, d), key=ks[7]) * 0.1
        g = mlxkern.compute_g(a_log, a, dt_bias)
        beta = mx.sigmoid(b.astype(mx.float32))
        mx.eval(q, k, v, a, b, a_log, dt_bias, state, g, beta)

        paths = {
            "mlxkern exact": lambda: mlxkern.gated_delta_update(q, k, v, a, b, a_log, dt_bias,
                                                                state),
            "mlxkern chunked C=32": lambda: mlxkern.gated_delta_update_chunked(
                q, k, v, a, b, a_log, dt_bias, state, chunk_size=32),
            "mlxkern chunked C=64": lambda: mlxkern.gated_delta_update_chunked(
                q, k, v, a, b, a_log, dt_bias, state, chunk_size=64),
            "mlx fast": lambda: mx.fast.gated_delta_update(
                q, k, v, g.astype(mx.bfloat16), beta.astype(mx.bfloat16), state),
        }
        reference = None
        for name, call in paths.items():
            try:
                y, s = call()
                mx.eval(y, s)
            except Exception as e:  # reported, the other paths still run
                print(f"  T={t:<6} {name:<22} skipped: {type(e).__name__}: {e}")
                continue
            if reference is None:
                reference = y.astype(mx.float32)
            diff = mx.max(mx.abs(y.astype(mx.float32) - reference)).item()
            times = []
            for i in range(8 if t >= 16384 else 12):
                start = time.perf_counter()
                y, s = call()
                mx.eval(y, s)
                if i >= 2:  # two warm-up calls
                    times.append(time.perf_counter() - start)
            ms = statistics.median(times) * 1e3
            print(f"  T={t:<6} {name:<22} {ms:9.3f} ms   max |y - exact y| {diff:.3e}")
            if out:
                out.write(json.dumps({"group": "metal chunked", "case": f"prefill T={t} B=1",
                                      "impl": name, "ms": round(ms, 4),
                                      "max_abs_diff_vs_exact": diff}) + "\n")
                out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
