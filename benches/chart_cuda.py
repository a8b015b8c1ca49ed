"""Chart of `make bench-cuda`: per-layer decode time by batch for every implementation (log
scale), and each mlxkern row's time relative to MLX's floor op on the same data, serial and
pipelined.
    chart_cuda.py OUT.png bench-cuda.jsonl [fla.jsonl]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = []
for path in sys.argv[2:]:
    try:
        # Timing rows only (the grad group's memory lines have no "impl").
        rows += [r for r in (json.loads(line) for line in open(path) if line.strip())
                 if "impl" in r]
    except FileNotFoundError:
        pass

fig, (left, right) = plt.subplots(1, 2, figsize=(14, 7))
# Whole layer steps only (the "build" rows time the host's node building alone).
decode = [r for r in rows if r["group"] == "decode" and "build" not in r["impl"]]
for impl in sorted({r["impl"] for r in decode}):
    pts = sorted((int(r["case"].split("B=")[1].split()[0]), r["us_per_layer"])
                 for r in decode if r["impl"] == impl)
    left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
left.set_xscale("log", base=2)
left.set_yscale("log")
left.set_xlabel("batch B (decode, T = 1, 30 layers per eval)")
left.set_ylabel("µs per layer-step")
left.set_title("Gated DeltaNet decode on the GPU (Qwen3.5-35B-A3B dims)")
left.legend()
left.grid(True, which="both", alpha=0.3)

# Serial rows (one eval per graph) in green, pipelined rows (one graph in flight while the next
# is built, each against the pipelined floor) in blue.
ours = [r for r in rows if r["impl"] in ("mlxkern", "mlxkern, pipelined") and r["vs_floor"] > 0]
right.barh([r["case"] + (", pipelined" if "pipelined" in r["impl"] else "") for r in ours],
           [1 / r["vs_floor"] for r in ours],
           color=["tab:blue" if "pipelined" in r["impl"] else "tab:green" for r in ours])
right.axvline(1.0, color="k", lw=0.8)
right.axvline(0.9, color="tab:gray", lw=0.8, ls="--")
right.axvline(0.7, color="tab:gray", lw=0.8, ls=":")
for y, r in enumerate(ours):
    right.text(1 / r["vs_floor"] + 0.01, y, f"{100 / r['vs_floor']:.0f} %", va="center", fontsize=8)
right.set_xlabel("MLX floor-op time / mlxkern time (1 = MLX's own op; lines at 0.9, 0.7)")
right.set_title("mlxkern against MLX's floor on the same bytes")
right.invert_yaxis()
fig.tight_layout()
fig.savefig(sys.argv[1], dpi=110)
print(f"chart: {sys.argv[1]}")
