//! The recurrence's backward pass on the CPU: gradients of `y` and the final state with respect
//! to q, k, v, the gates g and β, and the initial state, by a reverse sweep over the tokens
//! that recomputes the forward states from checkpoints.
//!
//! Per (batch row, value head) and value row, token t of the forward (docs/DESIGN.md §4):
//!
//! ```text
//! s1 = g_t · s            kv = s1 · k_t          δ = (v_t − kv) · β_t
//! s' = s1 + k_t · δ       y_t = s' · q_t
//! ```
//!
//! and in reverse, with `ds` the cotangent of s' (the next token's, or the final state's):
//!
//! ```text
//! ds  += dy_t · q_t                 dq_t += dy_t · s'
//! dδ   = ds · k_t                   dk_t += δ · ds
//! dv_t = dδ · β_t                   dβ_t += dδ · (v_t − kv)
//! ds1  = ds − dδ · β_t · k_t        dk_t −= dδ · β_t · s1
//! dg_t += ds1 · s                   ds    = g_t · ds1   (the cotangent of s)
//! ```
//!
//! A masked token leaves the state as it is and writes y = 0: its gradients are zero and `ds`
//! passes through. Key heads collect the gradients of all the value heads that read them (GQA).
//!
//! Memory: the forward states are kept every `checkpoint` tokens and one chunk's states are
//! recomputed at a time, so each job holds `(ceil(T/C) + C + 1)` states of one value head
//! (`Dv · Dk` f32 each): O((T/C + C) · state), never O(T · state). The arithmetic is f32 in a
//! plain sequential order (gradients are not part of the bit-exact contract), the same on
//! every path: with AVX2 the row loops run in `backward_avx2`, with NEON (arm64) in
//! `backward_neon`, which compute the same bits.

#[cfg(target_arch = "x86_64")]
use super::backward_avx2 as rows_simd;
#[cfg(target_arch = "aarch64")]
use super::backward_neon as rows_simd;
use super::Dims;
use crate::cpu::features;
use crate::cpu::pool::{self, SharedMut};
use crate::cpu::reduce::sum_lanes;

/// Tokens between kept forward states when the caller passes 0.
pub const DEFAULT_CHECKPOINT: usize = 64;

/// The inputs of one backward call, all f32 (widened from the forward's dtypes), in the forward's
/// layouts: q, k `[B, T, Hk, Dk]`; v, dy `[B, T, Hv, Dv]`; g, beta `[B, T, Hv]`; state and
/// dstate_out `[B, Hv, Dv, Dk]`; mask `[B, T]` (0 = padding).
pub struct Inputs<'a> {
    pub d: Dims,
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub state: Option<&'a [f32]>,
    pub mask: Option<&'a [u8]>,
    pub dy: &'a [f32],
    pub dstate_out: Option<&'a [f32]>,
}

/// The gradients, in the layouts of their inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct Grads {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    pub dg: Vec<f32>,
    pub dbeta: Vec<f32>,
    pub dstate: Vec<f32>,
}

#[derive(Clone, Copy)]
struct Outs {
    dq: SharedMut<f32>,
    dk: SharedMut<f32>,
    dv: SharedMut<f32>,
    dg: SharedMut<f32>,
    dbeta: SharedMut<f32>,
    dstate: SharedMut<f32>,
}

/// The backward pass; `checkpoint` tokens between kept states (0: the default). Jobs run per
/// (batch row, key head), each over the value heads that read that key head.
pub fn backward(x: &Inputs, checkpoint: usize) -> Grads {
    let f = features::kernels();
    backward_on(x, checkpoint, f.avx2 || f.neon)
}

