"""Reads an Nsight Compute text report (scripts/cuda/ncu.sh's profile_many) and prints one line
per profiled launch (kernel, grid, block, duration, SM and DRAM throughput, registers, achieved
occupancy), then the durations summed per call and the FLOP rate that gives against the H100 /
H200 floors (dense datasheet figures: float32 FMA 67, tf32 495, bf16 989 TFLOP/s).

The work of one call is the chunked form's count at Qwen3.5-35B-A3B dims (Hv 32, Dk = Dv = 128,
C = 64, B = 1): per chunk and value head five C x C x d products (K Kᵀ, W, U, Q Kᵀ, P U: 2C²d FLOP
each), three C x d x d ones (W H, Kdᵀ U, Q H: 2Cd² each) and the inverse (C³/3): 11.6 MFLOP, or
180 kFLOP per token and value head, forward; the backward about twice that. Usage: ncu_flops.py REPORT.txt [T] [fwd|fwdbwd]
"""
import re
import sys

FLOORS = {"fp32 FMA": 67e12, "tf32 TC": 495e12, "bf16 TC": 989e12}


def launches(text):
    """(name, grid, block, {metric: value}) per launch, in order."""
    out = []
    head = re.compile(r"^\s+(\S+)\s+\((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
    cur = None
    for line in text.splitlines():
        m = head.match(line)
        if m:
            cur = (m.group(1), m.group(2, 3, 4), m.group(5, 6, 7), {})
            out.append(cur)
            continue
        if cur is None:
            continue
        parts = line.split()
        if len(parts) >= 3:
            for key in ("Duration", "Compute (SM) Throughput", "DRAM Throughput",
                        "Registers Per Thread", "Achieved Occupancy"):
                if line.strip().startswith(key) and key not in cur[3]:
                    unit, value = parts[-2], parts[-1].replace(",", "")
                    try:
                        v = float(value)
                    except ValueError:
                        continue
                    if key == "Duration":
                        v *= {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
                              "s": 1e6, "second": 1e6}.get(unit, 1.0)
                    cur[3][key] = v
    return out


def main():
    text = open(sys.argv[1], errors="replace").read()
    t = int(sys.argv[2]) if len(sys.argv) > 2 else 4096
    kind = sys.argv[3] if len(sys.argv) > 3 else "fwd"
    rows = launches(text)
    if not rows:
        print("ncu_flops: no profiled launch in the report (ncu missing, or no kernel matched)")
        return
    names = []
    for name, grid, block, m in rows:
        short = re.sub(r"^custom_kernel_", "", name)[:60]
        names.append(short)
        print(f"{short:<60} grid {'x'.join(grid):>12} block {'x'.join(block):>9} "
              f"{m.get('Duration', 0):9.1f} us  SM {m.get('Compute (SM) Throughput', 0):5.1f} %  "
              f"DRAM {m.get('DRAM Throughput', 0):5.1f} %  regs {m.get('Registers Per Thread', 0):4.0f}  "
              f"occ {m.get('Achieved Occupancy', 0):5.1f} %")
    # One call: the launches up to the first repeat of the first kernel's name.
    per_call = len(names)
    for i in range(1, len(names)):
        if names[i] == names[0]:
            per_call = i
            break
    total_us = sum(m.get("Duration", 0) for _, _, _, m in rows[:per_call])
    flop = 180e3 * t * 32 * (3 if kind == "fwdbwd" else 1)
    print(f"one call: {per_call} launches, {total_us:.1f} us; {flop / 1e9:.1f} GFLOP "
          f"({kind}, T = {t}) -> {flop / (total_us * 1e-6) / 1e12:.2f} TFLOP/s")
    for floor, rate in FLOORS.items():
        print(f"  floor {floor}: {flop / rate * 1e6:8.1f} us; this call at "
              f"{flop / (total_us * 1e-6) / rate * 100:5.1f} % of it")


if __name__ == "__main__":
    main()
