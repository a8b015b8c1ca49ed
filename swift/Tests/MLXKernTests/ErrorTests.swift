import XCTest
import MLXKern

/// Bad input is refused before any graph is built, with the contract's status code and a
/// message that names the function and the argument at fault.
final class ErrorTests: XCTestCase {
    /// Valid bfloat16 recurrence inputs with B = 2, T = 4, Hk = 1, Hv = 2, Dk = 32, Dv = 8.
    private struct Inputs {
        var q, k, v, a, b, aLog, dtBias: MLXKArray
        init() throws {
            var rng = SeededGenerator("ErrorTests.Inputs")
            q = try .floats(rng.normals(256), shape: [2, 4, 1, 32], dtype: .bfloat16)
            k = try .floats(rng.normals(256), shape: [2, 4, 1, 32], dtype: .bfloat16)
            v = try .floats(rng.normals(128), shape: [2, 4, 2, 8], dtype: .bfloat16)
            a = try .floats(rng.normals(16), shape: [2, 4, 2], dtype: .bfloat16)
            b = try .floats(rng.normals(16), shape: [2, 4, 2], dtype: .bfloat16)
            aLog = try .floats([0.1, -0.5], shape: [2])
            dtBias = try .floats([0.2, 0.3], shape: [2], dtype: .bfloat16)
        }

        func update(state: MLXKArray? = nil, mask: MLXKArray? = nil) throws -> (y: MLXKArray, state: MLXKArray) {
            try MLXKern.gatedDeltaUpdate(q: q, k: k, v: v, a: a, b: b, aLog: aLog, dtBias: dtBias,
                                         state: state, mask: mask)
        }

        func replay(_ lengths: [Int32]) throws -> MLXKArray {
            try MLXKern.gatedDeltaState(k: k, v: v, a: a, b: b, aLog: aLog, dtBias: dtBias,
                                        acceptedLengths: lengths)
        }
    }

    func testStatusNumbersAreTheContract() {
        XCTAssertEqual(MLXKError.Status.invalidArgument.rawValue, 2)
        XCTAssertEqual(MLXKError.Status.shape.rawValue, 3)
        XCTAssertEqual(MLXKError.Status.dtype.rawValue, 4)
        XCTAssertEqual(MLXKError.Status.unsupported.rawValue, 5)
    }

    func testValidInputsPass() throws {
        let x = try Inputs()
        let out = try x.update()
        try out.y.eval()
        try out.state.eval()
        XCTAssertEqual(try x.replay([0, 4]).shape, [2, 2, 8, 32])
    }

    func testMismatchedShapesThrowShapeNamingTheArgument() throws {
        var x = try Inputs()
        x.k = try .zeros(shape: [2, 3, 1, 32], dtype: .bfloat16)
        assertMLXKError(.shape, mentioning: "mlxk_gated_delta_update: k: dimension 1 (T) is 3, expected 4") {
            try x.update()
        }
        x = try Inputs()
        assertMLXKError(.shape, mentioning: "state: dimension 3 (Dk) is 16, expected 32") {
            try x.update(state: .zeros(shape: [2, 2, 8, 16]))
        }
        assertMLXKError(.shape, mentioning: "mask: dimension 1 (T)") {
            try x.update(mask: .bools([Bool](repeating: true, count: 6), shape: [2, 3]))
        }
        x.a = try .zeros(shape: [2, 4], dtype: .bfloat16)
        assertMLXKError(.shape, mentioning: "a: expected rank 3") { try x.update() }

        x = try Inputs()
        x.q = try .zeros(shape: [2, 4, 1, 48], dtype: .bfloat16)
        x.k = x.q
        assertMLXKError(.shape, mentioning: "Dk (dimension 3) is 48") { try x.update() }

        x = try Inputs()
        x.dtBias = try .zeros(shape: [3], dtype: .bfloat16)
        assertMLXKError(.shape, mentioning: "mlxk_compute_g: dt_bias") {
            try MLXKern.computeG(aLog: x.aLog, a: x.a, dtBias: x.dtBias)
        }
        assertMLXKError(.shape, mentioning: "mlxk_gated_delta_state: dt_bias") { try x.replay([1, 1]) }

        let norm = try MLXKArray.zeros(shape: [2, 16], dtype: .bfloat16)
        assertMLXKError(.shape, mentioning: "mlxk_gated_rms_norm: weight") {
            try MLXKern.gatedRMSNorm(x: norm, gate: norm, weight: .zeros(shape: [15], dtype: .bfloat16), eps: 1e-6)
        }
        assertMLXKError(.shape, mentioning: "gate: shape") {
            try MLXKern.gatedRMSNorm(x: norm, gate: .zeros(shape: [16, 2], dtype: .bfloat16),
                                     weight: .zeros(shape: [16], dtype: .bfloat16), eps: 1e-6)
        }
        let scale = try MLXKArray.zeros(shape: [4], dtype: .bfloat16)
        assertMLXKError(.shape, mentioning: "x: dimension 2 (channels) is 20") {
            try MLXKern.siluRMSHeads(x: .zeros(shape: [1, 2, 20], dtype: .bfloat16), qScale: scale,
                                     kScale: scale, keyHeads: 1, valueHeads: 2, valueWidth: 4, eps: 1e-6)
        }
    }

