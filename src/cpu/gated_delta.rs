//! The gated-delta recurrence and its prefix replay on the CPU, in the Metal kernel's order:
//! per value row, lane `l` of 32 owns state elements `[l·n, (l+1)·n)` (n = Dk/32) and sums its
//! products sequentially in f32; the lane partials meet in the xor butterfly
//! (`reduce::simd_sum`). No FMA contraction anywhere.
//!
//! The gates are fused in: beta = sigmoid(b) and g = exp(-exp(A_log) · softplus(a + dt_bias))
//! are computed here with MLX's CPU formulas and rounding points (`cpu::math`), so one kernel
//! node replaces seven MLX ops and stays bit-identical to `mlxk_compute_g`.
//!
//! Work is split by (batch row, value head) over the worker pool. Within a head, tokens are
//! processed in tiles; each value row keeps its state in registers/L1 across a tile. With AVX2
//! and Dk = 128 a vectorized row kernel runs (8 lanes' partials per register, the butterfly as
//! fixed shuffles); elsewhere the portable row kernel. A decode step (one real token from a
//! given state) takes a single-token AVX2 kernel that leaves the state in its natural layout
//! and moves only the products into lane layout. All compute identical bits.

use std::cell::RefCell;

use half::{bf16, f16};

use super::elem::Elem;
use super::features;
use super::math::{exp, sigmoid, softplus};
use super::pool::{self, SharedMut};
use super::reduce::simd_sum;
use super::{typed, typed_mut, Buffers};
use crate::dtype::Dtype;

/// Tokens per tile: a tile's keys and queries (2 · 64 · Dk f32) stay in L2.
const TILE: usize = 64;

/// Value rows the vectorized kernel interleaves.
const ROWS: usize = 4;

/// Value rows the single-token (decode) kernel interleaves.
const SINGLE_ROWS: usize = 2;

/// Dimensions of one call, as usize.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    pub b: usize,
    pub t: usize,
    pub hk: usize,
    pub hv: usize,
    pub dk: usize,
    pub dv: usize,
}

/// The update's outputs, y `[B, T, Hv, Dv]` and the state `[B, Hv, Dv, Dk]`, shared by the
/// jobs of one call; each job writes a disjoint part.
#[derive(Clone, Copy)]
pub(crate) struct Out<T> {
    pub(crate) y: SharedMut<T>,
    pub(crate) state: SharedMut<f32>,
}

impl<T> Out<T> {
    pub(crate) fn new(y: &mut [T], state: &mut [f32]) -> Self {
        Out {
            y: SharedMut(y.as_mut_ptr()),
            state: SharedMut(state.as_mut_ptr()),
        }
    }
}

/// Where the initial state comes from.
#[derive(Clone, Copy)]
pub enum StateIn<'a> {
    /// No state given: start from zeros.
    Zeros,
    /// A separate input buffer `[B, Hv, Dv, Dk]`.
    Buffer(&'a [f32]),
    /// The output buffer already holds the initial state (MLX donated it).
    InPlace,
}

/// The gate inputs in their own dtypes.
#[derive(Clone, Copy)]
pub struct GateInputs<'a> {
    pub a: &'a [u8],
    pub a_dtype: Dtype,
    pub b: &'a [u8],
    pub b_dtype: Dtype,
    pub a_log: &'a [u8],
    pub a_log_dtype: Dtype,
    pub dt_bias: &'a [u8],
    pub dt_bias_dtype: Dtype,
}

/// MLX's type promotion among the float dtypes.
#[inline(always)]
fn promote(x: Dtype, y: Dtype) -> Dtype {
    if x == y {
        x
    } else {
        Dtype::Float32
    }
}

#[inline(always)]
fn value(bytes: &[u8], dtype: Dtype, i: usize) -> f32 {
    match dtype {
        Dtype::Float32 => typed::<f32>(bytes)[i],
        Dtype::Bfloat16 => typed::<bf16>(bytes)[i].to_f32(),
        Dtype::Float16 => Elem::to_f32(typed::<f16>(bytes)[i]),
        other => panic!("gate input of dtype {}", other.name()),
    }
}

