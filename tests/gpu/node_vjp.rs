//! MLX's autograd entry for the GPU kernel nodes (`GpuKernelWithVjp::vjp` → `mlxk_gpu_vjp` →
//! `ops::gpu_vjp`; docs/DESIGN.md §2.2 "Autograd on the GPU") without a GPU: the node's
//! gradient description made as the forward makes it, decoded, and its primals mapped to their
//! gradients, on MLX's CPU stream (`testing::gpu_node_vjp`).
//!
//! - The head split and the gated norm (their GPU gradients are MLX ops, which run on the CPU
//!   stream): every gradient against the explicit CPU backward (`mlxk_*_vjp`), within
//!   `bound · u · scale` (tests/support/grad.rs `check_paths`; 16-bit: 8, f32: 64), for the Metal
//!   and the CUDA descriptions.
//! - The recurrence: without a token its gradients are zeros and the state's is the cotangent's,
//!   for the fused-gate (CUDA) and the Metal primal orders, with one gradient per primal (T and
//!   the mask get zeros) in each primal's shape; with tokens the call reaches the backward
//!   kernel's launch, which MLX refuses on the CPU stream. On a GPU, tests/cpp/gpu_autograd.cc
//!   checks the whole path through `mx::vjp`.
//! - A description whose cotangents do not fit its node is refused with a message.

use crate::support::grad;

use crate::support::*;
use grad::{check_paths, read_as_f32, Float};
use mlxkern::capi::gated_rms_norm::mlxk_gated_rms_norm_vjp;
use mlxkern::capi::silu_rms_heads::mlxk_silu_rms_heads_vjp;
use mlxkern::testing::{gpu_node_vjp, GpuForward, GpuKernels};
use std::ptr::null_mut;

const KERNELS: [GpuKernels; 2] = [GpuKernels::Metal, GpuKernels::Cuda];

/// The values of `handles` (of the dtypes `expect` gives) as f32; frees the handles.
fn read_freed<S>(handles: &[H], expect: &[(S, Float)]) -> Vec<Vec<f32>> {
    let read = |(&h, (_, d)): (&H, &(S, Float))| {
        let v = read_as_f32(h, *d);
        free(h);
        v
    };
    handles.iter().zip(expect).map(read).collect()
}

fn bound(dtype: Float) -> f64 {
    if dtype == Float::F32 {
        64.0
    } else {
        8.0
    }
}

/// The autograd entry's gradients, read as f32 in `dtypes` (shapes checked against `shapes`).
fn autograd(
    forward: GpuForward,
    kernels: GpuKernels,
    node_args: &[H],
    primals: &[H],
    cotangents: &[H],
    expect: &[(Vec<i32>, Float)],
) -> Vec<Vec<f32>> {
    let c = |l: &[H]| l.iter().map(|&h| h as *const _).collect::<Vec<_>>();
    let mut outs = vec![null_mut(); primals.len()];
    ok(unsafe {
        gpu_node_vjp(
            forward,
            kernels,
            &c(node_args),
            &c(primals),
            &c(cotangents),
            &mut outs,
        )
    });
    outs.into_iter()
        .zip(expect)
        .map(|(h, (shape, dtype))| {
            assert_eq!(
                &shape_of(h),
                shape,
                "{forward:?} {kernels:?}: gradient shape"
            );
            let values = read_as_f32(h, *dtype);
            free(h);
            values
        })
        .collect()
}

#[test]
fn gated_norm_gradients_match_the_cpu_backward() {
    let mut rng = Rng::fresh();
    for (dtype, shape) in [(Float::F32, [5, 64]), (Float::Bf16, [3, 128])] {
        let n = shape[0] * shape[1];
        let (x, _) = dtype.array(&rng.vec(n as usize, 1.0), &shape);
        let (gate, _) = dtype.array(&rng.vec(n as usize, 2.0), &shape);
        let (weight, _) = dtype.array(&rng.vec(shape[1] as usize, 1.0), &[shape[1]]);
        let (dout, _) = dtype.array(&rng.vec(n as usize, 1.0), &shape);
        let eps = 1e-6;
        let mut cpu = [null_mut(); 3];
        let [c0, c1, c2] = &mut cpu;
        ok(unsafe { mlxk_gated_rms_norm_vjp(x, gate, weight, eps, dout, c0, c1, c2) });
        let expect = [
            (shape.to_vec(), dtype),
            (shape.to_vec(), dtype),
            (vec![shape[1]], dtype),
        ];
        let cpu = read_freed(&cpu, &expect);
        for kernels in KERNELS {
            let forward = GpuForward::GatedRmsNorm { eps };
            let arrays = [x, gate, weight];
            let gpu = autograd(forward, kernels, &arrays, &arrays, &[dout], &expect);
            for (i, name) in ["dx", "dgate", "dweight"].iter().enumerate() {
                let what = format!("gated norm {} {kernels:?} {name}", dtype.name());
                check_paths(&what, dtype.unit(), bound(dtype), &cpu[i], &gpu[i]);
            }
        }
        free_all(&[x, gate, weight, dout]);
    }
}

