//! GLM-5.2 expert-slot layout: `mlxk_glm52_layout_canonical`, `mlxk_glm52_layout_validate`.

use super::status::mlxk_status;
use super::{boundary, Out};
use crate::error::Error;
use crate::glm52::{self, Format, Layout};

/// Every slot size is a multiple of this many bytes (16 KiB); canonical regions start on it.
pub const MLXK_GLM52_EXPERT_SLOT_ALIGNMENT: u64 = 16384;

const _: () = assert!(MLXK_GLM52_EXPERT_SLOT_ALIGNMENT == glm52::EXPERT_SLOT_ALIGNMENT);

/// Where one GLM-5.2 routed expert's weights and scales lie in its slot of a residency buffer.
/// Offsets are bytes from the start of the slot. Gate and up weights are [intermediate_size,
/// hidden_size], the down weight [hidden_size, intermediate_size]; bits = 8 stores one int8
/// (two's complement) per weight, bits = 4 two 4-bit values (-8..7) per byte, low nibble first;
/// each weight has one bfloat16 scale per group_size consecutive input values (w = q * scale;
/// no biases). Every field is at most 2^53-1 so that JavaScript numbers hold it exactly.
/// Plain data: the caller owns it; pass it by pointer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct mlxk_glm52_layout {
    /// The model's hidden size: the input width of gate and up, the output width of down.
    pub hidden_size: u64,
    /// The expert's intermediate size: the output width of gate and up, the input width of down.
    pub intermediate_size: u64,
    /// Bytes of one slot: a positive multiple of MLXK_GLM52_EXPERT_SLOT_ALIGNMENT.
    pub slot_bytes: u64,
    /// Byte offset of the down weight [hidden_size, intermediate_size].
    pub down_weight_offset: u64,
    /// Byte offset of the gate weight [intermediate_size, hidden_size].
    pub gate_weight_offset: u64,
    /// Byte offset of the up weight [intermediate_size, hidden_size].
    pub up_weight_offset: u64,
    /// Byte offset of the down scales [hidden_size, intermediate_size / group_size], bfloat16.
    pub down_scale_offset: u64,
    /// Byte offset of the gate scales [intermediate_size, hidden_size / group_size], bfloat16.
    pub gate_scale_offset: u64,
    /// Byte offset of the up scales [intermediate_size, hidden_size / group_size], bfloat16.
    pub up_scale_offset: u64,
}

impl From<mlxk_glm52_layout> for Layout {
    fn from(c: mlxk_glm52_layout) -> Self {
        Layout {
            hidden_size: c.hidden_size,
            intermediate_size: c.intermediate_size,
            slot_bytes: c.slot_bytes,
            down_weight_offset: c.down_weight_offset,
            gate_weight_offset: c.gate_weight_offset,
            up_weight_offset: c.up_weight_offset,
            down_scale_offset: c.down_scale_offset,
            gate_scale_offset: c.gate_scale_offset,
            up_scale_offset: c.up_scale_offset,
        }
    }
}

impl From<Layout> for mlxk_glm52_layout {
    fn from(l: Layout) -> Self {
        mlxk_glm52_layout {
            hidden_size: l.hidden_size,
            intermediate_size: l.intermediate_size,
            slot_bytes: l.slot_bytes,
            down_weight_offset: l.down_weight_offset,
            gate_weight_offset: l.gate_weight_offset,
            up_weight_offset: l.up_weight_offset,
            down_scale_offset: l.down_scale_offset,
            gate_scale_offset: l.gate_scale_offset,
            up_scale_offset: l.up_scale_offset,
        }
    }
}

/// Writes the canonical layout of one expert slot for `hidden` x `intermediate` in format Q`bits`
/// (4 or 8) with `group_size` (32, 64 or 128) to `*out`: gate, up and down weights, then gate,
/// up and down scales, each starting on a MLXK_GLM52_EXPERT_SLOT_ALIGNMENT (16 KiB) boundary;
/// slot_bytes is the end of the down scales rounded up to that boundary. For GLM-5 (hidden 6144,
/// intermediate 2048), Q4 with group_size 64: gate weight 0, up weight 6291456, down weight
/// 12582912, gate scale 18874368, up scale 19267584, down scale 19660800, slot_bytes 20054016.
/// The result passes mlxk_glm52_layout_validate() with the same bits and group_size.
///
/// Ownership: `*out` is caller memory, written only on success. NULL: `out` must not be NULL.
/// Errors: MLXK_ERR_NULL_POINTER (out), MLXK_ERR_INVALID_ARGUMENT (bits not 4 or 8, group_size
/// not 32, 64 or 128, hidden or intermediate not a positive multiple of group_size, a slot that
/// would exceed 2^53-1 bytes). Thread: any. Pure arithmetic: no MLX involved, never takes the
/// MLX lock, nothing lazy.
#[no_mangle]
pub unsafe extern "C" fn mlxk_glm52_layout_canonical(
    hidden: u64,
    intermediate: u64,
    bits: u32,
    group_size: u32,
    out: *mut mlxk_glm52_layout,
) -> mlxk_status {
    boundary("mlxk_glm52_layout_canonical", || {
        // SAFETY: the documented contract on `out`.
        let out = unsafe { Out::new(out, "out") }?;
        let format = Format::new(bits, group_size)?;
        let layout = glm52::canonical(hidden, intermediate, format)?;
        out.write(layout.into());
        Ok(())
    })
}

/// Checks that `*layout` is safe for the decode kernels to read with Q`bits` weights and
/// `group_size`. Region lengths follow from the dims, bits and group size (see
/// mlxk_glm52_layout). Checked in this order, the first failure reported: every field <=
/// 2^53-1 ("gate weight offset exceeds 2^53-1"); slot_bytes a positive multiple of
/// MLXK_GLM52_EXPERT_SLOT_ALIGNMENT ("slot bytes 100 must be a positive multiple of 16384");
/// hidden_size and intermediate_size positive multiples of group_size; then per region, in the
/// order gate, up, down weight, gate, up, down scale: offset 16-byte aligned ("down scale offset
/// is not 16-byte aligned"), offset + length <= 2^53-1, inside the slot ("gate weight exceeds
/// the canonical expert slot"); last, no two regions overlap ("up scale overlaps down weight").
/// Regions need not be in canonical order and may touch.
///
/// Ownership: `layout` is borrowed for the call. NULL: `layout` must not be NULL.
/// Errors: MLXK_ERR_NULL_POINTER (layout), MLXK_ERR_INVALID_ARGUMENT (bits not 4 or 8,
/// group_size not 32, 64 or 128, any failed check above; the message names the field or
/// regions). Thread: any. Pure arithmetic: no MLX involved, never takes the MLX lock, nothing
/// lazy.
#[no_mangle]
pub unsafe extern "C" fn mlxk_glm52_layout_validate(
    layout: *const mlxk_glm52_layout,
    bits: u32,
    group_size: u32,
) -> mlxk_status {
    boundary("mlxk_glm52_layout_validate", || {
        if layout.is_null() {
            return Err(Error::NullPointer(
                "layout is NULL (expected a pointer to an mlxk_glm52_layout)".into(),
            ));
        }
        // SAFETY: checked non-NULL; the caller promises a readable mlxk_glm52_layout.
        let layout = unsafe { layout.read_unaligned() };
        let format = Format::new(bits, group_size)?;
        glm52::validate(&layout.into(), format)
    })
}