#[inline(always)]
fn round(dtype: Dtype, x: f32) -> f32 {
    match dtype {
        Dtype::Float32 => x,
        Dtype::Bfloat16 => bf16::from_f32(x).to_f32(),
        Dtype::Float16 => Elem::to_f32(<f16 as Elem>::from_f32(x)),
        other => panic!("rounding to {}", other.name()),
    }
}

/// `g = exp(-exp(f32(A_log)) · softplus(a + dt_bias))` for element `i` of `a [.., Hv]`, with
/// MLX's promotion: `a + dt_bias` and softplus in the promoted dtype of a and dt_bias, the
/// product and the outer exp in f32.
#[inline(always)]
fn gate_g(x: &GateInputs, i: usize, hv: usize, decay: &[f32]) -> f32 {
    let sum_dtype = promote(x.a_dtype, x.dt_bias_dtype);
    let sum = round(
        sum_dtype,
        value(x.a, x.a_dtype, i) + value(x.dt_bias, x.dt_bias_dtype, i % hv),
    );
    let sp = match sum_dtype {
        Dtype::Bfloat16 => softplus::<bf16>(sum),
        Dtype::Float16 => softplus::<f16>(sum),
        _ => softplus::<f32>(sum),
    };
    exp(decay[i % hv] * sp)
}

#[inline(always)]
fn gate_beta(x: &GateInputs, i: usize) -> f32 {
    let b = value(x.b, x.b_dtype, i);
    match x.b_dtype {
        Dtype::Bfloat16 => sigmoid::<bf16>(b),
        Dtype::Float16 => sigmoid::<f16>(b),
        _ => sigmoid::<f32>(b),
    }
}

/// Gate positions per pool job.
const GATE_BLOCK: usize = 4096;

/// g and beta for every `[B, T, Hv]` position, as f32. Long inputs are split over the worker
/// pool (the transcendental formulas cost ~100 ns a position); with FMA available the same
/// formulas run with hardware fused multiply-adds (an FMA rounds once either way, so the
/// results are the same bits). Not to be called from inside a pool job.
pub fn gates(x: &GateInputs, count: usize, hv: usize) -> (Vec<f32>, Vec<f32>) {
    let decay: Vec<f32> = (0..hv)
        .map(|h| -exp(value(x.a_log, x.a_log_dtype, h)))
        .collect();
    let mut g = vec![0f32; count];
    let mut beta = vec![0f32; count];
    let out = GateOut {
        g: SharedMut(g.as_mut_ptr()),
        beta: SharedMut(beta.as_mut_ptr()),
    };
    // The CPU's FMA, whether or not the portable kernels are forced (the bits are the same).
    let fma = features::cpu().fma;
    let block = |job: usize| {
        let range = job * GATE_BLOCK..((job + 1) * GATE_BLOCK).min(count);
        // SAFETY: each job writes its own range of the two `count`-long buffers, which outlive
        // the pool run; `fma` is only true when the CPU has FMA.
        unsafe { gate_block(x, range, hv, &decay, out, fma) }
    };
    let blocks = count.div_ceil(GATE_BLOCK);
    if blocks <= 1 {
        (0..blocks).for_each(block);
    } else {
        pool::run(blocks, &block);
    }
    (g, beta)
}

/// g and beta, shared by the gate jobs; each job writes its own range of both.
#[derive(Clone, Copy)]
struct GateOut {
    g: SharedMut<f32>,
    beta: SharedMut<f32>,
}

