"""Merges the mlxkern (benches/bench.c), MLX peer (benches/peer.py) and llama.cpp peer
(benches/llama_peer.c) results of one run.

    .venv/bin/python3 benches/report.py OUT_DIR [--run RUN.json] [--mlxkern PART.json...
        --peer PART.json... [--llama PART.json...] [--engine PART.json...]]
        [--grad PART.json... [--grad-peer PART.json...]]

Each side may come in parts (scripts/bench/run.sh runs one case group at a time, alternating the
sides); the parts of a side are concatenated in the order given. RUN.json (written by
scripts/bench/run.sh) holds the 1-minute load average at the start and end of the whole run.

Writes OUT_DIR/results.json (the machine, all inputs, one merged row per case, the targets,
the llama.cpp agreement checks) and OUT_DIR/chart.png (tokens/s per op and size, mlxkern vs
MLX vs llama.cpp, log scale, the machine in the footer), and prints the machine, then the
table: case, mlxkern, the MLX peers, speedup (best MLX time / mlxkern time), llama.cpp and its
ratio (llama.cpp time / mlxkern time), memory floor, target, met?
The --engine parts (benches/engine.cpp and benches/engine_peer.py: a whole Qwen3.5 layer) get a
table of their own and results.json's "engine_layer". The --grad and --grad-peer parts
(benches/grad.cpp and benches/grad_peer.py: one layer's forward and backward, mlxkern vs MLX's
paths, time and peak memory) get two tables, results.json's "gradients" and
OUT_DIR/grad_chart.png.
"""

import json
import os
import sys
import time

from report_common import fmt_time, host_text, yes_no
from report_grad import grad_section, native_section

# Issue targets (one layer, this machine).
DECODE_HOT_US = 60.0  # decode, B = 1, hot, 30 steps chained per eval: <= 60 us per step
DECODE_COLD_X_COPY = 1.3  # decode, B = 1, cold, one eval of 30 layers: <= 1.3 x streaming the states
PREFILL_TOK_S = 25000.0  # prefill at T = 4096: >= 25 k tokens/s
SMALL_OPS_X_COPY = 2.0  # head split and gated norm: <= 2 x a copy of their input + output bytes
ENGINE_X_PARTS = 1.05  # the engine layer: <= 1.05 x its MLX ops alone + its mlxkern kernels alone

PEERS = ("mlx_fast", "mlx_lm_ops", "mlx_ops")  # MLX's paths: "speedup" is against the best of these
LLAMA = "llama_cpp"  # llama.cpp's GGML_OP_GATED_DELTA_NET: its own column and ratio
PEER_LABEL = {"mlx_fast": "mx.fast", "mlx_lm_ops": "mlx-lm ops", "mlx_ops": "MLX ops", LLAMA: "llama.cpp"}
COPY_IMPLS = ("memcpy", "memcpy_2t")


def load(path):
    with open(path) as f:
        return json.load(f)


