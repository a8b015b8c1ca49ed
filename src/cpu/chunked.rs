//! The gated delta rule in chunked (WY / UT) form: an explicit, faster prefill option whose
//! results equal the exact recurrence (`gated_delta`) up to float32 rounding, not bit for bit.
//!
//! Per (batch row, value head) the state is kept transposed, `H = Sᵀ` (`[Dk, Dv]`), in panels
//! of 16 value columns. Active (unmasked) tokens are gathered into chunks of C (a masked token
//! is an identity step: it is skipped and its output is zero). For a chunk of L tokens with
//! keys K, queries Q (`[L, Dk]`), values V (`[L, Dv]`), gates g, β, and the state H at its
//! start:
//!
//! * `Γ(t, s) = g_{s+1} ⋯ g_t` (s ≤ t) and `γ_t = g_0 ⋯ g_t`, as running products: a product
//!   of gates in (0, 1] only shrinks, so tiny gates underflow gracefully to 0 and no ratio of
//!   underflowed values is ever formed.
//! * `A[t, s] = β_t Γ(t, s) k_t·k_s` (s < t) and the UT transform `Tm = (I + A)⁻¹`, unit lower
//!   triangular, by blocked forward substitution (16-row blocks; the off-diagonal part of each
//!   block is a product, the diagonal part row by row).
//! * The delta-rule corrections `U = Tm diag(β) (V − diag(γ) K H)` (row t is token t's
//!   `delta`), the outputs `Y = diag(γ) Q H + P U` with `P[t, s] = Γ(t, s) q_t·k_s` (s ≤ t), and
//!   the state `H ← γ_{L-1} H + Kᵀ diag(Γ(L-1, ·)) U`.
//!
//! Every value column evolves independently, so each 16-column panel of H runs the chunk's
//! products on its own (the panel stays in L1); the per-chunk matrices are shared by the
//! panels, and the Gram products `[K; Q] Kᵀ` by the value heads that read the same key head.
//! A job is one batch row and a range of key heads (or also a column range, when there are
//! too few for the threads); it walks the chunks, and within a chunk the key heads (a "unit"
//! is one chunk of one key head), so that neighbouring heads' rows, which share pages, are
//! read together. All products go through one register-blocked kernel (6 rows × 16 columns):
//! with AVX2+FMA detected at run time it uses intrinsics, elsewhere a portable version of the
//! same loops. Rows of q, k, v and y are strided in memory (`[B, T, H, D]`), so each unit's
//! rows are gathered into contiguous scratch; while a unit's products run, the next unit's rows
//! are prefetched and the previous unit's outputs written (non-temporal stores where aligned),
//! a little after each product. Scratch is per thread and reused; nothing is allocated per
//! chunk.
//!
//! Per token and value head this costs about `3·Dk·Dv + C·(Dv + Dk)` multiply-adds (the
//! sequential recurrence: `2·Dk·Dv`), almost all of them in the register-blocked products.

// The product kernels and the job code work on raw pointers into the per-thread scratch and
// the output buffers; their validity is established once per job (`run_job`'s contract) and
// per product (`Kernel::gemm`'s), not per operation.
#![allow(unsafe_op_in_unsafe_fn)]

use std::cell::RefCell;

use super::elem::Elem;
use super::features;
use super::gated_delta::{Dims, Out, StateIn};
use super::pool;

/// Tokens per chunk unless the caller asks otherwise (32 measured faster than 64 on an AVX2
/// machine: fewer intra-chunk multiply-adds, a working set well inside L2).
pub const DEFAULT_CHUNK: usize = 32;

/// Largest chunk the kernel accepts.
pub const MAX_CHUNK: usize = 128;

/// Smallest chunk the kernel accepts; every chunk size is a multiple of it.
pub const MIN_CHUNK: usize = NR;

/// Value columns per panel (two 8-wide vectors).
const NR: usize = 16;

/// Rows of the register-blocked product kernel.
const MR: usize = 6;

/// Rows of the triangular inversion's blocks.
const TB: usize = 16;

/// Tokens ahead that the gather prefetches (for the first unit; later units' rows were
/// prefetched during the unit before).
const AHEAD: usize = 2;

/// Knobs of the chunked kernel (tests and benchmarks vary them; callers use the default).
#[derive(Debug, Clone, Copy)]
pub struct ChunkedOptions {
    /// Tokens per chunk: a multiple of 16 in 16..=128.
    pub chunk: usize,
    /// Use the portable product kernel even where AVX2+FMA is available.
    pub force_portable: bool,
}

impl Default for ChunkedOptions {
    fn default() -> Self {
        ChunkedOptions {
            chunk: DEFAULT_CHUNK,
            force_portable: false,
        }
    }
}

