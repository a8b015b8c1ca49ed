"""Training through mlxkern from C++ against the same training in mlx-lm 0.32.2.

The model: one Qwen3.5 GatedDeltaNet layer (mlx-lm's `qwen3_5.GatedDeltaNet`) at small shapes,
float32, with random weights, and a LoRA adapter (mlx-lm's `tuner.lora.LoRALinear`: rank 8,
scale 20, A uniform +-1/sqrt(hidden), B zero) on in_proj_qkv; only A and B are trained. The
task: regress the output of a fixed "teacher", the same layer with a random low-rank change of
in_proj_qkv (which the adapter can represent exactly), on B random sequences of T tokens (one
batch, or N batches taken in turn), mean squared error, Adam (mlx.optimizers.Adam) with its
learning rate decayed to 0 over the run (mlx.optimizers.cosine_decay).

This script writes the weights, the data and the adapter's initial matrices (safetensors; the
seed is printed), runs examples/cpp/qwen35_train on them (the engine layer of
examples/cpp/qwen35_gdn.hpp, MLX ops + mlxkern kernels, trained with mx::value_and_grad through
the kernels' backward nodes), trains the mlx-lm module on the same (nn.value_and_grad,
mlx.optimizers.Adam), and compares the two loss curves step by step.

    .venv/bin/python3 tests/cpp/test_qwen35_train.py --binary build/cpp/qwen35_train \\
        [--steps N] [--seed N] [--recurrence exact|chunked] [--curves PREFIX] [--plot PNG] \\
        [--batch B] [--tokens T] [--batches N] [--workdir DIR]

--curves writes PREFIX.csv and PREFIX.json (both curves, the configuration, timings); --plot a
PNG of both curves and their relative difference (needs matplotlib). Exit status 0 when the
curves agree within the tolerance below and both losses decreased.

Tolerance. Both sides compute in float32 from identical inputs and differ only in rounding: the
kernels reduce in the Metal order (lane partials, then a butterfly) where MLX's CPU ops sum in
order; the recurrence's backward pass recomputes the forward from checkpoints and sums its
chain in its own order, while mlx-lm's recurrence is a Python loop of MLX ops differentiated by
MLX. So the forward pass, hence step 0's loss, agrees to about 1e-7 relative, and so do the
gradients. Each step feeds these differences back through the parameters, and how much a
training run amplifies them is a property of the run, not of mlxkern: mlx-lm against itself
with A perturbed by 1e-7 (relative) separates to 0.2 relative by step 300 at a constant
learning rate of 1e-3 over 8 batches of 2 taken in turn (plain SGD at 0.5: by 2 to 5 %), while
in this setting (one batch, 3e-4 decayed to 0) it stays within 2e-6. The bounds:
  - steps 0 to EARLY_STEPS-1: |l_mlxkern - l_mlx_lm| <= EARLY_REL * l_mlx_lm (measured: at
    most 9e-7 over 32 runs of 25 steps, exact and chunked recurrence, seeds 100-115); a
    gradient with one term halved (q's share of the chain, in a deliberately broken engine)
    exceeds it by step 2 (4.6e-5), one with k's share dropped by step 1 (6e-2);
  - every step: <= ALL_REL (measured over 300 steps: at most 1.2e-5, seeds 1 and 11-18 and a
    chunked run; mostly 1-2e-6): a long run's drift grows slowly and varies with the seed,
    and this bound leaves it room while a curve that visibly departs still fails;
  - the final losses within FINAL_REL of each other (measured: at most 9.3e-6);
  - both curves decrease: the final loss below DECREASE times the initial (measured: x0.24 to
    x0.29 after 25 steps, x0.017 to x0.027 after 300).
Initial and final losses are means over one pass of the data (the first and the last N steps),
so that both compare the same batches.
"""

