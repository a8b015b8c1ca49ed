//! MLX CUDA: the Metal kernels' own text (`kernels/metal/`) through `mx::fast::cuda_kernel`,
//! with `kernels/cuda/metal_compat.cuh` as its header (Metal's names, MLX's CPU `exp`, products
//! that never fuse; docs/DESIGN.md §3). A CUDA launch is the Metal launch of the same node
//! (`crate::metal`) with that header and a geometry CUDA can run.

use std::sync::OnceLock;

use crate::bridge::MetalLaunch;
use crate::error::{Error, Result};
use crate::node::gated_delta::Dims;

mod files;

/// The header that lets NVRTC compile the Metal kernel text.
pub const METAL_COMPAT_HEADER: &str = include_str!("../kernels/cuda/metal_compat.cuh");

/// The gates computed inside the recurrence and replay (MLX's CPU formulas; the Metal text's
/// MLXK_GATE_DECAY_AT / MLXK_GATE_BETA_AT hooks).
pub const GATES_HEADER: &str = include_str!("../kernels/cuda/gates.cuh");

/// The matrix tiles' MLX CUDA form, which a CUDA launch carries in the place of their Metal
/// form (`metal::tiles::TILES_HEADER`).
pub const TILES_HEADER: &str = include_str!("../kernels/cuda/tiles.cuh");

pub use crate::config::TileForm;

impl TileForm {
    /// The header line that selects the form.
    pub fn define(self) -> String {
        let form = match self {
            TileForm::Fma => "MLXK_TILE_FMA",
            TileForm::Tf32 => "MLXK_TILE_TF32",
            TileForm::Bf16 => "MLXK_TILE_BF16",
        };
        format!("#define MLXK_TILE_FORM {form}\n")
    }

    /// The form CUDA launches take: `MLXK_CUDA_TILES`, else fma.
    pub fn configured() -> TileForm {
        crate::seams::cuda_tile_form()
            .or(crate::config::get().cuda_tiles)
            .unwrap_or(TileForm::Fma)
    }
}

/// A launch using the tiles with `form`'s line first in its header, so that `launch` keeps that
/// form instead of the configured one (tests and benchmarks of every form in one process).
pub fn with_tile_form(mut l: MetalLaunch, form: TileForm) -> MetalLaunch {
    l.header = format!("{}{}", form.define(), l.header);
    l
}

/// The header with the tiles' Metal form replaced by the CUDA form, of the form a line of the
/// header already names (`with_tile_form`) or else the configured one; other headers as they
/// are.
fn cuda_tiles(header: &str) -> String {
    let metal = crate::metal::tiles::TILES_HEADER;
    if !header.contains(metal) {
        return header.to_string();
    }
    let chosen = if header.contains("#define MLXK_TILE_FORM ") {
        String::new()
    } else {
        TileForm::configured().define()
    };
    format!("{chosen}{}", header.replace(metal, TILES_HEADER))
}

/// CUDA's limit on the blocks of a grid's y and z axes (x allows 2^31 - 1).
pub const MAX_BLOCKS_YZ: i32 = 65_535;

/// The copy of a pool the in-place pool launch makes when the caller keeps its pool
/// (`bridge::cuda_pool_kernel_op`): `out = pool`, float32, a grid-stride loop over
/// `pool_shape`'s elements (the grid: 1024 blocks of 256 threads).
pub fn pool_copy_launch() -> MetalLaunch {
    MetalLaunch {
        name: "mlxk_pool_copy".into(),
        source: "  const size_t n = size_t(pool_shape[0]) * size_t(pool_shape[1]) *\n\
                 \x20   size_t(pool_shape[2]) * size_t(pool_shape[3]);\n\
                 \x20 const size_t stride = size_t(gridDim.x) * blockDim.x;\n\
                 \x20 for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; \
                 i += stride) {\n\
                 \x20   out[i] = pool[i];\n\
                 \x20 }\n"
            .into(),
        header: String::new(),
        input_names: vec!["pool".into()],
        output_names: vec!["out".into()],
        output_dims: Vec::new(),
        output_ndims: Vec::new(),
        output_dtypes: vec![crate::dtype::Dtype::Float32 as i32],
        grid: [256 * 1024, 1, 1],
        threadgroup: [256, 1, 1],
        template_int_names: Vec::new(),
        template_int_values: Vec::new(),
        template_dtype_names: Vec::new(),
        template_dtype_values: Vec::new(),
    }
}

