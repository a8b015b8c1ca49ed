//! `make test-cuda`: every kernel on an MLX CUDA GPU against the CPU kernels, through the C ABI
//! (docs/DESIGN.md §3 "MLX CUDA", §6). Skips with a message where the loaded MLX has no CUDA
//! backend (CI, `mlx[cpu]`).
//!
//! What must hold:
//! - head split, gated norm: bit-identical (their transcendentals are inside the kernel text,
//!   where kernels/cuda/metal_compat.cuh gives MLX's CPU formulas);
//! - recurrence and replay with g and beta made by MLX's CPU ops and read by the kernel
//!   (`testing::gpu_gates_on_cpu`, the Metal launch's form): bit-identical. With the library's
//!   own CUDA path, whose kernel computes the gates (kernels/cuda/gates.cuh: MLX's CPU formulas
//!   except CUDA's log1pf for glibc's), only gates whose log1p rounds differently can differ;
//!   the bound is `gate_bound` below, and every case prints how many outputs differ;
//! - replay over the whole window equals the update's state, bit for bit, on the GPU;
//! - the pool calls (update, packed, verify then commit, replay: tests/cuda/pool.rs) the same
//!   way against the CPU pool calls, every slot of the new pool compared;
//! - the chunked form's GPU backward (tests/cuda/chunked_grad.rs) within bounds of the CPU
//!   backward and of a float64 backward, T up to 4096;
//! - a 40-step decode loop (each state feeding the next step) equals the CPU loop's bits;
//! - the chunked form (tests/cuda/chunked.rs) within docs/DESIGN.md §4's chunked bounds of the
//!   exact update, of the CPU chunked form and of a float64 recurrence;
//! - argument errors (the chunk size's too) and the memory limit are unchanged with the GPU as
//!   default device.
//!
//! Run it alone (`--test-threads=1`): the default device is process-wide.

#[path = "../support/mod.rs"]
mod support;

mod chunked;
mod chunked_grad;
mod pool;
mod syntax;
mod text;
mod tiles;
use crate::support::*;
use mlxkern::capi::gated_delta::mlxk_gated_delta_update_from_conv;
use mlxkern::capi::gated_rms_norm::mlxk_gated_rms_norm;
use mlxkern::capi::silu_rms_heads::mlxk_silu_rms_heads;
use mlxkern::testing::{from_conv_one_kernel_any_tokens, gpu_gates_on_cpu};
use std::ptr::null_mut;

fn cuda() -> bool {
    mlxk_gpu_backend() == MLXK_GPU_CUDA
}

fn on_gpu(gpu: bool) {
    ok(mlxk_set_default_device(if gpu {
        MLXK_DEVICE_GPU
    } else {
        MLXK_DEVICE_CPU
    }));
}

/// `dims` = B, T, Hk, Hv, Dk, Dv as a label.
fn dims_label(dims: [usize; 6]) -> String {
    let [b, t, hk, hv, dk, dv] = dims;
    format!("B={b} T={t} Hk={hk} Hv={hv} Dk={dk} Dv={dv}")
}

fn half_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exp = ((h >> 10) & 0x1F) as i32;
    let man = (h & 0x3FF) as f32;
    sign * match exp {
        0 => man * 2f32.powi(-24),
        31 if man == 0.0 => f32::INFINITY,
        31 => f32::NAN,
        e => (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    }
}

fn values(a: H) -> Vec<f64> {
    let bytes = read_bytes(a);
    match dtype_of(a) {
        MLXK_DTYPE_FLOAT32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]) as f64)
            .collect(),
        MLXK_DTYPE_BFLOAT16 => bytes
            .chunks_exact(2)
            .map(|c| bf16_to_f32(u16::from_ne_bytes([c[0], c[1]])) as f64)
            .collect(),
        MLXK_DTYPE_FLOAT16 => bytes
            .chunks_exact(2)
            .map(|c| half_to_f32(u16::from_ne_bytes([c[0], c[1]])) as f64)
            .collect(),
        d => panic!("unexpected dtype {d}"),
    }
}

/// How a GPU output compares with the CPU reference: elements with different bits, and the
/// largest difference relative to the reference's largest magnitude.
struct Diff {
    differ: usize,
    total: usize,
    rel: f64,
}

