//! GLM-5.2 expert-slot layout: the canonical layout and its validator (pure arithmetic).
//!
//! One routed expert lives in one slot of a residency buffer: its gate and up weights
//! `[intermediate, hidden]`, its down weight `[hidden, intermediate]`, and one bfloat16 scale per
//! `group_size` consecutive input values of each (hidden for gate and up, intermediate for down;
//! no biases). Q8 stores one int8 per weight, Q4 two 4-bit weights per byte. The decode kernels
//! read each region at the offset a [`Layout`] gives; [`validate`] makes sure those reads stay
//! inside the slot, never alias, and that every number is exact in a JavaScript `number` (Bun
//! callers hold layouts as numbers).
//!
//! Lengths and ends are computed in `u128`: a `u64` times a `u64` fits, so no input, however
//! large, overflows or panics.

use std::fmt;

use crate::error::{Error, Result};

/// Slot sizes are multiples of this (16 KiB, a page on Apple silicon); canonical regions start
/// on it.
pub const EXPERT_SLOT_ALIGNMENT: u64 = 16 * 1024;

/// Every region offset is a multiple of this.
pub const REGION_ALIGNMENT: u64 = 16;

/// 2^53 - 1, JavaScript's `Number.MAX_SAFE_INTEGER`: no field or region end may exceed it.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Where one expert's six regions lie in its slot. Offsets are bytes from the slot's start.
/// Field order is the seed's (`Glm52CanonicalMetalLayout`) and the C struct's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Layout {
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub slot_bytes: u64,
    pub down_weight_offset: u64,
    pub gate_weight_offset: u64,
    pub up_weight_offset: u64,
    pub down_scale_offset: u64,
    pub gate_scale_offset: u64,
    pub up_scale_offset: u64,
}

impl Layout {
    /// The nine fields with their names as messages spell them, in field order.
    fn fields(&self) -> [(&'static str, u64); 9] {
        [
            ("hidden size", self.hidden_size),
            ("intermediate size", self.intermediate_size),
            ("slot bytes", self.slot_bytes),
            ("down weight offset", self.down_weight_offset),
            ("gate weight offset", self.gate_weight_offset),
            ("up weight offset", self.up_weight_offset),
            ("down scale offset", self.down_scale_offset),
            ("gate scale offset", self.gate_scale_offset),
            ("up scale offset", self.up_scale_offset),
        ]
    }
}

/// A quantization format: `bits` per weight (4 or 8) and `group_size` input values per scale
/// (32, 64 or 128). Only [`Format::new`] makes one, so a `Format` is always supported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Format {
    bits: u32,
    group_size: u32,
}

impl Format {
    /// Checks `bits` and `group_size`, naming the argument at fault.
    pub fn new(bits: u32, group_size: u32) -> Result<Self> {
        if !matches!(bits, 4 | 8) {
            return Err(Error::InvalidArgument(format!(
                "bits is {bits} (expected 4 or 8)"
            )));
        }
        if !matches!(group_size, 32 | 64 | 128) {
            return Err(Error::InvalidArgument(format!(
                "group_size is {group_size} (expected 32, 64 or 128)"
            )));
        }
        Ok(Format { bits, group_size })
    }

    pub fn bits(self) -> u32 {
        self.bits
    }

    pub fn group_size(self) -> u32 {
        self.group_size
    }

    /// Bytes of a `[rows, cols]` weight matrix. Q4 packs two values per byte; `cols` is a
    /// multiple of the group size, hence even, so the division is exact.
    fn weight_bytes(self, rows: u64, cols: u64) -> u128 {
        let values = u128::from(rows) * u128::from(cols);
        values / u128::from(8 / self.bits)
    }

    /// Bytes of the bfloat16 scales of a `[rows, cols]` weight matrix: one per group of
    /// `group_size` consecutive input values (along `cols`).
    fn scale_bytes(self, rows: u64, cols: u64) -> u128 {
        let groups = u128::from(cols / u64::from(self.group_size));
        u128::from(rows) * groups * 2
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Q{} group_size {}", self.bits, self.group_size)
    }
}

