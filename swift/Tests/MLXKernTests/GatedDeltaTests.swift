import XCTest
import MLXKern

/// One recurrence call's inputs: the arrays handed to the kernel and, for the reference, the
/// values they hold (read back, so the reference sees exactly what the kernel sees).
struct RecurrenceInputs {
    let batch, tokens, keyHeads, valueHeads, keyWidth, valueWidth: Int
    let q, k, v, a, b, aLog, dtBias: MLXKArray
    let state: MLXKArray?
    let mask: MLXKArray?
    let gatesAreBFloat16: Bool
    let qValues, kValues, vValues, aValues, bValues, aLogValues, dtBiasValues: [Float]
    let stateValues: [Float]?
    let maskValues: [Bool]?

    /// Random inputs shaped like a Qwen3.5 layer's: q and k normalized per head as mlx-lm's
    /// `normalize_qk` leaves them (k unit length, q of length Dk^-1/2), v, a, b standard normal.
    init(rng: inout SeededGenerator, batch: Int, tokens: Int, keyHeads: Int, valueHeads: Int,
         keyWidth: Int, valueWidth: Int, dtype: DType, gateDType: DType,
         withState: Bool, withMask: Bool) throws {
        (self.batch, self.tokens, self.keyHeads, self.valueHeads) = (batch, tokens, keyHeads, valueHeads)
        (self.keyWidth, self.valueWidth) = (keyWidth, valueWidth)
        gatesAreBFloat16 = gateDType == .bfloat16

        func heads(_ rng: inout SeededGenerator, length: Float) -> [Float] {
            var x = rng.normals(batch * tokens * keyHeads * keyWidth)
            for start in stride(from: 0, to: x.count, by: keyWidth) {
                let norm = x[start..<start + keyWidth].reduce(0) { $0 + $1 * $1 }.squareRoot()
                for i in start..<start + keyWidth { x[i] *= length / norm }
            }
            return x
        }
        let keyShape = [batch, tokens, keyHeads, keyWidth]
        let gateShape = [batch, tokens, valueHeads]
        q = try .floats(heads(&rng, length: 1 / Float(keyWidth).squareRoot()), shape: keyShape, dtype: dtype)
        k = try .floats(heads(&rng, length: 1), shape: keyShape, dtype: dtype)
        v = try .floats(rng.normals(batch * tokens * valueHeads * valueWidth),
                        shape: [batch, tokens, valueHeads, valueWidth], dtype: dtype)
        a = try .floats(rng.normals(batch * tokens * valueHeads), shape: gateShape, dtype: gateDType)
        b = try .floats(rng.normals(batch * tokens * valueHeads), shape: gateShape, dtype: gateDType)
        // mlx-lm initializes A_log as log(U(0, 16)); keep exp(A_log) in [0.1, 3] for a gate
        // that neither vanishes nor stays at 1.
        aLog = try .floats(rng.uniforms(valueHeads, in: -2.3...1.1), shape: [valueHeads])
        dtBias = try .floats(rng.normals(valueHeads, scale: 0.5), shape: [valueHeads], dtype: gateDType)
        state = withState
            ? try .floats(rng.normals(batch * valueHeads * valueWidth * keyWidth, scale: 0.3),
                          shape: [batch, valueHeads, valueWidth, keyWidth])
            : nil
        if withMask {
            // Every row keeps at least its first token; about a quarter of the rest is padding.
            let values = (0..<batch * tokens).map { $0 % tokens == 0 || Float.random(in: 0..<1, using: &rng) > 0.25 }
            mask = try .bools(values, shape: [batch, tokens])
            maskValues = values
        } else {
            mask = nil
            maskValues = nil
        }
        qValues = try q.toFloats()
        kValues = try k.toFloats()
        vValues = try v.toFloats()
        aValues = try a.toFloats()
        bValues = try b.toFloats()
        aLogValues = try aLog.toFloats()
        dtBiasValues = try dtBias.toFloats()
        stateValues = try state?.toFloats()
    }

