"""Oracle tests of the backward passes mlxk_silu_rms_heads_vjp and mlxk_gated_rms_norm_vjp
(docs/DESIGN.md §4, "Gradients"): against `mx.vjp` of mlx-lm 0.32.2's own ops for the same
functions on MLX CPU, and against a float64 evaluation of the gradients' formulas.

- Head split: mlx-lm's composition `nn.silu(conv_out)`, split into q | k | v heads, then (a)
  `gated_delta.normalize_qk` (the library given q_scale = T(inv_scale²), k_scale = T(inv_scale)
  and mlx-lm's rms eps; gradient of x) and (b) the weight form `mx.fast.rms_norm(q, q_scale,
  eps)` with random per-column scales (gradients of x, q_scale and k_scale).
- Gated norm: `qwen3_next.Qwen3NextRMSNormGated` (`mx.fast.rms_norm(x, weight, eps)`, then
  `precise_swiglu`), its weight in x's dtype (gradients of x, gate and weight).

Both sides differentiate the same formula; they differ in where they round. The library
evaluates each gradient in float32 (sums in float64) and rounds once to the primal's dtype T;
MLX differentiates op by op in the dtype of each op's arrays. Errors are measured in units of
`unit(T) · mag`, where unit(T) is the rounding error of T (2^-24, 2^-8, 2^-11) and mag the sum
of the magnitudes of the terms of the gradient's formula (float64, as tests/support/grad.rs):
a float computation of a sum is accurate relative to its terms, not to the (possibly cancelling)
result. Bounds:

- float32: the library is within 32 units (its tests' bound: ~14 f32 roundings, a factor two);
  MLX's f32 ops within the same (measured <= 14); so |library - mlx-lm| <= 64 units.
- bfloat16 / float16: MLX's gradient passes ~6 ops that each round to the dtype they work in
  (sigmoid, the SiLU product, rms_norm's backward, the scale or weight products,
  precise_swiglu's casts), each within one unit of the magnitude of its terms; the library
  rounds once. |library - mlx-lm| <= 8 units of the coarser of the gradient's dtype and the
  dtype MLX works in (x's: the gated norm's float32 gate gradient goes through x's rounded
  normalized values), plus 8 half-subnormals (float16 gradients reach its subnormal range);
  measured <= 4.5 units.
- One exception, counted and printed: MLX's float16 sigmoid is `1/(1 + T(exp(-x)))`, and
  exp(-x) overflows float16 below x = -log(65504) = -11.09, so its SiLU and SiLU slope there are
  exactly 0 (the library's forward gives that 0 too; its gradient is the formula's, up to
  |g| · 1.8e-4). Those elements of a float16 x (head split) or gate (gated norm) are compared
  with float64 only.

Every case also checks the library within its own bound of the float64 gradient. The tables
print the worst of each side in these units. Inputs are fresh random values every run (the seed
is printed when a test fails; MLXK_ORACLE_SEED replays).
"""

import unittest
import zlib

import numpy as np

import mlxk  # noqa: E402
from shapes import HeadSplit as Split, NormRows as Norm  # noqa: E402
from test_gated_delta import SEED, SeededTestCase, gd  # noqa: E402  (registers mlx_lm)

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx_lm.models.qwen3_next as qwen3_next  # noqa: E402

UNIT = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
# Half the smallest subnormal: the largest error of rounding a value in the subnormal range.
FLOOR = {"float32": 2.0 ** -150, "bfloat16": 2.0 ** -134, "float16": 2.0 ** -25}
LIBRARY_UNITS = 32.0  # float32 arithmetic of the library (tests/support/grad.rs)
VS_MLX_UNITS = {"float32": 64.0, "bfloat16": 8.0, "float16": 8.0}

# mlx-lm 0.32.2 (qwen3_5.py): normalize_qk(q, k, inv_scale=Dk**-0.5, eps=1e-6).
L2_EPS = 1e-6


