//! The vectorized head split (`mlxk_silu_rms_heads`) and gated norm (`mlxk_gated_rms_norm`)
//! against their portable code, bit for bit, through the C ABI: many shapes, all three dtypes,
//! mixed gate dtypes, and special values (±0, ±inf, NaN, huge, tiny, subnormal). NaN outputs
//! compare as a class. (Own binary: it flips a process-wide switch.)
//!
//! The ignored `timing` test prints per-call times next to a memory copy of the same bytes:
//! `cargo test --test norm_paths -- --ignored --nocapture timing`, with
//! `MLXK_NUM_THREADS=1` or `2`.

mod common;
use common::*;
use mlxkern::capi::gated_rms_norm::*;
use mlxkern::capi::silu_rms_heads::*;
use std::ptr::null_mut;
use std::sync::Mutex;
use std::time::Instant;

/// The tests of this binary flip the process-wide switch: one at a time.
static SWITCH: Mutex<()> = Mutex::new(());

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Bf16,
    F16,
    F32,
}

const KINDS: [Kind; 3] = [Kind::Bf16, Kind::F16, Kind::F32];

impl Kind {
    fn code(self) -> mlxk_dtype {
        match self {
            Kind::Bf16 => MLXK_DTYPE_BFLOAT16,
            Kind::F16 => MLXK_DTYPE_FLOAT16,
            Kind::F32 => MLXK_DTYPE_FLOAT32,
        }
    }
    fn size(self) -> usize {
        match self {
            Kind::F32 => 4,
            _ => 2,
        }
    }
    fn encode(self, x: f32) -> u32 {
        match self {
            Kind::Bf16 => bf16_bits(x) as u32,
            Kind::F16 => {
                if x.is_nan() {
                    0x7E00
                } else {
                    half::f16::from_f32(x).to_bits() as u32
                }
            }
            Kind::F32 => x.to_bits(),
        }
    }
    fn is_nan(self, bits: u32) -> bool {
        match self {
            Kind::Bf16 => bits & 0x7FFF > 0x7F80,
            Kind::F16 => bits & 0x7FFF > 0x7C00,
            Kind::F32 => f32::from_bits(bits).is_nan(),
        }
    }
    /// Bit patterns worth testing: subnormals, infinities, NaNs (quiet, signalling, signed,
    /// with payloads), the largest finite values and the smallest normals.
    fn specials(self) -> &'static [u32] {
        match self {
            Kind::Bf16 => &[
                0x0001, 0x007F, 0x8001, 0x807F, 0x0080, 0x7F80, 0xFF80, 0x7FC0, 0xFFC1, 0x7F81,
                0xFF81, 0x7F7F, 0xFF7F, 0x0000, 0x8000,
            ],
            Kind::F16 => &[
                0x0001, 0x03FF, 0x8001, 0x83FF, 0x0400, 0x7C00, 0xFC00, 0x7E00, 0xFE01, 0x7C01,
                0xFC01, 0x7BFF, 0xFBFF, 0x0000, 0x8000,
            ],
            Kind::F32 => &[
                0x0000_0001,
                0x007F_FFFF,
                0x8000_0001,
                0x0080_0000,
                0x7F80_0000,
                0xFF80_0000,
                0x7FC0_0000,
                0xFFC0_0001,
                0x7F80_0001,
                0xFFA0_0000,
                0x7F7F_FFFF,
                0xFF7F_FFFF,
                0x0000_0000,
                0x8000_0000,
            ],
        }
    }
    fn raw(self, rng: &mut Rng) -> u32 {
        match self {
            Kind::F32 => rng.next_u64() as u32,
            _ => rng.next_u64() as u32 & 0xFFFF,
        }
    }
}

/// Values that sit on the edges of MLX's exp and sigmoid (the ±88 clamps, saturation).
const EDGES: [f32; 14] = [
    88.0, -88.0, 88.5, -88.5, 87.9, -87.9, 20.0, -20.0, 60.0, -60.0, 1e-3, -1e-3, 0.5, -0.5,
];

