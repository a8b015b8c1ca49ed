import Foundation
import MLX
import MLXKernMLX

// One Qwen3.5 Gated DeltaNet layer (mlx-lm's qwen3_5.GatedDeltaNet, batch 1) in an mlx-swift
// program, the Swift counterpart of examples/cpp/qwen35_gdn.hpp: the projections, the conv and
// out_proj are mlx-swift ops; the head split, the recurrence, the gated norm and the
// speculative replay are mlxkern's kernels on the same MLXArrays, without a copy. One step is
// one lazy graph, evaluated by one `eval` (the output and both states); the states are
// MLXArrays the layer replaces with each step's lazy results.

struct Qwen35Config {
    var hiddenSize = 0, keyHeads = 0, valueHeads = 0, keyDim = 0, valueDim = 0, convKernel = 0
    var rmsNormEps: Float = 0

    var keyWidth: Int { keyHeads * keyDim }
    var valueWidth: Int { valueHeads * valueDim }
    var convDim: Int { 2 * keyWidth + valueWidth }

    /// From a checkpoint's metadata (config.json's names).
    init(metadata: [String: String]) throws {
        func int(_ key: String) throws -> Int {
            guard let text = metadata[key], let value = Int(text) else {
                throw MLXKError(status: .invalidArgument, message: "weights metadata: no integer \(key)")
            }
            return value
        }
        hiddenSize = try int("hidden_size")
        keyHeads = try int("linear_num_key_heads")
        valueHeads = try int("linear_num_value_heads")
        keyDim = try int("linear_key_head_dim")
        valueDim = try int("linear_value_head_dim")
        convKernel = try int("linear_conv_kernel_dim")
        guard let eps = metadata["rms_norm_eps"].flatMap(Float.init) else {
            throw MLXKError(status: .invalidArgument, message: "weights metadata: no rms_norm_eps")
        }
        rmsNormEps = eps
    }
}

final class Qwen35GatedDeltaNet {
    let config: Qwen35Config
    let inProjQKV, inProjZ, inProjB, inProjA, conv1dWeight, outProj: MLXArray
    // The kernels' parameters, shared with mlxkern once.
    let aLog, dtBias, normWeight, qScale, kScale: MLXKArray
    let qkEps: Float
    /// [1, Hv, Dv, Dk] float32, lazy until the step's eval.
    private(set) var state: MLXArray
    /// [1, K-1, conv_dim], the model's dtype.
    private(set) var convState: MLXArray
    private var pending: Pending?

    private struct Pending {
        let tokens: Int
        let stateBefore: MLXArray
        let convInput: MLXArray
        let q, k, v: MLXKArray
        let a, b: MLXArray
    }

    init(config c: Qwen35Config, weights: [String: MLXArray]) throws {
        func get(_ name: String, _ shape: [Int]) throws -> MLXArray {
            guard let w = weights[name] else {
                throw MLXKError(status: .invalidArgument, message: "weights: no \(name)")
            }
            guard w.shape == shape else {
                throw MLXKError(status: .shape, message: "weights: \(name) is \(w.shape), expected \(shape)")
            }
            return w
        }
        config = c
        inProjQKV = try get("in_proj_qkv.weight", [c.convDim, c.hiddenSize])
        inProjZ = try get("in_proj_z.weight", [c.valueWidth, c.hiddenSize])
        inProjB = try get("in_proj_b.weight", [c.valueHeads, c.hiddenSize])
        inProjA = try get("in_proj_a.weight", [c.valueHeads, c.hiddenSize])
        conv1dWeight = try get("conv1d.weight", [c.convDim, c.convKernel, 1])
        outProj = try get("out_proj.weight", [c.hiddenSize, c.valueWidth])
        let dtype = inProjQKV.dtype
        let aLogM = try get("A_log", [c.valueHeads]), dtBiasM = try get("dt_bias", [c.valueHeads])
        var norm = try get("norm.weight", [c.valueDim])
        if norm.dtype != dtype { norm = norm.asType(dtype) }
        // mlx-lm's normalize_qk (inv_scale = Dk^-1/2): q scaled by inv_scale^2, k by inv_scale,
        // each scalar rounded to the model's dtype; the rms_norm eps is 1e-6 inv_scale^2.
        let invScale = pow(Double(c.keyDim), -0.5)
        let invScaleSquared = pow(invScale, 2.0)
        let qScaleM = MLXArray.full([c.keyDim], values: MLXArray(Float(invScaleSquared))).asType(dtype)
        let kScaleM = MLXArray.full([c.keyDim], values: MLXArray(Float(invScale))).asType(dtype)
        state = MLXArray.zeros([1, c.valueHeads, c.valueDim, c.keyDim], type: Float.self)
        convState = MLXArray.zeros([1, c.convKernel - 1, c.convDim], dtype: dtype)
        eval(inProjQKV, inProjZ, inProjB, inProjA, conv1dWeight, outProj, aLogM, dtBiasM, norm,
             qScaleM, kScaleM, state, convState)
        aLog = try aLogM.mlxk()
        dtBias = try dtBiasM.mlxk()
        normWeight = try norm.mlxk()
        qScale = try qScaleM.mlxk()
        kScale = try kScaleM.mlxk()
        qkEps = Float(1e-6 * invScaleSquared)
    }

    /// The layer over x [1, T, hidden], committing the tokens. Lazy: evaluate the result with
    /// `state` and `convState` (one eval).
    func forward(_ x: MLXArray) throws -> MLXArray {
        precondition(pending == nil, "forward() during a verify: call accept() first")
        let (qkv, z, b, a) = project(x)
        let (input, out, next) = conv(qkv)
        _ = input
        let k = try kernels(convOut: out, a: a, b: b, z: z, keepHeads: false)
        state = k.state
        convState = next
        return outProjection(k.normed)
    }

