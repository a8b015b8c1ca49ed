//! Every CUDA kernel text as MLX CUDA compiles it, through a host C++ compiler: `cuda::launch`'s
//! header and source put together the way `mx::fast::cuda_kernel` does (MLX's header, then the
//! library's, then `namespace mlx::core::cu { __global__ void <name>(<inputs, their _shape
//! parameters where the source names them, outputs>) { <template constants> <source> } }`),
//! checked with `-fsyntax-only` against `tests/cuda/mock/nvrtc_mock.h`, compile-only stand-ins
//! for NVRTC's and MLX's names. A name CUDA lacks, a typo or a type error in a kernel text or in
//! `kernels/cuda/` fails here, on any machine, instead of on the GPU machine (docs/DESIGN.md §6).
//! Whether NVRTC accepts the text is still `make test-cuda`'s to say.

use std::io::Write;
use std::process::{Command, Stdio};

use mlxkern::bridge::MetalLaunch;
use mlxkern::cuda;
use mlxkern::metal::gated_delta::chunked::*;
use mlxkern::metal::gated_delta::chunked_backward::*;
use mlxkern::metal::gated_delta::*;
use mlxkern::metal::gated_rms_norm::*;
use mlxkern::metal::silu_rms_heads::*;
use mlxkern::node::gated_delta::{ChunkSize, Dims, Form, GateDtypes, Node, Pool, PoolWrite};
use mlxkern::node::{gated_rms_norm, silu_rms_heads};
use mlxkern::Dtype;

use crate::support::qwen35_split_dims;

/// MLX's CUDA name of a dtype (`dtype_to_cuda_type`).
fn cuda_type(d: Dtype) -> &'static str {
    match d {
        Dtype::Bfloat16 => "__nv_bfloat16",
        Dtype::Float16 => "__half",
        Dtype::Float32 => "float",
        Dtype::Int32 => "int32_t",
        Dtype::Uint32 => "uint32_t",
        Dtype::Bool => "bool",
        Dtype::Uint8 => "uint8_t",
        Dtype::Int8 => "int8_t",
    }
}

/// The text MLX compiles for `l` (already through `cuda::launch`) with these input dtypes.
fn kernel_text(l: &MetalLaunch, inputs: &[Dtype]) -> String {
    assert_eq!(
        inputs.len(),
        l.input_names.len(),
        "{}: input dtypes",
        l.name
    );
    let mut text = format!(
        "{}namespace mlx::core::cu {{\n\nnamespace cg = cooperative_groups;\n\n",
        l.header
    );
    text += &format!("__global__ void custom_kernel_{}(\n", l.name);
    for (name, &dtype) in l.input_names.iter().zip(inputs) {
        text += &format!("    const {}* {name},\n", cuda_type(dtype));
        if l.source.contains(&format!("{name}_shape")) {
            text += &format!("    const __grid_constant__ Shape {name}_shape,\n");
        }
        if l.source.contains(&format!("{name}_strides")) {
            text += &format!("    const __grid_constant__ Strides {name}_strides,\n");
        }
        if l.source.contains(&format!("{name}_ndim")) {
            text += &format!("    const __grid_constant__ int {name}_ndim,\n");
        }
    }
    let outputs: Vec<String> = l
        .output_names
        .iter()
        .zip(&l.output_dtypes)
        .map(|(name, &code)| {
            let dtype = Dtype::from_code(code).expect("an output dtype");
            format!("    {}* {name}", cuda_type(dtype))
        })
        .collect();
    text += &outputs.join(",\n");
    text += ") {\n";
    for (name, value) in l.template_int_names.iter().zip(&l.template_int_values) {
        text += &format!("  constexpr int {name} = {value};\n");
    }
    for (name, &code) in l.template_dtype_names.iter().zip(&l.template_dtype_values) {
        let dtype = Dtype::from_code(code).expect("a template dtype");
        text += &format!("  using {name} = {};\n", cuda_type(dtype));
    }
    text += "\n";
    text += &l.source;
    text += "\n}\n\n} // namespace mlx::core::cu\n";
    text
}

