//! One unit of a job: one chunk of one key head, with its value heads (which share the Gram
//! products). The data a job works in (the call's inputs, what the job covers and its strides,
//! the per-thread scratch), the unit's maths, and the memory work spread between its products
//! (writing the previous unit's outputs, prefetching the next unit's rows).

use super::gemm::{Epi, Kernel, Product, NR};
use crate::cpu::elem::Elem;
use crate::cpu::gated_delta::{Dims, Rows, StateIn};

/// Rows of the triangular inversion's blocks.
const TB: usize = 16;

/// Tokens ahead that the gather prefetches (for the first unit; later units' rows were
/// prefetched during the unit before).
const AHEAD: usize = 2;

/// One call's inputs, shared read-only by the jobs.
pub(super) struct Problem<'a, T> {
    pub(super) d: Dims,
    pub(super) q: &'a [T],
    pub(super) k: &'a [T],
    pub(super) v: &'a [T],
    pub(super) g: &'a [f32],
    pub(super) beta: &'a [f32],
    pub(super) init: StateIn<'a>,
    pub(super) mask: Option<&'a [u8]>,
    /// Each row's tokens and state rows.
    pub(super) rows: Rows<'a>,
    pub(super) chunk: usize,
    /// Value heads per key head.
    pub(super) group: usize,
}

/// A float buffer that starts on a cache line (64 bytes), so that the products' 16-wide loads
/// and stores of its rows never straddle two lines; grown (never shrunk) by `fit`.
#[derive(Default)]
pub(super) struct Floats {
    lines: Vec<Line>,
    len: usize,
}

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([f32; 16]);

impl Floats {
    /// Grows the buffer to `n` floats (new ones zero), keeping its contents.
    pub(super) fn fit(&mut self, n: usize) {
        if self.len < n {
            self.lines.resize(n.div_ceil(16), Line([0.0; 16]));
            self.len = n;
        }
    }
}

impl std::ops::Deref for Floats {
    type Target = [f32];
    #[inline(always)]
    fn deref(&self) -> &[f32] {
        // SAFETY: `lines` holds at least `len` floats (`fit`), laid out contiguously.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const f32, self.len) }
    }
}

impl std::ops::DerefMut for Floats {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `deref`.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut f32, self.len) }
    }
}

/// Per-thread scratch, grown per call and reused across chunks and jobs.
#[derive(Default)]
pub(super) struct Scratch {
    /// State panels: the job's value head i, panel j is `[Dk, 16]` at `(i · np + j) · Dk · 16`.
    pub(super) h: Floats,
    /// `[K; Q]` of the chunk, `[2·lp, Dk]` (Q from row lp).
    pub(super) kq: Floats,
    /// `[K; Q]ᵀ`, `[Dk, 2·lp]`, row stride `kts`: A by columns for the products of K and Q,
    /// `Kᵀ` (its first lp columns) as B for the Gram products.
    pub(super) kt: Floats,
    /// `[K; Q] Kᵀ`, `[2·lp, lp]` (lower block triangle).
    pub(super) gram: Floats,
    /// `-A`, P, `Tm`, `Tm diag(β)`: `[lp, lp]` each.
    pub(super) an: Floats,
    pub(super) pm: Floats,
    pub(super) tm: Floats,
    pub(super) tmb: Floats,
    /// Two halves (alternate units), each per value head of the key head `[2·lp, vys]`: rows
    /// `0..lp` V, then `V − γ K H`; rows `lp..` `γ Q H`, then Y (written out during the next
    /// unit).
    pub(super) vy: Floats,
    /// `diag(Γ(L-1, ·)) K` of one value head, `[lp, Dk]`: `Kᵀ diag(Γ(L-1, ·))` by columns.
    pub(super) kd: Floats,
    /// U of one panel, `[lp, 16]`.
    pub(super) u: Floats,
    /// Row scales `[-γ; γ]`.
    pub(super) rs: Floats,
    /// Running row of `Γ(t, ·)`.
    pub(super) decay: Floats,
    pub(super) gamma: Floats,
    /// Gates of the key head's value heads, `[group, C]`.
    pub(super) g: Floats,
    pub(super) beta: Floats,
    /// Token index of each chunk row, two halves (alternate chunks).
    pub(super) tok: Vec<usize>,
}

/// What one job covers, with its scratch strides: the batch row from token `tok0`, key heads `kh0..kh0 + nkh`
/// (`group` value heads each), value panels `[p0, p1)`: `np` panels from column `col0`, real
/// columns `[col0, col1)`.
pub(super) struct Job<T> {
    /// The row's first token in the flattened token dimension (`Rows::tok0`).
    pub(super) tok0: usize,
    pub(super) kh0: usize,
    pub(super) nkh: usize,
    pub(super) group: usize,
    pub(super) np: usize,
    pub(super) col0: usize,
    pub(super) col1: usize,
    /// Row stride of the `vy` scratch (`np · 16`, plus 16 when that is a multiple of 64 so
    /// that a panel's rows do not all fall in a few cache sets).
    pub(super) vys: usize,
    /// Row stride of `kt` (likewise padded).
    pub(super) kts: usize,
    pub(super) y: *mut T,
}