def load_side(paths):
    """One side's parts as one document: the first part's metadata, every record, the checks
    of all parts, the run time summed, and each part's group, run time and load average."""
    parts = [load(p) for p in paths]
    side = {k: v for k, v in parts[0].items() if k != "records"}
    side["records"] = [rec for part in parts for rec in part["records"]]
    side["checks"] = {}
    for part in parts:
        for key, val in part.get("checks", {}).items():
            side["checks"].setdefault(key, {}).update(val)
    side["total_s"] = sum(part.get("total_s", 0) for part in parts)
    side["check_failed"] = any(part.get("check_failed") for part in parts)
    side["parts"] = [{"groups": part.get("groups"), "total_s": part.get("total_s"),
                      "loadavg_start": part.get("loadavg_start"), "loadavg_end": part.get("loadavg_end")}
                     for part in parts]
    overhead = sorted(part["eval_roundtrip_us"] for part in parts if "eval_roundtrip_us" in part)
    if overhead:
        side["eval_roundtrip_us"] = overhead[len(overhead) // 2]
    return side


def load_range(*sides):
    """(lowest, highest) 1-minute load average seen at the start and end of every part."""
    loads = [float(la[0]) for side in sides if side for part in side["parts"]
             for la in (part.get("loadavg_start"), part.get("loadavg_end")) if la]
    return (min(loads), max(loads)) if loads else None


def host_of(kern, peer, llama):
    """The machine every side ran on (bench.c's description; the others must name the same CPU)."""
    host = dict(kern.get("host") or {})
    others = [side.get("host") for side in (peer, llama) if side and side.get("host")]
    host["same_cpu_on_every_side"] = all(o.get("cpu_model") == host.get("cpu_model") for o in others)
    return host


def load_text(run, loads):
    parts = []
    if run and run.get("loadavg_start") and run.get("loadavg_end"):
        parts.append(f"{run['loadavg_start'][0]:.2f} at the start, {run['loadavg_end'][0]:.2f} at the end")
    if loads:
        parts.append(f"{loads[0]:.2f} to {loads[1]:.2f} over the parts")
    return "; ".join(parts) if parts else "unknown"


def llama_text(llama):
    build = llama.get("ggml_build", {})
    return (f"ggml {llama.get('ggml_version')} ({llama.get('source')}), CPU backend built with -march=native"
            f" (AVX2 {yes_no(build.get('avx2'))}, FMA {yes_no(build.get('fma'))},"
            f" AVX-512 {yes_no(build.get('avx512'))}), {llama.get('threads')} threads")


def fmt_rate(tok_s):
    if not tok_s:
        return "-"
    if tok_s >= 1e6:
        return f"{tok_s / 1e6:.2f} M"
    if tok_s >= 1e3:
        return f"{tok_s / 1e3:.1f} k"
    return f"{tok_s:.0f}"


def label(case_id, rec):
    op, b, t = rec["op"], rec["B"], rec["T"]
    names = {
        "decode_hot_chained": f"decode hot, 30 steps/eval, B={b}",
        "decode_hot_per_call": f"decode hot, eval/step, B={b}",
        "decode_cold_chained": f"decode cold, 30 layers/eval, B={b}",
        "decode_cold_per_call": f"decode cold, eval/layer, B={b}",
        "prefill": f"prefill T={t}, B={b}",
        "prefill_padded": f"prefill padded T={t}, B={b} (mixed)",
        "prefill_chunked": f"prefill T={t}, B={b}, chunked",
        "prefill_decay": f"prefill T={t}, B={b}, half the heads decaying strongly",
        "prefill_decay_chunked": f"prefill T={t}, B={b}, chunked, half the heads decaying strongly",
        "prefill_padded_chunked": f"prefill padded T={t}, B={b} (mixed), chunked",
        "replay": f"replay T={t}, B={b} (mixed)",
        "head_split": f"head split S={t}",
        "gated_norm": f"gated norm S={t} (x{32} heads)",
    }
    return names.get(op, case_id)


def merge(kern, peer, llama):
    by = {}
    for side in (kern, peer, llama):
        if not side:
            continue
        for rec in side["records"]:
            by.setdefault(rec["id"], {})[rec["impl"]] = rec
    rows = []
    for rec in kern["records"]:
        if rec["impl"] != "mlxkern":
            continue
        cid = rec["id"]
        # The chunked form runs on the exact update's inputs: the same peer figures apply.
        impls = dict(by.get(cid.replace("_chunked", ""), {}))
        impls.update(by.get(cid, {}))
        row = {"id": cid, "label": label(cid, rec), "op": rec["op"], "B": rec["B"], "T": rec["T"],
               "unit": rec["unit"], "tokens_per_unit": rec["tokens_per_unit"], "mlxkern": rec}
        for p in PEERS:
            if p in impls:
                row[p] = impls[p]
        peer_times = [(impls[p]["median_us"], p) for p in PEERS if p in impls]
        if peer_times:
            best_us, best = min(peer_times)
            row["best_peer"] = best
            row["speedup_vs_best_peer"] = best_us / rec["median_us"]
        if LLAMA in impls:
            row[LLAMA] = impls[LLAMA]
            row["speedup_vs_llama_cpp"] = impls[LLAMA]["median_us"] / rec["median_us"]
        # memory floor of the same bytes, per the op's unit
        floor_id = None
        if rec["op"].startswith("decode_cold"):
            floor_id = f"stream_states_B{rec['B']}"
        elif rec["op"] in ("head_split", "gated_norm"):
            floor_id = cid
        if floor_id is not None:
            copies = [by[floor_id][c] for c in COPY_IMPLS if c in by.get(floor_id, {})]
            if copies:
                fastest = min(copies, key=lambda c: c["median_us"])
                row["copy_floor_us"] = fastest["median_us"]
                row["copy_floor_impl"] = fastest["impl"]
                row["copy_floor_bytes"] = fastest["bytes_per_unit"]
                row["x_copy_floor"] = rec["median_us"] / fastest["median_us"]
                rmw = by[floor_id].get("rmw_2t")
                if rmw is not None:
                    row["rmw_floor_us"] = rmw["median_us"]
        apply_target(row)
        rows.append(row)
    return rows


def apply_target(row):
    rec, op, b, t = row["mlxkern"], row["op"], row["B"], row["T"]
    target = None
    if op == "decode_hot_chained" and b == 1:
        target = dict(text=f"<= {DECODE_HOT_US:.0f} us/step", met=rec["median_us"] <= DECODE_HOT_US, limit_us=DECODE_HOT_US,
                      tokens_per_s=1e6 / DECODE_HOT_US)
    elif op == "decode_cold_chained" and b == 1 and "copy_floor_us" in row:
        limit = DECODE_COLD_X_COPY * row["copy_floor_us"]
        target = dict(text=f"<= {DECODE_COLD_X_COPY}x copy ({fmt_time(limit)})", met=rec["median_us"] <= limit,
                      limit_us=limit,
                      tokens_per_s=row["tokens_per_unit"] / (limit * 1e-6))
    elif op in ("prefill", "prefill_chunked") and t == 4096:
        target = dict(text=f">= {PREFILL_TOK_S / 1e3:.0f} k tok/s", met=rec["tokens_per_s"] >= PREFILL_TOK_S,
                      limit_us=rec["tokens_per_unit"] / PREFILL_TOK_S * 1e6,
                      tokens_per_s=PREFILL_TOK_S)
    elif op in ("head_split", "gated_norm") and "copy_floor_us" in row:
        limit = SMALL_OPS_X_COPY * row["copy_floor_us"]
        target = dict(text=f"<= {SMALL_OPS_X_COPY:.0f}x copy ({fmt_time(limit)})", met=rec["median_us"] <= limit,
                      limit_us=limit,
                      tokens_per_s=row["tokens_per_unit"] / (limit * 1e-6))
    if target is not None:
        target["mlxkern_median_us"] = rec["median_us"]
        target["mlxkern_tokens_per_s"] = rec["tokens_per_s"]
        row["target"] = target


def print_table(rows, kern, peer, llama, host, run):
    loads = load_range(kern, peer, llama)
    print(f"machine: {host_text(host)}")
    print(f"1-minute load average: {load_text(run, loads)}")
    if not host.get("same_cpu_on_every_side", True):
        print("WARNING: the parts name different CPUs")
    if llama:
        print(f"llama.cpp peer: {llama_text(llama)}")
    print()
    head = ["case", "unit", "mlxkern", "spread", "tok/s", "mx.fast", "ops path",
            "speedup", "llama.cpp", "its p10", "vs llama", "copy floor", "x floor", "target", "met?"]
    lines = []
    for r in rows:
        k = r["mlxkern"]
        spread = (k["p90_us"] - k["p10_us"]) / k["median_us"] * 100 if k["median_us"] else 0

        def peer_cell(p):
            if p not in r:
                return "-"
            cell = fmt_time(r[p]["median_us"])
            return cell + ("*" if r[p].get("extrapolated_from_T") else "")

        tgt = r.get("target")
        lines.append([
            r["label"], r["unit"], fmt_time(k["median_us"]), f"{spread:.0f}%", fmt_rate(k["tokens_per_s"]),
            peer_cell("mlx_fast"), peer_cell("mlx_lm_ops") if "mlx_lm_ops" in r else peer_cell("mlx_ops"),
            f"{r['speedup_vs_best_peer']:.2f}x" if "speedup_vs_best_peer" in r else "-",
            peer_cell(LLAMA),
            fmt_time(r[LLAMA]["p10_us"]) if LLAMA in r else "-",
            f"{r['speedup_vs_llama_cpp']:.2f}x" if "speedup_vs_llama_cpp" in r else "-",
            fmt_time(r.get("copy_floor_us")) if "copy_floor_us" in r else "-",
            f"{r['x_copy_floor']:.1f}x" if "x_copy_floor" in r else "-",
            tgt["text"] if tgt else "",
            ("yes" if tgt["met"] else "NO") if tgt else "",
        ])
    if not llama:  # no llama.cpp side in this run: no llama.cpp columns
        head = head[:8] + head[11:]
        lines = [line[:8] + line[11:] for line in lines]
    left = {0, 1, len(head) - 2, len(head) - 1}  # case, unit, target, met?
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]

    def fmt(cols):
        return "  ".join(c.ljust(w) if i in left else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cols, widths))).rstrip()

    print(fmt(head))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print(fmt(line))
    print()
    print("times are medians per unit (layer-step: one layer, one token per sequence; call: one call);"
          " spread = (p90 - p10) / median of mlxkern;")
    print("mx.fast = mx.fast.gated_delta_update; ops path = mlx-lm's gated_delta_ops (recurrence) or the"
          " MLX-ops composition of mlx-lm's model code (head split, gated norm);")
    print("speedup = best MLX median / mlxkern median (> 1: mlxkern faster); vs llama = llama.cpp median /"
          " mlxkern median (llama.cpp's CPU GGML_OP_GATED_DELTA_NET, f32, on the same inputs; its chunked-row"
          " figure is its exact op, which has no chunked form);")
    if llama:
        print("its p10 = llama.cpp's 10th percentile: its figures swing more with load than mlxkern's (each of its"
              " ops starts and ends at a barrier every ggml thread must reach, so a thread preempted by other work"
              " stalls the op); a p10 far below the median means other work held a CPU through most samples;")
    print("copy floor = fastest plain copy of the same bytes in this run (1 or 2 threads);")
    print("* = not run at this size: the T=512 measurement scaled to T=4096 (MLX's CPU paths are"
          " sequential over tokens; set MLXK_BENCH_PEER_FULL=1 to run it).")
    print(f"eval round trip of one tiny op through the C ABI: {kern.get('eval_roundtrip_us', 0):.1f} us"
          f" (no-op eval {kern.get('eval_noop_us', 0):.2f} us); every single-call figure includes it, so"
          " at S=1 the head split and gated norm copy floors (< 1 us) are out of reach of any one call")
    if loads:
        print(f"1-minute load average during the run: {loads[0]:.2f} to {loads[1]:.2f} on"
              f" {kern.get('cpus_online', '?')} CPUs (above ~{kern.get('cpus_online', 2)}: other work"
              " shared the CPUs and inflates every figure)")
    print(f"run time: bench.c {kern.get('total_s', 0):.1f} s, peer.py {peer.get('total_s', 0):.1f} s"
          + (f", llama_peer.c {llama.get('total_s', 0):.1f} s" if llama else "")
          + f"{' (quick mode)' if kern.get('quick') else ''}")


