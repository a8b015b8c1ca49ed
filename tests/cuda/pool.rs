//! The pool calls on MLX CUDA against the CPU pool calls (tests/cuda/main.rs runs them): the update
//! on a pool (decode and prefill, masks, fresh and padding rows, 1 to 16 value rows a warp),
//! packed sequences (lengths 0, 1, past 32), the verify then the commit of the accepted
//! prefixes, and the replay. With g and beta from MLX's CPU ops the GPU's y and new pool equal
//! the CPU's bit for bit (every slot: the rows written and the rows MLX's scatter leaves); with
//! the kernel's own gates within `gate_bound`. The chunked pool and packed calls run on the GPU
//! over a chunk table: each row's y and state equal, bit for bit, the dense GPU chunked call on
//! that row's tokens alone (`chunked_pool`).

use super::*;
use crate::support::pool::{update_packed_to, update_pool_to};
use std::ptr::null;

/// The arrays of a pool call: the update's (`Update`, without its state) and the pool.
struct PoolCall {
    u: Update,
    pool: H,
    slots: Vec<i32>,
    fresh: Vec<u8>,
}

impl PoolCall {
    /// `dims` = B, T, Hk, Hv, Dk, Dv of the tensors; a pool of `n` states; the slots at random
    /// (a quarter padding rows, each in use row fresh with odds 1 in 4).
    fn random(
        rng: &mut Rng,
        dims: [usize; 6],
        n: usize,
        rows: usize,
        dtype: mlxk_dtype,
        mask: bool,
    ) -> Self {
        let [_, _, _, hv, dk, dv] = dims;
        let u = Update::random(rng, dims, dtype, false, mask);
        let pool = new_f32(
            &rng.vec(n * hv * dv * dk, 0.5),
            &[n as i32, hv as i32, dv as i32, dk as i32],
        );
        let mut free_slots: Vec<i32> = (0..n as i32).collect();
        let slots: Vec<i32> = (0..rows)
            .map(|_| {
                if free_slots.is_empty() || rng.below(4) == 0 {
                    -1
                } else {
                    free_slots.swap_remove(rng.below(free_slots.len() as u64) as usize)
                }
            })
            .collect();
        let fresh = (0..rows).map(|_| (rng.below(4) == 0) as u8).collect();
        PoolCall {
            u,
            pool,
            slots,
            fresh,
        }
    }

    fn args(&self) -> [*const mlxk_array; 9] {
        let mut args = self.u.h.map(|h| h as *const mlxk_array);
        args[7] = self.pool;
        args
    }

    /// `mlxk_gated_delta_update_pool` (or, with `cu_seqlens`, `_update_packed`): (y, new pool).
    fn update(&self, cu_seqlens: Option<&[i32]>) -> (H, H) {
        let [q, k, v, a, b, al, dt, pool, m] = self.args();
        let (mut y, mut p) = (null_mut(), null_mut());
        let (slots, fresh) = (self.slots.as_ptr(), self.fresh.as_ptr());
        ok(unsafe {
            match cu_seqlens {
                None => mlxk_gated_delta_update_pool(
                    q,
                    k,
                    v,
                    a,
                    b,
                    al,
                    dt,
                    pool,
                    slots,
                    fresh,
                    self.slots.len(),
                    m,
                    &mut y,
                    &mut p,
                ),
                Some(cu) => {
                    let x = [q, k, v, a, b, al, dt, pool];
                    update_packed_to(x, cu, (slots, fresh), None, (&mut y, &mut p))
                }
            }
        });
        ok(mlxk_array_eval(y));
        ok(mlxk_array_eval(p));
        (y, p)
    }

    /// `mlxk_gated_delta_verify_pool`: y.
    fn verify(&self) -> H {
        let [q, k, v, a, b, al, dt, pool, m] = self.args();
        let mut y = null_mut();
        ok(unsafe {
            mlxk_gated_delta_verify_pool(
                q,
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                self.slots.as_ptr(),
                self.fresh.as_ptr(),
                self.slots.len(),
                m,
                &mut y,
            )
        });
        ok(mlxk_array_eval(y));
        y
    }

    /// `mlxk_gated_delta_state_pool` with the accepted `lengths` (the fresh flags as given, or
    /// none): the new pool.
    fn commit(&self, lengths: &[i32], fresh: bool) -> H {
        let [_, k, v, a, b, al, dt, pool, _] = self.args();
        let mut p = null_mut();
        let fresh = if fresh { self.fresh.as_ptr() } else { null() };
        ok(unsafe {
            mlxk_gated_delta_state_pool(
                k,
                v,
                a,
                b,
                al,
                dt,
                pool,
                self.slots.as_ptr(),
                fresh,
                lengths.as_ptr(),
                lengths.len(),
                &mut p,
            )
        });
        ok(mlxk_array_eval(p));
        p
    }

