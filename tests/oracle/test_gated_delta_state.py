"""Oracle tests of mlxk_gated_delta_state, the prefix-state replay (docs/DESIGN.md §3, §4).

After a verify window of T draft tokens, row b keeps its first accepted_lengths[b] tokens; the
replay recomputes each row's state from the pre-verify state over exactly that prefix.

Oracle 3: the recurrence emulated in float32 numpy in the Metal order (emulate.py), run over
          each row's prefix: the replayed state is bit-identical, for every m in 0..=T (all
          rows m) and for per-row mixed lengths (0 and T included), with bfloat16, float16 and
          float32 inputs, grouped heads (Hv/Hk from 1 to 4), with and without a start state.
Library cross-check: the replay equals the state mlxk_gated_delta_update returns over the same
          prefix (a mask that keeps tokens [0, len_b) of row b), and the tokens past a row's
          prefix are never read (NaN there changes nothing).

g comes from mlxk_compute_g (bit-exact with mlx-lm, test_gated_delta.py) and beta = MLX's
sigmoid of b in b's dtype: the transcendentals are MLX's, the emulation takes them as given.
Inputs are fresh random values every run (the seed is printed when a test fails; set
MLXK_ORACLE_SEED to replay).
"""

import unittest

import numpy as np

import emulate  # noqa: E402
import mlxk  # noqa: E402
from test_gated_delta import Case, Inputs, SeededTestCase, case_rng  # noqa: E402

import mlx.core as mx  # noqa: E402

CASES = [
    # Qwen3.5-35B-A3B head layout, a verify window of 8 draft tokens.
    Case(2, 8, 16, 32, 128, 128, state=True),
    # Grouped heads 1..4, every Dk, Dv != Dk, every input dtype, bfloat16 A_log, no state.
    Case(3, 7, 2, 6, 64, 48, "float16", "float16", state=True),
    Case(3, 5, 1, 4, 256, 40, "float32", "float32", "bfloat16"),
    Case(2, 6, 2, 4, 32, 96, "bfloat16", "float32", state=True),
    Case(1, 4, 1, 1, 128, 16, "float16", "bfloat16", state=True),
    Case(4, 3, 3, 9, 64, 1, "float32", "bfloat16", state=True),
    Case(3, 4, 2, 2, 128, 64, "bfloat16", alog_dtype="bfloat16"),
    Case(2, 1, 1, 2, 128, 64, "bfloat16", state=True),  # T = 1
]


def mixed_lengths(case, rng, count=4):
    """Per-row accepted lengths: the first vector has a 0 row and a T row (with B >= 2), the
    others are random in [0, T]."""
    B, T = case.B, case.T
    out = []
    first = rng.integers(0, T + 1, size=B)
    first[0] = 0
    first[-1] = T
    if B > 2:
        first[1] = rng.integers(1, T + 1)
    out.append(first)
    for _ in range(count - 1):
        out.append(rng.integers(0, T + 1, size=B))
    return [np.asarray(v, dtype=np.int32) for v in out]


class Replay:
    """One case's inputs (test_gated_delta.Inputs), g and beta, and the emulation's state after
    every prefix."""

    def __init__(self, case, rng):
        self.case = case
        self.inputs = Inputs(case, rng)
        self.g, self.beta = self.inputs.g_beta()
        self.k = self.inputs.f32("k")
        self.v = self.inputs.f32("v")
        self.state0 = None if self.inputs.state is None else self.inputs.f32("state")
        self.prefix_states = emulate.gated_delta_prefix_states(self.k, self.v, self.g, self.beta,
                                                               self.state0)

    def handles(self, overrides=None):
        """mlxk handles of k, v, a, b, a_log, dt_bias, state (None when absent)."""
        overrides = overrides or {}
        out = []
        for name in ("k", "v", "a", "b", "a_log", "dt_bias", "state"):
            x = overrides.get(name, getattr(self.inputs, name))
            out.append(None if x is None else mlxk.array(*mlxk.from_mx(x)))
        return out

    def library(self, lengths, overrides=None):
        hs = self.handles(overrides)
        s = mlxk.gated_delta_state(*hs, lengths)
        try:
            c = self.case
            assert mlxk.dtype_name(s.dtype) == "float32", mlxk.dtype_name(s.dtype)
            assert s.shape == (c.B, c.Hv, c.Dv, c.Dk), s.shape
            return s.read()
        finally:
            mlxk.free(s, *hs)


