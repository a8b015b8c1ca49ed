"""mlxkern.mlx_lm.patch() on mlx-lm's own model classes (qwen3_5.Model, qwen3_next.Model) built
from small random configurations: greedy tokens and logits against unpatched mlx-lm, float32 and
bfloat16, short prompts (exact update) and long ones (chunked), and a right-padded batch whose
mask decides the states. The comparisons print one line each (MLXK_PY_QUIET=1 silences)."""

from __future__ import annotations

import os
import random
import sys
import unittest

import mlx.core as mx
import numpy as np

import mlxkern.mlx_lm as mkl
import support  # noqa: F401  (mlx_lm importable)
from mlx_lm.models import cache as cache_mod
from mlx_lm.models import qwen3_5, qwen3_next

SEED = int(os.environ.get("MLXK_PY_SEED", random.randrange(1 << 30)))
QUIET = os.environ.get("MLXK_PY_QUIET") == "1"
print(f"test_mlx_lm: seed {SEED}")

# 3 linear-attention layers + 1 full attention; Hk 2, Hv 6, Dk 128, Dv 64
TEXT = dict(model_type="qwen3_5_text", hidden_size=256, intermediate_size=512,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
            rms_norm_eps=1e-6, vocab_size=512, linear_num_value_heads=6, linear_num_key_heads=2,
            linear_key_head_dim=128, linear_value_head_dim=64, linear_conv_kernel_dim=4,
            full_attention_interval=4, tie_word_embeddings=False, max_position_embeddings=4096)


def qwen35(dtype):
    model = qwen3_5.Model(qwen3_5.ModelArgs(model_type="qwen3_5", text_config=dict(TEXT)))
    randomize(model)
    if dtype != mx.float32:
        cast(model, dtype, model.cast_predicate)
    model.eval()
    return model


def qwen3next(dtype):
    args = qwen3_next.ModelArgs(
        model_type="qwen3_next", hidden_size=256, num_hidden_layers=4, intermediate_size=512,
        num_attention_heads=4, linear_num_value_heads=6, linear_num_key_heads=2,
        linear_key_head_dim=128, linear_value_head_dim=64, linear_conv_kernel_dim=4,
        num_experts=0, num_experts_per_tok=0, decoder_sparse_step=1,
        shared_expert_intermediate_size=0, mlp_only_layers=[0, 1, 2, 3],
        moe_intermediate_size=0, rms_norm_eps=1e-6, vocab_size=512, num_key_value_heads=2,
        rope_theta=10000.0, partial_rotary_factor=0.25, max_position_embeddings=4096,
        head_dim=64)
    model = qwen3_next.Model(args)
    randomize(model)
    if dtype != mx.float32:
        cast(model, dtype, lambda path: True)
    model.eval()
    return model


def cast(model, dtype, keep):
    """What mlx-lm's loading does: float parameters to the model dtype where the model's
    cast_predicate says so (Qwen3.5 keeps A_log in float32)."""
    from mlx.utils import tree_flatten, tree_unflatten

    model.update(tree_unflatten([(n, p.astype(dtype) if keep(n) else p)
                                 for n, p in tree_flatten(model.parameters())]))


def randomize(model):
    """Gates and norms away from their trivial initial values, so every path carries weight."""
    from mlx.utils import tree_flatten, tree_unflatten

    new = []
    for name, p in tree_flatten(model.parameters()):
        if name.endswith("A_log"):
            p = mx.random.uniform(-1.0, 1.5, p.shape)
        elif name.endswith("dt_bias") or name.endswith("norm.weight"):
            p = p + 0.2 * mx.random.normal(p.shape)
        new.append((name, p))
    model.update(tree_unflatten(new))
    mx.eval(model.parameters())


