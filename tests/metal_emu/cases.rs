//! The emulated cases (see `cases`).

use super::*;

fn dims(b: i64, t: i64, hk: i64, hv: i64, dk: i64, dv: i64) -> Dims {
    Dims {
        b,
        t,
        hk,
        hv,
        dk,
        dv,
    }
}

fn heads(b: i64, s: i64, hk: i64, hv: i64, dk: i64, dv: i64) -> HeadSplitDims {
    HeadSplitDims {
        b,
        s,
        hk,
        hv,
        dk,
        dv,
    }
}

fn rec(dtype: Dtype, b_dtype: Dtype, d: Dims, masked: bool, with_state: bool) -> Case {
    rec_rows(dtype, b_dtype, d, masked, with_state, 1)
}

/// A recurrence case whose launch gives `rows` value rows to each SIMD group, as the CUDA
/// launch does for large batches (src/cuda.rs `rows_per_simd_group`): the same text, so the
/// same bits as the CPU kernel.
fn rec_rows(dtype: Dtype, b_dtype: Dtype, d: Dims, masked: bool, with_state: bool, rows: usize) -> Case {
    Case {
        kind: Kind::Recurrence {
            d,
            masked,
            with_state,
            rows,
        },
        dtype,
        aux: b_dtype,
        eps: 0.0,
    }
}

fn replay(dtype: Dtype, b_dtype: Dtype, d: Dims, with_state: bool, lengths: &[i32]) -> Case {
    replay_rows(dtype, b_dtype, d, with_state, lengths, 1)
}

fn replay_rows(
    dtype: Dtype,
    b_dtype: Dtype,
    d: Dims,
    with_state: bool,
    lengths: &[i32],
    rows: usize,
) -> Case {
    Case {
        kind: Kind::Replay {
            d,
            with_state,
            lengths: lengths.to_vec(),
            rows,
        },
        dtype,
        aux: b_dtype,
        eps: 0.0,
    }
}

fn from_conv(dtype: Dtype, b_dtype: Dtype, d: Dims, masked: bool, with_state: bool, rows: usize) -> Case {
    Case {
        kind: Kind::FromConv {
            d,
            masked,
            with_state,
            rows,
        },
        dtype,
        aux: b_dtype,
        eps: 1e-6 / d.dk as f32,
    }
}

fn split(dtype: Dtype, d: HeadSplitDims, eps: f32) -> Case {
    Case {
        kind: Kind::HeadSplit { d, grouped: false },
        dtype,
        aux: dtype,
        eps,
    }
}

fn norm(dtype: Dtype, gate: Dtype, shape: &[i64], eps: f32) -> Case {
    Case {
        kind: Kind::GatedNorm {
            shape: shape.to_vec(),
            grouped: false,
        },
        dtype,
        aux: gate,
        eps,
    }
}

/// `c` with the CUDA launch's threadgroup (head split, gated norm).
fn grouped(mut c: Case) -> Case {
    match &mut c.kind {
        Kind::HeadSplit { grouped, .. } | Kind::GatedNorm { grouped, .. } => *grouped = true,
        _ => panic!("only the head split and the gated norm are grouped"),
    }
    c
}

/// A pool case (`Kind::Pool`): `d` = B, T of the tensors (packed: 1, total_T), then Hk, Hv, Dk,
/// Dv; `fresh` empty for none.
#[allow(clippy::too_many_arguments)]
fn pool(
    dtype: Dtype,
    b_dtype: Dtype,
    d: Dims,
    call: PoolCall,
    masked: bool,
    n: usize,
    slots: &[i32],
    fresh: &[u8],
    rows: usize,
) -> Case {
    let fresh = if fresh.is_empty() {
        vec![0; slots.len()]
    } else {
        fresh.to_vec()
    };
    Case {
        kind: Kind::Pool {
            d,
            call,
            masked,
            n,
            slots: slots.to_vec(),
            fresh,
            rows,
        },
        dtype,
        aux: b_dtype,
        eps: 0.0,
    }
}

