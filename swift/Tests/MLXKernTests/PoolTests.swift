import XCTest
import MLXKern

// The calls on a pool of states by slot (Sources/MLXKern/Pools.swift) against the dense calls
// of the same API: each row's state gathered from the pool on the host (zeros for fresh and
// padding rows), the dense call (gatedDeltaUpdate / Chunked / gatedDeltaState / siluRMSHeads)
// on them, and the states scattered back, bit for bit; packed prefill against one call per
// sequence; argument errors naming the argument.

/// Host values of `lengths.count` sequences (rows), each with its own token count.
private struct Sequences {
    let lengths: [Int]
    let keyHeads, valueHeads, keyWidth, valueWidth: Int
    let dtype: DType
    var q: [[Float]] = [], k: [[Float]] = [], v: [[Float]] = [], a: [[Float]] = [], b: [[Float]] = []
    let aLog, dtBias: MLXKArray

    init(rng: inout SeededGenerator, lengths: [Int], heads: (Int, Int, Int, Int), dtype: DType) throws {
        self.lengths = lengths
        (keyHeads, valueHeads, keyWidth, valueWidth) = heads
        self.dtype = dtype
        for length in lengths {
            for unit in 0..<2 {
                var x = rng.normals(length * keyHeads * keyWidth)
                for start in stride(from: 0, to: x.count, by: keyWidth) {
                    let norm = x[start..<start + keyWidth].reduce(0) { $0 + $1 * $1 }.squareRoot()
                    for i in start..<start + keyWidth { x[i] /= norm }
                }
                if unit == 0 { q.append(x) } else { k.append(x) }
            }
            v.append(rng.normals(length * valueHeads * valueWidth))
            a.append(rng.normals(length * valueHeads, scale: 2))
            b.append(rng.normals(length * valueHeads, scale: 2))
        }
        aLog = try .floats(rng.normals(valueHeads, scale: 0.5), shape: [valueHeads])
        dtBias = try .floats(rng.normals(valueHeads, scale: 0.5), shape: [valueHeads], dtype: .bfloat16)
    }

    var stateSize: Int { valueHeads * valueWidth * keyWidth }
    func poolShape(_ n: Int) -> [Int] { [n, valueHeads, valueWidth, keyWidth] }

    /// q, k, v, a, b of sequences `rows`: `[rows, T]` (equal lengths) or packed `[1, total]`.
    func tokens(_ rows: [Int], packed: Bool) throws -> (q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray) {
        let total = rows.reduce(0) { $0 + lengths[$1] }
        let (n, t) = packed ? (1, total) : (rows.count, rows.isEmpty ? 0 : lengths[rows[0]])
        func cat(_ x: [[Float]]) -> [Float] { rows.flatMap { x[$0] } }
        return (try .floats(cat(q), shape: [n, t, keyHeads, keyWidth], dtype: dtype),
                try .floats(cat(k), shape: [n, t, keyHeads, keyWidth], dtype: dtype),
                try .floats(cat(v), shape: [n, t, valueHeads, valueWidth], dtype: dtype),
                try .floats(cat(a), shape: [n, t, valueHeads], dtype: .bfloat16),
                try .floats(cat(b), shape: [n, t, valueHeads]))
    }

    /// The rows' start states: their slots' (zeros for a padding or fresh row).
    func gather(_ pool: [Float], _ slots: [Int32], _ fresh: [Bool]?) -> [Float] {
        let s = stateSize
        var out = [Float](repeating: 0, count: slots.count * s)
        for (row, slot) in slots.enumerated() where slot >= 0 && !(fresh?[row] ?? false) {
            out.replaceSubrange(row * s..<(row + 1) * s, with: pool[Int(slot) * s..<(Int(slot) + 1) * s])
        }
        return out
    }
}

private func bits(_ x: ArraySlice<Float>) -> [UInt32] { x.map(\.bitPattern) }
private func bits(_ x: [Float]) -> [UInt32] { x.map(\.bitPattern) }

/// `rows` distinct slots below `n`, about a quarter negative (padding rows).
private func randomSlots(_ rng: inout SeededGenerator, _ rows: Int, _ n: Int) -> [Int32] {
    var free = (0..<Int32(n)).shuffled(using: &rng)
    return (0..<rows).map { _ in
        free.isEmpty || Int.random(in: 0..<4, using: &rng) == 0 ? -1 - Int32.random(in: 0..<3, using: &rng) : free.removeLast()
    }
}