def greedy(model, prompt, n, forced=None):
    """mlx-lm's generation step by hand (prefill, then one token at a time, argmax). With
    `forced`, the tokens fed back are those (teacher forcing), so two runs' logits compare
    step by step even where a near-tie flips an argmax."""
    cache = model.make_cache()
    logits = model(prompt[None], cache=cache)
    first = logits[0].astype(mx.float32)
    tokens, steps = [], []
    tok = mx.argmax(logits[:, -1], axis=-1)
    for i in range(n):
        tokens.append(int(tok.item()))
        feed = tok if forced is None else mx.array([forced[i]])
        logits = model(feed[:, None], cache=cache)
        steps.append(logits[0, -1].astype(mx.float32))
        tok = mx.argmax(logits[:, -1], axis=-1)
    return tokens, first, mx.stack(steps)


def ulp_of(x, dtype):
    return 2.0 ** (np.floor(np.log2(x)) - (7 if dtype == mx.bfloat16 else 23))


class Generation(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        mx.random.seed(SEED)
        random.seed(SEED)

    def tearDown(self):
        mkl.unpatch()

    def compare(self, build, dtype, prompt_len, n=32):
        model = build(dtype)
        prompt = mx.random.randint(0, 512, (prompt_len,))
        mkl.unpatch()
        ref = greedy(model, prompt, n)
        mkl.patch()
        free = greedy(model, prompt, n)
        forced = greedy(model, prompt, n, forced=ref[0])
        mkl.unpatch()
        name = f"{build.__name__} {dtype} prompt {prompt_len}"
        same_free = next((i for i, (a, b) in enumerate(zip(free[0], ref[0])) if a != b), n)
        same_forced = sum(int(a == b) for a, b in zip(forced[0], ref[0]))
        d_prefill = float(mx.abs(forced[1] - ref[1]).max())
        d_decode = float(mx.abs(forced[2] - ref[2]).max())
        scale = float(mx.abs(mx.concatenate([ref[1], ref[2]])).max())
        ulp = ulp_of(scale, dtype)
        if not QUIET:
            print(f"  {name}: free-running greedy tokens equal to mlx-lm's for {same_free}/{n}; "
                  f"teacher-forced argmax equal {same_forced}/{n}; logits max |diff| prefill "
                  f"{d_prefill:.3g}, decode {d_decode:.3g} (max |logit| {scale:.3g}: "
                  f"{max(d_prefill, d_decode) / ulp:.1f} {dtype} ulp of it)")
        if dtype == mx.float32:
            self.assertEqual(free[0], ref[0], name)
            self.assertLessEqual(max(d_prefill, d_decode), 1e-4, name)
        else:
            self.assertGreaterEqual(same_forced, n - 2, name)
            self.assertLessEqual(max(d_prefill, d_decode), 16 * ulp, name)

    def test_qwen35_float32_short(self):
        self.compare(qwen35, mx.float32, 12)

    def test_qwen35_float32_chunked(self):
        self.compare(qwen35, mx.float32, 96)

    def test_qwen35_bfloat16(self):
        self.compare(qwen35, mx.bfloat16, 12)

    def test_qwen35_bfloat16_chunked(self):
        self.compare(qwen35, mx.bfloat16, 80)

    def test_qwen3next_float32(self):
        self.compare(qwen3next, mx.float32, 70, n=16)

    def test_qwen3next_bfloat16(self):
        self.compare(qwen3next, mx.bfloat16, 20, n=16)

    def test_patch_calls_mlxkern(self):
        calls = []
        original = mkl._mk.gated_delta_update

        def spy(*a, **kw):
            calls.append(a[0].shape)
            return original(*a, **kw)

        model = qwen35(mx.float32)
        mkl.patch(chunked_min_tokens=0)
        mkl._mk.gated_delta_update = spy
        try:
            model(mx.array([[1, 2, 3]]), cache=model.make_cache())
        finally:
            mkl._mk.gated_delta_update = original
        self.assertEqual(len(calls), 3)  # the three linear-attention layers
        mkl.unpatch()
        self.assertFalse(mkl.is_patched())
        from mlx_lm.models import gated_delta

        self.assertIs(qwen3_5.gated_delta_update, gated_delta.gated_delta_update)
        with self.assertRaises(ValueError):
            mkl.patch(chunk_size=24)


class PaddedBatch(unittest.TestCase):
    """A right-padded batch: each ArraysCache gets the rows' lengths (mlx-lm's prepare), so
    create_ssm_mask masks the padding; every row must give what it gives alone."""

    def test_right_padded_batch(self):
        mx.random.seed(SEED + 1)
        for dtype in (mx.float32, mx.bfloat16):
            for T in (10, 72):
                self.batch(dtype, T)

    def run_batch(self, model, tokens, lengths):
        cache = model.make_cache()
        for c in cache:
            if isinstance(c, cache_mod.ArraysCache):
                c.prepare(lengths=lengths)
        logits = model(tokens, cache=cache)
        states = [c[1] for c in cache if isinstance(c, cache_mod.ArraysCache)]
        return logits.astype(mx.float32), states

    def batch(self, dtype, T):
        model = qwen35(dtype)
        lengths = [T, T // 2, 3]
        tokens = mx.random.randint(0, 512, (3, T))
        tokens = mx.where(mx.arange(T)[None] < mx.array(lengths)[:, None], tokens, 0)
        mkl.patch()
        try:
            logits, states = self.run_batch(model, tokens, lengths)
        finally:
            mkl.unpatch()
        ref_logits, ref_states = self.run_batch(model, tokens, lengths)
        worst, worst_state = 0.0, 0.0
        for row, n in enumerate(lengths):
            alone, alone_states = self.run_batch(model, tokens[row:row + 1, :n], [n])
            for got, want in ((logits[row, :n], alone[0]), (ref_logits[row, :n], alone[0])):
                worst = max(worst, float(mx.abs(got - want).max()))
            for s, rs, a in zip(states, ref_states, alone_states):
                worst_state = max(worst_state, float(mx.abs(s[row] - a[0]).max()))
                # mlx-lm's own batch on the same rows, for scale
                worst_state = max(worst_state, float(mx.abs(rs[row] - a[0]).max()))
        scale = float(mx.abs(ref_logits).max())
        if not QUIET:
            real = (mx.arange(T)[None] < mx.array(lengths)[:, None])[..., None]
            d = float((mx.abs(logits - ref_logits) * real).max())
            print(f"  right-padded batch {dtype} T {T} lengths {lengths}: patched vs unpatched "
                  f"logits at real tokens max |diff| {d:.3g} (max |logit| {scale:.3g}); rows vs alone "
                  f"{worst:.3g}, states {worst_state:.3g}")
        tol = 1e-4 if dtype == mx.float32 else 0.05 * scale
        self.assertLessEqual(worst, tol)
        self.assertLessEqual(worst_state, 1e-4 if dtype == mx.float32 else 0.05)
        # masks matter: the padded rows' states differ from running the padding as tokens
        unmasked, unmasked_states = self.run_batch(model, tokens, [T, T, T])
        self.assertGreater(float(mx.abs(unmasked_states[0][2] - states[0][2]).max()), 1e-3)


class PatchWithoutMlxLm(unittest.TestCase):
    def test_missing_module_named_and_nothing_patched(self):
        from mlx_lm.models import qwen3_5 as module

        own = module.gated_delta_update
        saved = sys.modules.get("mlx_lm.models.qwen3_next")
        sys.modules["mlx_lm.models.qwen3_next"] = None  # an import of it raises ImportError
        try:
            with self.assertRaisesRegex(ImportError, r"mlx_lm\.models\.qwen3_next.*pip install mlx-lm"):
                mkl.patch()
        finally:
            if saved is None:
                del sys.modules["mlx_lm.models.qwen3_next"]
            else:
                sys.modules["mlx_lm.models.qwen3_next"] = saved
            mkl.unpatch()
        self.assertIs(module.gated_delta_update, own)


if __name__ == "__main__":
    unittest.main()
