import CMLXKern

/// An error reported by libmlxkern (or by this wrapper, before a call reaches it).
///
/// `status` is the C ABI's status code; `statusName` its C name ("MLXK_ERR_SHAPE");
/// `message` the library's explanation, which names the function and the argument at fault,
/// e.g. "mlxk_gated_delta_update: k: dimension 1 (T) is 3, expected 4 (T of q); shape [...]".
public struct MLXKError: Error, Hashable, Sendable, CustomStringConvertible {
    /// A status code of the C ABI. Codes are stable and never reused; a newer library may
    /// return one this wrapper has no name for, so this is a struct, not an enum.
    public struct Status: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        /// A required pointer was NULL (the wrapper never passes one; seen only on misuse).
        public static let nullPointer = Status(rawValue: MLXK_ERR_NULL_POINTER)
        /// A value outside what the function accepts (a length, a mask byte, eps, ...).
        public static let invalidArgument = Status(rawValue: MLXK_ERR_INVALID_ARGUMENT)
        /// An array has the wrong rank or a dimension that does not match.
        public static let shape = Status(rawValue: MLXK_ERR_SHAPE)
        /// An array has a dtype the function does not accept.
        public static let dtype = Status(rawValue: MLXK_ERR_DTYPE)
        /// Valid, but this build or machine cannot run it (e.g. no GPU backend).
        public static let unsupported = Status(rawValue: MLXK_ERR_UNSUPPORTED)
        /// MLX raised an error while building or evaluating a graph.
        public static let backend = Status(rawValue: MLXK_ERR_BACKEND)
        /// The request would exceed the memory limit; nothing was allocated.
        public static let outOfMemory = Status(rawValue: MLXK_ERR_OUT_OF_MEMORY)
        /// A buffer is smaller than the data to be written into it.
        public static let bufferTooSmall = Status(rawValue: MLXK_ERR_BUFFER_TOO_SMALL)
        /// An internal panic was caught at the library's boundary; the process is intact.
        public static let panic = Status(rawValue: MLXK_ERR_PANIC)
        /// A handle that is not a live array.
        public static let invalidHandle = Status(rawValue: MLXK_ERR_INVALID_HANDLE)

        /// The C name of the code, as `mlxk_status_name` spells it.
        public var name: String { String(cString: mlxk_status_name(rawValue)) }
        public var description: String { name }
    }

    /// What went wrong, as a C ABI status code.
    public let status: Status
    /// The C name of `status`, e.g. "MLXK_ERR_SHAPE".
    public let statusName: String
    /// The library's message: the function, the argument at fault and what was expected.
    public let message: String

    /// An error with the given status; the name comes from the library.
    public init(status: Status, message: String) {
        self.status = status
        self.statusName = status.name
        self.message = message
    }

    public var description: String { "\(statusName): \(message)" }
}

/// Turns the status of the C call just made into a Swift error.
///
/// Call it directly on the value a C function returned, on the same thread and before any
/// other mlxk_ call: mlxk_last_error() is per thread and overwritten by the next failure.
@inline(__always)
func check(_ status: mlxk_status) throws {
    guard status != MLXK_OK else { return }
    throw MLXKError(status: MLXKError.Status(rawValue: status),
                    message: String(cString: mlxk_last_error()))
}

/// For calls that cannot fail on a live handle the wrapper owns (shape, dtype, ...): a failure
/// there is a bug in this wrapper or the library, not a condition a caller can handle.
@inline(__always)
func mustSucceed(_ status: mlxk_status, _ function: StaticString) {
    guard status != MLXK_OK else { return }
    let message = String(cString: mlxk_last_error())
    preconditionFailure("\(function) failed on a live handle: \(message)")
}