/// Values x ≥ 0 whose product x·log2(e) in f32 is exactly k + 0.5: where MLX's exp rounds its
/// integer part half up (in double) and a round-to-nearest-even shortcut would not.
#[allow(clippy::approx_constant)]
fn exp_ties() -> &'static [f32] {
    static TIES: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TIES.get_or_init(|| {
        let mut ties = vec![];
        for k in 0..127 {
            let half = k as f32 + 0.5;
            let base = (half / 1.442695f32).to_bits() as i64;
            for step in -256..256 {
                let x = f32::from_bits((base + step) as u32);
                if x * 1.442695f32 == half {
                    ties.push(x);
                }
            }
        }
        assert!(ties.len() > 50, "only {} ties", ties.len());
        ties
    })
}

/// `n` elements of one segment (a head, a row) in one of several regimes.
fn segment(rng: &mut Rng, kind: Kind, n: usize, out: &mut Vec<u32>) {
    let mode = rng.below(21);
    for _ in 0..n {
        let bits = match mode {
            // Ordinary values at several scales.
            0..=10 => {
                let scale = [0.01f32, 1.0, 4.0, 30.0][(mode % 4) as usize];
                kind.encode(rng.uniform() * scale)
            }
            // Ordinary values with a sprinkling of special ones.
            11..=13 => match rng.below(12) {
                0 => kind.specials()[rng.below(kind.specials().len() as u64) as usize],
                1 => kind.encode(EDGES[rng.below(EDGES.len() as u64) as usize]),
                _ => kind.encode(rng.uniform() * 3.0),
            },
            // Tiny values: squares underflow (sum 0, inv = 1/sqrt(eps)), subnormal inputs.
            14 => {
                let scale = match kind {
                    Kind::F16 => 1e-5,
                    _ => [1e-20f32, 1e-39][rng.below(2) as usize],
                };
                kind.encode(rng.uniform() * scale)
            }
            // Huge values: squares overflow (sum inf, inv 0).
            15 => {
                let scale = match kind {
                    Kind::F16 => 6e4,
                    _ => [1e19f32, 1e30, 3e38][rng.below(3) as usize],
                };
                kind.encode(rng.uniform() * scale)
            }
            // Raw bit patterns (every class).
            16 => kind.raw(rng),
            // Only the edges of exp and sigmoid.
            17 => kind.encode(EDGES[rng.below(EDGES.len() as u64) as usize]),
            // All zeros (±0).
            18 => kind.encode(if rng.below(2) == 0 { 0.0 } else { -0.0 }),
            // Ties of exp's integer part, either sign.
            19 => {
                let ties = exp_ties();
                let x = ties[rng.below(ties.len() as u64) as usize];
                kind.encode(if rng.below(2) == 0 { x } else { -x })
            }
            // Large but finite activations.
            _ => kind.encode(rng.uniform() * 300.0),
        };
        out.push(bits);
    }
}

fn to_bytes(kind: Kind, bits: &[u32]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(bits.len() * kind.size());
    for &b in bits {
        match kind {
            Kind::F32 => bytes.extend_from_slice(&b.to_ne_bytes()),
            _ => bytes.extend_from_slice(&(b as u16).to_ne_bytes()),
        }
    }
    bytes
}

fn from_bytes(kind: Kind, bytes: &[u8]) -> Vec<u32> {
    match kind {
        Kind::F32 => bytes
            .chunks_exact(4)
            .map(|c| u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|c| u16::from_ne_bytes([c[0], c[1]]) as u32)
            .collect(),
    }
}

fn array(kind: Kind, bits: &[u32], shape: &[i32]) -> H {
    new_bytes(&to_bytes(kind, bits), shape, kind.code())
}

/// Asserts the two outputs are equal bit for bit (NaN as a class).
#[track_caller]
fn assert_same(kind: Kind, portable: &[u8], vectorized: &[u8], what: &str) {
    let (a, b) = (from_bytes(kind, portable), from_bytes(kind, vectorized));
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        let same = x == y || (kind.is_nan(x) && kind.is_nan(y));
        assert!(
            same,
            "{what}: element {i}: portable {x:#x}, vectorized {y:#x} ({} elements)",
            a.len()
        );
    }
}

