//! The row kernel with NEON, for Dk = 32·N (N = 1, 2, 3, 4 or 8 values a lane: Dk = 32, 64,
//! 96, 128, 256). A row's state sits in 8·N registers in lane layout (`simd::neon`: register
//! (g, i) holds element i of lanes 4g..4g+4), loaded and stored with the de-interleaving
//! `vld`/`vst` forms; the tile's keys and queries are put in lane layout once
//! (`to_lane_layout`). Each lane's sequential sum is then a vertical add chain, and the
//! butterfly over the 32 partials (`simd::neon::butterfly`) is pairwise adds. Products and sums
//! stay separate operations (no `fmla`): the bits are `row_portable`'s.

// The whole module is intrinsics on pointers whose validity the callers establish.
#![allow(unsafe_op_in_unsafe_fn)]
// Indexed loops over the rows' registers, as the x86 kernels write them.
#![allow(clippy::needless_range_loop)]

use std::arch::aarch64::*;

use super::exact_row::{RowIo, Tile};
use crate::cpu::elem::Elem;
use crate::cpu::simd::neon::{self, butterfly, load_lanes, store_lanes};

/// Whether the kernel runs key width `dk`.
pub fn supports(dk: usize) -> bool {
    dk.is_multiple_of(32) && neon::lane_layout_fits(dk / 32)
}

/// Rewrites one token's `dk` keys or queries (natural order) into lane layout, in place.
///
/// # Safety
/// `supports(x.len())`.
pub unsafe fn to_lane_layout(x: &mut [f32]) {
    match x.len() / 32 {
        1 => neon::to_lane_layout::<1>(x),
        2 => neon::to_lane_layout::<2>(x),
        3 => neon::to_lane_layout::<3>(x),
        4 => neon::to_lane_layout::<4>(x),
        8 => neon::to_lane_layout::<8>(x),
        n => unreachable!("no NEON row kernel for {n} values a lane"),
    }
}

/// Registers a row's state takes at most (Dk = 256).
const MAX_REGS: usize = 64;

/// Rows a call of `rows` interleaves at most.
pub const MAX_ROWS: usize = 4;

/// First half of a token for `R` rows (row r's state at `s + 8·N·r`): `s *= g; kv += s·k`;
/// row r's eight lane-group partials go to `kv[8r..8r+8]`.
#[inline(always)]
unsafe fn decay_and_read<const R: usize, const N: usize>(
    s: *mut float32x4_t,
    g: f32,
    k: *const f32,
    kv: *mut float32x4_t,
) {
    let g = vdupq_n_f32(g);
    for group in 0..8 {
        let mut a = [vdupq_n_f32(0.0); R];
        for i in 0..N {
            let j = N * group + i;
            let kj = vld1q_f32(k.add(4 * j));
            for r in 0..R {
                let x = vmulq_f32(*s.add(8 * N * r + j), g);
                *s.add(8 * N * r + j) = x;
                a[r] = vaddq_f32(a[r], vmulq_f32(x, kj));
            }
        }
        for r in 0..R {
            *kv.add(8 * r + group) = a[r];
        }
    }
}

/// Second half of a token (`s += k·delta`, and `out += s·q` when `Q`), fused with the first
/// half of the next token when `NEXT` (`s *= g'; kv' += s·k'`). Per element the operations,
/// and each lane's accumulation order, are those of the halves run one after the other.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn update_and_next<const R: usize, const N: usize, const Q: bool, const NEXT: bool>(
    s: *mut float32x4_t,
    delta: &[float32x4_t; R],
    k: *const f32,
    q: *const f32,
    g_next: f32,
    k_next: *const f32,
    out: *mut float32x4_t,
    kv: *mut float32x4_t,
) {
    let g_next = vdupq_n_f32(g_next);
    for group in 0..8 {
        let mut o = [vdupq_n_f32(0.0); R];
        let mut a = [vdupq_n_f32(0.0); R];
        for i in 0..N {
            let j = N * group + i;
            let kj = vld1q_f32(k.add(4 * j));
            let qj = if Q { vld1q_f32(q.add(4 * j)) } else { kj };
            let kn = if NEXT {
                vld1q_f32(k_next.add(4 * j))
            } else {
                kj
            };
            for r in 0..R {
                let at = s.add(8 * N * r + j);
                let mut x = vaddq_f32(*at, vmulq_f32(kj, delta[r]));
                if Q {
                    o[r] = vaddq_f32(o[r], vmulq_f32(x, qj));
                }
                if NEXT {
                    x = vmulq_f32(x, g_next);
                    a[r] = vaddq_f32(a[r], vmulq_f32(x, kn));
                }
                *at = x;
            }
        }
        for r in 0..R {
            if Q {
                *out.add(8 * r + group) = o[r];
            }
            if NEXT {
                *kv.add(8 * r + group) = a[r];
            }
        }
    }
}

