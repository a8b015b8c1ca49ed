// The Gated DeltaNet kernels. Every function borrows its MlxArray inputs and returns new arrays
// the caller owns (dispose them). Results are lazy: errors in argument checks are thrown here,
// computation errors at eval() / toTypedArray().

import { ptr } from "bun:ffi";
import { adopt, handleOf, MlxArray, optionalHandle, outSlot } from "./array";
import { floatArg, int32Arg } from "./args";
import { check } from "./errors";
import { lib } from "./library";

/**
 * g = exp(-exp(float32(aLog)) * softplus(a + dtBias)), mlx-lm's `compute_g`: float32 with a's
 * shape. aLog [Hv] (float32 or bfloat16), a [..., Hv], dtBias [Hv] (any float dtype).
 */
export function computeG(aLog: MlxArray, a: MlxArray, dtBias: MlxArray): MlxArray {
  const g = outSlot();
  check(lib.mlxk_compute_g(handleOf(aLog, "aLog"), handleOf(a, "a"), handleOf(dtBias, "dtBias"), g));
  return adopt(g, "computeG g");
}

export interface GatedDeltaResult {
  /** [B, T, Hv, Dv] in q's dtype; 0 at masked tokens. */
  y: MlxArray;
  /** float32 [B, Hv, Dv, Dk]. */
  state: MlxArray;
}

/**
 * One Gated DeltaNet call (mlx-lm's `gated_delta_update`, the Metal kernel's arithmetic).
 * q, k [B, T, Hk, Dk] (already normalized); v [B, T, Hv, Dv]; a, b [B, T, Hv]; aLog, dtBias
 * [Hv]; state float32 [B, Hv, Dv, Dk] or null (zeros); mask bool [B, T] or null (all real).
 *
 * Decode loops: dispose the previous state before evaluating the returned one; the CPU kernel
 * then writes the new state into the old buffer instead of allocating.
 */
export function gatedDeltaUpdate(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  state: MlxArray | null = null,
  mask: MlxArray | null = null,
): GatedDeltaResult {
  const inputs = updateInputs(q, k, v, a, b, aLog, dtBias, state, mask);
  return updateResult("gatedDeltaUpdate", (y, stateOut) =>
    lib.mlxk_gated_delta_update(...inputs, y, stateOut),
  );
}

/** The handles of an update's nine inputs (each checked, named in errors). */
function updateInputs(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  state: MlxArray | null,
  mask: MlxArray | null,
) {
  return [
    handleOf(q, "q"),
    handleOf(k, "k"),
    handleOf(v, "v"),
    handleOf(a, "a"),
    handleOf(b, "b"),
    handleOf(aLog, "aLog"),
    handleOf(dtBias, "dtBias"),
    optionalHandle(state),
    optionalHandle(mask),
  ] as const;
}

/** Runs an update entry (`call` fills the y and state slots) and adopts its two results. */
function updateResult(
  name: string,
  call: (y: BigUint64Array, stateOut: BigUint64Array) => number,
): GatedDeltaResult {
  const y = outSlot();
  const stateOut = outSlot();
  check(call(y, stateOut));
  return { y: adopt(y, `${name} y`), state: adopt(stateOut, `${name} state`) };
}

/**
 * The same update as gatedDeltaUpdate computed in chunked (WY / UT-transform) form: a faster
 * prefill on the CPU. Tokens are taken chunkSize at a time and each chunk is solved with matrix
 * products, so the results equal gatedDeltaUpdate's up to float32 rounding, not bit for bit.
 * Use it for long prefills; decode (T = 1) and speculative verification, whose results must
 * match other calls bit for bit, use gatedDeltaUpdate.
 *
 * Arguments, shapes, dtypes, mask, state reuse and results as gatedDeltaUpdate. chunkSize: 0
 * for the default (32), or a multiple of 16 in [16, 128] (InvalidArgumentError otherwise).
 * Without a mask, a prefill split into calls at multiples of the chunk size (each passing on
 * the state) gives the same bits as one call. With the GPU as the default device it runs the
 * GPU chunked kernels.
 */
