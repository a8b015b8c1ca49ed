import Foundation
import XCTest
import MLXKern

// The backward passes against central differences of float64 forwards: for each input, the
// gradient along a random direction u, Σ grad·u, must equal dL/dt at t = 0 of L(input + t·u),
// L = Σ cotangent · output. float32 inputs: the library computes in float32 (float64 sums), so
// the error is a few float32 roundings of each term: |Σ grad·u − dL/dt| ≤ rtol · Σ |grad·u|
// with rtol 1e-4 for the norms and 2e-3 for the update (its tests' bound: f32 sums over T·Dk
// terms). The central difference (h = 1e-5 on float64 losses) is far more accurate.

private let step = 1e-5

/// Σ a·b.
private func dot(_ a: [Double], _ b: [Double]) -> Double { zip(a, b).reduce(0) { $0 + $1.0 * $1.1 } }

/// Checks the gradient of input `index` along a random direction.
private func checkDirection(_ what: String, _ inputs: [[Double]], _ index: Int, _ grad: [Float],
                            rtol: Double, rng: inout SeededGenerator,
                            file: StaticString = #filePath, line: UInt = #line,
                            loss: ([[Double]]) -> Double) {
    let u = rng.normals(grad.count).map(Double.init)
    func moved(_ t: Double) -> Double {
        var copy = inputs
        for i in u.indices { copy[index][i] += t * u[i] }
        return loss(copy)
    }
    let numeric = (moved(step) - moved(-step)) / (2 * step)
    let g = grad.map(Double.init)
    let along = dot(g, u)
    let scale = zip(g, u).reduce(0) { $0 + abs($1.0 * $1.1) }
    XCTAssertGreaterThan(scale, 0, what, file: file, line: line)
    XCTAssertLessThanOrEqual(abs(along - numeric), rtol * scale + 1e-6,
                             "\(what): Σ grad·u = \(along), central difference \(numeric), seed \(rng.seed)",
                             file: file, line: line)
}

/// Gated RMSNorm in float64, rows of D = weight.count.
private func gatedNorm(_ x: [Double], _ gate: [Double], _ weight: [Double], eps: Double) -> [Double] {
    let d = weight.count
    var out = [Double](repeating: 0, count: x.count)
    for r in 0..<(x.count / d) {
        let row = x[r * d..<(r + 1) * d]
        let inv = 1 / (row.reduce(0) { $0 + $1 * $1 } / Double(d) + eps).squareRoot()
        for i in 0..<d { out[r * d + i] = silu(gate[r * d + i]) * weight[i] * x[r * d + i] * inv }
    }
    return out
}

/// The head split in float64: q, k, v concatenated per row as the library lays them out.
private func headSplit(_ x: [Double], rows: Int, hk: Int, hv: Int, dk: Int, dv: Int,
                       qScale: [Double], kScale: [Double], eps: Double) -> (q: [Double], k: [Double], v: [Double]) {
    let c = 2 * hk * dk + hv * dv
    var (q, k, v) = ([Double](), [Double](), [Double]())
    for r in 0..<rows {
        for head in 0..<(2 * hk) {
            let s = (0..<dk).map { silu(x[r * c + head * dk + $0]) }
            let inv = 1 / (s.reduce(0) { $0 + $1 * $1 } / Double(dk) + eps).squareRoot()
            let scale = head < hk ? qScale : kScale
            let normalized = (0..<dk).map { scale[$0] * s[$0] * inv }
            if head < hk { q += normalized } else { k += normalized }
        }
        v += (0..<(hv * dv)).map { silu(x[r * c + 2 * hk * dk + $0]) }
    }
    return (q, k, v)
}

