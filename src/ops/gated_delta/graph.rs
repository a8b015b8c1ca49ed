//! The graph building every form of the update shares: the CPU node, or the GPU launch with
//! its inputs in the kernel's order.

use cxx::UniquePtr;

use crate::bridge::{self, Array};
use crate::cuda;
use crate::dtype::Dtype;
use crate::error::Result;
use crate::metal::gated_delta::{self as gd_metal, chunked};
use crate::node::gated_delta::{Form, Input, Node, PoolWrite};
use crate::node::{Kernel, Words};
use crate::ops::{cpu_node, gpu_node_as, Backend, GpuLaunch};

pub(super) fn two_outputs(
    mut outputs: Vec<UniquePtr<Array>>,
) -> (UniquePtr<Array>, UniquePtr<Array>) {
    let state_out = outputs.pop().expect("two outputs");
    let y = outputs.pop().expect("two outputs");
    (y, state_out)
}

/// The caller's arrays of one call, by input (None: not given).
#[derive(Default)]
pub(super) struct Arrays<'a> {
    pub(super) q: Option<&'a Array>,
    pub(super) k: Option<&'a Array>,
    pub(super) v: Option<&'a Array>,
    pub(super) a: Option<&'a Array>,
    pub(super) b: Option<&'a Array>,
    pub(super) a_log: Option<&'a Array>,
    pub(super) dt_bias: Option<&'a Array>,
    pub(super) state: Option<&'a Array>,
    pub(super) mask: Option<&'a Array>,
    pub(super) lengths: Option<&'a Array>,
    /// A pool node's row table (`node::gated_delta::Pool`).
    pub(super) rows: Option<&'a Array>,
    /// The recurrence from the convolution's output: x and the head split's scales.
    pub(super) x: Option<&'a Array>,
    pub(super) q_scale: Option<&'a Array>,
    pub(super) k_scale: Option<&'a Array>,
}

/// Builds `node` on `backend` from the caller's arrays, taking them in the order the node
/// defines for that backend.
pub(super) fn build(node: &Node, x: &Arrays, backend: Backend) -> Result<Vec<UniquePtr<Array>>> {
    match backend {
        Backend::Cpu => {
            let inputs = node
                .cpu_inputs()
                .into_iter()
                .map(|input| caller_array(x, input))
                .collect::<Vec<_>>();
            cpu_node(
                node.kernel(),
                node.encode(),
                &node.outputs(),
                node.donations(),
                &inputs,
            )
        }
        gpu => build_gpu(node, x, gpu, None),
    }
}

