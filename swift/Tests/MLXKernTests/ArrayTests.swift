import CMLXKern
import XCTest
import MLXKern

/// Arrays, dtypes, versions: the wrapper's own surface.
final class ArrayTests: XCTestCase {
    func testVersionsMatchTheHeader() throws {
        XCTAssertEqual(MLXKern.version, MLXK_VERSION)
        XCTAssertEqual(MLXKern.headerVersion, MLXK_VERSION)
        XCTAssertEqual(MLXKern.abiVersion, UInt32(MLXK_ABI_VERSION))
        XCTAssertEqual(MLXKern.headerABIVersion, MLXKern.abiVersion)
        XCTAssertNoThrow(try MLXKern.requireCompatibleLibrary())
    }

    func testCodesMatchTheHeader() {
        let dtypes: [(DType, Int32)] = [
            (.bool, MLXK_DTYPE_BOOL), (.uint8, MLXK_DTYPE_UINT8), (.int8, MLXK_DTYPE_INT8),
            (.int32, MLXK_DTYPE_INT32), (.uint32, MLXK_DTYPE_UINT32), (.float16, MLXK_DTYPE_FLOAT16),
            (.bfloat16, MLXK_DTYPE_BFLOAT16), (.float32, MLXK_DTYPE_FLOAT32),
        ]
        for (dtype, code) in dtypes { XCTAssertEqual(dtype.rawValue, code, "\(dtype)") }
        XCTAssertEqual(DType.allCases.count, dtypes.count)
        XCTAssertEqual(Device.cpu.rawValue, MLXK_DEVICE_CPU)
        XCTAssertEqual(Device.gpu.rawValue, MLXK_DEVICE_GPU)
        XCTAssertEqual(GPUBackend.none.rawValue, MLXK_GPU_NONE)
        XCTAssertEqual(GPUBackend.metal.rawValue, MLXK_GPU_METAL)
        XCTAssertEqual(GPUBackend.cuda.rawValue, MLXK_GPU_CUDA)
        // The contract's numbers (docs/DESIGN.md §5), and the library's names for them.
        let statuses: [(MLXKError.Status, Int32, String)] = [
            (.nullPointer, 1, "MLXK_ERR_NULL_POINTER"), (.invalidArgument, 2, "MLXK_ERR_INVALID_ARGUMENT"),
            (.shape, 3, "MLXK_ERR_SHAPE"), (.dtype, 4, "MLXK_ERR_DTYPE"),
            (.unsupported, 5, "MLXK_ERR_UNSUPPORTED"), (.backend, 6, "MLXK_ERR_BACKEND"),
            (.outOfMemory, 7, "MLXK_ERR_OUT_OF_MEMORY"), (.bufferTooSmall, 8, "MLXK_ERR_BUFFER_TOO_SMALL"),
            (.panic, 9, "MLXK_ERR_PANIC"), (.invalidHandle, 10, "MLXK_ERR_INVALID_HANDLE"),
        ]
        for (status, code, name) in statuses {
            XCTAssertEqual(status.rawValue, code)
            XCTAssertEqual(status.name, name)
        }
        XCTAssertEqual(MLXKError.Status(rawValue: 0).name, "MLXK_OK")
        XCTAssertEqual(MLXKError.Status(rawValue: 4242).name, "MLXK_UNKNOWN_STATUS")
    }

    func testFloat32RoundTripAndDescription() throws {
        var rng = SeededGenerator()
        let values = rng.normals(24)
        let array = try MLXKArray.floats(values, shape: [2, 3, 4])
        XCTAssertEqual(array.shape, [2, 3, 4])
        XCTAssertEqual(array.dtype, .float32)
        XCTAssertEqual(array.nbytes, 96)
        XCTAssertEqual(array.count, 24)
        XCTAssertEqual(array.description, "MLXKArray(float32, [2, 3, 4])")
        try array.eval()
        XCTAssertEqual(try array.toFloats(), values)
    }

