"""The peer side of the mlxkern benchmark: MLX's own CPU path on the same cases and inputs.

Run by scripts/bench/run.sh in the same run as benches/bench.c, one case group at a time, each
right after bench.c's run of the same group, so both sides of each ratio are measured close
together:

    .venv/bin/python3 benches/peer.py OUTPUT.json [GROUP...]

(groups: decode1 decode4 decode16 prefill replay small; default: all)

Implementations (MLX 0.32.4 CPU, mlx-lm 0.32.2):
  mlx_fast    recurrence: mlx-lm's compute_g and sigmoid, then mx.fast.gated_delta_update
              (MLX core's op; on the CPU its fallback)
  mlx_lm_ops  recurrence: mlx-lm's gated_delta_update, which on the CPU runs gated_delta_ops
              (a compiled per-token step in a Python loop)
  mlx_ops     head split: nn.silu, mx.split, reshape, mlx-lm's normalize_qk (the model code);
              gated norm: mx.fast.rms_norm with the weight, then mlx-lm's precise_swiglu

Inputs come from the same counter-based generator as benches/inputs.h (same seeds), so both
sides see the same bfloat16 values. Timing mirrors bench.c: warm-up, then timed samples
(mx.eval of every output an engine needs), median / min / max / p10 / p90; cases whose one
call takes seconds here (30 chained steps at B >= 4, prefill T >= 512, the padded batch) warm
up with a short call of the same compiled shapes instead of a full one.

Very slow cases: prefill at T = 4096 runs for about 10 s per call on each MLX path; unless
MLXK_BENCH_PEER_FULL=1 it is not run, and its record carries the T = 512 measurement scaled
to T = 4096 (both paths are sequential over tokens, so their rate is flat in T; compare the
T = 64 and T = 512 records), marked "extrapolated_from_T": 512.

Environment: MLXK_BENCH_QUICK=1 (short run), MLXK_BENCH_PEER_FULL=1 (measure T = 4096).
"""

import importlib.util
import json
import math
import os
import sys
import time
import types

import numpy as np


def import_mlx_lm_modules():
    """mlx_lm.models.gated_delta and .activations without running mlx_lm/__init__.py (which
    imports transformers, not installed): a bare package module over the installed folder."""
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")  # locates the package; does not execute it
        if spec is None or not spec.submodule_search_locations:
            sys.exit("peer.py: mlx-lm is not installed in this Python")
        package = types.ModuleType("mlx_lm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_lm"] = package
    import mlx_lm.models.activations as activations
    import mlx_lm.models.gated_delta as gated_delta

    return gated_delta, activations


import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

gd, activations = import_mlx_lm_modules()
mx.set_default_device(mx.cpu)  # mlx-lm's gated_delta_update then takes its ops path

HK, HV, DK, DV = 16, 32, 128, 128
CONV_DIM = 2 * HK * DK + HV * DV
LAYERS = 30
STATE_ELEMS = HV * DV * DK
NORM_EPS = 1e-6
QK_EPS = 1e-6  # mlx-lm's normalize_qk eps (its rms eps is eps / Dk)

# ---------------------------------------------------------------------------------------------
# Inputs: the generator of benches/inputs.h

GOLDEN = 0x9E3779B97F4A7C15
MASK64 = (1 << 64) - 1
TAG_Q, TAG_K, TAG_V, TAG_A, TAG_B, TAG_A_LOG, TAG_DT_BIAS, TAG_STATE = 1, 2, 3, 4, 5, 6, 7, 8
TAG_CONV_OUT, TAG_NORM_X, TAG_NORM_GATE, TAG_NORM_WEIGHT = 9, 10, 11, 12
KIND_DECODE, KIND_PREFILL, KIND_PADDED, KIND_REPLAY = 1, 2, 3, 4
KIND_HEAD_SPLIT, KIND_GATED_NORM, KIND_SHARED = 5, 6, 7


def case_seed(kind, batch, tokens, index):
    return (kind * 1000000000 + batch * 1000000 + tokens * 100 + index) & MASK64


def tensor_seed(tag, cs):
    return ((tag << 48) ^ cs) & MASK64


