//! The products of the chunked form. Every product goes through one register-blocked kernel:
//! 6 rows × 16 columns with AVX2 + FMA intrinsics, NEON intrinsics (`gemm/neon.rs`) or as
//! portable loops, or, with AVX-512, up to 12 rows × 32 columns (two panels per product); the kernel also stores the output rows and
//! transposes the keys. A is read by rows or by columns (the products of K and Q read `[K; Q]ᵀ`:
//! a step's broadcasts then come from one pointer at fixed offsets).
//!
//! The AVX2, AVX-512 and NEON kernels compute the same bits: each element of a product is one chain
//! of fused multiply-adds over the steps in order from +0 (for a triangular A only the steps
//! up to the diagonal), then the same epilogue, whatever the register tile.

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

/// One product `C[m, 16] = epi(C, A[m, kc] · B[kc, 16])`, A addressed as
/// `a[r · a_rs + p · a_cs]` with one of the two strides 1 (A by rows or by columns), B as
/// `b[p · b_rs + j]`, C as `c[r · c_rs + j]`; with `panels` = 2 also the same product for a
/// second panel of 16 columns, B at `b + b_ps`, C at `c + c_ps`. With `tri` (and `kc` ≥ `m`),
/// row r sums only the steps `p <= r` (A lower triangular: its zeros above the diagonal are
/// never multiplied in: 0 · NaN or 0 · inf would otherwise reach tokens before the one that
/// carries the NaN or inf).
#[derive(Clone, Copy)]
pub(super) struct Product {
    pub(super) m: usize,
    pub(super) kc: usize,
    pub(super) tri: bool,
    pub(super) a: *const f32,
    pub(super) a_rs: usize,
    pub(super) a_cs: usize,
    pub(super) b: *const f32,
    pub(super) b_rs: usize,
    pub(super) c: *mut f32,
    pub(super) c_rs: usize,
    pub(super) panels: usize,
    pub(super) b_ps: usize,
    pub(super) c_ps: usize,
    pub(super) epi: Epi,
}

impl Product {
    /// Panel `q` alone.
    #[inline(always)]
    unsafe fn panel(self, q: usize) -> Product {
        Product {
            b: self.b.add(q * self.b_ps),
            c: self.c.add(q * self.c_ps),
            panels: 1,
            ..self
        }
    }
}

