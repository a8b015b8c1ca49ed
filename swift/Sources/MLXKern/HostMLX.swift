import CMLXKern

// Arrays shared with the host's MLX, without a copy. The currency is the address of an
// `mlx::core::array`: what an mlx-c `mlx_array` keeps in its `ctx` (mlx-swift's `MLXArray`
// holds such an `mlx_array` in its `ctx` property). Only with the one libmlx this library was
// built against, loaded once in the process: see docs/hosts/swift.md, "One MLX in an mlx-swift app".

extension MLXKArray {
    /// An array sharing the host's MLX array at `mlxArray`: the address of an
    /// `mlx::core::array`, i.e. the `ctx` of an mlx-c `mlx_array` (with mlx-swift:
    /// `MLXKArray(sharingMLXArray: x.ctx.ctx)`). Nothing is copied: both are the same MLX array
    /// (same buffer; an unevaluated host array stays lazy and becomes an input of the kernels).
    /// Views (transposed, broadcast, sliced) are accepted.
    ///
    /// The host keeps its array and frees it as usual; the data lives while either side holds
    /// it. An address that is not an `mlx::core::array` cannot be detected (undefined
    /// behaviour, as with any raw pointer).
    /// - Throws: `MLXKError` `.nullPointer` for nil; `.unsupported` when the loaded libmlx is
    ///   not the one this library was built against, or a second libmlx file is loaded (the
    ///   message names the versions or both files; an MLX compiled into the app binary counts
    ///   too, found on Linux through its symbol table unless stripped: see docs/hosts/swift.md); `.dtype` for dtypes without a `DType` (float64, int64, ...); `.shape`
    ///   past `MLXK_MAX_NDIM` dimensions.
    public convenience init(sharingMLXArray mlxArray: UnsafeRawPointer?) throws {
        try MLXKern.requireCompatibleLibrary()
        var out: OpaquePointer?
        try check(mlxk_array_from_mlx(mlxArray, &out))
        guard let out else { preconditionFailure("mlxk_array_from_mlx succeeded without a result") }
        self.init(owning: out)
    }

    /// A new host MLX array sharing this one: the address of a heap `mlx::core::array` (no
    /// copy; a kernel's unevaluated result stays lazy and the host's evaluation computes it).
    ///
    /// The pointer is the caller's: release it exactly once, with
    /// `MLXKArray.freeMLXArray(_:)`, or by wrapping it as an mlx-c `mlx_array(ctx: pointer)`
    /// that is freed with `mlx_array_free` (with mlx-swift, `MLXArray(mlx_array(ctx: pointer))`
    /// takes it over and frees it when it dies).
    /// - Throws: `MLXKError` `.unsupported` as `init(sharingMLXArray:)`.
    public func sharedMLXArray() throws -> UnsafeMutableRawPointer {
        var out: UnsafeMutableRawPointer?
        try withExtendedLifetime(self) { try check(mlxk_array_to_mlx(handle, &out)) }
        guard let out else { preconditionFailure("mlxk_array_to_mlx succeeded without a result") }
        return out
    }

    /// Deletes a host array made by `sharedMLXArray()` (once; nil does nothing).
    public static func freeMLXArray(_ mlxArray: UnsafeMutableRawPointer?) {
        // Fails only for a pointer that is not such an array, which is undefined behaviour
        // the library cannot detect: no status to report.
        _ = mlxk_mlx_array_free(mlxArray)
    }
}

extension MLXKern {
    /// The version of the libmlx loaded in this process, e.g. "0.32.4": the only MLX that
    /// arrays can be shared with (`MLXKArray(sharingMLXArray:)`, `sharedMLXArray()`).
    public static var mlxVersion: String { String(cString: mlxk_mlx_version()) }

    /// Runs `body` holding the lock under which this library builds and evaluates MLX graphs,
    /// on the calling thread; returns its result. MLX is not safe for graph building on several
    /// threads at once: an app that also uses MLX itself (mlx-swift, mlx-c) on other threads
    /// wraps that work in this, so it never overlaps this library's. Calls into this library
    /// inside `body` run under the same lock (it nests). An app that uses MLX on one thread
    /// only needs none of this.
    public static func withMLXLock<T>(_ body: () throws -> T) rethrows -> T {
        mustSucceed(mlxk_mlx_lock(), "mlxk_mlx_lock")
        defer { mustSucceed(mlxk_mlx_unlock(), "mlxk_mlx_unlock") }
        return try body()
    }
}
