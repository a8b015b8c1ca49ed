//! One chunk of the chunked backward (`backward`): the chunk's gates, its WY quantities
//! recomputed from the state entering it, and the reverse pass through its products.
//!
//! For a chunk of L tokens (keys K, queries Q, values V, state H0 entering, cotangents dY of
//! the outputs and dH1 of the state leaving), with `R = V − diag(γ) K H0`, `X = diag(β) R`,
//! `U = Tm X`, `λ_s = Γ(L−1, s)`:
//!
//! ```text
//! dU  = diag(λ) K dH1 + Pᵀ dY              E  = U dH1ᵀ:  dK += diag(λ) E,  dλ_s = k_s·E_s
//! dX  = Tmᵀ dU                             dβ_t += R_t·dX_t,   dR = diag(β) dX = dV
//! dP  = dY Uᵀ,  dA = −dX Uᵀ                (as dTm = dU Xᵀ and dA = −Tmᵀ dTm Tmᵀ)
//! [F; G] = [dY; dR] H0ᵀ:                   dQ += diag(γ) F,  dK −= diag(γ) G,
//!                                          dγ_t += q_t·F_t − k_t·G_t
//! dH0 = γ_{L−1} dH1 + [diag(γ) Q; −diag(γ) K]ᵀ [dY; dR],     dγ_{L−1} += ⟨H0, dH1⟩
//! ```
//!
//! and through `P = Γ ⊙ Q Kᵀ` (lower, diagonal included) and `A = diag(β) Γ ⊙ K Kᵀ` (strictly
//! lower): `dP' = Γ ⊙ dP`, `dA' = diag(β) Γ ⊙ dA` give `dQ += dP' K`, `dK += dP'ᵀ Q +
//! (dA' + dA'ᵀ) K` (summed over the key head's value heads before these products) and
//! `dβ_t += Σ_s dA(t, s) Γ(t, s) k_t·k_s`.
//!
//! All matrices are row-major with a padded width: L' = L rounded up to 16 (columns of the
//! [L, L] matrices, stride C), Dv' = Dv rounded up to 16; the padding holds zeros.

use half::{bf16, f16};

use super::gemm::{Epi, Kernel, Product, NR};
use crate::cpu::elem::{Elem, Floats, FloatsMut};
use crate::cpu::gated_delta::backward::Inputs;
use crate::cpu::gated_delta::Dims;
use crate::cpu::pool::SharedMut;

/// The chunked backward's inputs, q, k, v and dy in their own dtypes (each row widened to f32
/// as a chunk gathers it); the others as `gated_delta::backward::Inputs`.
#[derive(Clone, Copy)]
pub struct ChunkedInputs<'a> {
    pub d: Dims,
    pub q: Floats<'a>,
    pub k: Floats<'a>,
    pub v: Floats<'a>,
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub state: Option<&'a [f32]>,
    pub mask: Option<&'a [u8]>,
    pub dy: Floats<'a>,
    pub dstate_out: Option<&'a [f32]>,
}

impl<'a> ChunkedInputs<'a> {
    /// Float32 inputs.
    pub fn f32(x: &Inputs<'a>) -> Self {
        ChunkedInputs {
            d: x.d,
            q: Floats::F32(x.q),
            k: Floats::F32(x.k),
            v: Floats::F32(x.v),
            g: x.g,
            beta: x.beta,
            state: x.state,
            mask: x.mask,
            dy: Floats::F32(x.dy),
            dstate_out: x.dstate_out,
        }
    }
}

/// The output buffers, shared by the jobs (each writes the entries of its batch row and key
/// head, and of that key head's value heads).
#[derive(Clone, Copy)]
pub(super) struct Outs {
    pub(super) dq: OutRows,
    pub(super) dk: OutRows,
    pub(super) dv: OutRows,
    pub(super) dlog_g: SharedMut<f32>,
    pub(super) dbeta: SharedMut<f32>,
    pub(super) dstate: SharedMut<f32>,
}

/// A gradient output in its input's dtype, written a row at a time.
#[derive(Clone, Copy)]
pub(super) enum OutRows {
    F32(SharedMut<f32>),
    Bf16(SharedMut<bf16>),
    F16(SharedMut<f16>),
}

