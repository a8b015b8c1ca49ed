//! The Dk = 128 row kernel with AVX2. Each group of 32 elements (8 lanes × 4) sits in four
//! registers; a 4×4 transpose within each 128-bit half (`simd::avx2::transpose`) turns them
//! into "lane layout": register i of group g holds element i of lanes (8g, 8g+2, 8g+4,
//! 8g+6 | 8g+1, ..., 8g+7). Each lane's sequential sum is then a vertical add chain, and the
//! butterfly over the 32 partials (`simd::avx2::butterfly`) is extract/add and three
//! horizontal adds.

// The whole module is intrinsics on pointers whose validity the callers establish.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use super::exact_row::{RowIo, Tile};
use crate::cpu::elem::Elem;
use crate::cpu::simd::avx2::{butterfly, transpose};

/// Loads a row (natural order) into lane layout.
#[inline(always)]
unsafe fn load(src: *const f32, s: *mut __m256) {
    for g in 0..4 {
        let p = src.add(32 * g);
        let r = transpose([
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ]);
        for (i, v) in r.into_iter().enumerate() {
            *s.add(4 * g + i) = v;
        }
    }
}

/// Stores a row from lane layout back in natural order.
#[inline(always)]
unsafe fn store(s: *const __m256, dst: *mut f32) {
    for g in 0..4 {
        let r = transpose([
            *s.add(4 * g),
            *s.add(4 * g + 1),
            *s.add(4 * g + 2),
            *s.add(4 * g + 3),
        ]);
        let p = dst.add(32 * g);
        _mm256_storeu_ps(p, r[0]);
        _mm256_storeu_ps(p.add(8), r[1]);
        _mm256_storeu_ps(p.add(16), r[2]);
        _mm256_storeu_ps(p.add(24), r[3]);
    }
}

/// Rewrites 128 values from natural order into lane layout, in place.
#[target_feature(enable = "avx2")]
pub unsafe fn to_lane_layout(x: &mut [f32]) {
    let mut s = [_mm256_setzero_ps(); 16];
    load(x.as_ptr(), s.as_mut_ptr());
    for (j, v) in s.iter().enumerate() {
        _mm256_storeu_ps(x.as_mut_ptr().add(8 * j), *v);
    }
}

/// First half of a token for `R` rows (`s` holds 16·R vectors): `s *= g; kv += s·k`; the
/// lane partials of row r go to `kv[4r..4r+4]`.
#[inline(always)]
unsafe fn decay_and_read<const R: usize>(s: *mut __m256, g: f32, k: *const f32, kv: *mut __m256) {
    let g = _mm256_set1_ps(g);
    for group in 0..4 {
        // Lanes 8·group .. 8·group+8: element i of each lane, i = 0..3, in order.
        let mut a = [_mm256_setzero_ps(); R];
        for i in 0..4 {
            let j = 4 * group + i;
            let kj = _mm256_loadu_ps(k.add(8 * j));
            for r in 0..R {
                let x = _mm256_mul_ps(*s.add(16 * r + j), g);
                *s.add(16 * r + j) = x;
                a[r] = _mm256_add_ps(a[r], _mm256_mul_ps(x, kj));
            }
        }
        for r in 0..R {
            *kv.add(4 * r + group) = a[r];
        }
    }
}

