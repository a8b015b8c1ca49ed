"""Merges the mlxkern (benches/bench.c) and MLX peer (benches/peer.py) results of one run.

    .venv/bin/python3 benches/report.py OUT_DIR --mlxkern PART.json... --peer PART.json...

Each side may come in parts (scripts/bench.sh runs one case group at a time, alternating the
two sides); the parts of a side are concatenated in the order given.

Writes OUT_DIR/results.json (both inputs, one merged row per case, the targets) and
OUT_DIR/chart.png (tokens/s per op and size, mlxkern vs MLX, log scale), and prints the table:
case, mlxkern, the MLX peers, speedup (best MLX time / mlxkern time), memory floor, target, met?
"""

import json
import os
import sys
import time

# Issue targets (one layer, this machine).
DECODE_HOT_US = 60.0  # decode, B = 1, hot, 30 steps chained per eval: <= 60 us per step
DECODE_COLD_X_COPY = 1.3  # decode, B = 1, cold, one eval of 30 layers: <= 1.3 x streaming the states
PREFILL_TOK_S = 25000.0  # prefill at T = 4096: >= 25 k tokens/s
SMALL_OPS_X_COPY = 2.0  # head split and gated norm: <= 2 x a copy of their input + output bytes

PEERS = ("mlx_fast", "mlx_lm_ops", "mlx_ops")
PEER_LABEL = {"mlx_fast": "mx.fast", "mlx_lm_ops": "mlx-lm ops", "mlx_ops": "MLX ops"}
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
    side["parts"] = [{"groups": part.get("groups"), "total_s": part.get("total_s"),
                      "loadavg_start": part.get("loadavg_start"), "loadavg_end": part.get("loadavg_end")}
                     for part in parts]
    overhead = sorted(part["eval_roundtrip_us"] for part in parts if "eval_roundtrip_us" in part)
    if overhead:
        side["eval_roundtrip_us"] = overhead[len(overhead) // 2]
    return side


def load_range(kern, peer):
    """(lowest, highest) 1-minute load average seen at the start and end of every part."""
    loads = [float(la[0]) for side in (kern, peer) for part in side["parts"]
             for la in (part.get("loadavg_start"), part.get("loadavg_end")) if la]
    return (min(loads), max(loads)) if loads else None


def fmt_time(us):
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.1f} us"
    if us < 1e6:
        return f"{us / 1e3:.2f} ms"
    return f"{us / 1e6:.2f} s"


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
        "prefill_padded_chunked": f"prefill padded T={t}, B={b} (mixed), chunked",
        "replay": f"replay T={t}, B={b} (mixed)",
        "head_split": f"head split S={t}",
        "gated_norm": f"gated norm S={t} (x{32} heads)",
    }
    return names.get(op, case_id)


def merge(kern, peer):
    by = {}
    for side in (kern, peer):
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


def print_table(rows, kern, peer):
    head = ["case", "unit", "mlxkern", "spread", "tok/s", "mx.fast", "ops path",
            "speedup", "copy floor", "x floor", "target", "met?"]
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
            fmt_time(r.get("copy_floor_us")) if "copy_floor_us" in r else "-",
            f"{r['x_copy_floor']:.1f}x" if "x_copy_floor" in r else "-",
            tgt["text"] if tgt else "",
            ("yes" if tgt["met"] else "NO") if tgt else "",
        ])
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]

    def fmt(cols):
        return "  ".join(c.ljust(w) if i in (0, 1, 10, 11) else c.rjust(w)
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
    print("speedup = best MLX median / mlxkern median (> 1: mlxkern faster); copy floor = fastest plain"
          " copy of the same bytes in this run (1 or 2 threads);")
    print("* = not run at this size: the T=512 measurement scaled to T=4096 (MLX's CPU paths are"
          " sequential over tokens; set MLXK_BENCH_PEER_FULL=1 to run it).")
    print(f"eval round trip of one tiny op through the C ABI: {kern.get('eval_roundtrip_us', 0):.1f} us"
          f" (no-op eval {kern.get('eval_noop_us', 0):.2f} us); every single-call figure includes it, so"
          " at S=1 the head split and gated norm copy floors (< 1 us) are out of reach of any one call")
    loads = load_range(kern, peer)
    if loads:
        print(f"1-minute load average during the run: {loads[0]:.2f} to {loads[1]:.2f} on"
              f" {kern.get('cpus_online', '?')} CPUs (above ~{kern.get('cpus_online', 2)}: other work"
              " shared the CPUs and inflates every figure)")
    print(f"run time: bench.c {kern.get('total_s', 0):.1f} s, peer.py {peer.get('total_s', 0):.1f} s"
          f"{' (quick mode)' if kern.get('quick') else ''}")


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


def group(row):
    op = row["op"]
    if op.startswith("decode"):
        return f"decode B={row['B']}"
    return op.replace("_padded", "").replace("_chunked", "")


def draw_chart(rows, path, footer):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    series = [("mlxkern", "mlxkern", "#1f77b4"), ("mlx_fast", "MLX mx.fast.gated_delta_update", "#ff7f0e"),
              ("mlx_lm_ops", "mlx-lm gated_delta_ops", "#2ca02c"), ("mlx_ops", "MLX ops (mlx-lm model code)", "#9467bd")]
    rows = [r for r in rows if r["mlxkern"]["tokens_per_s"] > 0]
    n = len(rows)
    fig, ax = plt.subplots(figsize=(12, 0.62 * n + 2.2))
    bar_h = 0.26
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
                 "mlxkern (C ABI) vs MLX's CPU path, same run, same inputs; higher is better", fontsize=10)
    fig.text(0.01, 0.005, footer, fontsize=7, color="dimgrey", va="bottom")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    args = sys.argv[1:]
    if len(args) < 5 or args[1] != "--mlxkern" or "--peer" not in args:
        sys.exit("usage: report.py OUT_DIR --mlxkern PART.json... --peer PART.json...")
    out_dir = args[0]
    split = args.index("--peer")
    kern, peer = load_side(args[2:split]), load_side(args[split + 1:])
    os.makedirs(out_dir, exist_ok=True)
    rows = merge(kern, peer)
    print_table(rows, kern, peer)
    checks = print_checks(kern, peer)
    targets = [{"id": r["id"], "label": r["label"], **r["target"]} for r in rows if "target" in r]
    merged = {"mlxkern_run": {k: v for k, v in kern.items() if k != "records"},
              "peer_run": {k: v for k, v in peer.items() if k != "records"},
              "rows": rows, "targets": targets, "checks": checks,
              "records": {"mlxkern": kern["records"], "peer": peer["records"]}}
    results = os.path.join(out_dir, "results.json")
    with open(results, "w") as f:
        json.dump(merged, f, indent=1)
    chart = os.path.join(out_dir, "chart.png")
    loads = load_range(kern, peer)
    footer = (f"{time.strftime('%Y-%m-%d %H:%M')}  mlxkern {kern.get('library_version')}, MLX {peer.get('mlx_version')},"
              f" mlx-lm {peer.get('mlx_lm_version')}; {kern.get('cpus_online', '?')} CPUs"
              + (f", 1-min load average {loads[0]:.1f}-{loads[1]:.1f}" if loads else "")
              + ("; quick mode" if kern.get("quick") else ""))
    draw_chart(rows, chart, footer)
    met = sum(1 for t in targets if t["met"])
    print(f"targets met: {met} of {len(targets)}")
    print(f"wrote {results} and {chart}")


if __name__ == "__main__":
    main()