def print_checks(kern, peer):
    chunked = kern.get("checks", {}).get("chunked_vs_exact_T4096_B1")
    if chunked:
        print(f"chunked vs exact update (prefill T=4096, same inputs): max |dy| {chunked['y_max_rel']:.2e},"
              f" max |dstate| {chunked['state_max_rel']:.2e} of the exact result's largest magnitude"
              " (y is bf16: one ulp near the largest value is 3.9e-3)")
    k = kern.get("checks", {}).get("prefill_T64_B1")
    p = peer.get("checks", {}).get("prefill_T64_B1", {})
    if not k or not p:
        return None
    out = {}
    parts = []
    for impl, sums in p.items():
        dy = abs(sums["y_abs_sum"] - k["y_abs_sum"]) / max(k["y_abs_sum"], 1e-30)
        ds = abs(sums["state_abs_sum"] - k["state_abs_sum"]) / max(k["state_abs_sum"], 1e-30)
        out[impl] = {"y_abs_sum_rel_diff": dy, "state_abs_sum_rel_diff": ds}
        parts.append(f"{PEER_LABEL.get(impl, impl)}: sum|y| {dy:.1e}, sum|state| {ds:.1e}")
    print("same inputs, same results (prefill T=64, relative difference to mlxkern): " + "; ".join(parts))
    return out


