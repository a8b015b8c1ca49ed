import CMLXKern

// The Gated DeltaNet calls on a pool of recurrent states addressed by slot, as engines keep
// them (mlxkern.h: mlxk_gated_delta_update_pool and the calls after it). Every sequence's
// state lives in one pool float32 `[N, Hv, Dv, Dk]`; each batch row (each sequence, when
// packed) names its own by slot. A negative slot is a padding row (y zeros, nothing read or
// written); two rows may not name one slot. `fresh` (nil: none) holds one flag per slot: true
// starts that row from zeros (its slot is then written).
//
// In place: replace the pool with the returned one before evaluating it (`pool = r.pool`
// drops the old array); with no other owner left, the CPU kernel writes the named states into
// the old pool's buffer, those states only, never all N.
//
// A per-slot array of another length than `slots` throws `.invalidArgument` here, before the
// library reads it.

extension MLXKern {
    /// Throws unless a per-slot host array holds one value per slot.
    private static func checkPerSlot(_ count: Int, _ slots: Int, _ function: String,
                                     _ name: String) throws {
        guard count == slots else {
            throw MLXKError(status: .invalidArgument, message:
                "\(function): \(name): \(count) values for \(slots) slots; expected one per slot")
        }
    }

    /// Calls `body` with the slots and the fresh flags (as bytes; nil: none), checked.
    private static func withRows<R>(
        _ slots: [Int32], _ fresh: [Bool]?, _ function: String,
        _ body: (UnsafePointer<Int32>?, UnsafePointer<UInt8>?, Int) throws -> R
    ) throws -> R {
        let flags = fresh.map { $0.map { $0 ? UInt8(1) : UInt8(0) } }
        if let flags { try checkPerSlot(flags.count, slots.count, function, "fresh") }
        return try slots.withUnsafeBufferPointer { s in
            guard let flags else { return try body(s.baseAddress, nil, s.count) }
            return try flags.withUnsafeBufferPointer { f in try body(s.baseAddress, f.baseAddress, s.count) }
        }
    }

    /// A packed call reads one slot per sequence: `cuSeqlens.count - 1`.
    private static func checkPacked(_ cuSeqlens: [Int32], _ slots: [Int32], _ function: String) throws {
        guard cuSeqlens.isEmpty || slots.count == cuSeqlens.count - 1 else {
            throw MLXKError(status: .invalidArgument, message:
                "\(function): slots: \(slots.count) slots for \(cuSeqlens.count - 1) sequences " +
                "(cuSeqlens holds N + 1 offsets); expected one per sequence")
        }
    }

