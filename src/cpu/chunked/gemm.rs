//! The products of the chunked form. Every product goes through one register-blocked kernel
//! (6 rows × 16 columns), with AVX2 + FMA intrinsics or as portable loops; the kernel also
//! stores the output rows and transposes the keys.

use crate::cpu::elem::Elem;

/// Value columns per panel (two 8-wide vectors): the columns of every product.
pub(super) const NR: usize = 16;

/// Rows of the register-blocked product kernel.
const MR: usize = 6;

/// What a product does with C: `C = (load ? c_scale · C : 0) + rs[r] · (A B)_r` (`rs` null:
/// 1; indexed by the product's row).
#[derive(Clone, Copy)]
pub(super) struct Epi {
    pub(super) load: bool,
    pub(super) c_scale: f32,
    pub(super) rs: *const f32,
}

impl Epi {
    pub(super) const SET: Epi = Epi {
        load: false,
        c_scale: 0.0,
        rs: std::ptr::null(),
    };
    pub(super) const ADD: Epi = Epi {
        load: true,
        c_scale: 1.0,
        rs: std::ptr::null(),
    };
}

/// One product `C[m, 16] = epi(C, A[m, kc] · B[kc, 16])`, A addressed as `a[r · a_rs + p]`,
/// B as `b[p · b_rs + j]`, C as `c[r · c_rs + j]`. With `tri`, row block `[r0, r0 + mb)` sums
/// `p <= r0` in the tile and row `r0 + i` adds `r0 < p <= r0 + i` in `triangle` (A lower
/// triangular: its zeros above the diagonal are never multiplied in).
#[derive(Clone, Copy)]
pub(super) struct Product {
    pub(super) m: usize,
    pub(super) kc: usize,
    pub(super) tri: bool,
    pub(super) a: *const f32,
    pub(super) a_rs: usize,
    pub(super) b: *const f32,
    pub(super) b_rs: usize,
    pub(super) c: *mut f32,
    pub(super) c_rs: usize,
    pub(super) epi: Epi,
}

/// The register-blocked product kernel (`gemm` runs a `Product`), and the stores and the
/// transpose that go with it.
pub(super) trait Kernel {
    unsafe fn gemm(p: Product);

    /// Writes `src` rounded to T at `dst` (an output row nobody reads soon).
    #[inline(always)]
    unsafe fn store_row<T: Elem>(dst: *mut T, src: &[f32]) {
        for (j, &x) in src.iter().enumerate() {
            *dst.add(j) = T::from_f32(x);
        }
    }

    /// Orders the `store_row` writes before what follows (the job's completion).
    #[inline(always)]
    fn store_fence() {}

    /// `dst[c · dst_rs + r] = src[r · src_rs + c]` for r < rows, c < cols, both multiples of 8.
    #[inline(always)]
    unsafe fn transpose(
        src: *const f32,
        src_rs: usize,
        dst: *mut f32,
        dst_rs: usize,
        rows: usize,
        cols: usize,
    ) {
        for r0 in (0..rows).step_by(8) {
            for c in 0..cols {
                for r in r0..r0 + 8 {
                    *dst.add(c * dst_rs + r) = *src.add(r * src_rs + c);
                }
            }
        }
    }
}

/// Splits `m` rows into blocks of at most MR, avoiding tiny tail blocks (a block of 1–3 rows
/// has too few independent accumulators): the last 6 + r rows become two near-equal blocks.
#[inline(always)]
fn row_blocks(m: usize, mut f: impl FnMut(usize, usize)) {
    let mut full = m / MR;
    let rem = m % MR;
    let mut r0 = 0;
    let split = rem > 0 && rem < 4 && full > 0;
    if split {
        full -= 1;
    }
    for _ in 0..full {
        f(r0, MR);
        r0 += MR;
    }
    if split {
        let last = MR + rem;
        let first = last.div_ceil(2);
        f(r0, first);
        f(r0 + first, last - first);
    } else if rem > 0 {
        f(r0, rem);
    }
}

