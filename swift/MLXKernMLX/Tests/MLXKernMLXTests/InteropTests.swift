import Cmlx
import Foundation
import MLX
import MLXKernMLX
import XCTest

// MLXArrays into mlxkern's kernels and back, on the program's one MLX (mlx-swift's, compiled
// in; libmlxkern is the static archive built against the same sources). Each result is checked
// bit for bit against the same kernels on copies (`MLXKArray.floats`, `toFloats()`).

final class InteropTests: XCTestCase {
    override func setUp() {
        super.setUp()
        _ = useCPU
    }

    func testOneMLXInTheProcess() throws {
        XCTAssertEqual(MLXKern.mlxVersion, MLXKern.mlxSwiftMLXVersion,
                       "the kernels run on mlx-swift's MLX")
        print("InteropTests: mlx-swift's MLX \(MLXKern.mlxSwiftMLXVersion), libmlxkern \(MLXKern.version)")
    }

    func testSameDataPointerBothWays() throws {
        var rng = SeededGenerator()
        let values = rng.uniforms(24)
        let x = mlxArray(values, [2, 3, 4])
        eval(x)
        let shared = try MLXKArray(sharing: x)
        XCTAssertEqual(shared.shape, [2, 3, 4])
        XCTAssertEqual(shared.dtype, .float32)
        let back = try shared.mlxArray
        XCTAssertTrue(isEvaluated(back), "the same evaluated array, not a new node")
        XCTAssertEqual(dataAddress(back), dataAddress(x), "the same buffer on both sides")
        XCTAssertEqual(bits(try shared.toFloats()), bits(values), "seed \(rng.seed)")
        XCTAssertEqual(bits(back), bits(values), "seed \(rng.seed)")
    }

    func testSharedArrayOutlivesTheMLXArray() throws {
        var rng = SeededGenerator()
        let values = rng.uniforms(12)
        var shared: MLXKArray?
        var address: UnsafeRawPointer?
        do {
            let x = mlxArray(values, [3, 4])
            eval(x)
            address = dataAddress(x)
            shared = try MLXKArray(sharing: x)
        }  // x is gone; the handle keeps the buffer
        let back = try XCTUnwrap(shared).mlxArray
        XCTAssertEqual(dataAddress(back), address)
        XCTAssertEqual(bits(back), bits(values), "seed \(rng.seed)")
    }

    /// x an unevaluated MLX sum; the kernel's result stays lazy until one eval computes the
    /// mlx-swift ops after it, the kernel node and the sum together.
    func testLazyThroughTheKernelsOneEval() throws {
        var rng = SeededGenerator()
        for (rows, width) in [(3, 16), (1, 128), (5, 40)] {
            let x1 = rng.uniforms(rows * width), x2 = rng.uniforms(rows * width)
            let gate = rng.uniforms(rows * width, in: -3...3)
            let weight = rng.uniforms(width, in: 0.5...1.5)
            let lazyX = mlxArray(x1, [rows, width]) + mlxArray(x2, [rows, width])
            let g = mlxArray(gate, [rows, width]), w = mlxArray(weight, [width])
            XCTAssertFalse(isEvaluated(lazyX))
            let normed = try MLXKern.gatedRMSNorm(x: lazyX.mlxk(), gate: g.mlxk(), weight: w.mlxk(), eps: 1e-6)
            let out = try normed.mlxArray
            let total = (out * 2 + 1).sum(axis: 1)
            XCTAssertFalse(isEvaluated(lazyX), "sharing does not evaluate")
            XCTAssertFalse(isEvaluated(out), "the kernel's result is a lazy node")
            eval(total)
            XCTAssertTrue(isEvaluated(lazyX) && isEvaluated(out), "one eval computed all")

            // The copying path: the sum computed by MLX, copied out; kernels on copies.
            let sum = (mlxArray(x1, [rows, width]) + mlxArray(x2, [rows, width])).asArray(Float.self)
            let copied = try MLXKern.gatedRMSNorm(
                x: .floats(sum, shape: [rows, width]), gate: .floats(gate, shape: [rows, width]),
                weight: .floats(weight, shape: [width]), eps: 1e-6).toFloats()
            XCTAssertEqual(bits(out), bits(copied), "\(rows)x\(width), seed \(rng.seed)")
            let expected = (mlxArray(copied, [rows, width]) * 2 + 1).sum(axis: 1)
            XCTAssertEqual(bits(total), bits(expected), "\(rows)x\(width), seed \(rng.seed)")
        }
    }