    /// The recurrence in float64, token by token (docs/DESIGN.md §4), for the rows' first
    /// `lengths[b]` tokens (all by default); masked tokens are skipped and give y = 0.
    func reference(lengths: [Int]? = nil) -> (y: [Double], state: [Double]) {
        let (bsz, t, hk, hv, dk, dv) = (batch, tokens, keyHeads, valueHeads, keyWidth, valueWidth)
        var y = [Double](repeating: 0, count: bsz * t * hv * dv)
        var state = stateValues.map { $0.map(Double.init) } ?? [Double](repeating: 0, count: bsz * hv * dv * dk)
        for row in 0..<bsz {
            for h in 0..<hv {
                let keyHead = h / (hv / hk)  // grouped: value heads h.. share key head h/(Hv/Hk)
                for token in 0..<(lengths?[row] ?? t) where maskValues?[row * t + token] ?? true {
                    let gateIndex = index([row, token, h], [bsz, t, hv])
                    let g = gateReference(aLog: aLogValues[h], a: aValues[gateIndex],
                                          dtBias: dtBiasValues[h], bfloat16Inputs: gatesAreBFloat16)
                    let beta = betaReference(bValues[gateIndex], bfloat16Input: gatesAreBFloat16)
                    let keyBase = index([row, token, keyHead, 0], [bsz, t, hk, dk])
                    for d in 0..<dv {
                        let s = index([row, h, d, 0], [bsz, hv, dv, dk])
                        var kv = 0.0
                        for i in 0..<dk {
                            state[s + i] *= g
                            kv += state[s + i] * Double(kValues[keyBase + i])
                        }
                        let delta = (Double(vValues[index([row, token, h, d], [bsz, t, hv, dv])]) - kv) * beta
                        var out = 0.0
                        for i in 0..<dk {
                            state[s + i] += Double(kValues[keyBase + i]) * delta
                            out += state[s + i] * Double(qValues[keyBase + i])
                        }
                        y[index([row, token, h, d], [bsz, t, hv, dv])] = out
                    }
                }
            }
        }
        return (y, state)
    }
}

/// How many of `kernel`'s bfloat16 values lie within one bfloat16 ulp of the exact
/// `reference`, plus `slack` times the largest |reference| (float32 sums that cancel to near
/// zero carry an error relative to their terms, not to their result).
func withinOneULP(_ kernel: [Float], _ reference: [Double], slack: Double) -> (within: Int, count: Int) {
    let scale = reference.map(abs).max() ?? 0
    let within = zip(kernel, reference).filter { value, exact in
        let magnitude = Float(abs(exact))
        let ulp = magnitude == 0 ? 0 : Double(Float(bitPattern: bf16(magnitude).bitPattern & 0x7F80_0000)) * 0x1p-7
        return abs(Double(value) - exact) <= ulp + slack * scale
    }.count
    return (within, kernel.count)
}

/// Largest |kernel - reference| over the largest |reference|: an error relative to the
/// array's scale, meaningful for sums with cancellation where a per-element relative error
/// is not.
func scaledError(_ kernel: [Float], _ reference: [Double]) -> Double {
    let scale = reference.map(abs).max() ?? 0
    let worst = zip(kernel, reference).map { abs(Double($0) - $1) }.max() ?? 0
    return scale == 0 ? worst : worst / scale
}

final class GatedDeltaTests: XCTestCase {
    // MARK: head split and update in one call