final class PoolTests: XCTestCase {
    /// A pool call's results against the dense reference (y rows of `yRow` values): slotted
    /// rows' y and slots bit for bit, padding rows' y zero, unnamed slots unchanged.
    private func assertDense(_ s: Sequences, _ slots: [Int32], pool: [Float], y: [Float], newPool: [Float],
                             yRef: [Float], statesRef: [Float], yRow: Int, _ what: String,
                             file: StaticString = #filePath, line: UInt = #line) {
        let n = s.stateSize
        XCTAssertEqual(y.count, yRef.count, what, file: file, line: line)
        XCTAssertEqual(newPool.count, pool.count, what, file: file, line: line)
        for (row, slot) in slots.enumerated() {
            let yr = y[row * yRow..<(row + 1) * yRow]
            if slot < 0 {
                XCTAssertTrue(yr.allSatisfy { $0 == 0 }, "padding row \(row): \(what)", file: file, line: line)
            } else {
                XCTAssertEqual(bits(yr), bits(yRef[row * yRow..<(row + 1) * yRow]), "row \(row)'s y: \(what)", file: file, line: line)
                let dst = Int(slot) * n
                XCTAssertEqual(bits(newPool[dst..<dst + n]), bits(statesRef[row * n..<(row + 1) * n]),
                               "slot \(slot): \(what)", file: file, line: line)
            }
        }
        for slot in 0..<pool.count / n where !slots.contains(Int32(slot)) {
            XCTAssertEqual(bits(newPool[slot * n..<(slot + 1) * n]), bits(pool[slot * n..<(slot + 1) * n]),
                           "unnamed slot \(slot): \(what)", file: file, line: line)
        }
    }