fn eps_of(rng: &mut Rng) -> f32 {
    [1e-6f32, 1e-5, 0.0, 1e-6 / 128.0, 0.1, 1e-30][rng.below(6) as usize]
}

/// Runs `f` with the portable kernels, then with the fastest, and returns both results.
fn both<R>(mut f: impl FnMut() -> R) -> (R, R) {
    mlxkern::testing::force_portable_kernels(true);
    let portable = f();
    mlxkern::testing::force_portable_kernels(false);
    let vectorized = f();
    (portable, vectorized)
}

const HEAD_WIDTHS: [usize; 11] = [1, 3, 5, 8, 31, 33, 64, 100, 127, 128, 0];

fn head_width(rng: &mut Rng) -> usize {
    match HEAD_WIDTHS[rng.below(HEAD_WIDTHS.len() as u64) as usize] {
        0 => 1 + rng.below(128) as usize,
        w => w,
    }
}

fn head_split_case(rng: &mut Rng, kind: Kind, dims: [usize; 5]) {
    let [rows, hk, hv, dk, dv] = dims;
    let c = 2 * hk * dk + hv * dv;
    let mut x = Vec::with_capacity(rows * c);
    for _ in 0..rows {
        for _ in 0..2 * hk {
            segment(rng, kind, dk, &mut x);
        }
        for _ in 0..hv {
            segment(rng, kind, dv, &mut x);
        }
    }
    let (mut qs, mut ks) = (vec![], vec![]);
    segment(rng, kind, dk, &mut qs);
    segment(rng, kind, dk, &mut ks);
    let eps = eps_of(rng);
    let b = if rows % 2 == 0 && rng.below(2) == 0 {
        2
    } else {
        1
    };
    let xh = array(kind, &x, &[b as i32, (rows / b) as i32, c as i32]);
    let qh = array(kind, &qs, &[dk as i32]);
    let kh = array(kind, &ks, &[dk as i32]);
    let (portable, vectorized) = both(|| {
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        ok(unsafe {
            mlxk_silu_rms_heads(
                xh, qh, kh, hk as i32, hv as i32, dv as i32, eps, &mut q, &mut k, &mut v,
            )
        });
        let out = [read_bytes(q), read_bytes(k), read_bytes(v)];
        for h in [q, k, v] {
            free(h);
        }
        out
    });
    for (i, name) in ["q", "k", "v"].iter().enumerate() {
        let what = format!(
            "head split {kind:?} {name} rows {rows} Hk {hk} Hv {hv} Dk {dk} Dv {dv} eps {eps:e}"
        );
        assert_same(kind, &portable[i], &vectorized[i], &what);
    }
    for h in [xh, qh, kh] {
        free(h);
    }
}

#[test]
fn head_split_paths_agree_bit_for_bit() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng::fresh();
    let mut cases = 0;
    for kind in KINDS {
        // Every listed width as both Dk and Dv, then random shapes.
        for &w in &HEAD_WIDTHS[..HEAD_WIDTHS.len() - 1] {
            let rows = 1 + rng.below(40) as usize;
            let hk = 1 + rng.below(3) as usize;
            head_split_case(&mut rng, kind, [rows, hk, 2, w, w]);
            cases += 1;
        }
        for _ in 0..30 {
            let (dk, dv) = (head_width(&mut rng), head_width(&mut rng));
            let hk = 1 + rng.below(32) as usize;
            let hv = 1 + rng.below(32) as usize;
            let c = 2 * hk * dk + hv * dv;
            let rows = (1 + rng.below(300) as usize).min((150_000 / c).max(1));
            head_split_case(&mut rng, kind, [rows, hk, hv, dk, dv]);
            cases += 1;
        }
        // Qwen3.5's shape: full 128-wide heads, one row and many.
        for rows in [1, 17] {
            head_split_case(&mut rng, kind, [rows, 16, 32, 128, 128]);
            cases += 1;
        }
    }
    eprintln!("{cases} head split cases");
    mlxkern::testing::force_portable_kernels(false);
}

