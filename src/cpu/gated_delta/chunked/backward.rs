//! The chunked form's backward pass: the gradients of y and the final state with respect to
//! q, k, v, the gates (as `∂L/∂(log g)`), β and the initial state, computed chunk by chunk
//! through the WY products of `super` (see its header for the forward's maths).
//!
//! Per (batch row, value head): a forward sweep over the chunks keeps only the state entering
//! each chunk (`H_j`, transposed) and the chunk's residuals `R = V − diag(γ) K H_j`; a reverse
//! sweep then carries `dH` (the cotangent of the state leaving the chunk) backwards, and for
//! each chunk recomputes its WY quantities from them and back-propagates through them
//! (`backward_chunk`). A job is one batch row and one
//! key head with the value heads that read it (GQA), so the gradients of q and k of a key head
//! are summed over its value heads inside the job, and the per-key-head products (the Gram
//! matrices `K Kᵀ`, `Q Kᵀ`, and the products of the summed `dP`, `dA` with K and Q) run once.
//!
//! Memory per job: the kept states and each chunk's residuals R = V − diag(γ) K H,
//! `group · ceil(T'/C) · (Dk + C) · Dv'` f32 (T' the row's active tokens, Dv' = Dv rounded up
//! to 16; C ≤ 4·Dk, so at most 5 states per chunk), the `group` states and their cotangents,
//! and O(C · (C + Dk + Dv')) of per-chunk scratch: O((T/C + C) · state), never O(T · state).
//! These buffers are one set per running job, passed from job to job and kept between calls
//! (`take_bufs`, up to 256 MiB): a repeated call touches no fresh page of its own. q, k, v
//! and dy are read in their dtypes (each row widened as a chunk gathers it) and dq, dk, dv are
//! written in theirs (`ChunkedOuts`): no float32 copy of an input or a gradient.
//!
//! Gates enter as running products (`Γ(t, s)`, `γ_t`, no division, no logarithm): a gate that
//! underflows to 0 gives zero products and finite gradients. The gradient of a product of
//! gates with respect to the logarithm of one of its factors is the product itself, so every
//! term `f(Γ(t, s))` contributes `Γ(t, s) · ∂L/∂Γ(t, s)` to `∂L/∂ log g_i` for each `i` in
//! `(s, t]`; these are gathered as sums of row prefixes (`backward_chunk::head_backward`), so
//! no two sums that cancel are subtracted. The result is `g · ∂L/∂g`, what the gate chain to
//! a, A_log and dt_bias needs (`gated_delta::backward::gate_backward_log`).

pub use super::backward_chunk::ChunkedInputs;
use super::backward_chunk::{self as bc, Chunk, OutRows, Outs, Scratch};
#[cfg(target_arch = "aarch64")]
use super::gemm::Neon;
#[cfg(target_arch = "x86_64")]
use super::gemm::{Avx2, Avx512};
use super::gemm::{Kernel, Portable, NR};
use super::{ChunkSize, Products};
use crate::cpu::elem::FloatsMut;
use crate::cpu::gated_delta::backward::Inputs;
use crate::cpu::pool::{self, SharedMut};
use crate::cpu::{features, fp};
use std::sync::Mutex;

/// Where the chunked backward writes its gradients: dq, dk and dv in any float dtype (rounded
/// as MLX rounds), the others float32; lengths as `ChunkedGrads`'. Every element is written.
pub struct ChunkedOuts<'a> {
    pub dq: FloatsMut<'a>,
    pub dk: FloatsMut<'a>,
    pub dv: FloatsMut<'a>,
    pub dlog_g: &'a mut [f32],
    pub dbeta: &'a mut [f32],
    pub dstate: &'a mut [f32],
}

/// The chunked backward's gradients, in the layouts of their inputs. `dlog_g` is
/// `∂L/∂(log g) = g · ∂L/∂g` `[B, T, Hv]`; the others as `gated_delta::backward::Grads`.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkedGrads {
    pub dq: Vec<f32>,
    pub dk: Vec<f32>,
    pub dv: Vec<f32>,
    pub dlog_g: Vec<f32>,
    pub dbeta: Vec<f32>,
    pub dstate: Vec<f32>,
}

/// The backward pass of the chunked form with chunks of `chunk` tokens and the fastest product
/// kernel.
pub fn chunked_backward(x: &Inputs, chunk: ChunkSize) -> ChunkedGrads {
    chunked_backward_with(x, chunk, Products::Fastest)
}