/// # Safety
/// `out` holds two buffers with room for `range`, written by no one else meanwhile; `fma`
/// only where the CPU supports FMA.
unsafe fn gate_block(
    x: &GateInputs,
    range: std::ops::Range<usize>,
    hv: usize,
    decay: &[f32],
    out: GateOut,
    fma: bool,
) {
    #[cfg(target_arch = "x86_64")]
    if fma {
        // SAFETY: FMA detected by the caller.
        return unsafe { gate_block_fma(x, range, hv, decay, out) };
    }
    let _ = fma;
    // SAFETY: the caller's contract.
    unsafe { gate_block_any(x, range, hv, decay, out) }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
unsafe fn gate_block_fma(
    x: &GateInputs,
    range: std::ops::Range<usize>,
    hv: usize,
    decay: &[f32],
    out: GateOut,
) {
    // SAFETY: the caller's contract.
    unsafe { gate_block_any(x, range, hv, decay, out) }
}

#[inline(always)]
unsafe fn gate_block_any(
    x: &GateInputs,
    range: std::ops::Range<usize>,
    hv: usize,
    decay: &[f32],
    out: GateOut,
) {
    for i in range {
        // SAFETY: i is inside this job's range of both buffers.
        unsafe {
            *out.g.0.add(i) = gate_g(x, i, hv, decay);
            *out.beta.0.add(i) = gate_beta(x, i);
        }
    }
}

/// One call's inputs, shared read-only by the jobs.
struct Problem<'a, T> {
    d: Dims,
    q: Option<&'a [T]>,
    k: &'a [T],
    v: &'a [T],
    g: &'a [f32],
    beta: &'a [f32],
    state_in: StateIn<'a>,
    /// `[B, T]`: 0 = padding (the update's mask).
    mask: Option<&'a [u8]>,
    /// Tokens each batch row runs (the replay's accepted lengths; else T).
    lengths: Option<&'a [i32]>,
}

/// Per-thread scratch: a tile's keys, queries (f32), gates and token flags.
#[derive(Default)]
struct Scratch {
    k: Vec<f32>,
    q: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    active: Vec<bool>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// One tile of tokens for one head, ready for the row kernels.
struct Tile<'a> {
    len: usize,
    k: &'a [f32],
    q: Option<&'a [f32]>,
    g: &'a [f32],
    beta: &'a [f32],
    active: &'a [bool],
}