/// Compiles `text` with `-fsyntax-only`; the compiler's messages on failure.
fn syntax_check(text: &str) -> Result<(), String> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mock = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cuda/mock/nvrtc_mock.h");
    let mut child = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-fsyntax-only",
            "-x",
            "c++",
            "-include",
            mock,
            "-",
        ])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cxx} (set CXX): {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn gated_delta_node(dtype: Dtype, gate: Dtype, form: Form, has_mask: bool) -> Node {
    Node {
        dims: Dims {
            b: 32,
            t: 3,
            hk: 16,
            hv: 32,
            dk: 128,
            dv: 128,
        },
        dtype,
        gates: GateDtypes {
            a: gate,
            b: gate,
            a_log: Dtype::Float32,
            dt_bias: gate,
        },
        has_state: true,
        has_mask,
        form,
        pool: None,
    }
}

/// Each input's dtype, by name, as the library passes them for `n` (src/ops/gated_delta/graph.rs).
fn gated_delta_inputs(l: &MetalLaunch, n: &Node, fused: bool) -> Vec<Dtype> {
    l.input_names
        .iter()
        .map(|name| match name.as_str() {
            "q" | "k" | "v" | "x" | "qscale" | "kscale" => n.dtype,
            "g" if fused => n.gates.a,
            "g" => Dtype::Float32,
            "beta" => n.gates.b,
            "state_in" | "dstate_out" => Dtype::Float32,
            "dy" => n.dtype,
            "mask" => Dtype::Bool,
            "lengths" | "Tin" | "rows" | "chunks" | "firsts" => Dtype::Int32,
            "w" | "u0" | "kd" | "p" | "gam" | "states" | "u" => Dtype::Float32,
            "a_log" => n.gates.a_log,
            "dt_bias" => n.gates.dt_bias,
            other => panic!("{}: unexpected input {other}", l.name),
        })
        .collect()
}

#[test]
fn every_cuda_kernel_text_compiles_as_mlx_assembles_it() {
    let mut checked = Vec::new();
    // MLXK_CUDA_TEXT_DIR=<dir>: each text also goes to <dir>/<label>.cu, for
    // scripts/cuda/sass.py (NVRTC's machine code for them, without a GPU).
    let dump = std::env::var_os("MLXK_CUDA_TEXT_DIR").map(std::path::PathBuf::from);
    let mut check = |label: String, l: MetalLaunch, inputs: Vec<Dtype>| {
        let l = cuda::launch(l).unwrap_or_else(|e| panic!("{label}: {e}"));
        let text = kernel_text(&l, &inputs);
        if let Err(messages) = syntax_check(&text) {
            panic!("{label}: the CUDA text does not compile:\n{messages}");
        }
        if let Some(dir) = &dump {
            std::fs::create_dir_all(dir).unwrap();
            let file: String = label
                .chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '=' {
                        c
                    } else {
                        '_'
                    }
                })
                .collect();
            std::fs::write(dir.join(format!("{file}.cu")), &text).unwrap();
        }
        checked.push(label);
    };
    let (bf16, f16, f32) = (Dtype::Bfloat16, Dtype::Float16, Dtype::Float32);
    for (dtype, gate) in [(bf16, bf16), (f16, f32), (f32, f32)] {
        for masked in [false, true] {
            let n = gated_delta_node(dtype, gate, Form::Exact, masked);
            for rows in [1, 16] {
                // The CUDA launch (gates in the kernel) and the Metal launch's form (g and beta
                // from MLX ops: the tests' hook).
                let l = gated_delta_launch_rows(&n, rows);
                let fused = cuda::with_fused_gates(l.clone());
                let inputs = gated_delta_inputs(&fused, &n, true);
                check(
                    format!("recurrence {dtype:?} masked={masked} ROWS={rows}"),
                    fused,
                    inputs,
                );
                let inputs = gated_delta_inputs(&l, &n, false);
                check(
                    format!("recurrence {dtype:?} masked={masked} ROWS={rows} ops gates"),
                    l,
                    inputs,
                );
            }
            // The recurrence from the convolution's output (x and the scales for q, k, v), at
            // Dk = 128 (the split's lanes own the recurrence's columns) and 64 (they do not).
            for dk in [128, 64] {
                let mut n = n;
                n.dims.dk = dk;
                for fused_gates in [true, false] {
                    let l = gated_delta_from_conv_launch(gated_delta_launch_rows(&n, 4), 1e-6);
                    let l = if fused_gates {
                        cuda::with_fused_gates(l)
                    } else {
                        l
                    };
                    let inputs = gated_delta_inputs(&l, &n, fused_gates);
                    check(
                        format!(
                            "from conv {dtype:?} masked={masked} Dk={dk} fused gates={fused_gates}"
                        ),
                        l,
                        inputs,
                    );
                }
            }
            let c = backward_checkpoint(n.dims.t);
            let l = gated_delta_backward_launch(&n, c);
            let inputs = gated_delta_inputs(&l, &n, false);
            check(format!("backward {dtype:?} masked={masked}"), l, inputs);
            // The chunked backward's five stages (Dk 128 and 256: tiles of 32 and 16 columns,
            // chunks of 32 and 16); the stages' scratch arrays are f32.
            for (dk, chunk) in [(128, 0), (256, 16)] {
                let chunk = ChunkSize::from_c(chunk).unwrap();
                let mut n = gated_delta_node(dtype, gate, Form::Chunked { chunk }, masked);
                n.dims.dk = dk;
                let c = backward_chunk(chunk);
                let scratch = backward_chunked_scratch(n.dims, c);
                for stage in 0..CHUNKED_BACKWARD_STAGES {
                    let l = gated_delta_chunked_backward_launch(&n, c, stage);
                    let mut plain = l.clone();
                    plain
                        .input_names
                        .retain(|i| !scratch.iter().any(|(s, _)| s == i));
                    let mut known = gated_delta_inputs(&plain, &n, false).into_iter();
                    let inputs = l
                        .input_names
                        .iter()
                        .map(|i| {
                            if scratch.iter().any(|(s, _)| s == i) {
                                Dtype::Float32
                            } else {
                                known.next().expect("a dtype per input")
                            }
                        })
                        .collect();
                    check(
                        format!("chunked backward {dtype:?} masked={masked} Dk={dk} stage {stage}"),
                        l,
                        inputs,
                    );
                }
            }
            // The chunked form's three launches (src/ops/gated_delta/graph.rs
            // `build_gpu_chunked`), gates fused and from MLX ops, Dk 128 and 256, Dv 128 and
            // 24 (the output pass's tiles of 64 and of 32 value columns).
            for (chunk, dk, dv) in [(32, 128, 128), (64, 256, 128), (16, 128, 24)] {
                let size = ChunkSize::new(chunk).unwrap();
                let mut n = gated_delta_node(dtype, gate, Form::Chunked { chunk: size }, masked);
                n.dims.dk = dk;
                n.dims.dv = dv;
                // The state pass (one text for every dtype and mask): the launch's tile on
                // CUDA, and the others MLXK_CHUNK_STATE_COLUMNS or Metal take.
                if dtype == bf16 && !masked {
                    let vt = chunk_state_columns_for(n.dims, chunk, true);
                    let widest = chunk_state_columns(dk, chunk, 48 * 1024);
                    for vt in [vt, 8, 16, 32].into_iter().filter(|&vt| vt <= widest) {
                        // Its products on the matrix tiles, in each of their forms.
                        for form in cuda::TileForm::ALL {
                            let state = cuda::with_tile_form(
                                gated_delta_chunked_state_launch(&n, vt),
                                form,
                            );
                            let inputs = gated_delta_inputs(&state, &n, false);
                            check(
                                format!(
                                    "chunk state {dtype:?} C={chunk} Dk={dk} VT={vt} tiles={}",
                                    form.name()
                                ),
                                state,
                                inputs,
                            );
                        }
                    }
                }
                for fused_gates in [true, false] {
                    let prep = gated_delta_chunked_prep_launch(&n);
                    let prep = if fused_gates {
                        cuda::with_fused_gates(prep)
                    } else {
                        prep
                    };
                    let inputs = gated_delta_inputs(&prep, &n, fused_gates);
                    check(
                        format!(
                            "chunk prep {dtype:?} masked={masked} C={chunk} Dk={dk} fused gates={fused_gates}"
                        ),
                        prep,
                        inputs,
                    );
                    let mut names: Vec<String> = n
                        .metal_inputs()
                        .iter()
                        .map(|i| i.name().to_string())
                        .collect();
                    if fused_gates {
                        names.extend(["a_log".to_string(), "dt_bias".to_string()]);
                    }
                    let out = gated_delta_chunked_out_launch(&n, names);
                    let inputs = gated_delta_inputs(&out, &n, fused_gates);
                    check(
                        format!(
                            "chunk out {dtype:?} masked={masked} C={chunk} Dk={dk} Dv={dv} fused gates={fused_gates}"
                        ),
                        out,
                        inputs,
                    );
                }
                // The same three on a pool (src/ops/gated_delta/graph.rs
                // `build_gpu_chunked_pool`): 7 chunks over R = 32 rows, 5 of them written.
                let mut p = n;
                p.pool = Some(Pool {
                    slots: 40,
                    write: PoolWrite::Rows(5),
                    packed: false,
                });
                for fused_gates in [true, false] {
                    let prep = gated_delta_chunked_pool_prep_launch(&p, 7);
                    let prep = if fused_gates {
                        cuda::with_fused_gates(prep)
                    } else {
                        prep
                    };
                    let inputs = gated_delta_inputs(&prep, &p, fused_gates);
                    check(
                        format!(
                            "chunk pool prep {dtype:?} masked={masked} C={chunk} Dk={dk} fused gates={fused_gates}"
                        ),
                        prep,
                        inputs,
                    );
                }
                let vt = chunk_state_columns_for(p.dims, chunk, true);
                let state = gated_delta_chunked_pool_state_launch(&p, 7, vt);
                let inputs = gated_delta_inputs(&state, &p, false);
                check(
                    format!("chunk pool state {dtype:?} masked={masked} C={chunk} Dk={dk} VT={vt}"),
                    state,
                    inputs,
                );
                let out = gated_delta_chunked_pool_out_launch(&p, 7);
                let inputs = gated_delta_inputs(&out, &p, false);
                check(
                    format!("chunk pool out {dtype:?} masked={masked} C={chunk} Dk={dk} Dv={dv}"),
                    out,
                    inputs,
                );
            }
        }
        let n = gated_delta_node(dtype, gate, Form::State, false);
        let l = cuda::with_fused_gates(gated_delta_launch_rows(&n, 8));
        let inputs = gated_delta_inputs(&l, &n, true);
        check(format!("replay {dtype:?}"), l, inputs);

        // Pool nodes (the row table, the pool as state_in, compact state rows): the update
        // (dense with or without a mask, packed), the verify (no rows written) and the replay,
        // with the gates fused and from MLX ops, one and several value rows a SIMD group.
        let pool = |write, packed| {
            Some(Pool {
                slots: 40,
                write,
                packed,
            })
        };
        for (form, masked, write, packed) in [
            (Form::Exact, false, PoolWrite::Rows(5), false),
            (Form::Exact, true, PoolWrite::Rows(32), false),
            (Form::Exact, false, PoolWrite::Rows(2), true),
            (Form::Exact, true, PoolWrite::Rows(0), false),
            (Form::State, false, PoolWrite::Rows(7), false),
            (Form::Exact, true, PoolWrite::InPlace, false),
            (Form::Exact, false, PoolWrite::InPlace, true),
            (Form::State, false, PoolWrite::InPlace, false),
        ] {
            let n = Node {
                pool: pool(write, packed),
                ..gated_delta_node(dtype, gate, form, masked)
            };
            for rows in [1, 8, 16] {
                let l = gated_delta_launch_rows(&n, rows);
                match write {
                    PoolWrite::InPlace => assert!(
                        l.name.ends_with("_pool_in_place")
                            && l.header == format!("{POOL_HEADER}{POOL_IN_PLACE_HEADER}")
                    ),
                    _ => assert!(l.name.ends_with("_pool") && l.header == POOL_HEADER),
                }
                for fused_gates in [true, false] {
                    let l = if fused_gates {
                        cuda::with_fused_gates(l.clone())
                    } else {
                        l.clone()
                    };
                    let inputs = gated_delta_inputs(&l, &n, fused_gates);
                    check(
                        format!(
                            "pool {form:?} {dtype:?} masked={masked} {write:?} packed={packed} \
                             ROWS={rows} fused gates={fused_gates}"
                        ),
                        l,
                        inputs,
                    );
                }
            }
        }

        let split = silu_rms_heads::Node {
            dims: qwen35_split_dims(),
            dtype,
            eps: 1e-6,
        };
        check(
            format!("head split {dtype:?}"),
            silu_rms_heads_launch(&split),
            vec![dtype; 3],
        );
        for width in [128, 1000, 4096] {
            let norm = gated_rms_norm::Node {
                shape: vec![4, width],
                dtype,
                gate_dtype: gate,
                eps: 1e-6,
            };
            check(
                format!("gated norm {dtype:?} D={width}"),
                gated_rms_norm_launch(&norm),
                vec![dtype, gate, dtype],
            );
        }
    }
    // The chunked backward's stages in each tile form (the loop above: the configured one).
    for form in cuda::TileForm::ALL {
        let chunk = ChunkSize::from_c(0).unwrap();
        let (bf16, f32) = (Dtype::Bfloat16, Dtype::Float32);
        let n = gated_delta_node(bf16, f32, Form::Chunked { chunk }, true);
        let c = backward_chunk(chunk);
        let scratch = backward_chunked_scratch(n.dims, c);
        for stage in 0..CHUNKED_BACKWARD_STAGES {
            let l = cuda::with_tile_form(gated_delta_chunked_backward_launch(&n, c, stage), form);
            let inputs = l
                .input_names
                .iter()
                .map(|i| match i.as_str() {
                    "q" | "k" | "v" | "dy" => bf16,
                    "mask" => Dtype::Bool,
                    "Tin" => Dtype::Int32,
                    _ => {
                        assert!(
                            scratch.iter().any(|(s, _)| s == i)
                                || ["g", "beta", "state_in", "dstate_out"].contains(&i.as_str()),
                            "{i}"
                        );
                        f32
                    }
                })
                .collect();
            check(
                format!("chunked backward stage {stage} tiles {}", form.name()),
                l,
                inputs,
            );
        }
    }
    // The chunked forward's prep and output pass in each tile form (the loop above: the
    // configured one; the state pass: every form above), gates fused, masked.
    for form in cuda::TileForm::ALL {
        let size = ChunkSize::new(64).unwrap();
        let (bf16, f32) = (Dtype::Bfloat16, Dtype::Float32);
        let n = gated_delta_node(bf16, f32, Form::Chunked { chunk: size }, true);
        let prep = cuda::with_tile_form(
            cuda::with_fused_gates(gated_delta_chunked_prep_launch(&n)),
            form,
        );
        let inputs = gated_delta_inputs(&prep, &n, true);
        check(format!("chunk prep tiles {}", form.name()), prep, inputs);
        let mut names: Vec<String> = n
            .metal_inputs()
            .iter()
            .map(|i| i.name().to_string())
            .collect();
        names.extend(["a_log".to_string(), "dt_bias".to_string()]);
        let out = cuda::with_tile_form(gated_delta_chunked_out_launch(&n, names), form);
        let inputs = gated_delta_inputs(&out, &n, true);
        check(format!("chunk out tiles {}", form.name()), out, inputs);
    }
    // The matrix tiles' self-test and benchmark, in each tile form (kernels/cuda/tiles.cuh).
    for form in cuda::TileForm::ALL {
        let l = cuda::with_tile_form(
            mlxkern::metal::tiles::tiles_check_launch(2, 32, 64, 32),
            form,
        );
        check(
            format!("tiles check {}", form.name()),
            l,
            vec![Dtype::Float32; 4],
        );
        let l = cuda::with_tile_form(mlxkern::metal::tiles::tiles_bench_launch(8, 32, 4), form);
        check(
            format!("tiles bench {}", form.name()),
            l,
            vec![Dtype::Float32; 2],
        );
    }
    println!(
        "PASS: {} CUDA kernel texts compile as MLX assembles them: {}",
        checked.len(),
        checked.join("; ")
    );
}