import argparse
import csv
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def import_mlx_lm():
    """mlx_lm.models.qwen3_5 and mlx_lm.tuner.lora without running the packages' __init__.py
    (mlx_lm's imports transformers, mlx_lm.tuner's its trainer)."""
    spec = importlib.util.find_spec("mlx_lm")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("mlx-lm is not installed in this Python (run make bootstrap)")
    base = list(spec.submodule_search_locations)[0]
    for name, path in (("mlx_lm", base), ("mlx_lm.tuner", os.path.join(base, "tuner"))):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [path]
            sys.modules[name] = package
    import mlx_lm.models.qwen3_5 as qwen3_5
    from mlx_lm.tuner.lora import LoRALinear

    return qwen3_5, LoRALinear


import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import mlx.optimizers as optim  # noqa: E402
from mlx.utils import tree_flatten  # noqa: E402

qwen3_5, LoRALinear = import_mlx_lm()

FIELDS = dict(hidden_size=128, linear_num_key_heads=2, linear_num_value_heads=4,
              linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4,
              rms_norm_eps=1e-6)
RANK = 8              # the adapter's rank
LORA_SCALE = 20.0     # LoRALinear's default scale
TEACHER_RANK = 4      # rank of the teacher's change of in_proj_qkv
TEACHER_STD = 0.02    # its factors' scale: |dW| about 0.8 |W|
LEARNING_RATE = 3e-4  # Adam's, decayed to 0 over the run (mlx.optimizers.cosine_decay)
BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8

EARLY_STEPS = 10
EARLY_REL = 1e-5
ALL_REL = 1e-3
FINAL_REL = 1e-3
DECREASE = 0.5


def make_problem(seed, batch, tokens, batches):
    """The student layer (float32, eval mode), the teacher's targets, the data and the
    adapter's initial matrices, all from `seed`."""
    mx.random.seed(seed)
    args = qwen3_5.TextModelArgs(**FIELDS)
    layer = qwen3_5.GatedDeltaNet(args)
    nv, dv = FIELDS["linear_num_value_heads"], FIELDS["linear_value_head_dim"]
    hidden = FIELDS["hidden_size"]
    # As tests/cpp/test_qwen35_layer.py: decays g in (0.2, 1), a gated norm weight not all ones.
    layer.A_log = mx.log(mx.random.uniform(0.02, 1.0, (nv,)))
    layer.dt_bias = mx.random.normal((nv,)) * 0.5
    layer.norm.weight = 1.0 + 0.2 * mx.random.normal((dv,))
    layer.eval()
    w = layer.in_proj_qkv.weight
    delta = TEACHER_STD * (mx.random.normal((w.shape[0], TEACHER_RANK))
                           @ mx.random.normal((TEACHER_RANK, hidden)))
    teacher = qwen3_5.GatedDeltaNet(args)
    teacher.update(layer.parameters())
    teacher.in_proj_qkv.weight = w + delta
    teacher.eval()
    x = mx.random.normal((batches, batch, tokens, hidden))
    target = mx.stack([teacher(x[n]) for n in range(batches)])
    bound = 1.0 / np.sqrt(hidden)
    lora_a = mx.random.uniform(-bound, bound, (hidden, RANK))
    lora_b = mx.zeros((RANK, w.shape[0]))
    mx.eval(layer.parameters(), x, target, lora_a, lora_b)
    return layer, x, target, lora_a, lora_b


