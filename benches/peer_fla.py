"""fla's fused recurrent Gated DeltaNet kernel (fla-core, Triton over PyTorch) on the same
shapes as the decode rows of `make bench-cuda` (benches/bench_cuda_layers.cc): B = 1, 8, 32,
256, T = 1, Qwen3.5-35B-A3B dims, 30 layers with their own states per timed step; plus
PyTorch's own elementwise op over the same states (the floor outside MLX); and fla's chunked
forward on the prefill rows' shapes (T = 512, 4096, 16384) and its varlen form on the packed16k
rows' (8 prompts of mixed lengths, 16384 tokens). Writes JSON lines to argv[1] and
prints a table.

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


def prefill():
    """fla's chunked forward (chunk_gated_delta_rule) over T = 512, 4096, 16384, B = 1, one
    layer, from a given state with the final state out: the peer of the prefill rows."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except Exception as e:  # pragma: no cover - reported, not fatal
        print(f"peer_fla: chunk_gated_delta_rule is not importable ({e}); skipped")
        return
    dev = torch.device("cuda")
    bf = torch.bfloat16
    for t in (512, 4096, 16384):
        q = torch.nn.functional.normalize(torch.randn(1, t, HK, D, device=dev), dim=-1).to(bf)
        k = torch.nn.functional.normalize(torch.randn(1, t, HK, D, device=dev), dim=-1).to(bf)
        v = torch.randn(1, t, HV, D, device=dev, dtype=bf)
        g = -torch.nn.functional.softplus(torch.randn(1, t, HV, device=dev))
        beta = torch.sigmoid(torch.randn(1, t, HV, device=dev)).to(bf)
        state = torch.randn(1, HV, D, D, device=dev) * 0.1
        try:
            chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True)
        except Exception as e:
            print(f"peer_fla: grouped value heads refused ({type(e).__name__}); key heads repeated")
            q, k = q.repeat_interleave(HV // HK, 2), k.repeat_interleave(HV // HK, 2)

        def ours():
            chunk_gated_delta_rule(q, k, v, g, beta, scale=D ** -0.5, initial_state=state,
                                   output_final_state=True)

        us = timed(ours, warmup=3, iters=10)
        name = f"prefill T={t} B=1 (1 layer)"
        bytes_ = HV * D * D * 4 * 2 + t * (2 * HK * D + 2 * HV * D + 2 * HV) * 2
        print(f"prefill  {name:<34} {'fla chunk':<20} {us:10.2f} us  {bytes_ / us / 1e3:8.1f} GB/s")
        if out:
            out.write(json.dumps({"group": "prefill", "case": name, "impl": "fla chunk",
                                  "us_per_layer": round(us, 3), "bytes_per_layer": bytes_,
                                  "gbs": round(bytes_ / us / 1e3, 2), "vs_floor": 0.0}) + "\n")
            out.flush()
    varlen(chunk_gated_delta_rule)


# benches/pool_cases.h's kMixedLengths: the packed16k rows' 8 prompts, 16384 tokens.
MIXED_LENGTHS = (512, 1024, 1536, 2048, 2560, 3072, 2048, 3584)


def varlen(chunk_gated_delta_rule):
    """fla's varlen chunked forward (cu_seqlens, B = 1 packed) over MIXED_LENGTHS, each prompt from
    its own state with the final states out, beside one sequence of the same total length: the
    peer of bench_cuda's packed16k rows."""
    dev = torch.device("cuda")
    bf = torch.bfloat16
    t = sum(MIXED_LENGTHS)
    n = len(MIXED_LENGTHS)
    cu = torch.tensor([0] + [sum(MIXED_LENGTHS[:i + 1]) for i in range(n)], device=dev,
                      dtype=torch.int32)
    q = torch.nn.functional.normalize(torch.randn(1, t, HK, D, device=dev), dim=-1).to(bf)
    k = torch.nn.functional.normalize(torch.randn(1, t, HK, D, device=dev), dim=-1).to(bf)
    v = torch.randn(1, t, HV, D, device=dev, dtype=bf)
    g = -torch.nn.functional.softplus(torch.randn(1, t, HV, device=dev))
    beta = torch.sigmoid(torch.randn(1, t, HV, device=dev)).to(bf)
    states = torch.randn(n, HV, D, D, device=dev) * 0.1
    try:
        chunk_gated_delta_rule(q, k, v, g, beta, initial_state=states, output_final_state=True,
                               cu_seqlens=cu)
    except Exception as e:
        if "cu_seqlens" in str(e) or isinstance(e, TypeError):
            print(f"peer_fla: varlen refused ({type(e).__name__}: {e}); skipped")
            return
        q, k = q.repeat_interleave(HV // HK, 2), k.repeat_interleave(HV // HK, 2)
    name = f"{n} prompts, {t} tokens (1 layer)"
    for impl, fn in (
        ("fla chunk varlen", lambda: chunk_gated_delta_rule(
            q, k, v, g, beta, scale=D ** -0.5, initial_state=states, output_final_state=True,
            cu_seqlens=cu)),
        ("fla chunk one sequence", lambda: chunk_gated_delta_rule(
            q, k, v, g, beta, scale=D ** -0.5, initial_state=states[:1], output_final_state=True)),
    ):
        us = timed(fn, warmup=3, iters=10)
        print(f"packed16k {name:<33} {impl:<22} {us:10.2f} us")
        if out:
            out.write(json.dumps({"group": "packed16k", "case": name, "impl": impl,
                                  "us_per_layer": round(us, 3), "vs_floor": 0.0}) + "\n")
            out.flush()


if len(sys.argv) > 2 and sys.argv[2] == "prefill":  # in its own process, as each batch size
    prefill()
elif len(sys.argv) > 2:  # one batch size, in its own process (a CUDA fault ends only that one)
    decode(int(sys.argv[2]))
else:
    import subprocess

    print(f"fla peer: torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if out:
        out.close()
    for b in ("1", "8", "32", "256", "prefill"):
        subprocess.run([sys.executable, __file__, sys.argv[1] if len(sys.argv) > 1 else "", b],
                       check=False)