impl OutRows {
    pub(super) fn new(buf: &mut FloatsMut) -> OutRows {
        match buf {
            FloatsMut::F32(x) => OutRows::F32(SharedMut(x.as_mut_ptr())),
            FloatsMut::Bf16(x) => OutRows::Bf16(SharedMut(x.as_mut_ptr())),
            FloatsMut::F16(x) => OutRows::F16(SharedMut(x.as_mut_ptr())),
        }
    }

    /// Writes `src` rounded to the buffer's dtype at element `at`.
    ///
    /// # Safety
    /// Elements `[at, at + src.len())` are in the buffer and this caller's alone.
    #[inline(always)]
    pub(super) unsafe fn store(self, at: usize, src: &[f32]) {
        #[inline(always)]
        unsafe fn put<T: Elem>(dst: *mut T, src: &[f32]) {
            for (j, &x) in src.iter().enumerate() {
                *dst.add(j) = T::from_f32(x);
            }
        }
        match self {
            OutRows::F32(p) => put(p.0.add(at), src),
            OutRows::Bf16(p) => put(p.0.add(at), src),
            OutRows::F16(p) => put(p.0.add(at), src),
        }
    }

    /// Writes `n` zeros at element `at`.
    ///
    /// # Safety
    /// As `store`.
    pub(super) unsafe fn zero(self, at: usize, n: usize) {
        match self {
            OutRows::F32(p) => std::ptr::write_bytes(p.0.add(at), 0, n),
            OutRows::Bf16(p) => std::ptr::write_bytes(p.0.add(at), 0, n),
            OutRows::F16(p) => std::ptr::write_bytes(p.0.add(at), 0, n),
        }
    }
}

/// The tokens of one chunk (positions in the batch row) and their counts.
pub(super) struct Chunk<'a> {
    pub(super) tok: &'a [usize],
    /// Tokens.
    pub(super) l: usize,
    /// Tokens rounded up to 16.
    pub(super) lp: usize,
}

impl<'a> Chunk<'a> {
    /// Chunk `j` of the row's active tokens `tokens`, C = `c` tokens each.
    pub(super) fn new(tokens: &'a [usize], j: usize, c: usize) -> Self {
        let tok = &tokens[j * c..((j + 1) * c).min(tokens.len())];
        Chunk {
            tok,
            l: tok.len(),
            lp: tok.len().div_ceil(NR) * NR,
        }
    }
}

/// A job's per-chunk buffers (sizes for chunks of up to C tokens).
pub(super) struct Scratch {
    c: usize,
    dk: usize,
    dvp: usize,
    /// K rows `[0, C)`, Q rows `[C, 2C)`, `[2C, Dk]` (rows past L zero).
    pub(super) kq: Vec<f32>,
    /// Kᵀ, `[Dk, C]`.
    pub(super) kt: Vec<f32>,
    /// K Kᵀ rows `[0, C)`, Q Kᵀ rows `[C, 2C)`, `[2C, C]`.
    gram: Vec<f32>,
    /// Γ(t, s) for s ≤ t, `[C, C]`.
    big: Vec<f32>,
    gam: Vec<f32>,
    lam: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    /// Tm = (I + A)⁻¹, `[C, C]` (zeros above the diagonal).
    tm: Vec<f32>,
    /// X = diag(β) R (first V, as R is made), U: `[C, Dv']` each.
    xb: Vec<f32>,
    u: Vec<f32>,
    /// Uᵀ, `[Dv', C]`.
    ut: Vec<f32>,
    /// dY rows `[0, L)`, dX then dR rows `[L, 2L)`, `[2C, Dv']`.
    dyr: Vec<f32>,
    du: Vec<f32>,
    /// dH1ᵀ, `[Dv', Dk]`.
    dht: Vec<f32>,
    /// [F; G], `[2C, Dk]`; E `[C, Dk]`; [γQ; −γK] `[2C, Dk]`.
    fg: Vec<f32>,
    e: Vec<f32>,
    qks: Vec<f32>,
    /// P, then [dP; −dA], `[C, C]` and `[2C, C]`.
    p: Vec<f32>,
    pa: Vec<f32>,
    /// Σ over the key head's value heads of dP' and dA', and dA' + dA'ᵀ, `[C, C]`.
    sdp: Vec<f32>,
    sdkk: Vec<f32>,
    sym: Vec<f32>,
    /// The chunk's dQ and dK of the key head, `[C, Dk]`.
    dqc: Vec<f32>,
    dkc: Vec<f32>,
    dgam: Vec<f32>,
    dlam: Vec<f32>,
    dbeta: Vec<f32>,
    row_m: Vec<f32>,
    col_m: Vec<f32>,
    /// A row's terms of dβ and of the gates' sums, `[2, C]`.
    tri: Vec<f32>,
}

