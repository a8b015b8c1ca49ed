"""Markdown tables of a benchmark run, in the layout of docs/performance-cpu.md and
docs/performance-cuda.md, from the JSON the benches write:

    python3 benches/tables.py build/bench/results.json              # make bench (benches/report.py)
    python3 benches/tables.py build/bench/bench-cuda.jsonl [fla.jsonl] # make bench-cuda

Each table is preceded by the run's context (machine, 1-minute load, date of the file), so a
table pasted into a docs page keeps where and when it was measured. Prints to stdout; reads
nothing else and computes no figure the JSON does not hold (ratios are of figures it holds).
"""

import json
import os
import sys
import time

from report_common import fmt_time, host_text


def md_table(head, lines):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(cell if cell else "" for cell in line) + " |" for line in lines]
    return "\n".join(out)


def rate(tok_s):
    if not tok_s:
        return ""
    return f"{tok_s / 1e3:.1f}k tokens/s" if tok_s >= 1e3 else f"{tok_s:.0f} tokens/s"


def cell_time(rec):
    if not rec or "median_us" not in rec:
        return ""
    return fmt_time(rec["median_us"]) + (" (scaled)" if rec.get("extrapolated_from_T") else "")


def context(results, path):
    date = time.strftime("%Y-%m-%d", time.gmtime(os.path.getmtime(path)))
    host = results.get("host") or {}
    load = results.get("load_average_1min") or {}
    parts = []
    if load.get("run_start") and load.get("run_end"):
        parts.append(f"{float(load['run_start'][0]):.2f} at the start, {float(load['run_end'][0]):.2f} at the end")
    if load.get("range_over_parts"):
        lo, hi = load["range_over_parts"]
        parts.append(f"{lo:.2f} to {hi:.2f} over the parts")
    quick = (results.get("mlxkern_run") or {}).get("quick")
    return (f"Measured {date} on {host_text(host)}; 1-minute load {'; '.join(parts) or 'unknown'}"
            + ("; quick mode (short run)" if quick else "") + ".")


def kernel_table(results):
    rows = results.get("rows") or []
    if not rows:
        return None
    llama = any("llama_cpp" in r for r in rows)
    head = ["case", "unit", "mlxkern", "MLX CPU (best)", "mlxkern vs MLX"]
    if llama:
        head += ["llama.cpp", "llama.cpp / mlxkern"]
    lines = []
    for r in rows:
        k = r["mlxkern"]
        best = r.get(r.get("best_peer", ""), None)
        line = [r["label"], r["unit"], f"{cell_time(k)}, {rate(k.get('tokens_per_s'))}".rstrip(", "),
                cell_time(best), f"{r['speedup_vs_best_peer']:.1f}×" if "speedup_vs_best_peer" in r else ""]
        if llama:
            line += [cell_time(r.get("llama_cpp")),
                     f"{r['speedup_vs_llama_cpp']:.2f}×" if "speedup_vs_llama_cpp" in r else ""]
        lines.append(line)
    return md_table(head, lines)


def engine_table(results):
    engine = results.get("engine_layer") or {}
    records = engine.get("records") or []
    if not records:
        return None
    by = {(r["case"], r["impl"]): r for r in records}
    names = (("engine_zero_copy", "(a) engine layer: MLX ops + mlxkern, zero-copy exchange"),
             ("engine_host_copy", "(b) the same, kernels' inputs and outputs through host memory"),
             ("mlx_lm_module", "(c) mlx-lm's module (Python)"),
             ("dense_alone", "(a)'s MLX ops alone"), ("kernels_alone", "(a)'s mlxkern kernels alone"))
    head = ["", "decode step", "512-token prefill", "evals / step"]
    lines = []
    for impl, text in names:
        d, p = by.get(("decode", impl)), by.get(("prefill", impl))
        if d is None and p is None:
            continue
        lines.append([text, cell_time(d), cell_time(p), str((d or p).get("evals_per_step", ""))])
    ratios = {row["case"]: row["x_sum_of_parts"] for row in engine.get("rows", [])}
    if ratios:
        lines.append(["(a) / sum of its parts", f"{ratios['decode']:.2f}×" if "decode" in ratios else "",
                      f"{ratios['prefill']:.2f}×" if "prefill" in ratios else "", ""])
    return md_table(head, lines)


