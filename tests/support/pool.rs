//! What the pool suites share: host values of one call's inputs and their handles, pool
//! shapes and random slots, and the reading of a recorded GPU launch.
#![allow(dead_code)]

use super::*;

/// Host values of one call's inputs (any float dtype for q, k, v), rows of T tokens.
pub struct Host {
    pub dims: [usize; 6], // B, T, Hk, Hv, Dk, Dv
    pub dtype: mlxk_dtype,
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub a: Vec<f32>,
    pub b: Vec<f32>,
    pub a_log: Vec<f32>,
    pub dt_bias: Vec<f32>,
}

impl Host {
    pub fn random(rng: &mut Rng, dims: [usize; 6], dtype: mlxk_dtype) -> Host {
        let [b, t, hk, hv, dk, dv] = dims;
        let q = heads(rng, b * t * hk * dk, dk, (dk as f32).powf(-0.5));
        let k = heads(rng, b * t * hk * dk, dk, 1.0);
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
    pub fn arrays(&self, rows: &[usize], t: usize, packed: bool) -> [H; 7] {
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

    pub fn state_len(&self) -> usize {
        let [_, _, _, hv, dk, dv] = self.dims;
        hv * dv * dk
    }
}

pub fn pool_shape(host: &Host, n: usize) -> [i32; 4] {
    let [_, _, _, hv, dk, dv] = host.dims;
    [n as i32, hv as i32, dv as i32, dk as i32]
}

/// `b` distinct slots below `n`, about a quarter of them negative (padding rows).
pub fn random_slots(rng: &mut Rng, b: usize, n: usize) -> Vec<i32> {
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

pub fn elem_size(dtype: mlxk_dtype) -> usize {
    if dtype == MLXK_DTYPE_FLOAT32 {
        4
    } else {
        2
    }
}

/// A recorded launch's int32 input as values.
pub fn ints(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A launch header with the `#include` lines of the CUDA launch replaced by their files.
pub fn resolved(text: &str) -> String {
    text.lines()
        .map(|line| match line.strip_prefix("#include \"") {
            Some(rest) => std::fs::read_to_string(rest.trim_end_matches('"')).unwrap(),
            None => format!("{line}\n"),
        })
        .collect()
}

/// `mlxk_gated_delta_update_pool` on the seven inputs `x` (q, k, v, a, b, a_log, dt_bias), the
/// pool, its slots with fresh flags (NULL: none) and the mask (NULL: none), the out-parameters
/// as given (NULL, or one place twice, where a test wants).
pub fn update_pool_to(
    x: [*const mlxk_array; 7],
    pool: *const mlxk_array,
    slots: &[i32],
    fresh: *const u8,
    mask: *const mlxk_array,
    y: *mut H,
    pool_out: *mut H,
) -> mlxk_status {
    pool_update(x, pool, (slots, fresh), mask, None, (y, pool_out))
}

/// `update_pool_to`, or with a `chunk` size `mlxk_gated_delta_update_pool_chunked`.
pub fn pool_update(
    [q, k, v, a, b, a_log, dt_bias]: [*const mlxk_array; 7],
    pool: *const mlxk_array,
    (slots, fresh): (&[i32], *const u8),
    mask: *const mlxk_array,
    chunk: Option<i32>,
    out: (*mut H, *mut H),
) -> mlxk_status {
    let x = [q, k, v, a, b, a_log, dt_bias, pool];
    let rows = (slots.as_ptr(), slots.len(), fresh);
    any_pool_update(x, None, rows, mask, chunk, out)
}

/// `mlxk_gated_delta_update_packed` (`chunk` None) or `mlxk_gated_delta_update_packed_chunked`
/// (its chunk size) on `x` (the seven inputs q, k, v, a, b, a_log, dt_bias, then the pool), the
/// offsets `cu`, the slots and fresh flags (NULL: none), the out-parameters as given.
pub fn update_packed_to(
    x: [*const mlxk_array; 8],
    cu: &[i32],
    (slots, fresh): (*const i32, *const u8),
    chunk: Option<i32>,
    out: (*mut H, *mut H),
) -> mlxk_status {
    any_pool_update(x, Some(cu), (slots, 0, fresh), std::ptr::null(), chunk, out)
}

/// The four pool updates on `x` (the seven inputs, then the pool): B rows (`cu` None; `n`
/// slots, the mask) or packed sequences (their offsets `cu`; `n` and the mask unread), exact
/// (`chunk` None) or chunked; the out-parameters as given.
fn any_pool_update(
    [q, k, v, a, b, al, dt, pool]: [*const mlxk_array; 8],
    cu: Option<&[i32]>,
    (s, n, fresh): (*const i32, usize, *const u8),
    mask: *const mlxk_array,
    chunk: Option<i32>,
    (y, p): (*mut H, *mut H),
) -> mlxk_status {
    let (c, nc) = cu.map_or((std::ptr::null(), 0), |cu| (cu.as_ptr(), cu.len()));
    unsafe {
        match (cu.is_some(), chunk) {
            (false, None) => {
                mlxk_gated_delta_update_pool(q, k, v, a, b, al, dt, pool, s, fresh, n, mask, y, p)
            }
            (false, Some(size)) => mlxk_gated_delta_update_pool_chunked(
                q, k, v, a, b, al, dt, pool, s, fresh, n, mask, size, y, p,
            ),
            (true, None) => {
                mlxk_gated_delta_update_packed(q, k, v, a, b, al, dt, pool, c, nc, s, fresh, y, p)
            }
            (true, Some(size)) => mlxk_gated_delta_update_packed_chunked(
                q, k, v, a, b, al, dt, pool, c, nc, s, fresh, size, y, p,
            ),
        }
    }
}

/// The pool calls (the faults suites run each).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolCall {
    Update,
    UpdateChunked,
    Verify,
    Packed,
    PackedChunked,
    Commit,
    FromConv,
}

pub const POOL_CALLS: [PoolCall; 7] = [
    PoolCall::Update,
    PoolCall::UpdateChunked,
    PoolCall::Verify,
    PoolCall::Packed,
    PoolCall::PackedChunked,
    PoolCall::Commit,
    PoolCall::FromConv,
];

impl PoolCall {
    /// Whether the call writes states (returns a new pool).
    pub fn writes(self) -> bool {
        self != PoolCall::Verify
    }
    /// Whether the call returns y.
    pub fn has_y(self) -> bool {
        self != PoolCall::Commit
    }
    /// The CPU kernel nodes an evaluation of the call's results runs before its pool node.
    pub fn nodes_before(self) -> usize {
        match self {
            PoolCall::FromConv => 1, // the head split
            _ => 0,
        }
    }
}
