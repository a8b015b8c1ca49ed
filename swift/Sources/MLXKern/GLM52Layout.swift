import CMLXKern

/// Where one GLM-5.2 routed expert's weights and scales lie in its slot of a residency buffer.
///
/// Offsets are bytes from the start of the slot. Gate and up weights are
/// `[intermediateSize, hiddenSize]`, the down weight `[hiddenSize, intermediateSize]`; Q8
/// stores one int8 per weight, Q4 two 4-bit values (-8...7) per byte, low nibble first; each
/// weight has one bfloat16 scale per `groupSize` consecutive input values (w = q · scale).
/// Every field is at most 2^53-1, so JavaScript numbers hold it exactly.
///
/// Pure arithmetic: no MLX involved.
public struct GLM52Layout: Hashable, Sendable {
    /// The model's hidden size: the input width of gate and up, the output width of down.
    public var hiddenSize: UInt64
    /// The expert's intermediate size: the output width of gate and up, the input of down.
    public var intermediateSize: UInt64
    /// Bytes of one slot: a positive multiple of `GLM52Layout.slotAlignment`.
    public var slotBytes: UInt64
    /// Byte offset of the down weight `[hiddenSize, intermediateSize]`.
    public var downWeightOffset: UInt64
    /// Byte offset of the gate weight `[intermediateSize, hiddenSize]`.
    public var gateWeightOffset: UInt64
    /// Byte offset of the up weight `[intermediateSize, hiddenSize]`.
    public var upWeightOffset: UInt64
    /// Byte offset of the down scales `[hiddenSize, intermediateSize / groupSize]`, bfloat16.
    public var downScaleOffset: UInt64
    /// Byte offset of the gate scales `[intermediateSize, hiddenSize / groupSize]`, bfloat16.
    public var gateScaleOffset: UInt64
    /// Byte offset of the up scales `[intermediateSize, hiddenSize / groupSize]`, bfloat16.
    public var upScaleOffset: UInt64

    /// Every slot size is a multiple of this many bytes (16 KiB); canonical regions start on it.
    public static let slotAlignment = UInt64(MLXK_GLM52_EXPERT_SLOT_ALIGNMENT)

    /// A layout from its nine fields, in the C struct's order. Nothing is checked here: call
    /// `validate(bits:groupSize:)`.
    public init(hiddenSize: UInt64, intermediateSize: UInt64, slotBytes: UInt64,
                downWeightOffset: UInt64, gateWeightOffset: UInt64, upWeightOffset: UInt64,
                downScaleOffset: UInt64, gateScaleOffset: UInt64, upScaleOffset: UInt64) {
        self.hiddenSize = hiddenSize
        self.intermediateSize = intermediateSize
        self.slotBytes = slotBytes
        self.downWeightOffset = downWeightOffset
        self.gateWeightOffset = gateWeightOffset
        self.upWeightOffset = upWeightOffset
        self.downScaleOffset = downScaleOffset
        self.gateScaleOffset = gateScaleOffset
        self.upScaleOffset = upScaleOffset
    }

    /// The canonical layout for `hidden` × `intermediate` in format Q`bits` (4 or 8) with
    /// `groupSize` (32, 64 or 128): gate, up, down weights, then gate, up, down scales, each
    /// on a 16 KiB boundary; the slot ends at the next boundary after the down scales.
    /// For GLM-5 (6144 × 2048), Q4 g64 gives a slot of 20054016 bytes.
    /// - Throws: `MLXKError` `.invalidArgument` (bits, group size, dims not positive multiples
    ///   of the group size, a slot beyond 2^53-1 bytes).
    public static func canonical(hidden: UInt64, intermediate: UInt64, bits: Int, groupSize: Int) throws -> GLM52Layout {
        try MLXKern.requireCompatibleLibrary()
        var out = mlxk_glm52_layout()
        try check(mlxk_glm52_layout_canonical(hidden, intermediate, uint32(bits, "bits"),
                                              uint32(groupSize, "group_size"), &out))
        return GLM52Layout(out)
    }

    /// Checks that the decode kernels can read Q`bits` weights with `groupSize` safely from
    /// this layout: fields within 2^53-1, the slot a positive multiple of 16 KiB, each region
    /// 16-byte aligned and inside the slot, no two regions overlapping (they may touch and need
    /// not be in canonical order).
    /// - Throws: `MLXKError` `.invalidArgument` with the first failure, naming the field or
    ///   the regions, e.g. "up scale overlaps down weight".
    public func validate(bits: Int, groupSize: Int) throws {
        try MLXKern.requireCompatibleLibrary()
        var layout = cLayout
        try check(mlxk_glm52_layout_validate(&layout, Self.uint32(bits, "bits"),
                                             Self.uint32(groupSize, "group_size")))
    }

    private init(_ c: mlxk_glm52_layout) {
        self.init(hiddenSize: c.hidden_size, intermediateSize: c.intermediate_size,
                  slotBytes: c.slot_bytes, downWeightOffset: c.down_weight_offset,
                  gateWeightOffset: c.gate_weight_offset, upWeightOffset: c.up_weight_offset,
                  downScaleOffset: c.down_scale_offset, gateScaleOffset: c.gate_scale_offset,
                  upScaleOffset: c.up_scale_offset)
    }

    private var cLayout: mlxk_glm52_layout {
        mlxk_glm52_layout(hidden_size: hiddenSize, intermediate_size: intermediateSize,
                          slot_bytes: slotBytes, down_weight_offset: downWeightOffset,
                          gate_weight_offset: gateWeightOffset, up_weight_offset: upWeightOffset,
                          down_scale_offset: downScaleOffset, gate_scale_offset: gateScaleOffset,
                          up_scale_offset: upScaleOffset)
    }

    /// `value` as the C ABI's uint32; out of range it could only be rejected, so say so here.
    private static func uint32(_ value: Int, _ name: String) throws -> UInt32 {
        guard let converted = UInt32(exactly: value) else {
            throw MLXKError(status: .invalidArgument,
                            message: "GLM52Layout: \(name) is \(value); expected one of the supported values")
        }
        return converted
    }
}
