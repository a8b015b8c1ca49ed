"""LoRA training on mlx-lm's qwen3_5.Model (small random configuration) with and without
mlxkern.mlx_lm.patch(): the same adapters (mlx-lm's LoRALinear on the linear-attention and
attention projections), data, optimizer (mlx.optimizers.Adam) and seed; the loss curves side by
side must agree step by step, and the patched run's gradients go through mlxkern's kernels
(chunked form: sequences of 64 tokens).

Two runs of each: mlx-lm's own trainer (mlx_lm.tuner.trainer.train, its compiled step, batching
and default_loss, losses read through a TrainingCallback; it needs rich and transformers, which
scripts/python/trainer-deps.sh installs into build/py-deps), and a step written here with the
same loss formula, which also compares the first step's gradients directly."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import unittest

import numpy as np

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


def trainer_run(patched, dataset, steps, batch_size):
    """mlx-lm's train() for `steps` iterations, a loss report every step; returns the losses."""
    train_fn, TrainingArgs, TrainingCallback = support.import_trainer()

    class Record(TrainingCallback):
        def __init__(self):
            self.losses = []

            self.tok_s = []

        def on_train_loss_report(self, info):
            self.losses.append(info["train_loss"])
            self.tok_s.append(info["tokens_per_second"])

    mx.random.seed(SEED)
    np.random.seed(SEED % (1 << 32))  # the trainer's batch order
    LoRALinear = support.import_lora_linear()
    model = qwen35(mx.float32)
    add_lora(model, LoRALinear)
    opt = optim.Adam(learning_rate=1e-3)
    record = Record()
    if patched:
        mkl.patch()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            args = TrainingArgs(batch_size=batch_size, iters=steps, steps_per_report=1,
                                steps_per_save=steps + 1, max_seq_length=256,
                                adapter_file=os.path.join(tmp, "adapters.safetensors"))
            quiet = contextlib.redirect_stdout(io.StringIO()) if QUIET else contextlib.nullcontext()
            with quiet:  # the trainer's terminal UI
                train_fn(model, opt, dataset, args=args, training_callback=record)
    finally:
        mkl.unpatch()
    return record.losses, record.tok_s


class LoraTrainer(unittest.TestCase):
    def test_trainer_loss_curves_agree(self):
        support.import_trainer()
        mx.random.seed(SEED + 6)
        # 6 sequences of 64 tokens, each a short random motif repeated; batches of 2 (the
        # trainer pads them to 65 columns: 64 input tokens a row)
        n, T, B = 6, 64, 2
        motifs = mx.random.randint(0, 512, (n, 7)).tolist()
        dataset = [((m * (T // len(m) + 1))[:T], 0) for m in motifs]

        calls = []
        original = mkl._mk.gated_delta_update_chunked

        def spy(*a, **kw):
            calls.append(a[0].shape)
            return original(*a, **kw)

        mkl._mk.gated_delta_update_chunked = spy
        try:
            patched, fast = trainer_run(True, dataset, STEPS, B)
        finally:
            mkl._mk.gated_delta_update_chunked = original
        ref, slow = trainer_run(False, dataset, STEPS, B)
        if not QUIET:
            print(f"\n  mlx-lm's trainer, LoRA rank 8, batch {B} x {T} tokens, Adam 1e-3, "
                  f"{n} sequences; train_loss per step:")
            print("  step  mlx-lm    mlxkern   |diff|")
            for i, (a, b) in enumerate(zip(ref, patched)):
                print(f"  {i + 1:4d}  {a:.6f}  {b:.6f}  {abs(a - b):.2e}")
            print(f"  trainer's tokens/s after the first step (median): mlx-lm "
                  f"{sorted(slow[1:])[len(slow) // 2 - 1]:.0f}, mlxkern "
                  f"{sorted(fast[1:])[len(fast) // 2 - 1]:.0f}")
        self.assertEqual(len(ref), STEPS)
        self.assertEqual(len(patched), STEPS)
        # the compiled step traces the model once: 3 linear-attention layers through the kernel
        self.assertGreaterEqual(len(calls), 3)
        self.assertTrue(all(shape == (B, T) + shape[2:] for shape in calls), calls)
        for a, b in zip(ref, patched):
            self.assertLess(abs(a - b), 2e-3 * max(1.0, abs(a)))
        self.assertLess(patched[-1], patched[0] - 0.05, "the loss falls")


if __name__ == "__main__":
    unittest.main()
