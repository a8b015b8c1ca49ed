import CMLXKern

// Qwen3.5's linear attention (Gated DeltaNet): the gate, the recurrence, prefix replay.
// Shapes use B (batch), T (tokens), Hk/Hv (key/value heads), Dk/Dv (key/value head width).

extension MLXKern {
    /// The decay gate `g = exp(-exp(aLog) * softplus(a + dtBias))`, mlx-lm's `compute_g`
    /// bit for bit on the same device: `a + dtBias` and softplus in their promoted dtype
    /// (bfloat16 for bfloat16 inputs), the product and the outer exp in float32.
    ///
    /// - Parameters:
    ///   - aLog: `[Hv]`, float32 or bfloat16.
    ///   - a: `[..., Hv]`, any float dtype.
    ///   - dtBias: `[Hv]`, any float dtype.
    /// - Returns: g, float32, shaped like `a`. Lazy.
    /// - Throws: `MLXKError` `.shape` or `.dtype` naming the argument at fault.
    public static func computeG(aLog: MLXKArray, a: MLXKArray, dtBias: MLXKArray) throws -> MLXKArray {
        var g: OpaquePointer?
        try withExtendedLifetime((aLog, a, dtBias)) {
            try check(mlxk_compute_g(aLog.handle, a.handle, dtBias.handle, &g))
        }
        return MLXKArray.adopt(g, "mlxk_compute_g")
    }

