//! The backward pass's row loops (`backward`) with NEON (arm64), as `backward_avx2` does them
//! with AVX2: the same f32 operations in the same order per element, so the same bits as the
//! portable loops. A dot product's eight partial sums (lane l takes elements l, l + 8, ...) are
//! the lanes of two registers (`Eight`: lanes 0-3 and 4-7); elements past the last whole group
//! of eight go to lanes 0, 1, ... as scalars, and the eight partials are added by the portable
//! code's `sum_lanes`. Multiplies and adds stay separate (no FMA): the portable code rounds
//! after each.
//!
//! Two loops of the portable row are fused into one pass where no element reads a value
//! another element writes in between: a row's elementwise updates and the dot products that
//! read their results, and `s1 = g · s`, which is recomputed rather than stored.

// The whole module is intrinsics on slices whose lengths the callers establish.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::aarch64::*;

use crate::cpu::reduce::sum_lanes;

/// Eight lanes: two NEON registers.
#[derive(Clone, Copy)]
struct Eight(float32x4_t, float32x4_t);

#[inline(always)]
unsafe fn load8(p: *const f32) -> Eight {
    Eight(vld1q_f32(p), vld1q_f32(p.add(4)))
}

#[inline(always)]
unsafe fn store8(p: *mut f32, v: Eight) {
    vst1q_f32(p, v.0);
    vst1q_f32(p.add(4), v.1);
}

#[inline(always)]
unsafe fn set8(x: f32) -> Eight {
    Eight(vdupq_n_f32(x), vdupq_n_f32(x))
}

#[inline(always)]
unsafe fn zero8() -> Eight {
    set8(0.0)
}

#[inline(always)]
unsafe fn add8(a: Eight, b: Eight) -> Eight {
    Eight(vaddq_f32(a.0, b.0), vaddq_f32(a.1, b.1))
}

#[inline(always)]
unsafe fn mul8(a: Eight, b: Eight) -> Eight {
    Eight(vmulq_f32(a.0, b.0), vmulq_f32(a.1, b.1))
}

#[inline(always)]
unsafe fn ld(x: &[f32], j: usize) -> Eight {
    load8(x.as_ptr().add(j))
}

#[inline(always)]
unsafe fn st(x: &mut [f32], j: usize, v: Eight) {
    store8(x.as_mut_ptr().add(j), v)
}

#[inline(always)]
unsafe fn lanes_of(v: Eight) -> [f32; 8] {
    let mut lanes = [0.0f32; 8];
    store8(lanes.as_mut_ptr(), v);
    lanes
}

/// One forward token on one state row (Dk values) read at `src` and written at `dst` (the
/// same row in place, or a copy): `r = src · g`, `δ = (v − r · k) β`, `r += k δ`; as the
/// portable `step` after a copy.
///
/// # Safety
/// `src` and `dst` address `k.len()` values, the same ones or disjoint.
pub unsafe fn step_row(src: *const f32, dst: *mut f32, k: &[f32], g: f32, v: f32, beta: f32) {
    let n = k.len();
    let whole = n - n % 8;
    let gv = set8(g);
    let mut acc = zero8();
    for j in (0..whole).step_by(8) {
        let x = mul8(load8(src.add(j)), gv);
        store8(dst.add(j), x);
        acc = add8(acc, mul8(x, ld(k, j)));
    }
    let mut lanes = lanes_of(acc);
    for j in whole..n {
        let x = *src.add(j) * g;
        *dst.add(j) = x;
        lanes[j - whole] += x * k[j];
    }
    let delta = (v - sum_lanes(lanes)) * beta;
    let dv = set8(delta);
    for j in (0..whole).step_by(8) {
        let r = load8(dst.add(j));
        store8(dst.add(j), add8(r, mul8(ld(k, j), dv)));
    }
    for j in whole..n {
        *dst.add(j) += k[j] * delta;
    }
}

/// One value row of one token in reverse (the portable loop body of `value_head`): updates
/// `dsr` (the row's state cotangent), `dq_t` and `dk_t`; returns `(dδ, v − kv, ds1 · s)`.
///
/// # Safety
/// every slice has the length of `k`.
#[allow(clippy::too_many_arguments)]
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
    let (dyv, gv) = (set8(dy), set8(g));
    // dq_t += dy s'; ds += dy q; s1 = g s; kv = s1 · k; dδ = ds · k.
    let (mut kv, mut dd) = (zero8(), zero8());
    for j in (0..whole).step_by(8) {
        let kj = ld(k, j);
        st(dq_t, j, add8(ld(dq_t, j), mul8(dyv, ld(s_next, j))));
        let d = add8(ld(dsr, j), mul8(dyv, ld(q, j)));
        st(dsr, j, d);
        let s1 = mul8(gv, ld(s_prev, j));
        kv = add8(kv, mul8(s1, kj));
        dd = add8(dd, mul8(d, kj));
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
    let (deltav, dkvv) = (set8(delta), set8(dkv));
    let mut dg = zero8();
    for j in (0..whole).step_by(8) {
        let (d, sp) = (ld(dsr, j), ld(s_prev, j));
        let s1 = mul8(gv, sp);
        let mut dkj = add8(ld(dk_t, j), mul8(deltav, d));
        dkj = add8(dkj, mul8(dkvv, s1));
        st(dk_t, j, dkj);
        let ds1 = add8(d, mul8(dkvv, ld(k, j)));
        dg = add8(dg, mul8(ds1, sp));
        st(dsr, j, mul8(gv, ds1));
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
