//! The chunked form's GPU backward on MLX CUDA (tests/cuda/main.rs runs it):
//! `kernels/metal/gated_delta_chunked_backward.metal`'s five stages through
//! `testing::gated_delta_update_chunked_vjp_via_gpu`, against the CPU backward of the exact
//! update (`mlxk_gated_delta_update_vjp` on the CPU device) and, where small enough, a float64
//! backward of the exact recurrence written here (the truth both approximate). T up to 4096,
//! Qwen3.5-35B-A3B's heads, GQA 1-4, Dk 32-256, odd Dv, masks, absent state, chunks 0/16/32/128.
//!
//! Bounds, relative to each gradient's largest magnitude (the reference's): two units in the
//! last place of the output's dtype (both sides round their f32 result to it: bf16 for dq, dk,
//! dv, da, ddt_bias here) plus 2^-12 for the f32 arithmetic (the emulator measures the chunked
//! kernels within 4e-6 of float64 on its cases; tests/metal_emu/README.md). da_log and
//! ddt_bias sum B·T terms of either sign: 2^-10 for them. Every case prints its figures.
//!
//! Every stage's products run on the matrix tiles (kernels/cuda/tiles.cuh), float32 FMAs by
//! default; `chunked_backward_tile_forms` runs cases with tf32 and bf16 tensor cores, whose
//! bounds add 4 (2δ + δ²) for an input rounding of δ (2^-11, 2^-8): each tile product moves its
//! result by at most 2δ + δ² of the sum of its terms' magnitudes, those errors add along a
//! gradient's chain of products, and with these inputs' magnitudes four such terms bound it
//! (tests/metal_emu/harness_backward_chunked.cc; it measures the same forms' worst at 0.19 and
//! 0.23 of it).

use super::*;
use mlxkern::testing::{gated_delta_update_chunked_vjp_via_gpu, GpuKernels};

const NAMES: [&str; 8] = crate::support::vjp_case::GRADS;

/// `Recurrence::random`'s inputs with a, b and dt_bias in float32, so that g and beta (MLX ops
/// on the GPU, the CPU kernel's own on the CPU) agree to float32 rounding on both sides (in
/// bf16, MLX CUDA's sigmoid or log1p may round a gate to the neighbouring bf16 value).
fn random_inputs(rng: &mut Rng, dims: [usize; 6], state: bool, mask: bool) -> Recurrence {
    let mut x = Recurrence::random(rng, dims, state, mask);
    for h in [&mut x.a, &mut x.b, &mut x.dt_bias] {
        let f: Vec<f32> = values(*h).iter().map(|&v| v as f32).collect();
        let widened = new_f32(&f, &shape_of(*h));
        free(std::mem::replace(h, widened));
    }
    x
}