    /// `gatedDeltaUpdateFromConv` gives the bits of `siluRMSHeads` then `gatedDeltaUpdate`.
    func testUpdateFromConvEqualsSplitThenUpdate() throws {
        var rng = SeededGenerator()
        let (batch, tokens, hk, hv, dk, dv) = (2, 3, 2, 4, 64, 24)
        let channels = 2 * hk * dk + hv * dv
        let x = try MLXKArray.floats(rng.normals(batch * tokens * channels, scale: 3),
                                     shape: [batch, tokens, channels], dtype: .bfloat16)
        let qScale = try MLXKArray.floats(rng.uniforms(dk, in: 0.5...1.5).map { $0 / Float(dk) },
                                          shape: [dk], dtype: .bfloat16)
        let kScale = try MLXKArray.floats(rng.uniforms(dk, in: 0.5...1.5).map { $0 / Float(dk).squareRoot() },
                                          shape: [dk], dtype: .bfloat16)
        let gateShape = [batch, tokens, hv]
        let a = try MLXKArray.floats(rng.normals(batch * tokens * hv), shape: gateShape, dtype: .bfloat16)
        let b = try MLXKArray.floats(rng.normals(batch * tokens * hv), shape: gateShape, dtype: .bfloat16)
        let aLog = try MLXKArray.floats(rng.uniforms(hv, in: -2.3...1.1), shape: [hv])
        let dtBias = try MLXKArray.floats(rng.normals(hv, scale: 0.5), shape: [hv], dtype: .bfloat16)
        let state = try MLXKArray.floats(rng.normals(batch * hv * dv * dk, scale: 0.3),
                                         shape: [batch, hv, dv, dk])
        let mask = try MLXKArray.bools([true, true, false, true, false, true], shape: [batch, tokens])
        let eps = 1e-6 / Float(dk)
        let fused = try MLXKern.gatedDeltaUpdateFromConv(
            x: x, qScale: qScale, kScale: kScale, keyHeads: hk, valueHeads: hv, valueWidth: dv,
            eps: eps, a: a, b: b, aLog: aLog, dtBias: dtBias, state: state, mask: mask)
        let split = try MLXKern.siluRMSHeads(x: x, qScale: qScale, kScale: kScale, keyHeads: hk,
                                             valueHeads: hv, valueWidth: dv, eps: eps)
        let composed = try MLXKern.gatedDeltaUpdate(q: split.q, k: split.k, v: split.v, a: a, b: b,
                                                    aLog: aLog, dtBias: dtBias, state: state, mask: mask)
        let y = try fused.y.toUInt16Bits()
        XCTAssertEqual(y, try composed.y.toUInt16Bits())
        XCTAssertTrue(y.contains { $0 & 0x7fff != 0 }, "y carries values")
        XCTAssertEqual(try fused.state.toFloats(), try composed.state.toFloats())
        XCTAssertThrowsError(try MLXKern.gatedDeltaUpdateFromConv(
            x: x, qScale: qScale, kScale: kScale, keyHeads: hk, valueHeads: 3, valueWidth: dv,
            eps: eps, a: a, b: b, aLog: aLog, dtBias: dtBias)) { error in
            XCTAssertTrue("\(error)".contains("mlxk_gated_delta_update_from_conv"), "\(error)")
        }
    }

    // MARK: compute_g

    /// float32 inputs: every step is float32 in MLX and float64 here, so z = -log(g) agrees
    /// to a few float32 roundings (≈1e-7 each; 1e-6 leaves a wide margin).
    func testComputeGFloat32() throws {
        try checkComputeG(dtype: .float32, relativeTolerance: 1e-6)
    }

    /// bfloat16 a and dt_bias: the reference rounds to bfloat16 where MLX does (the sum, and
    /// softplus's exp, log1p and final sum), so z agrees to float32 accuracy — except where
    /// MLX's float32 exp or log1p rounds to the other bfloat16 neighbour than float64 does
    /// (about 1 value in 10^4): softplus then moves by one bfloat16 ulp, ≤ 2^-7 of itself, the
    /// bound on z. At most 2 of the 36 values may use that allowance.
    func testComputeGBFloat16() throws {
        try checkComputeG(dtype: .bfloat16, relativeTolerance: 0x1p-7)
    }