def case_rng(test, index):
    return np.random.default_rng([SEED, zlib.crc32(test.encode()), index])


def silu(x):
    return x / (1.0 + np.exp(-x))


def slope(x):
    s = 1.0 / (1.0 + np.exp(-x))
    return s * (1.0 + x * (1.0 - s))


def slope_mag(x):
    s = 1.0 / (1.0 + np.exp(-x))
    return s * (1.0 + np.abs(x) * (1.0 - s))


def rms_backward(v, eps, gn):
    """The backward of n = v · rsqrt(mean(v²) + eps) over the last axis, float64: returns
    (n, cotangent of v, its magnitude)."""
    d = v.shape[-1]
    inv = 1.0 / np.sqrt(np.mean(v * v, -1, keepdims=True) + eps)
    n = v * inv
    dot = np.sum(gn * n, -1, keepdims=True)
    dot_mag = np.sum(np.abs(gn * n), -1, keepdims=True)
    return n, inv * (gn - n * dot / d), inv * (np.abs(gn) + np.abs(n) * dot_mag / d)


def saturated(x, dtype):
    """Where MLX's float16 sigmoid is exactly 0 (exp(-x) overflows float16); None otherwise."""
    if dtype != "float16":
        return None
    return x < -np.log(65504.0)


def to_mx(x, dtype):
    return mlxk.to_mx(mlxk.to_storage(x, dtype), dtype)


def from_mx(a):
    return np.array(a.astype(mx.float32)).astype(np.float64)


def mlx_vjp(fun, primals, cotangents):
    """mx.vjp uncompiled (nn.silu and precise_swiglu are mx.compile'd; the CPU compile needs a
    C++ compiler at run time)."""
    mx.disable_compile()
    try:
        _, grads = mx.vjp(fun, primals, cotangents)
        mx.eval(grads)
    finally:
        mx.enable_compile()
    return [from_mx(g) for g in grads]


class Errors:
    """Worst errors per (what, input, dtype), in units of unit(T) · mag."""

    def __init__(self):
        self.rows = {}

    def add(self, key, lib, mlx, ref, mag, dtype, skipped):
        unit = UNIT[dtype] * mag + FLOOR[dtype]
        worst = [float(np.max(np.abs(a - b) / unit, initial=0.0))
                 for a, b in ((lib, ref), (mlx, ref), (lib, mlx))]
        old = self.rows.get(key, [0.0, 0.0, 0.0, 0, 0])
        self.rows[key] = ([max(o, w) for o, w in zip(old[:3], worst)]
                          + [old[3] + lib.size, old[4] + skipped])

    def report(self, title):
        print(f"\n  {title}: worst error in units of unit(T) · (sum of |terms|), T the coarser "
              f"of the gradient's dtype and the one MLX works in")
        print(f"    {'gradient':56s} {'values':>8s} {'library-f64':>12s} {'mlx-lm-f64':>11s} "
              f"{'library-mlx-lm':>15s} {'saturated':>10s}")
        for (what, name, dtype), (a, b, c, n, k) in self.rows.items():
            print(f"    {what + ' ' + name + ' ' + dtype:56s} {n:8d} {a:12.3g} {b:11.3g} {c:15.3g} "
                  f"{k:10d}")
        print(f"    (MLXK_ORACLE_SEED={SEED})")