/// Chunked (WY-form) gated delta rule: same results as the exact recurrence up to float32
/// rounding (not bit-exact). Inputs: q, k [B, T, Hk, Dk]; v [B, T, Hv, Dv] (element type T);
/// g, beta [B, T, Hv] f32; state_in [B, Hv, Dv, Dk] f32 or None (zeros); mask [B, T] bytes or
/// None (0 = padding: the state is left unchanged and y is 0). Outputs: y [B, T, Hv, Dv] (T),
/// state [B, Hv, Dv, Dk] f32.
#[allow(clippy::too_many_arguments)]
pub fn chunked_recurrence<T: Elem>(
    d: Dims,
    q: &[T],
    k: &[T],
    v: &[T],
    g: &[f32],
    beta: &[f32],
    state_in: Option<&[f32]>,
    mask: Option<&[u8]>,
    y: &mut [T],
    state: &mut [f32],
) {
    let init = match state_in {
        Some(s) => StateIn::Buffer(s),
        None => StateIn::Zeros,
    };
    chunked_recurrence_with(
        d,
        q,
        k,
        v,
        g,
        beta,
        init,
        mask,
        y,
        state,
        ChunkedOptions::default(),
    )
}

/// As `chunked_recurrence`, with the initial state given as a `StateIn` (`InPlace`: `state`
/// holds the initial state on entry, as when MLX donated the state buffer) and explicit options.
#[allow(clippy::too_many_arguments)]
pub fn chunked_recurrence_with<T: Elem>(
    d: Dims,
    q: &[T],
    k: &[T],
    v: &[T],
    g: &[f32],
    beta: &[f32],
    state_in: StateIn,
    mask: Option<&[u8]>,
    y: &mut [T],
    state: &mut [f32],
    opts: ChunkedOptions,
) {
    assert!(
        opts.chunk >= NR && opts.chunk <= MAX_CHUNK && opts.chunk % NR == 0,
        "chunk size {} is not a multiple of {NR} in {NR}..={MAX_CHUNK}",
        opts.chunk
    );
    assert!(
        d.hv == 0 || (d.hk > 0 && d.hv % d.hk == 0),
        "Hv = {} is not a multiple of Hk = {}",
        d.hv,
        d.hk
    );
    let qk_len = d.b * d.t * d.hk * d.dk;
    let v_len = d.b * d.t * d.hv * d.dv;
    let gate_len = d.b * d.t * d.hv;
    let state_len = d.b * d.hv * d.dv * d.dk;
    assert_eq!(q.len(), qk_len, "q has the wrong length");
    assert_eq!(k.len(), qk_len, "k has the wrong length");
    assert_eq!(v.len(), v_len, "v has the wrong length");
    assert_eq!(y.len(), v_len, "y has the wrong length");
    assert_eq!(g.len(), gate_len, "g has the wrong length");
    assert_eq!(beta.len(), gate_len, "beta has the wrong length");
    assert_eq!(state.len(), state_len, "state has the wrong length");
    if let StateIn::Buffer(s) = state_in {
        assert_eq!(s.len(), state_len, "state_in has the wrong length");
    }
    if let Some(m) = mask {
        assert_eq!(m.len(), d.b * d.t, "mask has the wrong length");
    }
    if d.b == 0 || d.hv == 0 || d.dv == 0 {
        // y and the state are empty.
        return;
    }

    let group = d.hv / d.hk;
    let panels = d.dv.div_ceil(NR);
    let threads = pool::threads();
    // A job runs several key heads of one batch row, chunk by chunk and within a chunk head by
    // head: the rows of neighbouring heads share pages and cache lines, which a head-at-a-time
    // walk over the strided [B, T, H, D] rows would touch once per head. Enough jobs for four
    // per thread when there are enough key heads (the pool hands jobs out as threads free up,
    // so a thread slowed by other work does less of them).
    let splits = (4 * threads).div_ceil(d.b).clamp(1, d.hk);
    let jobs = d.b * splits;
    // Still fewer jobs than the threads can share out evenly: split the value columns into
    // parts as well (each part repeats the per-chunk shared work, about a tenth of the total).
    let mut parts = 1;
    while parts < panels && (jobs * parts) % threads != 0 && jobs * parts < 4 * threads {
        parts += 1;
    }
    let problem = Problem {
        d,
        q,
        k,
        v,
        g,
        beta,
        init: state_in,
        mask,
        chunk: opts.chunk,
        group,
    };
    let out = Out::new(y, state);
    let avx2 = !opts.force_portable && features::cpu().avx2_fma();
    let problem = &problem;
    pool::run(jobs * parts, &|job| {
        let (row_split, part) = (job / parts, job % parts);
        let (b, split) = (row_split / splits, row_split % splits);
        let span = Span {
            b,
            kh0: split * d.hk / splits,
            kh1: (split + 1) * d.hk / splits,
            p0: part * panels / parts,
            p1: (part + 1) * panels / parts,
        };
        SCRATCH.with(|s| {
            let s = &mut *s.borrow_mut();
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: AVX2 and FMA were detected; the jobs' spans are disjoint, as
                // `run_job` requires.
                unsafe { avx2::job(problem, out, s, span) };
                return;
            }
            let _ = avx2;
            // SAFETY: as above.
            unsafe { run_job::<Portable, T>(problem, out, s, span) };
        })
    });
}

