"""A LoRA training run on mlx-lm's qwen3_5.Model (small random configuration) with and without
mlxkern.mlx_lm.patch(): the same adapters (mlx-lm's LoRALinear on the linear-attention and
attention projections), data, optimizer (mlx.optimizers.Adam) and seed; the loss curves side by
side must agree step by step, and the patched run's gradients go through mlxkern's kernels
(chunked form: sequences of 64 tokens). mlx-lm's own trainer (mlx_lm.tuner.trainer) is not used:
it imports `rich` for its terminal UI, which the project's environment does not install; the
loss is its default_loss formula (masked mean cross-entropy of next tokens)."""

from __future__ import annotations

import os
import unittest

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
from mlx.utils import tree_flatten

import mlxkern.mlx_lm as mkl
import support
from test_mlx_lm import SEED, qwen35

QUIET = os.environ.get("MLXK_PY_QUIET") == "1"
STEPS = int(os.environ.get("MLXK_PY_LORA_STEPS", "8"))


def add_lora(model, LoRALinear, rank=8):
    model.freeze()
    for layer in model.language_model.model.layers:
        mixer = layer.linear_attn if layer.is_linear else layer.self_attn
        names = (["in_proj_qkv", "in_proj_z", "out_proj"] if layer.is_linear
                 else ["q_proj", "v_proj"])
        for name in names:
            setattr(mixer, name, LoRALinear.from_base(getattr(mixer, name), r=rank, scale=4.0))


def loss_fn(model, batch, lengths):
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits = model(inputs)
    steps = mx.arange(1, targets.shape[1] + 1)
    mask = (steps >= lengths[:, 0:1]) & (steps <= lengths[:, 1:])
    ce = nn.losses.cross_entropy(logits, targets) * mask
    return ce.astype(mx.float32).sum() / mask.sum()


def train(patched, data, lengths, steps):
    mx.random.seed(SEED)
    LoRALinear = support.import_lora_linear()
    model = qwen35(mx.float32)
    add_lora(model, LoRALinear)
    model.train()
    opt = optim.Adam(learning_rate=1e-3)
    step = nn.value_and_grad(model, loss_fn)
    if patched:
        mkl.patch()
    losses, first = [], None
    try:
        for i in range(steps):
            loss, grads = step(model, data[i % len(data)], lengths)
            if first is None:
                first = dict(tree_flatten(grads))
            opt.update(model, grads)
            mx.eval(model.parameters(), opt.state, loss)
            losses.append(float(loss))
    finally:
        mkl.unpatch()
    n_train = sum(p.size for _, p in tree_flatten(model.trainable_parameters()))
    return losses, n_train, first


class Lora(unittest.TestCase):
    def test_loss_curves_agree(self):
        mx.random.seed(SEED + 5)
        B, T = 2, 65
        # one batch, fitted step after step: each sequence repeats a short random motif
        motif = mx.random.randint(0, 512, (B, 9))
        data = [mx.tile(motif, (1, 8))[:, :T]]
        lengths = mx.array([[0, T - 1]] * B)

        calls = []
        original = mkl._mk.gated_delta_update_chunked

        def spy(*a, **kw):
            calls.append(a[0].shape)
            return original(*a, **kw)

        mkl._mk.gated_delta_update_chunked = spy
        try:
            patched, n_train, grads = train(True, data, lengths, STEPS)
        finally:
            mkl._mk.gated_delta_update_chunked = original
        ref, _, ref_grads = train(False, data, lengths, STEPS)
        worst = max(float(mx.abs(grads[n] - g).max()) / max(1e-6, float(mx.abs(g).max()))
                    for n, g in ref_grads.items())
        if not QUIET:
            print(f"\n  LoRA (rank 8, {n_train} trainable parameters, batch {B} x {T - 1} tokens, "
                  f"Adam 1e-3), loss per step:")
            print(f"  first step's LoRA gradients: largest difference {worst:.2e} of each "
                  "gradient's largest magnitude")
            print("  step  mlx-lm    mlxkern   |diff|")
            for i, (a, b) in enumerate(zip(ref, patched)):
                print(f"  {i:4d}  {a:.6f}  {b:.6f}  {abs(a - b):.2e}")
        self.assertEqual(len(calls), 3 * STEPS)  # 3 linear-attention layers a step, chunked
        self.assertLess(worst, 1e-3)
        for a, b in zip(ref, patched):
            self.assertLess(abs(a - b), 2e-3 * max(1.0, abs(a)))
        self.assertLess(patched[-1], patched[0] - 0.05, "the loss falls")


if __name__ == "__main__":
    unittest.main()