export function gatedDeltaUpdateChunked(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  state: MlxArray | null = null,
  mask: MlxArray | null = null,
  chunkSize = 0,
): GatedDeltaResult {
  const inputs = updateInputs(q, k, v, a, b, aLog, dtBias, state, mask);
  const chunk = int32Arg("chunkSize", chunkSize);
  return updateResult("gatedDeltaUpdateChunked", (y, stateOut) =>
    lib.mlxk_gated_delta_update_chunked(...inputs, chunk, y, stateOut),
  );
}

/**
 * Prefix-state replay for speculative decoding: the state after each row's first
 * acceptedLengths[b] tokens of the window, from `state` (null: zeros). Bit-identical to the
 * state gatedDeltaUpdate returns for the same prefix. One length per batch row, each in [0, T].
 */
export function gatedDeltaState(
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  state: MlxArray | null,
  acceptedLengths: readonly number[] | Int32Array,
): MlxArray {
  const lengths =
    acceptedLengths instanceof Int32Array
      ? acceptedLengths
      : Int32Array.from(acceptedLengths, (n, i) => int32Arg(`acceptedLengths[${i}]`, n));
  const stateOut = outSlot();
  check(
    lib.mlxk_gated_delta_state(
      handleOf(k, "k"),
      handleOf(v, "v"),
      handleOf(a, "a"),
      handleOf(b, "b"),
      handleOf(aLog, "aLog"),
      handleOf(dtBias, "dtBias"),
      optionalHandle(state),
      lengths.length === 0 ? null : ptr(lengths),
      lengths.length,
      stateOut,
    ),
  );
  return adopt(stateOut, "gatedDeltaState state");
}

export interface HeadSplit {
  /** [B, S, Hk, Dk], normalized and scaled by qScale. */
  q: MlxArray;
  /** [B, S, Hk, Dk], normalized and scaled by kScale. */
  k: MlxArray;
  /** [B, S, Hv, Dv], SiLU only. */
  v: MlxArray;
}

/**
 * The Qwen3.5 head split of the convolution output x [B, S, 2*Hk*Dk + Hv*Dv] (channels
 * q | k | v, before the SiLU): SiLU everywhere, then q and k RMS-normalized per head and scaled.
 * qScale, kScale [Dk] in x's dtype; Dk and valueWidth in [1, 128]; eps finite and >= 0
 * (mlx-lm 0.32.2 uses 1e-6 / Dk).
 */
export function siluRmsHeads(
  x: MlxArray,
  qScale: MlxArray,
  kScale: MlxArray,
  keyHeads: number,
  valueHeads: number,
  valueWidth: number,
  eps: number,
): HeadSplit {
  const q = outSlot();
  const k = outSlot();
  const v = outSlot();
  check(
    lib.mlxk_silu_rms_heads(
      handleOf(x, "x"),
      handleOf(qScale, "qScale"),
      handleOf(kScale, "kScale"),
      int32Arg("keyHeads", keyHeads),
      int32Arg("valueHeads", valueHeads),
      int32Arg("valueWidth", valueWidth),
      floatArg("eps", eps),
      q,
      k,
      v,
    ),
  );
  return { q: adopt(q, "siluRmsHeads q"), k: adopt(k, "siluRmsHeads k"), v: adopt(v, "siluRmsHeads v") };
}

/**
 * The head split and the update of one layer in one call: exactly siluRmsHeads(x, ...) followed
 * by gatedDeltaUpdate(q, k, v, a, ...), bit for bit on every device, without q, k, v as results.
 * On a GPU it is one kernel node instead of two where mlxkern.h says (decode). Dk (qScale's
 * length) is a multiple of 32 in [32, 128]; valueHeads a multiple of keyHeads. Results as gatedDeltaUpdate's (y in x's dtype).
 */
