//! The Metal launch descriptions the library would hand to `mx::fast::metal_kernel`, for each
//! case of the Metal-text emulation (tests/metal_emu/README.md).
//!
//! Built with plain `rustc` (no Cargo, no dependencies) by scripts/test-metal-emu.sh. It compiles
//! the library's own `src/metal.rs` and `src/dtype.rs` through `#[path]`, so the names, template
//! arguments, grid and threadgroup come from the functions the library calls, not from a
//! restatement; the launches are built from the library's own typed nodes (`src/node/`, also
//! compiled here), as `src/ops/*.rs` builds them. The two items `src/metal.rs` and `src/dtype.rs`
//! import from modules that need MLX (`bridge::MetalLaunch`) and `error` are declared here with
//! the same fields; a field added there and missing here stops this build.
//!
//! For each case it checks that the launch's source is the kernel file with the library's
//! textual substitution (the token-active marker), records that substitution as a `#define`, and
//! writes the case, the inputs as the library's ops pass them (names, dtypes, shapes: restated
//! from src/ops/*.rs, which build those arrays with MLX) and the whole launch description.
//!
//! Usage: launches <repo root> <output file>

#![allow(dead_code, unused_imports, clippy::all)]

use std::fmt::Write as _;

mod error {
    #[derive(Debug)]
    pub enum Error {
        Dtype(String),
    }
    pub type Result<T> = std::result::Result<T, Error>;
}

#[path = "../../src/dtype.rs"]
mod dtype;

mod bridge {
    /// Same fields as `src/bridge/mod.rs`'s `MetalLaunch` (a cxx shared struct).
    #[derive(Debug, Clone)]
    pub struct MetalLaunch {
        pub name: String,
        pub source: String,
        pub header: String,
        pub input_names: Vec<String>,
        pub output_names: Vec<String>,
        pub output_dims: Vec<i32>,
        pub output_ndims: Vec<u32>,
        pub output_dtypes: Vec<i32>,
        pub grid: [i32; 3],
        pub threadgroup: [i32; 3],
        pub template_int_names: Vec<String>,
        pub template_int_values: Vec<i32>,
        pub template_dtype_names: Vec<String>,
        pub template_dtype_values: Vec<i32>,
    }
}

#[path = "../../src/node/mod.rs"]
mod node;

/// A recurrence case's dimensions (the library's node takes them as `usize`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Dims {
    b: i64,
    t: i64,
    hk: i64,
    hv: i64,
    dk: i64,
    dv: i64,
}

/// A head-split case's dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HeadSplitDims {
    b: i64,
    s: i64,
    hk: i64,
    hv: i64,
    dk: i64,
    dv: i64,
}

#[path = "../../src/metal.rs"]
mod metal;

use dtype::Dtype;
use metal::MetalLaunch;
use node::gated_delta::{self as gd, Form};

const BF16: Dtype = Dtype::Bfloat16;
const F16: Dtype = Dtype::Float16;
const F32: Dtype = Dtype::Float32;

/// One emulated launch.
enum Kind {
    /// The recurrence; `aux` is b's dtype (beta = sigmoid(b) keeps it).
    Recurrence {
        d: Dims,
        masked: bool,
        with_state: bool,
        /// Value rows per SIMD group (1: the Metal launch; more: the CUDA launch's text path).
        rows: usize,
    },
    /// The prefix replay with the accepted lengths.
    Replay {
        d: Dims,
        with_state: bool,
        lengths: Vec<i32>,
        rows: usize,
    },
    /// The recurrence computing q, k, v from the convolution's output (the head split's
    /// arithmetic in the recurrence's kernel; `metal::gated_delta_from_conv_launch`), the case's
    /// eps the split's.
    FromConv {
        d: Dims,
        masked: bool,
        with_state: bool,
        rows: usize,
    },
    /// The SiLU + RMS head split.
    /// `grouped`: with the CUDA launch's threadgroup (up to eight heads a block, src/cuda.rs).
    HeadSplit { d: HeadSplitDims, grouped: bool },
    /// The gated norm over the last axis of `shape`; `aux` is the gate's dtype.
    /// `grouped`: with the CUDA launch's threadgroup (up to eight one-SIMD-group rows a block).
    GatedNorm { shape: Vec<i64>, grouped: bool },
    /// The recurrence's backward pass (`aux` is b's dtype) with `dy` in `dy_dtype` and
    /// `checkpoint` tokens between kept states (None: `backward_checkpoint(T)`, the library's
    /// choice). `twin`: the id of a case with the same inputs (same draws) and another
    /// checkpoint, whose outputs must be the same bits.
    Backward {
        d: Dims,
        masked: bool,
        with_state: bool,
        dy_dtype: Dtype,
        checkpoint: Option<usize>,
        twin: Option<usize>,
    },
}

