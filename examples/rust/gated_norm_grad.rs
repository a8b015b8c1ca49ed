//! The gated RMS norm of a Gated DeltaNet layer's output and its gradient through the safe
//! API, the gradient checked against central differences of `sum(dout · out)`.
//!
//!     cargo run --example gated_norm_grad

use mlxkern::{Array, GatedRmsNorm, Result};

const ROWS: usize = 6;
const WIDTH: usize = 48;
const EPS: f32 = 1e-6;

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

/// `sum(dout · norm(x, gate, weight))` in float64 over the float32 results.
fn loss(x: &[f32], gate: &[f32], weight: &Array, dout: &[f32]) -> Result<f64> {
    let x = Array::from_slice(x, &[ROWS, WIDTH])?;
    let gate = Array::from_slice(gate, &[ROWS, WIDTH])?;
    let out: Vec<f32> = mlxkern::gated_rms_norm(&x, &gate, weight, EPS)?.to_vec()?;
    Ok(out
        .iter()
        .zip(dout)
        .map(|(o, d)| *o as f64 * *d as f64)
        .sum())
}

fn main() -> Result<()> {
    let mut rng = Lcg(7);
    let xs = rng.fill(ROWS * WIDTH, 2.0);
    let gs = rng.fill(ROWS * WIDTH, 3.0);
    let ws: Vec<f32> = rng.fill(WIDTH, 0.5).iter().map(|w| 1.0 + w).collect();
    let douts = rng.fill(ROWS * WIDTH, 1.0);

    let x = Array::from_slice(&xs, &[ROWS, WIDTH])?;
    let gate = Array::from_slice(&gs, &[ROWS, WIDTH])?;
    let weight = Array::from_slice(&ws, &[WIDTH])?;
    let dout = Array::from_slice(&douts, &[ROWS, WIDTH])?;

    let norm = GatedRmsNorm {
        x: &x,
        gate: &gate,
        weight: &weight,
        eps: EPS,
    };
    let out = norm.forward()?;
    println!("out {:?} {:?}", out.shape()?, out.dtype()?);
    let grads = norm.vjp(Some(&dout))?;
    let dx: Vec<f32> = grads.dx.to_vec()?;
    let dgate: Vec<f32> = grads.dgate.to_vec()?;
    let dweight: Vec<f32> = grads.dweight.to_vec()?;
    println!(
        "dx {:?}, dgate {:?}, dweight {:?}",
        grads.dx.shape()?,
        grads.dgate.shape()?,
        grads.dweight.shape()?
    );

    // Central differences on a few elements of x and gate (float32 forward, so a loose bound).
    let h = 1e-2f32;
    let mut worst = 0.0f64;
    for i in [0, 5, WIDTH + 3, 3 * WIDTH + 17, ROWS * WIDTH - 1] {
        for (which, analytic) in [("x", dx[i]), ("gate", dgate[i])] {
            let (mut plus, mut minus) = (xs.clone(), xs.clone());
            let (mut gplus, mut gminus) = (gs.clone(), gs.clone());
            if which == "x" {
                plus[i] += h;
                minus[i] -= h;
            } else {
                gplus[i] += h;
                gminus[i] -= h;
            }
            let numeric = (loss(&plus, &gplus, &weight, &douts)?
                - loss(&minus, &gminus, &weight, &douts)?)
                / (2.0 * h as f64);
            let err = (numeric - analytic as f64).abs() / (1.0 + numeric.abs());
            worst = worst.max(err);
            println!("d{which}[{i}]: vjp {analytic:+.5}, central difference {numeric:+.5}");
        }
    }
    // dweight is a sum over rows of dout · silu(gate) · x · rsqrt(mean(x²) + eps): its
    // definition in float64.
    for (j, &got) in dweight.iter().enumerate() {
        let mut want = 0.0f64;
        for r in 0..ROWS {
            let row = &xs[r * WIDTH..(r + 1) * WIDTH];
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / WIDTH as f64;
            let inv = 1.0 / (ms + EPS as f64).sqrt();
            let g = gs[r * WIDTH + j] as f64;
            let silu = g / (1.0 + (-g).exp());
            want += douts[r * WIDTH + j] as f64 * silu * row[j] as f64 * inv;
        }
        worst = worst.max((want - got as f64).abs() / (1.0 + want.abs()));
    }
    println!(
        "dweight[0..3] = {:?} ({} values)",
        &dweight[..3],
        dweight.len()
    );
    println!("largest relative difference: {worst:.2e}");
    if worst > 2e-2 {
        eprintln!("gated_norm_grad: the gradient disagrees with the central differences");
        std::process::exit(1);
    }
    Ok(())
}
