import Foundation
import MLX
import MLXKernMLX
import XCTest

// The kernels on mlx-swift's MLX (0.31.1, compiled in) against the bundled library on the pip
// MLX (0.32.4): tests/consumers/reference.c's decode step and gated norm, on that file's
// generated inputs, made here as MLXArrays and shared with the kernels. The kernels are the
// same code, so given the same inputs they must give the same bits under either MLX.
// MLXKERN_TEST_REFERENCE names reference.c's output (scripts/test/mlx-swift.sh writes it).

final class ReferenceTests: XCTestCase {
    override func setUp() {
        super.setUp()
        _ = useCPU
    }

    func testKernelsBitIdenticalToTheBundledLibrary() throws {
        guard let path = ProcessInfo.processInfo.environment["MLXKERN_TEST_REFERENCE"], !path.isEmpty else {
            throw XCTSkip("MLXKERN_TEST_REFERENCE is not set (scripts/test/mlx-swift.sh writes "
                          + "tests/consumers/reference.c's output there)")
        }
        let expected = try String(contentsOfFile: path, encoding: .utf8)

        var s: UInt32 = 2024
        func make(_ shape: [Int]) -> MLXArray {
            let values = (0..<shape.reduce(1, *)).map { _ -> Float in
                s = s &* 1664525 &+ 1013904223
                return Float(Double(s >> 8) / 16777216.0 * 2.0 - 1.0)
            }
            return MLXArray(values, shape)
        }
        let qk = [2, 1, 2, 32], vs = [2, 1, 4, 8], gates = [2, 1, 4]
        let q = make(qk), k = make(qk), v = make(vs), a = make(gates), b = make(gates)
        let aLog = make([4]), dtBias = make([4]), state = make([2, 4, 8, 32])
        let step = try MLXKern.gatedDeltaUpdate(
            q: q.mlxk(), k: k.mlxk(), v: v.mlxk(), a: a.mlxk(), b: b.mlxk(),
            aLog: aLog.mlxk(), dtBias: dtBias.mlxk(), state: state.mlxk())
        let x = make([3, 16]), gate = make([3, 16]), weight = make([16])
        let norm = try MLXKern.gatedRMSNorm(x: x.mlxk(), gate: gate.mlxk(), weight: weight.mlxk(), eps: 1e-6)
        let y = try step.y.mlxArray, newState = try step.state.mlxArray, normed = try norm.mlxArray
        eval(y, newState, normed)

        func line(_ name: String, _ array: MLXArray) -> String {
            let words = bits(array)
            return "\(name) \(words.count) " + words.map { String(format: "%08x", $0) }.joined(separator: " ")
        }
        let got = [line("y", y), line("state", newState), line("norm", normed)].joined(separator: "\n") + "\n"
        XCTAssertEqual(got, expected, "the kernels on MLX \(MLXKern.mlxVersion) vs the bundled library")
        print("ReferenceTests: y, state and norm bit-identical to the bundled library's "
              + "(\(got.split(separator: " ").count) words)")
    }
}
