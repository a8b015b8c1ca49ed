// The Gated DeltaNet calls on a pool of recurrent states addressed by slot, as engines keep them
// (mlxkern.h: mlxk_gated_delta_update_pool and the calls after it). Every sequence's state
// lives in one pool float32 [N, Hv, Dv, Dk]; each batch row (each sequence, when packed) names
// its own by slot. A negative slot is a padding row (y zeros, nothing read or written); two rows
// may not name one slot. `fresh` (null: none) holds one flag per slot: true / nonzero starts that
// row from zeros (its slot is then written).
//
// In place: dispose the old pool before evaluating the returned one; with no other owner left,
// the CPU kernel writes the named states into the old pool's buffer (only those, never all N).
//
// Slots, fresh flags, offsets and lengths are host arrays read during the call. A per-slot array
// of another length than `slots` throws InvalidArgumentError here, before the library reads it.

import { ptr, type Pointer } from "bun:ffi";
import { adopt, handleOf, MlxArray, optionalHandle, outSlot } from "./array";
import { floatArg, int32Arg } from "./args";
import { check, InvalidArgumentError, statusName } from "./errors";
import { lib } from "./library";
import { MLXK_ERR_INVALID_ARGUMENT } from "./symbols.generated";

/** Slots, offsets or lengths: an Int32Array (passed as it is) or numbers (each an int32). */
export type Int32Init = Int32Array | readonly number[];
/** Fresh flags, one per slot: a Uint8Array (nonzero: fresh) or booleans; null: none fresh. */
export type FreshInit = Uint8Array | readonly boolean[] | null;

export interface GatedDeltaPoolResult {
  /** [B, T, Hv, Dv] ([1, totalT, Hv, Dv] when packed) in q's dtype; 0 at masked tokens and
   * padding rows. */
  y: MlxArray;
  /** float32 [N, Hv, Dv, Dk]: the pool with the named slots replaced, every other slot kept. */
  pool: MlxArray;
}

function int32s(name: string, values: Int32Init): Int32Array {
  if (values instanceof Int32Array) return values;
  if (!Array.isArray(values)) throw new TypeError(`mlxkern: ${name} must be an Int32Array or an array of numbers`);
  return Int32Array.from(values, (n, i) => int32Arg(`${name}[${i}]`, n));
}

function freshFlags(fresh: FreshInit): Uint8Array | null {
  if (fresh === null || fresh instanceof Uint8Array) return fresh;
  if (!Array.isArray(fresh)) throw new TypeError("mlxkern: fresh must be a Uint8Array, an array of booleans or null");
  return Uint8Array.from(fresh, (x) => (x ? 1 : 0));
}

/** The library reads one value per slot from each per-slot array: check the count first. */
function perSlot(fn: string, name: string, values: ArrayLike<unknown>, slots: number): void {
  if (values.length !== slots) {
    throw new InvalidArgumentError(
      MLXK_ERR_INVALID_ARGUMENT,
      statusName(MLXK_ERR_INVALID_ARGUMENT),
      `${fn}: ${name}: ${values.length} values for ${slots} slots; expected one per slot`,
    );
  }
}

/** A host array's pointer (null for an empty one: bun:ffi refuses a pointer to zero bytes). */
function hostPtr(view: Int32Array | Uint8Array | null): Pointer | null {
  return view === null || view.byteLength === 0 ? null : ptr(view);
}

/** The slots and fresh flags of a call, checked against each other. The pointers are taken in
 * the call's own argument list (ptr(...) there), while `rows` holds the arrays. */
function rows(fn: string, slots: Int32Init, fresh: FreshInit) {
  const s = int32s("slots", slots);
  const f = freshFlags(fresh);
  if (f !== null) perSlot(fn, "fresh", f, s.length);
  return { s, f, n: s.length };
}

function updateArgs(q: MlxArray, k: MlxArray, v: MlxArray, a: MlxArray, b: MlxArray, aLog: MlxArray, dtBias: MlxArray, pool: MlxArray) {
  return [
    handleOf(q, "q"),
    handleOf(k, "k"),
    handleOf(v, "v"),
    handleOf(a, "a"),
    handleOf(b, "b"),
    handleOf(aLog, "aLog"),
    handleOf(dtBias, "dtBias"),
    handleOf(pool, "pool"),
  ] as const;
}