def llama_checks(llama):
    """llama.cpp's agreement with mlxkern, checked by llama_peer.c before timing each case."""
    if not llama:
        return None
    checks = llama.get("checks", {})
    limits = llama.get("check_limits", {})
    failed = [cid for cid, c in checks.items() if not c.get("ok")]
    if checks:
        worst_y = max(c["y_max_rel"] for c in checks.values())
        worst_s = max(c["state_max_rel"] for c in checks.values())
        print(f"llama.cpp vs mlxkern on the same inputs ({len(checks)} cases checked before timing): max |dy|"
              f" {worst_y:.2e}, max |dstate| {worst_s:.2e} of mlxkern's largest magnitude (limits"
              f" {limits.get('y_max_rel', 0):.1e}: y is bf16 in mlxkern, half an ulp is up to 2^-8 of the largest;"
              f" {limits.get('state_max_rel', 0):.0e}: f32 state)")
    if failed:
        print(f"LLAMA.CPP PEER FAILED its agreement check on {', '.join(failed)}: those cases carry no llama.cpp"
              " figures")
    return {"limits": limits, "cases": checks, "failed": failed, "mapping": llama.get("mapping")}


def group(row):
    op = row["op"]
    if op.startswith("decode"):
        return f"decode B={row['B']}"
    return op.replace("_padded", "").replace("_chunked", "")