def grad_table(results):
    grad = results.get("gradients") or {}
    rows = grad.get("rows") or []
    if not rows:
        return None
    head = ["T", "mlxkern forward / backward", "mlx-lm ops fwd + bwd (its bwd)", "mx.fast fwd + bwd (its bwd)",
            "mlxkern's backward against the best MLX path"]
    lines = []
    for r in rows:
        k = r["mlxkern"]

        def peer(impl):
            p = r.get(impl, {})
            if "fwd_bwd_us" in p:
                return f"{fmt_time(p['fwd_bwd_us'])} ({fmt_time(p['bwd_us'])})"
            return "not run"

        if "bwd_speedup" in r:
            ratio = f"{r['bwd_speedup']:.1f}×"
        elif "bwd_speedup_lower_bound" in r:
            ratio = f"≥ {r['bwd_speedup_lower_bound']:.0f}× (bound)"
        else:
            ratio = ""
        lines.append([str(r["T"]), f"{fmt_time(k['fwd_us'])} / {fmt_time(k['bwd_us'])}",
                      peer("mlx_lm_ops"), peer("mlx_fast"), ratio])
    return md_table(head, lines)


def chunked_grad_table(results):
    native = results.get("gradients_chunked") or {}
    rows = native.get("rows") or []
    if not rows:
        return None
    head = ["T", "chunked fwd", "chunked bwd", "chunked fwd + bwd", "exact fwd + bwd", "bnb fwd", "bnb fwd + bwd",
            "bnb / chunked", "chunked fwd GFLOP/s (share of the FMA peak)"]
    lines = []
    for r in rows:
        c, e, b = r["chunked"], r.get("exact", {}), r.get("bnb_cpu", {})
        share = f" ({r['fma_share']:.0%})" if "fma_share" in r else ""
        lines.append([str(r["T"]), fmt_time(c["fwd_us"]), fmt_time(c["bwd_us"]), fmt_time(c["fwd_bwd_us"]),
                      fmt_time(e.get("fwd_bwd_us")) if e else "", fmt_time(b.get("fwd_us")) if b else "",
                      fmt_time(b.get("fwd_bwd_us")) if b else "", f"{r['speedup']:.2f}×" if "speedup" in r else "",
                      f"{c['fwd_gflops']:.0f}{share}"])
    peak = native.get("fma_peak")
    table = md_table(head, lines)
    if peak:
        table += (f"\n\nFloat32 multiply-add peak in the same run: {peak['gflops']:.0f} GFLOP/s"
                  f" ({peak.get('isa')}, {peak.get('threads')} threads, benches/fma_peak.cpp).")
    return table


def python_table(results):
    """results.json's "python" (scripts/python/bench.py): mlx-lm with and without the patch."""
    py = results.get("python")
    if not py:
        return ""
    m = py.get("machine", {})
    lines = [[name, f"{r['prefill_tok_s']:.1f}", f"{r['generate_tok_s']:.1f}"]
             for name, r in py["rows"].items()]
    lines += [[f"one layer's update alone, T = {T} (ms a call)", f"mlx-lm {r['mlx-lm']:.2f}",
               f"mlxkern {r['mlxkern']:.2f} ({r['mlx-lm'] / r['mlxkern']:.1f}×)"]
              for T, r in py.get("update_alone_ms", {}).items()]
    head = [f"{py['dtype']} on {m.get('device', '?')}, {py['prompt']}-token prompt, "
            f"{py['generated']} generated, {py['repeats']} repeat(s)",
            "prefill tok/s", "generate tok/s"]
    return md_table(head, lines)


def cpu(path):
    with open(path) as f:
        results = json.load(f)
    print(context(results, path))
    for title, table in (("Kernels, one layer (medians)", kernel_table(results)),
                         ("The whole layer (medians per step)", engine_table(results)),
                         ("Gradients (medians per call)", grad_table(results)),
                         ("Chunked forms and gradients (medians per call)", chunked_grad_table(results)),
                         ("mlx-lm in Python, with and without mlxkern.mlx_lm.patch()", python_table(results))):
        if table:
            print(f"\n**{title}**\n\n{table}")


def cuda(paths):
    rows = []
    for path in paths:
        if not os.path.exists(path) and path != paths[0]:  # a peer that did not run (fla)
            continue
        with open(path) as f:  # timing rows only (the grad group's memory lines have no "impl")
            rows += [r for r in (json.loads(line) for line in f if line.strip()) if "impl" in r]
    date = time.strftime("%Y-%m-%d", time.gmtime(os.path.getmtime(paths[0])))
    print(f"`make bench-cuda` rows of {date} (µs a layer; × is the row's time over MLX's floor op on the"
          " same data in the same mode).")
    for group in dict.fromkeys(r["group"] for r in rows):
        lines = [[r["case"], r["impl"], f"{r['us_per_layer']:.1f}",
                  f"{r['vs_floor']:.2f}×" if r.get("vs_floor") else ""] for r in rows if r["group"] == group]
        print(f"\n**{group}**\n\n{md_table(['case', 'implementation', 'µs a layer', 'vs floor'], lines)}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    if sys.argv[1].endswith(".jsonl"):
        cuda(sys.argv[1:])
    else:
        cpu(sys.argv[1])


if __name__ == "__main__":
    main()