impl<T> Job<T> {
    /// Offset of y (and v) of token t, value head h, column 0.
    #[inline(always)]
    pub(super) fn vy_at(&self, d: Dims, t: usize, h: usize) -> usize {
        ((self.tok0 + t) * d.hv + h) * d.dv
    }

    /// Offset of q and k of token t, key head kh.
    #[inline(always)]
    pub(super) fn qk_at(&self, d: Dims, t: usize, kh: usize) -> usize {
        ((self.tok0 + t) * d.hk + kh) * d.dk
    }

    /// Floats in one half of the `vy` scratch (chunk `c`).
    #[inline(always)]
    pub(super) fn vy_half(&self, c: usize) -> usize {
        self.group * 2 * c * self.vys
    }

    /// Offset in the state scratch of value head `gi` of the job's key head `khl`.
    #[inline(always)]
    pub(super) fn h_at(&self, dk: usize, khl: usize, gi: usize) -> usize {
        (khl * self.group + gi) * self.np * dk * NR
    }
}

/// A unit (one chunk, one key head) whose outputs still sit in its half of the `vy` scratch;
/// its tokens are in half `tok_half` of `tok`.
#[derive(Clone, Copy)]
pub(super) struct Pending {
    pub(super) kh: usize,
    pub(super) vy_half: usize,
    pub(super) tok_half: usize,
    pub(super) len: usize,
    pub(super) lp: usize,
}

