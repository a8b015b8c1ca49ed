"""Bit-level comparison helpers shared by the oracle tests: ulp distances in a dtype and in
bfloat16, and the exact-fraction tables the tests print (they go into release notes).

Arrays are in their storage form (mlxk.Array.read_bits(), mlxk.from_mx()): bfloat16 as uint16
bit patterns, float16 and float32 as themselves.
"""

import numpy as np

import mlxk

DTYPE_BITS = {"bfloat16": 16, "float16": 16, "float32": 32}


def ordered(storage, nbits):
    """Storage -> integers in the order of the values, so a difference counts ulps (+0 and -0
    both map to 0)."""
    b = mlxk.bits(storage).astype(np.int64)
    sign = np.int64(1) << (nbits - 1)
    return np.where(b & sign, -(b & (sign - 1)), b)


def ulps_apart(a, b, dtype):
    """How many steps of `dtype` lie between two storage arrays, element by element."""
    n = DTYPE_BITS[dtype]
    return np.abs(ordered(a, n) - ordered(b, n))


def ulp(values, dtype):
    """The spacing of `dtype` at |values| (float32 values), as float64."""
    x = np.abs(np.asarray(values, dtype=np.float32))
    if dtype == "float32":
        return np.spacing(x).astype(np.float64)
    if dtype == "bfloat16":
        return np.spacing(x).astype(np.float64) * 65536.0
    if dtype == "float16":
        return np.spacing(np.minimum(x, 65504).astype(np.float16)).astype(np.float64)
    raise ValueError(dtype)


def bf16_ulps(got, ref, dtype):
    """|got − ref| in bfloat16 ulps at the larger magnitude (the issue's measure, also for
    float16 and float32 results)."""
    a = mlxk.storage_to_f32(got, dtype).astype(np.float64)
    b = mlxk.storage_to_f32(ref, dtype).astype(np.float64)
    unit = ulp(np.maximum(np.abs(a), np.abs(b)), "bfloat16")
    with np.errstate(invalid="ignore"):
        return np.where(a == b, 0.0, np.abs(a - b) / unit)


def propagated(n_got, n_ref, weight, out_got, out_ref, dtype):
    """The most that out = T(weight · n) can move when n moves from n_ref to n_got: each
    rounding of the product errs by at most half an ulp, so
    |T(w·n1) − T(w·n2)| <= |w|·|n1 − n2| + ulp(out) (float64, element by element)."""
    n1 = mlxk.storage_to_f32(n_got, dtype).astype(np.float64)
    n2 = mlxk.storage_to_f32(n_ref, dtype).astype(np.float64)
    o = np.maximum(np.abs(mlxk.storage_to_f32(out_got, dtype)),
                   np.abs(mlxk.storage_to_f32(out_ref, dtype)))
    return np.abs(np.asarray(weight, dtype=np.float64)) * np.abs(n1 - n2) + ulp(o, dtype)


class Stats:
    """Exact fractions and the largest differences per (what, dtype), and per-case lines."""

    def __init__(self):
        self.rows = {}
        self.lines = []

    def add(self, key, got, ref, dtype):
        """Counts one comparison; returns (exact, total, max ulps of dtype)."""
        st = self.rows.setdefault(key, dict(same=0, n=0, within=0, ulps=0, bf16=0.0, abs=0.0))
        got, ref = np.asarray(got).reshape(-1), np.asarray(ref).reshape(-1)
        same = int(np.sum(mlxk.bits(got) == mlxk.bits(ref)))
        far = bf16_ulps(got, ref, dtype)
        ulps = int(ulps_apart(got, ref, dtype).max()) if got.size else 0
        st["same"] += same
        st["n"] += got.size
        st["within"] += int(np.sum(far <= 1.0))
        st["ulps"] = max(st["ulps"], ulps)
        st["bf16"] = max(st["bf16"], float(far.max()) if got.size else 0.0)
        diff = np.abs(mlxk.storage_to_f32(got, dtype) - mlxk.storage_to_f32(ref, dtype))
        st["abs"] = max(st["abs"], float(diff.max()) if got.size else 0.0)
        return same, got.size, ulps

    def report(self, title, seed):
        print(f"\n  {title} (seed {seed}):")
        width = max((len(what) for what, _ in self.rows), default=10)
        for (what, dtype), st in sorted(self.rows.items()):
            n = max(st["n"], 1)
            print(f"    {what:{width}s} {dtype:9s} exact {st['same']}/{st['n']} "
                  f"({100.0 * st['same'] / n:.4f}%), "
                  f"<= 1 bf16 ulp {100.0 * st['within'] / n:.4f}%, "
                  f"max {st['ulps']} ulp of {dtype} ({st['bf16']:.3g} bf16 ulp), "
                  f"max |d| {st['abs']:.3g}")
