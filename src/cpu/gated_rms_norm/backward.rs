//! The gated norm's backward pass on the CPU (`mlxk_gated_rms_norm_vjp`): the gradients of x,
//! gate and weight given the cotangent of out.
//!
//! Per row of width D the forward is (docs/DESIGN.md §4) `n = x · inv`,
//! `inv = 1/sqrt(Σ x² / D + eps)`, `h = w · n`, `a = silu(z)` (z: the gate), `out = a · h`. In
//! reverse, with `g` the cotangent of out:
//!
//! ```text
//! dz  = g · h · silu'(z)
//! gh  = g · a
//! dw += gh · n                      (summed over every row)
//! gn  = gh · w
//! dx  = inv · (gn − n · Σ(gn · n) / D)
//! ```
//!
//! The forward's roundings to the input dtype are not differentiated: this is the gradient of
//! the same formula in exact arithmetic, evaluated in f32 with f64 sums (`cpu::grad`). An
//! absent cotangent is zeros, and so are then all three gradients.

use half::{bf16, f16};

use crate::cpu::elem::{narrow, Elem, Floats};
use crate::cpu::grad::{normalize, part_mut, rms_backward, row_jobs, silu_and_slope, Partials};
use crate::cpu::pool::{self, SharedMut};
use crate::cpu::{typed, typed_mut, Buffers};
use crate::dtype::Dtype;
use crate::node::gated_rms_norm::Backward;
use crate::node::Words;

/// The backward pass over rows of `width` values: writes dx (x's layout, T) and dgate (the
/// gate's layout, G) and returns dweight (`[width]`, f32). `dout` None: zeros.
#[allow(clippy::too_many_arguments)]
pub fn backward<T: Elem, G: Elem>(
    width: usize,
    eps: f32,
    x: &[T],
    gate: &[G],
    weight: &[T],
    dout: Option<Floats>,
    dx: &mut [T],
    dgate: &mut [G],
) -> Vec<f32> {
    if width == 0 {
        return Vec::new();
    }
    let rows = x.len() / width;
    let n_values = rows * width;
    assert!(
        gate.len() >= n_values
            && weight.len() >= width
            && dx.len() >= n_values
            && dgate.len() >= n_values
            && dout.is_none_or(|g| g.len() >= n_values),
        "gated_rms_norm backward: buffers too small for {rows} rows of {width}"
    );
    let Some(dout) = dout else {
        dx[..n_values].fill(T::from_f32(0.0));
        dgate[..n_values].fill(G::from_f32(0.0));
        return vec![0.0; width];
    };
    let w: Vec<f32> = weight[..width].iter().map(|v| v.to_f32()).collect();
    let (jobs, per_job) = row_jobs(rows, width);
    let partials = Partials::new(jobs, width);
    let (dx_out, dgate_out) = (SharedMut(dx.as_mut_ptr()), SharedMut(dgate.as_mut_ptr()));
    pool::run(jobs, &|job| {
        let mut sums = partials.start();
        let mut xs = vec![0f32; width];
        let mut n = vec![0f32; width];
        let mut g = vec![0f32; width];
        for row in job * per_job..((job + 1) * per_job).min(rows) {
            let at = row * width;
            for (o, v) in xs.iter_mut().zip(&x[at..at + width]) {
                *o = v.to_f32();
            }
            dout.widen(at, &mut g);
            let inv = normalize(&xs, eps, &mut n);
            // SAFETY: this job's row of dgate, within the checked size; no other job writes it.
            let dz = unsafe { part_mut(dgate_out, at, width) };
            for i in 0..width {
                let (silu, slope) = silu_and_slope(gate[at + i].to_f32());
                dz[i] = G::from_f32(g[i] * (w[i] * n[i]) * slope);
                let gh = g[i] * silu;
                sums[i] += gh as f64 * n[i] as f64;
                g[i] = gh * w[i];
            }
            rms_backward(&n, inv, &mut g);
            // SAFETY: this job's row of dx, within the checked size; no other job writes it.
            let dst = unsafe { part_mut(dx_out, at, width) };
            for (o, &v) in dst.iter_mut().zip(&g) {
                *o = T::from_f32(v);
            }
        }
        partials.put(job, sums);
    });
    partials.total()
}