/// Writes the outputs of token row `i` of a pending unit (the key head's value heads), from
/// the `vy` and `tok` scratch at `vy`, `tok`.
#[inline(always)]
pub(super) unsafe fn write_y<K: Kernel, T: Elem>(
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
pub(super) struct NextRows {
    pub(super) kh: usize,
    pub(super) tok: *const usize,
    pub(super) first: usize,
    pub(super) count: usize,
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

/// One unit: the chunk of `unit.len` active tokens (`s.tok[unit.tok_half · C..]`) for key
/// head `unit.kh` (the job's `khl`-th) and its value heads, computed in half `unit.vy_half` of
/// the `vy` scratch. While the products run, the outputs of the previous unit (`pending`) are
/// written and the rows of the next (`next_rows`) prefetched, a little after each product.
#[inline(always)]
pub(super) unsafe fn unit_run<K: Kernel, T: Elem>(
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
    let (np, vys, kts) = (job.np, job.vys, job.kts);
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
                    let gate = (job.tok0 + t) * d.hv + kh * group + gi;
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
    }
    // [K; Q]ᵀ (Dk is a multiple of 8 in the transposed part; other columns one by one).
    {
        let (kq, kt) = (s.kq.as_ptr(), s.kt.as_mut_ptr());
        let dk8 = dk / 8 * 8;
        K::transpose(kq, dk, kt, kts, 2 * lp, dk8);
        for col in dk8..dk {
            for i in 0..2 * lp {
                *kt.add(col * kts + i) = *kq.add(i * dk + col);
            }
        }
    }

    // Gram products [K; Q] Kᵀ, lower block triangle only: column panel j needs rows ≥ 16 j.
    {
        let kt = s.kt.as_ptr();
        let gram = s.gram.as_mut_ptr();
        for part in 0..2 {
            for j in 0..lp / NR {
                let r0 = j * NR;
                K::gemm(Product {
                    m: lp - r0,
                    kc: dk,
                    tri: false,
                    a: kt.add(part * lp + r0),
                    a_rs: 1,
                    a_cs: kts,
                    b: kt.add(j * NR),
                    b_rs: kts,
                    c: gram.add((part * lp + r0) * lp + j * NR),
                    c_rs: lp,
                    panels: 1,
                    b_ps: 0,
                    c_ps: 0,
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
        // decay[j] = Γ(t, j) for j < t; 1 from t on.
        decay.fill(1.0);
        for t in 0..lp {
            let gt = g[t];
            gamma *= gt;
            s.gamma[t] = gamma;
            s.rs[t] = -gamma;
            s.rs[lp + t] = gamma;
            let nb = -beta[t];
            let row = t * lp..(t + 1) * lp;
            let (arow, prow) = (&mut an[row.clone()], &mut pm[row.clone()]);
            let (krow, qrow) = (&gk[row.clone()], &gq[row]);
            // Whole 16-column groups up to t's (lanes selected by column), zeros past it.
            let end = (t / NR + 1) * NR;
            for c0 in (0..end).step_by(NR) {
                let group = c0..c0 + NR;
                let (d, a, p) = (
                    &mut decay[group.clone()],
                    &mut arow[group.clone()],
                    &mut prow[group.clone()],
                );
                let (k, q) = (&krow[group.clone()], &qrow[group]);
                for l in 0..NR {
                    let j = c0 + l;
                    let e = if j < t { d[l] * gt } else { d[l] };
                    d[l] = e;
                    a[l] = if j < t { nb * e * k[l] } else { 0.0 };
                    p[l] = if j <= t { e * q[l] } else { 0.0 };
                }
            }
            arow[end..].fill(0.0);
            prow[end..].fill(0.0);
        }
    }
    let gamma_last = s.gamma[lp - 1];

    // diag(Γ(L-1, ·)) K for the state update.
    {
        let kd = &mut s.kd[..lp * dk];
        for ((o, x), &e) in kd
            .chunks_exact_mut(dk)
            .zip(s.kq.chunks_exact(dk))
            .zip(&s.decay[..lp])
        {
            for (o, &x) in o.iter_mut().zip(x) {
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
                    a_cs: 1,
                    b: tm.add(c0 * lp + c0),
                    b_rs: lp,
                    c: tm.add(t0 * lp + c0),
                    c_rs: lp,
                    panels: 1,
                    b_ps: 0,
                    c_ps: 0,
                    epi: Epi::SET,
                });
            }
            for t in t0..t0 + TB {
                let row = std::slice::from_raw_parts_mut(tm.add(t * lp), lp);
                row[t0..].fill(0.0);
                // Row t's nonzero columns are those of the 16-column groups up to t0's; each
                // group is summed in registers over the block's rows before t.
                for c0 in (0..=t0).step_by(16) {
                    let mut acc = [0f32; 16];
                    acc.copy_from_slice(&row[c0..c0 + 16]);
                    for si in t0..t {
                        let x = *an.add(t * lp + si);
                        let src = std::slice::from_raw_parts(tm.add(si * lp + c0), 16);
                        for (r, &e) in acc.iter_mut().zip(src) {
                            *r += x * e;
                        }
                    }
                    row[c0..c0 + 16].copy_from_slice(&acc);
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

    // The panels, K::PANELS at a time (each product's columns are those panels' columns).
    let mut pj = 0;
    while pj < np {
        let panels = K::PANELS.min(np - pj);
        let hp = s.h.as_mut_ptr().add(h0 + pj * dk * NR);
        let vyp = s.vy.as_mut_ptr().add(vy0 + pj * NR);
        let up = s.u.as_mut_ptr();
        let (h_ps, u_ps) = (dk * NR, lp * NR);
        // V - γ K H, then γ Q H (which overwrites its rows).
        for part in 0..2 {
            K::gemm(Product {
                m: lp,
                kc: dk,
                tri: false,
                a: s.kt.as_ptr().add(part * lp),
                a_rs: 1,
                a_cs: kts,
                b: hp,
                b_rs: NR,
                c: vyp.add(part * lp * vys),
                c_rs: vys,
                panels,
                b_ps: h_ps,
                c_ps: NR,
                epi: Epi {
                    load: part == 0,
                    c_scale: 1.0,
                    rs: s.rs.as_ptr().add(part * lp),
                },
            });
        }
        for _ in 0..panels {
            overlap.step();
        }
        // U = Tm diag(β) (V - γ K H).
        K::gemm(Product {
            m: lp,
            kc: lp,
            tri: true,
            a: s.tmb.as_ptr(),
            a_rs: lp,
            a_cs: 1,
            b: vyp,
            b_rs: vys,
            c: up,
            c_rs: NR,
            panels,
            b_ps: NR,
            c_ps: u_ps,
            epi: Epi::SET,
        });
        for _ in 0..panels {
            overlap.step();
        }
        // Y = γ Q H + P U.
        K::gemm(Product {
            m: lp,
            kc: lp,
            tri: true,
            a: s.pm.as_ptr(),
            a_rs: lp,
            a_cs: 1,
            b: up,
            b_rs: NR,
            c: vyp.add(lp * vys),
            c_rs: vys,
            panels,
            b_ps: u_ps,
            c_ps: NR,
            epi: Epi::ADD,
        });
        for _ in 0..panels {
            overlap.step();
        }
        // H = γ_{L-1} H + Kᵀ diag(Γ(L-1, ·)) U, a panel at a time (measured faster than two
        // at a time with AVX-512, where this product's few steps per tile, L, come with the
        // load and store of its part of H).
        for q in 0..panels {
            K::gemm(Product {
                m: dk,
                kc: lp,
                tri: false,
                a: s.kd.as_ptr(),
                a_rs: 1,
                a_cs: dk,
                b: up.add(q * u_ps),
                b_rs: NR,
                c: hp.add(q * h_ps),
                c_rs: NR,
                panels: 1,
                b_ps: 0,
                c_ps: 0,
                epi: Epi {
                    load: true,
                    c_scale: gamma_last,
                    rs: std::ptr::null(),
                },
            });
            overlap.step();
        }
        pj += panels;
    }
}
