//! The gates, fused into the update: beta = sigmoid(b) and
//! g = exp(-exp(A_log) · softplus(a + dt_bias)) are computed here with MLX's CPU formulas and
//! rounding points (`cpu::math`), so one kernel node replaces seven MLX ops and stays
//! bit-identical to `mlxk_compute_g`.

use half::{bf16, f16};

use crate::cpu::elem::Elem;
use crate::cpu::features;
use crate::cpu::math::{exp, sigmoid, softplus};
use crate::cpu::pool::{self, SharedMut};
use crate::cpu::typed;
use crate::dtype::Dtype;

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
