"""Oracle tests of mlxk_gated_rms_norm, Qwen's gated RMSNorm (docs/DESIGN.md §3, §4).

The library computes, per row of width D,
`out = T(silu_f32(gate) · f32(T(weight · T(x · rsqrt(mean(x²) + eps)))))`.

Oracle 1: mlx-lm 0.32.2's `Qwen3NextRMSNormGated` (the class Qwen3.5 uses as RMSNormGated) on
          MLX CPU, its weight cast to the input dtype: `mx.fast.rms_norm(x, weight, eps)` then
          `precise_swiglu` (float32 SiLU of the gate, float32 product, cast to x's dtype).
          MLX's CPU reduction sums the squares in another order (a sequential chain), so its
          inv differs by a few f32 ulps and the normalized n = T(x · inv) can land on the other
          side of a rounding boundary: n is checked within 1 bf16 ulp (against
          `mx.fast.rms_norm(x, None, eps)`). What follows n is the same formula on both sides
          (checked bit for bit: mlx-lm's output is emulate.gated_norm_tail of MLX's n), so the
          outputs are equal wherever n is; elsewhere the two products after n (T(w · n), then
          T(silu · x')) can turn one n step into 2 ulps of the output for a weight or gate
          whose significand exceeds 1. Exact fractions are reported.
Oracle 3: emulate.gated_rms_norm, the Metal text's order in float32 numpy: bit for bit.

Inputs are fresh random values every run (the seed is printed when a test fails; set
MLXK_ORACLE_SEED to replay).
"""

import unittest
import zlib

import numpy as np

import emulate  # noqa: E402
import mlxk  # noqa: E402
from test_gated_delta import MX_DTYPE, SEED, SeededTestCase  # noqa: E402  (registers mlx_lm)
from compare import Stats, bf16_ulps, ulp  # noqa: E402
from shapes import NormRows as Case  # noqa: E402

import mlx.core as mx  # noqa: E402
import mlx_lm.models.qwen3_next as qwen3_next  # noqa: E402

# Qwen3.5's rms_norm_eps.
EPS = 1e-6


CASES = [
    # Qwen3.5's use: out [B, S, Hv, Dv = 128] gated by z.
    Case((2, 64, 32), 128),
    # The widths (THREADS 32, 32, 64, 256).
    Case((512,), 64),
    Case((64, 8), 256),
    Case((300,), 1000),
    # Multi-group second butterfly at its widest, and more than one pass (THREADS = 1024).
    Case((6,), 4096),
    Case((5,), 5000),
    Case((3,), 10000),
    # Narrow widths: threads past the width add +0.
    Case((40,), 1),
    Case((3, 17), 7),
    Case((50,), 33),
    # float16 and float32 models; gates of another dtype than x.
    Case((2, 16, 32), 128, "float16"),
    Case((64,), 1000, "float16"),
    Case((2, 16, 32), 128, "float32"),
    Case((64,), 1000, "float32"),
    # float32 outputs show every bit of inv: the reduction order of the wide launches.
    Case((6,), 4096, "float32"),
    Case((5,), 5000, "float32"),
    Case((4,), 10000, "float32"),
    Case((3,), 10000, "float16"),
    Case((40,), 33, "float32"),
    Case((128,), 256, "bfloat16", "float32"),
    Case((64,), 1000, "float32", "bfloat16"),
    Case((96,), 64, "float16", "bfloat16"),
]

MLX_LM_CASES = [c for c in CASES if c.D in (64, 128, 256, 1000, 4096, 5000)]


def case_rng(test, index):
    return np.random.default_rng([SEED, zlib.crc32(test.encode()), index])