    fn free(self) {
        free(self.pool);
        self.u.free();
    }
}

/// Runs `call` on the CPU, then on the GPU with CPU-op gates (each output bit for bit the
/// CPU's) and with the kernel's gates (within `gate_bound`; the outputs named in `y_like` are
/// y, the others states). Prints the counts; frees everything.
pub(super) fn against_the_cpu(
    label: &str,
    dtype: mlxk_dtype,
    names: &[&str],
    call: impl Fn() -> Vec<H>,
) {
    on_gpu(false);
    let cpu = call();
    on_gpu(true);
    gpu_gates_on_cpu(true);
    let exact = call();
    gpu_gates_on_cpu(false);
    let fused = call();
    on_gpu(false);
    let mut line = String::new();
    for (i, name) in names.iter().enumerate() {
        assert_identical(&format!("{label}: {name} (CPU gates)"), cpu[i], exact[i]);
        let d = diff(cpu[i], fused[i]);
        let bound = gate_bound(dtype, name.starts_with('y'));
        assert!(
            d.rel <= bound,
            "{label}: {name} {:.3e} over the bound {bound:.1e}",
            d.rel
        );
        line += &format!(
            "; fused gates: {name} {}/{} differ (max rel {:.2e})",
            d.differ, d.total, d.rel
        );
    }
    println!(
        "PASS: {label}: {} bit-identical with CPU-op gates{line}",
        names.join(", ")
    );
    for h in cpu.into_iter().chain(exact).chain(fused) {
        free(h);
    }
}

fn dims_label(dims: [usize; 6]) -> String {
    let [b, t, hk, hv, dk, dv] = dims;
    format!("B={b} T={t} Hk={hk} Hv={hv} Dk={dk} Dv={dv}")
}

/// `mlxk_gated_delta_update_pool` on `rows` rows of a pool of `n`.
fn update_pool(rng: &mut Rng, dims: [usize; 6], n: usize, dtype: mlxk_dtype, mask: bool) {
    let c = PoolCall::random(rng, dims, n, dims[0], dtype, mask);
    let label = format!(
        "update pool {} {} N={n} slots {:?} fresh {:?} mask={mask}",
        dtype_name(dtype),
        dims_label(dims),
        c.slots,
        c.fresh
    );
    against_the_cpu(&label, dtype, &["y", "pool"], || {
        let (y, p) = c.update(None);
        vec![y, p]
    });
    c.free();
}

/// `mlxk_gated_delta_update_packed`: sequences of `lengths` tokens.
fn packed(rng: &mut Rng, lengths: &[i32], heads: [usize; 4], n: usize, dtype: mlxk_dtype) {
    let mut cu = vec![0];
    for l in lengths {
        cu.push(cu.last().unwrap() + l);
    }
    let [hk, hv, dk, dv] = heads;
    let dims = [1, *cu.last().unwrap() as usize, hk, hv, dk, dv];
    let c = PoolCall::random(rng, dims, n, lengths.len(), dtype, false);
    let label = format!(
        "packed {} lengths {lengths:?} {} N={n} slots {:?} fresh {:?}",
        dtype_name(dtype),
        dims_label(dims),
        c.slots,
        c.fresh
    );
    against_the_cpu(&label, dtype, &["y", "pool"], || {
        let (y, p) = c.update(Some(&cu));
        vec![y, p]
    });
    c.free();
}

/// The speculative step: the verify (its y equal to the update's on the GPU), then the commit
/// of random accepted lengths (0 and T among them), and the commit of every token equal to the
/// update's pool on the GPU (unmasked).
fn verify_then_commit(rng: &mut Rng, dims: [usize; 6], n: usize, dtype: mlxk_dtype, mask: bool) {
    let c = PoolCall::random(rng, dims, n, dims[0], dtype, mask);
    let [b, t, ..] = dims;
    let label = format!(
        "verify {} {} N={n} slots {:?} fresh {:?} mask={mask}",
        dtype_name(dtype),
        dims_label(dims),
        c.slots,
        c.fresh
    );
    against_the_cpu(&label, dtype, &["y"], || vec![c.verify()]);
    on_gpu(true);
    let (y, p) = c.update(None);
    let y_verify = c.verify();
    assert_identical(&format!("{label}: verify's y vs the update's"), y, y_verify);
    let mut lengths: Vec<i32> = (0..b).map(|_| rng.below(t as u64 + 1) as i32).collect();
    lengths[0] = 0;
    lengths[b - 1] = t as i32;
    if !mask {
        let whole = c.commit(&vec![t as i32; b], true);
        assert_identical(
            &format!("{label}: commit of all T vs the update's pool"),
            p,
            whole,
        );
        free(whole);
    }
    on_gpu(false);
    for h in [y, p, y_verify] {
        free(h);
    }
    let label = format!(
        "commit {} {} lengths {lengths:?}",
        dtype_name(dtype),
        dims_label(dims)
    );
    against_the_cpu(&label, dtype, &["pool"], || vec![c.commit(&lengths, true)]);
    c.free();
}