/// Runs head (batch row `b`, value head `hv`): every value row over the row's tokens.
fn head<T: Elem>(p: &Problem<T>, out: Out<T>, b: usize, hv: usize, vectorized: bool) {
    let d = p.d;
    let hk = hv / (d.hv / d.hk);
    let tokens = p.lengths.map_or(d.t, |l| l[b] as usize);
    assert!(
        tokens <= d.t,
        "accepted length {tokens} exceeds T = {}",
        d.t
    );
    let head_state = ((b * d.hv + hv) * d.dv) * d.dk;
    // A decode step (one real token from a given state) takes the single-token kernel, which
    // works on the state in its natural layout: no transposed copy of the state to keep.
    let single = vectorized
        && tokens == 1
        && !matches!(p.state_in, StateIn::Zeros)
        && p.mask.is_none_or(|m| m[b * d.t] != 0);
    SCRATCH.with(|scratch| {
        let s = &mut *scratch.borrow_mut();
        let mut t0 = 0;
        loop {
            let len = (tokens - t0).min(TILE);
            s.k.resize(len * d.dk, 0.0);
            s.q.resize(len * d.dk, 0.0);
            s.g.clear();
            s.beta.clear();
            s.active.clear();
            for t in t0..t0 + len {
                let qk = ((b * d.t + t) * d.hk + hk) * d.dk;
                let dst = (t - t0) * d.dk;
                let lanes = vectorized && !single;
                widen(&p.k[qk..qk + d.dk], &mut s.k[dst..dst + d.dk], lanes);
                if let Some(q) = p.q {
                    widen(&q[qk..qk + d.dk], &mut s.q[dst..dst + d.dk], lanes);
                }
                let gate = (b * d.t + t) * d.hv + hv;
                s.g.push(p.g[gate]);
                s.beta.push(p.beta[gate]);
                s.active.push(p.mask.is_none_or(|m| m[b * d.t + t] != 0));
            }
            let tile = Tile {
                len,
                k: &s.k,
                q: p.q.map(|_| &s.q[..]),
                g: &s.g,
                beta: &s.beta,
                active: &s.active,
            };
            let row_io = |dv: usize| -> RowIo<T> {
                let row = head_state + dv * d.dk;
                // SAFETY: this job owns rows [head_state, head_state + Dv·Dk) of the state
                // output and y[b, :, hv, :]; the pool joins before the buffers are released.
                let dst = unsafe { out.state.0.add(row) };
                let src = match (t0, p.state_in) {
                    (0, StateIn::Zeros) => std::ptr::null(),
                    (0, StateIn::Buffer(s)) => s[row..row + d.dk].as_ptr(),
                    _ => dst as *const f32,
                };
                let v_at = ((b * d.t + t0) * d.hv + hv) * d.dv + dv;
                let y = match p.q {
                    // SAFETY: y has v's layout; see above.
                    Some(_) => unsafe { out.y.0.add(v_at) },
                    None => std::ptr::null_mut(),
                };
                RowIo {
                    src,
                    dst,
                    v: p.v.get(v_at..).unwrap_or(&[]),
                    y,
                    stride: d.hv * d.dv,
                }
            };
            let mut dv = 0;
            #[cfg(target_arch = "x86_64")]
            if single {
                let (k, q) = (s.k.as_ptr(), s.q.as_ptr());
                let (g, beta) = (s.g[0], s.beta[0]);
                // SAFETY: `single` implies AVX2 and Dk = 128; k and q hold one token's 128
                // values each; the rows are this job's (see `row_io`).
                unsafe {
                    let blocks = d.dv / SINGLE_ROWS;
                    match p.q {
                        Some(_) => avx2::single_token::<T, SINGLE_ROWS, true>(
                            k, q, g, beta, blocks, &row_io,
                        ),
                        None => avx2::single_token::<T, SINGLE_ROWS, false>(
                            k, q, g, beta, blocks, &row_io,
                        ),
                    }
                    // The rows left over, one at a time.
                    let first = blocks * SINGLE_ROWS;
                    let rest = |i: usize| row_io(first + i);
                    match p.q {
                        Some(_) => {
                            avx2::single_token::<T, 1, true>(k, q, g, beta, d.dv - first, &rest)
                        }
                        None => {
                            avx2::single_token::<T, 1, false>(k, q, g, beta, d.dv - first, &rest)
                        }
                    }
                    dv = d.dv;
                }
            }
            while dv < d.dv {
                if vectorized {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `vectorized` is only true when AVX2 was detected and Dk = 128.
                    unsafe {
                        if dv + ROWS <= d.dv {
                            avx2::rows::<T, ROWS>(&tile, std::array::from_fn(|r| row_io(dv + r)));
                            dv += ROWS;
                        } else {
                            avx2::rows::<T, 1>(&tile, [row_io(dv)]);
                            dv += 1;
                        }
                    }
                } else {
                    // SAFETY: `src`/`dst` address Dk values each (see above).
                    unsafe { row_portable(&tile, row_io(dv), d.dk) };
                    dv += 1;
                }
            }
            t0 += len;
            if t0 >= tokens {
                break;
            }
        }
    });
}

/// Converts one token's keys or queries to f32, in the layout the row kernel wants.
fn widen<T: Elem>(src: &[T], dst: &mut [f32], vectorized: bool) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
    if vectorized {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: only called with `vectorized` when AVX2 was detected.
        unsafe {
            avx2::to_lane_layout(dst)
        };
    }
}

/// What one value row reads and writes.
struct RowIo<'a, T> {
    /// The row's initial state (Dk values; null: zeros).
    src: *const f32,
    /// Where the row's final state goes (Dk values; may be the same memory as `src`, which
    /// the row kernels read completely before writing).
    dst: *mut f32,
    /// v of this row at the tile's first token; token t at `t · stride`.
    v: &'a [T],
    /// y of this row at the tile's first token (null for the replay); token t at `t · stride`.
    y: *mut T,
    stride: usize,
}

