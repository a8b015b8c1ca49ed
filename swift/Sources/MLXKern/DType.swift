import CMLXKern

/// The element type of an array. Raw values are the C ABI's `mlxk_dtype` codes.
public enum DType: Int32, CaseIterable, Sendable {
    /// One byte holding 0 or 1.
    case bool = 0
    case uint8 = 1
    case int8 = 2
    case int32 = 3
    case uint32 = 4
    /// IEEE binary16.
    case float16 = 5
    /// bfloat16: the upper half of an IEEE binary32.
    case bfloat16 = 6
    case float32 = 7

    /// Bytes per element.
    public var size: Int {
        switch self {
        case .bool, .uint8, .int8: return 1
        case .float16, .bfloat16: return 2
        case .int32, .uint32, .float32: return 4
        }
    }

    /// True for float16, bfloat16 and float32.
    public var isFloatingPoint: Bool {
        self == .float16 || self == .bfloat16 || self == .float32
    }
}

/// Where kernels run. Raw values are the C ABI's `mlxk_device` codes.
public enum Device: Int32, Sendable {
    case cpu = 0
    /// Apple's GPU through Metal. Not available in Linux builds of MLX.
    case gpu = 1
}

/// The GPU backend of the loaded MLX. Raw values are the C ABI's `mlxk_gpu_backend_kind`.
public enum GPUBackend: Int32, Sendable {
    case none = 0
    case metal = 1
    case cuda = 2
}

// MARK: - float16 and bfloat16 on the host

/// Host-side conversions with MLX's rules (round to nearest, ties to even), so an array made
/// from `[Float]` holds the same bits as `asType(.bfloat16)` of a float32 array would.
/// Written on bit patterns: Swift's `Float16` is missing on Intel Macs.
enum HalfConversion {
    /// float32 -> bfloat16 bits. NaN becomes 0x7FC0 whatever its sign and payload, as in MLX.
    static func bfloat16Bits(_ x: Float) -> UInt16 {
        if x.isNaN { return 0x7FC0 }
        let bits = x.bitPattern
        return UInt16(truncatingIfNeeded: (bits &+ 0x7FFF &+ ((bits >> 16) & 1)) >> 16)
    }

    /// bfloat16 bits -> float32 (exact).
    static func float(bfloat16Bits bits: UInt16) -> Float {
        Float(bitPattern: UInt32(bits) << 16)
    }

    /// float32 -> IEEE binary16 bits, overflow to infinity, subnormals rounded to even.
    static func float16Bits(_ x: Float) -> UInt16 {
        let bits = x.bitPattern
        let sign = UInt16(truncatingIfNeeded: (bits >> 16) & 0x8000)
        let exponent = Int((bits >> 23) & 0xFF)
        let mantissa = bits & 0x7F_FFFF
        if exponent == 0xFF {  // infinity or NaN (kept quiet, top payload bits kept)
            return sign | 0x7C00 | (mantissa == 0 ? 0 : 0x200 | UInt16(truncatingIfNeeded: mantissa >> 13))
        }
        let halfExponent = exponent - 127 + 15
        if halfExponent <= 0 {  // a binary16 subnormal, or zero
            if halfExponent < -10 { return sign }  // below half of the smallest subnormal
            let significand = mantissa | 0x80_0000
            let shift = UInt32(14 - halfExponent)
            var half = significand >> shift
            let rest = significand & ((1 << shift) - 1)
            let halfway = UInt32(1) << (shift - 1)
            if rest > halfway || (rest == halfway && half & 1 == 1) { half += 1 }
            return sign | UInt16(truncatingIfNeeded: half)
        }
        var half = UInt32(halfExponent) << 10 | mantissa >> 13
        let rest = mantissa & 0x1FFF
        if rest > 0x1000 || (rest == 0x1000 && half & 1 == 1) { half += 1 }  // may carry into the exponent
        if half >= 0x7C00 { return sign | 0x7C00 }
        return sign | UInt16(truncatingIfNeeded: half)
    }

    /// IEEE binary16 bits -> float32 (exact).
    static func float(float16Bits bits: UInt16) -> Float {
        let sign: Float = bits & 0x8000 == 0 ? 1 : -1
        let exponent = Int((bits >> 10) & 0x1F)
        let mantissa = UInt32(bits & 0x3FF)
        switch exponent {
        case 0:
            return sign * Float(mantissa) * 0x1p-24
        case 0x1F:
            if mantissa == 0 { return sign * .infinity }
            return Float(bitPattern: UInt32(bits & 0x8000) << 16 | 0x7FC0_0000 | mantissa << 13)
        default:
            return Float(bitPattern: UInt32(bits & 0x8000) << 16
                | UInt32(exponent - 15 + 127) << 23 | mantissa << 13)
        }
    }
}