#[test]
fn head_split_gradients_match_the_cpu_backward() {
    let mut rng = Rng::fresh();
    let (hk, hv, dk, dv) = (2, 4, 64, 32);
    let (b, s) = (2, 3);
    let channels = 2 * hk * dk + hv * dv;
    for dtype in [Float::F32, Float::Bf16] {
        let shape = [b, s, channels];
        let (x, _) = dtype.array(&rng.vec((b * s * channels) as usize, 1.5), &shape);
        let (q_scale, _) = dtype.array(&rng.vec(dk as usize, 1.0), &[dk]);
        let (k_scale, _) = dtype.array(&rng.vec(dk as usize, 1.0), &[dk]);
        let qk = [b, s, hk, dk];
        let vs = [b, s, hv, dv];
        let (dq, _) = dtype.array(&rng.vec((b * s * hk * dk) as usize, 1.0), &qk);
        let (dkk, _) = dtype.array(&rng.vec((b * s * hk * dk) as usize, 1.0), &qk);
        let (dvv, _) = dtype.array(&rng.vec((b * s * hv * dv) as usize, 1.0), &vs);
        let eps = 1e-6;
        let mut cpu = [null_mut(); 3];
        let [c0, c1, c2] = &mut cpu;
        ok(unsafe {
            mlxk_silu_rms_heads_vjp(
                x, q_scale, k_scale, hk, hv, dv, eps, dq, dkk, dvv, c0, c1, c2,
            )
        });
        let expect = [
            (shape.to_vec(), dtype),
            (vec![dk], dtype),
            (vec![dk], dtype),
        ];
        let cpu = read_freed(&cpu, &expect);
        for kernels in KERNELS {
            let forward = GpuForward::SiluRmsHeads {
                key_heads: hk,
                value_heads: hv,
                value_width: dv,
                eps,
            };
            let arrays = [x, q_scale, k_scale];
            let gpu = autograd(forward, kernels, &arrays, &arrays, &[dq, dkk, dvv], &expect);
            for (i, name) in ["dx", "dq_scale", "dk_scale"].iter().enumerate() {
                let what = format!("head split {} {kernels:?} {name}", dtype.name());
                check_paths(&what, dtype.unit(), bound(dtype), &cpu[i], &gpu[i]);
            }
        }
        free_all(&[x, q_scale, k_scale, dq, dkk, dvv]);
    }
}

/// The recurrence's arrays for a forward with T tokens: the caller's (q, k, v, a, b, a_log,
/// dt_bias, state, mask) and the launch-only ones (g, beta; T comes with k's shape).
struct Recurrence {
    dims: [i32; 6], // B, T, Hk, Hv, Dk, Dv
    caller: [H; 9],
    g: H,
    beta: H,
    dy: H,
    dstate: H,
}

impl Recurrence {
    fn new(rng: &mut Rng, dims: [i32; 6], masked: bool) -> Recurrence {
        let [b, t, hk, hv, dk, dv] = dims;
        let n = |s: &[i32]| s.iter().product::<i32>() as usize;
        let f = |rng: &mut Rng, s: &[i32], scale: f32| new_f32(&rng.vec(n(s), scale), s);
        let gates = [b, t, hv];
        let mask = if masked {
            new_bool(&(0..b * t).map(|i| i % 3 != 1).collect::<Vec<_>>(), &[b, t])
        } else {
            null_mut()
        };
        let caller = [
            f(rng, &[b, t, hk, dk], 0.2),
            f(rng, &[b, t, hk, dk], 0.2),
            f(rng, &[b, t, hv, dv], 1.0),
            f(rng, &gates, 1.0),
            f(rng, &gates, 1.0),
            f(rng, &[hv], 0.5),
            f(rng, &[hv], 0.5),
            f(rng, &[b, hv, dv, dk], 0.3),
            mask,
        ];
        Recurrence {
            dims,
            g: f(rng, &gates, 0.5),
            beta: f(rng, &gates, 0.5),
            dy: f(rng, &[b, t, hv, dv], 1.0),
            dstate: f(rng, &[b, hv, dv, dk], 1.0),
            caller,
        }
    }

