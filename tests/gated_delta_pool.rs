//! The engine-shaped calls through the C ABI: a pool call equals gathering the slots, the
//! dense call and scattering back, bit for bit; packed prefill equals one call per sequence;
//! verify + commit equals the replay of the accepted tokens; the pool is updated in place;
//! argument errors name the argument.

mod common;
use common::*;
use std::ptr::{null, null_mut};

/// Host values of one call's inputs (any float dtype for q, k, v), rows of T tokens.
struct Host {
    dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    dtype: mlxk_dtype,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
}

impl Host {
    fn random(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype) -> Host {
        let [b, t, hk, hv, dk, dv] = dims;
        let mut norm = |scale: f32| -> Vec<f32> {
            let mut x = rng.vec(b * t * hk * dk, 1.0);
            for head in x.chunks_mut(dk) {
                let n = head.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-6);
                head.iter_mut().for_each(|v| *v = *v / n * scale);
            }
            x
        };
        let q = norm((dk as f32).powf(-0.5));
        let k = norm(1.0);
        Host {
            dims,
            dtype,
            q,
            k,
            v: rng.vec(b * t * hv * dv, 1.0),
            a: rng.vec(b * t * hv, 2.0),
            b: rng.vec(b * t * hv, 2.0),
            a_log: rng.vec(hv, 1.0),
            dt_bias: rng.vec(hv, 1.0),
        }
    }

    /// Handles for rows `rows` (all tokens), or with `packed` the same rows' tokens
    /// concatenated as one row (`[1, rows·T, ...]`). Tokens `[0, t)` of each row.
    fn arrays(&self, rows: &[usize], t: usize, packed: bool) -> [H; 7] {
        let [_, tt, hk, hv, dk, dv] = self.dims;
        let cut = |x: &[f32], per: usize| -> Vec<f32> {
            rows.iter()
                .flat_map(|&r| x[r * tt * per..(r * tt + t) * per].to_vec())
                .collect()
        };
        let (b, tt_out) = match packed {
            true => (1, (rows.len() * t) as i32),
            false => (rows.len() as i32, t as i32),
        };
        let (hk, hv, dk, dv) = (hk as i32, hv as i32, dk as i32, dv as i32);
        [
            typed(
                &cut(&self.q, hk as usize * dk as usize),
                &[b, tt_out, hk, dk],
                self.dtype,
            ),
            typed(
                &cut(&self.k, hk as usize * dk as usize),
                &[b, tt_out, hk, dk],
                self.dtype,
            ),
            typed(
                &cut(&self.v, hv as usize * dv as usize),
                &[b, tt_out, hv, dv],
                self.dtype,
            ),
            typed(
                &cut(&self.a, hv as usize),
                &[b, tt_out, hv],
                MLXK_DTYPE_BFLOAT16,
            ),
            typed(
                &cut(&self.b, hv as usize),
                &[b, tt_out, hv],
                MLXK_DTYPE_FLOAT32,
            ),
            new_f32(&self.a_log, &[hv]),
            typed(&self.dt_bias, &[hv], MLXK_DTYPE_BFLOAT16),
        ]
    }

    fn state_len(&self) -> usize {
        let [_, _, _, hv, dk, dv] = self.dims;
        hv * dv * dk
    }
}

fn free_all(hs: &[H]) {
    for &h in hs {
        free(h);
    }
}

fn pool_shape(host: &Host, n: usize) -> [i32; 4] {
    let [_, _, _, hv, dk, dv] = host.dims;
    [n as i32, hv as i32, dv as i32, dk as i32]
}