final class GradientTests: XCTestCase {
    func testGatedRMSNormVJP() throws {
        var rng = SeededGenerator()
        let (rows, d) = (3, 40)
        let x = rng.normals(rows * d, scale: 2), gate = rng.normals(rows * d, scale: 3)
        let weight = rng.uniforms(d, in: 0.5...1.5), dout = rng.normals(rows * d)
        let eps: Float = 1e-6
        let g = try MLXKern.gatedRMSNormVJP(
            x: try .floats(x, shape: [rows, d]), gate: try .floats(gate, shape: [rows, d]),
            weight: try .floats(weight, shape: [d]), eps: eps, dout: try .floats(dout, shape: [rows, d]))
        XCTAssertEqual(g.dx.shape, [rows, d])
        XCTAssertEqual(g.dgate.dtype, .float32)
        XCTAssertEqual(g.dweight.shape, [d])
        let inputs = [x, gate, weight].map { $0.map(Double.init) }
        let cot = dout.map(Double.init)
        for (i, (name, grad)) in [("dx", g.dx), ("dgate", g.dgate), ("dweight", g.dweight)].enumerated() {
            checkDirection(name, inputs, i, try grad.toFloats(), rtol: 1e-4, rng: &rng) { a in
                dot(cot, gatedNorm(a[0], a[1], a[2], eps: Double(eps)))
            }
        }
        // No cotangent: zeros.
        let none = try MLXKern.gatedRMSNormVJP(x: try .floats(x, shape: [rows, d]),
                                               gate: try .floats(gate, shape: [rows, d]),
                                               weight: try .floats(weight, shape: [d]), eps: eps)
        XCTAssertTrue(try none.dx.toFloats().allSatisfy { $0 == 0 })
        XCTAssertTrue(try none.dweight.toFloats().allSatisfy { $0 == 0 })
    }

    func testSiluRMSHeadsVJP() throws {
        var rng = SeededGenerator()
        let (batch, tokens, hk, hv, dk, dv) = (1, 2, 2, 4, 16, 7)
        let rows = batch * tokens, c = 2 * hk * dk + hv * dv
        let x = rng.normals(rows * c, scale: 2)
        let qs = rng.uniforms(dk, in: 0.5...1.5), ks = rng.uniforms(dk, in: 0.5...1.5)
        let dq = rng.normals(rows * hk * dk), dkc = rng.normals(rows * hk * dk), dvc = rng.normals(rows * hv * dv)
        let eps: Float = 1e-6 / Float(dk)
        let g = try MLXKern.siluRMSHeadsVJP(
            x: try .floats(x, shape: [batch, tokens, c]), qScale: try .floats(qs, shape: [dk]),
            kScale: try .floats(ks, shape: [dk]), keyHeads: hk, valueHeads: hv, valueWidth: dv, eps: eps,
            dq: try .floats(dq, shape: [batch, tokens, hk, dk]),
            dk: try .floats(dkc, shape: [batch, tokens, hk, dk]),
            dv: try .floats(dvc, shape: [batch, tokens, hv, dv]))
        XCTAssertEqual(g.dx.shape, [batch, tokens, c])
        XCTAssertEqual(g.dqScale.shape, [dk])
        let inputs = [x, qs, ks].map { $0.map(Double.init) }
        let cot = [dq, dkc, dvc].map { $0.map(Double.init) }
        for (i, (name, grad)) in [("dx", g.dx), ("dqScale", g.dqScale), ("dkScale", g.dkScale)].enumerated() {
            checkDirection(name, inputs, i, try grad.toFloats(), rtol: 1e-4, rng: &rng) { a in
                let out = headSplit(a[0], rows: rows, hk: hk, hv: hv, dk: dk, dv: dv,
                                    qScale: a[1], kScale: a[2], eps: Double(eps))
                return dot(cot[0], out.q) + dot(cot[1], out.k) + dot(cot[2], out.v)
            }
        }
        assertMLXKError(.shape, mentioning: "dv: dimension 3 (Dv)") {
            try MLXKern.siluRMSHeadsVJP(x: try .floats(x, shape: [batch, tokens, c]),
                                        qScale: try .floats(qs, shape: [dk]), kScale: try .floats(ks, shape: [dk]),
                                        keyHeads: hk, valueHeads: hv, valueWidth: dv, eps: eps,
                                        dv: try .floats(dq, shape: [batch, tokens, hv, 2 * dk / hv]))
        }
    }

    func testGatedDeltaUpdateVJP() throws {
        try checkUpdateVJP(tokens: 4, chunk: nil)
    }

    /// The chunked backward over two chunks of 16 and a partial third.
    func testGatedDeltaUpdateChunkedVJP() throws {
        try checkUpdateVJP(tokens: 37, chunk: 16)
        var rng = SeededGenerator()
        let x = try [[1, 2, 1, 32], [1, 2, 1, 32], [1, 2, 1, 2], [1, 2, 1], [1, 2, 1], [1], [1]].map {
            try MLXKArray.floats(rng.normals($0.reduce(1, *), scale: 0.3), shape: $0)
        }
        assertMLXKError(.invalidArgument, mentioning: "chunk_size") {
            try MLXKern.gatedDeltaUpdateChunkedVJP(q: x[0], k: x[1], v: x[2], a: x[3], b: x[4], aLog: x[5],
                                                   dtBias: x[6], chunkSize: 24)
        }
    }