/// `mlxk_gated_delta_state_pool` at random lengths, with and without the fresh flags.
fn replay(rng: &mut Rng, dims: [usize; 6], n: usize, dtype: mlxk_dtype) {
    let c = PoolCall::random(rng, dims, n, dims[0], dtype, false);
    let t = dims[1] as u64;
    let lengths: Vec<i32> = (0..dims[0]).map(|_| rng.below(t + 1) as i32).collect();
    for fresh in [true, false] {
        let label = format!(
            "replay pool {} {} N={n} slots {:?} fresh {:?} lengths {lengths:?}",
            dtype_name(dtype),
            dims_label(dims),
            c.slots,
            if fresh { &c.fresh[..] } else { &[] }
        );
        against_the_cpu(&label, dtype, &["pool"], || vec![c.commit(&lengths, fresh)]);
    }
    c.free();
}

/// Decode steps on a pool whose old handle is freed before each eval: on MLX CUDA the in-place
/// launch writes the new states into the pool's own buffer (the same data address every step),
/// and the pool after the steps equals the CPU's bit for bit (CPU-op gates).
fn in_place_decode(rng: &mut Rng) {
    use mlxkern::testing::data_address;
    let dims = [8, 1, 16, 32, 128, 128];
    let n = 20;
    let c = PoolCall::random(rng, dims, n, dims[0], MLXK_DTYPE_BFLOAT16, false);
    let pool0 = read_bytes(c.pool);
    let run = |gpu: bool| -> (Vec<u8>, Vec<usize>) {
        on_gpu(gpu);
        gpu_gates_on_cpu(gpu);
        let shape = shape_of(c.pool);
        let mut pool = new_bytes(&pool0, &shape, MLXK_DTYPE_FLOAT32);
        ok(mlxk_array_eval(pool));
        let mut addresses = vec![data_address(pool)];
        for _ in 0..4 {
            let [q, k, v, a, b, al, dt, _, m] = c.args();
            let (mut y, mut next) = (null_mut(), null_mut());
            let x = [q, k, v, a, b, al, dt];
            ok(update_pool_to(
                x,
                pool,
                &c.slots,
                null(),
                m,
                &mut y,
                &mut next,
            ));
            free(pool);
            free(y);
            pool = next;
            addresses.push(data_address(pool));
        }
        let bytes = read_bytes(pool);
        free(pool);
        gpu_gates_on_cpu(false);
        on_gpu(false);
        (bytes, addresses)
    };
    let (cpu, cpu_at) = run(false);
    let (gpu, gpu_at) = run(true);
    assert!(
        cpu == gpu,
        "in-place decode: the GPU pool differs from the CPU's"
    );
    assert!(
        cpu_at.iter().all(|&a| a == cpu_at[0]),
        "CPU pool moved: {cpu_at:x?}"
    );
    assert!(
        gpu_at.iter().all(|&a| a == gpu_at[0]),
        "GPU pool moved: {gpu_at:x?}"
    );
    println!(
        "PASS: in-place decode on a pool of {n} ({}, slots {:?}): 4 steps in the pool's own \
         buffer on the CPU and the GPU, bit-identical",
        dims_label(dims),
        c.slots
    );
    c.free();
}

/// `mlxk_gated_delta_update_pool_chunked` (or, with `cu_seqlens`, `_packed_chunked`) with
/// chunk size `chunk`: (y, new pool).
fn update_chunked(c: &PoolCall, cu_seqlens: Option<&[i32]>, chunk: i32) -> (H, H) {
    let [q, k, v, a, b, al, dt, pool, m] = c.args();
    let (mut y, mut p) = (null_mut(), null_mut());
    let (slots, fresh, n) = (c.slots.as_ptr(), c.fresh.as_ptr(), c.slots.len());
    ok(unsafe {
        match cu_seqlens {
            None => mlxk_gated_delta_update_pool_chunked(
                q, k, v, a, b, al, dt, pool, slots, fresh, n, m, chunk, &mut y, &mut p,
            ),
            Some(cu) => {
                let x = [q, k, v, a, b, al, dt, pool];
                update_packed_to(x, cu, (slots, fresh), Some(chunk), (&mut y, &mut p))
            }
        }
    });
    ok(mlxk_array_eval(y));
    ok(mlxk_array_eval(p));
    (y, p)
}

