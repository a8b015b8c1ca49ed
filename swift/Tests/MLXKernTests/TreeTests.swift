import XCTest
import MLXKern

// The tree calls (Sources/MLXKern/Pools.swift: gatedDeltaVerifyTreePool,
// gatedDeltaCommitTreePool) against the chain calls of the same API on random draft trees:
// every node's y is the last y of gatedDeltaVerifyPool on its path, each tree's commit
// gatedDeltaStatePool on that path, bit for bit; counts of the wrong length refused before the
// library reads them; the library's refusals name the argument.

/// Host tokens of T nodes (Hk 1, Hv 2, Dk 32, Dv 8) and the arrays of chosen ones as one row.
private struct TreeTokens {
    static let (hk, hv, dk, dv) = (1, 2, 32, 8)
    var q: [Float], k: [Float], v: [Float], a: [Float], b: [Float]

    init(rng: inout SeededGenerator, count t: Int) {
        q = rng.normals(t * Self.hk * Self.dk, scale: 0.2)
        k = rng.normals(t * Self.hk * Self.dk, scale: 0.2)
        v = rng.normals(t * Self.hv * Self.dv)
        a = rng.normals(t * Self.hv, scale: 2)
        b = rng.normals(t * Self.hv, scale: 2)
    }

    func arrays(_ pick: [Int]) throws -> (q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray) {
        func take(_ x: [Float], _ per: Int) -> [Float] { pick.flatMap { x[$0 * per..<($0 + 1) * per] } }
        let n = pick.count
        return (try .floats(take(q, Self.hk * Self.dk), shape: [1, n, Self.hk, Self.dk], dtype: .bfloat16),
                try .floats(take(k, Self.hk * Self.dk), shape: [1, n, Self.hk, Self.dk], dtype: .bfloat16),
                try .floats(take(v, Self.hv * Self.dv), shape: [1, n, Self.hv, Self.dv], dtype: .bfloat16),
                try .floats(take(a, Self.hv), shape: [1, n, Self.hv]),
                try .floats(take(b, Self.hv), shape: [1, n, Self.hv]))
    }
}

/// A random tree of `size` nodes: each node's parent an earlier node, or -1 now and then.
private func randomTree(_ rng: inout SeededGenerator, _ size: Int) -> [Int32] {
    (0..<size).map { j in j == 0 || Int.random(in: 0..<10, using: &rng) == 0 ? -1 : Int32.random(in: 0..<Int32(j), using: &rng) }
}

private func pathTo(_ parents: [Int32], _ j: Int) -> [Int] {
    var path = [j]
    while parents[path.last!] >= 0 { path.append(Int(parents[path.last!])) }
    return path.reversed()
}

