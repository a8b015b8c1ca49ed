//! One chunked-form case whose outputs the x86-64 kernels (AVX2 or AVX-512, which agree bit
//! for bit) and the NEON kernels must give alike: the products are the same fused chains and
//! everything between them is plain float32 arithmetic. The gates are given (not computed
//! through `exp` and `log1p`, whose C library may differ between the two machines) and keep
//! the running products of g inside the normal range (the two flush modes agree there).

use half::bf16;

use crate::cpu::features;
use crate::cpu::gated_delta::chunked::chunked_recurrence;
use crate::cpu::gated_delta::Dims;

fn values(seed: &mut u64, n: usize, lo: f32, hi: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            lo + (hi - lo) * ((*seed >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// Whether this machine runs the chunked form's fused products (x86-64: AVX2 and FMA; arm64:
/// NEON).
pub fn fused_products() -> bool {
    let f = features::kernels();
    f.avx2_fma() || f.neon
}

/// The case's outputs, as bits: y and the final state in f32, then y and the state in bf16
/// (with a mask and an initial state).
pub fn chunked_case_bits() -> Vec<u32> {
    let d = Dims {
        b: 2,
        t: 77,
        hk: 2,
        hv: 4,
        dk: 128,
        dv: 40,
    };
    let mut seed = 0x005E_ED0F_C4A1_u64;
    let mut seed_values = |n, lo, hi| values(&mut seed, n, lo, hi);
    let qk = d.b * d.t * d.hk * d.dk;
    let key_scale = 1.5 / (d.dk as f32).sqrt();
    let q = seed_values(qk, -0.3, 0.3);
    let k = seed_values(qk, -key_scale, key_scale);
    let v = seed_values(d.b * d.t * d.hv * d.dv, -1.0, 1.0);
    let g = seed_values(d.b * d.t * d.hv, 0.85, 0.999);
    let beta = seed_values(d.b * d.t * d.hv, 0.1, 0.9);
    let state_in = seed_values(d.b * d.hv * d.dv * d.dk, -0.5, 0.5);
    let mask: Vec<u8> = (0..d.b * d.t).map(|i| (i % 7 != 3) as u8).collect();
    let mut bits = Vec::new();
    let mut y = vec![0f32; v.len()];
    let mut state = vec![0f32; state_in.len()];
    chunked_recurrence(d, &q, &k, &v, &g, &beta, None, None, &mut y, &mut state);
    bits.extend(y.iter().chain(&state).map(|x| x.to_bits()));
    let to16 = |x: &[f32]| x.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>();
    let (q, k, v) = (to16(&q), to16(&k), to16(&v));
    let mut y = vec![bf16::ZERO; v.len()];
    let (g, beta, s, m) = (&g, &beta, Some(&state_in[..]), Some(&mask[..]));
    chunked_recurrence(d, &q, &k, &v, g, beta, s, m, &mut y, &mut state);
    bits.extend(
        y.iter()
            .map(|x| x.to_bits() as u32)
            .chain(state.iter().map(|x| x.to_bits())),
    );
    bits
}

/// The bits as little-endian bytes (the reference file's format).
pub fn to_bytes(bits: &[u32]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}

#[cfg(all(test, target_arch = "aarch64"))]
mod tests {
    use super::*;

    /// The NEON kernels give the x86-64 kernels' bits. Needs the reference the x86-64 build
    /// wrote (`scripts/test-arm64.sh` passes it in `MLXK_CHUNKED_REFERENCE`).
    #[test]
    #[ignore = "needs MLXK_CHUNKED_REFERENCE from an x86-64 run (scripts/test-arm64.sh)"]
    fn chunked_bits_match_the_x86_kernels() {
        let path = std::env::var("MLXK_CHUNKED_REFERENCE").expect("MLXK_CHUNKED_REFERENCE");
        let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(fused_products());
        let got = to_bytes(&chunked_case_bits());
        assert_eq!(got.len(), want.len(), "reference length");
        let differ = got
            .chunks(4)
            .zip(want.chunks(4))
            .filter(|(a, b)| a != b)
            .count();
        assert_eq!(
            differ,
            0,
            "{differ} of {} values differ from the x86-64 kernels'",
            got.len() / 4
        );
        assert!(got.iter().any(|&b| b != 0));
    }
}