/// Rows `from .. from + n` of `bytes` (rows of `row_bytes`) as a new array of `shape`.
fn rows_of(
    bytes: &[u8],
    from: usize,
    n: usize,
    row_bytes: usize,
    shape: &[i32],
    dtype: mlxk_dtype,
) -> H {
    new_bytes(
        &bytes[from * row_bytes..(from + n) * row_bytes],
        shape,
        dtype,
    )
}

/// The chunked pool (or packed) call on the GPU against the dense GPU chunked call on each
/// row's tokens alone (its state the slot's, none where fresh): y over the row's tokens and the
/// slot's new state bit for bit; a padding row's y +0 and the slots no row names unchanged.
fn chunked_pool(
    rng: &mut Rng,
    dims: [usize; 6],
    lengths: Option<&[i32]>,
    n: usize,
    dtype: mlxk_dtype,
    mask: bool,
    chunk: i32,
) {
    let [b, t, hk, hv, dk, dv] = dims;
    let rows = lengths.map_or(b, <[i32]>::len);
    let cu: Option<Vec<i32>> = lengths.map(|l| {
        let mut cu = vec![0];
        for x in l {
            cu.push(cu.last().unwrap() + x);
        }
        cu
    });
    let c = PoolCall::random(rng, dims, n, rows, dtype, mask);
    let label = format!(
        "chunked pool {} {} C={chunk} N={n} slots {:?} fresh {:?} lengths {lengths:?} mask={mask}",
        dtype_name(dtype),
        dims_label(dims),
        c.slots,
        c.fresh
    );
    on_gpu(true);
    let (y, pool_out) = update_chunked(&c, cu.as_deref(), chunk);
    let (y_bytes, pool_bytes) = (read_bytes(y), read_bytes(pool_out));
    let pool_in = read_bytes(c.pool);
    let item = if dtype == MLXK_DTYPE_FLOAT32 { 4 } else { 2 };
    let [q, k, v, a, bb, al, dt, _, m] = c.u.h;
    let inputs = [q, k, v, a, bb].map(read_bytes);
    let mask_bytes = (!m.is_null()).then(|| read_bytes(m));
    let per_token = [hk * dk, hk * dk, hv * dv, hv, hv];
    let state_bytes = 4 * hv * dv * dk;
    let y_row = item * hv * dv;
    for row in 0..rows {
        let (tok0, len) = match &cu {
            Some(cu) => (cu[row] as usize, (cu[row + 1] - cu[row]) as usize),
            None => (row * t, t),
        };
        let slot = c.slots[row];
        let got = &y_bytes[tok0 * y_row..(tok0 + len) * y_row];
        if slot < 0 {
            assert!(
                got.iter().all(|&x| x == 0),
                "{label}: padding row {row}: y is not +0"
            );
            continue;
        }
        let l = len as i32;
        let shapes = [
            [1, l, hk as i32, dk as i32],
            [1, l, hk as i32, dk as i32],
            [1, l, hv as i32, dv as i32],
            [1, l, hv as i32, 0],
            [1, l, hv as i32, 0],
        ];
        let arrays: Vec<H> = (0..5)
            .map(|i| {
                let shape: Vec<i32> = shapes[i].iter().copied().filter(|&d| d != 0).collect();
                rows_of(&inputs[i], tok0, len, item * per_token[i], &shape, dtype)
            })
            .collect();
        let state = if c.fresh[row] != 0 {
            null_mut()
        } else {
            let at = slot as usize;
            rows_of(
                &pool_in,
                at,
                1,
                state_bytes,
                &[1, hv as i32, dv as i32, dk as i32],
                MLXK_DTYPE_FLOAT32,
            )
        };
        let row_mask = mask_bytes
            .as_ref()
            .map(|mb| rows_of(mb, tok0, len, 1, &[1, l], MLXK_DTYPE_BOOL))
            .unwrap_or(null_mut());
        let (mut ye, mut se) = (null_mut(), null_mut());
        ok(unsafe {
            mlxk_gated_delta_update_chunked(
                arrays[0], arrays[1], arrays[2], arrays[3], arrays[4], al, dt, state, row_mask,
                chunk, &mut ye, &mut se,
            )
        });
        ok(mlxk_array_eval(ye));
        ok(mlxk_array_eval(se));
        assert!(
            read_bytes(ye) == got,
            "{label}: row {row}: y differs from the dense call's"
        );
        let slot_out = &pool_bytes[slot as usize * state_bytes..(slot as usize + 1) * state_bytes];
        assert!(
            read_bytes(se) == slot_out,
            "{label}: row {row}: slot {slot} differs from the dense call's state"
        );
        for h in arrays.into_iter().chain([state, row_mask, ye, se]) {
            if !h.is_null() {
                free(h);
            }
        }
    }
    for slot in 0..n as i32 {
        if !c.slots.contains(&slot) {
            let at = slot as usize * state_bytes..(slot as usize + 1) * state_bytes;
            assert!(
                pool_bytes[at.clone()] == pool_in[at],
                "{label}: slot {slot} changed"
            );
        }
    }
    on_gpu(false);
    println!("PASS: {label}: every row bit-identical to the dense GPU chunked call");
    free(y);
    free(pool_out);
    c.free();
}

