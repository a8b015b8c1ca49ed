"""The gradient benchmark's native CPU peer: bitsandbytes-cpu-fork 0.50.2.dev9's Gated DeltaNet
kernels (`gdn_fwd_cpu`, `gdn_bwd_cpu` from its `libbitsandbytes_cpu*.so`: AVX2 or AVX-512 +
OpenMP over batch x heads, a token-sequential recurrence with float32 state checkpoints every C
tokens and an analytic backward that recomputes each chunk), called through ctypes on the
inputs of benches/grad.cpp (B = 1, Hk 16, Hv 32, Dk = Dv = 128, bfloat16, no initial state; the
prefill case's seeds, dy and dstate_out from their own tags).

    .venv/bin/python3 benches/grad_bnb.py LIBDIR OUTPUT.json T

LIBDIR holds the extracted wheel (scripts/bench/bnb-peer.sh): bitsandbytes/libbitsandbytes_cpu*.so and
the libgomp it loads by $ORIGIN. The library is picked as the package picks it: the AVX-512 one
where /proc/cpuinfo has avx512f, bw, dq, vl and avx512_bf16, else the AVX2 one.

The map onto its arguments (it has no GQA and no gates of its own): q and k repeated to Hv heads
(value head h reads key head h / (Hv/Hk), as mlxkern's); beta = mx.sigmoid(b) and the log decay
log g = -exp(A_log) * softplus(a + dt_bias) (mlx-lm's compute_g before its exp), both float32
[B, H, T]; its state is [B, H, K, V], mlxkern's transposed, so dstate_out goes in transposed.
Its layout 1 ([B, T, H, D]) reads q, k, v and writes y, dq, dk, dv in place. The checkpoint
interval C is 32, its fastest here: the package's own default (bitsandbytes/gdn_cpu.py
`_chunk_len`, the largest C <= 512 whose recompute buffers fit a quarter of free memory) gives
C = 512, whose backward was 4.8x slower at T = 512 on an AMD EPYC (Zen 4, 2 threads; forward +
backward 1109 ms at C = 512, 289 at 64, 277 at 128, 260 at 16, 231 at 32). GDN_CPU_CHUNK pins
another C.
Threads: OpenMP's, OMP_NUM_THREADS (scripts/bench/run.sh sets it to mlxkern's thread count).

Timed (benches/peer.py's measure): the forward alone (with checkpoints, as for training) and the
forward + backward (one call each). The setup above (repeat, gates, transposes) is outside the
timing; so is the chain from its dbeta and d(log g) to db, da, dA_log, ddt_bias (numpy, float64,
after the timing), which mlxkern's backward computes inside its call. Checks: sum |gradient| of
dq and dk (summed back over each key head's value heads), dv, da, db, dA_log, ddt_bias and
dstate (transposed back), the figures benches/grad.cpp reports for mlxkern.
"""

import ctypes
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import grad_peer  # noqa: E402  (inputs; imports peer, which sets MLX's CPU device)
import peer  # noqa: E402

import mlx.core as mx  # noqa: E402

HK, HV, DK, DV = peer.HK, peer.HV, peer.DK, peer.DV
AVX512_FLAGS = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}
NOTE = ("bitsandbytes-cpu-fork 0.50.2.dev9 gdn_fwd_cpu / gdn_bwd_cpu (ctypes; {lib}; C = {c}; "
        "q, k repeated to Hv; OpenMP threads {threads})")


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def load(libdir):
    name = "libbitsandbytes_cpu_avx512.so" if AVX512_FLAGS <= cpu_flags() else "libbitsandbytes_cpu.so"
    lib = ctypes.CDLL(os.path.join(libdir, "bitsandbytes", name))
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    lib.gdn_fwd_cpu.restype = i32
    lib.gdn_fwd_cpu.argtypes = [ptr] * 9 + [i32] * 8
    lib.gdn_bwd_cpu.restype = i32
    lib.gdn_bwd_cpu.argtypes = [ptr] * 14 + [i32] * 8
    return lib, name


def chunk_len(tokens):
    """The checkpoint interval (see the module docstring), capped at T."""
    pinned = os.environ.get("GDN_CPU_CHUNK")
    c = int(pinned) if pinned and pinned.isdigit() and int(pinned) > 0 else 32
    return min(c, max(tokens, 1))


def bf16_bits(x):
    """An mx bfloat16 array's bits as a contiguous uint16 numpy array."""
    return np.ascontiguousarray(np.array(x.view(mx.uint16)))