/// `chunked_backward` with the product kernel capped at `products`.
pub fn chunked_backward_with(x: &Inputs, chunk: ChunkSize, products: Products) -> ChunkedGrads {
    let d = x.d;
    let (qk, vs, gates, states) = (
        d.b * d.t * d.hk * d.dk,
        d.b * d.t * d.hv * d.dv,
        d.b * d.t * d.hv,
        d.b * d.hv * d.dv * d.dk,
    );
    let mut g = ChunkedGrads {
        dq: vec![0.0; qk],
        dk: vec![0.0; qk],
        dv: vec![0.0; vs],
        dlog_g: vec![0.0; gates],
        dbeta: vec![0.0; gates],
        dstate: vec![0.0; states],
    };
    let outs = ChunkedOuts {
        dq: FloatsMut::F32(&mut g.dq),
        dk: FloatsMut::F32(&mut g.dk),
        dv: FloatsMut::F32(&mut g.dv),
        dlog_g: &mut g.dlog_g,
        dbeta: &mut g.dbeta,
        dstate: &mut g.dstate,
    };
    chunked_backward_into(&ChunkedInputs::f32(x), chunk, products, outs);
    g
}

/// The chunked backward with inputs in their own dtypes, written into `out` (every element:
/// masked tokens' gradients are zeros), the product kernel capped at `products`. The buffers
/// of the jobs running at once are allocated once per call and passed from job to job.
pub fn chunked_backward_into(
    x: &ChunkedInputs,
    chunk: ChunkSize,
    products: Products,
    mut out: ChunkedOuts,
) {
    let d = x.d;
    let c = chunk.tokens();
    assert!(
        d.hv == 0 || (d.hk > 0 && d.hv.is_multiple_of(d.hk)),
        "Hv = {} is not a multiple of Hk = {}",
        d.hv,
        d.hk
    );
    let (qk, vs, gates, states) = (
        d.b * d.t * d.hk * d.dk,
        d.b * d.t * d.hv * d.dv,
        d.b * d.t * d.hv,
        d.b * d.hv * d.dv * d.dk,
    );
    assert_eq!(x.q.len(), qk, "q has the wrong length");
    assert_eq!(x.k.len(), qk, "k has the wrong length");
    assert_eq!(x.v.len(), vs, "v has the wrong length");
    assert_eq!(x.dy.len(), vs, "dy has the wrong length");
    assert_eq!(out.dq.len(), qk, "dq has the wrong length");
    assert_eq!(out.dk.len(), qk, "dk has the wrong length");
    assert_eq!(out.dv.len(), vs, "dv has the wrong length");
    assert_eq!(out.dlog_g.len(), gates, "dlog_g has the wrong length");
    assert_eq!(out.dbeta.len(), gates, "dbeta has the wrong length");
    assert_eq!(out.dstate.len(), states, "dstate has the wrong length");
    assert_eq!(x.g.len(), gates, "g has the wrong length");
    assert_eq!(x.beta.len(), gates, "beta has the wrong length");
    if let Some(s) = x.state {
        assert_eq!(s.len(), states, "state has the wrong length");
    }
    if let Some(s) = x.dstate_out {
        assert_eq!(s.len(), states, "dstate_out has the wrong length");
    }
    if let Some(m) = x.mask {
        assert_eq!(m.len(), d.b * d.t, "mask has the wrong length");
    }
    assert!(
        d.hv == 0 || d.dk.is_multiple_of(8),
        "Dk = {} is not a multiple of 8",
        d.dk
    );
    let outs = Outs {
        dq: OutRows::new(&mut out.dq),
        dk: OutRows::new(&mut out.dk),
        dv: OutRows::new(&mut out.dv),
        dlog_g: SharedMut(out.dlog_g.as_mut_ptr()),
        dbeta: SharedMut(out.dbeta.as_mut_ptr()),
        dstate: SharedMut(out.dstate.as_mut_ptr()),
    };
    if d.b == 0 || d.hv == 0 || d.dv == 0 {
        // No value: every gradient is zero.
        // SAFETY: the lengths were checked above.
        unsafe {
            outs.dq.zero(0, qk);
            outs.dk.zero(0, qk);
            outs.dv.zero(0, vs);
        }
        out.dlog_g.fill(0.0);
        out.dbeta.fill(0.0);
        out.dstate.fill(0.0);
        return;
    }
    let f = features::kernels();
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = (
        products == Products::Fastest && f.avx512(),
        products != Products::Portable && f.avx2_fma(),
    );
    #[cfg(target_arch = "aarch64")]
    let neon = products == Products::Fastest && f.neon;
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let _ = (f, products);
    let dvp = d.dv.div_ceil(NR) * NR;
    let shape = (c, d.dk, dvp);
    pool::run(d.b * d.hk, &|job| {
        let (b, hk) = (job / d.hk, job % d.hk);
        let mut bufs = take_bufs(shape);
        let w = &mut bufs;
        fp::flush_subnormals(|| {
            #[cfg(target_arch = "x86_64")]
            {
                if avx512 {
                    // SAFETY: AVX-512 was detected; job (b, hk) alone writes its entries.
                    return unsafe { job_avx512(x, outs, w, c, b, hk) };
                }
                if avx2 {
                    // SAFETY: AVX2 and FMA were detected; as above.
                    return unsafe { job_avx2(x, outs, w, c, b, hk) };
                }
            }
            #[cfg(target_arch = "aarch64")]
            if neon {
                // SAFETY: NEON is part of arm64; job (b, hk) alone writes its entries.
                return unsafe { run_job::<Neon>(x, outs, w, c, b, hk) };
            }
            // SAFETY: job (b, hk) alone writes its entries.
            unsafe { run_job::<Portable>(x, outs, w, c, b, hk) }
        });
        give_bufs(bufs);
    });
}

