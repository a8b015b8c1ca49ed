//! The pool calls' GPU launches without a GPU: for the Metal and the CUDA descriptions, each
//! pool call (update, verify, packed, replay) builds its launch, with the row table, the
//! outputs and the geometry the node defines, and the launch reaches MLX (which refuses it on
//! a CPU stream).

use crate::support::pool::*;
use crate::support::*;
use std::ptr::null_mut;

/// What a pool call's launch must be: its kernel's name, row table, written rows (W; the launch
/// has one unwritten row where W is 0) and value rows a SIMD group on CUDA.
pub(super) struct Expected<'a> {
    pub(super) name: &'a str,
    pub(super) replay: bool,
    pub(super) masked: bool,
    pub(super) y: Option<[i32; 4]>,
    pub(super) table: Vec<i32>,
    pub(super) written: i32,
    pub(super) cuda_rows: i32,
}

/// Checks the last recorded launch against `e` (dims B, T, Hk, Hv, Dk, Dv of the call, N).
pub(super) fn check_launch(kernels: GpuKernels, dims: [usize; 6], n: usize, e: &Expected) {
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

/// A launch test's inputs: random bf16 rows of `dims` (B, T, Hk, Hv, Dk, Dv) and a pool of
/// N = 6 random states; (host, pool, N).
pub(super) fn host_and_pool(rng: &mut Rng, dims: [usize; 6]) -> (Host, H, usize) {
    let host = Host::random(rng, dims, MLXK_DTYPE_BFLOAT16);
    let n = 6;
    let pool = new_f32(&rng.vec(n * host.state_len(), 0.5), &pool_shape(&host, n));
    (host, pool, n)
}

/// `host_and_pool` and a [B, T] mask with every third token masked off; (host, pool, mask, N).
pub(super) fn rows_and_pool(rng: &mut Rng, dims: [usize; 6]) -> (Host, H, H, usize) {
    let (host, pool, n) = host_and_pool(rng, dims);
    let [b, t, ..] = dims;
    let mask_values: Vec<bool> = (0..b * t).map(|i| i % 3 != 0).collect();
    let mask = new_bool(&mask_values, &[b as i32, t as i32]);
    (host, pool, mask, n)
}

/// One packed row of 40 random bf16 tokens (Hk 1, Hv 2, Dk 32, Dv 8): its arrays.
pub(super) fn packed_40(rng: &mut Rng) -> [H; 7] {
    Host::random(rng, [1, 40, 1, 2, 32, 8], MLXK_DTYPE_BFLOAT16).arrays(&[0], 40, true)
}

/// Runs `body` for the Metal and the CUDA launch (`kernels`) with the GPU launches recorded,
/// handing it a y and a new pool's out-parameters (NULL, for calls that must not write them).
pub(super) fn for_each_launch(mut body: impl FnMut(GpuKernels, &mut H, &mut H)) {
    use mlxkern::testing::record_gpu_launches;
    record_gpu_launches(true);
    for kernels in GPU_KERNELS {
        let (mut y, mut p) = (null_mut(), null_mut());
        body(kernels, &mut y, &mut p);
    }
    record_gpu_launches(false);
}

/// MLX refused a call's launch for want of the `kernels` GPU.
#[track_caller]
pub(super) fn refused(kernels: GpuKernels, status: mlxk_status) {
    expect_err(status, MLXK_ERR_BACKEND, &[refused_launch(kernels)]);
}

/// A pool call's nine array arguments: the seven inputs `x`, the pool, the mask.
pub(super) fn args(x: &[H; 7], pool: H, mask: H) -> [*const mlxk_array; 9] {
    let [q, k, v, a, b, al, dt] = *x;
    [q, k, v, a, b, al, dt, pool, mask].map(|h| h as *const mlxk_array)
}

/// The pool calls' Metal and CUDA launches are built on every machine and handed to MLX, which
/// refuses them without that GPU: the recorded launch shows the kernel, the pool as the state,
/// the row table with its values (compact numbering of the written rows), the written rows as
/// the state output (one row no thread writes where none is written) and the geometry, for the
/// update (masked), the verify, packed sequences (lengths 0, 1 and 39), the replay, and a call
/// of 256 (row, value head) pairs, which takes 4 value rows a SIMD group on CUDA.
#[test]
fn pool_gpu_launches_are_built_and_reach_mlx() {
    let _serial = serial();
    use mlxkern::testing::{gated_delta_state_pool_via_gpu, gated_delta_update_pool_via_gpu};
    let mut rng = Rng::fresh();
    let bf16 = MLXK_DTYPE_BFLOAT16;
    let dims = [3, 4, 1, 2, 32, 8];
    let (host, pool, mask, n) = rows_and_pool(&mut rng, dims);
    let x = host.arrays(&[0, 1, 2], 4, false);
    let packed = packed_40(&mut rng);
    let wide_host = Host::random(&mut rng, [128, 1, 1, 2, 32, 8], bf16);
    let wide = wide_host.arrays(&(0..128).collect::<Vec<_>>(), 1, false);
    let wide_pool = new_f32(&vec![0.5; 130 * host.state_len()], &pool_shape(&host, 130));
    let (slots, fresh) = ([4, -1, 1], [0u8, 0, 1]);
    let wide_slots: Vec<i32> = (0..128).map(|i| (i * 37) % 130).collect();
    for_each_launch(|kernels, y, p| {
        // The update, masked: row 1 padding, row 2 fresh.
        refused(kernels, unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                false,
                args(&x, pool, mask),
                &slots,
                Some(&fresh),
                None,
                y,
                p,
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
        refused(kernels, unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                true,
                args(&x, pool, null_mut()),
                &slots,
                None,
                None,
                y,
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
        refused(kernels, unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                false,
                args(&packed, pool, null_mut()),
                &[2, 0, 5],
                None,
                Some(&[0, 0, 1, 40]),
                y,
                p,
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
        refused(kernels, unsafe {
            gated_delta_state_pool_via_gpu(
                kernels,
                false,
                [k, v, a, b, al, dt, pool],
                &[3, -1, 0],
                Some(&[1, 0, 0]),
                &[2, 0, 4],
                p,
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
        refused(kernels, unsafe {
            gated_delta_update_pool_via_gpu(
                kernels,
                false,
                false,
                args(&wide, wide_pool, null_mut()),
                &wide_slots,
                None,
                None,
                y,
                p,
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
                    kernels, false, false, bad, &slots, None, None, y, p,
                )
            },
            MLXK_ERR_SHAPE,
            &["q"],
        );
    });
    free_all(&x);
    free_all(&packed);
    free_all(&wide);
    free_all(&[pool, mask, wide_pool]);
}
