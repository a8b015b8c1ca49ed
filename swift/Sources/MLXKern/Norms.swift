import CMLXKern

// The two normalizations around the recurrence: the head split of the convolution's output
// (before it) and the gated RMSNorm (after it).

extension MLXKern {
    /// Qwen3.5's head split of the depthwise convolution's output
    /// `x [B, S, 2·Hk·Dk + Hv·Dv]` (channels q | k | v, before the SiLU): SiLU on every channel
    /// with MLX's rounding points, then q and k RMS-normalized per head and scaled, v only
    /// activated: `q = qScale · (silu · rsqrt(mean(silu²) + eps))`, likewise k with `kScale`.
    ///
    /// - Parameters:
    ///   - x: `[B, S, 2·Hk·Dk + Hv·Dv]`, any float dtype.
    ///   - qScale: `[Dk]` in x's dtype (mlx-lm: Dk^-1, rounded to the dtype).
    ///   - kScale: `[Dk]` in x's dtype (mlx-lm: Dk^-1/2, rounded to the dtype).
    ///   - keyHeads: Hk. `valueHeads`: Hv. `valueWidth`: Dv. Dk and Dv lie in [1, 128].
    ///   - eps: finite, >= 0 (mlx-lm 0.32.2: 1e-6 / Dk).
    /// - Returns: q, k `[B, S, Hk, Dk]` and v `[B, S, Hv, Dv]` in x's dtype. Lazy.
    /// - Throws: `MLXKError` `.shape`, `.dtype` or `.invalidArgument` naming the argument.
    public static func siluRMSHeads(
        x: MLXKArray, qScale: MLXKArray, kScale: MLXKArray,
        keyHeads: Int, valueHeads: Int, valueWidth: Int, eps: Float
    ) throws -> (q: MLXKArray, k: MLXKArray, v: MLXKArray) {
        let hk = try int32(keyHeads, "key_heads")
        let hv = try int32(valueHeads, "value_heads")
        let dv = try int32(valueWidth, "value_width")
        var q: OpaquePointer?
        var k: OpaquePointer?
        var v: OpaquePointer?
        try withExtendedLifetime((x, qScale, kScale)) {
            try check(mlxk_silu_rms_heads(x.handle, qScale.handle, kScale.handle, hk, hv, dv, eps,
                                          &q, &k, &v))
        }
        return (MLXKArray.adopt(q, "mlxk_silu_rms_heads"),
                MLXKArray.adopt(k, "mlxk_silu_rms_heads"),
                MLXKArray.adopt(v, "mlxk_silu_rms_heads"))
    }

    /// Gated RMSNorm over the last axis (mlx-lm's `Qwen3NextRMSNormGated`):
    /// `out = silu(gate) · (weight · (x · rsqrt(mean(x²) + eps)))`, rounded to x's dtype at
    /// each product; silu in float32.
    ///
    /// - Parameters:
    ///   - x: `[..., D]`, any float dtype, D >= 1.
    ///   - gate: x's shape, any float dtype.
    ///   - weight: `[D]` in x's dtype (cast mlx-lm's float32 module weight to the model dtype).
    ///   - eps: finite, >= 0.
    /// - Returns: x's shape and dtype. Lazy.
    /// - Throws: `MLXKError` `.shape`, `.dtype` or `.invalidArgument` naming the argument.
    public static func gatedRMSNorm(x: MLXKArray, gate: MLXKArray, weight: MLXKArray, eps: Float) throws -> MLXKArray {
        var out: OpaquePointer?
        try withExtendedLifetime((x, gate, weight)) {
            try check(mlxk_gated_rms_norm(x.handle, gate.handle, weight.handle, eps, &out))
        }
        return MLXKArray.adopt(out, "mlxk_gated_rms_norm")
    }

    /// A count as the C ABI's int32, or the error the library would give for it.
    private static func int32(_ value: Int, _ name: String) throws -> Int32 {
        guard let value = Int32(exactly: value) else {
            throw MLXKError(status: .invalidArgument,
                            message: "MLXKern.siluRMSHeads: \(name) is \(value); it does not fit in int32")
        }
        return value
    }
}