    /// One Gated DeltaNet call (mlx-lm's `gated_delta_update`, with the Metal kernel's
    /// arithmetic on every device): per token, `beta = sigmoid(b)`, `g = computeG(...)`, and per
    /// value head h (reading key head `h / (Hv / Hk)`) and row dv, in float32:
    /// `s *= g; kv = sum(s * k); delta = (v - kv) * beta; s += k * delta; y = sum(s * q)`.
    ///
    /// - Parameters:
    ///   - q: `[B, T, Hk, Dk]`, already normalized (mlx-lm's `normalize_qk`; no scale here).
    ///   - k: `[B, T, Hk, Dk]`, likewise; q's dtype. Dk is a multiple of 32 in [32, 256].
    ///   - v: `[B, T, Hv, Dv]`, q's dtype; Hv a multiple of Hk.
    ///   - a: `[B, T, Hv]`, any float dtype.
    ///   - b: `[B, T, Hv]`, any float dtype.
    ///   - aLog: `[Hv]`, float32 or bfloat16.
    ///   - dtBias: `[Hv]`, any float dtype.
    ///   - state: `[B, Hv, Dv, Dk]` float32, or nil for zeros.
    ///   - mask: `[B, T]` bool (true: a real token), or nil for all real. A masked token
    ///     leaves the state untouched and writes y = 0.
    /// - Returns: `y` `[B, T, Hv, Dv]` in q's dtype and the new `state` `[B, Hv, Dv, Dk]`
    ///   float32, both lazy.
    /// - Throws: `MLXKError` `.shape` or `.dtype` naming the argument at fault.
    ///
    /// In a decode loop, drop the old state before evaluating the new one: with no other
    /// owner left, the CPU kernel writes the new state into the old buffer.
    public static func gatedDeltaUpdate(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, state: MLXKArray? = nil, mask: MLXKArray? = nil
    ) throws -> (y: MLXKArray, state: MLXKArray) {
        var y: OpaquePointer?
        var stateOut: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, state, mask)) {
            try check(mlxk_gated_delta_update(
                q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                state?.handle, mask?.handle, &y, &stateOut))
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update"),
                MLXKArray.adopt(stateOut, "mlxk_gated_delta_update"))
    }

    /// The head split and the update of one layer in one call: exactly `siluRMSHeads` of the
    /// convolution's output followed by `gatedDeltaUpdate` on its q, k and v, bit for bit on
    /// every device, without q, k and v as results. On a GPU it is one kernel node instead of
    /// two where `mlxkern.h` says (decode: a step pays for each node per layer).
    ///
    /// - Parameters: `x`, `qScale`, `kScale`, `keyHeads`, `valueHeads`, `valueWidth`, `eps` as
    ///   `siluRMSHeads` (Dk, qScale's length, a multiple of 32 in [32, 128]; Hv a multiple of
    ///   Hk); `a` ... `mask` as `gatedDeltaUpdate`.
    /// - Returns: `y` `[B, T, Hv, Dv]` in x's dtype and the new `state` `[B, Hv, Dv, Dk]`
    ///   float32, both lazy.
    /// - Throws: `MLXKError` naming the argument at fault.
    public static func gatedDeltaUpdateFromConv(
        x: MLXKArray, qScale: MLXKArray, kScale: MLXKArray,
        keyHeads: Int, valueHeads: Int, valueWidth: Int, eps: Float,
        a: MLXKArray, b: MLXKArray, aLog: MLXKArray, dtBias: MLXKArray,
        state: MLXKArray? = nil, mask: MLXKArray? = nil
    ) throws -> (y: MLXKArray, state: MLXKArray) {
        let function = "MLXKern.gatedDeltaUpdateFromConv"
        let hk = try int32(keyHeads, "key_heads", function)
        let hv = try int32(valueHeads, "value_heads", function)
        let dv = try int32(valueWidth, "value_width", function)
        var y: OpaquePointer?
        var stateOut: OpaquePointer?
        try withExtendedLifetime((x, qScale, kScale, a, b, aLog, dtBias, state, mask)) {
            try check(mlxk_gated_delta_update_from_conv(
                x.handle, qScale.handle, kScale.handle, hk, hv, dv, eps, a.handle, b.handle,
                aLog.handle, dtBias.handle, state?.handle, mask?.handle, &y, &stateOut))
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update_from_conv"),
                MLXKArray.adopt(stateOut, "mlxk_gated_delta_update_from_conv"))
    }

    /// The same update as `gatedDeltaUpdate` computed in chunked (WY / UT-transform) form: a
    /// faster prefill on the CPU. Tokens are taken `chunkSize` at a time and each chunk's
    /// recurrence is solved with matrix products, so the results equal `gatedDeltaUpdate`'s up
    /// to float32 rounding, not bit for bit. Use it for long prefills; decode (T = 1) and
    /// speculative verification, whose results must match other calls bit for bit, use
    /// `gatedDeltaUpdate`.
    ///
    /// - Parameters: as `gatedDeltaUpdate`, plus `chunkSize`: 0 for the default (32), or a
    ///   multiple of 16 in [16, 128]. Without a mask, a prefill split into calls at multiples
    ///   of the chunk size (each passing on the state) gives the same bits as one call.
    /// - Returns: `y` `[B, T, Hv, Dv]` in q's dtype and the new `state` `[B, Hv, Dv, Dk]`
    ///   float32, both lazy.
    /// - Throws: `MLXKError` `.shape` or `.dtype` naming the argument at fault,
    ///   `.invalidArgument` naming `chunk_size`. With the GPU as the default device it runs
    ///   the GPU chunked kernels.
    public static func gatedDeltaUpdateChunked(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, state: MLXKArray? = nil, mask: MLXKArray? = nil,
        chunkSize: Int32 = 0
    ) throws -> (y: MLXKArray, state: MLXKArray) {
        var y: OpaquePointer?
        var stateOut: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, state, mask)) {
            try check(mlxk_gated_delta_update_chunked(
                q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                state?.handle, mask?.handle, chunkSize, &y, &stateOut))
        }
        return (MLXKArray.adopt(y, "mlxk_gated_delta_update_chunked"),
                MLXKArray.adopt(stateOut, "mlxk_gated_delta_update_chunked"))
    }

    /// The backward pass of `gatedDeltaUpdate` (its vector-Jacobian product), for hosts
    /// without automatic differentiation: the gradients of `sum(dy · y) + sum(dStateOut ·
    /// stateOut)` with respect to every input. float32 arithmetic, the forward recomputed from
    /// kept states (on the GPU default device: the GPU backward kernel).
    ///
    /// - Parameters: as `gatedDeltaUpdate`, plus `dy` `[B, T, Hv, Dv]` (any float dtype) and
    ///   `dStateOut` `[B, Hv, Dv, Dk]` float32; nil cotangents are zeros.
    /// - Returns: the gradients, each in its input's shape and dtype (`dState` float32, also
    ///   when `state` is nil). Lazy.
    /// - Throws: `MLXKError` as `gatedDeltaUpdate`, `.shape` / `.dtype` naming `dy` or
    ///   `dstate_out`, `.unsupported` when the default device is the GPU.
    public static func gatedDeltaUpdateVJP(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, state: MLXKArray? = nil, mask: MLXKArray? = nil,
        dy: MLXKArray? = nil, dStateOut: MLXKArray? = nil
    ) throws -> GatedDeltaGradients {
        var g0, g1, g2, g3, g4, g5, g6, g7: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, state, mask, dy, dStateOut)) {
            try check(mlxk_gated_delta_update_vjp(
                q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                state?.handle, mask?.handle, dy?.handle, dStateOut?.handle,
                &g0, &g1, &g2, &g3, &g4, &g5, &g6, &g7))
        }
        let g = [g0, g1, g2, g3, g4, g5, g6, g7].map { MLXKArray.adopt($0, "mlxk_gated_delta_update_vjp") }
        return GatedDeltaGradients(dq: g[0], dk: g[1], dv: g[2], da: g[3], db: g[4],
                                   daLog: g[5], dDtBias: g[6], dState: g[7])
    }

    /// The backward pass of `gatedDeltaUpdateChunked`: the gradients `gatedDeltaUpdateVJP`
    /// returns, computed chunk by chunk through the chunked form's products (equal up to
    /// float32 rounding; much faster on long sequences).
    ///
    /// - Parameters: as `gatedDeltaUpdateVJP`, plus `chunkSize` as in
    ///   `gatedDeltaUpdateChunked` (0 for the default, 32, or a multiple of 16 in [16, 128]).
    /// - Returns: the gradients, as `gatedDeltaUpdateVJP`. Lazy.
    /// - Throws: `MLXKError` as `gatedDeltaUpdateVJP`, `.invalidArgument` naming `chunk_size`.
    public static func gatedDeltaUpdateChunkedVJP(
        q: MLXKArray, k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray,
        aLog: MLXKArray, dtBias: MLXKArray, state: MLXKArray? = nil, mask: MLXKArray? = nil,
        chunkSize: Int32 = 0, dy: MLXKArray? = nil, dStateOut: MLXKArray? = nil
    ) throws -> GatedDeltaGradients {
        var g0, g1, g2, g3, g4, g5, g6, g7: OpaquePointer?
        try withExtendedLifetime((q, k, v, a, b, aLog, dtBias, state, mask, dy, dStateOut)) {
            try check(mlxk_gated_delta_update_chunked_vjp(
                q.handle, k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                state?.handle, mask?.handle, chunkSize, dy?.handle, dStateOut?.handle,
                &g0, &g1, &g2, &g3, &g4, &g5, &g6, &g7))
        }
        let g = [g0, g1, g2, g3, g4, g5, g6, g7].map {
            MLXKArray.adopt($0, "mlxk_gated_delta_update_chunked_vjp")
        }
        return GatedDeltaGradients(dq: g[0], dk: g[1], dv: g[2], da: g[3], db: g[4],
                                   daLog: g[5], dDtBias: g[6], dState: g[7])
    }

    /// Prefix-state replay for speculative decoding: after a verify window of T draft tokens
    /// of which row b accepted `acceptedLengths[b]`, recomputes each row's state from the
    /// pre-verify `state` over exactly that prefix. Bit-identical to the state
    /// `gatedDeltaUpdate` returns for those first tokens from the same start state.
    ///
    /// - Parameters: as `gatedDeltaUpdate` without q and mask; `acceptedLengths` holds B
    ///   values, each in [0, T].
    /// - Returns: the state `[B, Hv, Dv, Dk]` float32. Lazy.
    /// - Throws: `MLXKError` `.shape` / `.dtype` naming the argument, `.invalidArgument`
    ///   naming the row whose length is out of range.
    public static func gatedDeltaState(
        k: MLXKArray, v: MLXKArray, a: MLXKArray, b: MLXKArray, aLog: MLXKArray,
        dtBias: MLXKArray, state: MLXKArray? = nil, acceptedLengths: [Int32]
    ) throws -> MLXKArray {
        var stateOut: OpaquePointer?
        try withExtendedLifetime((k, v, a, b, aLog, dtBias, state)) {
            try acceptedLengths.withUnsafeBufferPointer { lengths in
                try check(mlxk_gated_delta_state(
                    k.handle, v.handle, a.handle, b.handle, aLog.handle, dtBias.handle,
                    state?.handle, lengths.baseAddress, lengths.count, &stateOut))
            }
        }
        return MLXKArray.adopt(stateOut, "mlxk_gated_delta_state")
    }
}

/// The gradients `MLXKern.gatedDeltaUpdateVJP` returns, each in its input's shape and dtype.
public struct GatedDeltaGradients {
    public let dq: MLXKArray
    public let dk: MLXKArray
    public let dv: MLXKArray
    public let da: MLXKArray
    public let db: MLXKArray
    public let daLog: MLXKArray
    public let dDtBias: MLXKArray
    /// float32 `[B, Hv, Dv, Dk]`: the initial state's gradient.
    public let dState: MLXKArray
}