fn diff(reference: H, gpu: H) -> Diff {
    assert_eq!(shape_of(reference), shape_of(gpu));
    assert_eq!(dtype_of(reference), dtype_of(gpu));
    let (rb, gb) = (read_bytes(reference), read_bytes(gpu));
    let size = rb.len() / values(reference).len().max(1);
    let differ = rb
        .chunks(size.max(1))
        .zip(gb.chunks(size.max(1)))
        .filter(|(a, b)| a != b)
        .count();
    let (r, g) = (values(reference), values(gpu));
    let scale = r.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    let worst = r
        .iter()
        .zip(&g)
        .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
    Diff {
        differ,
        total: r.len(),
        rel: worst / scale,
    }
}

#[track_caller]
fn assert_identical(what: &str, reference: H, gpu: H) {
    let d = diff(reference, gpu);
    assert_eq!(
        d.differ, 0,
        "{what}: {} of {} elements differ from the CPU kernel (max rel {:.3e})",
        d.differ, d.total, d.rel
    );
}

/// The bound for the fused CUDA gates: a softplus whose log1p rounds differently is one ulp of
/// the gate inputs' dtype off (2^-8 bf16, 2^-11 f16, 2^-24 f32), which moves g by at most that
/// relative amount times |exp(-exp(A_log)) softplus| (≤ 4.5 here) and the state by that times
/// the decay's memory (≤ ~100 tokens for these inputs); y in a 16-bit dtype may then round to
/// its neighbour. So: one ulp of the dtype for the state, two for y, plus 1e-4 for f32
/// accumulation. Measured figures are printed per case.
fn gate_bound(dtype: mlxk_dtype, y: bool) -> f64 {
    let ulp = match dtype {
        MLXK_DTYPE_BFLOAT16 => 2f64.powi(-8),
        MLXK_DTYPE_FLOAT16 => 2f64.powi(-11),
        _ => 0.0,
    };
    if y {
        2.0 * ulp + 1e-4
    } else {
        ulp + 1e-4
    }
}

fn dtype_name(d: mlxk_dtype) -> &'static str {
    match d {
        MLXK_DTYPE_FLOAT32 => "f32",
        MLXK_DTYPE_BFLOAT16 => "bf16",
        MLXK_DTYPE_FLOAT16 => "f16",
        _ => "?",
    }
}

/// `data` as an array of `dtype` (made on the CPU and evaluated).
struct Update {
    dtype: mlxk_dtype,
    h: [H; 9], // q k v a b a_log dt_bias state mask (state, mask may be null)
}

impl Update {
    fn random(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype, state: bool, mask: bool) -> Self {
        let [b, t, hk, hv, dk, dv] = dims;
        let (bi, ti, hki, hvi, dki, dvi) = (
            b as i32, t as i32, hk as i32, hv as i32, dk as i32, dv as i32,
        );
        let q = heads(rng, b * t * hk * dk, dk, (dk as f32).powf(-0.5));
        let k = heads(rng, b * t * hk * dk, dk, 1.0);
        let h = [
            typed(&q, &[bi, ti, hki, dki], dtype),
            typed(&k, &[bi, ti, hki, dki], dtype),
            typed(&rng.vec(b * t * hv * dv, 1.0), &[bi, ti, hvi, dvi], dtype),
            typed(&rng.vec(b * t * hv, 3.0), &[bi, ti, hvi], dtype),
            typed(&rng.vec(b * t * hv, 3.0), &[bi, ti, hvi], dtype),
            new_f32(&rng.vec(hv, 1.5), &[hvi]),
            typed(&rng.vec(hv, 1.0), &[hvi], dtype),
            if state {
                new_f32(&rng.vec(b * hv * dv * dk, 0.5), &[bi, hvi, dvi, dki])
            } else {
                null_mut()
            },
            if mask {
                // Row 0 fully masked, the others at random.
                let m: Vec<bool> = (0..b * t).map(|i| i >= t && rng.below(4) != 0).collect();
                new_bool(&m, &[bi, ti])
            } else {
                null_mut()
            },
        ];
        Update { dtype, h }
    }

    fn run(&self) -> (H, H) {
        let [q, k, v, a, b, al, dt, s, m] = self.h.map(|h| h as *const mlxk_array);
        let (mut y, mut st) = (null_mut(), null_mut());
        ok(unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st) });
        ok(mlxk_array_eval(y));
        ok(mlxk_array_eval(st));
        (y, st)
    }

    fn replay(&self, lengths: &[i32]) -> H {
        let (status, out) = replay(self.h.map(|h| h as *const mlxk_array), lengths);
        ok(status);
        ok(mlxk_array_eval(out));
        out
    }

    fn free(self) {
        for h in self.h {
            if !h.is_null() {
                free(h);
            }
        }
    }
}

