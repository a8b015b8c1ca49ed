"""fla's chunked Gated DeltaNet kernel (fla-core 0.6 `chunk_gated_delta_rule`, Triton over
PyTorch) differentiated, on the gradient shapes of `make bench-cuda` (its forward alone is the
prefill peer in benches/peer_fla.py): B = 1, Qwen3.5-35B-A3B dims
(Hk 16, Hv 32, Dk = Dv = 128), bfloat16 q, k, v and beta, float32 log-space gates, no initial
state, the final state returned; one layer.

    python3 benches/peer_fla_chunk.py OUT.jsonl

Rows (JSON lines appended to OUT.jsonl, group "grad", impl "fla chunk"):
  fwd+bwd T = 512, 4096           forward, then torch.autograd.backward of sum(dy * y) +
                                  sum(dstate * state) to q, k, v, g, beta; where fla refuses
                                  its backward on this GPU and Triton (fla #640: Hopper with
                                  Triton < 3.7.1), the row records the refusal instead of a time
fla takes a state [B, H, K, V] and log gates; the work per token is the same as mlxkern's. Value
heads read key heads by the same rule (h / (Hv / Hk)) where fla takes grouped value heads;
elsewhere q and k are made with Hv heads (the repeat, outside the timing).
"""
import json
import sys

import torch

try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
except Exception as e:  # pragma: no cover - reported, not fatal
    print(f"peer_fla_chunk: fla is not importable ({e}); skipped")
    sys.exit(0)

HK, HV, D = 16, 32, 128
out = open(sys.argv[1], "a") if len(sys.argv) > 1 and sys.argv[1] else None


def timed(step, warmup=3, iters=15):
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
    return times[len(times) // 2], times[0]


def emit(group, case, tokens, median_us=None, min_us=None, note=""):
    rec = {"group": group, "case": case, "impl": "fla chunk", "T": tokens}
    if median_us is not None:
        rec.update(median_us=round(median_us, 2), min_us=round(min_us, 2),
                   tokens_per_s=round(tokens / median_us * 1e6, 1))
    if note:
        rec["note"] = note
    print(f"{group:<8} {case:<28} fla chunk  " + (f"{median_us / 1e3:9.3f} ms (min {min_us / 1e3:.3f})"
                                                   if median_us is not None else "not run")
          + (f"  {note}" if note else ""))
    if out:
        out.write(json.dumps(rec) + "\n")
        out.flush()


GROUPED = None  # whether fla takes Hv > Hk itself (found by a first small call)


def key_heads():
    global GROUPED
    if GROUPED is None:
        GROUPED = True
        q, k, v, g, beta = inputs(64, False)
        try:
            chunk_gated_delta_rule(q, k, v, g, beta, scale=1.0, output_final_state=True)
        except Exception as e:
            print(f"peer_fla_chunk: grouped value heads refused ({type(e).__name__}); q and k made with Hv heads")
            GROUPED = False
    return HK if GROUPED else HV


def inputs(tokens, grad):
    """q and k with Hk heads where fla groups value heads, else Hv (the repeat, outside the timing)."""
    dev = torch.device("cuda")
    bf = torch.bfloat16
    hk = HK if GROUPED is not False else HV
    q = torch.nn.functional.normalize(torch.randn(1, tokens, hk, D, device=dev), dim=-1).to(bf)
    k = torch.nn.functional.normalize(torch.randn(1, tokens, hk, D, device=dev), dim=-1).to(bf)
    v = torch.randn(1, tokens, HV, D, device=dev, dtype=bf)
    g = -torch.nn.functional.softplus(torch.randn(1, tokens, HV, device=dev))
    beta = torch.sigmoid(torch.randn(1, tokens, HV, device=dev)).to(bf)
    return [x.requires_grad_(grad) for x in (q, k, v, g, beta)]


def call(q, k, v, g, beta):
    return chunk_gated_delta_rule(q, k, v, g, beta, scale=1.0, output_final_state=True)


def fwd_bwd(tokens):
    key_heads()
    xs = inputs(tokens, True)
    dy = torch.randn(1, tokens, HV, D, device="cuda", dtype=torch.bfloat16)
    ds = torch.randn(1, HV, D, D, device="cuda") * 0.05

    def step():
        for x in xs:
            x.grad = None
        y, s = call(*xs)
        torch.autograd.backward([y, s], [dy, ds])

    try:
        step()
        torch.cuda.synchronize()
    except Exception as e:
        emit("grad", f"fwd+bwd T={tokens}", tokens, note=f"refused: {type(e).__name__}: {str(e)[:300]}")
        return
    med, lo = timed(step)
    emit("grad", f"fwd+bwd T={tokens}", tokens, med, lo)


if __name__ == "__main__":
    import triton

    print(f"fla chunk peer: torch {torch.__version__}, triton {triton.__version__},"
          f" {torch.cuda.get_device_name()}")
    for t in (512, 4096):
        fwd_bwd(t)