/// Second half of token t (`s += k·delta`, and `out += s·q` when `Q`), fused with the
/// first half of the next token when `NEXT` (`s *= g'; kv' += s·k'`). Per element the
/// operations, and each lane's accumulation order, are those of the halves run one after
/// the other.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn update_and_next<const R: usize, const Q: bool, const NEXT: bool>(
    s: *mut __m256,
    delta: &[__m256; R],
    k: *const f32,
    q: *const f32,
    g_next: f32,
    k_next: *const f32,
    out: *mut __m256,
    kv: *mut __m256,
) {
    let g_next = _mm256_set1_ps(g_next);
    for group in 0..4 {
        let mut o = [_mm256_setzero_ps(); R];
        let mut a = [_mm256_setzero_ps(); R];
        for i in 0..4 {
            let j = 4 * group + i;
            let kj = _mm256_loadu_ps(k.add(8 * j));
            let qj = if Q { _mm256_loadu_ps(q.add(8 * j)) } else { kj };
            let kn = if NEXT {
                _mm256_loadu_ps(k_next.add(8 * j))
            } else {
                kj
            };
            for r in 0..R {
                let mut x = _mm256_add_ps(*s.add(16 * r + j), _mm256_mul_ps(kj, delta[r]));
                if Q {
                    o[r] = _mm256_add_ps(o[r], _mm256_mul_ps(x, qj));
                }
                if NEXT {
                    x = _mm256_mul_ps(x, g_next);
                    a[r] = _mm256_add_ps(a[r], _mm256_mul_ps(x, kn));
                }
                *s.add(16 * r + j) = x;
            }
        }
        for r in 0..R {
            if Q {
                *out.add(4 * r + group) = o[r];
            }
            if NEXT {
                *kv.add(4 * r + group) = a[r];
            }
        }
    }
}

/// Each lane's partial of products held in natural layout: `0 + p0 + p1 + p2 + p3` in
/// order (the kernel's sums start from 0), after a transpose into lane layout.
#[inline(always)]
unsafe fn lane_sum(p: [__m256; 4]) -> __m256 {
    let t = transpose(p);
    let zero = _mm256_setzero_ps();
    _mm256_add_ps(
        _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(zero, t[0]), t[1]), t[2]),
        t[3],
    )
}

/// Group `group` (32 values) of the read pass: `s *= g`, its 8 lanes' partials of s·k.
#[inline(always)]
unsafe fn read_group(src: *const f32, k: *const f32, gv: __m256, group: usize) -> __m256 {
    let (src, kg) = (src.add(32 * group), k.add(32 * group));
    lane_sum(std::array::from_fn(|i| {
        let x = _mm256_mul_ps(_mm256_loadu_ps(src.add(8 * i)), gv);
        _mm256_mul_ps(x, _mm256_loadu_ps(kg.add(8 * i)))
    }))
}

/// Group `group` of the update pass: `s = s·g + k·delta`, stored; with `Q` its lanes'
/// partials of s·q.
#[inline(always)]
unsafe fn update_group<const Q: bool>(
    src: *const f32,
    dst: *mut f32,
    k: *const f32,
    q: *const f32,
    gv: __m256,
    delta: __m256,
    group: usize,
) -> __m256 {
    let (src, dst, kg) = (src.add(32 * group), dst.add(32 * group), k.add(32 * group));
    let x: [__m256; 4] = std::array::from_fn(|i| {
        let decayed = _mm256_mul_ps(_mm256_loadu_ps(src.add(8 * i)), gv);
        _mm256_add_ps(
            decayed,
            _mm256_mul_ps(_mm256_loadu_ps(kg.add(8 * i)), delta),
        )
    });
    for (i, x) in x.iter().enumerate() {
        _mm256_storeu_ps(dst.add(8 * i), *x);
    }
    if Q {
        let qg = q.add(32 * group);
        lane_sum(std::array::from_fn(|i| {
            _mm256_mul_ps(x[i], _mm256_loadu_ps(qg.add(8 * i)))
        }))
    } else {
        _mm256_setzero_ps()
    }
}