/// The dense reference: the rows' states gathered from `pool` (zeros for fresh and padding
/// rows), the dense update (or chunked), and (y, states).
fn dense(
    host: &Host,
    pool: &[f32],
    slots: &[i32],
    fresh: &[u8],
    mask: Option<&[bool]>,
    chunk: Option<i32>,
) -> (Vec<u8>, Vec<f32>) {
    let [b, t, ..] = host.dims;
    let per = host.state_len();
    let mut start = vec![0.0f32; b * per];
    for (row, &slot) in slots.iter().enumerate() {
        if slot >= 0 && fresh[row] == 0 {
            let s = slot as usize;
            start[row * per..(row + 1) * per].copy_from_slice(&pool[s * per..(s + 1) * per]);
        }
    }
    let rows: Vec<usize> = (0..b).collect();
    let x = host.arrays(&rows, t, false);
    let state = new_f32(&start, &pool_shape(host, b));
    let mask_h = mask.map(|m| new_bool(m, &[b as i32, t as i32]));
    let m = mask_h.unwrap_or(null_mut());
    let (mut y, mut s) = (null_mut(), null_mut());
    let [q, k, v, a, bb, al, dt] = x;
    ok(unsafe {
        match chunk {
            None => mlxk_gated_delta_update(q, k, v, a, bb, al, dt, state, m, &mut y, &mut s),
            Some(c) => {
                mlxk_gated_delta_update_chunked(q, k, v, a, bb, al, dt, state, m, c, &mut y, &mut s)
            }
        }
    });
    let out = (read_bytes(y), read_f32(s));
    free_all(&x);
    free_all(&[state, y, s]);
    if let Some(m) = mask_h {
        free(m);
    }
    out
}

/// The pool call on the same inputs: (y, new pool).
#[allow(clippy::too_many_arguments)]
fn pooled(
    host: &Host,
    pool: &[f32],
    n: usize,
    slots: &[i32],
    fresh: Option<&[u8]>,
    mask: Option<&[bool]>,
    chunk: Option<i32>,
) -> (Vec<u8>, Vec<f32>) {
    let [b, t, ..] = host.dims;
    let rows: Vec<usize> = (0..b).collect();
    let x = host.arrays(&rows, t, false);
    let pool_h = new_f32(pool, &pool_shape(host, n));
    let mask_h = mask.map(|m| new_bool(m, &[b as i32, t as i32]));
    let m = mask_h.unwrap_or(null_mut());
    let fresh_p = fresh.map_or(null(), |f| f.as_ptr());
    let (mut y, mut p) = (null_mut(), null_mut());
    let [q, k, v, a, bb, al, dt] = x;
    let (sp, ns) = (slots.as_ptr(), slots.len());
    ok(unsafe {
        match chunk {
            None => mlxk_gated_delta_update_pool(
                q, k, v, a, bb, al, dt, pool_h, sp, fresh_p, ns, m, &mut y, &mut p,
            ),
            Some(c) => mlxk_gated_delta_update_pool_chunked(
                q, k, v, a, bb, al, dt, pool_h, sp, fresh_p, ns, m, c, &mut y, &mut p,
            ),
        }
    });
    free(pool_h);
    assert_eq!(shape_of(p), pool_shape(host, n));
    let out = (read_bytes(y), read_f32(p));
    free_all(&x);
    free_all(&[y, p]);
    if let Some(m) = mask_h {
        free(m);
    }
    out
}

/// `b` distinct slots below `n`, about a quarter of them negative (padding rows).
fn random_slots(rng: &mut Rng, b: usize, n: usize) -> Vec<i32> {
    let mut free_rows: Vec<i32> = (0..n as i32).collect();
    (0..b)
        .map(|_| {
            if free_rows.is_empty() || rng.below(4) == 0 {
                -1 - rng.below(3) as i32
            } else {
                free_rows.swap_remove(rng.below(free_rows.len() as u64) as usize)
            }
        })
        .collect()
}

fn elem_size(dtype: mlxk_dtype) -> usize {
    if dtype == MLXK_DTYPE_FLOAT32 {
        4
    } else {
        2
    }
}