    func testWrongDTypesThrowDTypeNamingTheArgument() throws {
        var x = try Inputs()
        assertMLXKError(.dtype, mentioning: "state: dtype bfloat16 is not accepted") {
            try x.update(state: .zeros(shape: [2, 2, 8, 32], dtype: .bfloat16))
        }
        assertMLXKError(.dtype, mentioning: "mask: dtype int32") {
            try x.update(mask: .zeros(shape: [2, 4], dtype: .int32))
        }
        x.k = try x.k.asType(.float16)
        assertMLXKError(.dtype, mentioning: "k: dtype float16 differs from q") { try x.update() }
        x = try Inputs()
        x.q = try .zeros(shape: [2, 4, 1, 32], dtype: .int32)
        assertMLXKError(.dtype, mentioning: "q: dtype int32 is not a float dtype") { try x.update() }

        let norm = try MLXKArray.zeros(shape: [2, 16], dtype: .bfloat16)
        assertMLXKError(.dtype, mentioning: "weight: dtype float32 differs from x") {
            try MLXKern.gatedRMSNorm(x: norm, gate: norm, weight: .zeros(shape: [16]), eps: 1e-6)
        }
        assertMLXKError(.dtype, mentioning: "q_scale") {
            try MLXKern.siluRMSHeads(x: .zeros(shape: [1, 1, 16], dtype: .bfloat16),
                                     qScale: .zeros(shape: [4]), kScale: .zeros(shape: [4]),
                                     keyHeads: 1, valueHeads: 2, valueWidth: 4, eps: 1e-6)
        }
    }

    func testBadAcceptedLengthsThrowInvalidArgumentNamingTheRow() throws {
        let x = try Inputs()
        assertMLXKError(.invalidArgument, mentioning: "accepted_lengths[1] is 5; expected 0 <= length <= T (4)") {
            try x.replay([2, 5])
        }
        assertMLXKError(.invalidArgument, mentioning: "accepted_lengths[0] is -1") { try x.replay([-1, 0]) }
        assertMLXKError(.invalidArgument, mentioning: "n_lengths is 3") { try x.replay([1, 1, 1]) }
        assertMLXKError(.invalidArgument, mentioning: "n_lengths is 0") { try x.replay([]) }
    }

    func testOtherInvalidArguments() throws {
        let norm = try MLXKArray.zeros(shape: [2, 16], dtype: .bfloat16)
        let weight = try MLXKArray.zeros(shape: [16], dtype: .bfloat16)
        for eps in [-1, Float.nan, .infinity] {
            assertMLXKError(.invalidArgument, mentioning: "eps is") {
                try MLXKern.gatedRMSNorm(x: norm, gate: norm, weight: weight, eps: eps)
            }
        }
        let scale = try MLXKArray.zeros(shape: [4], dtype: .bfloat16)
        let x = try MLXKArray.zeros(shape: [1, 1, 16], dtype: .bfloat16)
        assertMLXKError(.invalidArgument, mentioning: "value_heads is 0") {
            try MLXKern.siluRMSHeads(x: x, qScale: scale, kScale: scale, keyHeads: 1, valueHeads: 0,
                                     valueWidth: 4, eps: 1e-6)
        }
        assertMLXKError(.invalidArgument, mentioning: "key_heads is 4294967296") {
            try MLXKern.siluRMSHeads(x: x, qScale: scale, kScale: scale, keyHeads: 1 << 32, valueHeads: 1,
                                     valueWidth: 4, eps: 1e-6)
        }
        // The backward passes check the forward's arguments, then their cotangents.
        assertMLXKError(.invalidArgument, mentioning: "mlxk_gated_rms_norm_vjp: eps is -1") {
            try MLXKern.gatedRMSNormVJP(x: norm, gate: norm, weight: weight, eps: -1)
        }
        let ints = try MLXKArray.zeros(shape: [2, 16], dtype: .int32)
        assertMLXKError(.dtype, mentioning: "dout: dtype int32") {
            try MLXKern.gatedRMSNormVJP(x: norm, gate: norm, weight: weight, eps: 1e-6, dout: ints)
        }
        assertMLXKError(.invalidArgument, mentioning: "mlxk_silu_rms_heads_vjp: value_heads is 0") {
            try MLXKern.siluRMSHeadsVJP(x: x, qScale: scale, kScale: scale, keyHeads: 1, valueHeads: 0,
                                        valueWidth: 4, eps: 1e-6)
        }
        assertMLXKError(.invalidArgument, mentioning: "MLXKern.siluRMSHeadsVJP: key_heads is 4294967296") {
            try MLXKern.siluRMSHeadsVJP(x: x, qScale: scale, kScale: scale, keyHeads: 1 << 32,
                                        valueHeads: 1, valueWidth: 4, eps: 1e-6)
        }
    }

    /// Linux's MLX is CPU only: asking for the GPU is refused and the CPU stays the default.
    /// Where MLX has Metal, the GPU is accepted, runs a kernel, and the CPU is restored.
    func testGPUDevice() throws {
        let x = try Inputs()
        if MLXKern.gpuBackend == .none {
            assertMLXKError(.unsupported, mentioning: "MLXK_DEVICE_GPU") {
                try MLXKern.setDefaultDevice(.gpu)
            }
        } else {
            try MLXKern.setDefaultDevice(.gpu)
            defer { XCTAssertNoThrow(try MLXKern.setDefaultDevice(.cpu)) }
            try x.update().y.eval()
        }
        try MLXKern.setDefaultDevice(.cpu)
        try x.update().y.eval()
    }

    /// The message belongs to the failure just thrown, not to an older one.
    func testEachErrorCarriesItsOwnMessage() throws {
        let x = try Inputs()
        var messages: [String] = []
        for lengths in [[9, 0], [0, 9]] as [[Int32]] {
            do { _ = try x.replay(lengths) } catch let error as MLXKError { messages.append(error.message) }
            _ = try x.replay([1, 1])  // a success in between changes nothing
        }
        XCTAssertEqual(messages.count, 2)
        XCTAssertTrue(messages[0].contains("accepted_lengths[0]"), messages[0])
        XCTAssertTrue(messages[1].contains("accepted_lengths[1]"), messages[1])
    }
}
