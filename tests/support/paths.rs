//! Helpers of the portable-vs-vectorized suites of the head split and the gated norm
//! (tests/paths/silu_rms_heads.rs, tests/paths/gated_rms_norm.rs): element kinds, special
//! values, the switches forcing the portable and the AVX2 kernels. (Their timings are probes:
//! benches/rust/kernel_probe.rs.)
#![allow(dead_code)]

use super::*;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Bf16,
    F16,
    F32,
}

pub const KINDS: [Kind; 3] = [Kind::Bf16, Kind::F16, Kind::F32];

impl Kind {
    pub fn code(self) -> mlxk_dtype {
        match self {
            Kind::Bf16 => MLXK_DTYPE_BFLOAT16,
            Kind::F16 => MLXK_DTYPE_FLOAT16,
            Kind::F32 => MLXK_DTYPE_FLOAT32,
        }
    }
    pub fn size(self) -> usize {
        match self {
            Kind::F32 => 4,
            _ => 2,
        }
    }
    pub fn encode(self, x: f32) -> u32 {
        match self {
            Kind::Bf16 => bf16_bits(x) as u32,
            Kind::F16 => {
                if x.is_nan() {
                    0x7E00
                } else {
                    half::f16::from_f32(x).to_bits() as u32
                }
            }
            Kind::F32 => x.to_bits(),
        }
    }
    pub fn is_nan(self, bits: u32) -> bool {
        match self {
            Kind::Bf16 => bits & 0x7FFF > 0x7F80,
            Kind::F16 => bits & 0x7FFF > 0x7C00,
            Kind::F32 => f32::from_bits(bits).is_nan(),
        }
    }
    /// Bit patterns worth testing: subnormals, infinities, NaNs (quiet, signalling, signed,
    /// with payloads), the largest finite values and the smallest normals.
    pub fn specials(self) -> &'static [u32] {
        match self {
            Kind::Bf16 => &[
                0x0001, 0x007F, 0x8001, 0x807F, 0x0080, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81,
                0xFF81, 0x7F7F, 0xFF7F, 0x0000, 0x8000,
            ],
            Kind::F16 => &[
                0x0001, 0x03FF, 0x8001, 0x83FF, 0x0400, 0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7C01,
                0xFC01, 0x7BFF, 0xFBFF, 0x0000, 0x8000,
            ],
            Kind::F32 => &[
                0x0000_0001,
                0x007F_FFFF,
                0x8000_0001,
                0x0080_0000,
                0x7F80_0000,
                0xFF80_0000,
                0x7FC0_0000,
                0xFFC0_0001,
                0x7F80_0001,
                0xFFA0_0000,
                0x7F7F_FFFF,
                0xFF7F_FFFF,
                0x0000_0000,
                0x8000_0000,
            ],
        }
    }
    pub fn raw(self, rng: &mut Rng) -> u32 {
        match self {
            Kind::F32 => rng.next_u64() as u32,
            _ => rng.next_u64() as u32 & 0xFFFF,
        }
    }
}

/// Values that sit on the edges of MLX's exp and sigmoid (the ±88 clamps, saturation).
pub const EDGES: [f32; 14] = [
    88.0, -88.0, 88.5, -88.5, 87.9, -87.9, 20.0, -20.0, 60.0, -60.0, 1e-3, -1e-3, 0.5, -0.5,
];

/// Values x ≥ 0 whose product x·log2(e) in f32 is exactly k + 0.5: where MLX's exp rounds its
/// integer part half up (in double) and a round-to-nearest-even shortcut would not.
#[allow(clippy::approx_constant)]
pub fn exp_ties() -> &'static [f32] {
    static TIES: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TIES.get_or_init(|| {
        let mut ties = vec![];
        for k in 0..127 {
            let half = k as f32 + 0.5;
            let base = (half / 1.442695f32).to_bits() as i64;
            for step in -256..256 {
                let x = f32::from_bits((base + step) as u32);
                if x * 1.442695f32 == half {
                    ties.push(x);
                }
            }
        }
        assert!(ties.len() > 50, "only {} ties", ties.len());
        ties
    })
}