class PrefixReplay(SeededTestCase):

    def assert_same(self, case, got, want, what):
        differ = np.flatnonzero(mlxk.bits(got).reshape(-1) != mlxk.bits(want).reshape(-1))
        if differ.size:
            with np.errstate(invalid="ignore"):
                worst = float(np.nanmax(np.abs(got - want)))
        self.assertEqual(differ.size, 0, self.msg(
            case, f"{what}: {differ.size} of {got.size} state values differ, first at flat "
                  f"index {differ[:3]}; max |ds| {worst if differ.size else 0:.3g}"))

    def test_every_prefix_bit_exact_vs_emulation(self):
        """Every m in 0..=T with all rows at m: the state after the first m tokens."""
        counted = {}
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                r = Replay(case, case_rng("replay_every", index))
                moved = False
                for m in range(case.T + 1):
                    got = r.library([m] * case.B)
                    self.assert_same(case, got, r.prefix_states[m], f"all rows at m = {m}")
                    moved |= m > 0 and not np.array_equal(got, r.prefix_states[0])
                    counted[case.dtype] = counted.get(case.dtype, 0) + got.size
                self.assertTrue(moved or case.T == 0, self.msg(case, "the state never moved"))
        print("\n  replay, every prefix m = 0..T, bit-identical to the emulation: " + ", ".join(
            f"{d} inputs {n} state values" for d, n in counted.items()))

    def test_mixed_lengths_bit_exact_vs_emulation(self):
        """Per-row mixed lengths: each row's state is the emulated recurrence over that row's
        own prefix (emulate.gated_delta_state, which slices the prefix), and agrees with the
        every-prefix emulation's entry for that row."""
        checked = 0
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                rng = case_rng("replay_mixed", index)
                r = Replay(case, rng)
                for lengths in mixed_lengths(case, rng):
                    got = r.library(lengths)
                    want = emulate.gated_delta_state(r.k, r.v, r.g, r.beta, r.state0, lengths)
                    self.assert_same(case, got, want, f"lengths {lengths.tolist()}")
                    rows = np.stack([r.prefix_states[n][b] for b, n in enumerate(lengths)])
                    self.assert_same(case, want, rows, f"the two emulations, {lengths.tolist()}")
                    checked += 1
        print(f"\n  replay, {checked} mixed-length vectors over {len(CASES)} cases: "
              "bit-identical to the per-row prefix emulation")

    def test_equals_update_over_the_prefix(self):
        """The replay's state equals mlxk_gated_delta_update's over the same prefix: all T
        tokens (no mask), and per-row mixed lengths as a mask keeping tokens [0, len_b)."""
        for index, case in enumerate(CASES):
            with self.subTest(case=str(case)):
                rng = case_rng("replay_update", index)
                r = Replay(case, rng)
                _, _, s_full = r.inputs.library()
                self.assert_same(case, r.library([case.T] * case.B), s_full, "full window")
                lengths = mixed_lengths(case, rng, count=1)[0]
                r.inputs.mask_np = np.arange(case.T)[None, :] < lengths[:, None]
                r.inputs.mask = mx.array(r.inputs.mask_np)
                _, _, s_masked = r.inputs.library()
                self.assert_same(case, r.library(lengths), s_masked,
                                 f"update masked to lengths {lengths.tolist()}")

    def test_tokens_past_the_prefix_are_not_read(self):
        """NaN in k, v, a and b past every row's prefix leaves the replayed state unchanged."""
        for index, case in enumerate(CASES[:4]):
            with self.subTest(case=str(case)):
                rng = case_rng("replay_poison", index)
                r = Replay(case, rng)
                lengths = mixed_lengths(case, rng, count=1)[0]
                past = np.arange(case.T)[None, :] >= lengths[:, None]  # [B, T]
                overrides = {}
                for name in ("k", "v", "a", "b"):
                    x = getattr(r.inputs, name)
                    where = mx.array(past.reshape(past.shape + (1,) * (x.ndim - 2)))
                    overrides[name] = mx.where(where, mx.array(np.nan, dtype=x.dtype), x)
                got = r.library(lengths, overrides)
                self.assertFalse(np.isnan(got).any(), self.msg(case, "NaN reached the state"))
                self.assert_same(case, got, r.library(lengths), f"lengths {lengths.tolist()}")


if __name__ == "__main__":
    unittest.main(verbosity=2)