/// The gradients of the exact recurrence in float64, in the C ABI's order and shapes.
fn float64_backward(x: &Recurrence, dy: &[f64], dstate_out: &[f64]) -> [Vec<f64>; 8] {
    let [bsz, t_len, hk_n, hv_n, dk, dv] = x.dims;
    let group = hv_n / hk_n;
    let (q, k, v) = (values(x.q), values(x.k), values(x.v));
    let (a, b, a_log, dt_bias) = (values(x.a), values(x.b), values(x.a_log), values(x.dt_bias));
    let state = x.state.map(values);
    let mask: Option<Vec<u8>> = x.mask.map(read_bytes);
    let softplus = |z: f64| z.max(0.0) + (-z.abs()).exp().ln_1p();
    let sigmoid = |z: f64| 1.0 / (1.0 + (-z).exp());
    let gate = |i: usize| {
        let h = i % hv_n;
        (-a_log[h].exp() * softplus(a[i] + dt_bias[h])).exp()
    };
    let mut dq = vec![0.0; bsz * t_len * hk_n * dk];
    let mut dk_out = dq.clone();
    let mut dv_out = vec![0.0; bsz * t_len * hv_n * dv];
    let mut dg = vec![0.0; bsz * t_len * hv_n];
    let mut dbeta = dg.clone();
    let mut dstate = vec![0.0; bsz * hv_n * dv * dk];
    let s_len = dv * dk;
    for bi in 0..bsz {
        for h in 0..hv_n {
            let hk = h / group;
            let qk = |t: usize, i: usize| ((bi * t_len + t) * hk_n + hk) * dk + i;
            let vv = |t: usize, j: usize| ((bi * t_len + t) * hv_n + h) * dv + j;
            let gt = |t: usize| (bi * t_len + t) * hv_n + h;
            let active = |t: usize| mask.as_ref().is_none_or(|m| m[bi * t_len + t] != 0);
            let base = (bi * hv_n + h) * s_len;
            let mut states = vec![0.0; (t_len + 1) * s_len];
            if let Some(s) = &state {
                states[..s_len].copy_from_slice(&s[base..base + s_len]);
            }
            for t in 0..t_len {
                let (done, next) = states.split_at_mut((t + 1) * s_len);
                let s1 = &mut next[..s_len];
                s1.copy_from_slice(&done[t * s_len..]);
                if !active(t) {
                    continue;
                }
                let (gv, bv) = (gate(gt(t)), sigmoid(b[gt(t)]));
                for j in 0..dv {
                    let row = &mut s1[j * dk..(j + 1) * dk];
                    let mut kv = 0.0;
                    for i in 0..dk {
                        row[i] *= gv;
                        kv += row[i] * k[qk(t, i)];
                    }
                    let delta = (v[vv(t, j)] - kv) * bv;
                    for i in 0..dk {
                        row[i] += k[qk(t, i)] * delta;
                    }
                }
            }
            let mut ds = dstate_out[base..base + s_len].to_vec();
            for t in (0..t_len).rev() {
                if !active(t) {
                    continue;
                }
                let sp = &states[t * s_len..(t + 1) * s_len];
                let sn = &states[(t + 1) * s_len..(t + 2) * s_len];
                let (gv, bv) = (gate(gt(t)), sigmoid(b[gt(t)]));
                let (mut dgt, mut dbt) = (0.0, 0.0);
                for j in 0..dv {
                    let dyj = dy[vv(t, j)];
                    let (mut kv, mut ddelta) = (0.0, 0.0);
                    for i in 0..dk {
                        kv += gv * sp[j * dk + i] * k[qk(t, i)];
                        dq[qk(t, i)] += dyj * sn[j * dk + i];
                        ds[j * dk + i] += dyj * q[qk(t, i)];
                        ddelta += ds[j * dk + i] * k[qk(t, i)];
                    }
                    let err = v[vv(t, j)] - kv;
                    let delta = err * bv;
                    dv_out[vv(t, j)] = ddelta * bv;
                    dbt += ddelta * err;
                    let dkv = -ddelta * bv;
                    for i in 0..dk {
                        let d = ds[j * dk + i];
                        dk_out[qk(t, i)] += delta * d + dkv * gv * sp[j * dk + i];
                        let ds1 = d + dkv * k[qk(t, i)];
                        dgt += ds1 * sp[j * dk + i];
                        ds[j * dk + i] = gv * ds1;
                    }
                }
                dg[gt(t)] = dgt;
                dbeta[gt(t)] = dbt;
            }
            dstate[base..base + s_len].copy_from_slice(&ds);
        }
    }
    // The gates' chain.
    let mut da = vec![0.0; dg.len()];
    let mut db = da.clone();
    let mut da_log = vec![0.0; hv_n];
    let mut ddt = da_log.clone();
    for i in 0..dg.len() {
        let h = i % hv_n;
        let z = a[i] + dt_bias[h];
        let rate = a_log[h].exp();
        let gv = gate(i);
        da[i] = dg[i] * -rate * sigmoid(z) * gv;
        ddt[h] += da[i];
        da_log[h] += dg[i] * -rate * softplus(z) * gv;
        let bv = sigmoid(b[i]);
        db[i] = dbeta[i] * bv * (1.0 - bv);
    }
    [dq, dk_out, dv_out, da, db, da_log, ddt, dstate]
}

fn ulp(dtype: mlxk_dtype) -> f64 {
    match dtype {
        MLXK_DTYPE_BFLOAT16 => 2f64.powi(-8),
        MLXK_DTYPE_FLOAT16 => 2f64.powi(-11),
        _ => 2f64.powi(-24),
    }
}

/// The largest |got - want| relative to the largest |want|.
fn relative(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    got.iter()
        .zip(want)
        .fold(0.0f64, |m, (g, w)| m.max((g - w).abs()))
        / scale
}

/// What the matrix tiles' input rounding adds to a bound (above).
fn tile_bound(form: Option<mlxkern::cuda::TileForm>) -> f64 {
    let delta = match form {
        Some(mlxkern::cuda::TileForm::Tf32) => 2f64.powi(-11),
        Some(mlxkern::cuda::TileForm::Bf16) => 2f64.powi(-8),
        _ => 0.0,
    };
    4.0 * (2.0 * delta + delta * delta)
}

fn case(rng: &mut Rng, dims: [usize; 6], state: bool, mask: bool, chunk: usize, exact64: bool) {
    case_in(rng, dims, state, mask, chunk, exact64, None);
}