/// Entry for a `node::gated_rms_norm::Backward`: inputs x, gate, weight, then dout when given;
/// outputs dx (x's dtype), dgate (the gate's dtype), dweight (x's dtype).
pub(crate) fn run(params: &[i64], buffers: Buffers) {
    let node = Backward::decode(params).unwrap_or_else(|e| panic!("{e}"));
    let f = &node.forward;
    let width = f.width();
    if f.rows() == 0 || width == 0 {
        let mut outputs = buffers.outputs.into_iter();
        let dweight = outputs.nth(2).expect("dweight");
        narrow(&vec![0.0; width], dweight, f.dtype);
        return;
    }
    let inputs = &buffers.inputs;
    let dout = node.cotangent.map(|dtype| Floats::new(inputs[3], dtype));
    let mut outputs = buffers.outputs.into_iter();
    let (dx, dgate, dweight) = (
        outputs.next().expect("dx"),
        outputs.next().expect("dgate"),
        outputs.next().expect("dweight"),
    );
    macro_rules! go {
        ($t:ty, $g:ty) => {
            backward::<$t, $g>(
                width,
                f.eps,
                typed(inputs[0]),
                typed(inputs[1]),
                typed(inputs[2]),
                dout,
                typed_mut(dx),
                typed_mut(dgate),
            )
        };
    }
    macro_rules! by_gate {
        ($t:ty) => {
            match f.gate_dtype {
                Dtype::Bfloat16 => go!($t, bf16),
                Dtype::Float16 => go!($t, f16),
                Dtype::Float32 => go!($t, f32),
                other => panic!("gated_rms_norm backward: gate dtype {}", other.name()),
            }
        };
    }
    let dw = match f.dtype {
        Dtype::Bfloat16 => by_gate!(bf16),
        Dtype::Float16 => by_gate!(f16),
        Dtype::Float32 => by_gate!(f32),
        other => panic!(
            "gated_rms_norm backward: unsupported dtype {}",
            other.name()
        ),
    };
    narrow(&dw, dweight, f.dtype);
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// Σ g·out of the forward in float64.
    fn loss(width: usize, eps: f64, x: &[f64], z: &[f64], w: &[f64], g: &[f32]) -> f64 {
        let mut total = 0.0;
        for row in 0..x.len() / width {
            let xs = &x[row * width..(row + 1) * width];
            let inv = 1.0 / (xs.iter().map(|v| v * v).sum::<f64>() / width as f64 + eps).sqrt();
            for i in 0..width {
                let zi = z[row * width + i];
                let silu = zi / (1.0 + (-zi).exp());
                total += g[row * width + i] as f64 * silu * w[i] * xs[i] * inv;
            }
        }
        total
    }

    #[test]
    fn matches_central_differences_of_a_float64_forward() {
        let (rows, width) = (3, 37);
        let mut r = Rng(0xbeef);
        let (x, z, w) = (
            r.vec(rows * width, 2.0),
            r.vec(rows * width, 4.0),
            r.vec(width, 1.5),
        );
        let g = r.vec(rows * width, 1.0);
        let eps = 1e-4;
        let (mut dx, mut dz) = (vec![0f32; x.len()], vec![0f32; x.len()]);
        let dw = backward(
            width,
            eps,
            &x,
            &z,
            &w,
            Some(Floats::F32(&g)),
            &mut dx,
            &mut dz,
        );
        let f64v = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let base = [f64v(&x), f64v(&z), f64v(&w)];
        let h = 1e-6;
        for (which, grad) in [(0, &dx), (1, &dz), (2, &dw)] {
            for i in 0..grad.len() {
                let mut a = base.clone();
                a[which][i] += h;
                let up = loss(width, eps as f64, &a[0], &a[1], &a[2], &g);
                a[which][i] -= 2.0 * h;
                let down = loss(width, eps as f64, &a[0], &a[1], &a[2], &g);
                let want = (up - down) / (2.0 * h);
                assert!(
                    (grad[i] as f64 - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "input {which} [{i}]: {} vs {want}",
                    grad[i]
                );
            }
        }
        let dw = backward(width, eps, &x, &z, &w, None, &mut dx, &mut dz);
        assert!(dx.iter().chain(&dz).chain(&dw).all(|&v| v == 0.0));
    }
}
