//! The kernels on arm64, NEON against portable: each case runs a node through
//! `cpu::mlxk_cpu_kernel` (the entry MLX's CPU stream calls) twice, with the NEON kernels and
//! with the portable ones forced, on the same random inputs, and compares the outputs bit for
//! bit where the kernels promise bits (docs/DESIGN.md §3), or within float32 rounding where
//! they do not (the chunked form; its products are compared with their model bit for bit in
//! `gemm`).

mod gated_delta;
mod gated_rms_norm;
mod silu_rms_heads;

use std::sync::atomic::Ordering;
use std::sync::Mutex;

use half::{bf16, f16};

use crate::cpu::features;
use crate::dtype::Dtype;

/// The tests switch `FORCE_PORTABLE`, a process-wide flag: one at a time.
static SWITCH: Mutex<()> = Mutex::new(());

pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in [-scale, scale).
    pub fn uniform(&mut self, scale: f32) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    }

    pub fn values(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(scale)).collect()
    }
}

/// A buffer as MLX hands it to a kernel: bytes, 4-byte aligned.
#[derive(Clone, Debug)]
pub struct Buffer {
    words: Vec<u32>,
    bytes: usize,
}

impl Buffer {
    pub fn zeroed(bytes: usize) -> Buffer {
        Buffer {
            words: vec![0; bytes.div_ceil(4)],
            bytes,
        }
    }

    /// `values` as elements of the float dtype `dtype` (MLX's rounding).
    pub fn floats(values: &[f32], dtype: Dtype) -> Buffer {
        let mut b = Buffer::zeroed(values.len() * dtype.size());
        crate::cpu::elem::narrow(values, b.bytes_mut(), dtype);
        b
    }

    pub fn raw(bytes: &[u8]) -> Buffer {
        let mut b = Buffer::zeroed(bytes.len());
        b.bytes_mut().copy_from_slice(bytes);
        b
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: the words hold at least `bytes` bytes.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.bytes) }
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.bytes) }
    }

    /// The elements as f32 (a float dtype).
    pub fn widen(&self, dtype: Dtype) -> Vec<f32> {
        crate::cpu::elem::widen(self.bytes(), dtype)
    }
}

/// Runs kernel `kernel` of a node (`params`) on `inputs`, into fresh outputs of `output_bytes`.
pub fn run_node(
    kernel: u32,
    params: &[i64],
    inputs: &[Buffer],
    output_bytes: &[usize],
) -> Vec<Buffer> {
    let mut outputs: Vec<Buffer> = output_bytes.iter().map(|&n| Buffer::zeroed(n)).collect();
    let input_ptrs: Vec<usize> = inputs.iter().map(|b| b.words.as_ptr() as usize).collect();
    let input_bytes: Vec<usize> = inputs.iter().map(|b| b.bytes).collect();
    let output_ptrs: Vec<usize> = outputs
        .iter_mut()
        .map(|b| b.words.as_mut_ptr() as usize)
        .collect();
    let aliased = vec![-1; outputs.len()];
    // SAFETY: live, distinct buffers of the sizes given; none aliased or donated.
    let result = unsafe {
        crate::cpu::mlxk_cpu_kernel(
            kernel,
            params,
            &input_ptrs,
            &input_bytes,
            &output_ptrs,
            output_bytes,
            &aliased,
            &aliased,
            "",
        )
    };
    if let Err(e) = result {
        panic!("kernel {kernel} failed: {e}");
    }
    outputs
}

/// `run` with the NEON kernels, then with the portable ones forced.
pub fn neon_and_portable<R>(run: impl Fn() -> R) -> (R, R) {
    let _one = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    assert!(features::kernels().neon, "NEON is part of every arm64 CPU");
    let neon = run();
    crate::seams::switches::FORCE_PORTABLE.store(true, Ordering::Relaxed);
    assert!(!features::kernels().neon);
    let portable = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&run));
    crate::seams::switches::FORCE_PORTABLE.store(false, Ordering::Relaxed);
    (
        neon,
        portable.unwrap_or_else(|e| std::panic::resume_unwind(e)),
    )
}

/// Floats equal bit for bit, any NaN equal to any NaN.
pub fn same_bits(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
            "{what}[{i}]: NEON {x:e} ({:#x}) vs portable {y:e} ({:#x})",
            x.to_bits(),
            y.to_bits()
        );
    }
}

/// The float dtypes.
pub const FLOATS: [Dtype; 3] = [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32];

/// Values of a 16-bit type's every bit pattern (for the transcendental tables).
pub fn every_bf16() -> Vec<f32> {
    (0..=u16::MAX)
        .map(|b| bf16::from_bits(b).to_f32())
        .collect()
}

pub fn every_f16() -> Vec<f32> {
    (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect()
}
