//! The head split's backward pass on the CPU (`mlxk_silu_rms_heads_vjp`): the gradients of
//! x, q_scale and k_scale given the cotangents of q, k and v.
//!
//! Per row and head, with `s = silu(x) = x·σ(x)` over the head's columns (docs/DESIGN.md §4),
//! the forward is `q = c · n`, `n = s · inv`, `inv = 1/sqrt(Σ s² / Dk + eps)` for a q or k head
//! (c: q_scale or k_scale) and `v = s` for a v head. In reverse, with `gq` the cotangent:
//!
//! ```text
//! dc  += gq · n                     (summed over every row and head of that kind)
//! gn   = gq · c
//! ds   = inv · (gn − n · Σ(gn · n) / Dk)
//! dx   = ds · silu'(x)              (v heads: dx = gv · silu'(x))
//! ```
//!
//! The forward's roundings to the input dtype are not differentiated: this is the gradient of
//! the same formula in exact arithmetic, evaluated in f32 with f64 sums (`cpu::grad`). An absent
//! cotangent is zeros: its heads get dx = 0 and add nothing to the scales' gradients.

use half::{bf16, f16};

use super::Dims;
use crate::cpu::elem::{narrow, Elem, Floats};
use crate::cpu::grad::{normalize, part_mut, rms_backward, row_jobs, silu_and_slope, Partials};
use crate::cpu::pool::{self, SharedMut};
use crate::cpu::{typed, typed_mut, Buffers};
use crate::dtype::Dtype;
use crate::node::silu_rms_heads::{Backward, BackwardInput};
use crate::node::Words;

/// The cotangents of q, k and v (None: zeros).
pub type Cotangents<'a> = [Option<Floats<'a>>; 3];

/// The backward pass: writes dx (x's layout `[rows, 2·Hk·Dk + Hv·Dv]`) and returns the
/// gradients of q_scale and k_scale (`[Dk]` each, f32).
pub fn backward<T: Elem>(
    d: Dims,
    eps: f32,
    x: &[T],
    q_scale: &[T],
    k_scale: &[T],
    cotangents: Cotangents,
    dx: &mut [T],
) -> [Vec<f32>; 2] {
    let channels = d.channels();
    assert!(
        (1..=128).contains(&d.dk) && (1..=128).contains(&d.dv),
        "silu_rms_heads backward: head widths {} and {} (1 to 128 supported)",
        d.dk,
        d.dv
    );
    let sizes = [
        d.rows * d.hk * d.dk,
        d.rows * d.hk * d.dk,
        d.rows * d.hv * d.dv,
    ];
    assert!(
        x.len() >= d.rows * channels
            && dx.len() >= d.rows * channels
            && q_scale.len() >= d.dk
            && k_scale.len() >= d.dk
            && cotangents
                .iter()
                .zip(sizes)
                .all(|(c, n)| c.is_none_or(|c| c.len() >= n)),
        "silu_rms_heads backward: buffers too small for {d:?}"
    );
    let scales: [Vec<f32>; 2] =
        [q_scale, k_scale].map(|s| s[..d.dk].iter().map(|v| v.to_f32()).collect());
    let (jobs, per_job) = row_jobs(d.rows, channels);
    let partials = Partials::new(jobs, 2 * d.dk);
    let out = SharedMut(dx.as_mut_ptr());
    pool::run(jobs, &|job| {
        let rows = job * per_job..((job + 1) * per_job).min(d.rows);
        let mut sums = partials.start();
        let mut xs = vec![0f32; channels];
        let mut grad = vec![0f32; channels];
        let (mut g, mut s, mut n, mut slope) = ([0f32; 128], [0f32; 128], [0f32; 128], [0f32; 128]);
        for row in rows {
            for (o, v) in xs.iter_mut().zip(&x[row * channels..(row + 1) * channels]) {
                *o = v.to_f32();
            }
            for head in 0..d.heads() {
                let (width, channel) = d.head(head);
                let (kind, at) = if head < d.hk {
                    (0, (row * d.hk + head) * d.dk)
                } else if head < 2 * d.hk {
                    (1, (row * d.hk + head - d.hk) * d.dk)
                } else {
                    (2, (row * d.hv + head - 2 * d.hk) * d.dv)
                };
                let dx_head = &mut grad[channel..channel + width];
                let Some(cotangent) = cotangents[kind] else {
                    dx_head.fill(0.0);
                    continue;
                };
                let (g, s, n, slope) = (
                    &mut g[..width],
                    &mut s[..width],
                    &mut n[..width],
                    &mut slope[..width],
                );
                cotangent.widen(at, g);
                for ((si, di), &xi) in s.iter_mut().zip(slope.iter_mut()).zip(&xs[channel..]) {
                    (*si, *di) = silu_and_slope(xi);
                }
                if kind < 2 {
                    // g: the cotangent of q or k, then of n, then of s.
                    let inv = normalize(s, eps, n);
                    let (scale, sum) = (&scales[kind], &mut sums[kind * d.dk..(kind + 1) * d.dk]);
                    for i in 0..width {
                        sum[i] += g[i] as f64 * n[i] as f64;
                        g[i] *= scale[i];
                    }
                    rms_backward(n, inv, g);
                }
                for ((o, &gi), &di) in dx_head.iter_mut().zip(g.iter()).zip(slope.iter()) {
                    *o = gi * di;
                }
            }
            // SAFETY: this job's row of dx, within the checked size; no other job writes it.
            let dst = unsafe { part_mut(out, row * channels, channels) };
            for (o, &v) in dst.iter_mut().zip(&grad) {
                *o = T::from_f32(v);
            }
        }
        partials.put(job, sums);
    });
    let total = partials.total();
    [total[..d.dk].to_vec(), total[d.dk..].to_vec()]
}