def uniform(seed, n):
    i = np.arange(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (i + np.uint64(1)) * np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def normal(seed, n):
    u = uniform(seed, 2 * n)
    u1 = np.maximum(u[0::2], 1e-300)
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(6.283185307179586 * u[1::2])


def bf16(values, shape):
    return mx.array(values.astype(np.float32).reshape(shape)).astype(mx.bfloat16)


def unit_rows(seed, rows, width, norm):
    x = normal(seed, rows * width).reshape(rows, width)
    inv = norm / np.sqrt((x * x).sum(axis=1, keepdims=True) + 1e-12)
    return x * inv


class RecIn:
    def __init__(self, batch, tokens, cs):
        self.batch, self.tokens = batch, tokens
        nqk, nv, nab = batch * tokens * HK, batch * tokens * HV * DV, batch * tokens * HV
        self.q = bf16(unit_rows(tensor_seed(TAG_Q, cs), nqk, DK, 1.0 / math.sqrt(DK)), (batch, tokens, HK, DK))
        self.k = bf16(unit_rows(tensor_seed(TAG_K, cs), nqk, DK, 1.0), (batch, tokens, HK, DK))
        self.v = bf16(normal(tensor_seed(TAG_V, cs), nv), (batch, tokens, HV, DV))
        self.a = bf16(normal(tensor_seed(TAG_A, cs), nab), (batch, tokens, HV))
        self.b = bf16(normal(tensor_seed(TAG_B, cs), nab), (batch, tokens, HV))
        mx.eval(self.q, self.k, self.v, self.a, self.b)


_shared_cs = case_seed(KIND_SHARED, 0, 0, 0)
A_LOG = mx.array(np.log(1.0 + 15.0 * uniform(tensor_seed(TAG_A_LOG, _shared_cs), HV)).astype(np.float32))
DT_BIAS = bf16(normal(tensor_seed(TAG_DT_BIAS, _shared_cs), HV) * 0.5, (HV,))
STATE_PATTERN = (normal(tensor_seed(TAG_STATE, _shared_cs), STATE_ELEMS) * 0.05).astype(np.float32)
mx.eval(A_LOG, DT_BIAS)


def make_state(batch):
    s = mx.array(np.tile(STATE_PATTERN, batch).reshape(batch, HV, DV, DK))
    mx.eval(s)
    return s


def left_padded_mask(batch, tokens, lengths):
    t = np.arange(tokens)[None, :]
    return mx.array(t >= (tokens - np.array(lengths))[:, None])


def prefix_mask(batch, tokens, lengths):
    t = np.arange(tokens)[None, :]
    return mx.array(t < np.array(lengths)[:, None])


# ---------------------------------------------------------------------------------------------
# The two MLX recurrence paths: (y, state) from raw a, b (g and beta computed in the graph)


def rec_mlx_fast(q, k, v, a, b, state, mask):
    g = gd.compute_g(A_LOG, a, DT_BIAS)
    beta = mx.sigmoid(b)
    y, s = mx.fast.gated_delta_update(q, k, v, g, beta, state, mask)
    return y, s


def rec_mlx_lm_ops(q, k, v, a, b, state, mask):
    return gd.gated_delta_update(q, k, v, a, b, A_LOG, DT_BIAS, state, mask)


RECURRENCES = {"mlx_fast": rec_mlx_fast, "mlx_lm_ops": rec_mlx_lm_ops}

NOTES = {
    "mlx_fast": "mx.fast.gated_delta_update (MLX 0.32.4 CPU), g and beta from mlx-lm's compute_g / sigmoid",
    "mlx_lm_ops": "mlx-lm 0.32.2 gated_delta_update on the CPU (gated_delta_ops)",
    "mlx_ops": "MLX ops as in mlx-lm's model code",
}

# ---------------------------------------------------------------------------------------------
# Timing (mirrors bench.c's measure())

QUICK = os.environ.get("MLXK_BENCH_QUICK", "") not in ("", "0")
PEER_FULL = os.environ.get("MLXK_BENCH_PEER_FULL", "") not in ("", "0")
if QUICK:
    CFG = dict(budget_s=0.25, max_case_s=0.8, min_reps=2, max_reps=30)
else:
    CFG = dict(budget_s=0.8, max_case_s=2.5, min_reps=3, max_reps=200)


def quantile(v, q):
    if len(v) == 1:
        return v[0]
    pos = q * (len(v) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return v[lo] * (1 - (pos - lo)) + v[hi] * (pos - lo)


def measure(body, units, warm=None):
    """Warm-up, then timed samples of `body` (each `units` units); statistics per unit.

    `warm`, for bodies that take seconds: a small version of the body (same compiled shapes)
    run as the warm-up instead of a full-size run; the first timed sample then plans the rest."""
    samples = []
    if warm is not None:
        warm()
        t0 = time.perf_counter()
        body()
        t_one = time.perf_counter() - t0
        samples.append(t_one / units)
    else:
        t0 = time.perf_counter()
        body()
        t_one = time.perf_counter() - t0
    if warm is None and t_one < 0.05:
        extra = 5 if t_one < 0.005 else 2
        t0 = time.perf_counter()
        for _ in range(extra):
            body()
        t_one = (time.perf_counter() - t0) / extra
    inner = 1 if t_one >= 5e-4 else int(math.ceil(5e-4 / max(t_one, 1e-8)))
    t_sample = t_one * inner
    reps = min(max(int(CFG["budget_s"] / t_sample), CFG["min_reps"]), CFG["max_reps"])
    if reps * t_sample > CFG["max_case_s"]:
        reps = max(1, int(CFG["max_case_s"] / t_sample))
    for _ in range(reps - len(samples)):
        s0 = time.perf_counter()
        for _ in range(inner):
            body()
        samples.append((time.perf_counter() - s0) / (inner * units))
    samples.sort()
    return dict(n=reps, inner=inner, median=quantile(samples, 0.5), min=samples[0], max=samples[-1],
                p10=quantile(samples, 0.1), p90=quantile(samples, 0.9))


RECORDS = []


def add_record(rid, op, impl, unit, batch, tokens_t, tokens, st, note, **extra):
    rec = dict(id=rid, op=op, impl=impl, unit=unit, B=batch, T=tokens_t, tokens_per_unit=tokens,
               bytes_per_unit=0, n=st["n"], inner=st["inner"],
               median_us=st["median"] * 1e6, min_us=st["min"] * 1e6, max_us=st["max"] * 1e6,
               p10_us=st["p10"] * 1e6, p90_us=st["p90"] * 1e6,
               tokens_per_s=tokens / st["median"] if tokens else 0.0, note=note)
    rec.update(extra)
    RECORDS.append(rec)
    print(f"  {rid:<34} {impl:<10} {st['median'] * 1e6:11.1f} us/{unit:<10} "
          f"[p10 {st['p10'] * 1e6:9.1f}  p90 {st['p90'] * 1e6:9.1f}  n {st['n']:3d} x{st['inner']}]"
          + (f"  {rec['tokens_per_s']:10.0f} tok/s" if tokens else ""), flush=True)
    return rec


# ---------------------------------------------------------------------------------------------
# Cases


def bench_decode(batch):
    print(f"decode B={batch}")
    tok = [RecIn(batch, 1, case_seed(KIND_DECODE, batch, 1, l)) for l in range(LAYERS)]
    for impl, rec in RECURRENCES.items():
        box = {"state": make_state(batch), "next": 0}

        def hot_chained():
            s = box.pop("state")
            ys = []
            for t in tok:
                y, s = rec(t.q, t.k, t.v, t.a, t.b, s, None)
                ys.append(y)
            mx.eval(*ys, s)
            box["state"] = s

        def hot_per_call():
            t = tok[box["next"]]
            box["next"] = (box["next"] + 1) % LAYERS
            y, s = rec(t.q, t.k, t.v, t.a, t.b, box.pop("state"), None)
            mx.eval(y, s)
            box["state"] = s

        def one_step():
            t = tok[0]
            y, s = rec(t.q, t.k, t.v, t.a, t.b, make_state(batch), None)
            mx.eval(y, s)

        big = batch >= 4  # 30 steps of MLX's CPU path take seconds: warm up with one step
        add_record(f"decode_hot_chained_B{batch}", "decode_hot_chained", impl, "layer-step", batch, 1, batch,
                   measure(hot_chained, LAYERS, warm=one_step if big else None),
                   NOTES[impl] + "; 30 chained steps, one mx.eval")
        add_record(f"decode_hot_per_call_B{batch}", "decode_hot_per_call", impl, "layer-step", batch, 1, batch,
                   measure(hot_per_call, 1), NOTES[impl] + "; one mx.eval per step")
        del box["state"]
        box["next"] = 0

        states = [make_state(batch) for _ in range(LAYERS)]

        def cold_chained():
            ys = []
            for l, t in enumerate(tok):
                v = t.v if l == 0 else ys[-1]
                y, states[l] = rec(t.q, t.k, v, t.a, t.b, states[l], None)
                ys.append(y)
            mx.eval(*ys, *states)

        def cold_per_call():
            l = box["next"]
            box["next"] = (box["next"] + 1) % LAYERS
            t = tok[l]
            y, states[l] = rec(t.q, t.k, t.v, t.a, t.b, states[l], None)
            mx.eval(y, states[l])

        add_record(f"decode_cold_chained_B{batch}", "decode_cold_chained", impl, "layer-step", batch, 1, batch,
                   measure(cold_chained, LAYERS, warm=one_step if big else None),
                   NOTES[impl] + "; 30 layer states, layer l+1's v = layer l's y, one mx.eval")
        add_record(f"decode_cold_per_call_B{batch}", "decode_cold_per_call", impl, "layer-step", batch, 1, batch,
                   measure(cold_per_call, 1),
                   NOTES[impl] + "; 30 layer states, one mx.eval per layer (calls walk the layers)")
        del states


def bench_prefill(checks):
    print("prefill")
    for impl, rec in RECURRENCES.items():
        measured = {}
        for tokens in (64, 512, 4096):
            if tokens == 4096 and not PEER_FULL:
                st = {key: (val * 4096 / 512 if key not in ("n", "inner") else val)
                      for key, val in measured[512].items()}
                add_record("prefill_T4096_B1", "prefill", impl, "call", 1, 4096, 4096, st,
                           NOTES[impl] + "; NOT RUN at T=4096 (~10 s per call): the T=512 "
                           "measurement scaled by 8 (rate flat in T)", extrapolated_from_T=512)
                continue
            t = RecIn(1, tokens, case_seed(KIND_PREFILL, 1, tokens, 0))

            def call():
                y, s = rec(t.q, t.k, t.v, t.a, t.b, None, None)
                mx.eval(y, s)

            def short_call():  # the first 64 tokens: same compiled step, a fraction of the time
                y, s = rec(t.q[:, :64], t.k[:, :64], t.v[:, :64], t.a[:, :64], t.b[:, :64], None, None)
                mx.eval(y, s)

            if tokens == 64:
                y, s = rec(t.q, t.k, t.v, t.a, t.b, None, None)
                checks[impl] = dict(
                    y_abs_sum=float(np.abs(np.array(y.astype(mx.float32), dtype=np.float64)).sum()),
                    state_abs_sum=float(np.abs(np.array(s, dtype=np.float64)).sum()))
            measured[tokens] = measure(call, 1, warm=short_call if tokens > 64 else None)
            add_record(f"prefill_T{tokens}_B1", "prefill", impl, "call", 1, tokens, tokens, measured[tokens],
                       NOTES[impl] + "; no initial state, one call, one mx.eval")

    batch, tokens, lengths = 4, 128, [128, 96, 64, 32]
    t = RecIn(batch, tokens, case_seed(KIND_PADDED, batch, tokens, 0))
    mask = left_padded_mask(batch, tokens, lengths)
    for impl, rec in RECURRENCES.items():
        def call():
            y, s = rec(t.q, t.k, t.v, t.a, t.b, None, mask)
            mx.eval(y, s)

        def short_call():  # the last 16 tokens (every row real there): same compiled masked step
            y, s = rec(t.q[:, -16:], t.k[:, -16:], t.v[:, -16:], t.a[:, -16:], t.b[:, -16:], None, mask[:, -16:])
            mx.eval(y, s)

        add_record("prefill_padded_T128_B4", "prefill_padded", impl, "call", batch, tokens, sum(lengths),
                   measure(call, 1, warm=short_call), NOTES[impl] + "; B=4, T=128, left-padded lengths 128/96/64/32, mask")


def bench_replay():
    print("replay")
    for batch, lengths in ((1, [5]), (4, [1, 3, 5, 8])):
        tokens = 8
        t = RecIn(batch, tokens, case_seed(KIND_REPLAY, batch, tokens, 0))
        state = make_state(batch)
        mask = prefix_mask(batch, tokens, lengths)
        for impl, rec in RECURRENCES.items():
            def call():
                _, s = rec(t.q, t.k, t.v, t.a, t.b, state, mask)
                mx.eval(s)  # only the state is wanted (y stays unevaluated)

            add_record(f"replay_T8_B{batch}", "replay", impl, "call", batch, tokens, sum(lengths),
                       measure(call, 1),
                       NOTES[impl] + "; prefix replay as a masked call (mask = t < accepted), state only")


def bench_head_split(rows):
    x = bf16(normal(tensor_seed(TAG_CONV_OUT, case_seed(KIND_HEAD_SPLIT, 1, rows, 0)), rows * CONV_DIM),
             (1, rows, CONV_DIM))
    mx.eval(x)
    key_dim = HK * DK

    def call():
        conv_out = nn.silu(x)
        q, k, v = [
            part.reshape(1, rows, h, d)
            for part, h, d in zip(mx.split(conv_out, [key_dim, 2 * key_dim], -1), [HK, HK, HV], [DK, DK, DV])
        ]
        q, k = gd.normalize_qk(q, k, inv_scale=DK ** -0.5, eps=QK_EPS)
        mx.eval(q, k, v)

    add_record(f"head_split_S{rows}", "head_split", "mlx_ops", "call", 1, rows, rows, measure(call, 1),
               NOTES["mlx_ops"] + ": nn.silu, mx.split, reshape, normalize_qk")


def bench_gated_norm(rows):
    cs = case_seed(KIND_GATED_NORM, 1, rows, 0)
    n = rows * HV * DV
    x = bf16(normal(tensor_seed(TAG_NORM_X, cs), n) * 0.2, (1, rows, HV, DV))
    gate = bf16(normal(tensor_seed(TAG_NORM_GATE, cs), n), (1, rows, HV, DV))
    weight = bf16(1.0 + 0.1 * normal(tensor_seed(TAG_NORM_WEIGHT, cs), DV), (DV,))
    mx.eval(x, gate, weight)

    def call():
        normed = mx.fast.rms_norm(x, weight, NORM_EPS)
        out = activations.precise_swiglu(x, gate, normed)
        mx.eval(out)

    add_record(f"gated_norm_S{rows}", "gated_norm", "mlx_ops", "call", 1, rows, rows, measure(call, 1),
               NOTES["mlx_ops"] + ": mx.fast.rms_norm(x, w, eps), precise_swiglu (silu(gate.f32) * x.f32 -> bf16)")


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return [float(x) for x in f.read().split()[:3]]
    except OSError:
        return None


def host_info():
    """The machine, as bench.c describes it (benches/harness.h): CPU model, architecture, CPUs
    online and whether the CPU has AVX2, FMA and AVX-512F (None where no x86 flags are listed)."""
    import platform

    model, flags = None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if model is None and key in ("model name", "Model Name"):
                    model = value.strip()
                elif flags is None and key == "flags":
                    flags = set(value.split())
                if model is not None and flags is not None:
                    break
    except OSError:
        pass
    if model is None and sys.platform == "darwin":
        import subprocess

        try:
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   check=True).stdout.strip() or None
        except (OSError, subprocess.CalledProcessError):
            model = None
    simd = {name: (name in flags if flags is not None else None) for name in ("avx2", "fma", "avx512f")}
    try:
        online = os.sysconf("SC_NPROCESSORS_ONLN")
    except (ValueError, OSError):
        online = os.cpu_count()
    return dict(cpu_model=model or "unknown", arch=platform.machine() or "unknown", cpus_online=online, simd=simd)


def host_line(host):
    def word(v):
        return "unknown" if v is None else "yes" if v else "no"

    simd = host["simd"]
    return (f"{host['cpu_model']} ({host['arch']}), {host['cpus_online']} CPUs online; AVX2 {word(simd['avx2'])},"
            f" FMA {word(simd['fma'])}, AVX-512F {word(simd['avx512f'])}")


GROUPS = ("decode1", "decode4", "decode16", "prefill", "replay", "small")


def main():
    if len(sys.argv) < 2 or any(g not in GROUPS for g in sys.argv[2:]):
        sys.exit("usage: peer.py OUTPUT.json [GROUP...]   groups: " + " ".join(GROUPS)
                 + " (default: all); MLXK_BENCH_QUICK=1, MLXK_BENCH_PEER_FULL=1")
    groups = [g for g in GROUPS if g in sys.argv[2:]] or list(GROUPS)
    start = time.perf_counter()
    load_start = loadavg()
    host = host_info()
    print(f"MLX {mx.__version__} CPU peer ({'quick' if QUICK else 'full'}): same cases and inputs as bench.c")
    print(f"host: {host_line(host)}; load average {load_start}")
    checks = {}
    for batch in (1, 4, 16):
        if f"decode{batch}" in groups:
            bench_decode(batch)
    if "prefill" in groups:
        bench_prefill(checks)
    if "replay" in groups:
        bench_replay()
    if "small" in groups:
        print("head split, gated norm")
        for rows in (1, 512):
            bench_head_split(rows)
        for rows in (1, 512):
            bench_gated_norm(rows)
    total = time.perf_counter() - start
    out = dict(tool="mlxkern benches/peer.py", mlx_version=mx.__version__, mlx_lm_version=mlx_lm_version(),
               device=str(mx.default_device()), quick=QUICK, peer_full=PEER_FULL, timing=CFG, groups=groups,
               cpus_online=host["cpus_online"], host=host,
               loadavg_start=load_start, loadavg_end=loadavg(),
               checks={"prefill_T64_B1": checks} if checks else {}, total_s=total, records=RECORDS)
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    print(f"peer.py: {len(RECORDS)} records in {total:.1f} s -> {sys.argv[1]}")


def mlx_lm_version():
    try:
        from importlib.metadata import version

        return version("mlx-lm")
    except Exception:  # noqa: BLE001
        return None


if __name__ == "__main__":
    main()