/// `backward` with the vector row loops (AVX2, NEON) or the portable ones; `vector` only where
/// the CPU has AVX2 (x86-64) or NEON (arm64).
fn backward_on(x: &Inputs, checkpoint: usize, vector: bool) -> Grads {
    let d = x.d;
    let checkpoint = if checkpoint == 0 {
        DEFAULT_CHECKPOINT
    } else {
        checkpoint
    };
    let mut g = Grads {
        dq: vec![0.0; d.b * d.t * d.hk * d.dk],
        dk: vec![0.0; d.b * d.t * d.hk * d.dk],
        dv: vec![0.0; d.b * d.t * d.hv * d.dv],
        dg: vec![0.0; d.b * d.t * d.hv],
        dbeta: vec![0.0; d.b * d.t * d.hv],
        dstate: vec![0.0; d.b * d.hv * d.dv * d.dk],
    };
    let outs = Outs {
        dq: SharedMut(g.dq.as_mut_ptr()),
        dk: SharedMut(g.dk.as_mut_ptr()),
        dv: SharedMut(g.dv.as_mut_ptr()),
        dg: SharedMut(g.dg.as_mut_ptr()),
        dbeta: SharedMut(g.dbeta.as_mut_ptr()),
        dstate: SharedMut(g.dstate.as_mut_ptr()),
    };
    let jobs = d.b * d.hk;
    pool::run(jobs, &|job| {
        let (b, hk) = (job / d.hk, job % d.hk);
        let group = d.hv / d.hk;
        for hv in hk * group..(hk + 1) * group {
            // SAFETY: the job for (b, hk) is the only writer of dq/dk rows (b, ·, hk) and of the
            // dv/dg/dbeta/dstate entries of its value heads; the buffers outlive the pool run;
            // `vector` says the CPU has the row loops' features.
            unsafe { value_head(x, outs, b, hk, hv, checkpoint, vector) };
        }
    });
    g
}