impl Scratch {
    pub(super) fn new(c: usize, dk: usize, dvp: usize) -> Self {
        let z = |n: usize| vec![0.0f32; n];
        Scratch {
            c,
            dk,
            dvp,
            kq: z(2 * c * dk),
            kt: z(dk * c),
            gram: z(2 * c * c),
            big: z(c * c),
            gam: z(c),
            lam: z(c),
            g: z(c),
            beta: z(c),
            tm: z(c * c),
            xb: z(c * dvp),
            u: z(c * dvp),
            ut: z(dvp * c),
            dyr: z(2 * c * dvp),
            du: z(c * dvp),
            dht: z(dvp * dk),
            fg: z(2 * c * dk),
            e: z(c * dk),
            qks: z(2 * c * dk),
            p: z(c * c),
            pa: z(2 * c * c),
            sdp: z(c * c),
            sdkk: z(c * c),
            sym: z(c * c),
            dqc: z(c * dk),
            dkc: z(c * dk),
            dgam: z(c),
            dlam: z(c),
            dbeta: z(c),
            row_m: z(c),
            col_m: z(c),
            tri: z(2 * c),
        }
    }

    /// The chunk's keys (and with `with_q` its queries) of key head `hk`, rows past L zero.
    pub(super) fn gather_kq(
        &mut self,
        x: &ChunkedInputs,
        b: usize,
        hk: usize,
        ch: &Chunk,
        with_q: bool,
    ) {
        let (d, dk, c) = (x.d, self.dk, self.c);
        for (half, src) in [(0, x.k), (1, x.q)] {
            if half == 1 && !with_q {
                break;
            }
            let dst = &mut self.kq[half * c * dk..(half * c + ch.lp) * dk];
            for (i, &t) in ch.tok.iter().enumerate() {
                let at = ((b * d.t + t) * d.hk + hk) * dk;
                src.widen(at, &mut dst[i * dk..(i + 1) * dk]);
            }
            dst[ch.l * dk..].fill(0.0);
        }
    }

    /// Value head `hv`'s gates over the chunk: g, β, Γ, γ, λ; then A and Tm (needs `gram`).
    // Inlined into the job, compiled with its target features.
    #[inline(always)]
    pub(super) fn gates(&mut self, x: &ChunkedInputs, b: usize, hv: usize, ch: &Chunk) {
        let (d, c, l) = (x.d, self.c, ch.l);
        for (i, &t) in ch.tok.iter().enumerate() {
            let at = (b * d.t + t) * d.hv + hv;
            self.g[i] = x.g[at];
            self.beta[i] = x.beta[at];
        }
        // Row t of Γ is row t − 1 times g_t (a product of gates only shrinks: no ratio).
        let mut run = 1.0f32;
        for t in 0..l {
            let g = self.g[t];
            run *= g;
            self.gam[t] = run;
            let (prev, rest) = self.big.split_at_mut(t * c);
            let row = &mut rest[..c];
            if t > 0 {
                for (x, &p) in row[..t].iter_mut().zip(&prev[(t - 1) * c..]) {
                    *x = p * g;
                }
            }
            row[t] = 1.0;
        }
        for s in 0..l {
            self.lam[s] = self.big[(l - 1) * c + s];
        }
        for v in [&mut self.gam, &mut self.lam, &mut self.beta] {
            v[l..ch.lp].fill(0.0);
        }
        // Tm = (I + A)⁻¹ row by row: Tm_t = e_t − Σ_{r<t} A[t, r] Tm_r, A[t, r] = β_t Γ(t, r)
        // k_t·k_r (zero terms skipped: no 0 · inf).
        for t in 0..l {
            let (done, rest) = self.tm.split_at_mut(t * c);
            let row = &mut rest[..c];
            row[..ch.lp].fill(0.0);
            for r in 0..t {
                let a = self.beta[t] * self.big[t * c + r] * self.gram[t * c + r];
                if a != 0.0 {
                    let prev = &done[r * c..r * c + r + 1];
                    for (x, &y) in row.iter_mut().zip(prev) {
                        *x -= a * y;
                    }
                }
            }
            row[t] = 1.0;
        }
    }

