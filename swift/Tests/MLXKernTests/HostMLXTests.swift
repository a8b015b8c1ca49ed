import CMLXKern
import Foundation
#if canImport(Glibc)
import Glibc
#endif
import XCTest
import MLXKern

// Arrays shared with a host's MLX: `MLXKArray(sharingMLXArray:)`, `sharedMLXArray()`,
// `freeMLXArray(_:)`, `MLXKern.mlxVersion` and `withMLXLock`. The host is a real mlx-c (MLX's
// C API) loaded into the test process with dlopen: MLXKERN_TEST_MLXC names its shared library
// (scripts/test/swift.sh builds it from ../shared/vendor/mlx-c; without it the tests that need
// it are skipped, with the reason). mlx-c makes the inputs, the kernels run on them without a
// copy, mlx-c evaluates and reads the results, and the same kernels on copies must give the
// same bits.

/// The few mlx-c functions the tests call, through function pointers. mlx-c's `mlx_array`,
/// `mlx_stream` and `mlx_string` are structs of one pointer, `{ void *ctx; }`, passed and
/// returned by value exactly as that pointer in the x86-64 and arm64 C ABIs, so the pointer
/// types stand for them here and a value is the ctx.
final class MLXC {
    typealias Ctx = UnsafeMutableRawPointer
    let newData: @convention(c) (UnsafeRawPointer?, UnsafePointer<Int32>?, Int32, Int32) -> Ctx?
    let arrayFree: @convention(c) (Ctx?) -> Int32
    let eval: @convention(c) (Ctx?) -> Int32
    let ndim: @convention(c) (Ctx?) -> Int
    let dim: @convention(c) (Ctx?, Int32) -> Int32
    let dtype: @convention(c) (Ctx?) -> Int32
    let nbytes: @convention(c) (Ctx?) -> Int
    let dataFloat32: @convention(c) (Ctx?) -> UnsafeRawPointer?
    let dataUInt16: @convention(c) (Ctx?) -> UnsafeRawPointer?
    let addOp: @convention(c) (UnsafeMutablePointer<Ctx?>?, Ctx?, Ctx?, Ctx?) -> Int32
    let transposeOp: @convention(c) (UnsafeMutablePointer<Ctx?>?, Ctx?, Ctx?) -> Int32
    let versionOf: @convention(c) (UnsafeMutablePointer<Ctx?>?) -> Int32
    let stringData: @convention(c) (Ctx?) -> UnsafePointer<CChar>?
    let stringFree: @convention(c) (Ctx?) -> Int32
    let cpu: Ctx?

    // mlx-c's dtype codes (mlx/c/array.h, enum mlx_dtype_).
    static let float32: Int32 = 10
    static let float64: Int32 = 11
    static let bfloat16: Int32 = 12

    /// The mlx-c of MLXKERN_TEST_MLXC, or a skip saying why there is none.
    static let shared: Result<MLXC, XCTSkip> = {
        guard let path = ProcessInfo.processInfo.environment["MLXKERN_TEST_MLXC"], !path.isEmpty else {
            let reason = "MLXKERN_TEST_MLXC is not set (scripts/test/swift.sh sets it to an mlx-c "
                + "built from ../shared/vendor/mlx-c)"
            print("HostMLXTests: SKIP the tests with mlx-c: \(reason)")
            return .failure(XCTSkip(reason))
        }
        guard let library = dlopen(path, RTLD_NOW) else {
            // Set but unloadable: a broken setup, not a reason to skip.
            fatalError("dlopen(\(path)): \(String(cString: dlerror()))")
        }
        return .success(MLXC(library))
    }()

    private init(_ library: UnsafeMutableRawPointer) {
        func symbol<T>(_ name: String, _: T.Type = T.self) -> T {
            guard let address = dlsym(library, name) else { fatalError("mlx-c has no \(name)") }
            return unsafeBitCast(address, to: T.self)
        }
        newData = symbol("mlx_array_new_data")
        arrayFree = symbol("mlx_array_free")
        eval = symbol("mlx_array_eval")
        ndim = symbol("mlx_array_ndim")
        dim = symbol("mlx_array_dim")
        dtype = symbol("mlx_array_dtype")
        nbytes = symbol("mlx_array_nbytes")
        dataFloat32 = symbol("mlx_array_data_float32")
        dataUInt16 = symbol("mlx_array_data_uint16")
        addOp = symbol("mlx_add")
        transposeOp = symbol("mlx_transpose")
        versionOf = symbol("mlx_version")
        stringData = symbol("mlx_string_data")
        stringFree = symbol("mlx_string_free")
        let defaultCPUStream: @convention(c) () -> Ctx? = symbol("mlx_default_cpu_stream_new")
        cpu = defaultCPUStream()
    }

