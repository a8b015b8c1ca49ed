import Foundation
import XCTest
import MLXKern

// Shared by the tests: a seeded random source (fresh inputs every run, reproducible with
// MLXKERN_TEST_SEED), float16/bfloat16 helpers written independently of the library's, and
// plain float64 references of the gate and the sigmoid.

/// SplitMix64: small, fast, and enough for test inputs.
struct SeededGenerator: RandomNumberGenerator {
    private var state: UInt64
    let seed: UInt64

    /// A generator seeded from MLXKERN_TEST_SEED if set, else at random; the seed is printed
    /// so that a failing run can be replayed.
    init(_ test: String = #function) {
        let fixed = ProcessInfo.processInfo.environment["MLXKERN_TEST_SEED"].flatMap { UInt64($0) }
        seed = fixed ?? UInt64.random(in: 0...UInt64.max)
        state = seed
        print("\(test): MLXKERN_TEST_SEED=\(seed)")
    }

    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A standard normal sample (Box-Muller).
    mutating func normal() -> Float {
        let u1 = Double.random(in: Double.ulpOfOne..<1, using: &self)
        let u2 = Double.random(in: 0..<1, using: &self)
        return Float((-2 * Foundation.log(u1)).squareRoot() * cos(2 * Double.pi * u2))
    }

    mutating func normals(_ count: Int, scale: Float = 1) -> [Float] {
        (0..<count).map { _ in normal() * scale }
    }

    mutating func uniforms(_ count: Int, in range: ClosedRange<Float>) -> [Float] {
        (0..<count).map { _ in Float.random(in: range, using: &self) }
    }
}

// MARK: - bfloat16 arithmetic for the references

/// Rounds to the nearest bfloat16 (ties to even), the formula MLX uses; NaN stays NaN.
func bf16(_ x: Float) -> Float {
    if x.isNaN { return x }
    let bits = x.bitPattern
    return Float(bitPattern: (bits &+ 0x7FFF &+ ((bits >> 16) & 1)) & 0xFFFF_0000)
}

func bf16(_ x: Double) -> Double { Double(bf16(Float(x))) }

/// The bfloat16 bit pattern of a value that is already a bfloat16.
func bf16Bits(_ x: Float) -> UInt16 { UInt16(truncatingIfNeeded: bf16(x).bitPattern >> 16) }

/// Distance in units in the last place between two bfloat16 values (0 for +0 and -0).
func bf16ULPDistance(_ a: UInt16, _ b: UInt16) -> Int {
    func ordered(_ u: UInt16) -> Int { u & 0x8000 == 0 ? Int(u) : -Int(u & 0x7FFF) }
    return abs(ordered(a) - ordered(b))
}

/// The largest bfloat16 ulp distance between `kernel` and `reference` rounded to bfloat16,
/// with the index where it occurs.
func maxBF16ULPs(_ kernel: [UInt16], _ reference: [Double]) -> (ulps: Int, index: Int) {
    precondition(kernel.count == reference.count)
    var worst = (ulps: 0, index: 0)
    for i in kernel.indices {
        let d = bf16ULPDistance(kernel[i], bf16Bits(Float(reference[i])))
        if d > worst.ulps { worst = (d, i) }
    }
    return worst
}

// MARK: - References of the elementwise pieces

func softplus(_ x: Double) -> Double { x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)) }

func sigmoid(_ x: Double) -> Double { 1 / (1 + exp(-x)) }

func silu(_ x: Double) -> Double { x * sigmoid(x) }

/// `g = exp(-exp(aLog) * softplus(a + dtBias))` in float64. With bfloat16 a and dtBias the
/// reference rounds where MLX's ops round (mlx-lm's `compute_g` on bfloat16 inputs): the sum
/// is bfloat16, and softplus = logaddexp(x, 0) = max + log1p(exp(min - max)) is evaluated in
/// bfloat16, rounding after exp, after log1p and after the sum. exp(A_log), the product and the
/// outer exp are float32 in MLX, float64 here.
func gateReference(aLog: Float, a: Float, dtBias: Float, bfloat16Inputs: Bool) -> Double {
    let sp: Double
    if bfloat16Inputs {
        let x = bf16(Double(a) + Double(dtBias))
        sp = bf16(max(x, 0) + bf16(log1p(bf16(exp(-abs(x))))))
    } else {
        sp = softplus(Double(a) + Double(dtBias))
    }
    return exp(-exp(Double(aLog)) * sp)
}

/// beta = sigmoid(b). For bfloat16 b MLX's CPU sigmoid rounds twice: `e = bf16(exp(|x|))`,
/// then `bf16(x < 0 ? 1/(1+e) : 1 - 1/(1+e))`; the reference follows those rounding points so
/// that only MLX's float32 exp polynomial (≈1e-7 relative) separates the two.
func betaReference(_ b: Float, bfloat16Input: Bool) -> Double {
    guard bfloat16Input else { return sigmoid(Double(b)) }
    let e = bf16(exp(abs(Double(b))))
    let y = Double(Float(1) / (Float(1) + Float(e)))
    return bf16(b < 0 ? y : 1 - y)
}

// MARK: - Assertions

/// Asserts that `body` throws an MLXKError with `status` whose message contains `fragment`.
func assertMLXKError<T>(
    _ status: MLXKError.Status, mentioning fragment: String, file: StaticString = #filePath,
    line: UInt = #line, _ body: () throws -> T
) {
    do {
        _ = try body()
        XCTFail("expected \(status.name), nothing was thrown", file: file, line: line)
    } catch let error as MLXKError {
        XCTAssertEqual(error.status, status, "\(error)", file: file, line: line)
        XCTAssertEqual(error.statusName, status.name, file: file, line: line)
        XCTAssertTrue(error.message.contains(fragment),
                      "message \"\(error.message)\" does not mention \"\(fragment)\"", file: file, line: line)
    } catch {
        XCTFail("expected MLXKError, got \(error)", file: file, line: line)
    }
}

/// Row-major index helpers.
@inline(__always) func index(_ i: [Int], _ shape: [Int]) -> Int {
    var flat = 0
    for (x, n) in zip(i, shape) { flat = flat * n + x }
    return flat
}
