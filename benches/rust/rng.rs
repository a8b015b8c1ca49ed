//! The one generator of the Rust test suites and probes: xorshift64*, deterministic per seed.
//! tests/support/mod.rs and benches/rust/common.rs both include this file.

/// xorshift64*: deterministic per seed; seeds come from the clock so every run is fresh. The
/// one generator of the Rust test suites and probes.
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from the clock, or from `MLXK_TEST_SEED` (the printed seed, hex with
    /// 0x or decimal) to replay a run.
    pub fn fresh() -> Rng {
        if let Ok(text) = std::env::var("MLXK_TEST_SEED") {
            let text = text.trim();
            let seed = match text.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => text.parse(),
            }
            .unwrap_or_else(|_| panic!("MLXK_TEST_SEED={text}: not a number"));
            eprintln!("rng seed {seed:#x} (MLXK_TEST_SEED)");
            return Rng(seed | 1);
        }
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let tid = std::thread::current().id();
        let mixed = nanos ^ (format!("{tid:?}").len() as u64).wrapping_mul(0x9E3779B97F4A7C15);
        eprintln!("rng seed {mixed:#x}");
        Rng(mixed | 1)
    }
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    /// A generator seeded through splitmix64's finalizer, so that nearby seeds give unrelated
    /// streams.
    pub fn mixed(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform() * scale).collect()
    }
    /// True `percent` times in a hundred.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    /// One of `from`, uniformly.
    pub fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }
    /// Uniform in [0, 1), in float64.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [lo, hi), in float64.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }
    /// Standard normal (Box-Muller), in float64.
    pub fn normal(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}