/// Checks a pool call against the dense reference: rows with a slot give the dense y and put
/// the dense state in their slot; padding rows give y = 0; other slots keep their bits.
#[allow(clippy::too_many_arguments)]
fn check_case(
    rng: &mut Rng,
    dims: [usize; 6],
    dtype: mlxk_dtype,
    n: usize,
    masked: bool,
    with_fresh: bool,
    chunk: Option<i32>,
) {
    let [b, t, _, hv, _, dv] = dims;
    let host = Host::random(rng, dims, dtype);
    let per = host.state_len();
    let pool = rng.vec(n * per, 0.5);
    let slots = random_slots(rng, b, n);
    let fresh: Vec<u8> = (0..b)
        .map(|_| (with_fresh && rng.below(3) == 0) as u8)
        .collect();
    let mask: Option<Vec<bool>> = masked.then(|| (0..b * t).map(|_| rng.below(4) != 0).collect());
    let (y_ref, s_ref) = dense(&host, &pool, &slots, &fresh, mask.as_deref(), chunk);
    let fresh_arg = with_fresh.then_some(&fresh[..]);
    let (y, new_pool) = pooled(&host, &pool, n, &slots, fresh_arg, mask.as_deref(), chunk);
    let what = format!("dims {dims:?} dtype {dtype} N {n} slots {slots:?} fresh {fresh:?} mask {masked} chunk {chunk:?}");
    let y_row = t * hv * dv * elem_size(dtype);
    for (row, &slot) in slots.iter().enumerate() {
        let got = &y[row * y_row..(row + 1) * y_row];
        if slot < 0 {
            assert!(got.iter().all(|&x| x == 0), "padding row {row}'s y: {what}");
        } else {
            assert_eq!(
                got,
                &y_ref[row * y_row..(row + 1) * y_row],
                "row {row}s y: {what}"
            );
            let s = slot as usize;
            assert!(
                new_pool[s * per..(s + 1) * per]
                    .iter()
                    .zip(&s_ref[row * per..(row + 1) * per])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "slot {s} (row {row}): {what}"
            );
        }
    }
    for s in 0..n {
        if !slots.contains(&(s as i32)) {
            assert!(
                new_pool[s * per..(s + 1) * per]
                    .iter()
                    .zip(&pool[s * per..(s + 1) * per])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "slot {s} not named changed: {what}"
            );
        }
    }
}

#[test]
fn a_pool_call_is_gather_dense_call_scatter_bit_for_bit() {
    let mut rng = Rng::fresh();
    let dtypes = [MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32];
    let cases: [([usize; 6], usize); 6] = [
        ([1, 1, 1, 1, 32, 4], 1),
        ([4, 1, 2, 4, 128, 16], 9),
        ([3, 5, 1, 3, 64, 7], 3),
        ([5, 3, 2, 2, 32, 33], 12),
        ([2, 9, 1, 2, 256, 5], 2),
        ([6, 2, 2, 8, 96, 3], 6),
    ];
    for (i, (dims, n)) in cases.into_iter().enumerate() {
        let dtype = dtypes[i % 3];
        for (masked, with_fresh) in [(false, false), (true, true), (false, true)] {
            check_case(&mut rng, dims, dtype, n, masked, with_fresh, None);
        }
    }
}

#[test]
fn a_chunked_pool_call_is_gather_chunked_call_scatter_bit_for_bit() {
    let mut rng = Rng::fresh();
    for (dims, n, chunk) in [
        ([3, 40, 1, 2, 32, 8], 5, 16),
        ([2, 70, 2, 4, 128, 16], 2, 0),
        ([4, 17, 1, 1, 64, 20], 8, 32),
    ] {
        for (masked, with_fresh) in [(false, true), (true, false)] {
            let dtype = MLXK_DTYPE_BFLOAT16;
            check_case(&mut rng, dims, dtype, n, masked, with_fresh, Some(chunk));
        }
    }
}

/// A recorded launch's int32 input as values.
fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A launch header with the `#include` lines of the CUDA launch replaced by their files.
fn resolved(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("#include \"") {
            Some(rest) => std::fs::read_to_string(rest.trim_end_matches('"')).unwrap(),
            None => format!("{line}\n"),
        })
        .collect()
}

/// What a pool call's launch must be: its kernel's name, row table, written rows (W; the launch
/// has one unwritten row where W is 0) and value rows a SIMD group on CUDA.
struct Expected<'a> {
    name: &'a str,
    replay: bool,
    masked: bool,
    y: Option<[i32; 4]>,
    table: Vec<i32>,
    written: i32,
    cuda_rows: i32,
}