def make_inputs(case, rng):
    """(x, gate, weight) float32 values of their dtypes: rows of spread 0.01 to 100 with
    large-magnitude spikes and zeros; gates reaching the saturated SiLU (±20 to ±100);
    weights around 1 with a few large, negative and zero ones."""
    shape = case.lead + (case.D,)
    rows = int(np.prod(case.lead))
    x = rng.standard_normal(shape).astype(np.float32)
    x *= rng.choice([0.01, 0.3, 1.0, 4.0, 100.0], size=case.lead + (1,)).astype(np.float32)
    flat = x.reshape(-1)
    n = max(1, flat.size // 200)
    flat[rng.integers(flat.size, size=n)] = rng.choice([-1.0, 1.0], n) * rng.uniform(50, 1000, n)
    flat[rng.integers(flat.size, size=n)] = 0.0
    gate = (3.0 * rng.standard_normal(shape)).astype(np.float32)
    g = gate.reshape(-1)
    g[rng.integers(g.size, size=n)] = rng.choice([-1.0, 1.0], n) * rng.uniform(20, 100, n)
    g[rng.integers(g.size, size=n)] = 0.0
    weight = rng.normal(1.0, 0.5, case.D).astype(np.float32)
    m = max(1, case.D // 20)
    weight[rng.integers(case.D, size=m)] = rng.uniform(-8.0, 8.0, m)
    weight[rng.integers(case.D, size=m)] = 0.0
    assert rows > 0
    return (mlxk.round_to(x, case.dtype), mlxk.round_to(gate, case.gate),
            mlxk.round_to(weight, case.dtype))


def library(case, x, gate, weight, eps):
    hs = [mlxk.array(x, case.dtype), mlxk.array(gate, case.gate), mlxk.array(weight, case.dtype)]
    out = mlxk.gated_rms_norm(*hs, eps)
    try:
        assert mlxk.dtype_name(out.dtype) == case.dtype, mlxk.dtype_name(out.dtype)
        assert out.shape == x.shape, out.shape
        return out.read_bits()
    finally:
        mlxk.free(out, *hs)


def mlx_lm_norm(case, x, gate, weight, eps, compiled=False):
    """mlx-lm's Qwen3NextRMSNormGated(x, gate) with the weight cast to x's dtype (storage)."""
    module = qwen3_next.Qwen3NextRMSNormGated(case.D, eps=eps)
    module.weight = mlxk.to_mx(mlxk.to_storage(weight, case.dtype), case.dtype)
    xm = mlxk.to_mx(mlxk.to_storage(x, case.dtype), case.dtype)
    gm = mlxk.to_mx(mlxk.to_storage(gate, case.gate), case.gate)
    if compiled:
        out = module(xm, gm)
        mx.eval(out)
    else:
        mx.disable_compile()
        try:
            out = module(xm, gm)
            mx.eval(out)
        finally:
            mx.enable_compile()
    assert out.dtype == MX_DTYPE[case.dtype], out.dtype
    return np.ascontiguousarray(mlxk.from_mx(out)[0])


class GatedNorm(SeededTestCase):

    def test_bit_exact_vs_emulation(self):
        """Oracle 3: every element bit for bit (eps 1e-6, and 1e-5 / 0 on some cases)."""
        counted = {}
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                rng = case_rng("emulation", index)
                x, gate, weight = make_inputs(case, rng)
                for eps in (EPS, [1e-5, 0.0][index % 2]):
                    got = library(case, x, gate, weight, eps)
                    want = mlxk.to_storage(
                        emulate.gated_rms_norm(x, gate, weight, eps, case.dtype), case.dtype)
                    self.assert_same_bits(case, f"eps {eps:g}", got, want)
                    counted[case.dtype] = counted.get(case.dtype, 0) + got.size
        print("\n  gated norm bit-identical to the Metal-order emulation: " + ", ".join(
            f"{d} {n} values" for d, n in counted.items()))

    def test_emulation_threads(self):
        """The launch the emulation assumes: THREADS = min(1024, ceil(D/128)·32)."""
        for width, threads in ((1, 32), (64, 32), (128, 32), (129, 64), (256, 64), (1000, 256),
                               (4096, 1024), (5000, 1024), (10000, 1024)):
            self.assertEqual(emulate.gated_norm_threads(width), threads, width)

    def test_vs_mlx_lm(self):
        """Oracle 1: n = T(x · inv) within 1 bf16 ulp of MLX's rms_norm; mlx-lm's output is the
        same tail on its n; the outputs agree wherever n does and elsewhere within one n step's
        propagation; exact fractions reported."""
        stats = Stats()
        lines = []
        for index, case in enumerate(MLX_LM_CASES):
            with self.subTest(case=str(case)):
                dt = case.dtype
                x, gate, weight = make_inputs(case, case_rng("mlx_lm", index))
                got = library(case, x, gate, weight, EPS)
                ref = mlx_lm_norm(case, x, gate, weight, EPS)

                n_got = emulate.rms_normalize(x, EPS, dt)  # the library's n (Metal order)
                xm = mlxk.to_mx(mlxk.to_storage(x, dt), dt)
                n_ref = mlxk.storage_to_f32(mlxk.from_mx(mx.fast.rms_norm(xm, None, EPS))[0], dt)
                n_stat = stats.add(("normalized T(x*inv)", dt), mlxk.to_storage(n_got, dt),
                                   mlxk.to_storage(n_ref, dt), dt)
                far = bf16_ulps(mlxk.to_storage(n_got, dt), mlxk.to_storage(n_ref, dt), dt)
                self.assertLessEqual(float(far.max()), 1.0, self.msg(
                    case, f"normalized: {np.sum(far > 1)} values beyond 1 bf16 ulp of MLX's "
                          f"rms_norm, worst {far.max():.3g}"))

                for name, out, n in (("library", got, n_got), ("mlx-lm", ref, n_ref)):
                    tail = mlxk.to_storage(emulate.gated_norm_tail(n, gate, weight, dt), dt)
                    self.assertTrue(np.array_equal(mlxk.bits(tail), mlxk.bits(out)), self.msg(
                        case, f"{name}'s output is not the gated tail of its normalized values"))

                n_same = mlxk.bits(mlxk.to_storage(n_got, dt)) == mlxk.bits(
                    mlxk.to_storage(n_ref, dt))
                out_same = mlxk.bits(got) == mlxk.bits(ref)
                self.assertTrue(np.all(out_same[n_same]), self.msg(
                    case, "outputs differ where the normalized values agree"))
                # One n step through T(w · n), then T(f32(s · x')).
                s = np.abs(gate * emulate.sigmoid(gate, "float32")).astype(np.float64)
                xs = [mlxk.round_to(weight * n, dt) for n in (n_got, n_ref)]
                big = np.maximum(np.abs(xs[0]), np.abs(xs[1]))
                o = np.maximum(np.abs(mlxk.storage_to_f32(got, dt)),
                               np.abs(mlxk.storage_to_f32(ref, dt)))
                allowed = (s * (np.abs(weight) * np.abs(n_got.astype(np.float64) - n_ref)
                                + ulp(big, dt)) + s * big * 2.0 ** -22 + ulp(o, dt))
                d = np.abs(mlxk.storage_to_f32(got, dt).astype(np.float64)
                           - mlxk.storage_to_f32(ref, dt))
                self.assertTrue(np.all(d <= allowed), self.msg(
                    case, f"{np.sum(d > allowed)} outputs beyond one normalized step"))

                same, total, ulps = stats.add((f"out (gate {case.gate})", dt), got, ref, dt)
                lines.append(f"    {str(case):42s} n exact {n_stat[0]}/{n_stat[1]}"
                             + (f" ({n_stat[2]} ulp)" if n_stat[2] else "")
                             + f", out exact {same}/{total} ({100.0 * same / total:.4f}%)"
                             + (f" ({ulps} ulp)" if ulps else ""))
        print("\n  gated norm vs mlx-lm Qwen3NextRMSNormGated per case:")
        print("\n".join(lines))
        stats.report("gated norm vs mlx-lm Qwen3NextRMSNormGated (MLX CPU), totals", SEED)

    def test_float32_vs_float64(self):
        """Where the float32 differences against mlx-lm come from: both normalizations against
        float64. The kernel's tree (4-column thread sums, butterflies) is the more accurate
        one; the library's n stays within a few float32 ulps (bound: ~20 roundings on the
        sum's path at D = 1000, halved by the square root, plus five single roundings)."""
        worst = []
        for index, case in enumerate([Case((64,), 1000, "float32"), Case((512,), 128, "float32")]):
            x, gate, weight = make_inputs(case, case_rng("float64", index))
            x64 = x.astype(np.float64)
            mean = np.mean(x64 * x64, axis=-1, keepdims=True)
            exact = x64 / np.sqrt(mean + float(np.float32(EPS)))
            unit = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
            mine = emulate.rms_normalize(x, EPS, "float32")
            ones = np.ones(case.D, dtype=np.float32)
            # exp(128) overflows, so sigmoid(128) = 1 and silu(128) = 128 exactly: out = 128 · n.
            big_gate = np.full_like(x, 128.0)
            lib = library(case, x, big_gate, ones, EPS) / np.float32(128.0)
            self.assertTrue(np.array_equal(mlxk.bits(lib), mlxk.bits(mine)), self.msg(
                case, "library's n (through a gate of 128) differs from the emulation's"))
            theirs = np.array(mx.fast.rms_norm(mx.array(x), None, EPS))
            m = float(np.max(np.abs(mine - exact) / unit))
            t = float(np.max(np.abs(theirs - exact) / unit))
            self.assertLessEqual(m, 16.0, self.msg(case, f"{m:.3g} ulp from float64"))
            worst.append(f"D {case.D}: library max {m:.3g} ulp, MLX rms_norm max {t:.3g} ulp")
        print("\n  float32 gated-norm normalization vs float64: " + "; ".join(worst))

    def test_mlx_lm_compiled_equals_uncompiled(self):
        """precise_swiglu (mx.compile, shapeless) gives the same bits compiled and uncompiled
        on the Qwen3.5 case; the comparison above runs uncompiled (no C++ build on a cold
        cache)."""
        case = CASES[0]
        x, gate, weight = make_inputs(case, case_rng("compiled", 0))
        a = mlx_lm_norm(case, x, gate, weight, EPS, compiled=True)
        b = mlx_lm_norm(case, x, gate, weight, EPS)
        self.assertTrue(np.array_equal(mlxk.bits(a), mlxk.bits(b)),
                        self.msg(case, "Qwen3NextRMSNormGated differs when compiled"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
