import Cmlx
import MLX
@_exported import MLXKern

// mlxkern's arrays and mlx-swift's, one MLX: `MLXKArray(sharing:)` takes an `MLXArray` into the
// kernels and `mlxArray` hands a kernel's result back, both without a copy. An `MLXArray`
// holds an mlx-c `mlx_array` (`ctx`), whose own `ctx` is the address of the
// `mlx::core::array`: the currency of the C ABI's mlxk_array_from_mlx / mlxk_array_to_mlx.

extension MLXKArray {
    /// An array sharing `array` (no copy: the same buffer, or, for an unevaluated `MLXArray`,
    /// the same lazy node, which the kernels take as an input; views such as transposes and
    /// broadcasts are accepted). `array` stays the caller's; the data lives while either holds
    /// it.
    /// - Throws: `MLXKError` `.unsupported` when the process holds another MLX besides the one
    ///   libmlxkern runs on (the bundled libmlxkern with its own libmlx beside mlx-swift's: the
    ///   message names both), `.dtype` for dtypes without a `DType` (float64, int64, ...).
    public convenience init(sharing array: MLXArray) throws {
        try self.init(sharingMLXArray: UnsafeRawPointer(array.ctx.ctx))
        withExtendedLifetime(array) {}  // alive until the handle holds the array too
    }

    /// This array as an `MLXArray` (no copy: a kernel's unevaluated result stays lazy, and
    /// evaluating the `MLXArray`, alone or with others in one `eval`, computes it).
    /// - Throws: `MLXKError` `.unsupported` as `init(sharing:)`.
    public var mlxArray: MLXArray {
        get throws {
            let pointer = try sharedMLXArray()
            return MLXArray(mlx_array(ctx: pointer))  // MLXArray frees it when it dies
        }
    }
}

extension MLXArray {
    /// This array for mlxkern's kernels, without a copy (`MLXKArray(sharing: self)`).
    public func mlxk() throws -> MLXKArray { try MLXKArray(sharing: self) }
}

extension MLXKern {
    /// The version of the MLX mlx-swift compiled into this program (mlx-c's `mlx_version`):
    /// with the static libmlxkern of this package, also the MLX the kernels run on
    /// (`MLXKern.mlxVersion`).
    public static var mlxSwiftMLXVersion: String {
        var string = mlx_string_new()
        defer { mlx_string_free(string) }
        guard mlx_version(&string) == 0, let text = mlx_string_data(string) else { return "" }
        return String(cString: text)
    }
}
