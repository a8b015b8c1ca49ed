import CMLXKern

/// An MLX array made by libmlxkern: a row-major, contiguous block of elements with a shape
/// and a dtype. The object owns its C handle and frees it when it dies.
///
/// Arrays are immutable. Kernels are lazy: they return at once with arrays whose values are
/// computed on first use (`eval()`, or any read such as `toFloats()`), which is also where an
/// error raised by the computation surfaces.
///
/// Every function may be called from any thread: libmlxkern serializes MLX work internally.
public final class MLXKArray: @unchecked Sendable {
    /// The C handle (`mlxk_array *`), a registry token owned by this object.
    let handle: OpaquePointer

    /// Takes ownership of a handle the library has just handed out.
    init(owning handle: OpaquePointer) {
        self.handle = handle
    }

    /// Adopts the handle a successful call wrote to an out-parameter.
    static func adopt(_ handle: OpaquePointer?, _ function: StaticString) -> MLXKArray {
        guard let handle else { preconditionFailure("\(function) succeeded without a result") }
        return MLXKArray(owning: handle)
    }

    deinit {
        // Fails only for a handle that is not live, which an owned handle always is.
        _ = mlxk_array_free(handle)
    }

    // MARK: Making arrays

    /// An array of `shape` holding `values` (row-major), stored as `dtype`.
    ///
    /// For `.bfloat16` and `.float16` the values are rounded to nearest, ties to even (MLX's
    /// conversion: NaN becomes the canonical quiet NaN); `.float32` keeps them as they are.
    /// - Throws: `MLXKError` `.shape` when `values.count` differs from the product of
    ///   `shape`, `.dtype` for a non-float `dtype`, and whatever `mlxk_array_new` reports.
    public static func floats(_ values: [Float], shape: [Int], dtype: DType = .float32) throws -> MLXKArray {
        try MLXKern.requireCompatibleLibrary()
        switch dtype {
        case .float32:
            return try make(values, shape: shape, dtype: .float32)
        case .bfloat16:
            return try make(values.map(HalfConversion.bfloat16Bits), shape: shape, dtype: .bfloat16)
        case .float16:
            return try make(values.map(HalfConversion.float16Bits), shape: shape, dtype: .float16)
        default:
            throw MLXKError(status: .dtype, message: "MLXKArray.floats: dtype \(dtype) is not a float dtype")
        }
    }

    /// An int32 array of `shape` holding `values` (row-major).
    public static func int32s(_ values: [Int32], shape: [Int]) throws -> MLXKArray {
        try MLXKern.requireCompatibleLibrary()
        return try make(values, shape: shape, dtype: .int32)
    }

    /// A bool array of `shape` holding `values` (row-major), one byte each.
    public static func bools(_ values: [Bool], shape: [Int]) throws -> MLXKArray {
        try MLXKern.requireCompatibleLibrary()
        return try make(values.map { $0 ? UInt8(1) : UInt8(0) }, shape: shape, dtype: .bool)
    }

    /// A `.float16` or `.bfloat16` array of `shape` from raw 16-bit patterns, taken as they are.
    public static func rawBits(_ bits: [UInt16], shape: [Int], dtype: DType) throws -> MLXKArray {
        try MLXKern.requireCompatibleLibrary()
        guard dtype == .float16 || dtype == .bfloat16 else {
            throw MLXKError(status: .dtype,
                            message: "MLXKArray.rawBits: dtype \(dtype) is not float16 or bfloat16")
        }
        return try make(bits, shape: shape, dtype: dtype)
    }

    /// An array of `shape` and `dtype` filled with zeros.
    public static func zeros(shape: [Int], dtype: DType = .float32) throws -> MLXKArray {
        try MLXKern.requireCompatibleLibrary()
        let dims = try cShape(shape, function: "MLXKArray.zeros")
        var out: OpaquePointer?
        try dims.withUnsafeBufferPointer { dims in
            try check(mlxk_array_zeros(dims.baseAddress, dims.count, dtype.rawValue, &out))
        }
        return adopt(out, "mlxk_array_zeros")
    }

    /// Copies `elements` (whose Swift type has `dtype`'s size) into a new array.
    private static func make<Element>(_ elements: [Element], shape: [Int], dtype: DType) throws -> MLXKArray {
        let dims = try cShape(shape, function: "MLXKArray")
        let count = dims.reduce(1) { $0 * Int($1) }
        // mlxk_array_new reads product(shape) elements: never let it read past `elements`.
        guard count == elements.count else {
            throw MLXKError(status: .shape,
                            message: "MLXKArray: \(elements.count) values for shape \(shape) (\(count) elements)")
        }
        var out: OpaquePointer?
        try elements.withUnsafeBytes { bytes in
            try dims.withUnsafeBufferPointer { dims in
                try check(mlxk_array_new(bytes.baseAddress, dims.baseAddress, dims.count, dtype.rawValue, &out))
            }
        }
        return adopt(out, "mlxk_array_new")
    }

