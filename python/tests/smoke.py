"""Smoke test of an installed mlxkern (run from outside the repository): the README's Python
example, the update against a float64 recurrence in numpy, mx.grad through it, an error."""

import mlx.core as mx
import numpy as np

import mlxkern

assert "site-packages" in mlxkern.__file__, mlxkern.__file__
mx.random.seed(7)
B, T, Hk, Hv, Dk, Dv = 2, 9, 2, 4, 64, 32
q = mx.random.normal((B, T, Hk, Dk)) * Dk**-0.5
k = mx.random.normal((B, T, Hk, Dk)) * Dk**-0.5
v = mx.random.normal((B, T, Hv, Dv))
a, b = mx.random.normal((B, T, Hv)), mx.random.normal((B, T, Hv))
A_log, dt_bias = mx.random.uniform(-1, 1, (Hv,)), mx.random.normal((Hv,))

y, state = mlxkern.gated_delta_update(q, k, v, a, b, A_log, dt_bias)
yc, statec = mlxkern.gated_delta_update_chunked(q, k, v, a, b, A_log, dt_bias)

# float64 reference of the recurrence
Q, K, V = (np.array(x, np.float64) for x in (q, k, v))
g = np.exp(-np.exp(np.array(A_log, np.float64)) * np.logaddexp(0, np.array(a + dt_bias, np.float64)))
beta = 1 / (1 + np.exp(-np.array(b, np.float64)))
S = np.zeros((B, Hv, Dv, Dk))
Y = np.zeros((B, T, Hv, Dv))
for t in range(T):
    for h in range(Hv):
        kh = h // (Hv // Hk)
        S[:, h] *= g[:, t, h, None, None]
        kv = np.einsum("bvk,bk->bv", S[:, h], K[:, t, kh])
        delta = (V[:, t, h] - kv) * beta[:, t, h, None]
        S[:, h] += delta[:, :, None] * K[:, t, kh, None, :]
        Y[:, t, h] = np.einsum("bvk,bk->bv", S[:, h], Q[:, t, kh])
for name, got, want in (("y", y, Y), ("state", state, S), ("chunked y", yc, Y),
                        ("chunked state", statec, S)):
    err = np.abs(np.array(got, np.float64) - want).max() / max(1, np.abs(want).max())
    assert err < 1e-5, (name, err)

grad = mx.grad(lambda v: mlxkern.gated_delta_update(q, k, v, a, b, A_log, dt_bias).y.sum())(v)
mx.eval(grad)
assert grad.shape == v.shape and bool(mx.all(mx.isfinite(grad)))

try:
    mlxkern.gated_delta_update(q[0], k, v, a, b, A_log, dt_bias)
    raise AssertionError("no error")
except mlxkern.ShapeError as e:
    assert "q" in str(e), e

print(f"smoke: mlxkern {mlxkern.__version__} on mlx {mx.__version__} ({mlxkern.__file__}): ok")
