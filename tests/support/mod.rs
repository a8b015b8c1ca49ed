//! What the Rust test suites share: a PRNG, array construction through the C ABI, bf16
//! conversion, error inspection, and the one lock of the tests that need their process alone.
//! Each suite's root declares it (`mod support;`, or `#[path = "../support/mod.rs"]` from a
//! folder); the submodules are the helpers of some suites only:
//! - `api`: inputs held both as safe arrays and as C handles, safe call against C call;
//! - `grad`: float kinds, float64 SiLU, central differences, the gradient error table;
//! - `paths`: portable-vs-vectorized kernels (element kinds, special values, timing);
//! - `pool`: host inputs of the pool calls, pool shapes and slots, recorded launches;
//! - `tree`: random draft trees, paths, a host window of chosen tokens;
//! - `vjp_case`: the update's gradient case, its float64 loss and the C call of either VJP.
#![allow(dead_code, unused_imports)]

pub mod api;
pub mod grad;
pub mod paths;
pub mod pool;
pub mod tree;
pub mod vjp_case;

// The generator is the probes' too (benches/rust/common.rs), so it lives beside them.
#[path = "../../benches/rust/rng.rs"]
mod rng;
pub use rng::Rng;

use std::ffi::CStr;
use std::ptr::null_mut;
use std::sync::{Mutex, MutexGuard};

pub use mlxkern::capi::array::*;
pub use mlxkern::capi::device::*;
pub use mlxkern::capi::gated_delta::pool::*;
pub use mlxkern::capi::gated_delta::tree::*;
pub use mlxkern::capi::gated_delta::*;
pub use mlxkern::capi::mlx::*;
pub use mlxkern::capi::mlxk_array;
pub use mlxkern::capi::status::*;
pub use mlxkern::testing::{
    gated_delta_state_via_gpu, gated_delta_update_chunked_via_gpu, gated_delta_update_via_gpu,
    GpuKernels,
};

pub type H = *mut mlxk_array;

/// Process-wide state some tests read or flip (the live-handle count, the in-place count, the
/// forced kernel paths, the recorded GPU launch): such tests hold this lock, one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        0x7FC0
    } else {
        ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16) as u16
    }
}

/// Whether `a` and `b` hold the same bits, element by element (over the shorter of the two).
pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

