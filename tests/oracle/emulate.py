"""An independent numpy emulation of the Metal gated-delta kernel's arithmetic (docs/DESIGN.md §3).

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

Also emulated, in the same style:
    gated_delta_state           the prefix replay (gated_delta_state.metal), per row's prefix;
    gated_delta_prefix_states   the state after every prefix m = 0..T;
    silu_rms_heads              the head split (silu_rms_heads.metal);
    gated_rms_norm              the gated RMSNorm (gated_rms_norm.metal), as rms_normalize
                                (n = T(x · inv)) followed by gated_norm_tail.
Those two use MLX's CPU exp / sigmoid formulas (exp_f32, sigmoid, silu; fused multiply-adds
emulated exactly by fma_f32) and rsqrt(x) = 1 / sqrt(x), as the library's CPU kernels do
(docs/DESIGN.md §3: bit-exact given identical transcendental results).

Precision references in float64 with plain sums (not an order): gated_delta_f64 (the
recurrence); gated_delta_vjp_f64 (its backward pass, an analytic reverse sweep), with
gates_f64 and gated_delta_loss_f64 (the gates and the loss it differentiates, for central
differences).
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
        with np.errstate(over="ignore"):
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
    q, k, v, g, beta = (np.asarray(x, dtype=np.float32) for x in (q, k, v, g, beta))
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


def gates_f64(a, b, a_log, dt_bias):
    """The gates in float64 with no rounding: g = exp(-exp(A_log) * softplus(a + dt_bias)) and
    beta = sigmoid(b) (a, b [B, T, Hv]; a_log, dt_bias [Hv])."""
    a, b, a_log, dt_bias = (np.asarray(x, dtype=np.float64) for x in (a, b, a_log, dt_bias))
    x = a + dt_bias
    softplus = np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))
    return np.exp(-np.exp(a_log) * softplus), 1.0 / (1.0 + np.exp(-b))


def gated_delta_vjp_f64(q, k, v, g, beta, state, mask, dy, dstate_out, a, b, a_log, dt_bias):
    """The recurrence's backward pass in float64: an analytic reverse sweep over every stored
    forward state (a precision reference; memory T x state).

    q, k, v, g, beta, state, mask as for gated_delta (g and beta the values the forward uses);
    dy [B, T, Hv, Dv] and dstate_out [B, Hv, Dv, Dk] (None: zeros) the cotangents of y and the
    final state; a, b, a_log, dt_bias the gate inputs, whose chain is differentiated exactly
    (dg/da = dg/ddt_bias = -exp(A_log) sigmoid(x) g, dg/dA_log = -exp(A_log) softplus(x) g,
    x = a + dt_bias, with g and beta recomputed here in float64: gates_f64).

    Returns a dict of float64 gradients dq, dk, dv, da, db, da_log, ddt_bias, dstate, and the
    sizes of what the gate gradients add up, which bound the rounding error of any order of
    summation: "size:da" = |dg terms| |dg/da|, "size:ddt_bias" its sum over (row, token) per
    head, "size:da_log" = the sum of |dg terms| |dg/dA_log|, and "size:db" = |dbeta terms| / 4
    (beta (1 - beta) <= 1/4), where |dg terms| = sum |ds1 * s| over the state (dg's summands)
    and |dbeta terms| = sum |ddelta * err| over the value rows. Masked tokens get zero
    gradients and pass the state's gradient through; a key head sums its value heads' dq, dk."""
    q, k, v, g, beta = (np.asarray(x, dtype=np.float64) for x in (q, k, v, g, beta))
    B, T, Hk, Dk = q.shape
    Hv, Dv = v.shape[2], v.shape[3]
    group = Hv // Hk
    live = np.ones((B, T), dtype=bool) if mask is None else np.asarray(mask, bool)
    s = np.zeros((B, Hv, Dv, Dk)) if state is None else np.array(state, dtype=np.float64)
    dy = np.zeros((B, T, Hv, Dv)) if dy is None else np.asarray(dy, dtype=np.float64)
    ds = (np.zeros((B, Hv, Dv, Dk)) if dstate_out is None
          else np.array(dstate_out, dtype=np.float64))

    states = [s]  # the state entering token t
    for t in range(T):
        kt = np.repeat(k[:, t], group, axis=1)
        new = s * g[:, t, :, None, None]
        delta = (v[:, t] - np.einsum("bhvk,bhk->bhv", new, kt)) * beta[:, t, :, None]
        new = new + kt[:, :, None, :] * delta[..., None]
        s = np.where(live[:, t, None, None, None], new, s)
        states.append(s)

    dq, dk = np.zeros(q.shape), np.zeros(k.shape)
    dv = np.zeros(v.shape)
    dg, dbeta = np.zeros(g.shape), np.zeros(beta.shape)
    dg_terms, dbeta_terms = np.zeros(g.shape), np.zeros(beta.shape)
    for t in reversed(range(T)):
        on = live[:, t]
        kt = np.repeat(k[:, t], group, axis=1)  # [B, Hv, Dk]
        qt = np.repeat(q[:, t], group, axis=1)
        prev, after = states[t], states[t + 1]
        dyt = np.where(on[:, None, None], dy[:, t], 0.0)  # a masked token's y is a constant 0
        # y = s' . q
        dq_h = np.einsum("bhv,bhvk->bhk", dyt, after)
        dsn = ds + dyt[..., None] * qt[:, :, None, :]
        # s1 = g s;  err = v - s1 . k;  delta = err beta;  s' = s1 + k delta
        s1 = prev * g[:, t, :, None, None]
        err = v[:, t] - np.einsum("bhvk,bhk->bhv", s1, kt)
        delta = err * beta[:, t, :, None]
        ddelta = np.einsum("bhvk,bhk->bhv", dsn, kt)
        dv[:, t] = np.where(on[:, None, None], ddelta * beta[:, t, :, None], 0.0)
        dbeta[:, t] = np.where(on[:, None], np.sum(ddelta * err, axis=-1), 0.0)
        dbeta_terms[:, t] = np.where(on[:, None], np.sum(np.abs(ddelta * err), axis=-1), 0.0)
        dkv = -ddelta * beta[:, t, :, None]
        dk_h = np.einsum("bhv,bhvk->bhk", delta, dsn) + np.einsum("bhv,bhvk->bhk", dkv, s1)
        ds1 = dsn + dkv[..., None] * kt[:, :, None, :]
        dg[:, t] = np.where(on[:, None], np.einsum("bhvk,bhvk->bh", ds1, prev), 0.0)
        dg_terms[:, t] = np.where(on[:, None], np.einsum("bhvk,bhvk->bh", np.abs(ds1),
                                                          np.abs(prev)), 0.0)
        ds = np.where(on[:, None, None, None], ds1 * g[:, t, :, None, None], ds)
        # Value head h read key head h // group: sum each group.
        dq[:, t] = np.where(on[:, None, None], dq_h.reshape(B, Hk, group, Dk).sum(axis=2), 0.0)
        dk[:, t] = np.where(on[:, None, None], dk_h.reshape(B, Hk, group, Dk).sum(axis=2), 0.0)

    a, b, a_log, dt_bias = (np.asarray(x, dtype=np.float64) for x in (a, b, a_log, dt_bias))
    x = a + dt_bias
    softplus = np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))
    rate = np.exp(a_log)
    g64, beta64 = gates_f64(a, b, a_log, dt_bias)
    dg_da = -rate * (1.0 / (1.0 + np.exp(-x))) * g64  # = dg/ddt_bias
    dg_dlog = -rate * softplus * g64
    sum_axes = tuple(range(dg.ndim - 1))
    return {"dq": dq, "dk": dk, "dv": dv, "da": dg * dg_da, "db": dbeta * beta64 * (1 - beta64),
            "da_log": (dg * dg_dlog).sum(axis=sum_axes),
            "ddt_bias": (dg * dg_da).sum(axis=sum_axes), "dstate": ds,
            "size:da": dg_terms * np.abs(dg_da), "size:db": dbeta_terms / 4.0,
            "size:da_log": (dg_terms * np.abs(dg_dlog)).sum(axis=sum_axes),
            "size:ddt_bias": (dg_terms * np.abs(dg_da)).sum(axis=sum_axes)}


def gated_delta_loss_f64(q, k, v, a, b, a_log, dt_bias, state, mask, dy, dstate_out):
    """sum(dy * y) + sum(dstate_out * state_out) in float64, gates from gates_f64: the function
    whose gradient gated_delta_vjp_f64 computes (when its g and beta are gates_f64's), for
    central differences."""
    g, beta = gates_f64(a, b, a_log, dt_bias)
    y, s = gated_delta_f64(q, k, v, g, beta, state, mask)
    return float(np.sum(np.asarray(dy, np.float64) * y)
                 + np.sum(np.asarray(dstate_out, np.float64) * s))


def gated_delta_state(k, v, g, beta, state=None, lengths=None):
    """Emulates the prefix replay (gated_delta_state.metal): row b runs the recurrence over its
    own first lengths[b] tokens, literally on that prefix (the tokens past it are never read).
    Inputs as for gated_delta (no q, no mask); lengths: one int per row, None for all T.
    Returns the state [B, Hv, Dv, Dk] float32."""
    k = np.asarray(k, dtype=np.float32)
    v = np.asarray(v, dtype=np.float32)
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    if state is None:
        state = np.zeros((B, Hv, Dv, Dk), dtype=np.float32)
    state = np.asarray(state, dtype=np.float32)
    lengths = [T] * B if lengths is None else [int(n) for n in lengths]
    out = np.empty((B, Hv, Dv, Dk), dtype=np.float32)
    for row, n in enumerate(lengths):
        assert 0 <= n <= T, f"row {row}: length {n} outside [0, {T}]"
        if n == 0:
            out[row] = state[row]
            continue
        prefix = slice(row, row + 1), slice(0, n)
        # The replay text has no query: y is computed from k in q's place and dropped.
        _, s = gated_delta(k[prefix], k[prefix], v[prefix], np.asarray(g)[prefix],
                           np.asarray(beta)[prefix], state[row:row + 1], None, "float32")
        out[row] = s[0]
    return out


def gated_delta_prefix_states(k, v, g, beta, state=None):
    """The recurrence's state after every prefix: [T + 1, B, Hv, Dv, Dk] float32, entry m the
    state after tokens [0, m) of every row (entry 0 is the start state). The same arithmetic
    as gated_delta, one step at a time (a step never looks at later tokens)."""
    k, v, g, beta = (np.asarray(x, dtype=np.float32) for x in (k, v, g, beta))
    B, T, Hk, Dk = k.shape
    Hv, Dv = v.shape[2], v.shape[3]
    s = np.zeros((B, Hv, Dv, Dk), np.float32) if state is None else np.asarray(state, np.float32)
    states = [s]
    for t in range(T):
        sl = slice(t, t + 1)
        _, s = gated_delta(k[:, sl], k[:, sl], v[:, sl], g[:, sl], beta[:, sl], s, None,
                           "float32")
        states.append(s)
    return np.stack(states)


# ---------------------------------------------------------------------------------------------
# MLX's CPU transcendentals (backend/cpu/simd/math.h, unary_ops.h), for the head split and the
# gated norm. Metal's exp is implementation-defined, so "the Metal order" uses MLX's CPU
# formulas for the transcendentals (docs/DESIGN.md §3); everything else is float32 numpy, one rounding
# per operation.

_F32 = np.float32


def fma_f32(a, b, c):
    """Exact fused multiply-add of float32 values, rounded once to float32.

    a*b is exact in float64 (48 significant bits). The sum is taken in float64 rounded to odd
    (nearest, then, when inexact and the last bit is even, one step toward the exact value,
    found with TwoSum); rounding a round-to-odd result with 53 bits to 24 bits equals rounding
    the exact value once, so no double-rounding error is possible."""
    a, b, c = (np.asarray(x, dtype=np.float32).astype(np.float64) for x in (a, b, c))
    p = a * b
    s = p + c
    with np.errstate(invalid="ignore", over="ignore"):
        c_part = s - p
        p_part = s - c_part
        err = (p - p_part) + (c - c_part)  # TwoSum: p + c == s + err exactly
        inexact = np.isfinite(s) & (err != 0)
        even = (s.view(np.uint64) & np.uint64(1)) == 0
        toward = np.nextafter(s, np.where(err > 0, np.inf, -np.inf))
        odd = np.where(inexact & even, toward, s)
        return odd.astype(np.float32)


_EXP_POLY = (1.339887440266574e-3, 9.618437357674640e-3, 5.550332471162809e-2,
             2.402264791363012e-1, 6.931472028550421e-1, 1.000000000000000)


def exp_f32(x_init):
    """MLX's CPU exp for float32, operation for operation: x = x_init · log2(e) (float32);
    ipart = floor(x + 0.5) with the 0.5 a double (so the add and floor are float64);
    fpart = x − ipart; a degree-6 polynomial in fpart by fused multiply-adds; 2^ipart built in
    the exponent bits; NaN passes through, x > 88 gives +inf, x < −88 gives 0."""
    x_init = np.asarray(x_init, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        x = x_init * _F32(1.442695)
        ipart = np.floor(x.astype(np.float64) + 0.5).astype(np.float32)
        fpart = x - ipart
        p = np.full(x.shape, _F32(1.535336188319500e-4), dtype=np.float32)
        for coefficient in _EXP_POLY:
            p = fma_f32(p, fpart, _F32(coefficient))
        # Only |x_init| <= 88 reaches the product (the selects below replace the rest).
        safe = np.where(np.abs(x_init) <= 88.0, ipart, 0).astype(np.int32)
        epart = ((safe + np.int32(127)) << np.int32(23)).astype(np.int32).view(np.float32)
        result = epart * p
    result = np.where(np.isnan(x_init), x_init, result)
    result = np.where(x_init > 88.0, _F32(np.inf), result)
    result = np.where(x_init < -88.0, _F32(0.0), result)
    return result.astype(np.float32)


def sigmoid(x, dtype):
    """MLX's CPU sigmoid for elements of `dtype`: e = T(exp(|x|)), y = 1/(1 + e) in float32,
    T(x < 0 ? y : 1 − y). x: float32 values (already of `dtype`); returns float32 values."""
    x = np.asarray(x, dtype=np.float32)
    e = _round(exp_f32(np.abs(x)), dtype)
    with np.errstate(invalid="ignore"):
        y = _F32(1.0) / (_F32(1.0) + e)
    return _round(np.where(x < 0, y, _F32(1.0) - y), dtype)


def silu(x, dtype):
    """x · sigmoid(x) with MLX's rounding points for `dtype`: T(x · T(sigmoid(x)))."""
    x = np.asarray(x, dtype=np.float32)
    with np.errstate(invalid="ignore"):
        return _round(x * sigmoid(x, dtype), dtype)


def rsqrt(x):
    """The CPU's rsqrt: 1 / sqrt(x) in float32 (two correctly rounded operations)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _F32(1.0) / np.sqrt(np.asarray(x, dtype=np.float32))


# ---------------------------------------------------------------------------------------------
# The head split (silu_rms_heads.metal).


def silu_rms_heads(x, q_scale, k_scale, key_heads, value_heads, value_width, eps, dtype):
    """Emulates silu_rms_heads.metal.

    x: [..., 2·Hk·Dk + Hv·Dv] float32 values of `dtype`; q_scale, k_scale: [Dk] likewise.
    One 32-lane group per (row, head); lane l owns columns [4l, 4l + 4) (the value T(0) past
    the head's width, whose SiLU is +0); SiLU per element with MLX's rounding points; the
    lane's four squares summed in order from +0.0; the xor butterfly; inv = rsqrt(sum / Dk +
    eps); q = T(q_scale · T(silu · inv)), k likewise with k_scale; v = silu.
    Returns (q [..., Hk, Dk], k [..., Hk, Dk], v [..., Hv, Dv]) float32 values of `dtype`."""
    x = np.asarray(x, dtype=np.float32)
    q_scale = np.asarray(q_scale, dtype=np.float32)
    k_scale = np.asarray(k_scale, dtype=np.float32)
    Hk, Hv, Dv = int(key_heads), int(value_heads), int(value_width)
    Dk = q_scale.shape[0]
    lead = x.shape[:-1]
    assert x.shape[-1] == 2 * Hk * Dk + Hv * Dv and 1 <= Dk <= 128 and 1 <= Dv <= 128
    rows = int(np.prod(lead, dtype=np.int64))
    x = x.reshape(rows, -1)
    eps = _F32(eps)

    def lanes(heads, width):
        """[rows, heads, width] -> [rows, heads, 32, 4], zero-padded past the width."""
        padded = np.zeros((rows, heads.shape[1], LANES * 4), dtype=np.float32)
        padded[:, :, :width] = heads
        return padded.reshape(rows, heads.shape[1], LANES, 4)

    qk = lanes(x[:, : 2 * Hk * Dk].reshape(rows, 2 * Hk, Dk), Dk)
    values = silu(qk, dtype)
    acc = np.zeros(values.shape[:-1], dtype=np.float32)
    for i in range(4):
        acc = acc + values[..., i] * values[..., i]
    total = simd_sum(acc)  # [rows, 2·Hk]
    inv = rsqrt(total / _F32(Dk) + eps)
    with np.errstate(invalid="ignore", over="ignore"):
        normalized = _round(values.reshape(rows, 2 * Hk, LANES * 4)[:, :, :Dk] * inv[..., None],
                            dtype)
        q = _round(q_scale * normalized[:, :Hk], dtype)
        k = _round(k_scale * normalized[:, Hk:], dtype)

    v_in = x[:, 2 * Hk * Dk:].reshape(rows, Hv, Dv)
    v = silu(lanes(v_in, Dv), dtype).reshape(rows, Hv, LANES * 4)[:, :, :Dv]
    return (q.reshape(*lead, Hk, Dk), k.reshape(*lead, Hk, Dk), v.reshape(*lead, Hv, Dv))


# ---------------------------------------------------------------------------------------------
# The gated RMSNorm (gated_rms_norm.metal).


def gated_norm_threads(width):
    """The threads per row of the Metal launch: min(1024, ceil(D / 128) · 32)."""
    return min(1024, -(-int(width) // 128) * 32)


def gated_rms_norm(x, gate, weight, eps, dtype):
    """Emulates gated_rms_norm.metal.

    x: [..., D] float32 values of `dtype`; gate: x's shape, float32 values (of any float
    dtype: the kernel widens them exactly); weight: [D] float32 values of `dtype`.
    Returns gated_norm_tail(rms_normalize(x, eps, dtype), gate, weight, dtype): float32 values
    of `dtype`."""
    return gated_norm_tail(rms_normalize(x, eps, dtype), gate, weight, dtype)


def rms_normalize(x, eps, dtype):
    """The gated norm's normalized values n = T(x · inv), inv in the Metal kernel's order:
    THREADS = min(1024, ceil(D/128)·32); thread tid sums from +0.0, for r = 0, 4·THREADS, …,
    the squares of columns r + 4·tid + i (i = 0..3, 0 past D) in order; each 32-thread SIMD
    group meets in the xor butterfly; with more than 32 threads, the group sums, zero-padded to
    32, meet in a second butterfly; inv = rsqrt(sum / D + eps).
    x: [..., D] float32 values of `dtype`; returns float32 values of `dtype`."""
    x = np.asarray(x, dtype=np.float32)
    D = x.shape[-1]
    lead = x.shape[:-1]
    rows = int(np.prod(lead, dtype=np.int64))
    x2 = x.reshape(rows, D)
    threads = gated_norm_threads(D)
    stride = 4 * threads
    rounds = -(-D // stride)
    padded = np.zeros((rows, rounds * stride), dtype=np.float32)
    padded[:, :D] = x2
    cols = padded.reshape(rows, rounds, threads, 4)  # column r·stride + 4·tid + i
    acc = np.zeros((rows, threads), dtype=np.float32)
    for r in range(rounds):
        for i in range(4):
            value = cols[:, r, :, i]
            acc = acc + value * value
    groups = simd_sum(acc.reshape(rows, threads // LANES, LANES))  # [rows, THREADS/32]
    if threads > LANES:
        sums = np.zeros((rows, LANES), dtype=np.float32)
        sums[:, : groups.shape[1]] = groups
        total = simd_sum(sums)
    else:
        total = groups[:, 0]
    inv = rsqrt(total / _F32(D) + _F32(eps))
    with np.errstate(invalid="ignore", over="ignore"):
        return _round(x2 * inv[:, None], dtype).reshape(x.shape)


def gated_norm_tail(normalized, gate, weight, dtype):
    """The gated norm after the normalization, per column:
    out = T(silu_f32(gate) · f32(T(weight · n))), silu_f32(g) = g · sigmoid_f32(g) (MLX's
    float32 sigmoid; one float32 rounding for each product). Returns float32 values of
    `dtype`."""
    n = np.asarray(normalized, dtype=np.float32)
    g = np.asarray(gate, dtype=np.float32)
    weight = np.asarray(weight, dtype=np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = _round(weight * n, dtype)
        activated = g * sigmoid(g, "float32")
        return _round(activated * scaled, dtype)
