"""Oracle tests of mlxk_silu_rms_heads, the Qwen3.5 head split (docs/DESIGN.md §3, §4).

The library computes, per (row, head), `q = T(q_scale · T(silu · rsqrt(mean(silu²) + eps)))`
(likewise k with k_scale) and `v = silu`, with silu = T(x · T(sigmoid(x))).

Oracle 1: MLX ops on the CPU, as mlx-lm 0.32.2 runs them:
          v bit for bit against `nn.silu` (x · sigmoid(x) in the model dtype);
          q and k against (a) `mx.fast.rms_norm(silu_q, q_scale, eps)` (the weight form, with
          random per-column scales) and (b) mlx-lm's own `normalize_qk`
          (`inv_scale² · rms_norm(q, None, rms_eps)`, `inv_scale · rms_norm(k, None, rms_eps)`),
          the library given q_scale = T(inv_scale²), k_scale = T(inv_scale), eps = rms_eps.
          MLX's CPU rms_norm sums the squares in another order (a sequential chain), so its inv
          differs by a few f32 ulps and the normalized value n = T(silu · inv) can land on the
          other side of a rounding boundary: n is checked within 1 bf16 ulp. The scale product
          T(scale · n) is the same formula on both sides (checked bit for bit on MLX's n; mlx-lm's
          scalar multiply after rounding is the weight form, checked too), so q and k are equal
          wherever n is, and elsewhere within what one n step can move T(scale · n): up to
          |scale|·ulp(n) + ulp(q), i.e. 2 ulps of q for a scale whose significand exceeds 1
          (k_scale = T(Dk^-1/2) = 1.414·2^-4 for Dk = 128). Exact fractions are reported.
Oracle 3: emulate.silu_rms_heads, the Metal text's order in float32 numpy: bit for bit.

Inputs are fresh random values every run (the seed is printed when a test fails; set
MLXK_ORACLE_SEED to replay).
"""

import unittest
import zlib

import numpy as np

import emulate  # noqa: E402
import mlxk  # noqa: E402
from compare import Stats, bf16_ulps, propagated  # noqa: E402
from shapes import HeadSplit as Case  # noqa: E402
from test_gated_delta import MX_DTYPE, SEED, SeededTestCase, gd  # noqa: E402  (registers mlx_lm)

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

# mlx-lm 0.32.2 (qwen3_5.py): normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6).
L2_EPS = 1e-6


CASES = [
    # Qwen3.5 (Hk 16, Hv 32, Dk = Dv = 128): decode and a prefill chunk.
    Case(1, 1, 16, 32, 128, 128),
    Case(2, 32, 16, 32, 128, 128),
    # Narrower heads: lanes past the width add +0.
    Case(3, 5, 2, 4, 64, 64),
    Case(2, 7, 3, 6, 96, 40),
    Case(2, 4, 1, 3, 40, 96),
    Case(3, 6, 2, 2, 7, 7),
    Case(1, 5, 2, 1, 1, 128),
    Case(2, 3, 1, 2, 127, 1),
    Case(1, 4, 2, 8, 33, 65),
    # float16 and float32 models.
    Case(1, 3, 16, 32, 128, 128, "float16"),
    Case(2, 5, 2, 6, 64, 96, "float16"),
    Case(2, 3, 1, 1, 7, 40, "float16"),
    Case(1, 3, 16, 32, 128, 128, "float32"),
    Case(2, 5, 2, 4, 96, 64, "float32"),
    Case(2, 2, 3, 3, 40, 7, "float32"),
]


def case_rng(test, index):
    return np.random.default_rng([SEED, zlib.crc32(test.encode()), index])