def draw_chart(rows, path, footer, with_llama):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    series = [("mlxkern", "mlxkern", "#1f77b4"), ("mlx_fast", "MLX mx.fast.gated_delta_update", "#ff7f0e"),
              ("mlx_lm_ops", "mlx-lm gated_delta_ops", "#2ca02c"), ("mlx_ops", "MLX ops (mlx-lm model code)", "#9467bd")]
    if with_llama:
        series.append((LLAMA, "llama.cpp GGML_OP_GATED_DELTA_NET (ggml CPU, f32)", "#d62728"))
    rows = [r for r in rows if r["mlxkern"]["tokens_per_s"] > 0]
    n = len(rows)
    height = 0.62 * n + 2.6
    fig, ax = plt.subplots(figsize=(12, height))
    most = max(sum(1 for key, _, _ in series if key in r) for r in rows)
    bar_h = min(0.26, 0.84 / most)
    for i, r in enumerate(rows):
        present = [(key, color) for key, _, color in series if key in r]
        for j, (key, color) in enumerate(present):
            y = i + (j - (len(present) - 1) / 2) * bar_h
            rec = r[key]
            extrap = bool(rec.get("extrapolated_from_T"))
            ax.barh(y, rec["tokens_per_s"], height=bar_h * 0.92, color=color, alpha=0.45 if extrap else 1.0,
                    hatch="//" if extrap else None, edgecolor="white" if not extrap else color)
            ax.text(rec["tokens_per_s"] * 1.06, y, fmt_rate(rec["tokens_per_s"]) + ("*" if extrap else ""),
                    va="center", fontsize=7)
        tgt = r.get("target")
        if tgt:
            ax.plot([tgt["tokens_per_s"]] * 2, [i - 0.45, i + 0.45], color="black", lw=2)
    for i in range(1, n):  # a rule between op groups (decode per batch size, prefill, replay, ...)
        if group(rows[i]) != group(rows[i - 1]):
            ax.axhline(i - 0.5, color="grey", lw=0.6, alpha=0.6)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"{r['label']}  [{r['unit']}]" for r in rows], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("tokens/s (one layer; decode: per layer-step, B tokens each)")
    ax.grid(axis="x", which="both", alpha=0.25)
    lo = min(r[k]["tokens_per_s"] for r in rows for k, _, _ in series if k in r and r[k]["tokens_per_s"] > 0)
    hi = max([r[k]["tokens_per_s"] for r in rows for k, _, _ in series if k in r]
             + [r["target"]["tokens_per_s"] for r in rows if "target" in r])
    ax.set_xlim(lo / 2, hi * 4)
    handles = [Patch(color=c, label=lbl) for _, lbl, c in series]
    handles.append(plt.Line2D([0], [0], color="black", lw=2, label="target (issue)"))
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="//", label="* scaled from T=512 (not run)"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.045 * 24 / (n + 4)), ncol=3,
              fontsize=8, frameon=False)
    ax.set_title("Gated DeltaNet ops, Qwen3.5-35B-A3B dims (Hk 16, Hv 32, Dk=Dv=128, bf16, f32 state), CPU\n"
                 "mlxkern (C ABI) vs MLX's CPU path" + (" and llama.cpp's CPU op" if with_llama else "")
                 + ", same run, same inputs; higher is better", fontsize=10)
    fig.text(0.01, 0.005, footer, fontsize=7, color="dimgrey", va="bottom")
    fig.tight_layout(rect=(0, (0.15 + 0.13 * footer.count("\n")) / height, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


ENGINE_IMPLS = (  # (impl, label) in table order
    ("engine_zero_copy", "(a) engine layer: MLX ops + mlxkern, zero copy"),
    ("engine_host_copy", "(b) the same through host memory"),
    ("mlx_lm_module", "(c) mlx-lm's module (Python)"),
    ("dense_alone", "    (a)'s MLX ops alone"),
    ("kernels_alone", "    (a)'s mlxkern kernels alone"),
    ("kernels_host_copy_alone", "    (b)'s kernels with their host copies alone"),
)


def fmt_bytes(n):
    if not n:
        return "0"
    return f"{n / 1024:.1f} KiB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MiB"


def engine_layer(parts):
    """The whole-layer table (benches/engine.cpp + benches/engine_peer.py): per case, time per
    step, evals per step and bytes copied across the MLX / mlxkern boundary for (a), (b), (c), and
    (a) against the sum of its parts measured alone. Returns results.json's "engine_layer"."""
    records = [rec for part in parts for rec in part.get("records", [])]
    if not records:
        return None
    by = {(rec["case"], rec["impl"]): rec for rec in records}
    dims = next((p["dims"] for p in parts if "dims" in p), {})
    print()
    print(f"engine layer: one Qwen3.5 Gated DeltaNet layer (hidden {dims.get('hidden')}, Hk {dims.get('Hk')},"
          f" Hv {dims.get('Hv')}, Dk = Dv = {dims.get('Dk')}, conv kernel {dims.get('K')}), B = 1, CPU,"
          " random bf16 weights; medians per step")
    head = ["case", "implementation", "time/step", "spread", "tok/s", "evals/step", "bytes copied/step"]
    lines, summary = [], []
    for case, tokens in (("decode", 1), ("prefill", 512)):
        for impl, text in ENGINE_IMPLS:
            rec = by.get((case, impl))
            if rec is None:
                continue
            spread = (rec["p90_us"] - rec["p10_us"]) / rec["median_us"] * 100 if rec["median_us"] else 0
            lines.append([f"{case} T={tokens}", text, fmt_time(rec["median_us"]), f"{spread:.0f}%",
                          fmt_rate(rec["tokens_per_s"]), str(rec["evals_per_step"]),
                          fmt_bytes(rec["bytes_copied_per_step"])])
        a, dense, kernels = (by.get((case, i)) for i in ("engine_zero_copy", "dense_alone", "kernels_alone"))
        if a and dense and kernels:
            parts_us = dense["median_us"] + kernels["median_us"]
            ratio = a["median_us"] / parts_us
            row = dict(case=case, T=tokens, engine_us=a["median_us"], dense_alone_us=dense["median_us"],
                       kernels_alone_us=kernels["median_us"], sum_of_parts_us=parts_us, x_sum_of_parts=ratio,
                       target=f"<= {ENGINE_X_PARTS}x", met=ratio <= ENGINE_X_PARTS)
            for other in ("engine_host_copy", "mlx_lm_module"):
                if (case, other) in by:
                    row[f"{other}_x_engine"] = by[(case, other)]["median_us"] / a["median_us"]
            if (case, "kernels_host_copy_alone") in by:
                row["host_copy_boundary_us"] = by[(case, "kernels_host_copy_alone")]["median_us"] - kernels["median_us"]
            summary.append(row)
            lines.append([f"{case} T={tokens}", "    (a) / (MLX ops alone + kernels alone)",
                          f"{ratio:.3f}x", "", "", "", f"target <= {ENGINE_X_PARTS}x: "
                          + ("yes" if ratio <= ENGINE_X_PARTS else "NO")])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]

    def fmt(cols):
        return "  ".join(c.ljust(w) if i in (0, 1, 6) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cols, widths))).rstrip()

    print(fmt(head))
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print(fmt(line))
    for row in summary:
        extra = "; ".join(f"{name.replace('_x_engine', '')} {row[name]:.2f}x (a)'s time"
                          for name in ("engine_host_copy_x_engine", "mlx_lm_module_x_engine") if name in row)
        boundary = ""
        if "host_copy_boundary_us" in row:
            boundary = (f"; (b)'s host copies cost {fmt_time(row['host_copy_boundary_us'])} a step"
                        f" ({row['host_copy_boundary_us'] / row['engine_us'] * 100:.1f}% of (a)): its kernels with"
                        " copies alone minus the kernels alone")
        print(f"{row['case']}: kernels are {row['kernels_alone_us'] / row['engine_us'] * 100:.1f}% of (a); {extra}"
              + boundary)
    print("(b) evaluates three times a step (MLX, mlxkern's read, MLX) and copies conv_out, a, b, z out of MLX and"
          " into mlxkern, and the gated norm's output back (each byte read back and uploaded: counted twice);"
          " its recurrent state stays an mlxkern handle")
    return dict(rows=summary, records=records,
                runs=[{k: v for k, v in part.items() if k != "records"} for part in parts])