/// One token for `blocks · R` value rows (`row(i)` gives row i), the state in natural
/// layout (a decode step). Arithmetic as `rows`: the elementwise operations are the same
/// (layout does not change them); each lane's products are moved into lane layout (a 4×4
/// transpose of 8 products per register) just before its sequential sum, so the state is
/// read twice (recomputing the decay, which gives the same bits) and written once, with no
/// transposed copy of it. Software-pipelined: the read pass of the next R rows runs inside
/// the update pass of the current ones, so one block's reductions (the butterflies between
/// its two passes) overlap the other's arithmetic. Every `src` must be non-null; `k` and
/// `q` hold the token's 128 values in natural order (`q` unused without `Q`).
#[target_feature(enable = "avx2")]
pub unsafe fn single_token<'a, T: Elem + 'a, const R: usize, const Q: bool>(
    k: *const f32,
    q: *const f32,
    g: f32,
    beta: f32,
    blocks: usize,
    row: impl Fn(usize) -> RowIo<'a, T>,
) {
    if blocks == 0 {
        return;
    }
    let gv = _mm256_set1_ps(g);
    let zero = _mm256_setzero_ps();
    let mut io: [RowIo<T>; R] = std::array::from_fn(&row);
    let mut kv = [[zero; 4]; R];
    for group in 0..4 {
        for r in 0..R {
            kv[r][group] = read_group(io[r].src, k, gv, group);
        }
    }
    for block in 0..blocks {
        let mut delta = [zero; R];
        for r in 0..R {
            let kv_mem = butterfly(kv[r]);
            delta[r] = _mm256_set1_ps(((*io[r].v.as_ptr()).to_f32() - kv_mem) * beta);
        }
        let next = (block + 1 < blocks).then(|| {
            let next: [RowIo<T>; R] = std::array::from_fn(|r| row((block + 1) * R + r));
            next
        });
        let mut out = [[zero; 4]; R];
        for group in 0..4 {
            for r in 0..R {
                out[r][group] = update_group::<Q>(io[r].src, io[r].dst, k, q, gv, delta[r], group);
            }
            if let Some(next) = &next {
                for r in 0..R {
                    kv[r][group] = read_group(next[r].src, k, gv, group);
                }
            }
        }
        if Q {
            for r in 0..R {
                *io[r].y = T::from_f32(butterfly(out[r]));
            }
        }
        match next {
            Some(next) => io = next,
            None => break,
        }
    }
}

/// `R` value rows over a tile, interleaved so that their dependency chains (each token's
/// reduction feeds the next token) overlap. Arithmetic as `row_portable`.
#[target_feature(enable = "avx2")]
pub unsafe fn rows<T: Elem, const R: usize>(tile: &Tile, io: [RowIo<T>; R]) {
    let mut state = [[_mm256_setzero_ps(); 16]; R];
    let mut kv = [[_mm256_setzero_ps(); 4]; R];
    let mut out = [[_mm256_setzero_ps(); 4]; R];
    let s = state.as_mut_ptr() as *mut __m256;
    let kvp = kv.as_mut_ptr() as *mut __m256;
    let outp = out.as_mut_ptr() as *mut __m256;
    for r in 0..R {
        if !io[r].src.is_null() {
            load(io[r].src, s.add(16 * r));
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
        let k = keys.add(t * 128);
        if !ready {
            decay_and_read::<R>(s, *gates.add(t), k, kvp);
        }
        let beta = *betas.add(t);
        let mut delta = [_mm256_setzero_ps(); R];
        for r in 0..R {
            let kv_mem = butterfly(*kvp.add(4 * r).cast::<[__m256; 4]>());
            delta[r] = _mm256_set1_ps(((*v[r].add(t * stride)).to_f32() - kv_mem) * beta);
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
        match (!queries.is_null(), ready) {
            (true, true) => {
                update_and_next::<R, true, true>(s, &delta, k, q, g_next, k_next, outp, kvp)
            }
            (true, false) => {
                update_and_next::<R, true, false>(s, &delta, k, q, g_next, k_next, outp, kvp)
            }
            (false, true) => {
                update_and_next::<R, false, true>(s, &delta, k, q, g_next, k_next, outp, kvp)
            }
            (false, false) => {
                update_and_next::<R, false, false>(s, &delta, k, q, g_next, k_next, outp, kvp)
            }
        }
        if !queries.is_null() {
            for r in 0..R {
                *y[r].add(t * stride) =
                    T::from_f32(butterfly(*outp.add(4 * r).cast::<[__m256; 4]>()));
            }
        }
    }
    for r in 0..R {
        store(s.add(16 * r), io[r].dst);
    }
}
