import Foundation
import MLX
import MLXKernMLX
import XCTest

// The Swift layer (Qwen35Layer.swift: mlx-swift ops + mlxkern's kernels, MLX 0.31.1 compiled
// in) against the C++ engine layer (examples/cpp/qwen35_layer: MLX's C++ ops + the same
// kernels, on the pip MLX 0.32.4) on the same weights and token stream: the files
// tests/cpp/test_qwen35_layer.py writes (weights, inputs with the plan, and the engine's
// outputs), in the folder MLXKERN_TEST_QWEN35_DIR (scripts/test/mlx-swift.sh makes them).
//
// Tolerance: the kernels are the same code, so given the same inputs they give the same bits;
// what may differ are the MLX ops of the two MLX versions (matmul through each build's BLAS,
// conv1d): a 1-ulp difference of a bfloat16 projection enters the kernels and moves outputs by
// less than an output ulp, as in the engine's own acceptance test against mlx-lm, whose bound
// is used here: |dy| <= 2 ulp_bf16(|y|) + 2^-9 sqrt(max(1, 4096 / (Hv Dv))) max|y| per step;
// recurrent state within 2^-8 max|s|, conv state within 1 bfloat16 ulp. The test prints how
// many values are bit-identical.

final class Qwen35LayerTests: XCTestCase {
    override func setUp() {
        super.setUp()
        _ = useCPU
    }

    func testLayerMatchesTheCppEngine() throws {
        guard let dir = ProcessInfo.processInfo.environment["MLXKERN_TEST_QWEN35_DIR"], !dir.isEmpty else {
            throw XCTSkip("MLXKERN_TEST_QWEN35_DIR is not set (scripts/test/mlx-swift.sh writes the C++ engine's "
                          + "weights, inputs and outputs there)")
        }
        let name = ProcessInfo.processInfo.environment["MLXKERN_TEST_QWEN35_CONFIG"] ?? "small"
        let folder = URL(fileURLWithPath: dir)
        let (weights, weightsMeta) = try loadArraysAndMetadata(
            url: folder.appendingPathComponent("\(name).weights.safetensors"))
        let (inputs, inputsMeta) = try loadArraysAndMetadata(
            url: folder.appendingPathComponent("\(name).inputs.safetensors"))
        let expected = try loadArrays(url: folder.appendingPathComponent("\(name).outputs.safetensors"))
        let config = try Qwen35Config(metadata: weightsMeta)
        let layer = try Qwen35GatedDeltaNet(config: config, weights: weights)
        let x = try XCTUnwrap(inputs["x"])
        let plan = try XCTUnwrap(inputsMeta["plan"]).split(separator: ",").map { item -> (Bool, Int, Int) in
            let parts = item.split(separator: ":").compactMap { Int($0) }
            return item.hasPrefix("verify") ? (true, parts[0], parts[1]) : (false, parts[0], parts[0])
        }
        XCTAssertNil(inputsMeta["chunked_prefill"], "this test runs the exact recurrence only")
        eval(x)

        var outputs: [MLXArray] = []
        var position = 0
        var evals = 0
        for (verify, tokens, accepted) in plan {
            let chunk = x[position ..< (position + tokens)].expandedDimensions(axis: 0)
            let out: MLXArray
            var identical = MLXArray(true)
            if verify {
                out = try layer.verify(chunk)
                identical = try layer.accept(accepted)  // the rollback joins this step's graph
            } else {
                out = try layer.forward(chunk)
            }
            eval(out, layer.state, layer.convState, identical)  // the step's one evaluation
            evals += 1
            XCTAssertTrue(identical.item(Bool.self), "replayed state bit-identical to a direct update")
            outputs.append(out[0])
            position += tokens
        }
        XCTAssertEqual(position, x.dim(0))
        XCTAssertEqual(evals, plan.count)

        // Per step: the outputs against the engine's, within the tolerance above.
        let terms = Double(config.valueHeads * config.valueDim)
        let absTerm = pow(2.0, -9) * max(1, 4096 / terms).squareRoot()
        let want = try XCTUnwrap(expected["y"]).asType(.float32).asArray(Float.self)
        var offset = 0
        var exact = 0, total = 0
        var worst = 0.0
        for (index, out) in outputs.enumerated() {
            let got = out.asType(.float32).asArray(Float.self)
            let ref = Array(want[offset ..< offset + got.count])
            let scale = Double(ref.map { abs($0) }.max() ?? 0)
            for (g, w) in zip(got, ref) {
                let d = abs(Double(g) - Double(w))
                let allowed = 2 * bf16ULP(max(abs(Double(g)), abs(Double(w)))) + absTerm * scale
                worst = max(worst, d / allowed)
                if d == 0 { exact += 1 }
                XCTAssertLessThanOrEqual(d, allowed, "step \(index): swift \(g), C++ \(w)")
            }
            total += got.count
            offset += got.count
        }
        XCTAssertEqual(offset, want.count)

        let stateGot = layer.state.asArray(Float.self)
        let stateWant = try XCTUnwrap(expected["state"]).asArray(Float.self)
        let stateScale = Double(stateWant.map { abs($0) }.max() ?? 0)
        let stateDiff = zip(stateGot, stateWant).map { abs(Double($0) - Double($1)) }.max() ?? 0
        XCTAssertLessThanOrEqual(stateDiff, pow(2.0, -8) * stateScale, "final recurrent state")
        let stateExact = zip(stateGot, stateWant).filter { $0.bitPattern == $1.bitPattern }.count

        let convGot = layer.convState.asType(.float32).asArray(Float.self)
        let convWant = try XCTUnwrap(expected["conv_state"]).asType(.float32).asArray(Float.self)
        var convWorst = 0.0
        for (g, w) in zip(convGot, convWant) {
            convWorst = max(convWorst, abs(Double(g) - Double(w)) / bf16ULP(max(abs(Double(g)), abs(Double(w)))))
        }
        XCTAssertLessThanOrEqual(convWorst, 1, "final conv state")
        let convExact = zip(convGot, convWant).filter { $0.bitPattern == $1.bitPattern }.count

        print(String(format: "Qwen35LayerTests: %@ (hidden %d, Hk %d, Hv %d, Dk %d, Dv %d): %d steps, %d evals; "
                     + "outputs %d of %d bit-identical (%.2f%%), worst |d|/tolerance %.3f; "
                     + "final state %d of %d bit-identical, max |ds| %.3g (max|s| %.3g); "
                     + "conv state %d of %d bit-identical, max %.2f ulp",
                     name, config.hiddenSize, config.keyHeads, config.valueHeads, config.keyDim,
                     config.valueDim, plan.count, evals, exact, total, 100 * Double(exact) / Double(total),
                     worst, stateExact, stateGot.count, stateDiff, stateScale, convExact, convGot.count,
                     convWorst))
    }
}

/// The bfloat16 ulp at |x| (normal range).
func bf16ULP(_ x: Double) -> Double {
    let e = floor(log2(max(abs(x), pow(2.0, -126))))
    return pow(2.0, e - 7)
}