    func mlxVersion() -> String {
        var string: Ctx?
        precondition(versionOf(&string) == 0)
        defer { _ = stringFree(string) }
        return String(cString: stringData(string)!)
    }

    /// A new mlx-c array holding a copy of `elements` (Float for float32, UInt16 bits for
    /// bfloat16, Double for float64).
    func array<Element>(_ elements: [Element], shape: [Int], dtype: Int32) -> Ctx {
        let dims = shape.map { Int32($0) }
        let ctx = elements.withUnsafeBytes { bytes in
            dims.withUnsafeBufferPointer { newData(bytes.baseAddress, $0.baseAddress, Int32(dims.count), dtype) }
        }
        return ctx!
    }

    private func op(_ call: (UnsafeMutablePointer<Ctx?>) -> Int32) -> Ctx {
        var result: Ctx?
        precondition(call(&result) == 0, "an mlx-c op failed")
        return result!
    }

    func add(_ a: Ctx, _ b: Ctx) -> Ctx { op { addOp($0, a, b, cpu) } }
    func transpose(_ a: Ctx) -> Ctx { op { transposeOp($0, a, cpu) } }

    func shape(_ a: Ctx) -> [Int] { (0..<ndim(a)).map { Int(dim(a, Int32($0))) } }

    /// Evaluates with mlx-c and copies the data out as `Element`s.
    func read<Element>(_ a: Ctx, as _: Element.Type) -> [Element] {
        precondition(eval(a) == 0)
        let bytes = nbytes(a)
        let data = dtype(a) == MLXC.float32 ? dataFloat32(a) : dataUInt16(a)
        let count = bytes / MemoryLayout<Element>.stride
        return [Element](UnsafeBufferPointer(start: data!.assumingMemoryBound(to: Element.self), count: count))
    }

    func release(_ arrays: Ctx...) {
        for a in arrays { precondition(arrayFree(a) == 0) }
    }
}

final class HostMLXTests: XCTestCase {
    private func mlxc() throws -> MLXC {
        try MLXC.shared.get()
    }

    private func bits(_ values: [Float]) -> [UInt32] { values.map(\.bitPattern) }

    // MARK: without a host MLX

