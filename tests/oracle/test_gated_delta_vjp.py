"""Oracle tests of mlxk_gated_delta_update_vjp, the update's backward (docs/DESIGN.md §4, §6).

All eight gradients (dq, dk, dv, da, db, da_log, ddt_bias, dstate) of
sum(dy · y) + sum(dstate_out · state_out), through the C ABI, against:

Oracle 1: a float64 numpy reverse sweep (emulate.gated_delta_vjp_f64), itself checked against
          central differences of the float64 forward (test_reference_vs_central_differences);
Oracle 2: mlx-lm 0.32.2's gated_delta_ops under mx.vjp on MLX CPU, g and beta from its
          compute_g and mx.sigmoid inside the differentiated function;
Oracle 3: mx.fast.gated_delta_update(q, k, v, gamma, beta, initial_state, mask) under mx.vjp on
          MLX CPU (MLX 0.32.4; on the CPU it differentiates its fallback), with the same gates.

The float64 reference uses the g and beta the forward uses (mlxk_compute_g, bit-exact with
mlx-lm, and MLX's sigmoid in b's dtype) and differentiates the gate functions exactly, as the
header documents for the library. The MLX references run with compile disabled (on the CPU,
MLX's compile builds C++ at run time) and get dy with the masked tokens zeroed (mlx-lm's ops
path leaves garbage in y there, which the library writes as 0); the library gets the full dy
and must ignore it at masked tokens. An absent state is a zero state for the MLX references.

Cases cover grouped heads (Hv/Hk 1 to 4), Dk 32 to 256, Dv != Dk, T from 1 to more than three
checkpoint intervals (the library keeps a state every 64 tokens), masks with fully masked rows,
absent state, bfloat16 / float16 / float32 inputs and a bfloat16 A_log. Inputs are fresh random
values every run; the seed is printed when a test fails (MLXK_ORACLE_SEED replays it).
"""

import functools
import unittest

import numpy as np

import emulate  # noqa: E402
import mlxk  # noqa: E402
import test_gated_delta as base  # noqa: E402  (a module: its test classes do not run twice)
from test_gated_delta import MX_DTYPE, SEED, Case, Inputs, SeededTestCase, case_rng  # noqa: E402

import mlx.core as mx  # noqa: E402
gd = base.gd

NAMES = mlxk.VJP_NAMES  # dq, dk, dv, da, db, da_log, ddt_bias, dstate

# ---------------------------------------------------------------------------------------------
# Tolerances. For gradient x with float64 reference r, element by element:
#
#     |x_i - r_i| <= U[dtype of x] * |r_i| + (ACC + REF_ULPS * U[ref_dtype]) * scale(x)
#
#  - U * |r_i|: x is rounded once to its output dtype (dq, dk, dv in q's dtype; da, db, da_log,
#    ddt_bias in their inputs' dtypes; dstate float32): at most one unit roundoff
#    (U = 2^-8 bfloat16, 2^-11 float16, 2^-24 float32) of the value.
#  - scale(x): the size of what the float32 arithmetic adds up, so that a sum that cancels
#    to near zero is not held to a relative bound its rounding cannot meet. For dq, dk, dv and
#    dstate, the largest |r|. For the gates, whose cotangents dg and dbeta are single sums over
#    a head's state (Dv x Dk products) or value rows (Dv), the reference's largest "size":
#    |dg terms| x |dg/da| for da, summed per head for da_log and ddt_bias, and |dbeta terms|/4
#    for db (beta (1 - beta) <= 1/4; emulate.gated_delta_vjp_f64).
#  - ACC * scale: the library's float32 arithmetic. Each gradient element comes out of Dk-long
#    dot products and sums over the Dv value rows and the heads of a group, and the state's
#    gradient is carried back through every token (multiplied by g < 1 each step, so old
#    rounding errors decay rather than add up). Measured against float64 over 25 seeds of the
#    cases below: <= 4.8e-7 x scale (dk; 8 float32 unit roundoffs), <= 1.2e-7 for the gates.
#    ACC = 4e-6 (~65 unit roundoffs) leaves 8x; a real fault (a wrong head, sign, gate, mask or
#    checkpoint) is O(1) of the scale.
#  - REF_ULPS * U[ref_dtype] * scale: only against the MLX references, their own error. MLX's
#    autograd runs the gates' chain (a + dt_bias, softplus, sigmoid and their derivatives) in
#    the gate dtype (beta (1 - beta) from beta rounded to b's dtype, for one), rounds each
#    promoted input's cotangent to its input dtype and adds a key head's pieces (one per value
#    head of its group for q, two for k) in that dtype; mx.fast's CPU fallback also rounds state
#    products to the model dtype (its bfloat16 dstate is ~1e-3 of scale off float64, the
#    library's ~1e-7). ref_dtype is the coarser of the model and gate dtypes, since both
#    roundings reach every gradient (through g and dg). Measured over the same 25 seeds: <= 1.4
#    unit roundoffs of ref_dtype in bfloat16 and float16 (dk, mx.fast), <= 8 float32 unit
#    roundoffs in float32 (well inside ACC). REF_ULPS = 8 leaves 5x.
ACC = 4e-6
REF_ULPS = 8
U = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11, "float32": 2.0 ** -24}