def train_mlx_lm(layer, x, target, lora_a, lora_b, steps):
    """mlx-lm's module with a LoRALinear on in_proj_qkv, trained with nn.value_and_grad and
    mlx.optimizers.Adam. Returns the loss before each update and the seconds taken."""
    layer.freeze()
    adapter = LoRALinear.from_base(layer.in_proj_qkv, r=RANK, scale=LORA_SCALE)
    adapter.lora_a = lora_a
    adapter.lora_b = lora_b
    layer.in_proj_qkv = adapter
    layer.train()
    trainable = sorted(name for name, _ in tree_flatten(layer.trainable_parameters()))
    assert trainable == ["in_proj_qkv.lora_a", "in_proj_qkv.lora_b"], trainable

    def loss_fn(model, inputs, wanted):
        return mx.mean(mx.square(model(inputs) - wanted))

    loss_and_grad = nn.value_and_grad(layer, loss_fn)
    optimizer = optim.Adam(learning_rate=optim.cosine_decay(LEARNING_RATE, steps),
                           betas=list(BETAS), eps=ADAM_EPS)
    losses = []
    start = time.monotonic()
    for s in range(steps):
        n = s % x.shape[0]
        loss, grads = loss_and_grad(layer, x[n], target[n])
        optimizer.update(layer, grads)
        mx.eval(loss, layer.parameters(), optimizer.state)
        losses.append(loss.item())
    return np.array(losses), time.monotonic() - start, adapter


def relative(got, want):
    return np.abs(got - want) / np.abs(want)