    /// `shape` as the C ABI's int32 dimensions.
    private static func cShape(_ shape: [Int], function: String) throws -> [Int32] {
        try shape.map { dim in
            guard let d = Int32(exactly: dim), d >= 0 else {
                throw MLXKError(status: .shape,
                                message: "\(function): dimension \(dim) of shape \(shape) is not in [0, 2^31-1]")
            }
            return d
        }
    }

    // MARK: Describing arrays (never evaluates)

    /// The dimensions, outermost first.
    public var shape: [Int] {
        withExtendedLifetime(self) {
            var ndim = 0
            mustSucceed(mlxk_array_ndim(handle, &ndim), "mlxk_array_ndim")
            var dims = [Int32](repeating: 0, count: ndim)
            dims.withUnsafeMutableBufferPointer { dims in
                mustSucceed(mlxk_array_shape(handle, dims.baseAddress, dims.count), "mlxk_array_shape")
            }
            return dims.map(Int.init)
        }
    }

    /// The element type.
    public var dtype: DType {
        withExtendedLifetime(self) {
            var code: mlxk_dtype = 0
            mustSucceed(mlxk_array_dtype(handle, &code), "mlxk_array_dtype")
            guard let dtype = DType(rawValue: code) else {
                preconditionFailure("mlxk_array_dtype returned the unknown dtype code \(code)")
            }
            return dtype
        }
    }

    /// The size of the data in bytes (elements times the dtype's size).
    public var nbytes: Int {
        withExtendedLifetime(self) {
            var bytes = 0
            mustSucceed(mlxk_array_nbytes(handle, &bytes), "mlxk_array_nbytes")
            return bytes
        }
    }

    /// The number of elements.
    public var count: Int { shape.reduce(1, *) }

    // MARK: Computing and reading

    /// Computes the array now. Errors raised by the computation, of this array or of the
    /// kernels it depends on, are thrown here.
    public func eval() throws {
        try withExtendedLifetime(self) { try check(mlxk_array_eval(handle)) }
    }

    /// A lazy copy converted to `dtype` (MLX's rules: round to nearest even; float to integer
    /// truncates).
    public func asType(_ dtype: DType) throws -> MLXKArray {
        var out: OpaquePointer?
        try withExtendedLifetime(self) { try check(mlxk_array_astype(handle, dtype.rawValue, &out)) }
        return MLXKArray.adopt(out, "mlxk_array_astype")
    }

    /// Evaluates the array and returns its elements, row-major, converted to `Float`
    /// (exactly for every dtype but int32/uint32 values beyond 2^24).
    public func toFloats() throws -> [Float] {
        switch dtype {
        case .float32: return try read(Float.self)
        case .bfloat16: return try read(UInt16.self).map(HalfConversion.float(bfloat16Bits:))
        case .float16: return try read(UInt16.self).map(HalfConversion.float(float16Bits:))
        case .bool, .uint8: return try read(UInt8.self).map(Float.init)
        case .int8: return try read(Int8.self).map(Float.init)
        case .int32: return try read(Int32.self).map(Float.init)
        case .uint32: return try read(UInt32.self).map(Float.init)
        }
    }

    /// Evaluates a `.float16` or `.bfloat16` array and returns its raw 16-bit patterns.
    public func toUInt16Bits() throws -> [UInt16] {
        guard dtype == .float16 || dtype == .bfloat16 else {
            throw MLXKError(status: .dtype,
                            message: "MLXKArray.toUInt16Bits: dtype \(dtype) is not float16 or bfloat16")
        }
        return try read(UInt16.self)
    }

    /// Evaluates an `.int32` array and returns its elements.
    public func toInt32s() throws -> [Int32] {
        guard dtype == .int32 else {
            throw MLXKError(status: .dtype, message: "MLXKArray.toInt32s: dtype \(dtype) is not int32")
        }
        return try read(Int32.self)
    }

    /// Evaluates a `.bool` array and returns its elements.
    public func toBools() throws -> [Bool] {
        guard dtype == .bool else {
            throw MLXKError(status: .dtype, message: "MLXKArray.toBools: dtype \(dtype) is not bool")
        }
        return try read(UInt8.self).map { $0 != 0 }
    }

    /// Evaluates and copies the elements as `Element` (which must have the dtype's size).
    private func read<Element>(_: Element.Type) throws -> [Element] {
        try withExtendedLifetime(self) {
            let bytes = nbytes
            precondition(bytes % MemoryLayout<Element>.stride == 0, "element size mismatch")
            let count = bytes / MemoryLayout<Element>.stride
            return try [Element](unsafeUninitializedCapacity: count) { buffer, initialized in
                try check(mlxk_array_read(handle, UnsafeMutableRawPointer(buffer.baseAddress), bytes))
                initialized = count
            }
        }
    }
}

extension MLXKArray: CustomStringConvertible {
    /// "MLXKArray(bfloat16, [2, 3, 4])": never evaluates.
    public var description: String { "MLXKArray(\(dtype), \(shape))" }
}