const NORM_WIDTHS: [usize; 12] = [1, 7, 31, 64, 100, 128, 129, 256, 1000, 4096, 5000, 0];

fn gated_norm_case(rng: &mut Rng, kind: Kind, gate_kind: Kind, rows: usize, width: usize) {
    let (mut x, mut gate, mut weight) = (vec![], vec![], vec![]);
    for _ in 0..rows {
        segment(rng, kind, width, &mut x);
        segment(rng, gate_kind, width, &mut gate);
    }
    // The weight mostly ordinary (else most rows are NaN or zero), sometimes special.
    if rng.below(4) == 0 {
        segment(rng, kind, width, &mut weight);
    } else {
        weight.extend((0..width).map(|_| kind.encode(rng.uniform() * 2.0)));
    }
    let eps = eps_of(rng);
    let shape: Vec<i32> = if rows % 3 == 0 && rng.below(2) == 0 {
        vec![3, (rows / 3) as i32, width as i32]
    } else {
        vec![rows as i32, width as i32]
    };
    let xh = array(kind, &x, &shape);
    let gh = array(gate_kind, &gate, &shape);
    let wh = array(kind, &weight, &[width as i32]);
    let (portable, vectorized) = both(|| {
        let mut out = null_mut();
        ok(unsafe { mlxk_gated_rms_norm(xh, gh, wh, eps, &mut out) });
        let bytes = read_bytes(out);
        free(out);
        bytes
    });
    let what =
        format!("gated norm {kind:?} gate {gate_kind:?} rows {rows} width {width} eps {eps:e}");
    assert_same(kind, &portable, &vectorized, &what);
    for h in [xh, gh, wh] {
        free(h);
    }
}

#[test]
fn gated_norm_paths_agree_bit_for_bit() {
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng::fresh();
    let mut cases = 0;
    for kind in KINDS {
        for gate_kind in KINDS {
            for &listed in &NORM_WIDTHS {
                let width = match listed {
                    0 => 1 + rng.below(6000) as usize,
                    w => w,
                };
                let rows = (1 + rng.below(300) as usize).min((120_000 / width).max(2));
                gated_norm_case(&mut rng, kind, gate_kind, rows, width);
                cases += 1;
            }
        }
        // Qwen3.5's shape: 32 heads of 128 per token.
        gated_norm_case(&mut rng, kind, kind, 32 * 7, 128);
        cases += 1;
    }
    eprintln!("{cases} gated norm cases");
    mlxkern::testing::force_portable_kernels(false);
}

