"""An independent numpy emulation of the Metal gated-delta kernel's arithmetic (DESIGN §3).

Every operation is a float32 numpy elementwise operation (IEEE single, one rounding each, no
FMA), written in the order the Metal text performs it:

    per (b, hv, dv) row, lane l of 32 owns Dk elements [l*n, (l+1)*n), n = Dk/32;
    kv partial:   s[i] = s[i] * g;  acc = acc + s[i] * k[i]     (i ascending, acc from +0.0)
    kv:           xor butterfly over the 32 partials (offsets 1, 2, 4, 8, 16)
    delta:        (v - kv) * beta
    out partial:  s[i] = s[i] + k[i] * delta;  acc = acc + s[i] * q[i]
    out:          xor butterfly;  y = out rounded to the input dtype (nearest even)
    masked token: state untouched, y = 0.

Value head h reads key head h // (Hv/Hk). All rows (B*Hv*Dv) advance together.

g and beta come from the caller as float32 (computed by MLX: the transcendentals of the Metal
kernel are implementation-defined, so the emulation takes them as given).
"""

import numpy as np

LANES = 32
BUTTERFLY_OFFSETS = (1, 2, 4, 8, 16)
_LANE = np.arange(LANES)


def simd_sum(partials):
    """The xor butterfly, literally: at each offset, lane l adds the value of lane l ^ offset.
    partials: [..., 32] float32. Returns [...] (every lane ends equal; lane 0 is taken, and
    the others are checked to agree)."""
    x = np.asarray(partials, dtype=np.float32)
    for offset in BUTTERFLY_OFFSETS:
        x = x + x[..., _LANE ^ offset]
    lane0 = x[..., 0]
    # Float addition is commutative, so partner lanes hold bitwise-equal sums.
    if not np.isnan(x).any():
        every_lane = np.repeat(lane0[..., None], LANES, -1)
        assert np.array_equal(x.view(np.uint32), every_lane.view(np.uint32))
    return lane0


def _round(x, dtype):
    """float32 -> the value stored as `dtype` ("bfloat16", "float16", "float32"), widened back."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float32":
        return x
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint32) << 16
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x), np.float32(np.nan), out).astype(np.float32)
    raise ValueError(f"unsupported dtype {dtype}")


def gated_delta(q, k, v, g, beta, state=None, mask=None, dtype="bfloat16"):
    """Emulates the recurrence.

    q, k: [B, T, Hk, Dk] and v: [B, T, Hv, Dv] as float32 values (already rounded to `dtype`);
    g, beta: [B, T, Hv] float32; state: [B, Hv, Dv, Dk] float32 or None (zeros);
    mask: [B, T] bool or None. Returns (y [B, T, Hv, Dv] float32 holding `dtype` values,
    state [B, Hv, Dv, Dk] float32)."""
    q = np.asarray(q, dtype=np.float32)
    k = np.asarray(k, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    g = np.asarray(g, dtype=np.float32)
    beta = np.asarray(beta, dtype=np.float32)
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    assert Dk % LANES == 0 and Hv % Hk == 0
    n = Dk // LANES
    rows = B * Hv * Dv

    # Row r = (b, hv, dv) in row-major order; its key head is hv // (Hv/Hk).
    b_of = np.repeat(np.arange(B), Hv * Dv)
    hv_of = np.tile(np.repeat(np.arange(Hv), Dv), B)
    dv_of = np.tile(np.arange(Dv), B * Hv)
    hk_of = hv_of // (Hv // Hk)

    if state is None:
        s = np.zeros((rows, LANES, n), dtype=np.float32)
    else:
        s = np.array(state, dtype=np.float32).reshape(rows, LANES, n)
    y = np.zeros((B, T, Hv, Dv), dtype=np.float32)
    zero = np.float32(0.0)

    for t in range(T):
        k_t = k[b_of, t, hk_of].reshape(rows, LANES, n)
        q_t = q[b_of, t, hk_of].reshape(rows, LANES, n)
        v_t = v[b_of, t, hv_of, dv_of]
        g_t = g[b_of, t, hv_of][:, None]
        beta_t = beta[b_of, t, hv_of]
        live = np.ones(rows, dtype=bool) if mask is None else np.asarray(mask, bool)[b_of, t]

        new = s.copy()
        acc = np.full((rows, LANES), zero, dtype=np.float32)
        for i in range(n):
            new[:, :, i] = new[:, :, i] * g_t
            acc = acc + new[:, :, i] * k_t[:, :, i]
        kv_mem = simd_sum(acc)

        delta = (v_t - kv_mem) * beta_t
        acc = np.full((rows, LANES), zero, dtype=np.float32)
        for i in range(n):
            new[:, :, i] = new[:, :, i] + k_t[:, :, i] * delta[:, None]
            acc = acc + new[:, :, i] * q_t[:, :, i]
        out = simd_sum(acc)

        s = np.where(live[:, None, None], new, s)
        y_t = np.where(live, _round(out, dtype), zero)
        y[b_of, t, hv_of, dv_of] = y_t

    return y, s.reshape(B, Hv, Dv, Dk)


def gated_delta_f64(q, k, v, g, beta, state=None, mask=None, magnitude=False):
    """The same recurrence in float64 with plain sums (a precision reference, not an order
    reference). Inputs as for gated_delta; returns (y unrounded float64, state float64), and
    with magnitude=True also sum_i |s_i * q_i| per y [B, T, Hv, Dv] (0 at masked tokens): the
    size of the readout's terms, which bounds the rounding error of any f32 summation order."""
    q, k, v, g, beta = (np.asarray(x, dtype=np.float64) for x in (q, k, v, g, beta))
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    group = Hv // Hk
    s = np.zeros((B, Hv, Dv, Dk)) if state is None else np.array(state, dtype=np.float64)
    y = np.zeros((B, T, Hv, Dv))
    terms = np.zeros((B, T, Hv, Dv))
    for t in range(T):
        kt = np.repeat(k[:, t], group, axis=1)  # [B, Hv, Dk], head h -> h // group
        qt = np.repeat(q[:, t], group, axis=1)
        new = s * g[:, t, :, None, None]
        kv = np.einsum("bhvk,bhk->bhv", new, kt)
        delta = (v[:, t] - kv) * beta[:, t, :, None]
        new = new + kt[:, :, None, :] * delta[..., None]
        out = np.einsum("bhvk,bhk->bhv", new, qt)
        live = np.ones(B, dtype=bool) if mask is None else np.asarray(mask, bool)[:, t]
        s = np.where(live[:, None, None, None], new, s)
        y[:, t] = np.where(live[:, None, None], out, 0.0)
        if magnitude:
            size = np.einsum("bhvk,bhk->bhv", np.abs(new), np.abs(qt))
            terms[:, t] = np.where(live[:, None, None], size, 0.0)
    return (y, s, terms) if magnitude else (y, s)