/// The pool cases: the update (masked or not; fresh rows, padding rows, a row with every token
/// masked, all rows padding), the verify (nothing written: the launch's one state row stays
/// unwritten), packed sequences (lengths 0, 1, past 32, a padding sequence), the replay (length
/// 0 of a fresh row, all T, past 32 tokens); GQA 1-4, Dk 32 to 256, odd Dv, 1 to 16 value rows
/// per SIMD group, a one-row table (constant memory).
#[rustfmt::skip]
fn pool_cases(list: &mut Vec<Case>) {
    use PoolCall::*;
    list.extend([
        pool(BF16, BF16, dims(3, 5, 2, 4, 64, 8), Update, false, 5, &[3, -1, 0], &[0, 0, 1], 1),
        pool(F16, F16, dims(4, 6, 1, 3, 128, 7), Update, true, 6, &[5, 2, -2, 0], &[1, 0, 0, 0], 1),
        pool(F32, BF16, dims(2, 3, 1, 2, 256, 5), Update, false, 3, &[2, 0], &[], 1),
        pool(BF16, F32, dims(3, 4, 2, 4, 32, 16), Update, true, 4, &[1, 3, -1], &[0, 1, 0], 4),
        pool(BF16, BF16, dims(2, 2, 1, 2, 128, 16), Update, false, 2, &[1, 0], &[], 8),
        pool(BF16, BF16, dims(2, 40, 1, 2, 32, 4), Update, true, 3, &[0, 2], &[0, 1], 2),
        pool(BF16, BF16, dims(4, 1, 2, 8, 128, 32), Update, false, 9, &[8, 1, -1, 4], &[], 16),
        pool(F32, F32, dims(1, 1, 1, 1, 32, 4), Update, false, 1, &[0], &[], 1),
        pool(F16, BF16, dims(2, 2, 1, 2, 64, 6), Update, false, 3, &[-1, -1], &[], 2),
        pool(BF16, BF16, dims(3, 4, 2, 4, 64, 8), Verify, true, 4, &[2, -1, 0], &[0, 0, 1], 1),
        pool(F32, F32, dims(2, 3, 1, 2, 32, 6), Verify, false, 3, &[1, 2], &[], 2),
        pool(BF16, BF16, dims(1, 45, 1, 2, 32, 8), Packed(vec![0, 0, 1, 40, 45]), false, 5, &[2, 0, 4, -1], &[0, 1, 0, 0], 1),
        pool(F16, F32, dims(1, 10, 2, 4, 128, 12), Packed(vec![0, 3, 3, 10]), false, 3, &[1, 0, 2], &[0, 0, 1], 4),
        pool(BF16, BF16, dims(3, 5, 2, 4, 64, 8), Replay(vec![2, 3, 5]), false, 4, &[3, -1, 0], &[0, 0, 1], 1),
        pool(F32, F32, dims(3, 3, 1, 2, 32, 8), Replay(vec![0, 3, 1]), false, 3, &[0, 1, 2], &[1, 0, 0], 4),
        pool(F16, F16, dims(2, 34, 1, 1, 256, 3), Replay(vec![34, 20]), false, 2, &[1, 0], &[], 1),
    ]);
}

/// What a backward case and a chunked backward case both name: the forward's dtype, b's, dy's,
/// the dims, masked, with a state.
type BackwardRow = (Dtype, Dtype, Dtype, Dims, bool, bool);

/// A backward case with the library's checkpoint interval, then one more case for each interval
/// in `also` (same draws, its `twin`): their outputs must be the same bits.
fn backward(list: &mut Vec<Case>, row: BackwardRow, also: &[usize]) {
    let (dtype, b_dtype, dy_dtype, d, masked, with_state) = row;
    let first = list.len();
    let case = |checkpoint, twin| Case {
        kind: Kind::Backward {
            d,
            masked,
            with_state,
            dy_dtype,
            checkpoint,
            twin,
        },
        dtype,
        aux: b_dtype,
        eps: 0.0,
    };
    list.push(case(None, None));
    for &c in also {
        list.push(case(Some(c), Some(first)));
    }
}

