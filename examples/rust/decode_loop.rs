//! A Gated DeltaNet decode loop through the safe API: a prefill of the prompt, then one token
//! per step with the recurrent state carried from step to step, checked at the end against a
//! single call over the whole sequence (the same bits: the recurrence is sequential).
//!
//!     cargo run --example decode_loop

use mlxkern::{Array, Dtype, GatedDelta, Result};

/// Qwen3.5-like head geometry, small: B rows, Hk key heads, Hv value heads, Dk, Dv.
const B: usize = 2;
const HK: usize = 2;
const HV: usize = 4;
const DK: usize = 64;
const DV: usize = 32;
const PROMPT: usize = 12;
const STEPS: usize = 6;

/// A tiny deterministic generator (uniform in [-scale, scale)).
struct Lcg(u32);

impl Lcg {
    fn fill(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_mul(1664525).wrapping_add(1013904223);
                ((self.0 >> 8) as f32 / 16777216.0 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}

/// The per-token inputs of `t` tokens: q, k (L2-normalized per head, as the model does), v, a, b.
struct Tokens {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
}

fn normalized(mut x: Vec<f32>, width: usize) -> Vec<f32> {
    for head in x.chunks_mut(width) {
        let norm = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        head.iter_mut().for_each(|v| *v /= norm);
    }
    x
}

/// Token range `t0..t1` of every row of a `[B, T, ...]` buffer with `inner` values per token.
fn window(x: &[f32], t: usize, inner: usize, t0: usize, t1: usize) -> Vec<f32> {
    (0..B)
        .flat_map(|b| {
            x[(b * t + t0) * inner..(b * t + t1) * inner]
                .iter()
                .copied()
        })
        .collect()
}

fn run(
    x: &Tokens,
    total: usize,
    (t0, t1): (usize, usize),
    a_log: &Array,
    dt_bias: &Array,
    state: Option<&Array>,
) -> Result<mlxkern::Update> {
    let t = t1 - t0;
    let q = Array::from_slice(&window(&x.q, total, HK * DK, t0, t1), &[B, t, HK, DK])?;
    let k = Array::from_slice(&window(&x.k, total, HK * DK, t0, t1), &[B, t, HK, DK])?;
    let v = Array::from_slice(&window(&x.v, total, HV * DV, t0, t1), &[B, t, HV, DV])?;
    let a = Array::from_slice(&window(&x.a, total, HV, t0, t1), &[B, t, HV])?;
    let b = Array::from_slice(&window(&x.b, total, HV, t0, t1), &[B, t, HV])?;
    GatedDelta {
        q: &q,
        k: &k,
        v: &v,
        a: &a,
        b: &b,
        a_log,
        dt_bias,
        state,
        mask: None,
    }
    .update()
}

fn main() -> Result<()> {
    println!(
        "mlxkern {} on MLX {} (device {:?})",
        mlxkern::version(),
        mlxkern::mlx_version(),
        mlxkern::default_device()
    );
    let mut rng = Lcg(2024);
    let total = PROMPT + STEPS;
    let tokens = Tokens {
        q: normalized(rng.fill(B * total * HK * DK, 1.0), DK),
        k: normalized(rng.fill(B * total * HK * DK, 1.0), DK),
        v: rng.fill(B * total * HV * DV, 1.0),
        a: rng.fill(B * total * HV, 1.0),
        b: rng.fill(B * total * HV, 2.0),
    };
    let a_log = Array::from_slice(&rng.fill(HV, 0.5), &[HV])?;
    let dt_bias = Array::from_slice(&rng.fill(HV, 0.5), &[HV])?;

    // Prefill: the whole prompt in one call, from the zero state.
    let prefill = run(&tokens, total, (0, PROMPT), &a_log, &dt_bias, None)?;
    let mut state: Array = prefill.state;
    println!("prefill: {PROMPT} tokens, y {:?}", prefill.y.shape()?);

    // Decode: one token a step; the new state replaces the old one before it is computed,
    // so the CPU kernel updates the state's buffer in place.
    for step in 0..STEPS {
        let t = PROMPT + step;
        let out = run(&tokens, total, (t, t + 1), &a_log, &dt_bias, Some(&state))?;
        state = out.state;
        let y: Vec<f32> = out.y.to_vec()?;
        let rms = (y.iter().map(|v| v * v).sum::<f32>() / y.len() as f32).sqrt();
        println!("step {step}: token {t}, rms(y) = {rms:.6}");
    }

    // The same sequence in one call: the carried state has the same bits.
    let whole = run(&tokens, total, (0, total), &a_log, &dt_bias, None)?;
    let carried: Vec<f32> = state.to_vec()?;
    let at_once: Vec<f32> = whole.state.to_vec()?;
    let same = carried
        .iter()
        .zip(&at_once)
        .all(|(x, y)| x.to_bits() == y.to_bits());
    println!(
        "state {:?} {}: carried over {STEPS} steps = one call over {total} tokens: {same}",
        state.shape()?,
        Dtype::Float32.name()
    );
    if !same {
        eprintln!("decode_loop: the carried state differs from the one-call state");
        std::process::exit(1);
    }
    Ok(())
}
