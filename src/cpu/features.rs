//! The CPU features the kernels may use: detected once per process, and the switch that
//! forces the portable kernels (`testing::force_portable_kernels`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Forces every kernel's portable path (tests compare it with the vectorized ones).
pub(crate) static FORCE_PORTABLE: AtomicBool = AtomicBool::new(false);

/// The x86-64 extensions the kernels use (all false on other architectures).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
}

impl Features {
    /// AVX2 and FMA: the chunked form's AVX2 products.
    pub fn avx2_fma(self) -> bool {
        self.avx2 && self.fma
    }

    /// AVX2, FMA and F16C: the kernels built on `simd::avx2`.
    pub fn avx2_fma_f16c(self) -> bool {
        self.avx2 && self.fma && self.f16c
    }
}

/// What this CPU has, whether or not the portable kernels are forced.
pub fn cpu() -> Features {
    static DETECTED: OnceLock<Features> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            Features {
                avx2: std::arch::is_x86_feature_detected!("avx2"),
                fma: std::arch::is_x86_feature_detected!("fma"),
                f16c: std::arch::is_x86_feature_detected!("f16c"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Features::default()
        }
    })
}

/// Whether the process forced the portable kernels.
pub fn portable_forced() -> bool {
    FORCE_PORTABLE.load(Ordering::Relaxed)
}

/// What the vectorized kernels may use: the CPU's features, or none where the portable kernels
/// are forced.
pub fn kernels() -> Features {
    if portable_forced() {
        Features::default()
    } else {
        cpu()
    }
}