/// Checks the last recorded launch against `e` (dims B, T, Hk, Hv, Dk, Dv of the call, N).
fn check_launch(kernels: GpuKernels, dims: [usize; 6], n: usize, e: &Expected) {
    use mlxkern::testing::last_gpu_launch;
    let (l, inputs) = last_gpu_launch().expect("a launch reached MLX");
    let [_, _, hk, hv, dk, dv] = dims.map(|x| x as i32);
    let cuda = kernels == GpuKernels::Cuda;
    let rows = e.table.len() as i32 / 5;
    let prefix = format!("{}{}_", e.name, if cuda { "_gates" } else { "" });
    assert!(l.name.starts_with(&prefix), "{} is not {prefix}…", l.name);
    assert!(
        resolved(&l.header).contains("#define MLXK_POOL 1"),
        "{kernels:?} header"
    );
    let mut names = vec!["q", "k", "v", "g", "beta", "state_in", "mask", "rows"];
    if e.replay {
        names.remove(0);
    }
    if !e.masked {
        names.retain(|&n| n != "mask");
    }
    if cuda {
        names.extend(["a_log", "dt_bias"]);
    }
    assert_eq!(l.input_names, names, "{}", l.name);
    let input = |name: &str| &inputs[names.iter().position(|&n| n == name).unwrap()];
    assert_eq!(input("state_in").shape, [n as i32, hv, dv, dk]);
    assert_eq!(input("rows").shape, [rows, 5]);
    assert_eq!(
        ints(&input("rows").bytes),
        e.table,
        "{}: the row table",
        l.name
    );
    // The gates: computed by MLX ops for Metal (g f32, beta in b's dtype f32), the raw a (bf16)
    // and b (f32) for CUDA.
    let g_dtype = if cuda {
        mlxkern::Dtype::Bfloat16
    } else {
        mlxkern::Dtype::Float32
    };
    assert_eq!(
        (input("g").dtype, input("beta").dtype),
        (g_dtype, mlxkern::Dtype::Float32)
    );
    let mut outputs = e.y.map_or(vec![], |y| y.to_vec());
    outputs.extend([e.written.max(1), hv, dv, dk]);
    assert_eq!(l.output_dims, outputs, "{}: outputs", l.name);
    let value_rows = if cuda { e.cuda_rows } else { 1 };
    assert_eq!(l.grid, [32, dv / value_rows, rows * hv], "{}: grid", l.name);
    assert_eq!(l.template_int_values, [dk, dv, hk, hv, value_rows]);
}

