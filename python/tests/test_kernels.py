"""The mlxkern package's kernels on mx.array: against mlx-lm's own formulation (float32 ops on the
CPU), between each other (chunked vs exact, pools vs gathered rows, packed vs one sequence at a
time), MLX autograd through the kernels' nodes against the explicit backward calls, and the
errors. Random inputs from a seed printed at start (MLXK_PY_SEED to repeat one)."""

from __future__ import annotations

import os
import random
import unittest

import mlx.core as mx
import numpy as np

import mlxkern as mk
import support  # noqa: F401  (mlx_lm importable)

SEED = int(os.environ.get("MLXK_PY_SEED", random.randrange(1 << 30)))
print(f"test_kernels: seed {SEED}")


def rnd(shape, dtype=mx.float32, scale=1.0):
    return (scale * mx.random.normal(shape)).astype(dtype)


def inputs(B, T, Hk, Hv, Dk, Dv, dtype=mx.float32, state=True, mask=False):
    """Random update arguments with q, k normalized as mlx-lm's normalize_qk does."""
    from mlx_lm.models.gated_delta import normalize_qk

    q, k = normalize_qk(rnd((B, T, Hk, Dk)), rnd((B, T, Hk, Dk)), inv_scale=Dk**-0.5, eps=1e-6)
    args = dict(
        q=q.astype(dtype), k=k.astype(dtype), v=rnd((B, T, Hv, Dv), dtype),
        a=rnd((B, T, Hv), dtype), b=rnd((B, T, Hv), dtype),
        A_log=mx.random.uniform(-1.0, 1.0, (Hv,)), dt_bias=rnd((Hv,), dtype),
        state=rnd((B, Hv, Dv, Dk), scale=0.1) if state else None, mask=None)
    if mask:
        # right padding: row b has lengths[b] real tokens
        lengths = [T] + [random.randint(1, T) for _ in range(B - 1)]
        args["mask"] = mx.arange(T)[None, :] < mx.array(lengths)[:, None]
    return args


def reference(args):
    """mlx-lm's own update on the CPU (its ops path: the loop of compiled steps)."""
    from mlx_lm.models.gated_delta import gated_delta_update

    return gated_delta_update(**args, use_kernel=False)


def close(test, got, want, rtol, what):
    got = np.array(got.astype(mx.float32))
    want = np.array(want.astype(mx.float32))
    scale = max(1.0, float(np.abs(want).max()))
    err = float(np.abs(got - want).max()) / scale
    test.assertLessEqual(err, rtol, f"{what}: max error {err:.3g} of scale {scale:.3g}")


def same(test, got, want, what):
    test.assertEqual(got.dtype, want.dtype, what)
    test.assertEqual(got.shape, want.shape, what)
    test.assertTrue(np.array_equal(np.array(got.astype(mx.float32)),
                                   np.array(want.astype(mx.float32)), equal_nan=True), what)


SHAPES = [  # B, T, Hk, Hv, Dk, Dv
    (1, 1, 1, 1, 32, 16),
    (2, 7, 2, 4, 64, 32),
    (3, 33, 2, 6, 128, 64),
    (1, 70, 1, 2, 96, 8),
]