pub fn last_error() -> String {
    unsafe { CStr::from_ptr(mlxk_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Asserts `status` is `expected` and the message mentions every word of `needles`.
#[track_caller]
pub fn expect_err(status: mlxk_status, expected: mlxk_status, needles: &[&str]) {
    let msg = last_error();
    assert_eq!(
        status,
        expected,
        "expected {} got {} ({msg})",
        name(expected),
        name(status)
    );
    for n in needles {
        assert!(msg.contains(n), "message {msg:?} lacks {n:?}");
    }
}

#[track_caller]
pub fn ok(status: mlxk_status) {
    assert_eq!(status, MLXK_OK, "{}: {}", name(status), last_error());
}

pub fn name(status: mlxk_status) -> String {
    unsafe { CStr::from_ptr(mlxk_status_name(status)) }
        .to_string_lossy()
        .into_owned()
}

/// `mlxk_array_new` on `bytes`: its status and the handle it made (NULL on failure).
pub fn array_new(bytes: &[u8], shape: &[i32], dtype: mlxk_dtype) -> (mlxk_status, H) {
    let mut out = null_mut();
    let status = array_new_into(bytes, shape, dtype, &mut out);
    (status, out)
}

/// `mlxk_array_new` on `bytes` with the out-parameter `out` as given (NULL included).
pub fn array_new_into(bytes: &[u8], shape: &[i32], dtype: mlxk_dtype, out: *mut H) -> mlxk_status {
    let (data, dims) = (bytes.as_ptr().cast(), shape.as_ptr());
    unsafe { mlxk_array_new(data, dims, shape.len(), dtype, out) }
}

pub fn new_bytes(bytes: &[u8], shape: &[i32], dtype: mlxk_dtype) -> H {
    let (status, out) = array_new(bytes, shape, dtype);
    ok(status);
    out
}

pub fn new_f32(data: &[f32], shape: &[i32]) -> H {
    new_bytes(as_bytes(data), shape, MLXK_DTYPE_FLOAT32)
}

/// Rounds `data` to bf16 and makes a bf16 array.
/// An array of `dtype` holding `data` rounded to it (made in float32, then converted and
/// evaluated).
pub fn typed(data: &[f32], shape: &[i32], dtype: mlxk_dtype) -> H {
    let f = new_f32(data, shape);
    if dtype == MLXK_DTYPE_FLOAT32 {
        return f;
    }
    let mut out = std::ptr::null_mut();
    ok(unsafe { mlxk_array_astype(f, dtype, &mut out) });
    ok(mlxk_array_eval(out));
    free(f);
    out
}

pub fn new_bf16(data: &[f32], shape: &[i32]) -> H {
    let bits: Vec<u16> = data.iter().map(|&x| bf16_bits(x)).collect();
    new_bytes(as_bytes(&bits), shape, MLXK_DTYPE_BFLOAT16)
}

pub fn new_bool(data: &[bool], shape: &[i32]) -> H {
    let bytes: Vec<u8> = data.iter().map(|&b| b as u8).collect();
    new_bytes(&bytes, shape, MLXK_DTYPE_BOOL)
}

pub fn as_bytes<T: Copy>(data: &[T]) -> &[u8] {
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

pub fn read_bytes(a: H) -> Vec<u8> {
    let mut n = 0usize;
    ok(unsafe { mlxk_array_nbytes(a, &mut n) });
    let mut out = vec![0u8; n];
    ok(unsafe { mlxk_array_read(a, out.as_mut_ptr().cast(), n) });
    out
}

pub fn read_f32(a: H) -> Vec<f32> {
    read_bytes(a)
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn read_bf16(a: H) -> Vec<f32> {
    read_bytes(a)
        .chunks_exact(2)
        .map(|c| bf16_to_f32(u16::from_ne_bytes([c[0], c[1]])))
        .collect()
}

pub fn shape_of(a: H) -> Vec<i32> {
    let mut nd = 0usize;
    ok(unsafe { mlxk_array_ndim(a, &mut nd) });
    let mut dims = vec![0i32; nd];
    ok(unsafe { mlxk_array_shape(a, dims.as_mut_ptr(), nd) });
    dims
}

pub fn dtype_of(a: H) -> mlxk_dtype {
    let mut d = -1;
    ok(unsafe { mlxk_array_dtype(a, &mut d) });
    d
}

pub fn free(a: H) {
    ok(mlxk_array_free(a));
}

/// Every value is +0 or -0; `what` names them in a failure.
#[track_caller]
pub fn assert_zeros(values: &[f32], what: &str) {
    assert!(
        values.iter().all(|&x| x == 0.0),
        "{what}: not all zeros: {values:?}"
    );
}

pub fn free_all(hs: &[H]) {
    for &h in hs {
        free(h);
    }
}

/// `n` random values as heads of `dk`, each head scaled to norm `scale` (q and k as mlx-lm
/// normalizes them).
pub fn heads(rng: &mut Rng, n: usize, dk: usize, scale: f32) -> Vec<f32> {
    let mut x = rng.vec(n, 1.0);
    for head in x.chunks_mut(dk) {
        let n = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        head.iter_mut().for_each(|v| *v = *v / n * scale);
    }
    x
}

/// Inputs of one recurrence call, as handles, plus the f32 values behind them.
pub struct Recurrence {
    pub dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    pub q: H,
    pub k: H,
    pub v: H,
    pub a: H,
    pub b: H,
    pub a_log: H,
    pub dt_bias: H,
    pub state: Option<H>,
    pub mask: Option<H>,
}

impl Recurrence {
    /// Random bf16 inputs of the given dims (q, k normalized per head like mlx-lm).
    pub fn random(rng: &mut Rng, dims: [usize; 6], with_state: bool, with_mask: bool) -> Self {
        let [b, t, hk, hv, dk, dv] = dims;
        let qk_shape = [b as i32, t as i32, hk as i32, dk as i32];
        let q = heads(rng, b * t * hk * dk, dk, (dk as f32).powf(-0.5));
        let k = heads(rng, b * t * hk * dk, dk, 1.0);
        let state = with_state.then(|| {
            new_f32(
                &rng.vec(b * hv * dv * dk, 0.5),
                &[b as i32, hv as i32, dv as i32, dk as i32],
            )
        });
        let mask = with_mask.then(|| {
            let m: Vec<bool> = (0..b * t).map(|_| rng.below(4) != 0).collect();
            new_bool(&m, &[b as i32, t as i32])
        });
        Recurrence {
            dims,
            q: new_bf16(&q, &qk_shape),
            k: new_bf16(&k, &qk_shape),
            v: new_bf16(
                &rng.vec(b * t * hv * dv, 1.0),
                &[b as i32, t as i32, hv as i32, dv as i32],
            ),
            a: new_bf16(&rng.vec(b * t * hv, 2.0), &[b as i32, t as i32, hv as i32]),
            b: new_bf16(&rng.vec(b * t * hv, 2.0), &[b as i32, t as i32, hv as i32]),
            a_log: new_f32(&rng.vec(hv, 1.0), &[hv as i32]),
            dt_bias: new_bf16(&rng.vec(hv, 1.0), &[hv as i32]),
            state,
            mask,
        }
    }

    /// q, k, v, a, b, a_log, dt_bias.
    pub fn inputs(&self) -> [H; 7] {
        [
            self.q,
            self.k,
            self.v,
            self.a,
            self.b,
            self.a_log,
            self.dt_bias,
        ]
    }

    pub fn args(&self) -> [*const mlxk_array; 9] {
        let [q, k, v, a, b, a_log, dt_bias] = self.inputs();
        let (state, mask) = (
            self.state.unwrap_or(null_mut()),
            self.mask.unwrap_or(null_mut()),
        );
        [q, k, v, a, b, a_log, dt_bias, state, mask].map(|h| h as *const mlxk_array)
    }

    pub fn run(&self) -> (mlxk_status, H, H) {
        let [q, k, v, a, b, al, dt, s, m] = self.args();
        let (mut y, mut st) = (null_mut(), null_mut());
        let status =
            unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st) };
        (status, y, st)
    }

    /// y and the state of `run`, which must succeed.
    pub fn outputs(&self) -> (H, H) {
        let (status, y, st) = self.run();
        ok(status);
        (y, st)
    }

    pub fn free(self) {
        if let Some(s) = self.state {
            free(s);
        }
        self.free_inputs();
    }
}

/// Host-side bf16 inputs of a recurrence, from which windows of tokens become handles.
pub struct HostRecurrence {
    pub dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    pub q: Vec<u16>,
    pub k: Vec<u16>,
    pub v: Vec<u16>,
    pub a: Vec<u16>,
    pub b: Vec<u16>,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<u16>,
}

impl HostRecurrence {
    pub fn random(rng: &mut Rng, dims: [usize; 6]) -> Self {
        let [b, t, hk, hv, dk, dv] = dims;
        let bits = |v: Vec<f32>| -> Vec<u16> { v.iter().map(|&x| bf16_bits(x)).collect() };
        let q = bits(heads(rng, b * t * hk * dk, dk, (dk as f32).powf(-0.5)));
        let k = bits(heads(rng, b * t * hk * dk, dk, 1.0));
        HostRecurrence {
            dims,
            q,
            k,
            v: bits(rng.vec(b * t * hv * dv, 1.0)),
            a: bits(rng.vec(b * t * hv, 2.0)),
            b: bits(rng.vec(b * t * hv, 2.0)),
            a_log: rng.vec(hv, 1.0),
            dt_bias: bits(rng.vec(hv, 1.0)),
        }
    }

    /// Handles for tokens `[t0, t1)` of every row (state and mask left to the caller).
    pub fn window(&self, t0: usize, t1: usize) -> Recurrence {
        let [b, t, hk, hv, dk, dv] = self.dims;
        let w = t1 - t0;
        let cut = |x: &[u16], per: usize| -> Vec<u16> {
            (0..b)
                .flat_map(|row| x[(row * t + t0) * per..(row * t + t1) * per].to_vec())
                .collect()
        };
        let bf = |x: Vec<u16>, shape: &[i32]| new_bytes(as_bytes(&x), shape, MLXK_DTYPE_BFLOAT16);
        let (bi, wi, hki, hvi, dki, dvi) = (
            b as i32, w as i32, hk as i32, hv as i32, dk as i32, dv as i32,
        );
        Recurrence {
            dims: [b, w, hk, hv, dk, dv],
            q: bf(cut(&self.q, hk * dk), &[bi, wi, hki, dki]),
            k: bf(cut(&self.k, hk * dk), &[bi, wi, hki, dki]),
            v: bf(cut(&self.v, hv * dv), &[bi, wi, hvi, dvi]),
            a: bf(cut(&self.a, hv), &[bi, wi, hvi]),
            b: bf(cut(&self.b, hv), &[bi, wi, hvi]),
            a_log: new_f32(&self.a_log, &[hvi]),
            dt_bias: bf(self.dt_bias.clone(), &[hvi]),
            state: None,
            mask: None,
        }
    }
}

impl Recurrence {
    /// Runs the prefix replay on these inputs (q unused).
    pub fn replay(&self, lengths: &[i32]) -> (mlxk_status, H) {
        replay(self.args(), lengths)
    }

    /// Frees everything but the state (which the caller owns).
    pub fn free_inputs(self) {
        for h in self.inputs() {
            free(h);
        }
        if let Some(m) = self.mask {
            free(m);
        }
    }
}

/// `mlxk_gated_delta_state` on an update's arguments (q and the mask unused): its status and
/// the state it made.
pub fn replay(args: [*const mlxk_array; 9], lengths: &[i32]) -> (mlxk_status, H) {
    let [_, k, v, a, b, al, dt, s, _] = args;
    let (mut out, n) = (null_mut(), lengths.len());
    let status =
        unsafe { mlxk_gated_delta_state(k, v, a, b, al, dt, s, lengths.as_ptr(), n, &mut out) };
    (status, out)
}

/// The head split's dims at Qwen3.5's heads (16 key heads, 32 value heads, 128 wide) on B = 2
/// rows of S = 3 tokens.
pub fn qwen35_split_dims() -> mlxkern::node::silu_rms_heads::Dims {
    mlxkern::node::silu_rms_heads::Dims {
        b: 2,
        s: 3,
        hk: 16,
        hv: 32,
        dk: 128,
        dv: 128,
    }
}

/// What MLX answers when a kernel's GPU launch is handed a CPU stream (MLX without that GPU).
pub fn refused_launch(kernels: GpuKernels) -> &'static str {
    match kernels {
        GpuKernels::Metal => "No Metal back-end",
        GpuKernels::Cuda => "No CUDA back-end",
    }
}

/// Both GPU launches.
pub const GPU_KERNELS: [GpuKernels; 2] = [GpuKernels::Metal, GpuKernels::Cuda];

/// The recurrence's random gate inputs and state for `dims` = B, T, Hk, Hv, Dk, Dv, drawn in
/// this order: a, b (in `dtype`, scale 3), a_log (f32, 1.5), dt_bias (`dtype`, 1) and the state
/// (f32, 0.5; NULL without `state`).
pub fn gate_arrays(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype, state: bool) -> [H; 5] {
    let [b, t, _, hv, dk, dv] = dims;
    let [bi, ti, hvi, dki, dvi] = [b, t, hv, dk, dv].map(|x| x as i32);
    [
        typed(&rng.vec(b * t * hv, 3.0), &[bi, ti, hvi], dtype),
        typed(&rng.vec(b * t * hv, 3.0), &[bi, ti, hvi], dtype),
        new_f32(&rng.vec(hv, 1.5), &[hvi]),
        typed(&rng.vec(hv, 1.0), &[hvi], dtype),
        if state {
            new_f32(&rng.vec(b * hv * dv * dk, 0.5), &[bi, hvi, dvi, dki])
        } else {
            std::ptr::null_mut()
        },
    ]
}

/// Random recurrence inputs q, k (scale `qk`), v, a, b (1), a_log (f32, 1) and dt_bias (0.5)
/// for `dims` = B, T, Hk, Hv, Dk, Dv, drawn in this order; all but a_log made by `make` (values,
/// shape).
pub fn recurrence_arrays(
    rng: &mut Rng,
    dims: [usize; 6],
    qk: f32,
    make: impl Fn(Vec<f32>, &[i32]) -> H,
) -> [H; 7] {
    let [b, t, hk, hv, dk, dv] = dims;
    let [bi, ti, hki, hvi, dki, dvi] = dims.map(|x| x as i32);
    [
        make(rng.vec(b * t * hk * dk, qk), &[bi, ti, hki, dki]),
        make(rng.vec(b * t * hk * dk, qk), &[bi, ti, hki, dki]),
        make(rng.vec(b * t * hv * dv, 1.0), &[bi, ti, hvi, dvi]),
        make(rng.vec(b * t * hv, 1.0), &[bi, ti, hvi]),
        make(rng.vec(b * t * hv, 1.0), &[bi, ti, hvi]),
        new_f32(&rng.vec(hv, 1.0), &[hvi]),
        make(rng.vec(hv, 0.5), &[hvi]),
    ]
}

/// Random arguments of `mlxk_gated_delta_update_from_conv` for `dims` = B, T, Hk, Hv, Dk, Dv:
/// x, q_scale, k_scale, a, b (in `dtype`), a_log (f32), dt_bias (`dtype`), the state (f32, or
/// NULL without `state`) and the mask (NULL without `mask`; with two rows or more row 0 is
/// fully masked, the last token is always real).
pub fn from_conv_arrays(
    rng: &mut Rng,
    dims: [usize; 6],
    dtype: mlxk_dtype,
    state: bool,
    mask: bool,
) -> [H; 9] {
    let [b, t, hk, hv, dk, dv] = dims;
    let c = 2 * hk * dk + hv * dv;
    let [bi, ti, dki] = [b, t, dk].map(|x| x as i32);
    let scale = |rng: &mut Rng, base: f32| -> Vec<f32> {
        (0..dk).map(|_| base * (0.5 + rng.uniform())).collect()
    };
    let qs = scale(rng, (dk as f32).powi(-1));
    let ks = scale(rng, (dk as f32).powf(-0.5));
    let x = typed(&rng.vec(b * t * c, 4.0), &[bi, ti, c as i32], dtype);
    let [a, gate_b, a_log, dt_bias, state] = gate_arrays(rng, dims, dtype, state);
    [
        x,
        typed(&qs, &[dki], dtype),
        typed(&ks, &[dki], dtype),
        a,
        gate_b,
        a_log,
        dt_bias,
        state,
        if mask {
            let m: Vec<bool> = (0..b * t)
                .map(|i| (b < 2 || i >= t) && (i + 1 == b * t || rng.below(4) != 0))
                .collect();
            new_bool(&m, &[bi, ti])
        } else {
            std::ptr::null_mut()
        },
    ]
}

/// The values of an array of any float dtype, converted to float32 by MLX.
pub fn read_widened(a: H) -> Vec<f32> {
    let mut as_f32 = null_mut();
    ok(unsafe { mlxk_array_astype(a, MLXK_DTYPE_FLOAT32, &mut as_f32) });
    let values = read_f32(as_f32);
    free(as_f32);
    values
}