fn recurrence(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype, state: bool, mask: bool) {
    let u = Update::random(rng, dims, dtype, state, mask);
    let label = format!(
        "update {} {} state={state} mask={mask}",
        dtype_name(dtype),
        dims_label(dims)
    );
    on_gpu(false);
    let (y0, s0) = u.run();
    on_gpu(true);
    gpu_gates_on_cpu(true);
    let (y1, s1) = u.run();
    assert_identical(&format!("{label}: y (CPU gates)"), y0, y1);
    assert_identical(&format!("{label}: state (CPU gates)"), s0, s1);
    gpu_gates_on_cpu(false);
    let (y2, s2) = u.run();
    let (dy, ds) = (diff(y0, y2), diff(s0, s2));
    println!(
        "PASS: {label}: bit-identical with CPU-op gates ({} y, {} state values); with the fused \
         CUDA gates y {}/{} differ (max rel {:.2e}), state {}/{} (max rel {:.2e})",
        dy.total, ds.total, dy.differ, dy.total, dy.rel, ds.differ, ds.total, ds.rel
    );
    assert!(
        dy.rel <= gate_bound(u.dtype, true),
        "{label}: y {:.3e} over the bound",
        dy.rel
    );
    assert!(
        ds.rel <= gate_bound(u.dtype, false),
        "{label}: state {:.3e}",
        ds.rel
    );
    // The replay: CPU vs GPU at random lengths, and the whole window equal to the update's state.
    let t = dims[1] as i32;
    let lengths: Vec<i32> = (0..dims[0])
        .map(|_| rng.below(t as u64 + 1) as i32)
        .collect();
    on_gpu(false);
    let r0 = u.replay(&lengths);
    on_gpu(true);
    gpu_gates_on_cpu(true);
    let r1 = u.replay(&lengths);
    assert_identical(&format!("{label}: replay {lengths:?}"), r0, r1);
    gpu_gates_on_cpu(false);
    if !mask {
        let whole = u.replay(&vec![t; dims[0]]);
        assert_identical(
            &format!("{label}: replay of all T vs the update"),
            s2,
            whole,
        );
        free(whole);
    }
    on_gpu(false);
    for h in [y0, s0, y1, s1, y2, s2, r0, r1] {
        free(h);
    }
    u.free();
}

fn head_split(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype) {
    let [b, s, hk, hv, dk, dv] = dims;
    let c = 2 * hk * dk + hv * dv;
    let x = typed(
        &rng.vec(b * s * c, 4.0),
        &[b as i32, s as i32, c as i32],
        dtype,
    );
    let qs = typed(&rng.vec(dk, 1.0), &[dk as i32], dtype);
    let ks = typed(&rng.vec(dk, 1.0), &[dk as i32], dtype);
    let run = || {
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        ok(unsafe {
            mlxk_silu_rms_heads(
                x, qs, ks, hk as i32, hv as i32, dv as i32, 1e-6, &mut q, &mut k, &mut v,
            )
        });
        for h in [q, k, v] {
            ok(mlxk_array_eval(h));
        }
        [q, k, v]
    };
    on_gpu(false);
    let cpu = run();
    on_gpu(true);
    let gpu = run();
    on_gpu(false);
    let label = format!(
        "head split {} B={b} S={s} Hk={hk} Hv={hv} Dk={dk} Dv={dv}",
        dtype_name(dtype)
    );
    for (i, name) in ["q", "k", "v"].iter().enumerate() {
        assert_identical(&format!("{label}: {name}"), cpu[i], gpu[i]);
    }
    println!("PASS: {label}: q, k, v bit-identical to the CPU kernel");
    for h in cpu.into_iter().chain(gpu).chain([x, qs, ks]) {
        free(h);
    }
}