    func testMLXVersion() {
        XCTAssertNotNil(MLXKern.mlxVersion.range(of: #"^\d+\.\d+\.\d+"#, options: .regularExpression),
                        MLXKern.mlxVersion)
    }

    func testRoundTripThroughAHostArray() throws {
        var rng = SeededGenerator()
        let values = rng.normals(12)
        var host: UnsafeMutableRawPointer?
        do {
            let a = try MLXKArray.floats(values, shape: [3, 4])
            host = try a.sharedMLXArray()
        } // `a` is gone; the host array keeps the data alive
        let b = try MLXKArray(sharingMLXArray: host)
        MLXKArray.freeMLXArray(host) // the handle keeps it alive in turn
        XCTAssertEqual(b.shape, [3, 4])
        XCTAssertEqual(b.dtype, .float32)
        XCTAssertEqual(bits(try b.toFloats()), bits(values), "seed \(rng.seed)")
    }

    func testMisuse() {
        assertMLXKError(.nullPointer, mentioning: "mlxk_array_from_mlx") {
            try MLXKArray(sharingMLXArray: nil)
        }
        MLXKArray.freeMLXArray(nil) // does nothing
    }

    func testWithMLXLockNestsRethrowsAndReleases() throws {
        let sum = try MLXKern.withMLXLock {
            try MLXKern.withMLXLock {
                try MLXKArray.floats([1, 2, 3], shape: [3]).asType(.bfloat16).toFloats().reduce(0, +)
            }
        }
        XCTAssertEqual(sum, 6)
        struct Thrown: Error {}
        XCTAssertThrowsError(try MLXKern.withMLXLock { throw Thrown() }) { XCTAssertTrue($0 is Thrown) }
        // Every lock was given back: one more unlock is a misuse the library reports.
        XCTAssertEqual(mlxk_mlx_unlock(), MLXK_ERR_INVALID_ARGUMENT)
    }

    // MARK: with mlx-c in the process

    func testMLXCLinksTheSharedLibmlx() throws {
        let c = try mlxc()
        XCTAssertEqual(c.mlxVersion(), MLXKern.mlxVersion)
    }

    func testNoCopyEitherWay() throws {
        let c = try mlxc()
        var rng = SeededGenerator()
        let values = rng.normals(24)
        let a = c.array(values, shape: [2, 3, 4], dtype: MLXC.float32)
        XCTAssertEqual(c.eval(a), 0)
        let buffer = c.dataFloat32(a)
        let back: UnsafeMutableRawPointer
        do {
            let shared = try MLXKArray(sharingMLXArray: a)
            XCTAssertEqual(shared.shape, [2, 3, 4])
            back = try shared.sharedMLXArray()
            XCTAssertEqual(c.dataFloat32(back), buffer, "the same buffer on both sides")
            c.release(a) // the handle and `back` still hold the array
            XCTAssertEqual(bits(try shared.toFloats()), bits(values), "seed \(rng.seed)")
        } // the handle is gone; `back` holds the array
        XCTAssertEqual(bits(c.read(back, as: Float.self)), bits(values), "seed \(rng.seed)")
        c.release(back)
    }

    /// x an unevaluated mlx-c sum, gate a transposed mlx-c view; the result goes back to mlx-c,
    /// is consumed by an mlx-c op, evaluated and read by mlx-c.
    func testGatedRMSNormOnHostArraysEqualsTheCopyingPath() throws {
        let c = try mlxc()
        var rng = SeededGenerator()
        let (rows, width, eps): (Int, Int, Float) = (6, 48, 1e-6)
        let x1 = rng.normals(rows * width), x2 = rng.normals(rows * width, scale: 0.5)
        let gateT = rng.normals(rows * width, scale: 2) // [width, rows]
        let weight = rng.uniforms(width, in: 0.5...1.5)
        let h1 = c.array(x1, shape: [rows, width], dtype: MLXC.float32)
        let h2 = c.array(x2, shape: [rows, width], dtype: MLXC.float32)
        let hx = c.add(h1, h2)
        let hgT = c.array(gateT, shape: [width, rows], dtype: MLXC.float32)
        let hg = c.transpose(hgT)
        let hw = c.array(weight, shape: [width], dtype: MLXC.float32)
        let hout: UnsafeMutableRawPointer
        do {
            let x = try MLXKArray(sharingMLXArray: hx)
            let gate = try MLXKArray(sharingMLXArray: hg)
            let w = try MLXKArray(sharingMLXArray: hw)
            XCTAssertEqual(gate.shape, [rows, width])
            hout = try MLXKern.gatedRMSNorm(x: x, gate: gate, weight: w, eps: eps).sharedMLXArray()
        }
        let twice = c.add(hout, hout)
        let sum = c.read(twice, as: Float.self) // one mlx-c evaluation computes the kernel too
        let got = c.read(hout, as: Float.self)
        XCTAssertEqual(c.shape(hout), [rows, width])
        // Reference: the same kernel on copies (float32 addition rounds alike on both sides).
        var gate = [Float](repeating: 0, count: rows * width)
        for r in 0..<rows { for col in 0..<width { gate[r * width + col] = gateT[col * rows + r] } }
        let expected = try MLXKern.gatedRMSNorm(
            x: MLXKArray.floats(zip(x1, x2).map { $0 + $1 }, shape: [rows, width]),
            gate: MLXKArray.floats(gate, shape: [rows, width]),
            weight: MLXKArray.floats(weight, shape: [width]), eps: eps).toFloats()
        XCTAssertEqual(bits(got), bits(expected), "seed \(rng.seed)")
        XCTAssertEqual(bits(sum), bits(expected.map { $0 + $0 }), "seed \(rng.seed)")
        c.release(h1, h2, hx, hgT, hg, hw, hout, twice)
    }

    /// A decode loop whose recurrent state stays an mlx-c array from step to step.
    func testGatedDeltaDecodeWithHostStateEqualsTheCopyingPath() throws {
        let c = try mlxc()
        var rng = SeededGenerator()
        let (b, t, hk, hv, dk, dv, steps) = (1, 1, 2, 4, 64, 16, 5)
        func bf16Values(_ n: Int, _ scale: Float) -> [UInt16] { rng.normals(n, scale: scale).map(bf16Bits) }
        let aLog = rng.normals(hv)
        let dtBias = bf16Values(hv, 1)
        let state0 = rng.normals(b * hv * dv * dk, scale: 0.5)
        let hALog = c.array(aLog, shape: [hv], dtype: MLXC.float32)
        let hDt = c.array(dtBias, shape: [hv], dtype: MLXC.bfloat16)
        var hState = c.array(state0, shape: [b, hv, dv, dk], dtype: MLXC.float32)
        let sALog = try MLXKArray(sharingMLXArray: hALog), sDt = try MLXKArray(sharingMLXArray: hDt)
        let rALog = try MLXKArray.floats(aLog, shape: [hv])
        let rDt = try MLXKArray.rawBits(dtBias, shape: [hv], dtype: .bfloat16)
        var rState = try MLXKArray.floats(state0, shape: [b, hv, dv, dk])
        for step in 0..<steps {
            let shapes = [[b, t, hk, dk], [b, t, hk, dk], [b, t, hv, dv], [b, t, hv], [b, t, hv]]
            let scales: [Float] = [0.2, 0.2, 1, 1, 1]
            let inputs = zip(shapes, scales).map { shape, scale in bf16Values(shape.reduce(1, *), scale) }
            let hosts = zip(inputs, shapes).map { c.array($0, shape: $1, dtype: MLXC.bfloat16) }
            // Shared: host arrays in, host arrays out.
            let hY: UnsafeMutableRawPointer, hNext: UnsafeMutableRawPointer
            do {
                let s = try hosts.map { try MLXKArray(sharingMLXArray: $0) }
                let out = try MLXKern.gatedDeltaUpdate(
                    q: s[0], k: s[1], v: s[2], a: s[3], b: s[4], aLog: sALog, dtBias: sDt,
                    state: MLXKArray(sharingMLXArray: hState))
                hY = try out.y.sharedMLXArray()
                hNext = try out.state.sharedMLXArray()
            }
            for h in hosts { c.release(h) }
            c.release(hState)
            // Reference: copies.
            let r = try zip(inputs, shapes).map { try MLXKArray.rawBits($0, shape: $1, dtype: .bfloat16) }
            let ref = try MLXKern.gatedDeltaUpdate(q: r[0], k: r[1], v: r[2], a: r[3], b: r[4],
                                                   aLog: rALog, dtBias: rDt, state: rState)
            rState = ref.state
            XCTAssertEqual(c.read(hY, as: UInt16.self), try ref.y.toUInt16Bits(), "y, step \(step), seed \(rng.seed)")
            XCTAssertEqual(bits(c.read(hNext, as: Float.self)), bits(try rState.toFloats()),
                           "state, step \(step), seed \(rng.seed)")
            XCTAssertEqual(c.shape(hNext), [b, hv, dv, dk])
            c.release(hY)
            hState = hNext // carried to the next step as an mlx-c array
        }
        c.release(hALog, hDt, hState)
    }

    func testAHostDtypeWithoutADTypeIsRefused() throws {
        let c = try mlxc()
        let h = c.array([1.0, 2.0, 3.0] as [Double], shape: [3], dtype: MLXC.float64)
        defer { c.release(h) }
        assertMLXKError(.dtype, mentioning: "mlxk_array_from_mlx") { try MLXKArray(sharingMLXArray: h) }
    }

    func testHostWorkUnderTheLock() throws {
        let c = try mlxc()
        var rng = SeededGenerator()
        let values = rng.normals(8)
        let got = try MLXKern.withMLXLock { () throws -> [Float] in
            let h = c.array(values, shape: [8], dtype: MLXC.float32)
            let doubled = c.add(h, h)
            defer { c.release(h, doubled) }
            return try MLXKArray(sharingMLXArray: doubled).toFloats()
        }
        XCTAssertEqual(bits(got), bits(values.map { $0 + $0 }), "seed \(rng.seed)")
    }
}