/// Seconds per call over `iters` timed calls after two warm-up calls: (median, best).
fn per_call(iters: usize, mut f: impl FnMut()) -> (f64, f64) {
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
fn copy_floor(read: usize, written: usize, iters: usize) -> (f64, f64) {
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

fn report(what: &str, api: (f64, f64), kernel: (f64, f64), copy: (f64, f64)) {
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

/// Prints per-call times (median and best) of the head split and the gated norm at Qwen3.5's
/// dimensions, through the C ABI with eval and as the kernel alone, next to a memory copy of
/// the same bytes. `MLXK_NUM_THREADS` picks the threads; `MLXK_TIMING_PORTABLE=1` times the
/// portable kernels.
#[test]
#[ignore]
fn timing() {
    use half::bf16;
    let _switch = SWITCH.lock().unwrap_or_else(|e| e.into_inner());
    let mut rng = Rng::seeded(11);
    let portable = std::env::var_os("MLXK_TIMING_PORTABLE").is_some();
    mlxkern::testing::force_portable_kernels(portable);
    println!(
        "threads {} ({} kernels)",
        mlxkern::testing::cpu_threads(),
        if portable { "portable" } else { "fastest" }
    );
    let bf16_vec = |rng: &mut Rng, n: usize| -> Vec<bf16> {
        (0..n)
            .map(|_| bf16::from_f32(rng.uniform() * 4.0))
            .collect()
    };
    let (hk, hv, dk, dv) = (16usize, 32usize, 128usize, 128usize);
    let c = 2 * hk * dk + hv * dv;
    for s in [1usize, 512] {
        let iters = match (s, portable) {
            (1, _) => 2000,
            (_, true) => 5,
            _ => 40,
        };
        let xs = bf16_vec(&mut rng, s * c);
        let scale = bf16_vec(&mut rng, dk);
        let x = new_bytes(as_bytes(&xs), &[1, s as i32, c as i32], MLXK_DTYPE_BFLOAT16);
        let qs = new_bytes(as_bytes(&scale), &[dk as i32], MLXK_DTYPE_BFLOAT16);
        let api = per_call(iters, || {
            let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
            ok(unsafe {
                mlxk_silu_rms_heads(
                    x, qs, qs, hk as i32, hv as i32, dv as i32, 1e-6, &mut q, &mut k, &mut v,
                )
            });
            ok(mlxk_array_eval(q));
            for h in [q, k, v] {
                free(h);
            }
        });
        let (mut qo, mut ko, mut vo) = (
            vec![bf16::ZERO; s * hk * dk],
            vec![bf16::ZERO; s * hk * dk],
            vec![bf16::ZERO; s * hv * dv],
        );
        let dims = mlxkern::cpu::silu_rms_heads::Dims {
            rows: s,
            hk,
            hv,
            dk,
            dv,
        };
        let kernel = per_call(iters, || {
            mlxkern::cpu::silu_rms_heads::split(
                dims, 1e-6, &xs, &scale, &scale, &mut qo, &mut ko, &mut vo,
            )
        });
        let bytes = 2 * s * c; // S·C bf16 values in, as many out
        let copy = copy_floor(bytes, bytes, iters.min(200));
        report(&format!("head split S={s}"), api, kernel, copy);
        for h in [x, qs] {
            free(h);
        }
    }
    let width = 128;
    for rows in [32usize, 512 * 32] {
        let iters = match (rows, portable) {
            (32, _) => 2000,
            (_, true) => 5,
            _ => 60,
        };
        let (xs, zs) = (
            bf16_vec(&mut rng, rows * width),
            bf16_vec(&mut rng, rows * width),
        );
        let ws = bf16_vec(&mut rng, width);
        let shape = [rows as i32, width as i32];
        let x = new_bytes(as_bytes(&xs), &shape, MLXK_DTYPE_BFLOAT16);
        let z = new_bytes(as_bytes(&zs), &shape, MLXK_DTYPE_BFLOAT16);
        let w = new_bytes(as_bytes(&ws), &[width as i32], MLXK_DTYPE_BFLOAT16);
        let api = per_call(iters, || {
            let mut out = null_mut();
            ok(unsafe { mlxk_gated_rms_norm(x, z, w, 1e-6, &mut out) });
            ok(mlxk_array_eval(out));
            free(out);
        });
        let mut os = vec![bf16::ZERO; rows * width];
        let kernel = per_call(iters, || {
            mlxkern::cpu::gated_rms_norm::norm(width, 1e-6, &xs, &zs, &ws, &mut os)
        });
        let copy = copy_floor(2 * 2 * rows * width, 2 * rows * width, iters.min(200));
        report(
            &format!("gated norm {} x 32 rows x {width}", rows / 32),
            api,
            kernel,
            copy,
        );
        for h in [x, z, w] {
            free(h);
        }
    }
    // MLX's eval round trip on its own: a cheap op (astype of 32 values) through the C ABI.
    let small = new_bf16(&rng.vec(32, 1.0), &[32]);
    let (t, _) = per_call(2000, || {
        let mut out = null_mut();
        ok(unsafe { mlxk_array_astype(small, MLXK_DTYPE_FLOAT32, &mut out) });
        ok(mlxk_array_eval(out));
        free(out);
    });
    println!("eval round trip (astype of 32 values) {:.1} us", t * 1e6);
    free(small);
    mlxkern::testing::force_portable_kernels(false);
}