/// `R` (≤ `MAX_ROWS`) value rows over a tile (keys and queries in lane layout), interleaved so
/// that their dependency chains (each token's reduction feeds the next token) overlap.
/// Arithmetic as `row_portable`; Dk = 32·N.
///
/// # Safety
/// As `row_portable`; `neon::lane_layout_fits(N)`.
pub unsafe fn rows<T: Elem, const R: usize, const N: usize>(tile: &Tile, io: [RowIo<T>; R]) {
    const { assert!(R <= MAX_ROWS) };
    let dk = 32 * N;
    let zero = vdupq_n_f32(0.0);
    // Row r's state at registers 8·N·r .. 8·N·(r + 1).
    // Only the 8·N·R registers used are written (loaded, or zeros), and only those are read: a
    // decode step does not pay for clearing the whole array.
    let mut state = std::mem::MaybeUninit::<[float32x4_t; MAX_ROWS * MAX_REGS]>::uninit();
    let mut kv = [[zero; 8]; R];
    let mut out = [[zero; 8]; R];
    let sp = state.as_mut_ptr() as *mut float32x4_t;
    let kvp = kv.as_mut_ptr() as *mut float32x4_t;
    let outp = out.as_mut_ptr() as *mut float32x4_t;
    for r in 0..R {
        if io[r].src.is_null() {
            for j in 0..8 * N {
                sp.add(8 * N * r + j).write(zero);
            }
        } else {
            for g in 0..8 {
                load_lanes::<N>(io[r].src.add(4 * N * g), sp.add(8 * N * r + N * g));
            }
        }
    }
    let keys = tile.k.as_ptr();
    let queries = tile.q.map_or(std::ptr::null(), |q| q.as_ptr());
    let (gates, betas, active) = (tile.g.as_ptr(), tile.beta.as_ptr(), tile.active.as_ptr());
    let v: [*const T; R] = std::array::from_fn(|r| io[r].v.as_ptr());
    let y: [*mut T; R] = std::array::from_fn(|r| io[r].y);
    let stride = io[0].stride;
    // Whether token t's first half already ran (fused into token t - 1).
    let mut ready = false;
    for t in 0..tile.len {
        if !*active.add(t) {
            if !queries.is_null() {
                for y in y {
                    *y.add(t * stride) = T::from_f32(0.0);
                }
            }
            continue;
        }
        let k = keys.add(t * dk);
        if !ready {
            decay_and_read::<R, N>(sp, *gates.add(t), k, kvp);
        }
        let beta = *betas.add(t);
        let mut delta = [zero; R];
        for r in 0..R {
            let kv_mem = butterfly(&*kvp.add(8 * r).cast::<[float32x4_t; 8]>());
            delta[r] = vdupq_n_f32(((*v[r].add(t * stride)).to_f32() - kv_mem) * beta);
        }
        ready = t + 1 < tile.len && *active.add(t + 1);
        let (g_next, k_next) = if ready {
            (*gates.add(t + 1), keys.add((t + 1) * dk))
        } else {
            (1.0, k)
        };
        let q = if queries.is_null() {
            queries
        } else {
            queries.add(t * dk)
        };
        match (!queries.is_null(), ready) {
            (true, true) => {
                update_and_next::<R, N, true, true>(sp, &delta, k, q, g_next, k_next, outp, kvp)
            }
            (true, false) => {
                update_and_next::<R, N, true, false>(sp, &delta, k, q, g_next, k_next, outp, kvp)
            }
            (false, true) => {
                update_and_next::<R, N, false, true>(sp, &delta, k, q, g_next, k_next, outp, kvp)
            }
            (false, false) => {
                update_and_next::<R, N, false, false>(sp, &delta, k, q, g_next, k_next, outp, kvp)
            }
        }
        if !queries.is_null() {
            for r in 0..R {
                let sum = butterfly(&*outp.add(8 * r).cast::<[float32x4_t; 8]>());
                *y[r].add(t * stride) = T::from_f32(sum);
            }
        }
    }
    for r in 0..R {
        for g in 0..8 {
            store_lanes::<N>(sp.add(8 * N * r + N * g), io[r].dst.add(4 * N * g));
        }
    }
}

/// `rows` for the key width of the tile (`supports(dk)`).
///
/// # Safety
/// As `rows`.
pub unsafe fn rows_for<T: Elem, const R: usize>(tile: &Tile, io: [RowIo<T>; R], dk: usize) {
    match dk / 32 {
        1 => rows::<T, R, 1>(tile, io),
        2 => rows::<T, R, 2>(tile, io),
        3 => rows::<T, R, 3>(tile, io),
        4 => rows::<T, R, 4>(tile, io),
        8 => rows::<T, R, 8>(tile, io),
        n => unreachable!("no NEON row kernel for {n} values a lane"),
    }
}
