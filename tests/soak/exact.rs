//! The recurrence in float64 (the header's formula for mlxk_gated_delta_update, with plain
//! sums), kept beside a float32 server's slots to measure drift: how far each live sequence's
//! float32 state has moved from exact arithmetic over its whole life. The bit-for-bit checks
//! find a wrong result at once; this one bounds what rounding accumulates over long sequences.

/// Per-head constants of the layer, as float64.
pub struct Gates {
    pub a_log: Vec<f64>,
    pub dt_bias: Vec<f64>,
}

/// One sequence's tokens (the state needs no q): k [T, Hk, Dk], v [T, Hv, Dv], a, b [T, Hv].
pub struct Tokens<'a> {
    pub t: usize,
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub a: &'a [f32],
    pub b: &'a [f32],
}

fn softplus(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// Advances `s` [Hv, Dv, Dk] over the tokens (a false mask entry skips a token).
#[allow(clippy::too_many_arguments)]
pub fn advance(
    s: &mut [f64],
    x: &Tokens,
    mask: Option<&[bool]>,
    gates: &Gates,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) {
    let group = hv / hk;
    for t in 0..x.t {
        if mask.is_some_and(|m| !m[t]) {
            continue;
        }
        for h in 0..hv {
            let kh = h / group;
            let k = &x.k[(t * hk + kh) * dk..][..dk];
            let ah = x.a[t * hv + h] as f64;
            let g = (-gates.a_log[h].exp() * softplus(ah + gates.dt_bias[h])).exp();
            let beta = 1.0 / (1.0 + (-(x.b[t * hv + h] as f64)).exp());
            for r in 0..dv {
                let row = &mut s[(h * dv + r) * dk..][..dk];
                let mut kv = 0.0;
                for (si, &ki) in row.iter_mut().zip(k) {
                    *si *= g;
                    kv += *si * ki as f64;
                }
                let delta = (x.v[(t * hv + h) * dv + r] as f64 - kv) * beta;
                for (si, &ki) in row.iter_mut().zip(k) {
                    *si += ki as f64 * delta;
                }
            }
        }
    }
}

/// The largest |f32 - f64| over a state, and the largest |f64| (its scale).
pub fn deviation(bits: &[u32], exact: &[f64]) -> (f64, f64) {
    let mut err: f64 = 0.0;
    let mut scale: f64 = 0.0;
    for (&b, &e) in bits.iter().zip(exact) {
        err = err.max((f32::from_bits(b) as f64 - e).abs());
        scale = scale.max(e.abs());
    }
    (err, scale)
}