    func testPoolCallIsGatherDenseCallScatterBitForBit() throws {
        var rng = SeededGenerator()
        let cases: [(b: Int, t: Int, heads: (Int, Int, Int, Int), n: Int, dtype: DType)] = [
            (3, 4, (1, 2, 32, 8), 5, .bfloat16),
            (4, 1, (2, 4, 64, 16), 4, .float32),
            (5, 17, (1, 2, 32, 3), 9, .bfloat16),
        ]
        for c in cases {
            let s = try Sequences(rng: &rng, lengths: Array(repeating: c.t, count: c.b), heads: c.heads, dtype: c.dtype)
            let poolHost = rng.normals(c.n * s.stateSize, scale: 0.5)
            let pool = try MLXKArray.floats(poolHost, shape: s.poolShape(c.n))
            let x = try s.tokens(Array(0..<c.b), packed: false)
            for variant in 0..<3 {
                let slots = randomSlots(&rng, c.b, c.n)
                let fresh: [Bool]? = variant == 0 ? nil : (0..<c.b).map { _ in Int.random(in: 0..<3, using: &rng) == 0 }
                let mask: MLXKArray? = variant == 1
                    ? try .bools((0..<c.b * c.t).map { _ in Int.random(in: 0..<4, using: &rng) != 0 }, shape: [c.b, c.t])
                    : nil
                let start = try MLXKArray.floats(s.gather(poolHost, slots, fresh), shape: s.poolShape(c.b))
                let what = "B \(c.b) T \(c.t) slots \(slots) fresh \(String(describing: fresh)) mask \(mask != nil)"
                for chunked in [false, true] {
                    let dense = chunked
                        ? try MLXKern.gatedDeltaUpdateChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                              state: start, mask: mask, chunkSize: 16)
                        : try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                       state: start, mask: mask)
                    let pooled = chunked
                        ? try MLXKern.gatedDeltaUpdatePoolChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                                  pool: pool, slots: slots, fresh: fresh, mask: mask, chunkSize: 16)
                        : try MLXKern.gatedDeltaUpdatePool(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                           pool: pool, slots: slots, fresh: fresh, mask: mask)
                    XCTAssertEqual(pooled.y.dtype, c.dtype)
                    XCTAssertEqual(pooled.pool.shape, s.poolShape(c.n))
                    let y = try pooled.y.toFloats()
                    assertDense(s, slots, pool: poolHost, y: y, newPool: try pooled.pool.toFloats(), yRef: try dense.y.toFloats(),
                                statesRef: try dense.state.toFloats(), yRow: c.t * c.heads.1 * c.heads.3, "\(what) chunked \(chunked)")
                    if !chunked {
                        let verified = try MLXKern.gatedDeltaVerifyPool(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog,
                                                                        dtBias: s.dtBias, pool: pool, slots: slots, fresh: fresh, mask: mask)
                        XCTAssertEqual(bits(try verified.toFloats()), bits(y), "verify's y: \(what)")
                    }
                }
            }
            XCTAssertEqual(bits(try pool.toFloats()), bits(poolHost), "the pool kept by the caller")
        }
    }

    func testPackedPrefillEqualsOneDenseCallPerSequence() throws {
        var rng = SeededGenerator()
        for lengths in [[5, 0, 3, 7], [1], [2, 9, 1, 0, 4, 6]] {
            let (count, n) = (lengths.count, lengths.count + 2)
            let s = try Sequences(rng: &rng, lengths: lengths, heads: (1, 2, 32, 6), dtype: .bfloat16)
            let (size, perToken) = (s.stateSize, 2 * 6)
            let poolHost = rng.normals(n * size, scale: 0.5)
            let pool = try MLXKArray.floats(poolHost, shape: s.poolShape(n))
            let slots = randomSlots(&rng, count, n)
            let fresh = (0..<count).map { _ in Int.random(in: 0..<3, using: &rng) == 0 }
            var cu: [Int32] = [0]
            for length in lengths { cu.append(cu.last! + Int32(length)) }
            let x = try s.tokens(Array(0..<count), packed: true)
            let starts = s.gather(poolHost, slots, fresh)
            for chunked in [false, true] {
                let what = "lengths \(lengths) slots \(slots) fresh \(fresh) chunked \(chunked)"
                let packed = chunked
                    ? try MLXKern.gatedDeltaUpdatePackedChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                                pool: pool, cuSeqlens: cu, slots: slots, fresh: fresh, chunkSize: 16)
                    : try MLXKern.gatedDeltaUpdatePacked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                         pool: pool, cuSeqlens: cu, slots: slots, fresh: fresh)
                XCTAssertEqual(packed.y.shape, [1, Int(cu.last!), 2, 6])
                let y = try packed.y.toFloats(), newPool = try packed.pool.toFloats()
                for (i, length) in lengths.enumerated() {
                    let ys = y[Int(cu[i]) * perToken..<Int(cu[i + 1]) * perToken]
                    let slot = Int(slots[i])
                    if slot < 0 {
                        XCTAssertTrue(ys.allSatisfy { $0 == 0 }, what)
                        continue
                    }
                    let start = Array(starts[i * size..<(i + 1) * size])
                    let dst = newPool[slot * size..<(slot + 1) * size]
                    if length == 0 {  // nothing run: the start state (zeros when fresh) is written
                        XCTAssertEqual(bits(dst), bits(start), "sequence \(i): \(what)")
                        continue
                    }
                    let one = try s.tokens([i], packed: false)
                    let state = try MLXKArray.floats(start, shape: s.poolShape(1))
                    let alone = chunked
                        ? try MLXKern.gatedDeltaUpdateChunked(q: one.q, k: one.k, v: one.v, a: one.a, b: one.b, aLog: s.aLog,
                                                              dtBias: s.dtBias, state: state, chunkSize: 16)
                        : try MLXKern.gatedDeltaUpdate(q: one.q, k: one.k, v: one.v, a: one.a, b: one.b, aLog: s.aLog,
                                                       dtBias: s.dtBias, state: state)
                    XCTAssertEqual(bits(ys), bits(try alone.y.toFloats()), "sequence \(i)'s y: \(what)")
                    XCTAssertEqual(bits(dst), bits(try alone.state.toFloats()), "sequence \(i)'s state: \(what)")
                }
                for slot in 0..<n where !slots.contains(Int32(slot)) {
                    XCTAssertEqual(bits(newPool[slot * size..<(slot + 1) * size]), bits(poolHost[slot * size..<(slot + 1) * size]),
                                   "unnamed slot \(slot): \(what)")
                }
            }
        }
    }

    func testVerifyThenCommitEqualsTheDenseReplay() throws {
        var rng = SeededGenerator()
        let (b, t, n) = (5, 4, 7)
        let s = try Sequences(rng: &rng, lengths: Array(repeating: t, count: b), heads: (2, 4, 32, 8), dtype: .bfloat16)
        let poolHost = rng.normals(n * s.stateSize, scale: 0.5)
        let pool = try MLXKArray.floats(poolHost, shape: s.poolShape(n))
        let x = try s.tokens(Array(0..<b), packed: false)
        let slots = randomSlots(&rng, b, n)
        let fresh = [false, true, false, false, true]
        let accepted: [Int32] = [0, Int32(t)] + (2..<b).map { _ in Int32.random(in: 0...Int32(t), using: &rng) }
        let start = try MLXKArray.floats(s.gather(poolHost, slots, fresh), shape: s.poolShape(b))
        let y = try MLXKern.gatedDeltaVerifyPool(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                 pool: pool, slots: slots, fresh: fresh)
        let dense = try MLXKern.gatedDeltaUpdate(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias, state: start)
        let replayed = try MLXKern.gatedDeltaState(k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                   state: start, acceptedLengths: accepted)
        let committed = try MLXKern.gatedDeltaStatePool(k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                        pool: pool, slots: slots, acceptedLengths: accepted, fresh: fresh)
        let c = try committed.toFloats()
        assertDense(s, slots, pool: poolHost, y: try y.toFloats(), newPool: c, yRef: try dense.y.toFloats(),
                    statesRef: try replayed.toFloats(), yRow: t * 4 * 8, "slots \(slots) accepted \(accepted)")
        if slots[1] >= 0 {  // row 1 accepted every token: its slot holds the update's state
            let size = s.stateSize, dst = Int(slots[1]) * size
            XCTAssertEqual(bits(c[dst..<dst + size]), bits(try dense.state.toFloats()[size..<2 * size]))
        }
    }

    func testFromConvPoolAndAnInPlaceDecodeLoop() throws {
        var rng = SeededGenerator()
        let (hk, hv, dk, dv, b, t, n) = (1, 2, 32, 8, 3, 5, 4)
        let width = 2 * hk * dk + hv * dv
        let conv = try MLXKArray.floats(rng.normals(b * t * width), shape: [b, t, width], dtype: .bfloat16)
        let qScale = try MLXKArray.floats(rng.normals(dk, scale: 0.2), shape: [dk], dtype: .bfloat16)
        let kScale = try MLXKArray.floats(rng.normals(dk, scale: 0.2), shape: [dk], dtype: .bfloat16)
        let a = try MLXKArray.floats(rng.normals(b * t * hv), shape: [b, t, hv], dtype: .bfloat16)
        let bb = try MLXKArray.floats(rng.normals(b * t * hv), shape: [b, t, hv], dtype: .bfloat16)
        let aLog = try MLXKArray.floats(rng.normals(hv, scale: 0.5), shape: [hv])
        let dtBias = try MLXKArray.floats(rng.normals(hv, scale: 0.5), shape: [hv])
        let poolHost = rng.normals(n * hv * dv * dk)
        let pool = try MLXKArray.floats(poolHost, shape: [n, hv, dv, dk])
        let slots: [Int32] = [2, -1, 0]
        let fresh = [false, false, true]
        let eps = 1e-6 / Float(dk)

        let fused = try MLXKern.gatedDeltaUpdateFromConvPool(
            x: conv, qScale: qScale, kScale: kScale, keyHeads: hk, valueHeads: hv, valueWidth: dv, eps: eps,
            a: a, b: bb, aLog: aLog, dtBias: dtBias, pool: pool, slots: slots, fresh: fresh)
        let heads = try MLXKern.siluRMSHeads(x: conv, qScale: qScale, kScale: kScale, keyHeads: hk, valueHeads: hv,
                                             valueWidth: dv, eps: eps)
        let split = try MLXKern.gatedDeltaUpdatePool(q: heads.q, k: heads.k, v: heads.v, a: a, b: bb, aLog: aLog,
                                                     dtBias: dtBias, pool: pool, slots: slots, fresh: fresh)
        let sy = try split.y.toFloats(), sp = try split.pool.toFloats()
        XCTAssertEqual(bits(try fused.y.toFloats()), bits(sy))
        XCTAssertEqual(bits(try fused.pool.toFloats()), bits(sp))

        // Decode: one token at a time, the pool replaced (the old one released) before it is
        // evaluated.
        let (q, k, v, av, bv) = (try heads.q.toFloats(), try heads.k.toFloats(), try heads.v.toFloats(),
                                 try a.toFloats(), try bb.toFloats())
        func token(_ x: [Float], _ step: Int, _ width: Int) -> [Float] {
            (0..<b).flatMap { r in x[(r * t + step) * width..<(r * t + step + 1) * width] }
        }
        var state = try MLXKArray.floats(poolHost, shape: [n, hv, dv, dk])
        var ys: [[Float]] = []
        for step in 0..<t {
            let one = try MLXKern.gatedDeltaUpdatePool(
                q: try .floats(token(q, step, hk * dk), shape: [b, 1, hk, dk], dtype: .bfloat16),
                k: try .floats(token(k, step, hk * dk), shape: [b, 1, hk, dk], dtype: .bfloat16),
                v: try .floats(token(v, step, hv * dv), shape: [b, 1, hv, dv], dtype: .bfloat16),
                a: try .floats(token(av, step, hv), shape: [b, 1, hv], dtype: .bfloat16),
                b: try .floats(token(bv, step, hv), shape: [b, 1, hv], dtype: .bfloat16),
                aLog: aLog, dtBias: dtBias, pool: state, slots: slots, fresh: step == 0 ? fresh : nil)
            state = one.pool
            try state.eval()
            ys.append(try one.y.toFloats())
        }
        XCTAssertEqual(bits(try state.toFloats()), bits(sp), "the decode loop's pool")
        let w = hv * dv
        for step in 0..<t {
            for r in 0..<b {
                XCTAssertEqual(bits(ys[step][r * w..<(r + 1) * w]), bits(sy[(r * t + step) * w..<(r * t + step + 1) * w]),
                               "decode step \(step) row \(r)")
            }
        }
    }

    func testBadArgumentsThrowErrorsNamingThem() throws {
        var rng = SeededGenerator()
        let s = try Sequences(rng: &rng, lengths: [2, 2, 2], heads: (1, 1, 32, 4), dtype: .float32)
        let x = try s.tokens([0, 1, 2], packed: false)
        let p = try s.tokens([0, 1, 2], packed: true)
        let pool = try MLXKArray.zeros(shape: s.poolShape(4))
        func update(_ slots: [Int32], _ fresh: [Bool]? = nil, in other: MLXKArray? = nil) throws -> Any {
            try MLXKern.gatedDeltaUpdatePool(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                             pool: other ?? pool, slots: slots, fresh: fresh)
        }
        assertMLXKError(.invalidArgument, mentioning: "mlxk_gated_delta_update_pool: slots[2] is 1, which slots[0] names too") {
            try update([1, 3, 1])
        }
        assertMLXKError(.invalidArgument, mentioning: "slots[1] is 4; expected a pool row below N = 4") {
            try MLXKern.gatedDeltaVerifyPool(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                             pool: pool, slots: [0, 4, -1])
        }
        assertMLXKError(.invalidArgument, mentioning: "MLXKern.gatedDeltaUpdatePool: fresh: 2 values for 3 slots") {
            try update([0, 1, 2], [true, false])
        }
        let bf16Pool = try MLXKArray.zeros(shape: s.poolShape(4), dtype: .bfloat16)
        assertMLXKError(.dtype, mentioning: "pool: dtype bfloat16") { try update([0, 1, 2], in: bf16Pool) }
        assertMLXKError(.invalidArgument, mentioning: "acceptedLengths: 2 values for 3 slots") {
            try MLXKern.gatedDeltaStatePool(k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias, pool: pool,
                                            slots: [0, 1, 2], acceptedLengths: [1, 1])
        }
        assertMLXKError(.invalidArgument, mentioning: "accepted_lengths") {
            try MLXKern.gatedDeltaStatePool(k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias, pool: pool,
                                            slots: [0, 1, 2], acceptedLengths: [1, 3, 0])
        }
        assertMLXKError(.invalidArgument, mentioning: "slots: 1 slots for 2 sequences") {
            try MLXKern.gatedDeltaUpdatePacked(q: p.q, k: p.k, v: p.v, a: p.a, b: p.b, aLog: s.aLog, dtBias: s.dtBias,
                                               pool: pool, cuSeqlens: [0, 2, 6], slots: [0])
        }
        assertMLXKError(.invalidArgument, mentioning: "cu_seqlens[2] is 5; expected total_T = 6") {
            try MLXKern.gatedDeltaUpdatePacked(q: p.q, k: p.k, v: p.v, a: p.a, b: p.b, aLog: s.aLog, dtBias: s.dtBias,
                                               pool: pool, cuSeqlens: [0, 4, 5], slots: [0, 1])
        }
        assertMLXKError(.invalidArgument, mentioning: "chunk_size") {
            try MLXKern.gatedDeltaUpdatePoolChunked(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: s.aLog, dtBias: s.dtBias,
                                                    pool: pool, slots: [0, 1, 2], chunkSize: 8)
        }
    }
}
