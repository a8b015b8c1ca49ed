"""Oracle tests of mlxk_compute_g and mlxk_gated_delta_update (docs/DESIGN.md §4, §6).

Oracle 1: mlx-lm 0.32.2 on MLX CPU (`compute_g` bit for bit; the recurrence, which there runs
          the ops path, within a tolerance: its reductions are ordered differently).
Oracle 2: a float64 numpy reference (precision).
Oracle 3: tests/oracle/emulate.py, the Metal kernel's arithmetic order in float32 numpy
          (bit for bit).

Inputs are fresh random values every run. The seed is printed when a test fails; set
MLXK_ORACLE_SEED to replay it.
"""

import importlib.util
import os
import sys
import types
import unittest
import zlib
from dataclasses import dataclass

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import emulate  # noqa: E402
import mlxk  # noqa: E402

import mlx.core as mx  # noqa: E402


def _import_mlx_lm_gated_delta():
    """mlx_lm.models.gated_delta without running mlx_lm/__init__.py (it imports transformers,
    which is not installed): register a bare package module over the installed folder."""
    if "mlx_lm" not in sys.modules:
        spec = importlib.util.find_spec("mlx_lm")  # locates the package; does not execute it
        if spec is None or not spec.submodule_search_locations:
            raise unittest.SkipTest("mlx-lm is not installed")
        package = types.ModuleType("mlx_lm")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["mlx_lm"] = package
    import mlx_lm.models.gated_delta as gated_delta

    return gated_delta


gd = _import_mlx_lm_gated_delta()
mx.set_default_device(mx.cpu)  # mlx-lm's gated_delta_update then takes its ops path

SEED = int(os.environ.get("MLXK_ORACLE_SEED") or int.from_bytes(os.urandom(8), "little"))

MX_DTYPE = {"bfloat16": mx.bfloat16, "float16": mx.float16, "float32": mx.float32}

# ---------------------------------------------------------------------------------------------
# Tolerances against mlx-lm's ops path (oracle 1).
#
# Both sides do the same per-element float32 arithmetic (decay, kv, delta, rank-1 update,
# readout) on identical inputs, g and beta (compute_g is checked bit-exact below; beta is the
# same MLX sigmoid). They differ only in how the two Dk-long dot products are summed: the kernel
# takes 32 sequential lane sums and an xor butterfly, MLX's CPU reduction its own vector order.
# A reordered f32 sum differs by a few f32 ulps of its partial sums, and the state carries that
# from step to step:
#  - state: measured |ds| <= 2.1e-7 x max|s| over 64 steps (about 2 f32 ulps; 50 runs).
#    STATE_RTOL = 2e-6 x max|s| leaves ~10x room; a real fault (a wrong gate, beta, head or
#    mask) moves the state by O(1) relative.
#  - y: the f32 readouts differ by that little, then both are rounded to the model dtype; at a
#    rounding boundary the tiny difference flips one ulp of the dtype (bf16: ~0.02% of y).
#    So |dy| <= Y_ULPS ulp of the dtype at |y| + Y_TERMS_REL x sum_i |s_i q_i|. The second
#    term is the f32 error of the readout itself: a dot product's rounding error is relative
#    to the size of its terms (sum_i |s_i q_i|, from the float64 reference), not to y, which
#    may cancel to near zero; it is also the whole bound for float32 y, whose ulp is tiny.
#    Measured <= 2.7e-7 x sum|s q| (float32 y, ~2 f32 ulps; 18 runs); Y_TERMS_REL = 2e-6
#    leaves ~7x.
STATE_RTOL = 2e-6
Y_ULPS = 1
Y_TERMS_REL = 2e-6

# Against the float64 reference (oracle 2): the f32 recurrence makes about one f32 rounding per
# operation per step; measured state error <= 3.7e-7 x max|s| over 50 runs, and 4e-6 is ~30 f32
# ulps. y is the rounded f64 readout within F64_Y_ULPS ulp of the dtype (0.5 from rounding) plus
# the f32 readout error, Y_TERMS_REL x sum|s q| as above.
F64_STATE_RTOL = 4e-6
F64_Y_ULPS = 1