/// The chunked pool and packed calls on the GPU (tests/cuda/main.rs calls it on a CUDA
/// machine): Qwen3.5's heads, masks with a fully masked row, fresh and padding rows, packed
/// lengths 0, 1, past a chunk and mid-chunk, chunks of 16, 32 (the default) and 64.
pub fn chunked_pool_calls_match_the_dense_calls(rng: &mut Rng) {
    let (bf16, f16, f32) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32);
    chunked_pool(rng, [4, 100, 16, 32, 128, 128], None, 6, bf16, false, 64);
    chunked_pool(rng, [3, 77, 2, 4, 64, 48], None, 5, f16, true, 0);
    chunked_pool(rng, [2, 40, 1, 2, 256, 7], None, 3, f32, true, 16);
    let lengths = [0, 1, 130, 40, 7];
    let total: i32 = lengths.iter().sum();
    chunked_pool(
        rng,
        [1, total as usize, 2, 4, 128, 64],
        Some(&lengths),
        7,
        bf16,
        false,
        64,
    );
    let lengths = [33, 0, 5, 64];
    let total: i32 = lengths.iter().sum();
    chunked_pool(
        rng,
        [1, total as usize, 1, 2, 32, 9],
        Some(&lengths),
        5,
        f32,
        false,
        32,
    );
}

/// Every pool case (tests/cuda/main.rs calls it on a CUDA machine): with the in-place launch (the
/// default on MLX CUDA), then with the written rows and MLX's scatter, then the in-place decode.
pub fn pool_calls_match_the_cpu(rng: &mut Rng) {
    use mlxkern::testing::pool_in_place;
    for mode in [None, Some(false)] {
        pool_in_place(mode);
        println!(
            "pool launches: {}",
            if mode.is_none() {
                "in place"
            } else {
                "rows + scatter"
            }
        );
        pool_cases(rng);
    }
    pool_in_place(None);
    in_place_decode(rng);
}

fn pool_cases(rng: &mut Rng) {
    let (bf16, f16, f32) = (MLXK_DTYPE_BFLOAT16, MLXK_DTYPE_FLOAT16, MLXK_DTYPE_FLOAT32);
    // Decode at Qwen3.5 dims (B = 64: 2048 (row, head) pairs, 16 value rows a warp), prefill
    // past 32 tokens, masks, GQA, Dk 32 to 256, odd Dv, 256 pairs (4 rows a warp).
    for (dims, n, dtype, mask) in [
        ([4, 1, 16, 32, 128, 128], 9, bf16, false),
        ([64, 1, 16, 32, 128, 128], 80, bf16, false),
        ([3, 17, 2, 4, 64, 48], 5, f16, true),
        ([2, 40, 1, 4, 256, 7], 3, f16, false),
        ([16, 3, 4, 16, 32, 24], 20, f32, true),
    ] {
        update_pool(rng, dims, n, dtype, mask);
    }
    packed(rng, &[0, 1, 40, 7], [2, 4, 128, 64], 6, bf16);
    packed(rng, &[33, 0, 5], [1, 2, 32, 9], 3, f32);
    verify_then_commit(rng, [4, 5, 16, 32, 128, 128], 6, bf16, false);
    verify_then_commit(rng, [3, 8, 2, 4, 64, 24], 4, f16, true);
    replay(rng, [3, 40, 1, 2, 32, 16], 5, bf16);
    replay(rng, [32, 4, 4, 8, 96, 32], 40, f32);
}