/// # Safety
/// No other thread writes the parts of `o` that (b, hk, hv) owns while this runs; `vector`
/// only where the CPU has AVX2 (x86-64) or NEON (arm64).
unsafe fn value_head(x: &Inputs, o: Outs, b: usize, hk: usize, hv: usize, c: usize, vector: bool) {
    let d = x.d;
    let (dk, dv, t_len) = (d.dk, d.dv, d.t);
    let size = dv * dk;
    let qk_at = |t: usize| ((b * t_len + t) * d.hk + hk) * dk;
    let v_at = |t: usize| ((b * t_len + t) * d.hv + hv) * dv;
    let gate_at = |t: usize| (b * t_len + t) * d.hv + hv;
    let active = |t: usize| x.mask.is_none_or(|m| m[b * t_len + t] != 0);
    let state0 = (b * d.hv + hv) * size;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = vector;

    // One forward token on `s` (Dv rows of Dk), in place.
    let step = |s: &mut [f32], t: usize| {
        if !active(t) {
            return;
        }
        let (k, g, beta) = (
            &x.k[qk_at(t)..qk_at(t) + dk],
            x.g[gate_at(t)],
            x.beta[gate_at(t)],
        );
        for (row, r) in s.chunks_exact_mut(dk).enumerate() {
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            if vector {
                let (p, v) = (r.as_mut_ptr(), x.v[v_at(t) + row]);
                // SAFETY: the CPU has the row loops' features; r and k hold Dk values.
                unsafe { rows_simd::step_row(p, p, k, g, v, beta) };
                continue;
            }
            r.iter_mut().for_each(|si| *si *= g);
            let delta = (x.v[v_at(t) + row] - dot(r, k)) * beta;
            for (si, &ki) in r.iter_mut().zip(k) {
                *si += ki * delta;
            }
        }
    };

    // Forward: keep the state entering every chunk.
    let chunks = t_len.div_ceil(c).max(1);
    let mut kept = vec![0.0f32; chunks * size];
    let mut s = match x.state {
        Some(state) => state[state0..state0 + size].to_vec(),
        None => vec![0.0; size],
    };
    for chunk in 0..chunks {
        kept[chunk * size..(chunk + 1) * size].copy_from_slice(&s);
        if chunk + 1 < chunks {
            for t in chunk * c..((chunk + 1) * c).min(t_len) {
                step(&mut s, t);
            }
        }
    }

    // Reverse: recompute one chunk's entering states, then walk it backwards.
    let mut ds = match x.dstate_out {
        Some(dso) => dso[state0..state0 + size].to_vec(),
        None => vec![0.0; size],
    };
    let mut states = vec![0.0f32; (c + 1) * size];
    let (mut s1, mut ds1) = (vec![0.0f32; dk], vec![0.0f32; dk]);
    // This token's dq and dk of the key head, summed over the value rows before they are added.
    let (mut dq_t, mut dk_t) = (vec![0.0f32; dk], vec![0.0f32; dk]);
    // Writes to the outputs: indices inside their buffers, owned by this job (the caller's
    // contract).
    let add = |p: SharedMut<f32>, i: usize, value: f32| {
        // SAFETY: see above.
        unsafe { *p.0.add(i) += value }
    };
    let put = |p: SharedMut<f32>, i: usize, value: f32| {
        // SAFETY: see above.
        unsafe { *p.0.add(i) = value }
    };
    for chunk in (0..chunks).rev() {
        let (t0, t1) = (chunk * c, ((chunk + 1) * c).min(t_len));
        states[..size].copy_from_slice(&kept[chunk * size..(chunk + 1) * size]);
        for t in t0..t1 {
            let i = t - t0;
            let (prev, next) = states.split_at_mut((i + 1) * size);
            #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
            if vector && active(t) {
                // The copy fused into the step: the same values.
                let (k, g, beta) = (
                    &x.k[qk_at(t)..qk_at(t) + dk],
                    x.g[gate_at(t)],
                    x.beta[gate_at(t)],
                );
                for row in 0..dv {
                    let (src, dst) = (&prev[i * size + row * dk..], &mut next[row * dk..]);
                    let v = x.v[v_at(t) + row];
                    // SAFETY: the CPU has the row loops' features; src and dst hold Dk values
                    // each, disjoint.
                    unsafe { rows_simd::step_row(src.as_ptr(), dst.as_mut_ptr(), k, g, v, beta) };
                }
                continue;
            }
            next[..size].copy_from_slice(&prev[i * size..]);
            step(&mut next[..size], t);
        }
        for t in (t0..t1).rev() {
            if !active(t) {
                continue; // the state passed through; its gradients are zero
            }
            let i = t - t0;
            let before = &states[i * size..(i + 1) * size];
            let after = &states[(i + 1) * size..(i + 2) * size];
            let (q, k) = (&x.q[qk_at(t)..qk_at(t) + dk], &x.k[qk_at(t)..qk_at(t) + dk]);
            let (g, beta) = (x.g[gate_at(t)], x.beta[gate_at(t)]);
            let (mut dg, mut dbeta) = (0.0f32, 0.0f32);
            dq_t.fill(0.0);
            dk_t.fill(0.0);
            for row in 0..dv {
                let (s_prev, s_next) = (
                    &before[row * dk..(row + 1) * dk],
                    &after[row * dk..(row + 1) * dk],
                );
                let dsr = &mut ds[row * dk..(row + 1) * dk];
                let dy = x.dy[v_at(t) + row];
                #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
                if vector {
                    let vr = x.v[v_at(t) + row];
                    // SAFETY: the CPU has the row loops' features; every slice holds Dk values.
                    let (ddelta, err, dg_row) = unsafe {
                        rows_simd::grad_row(
                            s_prev, s_next, dsr, q, k, &mut dq_t, &mut dk_t, dy, vr, g, beta,
                        )
                    };
                    put(o.dv, v_at(t) + row, ddelta * beta);
                    dbeta += ddelta * err;
                    dg += dg_row;
                    continue;
                }
                // y = s' · q
                for j in 0..dk {
                    dq_t[j] += dy * s_next[j];
                    dsr[j] += dy * q[j];
                }
                // s1 = g s; kv = s1 · k; δ = (v − kv) β
                for j in 0..dk {
                    s1[j] = g * s_prev[j];
                }
                let err = x.v[v_at(t) + row] - dot(&s1, k);
                let delta = err * beta;
                // s' = s1 + k δ
                let ddelta = dot(dsr, k);
                put(o.dv, v_at(t) + row, ddelta * beta);
                dbeta += ddelta * err;
                let dkv = -ddelta * beta;
                for j in 0..dk {
                    dk_t[j] += delta * dsr[j];
                    dk_t[j] += dkv * s1[j];
                    ds1[j] = dsr[j] + dkv * k[j];
                }
                dg += dot(&ds1, s_prev);
                for j in 0..dk {
                    dsr[j] = g * ds1[j];
                }
            }
            for j in 0..dk {
                add(o.dq, qk_at(t) + j, dq_t[j]);
                add(o.dk, qk_at(t) + j, dk_t[j]);
            }
            put(o.dg, gate_at(t), dg);
            put(o.dbeta, gate_at(t), dbeta);
        }
    }
    for (j, &value) in ds.iter().enumerate() {
        put(o.dstate, state0 + j, value);
    }
}

