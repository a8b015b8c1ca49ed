//! The soak's thin layer over the C ABI: arrays from host data (float32 or bfloat16, the values
//! already representable), reads, frees, statuses turned into errors naming the call.

use std::ffi::CStr;
use std::ptr::null_mut;

pub use mlxkern::capi::array::*;
pub use mlxkern::capi::gated_delta::pool::*;
pub use mlxkern::capi::gated_delta::*;
pub use mlxkern::capi::mlxk_array;
pub use mlxkern::capi::status::*;

pub type H = *mut mlxk_array;

/// A failed call: its name, status and the library's message.
pub fn check(call: &str, status: mlxk_status) -> Result<(), String> {
    if status == MLXK_OK {
        return Ok(());
    }
    let msg = unsafe { CStr::from_ptr(mlxk_last_error()) }
        .to_string_lossy()
        .into_owned();
    let name = unsafe { CStr::from_ptr(mlxk_status_name(status)) }
        .to_string_lossy()
        .into_owned();
    Err(format!("{call}: {name}: {msg}"))
}

/// xorshift64*: deterministic per seed.
pub struct Rng(u64);

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng(seed | 1)
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
    /// Uniform in [0, n).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    /// Uniform in [lo, hi].
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// The element type of q, k, v and the gates: float32 or bfloat16.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    Bf16,
}

impl Elem {
    pub fn dtype(self) -> mlxk_dtype {
        match self {
            Elem::F32 => MLXK_DTYPE_FLOAT32,
            Elem::Bf16 => MLXK_DTYPE_BFLOAT16,
        }
    }
    pub fn bytes(self) -> usize {
        match self {
            Elem::F32 => 4,
            Elem::Bf16 => 2,
        }
    }
    /// `x` rounded to this type (round to nearest even), as float32.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Elem::F32 => x,
            Elem::Bf16 => f32::from_bits(u32::from(bf16_bits(x)) << 16),
        }
    }
}

pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16) as u16
}

/// An array of `elem` holding `data` (already representable in it).
pub fn new_array(data: &[f32], shape: &[usize], elem: Elem) -> Result<H, String> {
    let bytes: Vec<u8> = match elem {
        Elem::F32 => data.iter().flat_map(|x| x.to_ne_bytes()).collect(),
        Elem::Bf16 => data
            .iter()
            .flat_map(|&x| bf16_bits(x).to_ne_bytes())
            .collect(),
    };
    from_bytes(&bytes, shape, elem.dtype())
}

pub fn new_bool(data: &[bool], shape: &[usize]) -> Result<H, String> {
    let bytes: Vec<u8> = data.iter().map(|&b| u8::from(b)).collect();
    from_bytes(&bytes, shape, MLXK_DTYPE_BOOL)
}

/// An array of `dtype` from its host bytes.
fn from_bytes(bytes: &[u8], shape: &[usize], dtype: mlxk_dtype) -> Result<H, String> {
    let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    let mut out = null_mut();
    let status = unsafe {
        mlxk_array_new(
            bytes.as_ptr().cast(),
            dims.as_ptr(),
            dims.len(),
            dtype,
            &mut out,
        )
    };
    check("mlxk_array_new", status)?;
    Ok(out)
}

/// The bytes of an array (evaluates it).
pub fn read_bytes(a: H) -> Result<Vec<u8>, String> {
    let mut n = 0usize;
    check("mlxk_array_nbytes", unsafe { mlxk_array_nbytes(a, &mut n) })?;
    let mut out = vec![0u8; n];
    check("mlxk_array_read", unsafe {
        mlxk_array_read(a, out.as_mut_ptr().cast(), n)
    })?;
    Ok(out)
}

/// A float32 array's values as bit patterns (evaluates it).
pub fn read_bits(a: H) -> Result<Vec<u32>, String> {
    Ok(read_bytes(a)?
        .chunks_exact(4)
        .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

pub fn free(a: H) -> Result<(), String> {
    check("mlxk_array_free", mlxk_array_free(a))
}

/// Handles freed when dropped (the arrays a round builds).
#[derive(Default)]
pub struct Scope(Vec<H>);

impl Scope {
    pub fn keep(&mut self, a: H) -> H {
        self.0.push(a);
        a
    }
    pub fn array(&mut self, data: &[f32], shape: &[usize], elem: Elem) -> Result<H, String> {
        Ok(self.keep(new_array(data, shape, elem)?))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        for &a in &self.0 {
            mlxk_array_free(a);
        }
    }
}

/// Resident memory of this process in bytes (`/proc/self/statm`); 0 where unavailable.
pub fn rss_bytes() -> usize {
    let Ok(text) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: usize = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * usize::try_from(page).unwrap_or(4096)
}
