//! The CPU features the kernels may use: detected once per process, and (with the `testing`
//! feature, `crate::seams`) the switches that force the portable kernels
//! (`testing::force_portable_kernels`) or the AVX2 ones on a CPU with AVX-512
//! (`testing::force_avx2_kernels`).

use std::sync::OnceLock;

use crate::seams;

/// The extensions the kernels use: x86-64's (all false elsewhere) and arm64's NEON (false
/// elsewhere).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Features {
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    /// AVX-512 Foundation, Byte/Word, Doubleword/Quadword and Vector Length extensions, as
    /// one: every AVX-512 CPU since Skylake-SP has all four.
    pub avx512: bool,
    /// Advanced SIMD on arm64 (part of the base architecture: always there on aarch64).
    pub neon: bool,
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

    /// AVX-512 (F, BW, DQ, VL) with AVX2, FMA and F16C: the AVX-512 kernels, which use the
    /// AVX2 building blocks too.
    pub fn avx512(self) -> bool {
        self.avx512 && self.avx2_fma_f16c()
    }
}

/// What this CPU has, whatever the switches say.
pub fn cpu() -> Features {
    static DETECTED: OnceLock<Features> = OnceLock::new();
    *DETECTED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            Features {
                avx2: has!("avx2"),
                fma: has!("fma"),
                f16c: has!("f16c"),
                avx512: has!("avx512f") && has!("avx512bw") && has!("avx512dq") && has!("avx512vl"),
                neon: false,
            }
        }
        #[cfg(target_arch = "aarch64")]
        {
            Features {
                neon: std::arch::is_aarch64_feature_detected!("neon"),
                ..Features::default()
            }
        }
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        {
            Features::default()
        }
    })
}

/// What the vectorized kernels may use: the CPU's features, none where the portable kernels
/// are forced, and no AVX-512 where the AVX2 ones are.
pub fn kernels() -> Features {
    if seams::portable_forced() {
        Features::default()
    } else if seams::avx2_forced() {
        Features {
            avx512: false,
            ..cpu()
        }
    } else {
        cpu()
    }
}