export function gatedDeltaUpdateFromConv(
  x: MlxArray,
  qScale: MlxArray,
  kScale: MlxArray,
  keyHeads: number,
  valueHeads: number,
  valueWidth: number,
  eps: number,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  state: MlxArray | null = null,
  mask: MlxArray | null = null,
): GatedDeltaResult {
  const split = [
    handleOf(x, "x"),
    handleOf(qScale, "qScale"),
    handleOf(kScale, "kScale"),
    int32Arg("keyHeads", keyHeads),
    int32Arg("valueHeads", valueHeads),
    int32Arg("valueWidth", valueWidth),
    floatArg("eps", eps),
  ] as const;
  const gates = [
    handleOf(a, "a"),
    handleOf(b, "b"),
    handleOf(aLog, "aLog"),
    handleOf(dtBias, "dtBias"),
    optionalHandle(state),
    optionalHandle(mask),
  ] as const;
  return updateResult("gatedDeltaUpdateFromConv", (y, stateOut) =>
    lib.mlxk_gated_delta_update_from_conv(...split, ...gates, y, stateOut),
  );
}

/**
 * Gated RMSNorm over the last axis (mlx-lm's Qwen3NextRMSNormGated):
 * out = silu(gate) * (weight * x * rsqrt(mean(x^2) + eps)), x's shape and dtype. gate has x's
 * shape (any float dtype); weight [D] in x's dtype; eps finite and >= 0.
 */
export function gatedRmsNorm(x: MlxArray, gate: MlxArray, weight: MlxArray, eps: number): MlxArray {
  const out = outSlot();
  check(lib.mlxk_gated_rms_norm(handleOf(x, "x"), handleOf(gate, "gate"), handleOf(weight, "weight"), floatArg("eps", eps), out));
  return adopt(out, "gatedRmsNorm out");
}

/** Runs a backward entry (`call` fills `names.length` slots) and adopts its results by name. */
function gradients<K extends string>(
  fn: string,
  names: readonly K[],
  call: (...slots: BigUint64Array[]) => number,
): Record<K, MlxArray> {
  if (call.length !== names.length) {
    throw new Error(`mlxkern: ${fn}: the call takes ${call.length} output slots, ${names.length} are named`);
  }
  const slots = names.map(() => outSlot());
  check(call(...slots));
  const out = {} as Record<K, MlxArray>;
  names.forEach((name, i) => {
    out[name] = adopt(slots[i]!, `${fn} ${name}`);
  });
  return out;
}

export interface GatedDeltaGradients {
  /** [B, T, Hk, Dk] in q's dtype. */
  dq: MlxArray;
  /** [B, T, Hk, Dk] in q's dtype. */
  dk: MlxArray;
  /** [B, T, Hv, Dv] in q's dtype. */
  dv: MlxArray;
  /** a's shape and dtype. */
  da: MlxArray;
  /** b's shape and dtype. */
  db: MlxArray;
  /** [Hv] in aLog's dtype. */
  daLog: MlxArray;
  /** [Hv] in dtBias's dtype. */
  dDtBias: MlxArray;
  /** float32 [B, Hv, Dv, Dk]: the initial state's gradient (also when state is null). */
  dState: MlxArray;
}

/**
 * The backward pass of gatedDeltaUpdate (its vector-Jacobian product), for hosts without
 * automatic differentiation: the gradients of sum(dy * y) + sum(dStateOut * stateOut) with
 * respect to every input. Arguments as gatedDeltaUpdate, plus dy [B, T, Hv, Dv] (any float
 * dtype) and dStateOut float32 [B, Hv, Dv, Dk]; null cotangents are zeros. float32
 * arithmetic on the CPU; with the GPU as the default device, the GPU backward kernel.
 */
export function gatedDeltaUpdateVjp(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  state: MlxArray | null = null,
  mask: MlxArray | null = null,
  dy: MlxArray | null = null,
  dStateOut: MlxArray | null = null,
): GatedDeltaGradients {
  const inputs = updateInputs(q, k, v, a, b, aLog, dtBias, state, mask);
  const cotangents = [optionalHandle(dy), optionalHandle(dStateOut)] as const;
  return gradients(
    "gatedDeltaUpdateVjp",
    ["dq", "dk", "dv", "da", "db", "daLog", "dDtBias", "dState"] as const,
    (dq, dk, dv, da, db, daLog, dDtBias, dState) =>
      lib.mlxk_gated_delta_update_vjp(...inputs, ...cotangents, dq, dk, dv, da, db, daLog, dDtBias, dState),
  );
}