/// `mlxk_gated_delta_update_from_conv`: one GPU node computing the head split inside the
/// recurrence. With CPU-op gates it equals the CPU (the two CPU kernels) bit for bit; with the
/// CUDA path's own gates it equals the two GPU calls it stands for bit for bit.
fn from_conv(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype, state: bool, mask: bool) {
    let [b, t, hk, hv, dk, dv] = dims;
    let h = from_conv_arrays(rng, dims, dtype, state, mask);
    let (hvi, dvi) = (hv as i32, dv as i32);
    let [x, qsh, ksh, a, bh, al, dt, s, m] = h.map(|h| h as *const mlxk_array);
    let (hki, eps) = (hk as i32, 1e-6 / dk as f32);
    let fused = || {
        let (mut y, mut st) = (null_mut(), null_mut());
        ok(unsafe {
            mlxk_gated_delta_update_from_conv(
                x, qsh, ksh, hki, hvi, dvi, eps, a, bh, al, dt, s, m, &mut y, &mut st,
            )
        });
        ok(mlxk_array_eval(y));
        ok(mlxk_array_eval(st));
        (y, st)
    };
    let composed = || {
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        ok(unsafe { mlxk_silu_rms_heads(x, qsh, ksh, hki, hvi, dvi, eps, &mut q, &mut k, &mut v) });
        let (mut y, mut st) = (null_mut(), null_mut());
        ok(unsafe { mlxk_gated_delta_update(q, k, v, a, bh, al, dt, s, m, &mut y, &mut st) });
        ok(mlxk_array_eval(y));
        ok(mlxk_array_eval(st));
        for h in [q, k, v] {
            free(h);
        }
        (y, st)
    };
    let label = format!(
        "from conv {} B={b} T={t} Hk={hk} Hv={hv} Dk={dk} Dv={dv} state={state} mask={mask}",
        dtype_name(dtype)
    );
    on_gpu(false);
    let (y0, s0) = fused();
    on_gpu(true);
    // The one kernel at every T (the library takes it on CUDA for 1 to 8 tokens and at most 32
    // (batch, token) pairs, the two kernels beyond).
    from_conv_one_kernel_any_tokens(true);
    gpu_gates_on_cpu(true);
    let (y1, s1) = fused();
    assert_identical(&format!("{label}: y (CPU gates) vs the CPU"), y0, y1);
    assert_identical(&format!("{label}: state (CPU gates) vs the CPU"), s0, s1);
    gpu_gates_on_cpu(false);
    let (y2, s2) = fused();
    from_conv_one_kernel_any_tokens(false);
    let (y3, s3) = composed();
    assert_identical(&format!("{label}: y vs the two GPU calls"), y3, y2);
    assert_identical(&format!("{label}: state vs the two GPU calls"), s3, s2);
    let (y4, s4) = fused();
    assert_identical(
        &format!("{label}: y, the library's choice of kernels"),
        y3,
        y4,
    );
    assert_identical(
        &format!("{label}: state, the library's choice of kernels"),
        s3,
        s4,
    );
    free(y4);
    free(s4);
    on_gpu(false);
    println!(
        "PASS: {label}: bit-identical to the CPU (CPU-op gates) and to the head split then the \
         update on the GPU"
    );
    for h in [y0, s0, y1, s1, y2, s2, y3, s3]
        .into_iter()
        .chain(h.into_iter().filter(|h| !h.is_null()))
    {
        free(h);
    }
}

fn gated_norm(rng: &mut Rng, rows: usize, d: usize, dtype: mlxk_dtype, gate: mlxk_dtype) {
    let shape = [rows as i32, d as i32];
    let x = typed(&rng.vec(rows * d, 3.0), &shape, dtype);
    let z = typed(&rng.vec(rows * d, 4.0), &shape, gate);
    let w = typed(&rng.vec(d, 1.5), &[d as i32], dtype);
    let run = || {
        let mut out = null_mut();
        ok(unsafe { mlxk_gated_rms_norm(x, z, w, 1e-6, &mut out) });
        ok(mlxk_array_eval(out));
        out
    };
    on_gpu(false);
    let cpu = run();
    on_gpu(true);
    let gpu = run();
    on_gpu(false);
    let label = format!(
        "gated norm {} gate {} rows={rows} D={d}",
        dtype_name(dtype),
        dtype_name(gate)
    );
    assert_identical(&label, cpu, gpu);
    println!("PASS: {label}: bit-identical to the CPU kernel");
    for h in [cpu, gpu, x, z, w] {
        free(h);
    }
}

