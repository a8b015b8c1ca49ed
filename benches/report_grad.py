"""The gradient section of benches/report.py: one Gated DeltaNet layer's forward and backward,
mlxkern (benches/grad.cpp) against MLX's CPU paths (benches/grad_peer.py), time and peak memory;
two tables, results.json's "gradients" and OUT_DIR/grad_chart.png."""

import os

from report_common import fmt_time, host_text

PEER_LABEL = {"mlx_fast": "mx.fast", "mlx_lm_ops": "mlx-lm ops"}

# ---------------------------------------------------------------------------------------------
# Gradients: benches/grad.cpp (mlxkern, one process per T and phase) and benches/grad_peer.py
# (MLX's two paths, one process per T and phase, skipped where they would not fit).

GRAD_BWD_SPEEDUP = 20.0  # the backward >= 20x faster than the best MLX path at each length
GRAD_EXTRA_GIB = 1.0  # mlxkern's backward at T = 4096: <= 1 GiB of peak memory above its inputs
GRAD_PEERS = ("mlx_lm_ops", "mlx_fast")
GIB = float(1 << 30)


def fmt_gib(nbytes):
    if nbytes is None:
        return "-"
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB else f"{nbytes / (1 << 20):.0f} MiB"


def met_text(target):
    if target["met"] is None:
        return "unknown (bound below)"
    return ("yes" if target["met"] else "NO") + (" (bound)" if target.get("lower_bound") else "")


def grad_rows(kern_parts, peer_parts):
    """One row per T: mlxkern's forward and backward, each MLX path's forward, forward +
    backward and backward (the difference), peak extra memory, the best MLX path's ratios, and
    for lengths an MLX path was not run at, its skip and lower bounds."""
    recs = [r for part in kern_parts + peer_parts for r in part.get("records", [])]
    skips = [s for part in peer_parts for s in part.get("skips", [])]
    lengths = sorted({r["T"] for r in recs if r["impl"] == "mlxkern"})
    by = {(r["impl"], r["op"], r["T"]): r for r in recs}
    rows = []
    for t in lengths:
        fwd, bwd = by.get(("mlxkern", "grad_fwd", t)), by.get(("mlxkern", "grad_bwd", t))
        if fwd is None or bwd is None:
            continue
        row = {"T": t, "B": 1, "mlxkern": {"fwd_us": fwd["median_us"], "bwd_us": bwd["median_us"],
                                           "fwd_bwd_us": fwd["median_us"] + bwd["median_us"],
                                           "fwd_rss_extra_bytes": fwd["rss_extra_bytes"],
                                           "fwd_mlx_extra_bytes": fwd["mlx_extra_bytes"],
                                           "bwd_rss_extra_bytes": bwd["rss_extra_bytes"],
                                           "bwd_mlx_extra_bytes": bwd["mlx_extra_bytes"],
                                           "bwd_n": bwd["n"], "fwd_n": fwd["n"]}}
        for impl in GRAD_PEERS:
            pf, pb = by.get((impl, "grad_fwd", t)), by.get((impl, "grad_fwd_bwd", t))
            if pf is not None and pb is not None:
                row[impl] = {"fwd_us": pf["median_us"], "fwd_bwd_us": pb["median_us"],
                             "bwd_us": pb["median_us"] - pf["median_us"],
                             "fwd_bwd_rss_extra_bytes": pb["rss_extra_bytes"],
                             "fwd_bwd_mlx_extra_bytes": pb["mlx_extra_bytes"], "fwd_bwd_n": pb["n"],
                             "checks": pb.get("checks", {})}
                continue
            skip = next((s for s in skips if s["impl"] == impl and s["T"] == t), None)
            # Lower bounds from the largest T this path ran at: its backward time per token does
            # not fall with T (it grows: every token's states are kept, and the measured time
            # grows faster than T), so scaling it linearly bounds it from below.
            ran = sorted(tt for (i, op, tt) in by if i == impl and op == "grad_fwd_bwd"
                         and (i, "grad_fwd", tt) in by and tt < t)
            entry = {"skipped": skip["reasons"] if skip else ["not run"]}
            if skip and "estimated_peak_extra_bytes" in skip:
                entry["estimated_peak_extra_bytes"] = skip["estimated_peak_extra_bytes"]
                entry["estimated_call_s"] = skip["estimated_call_s"]
            if ran:
                t0 = ran[-1]
                b0 = by[(impl, "grad_fwd_bwd", t0)]["median_us"] - by[(impl, "grad_fwd", t0)]["median_us"]
                entry["bwd_us_lower_bound"] = b0 * t / t0
                entry["fwd_bwd_us_lower_bound"] = by[(impl, "grad_fwd_bwd", t0)]["median_us"] * t / t0
                entry["bound_from_T"] = t0
            row[impl] = entry
        measured = [(row[i]["fwd_bwd_us"], i) for i in GRAD_PEERS if "fwd_bwd_us" in row.get(i, {})]
        k = row["mlxkern"]
        if measured:
            _, best = min(measured)
            row["best_mlx"] = best
            row["bwd_speedup"] = row[best]["bwd_us"] / k["bwd_us"]
            row["fwd_bwd_speedup"] = row[best]["fwd_bwd_us"] / k["fwd_bwd_us"]
        else:
            bounds = [(row[i]["fwd_bwd_us_lower_bound"], i) for i in GRAD_PEERS
                      if "fwd_bwd_us_lower_bound" in row.get(i, {})]
            if bounds:
                _, best = min(bounds)
                row["best_mlx"] = best
                row["bwd_speedup_lower_bound"] = row[best]["bwd_us_lower_bound"] / k["bwd_us"]
                row["fwd_bwd_speedup_lower_bound"] = row[best]["fwd_bwd_us_lower_bound"] / k["fwd_bwd_us"]
        speedup = row.get("bwd_speedup", row.get("bwd_speedup_lower_bound"))
        if speedup is not None:
            # From a lower bound, only "met" is known; below the target it says nothing (None).
            bound = "bwd_speedup" not in row
            met = speedup >= GRAD_BWD_SPEEDUP if not bound else (True if speedup >= GRAD_BWD_SPEEDUP else None)
            row["target_bwd"] = dict(text=f"bwd >= {GRAD_BWD_SPEEDUP:.0f}x best MLX", met=met, lower_bound=bound)
        if t == 4096:
            extra = k["bwd_rss_extra_bytes"]
            row["target_memory"] = dict(text=f"bwd peak extra <= {GRAD_EXTRA_GIB:.0f} GiB",
                                        met=extra <= GRAD_EXTRA_GIB * GIB, extra_bytes=extra)
        rows.append(row)
    return rows