/// The part of a call one job runs: batch row `b`, key heads `[kh0, kh1)` (and their value
/// heads), value panels `[p0, p1)`.
#[derive(Clone, Copy)]
struct Span {
    b: usize,
    kh0: usize,
    kh1: usize,
    p0: usize,
    p1: usize,
}

/// One call's inputs, shared read-only by the jobs.
struct Problem<'a, T> {
    d: Dims,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
    g: &'a [f32],
    beta: &'a [f32],
    init: StateIn<'a>,
    mask: Option<&'a [u8]>,
    chunk: usize,
    /// Value heads per key head.
    group: usize,
}

/// Per-thread scratch, grown per call and reused across chunks and jobs.
#[derive(Default)]
struct Scratch {
    /// State panels: the job's value head i, panel j is `[Dk, 16]` at `(i · np + j) · Dk · 16`.
    h: Vec<f32>,
    /// `[K; Q]` of the chunk, `[2·lp, Dk]` (Q from row lp).
    kq: Vec<f32>,
    /// `Kᵀ`, `[Dk, lp]`, row stride `kts`.
    kt: Vec<f32>,
    /// `[K; Q] Kᵀ`, `[2·lp, lp]` (lower block triangle).
    gram: Vec<f32>,
    /// `-A`, P, `Tm`, `Tm diag(β)`: `[lp, lp]` each.
    an: Vec<f32>,
    pm: Vec<f32>,
    tm: Vec<f32>,
    tmb: Vec<f32>,
    /// Two halves (alternate units), each per value head of the key head `[2·lp, vys]`: rows
    /// `0..lp` V, then `V − γ K H`; rows `lp..` `γ Q H`, then Y (written out during the next
    /// unit).
    vy: Vec<f32>,
    /// `Kᵀ diag(Γ(L-1, ·))` of one value head, like `kt`.
    ktd: Vec<f32>,
    /// U of one panel, `[lp, 16]`.
    u: Vec<f32>,
    /// Row scales `[-γ; γ]`.
    rs: Vec<f32>,
    /// Running row of `Γ(t, ·)`.
    decay: Vec<f32>,
    gamma: Vec<f32>,
    /// Gates of the key head's value heads, `[group, C]`.
    g: Vec<f32>,
    beta: Vec<f32>,
    /// Token index of each chunk row, two halves (alternate chunks).
    tok: Vec<usize>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// What a product does with C: `C = (load ? c_scale · C : 0) + rs[r] · (A B)_r` (`rs` null:
/// 1; indexed by the product's row).
#[derive(Clone, Copy)]
struct Epi {
    load: bool,
    c_scale: f32,
    rs: *const f32,
}

impl Epi {
    const SET: Epi = Epi {
        load: false,
        c_scale: 0.0,
        rs: std::ptr::null(),
    };
    const ADD: Epi = Epi {
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
struct Product {
    m: usize,
    kc: usize,
    tri: bool,
    a: *const f32,
    a_rs: usize,
    b: *const f32,
    b_rs: usize,
    c: *mut f32,
    c_rs: usize,
    epi: Epi,
}

/// The register-blocked product kernel (`gemm` runs a `Product`), and the stores and the
/// transpose that go with it.
trait Kernel {
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
struct Portable;

/// One R×16 register tile (`block.m` = R rows).
#[inline(always)]
unsafe fn tile_portable<const R: usize>(block: Product) {
    let Product {
        kc,
        a,
        a_rs,
        b,
        b_rs,
        c,
        c_rs,
        epi,
        ..
    } = block;
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
mod avx2 {
    //! The product kernel with AVX2 + FMA intrinsics, and the job entry compiled for them.

    use super::*;
    use std::arch::x86_64::*;

    pub struct Avx2;

    /// One R×16 register tile: 2·R accumulators; per step two loads of B and R broadcasts of
    /// A (one pointer per row, indexed by the step); `block.m` = R.
    #[inline(always)]
    unsafe fn tile<const R: usize>(block: Product) {
        let Product {
            kc,
            a,
            a_rs,
            b,
            b_rs,
            c,
            c_rs,
            epi,
            ..
        } = block;
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

    /// `run_job` compiled with AVX2 + FMA (its elementwise loops vectorize 8-wide).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; as `run_job`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn job<T: Elem>(p: &Problem<T>, out: Out<T>, s: &mut Scratch, span: Span) {
        run_job::<Avx2, T>(p, out, s, span)
    }
}

/// Grows (never shrinks) a scratch vector to `n` elements.
#[inline(always)]
fn fit(v: &mut Vec<f32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0.0);
    }
}

/// What one job covers, with its scratch strides: batch row `b`, key heads `kh0..kh0 + nkh`
/// (`group` value heads each), value panels `[p0, p1)`: `np` panels from column `col0`, real
/// columns `[col0, col1)`.
struct Job<T> {
    b: usize,
    kh0: usize,
    nkh: usize,
    group: usize,
    np: usize,
    col0: usize,
    col1: usize,
    /// Row stride of the `vy` scratch (`np · 16`, plus 16 when that is a multiple of 64 so
    /// that a panel's rows do not all fall in a few cache sets).
    vys: usize,
    /// Row stride of `kt` (likewise padded).
    kts: usize,
    y: *mut T,
}

impl<T> Job<T> {
    /// Offset of y (and v) of token t, value head h, column 0.
    #[inline(always)]
    fn vy_at(&self, d: Dims, t: usize, h: usize) -> usize {
        ((self.b * d.t + t) * d.hv + h) * d.dv
    }

    /// Offset of q and k of token t, key head kh.
    #[inline(always)]
    fn qk_at(&self, d: Dims, t: usize, kh: usize) -> usize {
        ((self.b * d.t + t) * d.hk + kh) * d.dk
    }

    /// Floats in one half of the `vy` scratch (chunk `c`).
    #[inline(always)]
    fn vy_half(&self, c: usize) -> usize {
        self.group * 2 * c * self.vys
    }

    /// Offset in the state scratch of value head `gi` of the job's key head `khl`.
    #[inline(always)]
    fn h_at(&self, dk: usize, khl: usize, gi: usize) -> usize {
        (khl * self.group + gi) * self.np * dk * NR
    }
}

/// A unit (one chunk, one key head) whose outputs still sit in its half of the `vy` scratch;
/// its tokens are in half `tok_half` of `tok`.
#[derive(Clone, Copy)]
struct Pending {
    kh: usize,
    vy_half: usize,
    tok_half: usize,
    len: usize,
    lp: usize,
}

/// Writes the outputs of token row `i` of a pending unit (the key head's value heads), from
/// the `vy` and `tok` scratch at `vy`, `tok`.
#[inline(always)]
unsafe fn write_y<K: Kernel, T: Elem>(
    p: &Problem<T>,
    job: &Job<T>,
    vy: *const f32,
    tok: *const usize,
    done: Pending,
    i: usize,
) {
    let d = p.d;
    let c = p.chunk;
    let vy_len = 2 * done.lp * job.vys;
    let base = vy.add(done.vy_half * job.vy_half(c) + (done.lp + i) * job.vys);
    let t = *tok.add(done.tok_half * c + i);
    let width = job.col1 - job.col0;
    for gi in 0..job.group {
        let y = job
            .y
            .add(job.vy_at(d, t, done.kh * job.group + gi) + job.col0);
        K::store_row(y, std::slice::from_raw_parts(base.add(gi * vy_len), width));
    }
}

/// The rows the next unit reads: key head `kh` for tokens `tok[..count]`, or (`tok` null) for
/// tokens `first..first + count`.
#[derive(Clone, Copy)]
struct NextRows {
    kh: usize,
    tok: *const usize,
    first: usize,
    count: usize,
}

/// Memory work done between a unit's products: the previous unit's outputs (one piece per
/// token) are written and the next unit's rows (three pieces per token: k, q, the value heads'
/// v) prefetched, evenly over the unit's `steps` products.
struct Overlap<'a, K, T> {
    p: &'a Problem<'a, T>,
    job: &'a Job<T>,
    pending: Option<Pending>,
    vy: *const f32,
    tok: *const usize,
    next: NextRows,
    steps: usize,
    prefetches: usize,
    writes: usize,
    step: usize,
    prefetched: usize,
    written: usize,
    _kernel: std::marker::PhantomData<K>,
}

impl<K: Kernel, T: Elem> Overlap<'_, K, T> {
    #[inline(always)]
    unsafe fn step(&mut self) {
        self.step += 1;
        if let Some(done) = self.pending {
            while self.written < self.writes * self.step / self.steps {
                write_y::<K, T>(self.p, self.job, self.vy, self.tok, done, self.written);
                self.written += 1;
            }
        }
        let (p, job, next) = (self.p, self.job, self.next);
        let d = p.d;
        let size = std::mem::size_of::<T>();
        while self.prefetched < self.prefetches * self.step / self.steps {
            let i = self.prefetched / 3;
            let t = if next.tok.is_null() {
                next.first + i
            } else {
                *next.tok.add(i)
            };
            let qk = job.qk_at(d, t, next.kh);
            match self.prefetched % 3 {
                0 => prefetch(p.k.as_ptr().wrapping_add(qk), d.dk * size),
                1 => prefetch(p.q.as_ptr().wrapping_add(qk), d.dk * size),
                _ => {
                    let at = job.vy_at(d, t, next.kh * job.group) + job.col0;
                    let width = job.col1 - job.col0;
                    let bytes = ((job.group - 1) * d.dv + width) * size;
                    prefetch(p.v.as_ptr().wrapping_add(at), bytes);
                }
            }
            self.prefetched += 1;
        }
    }
}

/// A row stride for `n` floats that is not a multiple of 64 floats (256 bytes).
#[inline(always)]
fn padded(n: usize) -> usize {
    if n % 64 == 0 {
        n + NR
    } else {
        n
    }
}

/// Asks for the cache lines of `bytes` from `p` (no-op off x86-64; never faults).
#[inline(always)]
fn prefetch<E>(p: *const E, bytes: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = p as *const i8;
        let mut off = 0;
        while off < bytes {
            // SAFETY: a prefetch is a hint; it never faults, whatever the address.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off)) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, bytes);
}

/// Prefetches what the gather reads for token t: k, q (key head kh), v (its value heads).
#[inline(always)]
fn prefetch_inputs<T: Elem>(p: &Problem<T>, job: &Job<T>, t: usize, kh: usize) {
    let d = p.d;
    let size = std::mem::size_of::<T>();
    let qk = job.qk_at(d, t, kh);
    prefetch(p.k.as_ptr().wrapping_add(qk), d.dk * size);
    prefetch(p.q.as_ptr().wrapping_add(qk), d.dk * size);
    prefetch(
        p.v.as_ptr().wrapping_add(job.vy_at(d, t, kh * job.group)),
        job.group * d.dv * size,
    );
}

/// Runs one job's span over all tokens.
///
/// # Safety
/// `out` points at y `[B, T, Hv, Dv]` and state `[B, Hv, Dv, Dk]` buffers of `p.d`, of which
/// this job alone writes the span's columns of y and of the state rows of the span's value
/// heads (and, for `InPlace`, reads those state rows).
#[inline(always)]
unsafe fn run_job<K: Kernel, T: Elem>(p: &Problem<T>, out: Out<T>, s: &mut Scratch, span: Span) {
    let d = p.d;
    let (dk, dv, c, group) = (d.dk, d.dv, p.chunk, p.group);
    let b = span.b;
    let np = span.p1 - span.p0;
    let job = Job {
        b,
        kh0: span.kh0,
        nkh: span.kh1 - span.kh0,
        group,
        np,
        col0: span.p0 * NR,
        col1: (span.p1 * NR).min(dv),
        vys: padded(np * NR),
        kts: padded(c),
        y: out.y.0,
    };
    let (col0, col1) = (job.col0, job.col1);
    let heads = job.nkh * group;
    let h_len = np * dk * NR;

    fit(&mut s.h, heads * h_len);
    fit(&mut s.kq, 2 * c * dk);
    fit(&mut s.kt, dk * job.kts);
    fit(&mut s.ktd, dk * job.kts);
    fit(&mut s.gram, 2 * c * c);
    fit(&mut s.an, c * c);
    fit(&mut s.pm, c * c);
    fit(&mut s.tm, c * c);
    fit(&mut s.tmb, c * c);
    fit(&mut s.vy, 2 * job.vy_half(c));
    fit(&mut s.u, c * NR);
    fit(&mut s.rs, 2 * c);
    fit(&mut s.decay, c);
    fit(&mut s.gamma, c);
    fit(&mut s.g, group * c);
    fit(&mut s.beta, group * c);
    if s.tok.len() < 2 * c {
        s.tok.resize(2 * c, 0);
    }

    // The initial states, transposed into panels (columns past Dv are zero and stay zero).
    let h0 = job.kh0 * group;
    let state_at = |i: usize| (b * d.hv + h0 + i) * dv * dk;
    for i in 0..heads {
        let src: Option<*const f32> = match p.init {
            StateIn::Zeros => None,
            StateIn::Buffer(x) => Some(x.as_ptr().add(state_at(i))),
            StateIn::InPlace => Some(out.state.0.add(state_at(i)) as *const f32),
        };
        let hbuf = &mut s.h[i * h_len..(i + 1) * h_len];
        hbuf.fill(0.0);
        if let Some(src) = src {
            for col in col0..col1 {
                let (pj, j) = ((col - col0) / NR, col % NR);
                let row = std::slice::from_raw_parts(src.add(col * dk), dk);
                let panel = &mut hbuf[pj * dk * NR..(pj + 1) * dk * NR];
                for (i, &x) in row.iter().enumerate() {
                    panel[i * NR + j] = x;
                }
            }
        }
    }

    let mut next = 0;
    let (mut tok_half, mut vy_half) = (0, 0);
    let mut pending: Option<Pending> = None;
    loop {
        // Gather up to C active tokens; masked tokens on the way get y = 0.
        let mut len = 0;
        while next < d.t && len < c {
            if p.mask.map_or(true, |m| m[b * d.t + next] != 0) {
                s.tok[tok_half * c + len] = next;
                len += 1;
            } else {
                for i in 0..heads {
                    let y = out.y.0.add(job.vy_at(d, next, h0 + i));
                    for col in col0..col1 {
                        *y.add(col) = T::from_f32(0.0);
                    }
                }
            }
            next += 1;
        }
        if len == 0 {
            break;
        }
        for khl in 0..job.nkh {
            // What the unit after this one reads: the next key head of this chunk, or the
            // first key head of the next chunk (its tokens guessed as the next C, unmasked).
            let next_rows = if khl + 1 < job.nkh {
                NextRows {
                    kh: job.kh0 + khl + 1,
                    tok: s.tok.as_ptr().add(tok_half * c),
                    first: 0,
                    count: len,
                }
            } else {
                NextRows {
                    kh: job.kh0,
                    tok: std::ptr::null(),
                    first: next,
                    count: (next + c).min(d.t) - next,
                }
            };
            let unit = Pending {
                kh: job.kh0 + khl,
                vy_half,
                tok_half,
                len,
                lp: len.div_ceil(NR) * NR,
            };
            unit_run::<K, T>(p, s, &job, unit, khl, next_rows, pending);
            pending = Some(unit);
            vy_half ^= 1;
        }
        tok_half ^= 1;
    }
    if let Some(done) = pending {
        for i in 0..done.len {
            write_y::<K, T>(p, &job, s.vy.as_ptr(), s.tok.as_ptr(), done, i);
        }
    }
    K::store_fence();

    // The final states back in [Dv, Dk] rows.
    for i in 0..heads {
        let hbuf = &s.h[i * h_len..(i + 1) * h_len];
        let dst = out.state.0.add(state_at(i));
        for col in col0..col1 {
            let (pj, j) = ((col - col0) / NR, col % NR);
            let row = std::slice::from_raw_parts_mut(dst.add(col * dk), dk);
            let panel = &hbuf[pj * dk * NR..(pj + 1) * dk * NR];
            for (i, x) in row.iter_mut().enumerate() {
                *x = panel[i * NR + j];
            }
        }
    }
}

/// One unit: the chunk of `unit.len` active tokens (`s.tok[unit.tok_half · C..]`) for key
/// head `unit.kh` (the job's `khl`-th) and its value heads, computed in half `unit.vy_half` of
/// the `vy` scratch. While the products run, the outputs of the previous unit (`pending`) are
/// written and the rows of the next (`next_rows`) prefetched, a little after each product.
#[inline(always)]
unsafe fn unit_run<K: Kernel, T: Elem>(
    p: &Problem<T>,
    s: &mut Scratch,
    job: &Job<T>,
    unit: Pending,
    khl: usize,
    next_rows: NextRows,
    pending: Option<Pending>,
) {
    let d = p.d;
    let (dk, group, c) = (d.dk, p.group, p.chunk);
    let (b, np, vys, kts) = (job.b, job.np, job.vys, job.kts);
    let (col0, col1) = (job.col0, job.col1);
    let width = col1 - col0;
    let (kh, len, lp) = (unit.kh, unit.len, unit.lp);
    // Rows len..lp are neutral tokens (k = q = v = 0, g = 1, β = 0).
    let vy_len = 2 * lp * vys;
    let vy0 = unit.vy_half * job.vy_half(c);
    let tok0 = unit.tok_half * c;

    // Gather keys, queries, values (as f32) and gates, prefetching a few tokens ahead (the
    // rows were usually prefetched during the previous unit already).
    {
        let (kpart, qpart) = s.kq[..2 * lp * dk].split_at_mut(lp * dk);
        for i in 0..lp {
            let (kr, qr) = (
                &mut kpart[i * dk..(i + 1) * dk],
                &mut qpart[i * dk..(i + 1) * dk],
            );
            if i < len {
                if i + AHEAD < len {
                    prefetch_inputs(p, job, s.tok[tok0 + i + AHEAD], kh);
                }
                let t = s.tok[tok0 + i];
                let at = job.qk_at(d, t, kh);
                for (x, e) in kr.iter_mut().zip(&p.k[at..at + dk]) {
                    *x = e.to_f32();
                }
                for (x, e) in qr.iter_mut().zip(&p.q[at..at + dk]) {
                    *x = e.to_f32();
                }
                for gi in 0..group {
                    let gate = (b * d.t + t) * d.hv + kh * group + gi;
                    s.g[gi * c + i] = p.g[gate];
                    s.beta[gi * c + i] = p.beta[gate];
                    let at = job.vy_at(d, t, kh * group + gi) + col0;
                    let row = &mut s.vy[vy0 + gi * vy_len + i * vys..][..vys];
                    for (x, e) in row[..width].iter_mut().zip(&p.v[at..at + width]) {
                        *x = e.to_f32();
                    }
                    row[width..].fill(0.0);
                }
            } else {
                kr.fill(0.0);
                qr.fill(0.0);
                for gi in 0..group {
                    s.g[gi * c + i] = 1.0;
                    s.beta[gi * c + i] = 0.0;
                    s.vy[vy0 + gi * vy_len + i * vys..][..vys].fill(0.0);
                }
            }
        }
        for gi in 0..group {
            s.vy[vy0 + gi * vy_len + lp * vys..vy0 + (gi + 1) * vy_len].fill(0.0);
        }
    }
    // Kᵀ (Dk is a multiple of 8 in the transposed part; other columns one by one).
    {
        let (kq, kt) = (s.kq.as_ptr(), s.kt.as_mut_ptr());
        let dk8 = dk / 8 * 8;
        K::transpose(kq, dk, kt, kts, lp, dk8);
        for col in dk8..dk {
            for i in 0..lp {
                *kt.add(col * kts + i) = *kq.add(i * dk + col);
            }
        }
    }

    // Gram products [K; Q] Kᵀ, lower block triangle only: column panel j needs rows ≥ 16 j.
    {
        let kq = s.kq.as_ptr();
        let kt = s.kt.as_ptr();
        let gram = s.gram.as_mut_ptr();
        for part in 0..2 {
            for j in 0..lp / NR {
                let r0 = j * NR;
                K::gemm(Product {
                    m: lp - r0,
                    kc: dk,
                    tri: false,
                    a: kq.add((part * lp + r0) * dk),
                    a_rs: dk,
                    b: kt.add(j * NR),
                    b_rs: kts,
                    c: gram.add((part * lp + r0) * lp + j * NR),
                    c_rs: lp,
                    epi: Epi::SET,
                });
            }
        }
    }

    // Spread over the unit's products (four per panel per value head): writing the previous
    // unit's outputs and prefetching the next unit's rows.
    let mut overlap = Overlap {
        p,
        job,
        pending,
        // The previous unit's half of `vy` and its `tok` half, which this unit does not
        // write (the vectors are not resized while it runs).
        vy: s.vy.as_ptr(),
        tok: s.tok.as_ptr(),
        next: next_rows,
        steps: 4 * group * np,
        prefetches: 3 * next_rows.count,
        writes: pending.map_or(0, |done| done.len),
        step: 0,
        prefetched: 0,
        written: 0,
        _kernel: std::marker::PhantomData,
    };
    for gi in 0..group {
        value_head::<K, T>(
            s,
            np,
            dk,
            lp,
            gi * c,
            job.h_at(dk, khl, gi),
            vy0 + gi * vy_len,
            vys,
            kts,
            &mut overlap,
        );
    }
}

/// The rest of a chunk for one value head: its decays, A and P, the UT transform, and its
/// panels. Its gates are at `s.g[gate0..]`, `s.beta[gate0..]`, its state panels at
/// `s.h[h0..]`, its V / Y rows at `s.vy[vy0..]`; `overlap` steps after each panel product.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn value_head<K: Kernel, T: Elem>(
    s: &mut Scratch,
    np: usize,
    dk: usize,
    lp: usize,
    gate0: usize,
    h0: usize,
    vy0: usize,
    vys: usize,
    kts: usize,
    overlap: &mut Overlap<K, T>,
) {
    let g = &s.g[gate0..gate0 + lp];
    let beta = &s.beta[gate0..gate0 + lp];

    // Decays; -A and P from the Gram products; row scales [-γ; γ].
    {
        let (gk, gq) = s.gram[..2 * lp * lp].split_at(lp * lp);
        let decay = &mut s.decay[..lp];
        let an = &mut s.an[..lp * lp];
        let pm = &mut s.pm[..lp * lp];
        let mut gamma = 1.0f32;
        for t in 0..lp {
            let gt = g[t];
            gamma *= gt;
            s.gamma[t] = gamma;
            s.rs[t] = -gamma;
            s.rs[lp + t] = gamma;
            for x in &mut decay[..t] {
                *x *= gt;
            }
            decay[t] = 1.0;
            let nb = -beta[t];
            let row = t * lp..(t + 1) * lp;
            let (arow, prow) = (&mut an[row.clone()], &mut pm[row.clone()]);
            let (krow, qrow) = (&gk[row.clone()], &gq[row]);
            for ((x, &e), &k) in arow[..t].iter_mut().zip(&decay[..t]).zip(&krow[..t]) {
                *x = nb * e * k;
            }
            arow[t..].fill(0.0);
            for ((x, &e), &q) in prow[..=t].iter_mut().zip(&decay[..=t]).zip(&qrow[..=t]) {
                *x = e * q;
            }
            prow[t + 1..].fill(0.0);
        }
    }
    let gamma_last = s.gamma[lp - 1];

    // Kᵀ diag(Γ(L-1, ·)) for the state update.
    {
        let decay = &s.decay[..lp];
        for col in 0..dk {
            let row = col * kts..col * kts + lp;
            for ((o, &x), &e) in s.ktd[row.clone()].iter_mut().zip(&s.kt[row]).zip(decay) {
                *o = x * e;
            }
        }
    }

    // Tm = (I + A)⁻¹ = (I - An)⁻¹: row t is e_t + Σ_{s<t} An[t, s] Tm[s, ·]. In blocks of 16
    // rows: the rows before the block contribute a product (column panel j only from rows
    // ≥ 16 j, Tm being lower triangular), the block's own rows one by one.
    {
        let an = s.an.as_ptr();
        let tm = s.tm.as_mut_ptr();
        for t0 in (0..lp).step_by(TB) {
            for j in 0..t0 / NR {
                let c0 = j * NR;
                K::gemm(Product {
                    m: TB,
                    kc: t0 - c0,
                    tri: false,
                    a: an.add(t0 * lp + c0),
                    a_rs: lp,
                    b: tm.add(c0 * lp + c0),
                    b_rs: lp,
                    c: tm.add(t0 * lp + c0),
                    c_rs: lp,
                    epi: Epi::SET,
                });
            }
            for t in t0..t0 + TB {
                let row = std::slice::from_raw_parts_mut(tm.add(t * lp), lp);
                row[t0..].fill(0.0);
                for si in t0..t {
                    let x = *an.add(t * lp + si);
                    // Row si has nonzeros in 0..=si; whole 8-wide groups (zeros past si).
                    let n = ((si + 8) & !7).min(lp);
                    let src = std::slice::from_raw_parts(tm.add(si * lp), n);
                    for (r, &e) in row[..n].iter_mut().zip(src) {
                        *r += x * e;
                    }
                }
                row[t] = 1.0;
            }
        }
        let tm = &s.tm[..lp * lp];
        let tmb = &mut s.tmb[..lp * lp];
        for t in 0..lp {
            let row = t * lp..(t + 1) * lp;
            for ((o, &x), &b) in tmb[row.clone()].iter_mut().zip(&tm[row]).zip(beta) {
                *o = x * b;
            }
        }
    }

    // The panels.
    for pj in 0..np {
        let hp = s.h.as_mut_ptr().add(h0 + pj * dk * NR);
        let vyp = s.vy.as_mut_ptr().add(vy0 + pj * NR);
        let up = s.u.as_mut_ptr();
        // [V - γ K H; γ Q H].
        K::gemm(Product {
            m: 2 * lp,
            kc: dk,
            tri: false,
            a: s.kq.as_ptr(),
            a_rs: dk,
            b: hp,
            b_rs: NR,
            c: vyp,
            c_rs: vys,
            epi: Epi {
                load: true,
                c_scale: 1.0,
                rs: s.rs.as_ptr(),
            },
        });
        overlap.step();
        // U = Tm diag(β) (V - γ K H).
        K::gemm(Product {
            m: lp,
            kc: lp,
            tri: true,
            a: s.tmb.as_ptr(),
            a_rs: lp,
            b: vyp,
            b_rs: vys,
            c: up,
            c_rs: NR,
            epi: Epi::SET,
        });
        overlap.step();
        // Y = γ Q H + P U.
        K::gemm(Product {
            m: lp,
            kc: lp,
            tri: true,
            a: s.pm.as_ptr(),
            a_rs: lp,
            b: up,
            b_rs: NR,
            c: vyp.add(lp * vys),
            c_rs: vys,
            epi: Epi::ADD,
        });
        overlap.step();
        // H = γ_{L-1} H + Kᵀ diag(Γ(L-1, ·)) U.
        K::gemm(Product {
            m: dk,
            kc: lp,
            tri: false,
            a: s.ktd.as_ptr(),
            a_rs: kts,
            b: up,
            b_rs: NR,
            c: hp,
            c_rs: NR,
            epi: Epi {
                load: true,
                c_scale: gamma_last,
                rs: std::ptr::null(),
            },
        });
        overlap.step();
    }
}