class Update(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        mx.random.seed(SEED)
        random.seed(SEED)

    def test_exact_matches_mlx_lm(self):
        for shape in SHAPES:
            for dtype in (mx.float32, mx.bfloat16):
                args = inputs(*shape, dtype=dtype)
                y, s = mk.gated_delta_update(**args)
                ry, rs = reference(args)
                self.assertEqual(y.dtype, dtype)
                self.assertEqual(s.dtype, mx.float32)
                self.assertEqual(y.shape, ry.shape)
                self.assertEqual(s.shape, rs.shape)
                tol = 2e-5 if dtype == mx.float32 else 1.6e-2
                close(self, y, ry, tol, f"y {shape} {dtype}")
                close(self, s, rs, 2e-5, f"state {shape} {dtype}")

    def test_masked_right_padding(self):
        for shape in SHAPES[1:3]:
            args = inputs(*shape, mask=True)
            y, s = mk.gated_delta_update(**args)
            ry, rs = reference(args)
            m = np.array(args["mask"])
            yn, ryn = np.array(y), np.array(ry)
            self.assertTrue(np.all(yn[~m] == 0), "y at masked tokens is 0")
            self.assertLess(np.abs(yn[m] - ryn[m]).max(), 2e-5 * max(1, np.abs(ryn[m]).max()))
            close(self, s, rs, 2e-5, f"masked state {shape}")

    def test_no_state_is_zeros(self):
        args = inputs(2, 5, 1, 3, 32, 16, state=False)
        y, s = mk.gated_delta_update(**args)
        y0, s0 = mk.gated_delta_update(**{**args, "state": mx.zeros(s.shape)})
        same(self, y, y0, "y")
        same(self, s, s0, "state")

    def test_chunked_close_to_exact(self):
        for shape in [(2, 64, 2, 4, 64, 32), (1, 100, 1, 2, 128, 128), (2, 17, 2, 2, 32, 16)]:
            for chunk in (0, 16, 64):
                args = inputs(*shape, mask=shape[0] > 1)
                y, s = mk.gated_delta_update(**args)
                cy, cs = mk.gated_delta_update_chunked(**args, chunk_size=chunk)
                close(self, cy, y, 1e-5, f"chunked y {shape} {chunk}")
                close(self, cs, s, 1e-5, f"chunked state {shape} {chunk}")

    def test_lazy_and_one_graph(self):
        # lazy host nodes in, lazy results out, consumed by the host's own ops; one eval
        args = inputs(1, 4, 1, 2, 32, 16)
        args["v"] = args["v"] * 2.0 + 1.0
        y, s = mk.gated_delta_update(**args)
        out = (y.sum() + s.sum()) * 0.5
        mx.eval(out)
        ry, rs = reference(args)
        close(self, out, (ry.sum() + rs.sum()) * 0.5, 1e-5, "graph")

    def test_compute_g_bit_for_bit(self):
        from mlx_lm.models.gated_delta import compute_g

        for dtype in (mx.float32, mx.bfloat16):
            A_log, a, dt = rnd((6,)), rnd((2, 9, 6), dtype), rnd((6,), dtype)
            same(self, mk.compute_g(A_log, a, dt), compute_g(A_log, a, dt), f"g {dtype}")

    def test_from_conv_is_heads_then_update(self):
        B, T, Hk, Hv, Dk, Dv = 2, 6, 2, 4, 64, 32
        x = rnd((B, T, 2 * Hk * Dk + Hv * Dv))
        qs, ks = mx.full((Dk,), Dk**-1.0), mx.full((Dk,), Dk**-0.5)
        args = inputs(B, T, Hk, Hv, Dk, Dv, mask=True)
        q, k, v = mk.silu_rms_heads(x, qs, ks, Hk, Hv, Dv, 1e-6 / Dk)
        y, s = mk.gated_delta_update(q, k, v, args["a"], args["b"], args["A_log"],
                                     args["dt_bias"], args["state"], args["mask"])
        fy, fs = mk.gated_delta_update_from_conv(x, qs, ks, Hk, Hv, Dv, 1e-6 / Dk, args["a"],
                                                 args["b"], args["A_log"], args["dt_bias"],
                                                 args["state"], args["mask"])
        same(self, fy, y, "y")
        same(self, fs, s, "state")

    def test_state_replay(self):
        B, T = 3, 9
        args = inputs(B, T, 2, 4, 32, 16)
        lengths = [0, 4, 9]
        s = mk.gated_delta_state(args["k"], args["v"], args["a"], args["b"], args["A_log"],
                                 args["dt_bias"], args["state"], lengths)
        for row, n in enumerate(lengths):
            sub = {key: (val[row:row + 1, :n] if key in "qkvab" else val)
                   for key, val in args.items() if key not in ("state", "mask")}
            want = args["state"][row:row + 1]
            if n:
                want = mk.gated_delta_update(**sub, state=args["state"][row:row + 1]).state
            same(self, s[row:row + 1], want, f"row {row}")


class Pools(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        mx.random.seed(SEED + 1)

    def setUp(self):
        self.B, self.T, self.N = 3, 5, 6
        self.args = inputs(self.B, self.T, 2, 4, 32, 16, state=False)
        self.pool = rnd((self.N, 4, 16, 32), scale=0.1)
        self.slots = [4, -1, 1]
        self.fresh = [False, False, True]

    def gathered(self, row, chunk=None):
        slot = self.slots[row]
        start = mx.zeros((1, 4, 16, 32)) if self.fresh[row] else self.pool[slot:slot + 1]
        sub = {k: v[row:row + 1] if v.ndim > 1 else v for k, v in self.args.items()
               if v is not None}
        if chunk is None:
            return mk.gated_delta_update(**sub, state=start)
        return mk.gated_delta_update_chunked(**sub, state=start, chunk_size=chunk)

    def test_update_pool(self):
        for chunk in (None, 16):
            a = {k: v for k, v in self.args.items() if k not in ("state", "mask")}
            y, pool = mk.gated_delta_update_pool(**a, pool=self.pool, slots=self.slots,
                                                 fresh=self.fresh, chunk_size=chunk)
            for row, slot in enumerate(self.slots):
                if slot < 0:
                    self.assertTrue(np.all(np.array(y[row]) == 0))
                    continue
                gy, gs = self.gathered(row, chunk)
                same(self, y[row:row + 1], gy, f"y row {row}")
                same(self, pool[slot:slot + 1], gs, f"slot {slot}")
            for slot in set(range(self.N)) - set(self.slots):
                same(self, pool[slot], self.pool[slot], f"untouched slot {slot}")
            verify = mk.gated_delta_verify_pool(**a, pool=self.pool, slots=self.slots,
                                                fresh=self.fresh)
            if chunk is None:
                same(self, verify, y, "verify")

    def test_state_pool_commit(self):
        a = {k: v for k, v in self.args.items() if k not in ("state", "mask", "q")}
        lengths = [2, 0, 5]
        pool = mk.gated_delta_state_pool(**a, pool=self.pool, slots=self.slots,
                                         accepted_lengths=lengths, fresh=self.fresh)
        start = mx.concatenate([self.pool[4:5], mx.zeros((1, 4, 16, 32)),
                                mx.zeros((1, 4, 16, 32))])
        want = mk.gated_delta_state(**a, state=start, accepted_lengths=lengths)
        same(self, pool[4], want[0], "slot 4")
        same(self, pool[1], want[2], "fresh slot 1")

    def test_packed(self):
        lens = [3, 0, 6]
        cu = [0, 3, 3, 9]
        T = cu[-1]
        args = inputs(1, T, 2, 4, 32, 16, state=False)
        a = {k: v for k, v in args.items() if v is not None}
        slots = [0, 2, 5]
        for chunk in (None, 32):
            y, pool = mk.gated_delta_update_packed(**a, pool=self.pool, cu_seqlens=cu,
                                                   slots=slots, chunk_size=chunk)
            for i, n in enumerate(lens):
                if n == 0:
                    continue
                sub = {k: v[:, cu[i]:cu[i + 1]] if v.ndim > 1 else v for k, v in a.items()}
                start = self.pool[slots[i]:slots[i] + 1]
                if chunk is None:
                    gy, gs = mk.gated_delta_update(**sub, state=start)
                else:
                    gy, gs = mk.gated_delta_update_chunked(**sub, state=start, chunk_size=chunk)
                same(self, y[:, cu[i]:cu[i + 1]], gy, f"y seq {i}")
                same(self, pool[slots[i]:slots[i] + 1], gs, f"state seq {i}")

    def test_from_conv_pool(self):
        B, T, Hk, Hv, Dk, Dv = 3, 5, 2, 4, 32, 16
        x = rnd((B, T, 2 * Hk * Dk + Hv * Dv))
        qs, ks = mx.full((Dk,), Dk**-1.0), mx.full((Dk,), Dk**-0.5)
        q, k, v = mk.silu_rms_heads(x, qs, ks, Hk, Hv, Dv, 1e-6)
        g = {n: self.args[n] for n in ("a", "b", "A_log", "dt_bias")}
        y, pool = mk.gated_delta_update_from_conv_pool(x, qs, ks, Hk, Hv, Dv, 1e-6, **g,
                                                       pool=self.pool, slots=self.slots,
                                                       fresh=self.fresh)
        wy, wpool = mk.gated_delta_update_pool(q, k, v, **g, pool=self.pool, slots=self.slots,
                                               fresh=self.fresh)
        same(self, y, wy, "y")
        same(self, pool, wpool, "pool")


def address(array):
    """The address of an evaluated mx.array's data (through the buffer protocol; the view is
    dropped at once so that it holds no reference)."""
    view = np.array(array, copy=False)
    addr = view.ctypes.data
    del view
    return addr


class ZeroCopy(unittest.TestCase):
    """The kernels work on the host's own MLX buffers: a state or pool the caller gives up is
    updated in place (the new mx.array has the old one's data address), one the caller keeps
    is left untouched (a new buffer)."""

    def test_state_and_pool_in_place(self):
        mx.random.seed(SEED + 4)
        args = inputs(2, 3, 1, 2, 32, 16)
        a = {k: v for k, v in args.items() if k not in ("state", "mask")}
        for kind in ("state", "pool"):
            for give_up in (True, False):
                if kind == "state":
                    old = rnd((2, 2, 16, 32))
                else:
                    old = rnd((5, 2, 16, 32))
                mx.eval(old)
                before, keep = address(old), np.array(old)
                if kind == "state":
                    _, new = mk.gated_delta_update(**a, state=old)
                else:
                    _, new = mk.gated_delta_update_pool(**a, pool=old, slots=[3, 1])
                if give_up:
                    del old
                mx.eval(new)
                self.assertEqual(address(new) == before, give_up, f"{kind} give_up={give_up}")
                if not give_up:
                    self.assertTrue(np.array_equal(np.array(old), keep), "kept input unchanged")


class Gradients(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        mx.random.seed(SEED + 2)

    def test_vjp_through_update_equals_explicit(self):
        names = ["q", "k", "v", "a", "b", "A_log", "dt_bias", "state"]
        for shape, mask, chunked in [((2, 6, 2, 4, 32, 16), True, False),
                                     ((1, 40, 1, 2, 64, 32), False, True)]:
            args = inputs(*shape, mask=mask)
            dy = rnd((shape[0], shape[1], shape[3], shape[5]))
            ds = rnd(args["state"].shape)
            fwd = mk.gated_delta_update_chunked if chunked else mk.gated_delta_update
            bwd = mk.gated_delta_update_chunked_vjp if chunked else mk.gated_delta_update_vjp

            def f(*prim):
                y, s = fwd(*prim, mask=args["mask"])
                return [y, s]

            primals = [args[n] for n in names]
            _, grads = mx.vjp(f, primals, [dy, ds])
            want = bwd(*primals, mask=args["mask"], dy=dy, dstate=ds)
            for n, g, w in zip(names, grads, want):
                self.assertEqual(g.shape, args[n].shape, n)
                close(self, g, w, 0 if not chunked else 1e-5, f"d{n} chunked={chunked}")

    def test_grad_matches_mlx_lm_ops(self):
        args = inputs(2, 8, 2, 4, 32, 16)
        w = rnd((2, 8, 4, 16))

        def loss(update, q, k, v, a, b):
            y, s = update(q, k, v, a, b, args["A_log"], args["dt_bias"], args["state"])
            return (y * w).sum() + (s * s).sum()

        def ref_update(*p):
            return reference(dict(zip(["q", "k", "v", "a", "b", "A_log", "dt_bias", "state"], p)))

        prim = [args[n] for n in "qkvab"]
        got = mx.grad(lambda *p: loss(mk.gated_delta_update, *p), argnums=(0, 1, 2, 3, 4))(*prim)
        want = mx.grad(lambda *p: loss(ref_update, *p), argnums=(0, 1, 2, 3, 4))(*prim)
        for n, g, r in zip("qkvab", got, want):
            close(self, g, r, 1e-4, f"grad {n}")

    def test_heads_and_norm_grads(self):
        B, S, Hk, Hv, Dk, Dv = 2, 3, 2, 4, 32, 16
        x = rnd((B, S, 2 * Hk * Dk + Hv * Dv))
        qs, ks = rnd((Dk,)), rnd((Dk,))
        cq, ck, cv = rnd((B, S, Hk, Dk)), rnd((B, S, Hk, Dk)), rnd((B, S, Hv, Dv))
        _, (dx, dqs, dks) = mx.vjp(
            lambda x, qs, ks: list(mk.silu_rms_heads(x, qs, ks, Hk, Hv, Dv, 1e-6)),
            [x, qs, ks], [cq, ck, cv])
        want = mk.silu_rms_heads_vjp(x, qs, ks, Hk, Hv, Dv, 1e-6, cq, ck, cv)
        for g, w, n in zip((dx, dqs, dks), want, want._fields):
            same(self, g, w, n)

        xs, gate, weight, dout = rnd((3, 5, 48)), rnd((3, 5, 48)), rnd((48,)), rnd((3, 5, 48))
        _, grads = mx.vjp(lambda x, g, w: [mk.gated_rms_norm(x, g, w, 1e-6)],
                          [xs, gate, weight], [dout])
        want = mk.gated_rms_norm_vjp(xs, gate, weight, 1e-6, dout)
        for g, w, n in zip(grads, want, want._fields):
            same(self, g, w, n)

    def test_heads_and_norm_forward_vs_mlx_lm(self):
        import mlx.nn as nn
        from mlx_lm.models.qwen3_next import Qwen3NextRMSNormGated

        x, gate = rnd((2, 3, 4, 64)), rnd((2, 3, 4, 64))
        norm = Qwen3NextRMSNormGated(64, eps=1e-6)
        norm.weight = rnd((64,))
        close(self, mk.gated_rms_norm(x, gate, norm.weight, 1e-6), norm(x, gate), 1e-6, "norm")

        B, S, Hk, Hv, Dk, Dv = 1, 4, 2, 4, 64, 32
        conv = rnd((B, S, 2 * Hk * Dk + Hv * Dv))
        s = nn.silu(conv)
        q, k, v = mx.split(s, [Hk * Dk, 2 * Hk * Dk], -1)
        inv = Dk**-0.5
        rq = (inv**2) * mx.fast.rms_norm(q.reshape(B, S, Hk, Dk), None, 1e-6 * inv**2)
        rk = inv * mx.fast.rms_norm(k.reshape(B, S, Hk, Dk), None, 1e-6 * inv**2)
        hq, hk, hv = mk.silu_rms_heads(conv, mx.full((Dk,), inv**2), mx.full((Dk,), inv), Hk, Hv,
                                       Dv, 1e-6 * inv**2)
        close(self, hq, rq, 1e-6, "q")
        close(self, hk, rk, 1e-6, "k")
        close(self, hv, v.reshape(B, S, Hv, Dv), 0, "v")


class Errors(unittest.TestCase):
    def setUp(self):
        mx.random.seed(SEED + 3)
        self.args = inputs(2, 3, 2, 4, 32, 16)

    def raises(self, cls, words, fn, *a, **kw):
        with self.assertRaises(cls) as ctx:
            fn(*a, **kw)
        for w in words:
            self.assertIn(w, str(ctx.exception))
        return ctx.exception

    def test_bad_arguments_name_the_argument(self):
        a = self.args
        e = self.raises(mk.ShapeError, ["q"], mk.gated_delta_update,
                        **{**a, "q": a["q"][:, :, 0]})
        self.assertEqual(e.status_name, "MLXK_ERR_SHAPE")
        self.assertIsInstance(e, ValueError)
        self.raises(mk.ShapeError, ["v"], mk.gated_delta_update, **{**a, "v": a["v"][:, :2]})
        self.raises(mk.DtypeError, ["state"], mk.gated_delta_update,
                    **{**a, "state": a["state"].astype(mx.bfloat16)})
        self.raises(mk.DtypeError, ["dt_bias"], mk.gated_delta_update,
                    **{**a, "dt_bias": a["dt_bias"].astype(mx.int32)})
        self.raises(mk.Error, ["mask"], mk.gated_delta_update,
                    **{**a, "mask": mx.ones((2, 3), dtype=mx.float32)})
        self.raises(TypeError, ["q", "numpy"], mk.gated_delta_update,
                    **{**a, "q": np.zeros((2, 3, 2, 32), np.float32)})
        self.raises(TypeError, ["state"], mk.gated_delta_update, **{**a, "state": 3})
        self.raises(mk.DtypeError, ["k", "float64"], mk.gated_delta_update,
                    **{**a, "k": a["k"].astype(mx.float64)})
        self.raises(mk.InvalidArgumentError, ["chunk_size"], mk.gated_delta_update_chunked,
                    **a, chunk_size=24)
        self.raises(mk.ShapeError, ["Dk"], mk.gated_delta_update,
                    **inputs(1, 2, 1, 1, 40, 8))
        self.raises(mk.InvalidArgumentError, ["eps"], mk.gated_rms_norm,
                    rnd((2, 8)), rnd((2, 8)), rnd((8,)), -1.0)
        self.raises(mk.InvalidArgumentError, ["value_width"], mk.silu_rms_heads,
                    rnd((1, 2, 2 * 2 * 32)), rnd((32,)), rnd((32,)), 2, 3, 0, 1e-6)
        self.raises(mk.InvalidArgumentError, ["value_heads"], mk.gated_delta_update_from_conv,
                    rnd((1, 2, 2 * 2 * 32 + 3 * 16)), rnd((32,)), rnd((32,)), 2, 3, 16, 1e-6,
                    rnd((1, 2, 3)), rnd((1, 2, 3)), rnd((3,)), rnd((3,)))

    def test_pool_and_replay_arguments(self):
        a = {k: v for k, v in self.args.items() if k not in ("state", "mask")}
        pool = mx.zeros((4, 4, 16, 32))
        self.raises(mk.InvalidArgumentError, ["slot"], mk.gated_delta_update_pool, **a,
                    pool=pool, slots=[1, 1])
        self.raises(mk.InvalidArgumentError, ["fresh"], mk.gated_delta_update_pool, **a,
                    pool=pool, slots=[0, 1], fresh=[True])
        self.raises(mk.InvalidArgumentError, ["slot"], mk.gated_delta_update_pool, **a,
                    pool=pool, slots=[0, 9])
        r = {k: v for k, v in a.items() if k != "q"}
        self.raises(mk.InvalidArgumentError, ["accepted_lengths"], mk.gated_delta_state, **r,
                    state=None, accepted_lengths=[1, 7])
        self.raises(mk.InvalidArgumentError, ["cu_seqlens"], mk.gated_delta_update_packed,
                    **{k: v[:1] if v.ndim > 1 else v for k, v in a.items()}, pool=pool,
                    cu_seqlens=[0, 2, 1], slots=[0, 1])

    def test_devices_limits_layouts(self):
        self.assertEqual(mk.gpu_backend(), "none" if not mx.metal.is_available() and
                         not mx.cuda.is_available() else mk.gpu_backend())
        if mk.gpu_backend() == "none":
            self.raises(mk.UnsupportedError, [], mk.set_default_device, "gpu")
        self.raises(mk.InvalidArgumentError, ["device"], mk.set_default_device, "tpu")
        mk.set_default_device("cpu")
        old = mk.memory_limit()
        self.assertGreater(old, 0)
        try:
            mk.set_memory_limit(1024)
            self.assertEqual(mk.memory_limit(), 1024)
            self.raises(mk.OutOfMemoryError, [], mk.gated_delta_update, **self.args)
        finally:
            mk.set_memory_limit(0)
        self.assertEqual(mk.memory_limit(), old)
        mk.set_cache_limit(1 << 20)

        lay = mk.glm52_layout_canonical(6144, 2048, 4, 64)
        self.assertEqual((lay.gate_weight_offset, lay.up_weight_offset, lay.down_weight_offset,
                          lay.gate_scale_offset, lay.up_scale_offset, lay.down_scale_offset,
                          lay.slot_bytes),
                         (0, 6291456, 12582912, 18874368, 19267584, 19660800, 20054016))
        mk.glm52_layout_validate(lay, 4, 64)
        lay.slot_bytes = 100
        self.raises(mk.InvalidArgumentError, ["slot bytes"], mk.glm52_layout_validate, lay, 4, 64)
        self.raises(mk.InvalidArgumentError, ["bits"], mk.glm52_layout_canonical, 64, 64, 3, 64)

    def test_versions(self):
        self.assertEqual(mk.mlx_version(), mx.__version__)
        self.assertEqual(mk.MLX_BUILD_VERSION, mx.__version__)
        self.assertEqual(mk.abi_version(), 1)
        self.assertRegex(mk.version(), r"^\d+\.\d+\.\d+")


if __name__ == "__main__":
    unittest.main()
