import XCTest
import MLXKern

// The head split and the gated RMSNorm against float64 loops that round to bfloat16 exactly
// where the contract says the kernels round (docs/DESIGN.md §4, the header's comments), so that the
// comparison is tight: between those points the kernels compute in float32 and the loops in
// float64. What is left is float32-versus-float64 error (≈1e-7 relative) that, rarely, puts a
// value on the other side of a bfloat16 rounding boundary: one ulp, in about 1 value in 10^4,
// and two when two such roundings line up. Bounds: every element within 2 bfloat16 ulps of
// the reference, and at least 99 % bit-exact.

/// MLX's SiLU on a bfloat16 x (docs/DESIGN.md §4): `e = T(exp(|x|))`, `y = 1/(1 + e)` in float32,
/// `s = T(x < 0 ? y : 1 - y)`, `silu = T(x · s)`.
func siluBFloat16(_ x: Float) -> Double {
    let e = Float(bf16(exp(abs(Double(x)))))
    let y = Float(1) / (Float(1) + e)
    let s = bf16(x < 0 ? Double(y) : 1 - Double(y))
    return bf16(Double(x) * s)
}

/// Counts of bit-exact elements and the largest ulp distance, as bfloat16.
func compareBFloat16(_ kernel: MLXKArray, _ reference: [Double], _ what: String, seed: UInt64,
                     file: StaticString = #filePath, line: UInt = #line) throws {
    let bits = try kernel.toUInt16Bits()
    XCTAssertEqual(bits.count, reference.count, file: file, line: line)
    let exact = zip(bits, reference).filter { $0 == bf16Bits(Float($1)) }.count
    let worst = maxBF16ULPs(bits, reference)
    print("\(what): \(exact) of \(bits.count) bit-exact, worst \(worst.ulps) ulp")
    XCTAssertLessThanOrEqual(worst.ulps, 2, "\(what)[\(worst.index)], seed \(seed)", file: file, line: line)
    XCTAssertGreaterThanOrEqual(Double(exact), 0.99 * Double(bits.count), "\(what), seed \(seed)",
                                file: file, line: line)
}

final class NormTests: XCTestCase {
    // MARK: head split

    func testSiluRMSHeadsQwenShape() throws {
        try checkHeadSplit(batch: 2, tokens: 3, keyHeads: 2, keyWidth: 128, valueHeads: 4, valueWidth: 128)
    }

    /// Widths that are not multiples of 4 leave lanes partly or wholly idle.
    func testSiluRMSHeadsOddWidths() throws {
        try checkHeadSplit(batch: 1, tokens: 5, keyHeads: 3, keyWidth: 20, valueHeads: 3, valueWidth: 7)
    }

    private func checkHeadSplit(batch: Int, tokens: Int, keyHeads hk: Int, keyWidth dk: Int,
                                valueHeads hv: Int, valueWidth dv: Int, test: String = #function) throws {
        var rng = SeededGenerator(test)
        let channels = 2 * hk * dk + hv * dv
        let rows = batch * tokens
        let x = try MLXKArray.floats(rng.normals(rows * channels, scale: 2), shape: [batch, tokens, channels],
                                     dtype: .bfloat16)
        // mlx-lm's scales are Dk^-1 and Dk^-1/2 for every element; varying them per element
        // checks that element i is scaled by scale[i].
        let qScale = try MLXKArray.floats(rng.uniforms(dk, in: 0.5...1.5).map { $0 / Float(dk) }, shape: [dk],
                                          dtype: .bfloat16)
        let kScale = try MLXKArray.floats(rng.uniforms(dk, in: 0.5...1.5).map { $0 / Float(dk).squareRoot() },
                                          shape: [dk], dtype: .bfloat16)
        let eps = 1e-6 / Float(dk)
        let out = try MLXKern.siluRMSHeads(x: x, qScale: qScale, kScale: kScale, keyHeads: hk,
                                           valueHeads: hv, valueWidth: dv, eps: eps)
        XCTAssertEqual(out.q.shape, [batch, tokens, hk, dk])
        XCTAssertEqual(out.k.shape, [batch, tokens, hk, dk])
        XCTAssertEqual(out.v.shape, [batch, tokens, hv, dv])
        XCTAssertEqual(out.q.dtype, .bfloat16)

        let (xs, qs, ks) = (try x.toFloats(), try qScale.toFloats(), try kScale.toFloats())
        var (qRef, kRef, vRef) = ([Double](), [Double](), [Double]())
        for row in 0..<rows {
            let silu = xs[row * channels..<(row + 1) * channels].map(siluBFloat16)
            for (part, scale) in [(0, qs), (1, ks)] {
                for head in 0..<hk {
                    let start = (part * hk + head) * dk
                    let values = silu[start..<start + dk]
                    let inv = 1 / (values.reduce(0) { $0 + $1 * $1 } / Double(dk) + Double(eps)).squareRoot()
                    let normalized = values.enumerated().map { i, s in bf16(Double(scale[i]) * bf16(s * inv)) }
                    if part == 0 { qRef += normalized } else { kRef += normalized }
                }
            }
            vRef += silu[2 * hk * dk..<channels]
        }
        try compareBFloat16(out.q, qRef, "q", seed: rng.seed)
        try compareBFloat16(out.k, kRef, "k", seed: rng.seed)
        try compareBFloat16(out.v, vRef, "v", seed: rng.seed)
    }