/// One of the six byte ranges of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    GateWeight,
    UpWeight,
    DownWeight,
    GateScale,
    UpScale,
    DownScale,
}

impl Region {
    /// All regions in canonical order: gate, up, down weights, then gate, up, down scales.
    pub const ALL: [Region; 6] = [
        Region::GateWeight,
        Region::UpWeight,
        Region::DownWeight,
        Region::GateScale,
        Region::UpScale,
        Region::DownScale,
    ];

    /// The region's name in messages, e.g. "gate weight".
    pub fn label(self) -> &'static str {
        match self {
            Region::GateWeight => "gate weight",
            Region::UpWeight => "up weight",
            Region::DownWeight => "down weight",
            Region::GateScale => "gate scale",
            Region::UpScale => "up scale",
            Region::DownScale => "down scale",
        }
    }

    /// The region's offset in `layout`.
    pub fn offset(self, layout: &Layout) -> u64 {
        match self {
            Region::GateWeight => layout.gate_weight_offset,
            Region::UpWeight => layout.up_weight_offset,
            Region::DownWeight => layout.down_weight_offset,
            Region::GateScale => layout.gate_scale_offset,
            Region::UpScale => layout.up_scale_offset,
            Region::DownScale => layout.down_scale_offset,
        }
    }

    fn offset_mut(self, layout: &mut Layout) -> &mut u64 {
        match self {
            Region::GateWeight => &mut layout.gate_weight_offset,
            Region::UpWeight => &mut layout.up_weight_offset,
            Region::DownWeight => &mut layout.down_weight_offset,
            Region::GateScale => &mut layout.gate_scale_offset,
            Region::UpScale => &mut layout.up_scale_offset,
            Region::DownScale => &mut layout.down_scale_offset,
        }
    }

    /// The region's length in bytes for `hidden` x `intermediate` in `format`. Meaningful when
    /// both dims are multiples of the group size ([`validate`] and [`canonical`] check that
    /// first).
    pub fn length(self, hidden: u64, intermediate: u64, format: Format) -> u128 {
        match self {
            Region::GateWeight | Region::UpWeight => format.weight_bytes(intermediate, hidden),
            Region::DownWeight => format.weight_bytes(hidden, intermediate),
            Region::GateScale | Region::UpScale => format.scale_bytes(intermediate, hidden),
            Region::DownScale => format.scale_bytes(hidden, intermediate),
        }
    }
}

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

/// A dimension must be exact in JavaScript and a positive multiple of the group size (each
/// weight's input width is one of the two dims).
fn check_dim(label: &str, value: u64, format: Format) -> Result<()> {
    if value > MAX_SAFE_INTEGER {
        return Err(invalid(format!("{label} exceeds 2^53-1 ({value})")));
    }
    if value == 0 || value % u64::from(format.group_size) != 0 {
        return Err(invalid(format!(
            "{label} {value} must be a positive multiple of group_size {}",
            format.group_size
        )));
    }
    Ok(())
}

/// Rounds `value` up to a multiple of `alignment`; None on overflow.
fn align_up(value: u128, alignment: u64) -> Option<u128> {
    let alignment = u128::from(alignment);
    value
        .checked_add(alignment - 1)
        .map(|v| v / alignment * alignment)
}