    /// Zeros the key head's sums for a chunk (whole rows: one fill each).
    #[inline(always)]
    pub(super) fn clear_sums(&mut self, ch: &Chunk) {
        let (c, dk) = (self.c, self.dk);
        self.sdp[..ch.l * c].fill(0.0);
        self.sdkk[..ch.l * c].fill(0.0);
        self.dqc[..ch.l * dk].fill(0.0);
        self.dkc[..ch.l * dk].fill(0.0);
    }
}

/// A row-major matrix operand: element (r, p) at `p[r · rs + p · cs]`.
#[derive(Clone, Copy)]
struct Op {
    p: *const f32,
    rs: usize,
    cs: usize,
}

fn rows(p: *const f32, rs: usize) -> Op {
    Op { p, rs, cs: 1 }
}

/// The transpose of the row-major matrix at `p` with row stride `rs`.
fn cols(p: *const f32, rs: usize) -> Op {
    Op { p, rs: 1, cs: rs }
}

/// `C[m, n] = epi(C, A[m, kc] · B[kc, n])`, B row-major with stride `b_rs`, C with `c_rs`;
/// n a multiple of 16.
///
/// # Safety
/// The operands address the rows and columns the product reads and writes.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn mm<K: Kernel>(
    m: usize,
    n: usize,
    kc: usize,
    a: Op,
    b: *const f32,
    b_rs: usize,
    c: *mut f32,
    c_rs: usize,
    epi: Epi,
) {
    if m == 0 || n == 0 {
        return;
    }
    let panels = n / NR;
    let mut q = 0;
    while q < panels {
        let two = K::PANELS == 2 && q + 1 < panels;
        K::gemm(Product {
            m,
            kc,
            tri: false,
            a: a.p,
            a_rs: a.rs,
            a_cs: a.cs,
            b: b.add(q * NR),
            b_rs,
            c: c.add(q * NR),
            c_rs,
            panels: if two { 2 } else { 1 },
            b_ps: NR,
            c_ps: NR,
            epi,
        });
        q += if two { 2 } else { 1 };
    }
}

/// `a · b` in 16 partial sums (lane l takes elements l, l + 16, ...): vectorized, unlike a
/// single running sum.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..16 {
            lanes[l] += x[l] * y[l];
        }
    }
    for (l, (x, y)) in ra.iter().zip(rb).enumerate() {
        lanes[l] += x * y;
    }
    lanes.iter().sum()
}

/// `dst` (`[Dk, Dv']`) = the transpose of a state row `src` (`[Dv, Dk]`), zero columns past Dv.
pub(super) fn to_panel(src: &[f32], dst: &mut [f32], dk: usize, dv: usize, dvp: usize) {
    for i in 0..dk {
        let row = &mut dst[i * dvp..(i + 1) * dvp];
        for (j, x) in row.iter_mut().enumerate() {
            *x = if j < dv { src[j * dk + i] } else { 0.0 };
        }
    }
}

/// The inverse of `to_panel`.
pub(super) fn from_panel(src: &[f32], dst: &mut [f32], dk: usize, dv: usize, dvp: usize) {
    for j in 0..dv {
        for i in 0..dk {
            dst[j * dk + i] = src[i * dvp + j];
        }
    }
}