class Checks(SeededTestCase):

    def compare(self, case, errors, what, names, dtypes, lib, mlx, ref, work, skip):
        """`work`: the dtype MLX computes in; `skip`: per gradient, None or the elements not
        compared with mlx-lm (its float16 sigmoid saturates there)."""
        for name, dtype, lg, mg, (r, mag), skipped in zip(names, dtypes, lib, mlx, ref, skip):
            self.assertEqual(lg.shape, r.shape, self.msg(case, f"{what} {name} shape"))
            self.assertTrue(np.any(r != 0), self.msg(case, f"{what} {name}: all zero"))
            unit = UNIT[dtype]
            f32 = LIBRARY_UNITS * 2.0 ** -24 * mag
            own = unit * (np.abs(r) + f32) + f32 + FLOOR[dtype]
            bad = np.flatnonzero(np.abs(lg - r) > own)
            self.assertEqual(bad.size, 0, self.msg(
                case, f"{what} {name}: {bad.size} values beyond the library's bound of float64, "
                      f"first {lg.reshape(-1)[bad[:3]]} vs {r.reshape(-1)[bad[:3]]}"))
            coarse = max((dtype, work), key=lambda d: UNIT[d])
            allowed = VS_MLX_UNITS[coarse] * (UNIT[coarse] * mag + FLOOR[coarse])
            compared = np.ones(lg.shape, bool) if skipped is None else ~skipped
            far = np.flatnonzero((np.abs(lg - mg) > allowed) & compared)
            self.assertEqual(far.size, 0, self.msg(
                case, f"{what} {name}: {far.size} values beyond {VS_MLX_UNITS[dtype]} units of "
                      f"mlx-lm's gradient, first {lg.reshape(-1)[far[:3]]} vs "
                      f"{mg.reshape(-1)[far[:3]]}"))
            label = dtype if coarse == dtype else f"{dtype} (MLX in {coarse})"
            errors.add((what, name, label), lg[compared], mg[compared], r[compared],
                       mag[compared], coarse, lg.size - int(compared.sum()))


# ---------------------------------------------------------------------------------------------
# The head split.


SPLITS = [
    Split(1, 8, 16, 32, 128, 128),  # Qwen3.5's heads
    Split(2, 5, 2, 4, 64, 64),
    Split(2, 3, 3, 6, 96, 40),
    Split(3, 2, 2, 2, 7, 33),
    Split(1, 4, 1, 2, 128, 1),
    Split(1, 8, 16, 32, 128, 128, "float32"),
    Split(2, 3, 3, 3, 40, 7, "float32"),
    Split(1, 8, 16, 32, 128, 128, "float16"),
    Split(2, 4, 2, 6, 64, 96, "float16"),
]


def split_reference(c, x, q_scale, k_scale, eps, cot):
    """The gradients of x, q_scale, k_scale in float64, with their magnitudes."""
    x = x.astype(np.float64)
    kd = c.Hk * c.Dk
    dx, dx_mag = np.zeros_like(x), np.zeros_like(x)
    scales = []
    for i, scale in enumerate((q_scale, k_scale)):
        xh = x[..., i * kd:(i + 1) * kd].reshape(c.B, c.S, c.Hk, c.Dk)
        g = cot[i].astype(np.float64)
        n, ds, ds_mag = rms_backward(silu(xh), eps, g * scale.astype(np.float64))
        at = slice(i * kd, (i + 1) * kd)
        dx[..., at] = (ds * slope(xh)).reshape(c.B, c.S, kd)
        dx_mag[..., at] = (ds_mag * slope_mag(xh)).reshape(c.B, c.S, kd)
        scales.append((np.sum(g * n, (0, 1, 2)), np.sum(np.abs(g * n), (0, 1, 2))))
    xv = x[..., 2 * kd:].reshape(c.B, c.S, c.Hv, c.Dv)
    gv = cot[2].astype(np.float64)
    dx[..., 2 * kd:] = (gv * slope(xv)).reshape(c.B, c.S, -1)
    dx_mag[..., 2 * kd:] = (np.abs(gv) * slope_mag(xv)).reshape(c.B, c.S, -1)
    return [(dx, dx_mag)] + scales


