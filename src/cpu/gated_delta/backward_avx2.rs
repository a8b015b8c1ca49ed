//! The backward pass's row loops (`backward`) with AVX2: the same f32 operations in the same
//! order per element, so the same bits as the portable loops. A dot product's eight partial
//! sums (lane l takes elements l, l + 8, ...) are one register's lanes; elements past the last
//! whole group of eight go to lanes 0, 1, ... as scalars, and the eight partials are added by
//! the portable code's `sum_lanes`. Multiplies and adds stay separate (no FMA): the portable
//! code rounds after each.
//!
//! Two loops of the portable row are fused into one pass where no element reads a value
//! another element writes in between: a row's elementwise updates and the dot products that
//! read their results, and `s1 = g · s`, which is recomputed rather than stored.

// The whole module is intrinsics on slices whose lengths the callers establish.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::cpu::reduce::sum_lanes;

#[inline(always)]
unsafe fn ld(x: &[f32], j: usize) -> __m256 {
    _mm256_loadu_ps(x.as_ptr().add(j))
}

#[inline(always)]
unsafe fn st(x: &mut [f32], j: usize, v: __m256) {
    _mm256_storeu_ps(x.as_mut_ptr().add(j), v)
}

#[inline(always)]
unsafe fn lanes_of(v: __m256) -> [f32; 8] {
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), v);
    lanes
}

/// One forward token on one state row (Dk values) read at `src` and written at `dst` (the
/// same row in place, or a copy): `r = src · g`, `δ = (v − r · k) β`, `r += k δ`; as the
/// portable `step` after a copy.
///
/// # Safety
/// AVX2 is available; `src` and `dst` address `k.len()` values, the same ones or disjoint.
#[target_feature(enable = "avx2")]
pub unsafe fn step_row(src: *const f32, dst: *mut f32, k: &[f32], g: f32, v: f32, beta: f32) {
    let n = k.len();
    let whole = n - n % 8;
    let gv = _mm256_set1_ps(g);
    let mut acc = _mm256_setzero_ps();
    for j in (0..whole).step_by(8) {
        let x = _mm256_mul_ps(_mm256_loadu_ps(src.add(j)), gv);
        _mm256_storeu_ps(dst.add(j), x);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(x, ld(k, j)));
    }
    let mut lanes = lanes_of(acc);
    for j in whole..n {
        let x = *src.add(j) * g;
        *dst.add(j) = x;
        lanes[j - whole] += x * k[j];
    }
    let delta = (v - sum_lanes(lanes)) * beta;
    let dv = _mm256_set1_ps(delta);
    for j in (0..whole).step_by(8) {
        let r = _mm256_loadu_ps(dst.add(j));
        _mm256_storeu_ps(dst.add(j), _mm256_add_ps(r, _mm256_mul_ps(ld(k, j), dv)));
    }
    for j in whole..n {
        *dst.add(j) += k[j] * delta;
    }
}

/// One value row of one token in reverse (the portable loop body of `value_head`): updates
/// `dsr` (the row's state cotangent), `dq_t` and `dk_t`; returns `(dδ, v − kv, ds1 · s)`.
///
/// # Safety
/// AVX2 is available; every slice has the length of `k`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2")]
pub unsafe fn grad_row(
    s_prev: &[f32],
    s_next: &[f32],
    dsr: &mut [f32],
    q: &[f32],
    k: &[f32],
    dq_t: &mut [f32],
    dk_t: &mut [f32],
    dy: f32,
    v: f32,
    g: f32,
    beta: f32,
) -> (f32, f32, f32) {
    let n = k.len();
    let whole = n - n % 8;
    let (dyv, gv) = (_mm256_set1_ps(dy), _mm256_set1_ps(g));
    // dq_t += dy s'; ds += dy q; s1 = g s; kv = s1 · k; dδ = ds · k.
    let (mut kv, mut dd) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for j in (0..whole).step_by(8) {
        let kj = ld(k, j);
        st(
            dq_t,
            j,
            _mm256_add_ps(ld(dq_t, j), _mm256_mul_ps(dyv, ld(s_next, j))),
        );
        let d = _mm256_add_ps(ld(dsr, j), _mm256_mul_ps(dyv, ld(q, j)));
        st(dsr, j, d);
        let s1 = _mm256_mul_ps(gv, ld(s_prev, j));
        kv = _mm256_add_ps(kv, _mm256_mul_ps(s1, kj));
        dd = _mm256_add_ps(dd, _mm256_mul_ps(d, kj));
    }
    let (mut kv_lanes, mut dd_lanes) = (lanes_of(kv), lanes_of(dd));
    for j in whole..n {
        dq_t[j] += dy * s_next[j];
        dsr[j] += dy * q[j];
        kv_lanes[j - whole] += (g * s_prev[j]) * k[j];
        dd_lanes[j - whole] += dsr[j] * k[j];
    }
    let err = v - sum_lanes(kv_lanes);
    let delta = err * beta;
    let ddelta = sum_lanes(dd_lanes);
    let dkv = -ddelta * beta;
    // dk_t += δ ds; dk_t += dkv s1; ds1 = ds + dkv k; dg = ds1 · s; ds = g ds1.
    let (deltav, dkvv) = (_mm256_set1_ps(delta), _mm256_set1_ps(dkv));
    let mut dg = _mm256_setzero_ps();
    for j in (0..whole).step_by(8) {
        let (d, sp) = (ld(dsr, j), ld(s_prev, j));
        let s1 = _mm256_mul_ps(gv, sp);
        let mut dkj = _mm256_add_ps(ld(dk_t, j), _mm256_mul_ps(deltav, d));
        dkj = _mm256_add_ps(dkj, _mm256_mul_ps(dkvv, s1));
        st(dk_t, j, dkj);
        let ds1 = _mm256_add_ps(d, _mm256_mul_ps(dkvv, ld(k, j)));
        dg = _mm256_add_ps(dg, _mm256_mul_ps(ds1, sp));
        st(dsr, j, _mm256_mul_ps(gv, ds1));
    }
    let mut dg_lanes = lanes_of(dg);
    for j in whole..n {
        let s1 = g * s_prev[j];
        dk_t[j] += delta * dsr[j];
        dk_t[j] += dkv * s1;
        let ds1 = dsr[j] + dkv * k[j];
        dg_lanes[j - whole] += ds1 * s_prev[j];
        dsr[j] = g * ds1;
    }
    (ddelta, err, sum_lanes(dg_lanes))
}