/// The backward cases: bf16 / f16 / f32 (dy in f32 or the forward's dtype), GQA 1, 2, 4,
/// Dk 32 to 256, odd Dv and Dv != Dk, T from 1 to 100 (checkpoint intervals 1 to 10, and 1 and
/// T for the twins), masks with a fully masked row (B >= 2), with and without a state, B 1-3,
/// and one Qwen3-Next-like head layout (Hk 2, Hv 4, Dk = Dv = 128).
#[rustfmt::skip]
fn backward_cases(list: &mut Vec<Case>) {
    backward(list, (BF16, BF16, F32, dims(2, 5, 2, 2, 32, 7), false, true), &[1, 5]);
    backward(list, (BF16, F32, BF16, dims(1, 17, 1, 2, 64, 48), false, false), &[]);
    backward(list, (F16, F16, F16, dims(3, 5, 1, 4, 128, 9), true, true), &[]);
    backward(list, (F32, F32, F32, dims(2, 64, 1, 2, 32, 5), true, true), &[1, 64]);
    backward(list, (BF16, BF16, F32, dims(1, 100, 1, 2, 32, 3), false, true), &[1, 100]);
    backward(list, (F16, F32, F32, dims(3, 1, 2, 2, 64, 7), true, false), &[]);
    backward(list, (F32, BF16, F32, dims(1, 3, 1, 2, 256, 130), false, true), &[]);
    backward(list, (BF16, BF16, BF16, dims(2, 4, 1, 4, 256, 33), true, false), &[]);
    backward(list, (F16, F16, F32, dims(2, 17, 2, 4, 32, 12), true, true), &[1, 17]);
    backward(list, (F32, F32, F32, dims(2, 17, 1, 4, 128, 16), false, true), &[]);
    backward(list, (BF16, BF16, BF16, dims(1, 20, 2, 4, 128, 128), false, true), &[]);
}

/// A chunked backward case: its five stage launches (`Kind::ChunkedBackward`).
fn chunked_backward(list: &mut Vec<Case>, row: BackwardRow, chunk: usize) {
    let (dtype, b_dtype, dy_dtype, d, masked, with_state) = row;
    let first = list.len();
    for stage in 0..metal_chunked::CHUNKED_BACKWARD_STAGES {
        list.push(Case {
            kind: Kind::ChunkedBackward {
                d,
                masked,
                with_state,
                dy_dtype,
                chunk,
                stage,
                first,
            },
            dtype,
            aux: b_dtype,
            eps: 0.0,
        });
    }
}

/// The chunked backward cases: bf16 / f16 / f32, GQA 1-4, Dk 32 / 64 / 128 / 256, odd Dv,
/// T = 1, T below, at and past a chunk and not a multiple of it (chunks 16 and 32, the
/// default 0 and 128 running 32), masks with a fully masked row (B >= 2), with and without a
/// state.
#[rustfmt::skip]
fn chunked_backward_cases(list: &mut Vec<Case>) {
    chunked_backward(list, (BF16, BF16, F32, dims(2, 5, 2, 2, 32, 7), false, true), 0);
    chunked_backward(list, (F32, F32, F32, dims(2, 70, 1, 2, 32, 5), true, true), 16);
    chunked_backward(list, (F32, BF16, F32, dims(1, 1, 1, 3, 64, 4), false, true), 0);
    chunked_backward(list, (F16, F16, F16, dims(3, 37, 1, 4, 128, 9), true, false), 32);
    chunked_backward(list, (BF16, F32, BF16, dims(1, 33, 2, 6, 64, 16), false, false), 128);
    chunked_backward(list, (F32, F32, F32, dims(2, 45, 1, 2, 256, 3), true, true), 0);
    chunked_backward(list, (F16, F32, F32, dims(1, 64, 1, 4, 32, 33), false, true), 16);
    // Dk = 160: five columns a lane, tiles of at most 25 columns.
    chunked_backward(list, (F32, BF16, F32, dims(2, 40, 1, 2, 160, 24), true, false), 32);
    // 64 value heads of 128 columns: tiles of 16 (fewer heads get 8).
    chunked_backward(list, (BF16, BF16, F32, dims(2, 3, 8, 32, 32, 128), true, true), 0);
}