def ulp(x, dtype):
    """The spacing of `dtype` at |x| (float32 array)."""
    x = np.abs(np.asarray(x, dtype=np.float32))
    if dtype == "float32":
        return np.spacing(x)
    if dtype == "bfloat16":
        return np.spacing(x) * np.float32(65536.0)
    if dtype == "float16":
        return np.spacing(np.minimum(x, 65504).astype(np.float16)).astype(np.float32)
    raise ValueError(dtype)


# ---------------------------------------------------------------------------------------------
# Cases.


@dataclass(frozen=True)
class Case:
    B: int
    T: int
    Hk: int
    Hv: int
    Dk: int
    Dv: int
    dtype: str = "bfloat16"  # q, k, v (the model dtype)
    gate_dtype: str = "bfloat16"  # a, b, dt_bias
    alog_dtype: str = "float32"
    mask: object = None  # None, or an int choosing the per-row padding patterns
    state: bool = False

    def __str__(self):
        mask = "-" if self.mask is None else f"m{self.mask}"
        return (f"B{self.B} T{self.T} Hk{self.Hk} Hv{self.Hv} Dk{self.Dk} Dv{self.Dv} "
                f"{self.dtype} gate={self.gate_dtype} A_log={self.alog_dtype} mask={mask} "
                f"state={'yes' if self.state else 'no'}")


def covering_cases():
    """A fixed set of 42 cases in which every value of every axis appears, each axis combined
    with several values of the others (a cheap stand-in for the cartesian product)."""
    explicit = [
        # Qwen3.5-35B-A3B head layout: decode and a padded prefill chunk.
        Case(1, 1, 16, 32, 128, 128, state=True),
        Case(2, 64, 16, 32, 128, 128, mask=1, state=True),
        # Fully-masked rows, leading and trailing padding, with and without state.
        Case(3, 7, 2, 6, 64, 48, mask=3, state=True),
        Case(3, 64, 1, 4, 256, 40, mask=1),
        Case(3, 64, 2, 2, 32, 32, "float16", "float16", mask=2, state=True),
        Case(3, 7, 1, 3, 128, 16, "float32", "float32", mask=3, state=True),
        # Qwen3-Next (bf16 A_log), f16/f32 models, Dv != Dk, T = 1.
        Case(1, 64, 2, 8, 256, 256, alog_dtype="bfloat16", state=True),
        Case(3, 1, 1, 1, 32, 96, "float16", mask=4, state=True),
        Case(1, 7, 3, 9, 64, 1, "float32"),
        Case(3, 64, 1, 2, 256, 48, "float32", "float32", mask=2, state=True),
    ]
    axes = {
        "B": [1, 3],
        "T": [1, 7, 64],
        "Hk": [1, 2],
        "ratio": [1, 2, 3, 4],
        "Dk": [32, 64, 128, 256],
        "Dv": ["same", 16, 40, 96],
        "dtype": ["bfloat16", "bfloat16", "float16", "float32"],
        "gate": ["bfloat16", "model"],
        "alog": ["float32", "float32", "bfloat16"],
        "mask": [None, 0, 1, 2, 3, 4],
        "state": [False, True],
    }
    pick = np.random.default_rng(20260314)  # fixed: the shapes are a plan, the values are fresh
    generated = []
    for _ in range(32):
        c = {name: values[pick.integers(len(values))] for name, values in axes.items()}
        dv = c["Dk"] if c["Dv"] == "same" else c["Dv"]
        gate = c["dtype"] if c["gate"] == "model" else c["gate"]
        generated.append(Case(c["B"], c["T"], c["Hk"], c["Hk"] * c["ratio"], c["Dk"], dv,
                              c["dtype"], gate, c["alog"], c["mask"], c["state"]))
    return explicit + generated