final class TreeTests: XCTestCase {
    func testEveryNodeIsTheChainVerifyOfItsPathAndTheCommitTheChainCommit() throws {
        var rng = SeededGenerator()
        let chain: [Int32] = (0..<8).map { Int32($0) - 1 }
        let star: [Int32] = [-1, 0, 0, 0, 0, 0]
        let shapes: [[[Int32]]] = [[[-1]], [chain], [star, randomTree(&rng, 9), [-1, 0]], [randomTree(&rng, 12), [], randomTree(&rng, 5)]]
        let (hv, dv, dk) = (TreeTokens.hv, TreeTokens.dv, TreeTokens.dk)
        for trees in shapes {
            var cu: [Int32] = [0]
            for t in trees { cu.append(cu.last! + Int32(t.count)) }
            let parents = trees.flatMap { $0 }
            let total = parents.count, n = trees.count + 2, size = hv * dv * dk, tok = hv * dv
            let poolHost = rng.normals(n * size, scale: 0.5)
            let pool = try MLXKArray.floats(poolHost, shape: [n, hv, dv, dk])
            let aLog = try MLXKArray.floats(rng.normals(hv, scale: 0.5), shape: [hv])
            let dtBias = try MLXKArray.floats(rng.normals(hv, scale: 0.5), shape: [hv])
            let tokens = TreeTokens(rng: &rng, count: total)
            let slots: [Int32] = trees.indices.map { i in i == 1 && trees.count > 2 ? -1 : Int32((i * 3 + 1) % n) }
            let fresh = trees.map { _ in Int.random(in: 0..<3, using: &rng) == 0 }
            let x = try tokens.arrays(Array(0..<total))
            let y = try MLXKern.gatedDeltaVerifyTreePool(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: aLog, dtBias: dtBias,
                                                         pool: pool, cuNodes: cu, parents: parents, slots: slots, fresh: fresh)
            let yh = try y.toFloats()
            var lengths: [Int32] = [], accepted: [Int32] = [], paths: [[Int]] = []
            for (i, tree) in trees.enumerated() {
                let c0 = Int(cu[i])
                for j in tree.indices {
                    let got = yh[(c0 + j) * tok..<(c0 + j + 1) * tok]
                    if slots[i] < 0 {
                        XCTAssert(got.allSatisfy { $0 == 0 }, "padding tree \(i) node \(j)")
                        continue
                    }
                    let c = try tokens.arrays(pathTo(tree, j).map { c0 + $0 })
                    let want = try MLXKern.gatedDeltaVerifyPool(q: c.q, k: c.k, v: c.v, a: c.a, b: c.b, aLog: aLog, dtBias: dtBias,
                                                                pool: pool, slots: [slots[i]], fresh: [fresh[i]]).toFloats()
                    XCTAssertEqual(got.map(\.bitPattern), want[(want.count - tok)...].map(\.bitPattern), "trees \(trees) tree \(i) node \(j)")
                }
                let path = tree.isEmpty ? [] : pathTo(tree, Int.random(in: 0..<tree.count, using: &rng))
                lengths.append(Int32(path.count))
                accepted += path.map { Int32($0) }
                paths.append(path.map { c0 + $0 })
            }
            let committed = try MLXKern.gatedDeltaCommitTreePool(k: x.k, v: x.v, a: x.a, b: x.b, aLog: aLog, dtBias: dtBias,
                                                                 pool: pool, cuNodes: cu, parents: parents, slots: slots,
                                                                 acceptedLengths: lengths, acceptedPaths: accepted,
                                                                 fresh: fresh).toFloats()
            for (i, path) in paths.enumerated() where slots[i] >= 0 {
                let c = try tokens.arrays(path)
                let want = try MLXKern.gatedDeltaStatePool(k: c.k, v: c.v, a: c.a, b: c.b, aLog: aLog, dtBias: dtBias, pool: pool,
                                                           slots: [slots[i]], acceptedLengths: [Int32(path.count)],
                                                           fresh: [fresh[i]]).toFloats()
                let at = Int(slots[i]) * size
                XCTAssertEqual(committed[at..<at + size].map(\.bitPattern), want[at..<at + size].map(\.bitPattern),
                               "trees \(trees) tree \(i)'s commit")
            }
        }
    }

    func testBadTreesPathsAndCountsThrowErrorsNamingThem() throws {
        var rng = SeededGenerator()
        let tokens = TreeTokens(rng: &rng, count: 3)
        let x = try tokens.arrays([0, 1, 2])
        let pool = try MLXKArray.zeros(shape: [3, TreeTokens.hv, TreeTokens.dv, TreeTokens.dk])
        let aLog = try MLXKArray.floats([0.1, 0.2], shape: [2])
        let dtBias = try MLXKArray.floats([0.3, 0.4], shape: [2])
        func verify(_ cu: [Int32], _ parents: [Int32], _ slots: [Int32]) throws -> MLXKArray {
            try MLXKern.gatedDeltaVerifyTreePool(q: x.q, k: x.k, v: x.v, a: x.a, b: x.b, aLog: aLog, dtBias: dtBias,
                                                 pool: pool, cuNodes: cu, parents: parents, slots: slots)
        }
        func commit(_ lengths: [Int32], _ paths: [Int32]) throws -> MLXKArray {
            try MLXKern.gatedDeltaCommitTreePool(k: x.k, v: x.v, a: x.a, b: x.b, aLog: aLog, dtBias: dtBias, pool: pool,
                                                 cuNodes: [0, 3], parents: [-1, 0, 1], slots: [1],
                                                 acceptedLengths: lengths, acceptedPaths: paths)
        }
        assertMLXKError(.invalidArgument, mentioning: "slots: 1 values for 2 trees") { try verify([0, 2, 3], [-1, 0, -1], [0]) }
        assertMLXKError(.invalidArgument, mentioning: "parents[1] is 2") { try verify([0, 3], [-1, 2, 0], [1]) }
        assertMLXKError(.invalidArgument, mentioning: "cu_nodes[1] is 4") { try verify([0, 4], [-1, 0, 1], [1]) }
        assertMLXKError(.invalidArgument, mentioning: "acceptedLengths: 2 values for 1 slots") { try commit([1, 1], [0, 0]) }
        assertMLXKError(.invalidArgument, mentioning: "accepted_paths[1] is node 2") { try commit([2], [0, 2]) }
        assertMLXKError(.invalidArgument, mentioning: "n_accepted is 1") { try commit([2], [0]) }
    }
}
