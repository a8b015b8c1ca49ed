//! The CPU kernels, in safe Rust over slices, and the one entry MLX's stream thread calls.
//!
//! Each kernel reproduces its Metal kernel's rounding points and reduction order (docs/DESIGN.md §3),
//! so the CPU and the Metal text compute the same bits given the same transcendental results.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::error::{panic_message, KERNEL_PANIC_TAG};
use crate::node::Kernel;

pub mod elem;
pub mod features;
pub mod fp;
pub mod gated_delta;
pub mod gated_rms_norm;
pub mod grad;
pub mod math;
pub mod pool;
pub mod reduce;
pub mod silu_rms_heads;
pub mod simd;

/// One kernel call's buffers, as MLX handed them over.
pub struct Buffers<'a> {
    /// Inputs in launch order; an input whose buffer an output took over is empty here.
    pub inputs: Vec<&'a [u8]>,
    pub outputs: Vec<&'a mut [u8]>,
    /// Per output, the input it took the buffer of (that input's data is in the output).
    pub aliased: Vec<Option<usize>>,
}

/// Reinterprets bytes as elements (all bit patterns are valid for the types used here).
pub fn typed<T: Copy>(bytes: &[u8]) -> &[T] {
    // SAFETY: T is a plain float/integer type for which every bit pattern is valid.
    let (head, body, tail) = unsafe { bytes.align_to::<T>() };
    assert!(
        head.is_empty() && tail.is_empty(),
        "misaligned or ragged kernel buffer"
    );
    body
}

pub fn typed_mut<T: Copy>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: as in `typed`.
    let (head, body, tail) = unsafe { bytes.align_to_mut::<T>() };
    assert!(
        head.is_empty() && tail.is_empty(),
        "misaligned or ragged kernel buffer"
    );
    body
}

fn run(kernel: u32, params: &[i64], buffers: Buffers) {
    match Kernel::from_code(kernel) {
        Some(Kernel::GatedDelta | Kernel::GatedDeltaChunked | Kernel::GatedDeltaState) => {
            gated_delta::node::run(params, buffers)
        }
        Some(Kernel::GatedDeltaBackward) => gated_delta::node::run_backward(params, buffers),
        Some(Kernel::SiluRmsHeads) => silu_rms_heads::run(params, buffers),
        Some(Kernel::GatedRmsNorm) => gated_rms_norm::run(params, buffers),
        Some(Kernel::SiluRmsHeadsBackward) => silu_rms_heads::backward::run(params, buffers),
        Some(Kernel::GatedRmsNormBackward) => gated_rms_norm::backward::run(params, buffers),
        Some(Kernel::PanicProbe) => panic!("panic probe kernel ran"),
        // GPU only: on the CPU the head split and the update run as nodes of their own.
        Some(Kernel::GatedDeltaFromConv) | None => panic!("unknown CPU kernel {kernel}"),
    }
}

/// Called by the bridge on MLX's CPU stream thread. Never unwinds: a panic comes back as an
/// error string, which the bridge throws and MLX re-throws from `eval`.
///
/// # Safety
/// Each `(ptr, bytes)` pair must be a live buffer MLX allocated for this node (outputs
/// writable), and no two may overlap except where `aliased` says an output took over an input.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn mlxk_cpu_kernel(
    kernel: u32,
    params: &[i64],
    input_ptrs: &[usize],
    input_bytes: &[usize],
    output_ptrs: &[usize],
    output_bytes: &[usize],
    aliased: &[i32],
    donate_from: &[i32],
    failed: &str,
) -> Result<(), String> {
    if !failed.is_empty() {
        // SAFETY: the caller's contract.
        unsafe {
            keep_inputs(
                input_ptrs,
                input_bytes,
                output_ptrs,
                output_bytes,
                aliased,
                donate_from,
            )
        };
        return Err(failed.to_string());
    }
    let aliased: Vec<Option<usize>> = aliased
        .iter()
        .map(|&a| if a >= 0 { Some(a as usize) } else { None })
        .collect();
    let taken: Vec<usize> = aliased.iter().flatten().copied().collect();
    crate::seams::count_in_place_updates(taken.len());
    let inputs = input_ptrs
        .iter()
        .zip(input_bytes)
        .enumerate()
        .map(|(i, (&ptr, &len))| {
            if len == 0 || ptr == 0 || taken.contains(&i) {
                &[][..]
            } else {
                // SAFETY: the caller's contract; taken-over inputs are skipped (no aliasing).
                unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }
            }
        })
        .collect();
    let outputs = output_ptrs
        .iter()
        .zip(output_bytes)
        .map(|(&ptr, &len)| {
            if len == 0 || ptr == 0 {
                &mut [][..]
            } else {
                // SAFETY: the caller's contract: distinct writable buffers.
                unsafe { std::slice::from_raw_parts_mut(ptr as *mut u8, len) }
            }
        })
        .collect();
    let buffers = Buffers {
        inputs,
        outputs,
        aliased,
    };
    catch_unwind(AssertUnwindSafe(|| run(kernel, params, buffers))).map_err(|payload| {
        // SAFETY: the caller's contract; the kernel's borrows ended with the unwind.
        unsafe { poison(output_ptrs, output_bytes) };
        format!("{KERNEL_PANIC_TAG}{}", panic_message(&*payload))
    })
}

/// A node that fails before its kernel ran (docs/serving.md, "Faults"): an output that would
/// take over an input holds that input (a buffer it took over is left as it is, else the
/// input is copied in), so a donated or kept pool comes back with every state it had; every
/// other output is poisoned.
///
/// # Safety
/// As `mlxk_cpu_kernel`'s.
unsafe fn keep_inputs(
    input_ptrs: &[usize],
    input_bytes: &[usize],
    output_ptrs: &[usize],
    output_bytes: &[usize],
    aliased: &[i32],
    donate_from: &[i32],
) {
    for (o, (&ptr, &len)) in output_ptrs.iter().zip(output_bytes).enumerate() {
        let took_over = aliased.get(o).is_some_and(|&a| a >= 0);
        let from = donate_from.get(o).and_then(|&i| usize::try_from(i).ok());
        match from.filter(|&i| input_bytes.get(i) == Some(&len) && input_ptrs[i] != 0) {
            _ if took_over => {}
            Some(i) if ptr != 0 => {
                // SAFETY: the caller's contract: input i and output o are distinct live buffers
                // of `len` bytes (the output did not take the input over).
                unsafe {
                    std::ptr::copy_nonoverlapping(input_ptrs[i] as *const u8, ptr as *mut u8, len)
                };
            }
            // SAFETY: the caller's contract.
            _ => unsafe { poison(&[ptr], &[len]) },
        }
    }
}

/// Whatever a failed kernel left half-written becomes all-ones bytes (NaN for every float
/// dtype), so nothing computed from these outputs later can pass for a valid result.
///
/// # Safety
/// Each `(ptr, bytes)` pair is a writable buffer no one else uses during the call.
unsafe fn poison(output_ptrs: &[usize], output_bytes: &[usize]) {
    for (&ptr, &len) in output_ptrs.iter().zip(output_bytes) {
        if ptr != 0 && len != 0 {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::write_bytes(ptr as *mut u8, 0xFF, len) };
        }
    }
}