CASES = covering_cases()


def case_rng(test, index):
    # crc32, not hash(): str hashes change from process to process.
    return np.random.default_rng([SEED, zlib.crc32(test.encode()), index])


def make_mask(case, rng):
    """[B, T] bool: per row one of random holes, leading padding, trailing padding, fully
    masked, all real; row b gets pattern (b + case.mask) % 5, so with B = 3 offsets 1, 2 and 3
    include a fully-masked row. A single row is never fully masked (y would be all zero)."""
    B, T = case.B, case.T
    patterns = ["random", "leading", "trailing", "full", "none"]
    mask = np.ones((B, T), dtype=bool)
    for row in range(B):
        kind = patterns[(row + case.mask) % len(patterns)]
        if kind == "full" and B == 1:
            kind = "random"
        if kind == "random":
            mask[row] = rng.random(T) < 0.6
            mask[row, rng.integers(T)] = True
        elif kind == "leading" and T > 1:
            mask[row, : rng.integers(1, T)] = False
        elif kind == "trailing" and T > 1:
            mask[row, rng.integers(1, T):] = False
        elif kind == "full":
            mask[row] = False
    return mask


class Inputs:
    """One case's inputs, as mlx-lm sees them (mx arrays) and as numpy storage."""

    def __init__(self, case, rng):
        self.case = case
        c = case
        dt, gt = MX_DTYPE[c.dtype], MX_DTYPE[c.gate_dtype]
        f32 = np.float32

        def normal(shape, scale=1.0, mean=0.0):
            return (mean + scale * rng.standard_normal(shape)).astype(f32)

        q_raw = mx.array(normal((c.B, c.T, c.Hk, c.Dk))).astype(dt)
        k_raw = mx.array(normal((c.B, c.T, c.Hk, c.Dk))).astype(dt)
        # Qwen3.5's call: inv_scale = Dk^-0.5, eps = 1e-6 (in the model dtype).
        self.q, self.k = gd.normalize_qk(q_raw, k_raw, inv_scale=c.Dk ** -0.5, eps=1e-6)
        self.v = mx.array(normal((c.B, c.T, c.Hv, c.Dv))).astype(dt)
        self.a = mx.array(normal((c.B, c.T, c.Hv), 1.5)).astype(gt)
        self.b = mx.array(normal((c.B, c.T, c.Hv), 2.0)).astype(gt)
        self.a_log = mx.array(np.log(rng.uniform(0.3, 8.0, c.Hv)).astype(f32)).astype(
            MX_DTYPE[c.alog_dtype])
        self.dt_bias = mx.array(normal((c.Hv,), 1.0, -1.0)).astype(gt)
        self.state = mx.array(normal((c.B, c.Hv, c.Dv, c.Dk), 0.5)) if c.state else None
        self.mask_np = make_mask(c, rng) if c.mask is not None else None
        self.mask = mx.array(self.mask_np) if self.mask_np is not None else None
        mx.eval([x for x in (self.q, self.k, self.v, self.a, self.b, self.a_log, self.dt_bias,
                             self.state, self.mask) if x is not None])

    def f32(self, name):
        """An input's values widened to float32 numpy."""
        return np.array(getattr(self, name).astype(mx.float32))

    def handles(self, state=True):
        """New mlxk handles of the inputs, in mlxk_gated_delta_update's order."""
        def h(x):
            return None if x is None else mlxk.array(*mlxk.from_mx(x))

        names = ("q", "k", "v", "a", "b", "a_log", "dt_bias")
        hs = [h(getattr(self, n)) for n in names]
        hs.append(h(self.state) if state else None)
        hs.append(h(self.mask))
        return hs

    def library(self, state=True):
        """Runs mlxk_gated_delta_update; returns (y storage, y float32, state float32)."""
        hs = self.handles(state)
        y, s = mlxk.gated_delta_update(*hs)
        try:
            assert mlxk.dtype_name(y.dtype) == self.case.dtype, mlxk.dtype_name(y.dtype)
            assert mlxk.dtype_name(s.dtype) == "float32", mlxk.dtype_name(s.dtype)
            assert y.shape == (self.case.B, self.case.T, self.case.Hv, self.case.Dv)
            assert s.shape == (self.case.B, self.case.Hv, self.case.Dv, self.case.Dk)
            return y.read_bits(), y.read().astype(np.float32), s.read()
        finally:
            mlxk.free(y, s, *hs)

    def g_beta(self):
        """g from mlxk_compute_g and beta = sigmoid(b) in b's dtype, both widened to float32."""
        hs = [mlxk.array(*mlxk.from_mx(x)) for x in (self.a_log, self.a, self.dt_bias)]
        g = mlxk.compute_g(*hs)
        try:
            g_np = g.read()
        finally:
            mlxk.free(g, *hs)
        beta = np.array(mx.sigmoid(self.b).astype(mx.float32))
        return g_np, beta


