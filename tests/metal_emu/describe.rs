//! Each case's launch, from src/metal/, and its inputs as src/ops/*.rs builds them.

use super::*;

type Inputs = Vec<(&'static str, Dtype, Vec<i64>)>;

/// A gated-delta input by name, as the library's ops build it: q, k, v in the case's dtype, g
/// (f32, compute_g), beta (sigmoid(b): b's dtype), state_in and dstate_out (f32; zeros when
/// absent), dy in `dy`'s dtype, mask (bool [B, T]). None for any other name.
fn gd_input(c: &Case, d: &Dims, dy: Dtype, name: &str) -> Option<(&'static str, Dtype, Vec<i64>)> {
    Some(match name {
        "q" => ("q", c.dtype, vec![d.b, d.t, d.hk, d.dk]),
        "k" => ("k", c.dtype, vec![d.b, d.t, d.hk, d.dk]),
        "v" => ("v", c.dtype, vec![d.b, d.t, d.hv, d.dv]),
        "g" => ("g", F32, vec![d.b, d.t, d.hv]),
        "beta" => ("beta", c.aux, vec![d.b, d.t, d.hv]),
        "state_in" => ("state_in", F32, vec![d.b, d.hv, d.dv, d.dk]),
        "dy" => ("dy", dy, vec![d.b, d.t, d.hv, d.dv]),
        "dstate_out" => ("dstate_out", F32, vec![d.b, d.hv, d.dv, d.dk]),
        "mask" => ("mask", Dtype::Bool, vec![d.b, d.t]),
        _ => return None,
    })
}

/// The named gated-delta inputs, in order (`gd_input`).
fn gd_inputs(c: &Case, d: &Dims, dy: Dtype, names: &[&str]) -> Inputs {
    names
        .iter()
        .map(|&n| gd_input(c, d, dy, n).unwrap_or_else(|| panic!("input {n}")))
        .collect()
}

/// A case's dimensions in labels: "B=.. T=.. Hk=.. Hv=.. (GQA ..) Dk=.. Dv=..".
fn dims_label(d: &Dims) -> String {
    format!(
        "B={} T={} Hk={} Hv={} (GQA {}) Dk={} Dv={}",
        d.b,
        d.t,
        d.hk,
        d.hv,
        d.hv / d.hk,
        d.dk,
        d.dv
    )
}

/// A gated-delta case's dimensions as the harness reads them.
fn case_dims(d: &Dims) -> Vec<i64> {
    vec![d.b, d.t, d.hk, d.hv, d.dk, d.dv]
}

/// The harness's first two extra lines.
fn flags(masked: bool, with_state: bool) -> String {
    format!("masked {}\nwith_state {}\n", masked as i32, with_state as i32)
}

/// A gated-delta case's label head: masked or not, its dtype and b's.
fn head_label(c: &Case, masked: bool) -> String {
    let word = if masked { "masked" } else { "unmasked" };
    format!("{word} {} b:{}", c.dtype.name(), c.aux.name())
}

/// A backward case's label before its launch's own numbers.
fn backward_label(c: &Case, d: &Dims, dy: Dtype, masked: bool, with_state: bool) -> String {
    let head = head_label(c, masked);
    format!("{head} dy:{} {}{}", dy.name(), dims_label(d), zero_state(with_state))
}

fn zero_state(with_state: bool) -> &'static str {
    if with_state { "" } else { " zero-state" }
}

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
        pool: None,
    }
}