def mlx_lm_split(c, form, eps, inv_scale):
    """mlx-lm's head split as a function of (x, q_scale, k_scale)."""
    kd = c.Hk * c.Dk

    def fun(x, q_scale, k_scale):
        conv_out = nn.silu(x)
        q, k, v = mx.split(conv_out, [kd, 2 * kd], -1)
        q = q.reshape(c.B, c.S, c.Hk, c.Dk)
        k = k.reshape(c.B, c.S, c.Hk, c.Dk)
        v = v.reshape(c.B, c.S, c.Hv, c.Dv)
        if form == "normalize_qk":
            q, k = gd.normalize_qk(q, k, inv_scale=inv_scale, eps=L2_EPS)
        else:
            q = mx.fast.rms_norm(q, q_scale, eps)
            k = mx.fast.rms_norm(k, k_scale, eps)
        return q, k, v

    return fun


class HeadSplitVjp(Checks):

    def test_vs_mlx_lm(self):
        """Gradients against mx.vjp of mlx-lm's composition (normalize_qk: x; the weight form:
        x, q_scale, k_scale) and against float64."""
        errors = Errors()
        for index, c in enumerate(SPLITS):
            with self.subTest(case=str(c)):
                rng = case_rng("split", index)
                dt = c.dtype
                inv_scale = c.Dk ** -0.5
                x = (rng.standard_normal((c.B, c.S, c.channels)) *
                     rng.choice([0.5, 2.0, 4.0], (c.B, c.S, 1))).astype(np.float32)
                x = mlxk.round_to(x, dt)
                cot = [mlxk.round_to(rng.standard_normal(shape).astype(np.float32), dt)
                       for shape in ((c.B, c.S, c.Hk, c.Dk),) * 2 + ((c.B, c.S, c.Hv, c.Dv),)]
                forms = {
                    "normalize_qk": (np.full(c.Dk, inv_scale ** 2, np.float32),
                                     np.full(c.Dk, inv_scale, np.float32),
                                     L2_EPS * inv_scale ** 2),
                    "weight": (rng.normal(0.5, 1.0, c.Dk).astype(np.float32),
                               rng.normal(0.5, 1.0, c.Dk).astype(np.float32),
                               1e-6 / c.Dk),
                }
                for form, (q_scale, k_scale, eps) in forms.items():
                    q_scale, k_scale = mlxk.round_to(q_scale, dt), mlxk.round_to(k_scale, dt)
                    hs = [mlxk.array(a, dt) for a in [x, q_scale, k_scale] + cot]
                    grads = mlxk.silu_rms_heads_vjp(hs[0], hs[1], hs[2], c.Hk, c.Hv, c.Dv, eps,
                                                    *hs[3:])
                    try:
                        for g in grads:
                            self.assertEqual(mlxk.dtype_name(g.dtype), dt)
                        lib = [g.read().astype(np.float64) for g in grads]
                    finally:
                        mlxk.free(*grads, *hs)
                    mlx = mlx_vjp(mlx_lm_split(c, form, eps, inv_scale),
                                  [to_mx(a, dt) for a in (x, q_scale, k_scale)],
                                  [to_mx(a, dt) for a in cot])
                    ref = split_reference(c, x, q_scale, k_scale, float(np.float32(eps)), cot)
                    # normalize_qk's scales are constants: only x's gradient is mlx-lm's.
                    n = 1 if form == "normalize_qk" else 3
                    skip = [saturated(x, dt), None, None]
                    self.compare(c, errors, f"head split {form}",
                                 ["dx", "dq_scale", "dk_scale"][:n], [dt] * n, lib[:n], mlx[:n],
                                 ref[:n], dt, skip[:n])
        errors.report("head split gradients vs mx.vjp of mlx-lm's ops and float64")


# ---------------------------------------------------------------------------------------------
# The gated norm.