def make_x(case, rng):
    """The conv output [B, S, channels] as float32 values of the dtype: per head a random
    spread (0.05 to 60), large-magnitude values (±50 to ±1000, within float16), exact zeros,
    and one head of large negative values (its SiLU is near zero, so eps dominates)."""
    c = case
    x = rng.standard_normal((c.B, c.S, c.channels)).astype(np.float32)
    widths = [c.Dk] * (2 * c.Hk) + [c.Dv] * c.Hv
    start = 0
    for width in widths:
        x[..., start:start + width] *= rng.choice([0.05, 1.0, 3.0, 8.0, 60.0])
        start += width
    flat = x.reshape(-1)
    n = max(1, flat.size // 50)
    at = rng.integers(flat.size, size=n)
    flat[at] = rng.choice([-1.0, 1.0], size=n) * rng.uniform(50.0, 1000.0, size=n)
    flat[rng.integers(flat.size, size=max(1, flat.size // 100))] = 0.0
    if c.Hk > 1:  # q head 1 of the first row: all large negative
        x[0, 0, c.Dk:2 * c.Dk] = -rng.uniform(20.0, 80.0, size=c.Dk)
    return mlxk.round_to(x, c.dtype)


def mlx_lm_scales(case):
    """The scale vectors that reproduce mlx-lm's normalize_qk: T(inv_scale²), T(inv_scale),
    and its rms_eps."""
    inv_scale = case.Dk ** -0.5
    q_scale = mlxk.round_to(np.full(case.Dk, inv_scale ** 2, dtype=np.float32), case.dtype)
    k_scale = mlxk.round_to(np.full(case.Dk, inv_scale, dtype=np.float32), case.dtype)
    return q_scale, k_scale, L2_EPS * inv_scale ** 2, inv_scale


def library(case, x, q_scale, k_scale, eps):
    """mlxk_silu_rms_heads: (q, k, v) as storage arrays."""
    hs = [mlxk.array(a, case.dtype) for a in (x, q_scale, k_scale)]
    q, k, v = mlxk.silu_rms_heads(*hs, case.Hk, case.Hv, case.Dv, eps)
    try:
        for out, heads, width in ((q, case.Hk, case.Dk), (k, case.Hk, case.Dk),
                                  (v, case.Hv, case.Dv)):
            assert mlxk.dtype_name(out.dtype) == case.dtype, mlxk.dtype_name(out.dtype)
            assert out.shape == (case.B, case.S, heads, width), out.shape
        return q.read_bits(), k.read_bits(), v.read_bits()
    finally:
        mlxk.free(q, k, v, *hs)


def emulation(case, x, q_scale, k_scale, eps):
    q, k, v = emulate.silu_rms_heads(x, q_scale, k_scale, case.Hk, case.Hv, case.Dv, eps,
                                     case.dtype)
    return tuple(mlxk.to_storage(a, case.dtype) for a in (q, k, v))


def mx_silu_split(case, x, compiled=False):
    """mlx-lm's conv activation and split: nn.silu on the whole conv output (x · sigmoid(x)
    in the model dtype), then q | k | v reshaped to heads (mx arrays)."""
    c = case
    xm = mlxk.to_mx(mlxk.to_storage(x, c.dtype), c.dtype)
    if compiled:
        conv_out = nn.silu(xm)
    else:
        mx.disable_compile()
        try:
            conv_out = nn.silu(xm)
            mx.eval(conv_out)
        finally:
            mx.enable_compile()
    key_dim = c.Hk * c.Dk
    q, k, v = mx.split(conv_out, [key_dim, 2 * key_dim], -1)
    return (q.reshape(c.B, c.S, c.Hk, c.Dk), k.reshape(c.B, c.S, c.Hk, c.Dk),
            v.reshape(c.B, c.S, c.Hv, c.Dv))


def as_storage(a, dtype):
    """An mx array of `dtype` -> contiguous numpy storage (bfloat16 as uint16 bits)."""
    assert a.dtype == MX_DTYPE[dtype], (a.dtype, dtype)
    return np.ascontiguousarray(mlxk.from_mx(a)[0])


class HeadSplit(SeededTestCase):

    def test_emulation_transcendentals_are_mlx(self):
        """The emulation's exp, sigmoid and SiLU are MLX's CPU ones bit for bit: every bfloat16
        and float16 value, and random float32 values (with the rounding boundaries of exp's
        integer split)."""
        every = np.arange(1 << 16, dtype=np.uint16)
        for dtype, values, xm in (
            ("bfloat16", mlxk.bf16_bits_to_f32(every), mlxk.to_mx(every, "bfloat16")),
            ("float16", every.view(np.float16).astype(np.float32),
             mx.array(every.view(np.float16))),
        ):
            for name, mine, theirs in (("sigmoid", emulate.sigmoid(values, dtype), mx.sigmoid(xm)),
                                       ("silu", emulate.silu(values, dtype), xm * mx.sigmoid(xm))):
                theirs = np.array(theirs.astype(mx.float32))
                both_nan = np.isnan(mine) & np.isnan(theirs)
                bad = np.flatnonzero((mlxk.bits(mine) != mlxk.bits(theirs)) & ~both_nan)
                self.assertEqual(bad.size, 0, f"{dtype} {name}: {bad.size} differ, e.g. "
                                              f"x={values[bad[:3]]}")
        rng = case_rng("transcendentals", 0)
        x = np.concatenate([rng.uniform(-100, 100, 200_000), 4 * rng.standard_normal(100_000)])
        half = (np.arange(-130, 131) + 0.5) / 1.442695  # x · log2(e) near k + 1/2
        near = (half.astype(np.float32).view(np.int32)[:, None] + np.arange(-8, 9)).reshape(-1)
        x = np.concatenate([x.astype(np.float32), near.astype(np.int32).view(np.float32)])
        for name, mine, theirs in (("exp", emulate.exp_f32(x), mx.exp(mx.array(x))),
                                   ("sigmoid", emulate.sigmoid(x, "float32"),
                                    mx.sigmoid(mx.array(x)))):
            bad = np.flatnonzero(mlxk.bits(mine) != mlxk.bits(np.array(theirs)))
            self.assertEqual(bad.size, 0, f"float32 {name}: {bad.size} differ, e.g. "
                                          f"x={x[bad[:3]]} (MLXK_ORACLE_SEED={SEED})")

    def test_bit_exact_vs_emulation(self):
        """Oracle 3: q, k, v bit for bit, with random per-column scales and with mlx-lm's."""
        counted = {}
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                rng = case_rng("emulation", index)
                x = make_x(case, rng)
                scales = [
                    mlx_lm_scales(case)[:3],
                    (mlxk.round_to(rng.normal(0.5, 1.0, case.Dk), case.dtype),
                     mlxk.round_to(rng.normal(0.5, 1.0, case.Dk), case.dtype),
                     float(rng.choice([1e-6, 1e-5 / case.Dk]))),
                ]
                for q_scale, k_scale, eps in scales:
                    got = library(case, x, q_scale, k_scale, eps)
                    want = emulation(case, x, q_scale, k_scale, eps)
                    for name, g, w in zip("qkv", got, want):
                        self.assert_same_bits(case, f"{name} (eps {eps:g})", g, w)
                        counted[case.dtype] = counted.get(case.dtype, 0) + g.size
        print("\n  head split bit-identical to the Metal-order emulation: " + ", ".join(
            f"{d} {n} values" for d, n in counted.items()))

    def test_zero_head_with_zero_eps(self):
        """eps = 0 and a head of zeros: rsqrt(0) = inf and 0 · inf = NaN, as the Metal text
        computes it; the library and the emulation agree (NaN compared as a class)."""
        for index, case in enumerate([Case(2, 3, 2, 2, 64, 32), Case(1, 2, 1, 1, 7, 7, "float32")]):
            with self.subTest(case=str(case)):
                x = make_x(case, case_rng("zero_eps", index))
                x[1 % case.B, 0, :case.Dk] = 0.0  # a q head of zeros
                ones = np.ones(case.Dk, dtype=np.float32)
                got = library(case, x, ones, ones, 0.0)
                want = emulation(case, x, ones, ones, 0.0)
                for name, g, w in zip("qkv", got, want):
                    gf, wf = (mlxk.storage_to_f32(a, case.dtype) for a in (g, w))
                    self.assertTrue(np.array_equal(np.isnan(gf), np.isnan(wf)),
                                    self.msg(case, f"{name}: NaN positions differ"))
                    ok = ~np.isnan(gf)
                    self.assertTrue(np.array_equal(mlxk.bits(g)[ok], mlxk.bits(w)[ok]),
                                    self.msg(case, f"{name} differs"))
                self.assertTrue(np.isnan(mlxk.storage_to_f32(got[0], case.dtype)).any())

    def test_vs_mlx(self):
        """Oracle 1: v bit for bit against nn.silu; the normalized n = T(silu · inv) within 1
        bf16 ulp of MLX's rms_norm; q and k against (a) the rms_norm weight form and (b)
        mlx-lm's normalize_qk: equal where n is, within one n step's propagation elsewhere;
        every exact fraction reported."""
        stats = Stats()
        lines = []
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                rng = case_rng("mlx", index)
                x = make_x(case, rng)
                q_silu, k_silu, v_silu = mx_silu_split(case, x)
                q_scale, k_scale, rms_eps, inv_scale = mlx_lm_scales(case)
                line = []

                # The normalized values: the library with unit scales, MLX's rms_norm without
                # a weight. v against nn.silu.
                ones = np.ones(case.Dk, dtype=np.float32)
                n_q, n_k, v = library(case, x, ones, ones, rms_eps)
                self.check_exact(case, "v vs nn.silu", v, v_silu, stats)
                n_ref = {}
                for name, got, heads in (("q", n_q, q_silu), ("k", n_k, k_silu)):
                    ref = as_storage(mx.fast.rms_norm(heads, None, rms_eps), case.dtype)
                    n_ref[name] = ref
                    line.append(stats.add((f"{name} normalized T(silu*inv)", case.dtype), got,
                                          ref, case.dtype))
                    far = bf16_ulps(got, ref, case.dtype)
                    self.assertLessEqual(float(far.max()), 1.0, self.msg(
                        case, f"{name} normalized: {np.sum(far > 1)} values beyond 1 bf16 ulp "
                              f"of MLX's rms_norm, worst {far.max():.3g}"))

                # (b) mlx-lm's normalize_qk, as qwen3_5.py calls it.
                q_ref, k_ref = gd.normalize_qk(q_silu, k_silu, inv_scale=inv_scale, eps=L2_EPS)
                q, k, v = library(case, x, q_scale, k_scale, rms_eps)
                self.check_exact(case, "v vs nn.silu", v, v_silu)
                for name, got, ref, scale, n_got in (("q", q, q_ref, q_scale, n_q),
                                                     ("k", k, k_ref, k_scale, n_k)):
                    ref = as_storage(ref, case.dtype)
                    # mlx-lm's scalar multiply after rounding is the weight form.
                    weight = mlxk.to_mx(mlxk.to_storage(scale, case.dtype), case.dtype)
                    heads = q_silu if name == "q" else k_silu
                    weighted = as_storage(mx.fast.rms_norm(heads, weight, rms_eps), case.dtype)
                    self.assertTrue(np.array_equal(mlxk.bits(weighted), mlxk.bits(ref)),
                                    self.msg(case, f"{name}: normalize_qk is not the weight form"))
                    line.append(self.check_scaled(case, f"{name} vs normalize_qk", got, ref,
                                                  scale, n_got, n_ref[name], stats))

                # (a) the weight form with random per-column scales.
                for name, n_got in (("q", n_q), ("k", n_k)):
                    scale = mlxk.round_to(rng.normal(0.5, 1.0, case.Dk), case.dtype)
                    weight = mlxk.to_mx(mlxk.to_storage(scale, case.dtype), case.dtype)
                    heads = q_silu if name == "q" else k_silu
                    ref = as_storage(mx.fast.rms_norm(heads, weight, rms_eps), case.dtype)
                    pair = (scale, ones) if name == "q" else (ones, scale)
                    got = library(case, x, *pair, rms_eps)[0 if name == "q" else 1]
                    line.append(self.check_scaled(
                        case, f"{name} vs rms_norm(silu_{name}, {name}_scale)", got, ref, scale,
                        n_got, n_ref[name], stats))
                lines.append(f"    {str(case):38s} " + ", ".join(
                    f"{same}/{n}" + (f" ({ulps} ulp)" if ulps else "") for same, n, ulps in line))
        print("\n  head split vs MLX per case, exact (n_q, n_k | normalize_qk q, k | weight form "
              "q, k); v bit-identical to nn.silu in every case:")
        print("\n".join(lines))
        stats.report("head split vs MLX CPU ops (mlx-lm 0.32.2 composition), totals", SEED)

    def check_exact(self, case, what, got, ref, stats=None):
        ref = as_storage(ref, case.dtype)
        self.assertEqual(got.shape, ref.shape, what)
        if stats is not None:
            stats.add((what, case.dtype), got, ref, case.dtype)
        bad = np.flatnonzero(mlxk.bits(got).reshape(-1) != mlxk.bits(ref).reshape(-1))
        self.assertEqual(bad.size, 0, self.msg(case, f"{what}: {bad.size} values differ"))

    def check_scaled(self, case, what, got, ref, scale, n_got, n_ref, stats):
        """got = T(scale · n_got) from the library, ref = MLX's T(scale · n_ref): the product is
        the same formula on both sides, so they agree exactly where n does, and elsewhere move
        by at most one n step's propagation."""
        self.assertEqual(got.shape, ref.shape, what)
        tail = mlxk.to_storage(mlxk.round_to(scale * mlxk.storage_to_f32(n_ref, case.dtype),
                                              case.dtype), case.dtype)
        self.assertTrue(np.array_equal(mlxk.bits(tail), mlxk.bits(ref)), self.msg(
            case, f"{what}: MLX's result is not T(scale · its normalized value)"))
        n_same = mlxk.bits(n_got) == mlxk.bits(n_ref)
        out_same = mlxk.bits(got) == mlxk.bits(ref)
        self.assertTrue(np.all(out_same[n_same]), self.msg(
            case, f"{what}: differs where the normalized values agree"))
        d = np.abs(mlxk.storage_to_f32(got, case.dtype).astype(np.float64)
                   - mlxk.storage_to_f32(ref, case.dtype))
        allowed = propagated(n_got, n_ref, np.broadcast_to(scale, got.shape), got, ref,
                             case.dtype)
        self.assertTrue(np.all(d <= allowed), self.msg(
            case, f"{what}: {np.sum(d > allowed)} values beyond one normalized step"))
        return stats.add((what, case.dtype), got, ref, case.dtype)

    def test_float32_vs_float64(self):
        """Where the float32 differences against MLX come from: both sides against a float64
        head norm. The kernel's tree (4 in-lane sums, then the butterfly) is the more accurate
        one; MLX's CPU reduction sums the squares in a longer sequential chain. The library's
        error stays within a few float32 ulps (bound: ~8 roundings on the sum's path, halved
        by the square root, plus five single roundings: <= 10 ulp at the value)."""
        case = Case(2, 16, 16, 32, 128, 128, "float32")
        x = make_x(case, case_rng("float64", 0))
        ones = np.ones(case.Dk, dtype=np.float32)
        eps = L2_EPS / case.Dk
        q, k, _ = library(case, x, ones, ones, eps)
        q_silu, k_silu, _ = mx_silu_split(case, x)
        worst = {}
        for name, got, silu_heads in (("q", q, q_silu), ("k", k, k_silu)):
            s = np.array(silu_heads).astype(np.float64)
            exact = s / np.sqrt(np.mean(s * s, axis=-1, keepdims=True) + float(np.float32(eps)))
            unit = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
            mine = float(np.max(np.abs(got - exact) / unit))
            theirs = float(np.max(np.abs(np.array(mx.fast.rms_norm(silu_heads, None, eps))
                                         - exact) / unit))
            self.assertLessEqual(mine, 10.0, self.msg(case, f"{name}: {mine:.3g} ulp from float64"))
            worst[name] = (mine, theirs)
        print("\n  float32 head norm vs float64: " + "; ".join(
            f"{n} library max {m:.3g} ulp, MLX rms_norm max {t:.3g} ulp"
            for n, (m, t) in worst.items()))

    def test_mlx_lm_compiled_equals_uncompiled(self):
        """nn.silu (mx.compile, shapeless) gives the same bits compiled and uncompiled on the
        Qwen3.5 shape; the comparison above runs uncompiled (no C++ build on a cold cache)."""
        case = CASES[1]
        x = make_x(case, case_rng("compiled", 0))
        for a, b in zip(mx_silu_split(case, x, compiled=True), mx_silu_split(case, x)):
            self.assertTrue(np.array_equal(mlxk.from_mx(a)[0], mlxk.from_mx(b)[0]),
                            self.msg(case, "nn.silu differs when compiled"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