/// `n` elements of one segment (a head, a row) in one of several regimes.
pub fn segment(rng: &mut Rng, kind: Kind, n: usize, out: &mut Vec<u32>) {
    let mode = rng.below(21);
    for _ in 0..n {
        let bits = match mode {
            // Ordinary values at several scales.
            0..=10 => {
                let scale = [0.01f32, 1.0, 4.0, 30.0][(mode % 4) as usize];
                kind.encode(rng.uniform() * scale)
            }
            // Ordinary values with a sprinkling of special ones.
            11..=13 => match rng.below(12) {
                0 => kind.specials()[rng.below(kind.specials().len() as u64) as usize],
                1 => kind.encode(EDGES[rng.below(EDGES.len() as u64) as usize]),
                _ => kind.encode(rng.uniform() * 3.0),
            },
            // Tiny values: squares underflow (sum 0, inv = 1/sqrt(eps)), subnormal inputs.
            14 => {
                let scale = match kind {
                    Kind::F16 => 1e-5,
                    _ => [1e-20f32, 1e-39][rng.below(2) as usize],
                };
                kind.encode(rng.uniform() * scale)
            }
            // Huge values: squares overflow (sum inf, inv 0).
            15 => {
                let scale = match kind {
                    Kind::F16 => 6e4,
                    _ => [1e19f32, 1e30, 3e38][rng.below(3) as usize],
                };
                kind.encode(rng.uniform() * scale)
            }
            // Raw bit patterns (every class).
            16 => kind.raw(rng),
            // Only the edges of exp and sigmoid.
            17 => kind.encode(EDGES[rng.below(EDGES.len() as u64) as usize]),
            // All zeros (±0).
            18 => kind.encode(if rng.below(2) == 0 { 0.0 } else { -0.0 }),
            // Ties of exp's integer part, either sign.
            19 => {
                let ties = exp_ties();
                let x = ties[rng.below(ties.len() as u64) as usize];
                kind.encode(if rng.below(2) == 0 { x } else { -x })
            }
            // Large but finite activations.
            _ => kind.encode(rng.uniform() * 300.0),
        };
        out.push(bits);
    }
}

pub fn to_bytes(kind: Kind, bits: &[u32]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(bits.len() * kind.size());
    for &b in bits {
        match kind {
            Kind::F32 => bytes.extend_from_slice(&b.to_ne_bytes()),
            _ => bytes.extend_from_slice(&(b as u16).to_ne_bytes()),
        }
    }
    bytes
}

pub fn from_bytes(kind: Kind, bytes: &[u8]) -> Vec<u32> {
    match kind {
        Kind::F32 => bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]) as u32)
            .collect(),
    }
}

pub fn array(kind: Kind, bits: &[u32], shape: &[i32]) -> H {
    new_bytes(&to_bytes(kind, bits), shape, kind.code())
}

/// Asserts the two outputs are equal bit for bit (NaN as a class).
#[track_caller]
pub fn assert_same(kind: Kind, portable: &[u8], vectorized: &[u8], what: &str) {
    let (a, b) = (from_bytes(kind, portable), from_bytes(kind, vectorized));
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        let same = x == y || (kind.is_nan(x) && kind.is_nan(y));
        assert!(
            same,
            "{what}: element {i}: portable {x:#x}, vectorized {y:#x} ({} elements)",
            a.len()
        );
    }
}

pub fn eps_of(rng: &mut Rng) -> f32 {
    [1e-6f32, 1e-5, 0.0, 1e-6 / 128.0, 0.1, 1e-30][rng.below(6) as usize]
}

/// The kernels the CPU picks (neither the portable nor the AVX2 ones forced).
pub fn default_kernels() {
    mlxkern::testing::force_portable_kernels(false);
    mlxkern::testing::force_avx2_kernels(false);
}

/// A paths test: `cases` (which counts the cases it runs) with the process-wide kernel switches
/// held (`serial`) and left as the CPU picks; prints "{n} {what} cases".
pub fn switched_cases(what: &str, cases: impl FnOnce(&mut Rng, &mut usize)) {
    let _switch = serial();
    let mut rng = Rng::fresh();
    let mut n = 0;
    cases(&mut rng, &mut n);
    eprintln!("{n} {what} cases");
    default_kernels();
}

/// Runs `f` with the portable kernels, then with the AVX2 ones (forced where the CPU has
/// AVX-512), then with the fastest; returns the portable result and the others, named.
pub fn paths<R>(mut f: impl FnMut() -> R) -> (R, [(&'static str, R); 2]) {
    mlxkern::testing::force_portable_kernels(true);
    let portable = f();
    mlxkern::testing::force_portable_kernels(false);
    mlxkern::testing::force_avx2_kernels(true);
    let avx2 = f();
    mlxkern::testing::force_avx2_kernels(false);
    let fastest = f();
    (portable, [("AVX2", avx2), ("fastest", fastest)])
}