/** Runs an entry that fills a y and a pool slot and adopts both. */
function poolResult(fn: string, call: (y: BigUint64Array, pool: BigUint64Array) => number): GatedDeltaPoolResult {
  const y = outSlot();
  const pool = outSlot();
  check(call(y, pool));
  return { y: adopt(y, `${fn} y`), pool: adopt(pool, `${fn} pool`) };
}

/**
 * gatedDeltaUpdate on a pool: row b starts from pool[slots[b]] (zeros where fresh) and its final
 * state goes back there; bit for bit gathering those states, gatedDeltaUpdate on them and
 * scattering the states back. q ... dtBias and mask as gatedDeltaUpdate; one slot per batch row.
 */
export function gatedDeltaUpdatePool(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  pool: MlxArray,
  slots: Int32Init,
  fresh: FreshInit = null,
  mask: MlxArray | null = null,
): GatedDeltaPoolResult {
  const args = updateArgs(q, k, v, a, b, aLog, dtBias, pool);
  const r = rows("gatedDeltaUpdatePool", slots, fresh);
  return poolResult("gatedDeltaUpdatePool", (y, p) =>
    lib.mlxk_gated_delta_update_pool(...args, hostPtr(r.s), hostPtr(r.f), r.n, optionalHandle(mask), y, p),
  );
}

/**
 * gatedDeltaUpdatePool in the chunked (WY) form of gatedDeltaUpdateChunked (chunkSize as
 * there): each row's results equal gatedDeltaUpdateChunked's on the gathered states, bit for
 * bit, on the CPU and on the GPU.
 */
export function gatedDeltaUpdatePoolChunked(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  pool: MlxArray,
  slots: Int32Init,
  fresh: FreshInit = null,
  mask: MlxArray | null = null,
  chunkSize = 0,
): GatedDeltaPoolResult {
  const args = updateArgs(q, k, v, a, b, aLog, dtBias, pool);
  const r = rows("gatedDeltaUpdatePoolChunked", slots, fresh);
  const chunk = int32Arg("chunkSize", chunkSize);
  return poolResult("gatedDeltaUpdatePoolChunked", (y, p) =>
    lib.mlxk_gated_delta_update_pool_chunked(...args, hostPtr(r.s), hostPtr(r.f), r.n, optionalHandle(mask), chunk, y, p),
  );
}

/**
 * Speculative verify on a pool: gatedDeltaUpdatePool's y over each row's draft window (bit for
 * bit), reading the pool and writing no state. Commit each row's accepted prefix with
 * gatedDeltaStatePool on the same k, v and gates.
 */
export function gatedDeltaVerifyPool(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  pool: MlxArray,
  slots: Int32Init,
  fresh: FreshInit = null,
  mask: MlxArray | null = null,
): MlxArray {
  const args = updateArgs(q, k, v, a, b, aLog, dtBias, pool);
  const r = rows("gatedDeltaVerifyPool", slots, fresh);
  const y = outSlot();
  check(lib.mlxk_gated_delta_verify_pool(...args, hostPtr(r.s), hostPtr(r.f), r.n, optionalHandle(mask), y));
  return adopt(y, "gatedDeltaVerifyPool y");
}

/** The offsets and slots of a packed call: one slot per sequence (cuSeqlens.length - 1). */
function packedRows(fn: string, cuSeqlens: Int32Init, slots: Int32Init, fresh: FreshInit) {
  const cu = int32s("cuSeqlens", cuSeqlens);
  const r = rows(fn, slots, fresh);
  if (cu.length > 0 && r.n !== cu.length - 1) {
    throw new InvalidArgumentError(
      MLXK_ERR_INVALID_ARGUMENT,
      statusName(MLXK_ERR_INVALID_ARGUMENT),
      `${fn}: slots: ${r.n} slots for ${cu.length - 1} sequences (cuSeqlens holds N + 1 offsets); expected one per sequence`,
    );
  }
  return { ...r, cu };
}

/**
 * Packed variable-length prefill on a pool: q, k [1, totalT, Hk, Dk], v [1, totalT, Hv, Dv],
 * a, b [1, totalT, Hv] hold the sequences one after another; sequence i owns tokens
 * [cuSeqlens[i], cuSeqlens[i + 1]) (N + 1 offsets: 0, then each end; zero-length sequences
 * allowed) and slot slots[i]. Each sequence's y and state equal one gatedDeltaUpdate on it alone,
 * bit for bit. No mask.
 */