/// The gradients of the gate inputs.
#[derive(Debug, Clone, PartialEq)]
pub struct GateGrads {
    /// `[B, T, Hv]`, as a.
    pub da: Vec<f32>,
    /// `[B, T, Hv]`, as b.
    pub db: Vec<f32>,
    /// `[Hv]`.
    pub da_log: Vec<f32>,
    /// `[Hv]`.
    pub ddt_bias: Vec<f32>,
}

/// Chains the cotangents of g and β (`backward`'s `dg`, `dbeta`, `[B, T, Hv]`) to the gate
/// inputs of `g = exp(-exp(A_log) · softplus(a + dt_bias))` and `β = sigmoid(b)`:
///
/// ```text
/// ∂g/∂a = ∂g/∂dt_bias = −exp(A_log) · sigmoid(a + dt_bias) · g
/// ∂g/∂A_log = −exp(A_log) · softplus(a + dt_bias) · g        ∂β/∂b = β (1 − β)
/// ```
///
/// The per-head parameters sum over every (batch row, token). Computed in f64 from the f32
/// inputs (the forward's bf16 rounding points are not differentiated).
pub fn gate_backward(
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    dg: &[f32],
    dbeta: &[f32],
) -> GateGrads {
    gate_chain(a, b, a_log, dt_bias, dg, dbeta, false)
}

/// `gate_backward` from the cotangent of log g (`dlog_g = g · ∂L/∂g`, as the chunked form's
/// backward gives it) instead of g's: `∂ log g/∂a = ∂ log g/∂dt_bias = −exp(A_log) ·
/// sigmoid(a + dt_bias)`, `∂ log g/∂A_log = −exp(A_log) · softplus(a + dt_bias)`; no gate is
/// divided by, so a gate that underflowed to 0 still passes its cotangent on.
pub fn gate_backward_log(
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    dlog_g: &[f32],
    dbeta: &[f32],
) -> GateGrads {
    gate_chain(a, b, a_log, dt_bias, dlog_g, dbeta, true)
}

/// `gate_backward` (`log`: false) or `gate_backward_log` (true).
fn gate_chain(
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    dg: &[f32],
    dbeta: &[f32],
    log: bool,
) -> GateGrads {
    let hv = a_log.len();
    let mut out = GateGrads {
        da: vec![0.0; a.len()],
        db: vec![0.0; b.len()],
        da_log: vec![0.0; hv],
        ddt_bias: vec![0.0; hv],
    };
    let (mut sum_log, mut sum_dt) = (vec![0f64; hv], vec![0f64; hv]);
    for i in 0..a.len() {
        let h = i % hv;
        let x = a[i] as f64 + dt_bias[h] as f64;
        let softplus = x.max(0.0) + (-x.abs()).exp().ln_1p();
        let sigmoid_x = 1.0 / (1.0 + (-x).exp());
        let rate = (a_log[h] as f64).exp();
        let (dx, dlog) = match log {
            false => {
                let g = (-rate * softplus).exp();
                (
                    dg[i] as f64 * -rate * sigmoid_x * g,
                    dg[i] as f64 * -rate * softplus * g,
                )
            }
            true => (
                dg[i] as f64 * -rate * sigmoid_x,
                dg[i] as f64 * -rate * softplus,
            ),
        };
        out.da[i] = dx as f32;
        sum_dt[h] += dx;
        sum_log[h] += dlog;
        let beta = 1.0 / (1.0 + (-(b[i] as f64)).exp());
        out.db[i] = (dbeta[i] as f64 * beta * (1.0 - beta)) as f32;
    }
    for h in 0..hv {
        out.da_log[h] = sum_log[h] as f32;
        out.ddt_bias[h] = sum_dt[h] as f32;
    }
    out
}