def grad_checks(kern_parts, peer_parts):
    """sum |gradient| of mlxkern's backward against each MLX path's, same inputs (relative)."""
    kern = {}
    for part in kern_parts:
        if part.get("checks"):
            kern[part["records"][0]["T"]] = part["checks"]
    out = {}
    for part in peer_parts:
        for rec in part.get("records", []):
            ours = kern.get(rec["T"])
            if rec["op"] != "grad_fwd_bwd" or not ours or not rec.get("checks"):
                continue
            out[f"{rec['impl']}_T{rec['T']}"] = {
                key: abs(val - ours[key]) / max(abs(ours[key]), 1e-30)
                for key, val in rec["checks"].items() if key in ours}
    return out


def grad_section(kern_parts, peer_parts, out_dir, footer_head):
    """Prints the gradient tables, draws build/bench/grad_chart.png, returns results.json's
    "gradients"."""
    rows = grad_rows(kern_parts, peer_parts)
    if not rows:
        return None
    host = kern_parts[0].get("host", {})
    loads = [float(la[0]) for part in kern_parts + peer_parts
             for la in (part.get("loadavg_start"), part.get("loadavg_end")) if la]
    load = f"{min(loads):.2f} to {max(loads):.2f}" if loads else "unknown"
    print()
    print("gradients: one Gated DeltaNet layer, forward and backward (Qwen3.5-35B-A3B dims: B = 1, Hk 16, Hv 32,"
          " Dk = Dv = 128, bf16, no initial state), CPU, each measurement in a fresh process")
    print(f"machine: {host_text(host)}; 1-minute load average {load} over the gradient parts")

    def peer_time(row, impl, key):
        cell = row.get(impl, {})
        if f"{key}_us" in cell:
            return fmt_time(cell[f"{key}_us"])
        if f"{key}_us_lower_bound" in cell:
            return ">=" + fmt_time(cell[f"{key}_us_lower_bound"]) + "^"
        return "skipped" if "skipped" in cell else "-"

    def ratio(row, key):
        if key in row:
            return f"{row[key]:.1f}x"
        if f"{key}_lower_bound" in row:
            return f">={row[f'{key}_lower_bound']:.0f}x^"
        return "-"

    head = ["T", "mlxkern fwd", "mlxkern bwd", "mlx-lm fwd", "mlx-lm fwd+bwd", "mlx-lm bwd", "mx.fast fwd",
            "mx.fast fwd+bwd", "mx.fast bwd", "bwd speedup", "fwd+bwd speedup", "target", "met?"]
    lines = []
    for r in rows:
        k = r["mlxkern"]
        tgt = r.get("target_bwd")
        lines.append([str(r["T"]), fmt_time(k["fwd_us"]), fmt_time(k["bwd_us"]),
                      peer_time(r, "mlx_lm_ops", "fwd"), peer_time(r, "mlx_lm_ops", "fwd_bwd"),
                      peer_time(r, "mlx_lm_ops", "bwd"), peer_time(r, "mlx_fast", "fwd"),
                      peer_time(r, "mlx_fast", "fwd_bwd"), peer_time(r, "mlx_fast", "bwd"),
                      ratio(r, "bwd_speedup"), ratio(r, "fwd_bwd_speedup"), tgt["text"] if tgt else "",
                      met_text(tgt) if tgt else ""])
    print_columns(head, lines, left={0, 11, 12})
    print("times: medians per call (one process per T and phase); bwd of an MLX path = its fwd+bwd"
          " (mx.value_and_grad) - its fwd; mlxkern's bwd (mlxk_gated_delta_update_vjp) recomputes the forward"
          " itself, and its fwd+bwd is fwd + bwd; speedup = best MLX path (lowest fwd+bwd) / mlxkern;")
    print("^ = that MLX path was not run at this T (below): its time at the largest T it ran at, scaled"
          " linearly in T, a lower bound (its cost per token grows with T), and the speedup a lower bound too")

    head = ["T", "mlxkern fwd RSS", "MLX", "mlxkern bwd RSS", "MLX", "mlx-lm fwd+bwd RSS", "MLX",
            "mx.fast fwd+bwd RSS", "MLX", "target", "met?"]
    lines = []
    for r in rows:
        k = r["mlxkern"]

        def peer_mem(impl, key):
            cell = r.get(impl, {})
            if key in cell:
                return fmt_gib(cell[key])
            if "estimated_peak_extra_bytes" in cell and key.endswith("rss_extra_bytes"):
                return f"est. {fmt_gib(cell['estimated_peak_extra_bytes'])}^"
            return "skipped" if "skipped" in cell else "-"

        tgt = r.get("target_memory")
        lines.append([str(r["T"]), fmt_gib(k["fwd_rss_extra_bytes"]), fmt_gib(k["fwd_mlx_extra_bytes"]),
                      fmt_gib(k["bwd_rss_extra_bytes"]), fmt_gib(k["bwd_mlx_extra_bytes"]),
                      peer_mem("mlx_lm_ops", "fwd_bwd_rss_extra_bytes"), peer_mem("mlx_lm_ops", "fwd_bwd_mlx_extra_bytes"),
                      peer_mem("mlx_fast", "fwd_bwd_rss_extra_bytes"), peer_mem("mlx_fast", "fwd_bwd_mlx_extra_bytes"),
                      tgt["text"] if tgt else "", ("yes" if tgt["met"] else "NO") if tgt else ""])
    print()
    print_columns(head, lines, left={0, 9, 10})
    print("peak extra memory: RSS = the process's peak resident set above its resident set just before the first"
          " call (inputs made); MLX = mx.get_peak_memory() above mx.get_active_memory() there (MLX's buffers only:"
          " mlxkern's backward keeps its working copies and checkpoints in its own allocations, which only RSS"
          " sees); ^ = the estimate the peer was skipped for")
    for impl in GRAD_PEERS:
        for r in rows:
            cell = r.get(impl, {})
            if "skipped" in cell:
                print(f"{PEER_LABEL.get(impl, impl)} at T={r['T']} NOT RUN: {'; '.join(cell['skipped'])}")
    checks = grad_checks(kern_parts, peer_parts)
    for key, diffs in checks.items():
        worst = max(diffs.values()) if diffs else 0.0
        each = ", ".join(f"{name[:-len('_abs_sum')]} {v:.1e}" for name, v in diffs.items())
        print(f"same inputs, same gradients ({key}): sum|gradient| within {worst:.1e} of mlxkern's ({each})")
    footer = (footer_head + f"\nmeasured on: {host_text(host)}; 1-minute load average {load}")
    path = os.path.join(out_dir, "grad_chart.png")
    draw_grad_chart(rows, path, footer)
    print(f"wrote {path}")
    targets = []
    for r in rows:
        for key in ("target_bwd", "target_memory"):
            if key in r:
                targets.append({"id": f"grad_T{r['T']}_{key[7:]}", "label": f"gradients T={r['T']}", **r[key]})
    return {"host": host, "load_average_1min_range": [min(loads), max(loads)] if loads else None,
            "rows": rows, "targets": targets, "checks": checks,
            "skips": [s for part in peer_parts for s in part.get("skips", [])],
            "probes": [p for part in peer_parts for p in part.get("probes", [])],
            "records": {"mlxkern": [r for part in kern_parts for r in part["records"]],
                        "mlx": [r for part in peer_parts for r in part.get("records", [])]},
            "runs": [{k: v for k, v in part.items() if k not in ("records", "probes")}
                     for part in kern_parts + peer_parts]}