/// The rest of a triangular product's row block after its full steps `p < kc` (`kc` = the
/// block's first row + 1): row r of the block adds `rs[r] · Σ A[r, p] B[p]` over
/// `kc <= p <= first row + r` only. The zeros above A's diagonal are skipped, not multiplied:
/// 0 · NaN or 0 · inf would otherwise reach tokens before the one that carries the NaN or inf.
/// `block` is the row block (`m` = mb rows): `a`, `c` and `epi.rs` (null: 1) start at its
/// first row.
///
/// # Safety
/// The pointers address the block's rows and B's rows up to `kc + mb - 1`.
#[inline(always)]
unsafe fn triangle(block: Product) {
    let Product {
        m: mb,
        kc,
        a,
        a_rs,
        b,
        b_rs,
        c,
        c_rs,
        ..
    } = block;
    let rs = block.epi.rs;
    for r in 1..mb {
        let mut acc = [0f32; NR];
        for p in kc..kc + r {
            let x = *a.add(r * a_rs + p);
            let bp = std::slice::from_raw_parts(b.add(p * b_rs), NR);
            for (acc, &b) in acc.iter_mut().zip(bp) {
                *acc += x * b;
            }
        }
        let scale = if rs.is_null() { 1.0 } else { *rs.add(r) };
        let cp = std::slice::from_raw_parts_mut(c.add(r * c_rs), NR);
        for (c, &x) in cp.iter_mut().zip(&acc) {
            *c += scale * x;
        }
    }
}

/// A product as row blocks: `tile(block)` runs the register tile on each block (`m` its rows;
/// A, C and the row scales moved to its first row; for a triangular A only the steps up to
/// the block's first diagonal element), then `triangle` adds the rest of a triangular block.
#[inline(always)]
unsafe fn blocks(p: Product, mut tile: impl FnMut(Product)) {
    let Product {
        kc,
        tri,
        a,
        a_rs,
        c,
        c_rs,
        epi,
        ..
    } = p;
    row_blocks(p.m, |r0, mb| {
        let kc = if tri { (r0 + 1).min(kc) } else { kc };
        let (a, c) = (a.add(r0 * a_rs), c.add(r0 * c_rs));
        let epi = Epi {
            rs: if epi.rs.is_null() {
                epi.rs
            } else {
                epi.rs.add(r0)
            },
            ..epi
        };
        let block = Product {
            m: mb,
            kc,
            a,
            c,
            epi,
            ..p
        };
        tile(block);
        if tri {
            triangle(block);
        }
    })
}

/// Runs `tile::<R>` for the row count `mb` (1..=MR) of a block.
macro_rules! dispatch_rows {
    ($mb:expr, $tile:ident, $($arg:expr),*) => {
        match $mb {
            6 => $tile::<6>($($arg),*),
            5 => $tile::<5>($($arg),*),
            4 => $tile::<4>($($arg),*),
            3 => $tile::<3>($($arg),*),
            2 => $tile::<2>($($arg),*),
            _ => $tile::<1>($($arg),*),
        }
    };
}

/// The portable product kernel (plain loops; the compiler vectorizes what it can).
pub(super) struct Portable;

/// One R×16 register tile (`block.m` = R rows).
#[inline(always)]
unsafe fn tile_portable<const R: usize>(block: Product) {
    let (kc, a, a_rs, b, b_rs) = (block.kc, block.a, block.a_rs, block.b, block.b_rs);
    let (c, c_rs, epi) = (block.c, block.c_rs, block.epi);
    let mut acc = [[0f32; NR]; R];
    for p in 0..kc {
        let bp = std::slice::from_raw_parts(b.add(p * b_rs), NR);
        for (r, row) in acc.iter_mut().enumerate() {
            let x = *a.add(r * a_rs + p);
            for (acc, b) in row.iter_mut().zip(bp) {
                *acc += x * b;
            }
        }
    }
    for (r, row) in acc.iter().enumerate() {
        let cp = std::slice::from_raw_parts_mut(c.add(r * c_rs), NR);
        let rs = if epi.rs.is_null() {
            1.0
        } else {
            *epi.rs.add(r)
        };
        for (c, &x) in cp.iter_mut().zip(row) {
            *c = if epi.load {
                epi.c_scale * *c + rs * x
            } else {
                rs * x
            };
        }
    }
}

