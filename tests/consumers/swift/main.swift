// A Swift consumer of mlxkern (tests/consumers/swift/run.sh builds it in a package of its own,
// outside the repository, with the MLXKern package as a version-pinned dependency): the inputs
// of tests/consumers/reference.c made with the package's API, one decode step and one gated
// norm, each result printed as reference.c prints it (float32 bit patterns in hex).
import MLXKern
#if canImport(Glibc)
import Glibc
#else
import Darwin
#endif

var s: UInt32 = 2024
func nextValue() -> Float {
    s = s &* 1664525 &+ 1013904223
    return Float(Double(s >> 8) / 16777216.0 * 2.0 - 1.0)
}

func make(_ shape: [Int]) throws -> MLXKArray {
    try MLXKArray.floats((0..<shape.reduce(1, *)).map { _ in nextValue() }, shape: shape)
}

func show(_ name: String, _ array: MLXKArray) throws {
    let words = try array.toFloats().map { String($0.bitPattern, radix: 16) }
    print("\(name) \(words.count) " + words.map { String(repeating: "0", count: 8 - $0.count) + $0 }
        .joined(separator: " "))
}

do {
    let qk = [2, 1, 2, 32], vs = [2, 1, 4, 8], gates = [2, 1, 4]
    let q = try make(qk), k = try make(qk), v = try make(vs), a = try make(gates), b = try make(gates)
    let aLog = try make([4]), dtBias = try make([4]), state = try make([2, 4, 8, 32])
    let step = try MLXKern.gatedDeltaUpdate(q: q, k: k, v: v, a: a, b: b, aLog: aLog, dtBias: dtBias,
                                            state: state)
    let x = try make([3, 16]), gate = try make([3, 16]), weight = try make([16])
    let norm = try MLXKern.gatedRMSNorm(x: x, gate: gate, weight: weight, eps: 1e-6)
    try show("y", step.y)
    try show("state", step.state)
    try show("norm", norm)
} catch {
    print("consumer: \(error)")
    exit(1)
}
