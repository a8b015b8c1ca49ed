//! The Metal launch descriptions: geometry, names and template arguments as mlx-lm's kernel.

use mlxkern::metal::*;
use mlxkern::Dtype;

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
        let l = gated_delta_launch(d, Dtype::Bfloat16, masked);
        assert_eq!(l.grid, [32, 96, 18]);
        assert_eq!(l.threadgroup, [32, 4, 1]);
        let mut inputs = vec!["q", "k", "v", "g", "beta", "state_in", "Tin"];
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
        assert_eq!(l.template_int_names, ["Dk", "Dv", "Hk", "Hv"]);
        assert_eq!(l.template_int_values, [128, 96, 2, 6]);
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