NORMS = [
    Norm((2, 16, 32), 128),  # Qwen3.5: out [B, S, Hv, Dv] gated by z
    Norm((64,), 64),
    Norm((8, 4), 256),
    Norm((16,), 1000),
    Norm((20,), 33),
    Norm((2, 8, 32), 128, "float32"),
    Norm((16,), 1000, "float32"),
    Norm((20,), 33, "float32", "bfloat16"),
    Norm((2, 8, 32), 128, "float16"),
    Norm((32,), 256, "bfloat16", "float32"),
    Norm((16,), 1000, "float16", "bfloat16"),
]


def norm_reference(x, gate, weight, g, eps, dtype):
    """The gradients of x, gate, weight in float64, with their magnitudes. `dtype`: x's. The
    gate's gradient is g · x' · silu'(z) with x' = T(w · n) in x's dtype (mlx-lm rounds it so);
    below T's normal range x' keeps only T's absolute resolution, so |x'| counts at least as
    T's smallest normal (FLOOR / UNIT) in the magnitude (float16 x: w · n = 5.6e-7 rounds to
    5.4e-7, 4 % of that gradient)."""
    resolution = FLOOR[dtype] / UNIT[dtype]
    x, z, w, g = (a.astype(np.float64) for a in (x, gate, weight, g))
    a = silu(z)
    inv = 1.0 / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)
    n = x * inv
    _, dx, dx_mag = rms_backward(x, eps, g * a * w)
    lead = tuple(range(x.ndim - 1))
    return [(dx, dx_mag),
            (g * w * n * slope(z), np.abs(g) * (np.abs(w * n) + resolution) * slope_mag(z)),
            (np.sum(g * a * n, lead), np.sum(np.abs(g * a * n), lead))]


class GatedNormVjp(Checks):

    def test_vs_mlx_lm(self):
        """Gradients against mx.vjp of mlx-lm's Qwen3NextRMSNormGated and against float64."""
        errors = Errors()
        eps = 1e-6
        for index, c in enumerate(NORMS):
            with self.subTest(case=str(c)):
                rng = case_rng("norm", index)
                shape = c.lead + (c.D,)
                x = (rng.standard_normal(shape) *
                     rng.choice([0.05, 1.0, 4.0], c.lead + (1,))).astype(np.float32)
                x = mlxk.round_to(x, c.dtype)
                gate = mlxk.round_to(3.0 * rng.standard_normal(shape).astype(np.float32), c.gate)
                weight = mlxk.round_to(rng.normal(1.0, 0.5, c.D).astype(np.float32), c.dtype)
                dout = mlxk.round_to(rng.standard_normal(shape).astype(np.float32), c.dtype)
                hs = [mlxk.array(x, c.dtype), mlxk.array(gate, c.gate),
                      mlxk.array(weight, c.dtype), mlxk.array(dout, c.dtype)]
                grads = mlxk.gated_rms_norm_vjp(hs[0], hs[1], hs[2], eps, hs[3])
                try:
                    dtypes = [c.dtype, c.gate, c.dtype]
                    for g, dt in zip(grads, dtypes):
                        self.assertEqual(mlxk.dtype_name(g.dtype), dt)
                    lib = [g.read().astype(np.float64) for g in grads]
                finally:
                    mlxk.free(*grads, *hs)
                module = qwen3_next.Qwen3NextRMSNormGated(c.D, eps=eps)

                def fun(xm, gm, wm):
                    module.weight = wm
                    return module(xm, gm)

                mlx = mlx_vjp(fun, [to_mx(x, c.dtype), to_mx(gate, c.gate), to_mx(weight, c.dtype)],
                              [to_mx(dout, c.dtype)])
                ref = norm_reference(x, gate, weight, dout, float(np.float32(eps)), c.dtype)
                self.compare(c, errors, "gated norm", ["dx", "dgate", "dweight"], dtypes, lib,
                             mlx, ref, c.dtype, [None, saturated(gate, c.gate), None])
        errors.report("gated norm gradients vs mx.vjp of mlx-lm's Qwen3NextRMSNormGated and "
                      "float64")


if __name__ == "__main__":
    unittest.main(verbosity=2)