def print_columns(head, lines, left):
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(head)]
    print("  ".join(h.ljust(w) if i in left else h.rjust(w) for i, (h, w) in enumerate(zip(head, widths))).rstrip())
    print("  ".join("-" * w for w in widths))
    for line in lines:
        print("  ".join(c.ljust(w) if i in left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip())


def draw_grad_chart(rows, path, footer):
    """Two panels over T: time per call (log) and peak extra memory (log), mlxkern vs MLX's
    paths; hatched bars are lower bounds (time) or estimates (memory) of runs that were skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(13, 5.6))
    xs = list(range(len(rows)))
    time_series = [("mlxkern fwd", "#aec7e8", lambda r: (r["mlxkern"]["fwd_us"], False)),
                   ("mlxkern bwd", "#1f77b4", lambda r: (r["mlxkern"]["bwd_us"], False))]
    mem_series = [("mlxkern fwd", "#aec7e8", lambda r: (r["mlxkern"]["fwd_rss_extra_bytes"], False)),
                  ("mlxkern bwd", "#1f77b4", lambda r: (r["mlxkern"]["bwd_rss_extra_bytes"], False))]
    colors = {"mlx_lm_ops": "#2ca02c", "mlx_fast": "#ff7f0e"}
    for impl in GRAD_PEERS:
        label = {"mlx_lm_ops": "mlx-lm gated_delta_ops", "mlx_fast": "mx.fast.gated_delta_update"}[impl]

        def t_of(r, impl=impl):
            cell = r.get(impl, {})
            if "bwd_us" in cell:
                return cell["bwd_us"], False
            return cell.get("bwd_us_lower_bound"), True

        def m_of(r, impl=impl):
            cell = r.get(impl, {})
            if "fwd_bwd_rss_extra_bytes" in cell:
                return cell["fwd_bwd_rss_extra_bytes"], False
            return cell.get("estimated_peak_extra_bytes"), True

        time_series.append((f"{label} (time: bwd; memory: fwd+bwd)", colors[impl], t_of))
        mem_series.append((label, colors[impl], m_of))
    width = 0.8 / len(time_series)
    for ax, series, scale, unit in ((ax_t, time_series, 1e-6, "s"), (ax_m, mem_series, 1 / GIB, "GiB")):
        values = []
        for j, (_, color, get) in enumerate(series):
            for i, r in enumerate(rows):
                value, hollow = get(r)
                if value is None:
                    continue
                x = i + (j - (len(series) - 1) / 2) * width
                v = value * scale
                values.append(v)
                ax.bar(x, v, width=width * 0.92, color=color, alpha=0.4 if hollow else 1.0,
                       hatch="//" if hollow else None, edgecolor=color if hollow else "white")
                text = (f"{v:.3g}" if v >= 0.01 else f"{v:.1e}") + ("*" if hollow else "")
                ax.text(x, v * 1.08, text, ha="center", va="bottom", fontsize=6.5, rotation=90)
        ax.set_yscale("log")
        ax.set_ylim(min(values) / 2, max(values) * 12)
        ax.set_xticks(xs)
        ax.set_xticklabels([f"T={r['T']}" for r in rows])
        ax.grid(axis="y", which="both", alpha=0.25)
        ax.set_ylabel(unit)
    top = ax_t.get_ylim()[1]
    for i, r in enumerate(rows):
        s = r.get("bwd_speedup", r.get("bwd_speedup_lower_bound"))
        if s is not None:
            ax_t.text(i, top / 2.2, ("" if "bwd_speedup" in r else ">=") + f"{s:.0f}x",
                      ha="center", va="top", fontsize=9, fontweight="bold")
    ax_m.axhline(GRAD_EXTRA_GIB, color="black", lw=1.2, ls="--")
    ax_m.text(-0.45, GRAD_EXTRA_GIB * 1.05, f"target for mlxkern bwd at T=4096: {GRAD_EXTRA_GIB:.0f} GiB",
              ha="left", va="bottom", fontsize=7)
    ax_t.set_title("time per call: forward, backward (bold: mlxkern's backward speedup vs the best MLX path)",
                   fontsize=9)
    ax_m.set_title("peak memory above the inputs (process RSS)", fontsize=9)
    handles = [Patch(color=c, label=lbl) for lbl, c, _ in time_series]
    handles.append(Patch(facecolor="white", edgecolor="grey", hatch="//",
                         label="* not run (would not fit here): time a lower bound (linear from the largest T run),"
                               " memory the estimate"))
    fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=7.5, frameon=False, bbox_to_anchor=(0.5, 0.07))
    fig.suptitle("Gated DeltaNet gradients, one layer at Qwen3.5-35B-A3B dims (B=1, Hk 16, Hv 32, Dk=Dv=128, bf16),"
                 " CPU: mlxkern (C ABI) vs MLX's CPU paths, same inputs", fontsize=10)
    fig.text(0.01, 0.005, footer, fontsize=7, color="dimgrey", va="bottom")
    fig.tight_layout(rect=(0, 0.2, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------
# The chunked form's forward + backward (benches/grad.cpp cfwd / cbwd) beside
# bitsandbytes-cpu-fork's native CPU kernels (benches/grad_bnb.py), and the chunked forward's
# share of the machine's multiply-add peak (benches/fma_peak.cpp).

NATIVE_SPEEDUP = 2.0  # chunked forward + backward >= 2x bitsandbytes-cpu-fork's at every T
FMA_SHARE = 0.8  # the chunked forward >= 80 % of the float32 multiply-add peak
CHUNK, HV, DK, DV = 32, 32, 128, 128


def chunked_forward_flops(tokens):
    """Multiply-adds of the chunked forward's products at the bench's dims, times two: per token
    and value head 3·Dk·Dv + C·(Dk + Dv) (src/cpu/gated_delta/chunked/mod.rs's count)."""
    return 2.0 * tokens * HV * (3 * DK * DV + CHUNK * (DK + DV))


def native_section(native_parts, kern_parts):
    """Prints the table, returns results.json's "gradients_chunked" (None without parts)."""
    recs = [r for part in native_parts + kern_parts for r in part.get("records", [])]
    by = {(r["impl"], r["op"], r["T"]): r for r in recs}
    peak = next((p for p in native_parts if p.get("tool", "").endswith("fma_peak.cpp")), None)
    lengths = sorted({r["T"] for r in recs if r["impl"] == "mlxkern_chunked"})
    if not lengths:
        return None
    rows = []
    for t in lengths:
        cf, cb = by.get(("mlxkern_chunked", "grad_fwd", t)), by.get(("mlxkern_chunked", "grad_bwd", t))
        if cf is None or cb is None:
            continue
        row = {"T": t, "chunked": {"fwd_us": cf["median_us"], "bwd_us": cb["median_us"],
                                   "fwd_bwd_us": cf["median_us"] + cb["median_us"],
                                   "bwd_rss_extra_bytes": cb.get("rss_extra_bytes")}}
        ef, eb = by.get(("mlxkern", "grad_fwd", t)), by.get(("mlxkern", "grad_bwd", t))
        if ef is not None and eb is not None:
            row["exact"] = {"fwd_us": ef["median_us"], "bwd_us": eb["median_us"],
                            "fwd_bwd_us": ef["median_us"] + eb["median_us"]}
        bf, bb = by.get(("bnb_cpu", "grad_fwd", t)), by.get(("bnb_cpu", "grad_fwd_bwd", t))
        if bf is not None and bb is not None:
            row["bnb_cpu"] = {"fwd_us": bf["median_us"], "fwd_bwd_us": bb["median_us"],
                              "bwd_us": bb["median_us"] - bf["median_us"], "checkpoint": bb.get("checkpoint")}
            row["speedup"] = bb["median_us"] / row["chunked"]["fwd_bwd_us"]
            row["target_native"] = dict(text=f"fwd+bwd >= {NATIVE_SPEEDUP:.0f}x bitsandbytes-cpu-fork",
                                        met=row["speedup"] >= NATIVE_SPEEDUP)
            ours = cb.get("checks") or next((p.get("checks") for p in native_parts
                                             if p.get("records") and p["records"][0]["impl"] == "mlxkern_chunked"
                                             and p["records"][0]["op"] == "grad_bwd" and p["records"][0]["T"] == t),
                                            None)
            theirs = bb.get("checks", {})
            if ours and theirs:
                row["checks"] = {k: abs(v - ours[k]) / max(abs(ours[k]), 1e-30) for k, v in theirs.items() if k in ours}
        gflops = chunked_forward_flops(t) / cf["median_us"] / 1e3
        row["chunked"]["fwd_gflops"] = gflops
        if peak:
            row["fma_share"] = gflops / peak["gflops"]
            row["target_fma"] = dict(text=f"chunked fwd >= {FMA_SHARE:.0%} of the FMA peak",
                                     met=row["fma_share"] >= FMA_SHARE)
        rows.append(row)
    if not rows:
        return None
    host = kern_parts[0].get("host", {}) if kern_parts else {}
    loads = [float(la[0]) for part in native_parts + kern_parts
             for la in (part.get("loadavg_start"), part.get("loadavg_end")) if la]
    load = f"{min(loads):.2f} to {max(loads):.2f}" if loads else "unknown"
    print()
    print("chunked form, forward + backward, beside bitsandbytes-cpu-fork 0.50.2.dev9's native CPU kernels"
          " (same dims and inputs as above)")
    print(f"machine: {host_text(host)}; 1-minute load average {load}"
          + (f"; float32 multiply-add peak {peak['gflops']:.1f} GFLOP/s ({peak['isa']}, {peak['threads']} threads,"
             f" benches/fma_peak.cpp)" if peak else ""))

    def cell(row, impl, key):
        return fmt_time(row.get(impl, {}).get(key))

    head = ["T", "chunked fwd", "chunked bwd", "chunked fwd+bwd", "exact fwd+bwd", "bnb fwd", "bnb fwd+bwd",
            "bnb / chunked", "target", "met?", "fwd GFLOP/s", "of peak", "met?"]
    lines = []
    for r in rows:
        tn, tf = r.get("target_native"), r.get("target_fma")
        lines.append([str(r["T"]), cell(r, "chunked", "fwd_us"), cell(r, "chunked", "bwd_us"),
                      cell(r, "chunked", "fwd_bwd_us"), cell(r, "exact", "fwd_bwd_us"), cell(r, "bnb_cpu", "fwd_us"),
                      cell(r, "bnb_cpu", "fwd_bwd_us"), f"{r['speedup']:.2f}x" if "speedup" in r else "-",
                      tn["text"] if tn else "", ("yes" if tn["met"] else "NO") if tn else "",
                      f"{r['chunked']['fwd_gflops']:.1f}", f"{r['fma_share']:.0%}" if "fma_share" in r else "-",
                      ("yes" if tf["met"] else "NO") if tf else ""])
    print_columns(head, lines, left={0, 8, 9, 12})
    print("times: medians per call, one process per T and phase (bnb: one process per T); chunked = "
          "mlxk_gated_delta_update_chunked, then mlxk_gated_delta_update_chunked_vjp (which recomputes the forward"
          " itself), chunk 32; bnb = gdn_fwd_cpu (checkpoints kept) + gdn_bwd_cpu, q and k repeated to Hv, its gate"
          " chain (to a, b, A_log, dt_bias) outside its time; GFLOP/s counts the chunked forward's products")
    for r in rows:
        if r.get("checks"):
            each = ", ".join(f"{name[:-len('_abs_sum')]} {v:.1e}" for name, v in r["checks"].items())
            print(f"same inputs, same gradients (bnb_cpu_T{r['T']}): sum|gradient| within"
                  f" {max(r['checks'].values()):.1e} of mlxkern chunked's ({each})")
    targets = []
    for r in rows:
        for key in ("target_native", "target_fma"):
            if key in r:
                targets.append({"id": f"chunked_T{r['T']}_{key[7:]}", "label": f"chunked T={r['T']}", **r[key]})
    return {"host": host, "fma_peak": peak, "rows": rows, "targets": targets,
            "records": [r for part in native_parts for r in part.get("records", [])]}