#[allow(clippy::too_many_arguments)]
fn case_in(
    rng: &mut Rng,
    dims: [usize; 6],
    state: bool,
    mask: bool,
    chunk: usize,
    exact64: bool,
    form: Option<mlxkern::cuda::TileForm>,
) {
    let [b, t, _, hv, dk, dv] = dims;
    let x = random_inputs(rng, dims, state, mask);
    let dy_values = rng.vec(b * t * hv * dv, 1.0);
    let ds_values = rng.vec(b * hv * dv * dk, 0.5);
    let dy = new_f32(&dy_values, &[b as i32, t as i32, hv as i32, dv as i32]);
    let dso = new_f32(&ds_values, &[b as i32, hv as i32, dv as i32, dk as i32]);
    let args = {
        let [q, k, v, a, bb, al, dt, s, m] = x.args();
        [
            q,
            k,
            v,
            a,
            bb,
            al,
            dt,
            s,
            m,
            dy as *const _,
            dso as *const _,
        ]
    };
    // The CPU backward of the exact update.
    on_gpu(false);
    let mut cpu = [null_mut(); 8];
    ok(crate::support::vjp_case::vjp(args, None, &mut cpu));
    // The chunked GPU backward (its tiles in `form`).
    on_gpu(true);
    mlxkern::testing::cuda_tile_form(form);
    let mut gpu = [null_mut(); 8];
    let outs = gpu.each_mut().map(|p| p as *mut H);
    ok(unsafe {
        gated_delta_update_chunked_vjp_via_gpu(GpuKernels::Cuda, true, chunk as i32, args, outs)
    });
    mlxkern::testing::cuda_tile_form(None);
    let truth = exact64.then(|| {
        float64_backward(
            &x,
            &dy_values.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &ds_values.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        )
    });
    let mut line = format!(
        "chunked backward B={b} T={t} Hk={} Hv={hv} Dk={dk} Dv={dv} state={state} mask={mask} \
         chunk={chunk} tiles={}: error/scale vs CPU exact",
        dims[2],
        form.map_or("configured", |f| f.name())
    );
    if exact64 {
        line += " (vs float64; CPU exact vs float64)";
    }
    let mut failures = Vec::new();
    for i in 0..8 {
        assert_eq!(shape_of(cpu[i]), shape_of(gpu[i]), "{}: shape", NAMES[i]);
        assert_eq!(dtype_of(cpu[i]), dtype_of(gpu[i]), "{}: dtype", NAMES[i]);
        let (c, g) = (values(cpu[i]), values(gpu[i]));
        let bound = 2.0 * ulp(dtype_of(gpu[i]))
            + if i == 5 || i == 6 {
                2f64.powi(-10)
            } else {
                2f64.powi(-12)
            }
            + tile_bound(form);
        let finite = g.iter().all(|v| v.is_finite());
        let e = relative(&g, &c);
        line += &format!(" {} {e:.2e}", NAMES[i]);
        if e.is_nan() || e > bound || !finite {
            failures.push(format!(
                "{} vs CPU: {e:.3e} > {bound:.3e} (finite: {finite})",
                NAMES[i]
            ));
        }
        if let Some(truth) = &truth {
            let e64 = relative(&g, &truth[i]);
            let c64 = relative(&c, &truth[i]);
            line += &format!(" ({e64:.2e}; {c64:.2e})");
            if e64.is_nan() || e64 > bound {
                failures.push(format!("{} vs float64: {e64:.3e} > {bound:.3e}", NAMES[i]));
            }
        }
    }
    println!("{line}");
    assert!(failures.is_empty(), "{line}\n{}", failures.join("\n"));
    for h in cpu.into_iter().chain(gpu) {
        free(h);
    }
    free(dy);
    free(dso);
    x.free();
}

/// Every case; the float64 backward where it is cheap (it runs on one CPU core).
pub fn chunked_backward_matches(rng: &mut Rng) {
    for (dims, state, mask, chunk, exact64) in [
        ([1, 1, 1, 3, 64, 5], true, false, 0, true),
        ([3, 33, 2, 4, 32, 48], true, true, 16, true),
        ([2, 45, 1, 2, 256, 7], false, true, 32, true),
        ([2, 100, 2, 6, 128, 33], true, true, 128, true),
        ([1, 4096, 1, 2, 128, 128], true, false, 0, true),
        ([1, 512, 16, 32, 128, 128], true, false, 0, false),
        ([2, 700, 16, 32, 128, 128], true, true, 0, false),
        ([1, 4096, 16, 32, 128, 128], true, false, 0, false),
    ] {
        case(rng, dims, state, mask, chunk, exact64);
    }
}

/// Cases with each matrix-tile form (fma, tf32, bf16), within that form's bounds.
pub fn chunked_backward_tile_forms(rng: &mut Rng) {
    for form in mlxkern::cuda::TileForm::ALL {
        for (dims, state, mask, chunk, exact64) in [
            ([3, 33, 2, 4, 32, 48], true, true, 16, true),
            ([2, 100, 2, 6, 128, 33], true, true, 128, true),
            ([1, 4096, 1, 2, 128, 128], true, false, 0, true),
            ([1, 4096, 16, 32, 128, 128], true, false, 0, false),
        ] {
            case_in(rng, dims, state, mask, chunk, exact64, Some(form));
        }
    }
}
