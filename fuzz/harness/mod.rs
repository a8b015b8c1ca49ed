//! The fuzz harness: decodes input bytes into a sequence of C ABI calls and checks each one
//! against the contract of include/mlxkern.h. Shared by the libFuzzer targets
//! (fuzz/fuzz_targets/*.rs) and the corpus replay run by `cargo test` (tests/fuzz_corpus.rs),
//! both of which include this folder with `#[path]`.
//!
//! Checked on every call:
//! - the status is a known code and never MLXK_ERR_PANIC;
//! - the status is one the contract allows for the arguments given: the harness models each
//!   function's rules (from the header, not from the implementation) and computes the set of
//!   statuses the arguments justify; a call whose arguments break no rule must succeed, and a
//!   call that breaks one must fail with one of the statuses of the rules it breaks;
//! - a failure sets a non-empty mlxk_last_error() that starts with "<function>: " and leaves
//!   every out-parameter untouched;
//! - a success returns arrays whose rank, dims, dtype and byte size are the documented ones,
//!   and which evaluate and read back (with per-kernel properties where they are exact);
//! - every handle made is freed (mlxk_array_free returns MLXK_OK once, then
//!   MLXK_ERR_INVALID_HANDLE), and the process's live-handle count is back where it started.
//!
//! Sizes stay small, and the memory limit is set to [`MEMORY_LIMIT`] (some calls lower it to
//! provoke MLXK_ERR_OUT_OF_MEMORY, then restore it).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fmt::Write as _;
use std::ptr::null_mut;
use std::sync::{Mutex, Once};

pub use mlxkern::capi::array::*;
pub use mlxkern::capi::device::*;
pub use mlxkern::capi::gated_delta::*;
pub use mlxkern::capi::gated_rms_norm::*;
pub use mlxkern::capi::glm52::*;
pub use mlxkern::capi::mlx::*;
pub use mlxkern::capi::mlxk_array;
pub use mlxkern::capi::silu_rms_heads::*;
pub use mlxkern::capi::status::*;

mod input;
pub use input::{Fill, Input};

pub mod array;
pub mod gated_delta;
pub mod glm52;
pub mod norms;
pub mod pool;
pub mod tree;

/// The memory limit the harness runs under (process-wide).
pub const MEMORY_LIMIT: usize = 64 << 20;
/// MLX's cache of freed buffers, kept small so that memory stays bounded over long runs.
pub const CACHE_LIMIT: usize = 16 << 20;

pub type H = *mut mlxk_array;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Array,
    GatedDelta,
    Norms,
    NormsVjp,
    GatedDeltaVjp,
    Glm52,
    Pool,
    Tree,
}

impl Target {
    pub const ALL: [Target; 8] = [
        Target::Array,
        Target::GatedDelta,
        Target::Norms,
        Target::NormsVjp,
        Target::GatedDeltaVjp,
        Target::Glm52,
        Target::Pool,
        Target::Tree,
    ];

    /// The target's name: its fuzz_targets/<name>.rs and corpus/<name>/.
    pub fn name(self) -> &'static str {
        match self {
            Target::Array => "array",
            Target::GatedDelta => "gated_delta",
            Target::Norms => "norms",
            Target::NormsVjp => "norms_vjp",
            Target::GatedDeltaVjp => "gated_delta_vjp",
            Target::Glm52 => "glm52",
            Target::Pool => "pool",
            Target::Tree => "tree",
        }
    }
}

static INIT: Once = Once::new();

/// Sets the limits the harness runs under (once per process).
pub fn init() {
    INIT.call_once(|| {
        assert_eq!(mlxk_set_memory_limit(MEMORY_LIMIT), MLXK_OK);
        assert_eq!(mlxk_set_cache_limit(CACHE_LIMIT), MLXK_OK);
    });
}