    func testScalarAndEmptyArrays() throws {
        let scalar = try MLXKArray.floats([2.5], shape: [])
        XCTAssertEqual(scalar.shape, [])
        XCTAssertEqual(try scalar.toFloats(), [2.5])
        let empty = try MLXKArray.floats([], shape: [0, 3], dtype: .bfloat16)
        XCTAssertEqual(empty.shape, [0, 3])
        XCTAssertEqual(empty.nbytes, 0)
        XCTAssertEqual(try empty.toFloats(), [])
    }

    func testIntegerBoolAndRawBitRoundTrips() throws {
        let ints: [Int32] = [0, -1, 7, .max, .min, 123_456]
        let intArray = try MLXKArray.int32s(ints, shape: [3, 2])
        XCTAssertEqual(intArray.dtype, .int32)
        XCTAssertEqual(try intArray.toInt32s(), ints)

        let bools = [true, false, false, true, true]
        let boolArray = try MLXKArray.bools(bools, shape: [5])
        XCTAssertEqual(boolArray.dtype, .bool)
        XCTAssertEqual(boolArray.nbytes, 5)
        XCTAssertEqual(try boolArray.toBools(), bools)
        XCTAssertEqual(try boolArray.toFloats(), [1, 0, 0, 1, 1])

        let bits: [UInt16] = [0x3F80, 0xBF80, 0x7F80, 0x0001, 0x8000]  // 1, -1, inf, tiny, -0
        let raw = try MLXKArray.rawBits(bits, shape: [5], dtype: .bfloat16)
        XCTAssertEqual(try raw.toUInt16Bits(), bits)
        XCTAssertEqual(try raw.toFloats().map(\.bitPattern),
                       [Float(1), -1, .infinity, Float(bitPattern: 0x0001_0000), -0.0].map(\.bitPattern))
        let half = try MLXKArray.rawBits([0x3C00, 0xC000, 0x0001, 0x7BFF], shape: [4], dtype: .float16)
        XCTAssertEqual(try half.toFloats(), [1, -2, 0x1p-24, 65504])
    }

    /// The host-side rounding of `floats(_:shape:dtype:)` agrees bit for bit with MLX's own
    /// conversion (`asType`), on random values and on the edges: ties, subnormals, overflow.
    func testHostRoundingMatchesMLXConversion() throws {
        var rng = SeededGenerator()
        var values = rng.normals(2000, scale: 3) + rng.normals(200, scale: 1e-5)
            + rng.normals(200, scale: 3e4)
        let edges: [Float] = [0, -0.0, 1, -1, .infinity, -.infinity, .greatestFiniteMagnitude,
                              .leastNonzeroMagnitude, 1 + 0x1p-8, 1 + 3 * 0x1p-8, 1 + 0x1p-9,
                              1 + 0x1p-11, 1 + 3 * 0x1p-11, 65504, 65519.99, 65520, 0x1p-14,
                              0x1p-24, 0x1p-25, 0x1.8p-25, 3 * 0x1p-26, 0x1.ff8p-15,
                              -0x1p-26]
        values += edges
        let source = try MLXKArray.floats(values, shape: [values.count])
        for dtype in [DType.bfloat16, .float16] {
            let mine = try MLXKArray.floats(values, shape: [values.count], dtype: dtype)
            let theirs = try source.asType(dtype)
            XCTAssertEqual(theirs.dtype, dtype)
            let (a, b) = (try mine.toUInt16Bits(), try theirs.toUInt16Bits())
            for i in values.indices where a[i] != b[i] {
                XCTFail("\(dtype) of \(values[i]): host 0x\(String(a[i], radix: 16)), MLX 0x\(String(b[i], radix: 16))")
            }
            // Reading back converts exactly: float32 -> dtype -> float32 is MLX's round trip.
            let back = try theirs.asType(.float32).toFloats()
            XCTAssertEqual(try mine.toFloats().map(\.bitPattern), back.map(\.bitPattern), "\(dtype)")
        }
        // NaN: MLX's bfloat16 NaN is 0x7FC0 whatever the sign and payload.
        let nans = try MLXKArray.floats([.nan, -.nan, Float(bitPattern: 0x7F80_0001)], shape: [3], dtype: .bfloat16)
        XCTAssertEqual(try nans.toUInt16Bits(), [0x7FC0, 0x7FC0, 0x7FC0])
        XCTAssertEqual(try source.asType(.bfloat16).toUInt16Bits().count, values.count)
        let f16NaN = try MLXKArray.floats([.nan], shape: [1], dtype: .float16)
        XCTAssertTrue(try f16NaN.toFloats()[0].isNaN)
    }