/// The cases: every kernel over Dk 32/64/128/256, GQA ratios 1-4, B > 1, partial threadgroups
/// (Dv not a multiple of 4, Dv < 4), masks in device and constant memory, gated-norm widths
/// above 128 (one to 1024 threads, several passes), all three float dtypes.
pub(super) fn cases() -> Vec<Case> {
    let mut list = vec![
        // Recurrence, unmasked.
        rec(BF16, BF16, dims(2, 5, 2, 2, 32, 8), false, true),
        rec(BF16, F32, dims(3, 4, 1, 2, 64, 6), false, false),
        rec(BF16, BF16, dims(2, 3, 2, 6, 128, 12), false, true),
        rec(BF16, BF16, dims(4, 1, 2, 8, 128, 32), false, true),
        rec(F16, F16, dims(2, 4, 1, 4, 128, 16), false, true),
        rec(F16, BF16, dims(2, 3, 3, 9, 64, 7), false, true),
        rec(F32, F32, dims(2, 3, 2, 8, 64, 10), false, true),
        rec(F32, BF16, dims(2, 2, 1, 1, 256, 4), false, true),
        rec(BF16, BF16, dims(2, 2, 1, 2, 256, 5), false, false),
        // Recurrence, masked (mask [B, T]: B*T < 8 passes it in constant memory).
        rec(BF16, BF16, dims(2, 6, 2, 4, 128, 8), true, true),
        rec(BF16, F32, dims(3, 4, 2, 6, 32, 6), true, false),
        rec(F16, F16, dims(3, 2, 1, 3, 32, 3), true, true),
        rec(F32, F32, dims(2, 5, 2, 2, 64, 5), true, false),
        rec(F32, BF16, dims(2, 3, 1, 4, 128, 9), true, true),
        // Several value rows per SIMD group (the CUDA launch for 256+ (batch, head) pairs).
        rec_rows(BF16, BF16, dims(2, 4, 2, 4, 128, 16), false, true, 4),
        rec_rows(F16, F32, dims(3, 3, 1, 3, 64, 6), true, true, 2),
        rec_rows(F32, F32, dims(2, 2, 2, 4, 32, 12), true, false, 4),
        rec_rows(BF16, BF16, dims(2, 3, 2, 4, 128, 16), true, true, 8),
        rec_rows(F32, BF16, dims(2, 2, 1, 2, 64, 32), false, true, 16),
        // Past 32 tokens: the gates of tokens 32.. come from the SIMD group's next refill.
        rec(BF16, BF16, dims(2, 70, 1, 2, 32, 3), true, true),
        rec_rows(F16, F32, dims(1, 41, 2, 2, 64, 8), false, false, 4),
        // Prefix replay (lengths [B]: B < 8 passes them in constant memory).
        replay(BF16, BF16, dims(3, 5, 2, 4, 64, 8), true, &[0, 5, 3]),
        replay(BF16, F32, dims(2, 6, 1, 3, 128, 6), false, &[6, 2]),
        replay(F16, F16, dims(2, 4, 2, 8, 32, 4), true, &[4, 1]),
        replay(
            F32,
            F32,
            dims(9, 3, 1, 1, 32, 4),
            true,
            &[0, 1, 2, 3, 3, 2, 1, 0, 3],
        ),
        replay(F32, BF16, dims(2, 3, 1, 2, 256, 3), true, &[3, 2]),
        replay_rows(BF16, BF16, dims(3, 5, 2, 4, 64, 8), true, &[0, 5, 3], 4),
        replay_rows(F16, F16, dims(2, 4, 1, 2, 32, 6), true, &[4, 2], 2),
        replay_rows(BF16, F32, dims(2, 4, 1, 2, 64, 8), true, &[4, 3], 8),
        replay_rows(BF16, BF16, dims(3, 66, 1, 2, 32, 16), true, &[66, 33, 31], 16),
        // The recurrence from the convolution's output: Dk 128 (the split's lanes own the
        // recurrence's columns) and 32 / 64 / 96 (they do not), GQA, odd Dv, masks, rows.
        from_conv(BF16, BF16, dims(2, 3, 2, 4, 128, 16), false, true, 1),
        from_conv(BF16, F32, dims(3, 2, 1, 3, 64, 6), true, false, 1),
        from_conv(F16, F16, dims(2, 4, 2, 4, 32, 7), true, true, 1),
        from_conv(F32, BF16, dims(2, 3, 1, 2, 96, 5), false, true, 1),
        from_conv(F32, F32, dims(1, 2, 2, 2, 128, 8), true, true, 4),
        from_conv(BF16, BF16, dims(2, 3, 2, 4, 64, 16), false, false, 8),
        from_conv(F16, BF16, dims(1, 37, 1, 2, 32, 4), true, true, 2),
        // Head split (Dk, Dv <= 128; qscale/kscale [Dk]: Dk < 8 passes them in constant memory).
        split(BF16, heads(2, 3, 2, 4, 128, 128), 1e-6 / 128.0),
        split(BF16, heads(2, 2, 1, 2, 64, 96), 1e-6),
        split(BF16, heads(3, 1, 1, 2, 5, 3), 0.0),
        split(F16, heads(2, 3, 2, 4, 128, 128), 1e-6 / 128.0),
        split(F16, heads(1, 2, 2, 3, 100, 72), 1e-5),
        split(F32, heads(2, 3, 2, 4, 128, 128), 1e-6 / 128.0),
        split(F32, heads(2, 2, 2, 3, 100, 72), 1e-5),
        split(F32, heads(2, 1, 1, 1, 3, 1), 1e-6),
        // Gated norm: THREADS = min(1024, ceil(D/128)*32).
        norm(BF16, BF16, &[2, 3, 64], 1e-6),
        norm(BF16, F32, &[2, 128], 1e-6),
        norm(BF16, BF16, &[4, 129], 1e-6),
        norm(F16, F16, &[2, 2, 1000], 1e-5),
        norm(F16, F32, &[3, 300], 1e-6),
        norm(F32, BF16, &[3, 4096], 1e-6),
        norm(BF16, BF16, &[2, 5000], 1e-6),
        norm(F32, F32, &[5, 7], 1e-6),
        norm(F32, F16, &[2, 2, 640], 0.0),
        // The CUDA launch's grouping: several heads / rows in one threadgroup.
        grouped(split(BF16, heads(2, 3, 2, 4, 128, 128), 1e-6 / 128.0)),
        grouped(split(F32, heads(1, 2, 1, 4, 64, 48), 1e-6)),
        grouped(norm(BF16, BF16, &[24, 128], 1e-6)),
        grouped(norm(F32, F16, &[7, 3, 100], 1e-6)),
    ];
    backward_cases(&mut list);
    // After the others, so that their ids (and so their draws) stay as they were.
    pool_cases(&mut list);
    chunked_backward_cases(&mut list);
    chunked_cases(&mut list);
    // The matrix tiles' self-test: square, wide, tall and odd-tile products.
    for (items, m, k, n) in [(3, 32, 64, 32), (2, 16, 16, 64), (2, 64, 32, 16), (1, 48, 48, 48)] {
        list.push(Case {
            kind: Kind::Tiles { items, m, k, n },
            dtype: F32,
            aux: F32,
            eps: 0.0,
        });
    }
    chunked_pool_cases(&mut list);
    list
}