struct Case {
    kind: Kind,
    dtype: Dtype,
    aux: Dtype,
    eps: f32,
}

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

/// The SIMD groups src/cuda.rs `launch` puts in one block for `n` heads or one-group rows: the
/// largest k <= 8 dividing n (restated: cuda.rs needs MLX-bound modules).
fn cuda_group(n: i64) -> i32 {
    (1..=8).rev().find(|k| n % k == 0).unwrap_or(1) as i32
}

/// A backward case with the library's checkpoint interval, then one more case for each interval
/// in `also` (same draws, its `twin`): their outputs must be the same bits.
#[allow(clippy::too_many_arguments)]
fn backward(
    list: &mut Vec<Case>,
    dtype: Dtype,
    b_dtype: Dtype,
    dy_dtype: Dtype,
    d: Dims,
    masked: bool,
    with_state: bool,
    also: &[usize],
) {
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
    backward(list, BF16, BF16, F32, dims(2, 5, 2, 2, 32, 7), false, true, &[1, 5]);
    backward(list, BF16, F32, BF16, dims(1, 17, 1, 2, 64, 48), false, false, &[]);
    backward(list, F16, F16, F16, dims(3, 5, 1, 4, 128, 9), true, true, &[]);
    backward(list, F32, F32, F32, dims(2, 64, 1, 2, 32, 5), true, true, &[1, 64]);
    backward(list, BF16, BF16, F32, dims(1, 100, 1, 2, 32, 3), false, true, &[1, 100]);
    backward(list, F16, F32, F32, dims(3, 1, 2, 2, 64, 7), true, false, &[]);
    backward(list, F32, BF16, F32, dims(1, 3, 1, 2, 256, 130), false, true, &[]);
    backward(list, BF16, BF16, BF16, dims(2, 4, 1, 4, 256, 33), true, false, &[]);
    backward(list, F16, F16, F32, dims(2, 17, 2, 4, 32, 12), true, true, &[1, 17]);
    backward(list, F32, F32, F32, dims(2, 17, 1, 4, 128, 16), false, true, &[]);
    backward(list, BF16, BF16, BF16, dims(1, 20, 2, 4, 128, 128), false, true, &[]);
}

