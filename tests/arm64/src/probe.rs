//! What `bin/kernel_probe` runs: kernel calls at Qwen3.5's head width on this machine's
//! fastest kernels or the portable ones (`scripts/arm64/insn-counts.sh` counts the instructions
//! qemu executes for it).

use std::sync::atomic::Ordering;

use half::bf16;

use crate::cpu::features;
use crate::cpu::gated_delta::chunked::chunked_recurrence;
use crate::cpu::gated_delta::Dims;
use crate::cpu::{gated_rms_norm, silu_rms_heads};
use crate::dtype::Dtype;
use crate::node::gated_delta::{self as node, Form, GateDtypes, Node};
use crate::node::Words;

/// Forces the portable kernels (true) or lets the fastest run (false).
pub fn force_portable(on: bool) {
    crate::seams::switches::FORCE_PORTABLE.store(on, Ordering::Relaxed);
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 8) as f32 / 16777216.0 - 0.5
        })
        .collect()
}

/// The sizes of one call of each kernel: (units of work, what a unit is).
pub fn work(kernel: &str) -> (usize, &'static str) {
    match kernel {
        "exact" => (T * DV * DK, "state element · token"),
        "decode" => (DECODE_HV * 128 * DK, "state element · token"),
        "chunked" => (T * DV * DK, "state element · token"),
        "heads" => (ROWS * (3 * 128), "column"),
        "norm" => (ROWS * 128, "column"),
        _ => panic!("kernels: exact, decode, chunked, heads, norm"),
    }
}

const T: usize = 64;
const DK: usize = 128;
const DV: usize = 16;
const ROWS: usize = 16;
/// Value heads of the decode step (of Dv = 128).
const DECODE_HV: usize = 2;

/// One call of `kernel`, its inputs made once (only the call is repeated).
pub fn call(kernel: &str) -> Box<dyn FnMut()> {
    match kernel {
        "exact" => exact(T, 1, DV),
        "decode" => exact(1, DECODE_HV, 128),
        "chunked" => chunked(),
        "heads" => heads(),
        "norm" => norm(),
        _ => panic!("kernels: exact, decode, chunked, heads, norm"),
    }
}

/// The exact update, f32, from a state: `t` tokens of `hv` value heads of `dv` rows.
fn exact(t: usize, hv: usize, dv: usize) -> Box<dyn FnMut()> {
    let dims = node::Dims {
        b: 1,
        t,
        hk: 1,
        hv,
        dk: DK,
        dv,
    };
    let n = Node {
        dims,
        dtype: Dtype::Float32,
        gates: GateDtypes::default(),
        has_state: true,
        has_mask: false,
        form: Form::Exact,
        pool: None,
    };
    let bytes = |v: Vec<f32>| -> Vec<u32> { v.into_iter().map(f32::to_bits).collect() };
    let inputs = [
        bytes(values(t * DK, 1)),
        bytes(values(t * DK, 2)),
        bytes(values(t * hv * dv, 3)),
        bytes(values(t * hv, 4)),
        bytes(values(t * hv, 5)),
        bytes(values(hv, 6)),
        bytes(values(hv, 7)),
        bytes(values(hv * dv * DK, 8)),
    ];
    let mut outputs = [vec![0u32; t * hv * dv], vec![0u32; hv * dv * DK]];
    let params = n.encode();
    Box::new(move || {
        let ptrs: Vec<usize> = inputs.iter().map(|b| b.as_ptr() as usize).collect();
        let lens: Vec<usize> = inputs.iter().map(|b| 4 * b.len()).collect();
        let out_lens: Vec<usize> = outputs.iter().map(|b| 4 * b.len()).collect();
        let out_ptrs: Vec<usize> = outputs
            .iter_mut()
            .map(|b| b.as_mut_ptr() as usize)
            .collect();
        // SAFETY: live, distinct buffers of the node's sizes.
        unsafe {
            crate::cpu::mlxk_cpu_kernel(
                n.kernel() as u32,
                &params,
                &ptrs,
                &lens,
                &out_ptrs,
                &out_lens,
                &[-1, -1],
                &[-1, -1],
                "",
            )
        }
        .expect("the exact update");
        std::hint::black_box(&outputs);
    })
}

/// The chunked update, f32, the same problem.
fn chunked() -> Box<dyn FnMut()> {
    let d = Dims {
        b: 1,
        t: T,
        hk: 1,
        hv: 1,
        dk: DK,
        dv: DV,
    };
    let (q, k, v) = (values(T * DK, 1), values(T * DK, 2), values(T * DV, 3));
    let g: Vec<f32> = values(T, 4).iter().map(|x| 0.9 + 0.1 * x).collect();
    let beta: Vec<f32> = values(T, 5).iter().map(|x| 0.5 + x).collect();
    let state_in = values(DV * DK, 8);
    let (mut y, mut state) = (vec![0f32; T * DV], vec![0f32; DV * DK]);
    Box::new(move || {
        let init = Some(&state_in[..]);
        chunked_recurrence(d, &q, &k, &v, &g, &beta, init, None, &mut y, &mut state);
        std::hint::black_box((&y, &state));
    })
}

/// The head split, bf16, ROWS rows of Hk = 1, Hv = 1 heads of 128.
fn heads() -> Box<dyn FnMut()> {
    let d = silu_rms_heads::Dims {
        rows: ROWS,
        hk: 1,
        hv: 1,
        dk: 128,
        dv: 128,
    };
    let x: Vec<bf16> = values(ROWS * 384, 9)
        .iter()
        .map(|&v| bf16::from_f32(4.0 * v))
        .collect();
    let scale: Vec<bf16> = values(128, 10).iter().map(|&v| bf16::from_f32(v)).collect();
    let (mut q, mut k, mut v) = (
        vec![bf16::ZERO; ROWS * 128],
        vec![bf16::ZERO; ROWS * 128],
        vec![bf16::ZERO; ROWS * 128],
    );
    Box::new(move || {
        silu_rms_heads::split(d, 1e-6, &x, &scale, &scale, &mut q, &mut k, &mut v);
        std::hint::black_box((&q, &k, &v));
    })
}

/// The gated norm, bf16 x and gate, ROWS rows of 128.
fn norm() -> Box<dyn FnMut()> {
    let x: Vec<bf16> = values(ROWS * 128, 11)
        .iter()
        .map(|&v| bf16::from_f32(v))
        .collect();
    let gate: Vec<bf16> = values(ROWS * 128, 12)
        .iter()
        .map(|&v| bf16::from_f32(4.0 * v))
        .collect();
    let w: Vec<bf16> = values(128, 13).iter().map(|&v| bf16::from_f32(v)).collect();
    let mut out = vec![bf16::ZERO; ROWS * 128];
    Box::new(move || {
        gated_rms_norm::norm(128, 1e-6, &x, &gate, &w, &mut out);
        std::hint::black_box(&out);
    })
}
