//! The gated-delta recurrence and its prefix replay on the CPU, in the Metal kernel's order:
//! per value row, lane `l` of 32 owns state elements `[l·n, (l+1)·n)` (n = Dk/32) and sums its
//! products sequentially in f32; the lane partials meet in the xor butterfly
//! (`reduce::simd_sum`). No FMA contraction anywhere.
//!
//! Work is split by (batch row, value head) over the worker pool. Within a head, tokens are
//! processed in tiles; each value row keeps its state in registers/L1 across a tile. With AVX2
//! and Dk = 128 a vectorized row kernel runs (8 lanes' partials per register, the butterfly as
//! fixed shuffles; `exact_avx2`), with AVX-512 one of 16 lanes per register (`exact_avx512`);
//! on arm64 a NEON one of 4 lanes per register for Dk = 32, 64, 96, 128 and 256
//! (`exact_neon`); elsewhere the portable row kernel (`exact_row`). A decode step (one real
//! token from a given state) takes a single-token AVX2 kernel that leaves the state in its
//! natural layout and moves only the products into lane layout (NEON's rows load and store
//! the state with de-interleaving loads and stores, so decode needs no kernel of its own). All
//! compute identical bits.

use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
use super::exact_avx2 as avx2;
#[cfg(target_arch = "x86_64")]
use super::exact_avx512 as avx512;
#[cfg(target_arch = "aarch64")]
use super::exact_neon as neon;
use super::exact_row::{row_portable, RowIo, Tile};
use super::{Dims, Out, Rows, StateIn};
use crate::cpu::elem::Elem;
use crate::cpu::{features, fp, pool};

/// Tokens per tile: a tile's keys and queries (2 · 64 · Dk f32) stay in L2.
const TILE: usize = 64;

/// Value rows the vectorized kernel interleaves.
const ROWS: usize = 4;

/// Value rows the AVX-512 kernel interleaves.
const ROWS_512: usize = 4;

/// The row kernels a call uses: portable, AVX2 or AVX-512 (Dk = 128), or NEON (Dk = 32, 64,
/// 96, 128 or 256).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Portable,
    Avx2,
    Avx512,
    Neon,
}

/// Value rows the single-token (decode) kernel interleaves.
const SINGLE_ROWS: usize = 2;

/// One call's inputs, shared read-only by the jobs.
pub(super) struct Problem<'a, T> {
    pub(super) d: Dims,
    pub(super) q: Option<&'a [T]>,
    pub(super) k: &'a [T],
    pub(super) v: &'a [T],
    pub(super) g: &'a [f32],
    pub(super) beta: &'a [f32],
    pub(super) state_in: StateIn<'a>,
    /// One flag a token (`[B, T]` flattened): 0 = padding (the update's mask).
    pub(super) mask: Option<&'a [u8]>,
    /// Each row's tokens and state rows (the replay's accepted lengths; a pool's table).
    pub(super) rows: Rows<'a>,
}