    /// Views: a transposed gate, an x broadcast along rows, bfloat16 inputs.
    func testTransposedAndBroadcastViews() throws {
        var rng = SeededGenerator()
        for (rows, width, dtype) in [(4, 32, MLX.DType.float32), (3, 64, .bfloat16), (7, 8, .float32)] {
            let row = rng.uniforms(width)
            let gateT = rng.uniforms(width * rows, in: -2...2)  // [width, rows]
            let weight = rng.uniforms(width, in: 0.5...1.5)
            let x = broadcast(mlxArray(row, [1, width], dtype), to: [rows, width])
            let gate = mlxArray(gateT, [width, rows], dtype).transposed()
            let w = mlxArray(weight, [width], dtype)
            let out = try MLXKern.gatedRMSNorm(x: x.mlxk(), gate: gate.mlxk(), weight: w.mlxk(), eps: 1e-5).mlxArray
            XCTAssertEqual(out.shape, [rows, width])
            XCTAssertEqual(out.dtype, dtype)

            // Copies, materialized row-major on the Swift side.
            let xs = (0..<rows).flatMap { _ in mlxArray(row, [width], dtype).asType(.float32).asArray(Float.self) }
            let gt = mlxArray(gateT, [width, rows], dtype).asType(.float32).asArray(Float.self)
            let gs = (0..<rows).flatMap { r in (0..<width).map { c in gt[c * rows + r] } }
            let ws = w.asType(.float32).asArray(Float.self)
            let kdtype: MLXKDType = dtype == .bfloat16 ? .bfloat16 : .float32
            let copied = try MLXKern.gatedRMSNorm(
                x: .floats(xs, shape: [rows, width], dtype: kdtype),
                gate: .floats(gs, shape: [rows, width], dtype: kdtype),
                weight: .floats(ws, shape: [width], dtype: kdtype), eps: 1e-5).toFloats()
            XCTAssertEqual(bits(out), bits(copied), "\(rows)x\(width) \(dtype), seed \(rng.seed)")
        }
    }

    /// A decode loop whose recurrent state stays an MLXArray, one eval per step, against the
    /// same loop on copies: bit-identical outputs and states at every step.
    func testDecodeLoopStateStaysAnMLXArray() throws {
        var rng = SeededGenerator()
        for (batch, hk, hv, dk, dv, steps) in [(1, 2, 4, 32, 16, 6), (2, 1, 2, 64, 8, 4)] {
            let aLog = rng.uniforms(hv, in: -3...0), dtBias = rng.uniforms(hv, in: -1...1)
            let aLogM = mlxArray(aLog, [hv]), dtBiasM = mlxArray(dtBias, [hv])
            var state = MLXArray.zeros([batch, hv, dv, dk], type: Float.self)
            var copyState = try MLXKArray.zeros(shape: [batch, hv, dv, dk])
            for step in 0..<steps {
                let q = rng.uniforms(batch * hk * dk), k = rng.uniforms(batch * hk * dk)
                let v = rng.uniforms(batch * hv * dv)
                let a = rng.uniforms(batch * hv, in: -2...2), b = rng.uniforms(batch * hv, in: -2...2)
                let qs = [batch, 1, hk, dk], vs = [batch, 1, hv, dv], gs = [batch, 1, hv]
                let (y, next) = try MLXKern.gatedDeltaUpdate(
                    q: mlxArray(q, qs).mlxk(), k: mlxArray(k, qs).mlxk(), v: mlxArray(v, vs).mlxk(),
                    a: mlxArray(a, gs).mlxk(), b: mlxArray(b, gs).mlxk(),
                    aLog: aLogM.mlxk(), dtBias: dtBiasM.mlxk(), state: state.mlxk())
                let yM = try y.mlxArray
                state = try next.mlxArray
                XCTAssertFalse(isEvaluated(state))
                eval(yM, state)

                let copy = try MLXKern.gatedDeltaUpdate(
                    q: .floats(q, shape: qs), k: .floats(k, shape: qs), v: .floats(v, shape: vs),
                    a: .floats(a, shape: gs), b: .floats(b, shape: gs),
                    aLog: .floats(aLog, shape: [hv]), dtBias: .floats(dtBias, shape: [hv]),
                    state: copyState)
                copyState = copy.state
                XCTAssertEqual(bits(yM), bits(try copy.y.toFloats()), "step \(step), seed \(rng.seed)")
                XCTAssertEqual(bits(state), bits(try copyState.toFloats()), "step \(step), seed \(rng.seed)")
            }
        }
    }

    func testUnsupportedDtypeIsRefused() throws {
        let x = MLXArray([1, 2, 3] as [Int64])
        XCTAssertThrowsError(try x.mlxk()) { error in
            guard let error = error as? MLXKError else { return XCTFail("\(error)") }
            XCTAssertEqual(error.status, .dtype)
            XCTAssertTrue(error.message.contains("dtype"), error.message)
        }
    }
}
