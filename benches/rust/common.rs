//! What the Rust probes share (each declares `mod common;`): the generator (which the test
//! suites include too), arrays through the C ABI, the inputs of one recurrence call at given
//! dims, CPU time, and the per-call timing of the kernel probes.
#![allow(dead_code, unused_imports)]

#[path = "rng.rs"]
mod rng;
pub use rng::Rng;

pub use mlxkern::capi::array::*;
pub use mlxkern::capi::gated_delta::*;
pub use mlxkern::capi::mlx::*;
pub use mlxkern::capi::mlxk_array;
pub use mlxkern::capi::status::*;
use std::ffi::CStr;
use std::ptr::null_mut;
use std::time::Instant;

pub type H = *mut mlxk_array;

/// Panics with the library's message unless `status` is MLXK_OK.
#[track_caller]
pub fn ok(status: mlxk_status) {
    if status != MLXK_OK {
        let msg = unsafe { CStr::from_ptr(mlxk_last_error()) }.to_string_lossy();
        panic!("status {status}: {msg}");
    }
}

pub fn free(a: H) {
    ok(mlxk_array_free(a));
}

/// An evaluated array of `dtype` holding `values` (made in float32, then converted).
pub fn array(values: &[f32], shape: &[usize], dtype: mlxk_dtype) -> H {
    let dims: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
    let mut f = null_mut();
    ok(unsafe {
        mlxk_array_new(
            values.as_ptr().cast(),
            dims.as_ptr(),
            dims.len(),
            MLXK_DTYPE_FLOAT32,
            &mut f,
        )
    });
    if dtype == MLXK_DTYPE_FLOAT32 {
        return f;
    }
    let mut out = null_mut();
    ok(unsafe { mlxk_array_astype(f, dtype, &mut out) });
    ok(mlxk_array_eval(out));
    free(f);
    out
}

/// The bytes of an array.
pub fn read_bytes(a: H) -> Vec<u8> {
    let mut n = 0usize;
    ok(unsafe { mlxk_array_nbytes(a, &mut n) });
    let mut out = vec![0u8; n];
    ok(unsafe { mlxk_array_read(a, out.as_mut_ptr().cast(), n) });
    out
}

/// The values of a float32 array.
pub fn read_f32(a: H) -> Vec<f32> {
    read_bytes(a)
        .chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// `n` random values as heads of `dk`, each head scaled to norm `scale` (q and k as mlx-lm
/// normalizes them).
pub fn unit_heads(rng: &mut Rng, n: usize, dk: usize, scale: f32) -> Vec<f32> {
    let mut x = rng.vec(n, 1.0);
    for head in x.chunks_mut(dk) {
        let norm = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
        head.iter_mut().for_each(|v| *v *= scale / norm);
    }
    x
}

/// The inputs of one `mlxk_gated_delta_update` call at dims [B, T, Hk, Hv, Dk, Dv]: q, k, v, a,
/// b and dt_bias in `dtype`, a_log and the state (if any) in float32, no mask.
pub struct Inputs {
    pub handles: [H; 8], // q, k, v, a, b, a_log, dt_bias, state (NULL: none)
}

impl Inputs {
    pub fn random(rng: &mut Rng, dims: [usize; 6], with_state: bool, dtype: mlxk_dtype) -> Inputs {
        let [b, t, hk, hv, dk, dv] = dims;
        let n = b * t * hk * dk;
        let q = unit_heads(rng, n, dk, (dk as f32).powf(-0.5));
        let k = unit_heads(rng, n, dk, 1.0);
        let f32_ = MLXK_DTYPE_FLOAT32;
        let handles = [
            array(&q, &[b, t, hk, dk], dtype),
            array(&k, &[b, t, hk, dk], dtype),
            array(&rng.vec(b * t * hv * dv, 1.0), &[b, t, hv, dv], dtype),
            array(&rng.vec(b * t * hv, 2.0), &[b, t, hv], dtype),
            array(&rng.vec(b * t * hv, 2.0), &[b, t, hv], dtype),
            array(&rng.vec(hv, 1.0), &[hv], f32_),
            array(&rng.vec(hv, 1.0), &[hv], dtype),
            match with_state {
                true => array(&rng.vec(b * hv * dv * dk, 0.5), &[b, hv, dv, dk], f32_),
                false => null_mut(),
            },
        ];
        Inputs { handles }
    }

    /// q, k, v, a, b, a_log, dt_bias, state, mask: the update's first nine arguments.
    pub fn args(&self) -> [*const mlxk_array; 9] {
        let [q, k, v, a, b, a_log, dt_bias, state] = self.handles;
        [q, k, v, a, b, a_log, dt_bias, state, null_mut()].map(|h| h as *const mlxk_array)
    }

    /// The update: (y, new state).
    pub fn update(&self) -> (H, H) {
        let [q, k, v, a, b, al, dt, s, m] = self.args();
        let (mut y, mut st) = (null_mut(), null_mut());
        ok(unsafe { mlxk_gated_delta_update(q, k, v, a, b, al, dt, s, m, &mut y, &mut st) });
        (y, st)
    }

    pub fn free(self) {
        for h in self.handles.into_iter().filter(|h| !h.is_null()) {
            free(h);
        }
    }
}

/// CPU seconds this process has used (all its threads).
pub fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The process's minor page faults so far (getrusage).
pub fn minor_faults() -> i64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    u.ru_minflt as i64
}

