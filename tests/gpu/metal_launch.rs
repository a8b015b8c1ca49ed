//! The Metal launch descriptions: geometry, names and template arguments as mlx-lm's kernel.

use mlxkern::metal::gated_delta::*;
use mlxkern::metal::gated_rms_norm::*;
use mlxkern::metal::silu_rms_heads::*;
use mlxkern::metal::*;
use mlxkern::node::gated_delta::{Dims, Form, GateDtypes, Node, Pool, PoolWrite};
use mlxkern::node::{gated_rms_norm, silu_rms_heads};
use mlxkern::Dtype;

use crate::support::qwen35_split_dims;

/// A gated-delta node of `form` with bf16 inputs and gates.
fn node(dims: Dims, form: Form, has_mask: bool) -> Node {
    let bf16 = Dtype::Bfloat16;
    Node {
        dims,
        dtype: bf16,
        gates: GateDtypes {
            a: bf16,
            b: bf16,
            a_log: Dtype::Float32,
            dt_bias: bf16,
        },
        has_state: true,
        has_mask,
        form,
        pool: None,
    }
}

#[test]
fn recurrence_launch_matches_mlx_lm() {
    let d = Dims {
        b: 3,
        t: 7,
        hk: 2,
        hv: 6,
        dk: 128,
        dv: 96,
    };
    for masked in [false, true] {
        let l = gated_delta_launch(&node(d, Form::Exact, masked));
        assert_eq!(l.grid, [32, 96, 18]);
        assert_eq!(l.threadgroup, [32, 4, 1]);
        let mut inputs = vec!["q", "k", "v", "g", "beta", "state_in"];
        // T comes with k's shape, which MLX passes when the text names k_shape.
        assert!(l.source.contains("const int T = k_shape[1];"));
        if masked {
            inputs.push("mask");
            assert!(l.source.contains("if (mask[b_idx * T + t])"));
        } else {
            assert!(l.source.contains("if (true)"));
        }
        assert!(!l.source.contains(TOKEN_ACTIVE_MARKER));
        assert_eq!(l.input_names, inputs);
        assert_eq!(l.output_names, ["y", "state_out"]);
        assert_eq!(l.output_dims, [3, 7, 6, 96, 3, 6, 96, 128]);
        assert_eq!(l.template_int_names, ["Dk", "Dv", "Hk", "Hv", "ROWS"]);
        assert_eq!(l.template_int_values, [128, 96, 2, 6, 1]);
        // More value rows per SIMD group (the CUDA launch): a shorter grid, the same text.
        let four = gated_delta_launch_rows(&node(d, Form::Exact, masked), 4);
        assert_eq!(four.grid, [32, 24, 18]);
        assert_eq!(four.template_int_values, [128, 96, 2, 6, 4]);
        assert_eq!(four.source, l.source);
        assert_eq!(l.template_dtype_names, ["InT", "StT"]);
        assert_eq!(
            l.template_dtype_values,
            [Dtype::Bfloat16 as i32, Dtype::Float32 as i32]
        );
        assert_eq!(
            l.output_dtypes,
            [Dtype::Bfloat16 as i32, Dtype::Float32 as i32]
        );
    }
}

#[test]
fn the_embedded_source_is_the_kernel_file() {
    let file = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/kernels/metal/gated_delta.metal"
    ))
    .unwrap();
    assert_eq!(file, GATED_DELTA_SOURCE);
}

