#!/usr/bin/env python3
"""Counts the floating-point instructions in the innermost loops of the CPU kernels of an
aarch64 build (docs/arm64.md, "Expected speed"): disassembles the functions whose demangled
names contain the given parts, finds each innermost loop (a backward branch whose range holds
no other), and prints its vector and scalar multiply, add and fused multiply-add counts and its
loads and stores.

    scripts/arm64/loop-counts.py BINARY NAME_PART...

BINARY is an aarch64 ELF with symbols (target/arm64/aarch64-unknown-linux-gnu/debug/deps/
mlxkern_arm64_kernels-*, which `make test-arm64` builds). Needs aarch64-linux-gnu-objdump."""

import re
import subprocess
import sys

BRANCHES = ("b", "cbz", "cbnz", "tbz", "tbnz")


def functions(binary):
    out = subprocess.run(
        ["aarch64-linux-gnu-objdump", "-d", "-C", "--no-show-raw-insn", binary],
        check=True, capture_output=True, text=True).stdout
    name, body = None, []
    for line in out.splitlines():
        m = re.match(r"^([0-9a-f]+) <(.*)>:$", line)
        if m:
            if name:
                yield name, body
            name, body = m.group(2), []
            continue
        m = re.match(r"^\s+([0-9a-f]+):\s+(\S+)\s*(.*)$", line)
        if m and name:
            body.append((int(m.group(1), 16), m.group(2), m.group(3)))
    if name:
        yield name, body


def kind(mnemonic, operands):
    vector = ".4s" in operands or ".2s" in operands
    base = mnemonic.split(".")[0]
    if base in ("fmla", "fmadd", "fmls", "fmsub"):
        return "fma" + (" v" if vector else " s")
    if base in ("fmul", "fadd", "fsub", "faddp", "fdiv"):
        return base + (" v" if vector else " s")
    if base.startswith("ld") or base.startswith("st"):
        return base
    return None


def loops(body):
    found = []
    for i, (addr, mnem, ops) in enumerate(body):
        if mnem.split(".")[0] in BRANCHES:
            m = re.search(r"\b([0-9a-f]+) <", ops)
            if m and int(m.group(1), 16) <= addr:
                found.append((int(m.group(1), 16), addr))
    inner = [l for l in found
             if not any(o != l and l[0] <= o[0] and o[1] <= l[1] for o in found)]
    return sorted(set(inner))


def main():
    binary, parts = sys.argv[1], sys.argv[2:]
    for name, body in functions(binary):
        if not any(p in name for p in parts):
            continue
        for start, end in loops(body):
            counts = {}
            size = 0
            for addr, mnem, ops in body:
                if start <= addr <= end:
                    size += 1
                    k = kind(mnem, ops)
                    if k:
                        counts[k] = counts.get(k, 0) + 1
            if not any(k.split()[0] in ("fma", "fmul", "fadd", "faddp") for k in counts):
                continue
            desc = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
            print(f"{name} [{start:#x}, {end:#x}] {size} instructions: {desc}")


if __name__ == "__main__":
    main()
