//! The cargo consumer's program (tests/consumers/cargo/run.sh): reference.c's inputs through
//! mlxkern's safe Rust API, one decode step and one gated norm, each result's float32 values
//! printed as 8-digit hex bit patterns in reference.c's format.

use mlxkern::{Array, GatedDelta, Result};

/// reference.c's generator: s = s * 1664525 + 1013904223 (mod 2^32), values in [-1, 1).
struct Generator(u32);

impl Generator {
    fn array(&mut self, shape: &[usize]) -> Result<Array> {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n)
            .map(|_| {
                self.0 = self.0.wrapping_mul(1664525).wrapping_add(1013904223);
                ((self.0 >> 8) as f64 / 16777216.0 * 2.0 - 1.0) as f32
            })
            .collect();
        Array::from_slice(&data, shape)
    }
}

fn print(name: &str, array: &Array) -> Result<()> {
    let values: Vec<f32> = array.to_vec()?;
    let mut line = format!("{name} {}", values.len());
    for v in values {
        line.push_str(&format!(" {:08x}", v.to_bits()));
    }
    println!("{line}");
    Ok(())
}

fn main() -> Result<()> {
    let mut g = Generator(2024);
    let (q, k) = (g.array(&[2, 1, 2, 32])?, g.array(&[2, 1, 2, 32])?);
    let v = g.array(&[2, 1, 4, 8])?;
    let (a, b) = (g.array(&[2, 1, 4])?, g.array(&[2, 1, 4])?);
    let (a_log, dt_bias) = (g.array(&[4])?, g.array(&[4])?);
    let state = g.array(&[2, 4, 8, 32])?;
    let step = GatedDelta {
        q: &q,
        k: &k,
        v: &v,
        a: &a,
        b: &b,
        a_log: &a_log,
        dt_bias: &dt_bias,
        state: Some(&state),
        mask: None,
    }
    .update()?;
    let (x, gate, weight) = (g.array(&[3, 16])?, g.array(&[3, 16])?, g.array(&[16])?);
    let norm = mlxkern::gated_rms_norm(&x, &gate, &weight, 1e-6)?;
    print("y", &step.y)?;
    print("state", &step.state)?;
    print("norm", &norm)?;
    Ok(())
}