/// Job buffers left by finished jobs, of this call or an earlier one: as many sets as jobs
/// run at once, so that in the steady state no job touches a fresh page.
static SPARE: Mutex<Vec<Bufs>> = Mutex::new(Vec::new());

/// The most floats a set of job buffers may hold to be kept between calls (256 MiB over the
/// sets); a larger set is freed at its job's end.
const SPARE_FLOATS: usize = 64 << 20;

/// A set of job buffers for chunks of `shape` = (C, Dk, Dv'): a spare one, or a new one.
fn take_bufs(shape: (usize, usize, usize)) -> Bufs {
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    match spare.iter().rposition(|b| b.shape == shape) {
        Some(i) => spare.swap_remove(i),
        None => {
            drop(spare);
            let (c, dk, dvp) = shape;
            Bufs {
                shape,
                s: Scratch::new(c, dk, dvp),
                kept: Vec::new(),
                h: Vec::new(),
                dh: Vec::new(),
            }
        }
    }
}

/// Returns a finished job's buffers to the spares (the oldest set of another shape, or past
/// one per thread, is freed).
fn give_bufs(bufs: Bufs) {
    let floats = bufs.kept.capacity() + bufs.h.capacity() + bufs.dh.capacity();
    if floats * pool::threads() > SPARE_FLOATS {
        return;
    }
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    spare.retain(|b| b.shape == bufs.shape);
    if spare.len() < pool::threads() {
        spare.push(bufs);
    }
}

/// One job's buffers: the chunk scratch, the kept states, the current states and their
/// cotangents.
struct Bufs {
    /// (C, Dk, Dv') the scratch was made for.
    shape: (usize, usize, usize),
    s: Scratch,
    kept: Vec<f32>,
    h: Vec<f32>,
    dh: Vec<f32>,
}

/// `v` holding at least `n` values (not cleared).
fn fit(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

/// `run_job` with the AVX2 products, compiled with AVX2 + FMA.
///
/// # Safety
/// AVX2 and FMA must be available; as `run_job`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn job_avx2(x: &ChunkedInputs, o: Outs, w: &mut Bufs, c: usize, b: usize, hk: usize) {
    run_job::<Avx2>(x, o, w, c, b, hk)
}

/// `run_job` with the AVX-512 products, compiled with AVX-512.
///
/// # Safety
/// AVX-512 (F), AVX2 and FMA must be available; as `run_job`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn job_avx512(x: &ChunkedInputs, o: Outs, w: &mut Bufs, c: usize, b: usize, hk: usize) {
    run_job::<Avx512>(x, o, w, c, b, hk)
}