/// The chunked update's GPU form: each case three times, its prep launch, its state pass and
/// its output pass; with the state pass's tile as the library picks it on Metal and, for value
/// heads of 32 or more, every other tile that fits CUDA's 48 KB (the CUDA launch's own, and the
/// narrower ones MLXK_CHUNK_STATE_COLUMNS takes).
fn chunked_cases(list: &mut Vec<Case>) {
    let mut all = |dtype: Dtype, b_dtype: Dtype, d: Dims, masked: bool, with_state: bool, chunk: usize| {
        let u = |x: i64| x as usize;
        let c = metal::gated_delta::chunked::gpu_chunk(chunk_size(chunk));
        let node_dims = gd::Dims {
            b: u(d.b),
            t: u(d.t),
            hk: u(d.hk),
            hv: u(d.hv),
            dk: u(d.dk),
            dv: u(d.dv),
        };
        let metal = metal::gated_delta::chunked::chunk_state_columns_for(node_dims, c, false);
        let mut tiles = vec![metal];
        if d.dv >= 32 {
            let widest = metal::gated_delta::chunked::chunk_state_columns(u(d.dk), c, 48 * 1024);
            tiles.extend([8, 16, 32].into_iter().filter(|&vt| vt != metal && vt <= widest));
        }
        for columns in tiles {
            for stage in 0..3 {
                list.push(Case {
                    kind: Kind::Chunked {
                        d,
                        masked,
                        with_state,
                        chunk,
                        stage,
                        columns,
                    },
                    dtype,
                    aux: b_dtype,
                    eps: 0.0,
                });
            }
        }
    };
    // GQA, T not a multiple of the chunk, Dk 32 / 128 / 256, odd Dv, Dv over one output tile,
    // absent state, masks with a fully masked row, chunks 16 / 32 (the default) / 64 / 128
    // (run as 64).
    all(BF16, BF16, dims(2, 37, 1, 2, 32, 8), false, true, 16);
    all(F32, F32, dims(2, 45, 2, 4, 64, 5), true, true, 32);
    all(F16, F16, dims(1, 70, 1, 3, 128, 7), false, false, 64);
    all(F32, BF16, dims(2, 33, 1, 2, 256, 3), true, false, 16);
    all(BF16, F32, dims(1, 20, 2, 2, 128, 33), false, true, 32);
    all(F32, F32, dims(1, 130, 1, 2, 128, 64), true, true, 64);
    all(F32, F32, dims(1, 150, 1, 2, 32, 4), false, true, 128);
    all(F32, F32, dims(2, 70, 1, 2, 64, 72), true, true, 32);
}