    private func checkComputeG(dtype: DType, relativeTolerance: Double) throws {
        var rng = SeededGenerator("computeG(\(dtype))")
        let shape = [2, 3, 6]
        let count = shape.reduce(1, *)
        let aLog = try MLXKArray.floats(rng.uniforms(6, in: -2.3...1.1), shape: [6])
        let a = try MLXKArray.floats(rng.normals(count, scale: 2), shape: shape, dtype: dtype)
        let dtBias = try MLXKArray.floats(rng.normals(6, scale: 0.5), shape: [6], dtype: dtype)
        let g = try MLXKern.computeG(aLog: aLog, a: a, dtBias: dtBias)
        XCTAssertEqual(g.shape, shape)
        XCTAssertEqual(g.dtype, .float32)
        let (gs, as_, aLogs, dts) = (try g.toFloats(), try a.toFloats(), try aLog.toFloats(), try dtBias.toFloats())
        var close = 0
        for i in 0..<count {
            let h = i % 6
            let ref = gateReference(aLog: aLogs[h], a: as_[i], dtBias: dts[h], bfloat16Inputs: dtype == .bfloat16)
            XCTAssert(gs[i] > 0 && gs[i] < 1, "g[\(i)] = \(gs[i]) outside (0, 1), seed \(rng.seed)")
            let (z, zRef) = (-log(Double(gs[i])), -log(ref))
            XCTAssertLessThanOrEqual(abs(z - zRef), relativeTolerance * zRef + 1e-6,
                                     "z[\(i)]: kernel \(z), reference \(zRef), seed \(rng.seed)")
            if abs(z - zRef) <= 1e-6 * zRef + 1e-6 { close += 1 }
        }
        XCTAssertGreaterThanOrEqual(close, count - 2, "values within 1e-6 of z, seed \(rng.seed)")
    }

    // MARK: the recurrence