    // MARK: gated norm

    func testGatedRMSNormNarrow() throws {
        try checkGatedNorm(shape: [2, 3, 64], gateDType: .bfloat16)
    }

    /// Width 1000: 256 threads, so the per-SIMD-group sums go through the second butterfly; a
    /// float32 gate, as the header allows any float gate dtype.
    func testGatedRMSNormWideWithFloat32Gate() throws {
        try checkGatedNorm(shape: [4, 1000], gateDType: .float32)
    }

    private func checkGatedNorm(shape: [Int], gateDType: DType, test: String = #function) throws {
        var rng = SeededGenerator(test)
        let width = shape.last!
        let count = shape.reduce(1, *)
        let x = try MLXKArray.floats(rng.normals(count, scale: 1.5), shape: shape, dtype: .bfloat16)
        let gate = try MLXKArray.floats(rng.normals(count, scale: 2), shape: shape, dtype: gateDType)
        let weight = try MLXKArray.floats(rng.uniforms(width, in: 0.5...1.5), shape: [width], dtype: .bfloat16)
        let eps: Float = 1e-6
        let out = try MLXKern.gatedRMSNorm(x: x, gate: gate, weight: weight, eps: eps)
        XCTAssertEqual(out.shape, shape)
        XCTAssertEqual(out.dtype, .bfloat16)

        // out = T(silu_f32(gate) · f32(T(weight · T(x · rsqrt(mean(x²) + eps))))).
        let (xs, gs, ws) = (try x.toFloats(), try gate.toFloats(), try weight.toFloats())
        var reference = [Double]()
        for row in 0..<count / width {
            let values = xs[row * width..<(row + 1) * width].map(Double.init)
            let inv = 1 / (values.reduce(0) { $0 + $1 * $1 } / Double(width) + Double(eps)).squareRoot()
            for (i, value) in values.enumerated() {
                let weighted = bf16(Double(ws[i]) * bf16(value * inv))
                reference.append(bf16(silu(Double(gs[row * width + i])) * weighted))
            }
        }
        try compareBFloat16(out, reference, "gated norm \(shape)", seed: rng.seed)
    }

    /// float32 throughout: no rounding points but float32's; 1e-5 relative to the scale covers
    /// the float32 sum of 1000 squares (≈1e-7 each step) many times over.
    func testGatedRMSNormFloat32() throws {
        var rng = SeededGenerator()
        let shape = [3, 1000]
        let x = try MLXKArray.floats(rng.normals(3000), shape: shape)
        let gate = try MLXKArray.floats(rng.normals(3000), shape: shape)
        let weight = try MLXKArray.floats(rng.uniforms(1000, in: 0.5...1.5), shape: [1000])
        let out = try MLXKern.gatedRMSNorm(x: x, gate: gate, weight: weight, eps: 1e-6)
        let (xs, gs, ws) = (try x.toFloats(), try gate.toFloats(), try weight.toFloats())
        var reference = [Double]()
        for row in 0..<3 {
            let values = xs[row * 1000..<(row + 1) * 1000].map(Double.init)
            let inv = 1 / (values.reduce(0) { $0 + $1 * $1 } / 1000 + 1e-6).squareRoot()
            for i in 0..<1000 { reference.append(silu(Double(gs[row * 1000 + i])) * Double(ws[i]) * values[i] * inv) }
        }
        XCTAssertLessThan(scaledError(try out.toFloats(), reference), 1e-5, "seed \(rng.seed)")
    }
}