/// The value of environment variable `name` parsed, or `default`.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the probes whose names contain one of the program's arguments (all without one);
/// `cargo bench` passes `--bench`, which is not a name.
pub fn run_probes(probes: &[(&str, fn())]) {
    let names: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    for (name, probe) in probes {
        if names.is_empty() || names.iter().any(|n| name.contains(n.as_str())) {
            println!("== {name}");
            probe();
        }
    }
}

/// Seconds per call over `iters` timed calls after two warm-up calls: (median, best).
pub fn per_call(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
    f();
    f();
    let mut times: Vec<f64> = (0..iters)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (times[iters / 2], times[0])
}

/// A memory copy moving as many bytes as the kernel (its inputs read, its outputs written):
/// (in + out) / 2 bytes between buffers allocated once, the faster of `memcpy` (which on some
/// virtual machines is slow at some alignments: `rep movsb`) and a plain loop of 64-byte moves.
pub fn copy_floor(read: usize, written: usize, iters: usize) -> (f64, f64) {
    let bytes = (read + written) / 2;
    let src = vec![1u8; bytes];
    let mut dst = vec![0u8; bytes];
    let memcpy = per_call(iters, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    });
    let chunks = per_call(iters, || {
        let src = std::hint::black_box(&src);
        for (d, s) in dst.chunks_exact_mut(64).zip(src.chunks_exact(64)) {
            let block: [u8; 64] = s.try_into().unwrap();
            d.copy_from_slice(&block);
        }
        std::hint::black_box(&mut dst);
    });
    (memcpy.0.min(chunks.0), memcpy.1.min(chunks.1))
}

pub fn report(what: &str, api: (f64, f64), kernel: (f64, f64), copy: (f64, f64)) {
    let us = |s: f64| s * 1e6;
    println!(
        "{what:<34} C ABI + eval {:>9.1} us (best {:>9.1})   kernel alone {:>9.1} us (best {:>9.1})   \
         copy {:>7.1} us (best {:>7.1})   median ratio {:.2}",
        us(api.0),
        us(api.1),
        us(kernel.0),
        us(kernel.1),
        us(copy.0),
        us(copy.1),
        api.0 / copy.0
    );
}

/// Starts the timing test: prints the threads and which kernels run; returns the RNG and
/// whether the portable kernels are timed (`MLXK_TIMING_PORTABLE=1`; `MLXK_TIMING_AVX2=1`
/// times the AVX2 kernels on a CPU with AVX-512).
pub fn timing_start() -> (Rng, bool) {
    let rng = Rng::seeded(11);
    let portable = std::env::var_os("MLXK_TIMING_PORTABLE").is_some();
    mlxkern::testing::force_portable_kernels(portable);
    mlxkern::testing::force_avx2_kernels(std::env::var_os("MLXK_TIMING_AVX2").is_some());
    let (avx2, avx512) = mlxkern::testing::kernel_features();
    println!(
        "threads {} ({} kernels)",
        mlxkern::testing::cpu_threads(),
        match (avx2, avx512) {
            (_, true) => "AVX-512",
            (true, false) => "AVX2",
            _ => "portable",
        }
    );
    (rng, portable)
}

/// `n` random bfloat16 values in [-4, 4).
pub fn bf16_vec(rng: &mut Rng, n: usize) -> Vec<half::bf16> {
    (0..n)
        .map(|_| half::bf16::from_f32(rng.uniform() * 4.0))
        .collect()
}

/// Prints MLX's eval round trip on its own: a cheap op (astype of 32 values) through the C ABI.
pub fn eval_round_trip(rng: &mut Rng) {
    let small = array(&rng.vec(32, 1.0), &[32], MLXK_DTYPE_BFLOAT16);
    let (t, _) = per_call(2000, || {
        let mut out = std::ptr::null_mut();
        ok(unsafe { mlxk_array_astype(small, MLXK_DTYPE_FLOAT32, &mut out) });
        ok(mlxk_array_eval(out));
        free(out);
    });
    println!("eval round trip (astype of 32 values) {:.1} us", t * 1e6);
    free(small);
}