/// 40 chained decode steps, each state feeding the next, on both devices.
fn decode_loop(rng: &mut Rng) {
    let dims = [4, 1, 16, 32, 128, 128];
    let steps: Vec<Update> = (0..40)
        .map(|_| Update::random(rng, dims, MLXK_DTYPE_BFLOAT16, false, false))
        .collect();
    let chain = |gpu: bool| {
        on_gpu(gpu);
        let mut state = new_f32(&vec![0.0; 4 * 32 * 128 * 128], &[4, 32, 128, 128]);
        let mut ys = Vec::new();
        for u in &steps {
            let [q, k, v, a, b, al, dt, _, _] = u.h.map(|h| h as *const mlxk_array);
            let (mut y, mut next) = (null_mut(), null_mut());
            ok(unsafe {
                mlxk_gated_delta_update(q, k, v, a, b, al, dt, state, null_mut(), &mut y, &mut next)
            });
            free(state);
            state = next;
            ys.push(y);
        }
        ok(mlxk_array_eval(state));
        on_gpu(false);
        (ys, state)
    };
    gpu_gates_on_cpu(true);
    let (cpu_ys, cpu_state) = chain(false);
    let (gpu_ys, gpu_state) = chain(true);
    gpu_gates_on_cpu(false);
    assert_identical("decode loop: final state", cpu_state, gpu_state);
    for (i, (a, b)) in cpu_ys.iter().zip(&gpu_ys).enumerate() {
        assert_identical(&format!("decode loop: y of step {i}"), *a, *b);
    }
    println!("PASS: 40 chained decode steps (B=4, Qwen3.5 dims): every y and the final state bit-identical");
    for h in cpu_ys
        .into_iter()
        .chain(gpu_ys)
        .chain([cpu_state, gpu_state])
    {
        free(h);
    }
    steps.into_iter().for_each(Update::free);
}

fn errors_on_the_gpu(rng: &mut Rng) {
    on_gpu(true);
    let u = Update::random(rng, [2, 8, 2, 4, 64, 32], MLXK_DTYPE_BFLOAT16, true, false);
    let [q, k, v, a, b, al, dt, s, m] = u.h.map(|h| h as *const mlxk_array);
    let (mut y, mut st) = (null_mut(), null_mut());
    expect_err(
        unsafe { mlxk_gated_delta_update(v, k, v, a, b, al, dt, s, m, &mut y, &mut st) },
        MLXK_ERR_SHAPE,
        &["q"],
    );
    ok(mlxk_set_memory_limit(1024));
    expect_err(
        unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st) },
        MLXK_ERR_OUT_OF_MEMORY,
        &[],
    );
    ok(mlxk_set_memory_limit(0));
    expect_err(
        unsafe {
            mlxk_gated_delta_update_chunked(q, k, v, a, b, al, dt, s, m, 24, &mut y, &mut st)
        },
        MLXK_ERR_INVALID_ARGUMENT,
        &["chunk_size"],
    );
    on_gpu(false);
    u.free();
    println!("PASS: shape errors, the chunk size's and the memory limit unchanged on the GPU");
}

/// mlxk_compute_g on both devices: how many gates MLX CUDA's ops round differently.
fn gates(rng: &mut Rng) {
    let n = 1 << 16;
    let a_log = new_f32(&rng.vec(32, 1.5), &[32]);
    let a = typed(&rng.vec(n * 32, 4.0), &[n as i32, 32], MLXK_DTYPE_BFLOAT16);
    let dt = typed(&rng.vec(32, 1.0), &[32], MLXK_DTYPE_BFLOAT16);
    let g = |gpu: bool| {
        on_gpu(gpu);
        let mut out = null_mut();
        ok(unsafe { mlxk_compute_g(a_log, a, dt, &mut out) });
        ok(mlxk_array_eval(out));
        on_gpu(false);
        out
    };
    let (cpu, gpu) = (g(false), g(true));
    let d = diff(cpu, gpu);
    let (c, x) = (read_f32(cpu), read_f32(gpu));
    let ulps = c
        .iter()
        .zip(&x)
        .map(|(a, b)| (a.to_bits() as i64 - b.to_bits() as i64).unsigned_abs())
        .max()
        .unwrap_or(0);
    let rel = c
        .iter()
        .zip(&x)
        .filter(|(a, _)| **a > 1e-30)
        .map(|(a, b)| ((a - b) / a).abs() as f64)
        .fold(0.0, f64::max);
    println!(
        "INFO: mlxk_compute_g, MLX CUDA ops vs MLX CPU ops: {}/{} gates differ, at most {ulps} \
         ulp (relative {rel:.2e})",
        d.differ, d.total
    );
    // exp(-exp(A_log) softplus(a + dt_bias)): an argument of magnitude m carries m ulps of its
    // own rounding into exp, so CUDA's and MLX CPU's formulas may part by tens of ulps for
    // large m; relative to the gate that stays far under 1e-5 (m ≤ 88, each step 2^-24).
    assert!(rel <= 1e-5, "gates {rel:.2e} apart (relative)");
    for h in [a_log, a, dt, cpu, gpu] {
        free(h);
    }
}