/// The register-blocked product kernel (`gemm` runs a `Product`), and the stores and the
/// transpose that go with it.
pub(super) trait Kernel {
    /// Panels a product should have (1 or 2): the kernel's tiles span that many.
    const PANELS: usize;

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
/// Returns the number of full blocks and the tail blocks' rows (0: none).
#[inline(always)]
fn row_blocks(m: usize) -> (usize, [usize; 2]) {
    let (full, rem) = (m / MR, m % MR);
    if rem > 0 && rem < 4 && full > 0 {
        let last = MR + rem;
        let first = last.div_ceil(2);
        (full - 1, [first, last - first])
    } else {
        (full, [rem, 0])
    }
}

/// Row block `[r0, r0 + mb)` of a product: `tile` on it (see `blocks`).
///
/// A named function rather than a closure, like everything between a kernel's
/// `#[target_feature]` function and its loops: a closure is compiled without the features of
/// the function it is written in (only the kernel's own tile closure is written there).
#[inline(always)]
unsafe fn block(p: Product, r0: usize, mb: usize, tile: &mut impl FnMut(Product)) {
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
}

/// A product as row blocks (`row_blocks`): `tile(block)` runs the register tile on each block
/// (`m` its rows; A, C and the row scales moved to its first row; for a triangular A, `kc`
/// the steps up to the block's first diagonal element: the tile's triangle steps add the
/// rest).
#[inline(always)]
unsafe fn blocks(p: Product, mut tile: impl FnMut(Product)) {
    let (full, tail) = row_blocks(p.m);
    let mut r0 = 0;
    for _ in 0..full {
        block(p, r0, MR, &mut tile);
        r0 += MR;
    }
    for mb in tail {
        if mb > 0 {
            block(p, r0, mb, &mut tile);
            r0 += mb;
        }
    }
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
    let (kc, a, a_rs, a_cs) = (block.kc, block.a, block.a_rs, block.a_cs);
    let (b, b_rs, c, c_rs, epi) = (block.b, block.b_rs, block.c, block.c_rs, block.epi);
    let mut acc = [[0f32; NR]; R];
    for p in 0..kc {
        let bp = std::slice::from_raw_parts(b.add(p * b_rs), NR);
        for (r, row) in acc.iter_mut().enumerate() {
            let x = *a.add(r * a_rs + p * a_cs);
            for (acc, b) in row.iter_mut().zip(bp) {
                *acc += x * b;
            }
        }
    }
    if block.tri {
        // Step kc - 1 + j reaches rows j.. of the block (its diagonal and below).
        for j in 1..R {
            let p = kc - 1 + j;
            let bp = std::slice::from_raw_parts(b.add(p * b_rs), NR);
            for (r, row) in acc.iter_mut().enumerate().skip(j) {
                let x = *a.add(r * a_rs + p * a_cs);
                for (acc, b) in row.iter_mut().zip(bp) {
                    *acc += x * b;
                }
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
    const PANELS: usize = 1;

    #[inline(always)]
    unsafe fn gemm(p: Product) {
        for q in 0..p.panels {
            blocks(p.panel(q), |block| {
                dispatch_rows!(block.m, tile_portable, block)
            })
        }
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
    /// A (A by columns: from one pointer, moved by a column per step; by rows: one pointer per
    /// row, indexed by the step); `block.m` = R. A triangular A (`TRI`, as `block.tri`) is
    /// read by rows.
    #[inline(always)]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tile<const R: usize, const TRI: bool>(block: Product) {
        let (kc, a, a_rs, a_cs, b, b_rs) = (
            block.kc, block.a, block.a_rs, block.a_cs, block.b, block.b_rs,
        );
        let (c, c_rs, epi) = (block.c, block.c_rs, block.epi);
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let mut bp = b;
        debug_assert!(!TRI || a_cs == 1);
        if a_rs == 1 {
            let mut ap = a;
            for _ in 0..kc {
                let b0 = _mm256_loadu_ps(bp);
                let b1 = _mm256_loadu_ps(bp.add(8));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_broadcast_ss(&*ap.add(r));
                    acc[0] = _mm256_fmadd_ps(x, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(x, b1, acc[1]);
                }
                ap = ap.add(a_cs);
                bp = bp.add(b_rs);
            }
        } else {
            debug_assert_eq!(a_cs, 1);
            let rows: [*const f32; R] = std::array::from_fn(|r| a.add(r * a_rs));
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
            if TRI {
                // Step kc - 1 + j reaches rows j.. of the block (A by rows: the triangular
                // products' A).
                for j in 1..R {
                    let p = kc - 1 + j;
                    let b0 = _mm256_loadu_ps(b.add(p * b_rs));
                    let b1 = _mm256_loadu_ps(b.add(p * b_rs + 8));
                    for r in 0..R {
                        // Rows before j keep their accumulators (the sums with A's zero above
                        // the diagonal are dropped).
                        let keep = _mm256_castsi256_ps(_mm256_set1_epi32(-((r >= j) as i32)));
                        let x = _mm256_broadcast_ss(&*rows[r].add(p));
                        let s0 = _mm256_fmadd_ps(x, b0, acc[r][0]);
                        let s1 = _mm256_fmadd_ps(x, b1, acc[r][1]);
                        acc[r][0] = _mm256_blendv_ps(acc[r][0], s0, keep);
                        acc[r][1] = _mm256_blendv_ps(acc[r][1], s1, keep);
                    }
                }
            }
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

    /// `tile` of a product that is not triangular.
    #[inline(always)]
    unsafe fn tile_full<const R: usize>(block: Product) {
        tile::<R, false>(block)
    }

    /// `tile` of a triangular product.
    #[inline(always)]
    unsafe fn tile_tri<const R: usize>(block: Product) {
        tile::<R, true>(block)
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn gemm_avx2(p: Product) {
        for q in 0..p.panels {
            blocks(p.panel(q), |block| match block.tri {
                false => dispatch_rows!(block.m, tile_full, block),
                true => dispatch_rows!(block.m, tile_tri, block),
            })
        }
    }

    impl Kernel for Avx2 {
        const PANELS: usize = 1;

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

#[cfg(target_arch = "x86_64")]
pub(super) use avx512::Avx512;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! The product kernel with AVX-512: tiles of up to `MR512` rows × two panels (32 columns),
    //! one 16-wide register per row and panel: 24 accumulators, and per step two loads of B
    //! and one broadcast of A per row for 24 fused multiply-adds (two FMA units need at least
    //! 8 independent chains; a single panel's tile, with one broadcast per multiply-add, is
    //! bound by the loads). The stores and the transpose are the AVX2 kernel's.

    use super::*;
    use std::arch::x86_64::*;

    pub struct Avx512;

    /// Rows of the register tile.
    const MR512: usize = 12;

    /// One R×16 register tile per panel (`P` panels): R·P accumulators; per step P loads of
    /// B and R broadcasts of A (as in `avx2::tile`); `block.m` = R, `block.panels` = P, `TRI`
    /// = `block.tri`. Per element the same chain and epilogue as `avx2::tile`.
    #[inline(always)]
    // Indexed loops: iterators over the nested accumulator array kept it in memory.
    #[allow(clippy::needless_range_loop)]
    unsafe fn tile<const R: usize, const P: usize, const TRI: bool>(block: Product) {
        let (kc, a, a_rs, a_cs) = (block.kc, block.a, block.a_rs, block.a_cs);
        let (b, b_rs, b_ps) = (block.b, block.b_rs, block.b_ps);
        let (c, c_rs, c_ps, epi) = (block.c, block.c_rs, block.c_ps, block.epi);
        let mut acc = [[_mm512_setzero_ps(); P]; R];
        let mut bp = b;
        let mut bq = [_mm512_setzero_ps(); P];
        debug_assert!(!TRI || a_cs == 1);
        if a_rs == 1 {
            let mut ap = a;
            for _ in 0..kc {
                for q in 0..P {
                    bq[q] = _mm512_loadu_ps(bp.add(q * b_ps));
                }
                for r in 0..R {
                    let x = _mm512_set1_ps(*ap.add(r));
                    for q in 0..P {
                        acc[r][q] = _mm512_fmadd_ps(x, bq[q], acc[r][q]);
                    }
                }
                ap = ap.add(a_cs);
                bp = bp.add(b_rs);
            }
        } else {
            debug_assert_eq!(a_cs, 1);
            let rows: [*const f32; R] = std::array::from_fn(|r| a.add(r * a_rs));
            for p in 0..kc {
                for q in 0..P {
                    bq[q] = _mm512_loadu_ps(bp.add(q * b_ps));
                }
                for r in 0..R {
                    let x = _mm512_set1_ps(*rows[r].add(p));
                    for q in 0..P {
                        acc[r][q] = _mm512_fmadd_ps(x, bq[q], acc[r][q]);
                    }
                }
                bp = bp.add(b_rs);
            }
            if TRI {
                // As in `avx2::tile`: step kc - 1 + j reaches rows j.. of the block.
                for j in 1..R {
                    let p = kc - 1 + j;
                    for q in 0..P {
                        bq[q] = _mm512_loadu_ps(b.add(p * b_rs + q * b_ps));
                    }
                    for r in 0..R {
                        // Rows before j keep their accumulators (A's zero above the diagonal,
                        // read, is not multiplied in).
                        let keep = ((r >= j) as u16).wrapping_neg();
                        let x = _mm512_set1_ps(*rows[r].add(p));
                        for q in 0..P {
                            acc[r][q] = _mm512_mask3_fmadd_ps(x, bq[q], acc[r][q], keep);
                        }
                    }
                }
            }
        }
        let cs = _mm512_set1_ps(epi.c_scale);
        for r in 0..R {
            for q in 0..P {
                let cp = c.add(r * c_rs + q * c_ps);
                let mut x = acc[r][q];
                if !epi.rs.is_null() {
                    x = _mm512_mul_ps(x, _mm512_set1_ps(*epi.rs.add(r)));
                }
                if epi.load {
                    x = _mm512_fmadd_ps(_mm512_loadu_ps(cp), cs, x);
                }
                _mm512_storeu_ps(cp, x);
            }
        }
    }

    /// Runs `tile::<R, P>` for the row count `mb` (1..=MR512) and the panels of a block.
    #[inline(always)]
    unsafe fn tile_any(block: Product) {
        macro_rules! rows {
            ($p:literal, $t:literal) => {
                match block.m {
                    12 => tile::<12, $p, $t>(block),
                    11 => tile::<11, $p, $t>(block),
                    10 => tile::<10, $p, $t>(block),
                    9 => tile::<9, $p, $t>(block),
                    8 => tile::<8, $p, $t>(block),
                    7 => tile::<7, $p, $t>(block),
                    6 => tile::<6, $p, $t>(block),
                    5 => tile::<5, $p, $t>(block),
                    4 => tile::<4, $p, $t>(block),
                    3 => tile::<3, $p, $t>(block),
                    2 => tile::<2, $p, $t>(block),
                    _ => tile::<1, $p, $t>(block),
                }
            };
        }
        match (block.panels == 2, block.tri) {
            (true, false) => rows!(2, false),
            (false, false) => rows!(1, false),
            (true, true) => rows!(2, true),
            (false, true) => rows!(1, true),
        }
    }

    #[target_feature(enable = "avx512f,avx2,fma")]
    unsafe fn gemm_avx512(p: Product) {
        if p.tri {
            // The AVX2 kernel's 6-row blocks: a triangular tile's steps past its first row
            // run on all its rows (masked), so short blocks waste fewer.
            blocks(p, |block| tile_any(block));
            return;
        }
        // Near-equal blocks of at most MR512 rows (a product has the same bits whatever its
        // blocks).
        let n = p.m.div_ceil(MR512);
        let mut r0 = 0;
        for i in 0..n {
            let mb = (p.m - r0) / (n - i);
            let rs = if p.epi.rs.is_null() {
                p.epi.rs
            } else {
                p.epi.rs.add(r0)
            };
            tile_any(Product {
                m: mb,
                a: p.a.add(r0 * p.a_rs),
                c: p.c.add(r0 * p.c_rs),
                epi: Epi { rs, ..p.epi },
                ..p
            });
            r0 += mb;
        }
    }

    impl Kernel for Avx512 {
        const PANELS: usize = 2;

        #[inline(always)]
        unsafe fn gemm(p: Product) {
            gemm_avx512(p)
        }

        #[inline(always)]
        unsafe fn store_row<T: Elem>(dst: *mut T, src: &[f32]) {
            <super::Avx2 as Kernel>::store_row(dst, src)
        }

        #[inline(always)]
        fn store_fence() {
            <super::Avx2 as Kernel>::store_fence()
        }

        #[inline(always)]
        unsafe fn transpose(
            src: *const f32,
            src_rs: usize,
            dst: *mut f32,
            dst_rs: usize,
            rows: usize,
            cols: usize,
        ) {
            <super::Avx2 as Kernel>::transpose(src, src_rs, dst, dst_rs, rows, cols)
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
pub(super) use neon::Neon;
