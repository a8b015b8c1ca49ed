//! The switches the test hooks (`crate::testing`, built with the `testing` feature) flip, in
//! one place, and the functions through which the library reads them. Without the feature no
//! switch exists and each function is the library's behaviour, a constant.

#[cfg(feature = "testing")]
pub(crate) mod switches {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};

    /// The GPU kernels' g and beta from MLX's CPU ops (`testing::gpu_gates_on_cpu`).
    pub static GPU_GATES_ON_CPU: AtomicBool = AtomicBool::new(false);
    /// The pool's in-place launch on MLX CUDA: 0 as MLX exports, 1 always, 2 never
    /// (`testing::pool_in_place`).
    pub static POOL_IN_PLACE: AtomicU8 = AtomicU8::new(0);
    /// The update from the convolution's output in one GPU kernel at any T
    /// (`testing::from_conv_one_kernel_any_tokens`).
    pub static FROM_CONV_ANY_T: AtomicBool = AtomicBool::new(false);
    /// CPU kernel outputs that took over an input's buffer (`testing::in_place_updates`).
    pub static IN_PLACE_UPDATES: AtomicUsize = AtomicUsize::new(0);
    /// Every CPU kernel's portable path (`testing::force_portable_kernels`).
    pub static FORCE_PORTABLE: AtomicBool = AtomicBool::new(false);
    /// AVX-512 hidden from the CPU kernels (`testing::force_avx2_kernels`).
    pub static FORCE_AVX2: AtomicBool = AtomicBool::new(false);
    /// `gpu_node` keeps the last launch it hands to MLX (`testing::record_gpu_launches`).
    pub static RECORD_GPU_LAUNCHES: AtomicBool = AtomicBool::new(false);
    /// The matrix tiles' form on MLX CUDA: 0 the configured one, else 1 + its index in
    /// `cuda::TileForm::ALL` (`testing::cuda_tile_form`).
    pub static CUDA_TILE_FORM: AtomicU8 = AtomicU8::new(0);

    thread_local! {
        /// The backend this thread's calls take instead of the default device's
        /// (`ops::Backend::code`; the `testing::*_via_gpu` hooks).
        pub static FORCED_BACKEND: Cell<Option<i64>> = const { Cell::new(None) };
        /// The CPU kernel node evaluated on this thread that fails, and where: (nodes to let
        /// pass first, `FAULT_AT_EVAL` or `FAULT_IN_TASK`) (`testing::fail_cpu_kernel`).
        pub static CPU_KERNEL_FAULT: Cell<Option<(usize, u8)>> = const { Cell::new(None) };
    }
}

#[cfg(feature = "testing")]
use std::sync::atomic::Ordering::Relaxed;

/// `cpu_kernel_fault`'s answers (the bridge's `mlxk_eval_fault` codes): no fault, the node's
/// evaluation raises before its outputs get buffers, its task raises before the kernel runs.
pub(crate) const NO_FAULT: u8 = 0;
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) const FAULT_AT_EVAL: u8 = 1;
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) const FAULT_IN_TASK: u8 = 2;

/// Asked once per CPU kernel node as it is evaluated (on the evaluating thread): whether it
/// fails, and where (library: never).
#[inline]
pub(crate) fn cpu_kernel_fault() -> u8 {
    #[cfg(feature = "testing")]
    return switches::CPU_KERNEL_FAULT.with(|f| match f.get() {
        None => NO_FAULT,
        Some((0, stage)) => {
            f.set(None);
            stage
        }
        Some((after, stage)) => {
            f.set(Some((after - 1, stage)));
            NO_FAULT
        }
    });
    #[cfg(not(feature = "testing"))]
    NO_FAULT
}

/// Whether the GPU kernels' g and beta come from MLX's CPU ops (library: no).
#[inline]
pub(crate) fn gpu_gates_on_cpu() -> bool {
    #[cfg(feature = "testing")]
    return switches::GPU_GATES_ON_CPU.load(Relaxed);
    #[cfg(not(feature = "testing"))]
    false
}

/// The pool's in-place launch forced on (Some(true)) or off (Some(false)); library: None.
#[inline]
pub(crate) fn pool_in_place() -> Option<bool> {
    #[cfg(feature = "testing")]
    return match switches::POOL_IN_PLACE.load(Relaxed) {
        1 => Some(true),
        2 => Some(false),
        _ => None,
    };
    #[cfg(not(feature = "testing"))]
    None
}

/// The matrix tiles' form forced on MLX CUDA launches (library: None, the configured one).
#[inline]
pub(crate) fn cuda_tile_form() -> Option<crate::config::TileForm> {
    #[cfg(feature = "testing")]
    return match switches::CUDA_TILE_FORM.load(Relaxed) {
        0 => None,
        i => crate::config::TileForm::ALL.get(i as usize - 1).copied(),
    };
    #[cfg(not(feature = "testing"))]
    None
}

/// Whether the update from the convolution's output takes one GPU kernel at any T (library:
/// no).
#[inline]
pub(crate) fn from_conv_any_tokens() -> bool {
    #[cfg(feature = "testing")]
    return switches::FROM_CONV_ANY_T.load(Relaxed);
    #[cfg(not(feature = "testing"))]
    false
}

/// Counts CPU kernel outputs that took over an input's buffer (library: nothing).
#[inline]
pub(crate) fn count_in_place_updates(_outputs: usize) {
    #[cfg(feature = "testing")]
    switches::IN_PLACE_UPDATES.fetch_add(_outputs, Relaxed);
}

/// Whether the CPU kernels are held to their portable paths (library: no).
#[inline]
pub(crate) fn portable_forced() -> bool {
    #[cfg(feature = "testing")]
    return switches::FORCE_PORTABLE.load(Relaxed);
    #[cfg(not(feature = "testing"))]
    false
}

/// Whether AVX-512 is hidden from the CPU kernels (library: no).
#[inline]
pub(crate) fn avx2_forced() -> bool {
    #[cfg(feature = "testing")]
    return switches::FORCE_AVX2.load(Relaxed);
    #[cfg(not(feature = "testing"))]
    false
}

/// Whether `gpu_node` records its launches (`ops::LAST_GPU_LAUNCH`, which exists only with
/// the feature).
#[cfg(feature = "testing")]
#[inline]
pub(crate) fn record_gpu_launches() -> bool {
    switches::RECORD_GPU_LAUNCHES.load(Relaxed)
}

/// The backend code this thread's calls are forced to (library: None, the default device's).
#[inline]
pub(crate) fn forced_backend() -> Option<i64> {
    #[cfg(feature = "testing")]
    return switches::FORCED_BACKEND.with(|b| b.get());
    #[cfg(not(feature = "testing"))]
    None
}