/// The canonical layout for `hidden` x `intermediate` in `format`: gate, up and down weights,
/// then gate, up and down scales, each starting on a 16 KiB boundary; the slot ends at the next
/// 16 KiB boundary after the down scales. Fails when a dim is not a positive multiple of the
/// group size or the slot would exceed 2^53-1 bytes.
pub fn canonical(hidden: u64, intermediate: u64, format: Format) -> Result<Layout> {
    check_dim("hidden", hidden, format)?;
    check_dim("intermediate", intermediate, format)?;
    let too_large = || {
        invalid(format!(
            "the canonical slot for hidden {hidden}, intermediate {intermediate} ({format}) \
             exceeds 2^53-1 bytes"
        ))
    };
    let mut offsets = [0u128; 6];
    let mut end: u128 = 0;
    for (offset, region) in offsets.iter_mut().zip(Region::ALL) {
        *offset = align_up(end, EXPERT_SLOT_ALIGNMENT).ok_or_else(too_large)?;
        end = offset
            .checked_add(region.length(hidden, intermediate, format))
            .ok_or_else(too_large)?;
    }
    let slot_bytes = align_up(end, EXPERT_SLOT_ALIGNMENT).ok_or_else(too_large)?;
    let narrow = |value: u128| {
        u64::try_from(value)
            .ok()
            .filter(|&v| v <= MAX_SAFE_INTEGER)
            .ok_or_else(too_large)
    };
    let mut layout = Layout {
        hidden_size: hidden,
        intermediate_size: intermediate,
        slot_bytes: narrow(slot_bytes)?,
        ..Layout::default()
    };
    for (offset, region) in offsets.into_iter().zip(Region::ALL) {
        *region.offset_mut(&mut layout) = narrow(offset)?;
    }
    validate(&layout, format)?;
    Ok(layout)
}