def parse_args(args):
    """OUT_DIR, then options each followed by its files: --run (one), --mlxkern, --peer, --llama,
    --engine, --grad (benches/grad.cpp parts), --grad-peer (benches/grad_peer.py parts),
    --grad-native (the chunked form's grad.cpp parts, benches/grad_bnb.py's, fma_peak's). The
    kernel table needs --mlxkern and --peer; a run of the gradient section alone gives --grad
    (and --grad-peer) only."""
    usage = ("usage: report.py OUT_DIR [--run RUN.json] [--mlxkern PART.json... --peer PART.json..."
             " [--llama PART.json...] [--engine PART.json...]] [--grad PART.json... [--grad-peer PART.json...]"
             " [--grad-native PART.json...]]")
    if not args or args[0].startswith("--"):
        sys.exit(usage)
    opts, key = {}, None
    for arg in args[1:]:
        if arg in ("--run", "--mlxkern", "--peer", "--llama", "--engine", "--grad", "--grad-peer",
                   "--grad-native"):
            key = arg[2:].replace("-", "_")
            opts.setdefault(key, [])
        elif key is None:
            sys.exit(usage)
        else:
            opts[key].append(arg)
    kernels = bool(opts.get("mlxkern")) and bool(opts.get("peer"))
    if (not kernels and not opts.get("grad")) or bool(opts.get("mlxkern")) != bool(opts.get("peer")) \
            or len(opts.get("run", [None])) != 1:
        sys.exit(usage)
    return args[0], opts


