"""fla's fused recurrent Gated DeltaNet kernel (fla-core, Triton over PyTorch) on the same
shapes as the decode rows of `make bench-cuda` (benches/bench_cuda_layers.cc): B = 1, 8, 32,
256, T = 1, Qwen3.5-35B-A3B dims, 30 layers with their own states per timed step; plus
PyTorch's own elementwise op over the same states (the floor outside MLX). Writes JSON lines to
argv[1] and prints a table.

fla keeps its state as [B, H, K, V] and takes log-space gates; the work per token is the same.
"""
import json
import sys

import torch

try:
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
except Exception as e:  # pragma: no cover - reported, not fatal
    print(f"peer_fla: fla is not importable ({e}); skipped")
    sys.exit(0)

LAYERS, HK, HV, D = 30, 16, 32, 128
# Each batch size appends its rows (a child process per size, see the end).
out = open(sys.argv[1], "a") if len(sys.argv) > 1 and sys.argv[1] else None


def timed(step, warmup=10, iters=50):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def row(name, impl, us, bytes_, floor=0.0):
    per = us / LAYERS
    gbs = bytes_ / per / 1e3
    extra = f"  {us / floor:5.2f}x floor" if floor else ""
    print(f"decode   {name:<34} {impl:<20} {per:10.2f} us/layer  {gbs:8.1f} GB/s{extra}")
    if out:
        out.write(json.dumps({"group": "decode", "case": name, "impl": impl,
                              "us_per_layer": round(per, 3), "bytes_per_layer": bytes_,
                              "gbs": round(gbs, 2),
                              "vs_floor": round(us / floor, 4) if floor else 0.0}) + "\n")
        out.flush()


def decode(batch):
    dev = torch.device("cuda")
    bf = torch.bfloat16
    layers = []
    for _ in range(LAYERS):
        q = torch.nn.functional.normalize(torch.randn(batch, 1, HK, D, device=dev), dim=-1).to(bf)
        k = torch.nn.functional.normalize(torch.randn(batch, 1, HK, D, device=dev), dim=-1).to(bf)
        v = torch.randn(batch, 1, HV, D, device=dev, dtype=bf)
        g = -torch.nn.functional.softplus(torch.randn(batch, 1, HV, device=dev))
        beta = torch.sigmoid(torch.randn(batch, 1, HV, device=dev)).to(bf)
        state = torch.randn(batch, HV, D, D, device=dev) * 0.1
        layers.append((q, k, v, g, beta, state))
    gva = True
    try:
        q, k, v, g, beta, state = layers[0]
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=state,
                                         output_final_state=True)
    except Exception as e:
        print(f"peer_fla: grouped value heads refused ({type(e).__name__}); key heads repeated")
        gva = False
    if not gva:
        layers = [(q.repeat_interleave(HV // HK, 2), k.repeat_interleave(HV // HK, 2), v, g, beta,
                   s) for (q, k, v, g, beta, s) in layers]

    def ours():
        for q, k, v, g, beta, state in layers:
            fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5,
                                             initial_state=state, output_final_state=True)

    def floor():
        for *_, state in layers:
            torch.neg(state)

    def graphed(fn):
        # The same calls captured once in a CUDA graph and replayed: kernel time without
        # Python's launch cost (MLX has no such replay; the eager rows are the comparable ones).
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay

    name = f"decode B={batch} (30 layers)"
    state_bytes = batch * HV * D * D * 4 * 2
    act = batch * (2 * HK * D + 2 * HV * D + 2 * HV) * 2
    f = timed(floor)
    row(name, "torch floor", f, state_bytes)
    row(name, "fla", timed(ours), state_bytes + act, f)
    try:
        fg = timed(graphed(floor))
        row(name, "torch floor (graph)", fg, state_bytes)
        row(name, "fla (graph)", timed(graphed(ours)), state_bytes + act, fg)
    except Exception as e:
        print(f"peer_fla: CUDA graph capture failed ({type(e).__name__}: {e})")


if len(sys.argv) > 2:  # one batch size, in its own process (a CUDA fault ends only that one)
    decode(int(sys.argv[2]))
else:
    import subprocess

    print(f"fla peer: torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if out:
        out.close()
    for b in (1, 8, 32, 256):
        subprocess.run([sys.executable, __file__, sys.argv[1] if len(sys.argv) > 1 else "",
                        str(b)], check=False)