def reference_f64(inputs):
    """The float64 recurrence on the case's inputs (g from mlxk_compute_g, which equals
    mlx-lm's bit for bit): (args for the emulation, y64, s64, readout term sizes)."""
    g, beta = inputs.g_beta()
    state0 = None if inputs.state is None else inputs.f32("state")
    args = (inputs.f32("q"), inputs.f32("k"), inputs.f32("v"), g, beta, state0, inputs.mask_np)
    y64, s64, terms = emulate.gated_delta_f64(*args, magnitude=True)
    return args, y64, s64, terms


def mlx_lm_update(inputs, compiled):
    """mlx-lm's gated_delta_update on the CPU (its ops path): (y, state) mx arrays, evaluated.

    compiled=False runs it with MLX's compile disabled. On the CPU, MLX compiles a fused
    function by running `g++ -std=c++17 -O3` once per dtype/layout variant, about a second
    each on a cold cache ($TMPDIR/mlx/<version>/cpu). The fused code keeps every intermediate
    in its own dtype and, without -march, x86-64 has no FMA to contract into, so there it gives
    the same bits (test_mlx_lm_compiled_equals_uncompiled checks that on the model's cases; on
    aarch64, where FMA is baseline and g++ contracts by default, it may not). The 42-case
    comparison runs uncompiled so that a fresh machine does not spend a minute in g++."""
    args = (inputs.q, inputs.k, inputs.v, inputs.a, inputs.b, inputs.a_log, inputs.dt_bias,
            inputs.state, inputs.mask)
    if compiled:
        y, s = gd.gated_delta_update(*args)
        mx.eval(y, s)
        return y, s
    mx.disable_compile()
    try:
        y, s = gd.gated_delta_update(*args)
        mx.eval(y, s)
        return y, s
    finally:
        mx.enable_compile()


def live_positions(inputs):
    c = inputs.case
    if inputs.mask_np is None:
        return np.ones((c.B, c.T, c.Hv, c.Dv), dtype=bool)
    return np.broadcast_to(inputs.mask_np[:, :, None, None], (c.B, c.T, c.Hv, c.Dv))


class SeededTestCase(unittest.TestCase):
    """Prints the seed when a test fails."""

    def run(self, result=None):
        counts = (len(result.failures), len(result.errors)) if result is not None else None
        out = super().run(result)
        r = result if result is not None else out
        if r is not None and counts is not None and (len(r.failures), len(r.errors)) != counts:
            print(f"\n  {self.id()} failed; replay with MLXK_ORACLE_SEED={SEED}", file=sys.stderr)
        return out

    def msg(self, case, text):
        return f"{case}: {text} (MLXK_ORACLE_SEED={SEED})"

    def assert_same_bits(self, case, what, got, want):
        """got and want (storage of case.dtype) hold the same bits; want is not all zero."""
        self.assertTrue(np.any(want != 0), self.msg(case, f"{what} all zero"))
        bad = np.flatnonzero(mlxk.bits(got).reshape(-1) != mlxk.bits(want).reshape(-1))
        self.assertEqual(bad.size, 0, self.msg(
            case, f"{what}: {bad.size} of {got.size} values differ from the emulation, first at "
                  f"flat index {bad[:3]}: "
                  f"{mlxk.storage_to_f32(got.reshape(-1)[bad[:3]], case.dtype)} vs "
                  f"{mlxk.storage_to_f32(want.reshape(-1)[bad[:3]], case.dtype)}"))