def main():
    out_dir, opts = parse_args(sys.argv[1:])
    run = load(opts["run"][0]) if opts.get("run") else None
    os.makedirs(out_dir, exist_ok=True)
    merged, targets, written = {}, [], []
    grad_kern = [load(p) for p in opts.get("grad", [])]
    grad_peer = [load(p) for p in opts.get("grad_peer", [])]
    if opts.get("mlxkern"):
        kern, peer = load_side(opts["mlxkern"]), load_side(opts["peer"])
        llama = load_side(opts["llama"]) if opts.get("llama") else None
        host = host_of(kern, peer, llama)
        loads = load_range(kern, peer, llama)
        rows = merge(kern, peer, llama)
        print_table(rows, kern, peer, llama, host, run)
        checks = print_checks(kern, peer)
        agreement = llama_checks(llama)
        engine = engine_layer([load(p) for p in opts.get("engine", [])])
        targets = [{"id": r["id"], "label": r["label"], **r["target"]} for r in rows if "target" in r]
        if engine:
            targets += [{"id": f"engine_layer_{r['case']}", "label": f"engine layer, {r['case']} T={r['T']}",
                         "text": f"{r['target']} (MLX ops alone + kernels alone)", "met": r["met"],
                         "x_sum_of_parts": r["x_sum_of_parts"]} for r in engine["rows"]]
        merged = {"host": host,
                  "load_average_1min": {"run_start": run.get("loadavg_start") if run else None,
                                        "run_end": run.get("loadavg_end") if run else None,
                                        "range_over_parts": list(loads) if loads else None},
                  "mlxkern_run": {k: v for k, v in kern.items() if k != "records"},
                  "peer_run": {k: v for k, v in peer.items() if k != "records"},
                  "llama_cpp_run": {k: v for k, v in llama.items() if k != "records"} if llama else None,
                  "rows": rows, "targets": targets, "checks": checks, "llama_cpp_agreement": agreement,
                  "engine_layer": engine,
                  "records": {"mlxkern": kern["records"], "peer": peer["records"],
                              "llama_cpp": llama["records"] if llama else []}}
        chart = os.path.join(out_dir, "chart.png")
        footer = (f"{time.strftime('%Y-%m-%d %H:%M')}  mlxkern {kern.get('library_version')}, MLX {peer.get('mlx_version')},"
                  f" mlx-lm {peer.get('mlx_lm_version')}"
                  + (f", llama.cpp: ggml {llama.get('ggml_version')} CPU ({llama.get('threads')} threads)" if llama else "")
                  + ("; quick mode" if kern.get("quick") else "")
                  + f"\nmeasured on: {host_text(host)}; 1-minute load average {load_text(run, loads)}")
        draw_chart(rows, chart, footer, llama is not None)
        written.append(chart)
    if grad_kern:
        versions = next((p for p in grad_peer if p.get("mlx_version")), {})
        footer_head = (f"{time.strftime('%Y-%m-%d %H:%M')}  mlxkern {grad_kern[0].get('library_version')},"
                       f" MLX {versions.get('mlx_version')}, mlx-lm {versions.get('mlx_lm_version')}"
                       + ("; quick mode" if grad_kern[0].get("quick") else ""))
        grad = grad_section(grad_kern, grad_peer, out_dir, footer_head)
        if grad:
            merged["gradients"] = grad
            merged.setdefault("host", grad["host"])
            merged.setdefault("load_average_1min", {"run_start": run.get("loadavg_start") if run else None,
                                                    "run_end": run.get("loadavg_end") if run else None})
            targets += grad["targets"]
            merged["targets"] = targets
            written.append(os.path.join(out_dir, "grad_chart.png"))
        native = native_section([load(p) for p in opts.get("grad_native", [])], grad_kern)
        if native:
            merged["gradients_chunked"] = native
            targets += native["targets"]
            merged["targets"] = targets
    results = os.path.join(out_dir, "results.json")
    with open(results, "w") as f:
        json.dump(merged, f, indent=1)
    met = sum(1 for t in targets if t["met"])
    unknown = sum(1 for t in targets if t["met"] is None)
    print(f"targets met: {met} of {len(targets)}" + (f" ({unknown} unknown: only a lower bound below the target)"
                                                     if unknown else ""))
    print(f"wrote {results} and {' and '.join(written)}")


if __name__ == "__main__":
    main()