/// The GPU node of `node` on `backend` (not the CPU). `from_conv`: the head split's eps when
/// the launch computes q, k and v from the convolution's output (`update_from_conv`; the
/// arrays then hold x and the scales instead of q, k and v).
///
/// A pool node (`node.pool`, built by `pool.rs`) takes the pool as its state and the row table
/// as `rows`, in the node's input order; its launch (`gd_metal::gated_delta_launch_rows`) gives one
/// grid row per table row and writes the compact state rows `pool.rs` then scatters into the
/// pool. It has no GPU gradient.
pub(super) fn build_gpu(
    node: &Node,
    x: &Arrays,
    gpu: Backend,
    from_conv: Option<f32>,
) -> Result<Vec<UniquePtr<Array>>> {
    assert!(
        node.pool.is_none() || (x.state.is_some() && x.rows.is_some() && from_conv.is_none()),
        "a pool node reads the pool and its row table (and has no form from the convolution)"
    );
    // On CUDA the kernel computes the gates itself (crate::cuda::with_fused_gates).
    let fused = matches!(gpu, Backend::Cuda { .. }) && !crate::seams::gpu_gates_on_cpu();
    let m = MetalInputs::new(node, x, gpu.gpu_stream(), !fused)?;
    let order = gpu_inputs(node, fused, from_conv.is_some());
    let how = match node.pool.map(|p| p.write) {
        Some(PoolWrite::InPlace) => GpuLaunch::PoolInPlace {
            pool: order
                .iter()
                .position(|&i| i == Input::State)
                .expect("a pool launch reads the pool"),
        },
        _ => GpuLaunch::Plain,
    };
    let inputs = order
        .into_iter()
        .map(|input| match input {
            Input::G => m.g.as_deref().expect("gates made for this launch"),
            Input::Beta => m.beta.as_deref().expect("gates made for this launch"),
            Input::State => x.state.unwrap_or_else(|| m.zeros()),
            other => caller_array(x, other),
        })
        .collect::<Vec<_>>();
    let make = || {
        let mut launch = match gpu {
            Backend::Cuda { .. } => {
                gd_metal::gated_delta_launch_rows(node, cuda::rows_per_simd_group(node.dims))
            }
            _ => gd_metal::gated_delta_launch(node),
        };
        if let Some(eps) = from_conv {
            launch = gd_metal::gated_delta_from_conv_launch(launch, eps);
        }
        if fused {
            cuda::with_fused_gates(launch)
        } else {
            launch
        }
    };
    // The launch depends on the node, on whether the gates are fused and on the head split.
    let mut words = vec![fused as i64];
    if let Some(eps) = from_conv {
        words.push(i64::from(eps.to_bits()));
    }
    words.extend(node.encode());
    let mut key = words.clone();
    if from_conv.is_some() {
        key.push(-1); // never the key of a recurrence of its own (one word shorter)
    }
    // Exact updates carry a gradient for MLX's autograd (the replay and pool nodes have none).
    let kernel = if from_conv.is_some() {
        Kernel::GatedDeltaFromConv
    } else {
        Kernel::GatedDelta
    };
    let vjp = (node.form == Form::Exact && node.pool.is_none())
        .then(|| (kernel, crate::ops::gpu_vjp_params(gpu, words)));
    gpu_node_as(Some(key), make, &inputs, gpu, vjp, how)
}

/// A GPU launch's inputs in order: the Metal launch's, or with the gates fused on CUDA, and
/// with x and the scales for q, k and v when it computes them from the convolution's output.
pub(super) fn gpu_inputs(node: &Node, fused: bool, from_conv: bool) -> Vec<Input> {
    let order = if fused {
        node.cuda_fused_inputs()
    } else {
        node.metal_inputs()
    };
    if from_conv {
        Node::from_conv_inputs(order)
    } else {
        order
    }
}

/// The caller's array for `input`; the node lists only inputs the call has.
pub(super) fn caller_array<'a>(x: &Arrays<'a>, input: Input) -> &'a Array {
    let array = match input {
        Input::Q => x.q,
        Input::K => x.k,
        Input::V => x.v,
        Input::A => x.a,
        Input::B => x.b,
        Input::ALog => x.a_log,
        Input::DtBias => x.dt_bias,
        Input::State => x.state,
        Input::Mask => x.mask,
        Input::Lengths => x.lengths,
        Input::Rows => x.rows,
        Input::X => x.x,
        Input::QScale => x.q_scale,
        Input::KScale => x.k_scale,
        Input::G | Input::Beta => None,
    };
    array.unwrap_or_else(|| panic!("the node lists input {input:?}, which the call lacks"))
}

/// What the Metal recurrence kernels take besides the caller's arrays: g and beta (MLX ops)
/// and a zero state when none is given (T comes with k's shape).
pub(super) struct MetalInputs {
    g: Option<UniquePtr<Array>>,
    beta: Option<UniquePtr<Array>>,
    zeros: Option<UniquePtr<Array>>,
}

