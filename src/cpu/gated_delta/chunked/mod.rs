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
//! products on its own (the panel stays in L1; the AVX-512 kernel takes two panels at a
//! time); the per-chunk matrices are shared by the panels, and the Gram products `[K; Q] Kᵀ`
//! by the value heads that read the same key head.
//! A job is one batch row and a range of key heads (or also a column range, when there are
//! too few for the threads); it walks the chunks, and within a chunk the key heads (a "unit"
//! is one chunk of one key head), so that neighbouring heads' rows, which share pages, are
//! read together. All products go through one register-blocked kernel (6 rows × 16 columns):
//! with AVX2+FMA detected at run time it uses intrinsics (with AVX-512, tiles of up to 12 rows
//! × 32 columns, computing the same bits), elsewhere a portable version of the same loops.
//! Rows of q, k, v and y are strided in memory (`[B, T, H, D]`), so each unit's
//! rows are gathered into contiguous scratch (aligned to cache lines); while a unit's products run, the next unit's rows
//! are prefetched and the previous unit's outputs written (non-temporal stores where aligned),
//! a little after each product. Scratch is per thread and reused; nothing is allocated per
//! chunk.
//!
//! Per token and value head this costs about `3·Dk·Dv + C·(Dv + Dk)` multiply-adds (the
//! sequential recurrence: `2·Dk·Dv`), almost all of them in the register-blocked products.
//!
//! `gemm` holds the products, `chunk` the work on one unit (and the data a job works in), `job`
//! the split into jobs and one job's walk over the chunks; `backward` (with `backward_chunk`)
//! the gradient of this form, chunk by chunk.

// The product kernels and the job code work on raw pointers into the per-thread scratch and
// the output buffers; their validity is established once per job (`run_job`'s contract) and
// per product (`Kernel::gemm`'s), not per operation.
#![allow(unsafe_op_in_unsafe_fn)]

mod backward;
mod backward_chunk;
mod chunk;
mod gemm;
mod job;

pub use backward::{
    chunked_backward, chunked_backward_into, chunked_backward_with, ChunkedGrads, ChunkedInputs,
    ChunkedOuts,
};

use chunk::Problem;
use gemm::NR;

use super::{Dims, Out, Rows, StateIn};
use crate::cpu::elem::Elem;
use crate::cpu::features;

pub use crate::node::gated_delta::ChunkSize;

// Every chunk is a whole number of the products' panels.
const _: () = assert!(ChunkSize::MULTIPLE == NR);

/// Which product kernel a call may use at most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// The fastest the CPU has (and `features::kernels()` allows): AVX-512, AVX2 + FMA, NEON
    /// or portable.
    Fastest,
    /// AVX2 + FMA where available, even on a CPU with AVX-512 (the same bits).
    Avx2,
    /// The portable kernel.
    Portable,
}

/// Knobs of the chunked kernel (tests and benchmarks vary them; callers use the default).
#[derive(Debug, Clone, Copy)]
pub struct ChunkedOptions {
    /// Tokens per chunk.
    pub chunk: ChunkSize,
    /// The fastest product kernel the call may use.
    pub products: Products,
}

impl Default for ChunkedOptions {
    fn default() -> Self {
        ChunkedOptions {
            chunk: ChunkSize::DEFAULT,
            products: Products::Fastest,
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
    let rows = Rows::dense(d.t, None);
    chunked_recurrence_rows(d, q, k, v, g, beta, state_in, mask, rows, y, state, opts)
}

/// As `chunked_recurrence_with`, for the rows `rows` gives (a pool node's table: each row's
/// tokens in the flattened token dimension, the state row it starts from and the one it ends
/// in; `state` is then the node's state output, in which rows not named are left alone).
#[allow(clippy::too_many_arguments)]
pub fn chunked_recurrence_rows<T: Elem>(
    d: Dims,
    q: &[T],
    k: &[T],
    v: &[T],
    g: &[f32],
    beta: &[f32],
    state_in: StateIn,
    mask: Option<&[u8]>,
    rows: Rows,
    y: &mut [T],
    state: &mut [f32],
    opts: ChunkedOptions,
) {
    assert!(
        d.hv == 0 || (d.hk > 0 && d.hv % d.hk == 0),
        "Hv = {} is not a multiple of Hk = {}",
        d.hv,
        d.hk
    );
    // The flattened tokens: B·T, or for a row table the furthest any row reaches.
    let tokens = match rows.is_table() {
        false => d.b * d.t,
        true => q.len() / (d.hk * d.dk).max(1),
    };
    for b in 0..d.b {
        assert!(
            rows.tok0(b) + rows.span(b) <= tokens,
            "row {b}'s tokens pass the input's end"
        );
        let _ = rows.len(b); // checked against the span
    }
    let qk_len = tokens * d.hk * d.dk;
    let v_len = tokens * d.hv * d.dv;
    let gate_len = tokens * d.hv;
    assert_eq!(q.len(), qk_len, "q has the wrong length");
    assert_eq!(k.len(), qk_len, "k has the wrong length");
    assert_eq!(v.len(), v_len, "v has the wrong length");
    assert_eq!(y.len(), v_len, "y has the wrong length");
    assert_eq!(g.len(), gate_len, "g has the wrong length");
    assert_eq!(beta.len(), gate_len, "beta has the wrong length");
    let state_row = d.hv * d.dv * d.dk;
    let fits = |len: usize, row: Option<usize>| row.is_none_or(|r| (r + 1) * state_row <= len);
    for b in 0..d.b {
        assert!(fits(state.len(), rows.dst(b)), "state has the wrong length");
        if let StateIn::Buffer(s) = state_in {
            assert!(fits(s.len(), rows.src(b)), "state_in has the wrong length");
        }
        if let StateIn::InPlace = state_in {
            assert!(fits(state.len(), rows.src(b)), "state has the wrong length");
        }
    }
    if !rows.is_table() {
        assert_eq!(state.len(), d.b * state_row, "state has the wrong length");
    }
    if let Some(m) = mask {
        assert_eq!(m.len(), tokens, "mask has the wrong length");
    }
    if d.b == 0 || d.hv == 0 || d.dv == 0 {
        // y and the state are empty.
        return;
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
        rows,
        chunk: opts.chunk.tokens(),
        group: d.hv / d.hk,
    };
    let f = features::kernels();
    let kernel = match opts.products {
        Products::Fastest if f.avx512() => job::KernelChoice::Avx512,
        Products::Fastest if f.neon => job::KernelChoice::Neon,
        Products::Fastest | Products::Avx2 if f.avx2_fma() => job::KernelChoice::Avx2,
        _ => job::KernelChoice::Portable,
    };
    // SAFETY: y and the state have the lengths checked above and stay borrowed for the call;
    // the kernel's features were detected.
    unsafe { job::run(&problem, Out::new(y, state), kernel) }
}

#[cfg(test)]
mod backward_tests;