/// K Kᵀ (and with `with_q`, Q Kᵀ) of the gathered chunk into `gram`.
///
/// # Safety
/// `s` was sized for the chunk; `kt` holds Kᵀ.
#[inline(always)]
pub(super) unsafe fn gram<K: Kernel>(s: &mut Scratch, ch: &Chunk, with_q: bool) {
    let (c, dk) = (s.c, s.dk);
    let kt = s.kt.as_ptr();
    mm::<K>(
        ch.l,
        ch.lp,
        dk,
        rows(s.kq.as_ptr(), dk),
        kt,
        c,
        s.gram.as_mut_ptr(),
        c,
        Epi::SET,
    );
    if with_q {
        mm::<K>(
            ch.l,
            ch.lp,
            dk,
            rows(s.kq.as_ptr().add(c * dk), dk),
            kt,
            c,
            s.gram.as_mut_ptr().add(c * c),
            c,
            Epi::SET,
        );
    }
}

/// R = V − diag(γ) K H0 into `r` (`[L, Dv']`), X = diag(β) R and U = Tm X for value head
/// `hv` (U's rows past L zero).
///
/// # Safety
/// `s` holds the chunk's K, gates and Tm; `h0` is `[Dk, Dv']`.
#[inline(always)]
pub(super) unsafe fn recompute_u<K: Kernel>(
    x: &ChunkedInputs,
    s: &mut Scratch,
    ch: &Chunk,
    (b, hv): (usize, usize),
    h0: &[f32],
    r: &mut [f32],
) {
    let (d, dk, dvp, l) = (x.d, s.dk, s.dvp, ch.l);
    let dv = d.dv;
    mm::<K>(
        l,
        dvp,
        dk,
        rows(s.kq.as_ptr(), dk),
        h0.as_ptr(),
        dvp,
        r.as_mut_ptr(),
        dvp,
        Epi::SET,
    );
    for (t, &tok) in ch.tok.iter().enumerate() {
        // V's row widened into X's row (X is made from R next).
        let v = &mut s.xb[t * dvp..t * dvp + dv];
        x.v.widen(((b * d.t + tok) * d.hv + hv) * dv, v);
        let gam = s.gam[t];
        let r = &mut r[t * dvp..(t + 1) * dvp];
        for (y, &x) in r.iter_mut().zip(&*v) {
            *y = x - gam * *y;
        }
        r[dv..].fill(0.0);
    }
    u_from_r::<K>(s, ch, r);
}

/// X = diag(β) R and U = Tm X from the chunk's R `r` (`[L, Dv']`, as `recompute_u` made it);
/// U's rows past L zero.
///
/// # Safety
/// `s` holds the chunk's gates and Tm.
#[inline(always)]
pub(super) unsafe fn u_from_r<K: Kernel>(s: &mut Scratch, ch: &Chunk, r: &[f32]) {
    let (c, dvp, l) = (s.c, s.dvp, ch.l);
    for t in 0..l {
        let beta = s.beta[t];
        let (r, xb) = (
            &r[t * dvp..(t + 1) * dvp],
            &mut s.xb[t * dvp..(t + 1) * dvp],
        );
        for (y, &x) in xb.iter_mut().zip(r) {
            *y = beta * x;
        }
    }
    for q in 0..dvp / NR {
        K::gemm(Product {
            m: l,
            kc: l,
            tri: true,
            a: s.tm.as_ptr(),
            a_rs: c,
            a_cs: 1,
            b: s.xb.as_ptr().add(q * NR),
            b_rs: dvp,
            c: s.u.as_mut_ptr().add(q * NR),
            c_rs: dvp,
            panels: 1,
            b_ps: NR,
            c_ps: NR,
            epi: Epi::SET,
        });
    }
    s.u[l * dvp..ch.lp * dvp].fill(0.0);
}