def bf16_to_f64(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def p(a):
    return ctypes.c_void_p(a.ctypes.data) if a is not None else None


def main():
    if len(sys.argv) != 4:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    libdir, out_path, tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lib, lib_name = load(libdir)
    threads = int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    c = chunk_len(tokens)
    nc = (tokens + c - 1) // c
    t = grad_peer.make_inputs(tokens)
    group = HV // HK

    # Arguments in its layouts (outside the timing).
    q = np.ascontiguousarray(np.repeat(bf16_bits(t.q), group, axis=2))  # [1, T, Hv, Dk]
    k = np.ascontiguousarray(np.repeat(bf16_bits(t.k), group, axis=2))
    v = bf16_bits(t.v)
    dy = bf16_bits(t.dy)
    a = np.array(t.a.astype(mx.float32), dtype=np.float64)  # [1, T, Hv]
    b = np.array(t.b.astype(mx.float32), dtype=np.float64)
    a_log = np.array(peer.A_LOG, dtype=np.float64)
    dt_bias = np.array(peer.DT_BIAS.astype(mx.float32), dtype=np.float64)
    x = a + dt_bias
    softplus = np.logaddexp(0.0, x)
    log_g = -np.exp(a_log) * softplus
    beta = 1.0 / (1.0 + np.exp(-b))
    beta_t = np.ascontiguousarray(beta.transpose(0, 2, 1), dtype=np.float32)  # [1, Hv, T]
    g_t = np.ascontiguousarray(log_g.transpose(0, 2, 1), dtype=np.float32)
    dstate_out = np.array(t.dstate_out, dtype=np.float32)  # [1, Hv, Dv, Dk]
    dsf = np.ascontiguousarray(dstate_out.transpose(0, 1, 3, 2))  # [1, Hv, Dk, Dv]

    o = np.empty((1, tokens, HV, DV), np.uint16)
    sf = np.empty((1, HV, DK, DV), np.float32)
    ck = np.empty((1, HV, nc, DK, DV), np.float32)
    dq = np.empty((1, tokens, HV, DK), np.uint16)
    dk = np.empty((1, tokens, HV, DK), np.uint16)
    dv = np.empty((1, tokens, HV, DV), np.uint16)
    dbeta = np.empty((1, HV, tokens), np.float32)
    dg = np.empty((1, HV, tokens), np.float32)
    dsi = np.empty((1, HV, DK, DV), np.float32)
    dims = (1, HV, tokens, DK, DV, 1, c, 1)  # B, H, T, K, V, dtype bf16, C, layout [B,T,H,D]

    def forward():
        rc = lib.gdn_fwd_cpu(p(q), p(k), p(v), p(beta_t), p(g_t), None, p(o), p(sf), p(ck), *dims)
        if rc != 0:
            raise RuntimeError(f"gdn_fwd_cpu returned {rc}")

    def backward():
        rc = lib.gdn_bwd_cpu(p(q), p(k), p(v), p(beta_t), p(g_t), p(dy), p(dsf), p(ck), p(dq), p(dk),
                             p(dv), p(dbeta), p(dg), p(dsi), *dims)
        if rc != 0:
            raise RuntimeError(f"gdn_bwd_cpu returned {rc}")

    def forward_backward():
        forward()
        backward()

    load_start = open("/proc/loadavg").read().split()[:3]
    note = NOTE.format(lib=lib_name, c=c, threads=threads)
    for phase, body in (("fwd", forward), ("fwd_bwd", forward_backward)):
        st = peer.measure(body, 1)
        peer.add_record(f"grad_{phase}_T{tokens}", f"grad_{phase}", "bnb_cpu", "call", 1, tokens, tokens, st,
                        note + ("; forward only, checkpoints kept" if phase == "fwd" else "; forward + backward"),
                        phase=phase, checkpoint=c)
    load_end = open("/proc/loadavg").read().split()[:3]

    # The gradients in mlxkern's terms, after the timing (float64).
    forward_backward()
    dq64 = bf16_to_f64(dq).reshape(1, tokens, HK, group, DK).sum(axis=3)
    dk64 = bf16_to_f64(dk).reshape(1, tokens, HK, group, DK).sum(axis=3)
    dlog_g = dg.astype(np.float64).transpose(0, 2, 1)  # [1, T, Hv]
    dbeta64 = dbeta.astype(np.float64).transpose(0, 2, 1)
    sig = 1.0 / (1.0 + np.exp(-x))
    da = dlog_g * (-np.exp(a_log) * sig)
    checks = {
        "dq_abs_sum": float(np.abs(dq64).sum()),
        "dk_abs_sum": float(np.abs(dk64).sum()),
        "dv_abs_sum": float(np.abs(bf16_to_f64(dv)).sum()),
        "da_abs_sum": float(np.abs(da).sum()),
        "db_abs_sum": float(np.abs(dbeta64 * beta * (1.0 - beta)).sum()),
        "da_log_abs_sum": float(np.abs((dlog_g * log_g).sum(axis=(0, 1))).sum()),
        "ddt_bias_abs_sum": float(np.abs(da.sum(axis=(0, 1))).sum()),
        "dstate_abs_sum": float(np.abs(dsi.astype(np.float64)).sum()),
    }
    for rec in peer.RECORDS:
        if rec["op"] == "grad_fwd_bwd":
            rec["checks"] = checks
    with open(out_path, "w") as f:
        json.dump(dict(tool="mlxkern benches/grad_bnb.py", records=peer.RECORDS, checks=checks,
                       library=lib_name, checkpoint=c, omp_threads=threads,
                       loadavg_start=[float(v) for v in load_start], loadavg_end=[float(v) for v in load_end]), f)
    print(f"  bitsandbytes-cpu-fork ({lib_name}, C = {c}, {threads} threads): checks "
          + ", ".join(f"{k[:-8]} {v:.6g}" for k, v in checks.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