/// The chunked update on a pool: the dense call it must equal (every row padded to the
/// longest, the padding masked; its three cases also run as a chunked case of their own), then
/// the pool's three launches.
fn chunked_pool_cases(list: &mut Vec<Case>) {
    let mut pool = |dtype: Dtype, d: Dims, masked: bool, chunk: usize, n: usize, slots: &[i32], fresh: &[u8], cu: Option<Vec<i32>>| {
        let r = slots.len() as i64;
        let longest = match &cu {
            Some(cu) => cu.windows(2).map(|w| (w[1] - w[0]) as i64).max().unwrap_or(0),
            None => d.t,
        };
        let padded = dims(r, longest, d.hk, d.hv, d.dk, d.dv);
        let node_dims = gd::Dims {
            b: r as usize,
            t: longest as usize,
            hk: d.hk as usize,
            hv: d.hv as usize,
            dk: d.dk as usize,
            dv: d.dv as usize,
        };
        let c = metal::gated_delta::chunked::gpu_chunk(chunk_size(chunk));
        let columns = metal::gated_delta::chunked::chunk_state_columns_for(node_dims, c, false);
        for stage in 0..3 {
            list.push(Case {
                kind: Kind::Chunked { d: padded, masked: true, with_state: true, chunk, stage, columns },
                dtype,
                aux: dtype,
                eps: 0.0,
            });
        }
        for stage in 0..3 {
            list.push(Case {
                kind: Kind::ChunkedPool {
                    d,
                    masked,
                    chunk,
                    stage,
                    n,
                    slots: slots.to_vec(),
                    fresh: fresh.to_vec(),
                    cu: cu.clone(),
                },
                dtype,
                aux: dtype,
                eps: 0.0,
            });
        }
    };
    // Dense rows with a padding row, a fresh row and a mask (row 0 fully masked); packed
    // sequences of lengths 0, 1, 40 and 5 (a chunk starting mid-chunk of the tokens, an empty
    // sequence keeping its slot's state) and a padding sequence; chunks of 16 and 32; GQA.
    pool(BF16, dims(3, 37, 1, 2, 32, 8), true, 16, 5, &[3, -1, 0], &[0, 0, 1], None);
    pool(F32, dims(2, 20, 2, 4, 64, 40), false, 32, 3, &[1, 2], &[0, 1], None);
    pool(BF16, dims(1, 46, 1, 2, 32, 8), false, 16, 6, &[2, 0, 4, -1, 5], &[0, 1, 0, 0, 0], Some(vec![0, 0, 1, 41, 46, 46]));
    pool(F16, dims(1, 90, 2, 4, 128, 12), false, 32, 3, &[1, 0, 2], &[0, 0, 1], Some(vec![0, 33, 33, 90]));
}