/// The cases: every kernel over Dk 32/64/128/256, GQA ratios 1-4, B > 1, partial threadgroups
/// (Dv not a multiple of 4, Dv < 4), masks in device and constant memory, gated-norm widths
/// above 128 (one to 1024 threads, several passes), all three float dtypes.
fn cases() -> Vec<Case> {
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
    list
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// Which kernel file the launch's source comes from, and the substitution (marker, text) the
/// library made, verified by rebuilding the source from the file.
fn locate_source(root: &str, l: &MetalLaunch) -> (String, Vec<(String, String)>) {
    let files = [
        "kernels/metal/gated_delta.metal",
        "kernels/metal/gated_delta_state.metal",
        "kernels/metal/silu_rms_heads.metal",
        "kernels/metal/gated_rms_norm.metal",
        "kernels/metal/gated_delta_backward.metal",
    ];
    for file in files {
        let text = std::fs::read_to_string(format!("{root}/{file}")).expect("kernel file");
        if text == l.source {
            return (file.to_string(), vec![]);
        }
        let marker = metal::TOKEN_ACTIVE_MARKER;
        let count = text.matches(marker).count();
        if count >= 1 {
            // Every occurrence must be a whole identifier, so a #define replaces exactly this
            // text (an occurrence in a comment changes nothing the compiler sees).
            let ident = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            for (at, _) in text.match_indices(marker) {
                let (pre, post) = (&text[..at], &text[at + marker.len()..]);
                assert!(!ident(pre.chars().last()) && !ident(post.chars().next()));
            }
            // All occurrences take the same text, so its length follows from the lengths.
            let at = text.find(marker).unwrap();
            let grown = l.source.len() as i64 - text.len() as i64;
            let active_len = marker.len() as i64 + grown / count as i64;
            if grown % count as i64 == 0
                && active_len >= 0
                && l.source.len() >= at + active_len as usize
                && l.source.starts_with(&text[..at])
                && l.source.is_char_boundary(at + active_len as usize)
            {
                let active = &l.source[at..at + active_len as usize];
                if text.replace(marker, active) == l.source {
                    assert!(
                        !active.contains('\n'),
                        "substitution spans lines: {active:?}"
                    );
                    return (
                        file.to_string(),
                        vec![(marker.to_string(), active.to_string())],
                    );
                }
            }
        }
    }
    panic!(
        "launch {}: its source is none of the kernel files (with the marker substituted)",
        l.name
    );
}

fn shape_str(shape: &[i64]) -> String {
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    assert_eq!(args.len(), 3, "usage: launches <repo root> <output file>");
    let root = &args[1];
    let mut out = String::new();
    for (id, case) in cases().into_iter().enumerate() {
        let (launch, kind, label, case_dims, inputs, extra) = describe(&case);
        // Twins draw the same inputs: the seed of the case they repeat.
        let seed_id = match case.kind {
            Kind::Backward { twin: Some(t), .. } => t,
            _ => id,
        };
        let (file, defines) = locate_source(root, &launch);
        writeln!(out, "case {id}").unwrap();
        writeln!(out, "kind {kind}").unwrap();
        writeln!(out, "label {label}").unwrap();
        writeln!(out, "dtype {}", case.dtype as i32).unwrap();
        writeln!(out, "aux_dtype {}", case.aux as i32).unwrap();
        writeln!(out, "dims {}", shape_str(&case_dims)).unwrap();
        out.push_str(&extra);
        writeln!(out, "eps_bits {}", case.eps.to_bits()).unwrap();
        writeln!(out, "seed {}", 0x5EED_0000u64 + seed_id as u64 * 7919).unwrap();
        writeln!(out, "name {}", launch.name).unwrap();
        writeln!(out, "file {file}").unwrap();
        for (marker, text) in &defines {
            writeln!(out, "define {marker} {text}").unwrap();
        }
        assert_eq!(inputs.len(), launch.input_names.len());
        for (name, (input, dtype, shape)) in launch.input_names.iter().zip(&inputs) {
            assert_eq!(name, input, "input order of {}", launch.name);
            writeln!(out, "input {name} {} {}", *dtype as i32, shape_str(shape)).unwrap();
        }
        let mut at = 0usize;
        for (i, name) in launch.output_names.iter().enumerate() {
            let n = launch.output_ndims[i] as usize;
            let shape: Vec<i64> = launch.output_dims[at..at + n]
                .iter()
                .map(|&d| d as i64)
                .collect();
            at += n;
            writeln!(
                out,
                "output {name} {} {}",
                launch.output_dtypes[i],
                shape_str(&shape)
            )
            .unwrap();
        }
        let [gx, gy, gz] = launch.grid;
        let [tx, ty, tz] = launch.threadgroup;
        writeln!(out, "grid {gx} {gy} {gz}").unwrap();
        writeln!(out, "threadgroup {tx} {ty} {tz}").unwrap();
        for (n, v) in launch
            .template_int_names
            .iter()
            .zip(&launch.template_int_values)
        {
            writeln!(out, "tint {n} {v}").unwrap();
        }
        for (n, v) in launch
            .template_dtype_names
            .iter()
            .zip(&launch.template_dtype_values)
        {
            writeln!(out, "tdtype {n} {v}").unwrap();
        }
        writeln!(out, "header {}", hex(&launch.header)).unwrap();
        writeln!(out, "source {}", hex(&launch.source)).unwrap();
        writeln!(out, "end").unwrap();
    }
    std::fs::write(&args[2], out).expect("write the launch list");
}

type Inputs = Vec<(&'static str, Dtype, Vec<i64>)>;

/// The gated-delta node the library builds for a case (b's dtype is the case's aux dtype).
fn gated_delta_node(d: &Dims, c: &Case, form: Form, masked: bool, with_state: bool) -> gd::Node {
    let u = |x: i64| x as usize;
    gd::Node {
        dims: gd::Dims {
            b: u(d.b),
            t: u(d.t),
            hk: u(d.hk),
            hv: u(d.hv),
            dk: u(d.dk),
            dv: u(d.dv),
        },
        dtype: c.dtype,
        gates: gd::GateDtypes {
            a: F32,
            b: c.aux,
            a_log: F32,
            dt_bias: F32,
        },
        has_state: with_state,
        has_mask: masked,
        form,
    }
}

/// The launch for a case (from src/metal.rs), its kind and label, the case dimensions, the
/// inputs as the library's ops build them, and extra case lines. Also asserts the geometry of
/// docs/DESIGN.md §3, so a change of launch geometry is noticed here as well as emulated.
fn describe(c: &Case) -> (MetalLaunch, &'static str, String, Vec<i64>, Inputs, String) {
    let name = |d: Dtype| d.name();
    match &c.kind {
        Kind::Recurrence {
            d,
            masked,
            with_state,
            rows,
        } => {
            let node = gated_delta_node(d, c, Form::Exact, *masked, *with_state);
            let l = metal::gated_delta_launch_rows(&node, *rows);
            assert_eq!(l.grid, [32, (d.dv / *rows as i64) as i32, (d.b * d.hv) as i32]);
            assert_eq!(l.threadgroup, [32, 4, 1]);
            // src/ops/gated_delta.rs `update`, Backend::Metal: q, k, v, g (f32, compute_g),
            // beta (sigmoid(b): b's dtype), state (f32; zeros when absent), mask (bool [B, T]);
            // T from k's shape (k_shape).
            let mut inputs: Inputs = vec![
                ("q", c.dtype, vec![d.b, d.t, d.hk, d.dk]),
                ("k", c.dtype, vec![d.b, d.t, d.hk, d.dk]),
                ("v", c.dtype, vec![d.b, d.t, d.hv, d.dv]),
                ("g", F32, vec![d.b, d.t, d.hv]),
                ("beta", c.aux, vec![d.b, d.t, d.hv]),
                ("state_in", F32, vec![d.b, d.hv, d.dv, d.dk]),
            ];
            if *masked {
                inputs.push(("mask", Dtype::Bool, vec![d.b, d.t]));
            }
            let label = format!(
                "{} {} b:{} B={} T={} Hk={} Hv={} (GQA {}) Dk={} Dv={}{}",
                if *masked { "masked" } else { "unmasked" },
                name(c.dtype),
                name(c.aux),
                d.b,
                d.t,
                d.hk,
                d.hv,
                d.hv / d.hk,
                d.dk,
                d.dv,
                if *with_state { "" } else { " zero-state" }
            ) + &if *rows > 1 { format!(" ROWS={rows}") } else { String::new() };
            let extra = format!(
                "masked {}\nwith_state {}\n",
                *masked as i32, *with_state as i32
            );
            let kind = if *masked {
                "recurrence_masked"
            } else {
                "recurrence"
            };
            (
                l,
                kind,
                label,
                vec![d.b, d.t, d.hk, d.hv, d.dk, d.dv],
                inputs,
                extra,
            )
        }
        Kind::Backward {
            d,
            masked,
            with_state,
            dy_dtype,
            checkpoint,
            twin,
        } => {
            let node = gated_delta_node(d, c, Form::Exact, *masked, *with_state);
            let u = |x: i64| x as usize;
            let ckpt = checkpoint.unwrap_or_else(|| metal::backward_checkpoint(u(d.t)));
            let l = metal::gated_delta_backward_launch(&node, ckpt);
            // P threadgroups per (batch row, value head), each of NSG ≤ 4 SIMD groups (128
            // threads) holding RP ≤ 4 value rows each, P·NSG·RP covering Dv; the row sums'
            // NSG·Dk + 2·NSG floats fit Metal's 32 KiB of threadgroup memory.
            let (nsg, parts, rp) = metal::backward_geometry(u(d.dv));
            assert!(nsg >= 1 && nsg <= 4 && nsg as i64 <= d.dv);
            assert!(rp >= 1 && rp <= 4);
            assert!(parts * nsg * rp >= u(d.dv) && parts * nsg * (rp - 1) < u(d.dv));
            assert!((nsg * u(d.dk) + 2 * nsg) * 4 <= 32 * 1024);
            assert_eq!(l.grid, [32, nsg as i32, (d.b * d.hv) as i32 * parts as i32]);
            assert_eq!(l.threadgroup, [32, nsg as i32, 1]);
            assert_eq!(
                l.template_int_values[4..],
                [nsg as i32, parts as i32, rp as i32]
            );
            // The scratch: the kept states and one chunk's token states.
            let chunks = (d.t as usize).div_ceil(ckpt).max(1) as i64;
            let scratch = [
                vec![d.b * d.hv, chunks, d.dv, d.dk],
                vec![d.b * d.hv, ckpt as i64, d.dv, d.dk],
            ];
            let mut at = 0usize;
            for (i, ndim) in l.output_ndims.iter().enumerate() {
                let shape: Vec<i64> = l.output_dims[at..at + *ndim as usize]
                    .iter()
                    .map(|&x| x as i64)
                    .collect();
                at += *ndim as usize;
                if i >= 6 {
                    assert_eq!(shape, scratch[i - 6], "scratch output {i}");
                }
            }
            // The inputs of the launch's description (src/metal.rs): q, k, v in the forward's
            // dtype, g (f32, compute_g), beta (sigmoid(b): b's dtype, as the forward gets it),
            // state_in (f32; zeros when absent), dy, dstate_out (f32), Tin = {T, C} (int32),
            // mask (bool [B, T]).
            let mut inputs: Inputs = vec![
                ("q", c.dtype, vec![d.b, d.t, d.hk, d.dk]),
                ("k", c.dtype, vec![d.b, d.t, d.hk, d.dk]),
                ("v", c.dtype, vec![d.b, d.t, d.hv, d.dv]),
                ("g", F32, vec![d.b, d.t, d.hv]),
                ("beta", c.aux, vec![d.b, d.t, d.hv]),
                ("state_in", F32, vec![d.b, d.hv, d.dv, d.dk]),
                ("dy", *dy_dtype, vec![d.b, d.t, d.hv, d.dv]),
                ("dstate_out", F32, vec![d.b, d.hv, d.dv, d.dk]),
                ("Tin", Dtype::Int32, vec![2]),
            ];
            if *masked {
                inputs.push(("mask", Dtype::Bool, vec![d.b, d.t]));
            }
            let label = format!(
                "{} {} b:{} dy:{} B={} T={} Hk={} Hv={} (GQA {}) Dk={} Dv={}{} NSG={} P={} RP={} C={}",
                if *masked { "masked" } else { "unmasked" },
                name(c.dtype),
                name(c.aux),
                name(*dy_dtype),
                d.b,
                d.t,
                d.hk,
                d.hv,
                d.hv / d.hk,
                d.dk,
                d.dv,
                if *with_state { "" } else { " zero-state" },
                nsg,
                parts,
                rp,
                ckpt
            );
            let extra = format!(
                "masked {}\nwith_state {}\ncheckpoint {ckpt}\ntwin {}\n",
                *masked as i32,
                *with_state as i32,
                twin.map_or(-1, |t| t as i64)
            );
            let kind = if *masked {
                "backward_masked"
            } else {
                "backward"
            };
            (
                l,
                kind,
                label,
                vec![d.b, d.t, d.hk, d.hv, d.dk, d.dv],
                inputs,
                extra,
            )
        }
        Kind::Replay {
            d,
            with_state,
            lengths,
            rows,
        } => {
            assert_eq!(lengths.len() as i64, d.b);
            let node = gated_delta_node(d, c, Form::State, false, *with_state);
            let l = metal::gated_delta_launch_rows(&node, *rows);
            assert_eq!(l.grid, [32, (d.dv / *rows as i64) as i32, (d.b * d.hv) as i32]);
            assert_eq!(l.threadgroup, [32, 4, 1]);
            // src/ops/gated_delta.rs `state`, Backend::Metal.
            let inputs: Inputs = vec![
                ("k", c.dtype, vec![d.b, d.t, d.hk, d.dk]),
                ("v", c.dtype, vec![d.b, d.t, d.hv, d.dv]),
                ("g", F32, vec![d.b, d.t, d.hv]),
                ("beta", c.aux, vec![d.b, d.t, d.hv]),
                ("state_in", F32, vec![d.b, d.hv, d.dv, d.dk]),
                ("lengths", Dtype::Int32, vec![d.b]),
            ];
            let label = format!(
                "{} b:{} B={} T={} Hk={} Hv={} (GQA {}) Dk={} Dv={} lengths {:?}{}",
                name(c.dtype),
                name(c.aux),
                d.b,
                d.t,
                d.hk,
                d.hv,
                d.hv / d.hk,
                d.dk,
                d.dv,
                lengths,
                if *with_state { "" } else { " zero-state" }
            ) + &if *rows > 1 { format!(" ROWS={rows}") } else { String::new() };
            let extra = format!(
                "masked 0\nwith_state {}\nlengths {}\n",
                *with_state as i32,
                lengths
                    .iter()
                    .map(|l| l.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            (
                l,
                "replay",
                label,
                vec![d.b, d.t, d.hk, d.hv, d.dk, d.dv],
                inputs,
                extra,
            )
        }
        Kind::FromConv {
            d,
            masked,
            with_state,
            rows,
        } => {
            // The recurrence's launch and inputs, then x and the scales for q, k and v
            // (src/ops/gated_delta.rs `update_from_conv`, Backend::Metal).
            let recurrence = Case {
                kind: Kind::Recurrence {
                    d: *d,
                    masked: *masked,
                    with_state: *with_state,
                    rows: *rows,
                },
                dtype: c.dtype,
                aux: c.aux,
                eps: c.eps,
            };
            let (l, kind, label, case_dims, mut inputs, extra) = describe(&recurrence);
            let l = metal::gated_delta_from_conv_launch(l, c.eps);
            assert_eq!(&l.input_names[..3], ["x", "qscale", "kscale"]);
            assert!(l.header.starts_with("#define MLXK_FROM_CONV 1\n"));
            let channels = 2 * d.hk * d.dk + d.hv * d.dv;
            inputs[0] = ("x", c.dtype, vec![d.b, d.t, channels]);
            inputs[1] = ("qscale", c.dtype, vec![d.dk]);
            inputs[2] = ("kscale", c.dtype, vec![d.dk]);
            let kind = if kind == "recurrence" {
                "from_conv"
            } else {
                "from_conv_masked"
            };
            (l, kind, format!("from conv {label}"), case_dims, inputs, extra)
        }
        Kind::HeadSplit { d, grouped } => {
            let u = |x: i64| x as usize;
            let l = metal::silu_rms_heads_launch(&node::silu_rms_heads::Node {
                dims: node::silu_rms_heads::Dims {
                    b: u(d.b),
                    s: u(d.s),
                    hk: u(d.hk),
                    hv: u(d.hv),
                    dk: u(d.dk),
                    dv: u(d.dv),
                },
                dtype: c.dtype,
                eps: c.eps,
            });
            assert_eq!(
                l.grid,
                [(32 * (2 * d.hk + d.hv)) as i32, (d.b * d.s) as i32, 1]
            );
            assert_eq!(l.threadgroup, [32, 1, 1]);
            let mut l = l;
            if *grouped {
                l.threadgroup[0] = 32 * cuda_group(2 * d.hk + d.hv);
            }
            let channels = 2 * d.hk * d.dk + d.hv * d.dv;
            // src/ops/silu_rms_heads.rs `split`: x, q_scale, k_scale as given.
            let inputs: Inputs = vec![
                ("x", c.dtype, vec![d.b, d.s, channels]),
                ("qscale", c.dtype, vec![d.dk]),
                ("kscale", c.dtype, vec![d.dk]),
            ];
            let label = format!(
                "{} B={} S={} Hk={} Hv={} Dk={} Dv={} eps={:e}{}",
                name(c.dtype),
                d.b,
                d.s,
                d.hk,
                d.hv,
                d.dk,
                d.dv,
                c.eps,
                if *grouped { " (CUDA grouping)" } else { "" }
            );
            (
                l,
                "head_split",
                label,
                vec![d.b, d.s, d.hk, d.hv, d.dk, d.dv],
                inputs,
                "masked 0\nwith_state 0\n".to_string(),
            )
        }
        Kind::GatedNorm { shape, grouped } => {
            let l = metal::gated_rms_norm_launch(&node::gated_rms_norm::Node {
                shape: shape.iter().map(|&d| d as usize).collect(),
                dtype: c.dtype,
                gate_dtype: c.aux,
                eps: c.eps,
            });
            let width = *shape.last().unwrap();
            let rows: i64 = shape[..shape.len() - 1].iter().product();
            let threads = ((width + 127) / 128 * 32).min(1024);
            assert_eq!(l.grid, [(rows * threads) as i32, 1, 1]);
            assert_eq!(l.threadgroup, [threads as i32, 1, 1]);
            let mut l = l;
            if *grouped {
                assert_eq!(threads, 32, "only one-SIMD-group rows are grouped");
                l.threadgroup[0] = 32 * cuda_group(rows);
            }
            // src/ops/gated_rms_norm.rs `norm`: x, gate (its own float dtype), weight [D].
            let inputs: Inputs = vec![
                ("x", c.dtype, shape.clone()),
                ("gate", c.aux, shape.clone()),
                ("weight", c.dtype, vec![width]),
            ];
            let label = format!(
                "{} gate:{} shape {:?} THREADS={} eps={:e}{}",
                name(c.dtype),
                name(c.aux),
                shape,
                threads,
                c.eps,
                if *grouped { " (CUDA grouping)" } else { "" }
            );
            (
                l,
                "gated_norm",
                label,
                shape.clone(),
                inputs,
                "masked 0\nwith_state 0\n".to_string(),
            )
        }
    }
}