impl MetalInputs {
    /// `gates`: whether to make g and beta (not when the kernel computes them).
    fn new(node: &Node, x: &Arrays, gpu: bool, gates: bool) -> Result<MetalInputs> {
        let d = node.dims;
        let zeros = match x.state {
            Some(_) => None,
            None => Some(bridge::array_zeros(
                &[d.b as i32, d.hv as i32, d.dv as i32, d.dk as i32],
                Dtype::Float32 as i32,
            )?),
        };
        let gate = |input| caller_array(x, input);
        let gates_gpu = gpu && !crate::seams::gpu_gates_on_cpu();
        let (g, beta) = if gates {
            (
                Some(bridge::compute_g(
                    gate(Input::ALog),
                    gate(Input::A),
                    gate(Input::DtBias),
                    gates_gpu,
                )?),
                Some(bridge::sigmoid(gate(Input::B), gates_gpu)?),
            )
        } else {
            (None, None)
        };
        Ok(MetalInputs { g, beta, zeros })
    }

    /// The zero state made when the call gives none.
    fn zeros(&self) -> &Array {
        self.zeros
            .as_deref()
            .expect("zeros made when no state is given")
    }
}

/// The chunked update's GPU graph (docs/DESIGN.md §3 "The chunked form", in docs/backends.md;
/// its bounds in §4 "Chunked update", docs/numerics.md), three launches as nodes of one graph:
/// - the prep (`metal::gated_delta::chunked::gated_delta_chunked_prep_launch`), the work within
///   every chunk: W, U0, the decayed keys, P and γ;
/// - the state pass (`gated_delta_chunked_state_launch`), the one walk over the chunks: the
///   state entering every chunk (and the final state) and U = U0 − W H;
/// - the output pass (`gated_delta_chunked_out_launch`), every chunk in parallel:
///   y = diag(γ) Q H_c + P U, and state_out, copied from the state pass's last slot.
///
/// The output pass makes both results, so one node carries the gradient: it also takes the
/// exact update's launch inputs, in that launch's order, before P, γ, the states and U, and has
/// the chunked form's GPU gradient (`gpu_vjp`, which takes the chunked backward for
/// `Form::Chunked`; the parts get zeros). Every output of the prep and the state pass goes
/// through MLX's stop_gradient, so autograd never reaches those two nodes (they have no
/// gradient of their own). `node`: `Form::Chunked`, dense, B ≥ 1, T ≥ 1.
pub(super) fn build_gpu_chunked(
    node: &Node,
    x: &Arrays,
    gpu: Backend,
) -> Result<Vec<UniquePtr<Array>>> {
    assert!(
        matches!(node.form, Form::Chunked { .. }) && node.pool.is_none(),
        "a dense chunked node"
    );
    let fused = matches!(gpu, Backend::Cuda { .. }) && !crate::seams::gpu_gates_on_cpu();
    let m = MetalInputs::new(node, x, gpu.gpu_stream(), !fused)?;
    let order = gpu_inputs(node, fused, false);
    let arrays: Vec<&Array> = order
        .iter()
        .map(|&input| match input {
            Input::G => m.g.as_deref().expect("gates made for this launch"),
            Input::Beta => m.beta.as_deref().expect("gates made for this launch"),
            Input::State => x.state.unwrap_or_else(|| m.zeros()),
            other => caller_array(x, other),
        })
        .collect();
    let mut words = vec![fused as i64];
    words.extend(node.encode());
    let stopped = |parts: Vec<UniquePtr<Array>>| {
        parts
            .iter()
            .map(|a| bridge::array_stop_gradient(a, gpu.gpu_stream()))
            .collect::<std::result::Result<Vec<_>, _>>()
    };

    // The prep launch: the exact launch's inputs but the state.
    let prep_inputs: Vec<&Array> = order
        .iter()
        .zip(&arrays)
        .filter(|(&input, _)| input != Input::State)
        .map(|(_, &a)| a)
        .collect();
    let make_prep = || {
        let l = chunked::gated_delta_chunked_prep_launch(node);
        if fused {
            cuda::with_fused_gates(l)
        } else {
            l
        }
    };
    let mut prep_key = words.clone();
    prep_key.push(-2);
    let parts = stopped(gpu_node_as(
        Some(prep_key),
        make_prep,
        &prep_inputs,
        gpu,
        None,
        GpuLaunch::Plain,
    )?)?;
    let part = |name: &str| -> &Array {
        let at = chunked::CHUNK_PARTS
            .iter()
            .position(|p| *p == name)
            .expect("a prep output");
        &parts[at]
    };

    // The state pass: the state (the caller's or zeros), then the prep's w, u0, kd and γ.
    let chunk = chunked::launch_chunk(node);
    let cuda = matches!(gpu, Backend::Cuda { .. });
    let mut columns = chunked::chunk_state_columns_for(node.dims, chunk, cuda);
    // A narrower state-pass tile than the launch's own, if configured (`crate::config`).
    if let Some(vt) = crate::config::get().chunk_state_columns {
        columns = columns.min(vt);
    }
    let state = x.state.unwrap_or_else(|| m.zeros());
    let state_inputs: Vec<&Array> = std::iter::once(state)
        .chain(
            chunked::CHUNK_STATE_INPUTS[1..]
                .iter()
                .map(|name| part(name)),
        )
        .collect();
    let mut state_key = words.clone();
    state_key.extend([-3, columns as i64]);
    let kept = stopped(gpu_node_as(
        Some(state_key),
        || chunked::gated_delta_chunked_state_launch(node, columns),
        &state_inputs,
        gpu,
        None,
        GpuLaunch::Plain,
    )?)?;

    // The output pass: the exact launch's inputs (names as that launch's), then P, γ, the
    // states and U; it makes y and state_out and carries the gradient.
    let make_out = || {
        let mut names: Vec<String> = node
            .metal_inputs()
            .iter()
            .map(|i| i.name().to_string())
            .collect();
        if fused {
            names.extend(["a_log".to_string(), "dt_bias".to_string()]);
        }
        let mut l = chunked::gated_delta_chunked_out_launch(node, names);
        if fused {
            l.name.push_str("_gates");
        }
        l
    };
    let mut out_inputs = arrays.clone();
    out_inputs.extend([part("p"), part("gam"), &*kept[0], &*kept[1]]);
    let mut out_key = words.clone();
    out_key.push(-4);
    let vjp = Some((Kernel::GatedDelta, crate::ops::gpu_vjp_params(gpu, words)));
    gpu_node_as(
        Some(out_key),
        make_out,
        &out_inputs,
        gpu,
        vjp,
        GpuLaunch::Plain,
    )
}