/// Entry for a `node::silu_rms_heads::Backward`: inputs x, q_scale, k_scale, then the given
/// cotangents; outputs dx, dq_scale, dk_scale in x's dtype.
pub(crate) fn run(params: &[i64], buffers: Buffers) {
    let node = Backward::decode(params).unwrap_or_else(|e| panic!("{e}"));
    let f = node.forward;
    let n = f.dims;
    let d = Dims {
        rows: n.rows(),
        hk: n.hk,
        hv: n.hv,
        dk: n.dk,
        dv: n.dv,
    };
    let input = |which: BackwardInput| buffers.inputs[node.cpu_slot(which).expect("listed")];
    let cotangents: Cotangents = [0, 1, 2].map(|i| {
        node.cotangents[i].map(|dtype| Floats::new(input(BackwardInput::Cotangent(i)), dtype))
    });
    let mut outputs = buffers.outputs.into_iter();
    let (dx, dq_scale, dk_scale) = (
        outputs.next().expect("dx"),
        outputs.next().expect("dq_scale"),
        outputs.next().expect("dk_scale"),
    );
    macro_rules! go {
        ($t:ty) => {
            backward::<$t>(
                d,
                f.eps,
                typed(input(BackwardInput::X)),
                typed(input(BackwardInput::QScale)),
                typed(input(BackwardInput::KScale)),
                cotangents,
                typed_mut(dx),
            )
        };
    }
    let [dq, dk] = match f.dtype {
        Dtype::Bfloat16 => go!(bf16),
        Dtype::Float16 => go!(f16),
        Dtype::Float32 => go!(f32),
        other => panic!(
            "silu_rms_heads backward: unsupported dtype {}",
            other.name()
        ),
    };
    narrow(&dq, dq_scale, f.dtype);
    narrow(&dk, dk_scale, f.dtype);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// xorshift, uniform in [-1, 1).
    struct Rng(u64);
    impl Rng {
        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n)
                .map(|_| {
                    self.0 ^= self.0 << 13;
                    self.0 ^= self.0 >> 7;
                    self.0 ^= self.0 << 17;
                    scale * ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32
                })
                .collect()
        }
    }

    /// Σ gq·q + Σ gk·k + Σ gv·v of the forward in float64.
    fn loss(d: Dims, eps: f64, x: &[f64], scales: [&[f64]; 2], g: [&[f32]; 3]) -> f64 {
        let silu = |v: f64| v / (1.0 + (-v).exp());
        let mut total = 0.0;
        for row in 0..d.rows {
            for head in 0..d.heads() {
                let (width, channel) = d.head(head);
                let s: Vec<f64> = (0..width)
                    .map(|i| silu(x[row * d.channels() + channel + i]))
                    .collect();
                if head < 2 * d.hk {
                    let kind = head / d.hk;
                    let inv =
                        1.0 / (s.iter().map(|v| v * v).sum::<f64>() / width as f64 + eps).sqrt();
                    let at = (row * d.hk + head % d.hk) * d.dk;
                    for i in 0..width {
                        total += g[kind][at + i] as f64 * scales[kind][i] * s[i] * inv;
                    }
                } else {
                    let at = (row * d.hv + head - 2 * d.hk) * d.dv;
                    total += (0..width).map(|i| g[2][at + i] as f64 * s[i]).sum::<f64>();
                }
            }
        }
        total
    }

    #[test]
    fn matches_central_differences_of_a_float64_forward() {
        let d = Dims {
            rows: 3,
            hk: 2,
            hv: 3,
            dk: 5,
            dv: 3,
        };
        let mut r = Rng(0x5eed);
        let x = r.vec(d.rows * d.channels(), 3.0);
        let (qs, ks) = (r.vec(d.dk, 1.0), r.vec(d.dk, 1.0));
        let gq = r.vec(d.rows * d.hk * d.dk, 1.0);
        let gk = r.vec(d.rows * d.hk * d.dk, 1.0);
        let gv = r.vec(d.rows * d.hv * d.dv, 1.0);
        let eps = 1e-3;
        let mut dx = vec![0f32; x.len()];
        let cot = [
            Some(Floats::F32(&gq)),
            Some(Floats::F32(&gk)),
            Some(Floats::F32(&gv)),
        ];
        let [dqs, dks] = backward(d, eps, &x, &qs, &ks, cot, &mut dx);
        let f64v = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let base = [f64v(&x), f64v(&qs), f64v(&ks)];
        let h = 1e-6;
        for (which, grad) in [(0, &dx), (1, &dqs), (2, &dks)] {
            for i in 0..grad.len() {
                let mut a = base.clone();
                a[which][i] += h;
                let up = loss(d, eps as f64, &a[0], [&a[1], &a[2]], [&gq, &gk, &gv]);
                a[which][i] -= 2.0 * h;
                let down = loss(d, eps as f64, &a[0], [&a[1], &a[2]], [&gq, &gk, &gv]);
                let want = (up - down) / (2.0 * h);
                assert!(
                    (grad[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "input {which} [{i}]: {} vs {want}",
                    grad[i]
                );
            }
        }
        // Without cotangents everything is zero.
        let [dqs, dks] = backward(d, eps, &x, &qs, &ks, [None; 3], &mut dx);
        assert!(dx.iter().chain(&dqs).chain(&dks).all(|&v| v == 0.0));
    }
}
