import CMLXKern

/// The library as a whole: versions, the device kernels run on, memory limits. The kernels
/// themselves are static functions here too (`MLXKern.gatedDeltaUpdate(...)`).
public enum MLXKern {
    /// The loaded library's version, e.g. "0.1.0".
    public static var version: String { String(cString: mlxk_version()) }

    /// The version of the header this package was compiled against (`MLXK_VERSION`).
    public static let headerVersion: String = MLXK_VERSION

    /// The C ABI version of the loaded library (`mlxk_abi_version()`).
    public static var abiVersion: UInt32 { mlxk_abi_version() }

    /// The C ABI version this package was compiled against (`MLXK_ABI_VERSION` of the header).
    public static let headerABIVersion = UInt32(MLXK_ABI_VERSION)

    /// Whether the loaded library speaks the C ABI this package was compiled against; checked
    /// once, before the first array or layout is made.
    private static let abiMismatch: MLXKError? = {
        let loaded = mlxk_abi_version()
        guard loaded != UInt32(MLXK_ABI_VERSION) else { return nil }
        return MLXKError(
            status: .unsupported,
            message: "libmlxkern \(String(cString: mlxk_version())) has C ABI version \(loaded), "
                + "but this package was compiled against ABI version \(MLXK_ABI_VERSION) "
                + "(header \(MLXK_VERSION)): rebuild one of them")
    }()

    /// Throws when the loaded library's ABI version differs from the header's.
    public static func requireCompatibleLibrary() throws {
        if let abiMismatch { throw abiMismatch }
    }

    /// The GPU backend of the loaded MLX (`.none` on Linux's CPU-only MLX).
    public static var gpuBackend: GPUBackend {
        GPUBackend(rawValue: mlxk_gpu_backend()) ?? .none
    }

    /// Sets the device later kernel calls run on, for the whole process. Arrays already built
    /// keep theirs.
    /// - Throws: `MLXKError` `.unsupported` for `.gpu` without a Metal GPU; the default device
    ///   then stays as it was.
    public static func setDefaultDevice(_ device: Device) throws {
        try check(mlxk_set_default_device(device.rawValue))
    }

    /// The most bytes one call may produce; larger requests throw `.outOfMemory` before
    /// anything is built or allocated. Setting 0 restores the default, the machine's memory.
    public static var memoryLimit: Int {
        get {
            var bytes = 0
            mustSucceed(mlxk_get_memory_limit(&bytes), "mlxk_get_memory_limit")
            return bytes
        }
        set {
            mustSucceed(mlxk_set_memory_limit(max(newValue, 0)), "mlxk_set_memory_limit")
        }
    }

    /// Sets how many bytes of freed buffers MLX keeps cached for reuse.
    public static func setCacheLimit(_ bytes: Int) throws {
        try check(mlxk_set_cache_limit(max(bytes, 0)))
    }
}