/// `a · b` with eight partial sums (lane l takes elements l, l + 8, ...), added at the end.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    sum_lanes(lanes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift, uniform in [-1, 1).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
        }
        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| scale * self.next()).collect()
        }
    }

    struct Case {
        d: Dims,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        state: Option<Vec<f32>>,
        mask: Option<Vec<u8>>,
        dy: Vec<f32>,
        dstate_out: Option<Vec<f32>>,
    }

    fn case(seed: u64, d: Dims, with_state: bool, with_mask: bool) -> Case {
        let mut r = Rng(seed | 1);
        let qk = d.b * d.t * d.hk * d.dk;
        let gates = d.b * d.t * d.hv;
        let scale = 1.0 / (d.dk as f32).sqrt();
        Case {
            d,
            q: r.vec(qk, scale),
            k: r.vec(qk, scale),
            v: r.vec(d.b * d.t * d.hv * d.dv, 1.0),
            g: (0..gates).map(|_| 0.8 + 0.2 * r.next().abs()).collect(),
            beta: (0..gates).map(|_| 0.5 + 0.5 * r.next().abs()).collect(),
            state: with_state.then(|| r.vec(d.b * d.hv * d.dv * d.dk, 0.5)),
            mask: with_mask.then(|| (0..d.b * d.t).map(|i| (i % 3 != 1) as u8).collect()),
            dy: r.vec(d.b * d.t * d.hv * d.dv, 1.0),
            dstate_out: Some(r.vec(d.b * d.hv * d.dv * d.dk, 0.3)),
        }
    }

    fn inputs(c: &Case) -> Inputs<'_> {
        Inputs {
            d: c.d,
            q: &c.q,
            k: &c.k,
            v: &c.v,
            g: &c.g,
            beta: &c.beta,
            state: c.state.as_deref(),
            mask: c.mask.as_deref(),
            dy: &c.dy,
            dstate_out: c.dstate_out.as_deref(),
        }
    }

    /// The loss L = Σ dy·y + Σ dstate_out·state_out of the forward in float64: its gradient is
    /// what the backward computes.
    fn loss(c: &Case, q: &[f64], k: &[f64], v: &[f64], g: &[f64], beta: &[f64], s0: &[f64]) -> f64 {
        let d = c.d;
        let mut total = 0.0;
        for b in 0..d.b {
            for hv in 0..d.hv {
                let hk = hv / (d.hv / d.hk);
                for row in 0..d.dv {
                    let base = ((b * d.hv + hv) * d.dv + row) * d.dk;
                    let mut s: Vec<f64> = s0[base..base + d.dk].to_vec();
                    for t in 0..d.t {
                        if c.mask.as_ref().is_some_and(|m| m[b * d.t + t] == 0) {
                            continue;
                        }
                        let kq = ((b * d.t + t) * d.hk + hk) * d.dk;
                        let gi = (b * d.t + t) * d.hv + hv;
                        let vi = ((b * d.t + t) * d.hv + hv) * d.dv + row;
                        s.iter_mut().for_each(|x| *x *= g[gi]);
                        let kv: f64 = (0..d.dk).map(|j| s[j] * k[kq + j]).sum();
                        let delta = (v[vi] - kv) * beta[gi];
                        (0..d.dk).for_each(|j| s[j] += k[kq + j] * delta);
                        let y: f64 = (0..d.dk).map(|j| s[j] * q[kq + j]).sum();
                        total += c.dy[vi] as f64 * y;
                    }
                    if let Some(dso) = &c.dstate_out {
                        total += (0..d.dk).map(|j| dso[base + j] as f64 * s[j]).sum::<f64>();
                    }
                }
            }
        }
        total
    }

    /// Central differences of the float64 loss for a few entries of each input.
    #[test]
    fn matches_central_differences_of_a_float64_forward() {
        let dims = [
            Dims {
                b: 2,
                t: 7,
                hk: 1,
                hv: 2,
                dk: 8,
                dv: 3,
            },
            Dims {
                b: 1,
                t: 11,
                hk: 2,
                hv: 4,
                dk: 4,
                dv: 2,
            },
        ];
        for (n, &d) in dims.iter().enumerate() {
            for (with_state, with_mask) in [(true, false), (false, true)] {
                let c = case(0x9E37 + n as u64, d, with_state, with_mask);
                let f64v = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
                let (q, k, v, g, beta) = (
                    f64v(&c.q),
                    f64v(&c.k),
                    f64v(&c.v),
                    f64v(&c.g),
                    f64v(&c.beta),
                );
                let s0 = c
                    .state
                    .as_ref()
                    .map_or(vec![0.0; d.b * d.hv * d.dv * d.dk], |s| f64v(s));
                for chunk in [0, 1, 3] {
                    let got = backward(&inputs(&c), chunk);
                    let h = 1e-6;
                    let check = |name: &str, grad: &[f32], which: usize| {
                        for i in (0..grad.len()).step_by(grad.len().div_ceil(9).max(1)) {
                            let mut args = [
                                q.clone(),
                                k.clone(),
                                v.clone(),
                                g.clone(),
                                beta.clone(),
                                s0.clone(),
                            ];
                            args[which][i] += h;
                            let up = loss(
                                &c, &args[0], &args[1], &args[2], &args[3], &args[4], &args[5],
                            );
                            args[which][i] -= 2.0 * h;
                            let down = loss(
                                &c, &args[0], &args[1], &args[2], &args[3], &args[4], &args[5],
                            );
                            let want = (up - down) / (2.0 * h);
                            let tol = 1e-4 * (1.0 + want.abs());
                            assert!(
                                (grad[i] as f64 - want).abs() <= tol,
                                "{name}[{i}] {} vs {want} (dims {d:?}, chunk {chunk})",
                                grad[i]
                            );
                        }
                    };
                    check("dq", &got.dq, 0);
                    check("dk", &got.dk, 1);
                    check("dv", &got.dv, 2);
                    check("dg", &got.dg, 3);
                    check("dbeta", &got.dbeta, 4);
                    if with_state {
                        check("dstate", &got.dstate, 5);
                    }
                }
            }
        }
    }

    /// The checkpoint interval changes only the memory: every interval gives the same bits.
    #[test]
    fn every_checkpoint_interval_gives_the_same_bits() {
        let d = Dims {
            b: 2,
            t: 37,
            hk: 2,
            hv: 4,
            dk: 32,
            dv: 5,
        };
        let c = case(7, d, true, true);
        let reference = backward(&inputs(&c), 1);
        for chunk in [2, 5, 16, 37, 64, 1000] {
            assert_eq!(
                backward(&inputs(&c), chunk),
                reference,
                "checkpoint {chunk}"
            );
        }
    }

    /// The vector row loops (AVX2, NEON) give the portable bits, also at key widths that leave
    /// a tail past the last group of eight (the C ABI takes multiples of 32 only).
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    #[test]
    fn the_vector_loops_give_the_portable_bits() {
        if !(features::cpu().avx2 || features::cpu().neon) {
            return;
        }
        for (n, dk) in [1, 7, 8, 13, 36, 100, 128, 259].into_iter().enumerate() {
            let d = Dims {
                b: 2,
                t: 19,
                hk: 1,
                hv: 2,
                dk,
                dv: 3,
            };
            let c = case(0x5EED + n as u64, d, n % 2 == 0, n % 3 == 0);
            let portable = backward_on(&inputs(&c), 4, false);
            assert!(portable.dq.iter().any(|&x| x != 0.0), "Dk {dk}");
            assert_eq!(backward_on(&inputs(&c), 4, true), portable, "Dk {dk}");
        }
    }

    /// Masked tokens get zero gradients and pass the state's gradient through unchanged.
    #[test]
    fn masked_tokens_are_inert() {
        let d = Dims {
            b: 1,
            t: 5,
            hk: 1,
            hv: 1,
            dk: 8,
            dv: 2,
        };
        let mut c = case(11, d, true, false);
        c.mask = Some(vec![0; 5]);
        let got = backward(&inputs(&c), 0);
        assert!(got
            .dq
            .iter()
            .chain(&got.dk)
            .chain(&got.dv)
            .chain(&got.dg)
            .all(|&x| x == 0.0));
        assert_eq!(got.dstate, c.dstate_out.unwrap());
    }

    /// The whole chain: gates computed from a, b, A_log and dt_bias in float64, the recurrence,
    /// and the loss; `backward` then `gate_backward` against central differences.
    #[test]
    fn gate_gradients_match_central_differences() {
        let d = Dims {
            b: 2,
            t: 6,
            hk: 1,
            hv: 2,
            dk: 8,
            dv: 3,
        };
        let mut c = case(0xA11CE, d, true, true);
        let mut r = Rng(99);
        let gates = d.b * d.t * d.hv;
        let a = r.vec(gates, 2.0);
        let b = r.vec(gates, 3.0);
        let a_log = r.vec(d.hv, 1.0);
        let dt_bias = r.vec(d.hv, 1.0);
        let gates_of = |a: &[f64], b: &[f64], a_log: &[f64], dt: &[f64]| {
            let g: Vec<f64> = (0..gates)
                .map(|i| {
                    let x = a[i] + dt[i % d.hv];
                    let sp = x.max(0.0) + (-x.abs()).exp().ln_1p();
                    (-a_log[i % d.hv].exp() * sp).exp()
                })
                .collect();
            let beta: Vec<f64> = b.iter().map(|&x| 1.0 / (1.0 + (-x).exp())).collect();
            (g, beta)
        };
        let f64v = |x: &[f32]| x.iter().map(|&v| v as f64).collect::<Vec<f64>>();
        let (g, beta) = gates_of(&f64v(&a), &f64v(&b), &f64v(&a_log), &f64v(&dt_bias));
        c.g = g.iter().map(|&x| x as f32).collect();
        c.beta = beta.iter().map(|&x| x as f32).collect();
        let grads = backward(&inputs(&c), 0);
        let got = gate_backward(&a, &b, &a_log, &dt_bias, &grads.dg, &grads.dbeta);
        let (q, k, v) = (f64v(&c.q), f64v(&c.k), f64v(&c.v));
        let s0 = f64v(c.state.as_ref().unwrap());
        let total = |args: &[Vec<f64>; 4]| {
            let (g, beta) = gates_of(&args[0], &args[1], &args[2], &args[3]);
            loss(&c, &q, &k, &v, &g, &beta, &s0)
        };
        let base = [f64v(&a), f64v(&b), f64v(&a_log), f64v(&dt_bias)];
        for (which, name, grad) in [
            (0, "da", &got.da),
            (1, "db", &got.db),
            (2, "da_log", &got.da_log),
            (3, "ddt_bias", &got.ddt_bias),
        ] {
            for i in 0..grad.len() {
                let h = 1e-6;
                let mut args = base.clone();
                args[which][i] += h;
                let up = total(&args);
                args[which][i] -= 2.0 * h;
                let down = total(&args);
                let want = (up - down) / (2.0 * h);
                assert!(
                    (grad[i] as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{name}[{i}] {} vs {want}",
                    grad[i]
                );
            }
        }
    }
}
