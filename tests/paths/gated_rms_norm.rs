//! The vectorized gated norm (`mlxk_gated_rms_norm`), AVX2 and (where the CPU has it) AVX-512,
//! mixed gate dtypes included, against its portable code, bit for bit, through the C ABI: many
//! shapes, all three dtypes, and special values (±0, ±inf, NaN, huge, tiny, subnormal). NaN
//! outputs compare as a class. (It flips process-wide switches: tests/paths/main.rs.)
//! Its timing is a probe: `cargo bench --bench kernel_probe -- gated_rms_norm`.

use crate::support::paths;
use crate::support::*;
use mlxkern::capi::gated_rms_norm::*;
use paths::*;
use std::ptr::null_mut;

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
    let (portable, others) = paths(|| {
        let mut out = null_mut();
        ok(unsafe { mlxk_gated_rms_norm(xh, gh, wh, eps, &mut out) });
        let bytes = read_bytes(out);
        free(out);
        bytes
    });
    for (path, vectorized) in others {
        let what = format!(
            "gated norm {kind:?} gate {gate_kind:?} rows {rows} width {width} eps {eps:e} ({path})"
        );
        assert_same(kind, &portable, &vectorized, &what);
    }
    free_all(&[xh, gh, wh]);
}

#[test]
fn gated_norm_paths_agree_bit_for_bit() {
    switched_cases("gated norm", |rng, cases| {
        for kind in KINDS {
            for gate_kind in KINDS {
                for &listed in &NORM_WIDTHS {
                    let width = match listed {
                        0 => 1 + rng.below(6000) as usize,
                        w => w,
                    };
                    let rows = (1 + rng.below(300) as usize).min((120_000 / width).max(2));
                    gated_norm_case(rng, kind, gate_kind, rows, width);
                    *cases += 1;
                }
            }
            // Qwen3.5's shape: 32 heads of 128 per token.
            gated_norm_case(rng, kind, kind, 32 * 7, 128);
            *cases += 1;
        }
    });
}
