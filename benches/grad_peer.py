"""The gradient benchmark, MLX's side: one layer's forward and forward + backward on MLX's CPU
paths, at the dims and on the inputs of benches/grad.cpp (B = 1, Hk 16, Hv 32, Dk = Dv = 128,
bfloat16, no initial state; the prefill case's seeds, dy and dstate_out from their own tags).

    .venv/bin/python3 benches/grad_peer.py OUTPUT.json T [EARLIER.json...]

Implementations (MLX 0.32.4 CPU, mlx-lm 0.32.2), both differentiated by mx.value_and_grad of
sum(dy * y) + sum(dstate_out * state) with respect to q, k, v, a, b, A_log and dt_bias (the
vector-Jacobian product mlxk_gated_delta_update_vjp computes for those cotangents):
  mlx_lm_ops  mlx-lm's gated_delta_update, which on the CPU runs gated_delta_ops (a compiled
              per-token step in a Python loop), g and beta from its compute_g and mx.sigmoid
  mlx_fast    mx.fast.gated_delta_update with the same g and beta; on the CPU, MLX
              differentiates its fallback

Each measurement (implementation, phase fwd or fwd_bwd, T) runs in a fresh process
(`grad_peer.py --child ...`), so that its peak memory is that computation's: the process's
peak resident set above its resident set just before the first call (VmHWM reset there through
/proc/self/clear_refs) and MLX's mx.get_peak_memory() above mx.get_active_memory() there.

Both paths keep every token's intermediate states for the backward (~8 MiB a token here) and
slow down faster than linearly in T, so before running one at T this script estimates its peak
memory and time from what it has measured at smaller T (EARLIER.json: this script's outputs
for smaller T in the same run; where fewer than two are known, short probes at T = 64 and 128
first): memory by a least-squares fit of c0 + c1 T + c2 T^2 (a line through two points), time
by a power law through the two largest T. It runs the measurement only if the estimated peak
(+15%) stays under the memory budget, min(MemAvailable - 4 GiB, 60% of MemTotal) unless
MLXK_BENCH_GRAD_PEER_MEM_GIB sets it (the machine is shared: the headroom is the rest's), and
the estimated time of one forward + backward call under MLXK_BENCH_GRAD_PEER_MAX_S seconds
(default 300); otherwise it prints why and records the skip with the estimates.

Environment: MLXK_BENCH_QUICK=1 (short timing budget), MLXK_BENCH_GRAD_PEER_MAX_S,
MLXK_BENCH_GRAD_PEER_MEM_GIB.
"""

import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peer  # noqa: E402  (inputs, timing, host description; sets MLX's CPU device)

import mlx.core as mx  # noqa: E402

gd = peer.gd
HK, HV, DK, DV = peer.HK, peer.HV, peer.DK, peer.DV
TAG_DY, TAG_DSTATE_OUT = 13, 14  # benches/inputs.h
IMPLS = ("mlx_lm_ops", "mlx_fast")
NOTES = {
    "mlx_lm_ops": "mlx-lm 0.32.2 gated_delta_update on the CPU (gated_delta_ops), compute_g, sigmoid",
    "mlx_fast": "mx.fast.gated_delta_update (MLX 0.32.4 CPU), mlx-lm's compute_g, sigmoid",
}
PROBE_T = (64, 128)
HEADROOM = 4 << 30  # left for the rest of the machine
MEM_SAFETY = 1.15
MAX_CALL_S = float(os.environ.get("MLXK_BENCH_GRAD_PEER_MAX_S") or 300)
MEM_BUDGET_GIB = os.environ.get("MLXK_BENCH_GRAD_PEER_MEM_GIB")
GIB = float(1 << 30)

# ---------------------------------------------------------------------------------------------
# Child: one measurement in this process.


def status_bytes(key):
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name == key:
                return int(value.split()[0]) * 1024
    return 0


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def make_inputs(tokens):
    cs = peer.case_seed(peer.KIND_PREFILL, 1, tokens, 0)
    t = peer.RecIn(1, tokens, cs)
    t.dy = peer.bf16(peer.normal(peer.tensor_seed(TAG_DY, cs), tokens * HV * DV), (1, tokens, HV, DV))
    ds = peer.normal(peer.tensor_seed(TAG_DSTATE_OUT, cs), HV * DV * DK) * 0.05
    t.dstate_out = mx.array(ds.astype(np.float32).reshape(1, HV, DV, DK))
    mx.eval(t.dy, t.dstate_out)
    return t


def recurrence(impl):
    """(q, k, v, a, b, A_log, dt_bias) -> (y, state), g and beta computed inside."""
    if impl == "mlx_lm_ops":
        return lambda q, k, v, a, b, a_log, dt_bias: gd.gated_delta_update(q, k, v, a, b, a_log, dt_bias)

    def fast(q, k, v, a, b, a_log, dt_bias):
        g = gd.compute_g(a_log, a, dt_bias)
        y, s = mx.fast.gated_delta_update(q, k, v, g, mx.sigmoid(b), None, None)
        return y, s

    return fast