# The cases (fixed shapes, fresh values): B, T, Hk, Hv, Dk, Dv, dtype, gate dtype, A_log dtype,
# mask pattern (test_gated_delta.make_mask: with B = 3 one row is fully masked for patterns 1,
# 2 and 3), state.
CASES = [
    # Decode: one token, Hv/Hk = 4, Dk = 256, a bfloat16 A_log (Qwen3-Next after conversion).
    Case(1, 1, 2, 8, 256, 64, "bfloat16", "bfloat16", "bfloat16", state=True),
    # Hv/Hk = 3, Dk = 32, Dv > Dk, float16, a fully masked row (pattern 3), no state.
    Case(3, 63, 1, 3, 32, 48, "float16", "float16", mask=3),
    # One checkpoint interval exactly, float32, masks with a fully masked row.
    Case(3, 64, 2, 4, 64, 32, "float32", "float32", mask=1, state=True),
    # Qwen3.5 head width (Dk = Dv = 128), one token past an interval.
    Case(1, 65, 2, 4, 128, 128, "bfloat16", "bfloat16", state=True),
    # Three intervals and a part, the state carried back through every kept checkpoint.
    Case(1, 200, 1, 2, 128, 16, "bfloat16", "bfloat16", state=True),
    Case(3, 200, 1, 1, 32, 8, "float32", "float32", mask=2, state=True),
    # float16 model with bfloat16 gates, Dk = 96, leading / trailing padding, no state.
    Case(3, 65, 2, 2, 96, 40, "float16", "bfloat16", mask=4),
    # T = 1 with a mask (row 0 fully masked), float32 model, bfloat16 gates.
    Case(2, 1, 1, 4, 64, 64, "float32", "bfloat16", mask=3, state=True),
    # Hv/Hk = 3 with three key heads, bfloat16 model, float32 gates (a + dt_bias in float32).
    Case(1, 64, 3, 9, 32, 16, "bfloat16", "float32", mask=0, state=True),
]


def out_dtypes(case):
    """The dtypes of the eight results (include/mlxkern.h)."""
    return (case.dtype, case.dtype, case.dtype, case.gate_dtype, case.gate_dtype,
            case.alog_dtype, case.gate_dtype, "float32")


def ref_dtype(case):
    """The coarser of the model and gate dtypes: MLX's autograd rounds in both, and the errors
    of either reach every gradient (the gates' through dg, the recurrence's through g)."""
    return max((case.dtype, case.gate_dtype), key=U.get)


def out_shapes(case):
    c = case
    return ((c.B, c.T, c.Hk, c.Dk), (c.B, c.T, c.Hk, c.Dk), (c.B, c.T, c.Hv, c.Dv),
            (c.B, c.T, c.Hv), (c.B, c.T, c.Hv), (c.Hv,), (c.Hv,), (c.B, c.Hv, c.Dv, c.Dk))