#[test]
fn cuda_kernels_match_the_cpu_kernels() {
    if !cuda() {
        eprintln!(
            "skipped: the loaded MLX has no CUDA backend (mlxk_gpu_backend() = {}); \
             `make test-cuda` runs this on a CUDA machine",
            mlxk_gpu_backend()
        );
        return;
    }
    let mut rng = Rng::fresh();
    if std::env::var("MLXK_CUDA_ONLY").as_deref() == Ok("chunked") {
        // scripts/cuda/device.sh chunked: the chunked form's cases alone.
        chunked::chunked_within_bounds(&mut rng);
        pool::chunked_pool_calls_match_the_dense_calls(&mut rng);
        println!("PASS: test-cuda (chunked only): the chunked form within its bounds");
        return;
    }
    let (bf16, f16, f32) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32);
    gates(&mut rng);
    // B, T, Hk, Hv, Dk, Dv: decode, prefill, GQA 1-4, Dk 32-256, Dv != Dk and odd, B to 64.
    for (dims, dtype, state, mask) in [
        ([1, 1, 16, 32, 128, 128], bf16, true, false),
        ([64, 1, 16, 32, 128, 128], bf16, true, false),
        ([2, 64, 16, 32, 128, 128], bf16, true, true),
        ([2, 17, 4, 4, 64, 64], f16, false, false),
        ([3, 33, 2, 4, 32, 48], f32, true, true),
        ([2, 9, 2, 6, 96, 7], bf16, true, true),
        ([1, 40, 1, 4, 256, 130], f16, true, false),
        ([2, 5, 2, 2, 160, 33], f32, false, true),
        ([3, 0, 2, 4, 64, 64], bf16, true, false),
        // 256+ (batch, value head) pairs: 4 or 2 value rows per warp; 512+: 8 (crate::cuda).
        ([16, 9, 4, 16, 64, 48], f16, true, true),
        ([64, 3, 2, 4, 64, 6], f32, false, false),
        ([16, 3, 8, 32, 64, 64], bf16, true, true),
        ([1, 4096, 2, 4, 128, 128], bf16, true, false),
    ] {
        recurrence(&mut rng, dims, dtype, state, mask);
    }
    for (dims, dtype) in [
        ([1, 1, 16, 32, 128, 128], bf16),
        ([2, 512, 16, 32, 128, 128], bf16),
        ([3, 7, 2, 4, 100, 72], f16),
        ([2, 3, 1, 3, 5, 3], f32),
        ([1, 64, 4, 8, 64, 128], f32),
    ] {
        head_split(&mut rng, dims, dtype);
    }
    // The head split inside the recurrence: decode at Qwen3.5 dims (B = 1 and 32, 16 rows a
    // warp from 1024 pairs), verify windows the library runs as one kernel (B·T <= 32, T <= 8),
    // prefill, Dk 32 to 128, odd Dv, masks, absent state.
    for (dims, dtype, state, mask) in [
        ([1, 1, 16, 32, 128, 128], bf16, true, false),
        ([32, 1, 16, 32, 128, 128], bf16, true, false),
        ([4, 8, 16, 32, 128, 128], bf16, true, false),
        ([2, 5, 2, 4, 64, 24], f16, false, true),
        ([2, 64, 16, 32, 128, 128], bf16, true, true),
        ([3, 33, 2, 4, 32, 48], f32, true, true),
        ([2, 9, 2, 6, 96, 7], f16, false, true),
        ([16, 3, 8, 32, 64, 64], bf16, true, true),
    ] {
        from_conv(&mut rng, dims, dtype, state, mask);
    }
    for (rows, d, dtype, gate) in [
        (32, 128, bf16, bf16),
        (512 * 32, 128, bf16, bf16),
        (7, 1000, f16, f32),
        (3, 4096, f32, f32),
        (5, 5000, bf16, f32),
        (2, 1, f32, f32),
        (0, 128, bf16, bf16),
    ] {
        gated_norm(&mut rng, rows, d, dtype, gate);
    }
    pool::pool_calls_match_the_cpu(&mut rng);
    chunked_grad::chunked_backward_matches(&mut rng);
    chunked::chunked_within_bounds(&mut rng);
    pool::chunked_pool_calls_match_the_dense_calls(&mut rng);
    decode_loop(&mut rng);
    errors_on_the_gpu(&mut rng);
    println!("PASS: test-cuda: every kernel on MLX CUDA matches the CPU kernels");
}