/// The state through the chunk: `H ← γ_{L−1} H + Kᵀ diag(λ) U` (after `recompute_u`).
///
/// # Safety
/// As `recompute_u`; `h` is `[Dk, Dv']`.
#[inline(always)]
pub(super) unsafe fn advance<K: Kernel>(s: &mut Scratch, ch: &Chunk, h: &mut [f32]) {
    let (dk, dvp, l) = (s.dk, s.dvp, ch.l);
    for t in 0..l {
        let lam = s.lam[t];
        let (src, dst) = (
            &s.u[t * dvp..(t + 1) * dvp],
            &mut s.xb[t * dvp..(t + 1) * dvp],
        );
        for (y, &x) in dst.iter_mut().zip(src) {
            *y = lam * x;
        }
    }
    mm::<K>(
        dk,
        dvp,
        l,
        cols(s.kq.as_ptr(), dk),
        s.xb.as_ptr(),
        dvp,
        h.as_mut_ptr(),
        dvp,
        Epi {
            load: true,
            c_scale: s.gam[l - 1],
            rs: std::ptr::null(),
        },
    );
}

/// The reverse pass through one value head's part of the chunk (after `recompute_u` or
/// `u_from_r`): writes dv, dβ and d(log g) of its tokens, adds its dQ, dK parts and the key
/// head's sums, and turns `dh` (dH1 on entry) into dH0. `h0t` is the state entering the
/// chunk, transposed (`[Dv', Dk]`), `r` the chunk's R (`[L, Dv']`).
///
/// # Safety
/// As `recompute_u`; `dh` is `[Dk, Dv']`; `o`'s entries of (b, hv) are this caller's alone.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub(super) unsafe fn head_backward<K: Kernel>(
    x: &ChunkedInputs,
    o: Outs,
    s: &mut Scratch,
    ch: &Chunk,
    (b, hv): (usize, usize),
    h0t: &[f32],
    r: &[f32],
    dh: &mut [f32],
) {
    let (d, c, dk, dvp, l, lp) = (x.d, s.c, s.dk, s.dvp, ch.l, ch.lp);
    let dv = d.dv;
    s.dgam[..l].fill(0.0);
    s.dbeta[..l].fill(0.0);

    // dY rows, and P (zeros above the diagonal).
    for (t, &tok) in ch.tok.iter().enumerate() {
        let row = &mut s.dyr[t * dvp..(t + 1) * dvp];
        x.dy.widen(((b * d.t + tok) * d.hv + hv) * dv, &mut row[..dv]);
        row[dv..].fill(0.0);
        let (p, big) = (&mut s.p[t * c..t * c + lp], &s.big[t * c..=t * c + t]);
        let qk = &s.gram[(c + t) * c..=(c + t) * c + t];
        for ((x, &g), &y) in p.iter_mut().zip(big).zip(qk) {
            *x = g * y;
        }
        p[t + 1..].fill(0.0);
    }
    // dU = diag(λ) K dH1 + Pᵀ dY.
    let lam = Epi {
        load: false,
        c_scale: 0.0,
        rs: s.lam.as_ptr(),
    };
    let (kq, du) = (s.kq.as_ptr(), s.du.as_mut_ptr());
    mm::<K>(l, dvp, dk, rows(kq, dk), dh.as_ptr(), dvp, du, dvp, lam);
    let dyr = s.dyr.as_mut_ptr();
    mm::<K>(
        l,
        dvp,
        l,
        cols(s.p.as_ptr(), c),
        dyr,
        dvp,
        du,
        dvp,
        Epi::ADD,
    );
    // E = U dH1ᵀ: dK += diag(λ) E, dλ.
    K::transpose(dh.as_ptr(), dvp, s.dht.as_mut_ptr(), dk, dk, dvp);
    s.dgam[l - 1] = dot(h0t, &s.dht);
    let e = s.e.as_mut_ptr();
    mm::<K>(
        l,
        dk,
        dv,
        rows(s.u.as_ptr(), dvp),
        s.dht.as_ptr(),
        dk,
        e,
        dk,
        Epi::SET,
    );
    for t in 0..l {
        let (e, k) = (&s.e[t * dk..(t + 1) * dk], &s.kq[t * dk..(t + 1) * dk]);
        s.dlam[t] = dot(k, e);
        let lam = s.lam[t];
        for (y, &v) in s.dkc[t * dk..(t + 1) * dk].iter_mut().zip(e) {
            *y += lam * v;
        }
    }
    // dX = Tmᵀ dU (rows [L, 2L) of dyr); dβ += R·dX.
    let dx = dyr.add(l * dvp);
    mm::<K>(
        l,
        dvp,
        l,
        cols(s.tm.as_ptr(), c),
        du,
        dvp,
        dx,
        dvp,
        Epi::SET,
    );
    for t in 0..l {
        let r = &r[t * dvp..t * dvp + dv];
        s.dbeta[t] += dot(r, &s.dyr[(l + t) * dvp..(l + t) * dvp + dv]);
    }
    // [dP; −dA] = [dY; dX] Uᵀ.
    K::transpose(s.u.as_ptr(), dvp, s.ut.as_mut_ptr(), c, lp, dvp);
    let pa = s.pa.as_mut_ptr();
    mm::<K>(
        2 * l,
        lp,
        dv,
        rows(dyr, dvp),
        s.ut.as_ptr(),
        c,
        pa,
        c,
        Epi::SET,
    );
    // dR = diag(β) dX = dV.
    for (t, &tok) in ch.tok.iter().enumerate() {
        let beta = s.beta[t];
        let row = &mut s.dyr[(l + t) * dvp..(l + t + 1) * dvp];
        row.iter_mut().for_each(|y| *y *= beta);
        o.dv.store(((b * d.t + tok) * d.hv + hv) * dv, &row[..dv]);
    }
    // [F; G] = [dY; dR] H0ᵀ.
    let fg = s.fg.as_mut_ptr();
    mm::<K>(
        2 * l,
        dk,
        dv,
        rows(dyr, dvp),
        h0t.as_ptr(),
        dk,
        fg,
        dk,
        Epi::SET,
    );
    for t in 0..l {
        let gam = s.gam[t];
        let (f, gg) = (
            &s.fg[t * dk..(t + 1) * dk],
            &s.fg[(l + t) * dk..(l + t + 1) * dk],
        );
        let (k, q) = (
            &s.kq[t * dk..(t + 1) * dk],
            &s.kq[(c + t) * dk..(c + t + 1) * dk],
        );
        s.dgam[t] += dot(q, f) - dot(k, gg);
        // Whole rows through iterators (no index checks: the loops vectorize).
        for (y, &x) in s.dqc[t * dk..(t + 1) * dk].iter_mut().zip(f) {
            *y += gam * x;
        }
        for (y, &x) in s.dkc[t * dk..(t + 1) * dk].iter_mut().zip(gg) {
            *y -= gam * x;
        }
        let (qs, ks) = s.qks.split_at_mut((l + t) * dk);
        for (y, &x) in qs[t * dk..(t + 1) * dk].iter_mut().zip(q) {
            *y = gam * x;
        }
        for (y, &x) in ks[..dk].iter_mut().zip(k) {
            *y = -gam * x;
        }
    }
    // dH0 = γ_{L−1} dH1 + [γQ; −γK]ᵀ [dY; dR].
    let keep = Epi {
        load: true,
        c_scale: s.gam[l - 1],
        rs: std::ptr::null(),
    };
    let qks = s.qks.as_ptr();
    mm::<K>(
        dk,
        dvp,
        2 * l,
        cols(qks, dk),
        dyr,
        dvp,
        dh.as_mut_ptr(),
        dvp,
        keep,
    );

    // Through P and A: the key head's sums, dβ, and the gates' terms. M(t, s) = Γ(t, s) ·
    // ∂L/∂Γ(t, s) (s < t) is the gradient of log Γ(t, s) = Σ_{s<i≤t} log g_i, so
    // d(log g_i) gets Σ_{t≥i} Σ_{s<i} M(t, s): `col_m[i]` sums the row prefixes
    // P(t, i) = Σ_{s<i} M(t, s) over t ≥ i. Summed this way (no difference of sums that
    // cancel), a gate that is 0 gets exactly 0: every term it multiplies is 0.
    s.col_m[..l].fill(0.0);
    for t in 0..l {
        let beta = s.beta[t];
        // Row t's terms side by side (these loops vectorize), then the two running sums in
        // order.
        let (dbeta_terms, m) = s.tri.split_at_mut(c);
        let (dbeta_terms, m) = (&mut dbeta_terms[..t], &mut m[..t]);
        let (big, kk) = (&s.big[t * c..t * c + t], &s.gram[t * c..t * c + t]);
        let qk = &s.gram[(c + t) * c..(c + t) * c + t];
        let (dp, da) = (&s.pa[t * c..t * c + t], &s.pa[(l + t) * c..(l + t) * c + t]);
        let (sdkk, sdp) = (&mut s.sdkk[t * c..t * c + t], &mut s.sdp[t * c..t * c + t]);
        for sc in 0..t {
            let (big, kk, qk) = (big[sc], kk[sc], qk[sc]);
            let da = -da[sc];
            dbeta_terms[sc] = da * big * kk;
            let da1 = da * beta * big;
            sdkk[sc] += da1;
            let dp1 = dp[sc] * big;
            sdp[sc] += dp1;
            m[sc] = da1 * kk + dp1 * qk;
        }
        let mut dbeta = 0.0f32;
        let mut prefix = 0.0f32;
        for ((col, &term), &m) in s.col_m[..t].iter_mut().zip(&*dbeta_terms).zip(&*m) {
            dbeta += term;
            *col += prefix;
            prefix += m;
        }
        s.col_m[t] += prefix;
        s.sdp[t * c + t] += s.pa[t * c + t];
        s.dbeta[t] += dbeta;
    }
    // γ_t = Π_{i≤t} g_i gives d(log g_i) Σ_{t≥i} γ_t dγ_t; λ_s = Π_{s<i≤L−1} g_i gives
    // Σ_{s<i} λ_s dλ_s (`row_m[i]`, a prefix sum).
    let mut lam_prefix = 0.0f32;
    for i in 0..l {
        s.row_m[i] = lam_prefix;
        lam_prefix += s.dlam[i] * s.lam[i];
    }
    let mut gam_suffix = 0.0f32;
    for t in (0..l).rev() {
        gam_suffix += s.dgam[t] * s.gam[t];
        let at = (b * d.t + ch.tok[t]) * d.hv + hv;
        *o.dlog_g.0.add(at) = s.col_m[t] + gam_suffix + s.row_m[t];
        *o.dbeta.0.add(at) = s.dbeta[t];
    }
}