class Run:
    """One case's inputs, cotangents and the four sets of gradients (float64 numpy dicts)."""

    def __init__(self, case, rng):
        self.case = c = case
        self.inputs = Inputs(case, rng)
        f32 = np.float32
        dy = rng.standard_normal((c.B, c.T, c.Hv, c.Dv)).astype(f32)
        self.dy = mx.array(dy).astype(MX_DTYPE[c.dtype])  # y's cotangent, in y's dtype
        self.dstate_out = mx.array(0.5 * rng.standard_normal((c.B, c.Hv, c.Dv, c.Dk)).astype(f32))
        mx.eval(self.dy, self.dstate_out)
        self.live = (np.ones((c.B, c.T), dtype=bool) if self.inputs.mask_np is None
                     else self.inputs.mask_np)
        self.library = self.run_library()
        self.f64 = self.run_f64()
        self.mlx_lm = self.run_mlx(self.mlx_lm_fn)
        self.mx_fast = self.run_mlx(self.mx_fast_fn)

    def run_library(self, state=True):
        """mlxk_gated_delta_update_vjp; checks the results' shapes and dtypes."""
        hs = self.inputs.handles(state)
        hdy, hds = (mlxk.array(*mlxk.from_mx(x)) for x in (self.dy, self.dstate_out))
        outs = mlxk.gated_delta_update_vjp(*hs, hdy, hds)
        try:
            got = {}
            for name, out, dtype, shape in zip(NAMES, outs, out_dtypes(self.case),
                                               out_shapes(self.case)):
                assert mlxk.dtype_name(out.dtype) == dtype, (name, mlxk.dtype_name(out.dtype))
                assert out.shape == shape, (name, out.shape, shape)
                got[name] = out.read().astype(np.float64)
            return got
        finally:
            mlxk.free(*outs, *hs, hdy, hds)

    def run_f64(self):
        inp = self.inputs
        g, beta = inp.g_beta()
        state = None if inp.state is None else inp.f32("state")
        return emulate.gated_delta_vjp_f64(
            inp.f32("q"), inp.f32("k"), inp.f32("v"), g, beta, state, inp.mask_np,
            np.array(self.dy.astype(mx.float32)), np.array(self.dstate_out),
            inp.f32("a"), inp.f32("b"), inp.f32("a_log"), inp.f32("dt_bias"))

    def mlx_lm_fn(self, q, k, v, a, b, a_log, dt_bias, state):
        g = gd.compute_g(a_log, a, dt_bias)
        return gd.gated_delta_ops(q, k, v, g, mx.sigmoid(b), state, self.inputs.mask)

    def mx_fast_fn(self, q, k, v, a, b, a_log, dt_bias, state):
        g = gd.compute_g(a_log, a, dt_bias)
        y, s = mx.fast.gated_delta_update(q, k, v, g, mx.sigmoid(b), state, self.inputs.mask)
        return y, s

    def run_mlx(self, fn):
        c, inp = self.case, self.inputs
        state = inp.state if inp.state is not None else mx.zeros((c.B, c.Hv, c.Dv, c.Dk))
        dy = self.dy
        if inp.mask is not None:
            dy = dy * inp.mask[:, :, None, None].astype(dy.dtype)
        primals = [inp.q, inp.k, inp.v, inp.a, inp.b, inp.a_log, inp.dt_bias, state]
        mx.disable_compile()
        try:
            _, grads = mx.vjp(fn, primals, [dy, self.dstate_out])
            mx.eval(grads)
        finally:
            mx.enable_compile()
        return {name: np.array(x.astype(mx.float32)).astype(np.float64)
                for name, x in zip(NAMES, grads)}

    def scale(self, name):
        size = self.f64.get(f"size:{name}")
        return float(np.max(np.abs(self.f64[name]) if size is None else size))


@functools.lru_cache(maxsize=None)
def run(index):
    """Case `index`'s run, computed once for all the tests below."""
    return Run(CASES[index], case_rng("vjp", index))


SHORT = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}


def dtypes_label(case):
    """"bf16/f32": the model dtype (q, k, v) / the gate dtype (a, b, dt_bias)."""
    return f"{SHORT[case.dtype]}/{SHORT[case.gate_dtype]}"