/// One job: batch row `b`, key head `hk` and its value heads, over all their tokens.
///
/// # Safety
/// `o` points at output buffers of `x.d`'s sizes, of which no other thread writes the
/// entries of (b, hk) and of hk's value heads while this runs.
#[inline(always)]
unsafe fn run_job<K: Kernel>(
    x: &ChunkedInputs,
    o: Outs,
    w: &mut Bufs,
    c: usize,
    b: usize,
    hk: usize,
) {
    let d = x.d;
    let (dk, dv) = (d.dk, d.dv);
    let dvp = dv.div_ceil(NR) * NR;
    let group = d.hv / d.hk;
    let hv0 = hk * group;
    let size = dk * dvp;
    let tokens: Vec<usize> = (0..d.t)
        .filter(|&t| x.mask.is_none_or(|m| m[b * d.t + t] != 0))
        .collect();
    let chunks = tokens.len().div_ceil(c);
    let s = &mut w.s;

    // The state walks the chunks in `h` as H = Sᵀ ([Dk, Dv'], zero columns past Dv). For each
    // chunk and value head `kept` holds the state entering it transposed, Hᵀ ([Dv', Dk], as
    // the reverse sweep reads it), then the chunk's R = V − diag(γ) K H ([C, Dv']: the reverse
    // sweep needs no K H product; (T/C)·C·Dv' ≤ 4·(T/C)·state, as C ≤ 4·Dk). The last chunk's
    // R is recomputed from `h`, which is left holding the state entering that chunk.
    let stride = size + c * dvp;
    let kept = fit(&mut w.kept, group * chunks * stride);
    let h = fit(&mut w.h, group * size);
    h.fill(0.0);
    let state_at = |i: usize| (b * d.hv + hv0 + i) * dv * dk;
    if let Some(state) = x.state {
        for i in 0..group {
            bc::to_panel(&state[state_at(i)..], &mut h[i * size..], dk, dv, dvp);
        }
    }
    for j in 0..chunks.saturating_sub(1) {
        let chunk = Chunk::new(&tokens, j, c);
        s.gather_kq(x, b, hk, &chunk, false);
        K::transpose(s.kq.as_ptr(), dk, s.kt.as_mut_ptr(), c, chunk.lp, dk);
        bc::gram::<K>(s, &chunk, false);
        for i in 0..group {
            let hv = hv0 + i;
            let hi = &mut h[i * size..(i + 1) * size];
            let keep = &mut kept[(i * chunks + j) * stride..][..stride];
            K::transpose(hi.as_ptr(), dvp, keep.as_mut_ptr(), dk, dk, dvp);
            s.gates(x, b, hv, &chunk);
            let r = &mut keep[size..size + chunk.l * dvp];
            bc::recompute_u::<K>(x, s, &chunk, (b, hv), hi, r);
            bc::advance::<K>(s, &chunk, hi);
        }
    }
    if chunks > 0 {
        for i in 0..group {
            let keep = &mut kept[(i * chunks + chunks - 1) * stride..];
            K::transpose(h[i * size..].as_ptr(), dvp, keep.as_mut_ptr(), dk, dk, dvp);
        }
    }

    // The reverse sweep: dH starts as the final state's cotangent.
    let dh = fit(&mut w.dh, group * size);
    dh.fill(0.0);
    if let Some(ds) = x.dstate_out {
        for i in 0..group {
            bc::to_panel(&ds[state_at(i)..], &mut dh[i * size..], dk, dv, dvp);
        }
    }
    for j in (0..chunks).rev() {
        let chunk = Chunk::new(&tokens, j, c);
        s.gather_kq(x, b, hk, &chunk, true);
        K::transpose(s.kq.as_ptr(), dk, s.kt.as_mut_ptr(), c, chunk.lp, dk);
        bc::gram::<K>(s, &chunk, true);
        s.clear_sums(&chunk);
        for i in 0..group {
            let hv = hv0 + i;
            s.gates(x, b, hv, &chunk);
            let keep = &mut kept[(i * chunks + j) * stride..][..stride];
            let (h0t, r) = keep.split_at_mut(size);
            let r = &mut r[..chunk.l * dvp];
            if j + 1 == chunks {
                // The last chunk's R, made here from the state entering it.
                bc::recompute_u::<K>(x, s, &chunk, (b, hv), &h[i * size..(i + 1) * size], r);
            } else {
                bc::u_from_r::<K>(s, &chunk, r);
            }
            let dhi = &mut dh[i * size..][..size];
            bc::head_backward::<K>(x, o, s, &chunk, (b, hv), h0t, r, dhi);
        }
        bc::key_head_backward::<K>(x, o, s, &chunk, b, hk);
    }
    for i in 0..group {
        let dst = std::slice::from_raw_parts_mut(o.dstate.0.add(state_at(i)), dv * dk);
        bc::from_panel(&dh[i * size..], dst, dk, dv, dvp);
    }
    // Masked tokens: zero gradients.
    if let Some(m) = x.mask {
        for t in (0..d.t).filter(|&t| m[b * d.t + t] == 0) {
            let at = ((b * d.t + t) * d.hk + hk) * dk;
            o.dq.zero(at, dk);
            o.dk.zero(at, dk);
            for hv in hv0..hv0 + group {
                let at = (b * d.t + t) * d.hv + hv;
                o.dv.zero(at * dv, dv);
                *o.dlog_g.0.add(at) = 0.0;
                *o.dbeta.0.add(at) = 0.0;
            }
        }
    }
}
