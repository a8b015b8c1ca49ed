//! The vectorized head split (`mlxk_silu_rms_heads`), AVX2 and (where the CPU has it) AVX-512,
//! against its portable code, bit for bit, through the C ABI: many shapes, all three dtypes,
//! and special values (±0, ±inf, NaN, huge, tiny, subnormal). NaN outputs compare as a class.
//! (It flips process-wide switches: tests/paths/main.rs.)
//! Its timing is a probe: `cargo bench --bench kernel_probe -- silu_rms_heads`.

use crate::support::paths;
use crate::support::*;
use mlxkern::capi::silu_rms_heads::*;
use paths::*;
use std::ptr::null_mut;

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
    let (portable, others) = paths(|| {
        let (mut q, mut k, mut v) = (null_mut(), null_mut(), null_mut());
        ok(unsafe {
            mlxk_silu_rms_heads(
                xh, qh, kh, hk as i32, hv as i32, dv as i32, eps, &mut q, &mut k, &mut v,
            )
        });
        let out = [read_bytes(q), read_bytes(k), read_bytes(v)];
        free_all(&[q, k, v]);
        out
    });
    for (path, vectorized) in others {
        for (i, name) in ["q", "k", "v"].iter().enumerate() {
            let what = format!(
                "head split {kind:?} {name} rows {rows} Hk {hk} Hv {hv} Dk {dk} Dv {dv} eps {eps:e} \
                 ({path})"
            );
            assert_same(kind, &portable[i], &vectorized[i], &what);
        }
    }
    free_all(&[xh, qh, kh]);
}

#[test]
fn head_split_paths_agree_bit_for_bit() {
    switched_cases("head split", |rng, cases| {
        for kind in KINDS {
            // Every listed width as both Dk and Dv, then random shapes.
            for &w in &HEAD_WIDTHS[..HEAD_WIDTHS.len() - 1] {
                let rows = 1 + rng.below(40) as usize;
                let hk = 1 + rng.below(3) as usize;
                head_split_case(rng, kind, [rows, hk, 2, w, w]);
                *cases += 1;
            }
            for _ in 0..30 {
                let (dk, dv) = (head_width(rng), head_width(rng));
                let hk = 1 + rng.below(32) as usize;
                let hv = 1 + rng.below(32) as usize;
                let c = 2 * hk * dk + hv * dv;
                let rows = (1 + rng.below(300) as usize).min((150_000 / c).max(1));
                head_split_case(rng, kind, [rows, hk, hv, dk, dv]);
                *cases += 1;
            }
            // Qwen3.5's shape: full 128-wide heads, one row and many.
            for rows in [1, 17] {
                head_split_case(rng, kind, [rows, 16, 32, 128, 128]);
                *cases += 1;
            }
        }
    });
}