class Table:
    """Worst errors per (gradient, model/gate dtypes): max |x - ref| and max |x - ref| / scale,
    and optionally the reference's own max |ref - float64| / scale."""

    def __init__(self, title):
        self.title = title
        self.rows = {}

    def add(self, name, dtypes, err, scale, ref_err=None):
        row = self.rows.setdefault((name, dtypes), [0.0, 0.0, 0.0])
        row[0] = max(row[0], float(err.max()))
        row[1] = max(row[1], float(err.max()) / scale)
        if ref_err is not None:
            row[2] = max(row[2], float(ref_err.max()) / scale)

    def print(self, ref_name=None):
        """One row per gradient, one column per model/gate dtypes: "max abs err / max rel err"
        (and a line with the reference's own max rel err against float64, if given)."""
        columns = sorted({dtypes for _, dtypes in self.rows})
        print(f"\n  {self.title} (seed {SEED}); max abs err / max rel err, by q/gates dtypes:")
        print("    " + " " * 9 + "".join(f"{c:>22s}" for c in columns))
        for name in NAMES:
            cells = []
            for c in columns:
                abs_err, rel, ref_rel = self.rows.get((name, c), (None, None, None))
                cells.append("-" if abs_err is None else f"{abs_err:9.3g} / {rel:9.3g}")
            print(f"    {name:9s}" + "".join(f"{cell:>22s}" for cell in cells))
            if ref_name:
                refs = [f"({self.rows[(name, c)][2]:9.3g})" if (name, c) in self.rows else "-"
                        for c in columns]
                print(f"    {'':9s}" + "".join(f"{cell:>22s}" for cell in refs))
        print("    rel: / scale (the float64 gradient's largest magnitude; for da, db, da_log and"
              " ddt_bias the largest size of what they sum); q/gates: the dtypes of q, k, v and"
              " of a, b, dt_bias" + (f"; (...): {ref_name}'s own max rel err vs float64"
                                     if ref_name else ""))