#[test]
fn replay_head_split_and_gated_norm_launches() {
    let d = Dims {
        b: 2,
        t: 8,
        hk: 16,
        hv: 32,
        dk: 128,
        dv: 128,
    };
    let l = gated_delta_launch(&node(d, Form::State, false));
    assert_eq!((l.grid, l.threadgroup), ([32, 128, 64], [32, 4, 1]));
    assert_eq!(
        l.input_names,
        ["k", "v", "g", "beta", "state_in", "lengths"]
    );
    assert!(l.source.contains("const int T = k_shape[1];"));
    assert_eq!(l.source, GATED_DELTA_STATE_SOURCE);

    let h = qwen35_split_dims();
    let l = silu_rms_heads_launch(&silu_rms_heads::Node {
        dims: h,
        dtype: Dtype::Bfloat16,
        eps: 1e-6 / 128.0,
    });
    assert_eq!((l.grid, l.threadgroup), ([32 * 64, 6, 1], [32, 1, 1]));
    assert_eq!(l.template_int_names, ["C", "HK", "HV", "DK", "DV", "EPS"]);
    assert_eq!(l.template_int_values[0], 2 * 16 * 128 + 32 * 128);
    assert_eq!(
        f32::from_bits(l.template_int_values[5] as u32),
        1e-6 / 128.0
    );
    assert_eq!(l.output_dims, [2, 3, 16, 128, 2, 3, 16, 128, 2, 3, 32, 128]);

    for (width, threads) in [
        (64, 32),
        (128, 32),
        (129, 64),
        (256, 64),
        (1000, 256),
        (4096, 1024),
        (9000, 1024),
    ] {
        assert_eq!(gated_rms_norm::threads(width), threads);
        let l = gated_rms_norm_launch(&gated_rms_norm::Node {
            shape: vec![3, 5, width],
            dtype: Dtype::Float16,
            gate_dtype: Dtype::Float16,
            eps: 1e-6,
        });
        assert_eq!(l.grid, [(15 * threads) as i32, 1, 1]);
        assert_eq!(l.threadgroup, [threads as i32, 1, 1]);
        assert_eq!(
            l.template_int_values,
            [width as i32, threads as i32, 1e-6f32.to_bits() as i32]
        );
    }
}

/// Pool nodes: the same texts with the pool header, one grid row per row of the table, the
/// pool as `state_in`, the table as `rows`, the compact state rows as the state output (one
/// row never written where no row is written), the flattened mask.
#[test]
fn pool_launches_read_the_row_table() {
    let d = Dims {
        b: 5,
        t: 9,
        hk: 2,
        hv: 6,
        dk: 64,
        dv: 24,
    };
    let pool = |write, packed| {
        Some(Pool {
            slots: 11,
            write,
            packed,
        })
    };
    for (masked, write, packed) in [
        (false, PoolWrite::Rows(3), false),
        (true, PoolWrite::Rows(5), false),
        (false, PoolWrite::Rows(2), true),
        (true, PoolWrite::Rows(0), false),
        (false, PoolWrite::Rows(0), true),
    ] {
        let n = Node {
            pool: pool(write, packed),
            ..node(d, Form::Exact, masked)
        };
        let dense = gated_delta_launch(&node(d, Form::Exact, masked));
        let l = gated_delta_launch(&n);
        assert_eq!(l.name, format!("{}_pool", dense.name));
        assert_eq!(l.header, POOL_HEADER);
        assert_eq!((l.grid, l.threadgroup), ([32, 24, 30], [32, 4, 1]));
        let mut inputs = vec!["q", "k", "v", "g", "beta", "state_in"];
        if masked {
            inputs.push("mask");
            assert!(l.source.contains("if (mask[tok0 + t])"));
            assert_eq!(
                l.source,
                GATED_DELTA_SOURCE.replace(TOKEN_ACTIVE_MARKER, POOL_MASK_TEST)
            );
        } else {
            assert_eq!(l.source, dense.source);
        }
        inputs.push("rows");
        assert_eq!(l.input_names, inputs);
        let (b, t) = if packed { (1, 9) } else { (5, 9) };
        let w = match write {
            PoolWrite::Rows(0) => 1,
            PoolWrite::Rows(w) => w as i32,
            _ => unreachable!(),
        };
        assert_eq!(l.output_dims, [b, t, 6, 24, w, 6, 24, 64]);
        assert_eq!(l.template_int_values, [64, 24, 2, 6, 1]);
        let four = gated_delta_launch_rows(&n, 4);
        assert_eq!((four.grid, four.source), ([32, 6, 30], l.source.clone()));
    }
    let replay = Node {
        pool: pool(PoolWrite::Rows(4), false),
        ..node(d, Form::State, false)
    };
    let l = gated_delta_launch(&replay);
    assert_eq!(l.name, "mlxk_gated_delta_state_pool");
    assert_eq!(l.input_names, ["k", "v", "g", "beta", "state_in", "rows"]);
    assert_eq!(
        (l.source.as_str(), l.header.as_str()),
        (GATED_DELTA_STATE_SOURCE, POOL_HEADER)
    );
    assert_eq!(l.output_dims, [4, 6, 24, 64]);
}