/**
 * The backward pass of gatedDeltaUpdateChunked: the same gradients as gatedDeltaUpdateVjp,
 * computed chunk by chunk through the chunked form's products (faster on long sequences; equal
 * up to float32 rounding). Arguments as gatedDeltaUpdateVjp plus chunkSize (0 = 32, or a
 * multiple of 16 in [16, 128]), placed as in gatedDeltaUpdateChunked.
 */
export function gatedDeltaUpdateChunkedVjp(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  state: MlxArray | null = null,
  mask: MlxArray | null = null,
  chunkSize = 0,
  dy: MlxArray | null = null,
  dStateOut: MlxArray | null = null,
): GatedDeltaGradients {
  const inputs = updateInputs(q, k, v, a, b, aLog, dtBias, state, mask);
  const chunk = int32Arg("chunkSize", chunkSize);
  const cotangents = [optionalHandle(dy), optionalHandle(dStateOut)] as const;
  return gradients(
    "gatedDeltaUpdateChunkedVjp",
    ["dq", "dk", "dv", "da", "db", "daLog", "dDtBias", "dState"] as const,
    (dq, dk, dv, da, db, daLog, dDtBias, dState) =>
      lib.mlxk_gated_delta_update_chunked_vjp(...inputs, chunk, ...cotangents, dq, dk, dv, da, db, daLog, dDtBias, dState),
  );
}

export interface HeadSplitGradients {
  /** x's shape and dtype. */
  dx: MlxArray;
  /** [Dk] in x's dtype. */
  dqScale: MlxArray;
  /** [Dk] in x's dtype. */
  dkScale: MlxArray;
}

/**
 * The backward pass of siluRmsHeads: the gradients of sum(dq * q) + sum(dk * k) + sum(dv * v)
 * with respect to x, qScale and kScale. Arguments as siluRmsHeads, plus the cotangents dq, dk
 * [B, S, Hk, Dk] and dv [B, S, Hv, Dv] (any float dtype; null: zeros). float32 arithmetic with
 * float64 sums, rounded once to x's dtype (on the GPU: MLX ops).
 */
export function siluRmsHeadsVjp(
  x: MlxArray,
  qScale: MlxArray,
  kScale: MlxArray,
  keyHeads: number,
  valueHeads: number,
  valueWidth: number,
  eps: number,
  dq: MlxArray | null = null,
  dk: MlxArray | null = null,
  dv: MlxArray | null = null,
): HeadSplitGradients {
  const args = [
    handleOf(x, "x"),
    handleOf(qScale, "qScale"),
    handleOf(kScale, "kScale"),
    int32Arg("keyHeads", keyHeads),
    int32Arg("valueHeads", valueHeads),
    int32Arg("valueWidth", valueWidth),
    floatArg("eps", eps),
    optionalHandle(dq),
    optionalHandle(dk),
    optionalHandle(dv),
  ] as const;
  return gradients("siluRmsHeadsVjp", ["dx", "dqScale", "dkScale"] as const, (dx, dqScale, dkScale) =>
    lib.mlxk_silu_rms_heads_vjp(...args, dx, dqScale, dkScale),
  );
}

export interface GatedRmsNormGradients {
  /** x's shape and dtype. */
  dx: MlxArray;
  /** The gate's shape and dtype. */
  dgate: MlxArray;
  /** [D] in x's dtype. */
  dweight: MlxArray;
}

/**
 * The backward pass of gatedRmsNorm: the gradients of sum(dout * out) with respect to x, gate
 * and weight. Arguments as gatedRmsNorm, plus dout of x's shape (any float dtype; null:
 * zeros). float32 arithmetic with float64 sums, rounded once to each input's dtype (on the GPU: MLX ops).
 */
export function gatedRmsNormVjp(
  x: MlxArray,
  gate: MlxArray,
  weight: MlxArray,
  eps: number,
  dout: MlxArray | null = null,
): GatedRmsNormGradients {
  const args = [
    handleOf(x, "x"),
    handleOf(gate, "gate"),
    handleOf(weight, "weight"),
    floatArg("eps", eps),
    optionalHandle(dout),
  ] as const;
  return gradients("gatedRmsNormVjp", ["dx", "dgate", "dweight"] as const, (dx, dgate, dweight) =>
    lib.mlxk_gated_rms_norm_vjp(...args, dx, dgate, dweight),
  );
}