    /// A draft window x [1, T, hidden] from the current states, keeping a checkpoint for
    /// `accept(_:)`. Lazy, as `forward`.
    func verify(_ x: MLXArray) throws -> MLXArray {
        precondition(pending == nil, "verify() during a verify: call accept() first")
        let (qkv, z, b, a) = project(x)
        let (input, out, next) = conv(qkv)
        let k = try kernels(convOut: out, a: a, b: b, z: z, keepHeads: true)
        guard let heads = k.heads else { preconditionFailure("verify keeps the heads") }
        pending = Pending(tokens: x.dim(1), stateBefore: state, convInput: input,
                          q: heads.q, k: heads.k, v: heads.v, a: a, b: b)
        state = k.state
        convState = next
        return outProjection(k.normed)
    }

    /// Keeps the first `accepted` tokens of the last verify window: the recurrent state is
    /// replayed from the checkpoint (mlxkern's gatedDeltaState), the conv state cut from the
    /// checkpoint's conv input, lazily (the next eval computes them). Returns a lazy bool: the
    /// replayed state equals a direct update over the accepted prefix bit for bit.
    @discardableResult
    func accept(_ accepted: Int) throws -> MLXArray {
        guard let p = pending else { preconditionFailure("accept() without a verify") }
        precondition(accepted >= 0 && accepted <= p.tokens, "accepted outside the window")
        pending = nil
        if accepted == p.tokens { return MLXArray(true) }
        let before = try p.stateBefore.mlxk()
        let ka = try p.a.mlxk(), kb = try p.b.mlxk()
        let replayed = try MLXKern.gatedDeltaState(
            k: p.k, v: p.v, a: ka, b: kb, aLog: aLog, dtBias: dtBias, state: before,
            acceptedLengths: [Int32(accepted)]).mlxArray
        var direct = p.stateBefore
        if accepted > 0 {
            func prefix(_ t: MLXArray) throws -> MLXKArray { try t[0..., ..<accepted].mlxk() }
            direct = try MLXKern.gatedDeltaUpdate(
                q: prefix(p.q.mlxArray), k: prefix(p.k.mlxArray), v: prefix(p.v.mlxArray),
                a: prefix(p.a), b: prefix(p.b), aLog: aLog, dtBias: dtBias, state: before
            ).state.mlxArray
        }
        let identical = arrayEqual(replayed.view(dtype: .uint32), direct.view(dtype: .uint32))
        state = replayed
        let window = config.convKernel - 1
        convState = contiguous(p.convInput[0..., accepted ..< (accepted + window), 0...])
        return identical
    }

    // MARK: the step's parts

    /// The input projections (nn.Linear without bias): qkv [B,T,conv_dim], z [B,T,Hv,Dv],
    /// b and a [B,T,Hv].
    func project(_ x: MLXArray) -> (MLXArray, MLXArray, MLXArray, MLXArray) {
        func linear(_ w: MLXArray) -> MLXArray { matmul(x, w.transposed()) }
        let c = config
        return (linear(inProjQKV),
                linear(inProjZ).reshaped([x.dim(0), x.dim(1), c.valueHeads, c.valueDim]),
                linear(inProjB), linear(inProjA))
    }

    /// The depthwise causal conv over [convState | qkv]: (its input, its output before SiLU,
    /// the next conv state).
    func conv(_ qkv: MLXArray) -> (MLXArray, MLXArray, MLXArray) {
        let window = config.convKernel - 1
        let input = concatenated([convState, qkv], axis: 1)
        let rows = input.dim(1)
        let next = contiguous(input[0..., (rows - window) ..< rows, 0...])
        let out = conv1d(input, conv1dWeight, stride: 1, padding: 0, dilation: 1, groups: config.convDim)
        return (input, out, next)
    }

    /// mlxkern's head split, recurrence and gated norm on the step's MLXArrays (lazy).
    func kernels(convOut: MLXArray, a: MLXArray, b: MLXArray, z: MLXArray, keepHeads: Bool) throws
        -> (normed: MLXArray, state: MLXArray, heads: (q: MLXKArray, k: MLXKArray, v: MLXKArray)?)
    {
        let c = config
        let x = try convOut.mlxk(), ka = try a.mlxk(), kb = try b.mlxk(), s = try state.mlxk()
        var heads: (q: MLXKArray, k: MLXKArray, v: MLXKArray)?
        let update: (y: MLXKArray, state: MLXKArray)
        if keepHeads {
            let h = try MLXKern.siluRMSHeads(x: x, qScale: qScale, kScale: kScale, keyHeads: c.keyHeads,
                                             valueHeads: c.valueHeads, valueWidth: c.valueDim, eps: qkEps)
            heads = h
            update = try MLXKern.gatedDeltaUpdate(q: h.q, k: h.k, v: h.v, a: ka, b: kb,
                                                  aLog: aLog, dtBias: dtBias, state: s)
        } else {
            update = try MLXKern.gatedDeltaUpdateFromConv(
                x: x, qScale: qScale, kScale: kScale, keyHeads: c.keyHeads, valueHeads: c.valueHeads,
                valueWidth: c.valueDim, eps: qkEps, a: ka, b: kb, aLog: aLog, dtBias: dtBias, state: s)
        }
        let normed = try MLXKern.gatedRMSNorm(x: update.y, gate: z.mlxk(), weight: normWeight, eps: c.rmsNormEps)
        return (try normed.mlxArray, try update.state.mlxArray, heads)
    }

    /// out_proj over the gated norm's output [B, T, Hv, Dv].
    func outProjection(_ normed: MLXArray) -> MLXArray {
        matmul(normed.reshaped([normed.dim(0), normed.dim(1), -1]), outProj.transposed())
    }
}