    /// `gatedDeltaUpdate` on a pool: row b starts from `pool[slots[b]]` (zeros where fresh)
    /// and its final state goes back there; bit for bit gathering those states,
    /// `gatedDeltaUpdate` on them and scattering the states back.
    ///
    /// - Parameters: `q` ... `dtBias` and `mask` as `gatedDeltaUpdate`; `pool` `[N, Hv, Dv,
    ///   Dk]` float32; `slots` one per batch row (negative: padding); `fresh` one per slot.
    /// - Returns: `y` `[B, T, Hv, Dv]` in q's dtype and the new `pool`, both lazy.
    /// - Throws: `MLXKError` naming the argument at fault (`.invalidArgument` for the slots,
    ///   e.g. one slot named twice, `.dtype` for a pool that is not float32).
    public static func gatedDeltaUpdatePool(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, pool: MLXKArray, slots: [Int32],
        fresh: [Bool]? = nil, mask: MLXKArray? = nil
    ) throws -> (y: MLXKArray, pool: MLXKArray) {
        var y: OpaquePointer?
        var poolOut: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, pool, mask)) {
            try withRows(slots, fresh, "MLXKern.gatedDeltaUpdatePool") { s, f, n in
                try check(mlxk_gated_delta_update_pool(
                    q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                    pool.handle, s, f, n, mask?.handle, &y, &poolOut))
            }
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update_pool"),
                MLXKArray.adopt(poolOut, "mlxk_gated_delta_update_pool"))
    }

    /// `gatedDeltaUpdatePool` in the chunked (WY) form of `gatedDeltaUpdateChunked`
    /// (`chunkSize` as there): each row's results equal `gatedDeltaUpdateChunked`'s on the
    /// gathered states, bit for bit, on the CPU and on the GPU.
    public static func gatedDeltaUpdatePoolChunked(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, pool: MLXKArray, slots: [Int32],
        fresh: [Bool]? = nil, mask: MLXKArray? = nil, chunkSize: Int32 = 0
    ) throws -> (y: MLXKArray, pool: MLXKArray) {
        var y: OpaquePointer?
        var poolOut: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, pool, mask)) {
            try withRows(slots, fresh, "MLXKern.gatedDeltaUpdatePoolChunked") { s, f, n in
                try check(mlxk_gated_delta_update_pool_chunked(
                    q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                    pool.handle, s, f, n, mask?.handle, chunkSize, &y, &poolOut))
            }
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update_pool_chunked"),
                MLXKArray.adopt(poolOut, "mlxk_gated_delta_update_pool_chunked"))
    }

    /// Speculative verify on a pool: `gatedDeltaUpdatePool`'s y over each row's draft window
    /// (bit for bit), reading the pool and writing no state. Commit each row's accepted prefix
    /// with `gatedDeltaStatePool` on the same k, v and gates.
    public static func gatedDeltaVerifyPool(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, pool: MLXKArray, slots: [Int32],
        fresh: [Bool]? = nil, mask: MLXKArray? = nil
    ) throws -> MLXKArray {
        var y: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, pool, mask)) {
            try withRows(slots, fresh, "MLXKern.gatedDeltaVerifyPool") { s, f, n in
                try check(mlxk_gated_delta_verify_pool(
                    q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                    pool.handle, s, f, n, mask?.handle, &y))
            }
        }
        return MLXKArray.adopt(y, "mlxk_gated_delta_verify_pool")
    }

    /// Packed variable-length prefill on a pool: q, k `[1, totalT, Hk, Dk]`, v
    /// `[1, totalT, Hv, Dv]`, a, b `[1, totalT, Hv]` hold the sequences one after another;
    /// sequence i owns tokens `[cuSeqlens[i], cuSeqlens[i + 1])` (N + 1 offsets: 0, then each
    /// end; zero-length sequences allowed) and slot `slots[i]`. Each sequence's y and state
    /// equal one `gatedDeltaUpdate` on it alone, bit for bit. No mask.
    ///
    /// - Returns: `y` `[1, totalT, Hv, Dv]` and the new `pool`, both lazy.
    /// - Throws: as `gatedDeltaUpdatePool`, and `.invalidArgument` naming the offset of
    ///   `cu_seqlens` at fault.
    public static func gatedDeltaUpdatePacked(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, pool: MLXKArray, cuSeqlens: [Int32],
        slots: [Int32], fresh: [Bool]? = nil
    ) throws -> (y: MLXKArray, pool: MLXKArray) {
        let function = "MLXKern.gatedDeltaUpdatePacked"
        try checkPacked(cuSeqlens, slots, function)
        var y: OpaquePointer?
        var poolOut: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, pool)) {
            try withRows(slots, fresh, function) { s, f, _ in
                try cuSeqlens.withUnsafeBufferPointer { cu in
                    try check(mlxk_gated_delta_update_packed(
                        q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle,
                        dtBias.handle, pool.handle, cu.baseAddress, cu.count, s, f, &y, &poolOut))
                }
            }
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update_packed"),
                MLXKArray.adopt(poolOut, "mlxk_gated_delta_update_packed"))
    }

    /// `gatedDeltaUpdatePacked` in the chunked (WY) form (`chunkSize` as in
    /// `gatedDeltaUpdateChunked`): each sequence's results equal
    /// `gatedDeltaUpdateChunked`'s on it alone, bit for bit, on the CPU and on the GPU.
    public static func gatedDeltaUpdatePackedChunked(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, pool: MLXKArray, cuSeqlens: [Int32],
        slots: [Int32], fresh: [Bool]? = nil, chunkSize: Int32 = 0
    ) throws -> (y: MLXKArray, pool: MLXKArray) {
        let function = "MLXKern.gatedDeltaUpdatePackedChunked"
        try checkPacked(cuSeqlens, slots, function)
        var y: OpaquePointer?
        var poolOut: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, pool)) {
            try withRows(slots, fresh, function) { s, f, _ in
                try cuSeqlens.withUnsafeBufferPointer { cu in
                    try check(mlxk_gated_delta_update_packed_chunked(
                        q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle,
                        dtBias.handle, pool.handle, cu.baseAddress, cu.count, s, f, chunkSize,
                        &y, &poolOut))
                }
            }
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update_packed_chunked"),
                MLXKArray.adopt(poolOut, "mlxk_gated_delta_update_packed_chunked"))
    }

    /// The commit after a speculative verify on a pool (`gatedDeltaState` on a pool): row b
    /// replays its first `acceptedLengths[b]` tokens of the window from `pool[slots[b]]`
    /// (zeros where fresh) and writes the state back into that slot; bit for bit
    /// `gatedDeltaState` on the gathered states, scattered back. A length of 0 leaves the
    /// slot as it was (a fresh one becomes zeros).
    ///
    /// - Returns: the new pool, lazy (in place under the rule at the top of this file).
    /// - Throws: as `gatedDeltaUpdatePool`, and `.invalidArgument` naming the row whose length
    ///   lies outside [0, T].
    public static func gatedDeltaStatePool(
        k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray, aLog: MLXKArray,
        dtBias: MLXKArray, pool: MLXKArray, slots: [Int32], acceptedLengths: [Int32],
        fresh: [Bool]? = nil
    ) throws -> MLXKArray {
        let function = "MLXKern.gatedDeltaStatePool"
        try checkPerSlot(acceptedLengths.count, slots.count, function, "acceptedLengths")
        var poolOut: OpaquePointer?
        try withExtendedLifetime((k, v, a, b, aLog, dtBias, pool)) {
            try withRows(slots, fresh, function) { s, f, n in
                try acceptedLengths.withUnsafeBufferPointer { lengths in
                    try check(mlxk_gated_delta_state_pool(
                        k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                        pool.handle, s, f, lengths.baseAddress, n, &poolOut))
                }
            }
        }
        return MLXKArray.adopt(poolOut, "mlxk_gated_delta_state_pool")
    }

    /// `gatedDeltaUpdateFromConv` on a pool: the head split of the convolution's output, then
    /// `gatedDeltaUpdatePool` on its q, k and v (bit for bit those two calls).
    ///
    /// - Parameters: `x` ... `eps` as `siluRMSHeads`; `a` ... `dtBias` and `mask` as
    ///   `gatedDeltaUpdate`; `pool`, `slots`, `fresh` as `gatedDeltaUpdatePool`.
    /// - Returns: `y` `[B, T, Hv, Dv]` in x's dtype and the new `pool`, both lazy.
    public static func gatedDeltaUpdateFromConvPool(
        x: MLXKArray, qScale: MLXKArray, kScale: MLXKArray,
        keyHeads: Int, valueHeads: Int, valueWidth: Int, eps: Float,
        a: MLXKArray, b: MLXKArray, aLog: MLXKArray, dtBias: MLXKArray,
        pool: MLXKArray, slots: [Int32], fresh: [Bool]? = nil, mask: MLXKArray? = nil
    ) throws -> (y: MLXKArray, pool: MLXKArray) {
        let function = "MLXKern.gatedDeltaUpdateFromConvPool"
        let hk = try int32(keyHeads, "key_heads", function)
        let hv = try int32(valueHeads, "value_heads", function)
        let dv = try int32(valueWidth, "value_width", function)
        var y: OpaquePointer?
        var poolOut: OpaquePointer?
        try withExtendedLifetime((x, qScale, kScale, a, b, aLog, dtBias, pool, mask)) {
            try withRows(slots, fresh, function) { s, f, n in
                try check(mlxk_gated_delta_update_from_conv_pool(
                    x.handle, qScale.handle, kScale.handle, hk, hv, dv, eps, a.handle, b.handle,
                    aLog.handle, dtBias.handle, pool.handle, s, f, n, mask?.handle, &y, &poolOut))
            }
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update_from_conv_pool"),
                MLXKArray.adopt(poolOut, "mlxk_gated_delta_update_from_conv_pool"))
    }
}