def child(impl, phase, tokens, out_path):
    t = make_inputs(tokens)
    rec = recurrence(impl)
    args = [t.q, t.k, t.v, t.a, t.b, peer.A_LOG, peer.DT_BIAS]

    def loss(q, k, v, a, b, a_log, dt_bias, dy, dstate_out):
        y, s = rec(q, k, v, a, b, a_log, dt_bias)
        return (y.astype(mx.float32) * dy.astype(mx.float32)).sum() + (s * dstate_out).sum()

    value_and_grad = mx.value_and_grad(loss, argnums=tuple(range(7)))

    def run(n):  # the first n tokens (n < T: the warm-up, same compiled per-token step)
        part = [x[:, :n] for x in args[:5]] + args[5:]
        if phase == "fwd":
            mx.eval(*rec(*part))
            return None
        value, grads = value_and_grad(*part, t.dy[:, :n], t.dstate_out)
        mx.eval(value, *grads)
        return grads

    hwm_reset = reset_peak_rss()
    rss0, active0 = status_bytes("VmRSS"), mx.get_active_memory()
    mx.reset_peak_memory()
    st = peer.measure(lambda: run(tokens), 1, warm=(lambda: run(64)) if tokens > 64 else None)
    rss_peak, mlx_peak = status_bytes("VmHWM"), mx.get_peak_memory()
    checks = {}
    if phase == "fwd_bwd":
        names = ("dq", "dk", "dv", "da", "db", "da_log", "ddt_bias")
        grads = run(tokens)
        checks = {f"{n}_abs_sum": float(np.abs(np.array(g.astype(mx.float32), dtype=np.float64)).sum())
                  for n, g in zip(names, grads)}
    memory = dict(phase=phase, rss_baseline_bytes=rss0, rss_peak_bytes=rss_peak,
                  rss_extra_bytes=max(rss_peak - rss0, 0), rss_hwm_reset=hwm_reset,
                  mlx_active_baseline_bytes=active0, mlx_peak_bytes=mlx_peak,
                  mlx_extra_bytes=max(mlx_peak - active0, 0))
    note = NOTES[impl] + ("; forward only" if phase == "fwd" else
                          "; mx.value_and_grad of sum(dy y) + sum(dstate_out state) w.r.t. q, k, v, a, b,"
                          " A_log, dt_bias") + "; one process"
    peer.add_record(f"grad_{phase}_T{tokens}", f"grad_{phase}", impl, "call", 1, tokens, tokens, st, note,
                    **memory)
    print(f"  peak extra memory: process RSS {memory['rss_extra_bytes'] / GIB:.3f} GiB, MLX allocator"
          f" {memory['mlx_extra_bytes'] / GIB:.3f} GiB", flush=True)
    with open(out_path, "w") as f:
        json.dump(dict(records=peer.RECORDS, checks=checks), f)


# ---------------------------------------------------------------------------------------------
# Parent: estimate, then measure or skip.


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, value = line.partition(":")
            out[key] = int(value.split()[0]) * 1024
    return out