/// Checks that `layout` is safe for the decode kernels to read in `format`, in this order:
/// every field <= 2^53-1; slot_bytes a positive multiple of 16384; both dims positive
/// multiples of the group size; per region (canonical order) a 16-byte aligned offset, an end
/// (offset + length) <= 2^53-1 and inside the slot; then no two regions overlap. The first
/// failure is returned, naming the field or region as the seed does ("gate weight exceeds the
/// canonical expert slot", "up scale overlaps down weight").
pub fn validate(layout: &Layout, format: Format) -> Result<()> {
    for (label, value) in layout.fields() {
        if value > MAX_SAFE_INTEGER {
            return Err(invalid(format!("{label} exceeds 2^53-1 ({value})")));
        }
    }
    let slot_bytes = layout.slot_bytes;
    if slot_bytes == 0 || slot_bytes % EXPERT_SLOT_ALIGNMENT != 0 {
        return Err(invalid(format!(
            "slot bytes {slot_bytes} must be a positive multiple of {EXPERT_SLOT_ALIGNMENT}"
        )));
    }
    let (hidden, intermediate) = (layout.hidden_size, layout.intermediate_size);
    check_dim("hidden size", hidden, format)?;
    check_dim("intermediate size", intermediate, format)?;

    // Half-open byte ranges [start, end) in canonical order.
    let mut ranges = [(0u128, 0u128); 6];
    for (range, region) in ranges.iter_mut().zip(Region::ALL) {
        let label = region.label();
        let offset = region.offset(layout);
        let length = region.length(hidden, intermediate, format);
        if offset % REGION_ALIGNMENT != 0 {
            return Err(invalid(format!(
                "{label} offset is not {REGION_ALIGNMENT}-byte aligned ({offset})"
            )));
        }
        let end = u128::from(offset) + length;
        if end > u128::from(MAX_SAFE_INTEGER) {
            return Err(invalid(format!(
                "{label} offset + length exceeds 2^53-1 ({offset} + {length})"
            )));
        }
        if end > u128::from(slot_bytes) {
            return Err(invalid(format!(
                "{label} exceeds the canonical expert slot ({offset} + {length} > slot bytes \
                 {slot_bytes})"
            )));
        }
        *range = (u128::from(offset), end);
    }
    for later in 1..ranges.len() {
        for earlier in 0..later {
            let (a, b) = (ranges[later], ranges[earlier]);
            if a.0 < b.1 && b.0 < a.1 {
                return Err(invalid(format!(
                    "{} overlaps {} ([{}, {}) and [{}, {}))",
                    Region::ALL[later].label(),
                    Region::ALL[earlier].label(),
                    a.0,
                    a.1,
                    b.0,
                    b.1
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GLM5_HIDDEN: u64 = 6144;
    const GLM5_INTERMEDIATE: u64 = 2048;

    fn glm5(bits: u32, group_size: u32) -> Layout {
        canonical(
            GLM5_HIDDEN,
            GLM5_INTERMEDIATE,
            Format::new(bits, group_size).unwrap(),
        )
        .unwrap()
    }

    /// Offsets in canonical order: gate w, up w, down w, gate s, up s, down s.
    fn offsets(layout: &Layout) -> [u64; 6] {
        Region::ALL.map(|region| region.offset(layout))
    }

    #[test]
    fn design_table_q4_g64() {
        let layout = glm5(4, 64);
        assert_eq!(
            offsets(&layout),
            [0, 6291456, 12582912, 18874368, 19267584, 19660800]
        );
        assert_eq!(layout.slot_bytes, 20054016);
        assert_eq!((layout.hidden_size, layout.intermediate_size), (6144, 2048));
    }

    #[test]
    fn design_table_q8_g64() {
        let layout = glm5(8, 64);
        assert_eq!(
            offsets(&layout),
            [0, 12582912, 25165824, 37748736, 38141952, 38535168]
        );
        assert_eq!(layout.slot_bytes, 38928384);
    }

    #[test]
    fn design_table_slot_bytes() {
        assert_eq!(glm5(4, 32).slot_bytes, 21233664);
        assert_eq!(glm5(4, 128).slot_bytes, 19464192);
        assert_eq!(glm5(8, 32).slot_bytes, 40108032);
        assert_eq!(glm5(8, 128).slot_bytes, 38338560);
    }

    #[test]
    fn region_lengths() {
        let q4 = Format::new(4, 64).unwrap();
        let q8 = Format::new(8, 32).unwrap();
        assert_eq!(Region::GateWeight.length(6144, 2048, q4), 6291456);
        assert_eq!(Region::DownWeight.length(6144, 2048, q8), 12582912);
        assert_eq!(Region::UpScale.length(6144, 2048, q4), 2048 * 96 * 2);
        assert_eq!(Region::DownScale.length(6144, 2048, q8), 6144 * 64 * 2);
        // The largest inputs fit in u128 without overflow.
        assert_eq!(
            Region::UpWeight.length(u64::MAX, u64::MAX, q8),
            u128::from(u64::MAX) * u128::from(u64::MAX)
        );
    }

    #[test]
    fn canonical_layouts_validate() {
        for bits in [4, 8] {
            for group_size in [32, 64, 128] {
                let format = Format::new(bits, group_size).unwrap();
                for hidden in [32, 64, 128, 384, 6144] {
                    for intermediate in [128, 256, 2048] {
                        let result = canonical(hidden, intermediate, format);
                        if hidden % u64::from(group_size) != 0 {
                            assert!(result.is_err());
                        } else {
                            validate(&result.unwrap(), format).unwrap();
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn unsupported_formats() {
        let bits = Format::new(3, 64).unwrap_err().to_string();
        assert_eq!(bits, "bits is 3 (expected 4 or 8)");
        let group = Format::new(4, 16).unwrap_err().to_string();
        assert_eq!(group, "group_size is 16 (expected 32, 64 or 128)");
    }

    #[test]
    fn huge_dims_fail_without_panic() {
        let format = Format::new(8, 32).unwrap();
        for dim in [MAX_SAFE_INTEGER - 31, u64::MAX - 31, u64::MAX] {
            assert!(canonical(dim, dim, format).is_err());
            assert!(canonical(32, dim, format).is_err());
        }
        let layout = Layout {
            hidden_size: u64::MAX,
            slot_bytes: u64::MAX,
            ..glm5(8, 32)
        };
        assert!(validate(&layout, format).is_err());
    }
}