    /// The update's gradients (the exact backward, or with `chunk` the chunked one) against
    /// central differences of the float64 recurrence.
    private func checkUpdateVJP(tokens t: Int, chunk: Int32?) throws {
        var rng = SeededGenerator()
        let (b, hk, hv, dk, dv) = (1, 1, 2, 32, 3)
        let shapes = [[b, t, hk, dk], [b, t, hk, dk], [b, t, hv, dv], [b, t, hv], [b, t, hv], [hv], [hv], [b, hv, dv, dk]]
        let scales: [Float] = [0.2, 0.2, 1, 1, 1, 0.5, 0.5, 0.5]
        let values = zip(shapes, scales).map { rng.normals($0.reduce(1, *), scale: $1) }
        let arrays = try zip(values, shapes).map { try MLXKArray.floats($0, shape: $1) }
        let dy = rng.normals(b * t * hv * dv), dState = rng.normals(b * hv * dv * dk, scale: 0.5)
        let dyA = try MLXKArray.floats(dy, shape: [b, t, hv, dv])
        let dsA = try MLXKArray.floats(dState, shape: [b, hv, dv, dk])
        let g = try chunk.map {
            try MLXKern.gatedDeltaUpdateChunkedVJP(
                q: arrays[0], k: arrays[1], v: arrays[2], a: arrays[3], b: arrays[4], aLog: arrays[5],
                dtBias: arrays[6], state: arrays[7], chunkSize: $0, dy: dyA, dStateOut: dsA)
        } ?? MLXKern.gatedDeltaUpdateVJP(
            q: arrays[0], k: arrays[1], v: arrays[2], a: arrays[3], b: arrays[4], aLog: arrays[5],
            dtBias: arrays[6], state: arrays[7], dy: dyA, dStateOut: dsA)
        let grads = [g.dq, g.dk, g.dv, g.da, g.db, g.daLog, g.dDtBias, g.dState]
        for (grad, shape) in zip(grads, shapes) { XCTAssertEqual(grad.shape, shape) }
        let inputs = values.map { $0.map(Double.init) }
        let (cy, cs) = (dy.map(Double.init), dState.map(Double.init))
        // Σ dy·y + Σ dState·state of the float64 recurrence (docs/DESIGN.md §4).
        func loss(_ a: [[Double]]) -> Double {
            let (q, k, v, ga, gb, aLog, dtBias) = (a[0], a[1], a[2], a[3], a[4], a[5], a[6])
            var total = 0.0
            for h in 0..<hv {
                for row in 0..<dv {
                    let at = (h * dv + row) * dk
                    var s: [Double] = Array(a[7][at..<at + dk])
                    for tok in 0..<t {
                        let gi = tok * hv + h
                        let g: Double = exp(-exp(aLog[h]) * softplus(ga[gi] + dtBias[h]))
                        let beta: Double = sigmoid(gb[gi])
                        let kq = (tok * hk + h / (hv / hk)) * dk
                        var kv = 0.0
                        for j in 0..<dk {
                            s[j] *= g
                            kv += s[j] * k[kq + j]
                        }
                        let delta: Double = (v[gi * dv + row] - kv) * beta
                        var y = 0.0
                        for j in 0..<dk {
                            s[j] += k[kq + j] * delta
                            y += s[j] * q[kq + j]
                        }
                        total += cy[gi * dv + row] * y
                    }
                    for j in 0..<dk { total += cs[at + j] * s[j] }
                }
            }
            return total
        }
        let names = ["dq", "dk", "dv", "da", "db", "daLog", "dDtBias", "dState"]
        for (i, grad) in grads.enumerated() {
            checkDirection(names[i], inputs, i, try grad.toFloats(), rtol: 2e-3, rng: &rng, loss: loss)
        }
        assertMLXKError(.shape, mentioning: "dy:") {
            try MLXKern.gatedDeltaUpdateVJP(q: arrays[0], k: arrays[1], v: arrays[2], a: arrays[3],
                                            b: arrays[4], aLog: arrays[5], dtBias: arrays[6], dy: arrays[0])
        }
    }
}