/// The key head's products of the chunk (after every value head's `head_backward`):
/// `dQ += dP' K`, `dK += dP'ᵀ Q + (dA' + dA'ᵀ) K`, and dq, dk of its tokens written.
///
/// # Safety
/// As `recompute_u`; `o`'s dq, dk entries of (b, hk) are this caller's alone.
#[inline(always)]
pub(super) unsafe fn key_head_backward<K: Kernel>(
    x: &ChunkedInputs,
    o: Outs,
    s: &mut Scratch,
    ch: &Chunk,
    b: usize,
    hk: usize,
) {
    let (d, c, dk, l) = (x.d, s.c, s.dk, ch.l);
    for t in 0..l {
        for sc in 0..l {
            let value = if sc < t {
                s.sdkk[t * c + sc]
            } else if sc > t {
                s.sdkk[sc * c + t]
            } else {
                0.0
            };
            s.sym[t * c + sc] = value;
        }
    }
    let (k, q) = (s.kq.as_ptr(), s.kq.as_ptr().add(c * dk));
    let (dqc, dkc) = (s.dqc.as_mut_ptr(), s.dkc.as_mut_ptr());
    let (sdp, sym) = (s.sdp.as_ptr(), s.sym.as_ptr());
    mm::<K>(l, dk, l, rows(sdp, c), k, dk, dqc, dk, Epi::ADD);
    mm::<K>(l, dk, l, cols(sdp, c), q, dk, dkc, dk, Epi::ADD);
    mm::<K>(l, dk, l, rows(sym, c), k, dk, dkc, dk, Epi::ADD);
    for (t, &tok) in ch.tok.iter().enumerate() {
        let at = ((b * d.t + tok) * d.hk + hk) * dk;
        o.dq.store(at, &s.dqc[t * dk..(t + 1) * dk]);
        o.dk.store(at, &s.dkc[t * dk..(t + 1) * dk]);
    }
}