/// The portable row kernel: natural layout, the Metal kernel's loops.
///
/// # Safety
/// `io.src` (unless null) and `io.dst` address `dk` values; `io.y` (unless null) and `io.v`
/// hold the tile's tokens at `io.stride`.
unsafe fn row_portable<T: Elem>(tile: &Tile, io: RowIo<T>, dk: usize) {
    let n = dk / 32;
    let mut s = [0f32; 256];
    let s = &mut s[..dk];
    if !io.src.is_null() {
        s.copy_from_slice(unsafe { std::slice::from_raw_parts(io.src, dk) });
    }
    let mut partials = [0f32; 32];
    for t in 0..tile.len {
        let y = (!io.y.is_null()).then(|| unsafe { io.y.add(t * io.stride) });
        if !tile.active[t] {
            if let Some(y) = y {
                // SAFETY: see `head`.
                unsafe { *y = T::from_f32(0.0) };
            }
            continue;
        }
        let k = &tile.k[t * dk..(t + 1) * dk];
        let g = tile.g[t];
        for (lane, partial) in partials.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for i in lane * n..(lane + 1) * n {
                s[i] *= g;
                acc += s[i] * k[i];
            }
            *partial = acc;
        }
        let kv_mem = simd_sum(&partials);
        let delta = (io.v[t * io.stride].to_f32() - kv_mem) * tile.beta[t];
        match (tile.q, y) {
            (Some(q), Some(y)) => {
                let q = &q[t * dk..(t + 1) * dk];
                for (lane, partial) in partials.iter_mut().enumerate() {
                    let mut acc = 0.0f32;
                    for i in lane * n..(lane + 1) * n {
                        s[i] += k[i] * delta;
                        acc += s[i] * q[i];
                    }
                    *partial = acc;
                }
                // SAFETY: see `head`.
                unsafe { *y = T::from_f32(simd_sum(&partials)) };
            }
            _ => {
                for i in 0..dk {
                    s[i] += k[i] * delta;
                }
            }
        }
    }
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), io.dst, dk) };
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    //! The Dk = 128 row kernel with AVX2. Each group of 32 elements (8 lanes × 4) sits in four
    //! registers; a 4×4 transpose within each 128-bit half (`simd::avx2::transpose`) turns them
    //! into "lane layout": register i of group g holds element i of lanes (8g, 8g+2, 8g+4, 8g+6
    //! | 8g+1, ..., 8g+7). Each lane's sequential sum is then a vertical add chain, and the
    //! butterfly over the 32 partials (`simd::avx2::butterfly`) is extract/add and three
    //! horizontal adds.

    // The whole module is intrinsics on pointers whose validity the callers establish.
    #![allow(unsafe_op_in_unsafe_fn)]

    use super::super::simd::avx2::{butterfly, transpose};
    use super::{Elem, RowIo, Tile};
    use std::arch::x86_64::*;

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
    unsafe fn decay_and_read<const R: usize>(
        s: *mut __m256,
        g: f32,
        k: *const f32,
        kv: *mut __m256,
    ) {
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
                    out[r][group] =
                        update_group::<Q>(io[r].src, io[r].dst, k, q, gv, delta[r], group);
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
}

fn solve<T: Elem>(p: &Problem<T>, y: &mut [T], state: &mut [f32]) {
    let vectorized = p.d.dk == 128 && features::kernels().avx2;
    let out = Out::new(y, state);
    let jobs = p.d.b * p.d.hv;
    pool::run(jobs, &|job| {
        head(p, out, job / p.d.hv, job % p.d.hv, vectorized)
    });
}

/// Entry for the update: params `[B, T, Hk, Hv, Dk, Dv, qkv, a, b, a_log, dt_bias dtypes,
/// has_state, has_mask]`; inputs `q, k, v, a, b, a_log, dt_bias, [state], [mask]`; outputs
/// `y, state_out`.
pub(crate) fn run(params: &[i64], buffers: Buffers) {
    run_any(params, buffers, Mode::Exact)
}