/// Runs one input through `target`'s call sequence; panics on any contract violation.
/// Not reentrant: the caller runs one input at a time per process (the memory limit and the
/// live-handle count are process-wide).
pub fn run(target: Target, data: &[u8]) {
    init();
    let before = mlxkern::capi::live_handles();
    let mut input = Input::new(data);
    match target {
        Target::Array => array::run(&mut input),
        Target::GatedDelta => gated_delta::run(&mut input),
        Target::Norms => norms::run(&mut input),
        Target::NormsVjp => norms::run_vjp(&mut input),
        Target::GatedDeltaVjp => gated_delta::run_vjp(&mut input),
        Target::Glm52 => glm52::run(&mut input),
        Target::Pool => pool::run(&mut input),
        Target::Tree => tree::run(&mut input),
    }
    let after = mlxkern::capi::live_handles();
    assert_eq!(
        before,
        after,
        "{}: live handles before and after one input",
        target.name()
    );
    let mut limit = 0usize;
    assert_eq!(unsafe { mlxk_get_memory_limit(&mut limit) }, MLXK_OK);
    assert_eq!(limit, MEMORY_LIMIT, "the harness restores the memory limit");
}

// ---------------------------------------------------------------------------------------------
// Statuses and messages

pub fn last_error() -> String {
    let p = mlxk_last_error();
    assert!(!p.is_null(), "mlxk_last_error() returned NULL");
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

pub fn status_name(status: mlxk_status) -> String {
    let p = mlxk_status_name(status);
    assert!(!p.is_null(), "mlxk_status_name returned NULL");
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// What the contract allows for one call: the statuses its arguments require (one of them must
/// be returned; a call that breaks no rule must succeed) and those they permit without
/// requiring (implementation limits the header leaves open, rules the model cannot evaluate
/// once an earlier argument is unusable).
#[derive(Debug, Default, Clone)]
pub struct Expect {
    required: Vec<(mlxk_status, String)>,
    optional: Vec<(mlxk_status, String)>,
}

impl Expect {
    pub fn new() -> Self {
        Expect::default()
    }

    /// The arguments break a rule whose status is `status`.
    pub fn fail(&mut self, status: mlxk_status, why: impl Into<String>) {
        self.required.push((status, why.into()));
    }

    /// The call may fail with `status` (or succeed, if nothing is required).
    pub fn maybe(&mut self, status: mlxk_status, why: impl Into<String>) {
        self.optional.push((status, why.into()));
    }

    /// Every reason recorded, required ones first: (status, why).
    pub fn reasons(&self) -> impl Iterator<Item = &(mlxk_status, String)> {
        self.required.iter().chain(&self.optional)
    }

    pub fn must_fail(&self) -> bool {
        !self.required.is_empty()
    }

    pub fn allows(&self, status: mlxk_status) -> bool {
        self.required
            .iter()
            .chain(&self.optional)
            .any(|(s, _)| *s == status)
    }

    fn describe(&self) -> String {
        let mut s = String::new();
        for (status, why) in &self.required {
            let _ = write!(s, "\n  required {}: {why}", status_name(*status));
        }
        for (status, why) in &self.optional {
            let _ = write!(s, "\n  allowed {}: {why}", status_name(*status));
        }
        s
    }

    /// Checks `status` (just returned by `function`) and, on failure, the thread's message.
    #[track_caller]
    pub fn check(&self, function: &str, status: mlxk_status) {
        check_status(function, status);
        if status == MLXK_OK {
            assert!(
                !self.must_fail(),
                "{function} succeeded, but the contract requires a failure:{}",
                self.describe()
            );
        } else {
            assert!(
                self.allows(status),
                "{function} returned {} ({}), which these arguments do not justify:{}",
                status_name(status),
                last_error(),
                if self.required.is_empty() && self.optional.is_empty() {
                    "\n  (no rule broken: it must succeed)".to_string()
                } else {
                    self.describe()
                }
            );
        }
    }
}

/// How many times each function returned each status (for reports: which paths a corpus
/// reaches).
static STATS: Mutex<BTreeMap<(String, mlxk_status), u64>> = Mutex::new(BTreeMap::new());

/// Takes the counts gathered so far (and resets them).
pub fn take_stats() -> BTreeMap<(String, mlxk_status), u64> {
    std::mem::take(&mut *STATS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// The counts as a table: one line per function, its statuses and counts.
pub fn format_stats(stats: &BTreeMap<(String, mlxk_status), u64>) -> String {
    let mut out = String::new();
    let mut current = "";
    for ((function, status), n) in stats {
        if function != current {
            let _ = write!(out, "\n  {function}:");
            current = function;
        }
        let name = status_name(*status);
        let _ = write!(
            out,
            " {}={n}",
            name.trim_start_matches("MLXK_ERR_")
                .trim_start_matches("MLXK_")
        );
    }
    out
}

/// Checks what holds for every call: a known code, never a panic, and a failure's message.
#[track_caller]
pub fn check_status(function: &str, status: mlxk_status) {
    *STATS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((function.to_string(), status))
        .or_insert(0) += 1;
    assert!(
        (MLXK_OK..=MLXK_ERR_INVALID_HANDLE).contains(&status),
        "{function} returned an unknown status {status}"
    );
    assert_ne!(
        status,
        MLXK_ERR_PANIC,
        "{function} panicked: {}",
        last_error()
    );
    if status != MLXK_OK {
        let msg = last_error();
        assert!(
            msg.starts_with(function)
                && msg[function.len()..].starts_with(": ")
                && msg.len() > function.len() + 2,
            "{function} failed with {} and the message does not name it: {msg:?}",
            status_name(status)
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Dtypes and data

pub const FLOATS: [mlxk_dtype; 3] = [MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32];

pub fn dtype_valid(d: mlxk_dtype) -> bool {
    (MLXK_DTYPE_BOOL..=MLXK_DTYPE_FLOAT32).contains(&d)
}

pub fn is_float(d: mlxk_dtype) -> bool {
    FLOATS.contains(&d)
}

pub fn dtype_size(d: mlxk_dtype) -> usize {
    match d {
        MLXK_DTYPE_BOOL | MLXK_DTYPE_UINT8 | MLXK_DTYPE_INT8 => 1,
        MLXK_DTYPE_FLOAT16 | MLXK_DTYPE_BFLOAT16 => 2,
        MLXK_DTYPE_INT32 | MLXK_DTYPE_UINT32 | MLXK_DTYPE_FLOAT32 => 4,
        _ => panic!("dtype_size of an invalid dtype {d}"),
    }
}

/// Exact element count of `shape` (None if a dim is negative).
pub fn count(shape: &[i64]) -> Option<u128> {
    let mut n: u128 = 1;
    for &d in shape {
        if d < 0 {
            return None;
        }
        n = n.saturating_mul(d as u128);
    }
    Some(n)
}

pub fn count_usize(shape: &[i64]) -> usize {
    count(shape).expect("non-negative dims") as usize
}

/// How array contents are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataMode {
    /// Raw random bits: NaN, Inf, subnormals and huge values everywhere.
    Raw,
    /// Magnitudes in [1/16, 2), random signs: finite everything downstream.
    Nice,
    /// Nice values with NaN, ±Inf, ±0, the largest finite and subnormals sprinkled in.
    Specials,
    /// All zeros.
    Zeros,
}

impl DataMode {
    pub fn pick(input: &mut Input) -> DataMode {
        match input.u8() % 8 {
            7 => DataMode::Raw,
            6 => DataMode::Specials,
            5 => DataMode::Zeros,
            _ => DataMode::Nice,
        }
    }
}

/// One element of `dtype` as little-endian-in-native-order bytes.
fn element(fill: &mut Fill, dtype: mlxk_dtype, mode: DataMode, out: &mut Vec<u8>) {
    let r = fill.next();
    match dtype {
        MLXK_DTYPE_BOOL => out.push(match mode {
            DataMode::Raw => r as u8,
            DataMode::Zeros => 0,
            _ => (r & 1) as u8,
        }),
        MLXK_DTYPE_UINT8 | MLXK_DTYPE_INT8 => {
            out.push(if mode == DataMode::Zeros { 0 } else { r as u8 })
        }
        MLXK_DTYPE_INT32 | MLXK_DTYPE_UINT32 => {
            let v = if mode == DataMode::Zeros { 0 } else { r as u32 };
            out.extend_from_slice(&v.to_ne_bytes())
        }
        MLXK_DTYPE_FLOAT32 => {
            let sign = ((r >> 40) as u32 & 1) << 31;
            let nice = sign | ((123 + (r >> 32) as u32 % 5) << 23) | (r as u32 & 0x7F_FFFF);
            let v = match mode {
                DataMode::Raw => r as u32,
                DataMode::Zeros => 0,
                DataMode::Nice => nice,
                DataMode::Specials => match (r >> 48) % 8 {
                    0 => [
                        0x7FC0_0000,
                        0x7F80_0000,
                        0xFF80_0000,
                        0x8000_0000,
                        0,
                        0x7F7F_FFFF,
                        1,
                        0xFFC0_0001,
                    ][(r >> 56) as usize % 8],
                    _ => nice,
                },
            };
            out.extend_from_slice(&v.to_ne_bytes())
        }
        MLXK_DTYPE_BFLOAT16 | MLXK_DTYPE_FLOAT16 => {
            let bf = dtype == MLXK_DTYPE_BFLOAT16;
            let sign = ((r >> 40) as u16 & 1) << 15;
            let nice = if bf {
                sign | ((123 + (r >> 32) as u16 % 5) << 7) | (r as u16 & 0x7F)
            } else {
                sign | ((11 + (r >> 32) as u16 % 5) << 10) | (r as u16 & 0x3FF)
            };
            let specials: [u16; 8] = if bf {
                [0x7FC0, 0x7F80, 0xFF80, 0x8000, 0, 0x7F7F, 1, 0xFFC1]
            } else {
                [0x7E00, 0x7C00, 0xFC00, 0x8000, 0, 0x7BFF, 1, 0xFE01]
            };
            let v = match mode {
                DataMode::Raw => r as u16,
                DataMode::Zeros => 0,
                DataMode::Nice => nice,
                DataMode::Specials => match (r >> 48) % 8 {
                    0 => specials[(r >> 56) as usize % 8],
                    _ => nice,
                },
            };
            out.extend_from_slice(&v.to_ne_bytes())
        }
        _ => panic!("element of an invalid dtype {dtype}"),
    }
}

/// `n` elements of `dtype`.
pub fn make_data(fill: &mut Fill, n: usize, dtype: mlxk_dtype, mode: DataMode) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * dtype_size(dtype));
    for _ in 0..n {
        element(fill, dtype, mode, &mut out);
    }
    out
}

/// Element `i` of float data as f32 (bf16, f16 or f32 bytes).
pub fn float_at(bytes: &[u8], dtype: mlxk_dtype, i: usize) -> f32 {
    match dtype {
        MLXK_DTYPE_FLOAT32 => f32::from_ne_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()),
        MLXK_DTYPE_BFLOAT16 => {
            f32::from_bits((u16::from_ne_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32) << 16)
        }
        MLXK_DTYPE_FLOAT16 => f16_to_f32(u16::from_ne_bytes([bytes[2 * i], bytes[2 * i + 1]])),
        _ => panic!("float_at of a non-float dtype {dtype}"),
    }
}

pub fn f16_to_f32(h: u16) -> f32 {
    let sign = if h & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exp = ((h >> 10) & 0x1F) as i32;
    let man = (h & 0x3FF) as f32;
    match exp {
        0 => sign * man * 2f32.powi(-24),
        31 => {
            if man == 0.0 {
                sign * f32::INFINITY
            } else {
                f32::NAN
            }
        }
        e => sign * (1.0 + man / 1024.0) * 2f32.powi(e - 15),
    }
}

/// True when every element of float data is finite.
pub fn all_finite(bytes: &[u8], dtype: mlxk_dtype) -> bool {
    let n = bytes.len() / dtype_size(dtype);
    (0..n).all(|i| float_at(bytes, dtype, i).is_finite())
}

/// Floats equal bit for bit, or both NaN.
pub fn same_floats(a: &[u8], b: &[u8], dtype: mlxk_dtype) -> bool {
    if a.len() != b.len() {
        return false;
    }
    if a == b {
        return true;
    }
    let size = dtype_size(dtype);
    (0..a.len() / size).all(|i| {
        a[i * size..(i + 1) * size] == b[i * size..(i + 1) * size]
            || (float_at(a, dtype, i).is_nan() && float_at(b, dtype, i).is_nan())
    })
}

// ---------------------------------------------------------------------------------------------
// Handles

/// A value for a handle argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A live handle the harness made.
    Live,
    Null,
    /// A handle freed earlier (tokens are never reused: dead for ever).
    Dead,
    /// A pointer that was never a handle: a stack or heap address, a dangling one, odd values.
    Foreign,
}

/// Foreign pointers: none of them is a token (tokens are multiples of 8 from 0x1000 up to
/// 0x1000 + 8 * handles-made-so-far), and the library must never read through them (ASan
/// would report the dangling one).
pub struct Foreign {
    heap: Box<[u64; 4]>,
    dangling: usize,
}

impl Foreign {
    pub fn new() -> Self {
        let gone = Box::new([0u64; 4]);
        let dangling = &*gone as *const [u64; 4] as usize;
        drop(gone);
        Foreign {
            heap: Box::new([0; 4]),
            dangling,
        }
    }

    pub fn pick(&self, input: &mut Input) -> H {
        let stack = 0u64;
        let addr = match input.u8() % 8 {
            0 => &stack as *const u64 as usize,
            1 => &*self.heap as *const [u64; 4] as usize,
            2 => self.dangling,
            3 => &self.heap[1] as *const u64 as usize + 3,
            4 => 8,
            5 => 0xFF8,
            6 => 0xDEAD_BEEF,
            _ => usize::MAX - 7,
        };
        addr as H
    }
}

/// A handle value of `kind`, with `live` the handle to use for `Kind::Live`.
pub fn handle_of(kind: Kind, live: H, dead: &[H], foreign: &Foreign, input: &mut Input) -> H {
    match kind {
        Kind::Live => live,
        Kind::Null => null_mut(),
        Kind::Dead => {
            if dead.is_empty() {
                // Make one: a fresh zeros array, freed at once.
                let mut h: H = null_mut();
                let st =
                    unsafe { mlxk_array_zeros([1i32].as_ptr(), 1, MLXK_DTYPE_FLOAT32, &mut h) };
                check_status("mlxk_array_zeros", st);
                assert_eq!(st, MLXK_OK);
                free_ok(h);
                h
            } else {
                dead[input.below(dead.len())]
            }
        }
        Kind::Foreign => foreign.pick(input),
    }
}

/// Records the expectation for handle argument `arg` of kind `kind`; `optional` for one that
/// may be NULL (state, mask).
pub fn expect_handle(e: &mut Expect, arg: &str, kind: Kind, optional: bool) {
    match kind {
        Kind::Live => {}
        Kind::Null if optional => {}
        Kind::Null => e.fail(MLXK_ERR_NULL_POINTER, format!("{arg} is NULL")),
        Kind::Dead => e.fail(MLXK_ERR_INVALID_HANDLE, format!("{arg} was freed")),
        Kind::Foreign => e.fail(MLXK_ERR_INVALID_HANDLE, format!("{arg} is not a handle")),
    }
}

/// Frees a live handle: MLXK_OK, then MLXK_ERR_INVALID_HANDLE for a second free and a use.
#[track_caller]
pub fn free_ok(h: H) {
    let st = mlxk_array_free(h);
    check_status("mlxk_array_free", st);
    assert_eq!(st, MLXK_OK, "freeing a live handle: {}", last_error());
    let st = mlxk_array_free(h);
    check_status("mlxk_array_free", st);
    assert_eq!(st, MLXK_ERR_INVALID_HANDLE, "double free of {h:p}");
    let mut nd = 0usize;
    let st = unsafe { mlxk_array_ndim(h, &mut nd) };
    check_status("mlxk_array_ndim", st);
    assert_eq!(st, MLXK_ERR_INVALID_HANDLE, "use after free of {h:p}");
}

/// Makes an array that must be made (valid arguments, within the limit).
#[track_caller]
pub fn new_array(bytes: &[u8], shape: &[i64], dtype: mlxk_dtype) -> H {
    assert!(
        shape.iter().all(|&d| (0..=i32::MAX as i64).contains(&d)),
        "harness: dims {shape:?}"
    );
    let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    let mut h: H = null_mut();
    let data = if bytes.is_empty() {
        std::ptr::null()
    } else {
        bytes.as_ptr().cast()
    };
    let st = unsafe { mlxk_array_new(data, dims.as_ptr(), dims.len(), dtype, &mut h) };
    check_status("mlxk_array_new", st);
    assert_eq!(
        st,
        MLXK_OK,
        "mlxk_array_new {shape:?} {dtype}: {}",
        last_error()
    );
    h
}

/// Checks a live result's rank, dims, dtype and byte size, then reads it (which evaluates it).
#[track_caller]
pub fn check_result(what: &str, h: H, shape: &[i64], dtype: mlxk_dtype) -> Vec<u8> {
    assert!(!h.is_null(), "{what}: a success wrote a NULL handle");
    let mut nd = usize::MAX;
    assert_eq!(
        unsafe { mlxk_array_ndim(h, &mut nd) },
        MLXK_OK,
        "{what}: ndim"
    );
    assert_eq!(nd, shape.len(), "{what}: rank");
    let mut dims = vec![-7i32; nd + 1];
    assert_eq!(
        unsafe { mlxk_array_shape(h, dims.as_mut_ptr(), dims.len()) },
        MLXK_OK
    );
    let want: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    assert_eq!(&dims[..nd], &want[..], "{what}: dims");
    assert_eq!(dims[nd], -7, "{what}: mlxk_array_shape wrote past ndim");
    let mut dt = -1;
    assert_eq!(unsafe { mlxk_array_dtype(h, &mut dt) }, MLXK_OK);
    assert_eq!(dt, dtype, "{what}: dtype");
    let mut nbytes = usize::MAX;
    assert_eq!(unsafe { mlxk_array_nbytes(h, &mut nbytes) }, MLXK_OK);
    let n = count_usize(shape) * dtype_size(dtype);
    assert_eq!(nbytes, n, "{what}: nbytes");
    let mut out = vec![0xA5u8; n];
    let st = unsafe { mlxk_array_read(h, out.as_mut_ptr().cast(), n) };
    check_status("mlxk_array_read", st);
    assert_eq!(st, MLXK_OK, "{what}: reading a result: {}", last_error());
    out
}

/// A sentinel for out-parameters: a failure must leave it in place.
pub const SENTINEL: usize = 0x5E57_1000_0000 | 0x7;

pub fn sentinel() -> H {
    SENTINEL as H
}

/// Temporarily lowers the memory limit for one call (then restore with [`restore_limit`]).
pub fn tight_limit(input: &mut Input) -> Option<usize> {
    if input.chance(24) {
        let limit = input.pick(&[1usize, 64, 1024, 4096, 16384, 65536, 262144, 1 << 20]);
        assert_eq!(mlxk_set_memory_limit(limit), MLXK_OK);
        Some(limit)
    } else {
        None
    }
}

pub fn restore_limit() {
    assert_eq!(mlxk_set_memory_limit(MEMORY_LIMIT), MLXK_OK);
}

/// The limit now in force.
pub fn current_limit(tight: Option<usize>) -> u128 {
    tight.unwrap_or(MEMORY_LIMIT) as u128
}

/// An eps: usually a sensible one, sometimes one the kernels must refuse.
pub fn pick_eps(input: &mut Input, sensible: f32) -> f32 {
    match input.u8() % 16 {
        15 => 0.0,
        14 => f32::NAN,
        13 => f32::INFINITY,
        12 => f32::NEG_INFINITY,
        11 => -1e-6,
        10 => f32::MAX,
        9 => -0.0,
        8 => f32::from_bits(1),
        7 => 1e-5,
        _ => sensible,
    }
}

pub fn eps_valid(eps: f32) -> bool {
    eps.is_finite() && eps >= 0.0
}
