//! The Dk = 128 row kernel with AVX-512: `exact_avx2::rows` on sixteen lanes. Each group of 64
//! elements (16 lanes × 4) sits in four registers; a 4×4 transpose within each 128-bit quarter
//! (`simd::avx512::transpose`) turns them into lane layout: quarter k of register i of group g
//! holds element i of lanes 16g + (k, 4 + k, 8 + k, 12 + k). A row's state is 8 registers,
//! kept in registers across a tile; each lane's sequential sum is a vertical add chain, and the
//! butterfly over the 32 partials is `simd::avx512::butterfly`. The same operations per element
//! and the same order per lane as the AVX2 and portable kernels: the same bits.

// The whole module is intrinsics on pointers whose validity the callers establish; its loops
// index the register arrays (rows × registers) by position, as the AVX2 kernel's do.
#![allow(unsafe_op_in_unsafe_fn, clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::exact_row::{RowIo, Tile};
use crate::cpu::elem::Elem;
use crate::cpu::simd::avx512::{butterfly, transpose};

/// A row's state: 8 registers in lane layout.
type Row = [__m512; 8];

/// Loads a row (natural order) into lane layout.
#[inline(always)]
unsafe fn load(src: *const f32) -> Row {
    let mut s = [_mm512_setzero_ps(); 8];
    for g in 0..2 {
        let p = src.add(64 * g);
        let r = transpose([
            _mm512_loadu_ps(p),
            _mm512_loadu_ps(p.add(16)),
            _mm512_loadu_ps(p.add(32)),
            _mm512_loadu_ps(p.add(48)),
        ]);
        s[4 * g..4 * g + 4].copy_from_slice(&r);
    }
    s
}

/// Stores a row from lane layout back in natural order.
#[inline(always)]
unsafe fn store(s: &Row, dst: *mut f32) {
    for g in 0..2 {
        let r = transpose([s[4 * g], s[4 * g + 1], s[4 * g + 2], s[4 * g + 3]]);
        let p = dst.add(64 * g);
        for (i, r) in r.into_iter().enumerate() {
            _mm512_storeu_ps(p.add(16 * i), r);
        }
    }
}

/// Rewrites 128 values from natural order into this kernel's lane layout, in place.
#[target_feature(enable = "avx512f")]
pub unsafe fn to_lane_layout(x: &mut [f32]) {
    let s = load(x.as_ptr());
    for (j, v) in s.iter().enumerate() {
        _mm512_storeu_ps(x.as_mut_ptr().add(16 * j), *v);
    }
}

/// First half of a token for `R` rows: `s *= g`; the lane partials of `s·k` (group g of row r
/// in `kv[r][g]`).
#[inline(always)]
unsafe fn decay_and_read<const R: usize>(
    s: &mut [Row; R],
    g: f32,
    k: *const f32,
) -> [[__m512; 2]; R] {
    let g = _mm512_set1_ps(g);
    let mut kv = [[_mm512_setzero_ps(); 2]; R];
    for group in 0..2 {
        // Element i of each lane, i = 0..3, in order.
        for i in 0..4 {
            let j = 4 * group + i;
            let kj = _mm512_loadu_ps(k.add(16 * j));
            for r in 0..R {
                let x = _mm512_mul_ps(s[r][j], g);
                s[r][j] = x;
                kv[r][group] = _mm512_add_ps(kv[r][group], _mm512_mul_ps(x, kj));
            }
        }
    }
    kv
}

/// Second half of token t (`s += k·delta`, and the lane partials of `s·q` into `out` when
/// `Q`), fused with the first half of the next token when `NEXT` (`s *= g'`, the partials of
/// `s·k'` into `kv`). Per element the operations, and each lane's accumulation order, are
/// those of the halves run one after the other.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn update_and_next<const R: usize, const Q: bool, const NEXT: bool>(
    s: &mut [Row; R],
    delta: &[__m512; R],
    k: *const f32,
    q: *const f32,
    g_next: f32,
    k_next: *const f32,
    out: &mut [[__m512; 2]; R],
    kv: &mut [[__m512; 2]; R],
) {
    let g_next = _mm512_set1_ps(g_next);
    for group in 0..2 {
        let mut o = [_mm512_setzero_ps(); R];
        let mut a = [_mm512_setzero_ps(); R];
        for i in 0..4 {
            let j = 4 * group + i;
            let kj = _mm512_loadu_ps(k.add(16 * j));
            let qj = if Q {
                _mm512_loadu_ps(q.add(16 * j))
            } else {
                kj
            };
            let kn = if NEXT {
                _mm512_loadu_ps(k_next.add(16 * j))
            } else {
                kj
            };
            for r in 0..R {
                let mut x = _mm512_add_ps(s[r][j], _mm512_mul_ps(kj, delta[r]));
                if Q {
                    o[r] = _mm512_add_ps(o[r], _mm512_mul_ps(x, qj));
                }
                if NEXT {
                    x = _mm512_mul_ps(x, g_next);
                    a[r] = _mm512_add_ps(a[r], _mm512_mul_ps(x, kn));
                }
                s[r][j] = x;
            }
        }
        for r in 0..R {
            if Q {
                out[r][group] = o[r];
            }
            if NEXT {
                kv[r][group] = a[r];
            }
        }
    }
}

/// `R` value rows over a tile, interleaved so that their dependency chains (each token's
/// reduction feeds the next token) overlap; keys and queries in this kernel's lane layout
/// (`to_lane_layout`). Arithmetic as `row_portable`.
#[target_feature(enable = "avx512f,avx2")]
pub unsafe fn rows<T: Elem, const R: usize>(tile: &Tile, io: [RowIo<T>; R]) {
    let zero = _mm512_setzero_ps();
    let mut s = [[zero; 8]; R];
    for r in 0..R {
        if !io[r].src.is_null() {
            s[r] = load(io[r].src);
        }
    }
    let mut kv = [[zero; 2]; R];
    let mut out = [[zero; 2]; R];
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
        let k = keys.add(t * 128);
        if !ready {
            kv = decay_and_read::<R>(&mut s, *gates.add(t), k);
        }
        let beta = *betas.add(t);
        let mut delta = [zero; R];
        for r in 0..R {
            let kv_mem = butterfly(kv[r]);
            delta[r] = _mm512_set1_ps(((*v[r].add(t * stride)).to_f32() - kv_mem) * beta);
        }
        ready = t + 1 < tile.len && *active.add(t + 1);
        let (g_next, k_next) = if ready {
            (*gates.add(t + 1), keys.add((t + 1) * 128))
        } else {
            (1.0, k)
        };
        let q = if queries.is_null() {
            queries
        } else {
            queries.add(t * 128)
        };
        let (s, delta, out, kv) = (&mut s, &delta, &mut out, &mut kv);
        match (!queries.is_null(), ready) {
            (true, true) => {
                update_and_next::<R, true, true>(s, delta, k, q, g_next, k_next, out, kv)
            }
            (true, false) => {
                update_and_next::<R, true, false>(s, delta, k, q, g_next, k_next, out, kv)
            }
            (false, true) => {
                update_and_next::<R, false, true>(s, delta, k, q, g_next, k_next, out, kv)
            }
            (false, false) => {
                update_and_next::<R, false, false>(s, delta, k, q, g_next, k_next, out, kv)
            }
        }
        if !queries.is_null() {
            for r in 0..R {
                *y[r].add(t * stride) = T::from_f32(butterfly(out[r]));
            }
        }
    }
    for r in 0..R {
        store(&s[r], io[r].dst);
    }
}
