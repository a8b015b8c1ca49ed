//! What the exact recurrence's row kernels work on (a tile of tokens of one head, one value
//! row's state and outputs), and the portable row kernel.

use crate::cpu::elem::Elem;
use crate::cpu::reduce::simd_sum;

/// One tile of tokens for one head, ready for the row kernels.
pub(super) struct Tile<'a> {
    pub(super) len: usize,
    pub(super) k: &'a [f32],
    pub(super) q: Option<&'a [f32]>,
    pub(super) g: &'a [f32],
    pub(super) beta: &'a [f32],
    pub(super) active: &'a [bool],
}

/// What one value row reads and writes.
pub(super) struct RowIo<'a, T> {
    /// The row's initial state (Dk values; null: zeros).
    pub(super) src: *const f32,
    /// Where the row's final state goes (Dk values; may be the same memory as `src`, which
    /// the row kernels read completely before writing).
    pub(super) dst: *mut f32,
    /// v of this row at the tile's first token; token t at `t · stride`.
    pub(super) v: &'a [T],
    /// y of this row at the tile's first token (null for the replay); token t at `t · stride`.
    pub(super) y: *mut T,
    pub(super) stride: usize,
}

/// The portable row kernel: natural layout, the Metal kernel's loops.
///
/// # Safety
/// `io.src` (unless null) and `io.dst` address `dk` values; `io.y` (unless null) and `io.v`
/// hold the tile's tokens at `io.stride`.
pub(super) unsafe fn row_portable<T: Elem>(tile: &Tile, io: RowIo<T>, dk: usize) {
    let n = dk / 32;
    let mut s = [0f32; 256];
    let s = &mut s[..dk];
    if !io.src.is_null() {
        s.copy_from_slice(unsafe { std::slice::from_raw_parts(io.src, dk) });
    }
    let mut partials = [0f32; 32];
    for t in 0..tile.len {
        let y = (!io.y.is_null()).then(|| unsafe { io.y.add(t * io.stride) });
        if !tile.active[t] {
            if let Some(y) = y {
                // SAFETY: see `head`.
                unsafe { *y = T::from_f32(0.0) };
            }
            continue;
        }
        let k = &tile.k[t * dk..(t + 1) * dk];
        let g = tile.g[t];
        for (lane, partial) in partials.iter_mut().enumerate() {
            let mut acc = 0.0f32;
            for i in lane * n..(lane + 1) * n {
                s[i] *= g;
                acc += s[i] * k[i];
            }
            *partial = acc;
        }
        let kv_mem = simd_sum(&partials);
        let delta = (io.v[t * io.stride].to_f32() - kv_mem) * tile.beta[t];
        match (tile.q, y) {
            (Some(q), Some(y)) => {
                let q = &q[t * dk..(t + 1) * dk];
                for (lane, partial) in partials.iter_mut().enumerate() {
                    let mut acc = 0.0f32;
                    for i in lane * n..(lane + 1) * n {
                        s[i] += k[i] * delta;
                        acc += s[i] * q[i];
                    }
                    *partial = acc;
                }
                // SAFETY: see `head`.
                unsafe { *y = T::from_f32(simd_sum(&partials)) };
            }
            _ => {
                for i in 0..dk {
                    s[i] += k[i] * delta;
                }
            }
        }
    }
    unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), io.dst, dk) };
}