/// Per-thread scratch: a tile's keys, queries (f32), gates and token flags.
#[derive(Default)]
struct Scratch {
    k: Vec<f32>,
    q: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    active: Vec<bool>,
    /// A head's state when the row's final state is not written (a pool only read).
    state: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs head (batch row `b`, value head `hv`): every value row over the row's tokens.
fn head<T: Elem>(p: &Problem<T>, out: Out<T>, b: usize, hv: usize, path: Path) {
    let vectorized = path != Path::Portable;
    let d = p.d;
    let hk = hv / (d.hv / d.hk);
    let (tok0, tokens, span) = (p.rows.tok0(b), p.rows.len(b), p.rows.span(b));
    let head_at = |row: usize| ((row * d.hv + hv) * d.dv) * d.dk;
    // The state's start: the row's source (None: zeros).
    let src_state = match p.state_in {
        StateIn::Zeros => None,
        _ => p.rows.src(b).map(head_at),
    };
    // A decode step (one real token from a given state) takes the single-token kernel, which
    // works on the state in its natural layout: no transposed copy of the state to keep.
    let single = matches!(path, Path::Avx2 | Path::Avx512)
        && tokens == 1
        && src_state.is_some()
        && p.mask.is_none_or(|m| m[tok0] != 0);
    SCRATCH.with(|scratch| {
        let s = &mut *scratch.borrow_mut();
        // Where the head's state lives while it runs: its output rows, or scratch.
        let dst_state: *mut f32 = match p.rows.dst(b) {
            // SAFETY: this job owns the head's rows of the state output (see `row_io`).
            Some(row) => unsafe { out.state.0.add(head_at(row)) },
            None => {
                s.state.resize(d.dv * d.dk, 0.0);
                s.state.as_mut_ptr()
            }
        };
        let mut t0 = 0;
        loop {
            let len = (tokens - t0).min(TILE);
            s.k.resize(len * d.dk, 0.0);
            s.q.resize(len * d.dk, 0.0);
            s.g.clear();
            s.beta.clear();
            s.active.clear();
            for t in t0..t0 + len {
                let qk = ((tok0 + t) * d.hk + hk) * d.dk;
                let dst = (t - t0) * d.dk;
                let lanes = if single { Path::Portable } else { path };
                widen(&p.k[qk..qk + d.dk], &mut s.k[dst..dst + d.dk], lanes);
                if let Some(q) = p.q {
                    widen(&q[qk..qk + d.dk], &mut s.q[dst..dst + d.dk], lanes);
                }
                let gate = (tok0 + t) * d.hv + hv;
                s.g.push(p.g[gate]);
                s.beta.push(p.beta[gate]);
                s.active.push(p.mask.is_none_or(|m| m[tok0 + t] != 0));
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
                // SAFETY: this job owns the Dv·Dk values at `dst_state` (its head's rows of the
                // state output, or its scratch) and y's rows of (b, hv); the pool joins before
                // the buffers are released.
                let dst = unsafe { dst_state.add(dv * d.dk) };
                let src = match (t0, p.state_in, src_state) {
                    (0, _, None) => std::ptr::null(),
                    (0, StateIn::Buffer(s), Some(at)) => s[at + dv * d.dk..][..d.dk].as_ptr(),
                    // SAFETY: in place, the source row is this job's own output row.
                    (0, StateIn::InPlace, Some(at)) => unsafe { out.state.0.add(at + dv * d.dk) },
                    _ => dst as *const f32,
                };
                let v_at = ((tok0 + t0) * d.hv + hv) * d.dv + dv;
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
                if path == Path::Neon {
                    #[cfg(target_arch = "aarch64")]
                    // SAFETY: `Path::Neon` only where NEON was detected and
                    // `neon::supports(Dk)`; `src`/`dst` address Dk values each (see above).
                    unsafe {
                        if dv + neon::MAX_ROWS <= d.dv {
                            let io = std::array::from_fn(|r| row_io(dv + r));
                            neon::rows_for::<T, { neon::MAX_ROWS }>(&tile, io, d.dk);
                            dv += neon::MAX_ROWS;
                        } else {
                            neon::rows_for::<T, 1>(&tile, [row_io(dv)], d.dk);
                            dv += 1;
                        }
                    }
                } else if path == Path::Avx512 {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `Path::Avx512` only where AVX-512 was detected and Dk = 128.
                    unsafe {
                        if dv + ROWS_512 <= d.dv {
                            avx512::rows::<T, ROWS_512>(
                                &tile,
                                std::array::from_fn(|r| row_io(dv + r)),
                            );
                            dv += ROWS_512;
                        } else {
                            avx512::rows::<T, 1>(&tile, [row_io(dv)]);
                            dv += 1;
                        }
                    }
                } else if vectorized {
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
    // y past the tokens the row runs (a pool's padding row) is zero.
    if p.q.is_some() {
        for t in tokens..span {
            for dv in 0..d.dv {
                // SAFETY: y's rows of (b, hv) are this job's (see `row_io`).
                unsafe { *out.y.0.add(((tok0 + t) * d.hv + hv) * d.dv + dv) = T::from_f32(0.0) };
            }
        }
    }
}

/// Converts one token's keys or queries to f32, in the layout the row kernel of `path` wants
/// (`Portable`: natural order).
fn widen<T: Elem>(src: &[T], dst: &mut [f32], path: Path) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `path` names kernels whose features were detected.
    unsafe {
        match path {
            Path::Avx2 => avx2::to_lane_layout(dst),
            Path::Avx512 => avx512::to_lane_layout(dst),
            Path::Portable | Path::Neon => {}
        }
    }
    #[cfg(target_arch = "aarch64")]
    if path == Path::Neon {
        // SAFETY: `Path::Neon` only where `neon::supports(Dk)`.
        unsafe { neon::to_lane_layout(dst) }
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = path;
}

pub(super) fn solve<T: Elem>(p: &Problem<T>, y: &mut [T], state: &mut [f32]) {
    let f = features::kernels();
    #[cfg(target_arch = "aarch64")]
    let neon_fits = neon::supports(p.d.dk);
    #[cfg(not(target_arch = "aarch64"))]
    let neon_fits = false;
    let path = match (p.d.dk == 128, f.avx2, f.avx512()) {
        _ if f.neon && neon_fits => Path::Neon,
        (true, _, true) => Path::Avx512,
        (true, true, false) => Path::Avx2,
        _ => Path::Portable,
    };
    let out = Out::new(y, state);
    let jobs = p.d.b * p.d.hv;
    // Apple GPUs flush float32 subnormals, as operands and as results (docs/DESIGN.md §3): so
    // does this kernel, which also keeps a decaying state from taking Intel's microcode assist
    // for every subnormal product.
    pool::run(jobs, &|job| {
        fp::flush_subnormals(|| head(p, out, job / p.d.hv, job % p.d.hv, path))
    });
}