/// The CUDA form of a Metal launch.
///
/// Metal dispatches exactly `grid` threads (partial threadgroups at the edge); MLX CUDA launches
/// `ceil(grid / threadgroup)` whole blocks, so threads past the grid would run, and the kernel
/// text has no bounds checks of its own. Each axis therefore takes the largest threadgroup
/// extent, at most Metal's, that divides the grid (the recurrence's `Dv = 6` gets 3 rows a
/// block instead of 4 and 2). Lanes stay on x, so a SIMD group is still one warp. Grids past
/// CUDA's block limits are refused with the dimension that overflows.
pub fn launch(mut l: MetalLaunch) -> Result<MetalLaunch> {
    static COMPAT: OnceLock<String> = OnceLock::new();
    static WITH_GATES: OnceLock<String> = OnceLock::new();
    let compat = COMPAT.get_or_init(|| strip_comments(METAL_COMPAT_HEADER));
    l.header = if l.header.is_empty() {
        compat.clone()
    } else if l.header == GATES_HEADER {
        WITH_GATES
            .get_or_init(|| format!("{compat}{}", strip_comments(GATES_HEADER)))
            .clone()
    } else {
        format!("{compat}{}", strip_comments(&cuda_tiles(&l.header)))
    };
    l.source = strip_comments(&l.source);
    if let Some((header, source)) = files::include_lines(&l.header, &l.source, &l.input_names) {
        // MLX hashes the text on every evaluation: two lines instead of 5-10 KB (cuda/files.rs).
        l.header = header;
        l.source = source;
    }
    if l.name.starts_with("mlxk_gated_rms_norm") && l.threadgroup[0] == 32 {
        // Rows of at most 128 values take one SIMD group each; on Metal a threadgroup, on CUDA
        // up to eight share a block, as the head split's heads (32-thread blocks cap an SM at
        // half its warps).
        let rows = l.grid[0] / 32;
        let k = (1..=8).rev().find(|k| rows % k == 0).unwrap_or(1);
        l.threadgroup[0] = 32 * k;
    }
    if l.name.starts_with("mlxk_silu_rms_heads") {
        // One SIMD group per (row, head) on Metal; on CUDA up to eight heads share a block, so
        // an SM is not limited by its block count to a quarter of its warps.
        let heads = l.grid[0] / 32;
        let k = (1..=8).rev().find(|k| heads % k == 0).unwrap_or(1);
        l.threadgroup[0] = 32 * k;
    }
    for axis in 0..3 {
        let (grid, group) = (l.grid[axis], &mut l.threadgroup[axis]);
        if grid == 0 {
            continue; // no thread runs; the bridge makes the empty outputs itself
        }
        *group = (1..=(*group).max(1))
            .rev()
            .find(|g| grid % g == 0)
            .unwrap_or(1);
        let blocks = grid / *group;
        if axis > 0 && blocks > MAX_BLOCKS_YZ {
            return Err(Error::Unsupported(format!(
                "{}: the CUDA launch needs {blocks} blocks on grid axis {} ({}), over CUDA's \
                 limit of {MAX_BLOCKS_YZ}; split the call along that dimension",
                l.name,
                ["x", "y", "z"][axis],
                axis_meaning(&l.name, axis),
            )));
        }
    }
    Ok(l)
}

/// The text without its `//` comments, indentation and the lines they leave empty: MLX CUDA
/// hashes a custom kernel's whole text on every evaluation (and `cuda_kernel` assembles it
/// anew on every call), so shorter text is cheaper per launch (bench-cuda's dispatch rows: 10 KB
/// more text, 0.9 µs more a node in a pipelined decode on an H200 host); NVRTC compiles the same
/// code (tests/cuda/text.rs compares the tokens). The kernel texts have no string literals: a
/// `//` after a `"` on its line is kept, in case.
pub fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let quote = line.find('"');
        let code = match line.find("//") {
            Some(at) if quote.is_none_or(|q| q > at) => &line[..at],
            _ => line,
        };
        let code = code.trim();
        if !code.is_empty() {
            out.push_str(code);
            out.push('\n');
        }
    }
    out
}

/// The recurrence or replay launch with its gates fused (`kernels/cuda/gates.cuh`): the inputs
/// named g and beta carry a and b, and A_log and dt_bias follow
/// (`node::gated_delta::Node::cuda_fused_inputs`). One op per layer step instead of eight: MLX
/// CUDA's dispatch costs ~6-10 us per op, the kernel itself a few.
pub fn with_fused_gates(mut l: MetalLaunch) -> MetalLaunch {
    l.name.push_str("_gates");
    // Before any header of the launch's own (the recurrence from the convolution's output).
    l.header = format!("{GATES_HEADER}{}", l.header);
    l.input_names
        .extend(["a_log".to_string(), "dt_bias".to_string()]);
    l
}

