//! The floating-point mode of a kernel's threads. Intel cores take a microcode assist for every
//! subnormal result or operand (roughly a hundred cycles each); the chunked form's running
//! products of g pass through that range, so whether it runs fast would depend on the mode the
//! host happens to leave in MXCSR (FPCR on arm64). Kernels whose contract allows it (the
//! chunked form, equal to the exact update only up to float32 rounding) run with subnormals
//! flushed to zero instead.

/// Runs `f` with subnormal results flushed to zero and subnormal operands read as zero (MXCSR
/// FTZ and DAZ on x86-64, FPCR.FZ on arm64, which flushes both) on the calling thread,
/// restoring the caller's mode afterwards — also when `f` panics. Elsewhere it just runs `f`.
/// The compiler does not model the mode: only arithmetic whose results `f` stores to memory
/// (as kernels do with their outputs) is sure to run inside it.
pub fn flush_subnormals<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        let _mode = Flush::set();
        f()
    }
    #[cfg(target_arch = "aarch64")]
    {
        let _mode = arm64::Flush::set();
        f()
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        f()
    }
}

#[cfg(target_arch = "aarch64")]
mod arm64 {
    //! FPCR's flush-to-zero bit: subnormal operands and results of single and double
    //! precision arithmetic become zeros of the same sign.

    /// FPCR.FZ.
    const FZ: u64 = 1 << 24;

    /// Restores the saved FPCR when dropped.
    pub(super) struct Flush {
        saved: u64,
    }

    impl Flush {
        pub(super) fn set() -> Flush {
            let saved = fpcr();
            if saved & FZ == 0 {
                set_fpcr(saved | FZ);
            }
            Flush { saved }
        }
    }

    impl Drop for Flush {
        fn drop(&mut self) {
            if fpcr() != self.saved {
                set_fpcr(self.saved);
            }
        }
    }

    /// The calling thread's FPCR.
    pub(super) fn fpcr() -> u64 {
        let value: u64;
        // SAFETY: reading FPCR has no side effect; it is readable at EL0.
        unsafe { std::arch::asm!("mrs {}, fpcr", out(reg) value, options(nomem, nostack)) };
        value
    }

    fn set_fpcr(value: u64) {
        // SAFETY: writes back a value read from FPCR with the FZ mode bit changed.
        unsafe { std::arch::asm!("msr fpcr, {}", in(reg) value, options(nomem, nostack)) };
    }
}

/// The MXCSR bits: flush to zero (15) and denormals are zero (6).
#[cfg(target_arch = "x86_64")]
const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);

/// Restores the saved MXCSR when dropped.
#[cfg(target_arch = "x86_64")]
struct Flush {
    saved: u32,
}

#[cfg(target_arch = "x86_64")]
impl Flush {
    fn set() -> Flush {
        let saved = mxcsr();
        if saved & FTZ_DAZ != FTZ_DAZ {
            set_mxcsr(saved | FTZ_DAZ);
        }
        Flush { saved }
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Flush {
    fn drop(&mut self) {
        if mxcsr() != self.saved {
            set_mxcsr(self.saved);
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn mxcsr() -> u32 {
    let mut value = 0u32;
    // SAFETY: stmxcsr stores the 32-bit MXCSR (SSE, always present on x86-64) at the address.
    unsafe {
        std::arch::asm!("stmxcsr [{}]", in(reg) &mut value, options(nostack, preserves_flags));
    }
    value
}

#[cfg(target_arch = "x86_64")]
fn set_mxcsr(value: u32) {
    // SAFETY: ldmxcsr loads a valid MXCSR value (one read from MXCSR with mode bits added).
    unsafe {
        std::arch::asm!("ldmxcsr [{}]", in(reg) &value, options(nostack, preserves_flags));
    }
}

/// The calling thread's MXCSR (tests check that kernels restore it).
#[cfg(target_arch = "x86_64")]
pub fn thread_mxcsr() -> u32 {
    mxcsr()
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn flushes_inside_and_restores_after() {
        let before = mxcsr();
        let tiny = std::hint::black_box(f32::MIN_POSITIVE);
        let (product, read) = flush_subnormals(|| {
            let p = std::hint::black_box(tiny) * std::hint::black_box(0.5f32);
            let sub = std::hint::black_box(f32::from_bits(1));
            // black_box the results inside: arithmetic whose result stays in registers may be
            // scheduled after the mode is restored (the kernels store theirs to memory).
            (
                std::hint::black_box(p),
                std::hint::black_box(std::hint::black_box(sub) * std::hint::black_box(2.0f32)),
            )
        });
        // The low six bits are sticky status flags that arithmetic sets; compare the mode.
        let mode = |m: u32| m & !0x3F;
        assert_eq!(product, 0.0, "a subnormal result is flushed");
        assert_eq!(read, 0.0, "a subnormal operand reads as zero");
        assert_eq!(mode(mxcsr()), mode(before));
        // Outside: subnormals are back.
        let p = std::hint::black_box(tiny) * std::hint::black_box(0.5f32);
        assert!(p > 0.0);
        // Restored after a panic too.
        let caught = std::panic::catch_unwind(|| flush_subnormals(|| panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(mode(mxcsr()), mode(before));
    }
}

#[cfg(all(test, target_arch = "aarch64"))]
mod tests_arm64 {
    use super::*;

    #[test]
    fn flushes_inside_and_restores_after() {
        let before = arm64::fpcr();
        let tiny = std::hint::black_box(f32::MIN_POSITIVE);
        let (product, read) = flush_subnormals(|| {
            let p = std::hint::black_box(tiny) * std::hint::black_box(0.5f32);
            let sub = std::hint::black_box(f32::from_bits(1));
            (
                std::hint::black_box(p),
                std::hint::black_box(std::hint::black_box(sub) * std::hint::black_box(2.0f32)),
            )
        });
        assert_eq!(product, 0.0, "a subnormal result is flushed");
        assert_eq!(read, 0.0, "a subnormal operand reads as zero");
        assert_eq!(arm64::fpcr(), before);
        let p = std::hint::black_box(tiny) * std::hint::black_box(0.5f32);
        assert!(p > 0.0);
        let caught = std::panic::catch_unwind(|| flush_subnormals(|| panic!("inside")));
        assert!(caught.is_err());
        assert_eq!(arm64::fpcr(), before);
    }
}