/// Entry for the chunked update: the update's params plus the chunk size; same buffers.
pub(crate) fn run_chunked(params: &[i64], buffers: Buffers) {
    let chunk = params[13] as usize;
    run_any(params, buffers, Mode::Chunked(chunk))
}

/// Entry for the replay: params `[B, T, Hk, Hv, Dk, Dv, kv, a, b, a_log, dt_bias dtypes,
/// has_state]`; inputs `k, v, a, b, a_log, dt_bias, [state], lengths`; output `state_out`.
pub(crate) fn run_replay(params: &[i64], buffers: Buffers) {
    run_any(params, buffers, Mode::Replay)
}

/// Which recurrence a node runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Exact,
    /// The chunked (WY) form with this many tokens per chunk.
    Chunked(usize),
    Replay,
}

fn run_any(params: &[i64], mut buffers: Buffers, mode: Mode) {
    let update = mode != Mode::Replay;
    let p: Vec<usize> = params.iter().map(|&x| x as usize).collect();
    let d = Dims {
        b: p[0],
        t: p[1],
        hk: p[2],
        hv: p[3],
        dk: p[4],
        dv: p[5],
    };
    let dtype = super::dtype_param(params[6]);
    let has_state = params[11] != 0;
    let first = if update { 1 } else { 0 }; // index of k
    let inputs = &buffers.inputs;
    let gate_inputs = GateInputs {
        a: inputs[first + 2],
        a_dtype: super::dtype_param(params[7]),
        b: inputs[first + 3],
        b_dtype: super::dtype_param(params[8]),
        a_log: inputs[first + 4],
        a_log_dtype: super::dtype_param(params[9]),
        dt_bias: inputs[first + 5],
        dt_bias_dtype: super::dtype_param(params[10]),
    };
    let (g, beta) = gates(&gate_inputs, d.b * d.t * d.hv, d.hv);
    let state_output = if update { 1 } else { 0 };
    let state_index = first + 6;
    let state_in = match (has_state, buffers.aliased[state_output]) {
        (false, _) => StateIn::Zeros,
        (true, Some(_)) => StateIn::InPlace,
        (true, None) => StateIn::Buffer(typed(inputs[state_index])),
    };
    let after_state = state_index + has_state as usize;
    let mask = (update && params[12] != 0).then(|| inputs[after_state]);
    let lengths: Option<&[i32]> = (!update).then(|| typed(inputs[after_state]));
    let mut outputs = std::mem::take(&mut buffers.outputs).into_iter();
    let (y_bytes, state_bytes) = if update {
        (outputs.next().unwrap(), outputs.next().unwrap())
    } else {
        (&mut [][..], outputs.next().unwrap())
    };
    let state: &mut [f32] = typed_mut(state_bytes);
    macro_rules! go {
        ($t:ty) => {{
            let problem = Problem::<$t> {
                d,
                q: update.then(|| typed::<$t>(inputs[0])),
                k: typed(inputs[first]),
                v: typed(inputs[first + 1]),
                g: &g,
                beta: &beta,
                state_in,
                mask,
                lengths,
            };
            match mode {
                Mode::Chunked(chunk) => super::chunked::chunked_recurrence_with(
                    d,
                    problem.q.expect("the update has queries"),
                    problem.k,
                    problem.v,
                    &g,
                    &beta,
                    state_in,
                    mask,
                    typed_mut::<$t>(y_bytes),
                    state,
                    super::chunked::ChunkedOptions {
                        chunk,
                        force_portable: features::portable_forced(),
                    },
                ),
                _ => solve(&problem, typed_mut::<$t>(y_bytes), state),
            }
        }};
    }
    match dtype {
        Dtype::Bfloat16 => go!(bf16),
        Dtype::Float16 => go!(f16),
        Dtype::Float32 => go!(f32),
        other => panic!("gated delta: unsupported input dtype {}", other.name()),
    }
}