/// The pool calls' Metal and CUDA launches are built on every machine and handed to MLX, which
/// refuses them without that GPU: the recorded launch shows the kernel, the pool as the state,
/// the row table with its values (compact numbering of the written rows), the written rows as
/// the state output (one row no thread writes where none is written) and the geometry, for the
/// update (masked), the verify, packed sequences (lengths 0, 1 and 39), the replay, and a call
/// of 256 (row, value head) pairs, which takes 4 value rows a SIMD group on CUDA.
#[test]
fn pool_gpu_launches_are_built_and_reach_mlx() {
    use mlxkern::testing::{
        gated_delta_state_pool_via_gpu, gated_delta_update_pool_via_gpu, record_gpu_launches,
    };
    let mut rng = Rng::fresh();
    let bf16 = MLXK_DTYPE_BFLOAT16;
    let dims = [3, 4, 1, 2, 32, 8];
    let host = Host::random(&mut rng, dims, bf16);
    let n = 6;
    let pool = new_f32(&rng.vec(n * host.state_len(), 0.5), &pool_shape(&host, n));
    let mask_values: Vec<bool> = (0..12).map(|i| i % 3 != 0).collect();
    let mask = new_bool(&mask_values, &[3, 4]);
    let x = host.arrays(&[0, 1, 2], 4, false);
    let packed_host = Host::random(&mut rng, [1, 40, 1, 2, 32, 8], bf16);
    let packed = packed_host.arrays(&[0], 40, true);
    let wide_host = Host::random(&mut rng, [128, 1, 1, 2, 32, 8], bf16);
    let wide = wide_host.arrays(&(0..128).collect::<Vec<_>>(), 1, false);
    let wide_pool = new_f32(&vec![0.5; 130 * host.state_len()], &pool_shape(&host, 130));
    let args = |x: &[H; 7], pool: H, mask: H| {
        let [q, k, v, a, b, al, dt] = *x;
        [q, k, v, a, b, al, dt, pool, mask].map(|h| h as *const mlxk_array)
    };
    let (slots, fresh) = ([4, -1, 1], [0u8, 0, 1]);
    let wide_slots: Vec<i32> = (0..128).map(|i| (i * 37) % 130).collect();
    record_gpu_launches(true);
    for kernels in GPU_KERNELS {
        let refused = |status| expect_err(status, MLXK_ERR_BACKEND, &[refused_launch(kernels)]);
        let (mut y, mut p) = (null_mut(), null_mut());
        // The update, masked: row 1 padding, row 2 fresh.
        refused(unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                false,
                args(&x, pool, mask),
                &slots,
                Some(&fresh),
                None,
                &mut y,
                &mut p,
            )
        });
        let update = Expected {
            name: "mlxk_gated_delta_step_mask_pool",
            replay: false,
            masked: true,
            y: Some([3, 4, 2, 8]),
            table: vec![0, 4, 4, 4, 0, 4, 4, 0, -1, -1, 8, 4, 4, -1, 1],
            written: 2,
            cuda_rows: 1,
        };
        check_launch(kernels, dims, n, &update);
        // The verify: nothing written.
        refused(unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                true,
                args(&x, pool, null_mut()),
                &slots,
                None,
                None,
                &mut y,
                null_mut(),
            )
        });
        let verify = Expected {
            name: "mlxk_gated_delta_step_pool",
            masked: false,
            table: vec![0, 4, 4, 4, -1, 4, 4, 0, -1, -1, 8, 4, 4, 1, -1],
            written: 0,
            ..update
        };
        check_launch(kernels, dims, n, &verify);
        // Packed sequences of 0, 1 and 39 tokens.
        refused(unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                false,
                args(&packed, pool, null_mut()),
                &[2, 0, 5],
                None,
                Some(&[0, 0, 1, 40]),
                &mut y,
                &mut p,
            )
        });
        let packed_launch = Expected {
            y: Some([1, 40, 2, 8]),
            table: vec![0, 0, 0, 2, 0, 0, 1, 1, 0, 1, 1, 39, 39, 5, 2],
            written: 3,
            ..verify
        };
        check_launch(kernels, [1, 40, 1, 2, 32, 8], n, &packed_launch);
        // The replay: accepted lengths 2, 0 (padding), 4.
        let [_, k, v, a, b, al, dt] = x.map(|h| h as *const mlxk_array);
        refused(unsafe {
            gated_delta_state_pool_via_gpu(
                kernels,
                false,
                [k, v, a, b, al, dt, pool],
                &[3, -1, 0],
                Some(&[1, 0, 0]),
                &[2, 0, 4],
                &mut p,
            )
        });
        let replay = Expected {
            name: "mlxk_gated_delta_state_pool",
            replay: true,
            y: None,
            table: vec![0, 4, 2, -1, 0, 4, 4, 0, -1, -1, 8, 4, 4, 0, 1],
            written: 2,
            ..verify
        };
        check_launch(kernels, dims, n, &replay);
        // 128 rows x 2 value heads.
        refused(unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                false,
                args(&wide, wide_pool, null_mut()),
                &wide_slots,
                None,
                None,
                &mut y,
                &mut p,
            )
        });
        let table = wide_slots
            .iter()
            .enumerate()
            .flat_map(|(row, &s)| [row as i32, 1, 1, s, row as i32])
            .collect();
        let wide_launch = Expected {
            y: Some([128, 1, 2, 8]),
            table,
            written: 128,
            cuda_rows: 4,
            ..verify
        };
        check_launch(kernels, [128, 1, 1, 2, 32, 8], 130, &wide_launch);
        // The argument checks run before the launch on this path too.
        let mut bad = args(&x, pool, mask);
        bad[0] = bad[2];
        expect_err(
            unsafe {
                gated_delta_update_pool_via_gpu(
                    kernels, false, false, bad, &slots, None, None, &mut y, &mut p,
                )
            },
            MLXK_ERR_SHAPE,
            &["q"],
        );
    }
    record_gpu_launches(false);
    free_all(&x);
    free_all(&packed);
    free_all(&wide);
    free_all(&[pool, mask, wide_pool]);
}