    /// float32 everywhere: the kernel's float32 sums (≤ 256 terms, fixed order) against
    /// float64. Errors relative to each array's scale stay below 3e-7 over a few tokens
    /// (observed); 2e-5 leaves room without hiding a wrong head mapping or a missed gate
    /// (those give errors of order 1).
    func testUpdateFloat32AgainstFloat64() throws {
        var rng = SeededGenerator()
        let x = try RecurrenceInputs(rng: &rng, batch: 2, tokens: 4, keyHeads: 2, valueHeads: 4,
                                     keyWidth: 64, valueWidth: 8, dtype: .float32, gateDType: .float32,
                                     withState: true, withMask: false)
        let out = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                               dtBias: x.dtBias, state: x.state)
        XCTAssertEqual(out.y.shape, [2, 4, 4, 8])
        XCTAssertEqual(out.y.dtype, .float32)
        XCTAssertEqual(out.state.shape, [2, 4, 8, 64])
        XCTAssertEqual(out.state.dtype, .float32)
        let ref = x.reference()
        let (yError, stateError) = (scaledError(try out.y.toFloats(), ref.y), scaledError(try out.state.toFloats(), ref.state))
        print("float32 recurrence: y error \(yError), state error \(stateError) (scaled)")
        XCTAssertLessThan(yError, 2e-5, "seed \(rng.seed)")
        XCTAssertLessThan(stateError, 2e-5, "seed \(rng.seed)")
    }

    /// bfloat16 q, k, v with float32 gates; grouped heads (Hv/Hk = 3), a padding mask and a
    /// start state. The gates carry no bfloat16 rounding, so the kernel's float32 state tracks
    /// the float64 one to float32 accuracy (observed ≈ 2e-7 of the scale; bound 1e-5), and y,
    /// rounded once to bfloat16, lies within one bfloat16 ulp of the exact value, plus the
    /// float32 error of the sum (1e-5 of the scale, for values that cancel to near zero).
    func testUpdateBFloat16GroupedHeadsWithMask() throws {
        var rng = SeededGenerator()
        let x = try RecurrenceInputs(rng: &rng, batch: 3, tokens: 6, keyHeads: 2, valueHeads: 6,
                                     keyWidth: 32, valueWidth: 16, dtype: .bfloat16, gateDType: .float32,
                                     withState: true, withMask: true)
        let out = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                               dtBias: x.dtBias, state: x.state, mask: x.mask)
        XCTAssertEqual(out.y.dtype, .bfloat16)
        XCTAssertEqual(out.y.shape, [3, 6, 6, 16])
        let ref = x.reference()
        let y = try out.y.toFloats()
        let (within, count) = withinOneULP(y, ref.y, slack: 1e-5)
        XCTAssertEqual(within, count, "y elements within one bfloat16 ulp, seed \(rng.seed)")
        XCTAssertLessThan(scaledError(try out.state.toFloats(), ref.state), 1e-5, "seed \(rng.seed)")
        // Masked tokens write exactly 0.
        let perToken = x.valueHeads * x.valueWidth
        for (i, real) in x.maskValues!.enumerated() where !real {
            XCTAssertEqual(Array(y[i * perToken..<(i + 1) * perToken]), [Float](repeating: 0, count: perToken),
                           "masked token \(i)")
        }
    }

    /// The model's dtypes throughout: a, b and dt_bias bfloat16 too. beta and g then pass
    /// through bfloat16 roundings (sigmoid, softplus) that the reference reproduces, but MLX's
    /// float32 exp can round to the other neighbour than float64 does (about 1 in 10^4
    /// values): one token of one head then moves by one bfloat16 ulp of beta or softplus,
    /// ≤ 2^-7 of that token's update. Bounds: y within 2^-7 of its scale and the state within
    /// 2^-8 of its scale everywhere, and at least 90 % of the elements as tight as with
    /// float32 gates (one such head holds under 6 % of them).
    func testUpdateAllBFloat16() throws {
        var rng = SeededGenerator()
        let x = try RecurrenceInputs(rng: &rng, batch: 3, tokens: 6, keyHeads: 2, valueHeads: 6,
                                     keyWidth: 32, valueWidth: 16, dtype: .bfloat16, gateDType: .bfloat16,
                                     withState: true, withMask: true)
        let out = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                               dtBias: x.dtBias, state: x.state, mask: x.mask)
        let ref = x.reference()
        let (y, state) = (try out.y.toFloats(), try out.state.toFloats())
        XCTAssertLessThan(scaledError(y, ref.y), 0x1p-7, "seed \(rng.seed)")
        XCTAssertLessThan(scaledError(state, ref.state), 0x1p-8, "seed \(rng.seed)")
        let (yWithin, yCount) = withinOneULP(y, ref.y, slack: 1e-5)
        XCTAssertGreaterThanOrEqual(Double(yWithin), 0.9 * Double(yCount), "seed \(rng.seed)")
        let stateScale = ref.state.map(abs).max()!
        let stateWithin = zip(state, ref.state).filter { abs(Double($0) - $1) <= 1e-5 * stateScale }.count
        XCTAssertGreaterThanOrEqual(Double(stateWithin), 0.9 * Double(state.count), "seed \(rng.seed)")
    }

    /// Decode (T = 1) with no state (zeros) and no mask, Hv/Hk = 4, Dk = 128.
    func testDecodeWithoutStateFourValueHeadsPerKeyHead() throws {
        var rng = SeededGenerator()
        let x = try RecurrenceInputs(rng: &rng, batch: 2, tokens: 1, keyHeads: 1, valueHeads: 4,
                                     keyWidth: 128, valueWidth: 32, dtype: .bfloat16, gateDType: .bfloat16,
                                     withState: false, withMask: false)
        let out = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                               dtBias: x.dtBias)
        let ref = x.reference()
        XCTAssertLessThan(scaledError(try out.y.toFloats(), ref.y), 0x1p-7, "seed \(rng.seed)")
        XCTAssertLessThan(scaledError(try out.state.toFloats(), ref.state), 0x1p-8, "seed \(rng.seed)")
    }

    /// A decode loop of T one-token calls, each freeing the previous state before the next
    /// evaluation (the in-place update), gives the bits of one T-token call.
    func testDecodeLoopEqualsOneCall() throws {
        var rng = SeededGenerator()
        let x = try RecurrenceInputs(rng: &rng, batch: 2, tokens: 5, keyHeads: 2, valueHeads: 4,
                                     keyWidth: 64, valueWidth: 8, dtype: .bfloat16, gateDType: .bfloat16,
                                     withState: true, withMask: false)
        let whole = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                                 dtBias: x.dtBias, state: x.state)
        let wholeY = try whole.y.toUInt16Bits()

        func token(_ values: [Float], _ t: Int, width: Int, dtype: DType) throws -> MLXKArray {
            let perToken = values.count / (x.batch * x.tokens)
            var slice: [Float] = []
            for row in 0..<x.batch {
                let start = (row * x.tokens + t) * perToken
                slice += values[start..<start + perToken]
            }
            return try .floats(slice, shape: [x.batch, 1] + (width == 0 ? [perToken] : [perToken / width, width]), dtype: dtype)
        }
        var state: MLXKArray = try .floats(x.stateValues!, shape: x.state!.shape)
        for t in 0..<x.tokens {
            let step = try MLXKern.gatedDeltaUpdate(
                q: token(x.qValues, t, width: x.keyWidth, dtype: .bfloat16),
                k: token(x.kValues, t, width: x.keyWidth, dtype: .bfloat16),
                v: token(x.vValues, t, width: x.valueWidth, dtype: .bfloat16),
                a: token(x.aValues, t, width: 0, dtype: .bfloat16),
                b: token(x.bValues, t, width: 0, dtype: .bfloat16),
                aLog: x.aLog, dtBias: x.dtBias, state: state)
            state = step.state  // the old state's last owner goes here, before the evaluation
            let y = try step.y.toUInt16Bits()
            for row in 0..<x.batch {
                let n = x.valueHeads * x.valueWidth
                XCTAssertEqual(Array(y[row * n..<(row + 1) * n]),
                               Array(wholeY[(row * x.tokens + t) * n..<(row * x.tokens + t + 1) * n]),
                               "row \(row), token \(t), seed \(rng.seed)")
            }
        }
        XCTAssertEqual(try state.toFloats().map(\.bitPattern), try whole.state.toFloats().map(\.bitPattern),
                       "seed \(rng.seed)")
    }

    // MARK: the chunked form

    /// The chunked form against the exact update on the same inputs, over shapes whose T spans
    /// several chunks and ends in a partial one. The two differ only in float32 rounding (each
    /// lies within about 1e-6 of the largest magnitude of a float64 recurrence), so the state
    /// must lie within 2e-5 of its scale, and y within one bfloat16 ulp (the two float32 sums
    /// may round to neighbouring bfloat16 values) plus 2e-5 of its scale; float32 y within
    /// 2e-5 of its scale. A wrong chunk boundary, gate product or mask errs by O(1).
    func testChunkedEqualsExactUpdate() throws {
        var rng = SeededGenerator()
        let cases: [(batch: Int, tokens: Int, keyHeads: Int, valueHeads: Int, keyWidth: Int, valueWidth: Int,
                     dtype: DType, gateDType: DType, withState: Bool, withMask: Bool, chunkSize: Int32)] = [
            (2, 70, 2, 4, 64, 16, .bfloat16, .float32, true, false, 0),
            (1, 37, 1, 3, 32, 8, .float32, .float32, false, false, 16),
            (3, 50, 2, 4, 128, 8, .bfloat16, .bfloat16, true, true, 48),
            (2, 45, 1, 2, 96, 6, .float32, .float32, false, true, 128),
        ]
        for c in cases {
            let label = "\(c), seed \(rng.seed)"
            let x = try RecurrenceInputs(rng: &rng, batch: c.batch, tokens: c.tokens, keyHeads: c.keyHeads,
                                         valueHeads: c.valueHeads, keyWidth: c.keyWidth, valueWidth: c.valueWidth,
                                         dtype: c.dtype, gateDType: c.gateDType,
                                         withState: c.withState, withMask: c.withMask)
            let exact = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                                     dtBias: x.dtBias, state: x.state, mask: x.mask)
            let chunked = try MLXKern.gatedDeltaUpdateChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b,
                                                              aLog: x.aLog, dtBias: x.dtBias, state: x.state,
                                                              mask: x.mask, chunkSize: c.chunkSize)
            XCTAssertEqual(chunked.y.shape, [c.batch, c.tokens, c.valueHeads, c.valueWidth], label)
            XCTAssertEqual(chunked.y.dtype, c.dtype, label)
            XCTAssertEqual(chunked.state.shape, [c.batch, c.valueHeads, c.valueWidth, c.keyWidth], label)
            XCTAssertEqual(chunked.state.dtype, .float32, label)

            let exactState = try exact.state.toFloats().map(Double.init)
            XCTAssertLessThan(scaledError(try chunked.state.toFloats(), exactState), 2e-5, "state, \(label)")
            let y = try chunked.y.toFloats()
            let exactY = try exact.y.toFloats().map(Double.init)
            if c.dtype == .bfloat16 {
                let (within, count) = withinOneULP(y, exactY, slack: 2e-5)
                XCTAssertEqual(within, count, "y elements within one bfloat16 ulp, \(label)")
            } else {
                XCTAssertLessThan(scaledError(y, exactY), 2e-5, "y, \(label)")
            }
            if let maskValues = x.maskValues {
                // Masked tokens write exactly 0, as in the exact update.
                let perToken = c.valueHeads * c.valueWidth
                for (i, real) in maskValues.enumerated() where !real {
                    XCTAssertEqual(Array(y[i * perToken..<(i + 1) * perToken]),
                                   [Float](repeating: 0, count: perToken), "masked token \(i), \(label)")
                }
            }
        }
    }

    /// chunkSize 0 is the default, 32, bit for bit; and without a mask a prefill split into two
    /// calls at a multiple of the chunk size, the first's state passed to the second, gives the
    /// bits of one call.
    func testChunkedDefaultAndSplitPrefill() throws {
        var rng = SeededGenerator()
        let x = try RecurrenceInputs(rng: &rng, batch: 2, tokens: 64, keyHeads: 1, valueHeads: 2,
                                     keyWidth: 32, valueWidth: 4, dtype: .bfloat16, gateDType: .float32,
                                     withState: true, withMask: false)
        let byDefault = try MLXKern.gatedDeltaUpdateChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                                            dtBias: x.dtBias, state: x.state)
        let explicit = try MLXKern.gatedDeltaUpdateChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                                           dtBias: x.dtBias, state: x.state, chunkSize: 32)
        let wholeY = try byDefault.y.toUInt16Bits()
        let wholeState = try byDefault.state.toFloats().map(\.bitPattern)
        XCTAssertEqual(try explicit.y.toUInt16Bits(), wholeY, "seed \(rng.seed)")
        XCTAssertEqual(try explicit.state.toFloats().map(\.bitPattern), wholeState, "seed \(rng.seed)")

        let half = x.tokens / 2
        func part(_ values: [Float], from: Int, _ perToken: [Int], _ dtype: DType) throws -> MLXKArray {
            let n = perToken.reduce(1, *)
            var slice: [Float] = []
            for row in 0..<x.batch {
                let start = (row * x.tokens + from) * n
                slice += values[start..<start + half * n]
            }
            return try .floats(slice, shape: [x.batch, half] + perToken, dtype: dtype)
        }
        var state: MLXKArray = x.state!
        var ys: [[UInt16]] = []
        for from in [0, half] {
            let step = try MLXKern.gatedDeltaUpdateChunked(
                q: part(x.qValues, from: from, [x.keyHeads, x.keyWidth], .bfloat16),
                k: part(x.kValues, from: from, [x.keyHeads, x.keyWidth], .bfloat16),
                v: part(x.vValues, from: from, [x.valueHeads, x.valueWidth], .bfloat16),
                a: part(x.aValues, from: from, [x.valueHeads], .float32),
                b: part(x.bValues, from: from, [x.valueHeads], .float32),
                aLog: x.aLog, dtBias: x.dtBias, state: state, chunkSize: 32)
            state = step.state
            ys.append(try step.y.toUInt16Bits())
        }
        XCTAssertEqual(try state.toFloats().map(\.bitPattern), wholeState, "seed \(rng.seed)")
        let perToken = x.valueHeads * x.valueWidth
        var stitched: [UInt16] = []
        for row in 0..<x.batch {
            for y in ys { stitched += y[row * half * perToken..<(row + 1) * half * perToken] }
        }
        XCTAssertEqual(stitched, wholeY, "seed \(rng.seed)")
    }

    /// A chunk size that is not 0 or a multiple of 16 in [16, 128] is refused with
    /// `.invalidArgument`, naming `chunk_size`.
    func testChunkedRejectsBadChunkSize() throws {
        var rng = SeededGenerator()
        let x = try RecurrenceInputs(rng: &rng, batch: 1, tokens: 3, keyHeads: 1, valueHeads: 1,
                                     keyWidth: 32, valueWidth: 2, dtype: .float32, gateDType: .float32,
                                     withState: false, withMask: false)
        for chunkSize: Int32 in [8, -16, 24, 144, 256, .min] {
            assertMLXKError(.invalidArgument, mentioning: "chunk_size is \(chunkSize)") {
                try MLXKern.gatedDeltaUpdateChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                                    dtBias: x.dtBias, chunkSize: chunkSize)
            }
        }
    }

    // MARK: prefix replay

    /// The replayed state of each row's accepted prefix is bit-identical to the state the
    /// update returns for that prefix — here the update masks every token past the prefix,
    /// which leaves the state untouched — and to the update run on the prefix alone.
    func testPrefixReplayEqualsUpdateState() throws {
        var rng = SeededGenerator()
        let tokens = 6
        let lengths: [Int32] = [0, Int32(tokens), 3, 1]
        for withState in [true, false] {
            let x = try RecurrenceInputs(rng: &rng, batch: lengths.count, tokens: tokens, keyHeads: 2,
                                         valueHeads: 4, keyWidth: 32, valueWidth: 8, dtype: .bfloat16,
                                         gateDType: .bfloat16, withState: withState, withMask: false)
            let replayed = try MLXKern.gatedDeltaState(k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                                       dtBias: x.dtBias, state: x.state,
                                                       acceptedLengths: lengths)
            XCTAssertEqual(replayed.shape, [lengths.count, 4, 8, 32])
            XCTAssertEqual(replayed.dtype, .float32)
            let prefixMask = try MLXKArray.bools((0..<lengths.count * tokens).map { $0 % tokens < Int(lengths[$0 / tokens]) },
                                                 shape: [lengths.count, tokens])
            let masked = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: x.aLog,
                                                      dtBias: x.dtBias, state: x.state, mask: prefixMask)
            let replayedBits = try replayed.toFloats().map(\.bitPattern)
            XCTAssertEqual(replayedBits, try masked.state.toFloats().map(\.bitPattern),
                           "state \(withState), seed \(rng.seed)")

            // Row 2 alone, its 3 accepted tokens only.
            let row = 2, length = Int(lengths[row])
            func prefix(_ values: [Float], _ perToken: [Int], _ dtype: DType) throws -> MLXKArray {
                let n = perToken.reduce(1, *)
                let start = row * tokens * n
                return try .floats(Array(values[start..<start + length * n]), shape: [1, length] + perToken, dtype: dtype)
            }
            let rowState = try x.stateValues.map { values -> MLXKArray in
                let n = 4 * 8 * 32
                return try .floats(Array(values[row * n..<(row + 1) * n]), shape: [1, 4, 8, 32])
            }
            let alone = try MLXKern.gatedDeltaUpdate(
                q: prefix(x.qValues, [2, 32], .bfloat16), k: prefix(x.kValues, [2, 32], .bfloat16),
                v: prefix(x.vValues, [4, 8], .bfloat16), a: prefix(x.aValues, [4], .bfloat16),
                b: prefix(x.bValues, [4], .bfloat16), aLog: x.aLog, dtBias: x.dtBias, state: rowState)
            let n = 4 * 8 * 32
            XCTAssertEqual(Array(replayedBits[row * n..<(row + 1) * n]), try alone.state.toFloats().map(\.bitPattern),
                           "state \(withState), seed \(rng.seed)")

            // And the float64 reference, for the prefixes.
            let ref = x.reference(lengths: lengths.map(Int.init))
            XCTAssertLessThan(scaledError(try replayed.toFloats(), ref.state), 0x1p-8, "seed \(rng.seed)")
        }
    }
}