# ---------------------------------------------------------------------------------------------


class ComputeG(SeededTestCase):
    """mlxk_compute_g against mlx-lm's compute_g (compiled, shapeless) on the CPU: bit for bit."""

    COMBOS = [
        # (A_log, a, dt_bias)
        ("float32", "bfloat16", "bfloat16"),  # Qwen3.5
        ("bfloat16", "bfloat16", "bfloat16"),  # Qwen3-Next after conversion
        ("float32", "float16", "float16"),
        ("float32", "float32", "float32"),
        ("bfloat16", "float32", "float32"),
        ("float32", "bfloat16", "float32"),  # mixed: a + dt_bias promotes to float32
        ("bfloat16", "float16", "bfloat16"),  # mixed: f16 + bf16 promotes to float32
    ]
    # Every shape for the model combinations; the mixed ones get two shapes of one layout,
    # since each (dtypes, layout) pair costs MLX's CPU compile a C++ build on a cold cache.
    SHAPES = [(32,), (1, 1, 32), (3, 7, 4), (2, 64, 48), (2, 3, 5, 1)]
    FEW_SHAPES = [(3, 7, 4), (2, 64, 48)]
    ALL_SHAPES = {("float32", "bfloat16", "bfloat16"), ("bfloat16", "bfloat16", "bfloat16"),
                  ("float32", "float32", "float32")}

    def test_bit_exact_vs_mlx_lm(self):
        rng = case_rng("compute_g", 0)
        checked = calls = 0
        for alog_t, a_t, dt_t in self.COMBOS:
            combo = (alog_t, a_t, dt_t)
            for shape in self.SHAPES if combo in self.ALL_SHAPES else self.FEW_SHAPES:
                hv = shape[-1]
                a_np = (rng.standard_normal(shape) * 4).astype(np.float32)
                # Reach softplus' far branches and exp's saturation too.
                flat = a_np.reshape(-1)
                flat[rng.integers(flat.size, size=max(1, flat.size // 10))] = rng.choice(
                    [-100.0, -30.0, -12.0, 12.0, 30.0, 100.0], size=max(1, flat.size // 10))
                a = mx.array(a_np).astype(MX_DTYPE[a_t])
                a_log = mx.array(np.log(rng.uniform(0.05, 20.0, hv)).astype(np.float32)).astype(
                    MX_DTYPE[alog_t])
                dt_bias = mx.array(rng.normal(-1.0, 2.0, hv).astype(np.float32)).astype(
                    MX_DTYPE[dt_t])
                expected = gd.compute_g(a_log, a, dt_bias)
                self.assertEqual(expected.dtype, mx.float32)
                expected = np.array(expected)
                hs = [mlxk.array(*mlxk.from_mx(x)) for x in (a_log, a, dt_bias)]
                g = mlxk.compute_g(*hs)
                try:
                    self.assertEqual(mlxk.dtype_name(g.dtype), "float32")
                    self.assertEqual(g.shape, tuple(shape))
                    got = g.read()
                finally:
                    mlxk.free(g, *hs)
                what = f"A_log {alog_t}, a {a_t}, dt_bias {dt_t}, shape {shape}"
                self.assertTrue(np.any(got != 0) and np.any(got != 1), what)
                differ = np.flatnonzero(mlxk.bits(got) != mlxk.bits(expected))
                self.assertEqual(differ.size, 0, self.msg(
                    what, f"{differ.size} g values differ, first at {differ[:1]}: "
                          f"{got.reshape(-1)[differ[:1]]} vs {expected.reshape(-1)[differ[:1]]}"))
                checked += got.size
                calls += 1
        print(f"\n  compute_g: {checked} values, {len(self.COMBOS)} dtype combinations, "
              f"{calls} calls, all bit-identical to mlx-lm")


class GatedDeltaUpdate(SeededTestCase):

    def test_vs_mlx_lm(self):
        """Oracle 1: mlx-lm 0.32.2 gated_delta_update on MLX CPU, within the tolerances above."""
        stats = {}
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                inputs = Inputs(case, case_rng("mlx_lm", index))
                _, y, s = inputs.library()
                y_ref, s_ref = mlx_lm_update(inputs, compiled=False)
                self.assertEqual(y_ref.dtype, MX_DTYPE[case.dtype])
                y_ref = np.array(y_ref.astype(mx.float32))
                s_ref = np.array(s_ref)
                live = live_positions(inputs)

                # Masked tokens: exactly +0 (mlx-lm's ops path leaves garbage there: skipped).
                masked_bits = mlxk.bits(y[~live])
                self.assertTrue(np.all(masked_bits == 0), self.msg(case, "masked y is not +0"))

                ya, yb = y[live], y_ref[live]
                self.assertTrue(np.any(yb != 0) or ya.size == 0, self.msg(case, "y all zero"))
                terms = reference_f64(inputs)[3][live]
                scale = float(np.max(np.abs(yb))) if yb.size else 0.0
                dy = np.abs(ya - yb)
                units = ulp(np.maximum(np.abs(ya), np.abs(yb)), case.dtype)
                allowed = Y_ULPS * units + Y_TERMS_REL * terms
                bad = np.flatnonzero(dy > allowed)
                self.assertEqual(bad.size, 0, self.msg(
                    case, f"{bad.size} y values beyond tolerance; worst {dy.max():.3g} "
                          f"(allowed there {allowed[np.argmax(dy)]:.3g})"))

                s_scale = float(np.max(np.abs(s_ref)))
                ds = np.abs(s - s_ref)
                self.assertLessEqual(float(ds.max()), STATE_RTOL * s_scale, self.msg(
                    case, f"state differs by {ds.max():.3g} (largest |s| {s_scale:.3g})"))

                st = stats.setdefault(case.dtype, dict(y_abs=0.0, y_ulps=0.0, y_beyond=0.0,
                                                        s_abs=0.0, s_rel=0.0, same=0, n=0))
                if ya.size:
                    # ulps away from cancellation (|y| >= max|y|/256); near zero the f32
                    # readout error, not the dtype ulp, is the measure (y_beyond).
                    away = np.abs(yb) >= scale / 256
                    st["y_abs"] = max(st["y_abs"], float(dy.max()))
                    if away.any():
                        st["y_ulps"] = max(st["y_ulps"], float(np.max(dy[away] / units[away])))
                    beyond = np.maximum(dy - units, 0) / np.maximum(terms, np.finfo(float).tiny)
                    st["y_beyond"] = max(st["y_beyond"], float(np.max(beyond)))
                st["s_abs"] = max(st["s_abs"], float(ds.max()))
                st["s_rel"] = max(st["s_rel"], float(ds.max()) / s_scale)
                st["same"] += int(np.sum(ya == yb))
                st["n"] += ya.size
        print(f"\n  vs mlx-lm ops path, {len(CASES)} cases (seed {SEED}):")
        for dtype, st in stats.items():
            print(f"    {dtype:9s} y: bit-identical {st['same']}/{st['n']} "
                  f"({100.0 * st['same'] / max(st['n'], 1):.3f}%), max |dy| {st['y_abs']:.3g}, "
                  f"max {st['y_ulps']:.3g} ulp where |y| >= max|y|/256, beyond 1 ulp "
                  f"{st['y_beyond']:.3g} x sum|s q| | state: max |ds| {st['s_abs']:.3g} = "
                  f"{st['s_rel']:.3g} x max|s|")

    def test_mlx_lm_compiled_equals_uncompiled(self):
        """mlx-lm's recurrence gives the same bits with and without MLX's compile (y at every
        position, masked garbage included, and the state), on the Qwen3.5 cases."""
        for index, case in enumerate(CASES[:2]):
            with self.subTest(case=str(case)):
                inputs = Inputs(case, case_rng("compiled", index))
                y1, s1 = mlx_lm_update(inputs, compiled=True)
                y2, s2 = mlx_lm_update(inputs, compiled=False)
                self.assertTrue(np.array_equal(mlxk.from_mx(y1)[0], mlxk.from_mx(y2)[0]),
                                self.msg(case, "y differs"))
                self.assertTrue(np.array_equal(mlxk.bits(np.array(s1)), mlxk.bits(np.array(s2))),
                                self.msg(case, "state differs"))

    def test_bit_exact_vs_emulation(self):
        """Oracle 3: the Metal order emulated in float32 numpy; y and state bit for bit."""
        counted = {}
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                inputs = Inputs(case, case_rng("emulation", index))
                y_bits, _, s = inputs.library()
                g, beta = inputs.g_beta()
                y_emu, s_emu = emulate.gated_delta(
                    inputs.f32("q"), inputs.f32("k"), inputs.f32("v"), g, beta,
                    None if inputs.state is None else inputs.f32("state"), inputs.mask_np,
                    case.dtype)
                emu_bits = mlxk.bits(mlxk.to_storage(y_emu, case.dtype))
                y_differ = np.flatnonzero(mlxk.bits(y_bits).reshape(-1) != emu_bits.reshape(-1))
                self.assertEqual(y_differ.size, 0, self.msg(
                    case, f"{y_differ.size} y values differ from the emulation, first at "
                          f"flat index {y_differ[:1]}"))
                s_differ = np.flatnonzero(mlxk.bits(s).reshape(-1) != mlxk.bits(s_emu).reshape(-1))
                self.assertEqual(s_differ.size, 0, self.msg(
                    case, f"{s_differ.size} state values differ from the emulation; max |ds| "
                          f"{np.max(np.abs(s - s_emu)):.3g}"))
                counted[case.dtype] = counted.get(case.dtype, 0) + y_bits.size + s.size
        print("\n  bit-identical to the Metal-order emulation: " + ", ".join(
            f"{d} {n} values" for d, n in counted.items()))

    def test_vs_float64(self):
        """Oracle 2: a float64 reference; the f32 recurrence's error stays at rounding level.
        The emulation is checked the same way (it must not be a wrong twin of the kernel)."""
        worst = {}
        for index, case in enumerate(CASES[::3]):
            with self.subTest(case=str(case)):
                inputs = Inputs(case, case_rng("float64", index))
                _, y, s = inputs.library()
                args, y64, s64, terms = reference_f64(inputs)
                s_scale = float(np.max(np.abs(s64)))
                s_err = float(np.max(np.abs(s - s64)))
                self.assertLessEqual(s_err, F64_STATE_RTOL * s_scale, self.msg(
                    case, f"state error {s_err:.3g} vs float64 (largest |s| {s_scale:.3g})"))
                live = live_positions(inputs)
                y_err = np.abs(y[live] - y64[live])
                y_allowed = F64_Y_ULPS * ulp(np.abs(y64[live]), case.dtype) \
                    + Y_TERMS_REL * terms[live]
                self.assertTrue(np.all(y_err <= y_allowed), self.msg(
                    case, f"y error {y_err.max():.3g} vs float64"))
                y_emu, s_emu = emulate.gated_delta(*args, case.dtype)
                self.assertLessEqual(float(np.max(np.abs(s_emu - s64))),
                                     F64_STATE_RTOL * s_scale, self.msg(case, "emulation state"))
                w = worst.setdefault(case.dtype, [0.0, 0.0, 0.0])
                w[0] = max(w[0], s_err)
                w[1] = max(w[1], s_err / s_scale)
                w[2] = max(w[2], float(y_err.max()) if y_err.size else 0.0)
        print("\n  vs float64: " + "; ".join(
            f"{d} state max abs err {w[0]:.3g} ({w[1]:.3g} of max|s|), y max abs err {w[2]:.3g}"
            for d, w in worst.items()))

    def test_masked_rows_keep_state(self):
        """A fully-masked batch row returns exactly its input state and y = +0 everywhere."""
        for index, case in enumerate([
            Case(3, 7, 2, 4, 128, 64, mask=2, state=True),
            Case(3, 64, 1, 3, 64, 32, "float32", "float32", mask=3, state=True),
            Case(3, 1, 1, 2, 256, 16, "float16", mask=1, state=True),
        ]):
            with self.subTest(case=str(case)):
                inputs = Inputs(case, case_rng("masked", index))
                full = np.flatnonzero(~inputs.mask_np.any(axis=1))
                self.assertGreater(full.size, 0, "the case has a fully-masked row")
                y_bits, _, s = inputs.library()
                s0 = inputs.f32("state")
                self.assertTrue(np.array_equal(mlxk.bits(s[full]), mlxk.bits(s0[full])),
                                self.msg(case, "a fully-masked row changed its state"))
                self.assertTrue(np.all(y_bits[full] == 0), self.msg(case, "masked y not +0"))
                others = np.flatnonzero(inputs.mask_np.any(axis=1))
                self.assertFalse(np.array_equal(s[others], s0[others]),
                                 self.msg(case, "rows with real tokens did not move"))

    def test_freed_state_handle_same_bits(self):
        """The decode-loop pattern: freeing the state handle (and every input) before reading
        lets the CPU kernel write the new state over the old buffer; the bits are unchanged."""
        for index, case in enumerate([
            Case(1, 1, 16, 32, 128, 128, state=True),
            Case(3, 7, 1, 2, 64, 32, "float16", mask=1, state=True),
        ]):
            with self.subTest(case=str(case)):
                inputs = Inputs(case, case_rng("freed", index))
                y_kept, _, s_kept = inputs.library()
                hs = inputs.handles()
                y, s = mlxk.gated_delta_update(*hs)
                mlxk.free(*hs)
                try:
                    y_freed, s_freed = y.read_bits(), s.read()
                finally:
                    mlxk.free(y, s)
                self.assertTrue(np.array_equal(mlxk.bits(y_kept), mlxk.bits(y_freed)),
                                self.msg(case, "y differs"))
                self.assertTrue(np.array_equal(mlxk.bits(s_kept), mlxk.bits(s_freed)),
                                self.msg(case, "state differs"))

    def test_absent_state_equals_zero_state(self):
        """state = NULL and an explicit zero state give the same bits."""
        for index, case in enumerate([
            Case(3, 7, 2, 4, 128, 64, mask=0),
            Case(1, 64, 1, 3, 256, 48),
            Case(3, 1, 2, 2, 32, 32, "float16"),
            Case(1, 7, 1, 1, 64, 64, "float32", "float32"),
        ]):
            with self.subTest(case=str(case)):
                inputs = Inputs(case, case_rng("zero_state", index))
                y_none, _, s_none = inputs.library(state=False)
                c = case
                inputs.state = mx.zeros((c.B, c.Hv, c.Dv, c.Dk), dtype=mx.float32)
                y_zero, _, s_zero = inputs.library(state=True)
                self.assertTrue(np.array_equal(y_none, y_zero), self.msg(case, "y differs"))
                self.assertTrue(np.array_equal(mlxk.bits(s_none), mlxk.bits(s_zero)),
                                self.msg(case, "state differs"))
                self.assertTrue(np.any(y_none != 0), self.msg(case, "y all zero"))


if __name__ == "__main__":
    unittest.main(verbosity=2)
