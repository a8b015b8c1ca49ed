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

    /// The backward pass of `siluRMSHeads` (its vector-Jacobian product), for hosts without
    /// automatic differentiation: the gradients of `sum(dq·q) + sum(dk·k) + sum(dv·v)` with
    /// respect to x, qScale and kScale. Per head, with `s = silu(x)`, `n = s · inv`:
    /// `dqScale = Σ dq · n` over rows and q heads (kScale likewise),
    /// `dx = inv · (g − n · mean(g · n)) · silu'(x)` with `g = dq · qScale` on q heads, and
    /// `dx = dv · silu'(x)` on v heads. Computed in float32 with float64 sums, rounded once to
    /// x's dtype (on the GPU default device: MLX ops on the GPU stream).
    ///
    /// - Parameters: as `siluRMSHeads`, plus the cotangents `dq`, `dk` `[B, S, Hk, Dk]` and `dv`
    ///   `[B, S, Hv, Dv]` in any float dtype; nil is zeros.
    /// - Returns: `dx` (x's shape), `dqScale` and `dkScale` `[Dk]`, all in x's dtype. Lazy.
    /// - Throws: `MLXKError` as `siluRMSHeads`, `.shape` / `.dtype` naming `dq`, `dk` or `dv`,
    ///   `.unsupported` when the default device is the GPU.
    public static func siluRMSHeadsVJP(
        x: MLXKArray, qScale: MLXKArray, kScale: MLXKArray,
        keyHeads: Int, valueHeads: Int, valueWidth: Int, eps: Float,
        dq: MLXKArray? = nil, dk: MLXKArray? = nil, dv: MLXKArray? = nil
    ) throws -> (dx: MLXKArray, dqScale: MLXKArray, dkScale: MLXKArray) {
        let function = "MLXKern.siluRMSHeadsVJP"
        let hk = try int32(keyHeads, "key_heads", function)
        let hv = try int32(valueHeads, "value_heads", function)
        let width = try int32(valueWidth, "value_width", function)
        var dx: OpaquePointer?
        var dqScale: OpaquePointer?
        var dkScale: OpaquePointer?
        try withExtendedLifetime((x, qScale, kScale, dq, dk, dv)) {
            try check(mlxk_silu_rms_heads_vjp(x.handle, qScale.handle, kScale.handle, hk, hv, width,
                                              eps, dq?.handle, dk?.handle, dv?.handle,
                                              &dx, &dqScale, &dkScale))
        }
        return (MLXKArray.adopt(dx, "mlxk_silu_rms_heads_vjp"),
                MLXKArray.adopt(dqScale, "mlxk_silu_rms_heads_vjp"),
                MLXKArray.adopt(dkScale, "mlxk_silu_rms_heads_vjp"))
    }

    /// The backward pass of `gatedRMSNorm`: the gradients of `sum(dout · out)` with respect to
    /// x, gate and weight. Per row, with `n = x · inv` and `a = silu(gate)`:
    /// `dgate = dout · weight · n · silu'(gate)`, `dweight = Σ dout · a · n` over rows,
    /// `dx = inv · (g − n · mean(g · n))` with `g = dout · a · weight`. Computed in float32
    /// with float64 sums, rounded once to each input's dtype (on the GPU: MLX ops).
    ///
    /// - Parameters: as `gatedRMSNorm`, plus `dout` of x's shape in any float dtype; nil is
    ///   zeros.
    /// - Returns: `dx` (x's shape and dtype), `dgate` (the gate's), `dweight` `[D]` in x's
    ///   dtype. Lazy.
    /// - Throws: `MLXKError` as `gatedRMSNorm`, `.shape` / `.dtype` naming `dout`,
    ///   `.unsupported` when the default device is the GPU.
    public static func gatedRMSNormVJP(
        x: MLXKArray, gate: MLXKArray, weight: MLXKArray, eps: Float, dout: MLXKArray? = nil
    ) throws -> (dx: MLXKArray, dgate: MLXKArray, dweight: MLXKArray) {
        var dx: OpaquePointer?
        var dgate: OpaquePointer?
        var dweight: OpaquePointer?
        try withExtendedLifetime((x, gate, weight, dout)) {
            try check(mlxk_gated_rms_norm_vjp(x.handle, gate.handle, weight.handle, eps,
                                              dout?.handle, &dx, &dgate, &dweight))
        }
        return (MLXKArray.adopt(dx, "mlxk_gated_rms_norm_vjp"),
                MLXKArray.adopt(dgate, "mlxk_gated_rms_norm_vjp"),
                MLXKArray.adopt(dweight, "mlxk_gated_rms_norm_vjp"))
    }

    /// A count as the C ABI's int32, or the error the library would give for it.
    static func int32(_ value: Int, _ name: String,
                              _ function: String = "MLXKern.siluRMSHeads") throws -> Int32 {
        guard let value = Int32(exactly: value) else {
            throw MLXKError(status: .invalidArgument,
                            message: "\(function): \(name) is \(value); it does not fit in int32")
        }
        return value
    }
}
