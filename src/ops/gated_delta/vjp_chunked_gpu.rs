//! The entry of the chunked form's GPU backward (`testing`'s hook; the C ABI reaches it
//! through the forward node's form, `Form::Chunked`, in `vjp::update_vjp_gpu`).

use crate::bridge::Array;
use crate::error::{Error, Result};
use crate::node::gated_delta::Form;
use crate::ops::Backend;

use super::vjp::{check_vjp, update_vjp_gpu, Gradients};
use super::{check_update, Inputs};

/// `mlxk_gated_delta_update_vjp`'s gradients for the chunked form on a GPU backend (chunk 0:
/// the default): the forward node's form made `Form::Chunked`, then the GPU backward, which
/// takes the chunked kernels for that form. The CPU backend is refused (the CPU backward is
/// the exact one's).
pub fn update_vjp_chunked_gpu(
    x: &Inputs,
    dy: Option<&Array>,
    dstate_out: Option<&Array>,
    backend: Backend,
    chunk: usize,
) -> Result<Gradients> {
    let mut node = check_update(x)?;
    check_vjp(&node, dy, dstate_out)?;
    if backend == Backend::Cpu {
        return Err(Error::Unsupported(
            "the chunked GPU backward needs a GPU backend (Metal or CUDA)".into(),
        ));
    }
    if chunk != 0 && (!chunk.is_multiple_of(16) || chunk > 128) {
        return Err(Error::InvalidArgument(format!(
            "chunk must be 0 (default) or a multiple of 16 in 16..=128, got {chunk}"
        )));
    }
    node.form = Form::Chunked { chunk };
    update_vjp_gpu(x, &node, dy, dstate_out, backend)
}
