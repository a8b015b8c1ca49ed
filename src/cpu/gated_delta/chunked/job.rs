//! The jobs of a call: the split over the worker pool (batch rows, ranges of key heads and,
//! when there are too few, parts of the value columns), and one job's walk over the chunks,
//! from its initial states to its final ones.

use std::cell::RefCell;

use super::chunk::{unit_run, write_y, Job, NextRows, Pending, Problem, Scratch};
#[cfg(target_arch = "aarch64")]
use super::gemm::Neon;
#[cfg(target_arch = "x86_64")]
use super::gemm::{Avx2, Avx512};
use super::gemm::{Kernel, Portable, NR};
use crate::cpu::elem::Elem;
use crate::cpu::gated_delta::{Out, StateIn};
use crate::cpu::{fp, pool};

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

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// The product kernel a call runs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum KernelChoice {
    Portable,
    /// Needs AVX2 and FMA.
    Avx2,
    /// Needs AVX-512 (F), AVX2 and FMA.
    Avx512,
    /// Needs NEON (arm64).
    Neon,
}

/// Runs a call's jobs over the pool, each on one `Span`.
///
/// # Safety
/// `out` points at y `[B, T, Hv, Dv]` and state `[B, Hv, Dv, Dk]` buffers of `problem.d`,
/// which nothing else accesses during the call; the CPU has the features `kernel` needs.
pub(super) unsafe fn run<T: Elem>(problem: &Problem<T>, out: Out<T>, kernel: KernelChoice) {
    let d = problem.d;
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
        // Subnormals flushed: their microcode assists on Intel cores would make the speed
        // depend on the host's MXCSR (the chunked contract is float32 rounding, not bits).
        fp::flush_subnormals(|| {
            SCRATCH.with(|s| {
                let s = &mut *s.borrow_mut();
                #[cfg(target_arch = "x86_64")]
                match kernel {
                    // SAFETY: the kernel's features were detected (the caller's contract); the
                    // jobs' spans are disjoint, as `run_job` requires.
                    KernelChoice::Avx512 => {
                        return unsafe { run_job_avx512(problem, out, s, span) }
                    }
                    // SAFETY: as above.
                    KernelChoice::Avx2 => return unsafe { run_job_avx2(problem, out, s, span) },
                    KernelChoice::Portable | KernelChoice::Neon => {}
                }
                #[cfg(target_arch = "aarch64")]
                if kernel == KernelChoice::Neon {
                    // SAFETY: as above (NEON is part of arm64).
                    return unsafe { run_job::<Neon, T>(problem, out, s, span) };
                }
                let _ = kernel;
                // SAFETY: the jobs' spans are disjoint, as `run_job` requires.
                unsafe { run_job::<Portable, T>(problem, out, s, span) };
            })
        })
    });
}

/// `run_job` with the AVX2 products, compiled with AVX2 + FMA (its elementwise loops
/// vectorize 8-wide).
///
/// # Safety
/// AVX2 and FMA must be available; as `run_job`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_job_avx2<T: Elem>(p: &Problem<T>, out: Out<T>, s: &mut Scratch, span: Span) {
    run_job::<Avx2, T>(p, out, s, span)
}

/// `run_job` with the AVX-512 products, compiled with AVX-512 (its elementwise loops
/// vectorize 16-wide; with no fused operations in them, to the same bits).
///
/// # Safety
/// AVX-512 (F), AVX2 and FMA must be available; as `run_job`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn run_job_avx512<T: Elem>(p: &Problem<T>, out: Out<T>, s: &mut Scratch, span: Span) {
    run_job::<Avx512, T>(p, out, s, span)
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
    let (tok0, tokens, span_len) = (p.rows.tok0(b), p.rows.len(b), p.rows.span(b));
    let job = Job {
        tok0,
        kh0: span.kh0,
        nkh: span.kh1 - span.kh0,
        group,
        np,
        col0: span.p0 * NR,
        col1: (span.p1 * NR).min(dv),
        vys: padded(np * NR),
        kts: padded(2 * c),
        y: out.y.0,
    };
    let (col0, col1) = (job.col0, job.col1);
    let heads = job.nkh * group;
    let h_len = np * dk * NR;

    s.h.fit(heads * h_len);
    s.kq.fit(2 * c * dk);
    s.kt.fit(dk * job.kts);
    s.kd.fit(c * dk);
    s.gram.fit(2 * c * c);
    s.an.fit(c * c);
    s.pm.fit(c * c);
    s.tm.fit(c * c);
    s.tmb.fit(c * c);
    s.vy.fit(2 * job.vy_half(c));
    s.u.fit(K::PANELS * c * NR);
    s.rs.fit(2 * c);
    s.decay.fit(c);
    s.gamma.fit(c);
    s.g.fit(group * c);
    s.beta.fit(group * c);
    if s.tok.len() < 2 * c {
        s.tok.resize(2 * c, 0);
    }

    // The initial states, transposed into panels (columns past Dv are zero and stay zero).
    let h0 = job.kh0 * group;
    let state_at = |row: usize, i: usize| (row * d.hv + h0 + i) * dv * dk;
    for i in 0..heads {
        let src: Option<*const f32> = match (p.init, p.rows.src(b)) {
            (StateIn::Zeros, _) | (_, None) => None,
            (StateIn::Buffer(x), Some(row)) => Some(x.as_ptr().add(state_at(row, i))),
            (StateIn::InPlace, Some(row)) => Some(out.state.0.add(state_at(row, i)) as *const f32),
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
        while next < tokens && len < c {
            if p.mask.map_or(true, |m| m[tok0 + next] != 0) {
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
                    count: (next + c).min(tokens) - next,
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
    // y past the tokens the row runs (a pool's padding row) is zero.
    for t in tokens..span_len {
        for i in 0..heads {
            let y = out.y.0.add(job.vy_at(d, t, h0 + i));
            for col in col0..col1 {
                *y.add(col) = T::from_f32(0.0);
            }
        }
    }
    K::store_fence();

    // The final states back in [Dv, Dk] rows (where the row's state is written).
    let Some(dst_row) = p.rows.dst(b) else {
        return;
    };
    for i in 0..heads {
        let hbuf = &s.h[i * h_len..(i + 1) * h_len];
        let dst = out.state.0.add(state_at(dst_row, i));
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