/// The launch for a case (from src/metal/), its kind and label, the case dimensions, the
/// inputs as the library's ops build them, and extra case lines. Also asserts the geometry of
/// docs/DESIGN.md §3, so a change of launch geometry is noticed here as well as emulated.
pub(super) fn describe(c: &Case) -> (MetalLaunch, &'static str, String, Vec<i64>, Inputs, String) {
    let name = |d: Dtype| d.name();
    match &c.kind {
        Kind::Recurrence {
            d,
            masked,
            with_state,
            rows,
        } => {
            let node = gated_delta_node(d, c, Form::Exact, *masked, *with_state);
            let l = metal::gated_delta::gated_delta_launch_rows(&node, *rows);
            assert_eq!(l.grid, [32, (d.dv / *rows as i64) as i32, (d.b * d.hv) as i32]);
            assert_eq!(l.threadgroup, [32, 4, 1]);
            // src/ops/gated_delta/ `update` (graph.rs), Backend::Metal: q, k, v, g (f32, compute_g),
            // beta (sigmoid(b): b's dtype), state (f32; zeros when absent), mask (bool [B, T]);
            // T from k's shape (k_shape).
            let mut inputs = gd_inputs(c, d, F32, &["q", "k", "v", "g", "beta", "state_in"]);
            if *masked {
                inputs.extend(gd_input(c, d, F32, "mask"));
            }
            let label = format!(
                "{} {}{}",
                head_label(c, *masked),
                dims_label(d),
                zero_state(*with_state)
            ) + &if *rows > 1 { format!(" ROWS={rows}") } else { String::new() };
            let extra = flags(*masked, *with_state);
            let kind = if *masked {
                "recurrence_masked"
            } else {
                "recurrence"
            };
            (
                l,
                kind,
                label,
                case_dims(d),
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
            let ckpt = checkpoint.unwrap_or_else(|| metal::gated_delta::backward_checkpoint(u(d.t)));
            let l = metal::gated_delta::gated_delta_backward_launch(&node, ckpt);
            // P threadgroups per (batch row, value head), each of NSG ≤ 4 SIMD groups (128
            // threads) holding RP ≤ 4 value rows each, P·NSG·RP covering Dv; the row sums'
            // NSG·Dk + 2·NSG floats fit Metal's 32 KiB of threadgroup memory.
            let (nsg, parts, rp) = metal::gated_delta::backward_geometry(u(d.dv));
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
            // The inputs of the launch's description (src/metal/): q, k, v in the forward's
            // dtype, g (f32, compute_g), beta (sigmoid(b): b's dtype, as the forward gets it),
            // state_in (f32; zeros when absent), dy, dstate_out (f32), Tin = {T, C} (int32),
            // mask (bool [B, T]).
            let mut inputs = gd_inputs(
                c,
                d,
                *dy_dtype,
                &["q", "k", "v", "g", "beta", "state_in", "dy", "dstate_out"],
            );
            inputs.push(("Tin", Dtype::Int32, vec![2]));
            if *masked {
                inputs.extend(gd_input(c, d, F32, "mask"));
            }
            let head = backward_label(c, d, *dy_dtype, *masked, *with_state);
            let label = format!("{head} NSG={nsg} P={parts} RP={rp} C={ckpt}");
            let extra = flags(*masked, *with_state)
                + &format!("checkpoint {ckpt}\ntwin {}\n", twin.map_or(-1, |t| t as i64));
            let kind = if *masked {
                "backward_masked"
            } else {
                "backward"
            };
            (
                l,
                kind,
                label,
                case_dims(d),
                inputs,
                extra,
            )
        }
        Kind::ChunkedBackward {
            d,
            masked,
            with_state,
            dy_dtype,
            chunk,
            stage,
            first,
        } => {
            let node = gated_delta_node(
                d,
                c,
                Form::Chunked { chunk: chunk_size(*chunk) },
                *masked,
                *with_state,
            );
            let u = |x: i64| x as usize;
            let cc = metal_chunked::backward_chunk(chunk_size(*chunk));
            let l = metal_chunked::gated_delta_chunked_backward_launch(&node, cc, *stage);
            let threads = metal_chunked::CHUNKED_BACKWARD_THREADS as i32;
            assert_eq!(l.threadgroup, [threads, 1, 1]);
            assert_eq!(l.grid[1..], [1, 1]);
            assert_eq!(l.grid[0] % threads, 0);
            assert_eq!(
                l.header,
                format!("#define MLXK_CBWD_STAGE {}\n{}", stage + 1, metal::tiles::TILES_HEADER)
            );
            // The stages' threadgroup memory (stage 4: five C x C matrices; the sequential
            // stages a Dk x TNP tile (TN padded to a multiple of 8), two C x TNP ones and a
            // C x 16 slice of keys; stage 5 below) within Metal's 32 KiB.
            let tile = metal_chunked::backward_tile(node.dims);
            let padded = tile.div_ceil(8) * 8;
            assert!(u(d.dk) * tile <= 4096 && tile <= 32);
            assert!((5 * cc * cc + 4 * cc * 16 + cc) * 4 <= 32 * 1024);
            assert!((3 * cc * cc + 2 * cc * 16 + 3 * cc) * 4 <= 32 * 1024, "stage 1");
            assert!((u(d.dk) * padded + 2 * cc * padded + 16 * cc + 2 * cc) * 4 <= 32 * 1024);
            // Stage 5: two C x C matrices, a C x 16 slice of dY, U and Tmᵀ dU, a 16 x 32 slice
            // of H and dH', a C x 32 block of K and Q, per-token sums per SIMD group.
            let nsg = u(threads as i64) / 32;
            let keys = 8 * nsg;
            let stage5 = 2 * cc * cc + 3 * cc * 16 + 2 * 16 * keys + 2 * cc * keys + 3 * cc
                + 3 * nsg * cc
                + u(threads as i64);
            assert!(stage5 * 4 <= 32 * 1024, "stage 5: {stage5} floats");
            // The inputs as src/ops/gated_delta/chunked_vjp.rs passes them: the backward's
            // (as for the exact kernel; Tin = {T}), then the earlier stages' f32 outputs.
            let scratch = metal_chunked::backward_chunked_scratch(node.dims, cc);
            let inputs: Inputs = l
                .input_names
                .iter()
                .map(|name| match name.as_str() {
                    "Tin" => ("Tin", Dtype::Int32, vec![1]),
                    other if gd_input(c, d, *dy_dtype, other).is_some() => {
                        gd_input(c, d, *dy_dtype, other).unwrap()
                    }
                    other => {
                        let (n, shape) = scratch
                            .iter()
                            .find(|(n, _)| *n == other)
                            .unwrap_or_else(|| panic!("stage {stage}: input {other}"));
                        (*n, F32, shape.iter().map(|&x| x as i64).collect())
                    }
                })
                .collect();
            let head = backward_label(c, d, *dy_dtype, *masked, *with_state);
            let label = format!("{head} chunk={chunk} (C={cc}) stage {stage} of case {first}");
            let extra = flags(*masked, *with_state) + &format!("checkpoint {cc}\ntwin -1\n");
            let kind = match (*stage, *masked) {
                (0, false) => "backward_chunked",
                (0, true) => "backward_chunked_masked",
                _ => "backward_chunked_stage",
            };
            (
                l,
                kind,
                label,
                case_dims(d),
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
            let l = metal::gated_delta::gated_delta_launch_rows(&node, *rows);
            assert_eq!(l.grid, [32, (d.dv / *rows as i64) as i32, (d.b * d.hv) as i32]);
            assert_eq!(l.threadgroup, [32, 4, 1]);
            // src/ops/gated_delta/replay.rs `state`, Backend::Metal.
            let mut inputs = gd_inputs(c, d, F32, &["k", "v", "g", "beta", "state_in"]);
            inputs.push(("lengths", Dtype::Int32, vec![d.b]));
            let label = format!(
                "{} b:{} {} lengths {:?}{}",
                name(c.dtype),
                name(c.aux),
                dims_label(d),
                lengths,
                zero_state(*with_state)
            ) + &if *rows > 1 { format!(" ROWS={rows}") } else { String::new() };
            let extra = flags(false, *with_state)
                + &format!(
                    "lengths {}\n",
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
                case_dims(d),
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
            // (src/ops/gated_delta/from_conv.rs `update_from_conv`, Backend::Metal).
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
            let l = metal::gated_delta::gated_delta_from_conv_launch(l, c.eps);
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
        Kind::Pool {
            d,
            call,
            masked,
            n,
            slots,
            fresh,
            rows,
        } => {
            let r = slots.len() as i64;
            assert_eq!(fresh.len(), slots.len());
            let (replay, writes) = match call {
                PoolCall::Replay(lengths) => {
                    assert_eq!(lengths.len(), slots.len());
                    (true, true)
                }
                PoolCall::Verify => (false, false),
                _ => (false, true),
            };
            let packed = match call {
                PoolCall::Packed(cu) => {
                    assert!(d.b == 1 && !*masked && cu.len() == slots.len() + 1);
                    assert_eq!((cu[0], *cu.last().unwrap() as i64), (0, d.t));
                    true
                }
                _ => {
                    assert_eq!(d.b, r);
                    false
                }
            };
            // src/ops/gated_delta/pool.rs on a GPU: one table row a row (B = R), the state
            // output the written rows [W, Hv, Dv, Dk], W the rows with a slot (none for a
            // verify).
            let written = if writes {
                slots.iter().filter(|&&s| s >= 0).count()
            } else {
                0
            };
            let form = if replay { Form::State } else { Form::Exact };
            let mut node = gated_delta_node(d, c, form, *masked, true);
            node.dims.b = r as usize;
            node.pool = Some(gd::Pool {
                slots: *n,
                write: gd::PoolWrite::Rows(written),
                packed,
            });
            let l = metal::gated_delta::gated_delta_launch_rows(&node, *rows);
            assert_eq!(l.grid, [32, (d.dv / *rows as i64) as i32, (r * d.hv) as i32]);
            assert_eq!(l.threadgroup, [32, 4, 1]);
            assert_eq!(l.header, metal::gated_delta::POOL_HEADER);
            let state_rows = l.output_dims[l.output_dims.len() - 4] as usize;
            assert_eq!(state_rows, written.max(1), "one unwritten row where none is written");
            // graph.rs `build_gpu`, Backend::Metal: the node's inputs, the pool as state_in and
            // the row table as rows; q, k, v, g, beta, mask over the tensors' [B, T].
            let mut inputs: Inputs = vec![];
            let names: &[&str] = if replay { &["k", "v", "g", "beta"] } else { &["q", "k", "v", "g", "beta"] };
            inputs.extend(gd_inputs(c, d, F32, names));
            inputs.push(("state_in", F32, vec![*n as i64, d.hv, d.dv, d.dk]));
            if *masked {
                inputs.extend(gd_input(c, d, F32, "mask"));
            }
            inputs.push(("rows", Dtype::Int32, vec![r, 5]));
            let list = |v: &[i32]| {
                v.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            let fresh32: Vec<i32> = fresh.iter().map(|&f| f as i32).collect();
            let mut extra = format!(
                "masked {}\nwith_state 1\npool_n {n}\nslots {}\nfresh {}\n",
                *masked as i32,
                list(slots),
                list(&fresh32)
            );
            let (kind, what) = match call {
                PoolCall::Update => (
                    if *masked { "pool_update_masked" } else { "pool_update" },
                    "update".to_string(),
                ),
                PoolCall::Verify => (
                    if *masked { "pool_verify_masked" } else { "pool_verify" },
                    "verify".to_string(),
                ),
                PoolCall::Packed(cu) => {
                    extra += &format!("cu_seqlens {}\n", list(cu));
                    ("pool_packed", format!("packed cu_seqlens {cu:?}"))
                }
                PoolCall::Replay(lengths) => {
                    extra += &format!("lengths {}\n", list(lengths));
                    ("pool_replay", format!("replay lengths {lengths:?}"))
                }
            };
            let label = format!(
                "{what}{} {} b:{} R={r} {} N={n} slots {slots:?} fresh {fresh:?} W={written}{}",
                if *masked { " masked" } else { "" },
                name(c.dtype),
                name(c.aux),
                dims_label(d),
                if *rows > 1 { format!(" ROWS={rows}") } else { String::new() },
            );
            (
                l,
                kind,
                label,
                case_dims(d),
                inputs,
                extra,
            )
        }
        Kind::HeadSplit { d, grouped } => {
            let u = |x: i64| x as usize;
            let l = metal::silu_rms_heads::silu_rms_heads_launch(&node::silu_rms_heads::Node {
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
        Kind::Chunked {
            d,
            masked,
            with_state,
            chunk,
            stage,
            columns,
        } => {
            let node = gated_delta_node(d, c, Form::Chunked { chunk: chunk_size(*chunk) }, *masked, *with_state);
            let u = |x: i64| x as usize;
            use metal::gated_delta::chunked;
            let cg = chunked::gpu_chunk(chunk_size(*chunk));
            assert!(cg <= chunked::GPU_MAX_CHUNK && cg % 16 == 0);
            let nc = u(d.t).div_ceil(cg) as i64;
            let rows = nc * cg as i64;
            let bh = d.b * d.hv;
            // src/ops/gated_delta/graph.rs `build_gpu_chunked`, Backend::Metal: the prep launch
            // takes the exact update's launch inputs (q, k, v, g, beta, state_in, mask) without
            // the state; the state pass the state and the prep's w, u0, kd, gam; the output pass
            // the exact update's inputs, then p, gam and the state pass's states and u.
            let mut inputs = gd_inputs(c, d, F32, &["q", "k", "v", "g", "beta"]);
            if *stage == 2 {
                inputs.extend(gd_input(c, d, F32, "state_in"));
            }
            if *masked {
                inputs.extend(gd_input(c, d, F32, "mask"));
            }
            let kind = ["chunk_prep", "chunk_state", "chunk_out"][*stage];
            let l = match stage {
                0 => {
                    let l = chunked::gated_delta_chunked_prep_launch(&node);
                    assert_eq!(l.grid, [256, nc as i32, bh as i32]);
                    assert_eq!(l.threadgroup, [256, 1, 1]);
                    // The prep's threadgroup memory: A, the panel buffer, five gate rows.
                    let panels = (2 * 16 * (cg + 1)).max(8 * 256);
                    assert!(4 * (cg * (cg + 1) + panels + 5 * cg) <= 32 * 1024);
                    l
                }
                1 => {
                    inputs = vec![
                        ("state_in", F32, vec![d.b, d.hv, d.dv, d.dk]),
                        ("w", F32, vec![bh, rows, d.dk]),
                        ("u0", F32, vec![bh, rows, d.dv]),
                        ("kd", F32, vec![bh, rows, d.dk]),
                        ("gam", F32, vec![bh, rows]),
                    ];
                    let vt = *columns;
                    let l = chunked::gated_delta_chunked_state_launch(&node, vt);
                    assert_eq!(l.grid, [256, u(d.dv).div_ceil(vt) as i32, bh as i32]);
                    assert_eq!(l.threadgroup, [256, 1, 1]);
                    // The state pass's threadgroup memory (H's and U's tiles) within CUDA's
                    // 48 KB (Metal's 32 KB where the launch picks the tile for Metal).
                    assert!(4 * (u(d.dk) * (vt + 1) + cg * vt) <= 48 * 1024);
                    assert_eq!(l.header, metal::tiles::TILES_HEADER);
                    l
                }
                _ => {
                    let names = node.metal_inputs().iter().map(|i| i.name().to_string()).collect();
                    inputs.extend([
                        ("p", F32, vec![bh, rows, cg as i64]),
                        ("gam", F32, vec![bh, rows]),
                        ("states", F32, vec![bh, nc + 1, d.dv, d.dk]),
                        ("u", F32, vec![bh, rows, d.dv]),
                    ]);
                    let l = chunked::gated_delta_chunked_out_launch(&node, names);
                    let vo = chunked::chunk_out_columns(u(d.dv));
                    let threads = (cg * vo / 16) as i64;
                    assert_eq!(l.grid, [(threads * nc) as i32, u(d.dv).div_ceil(vo) as i32, bh as i32]);
                    assert_eq!(l.threadgroup, [threads as i32, 1, 1]);
                    // The output pass's two panels.
                    assert!(4 * (16 * (cg + 1) + 16 * (vo + 1)) <= 32 * 1024);
                    l
                }
            };
            match stage {
                1 => {}
                // The prep and the output pass multiply on the matrix tiles.
                _ => assert_eq!(
                    l.header,
                    format!(
                        "{}{}",
                        if *masked { chunked::CHUNK_MASK_HEADER } else { "" },
                        metal::tiles::TILES_HEADER
                    )
                ),
            }
            let label = format!(
                "{} {} chunk {} (runs {}){} state tile {}",
                head_label(c, *masked),
                dims_label(d),
                chunk,
                cg,
                zero_state(*with_state),
                columns
            );
            let extra = flags(*masked, *with_state) + &format!("checkpoint {chunk}\n");
            (l, kind, label, case_dims(d), inputs, extra)
        }
        Kind::Tiles { items, m, k, n } => {
            let u = |x: i64| x as usize;
            let l = metal::tiles::tiles_check_launch(u(*items), u(*m), u(*k), u(*n));
            assert_eq!(l.grid, [(128 * items) as i32, 1, 1]);
            assert_eq!(l.threadgroup, [128, 1, 1]);
            assert_eq!(l.header, metal::tiles::TILES_HEADER);
            let inputs: Inputs = vec![
                ("a", F32, vec![*items, *m, *k]),
                ("b", F32, vec![*items, *k, *n]),
                ("gate", F32, vec![*items, *m]),
                ("c0", F32, vec![*items, *m, *n]),
            ];
            let label = format!("items {items} M {m} K {k} N {n}");
            (
                l,
                "tiles",
                label,
                vec![*items, *m, *k, *n],
                inputs,
                "masked 0\nwith_state 0\n".to_string(),
            )
        }
        Kind::ChunkedPool {
            d,
            masked,
            chunk,
            stage,
            n,
            slots,
            fresh,
            cu,
        } => {
            use metal::gated_delta::chunked;
            let r = slots.len();
            assert_eq!(fresh.len(), r);
            match cu {
                Some(cu) => assert!(d.b == 1 && !*masked && cu.len() == r + 1 && cu[r] as i64 == d.t),
                None => assert_eq!(d.b as usize, r),
            }
            // src/ops/gated_delta/pool.rs `row_table` on a GPU (compact numbering): per row
            // (tok0, span, len, src, dst).
            let mut table = Vec::new();
            let mut written = 0;
            for (i, &slot) in slots.iter().enumerate() {
                let (tok0, span) = match cu {
                    Some(cu) => (cu[i], cu[i + 1] - cu[i]),
                    None => (i as i32 * d.t as i32, d.t as i32),
                };
                let len = if slot < 0 { 0 } else { span };
                let src = if slot < 0 || fresh[i] != 0 { -1 } else { slot };
                let dst = if slot < 0 { -1 } else { written += 1; written - 1 };
                table.extend([tok0, span, len, src, dst]);
            }
            let mut node = gated_delta_node(d, c, Form::Chunked { chunk: chunk_size(*chunk) }, *masked, true);
            node.dims.b = r;
            node.pool = Some(gd::Pool {
                slots: *n,
                write: gd::PoolWrite::Rows(written as usize),
                packed: cu.is_some(),
            });
            let cg = chunked::gpu_chunk(chunk_size(*chunk));
            let (chunks, firsts) = chunked::pool_chunk_table(&table, cg);
            assert_eq!(firsts.len(), r + 1);
            let nch = (chunks.len() / 2) as i64;
            let (hv, dv, dk) = (d.hv, d.dv, d.dk);
            let rows = nch * cg as i64;
            let columns = chunked::chunk_state_columns_for(node.dims, cg, false);
            let mut inputs: Inputs = vec![];
            let kind = ["chunk_pool_prep", "chunk_pool_state", "chunk_pool_out"][*stage];
            let l = match stage {
                0 => {
                    inputs.extend(gd_inputs(c, d, F32, &["q", "k", "v", "g", "beta"]));
                    if *masked {
                        inputs.extend(gd_input(c, d, F32, "mask"));
                    }
                    inputs.push(("rows", Dtype::Int32, vec![r as i64, 5]));
                    inputs.push(("chunks", Dtype::Int32, vec![nch, 2]));
                    let l = chunked::gated_delta_chunked_pool_prep_launch(&node, nch as usize);
                    assert_eq!(l.grid, [256, nch as i32, hv as i32]);
                    l
                }
                1 => {
                    inputs = vec![
                        ("state_in", F32, vec![*n as i64, hv, dv, dk]),
                        ("w", F32, vec![hv, rows, dk]),
                        ("u0", F32, vec![hv, rows, dv]),
                        ("kd", F32, vec![hv, rows, dk]),
                        ("gam", F32, vec![hv, rows]),
                        ("rows", Dtype::Int32, vec![r as i64, 5]),
                        ("firsts", Dtype::Int32, vec![r as i64 + 1]),
                    ];
                    let l = chunked::gated_delta_chunked_pool_state_launch(&node, nch as usize, columns);
                    assert_eq!(l.grid, [256, (dv as usize).div_ceil(columns) as i32, (r as i64 * hv) as i32]);
                    assert_eq!(l.output_names, ["states", "u", "state_out"]);
                    l
                }
                _ => {
                    inputs.extend(gd_inputs(c, d, F32, &["q"]));
                    if *masked {
                        inputs.extend(gd_input(c, d, F32, "mask"));
                    }
                    inputs.extend([
                        ("rows", Dtype::Int32, vec![r as i64, 5]),
                        ("chunks", Dtype::Int32, vec![nch, 2]),
                        ("p", F32, vec![hv, rows, cg as i64]),
                        ("gam", F32, vec![hv, rows]),
                        ("states", F32, vec![hv, nch + r as i64, dv, dk]),
                        ("u", F32, vec![hv, rows, dv]),
                    ]);
                    let l = chunked::gated_delta_chunked_pool_out_launch(&node, nch as usize);
                    let threads = chunked::chunk_out_threads(cg, dv as usize) as i64;
                    assert_eq!(l.grid[0] as i64, threads * nch);
                    l
                }
            };
            let list = |v: &[i32]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" ");
            let fresh32: Vec<i32> = fresh.iter().map(|&f| f as i32).collect();
            let mut extra = format!(
                "masked {}\nwith_state 1\npool_n {n}\nslots {}\nfresh {}\ncheckpoint {chunk}\n",
                *masked as i32,
                list(slots),
                list(&fresh32)
            );
            if let Some(cu) = cu {
                extra += &format!("cu_seqlens {}\n", list(cu));
            }
            let label = format!(
                "{}{} {} chunk {chunk} (runs {cg}) N={n} slots {slots:?} fresh {fresh:?} W={written} chunks {nch}{}",
                head_label(c, *masked),
                match cu { Some(cu) => format!(" packed cu_seqlens {cu:?}"), None => String::new() },
                dims_label(d),
                format!(" state tile {columns}"),
            );
            (l, kind, label, case_dims(d), inputs, extra)
        }
        Kind::GatedNorm { shape, grouped } => {
            let l = metal::gated_rms_norm::gated_rms_norm_launch(&node::gated_rms_norm::Node {
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
