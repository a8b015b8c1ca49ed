//! Pieces the backward kernels of the head split and the gated norm share: the SiLU and its
//! slope in f32 without cancellation, the backward of an RMS normalization, and per-job sums of
//! parameter gradients added up in job order.
//!
//! Gradients are not part of the bit-exact contract (docs/DESIGN.md §4): the backward kernels
//! differentiate the forward's formula in exact arithmetic (its roundings to the input dtype are
//! not differentiated) and evaluate that in f32, with every reduction accumulated in f64. The
//! job split depends only on the sizes, so results do not depend on the thread count.

use std::sync::Mutex;

use super::pool::{self, SharedMut};

/// Work (values) a job should have at least.
const JOB_VALUES: usize = 65536;

/// At most this many jobs, so the per-job parameter sums stay small.
const MAX_JOBS: usize = 64;

/// `(silu(x), silu'(x))` = `(x·σ, σ·(1 + x·(1 − σ)))` in f32. σ and 1 − σ each come from
/// `e = exp(−|x|)` (never above 1) as `1/(1 + e)` and `e/(1 + e)`: no difference cancels and
/// nothing overflows.
#[inline(always)]
pub fn silu_and_slope(x: f32) -> (f32, f32) {
    let e = (-x.abs()).exp();
    let (big, small) = (1.0 / (1.0 + e), e / (1.0 + e));
    let (sigma, rest) = if x >= 0.0 { (big, small) } else { (small, big) };
    (x * sigma, sigma * (1.0 + x * rest))
}

/// The backward of `n = v · inv`, `inv = 1/sqrt(Σ v² / D + eps)`, over one row `v` of width D:
/// given `gn`, the cotangent of `n`, returns in `gn` the cotangent of `v`,
/// `inv · (gn − n · Σ(gn · n) / D)`. `n` holds `v · inv` (from `normalize`).
pub fn rms_backward(n: &[f32], inv: f32, gn: &mut [f32]) {
    let dot: f64 = n
        .iter()
        .zip(gn.iter())
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum();
    let mean = (dot / n.len() as f64) as f32;
    for (g, &ni) in gn.iter_mut().zip(n) {
        *g = inv * (*g - ni * mean);
    }
}

/// Writes `v · inv` into `n` and returns `inv = 1/sqrt(Σ v² / D + eps)` (the sum in f64).
pub fn normalize(v: &[f32], eps: f32, n: &mut [f32]) -> f32 {
    let squares: f64 = v.iter().map(|&x| x as f64 * x as f64).sum();
    let inv = (1.0 / (squares / v.len() as f64 + eps as f64).sqrt()) as f32;
    for (o, &x) in n.iter_mut().zip(v) {
        *o = x * inv;
    }
    inv
}

/// `len` elements of a job's output at element `at`.
///
/// # Safety
/// `[at, at + len)` lies inside the buffer behind `out`, which outlives the returned slice, and
/// no other job touches those elements meanwhile.
pub unsafe fn part_mut<'a, T>(out: SharedMut<T>, at: usize, len: usize) -> &'a mut [T] {
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts_mut(out.0.add(at), len) }
}

/// Splits `rows` rows of `values_per_row` values into at most `MAX_JOBS` jobs: (jobs, rows per
/// job). Depends only on the sizes.
pub fn row_jobs(rows: usize, values_per_row: usize) -> (usize, usize) {
    let (_, per_job) = pool::jobs(rows, values_per_row, JOB_VALUES);
    let per_job = per_job.max(rows.div_ceil(MAX_JOBS)).max(1);
    (rows.div_ceil(per_job), per_job)
}

/// Per-job f64 sums of a parameter gradient (`width` values), added up in job order.
pub struct Partials {
    width: usize,
    jobs: Vec<Mutex<Vec<f64>>>,
}

impl Partials {
    pub fn new(jobs: usize, width: usize) -> Self {
        Partials {
            width,
            jobs: (0..jobs).map(|_| Mutex::new(Vec::new())).collect(),
        }
    }

    /// A job's zeroed sums, to fill and hand back with `put`.
    pub fn start(&self) -> Vec<f64> {
        vec![0.0; self.width]
    }

    pub fn put(&self, job: usize, sums: Vec<f64>) {
        *self.jobs[job].lock().unwrap_or_else(|e| e.into_inner()) = sums;
    }

    /// The jobs' sums added in job order, as f32.
    pub fn total(self) -> Vec<f32> {
        let mut total = vec![0f64; self.width];
        for job in self.jobs {
            let sums = job.into_inner().unwrap_or_else(|e| e.into_inner());
            for (t, s) in total.iter_mut().zip(sums) {
                *t += s;
            }
        }
        total.into_iter().map(|t| t as f32).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_slope_matches_float64() {
        let mut x = -100.0f32;
        while x < 100.0 {
            let (s, d) = silu_and_slope(x);
            let sigma = 1.0 / (1.0 + (-(x as f64)).exp());
            let (s64, d64) = (x as f64 * sigma, sigma * (1.0 + x as f64 * (1.0 - sigma)));
            // A few f32 roundings, relative to the terms' magnitudes.
            assert!(
                (s as f64 - s64).abs() <= 4e-7 * s64.abs() + 1e-37,
                "silu({x})"
            );
            let scale = sigma * (1.0 + (x as f64).abs() * (1.0 - sigma));
            assert!((d as f64 - d64).abs() <= 8e-7 * scale + 1e-37, "silu'({x})");
            x += 0.0731;
        }
        assert_eq!(silu_and_slope(-200.0), (-0.0, -0.0));
        assert_eq!(silu_and_slope(200.0), (200.0, 1.0));
        assert!(silu_and_slope(f32::NAN).1.is_nan());
    }

    #[test]
    fn partials_add_in_job_order_and_jobs_depend_on_sizes_only() {
        let p = Partials::new(3, 2);
        for job in [2, 0, 1] {
            let mut s = p.start();
            s[0] = job as f64;
            s[1] = 0.5;
            p.put(job, s);
        }
        assert_eq!(p.total(), [3.0, 1.5]);
        assert_eq!(row_jobs(0, 10).0, 0);
        let (jobs, per) = row_jobs(1_000_000, 128);
        assert!(jobs <= MAX_JOBS && jobs * per >= 1_000_000);
        assert_eq!(row_jobs(3, 4), (1, 3));
    }
}