def table_steps(steps):
    picks = {0, 1, 2, 3, 5, 10, 20, steps - 1}
    picks |= {int(round(steps * f)) for f in (0.1, 0.25, 0.5, 0.75)}
    picks |= set(range(0, steps, max(1, steps // 10)))
    return sorted(p for p in picks if 0 <= p < steps)


def write_curves(prefix, ours, theirs, info):
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    with open(prefix + ".csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", "mlxkern", "mlx_lm", "relative_difference"])
        for s, (a, b) in enumerate(zip(ours, theirs)):
            writer.writerow([s, f"{a:.9e}", f"{b:.9e}", f"{abs(a - b) / abs(b):.3e}"])
    with open(prefix + ".json", "w") as f:
        json.dump(dict(info, mlxkern=[float(v) for v in ours], mlx_lm=[float(v) for v in theirs]),
                  f, indent=1)
    print(f"  curves: {prefix}.csv, {prefix}.json")


def plot(path, ours, theirs, info):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.arange(len(ours))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                      gridspec_kw=dict(height_ratios=[3, 1.3]))
    top.plot(steps, theirs, color="#888888", linewidth=3.5, alpha=0.7,
             label="mlx-lm 0.32.2 (Python, MLX ops)")
    top.plot(steps, ours, color="#d62728", linewidth=1.2,
             label="mlxkern (C++ host, mx::value_and_grad through the kernels)")
    top.set_yscale("log")
    top.set_ylabel("loss (MSE to the teacher)")
    top.legend()
    top.grid(True, which="both", alpha=0.3)
    top.set_title(f"LoRA (rank {info['rank']}) on in_proj_qkv of a Qwen3.5 GDN layer, "
                  f"B={info['batch']}, T={info['tokens']}, Adam lr {info['learning_rate']:g} "
                  "(cosine decay)",
                  fontsize=10)
    rel = relative(ours, theirs)
    floor = 1e-9  # equal losses are drawn at the floor
    bottom.semilogy(steps, np.maximum(rel, floor), ".", color="#1f77b4", markersize=3,
                    label=f"|mlxkern - mlx-lm| / mlx-lm (equal: drawn at {floor:g})")
    bottom.axhline(ALL_REL, color="#d62728", linewidth=0.8, linestyle="--",
                   label=f"tolerance {ALL_REL:g}")
    bottom.hlines(EARLY_REL, 0, min(EARLY_STEPS, len(ours)) - 1, color="#d62728", linewidth=1.5,
                  label=f"steps 0-{EARLY_STEPS - 1}: {EARLY_REL:g}")
    bottom.set_ylim(floor / 2, ALL_REL * 20)
    bottom.legend(fontsize=7, loc="upper left")
    bottom.set_ylabel("relative difference")
    bottom.set_xlabel("step")
    bottom.grid(True, which="both", alpha=0.3)
    fig.text(0.01, 0.005, f"hidden {FIELDS['hidden_size']}, Hk {FIELDS['linear_num_key_heads']}, "
             f"Hv {FIELDS['linear_num_value_heads']}, Dk = Dv = {FIELDS['linear_key_head_dim']}, "
             f"float32; seed {info['seed']}; {info['machine']}", fontsize=7, color="#555555")
    fig.tight_layout(rect=(0, 0.02, 1, 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"  plot: {path}")


def machine():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model or 'CPU'}, {os.cpu_count()} CPUs"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--binary", default=os.path.join(ROOT, "build", "cpp", "qwen35_train"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--batches", type=int, default=1)
    parser.add_argument("--recurrence", choices=["exact", "chunked"], default="exact",
                        help="the engine's recurrence (mlxk_gated_delta_update or _chunked)")
    parser.add_argument("--seed", type=int, default=int(os.environ.get("MLXK_TRAIN_SEED", "0")) or
                        int.from_bytes(os.urandom(4), "little"))
    parser.add_argument("--curves", help="write PREFIX.csv and PREFIX.json")
    parser.add_argument("--plot", help="write a PNG of both curves")
    parser.add_argument("--workdir")
    options = parser.parse_args()
    if options.steps < 2 * options.batches:
        parser.error("--steps must be at least twice --batches")

    mx.set_default_device(mx.cpu)
    print(f"seed {options.seed} (set MLXK_TRAIN_SEED or --seed to replay)")
    workdir = options.workdir or tempfile.mkdtemp(prefix="mlxkern-train-")
    os.makedirs(workdir, exist_ok=True)
    try:
        return run(options, workdir)
    finally:
        if not options.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


def run(options, workdir):
    steps = options.steps
    print(f"== LoRA rank {RANK} (scale {LORA_SCALE:g}) on in_proj_qkv of a Qwen3.5 GDN layer: "
          + ", ".join(f"{k} {v}" for k, v in FIELDS.items())
          + f"; float32; {steps} steps, B {options.batch}, T {options.tokens}, "
          f"{options.batches} batches; Adam lr {LEARNING_RATE:g}; the engine's recurrence "
          f"{options.recurrence}")
    start = time.monotonic()
    layer, x, target, lora_a, lora_b = make_problem(options.seed, options.batch, options.tokens,
                                                    options.batches)
    weights_path = os.path.join(workdir, "train.weights.safetensors")
    data_path = os.path.join(workdir, "train.data.safetensors")
    out_path = os.path.join(workdir, "train.out.safetensors")
    mx.save_safetensors(weights_path, dict(tree_flatten(layer.parameters())),
                        metadata={k: str(v) for k, v in FIELDS.items()})
    mx.save_safetensors(data_path, dict(x=x, target=target, lora_a=lora_a, lora_b=lora_b),
                        metadata=dict(steps=str(steps), learning_rate=repr(LEARNING_RATE),
                                      lora_scale=repr(LORA_SCALE), beta1=repr(BETAS[0]),
                                      beta2=repr(BETAS[1]), eps=repr(ADAM_EPS),
                                      decay_steps=str(steps),
                                      recurrence=options.recurrence))
    setup_s = time.monotonic() - start

    start = time.monotonic()
    result = subprocess.run([options.binary, weights_path, data_path, out_path],
                            capture_output=True, text=True)
    engine_s = time.monotonic() - start
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stdout.write(result.stderr)
        print(f"FAIL: {options.binary} exited with status {result.returncode}")
        return 1
    out, meta = mx.load(out_path, return_metadata=True)
    ours = np.array(out["loss"], dtype=np.float64)

    theirs, reference_s, adapter = train_mlx_lm(layer, x, target, lora_a, lora_b, steps)

    rel = relative(ours, theirs)
    print(f"  {'step':>5} {'mlxkern loss':>14} {'mlx-lm loss':>14} {'relative diff':>14}")
    for s in table_steps(steps):
        print(f"  {s:>5} {ours[s]:>14.7e} {theirs[s]:>14.7e} {rel[s]:>14.2e}")
    window = options.batches  # one pass over the data
    first_ours, first_theirs = float(np.mean(ours[:window])), float(np.mean(theirs[:window]))
    final_ours = float(np.mean(ours[-window:]))
    final_theirs = float(np.mean(theirs[-window:]))
    over = f" (mean over a pass of the {window} batches)" if window > 1 else ""
    final_rel = abs(final_ours - final_theirs) / final_theirs
    early = rel[:EARLY_STEPS]
    a_rel = float(mx.max(mx.abs(out["lora_a"] - adapter.lora_a)) / mx.max(mx.abs(adapter.lora_a)))
    b_rel = float(mx.max(mx.abs(out["lora_b"] - adapter.lora_b)) / mx.max(mx.abs(adapter.lora_b)))
    print(f"  max relative difference: steps 0-{EARLY_STEPS - 1} {early.max():.2e} "
          f"(tolerance {EARLY_REL:g}), all steps {rel.max():.2e} at step {int(rel.argmax())} "
          f"(tolerance {ALL_REL:g}); final loss{over} "
          f"{final_ours:.6e} vs {final_theirs:.6e}, {final_rel:.2e} apart "
          f"(tolerance {FINAL_REL:g})")
    print(f"  final adapter: A within {a_rel:.2e}, B within {b_rel:.2e} of mlx-lm's (max |d| / "
          f"max |p|)")
    print(f"  loss{over}, first -> last: {first_theirs:.4e} -> "
          f"{final_theirs:.4e} (mlx-lm), {first_ours:.4e} -> {final_ours:.4e} (mlxkern): "
          f"x{final_ours / first_ours:.3f}")
    engine_train_s = float(meta.get("seconds", "nan"))
    print(f"  timings: setup {setup_s:.2f} s; mlxkern (C++) training {engine_train_s:.2f} s "
          f"(median {float(meta.get('step_ms_median', 'nan')):.1f} ms per step; process "
          f"{engine_s:.2f} s); mlx-lm training {reference_s:.2f} s")

    info = dict(seed=options.seed, steps=steps, batch=options.batch, tokens=options.tokens,
                batches=options.batches, recurrence=options.recurrence, rank=RANK,
                lora_scale=LORA_SCALE,
                learning_rate=LEARNING_RATE, betas=list(BETAS), eps=ADAM_EPS, fields=FIELDS,
                dtype="float32", machine=machine(),
                tolerance=dict(early_steps=EARLY_STEPS, early_rel=EARLY_REL, all_rel=ALL_REL,
                               final_window=window, final_rel=FINAL_REL,
                               decrease=DECREASE),
                max_relative_difference=dict(early=float(early.max()), all=float(rel.max()),
                                             final=final_rel),
                seconds=dict(mlxkern=engine_train_s, mlx_lm=reference_s))
    if options.curves:
        write_curves(options.curves, ours, theirs, info)
    if options.plot:
        plot(options.plot, ours, theirs, info)

    failures = []
    if not np.all(np.isfinite(ours)):
        failures.append("mlxkern's loss is not finite")
    if early.max() > EARLY_REL:
        failures.append(f"steps 0-{EARLY_STEPS - 1}: relative difference {early.max():.3g} > "
                        f"{EARLY_REL:g}")
    if rel.max() > ALL_REL:
        failures.append(f"step {int(rel.argmax())}: relative difference {rel.max():.3g} > "
                        f"{ALL_REL:g}")
    if final_rel > FINAL_REL:
        failures.append(f"final losses {final_rel:.3g} apart > {FINAL_REL:g}")
    for name, first, final in (("mlxkern", first_ours, final_ours),
                               ("mlx-lm", first_theirs, final_theirs)):
        if not final < DECREASE * first:
            failures.append(f"{name}: the loss did not decrease below {DECREASE:g}x "
                            f"({first:.4g} -> {final:.4g})")
    for failure in failures:
        print(f"FAIL: {failure}")
    if not failures:
        print(f"PASS: {steps} training steps through mlxkern's kernels match mlx-lm's loss curve "
              f"(max relative difference {rel.max():.2e}; loss x{final_ours / first_ours:.3f})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