/// The chunked update of a pool node on a GPU (`mlxk_gated_delta_update_pool_chunked`,
/// `_packed_chunked`; fla's variable-length form): `build_gpu_chunked`'s three launches over a
/// chunk table (`chunked::pool_chunk_table` of the row table `table`), each chunk one row's:
/// the prep per (chunk, value head), the state pass per (row, value head, tile) from the row's
/// pool slot (or zeros), the output pass per (chunk, value head, tile). A row runs what the
/// dense call on its tokens alone runs, so its y and state are that call's bits. Returns y
/// and the written rows' states (`PoolWrite::Rows`, from the state pass; the pool node has no
/// gradient). `node`: `Form::Chunked`, `node.pool` set, T ≥ 1; `x` holds the pool as its state
/// and the row table as `rows`.
pub(super) fn build_gpu_chunked_pool(
    node: &Node,
    x: &Arrays,
    gpu: Backend,
    table: &[i32],
) -> Result<Vec<UniquePtr<Array>>> {
    assert!(
        matches!(node.form, Form::Chunked { .. })
            && matches!(node.pool.map(|p| p.write), Some(PoolWrite::Rows(_))),
        "a chunked pool node writing its rows"
    );
    let fused = matches!(gpu, Backend::Cuda { .. }) && !crate::seams::gpu_gates_on_cpu();
    let m = MetalInputs::new(node, x, gpu.gpu_stream(), !fused)?;
    let order = gpu_inputs(node, fused, false);
    let input = |input: Input| -> &Array {
        match input {
            Input::G => m.g.as_deref().expect("gates made for this launch"),
            Input::Beta => m.beta.as_deref().expect("gates made for this launch"),
            other => caller_array(x, other),
        }
    };
    let chunk = chunked::launch_chunk(node);
    let (table_chunks, firsts) = chunked::pool_chunk_table(table, chunk);
    let nch = table_chunks.len() / 2;
    let chunks = super::tables::ints_array(&table_chunks, &[nch as i32, 2])?;
    let firsts = super::tables::ints_array(&firsts, &[firsts.len() as i32])?;
    let mut words = vec![fused as i64];
    words.extend(node.encode());
    words.extend([-5, nch as i64]);
    let stopped = |parts: Vec<UniquePtr<Array>>| {
        parts
            .iter()
            .map(|a| bridge::array_stop_gradient(a, gpu.gpu_stream()))
            .collect::<std::result::Result<Vec<_>, _>>()
    };

    // The prep: the pool node's Metal launch inputs but the pool, then the chunk table, then
    // (fused gates) A_log and dt_bias, as `cuda::with_fused_gates` names them.
    let gates = [Input::ALog, Input::DtBias];
    let mut prep_inputs: Vec<&Array> = order
        .iter()
        .filter(|&&i| i != Input::State && !gates.contains(&i))
        .map(|&i| input(i))
        .collect();
    prep_inputs.push(&chunks);
    if fused {
        prep_inputs.extend(gates.map(input));
    }
    let make_prep = || {
        let l = chunked::gated_delta_chunked_pool_prep_launch(node, nch);
        if fused {
            cuda::with_fused_gates(l)
        } else {
            l
        }
    };
    let mut prep_key = words.clone();
    prep_key.push(-2);
    let parts = stopped(gpu_node_as(
        Some(prep_key),
        make_prep,
        &prep_inputs,
        gpu,
        None,
        GpuLaunch::Plain,
    )?)?;
    let part = |name: &str| -> &Array {
        let at = chunked::CHUNK_PARTS
            .iter()
            .position(|p| *p == name)
            .expect("a prep output");
        &parts[at]
    };

    // The state pass: the pool, w, u0, kd, γ, the rows and their chunks; it writes the rows'
    // states.
    let cuda = matches!(gpu, Backend::Cuda { .. });
    let mut columns = chunked::chunk_state_columns_for(node.dims, chunk, cuda);
    if let Some(vt) = crate::config::get().chunk_state_columns {
        columns = columns.min(vt);
    }
    let mut state_inputs: Vec<&Array> = vec![input(Input::State)];
    state_inputs.extend(
        chunked::CHUNK_STATE_INPUTS[1..]
            .iter()
            .map(|name| part(name)),
    );
    state_inputs.extend([input(Input::Rows), &*firsts]);
    let mut state_key = words.clone();
    state_key.extend([-3, columns as i64]);
    let mut kept = gpu_node_as(
        Some(state_key),
        || chunked::gated_delta_chunked_pool_state_launch(node, nch, columns),
        &state_inputs,
        gpu,
        None,
        GpuLaunch::Plain,
    )?;
    let rows_out = kept.pop().expect("the rows' states");
    let kept = stopped(kept)?;

    // The output pass: q, the mask, the rows and chunks, then P, γ, the states and U.
    let mut out_inputs: Vec<&Array> = vec![input(Input::Q)];
    if node.has_mask {
        out_inputs.push(input(Input::Mask));
    }
    out_inputs.extend([input(Input::Rows), &*chunks]);
    out_inputs.extend([part("p"), part("gam"), &*kept[0], &*kept[1]]);
    let mut out_key = words;
    out_key.push(-4);
    let mut y = gpu_node_as(
        Some(out_key),
        || chunked::gated_delta_chunked_pool_out_launch(node, nch),
        &out_inputs,
        gpu,
        None,
        GpuLaunch::Plain,
    )?;
    Ok(vec![y.pop().expect("y"), rows_out])
}