impl Kernel for Portable {
    #[inline(always)]
    unsafe fn gemm(p: Product) {
        blocks(p, |block| dispatch_rows!(block.m, tile_portable, block))
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use avx2::Avx2;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The product kernel with AVX2 + FMA intrinsics.

    use super::*;
    use std::arch::x86_64::*;

    pub struct Avx2;

    /// One R×16 register tile: 2·R accumulators; per step two loads of B and R broadcasts of
    /// A (one pointer per row, indexed by the step); `block.m` = R.
    #[inline(always)]
    unsafe fn tile<const R: usize>(block: Product) {
        let (kc, a, a_rs, b, b_rs) = (block.kc, block.a, block.a_rs, block.b, block.b_rs);
        let (c, c_rs, epi) = (block.c, block.c_rs, block.epi);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let rows: [*const f32; R] = std::array::from_fn(|r| a.add(r * a_rs));
        let mut bp = b;
        for p in 0..kc {
            let b0 = _mm256_loadu_ps(bp);
            let b1 = _mm256_loadu_ps(bp.add(8));
            for (acc, row) in acc.iter_mut().zip(rows) {
                let x = _mm256_broadcast_ss(&*row.add(p));
                acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
            }
            bp = bp.add(b_rs);
        }
        let cs = _mm256_set1_ps(epi.c_scale);
        for (r, acc) in acc.iter().enumerate() {
            let cp = c.add(r * c_rs);
            let mut x = *acc;
            if !epi.rs.is_null() {
                let rs = _mm256_set1_ps(*epi.rs.add(r));
                x = [_mm256_mul_ps(x[0], rs), _mm256_mul_ps(x[1], rs)];
            }
            if epi.load {
                x = [
                    _mm256_fmadd_ps(_mm256_loadu_ps(cp), cs, x[0]),
                    _mm256_fmadd_ps(_mm256_loadu_ps(cp.add(8)), cs, x[1]),
                ];
            }
            _mm256_storeu_ps(cp, x[0]);
            _mm256_storeu_ps(cp.add(8), x[1]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn gemm_avx2(p: Product) {
        blocks(p, |block| dispatch_rows!(block.m, tile, block))
    }

    impl Kernel for Avx2 {
        #[inline(always)]
        unsafe fn gemm(p: Product) {
            gemm_avx2(p)
        }

        /// Non-temporal stores when the row is whole 16-byte blocks at a 16-byte aligned
        /// address: y is written once and read by the next layer, so it need not take cache
        /// space or a read for ownership.
        #[inline(always)]
        unsafe fn store_row<T: Elem>(dst: *mut T, src: &[f32]) {
            let bytes = std::mem::size_of_val(src) / 4 * std::mem::size_of::<T>();
            if bytes % 16 != 0 || (dst as usize) % 16 != 0 {
                for (j, &x) in src.iter().enumerate() {
                    *dst.add(j) = T::from_f32(x);
                }
                return;
            }
            // Pieces of 64 elements through a small aligned buffer.
            #[repr(align(16))]
            struct Buf<T>([T; 64]);
            let mut buf = Buf([T::from_f32(0.0); 64]);
            let per = 16 / std::mem::size_of::<T>();
            for (n, piece) in src.chunks(64).enumerate() {
                for (o, &x) in buf.0.iter_mut().zip(piece) {
                    *o = T::from_f32(x);
                }
                let out = dst.add(n * 64) as *mut __m128i;
                let inp = buf.0.as_ptr() as *const __m128i;
                for blk in 0..piece.len() / per {
                    _mm_stream_si128(out.add(blk), _mm_load_si128(inp.add(blk)));
                }
            }
        }

        #[inline(always)]
        fn store_fence() {
            // SAFETY: SSE is part of x86-64.
            unsafe { _mm_sfence() };
        }

        /// In 8×8 blocks: eight row loads, the register transpose, eight row stores.
        #[inline(always)]
        unsafe fn transpose(
            src: *const f32,
            src_rs: usize,
            dst: *mut f32,
            dst_rs: usize,
            rows: usize,
            cols: usize,
        ) {
            for r0 in (0..rows).step_by(8) {
                for c0 in (0..cols).step_by(8) {
                    let x: [__m256; 8] =
                        std::array::from_fn(|i| _mm256_loadu_ps(src.add((r0 + i) * src_rs + c0)));
                    let t0 = _mm256_unpacklo_ps(x[0], x[1]);
                    let t1 = _mm256_unpackhi_ps(x[0], x[1]);
                    let t2 = _mm256_unpacklo_ps(x[2], x[3]);
                    let t3 = _mm256_unpackhi_ps(x[2], x[3]);
                    let t4 = _mm256_unpacklo_ps(x[4], x[5]);
                    let t5 = _mm256_unpackhi_ps(x[4], x[5]);
                    let t6 = _mm256_unpacklo_ps(x[6], x[7]);
                    let t7 = _mm256_unpackhi_ps(x[6], x[7]);
                    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
                    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
                    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
                    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
                    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
                    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
                    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
                    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
                    let y = [
                        _mm256_permute2f128_ps::<0x20>(u0, u4),
                        _mm256_permute2f128_ps::<0x20>(u1, u5),
                        _mm256_permute2f128_ps::<0x20>(u2, u6),
                        _mm256_permute2f128_ps::<0x20>(u3, u7),
                        _mm256_permute2f128_ps::<0x31>(u0, u4),
                        _mm256_permute2f128_ps::<0x31>(u1, u5),
                        _mm256_permute2f128_ps::<0x31>(u2, u6),
                        _mm256_permute2f128_ps::<0x31>(u3, u7),
                    ];
                    for (i, y) in y.into_iter().enumerate() {
                        _mm256_storeu_ps(dst.add((c0 + i) * dst_rs + r0), y);
                    }
                }
            }
        }
    }
}