class GatedDeltaVjp(SeededTestCase):

    def check(self, case, name, got, ref, scale, out_dtype, ref_ulps, ref_dtype):
        err = np.abs(got - ref)
        allowed = U[out_dtype] * np.abs(ref) + (ACC + ref_ulps * U[ref_dtype]) * scale
        bad = np.flatnonzero(err > allowed)
        self.assertEqual(bad.size, 0, self.msg(
            case, f"{name}: {bad.size} values beyond tolerance; worst {err.max():.3g} "
                  f"(allowed there {allowed.reshape(-1)[np.argmax(err)]:.3g}, scale {scale:.3g})"))
        return err

    def compare(self, title, reference, ref_ulps):
        table = Table(title)
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                r = run(index)
                ref = reference(r)
                for i, name in enumerate(NAMES):
                    scale = r.scale(name)
                    self.assertGreater(scale, 0.0, self.msg(case, f"{name}: reference all zero"))
                    err = self.check(case, name, r.library[name], ref[name], scale,
                                     out_dtypes(case)[i], ref_ulps, ref_dtype(case))
                    ref_err = np.abs(ref[name] - r.f64[name]) if ref is not r.f64 else None
                    table.add(name, dtypes_label(case), err, scale, ref_err)
        return table

    def test_vs_float64(self):
        """Oracle 1: the float64 reverse sweep, within one rounding to the output dtype plus
        the float32 accumulation error (ACC). Masked tokens' gradients are exactly zero."""
        self.compare("vs float64", lambda r: r.f64, 0).print()
        for index, case in enumerate(CASES):
            r = run(index)
            off = ~r.live
            for name in ("dq", "dk", "dv", "da", "db"):
                self.assertTrue(np.all(r.library[name][off] == 0), self.msg(
                    case, f"{name} is not zero at masked tokens"))

    def test_vs_mlx_lm(self):
        """Oracle 2: mlx-lm's gated_delta_ops (and compute_g, sigmoid) under mx.vjp."""
        self.compare("vs mlx-lm gated_delta_ops under mx.vjp", lambda r: r.mlx_lm,
                     REF_ULPS).print("mlx-lm")

    def test_vs_mx_fast(self):
        """Oracle 3: mx.fast.gated_delta_update (and compute_g, sigmoid) under mx.vjp."""
        self.compare("vs mx.fast.gated_delta_update under mx.vjp", lambda r: r.mx_fast,
                     REF_ULPS).print("mx.fast")

    def test_fully_masked_rows(self):
        """A fully masked batch row: zero gradients for its q, k, v, a and b, and its state's
        gradient is dstate_out unchanged (bit for bit); the other rows' gradients are not."""
        checked = 0
        for index, case in enumerate(CASES):
            r = run(index)
            full = np.flatnonzero(~r.live.any(axis=1))
            if full.size == 0:
                continue
            others = np.flatnonzero(r.live.any(axis=1))
            for name in ("dq", "dk", "dv", "da", "db"):
                self.assertTrue(np.all(r.library[name][full] == 0),
                                self.msg(case, f"{name} of a fully masked row is not zero"))
                self.assertTrue(np.any(r.library[name][others] != 0),
                                self.msg(case, f"{name} of the other rows is all zero"))
            dso = np.array(r.dstate_out)
            self.assertTrue(np.array_equal(mlxk.bits(r.library["dstate"][full].astype(np.float32)),
                                           mlxk.bits(dso[full])),
                            self.msg(case, "dstate of a fully masked row is not dstate_out"))
            self.assertFalse(np.array_equal(r.library["dstate"][others], dso[others]),
                             self.msg(case, "dstate of the other rows is dstate_out"))
            checked += full.size
        self.assertGreaterEqual(checked, 3, "the cases hold fully masked rows")

    def test_absent_state_equals_zero_state(self):
        """state = NULL and an explicit zero state give the same eight results bit for bit
        (dstate included: it is returned either way)."""
        checked = 0
        for index, case in enumerate(CASES):
            if case.state:
                continue
            r = run(index)
            c = case
            absent = r.run_library(state=False)
            r.inputs.state = mx.zeros((c.B, c.Hv, c.Dv, c.Dk), dtype=mx.float32)
            try:
                zero = r.run_library(state=True)
            finally:
                r.inputs.state = None
            for name in NAMES:
                self.assertTrue(np.array_equal(absent[name], zero[name]),
                                self.msg(case, f"{name} differs"))
                self.assertTrue(np.array_equal(absent[name], r.library[name]),
                                self.msg(case, f"{name} differs between calls"))
            self.assertTrue(np.any(absent["dstate"] != 0), self.msg(case, "dstate all zero"))
            checked += 1
        self.assertGreaterEqual(checked, 2, "the cases hold calls without a state")

    def test_reference_vs_central_differences(self):
        """The float64 reverse sweep is the gradient of the float64 forward: central differences
        of gated_delta_loss_f64 (gates from gates_f64) on a small case with GQA, a mask with a
        fully masked row, a state and every input perturbed, element by element."""
        rng = case_rng("vjp_fd", 0)
        B, T, Hk, Hv, Dk, Dv = 2, 5, 1, 2, 4, 3
        normal = rng.standard_normal
        x = dict(q=0.5 * normal((B, T, Hk, Dk)), k=0.5 * normal((B, T, Hk, Dk)),
                 v=normal((B, T, Hv, Dv)), a=1.5 * normal((B, T, Hv)), b=2.0 * normal((B, T, Hv)),
                 a_log=np.log(rng.uniform(0.3, 8.0, Hv)), dt_bias=normal(Hv) - 1.0,
                 state=0.5 * normal((B, Hv, Dv, Dk)))
        mask = np.array([[True, True, False, True, True], [False] * T])
        dy, dso = normal((B, T, Hv, Dv)), normal((B, Hv, Dv, Dk))
        g, beta = emulate.gates_f64(x["a"], x["b"], x["a_log"], x["dt_bias"])
        ref = emulate.gated_delta_vjp_f64(x["q"], x["k"], x["v"], g, beta, x["state"], mask, dy,
                                          dso, x["a"], x["b"], x["a_log"], x["dt_bias"])
        h = 1e-6
        worst = 0.0
        for name, key in zip(("q", "k", "v", "a", "b", "a_log", "dt_bias", "state"), NAMES):
            numeric = np.zeros_like(x[name])
            for i in range(x[name].size):
                loss = []
                for sign in (1.0, -1.0):
                    moved = x[name].copy()
                    moved.flat[i] += sign * h
                    loss.append(emulate.gated_delta_loss_f64(**{**x, name: moved}, mask=mask,
                                                             dy=dy, dstate_out=dso))
                numeric.flat[i] = (loss[0] - loss[1]) / (2 * h)
            scale = np.max(np.abs(ref[key]))
            self.assertGreater(scale, 0.0, key)
            # Central differences err by O(h^2) truncation and O(eps64 / h) rounding: ~1e-10.
            err = float(np.max(np.abs(numeric - ref[key])))
            self.assertLessEqual(err, 1e-7 * max(scale, 1.0), f"{key}: {err:.3g} (seed {SEED})")
            worst = max(worst, err / scale)
        print(f"\n  float64 reverse sweep vs central differences: max rel err {worst:.3g}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