def run_child(impl, phase, tokens, scratch):
    path = f"{scratch}.{impl}.{phase}.T{tokens}.json"
    print(f"{impl} {phase} T={tokens}:", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", impl, phase, str(tokens), path]
    done = subprocess.run(cmd)
    if done.returncode != 0:
        print(f"grad_peer.py: {impl} {phase} T={tokens} FAILED (exit status {done.returncode})", flush=True)
        return None
    with open(path) as f:
        part = json.load(f)
    os.remove(path)
    rec = part["records"][0]
    rec["checks"] = part["checks"]
    return rec


def fit_memory(points, tokens):
    """Estimated peak extra bytes at `tokens` from (T, bytes) points: least squares on
    c0 + c1 T + c2 T^2 (three or more points; a line through two)."""
    ts = np.array([p[0] for p in points], dtype=np.float64)
    ms = np.array([p[1] for p in points], dtype=np.float64)
    degree = 2 if len(points) >= 3 else 1
    coef = np.polyfit(ts, ms, degree)
    return float(max(np.polyval(coef, tokens), ms.max()))


def fit_time(points, tokens):
    """Estimated seconds at `tokens`: a power law through the two largest T (exponent >= 1)."""
    (t1, s1), (t2, s2) = sorted(points)[-2:]
    exponent = max(1.0, np.log(s2 / s1) / np.log(t2 / t1))
    return float(s2 * (tokens / t2) ** exponent), float(exponent)


def known_points(earlier, impl):
    """(T, rss extra bytes, median s) of every forward + backward of `impl` measured so far."""
    points = {}
    for part in earlier:
        for rec in part.get("records", []) + part.get("probes", []):
            if rec["impl"] == impl and rec["op"] == "grad_fwd_bwd":
                points[rec["T"]] = (rec["T"], rec["rss_extra_bytes"], rec["median_us"] * 1e-6)
    return points


def parent(out_path, tokens, earlier_paths):
    earlier = []
    for path in earlier_paths:
        with open(path) as f:
            earlier.append(json.load(f))
    start = time.perf_counter()
    load_start = peer.loadavg()
    host = peer.host_info()
    print(f"MLX {mx.__version__} gradient peer, T={tokens} ({'quick' if peer.QUICK else 'full'})")
    print(f"host: {peer.host_line(host)}; load average {load_start}")
    records, probes, skips = [], [], []
    scratch = out_path + ".child"
    for impl in IMPLS:
        points = known_points(earlier, impl)
        for probe_t in PROBE_T:
            if len([t for t in points if t < tokens]) >= 2 or probe_t >= tokens:
                break
            if probe_t not in points:
                rec = run_child(impl, "fwd_bwd", probe_t, scratch)
                if rec is None:
                    break
                rec["probe"] = True
                probes.append(rec)
                points[probe_t] = (probe_t, rec["rss_extra_bytes"], rec["median_us"] * 1e-6)
        below = [p for t, p in sorted(points.items()) if t < tokens]
        mem = meminfo()
        if MEM_BUDGET_GIB:
            budget, budget_text = float(MEM_BUDGET_GIB) * GIB, "MLXK_BENCH_GRAD_PEER_MEM_GIB"
        else:
            budget = min(mem["MemAvailable"] - HEADROOM, 0.6 * mem["MemTotal"])
            budget_text = (f"MemAvailable {mem['MemAvailable'] / GIB:.1f} GiB - 4 GiB headroom, at most 60% of"
                           f" MemTotal {mem['MemTotal'] / GIB:.1f} GiB")
        reasons, estimate = [], {}
        if len(below) >= 2:
            est_bytes = fit_memory([(t, m) for t, m, _ in below], tokens) * MEM_SAFETY
            est_s, exponent = fit_time([(t, s) for t, _, s in below], tokens)
            estimate = dict(estimated_peak_extra_bytes=est_bytes, memory_budget_bytes=budget,
                            estimated_call_s=est_s, time_exponent=exponent, max_call_s=MAX_CALL_S,
                            from_T=[p[0] for p in below])
            print(f"{impl} T={tokens}: estimated peak extra memory {est_bytes / GIB:.1f} GiB (with"
                  f" {MEM_SAFETY - 1:.0%} margin; budget {budget / GIB:.1f} GiB), one forward + backward"
                  f" call ~{est_s:.0f} s (time ~ T^{exponent:.2f}; cap {MAX_CALL_S:.0f} s), from T ="
                  f" {', '.join(str(p[0]) for p in below)}", flush=True)
            if est_bytes > budget:
                reasons.append(f"estimated peak {est_bytes / GIB:.1f} GiB > budget {budget / GIB:.1f} GiB"
                               f" ({budget_text})")
            if est_s > MAX_CALL_S:
                reasons.append(f"estimated {est_s:.0f} s per call > {MAX_CALL_S:.0f} s"
                               " (MLXK_BENCH_GRAD_PEER_MAX_S)")
        elif tokens > PROBE_T[-1]:
            reasons.append("no estimate: the probes failed")
        if reasons:
            print(f"{impl} T={tokens}: SKIPPED: {'; '.join(reasons)}", flush=True)
            skips.append(dict(impl=impl, T=tokens, reasons=reasons, **estimate))
            continue
        for phase in ("fwd", "fwd_bwd"):
            rec = run_child(impl, phase, tokens, scratch)
            if rec is None:
                skips.append(dict(impl=impl, T=tokens, reasons=[f"{phase} failed"], **estimate))
                break
            rec.update(estimate if phase == "fwd_bwd" else {})
            records.append(rec)
    out = dict(tool="mlxkern benches/grad_peer.py", mlx_version=mx.__version__,
               mlx_lm_version=peer.mlx_lm_version(), device=str(mx.default_device()), quick=peer.QUICK,
               timing=peer.CFG, T=tokens, cpus_online=host["cpus_online"], host=host,
               loadavg_start=load_start, loadavg_end=peer.loadavg(), records=records, probes=probes,
               skips=skips, total_s=time.perf_counter() - start)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
    print(f"grad_peer.py: {len(records)} records, {len(probes)} probes, {len(skips)} skipped in"
          f" {out['total_s']:.1f} s -> {out_path}")


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--child":
        _, _, impl, phase, tokens, out_path = sys.argv
        if impl not in IMPLS or phase not in ("fwd", "fwd_bwd"):
            sys.exit(f"grad_peer.py --child: bad implementation {impl} or phase {phase}")
        child(impl, phase, int(tokens), out_path)
        return
    if len(sys.argv) < 3 or sys.argv[1].startswith("--"):
        sys.exit("usage: grad_peer.py OUTPUT.json T [EARLIER.json...]   (MLXK_BENCH_QUICK=1,"
                 " MLXK_BENCH_GRAD_PEER_MAX_S)")
    parent(sys.argv[1], int(sys.argv[2]), sys.argv[3:])


if __name__ == "__main__":
    main()