/// Value rows per SIMD group for the CUDA recurrence and replay: the largest of 16 (from 1024
/// (batch, value head) pairs), 8 (from 512), 4 (from 256), 2 that divides Dv, so each warp keeps
/// that many rows' state loads in flight and computes each token's gates for all of them (the
/// seed's one row per warp leaves an H200 latency-bound); 1 below 256 pairs, where every warp
/// counts. The bits do not depend on it. Measured on an H200 (Hv = 32, Dk = Dv = 128):
/// - B = 32 and 256, through `mx::fast::cuda_kernel`, µs a layer at 1 / 2 / 4 / 8 / 16 rows:
///   B = 32 81.5 / 66.1 / 62.6 / 60.6 / 59.3, B = 256 482 / 369 / 330 / 304 / 295;
/// - B = 8, the kernel alone (Nsight Compute, the GPU's own clocks) at 2 / 4 / 8 rows: 13.9 /
///   12.5 / 13.7 µs (40 / 56 / 72 registers, 2.6 / 1.7 / 1.1 waves).
///
/// 512 pairs (B = 16) lie between the two measured sizes and take the rows between theirs.
pub fn rows_per_simd_group(dims: Dims) -> usize {
    let pairs = dims.b * dims.hv;
    if pairs < 256 {
        return 1;
    }
    let widest = match pairs {
        p if p >= 1024 => 16,
        p if p >= 512 => 8,
        _ => 4,
    };
    [16, 8, 4, 2, 1]
        .into_iter()
        .filter(|&r| r <= widest)
        .find(|r| dims.dv % r == 0)
        .unwrap_or(1)
}