    /// The launch's primals: the CUDA launch's with fused gates, or the Metal launch's.
    fn primals(&self, fused: bool) -> Vec<H> {
        let [q, k, v, a, b, a_log, dt_bias, state, mask] = self.caller;
        let mut p = if fused {
            vec![q, k, v, a, b, state]
        } else {
            vec![q, k, v, self.g, self.beta, state]
        };
        if !mask.is_null() {
            p.push(mask);
        }
        if fused {
            p.extend([a_log, dt_bias]);
        }
        p
    }

    /// `gpu_node_vjp` of the recurrence's node: its status and the gradients of `primals`.
    fn node_vjp(
        &self,
        forward: GpuForward,
        kernels: GpuKernels,
        primals: &[H],
        cotangents: &[H],
    ) -> (mlxk_status, Vec<H>) {
        let c = |l: &[H]| l.iter().map(|&h| h as *const _).collect::<Vec<_>>();
        let mut outs = vec![null_mut(); primals.len()];
        let (caller, primals, cotangents) = (c(&self.caller), c(primals), c(cotangents));
        let status =
            unsafe { gpu_node_vjp(forward, kernels, &caller, &primals, &cotangents, &mut outs) };
        (status, outs)
    }

    fn free(self) {
        for h in self
            .caller
            .into_iter()
            .chain([self.g, self.beta, self.dy, self.dstate])
        {
            if !h.is_null() {
                free(h);
            }
        }
    }
}

#[test]
fn the_recurrence_without_tokens_gives_zeros_and_passes_the_state_gradient() {
    let mut rng = Rng::fresh();
    for masked in [false, true] {
        let r = Recurrence::new(&mut rng, [2, 0, 1, 2, 32, 4], masked);
        for (kernels, fused) in [(GpuKernels::Cuda, true), (GpuKernels::Metal, false)] {
            let primals = r.primals(fused);
            let expect: Vec<(Vec<i32>, Float)> =
                primals.iter().map(|&h| (shape_of(h), Float::F32)).collect();
            let forward = GpuForward::GatedDelta { fused, masked };
            let (status, outs) = r.node_vjp(forward, kernels, &primals, &[r.dy, r.dstate]);
            ok(status);
            let dstate_out = read_f32(r.dstate);
            for (i, (&g, (shape, _))) in outs.iter().zip(&expect).enumerate() {
                assert_eq!(
                    &shape_of(g),
                    shape,
                    "{forward:?}: primal {i}'s gradient shape"
                );
                if primals[i] == r.caller[8] {
                    // The mask (bool) gets zeros of its own dtype.
                    assert_eq!(dtype_of(g), dtype_of(primals[i]), "{forward:?}: primal {i}");
                    free(g);
                    continue;
                }
                let values = read_f32(g);
                if primals[i] == r.caller[7] {
                    assert_eq!(values, dstate_out, "{forward:?}: dstate is dstate_out");
                } else {
                    assert_zeros(&values, &format!("{forward:?}: primal {i}"));
                }
                free(g);
            }
        }
        r.free();
    }
}

#[test]
fn the_recurrence_with_tokens_reaches_the_backward_kernel() {
    let mut rng = Rng::fresh();
    let r = Recurrence::new(&mut rng, [1, 5, 1, 2, 32, 8], true);
    for (kernels, fused, launch, back_end) in [
        (GpuKernels::Cuda, true, "cuda_kernel", "No CUDA back-end"),
        (
            GpuKernels::Metal,
            false,
            "metal_kernel",
            "No Metal back-end",
        ),
    ] {
        let primals = r.primals(fused);
        let forward = GpuForward::GatedDelta {
            fused,
            masked: true,
        };
        let (status, outs) = r.node_vjp(forward, kernels, &primals, &[r.dy, r.dstate]);
        expect_err(status, MLXK_ERR_BACKEND, &[launch, back_end]);
        assert!(outs.iter().all(|h| h.is_null()));
    }
    r.free();
}

#[test]
fn cotangents_that_do_not_fit_the_node_are_refused() {
    let mut rng = Rng::fresh();
    let r = Recurrence::new(&mut rng, [1, 0, 1, 1, 32, 4], false);
    let primals = r.primals(true);
    let forward = GpuForward::GatedDelta {
        fused: true,
        masked: false,
    };
    let (status, _) = r.node_vjp(forward, GpuKernels::Cuda, &primals, &[r.dy]);
    expect_err(
        status,
        MLXK_ERR_BACKEND,
        &["gradient description is malformed"],
    );
    let _ = r.dims;
    r.free();
}