export function gatedDeltaUpdatePacked(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  pool: MlxArray,
  cuSeqlens: Int32Init,
  slots: Int32Init,
  fresh: FreshInit = null,
): GatedDeltaPoolResult {
  const args = updateArgs(q, k, v, a, b, aLog, dtBias, pool);
  const r = packedRows("gatedDeltaUpdatePacked", cuSeqlens, slots, fresh);
  return poolResult("gatedDeltaUpdatePacked", (y, p) =>
    lib.mlxk_gated_delta_update_packed(...args, hostPtr(r.cu), r.cu.length, hostPtr(r.s), hostPtr(r.f), y, p),
  );
}

/**
 * gatedDeltaUpdatePacked in the chunked (WY) form (chunkSize as in gatedDeltaUpdateChunked):
 * each sequence's results equal gatedDeltaUpdateChunked's on it alone, bit for bit, on the CPU
 * and on the GPU.
 */
export function gatedDeltaUpdatePackedChunked(
  q: MlxArray,
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  pool: MlxArray,
  cuSeqlens: Int32Init,
  slots: Int32Init,
  fresh: FreshInit = null,
  chunkSize = 0,
): GatedDeltaPoolResult {
  const args = updateArgs(q, k, v, a, b, aLog, dtBias, pool);
  const r = packedRows("gatedDeltaUpdatePackedChunked", cuSeqlens, slots, fresh);
  const chunk = int32Arg("chunkSize", chunkSize);
  return poolResult("gatedDeltaUpdatePackedChunked", (y, p) =>
    lib.mlxk_gated_delta_update_packed_chunked(...args, hostPtr(r.cu), r.cu.length, hostPtr(r.s), hostPtr(r.f), chunk, y, p),
  );
}

/**
 * The commit after a speculative verify on a pool (gatedDeltaState on a pool): row b replays its
 * first acceptedLengths[b] tokens of the window from pool[slots[b]] (zeros where fresh) and
 * writes the state back into that slot; bit for bit gatedDeltaState on the gathered states,
 * scattered back. A length of 0 leaves the slot as it was (a fresh one becomes zeros). Returns
 * the new pool (in place under the rule above).
 */
export function gatedDeltaStatePool(
  k: MlxArray,
  v: MlxArray,
  a: MlxArray,
  b: MlxArray,
  aLog: MlxArray,
  dtBias: MlxArray,
  pool: MlxArray,
  slots: Int32Init,
  acceptedLengths: Int32Init,
  fresh: FreshInit = null,
): MlxArray {
  const fn = "gatedDeltaStatePool";
  const args = [
    handleOf(k, "k"),
    handleOf(v, "v"),
    handleOf(a, "a"),
    handleOf(b, "b"),
    handleOf(aLog, "aLog"),
    handleOf(dtBias, "dtBias"),
    handleOf(pool, "pool"),
  ] as const;
  const r = rows(fn, slots, fresh);
  const lengths = int32s("acceptedLengths", acceptedLengths);
  perSlot(fn, "acceptedLengths", lengths, r.n);
  const out = outSlot();
  check(lib.mlxk_gated_delta_state_pool(...args, hostPtr(r.s), hostPtr(r.f), hostPtr(lengths), r.n, out));
  return adopt(out, `${fn} pool`);
}

/**
 * gatedDeltaUpdateFromConv on a pool: the head split of the convolution's output x, then
 * gatedDeltaUpdatePool on its q, k and v (bit for bit those two calls). x ... eps as
 * siluRmsHeads; a ... dtBias and mask as gatedDeltaUpdate; one slot per batch row.
 */
export function gatedDeltaUpdateFromConvPool(
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
  pool: MlxArray,
  slots: Int32Init,
  fresh: FreshInit = null,
  mask: MlxArray | null = null,
): GatedDeltaPoolResult {
  const fn = "gatedDeltaUpdateFromConvPool";
  const split = [
    handleOf(x, "x"),
    handleOf(qScale, "qScale"),
    handleOf(kScale, "kScale"),
    int32Arg("keyHeads", keyHeads),
    int32Arg("valueHeads", valueHeads),
    int32Arg("valueWidth", valueWidth),
    floatArg("eps", eps),
  ] as const;
  const gates = [handleOf(a, "a"), handleOf(b, "b"), handleOf(aLog, "aLog"), handleOf(dtBias, "dtBias"), handleOf(pool, "pool")] as const;
  const r = rows(fn, slots, fresh);
  return poolResult(fn, (y, p) =>
    lib.mlxk_gated_delta_update_from_conv_pool(...split, ...gates, hostPtr(r.s), hostPtr(r.f), r.n, optionalHandle(mask), y, p),
  );
}