/// What a grid axis counts, for the error message.
fn axis_meaning(kernel: &str, axis: usize) -> &'static str {
    match (kernel, axis) {
        ("mlxk_silu_rms_heads", 1) => "rows: batch x sequence",
        (_, 1) => "value rows Dv",
        (_, 2) => "batch x value heads",
        _ => "threads",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metal(name: &str, grid: [i32; 3], threadgroup: [i32; 3]) -> MetalLaunch {
        MetalLaunch::empty(name, grid, threadgroup)
    }

    #[test]
    fn rows_per_simd_group_follows_the_launch_size_and_divides_dv() {
        let d = |b, hv, dv| Dims {
            b,
            t: 1,
            hk: 1,
            hv,
            dk: 128,
            dv,
        };
        assert_eq!(rows_per_simd_group(d(1, 32, 128)), 1);
        assert_eq!(rows_per_simd_group(d(7, 32, 128)), 1);
        assert_eq!(rows_per_simd_group(d(8, 32, 128)), 4);
        assert_eq!(rows_per_simd_group(d(15, 32, 128)), 4);
        assert_eq!(rows_per_simd_group(d(16, 32, 128)), 8);
        assert_eq!(rows_per_simd_group(d(31, 32, 128)), 8);
        assert_eq!(rows_per_simd_group(d(32, 32, 128)), 16);
        assert_eq!(rows_per_simd_group(d(256, 32, 128)), 16);
        assert_eq!(rows_per_simd_group(d(256, 32, 24)), 8);
        assert_eq!(rows_per_simd_group(d(256, 32, 12)), 4);
        assert_eq!(rows_per_simd_group(d(256, 32, 6)), 2);
        assert_eq!(rows_per_simd_group(d(256, 32, 7)), 1);
        assert_eq!(rows_per_simd_group(d(8, 32, 6)), 2);
        for dv in 1..=300 {
            for b in [1, 8, 32, 300] {
                assert_eq!(dv % rows_per_simd_group(d(b, 32, dv)), 0);
            }
        }
    }

    /// The text NVRTC reads: `#include "<file>"` lines replaced by the file (cuda/files.rs).
    fn resolved(text: &str) -> String {
        text.lines()
            .map(|line| match line.strip_prefix("#include \"") {
                Some(rest) => std::fs::read_to_string(rest.trim_end_matches('"')).unwrap(),
                None => format!("{line}\n"),
            })
            .collect()
    }

    #[test]
    fn threadgroups_divide_the_grid() {
        for dv in 1..=260 {
            let l = launch(metal("mlxk_gated_delta_step", [32, dv, 64], [32, 4, 1])).unwrap();
            assert_eq!(l.threadgroup[0], 32);
            assert!(l.threadgroup[1] >= 1 && l.threadgroup[1] <= 4);
            assert_eq!(dv % l.threadgroup[1], 0, "Dv {dv}");
            if dv % 4 == 0 {
                assert_eq!(l.threadgroup[1], 4);
            }
            assert_eq!(resolved(&l.header), strip_comments(METAL_COMPAT_HEADER));
            let fused = launch(with_fused_gates(metal(
                "mlxk_gated_delta_step",
                [32, dv, 2],
                [32, 4, 1],
            )))
            .unwrap();
            assert_eq!(
                resolved(&fused.header),
                strip_comments(&format!("{METAL_COMPAT_HEADER}{GATES_HEADER}"))
            );
            assert_eq!(fused.name, "mlxk_gated_delta_step_gates");
        }
        let l = launch(metal("mlxk_gated_rms_norm", [7 * 96, 1, 1], [96, 1, 1])).unwrap();
        assert_eq!(l.threadgroup, [96, 1, 1]);
        // Rows of one SIMD group: up to eight a block (12 rows: 6; 7 rows: 7; 16: 8).
        for (rows, k) in [(12, 6), (7, 7), (16, 8), (1, 1)] {
            let l = launch(metal("mlxk_gated_rms_norm", [32 * rows, 1, 1], [32, 1, 1])).unwrap();
            assert_eq!(l.threadgroup, [32 * k, 1, 1], "{rows} rows");
        }
        // The head split: up to eight heads a block (80 heads: 8; 6 heads: 6; 7 heads: 7).
        for (heads, k) in [(80, 8), (6, 6), (7, 7), (11, 1), (9, 3)] {
            let l = launch(metal("mlxk_silu_rms_heads", [32 * heads, 5, 1], [32, 1, 1])).unwrap();
            assert_eq!(l.threadgroup, [32 * k, 1, 1], "{heads} heads");
        }
        let l = launch(metal("mlxk_gated_delta_step", [32, 0, 0], [32, 4, 1])).unwrap();
        assert_eq!(l.threadgroup, [32, 4, 1]);
    }

    #[test]
    fn tile_launches_carry_the_cuda_form_of_their_choice() {
        use crate::metal::tiles::tiles_check_launch;
        let configured = launch(tiles_check_launch(1, 32, 32, 32)).unwrap();
        let text = resolved(&configured.header);
        assert!(
            !text.contains("simdgroup_float8x8"),
            "the Metal form left in"
        );
        assert!(text.contains("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"));
        assert!(text.starts_with(&strip_comments(METAL_COMPAT_HEADER)));
        let first = text.find("#define MLXK_TILE_FORM ").unwrap();
        assert!(text[first..].starts_with(&TileForm::configured().define()));
        for form in TileForm::ALL {
            let l = launch(with_tile_form(tiles_check_launch(1, 32, 32, 32), form)).unwrap();
            let text = resolved(&l.header);
            // The form's line comes first (tiles.cuh's own default follows, under #ifndef).
            let first = text.find("#define MLXK_TILE_FORM ").unwrap();
            assert!(text[first..].starts_with(&form.define()), "{form:?}");
            assert_eq!(TileForm::from_name(form.name()), Some(form));
        }
        assert_eq!(TileForm::from_name("fp32"), None);
        // A launch without tiles keeps its header.
        let plain = launch(metal("mlxk_gated_delta_step", [32, 4, 1], [32, 4, 1])).unwrap();
        assert!(!resolved(&plain.header).contains("MLXK_TILE_FORM"));
    }

    #[test]
    fn comments_go_and_code_stays() {
        let text = "// head\n#define A(x) ((x) * 2)  // doubles\n\n  int y = A(1);\n  // x\n\
                    #define B \\\n  1\n";
        assert_eq!(
            strip_comments(text),
            "#define A(x) ((x) * 2)\nint y = A(1);\n#define B \\\n1\n"
        );
        // Every kernel text keeps its code lines (no line of code is lost or cut).
        for text in [
            METAL_COMPAT_HEADER,
            GATES_HEADER,
            crate::metal::gated_delta::GATED_DELTA_SOURCE,
        ] {
            let code = |t: &str| {
                t.lines()
                    .map(|l| l.split("//").next().unwrap().trim().to_string())
                    .filter(|l| !l.is_empty())
                    .collect::<Vec<_>>()
            };
            assert_eq!(code(&strip_comments(text)), code(text));
            assert!(strip_comments(text).len() < text.len());
        }
    }

    #[test]
    fn grids_past_the_block_limits_are_refused() {
        let err = launch(metal(
            "mlxk_silu_rms_heads",
            [32 * 48, 70_000, 1],
            [32, 1, 1],
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("70000 blocks") && err.contains("batch x sequence"),
            "{err}"
        );
        let err = launch(metal(
            "mlxk_gated_delta_step",
            [32, 128, 65_536],
            [32, 4, 1],
        ))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("axis z") && err.contains("batch x value heads"),
            "{err}"
        );
        assert!(launch(metal("mlxk_silu_rms_heads", [32, 65_535, 1], [32, 1, 1])).is_ok());
    }
}