    func testZerosAndAsType() throws {
        let zeros = try MLXKArray.zeros(shape: [2, 2, 3], dtype: .bfloat16)
        XCTAssertEqual(zeros.dtype, .bfloat16)
        XCTAssertEqual(zeros.nbytes, 24)
        XCTAssertEqual(try zeros.toFloats(), [Float](repeating: 0, count: 12))
        let ints = try MLXKArray.floats([1.9, -1.9, 3], shape: [3]).asType(.int32)
        XCTAssertEqual(try ints.toInt32s(), [1, -1, 3])  // float to integer truncates
    }

    func testWrapperChecksBeforeCallingTheLibrary() {
        assertMLXKError(.shape, mentioning: "5 values for shape [2, 3]") {
            try MLXKArray.floats([1, 2, 3, 4, 5], shape: [2, 3])
        }
        assertMLXKError(.shape, mentioning: "dimension -2") {
            try MLXKArray.floats([], shape: [-2, 0])
        }
        assertMLXKError(.dtype, mentioning: "not a float dtype") {
            try MLXKArray.floats([1], shape: [1], dtype: .int32)
        }
        assertMLXKError(.dtype, mentioning: "not float16 or bfloat16") {
            try MLXKArray.rawBits([1], shape: [1], dtype: .float32)
        }
        assertMLXKError(.dtype, mentioning: "not float16 or bfloat16") {
            try MLXKArray.floats([1], shape: [1]).toUInt16Bits()
        }
    }

    func testLibraryRejectsTooManyDimensions() {
        assertMLXKError(.shape, mentioning: "ndim") {
            try MLXKArray.zeros(shape: [Int](repeating: 1, count: Int(MLXK_MAX_NDIM) + 1))
        }
    }

    func testMemoryLimitRefusesLargeRequests() throws {
        let before = MLXKern.memoryLimit
        XCTAssertGreaterThan(before, 0)
        defer { MLXKern.memoryLimit = 0 }
        MLXKern.memoryLimit = 1 << 20
        XCTAssertEqual(MLXKern.memoryLimit, 1 << 20)
        assertMLXKError(.outOfMemory, mentioning: "above the memory limit") {
            try MLXKArray.zeros(shape: [1024, 1024], dtype: .float32)  // 4 MiB
        }
        XCTAssertNoThrow(try MLXKArray.zeros(shape: [256, 256], dtype: .float32).eval())
        MLXKern.memoryLimit = 0
        XCTAssertEqual(MLXKern.memoryLimit, before)
        XCTAssertNoThrow(try MLXKern.setCacheLimit(64 << 20))
    }

    func testArraysAreUsableFromManyThreads() throws {
        let source = try MLXKArray.floats((0..<256).map(Float.init), shape: [16, 16])
        DispatchQueue.concurrentPerform(iterations: 8) { i in
            let values = try? source.asType(i % 2 == 0 ? .bfloat16 : .float16).toFloats()
            XCTAssertEqual(values?.count, 256)
            XCTAssertEqual(values?[255], 255)
        }
    }
}
