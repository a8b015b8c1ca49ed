// The calls on a pool of states by slot (src/pool.ts) against the dense calls of the same API:
// each row's state gathered from the pool on the host (zeros for fresh and padding rows), the
// dense call (gatedDeltaUpdate / Chunked / gatedDeltaState / siluRmsHeads) on them, and the
// states scattered back, bit for bit; packed prefill against one call per sequence; argument
// errors naming the argument.

import { afterEach, describe, expect, test } from "bun:test";
import {
  gatedDeltaState,
  gatedDeltaStatePool,
  gatedDeltaUpdate,
  gatedDeltaUpdateChunked,
  gatedDeltaUpdateFromConvPool,
  gatedDeltaUpdatePacked,
  gatedDeltaUpdatePackedChunked,
  gatedDeltaUpdatePool,
  gatedDeltaUpdatePoolChunked,
  gatedDeltaVerifyPool,
  DtypeError,
  InvalidArgumentError,
  liveArrayCount,
  MlxArray,
  siluRmsHeads,
  type GatedDeltaPoolResult,
} from "../src/index";
import { assertBitwiseEqual, disposeAll, floatArray, quantize, rngFor, SEED, type FloatDtype, type Rng } from "./helpers";

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

interface Heads {
  Hk: number;
  Hv: number;
  Dk: number;
  Dv: number;
}

/** Host values of `lengths.length` sequences (rows), each with its own token count. */
class Seqs {
  q: Float64Array[] = [];
  k: Float64Array[] = [];
  v: Float64Array[] = [];
  a: Float64Array[] = [];
  b: Float64Array[] = [];
  aLog: MlxArray;
  dtBias: MlxArray;

  constructor(
    rng: Rng,
    readonly lengths: number[],
    readonly h: Heads,
    readonly dtype: FloatDtype,
  ) {
    const unit = (n: number) => {
      const x = rng.normals(n * h.Hk * h.Dk);
      for (let i = 0; i < x.length; i += h.Dk) {
        let sum = 0;
        for (let j = 0; j < h.Dk; j++) sum += x[i + j]! ** 2;
        for (let j = 0; j < h.Dk; j++) x[i + j]! /= Math.sqrt(sum);
      }
      return quantize(x, dtype);
    };
    for (const len of lengths) {
      this.q.push(unit(len));
      this.k.push(unit(len));
      this.v.push(quantize(rng.normals(len * h.Hv * h.Dv), dtype));
      this.a.push(quantize(rng.normals(len * h.Hv, 2), "bfloat16"));
      this.b.push(quantize(rng.normals(len * h.Hv, 2), "float32"));
    }
    this.aLog = floatArray(quantize(rng.normals(h.Hv, 0.5), "float32"), [h.Hv], "float32");
    this.dtBias = floatArray(quantize(rng.normals(h.Hv, 0.5), "bfloat16"), [h.Hv], "bfloat16");
  }

  get stateSize(): number {
    return this.h.Hv * this.h.Dv * this.h.Dk;
  }

  poolShape(n: number): number[] {
    return [n, this.h.Hv, this.h.Dv, this.h.Dk];
  }

  /** q, k, v, a, b of sequences `rows`: [rows, T] (equal lengths) or packed [1, total]. */
  tokens(rows: number[], packed: boolean) {
    const total = rows.reduce((n, r) => n + this.lengths[r]!, 0);
    const [n, t] = packed ? [1, total] : [rows.length, rows.length === 0 ? 0 : this.lengths[rows[0]!]!];
    const cat = (x: Float64Array[]) => {
      const out = new Float64Array(rows.reduce((m, r) => m + x[r]!.length, 0));
      let at = 0;
      for (const r of rows) {
        out.set(x[r]!, at);
        at += x[r]!.length;
      }
      return out;
    };
    const { Hk, Hv, Dk, Dv } = this.h;
    return {
      q: floatArray(cat(this.q), [n, t, Hk, Dk], this.dtype),
      k: floatArray(cat(this.k), [n, t, Hk, Dk], this.dtype),
      v: floatArray(cat(this.v), [n, t, Hv, Dv], this.dtype),
      a: floatArray(cat(this.a), [n, t, Hv], "bfloat16"),
      b: floatArray(cat(this.b), [n, t, Hv], "float32"),
    };
  }

  /** The rows' start states: their slots' (zeros for a padding or fresh row). */
  gather(pool: Float32Array, slots: number[], fresh: Uint8Array | null): Float32Array {
    const s = this.stateSize;
    const out = new Float32Array(slots.length * s);
    slots.forEach((slot, r) => {
      if (slot >= 0 && !(fresh && fresh[r])) out.set(pool.subarray(slot * s, (slot + 1) * s), r * s);
    });
    return out;
  }

  dispose(): void {
    disposeAll(this.aLog, this.dtBias);
  }
}

/** `rows` distinct slots below n, about a quarter negative (padding rows). */
function randomSlots(rng: Rng, rows: number, n: number): number[] {
  const free = Array.from({ length: n }, (_, i) => i);
  return Array.from({ length: rows }, () =>
    free.length === 0 || rng.next() < 0.25 ? -1 - Math.floor(rng.next() * 3) : free.splice(Math.floor(rng.next() * free.length), 1)[0]!,
  );
}

function randomFresh(rng: Rng, rows: number): Uint8Array {
  return Uint8Array.from({ length: rows }, () => (rng.next() < 0.33 ? 1 : 0));
}

/** A pool call's results against the dense reference (y rows of `yRow` values): slotted rows'
 * y and slots bit for bit, padding rows' y zero, unnamed slots unchanged. */
function expectDense(
  label: string,
  s: Seqs,
  slots: number[],
  pool: Float32Array,
  y: Float32Array,
  newPool: Float32Array,
  yRef: Float32Array,
  statesRef: Float32Array,
  yRow: number,
): void {
  const n = s.stateSize;
  expect(y.length).toBe(yRef.length);
  expect(newPool.length).toBe(pool.length);
  slots.forEach((slot, r) => {
    const yr = y.subarray(r * yRow, (r + 1) * yRow);
    if (slot < 0) {
      expect(yr.every((x) => x === 0)).toBe(true);
    } else {
      assertBitwiseEqual(`${label}: row ${r}'s y`, yr, yRef.subarray(r * yRow, (r + 1) * yRow));
      assertBitwiseEqual(`${label}: slot ${slot}`, newPool.subarray(slot * n, (slot + 1) * n), statesRef.subarray(r * n, (r + 1) * n));
    }
  });
  for (let slot = 0; slot * n < pool.length; slot++) {
    if (!slots.includes(slot)) {
      assertBitwiseEqual(`${label}: unnamed slot ${slot}`, newPool.subarray(slot * n, (slot + 1) * n), pool.subarray(slot * n, (slot + 1) * n));
    }
  }
}

describe("a pool call is gather, the dense call, scatter, bit for bit", () => {
  const cases: Array<[string, number, number, Heads, number, FloatDtype]> = [
    ["bf16, T = 4", 3, 4, { Hk: 1, Hv: 2, Dk: 32, Dv: 8 }, 5, "bfloat16"],
    ["f32 decode, Hv/Hk = 2", 4, 1, { Hk: 2, Hv: 4, Dk: 64, Dv: 16 }, 4, "float32"],
    ["bf16, T = 17, more slots than rows", 5, 17, { Hk: 1, Hv: 2, Dk: 32, Dv: 3 }, 9, "bfloat16"],
  ];
  for (const [name, B, T, h, N, dtype] of cases) {
    test(name, () => {
      const rng = rngFor(`pool ${name}`);
      const s = new Seqs(rng, Array(B).fill(T), h, dtype);
      const poolHost = Float32Array.from(rng.normals(N * s.stateSize, 0.5));
      using pool = MlxArray.fromFloat32(poolHost, s.poolShape(N));
      const x = s.tokens([...Array(B).keys()], false);
      for (const variant of [0, 1, 2]) {
        const slots = randomSlots(rng, B, N);
        const fresh = variant > 0 ? randomFresh(rng, B) : null;
        const maskBytes = Uint8Array.from({ length: B * T }, () => (variant === 1 && rng.next() < 0.25 ? 0 : 1));
        using mask = MlxArray.fromBool(maskBytes, [B, T]);
        const m = variant === 1 ? mask : null;
        using start = MlxArray.fromFloat32(s.gather(poolHost, slots, fresh), s.poolShape(B));
        const label = `${name}, slots ${slots}, fresh ${fresh}, mask ${m !== null} (seed ${SEED})`;
        for (const chunked of [false, true]) {
          const dense = chunked
            ? gatedDeltaUpdateChunked(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, start, m, 16)
            : gatedDeltaUpdate(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, start, m);
          // Fresh flags as booleans once, as bytes once.
          const flags = fresh && variant === 2 ? Array.from(fresh, (f) => f !== 0) : fresh;
          const pooled: GatedDeltaPoolResult = chunked
            ? gatedDeltaUpdatePoolChunked(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, slots, flags, m, 16)
            : gatedDeltaUpdatePool(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, Int32Array.from(slots), flags, m);
          expect(pooled.y.dtype).toBe(dtype);
          expect(pooled.pool.shape).toEqual(s.poolShape(N));
          const y = pooled.y.toFloat32Array();
          expectDense(label, s, slots, poolHost, y, pooled.pool.toFloat32Array(), dense.y.toFloat32Array(), dense.state.toFloat32Array(), T * h.Hv * h.Dv);
          if (!chunked) {
            using verified = gatedDeltaVerifyPool(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, slots, fresh, m);
            assertBitwiseEqual(`${label}: verify's y`, verified.toFloat32Array(), y);
          }
          disposeAll(dense, pooled);
        }
      }
      assertBitwiseEqual("the pool kept by the caller", pool.toFloat32Array(), poolHost);
      disposeAll(x, s);
    });
  }
});

test("packed prefill equals one dense call per sequence, exact and chunked", () => {
  const rng = rngFor("packed");
  for (const lengths of [[5, 0, 3, 7], [1], [2, 9, 1, 0, 4, 6]]) {
    const seqs = lengths.length;
    const N = seqs + 2;
    const s = new Seqs(rng, lengths, { Hk: 1, Hv: 2, Dk: 32, Dv: 6 }, "bfloat16");
    const size = s.stateSize;
    const perToken = 2 * 6;
    const poolHost = Float32Array.from(rng.normals(N * size, 0.5));
    using pool = MlxArray.fromFloat32(poolHost, s.poolShape(N));
    const slots = randomSlots(rng, seqs, N);
    const fresh = randomFresh(rng, seqs);
    const cu = [0];
    for (const len of lengths) cu.push(cu[cu.length - 1]! + len);
    const x = s.tokens([...Array(seqs).keys()], true);
    const starts = s.gather(poolHost, slots, fresh);
    for (const chunked of [false, true]) {
      const label = `lengths ${lengths}, slots ${slots}, fresh ${fresh}, chunked ${chunked} (seed ${SEED})`;
      const packed = chunked
        ? gatedDeltaUpdatePackedChunked(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, cu, slots, fresh, 16)
        : gatedDeltaUpdatePacked(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, Int32Array.from(cu), slots, fresh);
      expect(packed.y.shape).toEqual([1, cu[seqs]!, 2, 6]);
      const y = packed.y.toFloat32Array();
      const newPool = packed.pool.toFloat32Array();
      lengths.forEach((len, i) => {
        const ys = y.subarray(cu[i]! * perToken, cu[i + 1]! * perToken);
        const slot = slots[i]!;
        if (slot < 0) return expect(ys.every((v) => v === 0)).toBe(true);
        const dst = newPool.subarray(slot * size, (slot + 1) * size);
        const start = starts.subarray(i * size, (i + 1) * size);
        // Nothing run: the start state (zeros when fresh) is written.
        if (len === 0) return assertBitwiseEqual(`${label}: sequence ${i}`, dst, start);
        const one = s.tokens([i], false);
        using st = MlxArray.fromFloat32(start.slice(), s.poolShape(1));
        const alone = chunked
          ? gatedDeltaUpdateChunked(one.q, one.k, one.v, one.a, one.b, s.aLog, s.dtBias, st, null, 16)
          : gatedDeltaUpdate(one.q, one.k, one.v, one.a, one.b, s.aLog, s.dtBias, st);
        assertBitwiseEqual(`${label}: sequence ${i}'s y`, ys, alone.y.toFloat32Array());
        assertBitwiseEqual(`${label}: sequence ${i}'s state`, dst, alone.state.toFloat32Array());
        disposeAll(one, alone);
      });
      for (let slot = 0; slot < N; slot++) {
        if (!slots.includes(slot)) {
          assertBitwiseEqual(`${label}: unnamed slot ${slot}`, newPool.subarray(slot * size, (slot + 1) * size), poolHost.subarray(slot * size, (slot + 1) * size));
        }
      }
      disposeAll(packed);
    }
    disposeAll(x, s);
  }
});

test("verify then commit with gatedDeltaStatePool equals the dense replay", () => {
  const rng = rngFor("verify-commit");
  const [B, T, N] = [5, 4, 7];
  const h = { Hk: 2, Hv: 4, Dk: 32, Dv: 8 };
  const s = new Seqs(rng, Array(B).fill(T), h, "bfloat16");
  const poolHost = Float32Array.from(rng.normals(N * s.stateSize, 0.5));
  using pool = MlxArray.fromFloat32(poolHost, s.poolShape(N));
  const x = s.tokens([...Array(B).keys()], false);
  const slots = randomSlots(rng, B, N);
  const fresh = [false, true, false, false, true];
  const accepted = [0, T, ...Array.from({ length: B - 2 }, () => Math.floor(rng.next() * (T + 1)))];
  const freshBytes = Uint8Array.from(fresh, Number);
  using start = MlxArray.fromFloat32(s.gather(poolHost, slots, freshBytes), s.poolShape(B));
  using y = gatedDeltaVerifyPool(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, slots, fresh);
  const dense = gatedDeltaUpdate(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, start);
  using replayed = gatedDeltaState(x.k, x.v, x.a, x.b, s.aLog, s.dtBias, start, accepted);
  using committed = gatedDeltaStatePool(x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, slots, Int32Array.from(accepted), fresh);
  const label = `slots ${slots}, accepted ${accepted} (seed ${SEED})`;
  const c = committed.toFloat32Array();
  expectDense(label, s, slots, poolHost, y.toFloat32Array(), c, dense.y.toFloat32Array(), replayed.toFloat32Array(), T * h.Hv * h.Dv);
  const n = s.stateSize;
  if (slots[1]! >= 0) {
    // Row 1 accepted every token: its slot holds the update's state.
    assertBitwiseEqual(label, c.subarray(slots[1]! * n, (slots[1]! + 1) * n), dense.state.toFloat32Array().subarray(n, 2 * n));
  }
  disposeAll(dense, x, s);
});

test("the update from the convolution's output on a pool equals the split then the pool update; a decode loop on the pool equals one call", () => {
  const rng = rngFor("from-conv");
  const [Hk, Hv, Dk, Dv, B, T, N] = [1, 2, 32, 8, 3, 5, 4];
  const width = 2 * Hk * Dk + Hv * Dv;
  const bf = (n: number, shape: number[], scale = 1) => floatArray(quantize(rng.normals(n, scale), "bfloat16"), shape, "bfloat16");
  using conv = bf(B * T * width, [B, T, width]);
  using qScale = bf(Dk, [Dk], 0.2);
  using kScale = bf(Dk, [Dk], 0.2);
  using a = bf(B * T * Hv, [B, T, Hv]);
  using b = bf(B * T * Hv, [B, T, Hv]);
  using aLog = MlxArray.fromFloat32(Float32Array.from(rng.normals(Hv, 0.5)), [Hv]);
  using dtBias = MlxArray.fromFloat32(Float32Array.from(rng.normals(Hv, 0.5)), [Hv]);
  const poolHost = Float32Array.from(rng.normals(N * Hv * Dv * Dk));
  using pool = MlxArray.fromFloat32(poolHost, [N, Hv, Dv, Dk]);
  const slots = [2, -1, 0];
  const fresh = Uint8Array.of(0, 0, 1);
  const eps = 1e-6 / Dk;

  const fused = gatedDeltaUpdateFromConvPool(conv, qScale, kScale, Hk, Hv, Dv, eps, a, b, aLog, dtBias, pool, slots, fresh);
  const heads = siluRmsHeads(conv, qScale, kScale, Hk, Hv, Dv, eps);
  const split = gatedDeltaUpdatePool(heads.q, heads.k, heads.v, a, b, aLog, dtBias, pool, slots, fresh);
  const sy = split.y.toFloat32Array();
  const sp = split.pool.toFloat32Array();
  assertBitwiseEqual("fromConvPool y", fused.y.toFloat32Array(), sy);
  assertBitwiseEqual("fromConvPool pool", fused.pool.toFloat32Array(), sp);

  // Decode: one token at a time, the old pool disposed before the new one is evaluated.
  const [q, k, v, av, bv] = [heads.q, heads.k, heads.v, a, b].map((t) => t.toFloat32Array());
  const token = (x: Float32Array, step: number, width: number) => {
    const out = new Float32Array(B * width);
    for (let r = 0; r < B; r++) out.set(x.subarray((r * T + step) * width, (r * T + step + 1) * width), r * width);
    return out;
  };
  const bfOf = (x: Float32Array, shape: number[]) => floatArray(x, shape, "bfloat16");
  let state = MlxArray.fromFloat32(poolHost, [N, Hv, Dv, Dk]);
  const ys: Float32Array[] = [];
  for (let step = 0; step < T; step++) {
    const inputs = [
      bfOf(token(q!, step, Hk * Dk), [B, 1, Hk, Dk]),
      bfOf(token(k!, step, Hk * Dk), [B, 1, Hk, Dk]),
      bfOf(token(v!, step, Hv * Dv), [B, 1, Hv, Dv]),
      bfOf(token(av!, step, Hv), [B, 1, Hv]),
      bfOf(token(bv!, step, Hv), [B, 1, Hv]),
    ] as const;
    const one = gatedDeltaUpdatePool(...inputs, aLog, dtBias, state, slots, step === 0 ? fresh : null);
    state.dispose();
    state = one.pool.eval();
    ys.push(one.y.toFloat32Array());
    disposeAll(one.y, ...inputs);
  }
  assertBitwiseEqual("the decode loop's pool", state.toFloat32Array(), sp);
  for (let step = 0; step < T; step++) {
    for (let r = 0; r < B; r++) {
      const w = Hv * Dv;
      assertBitwiseEqual(`decode step ${step} row ${r}`, ys[step]!.subarray(r * w, (r + 1) * w), sy.subarray((r * T + step) * w, (r * T + step + 1) * w));
    }
  }
  disposeAll(state, fused, heads, split);
});

function thrown(fn: () => unknown): Error {
  try {
    fn();
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected an exception");
}

test("bad arguments throw errors naming them", () => {
  const rng = rngFor("errors");
  const s = new Seqs(rng, [2, 2, 2], { Hk: 1, Hv: 1, Dk: 32, Dv: 4 }, "float32");
  const x = s.tokens([0, 1, 2], false);
  const p = s.tokens([0, 1, 2], true);
  using pool = MlxArray.zeros(s.poolShape(4));
  using bf16Pool = MlxArray.zeros(s.poolShape(4), "bfloat16");
  const update = (slots: number[], fresh: boolean[] | null = null, pl = pool) =>
    thrown(() => gatedDeltaUpdatePool(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pl, slots, fresh));

  let e = update([1, 3, 1]);
  expect(e).toBeInstanceOf(InvalidArgumentError);
  expect(e.message).toStartWith("mlxk_gated_delta_update_pool: slots[2] is 1, which slots[0] names too");
  e = thrown(() => gatedDeltaVerifyPool(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, [0, 4, -1]));
  expect(e).toBeInstanceOf(InvalidArgumentError);
  expect(e.message).toContain("slots[1] is 4; expected a pool row below N = 4");
  e = update([0, 1, 2], [true, false]);
  expect(e).toBeInstanceOf(InvalidArgumentError);
  expect(e.message).toBe("gatedDeltaUpdatePool: fresh: 2 values for 3 slots; expected one per slot");
  e = update([0, 1, 2], null, bf16Pool);
  expect(e).toBeInstanceOf(DtypeError);
  expect(e.message).toContain("pool: dtype bfloat16");
  e = update([0, 1.5, 2]);
  expect(e).toBeInstanceOf(RangeError);
  expect(e.message).toContain("slots[1]");
  e = thrown(() => gatedDeltaStatePool(x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, [0, 1, 2], [1, 1]));
  expect(e.message).toBe("gatedDeltaStatePool: acceptedLengths: 2 values for 3 slots; expected one per slot");
  e = thrown(() => gatedDeltaStatePool(x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, [0, 1, 2], [1, 3, 0]));
  expect(e).toBeInstanceOf(InvalidArgumentError);
  expect(e.message).toContain("accepted_lengths");
  e = thrown(() => gatedDeltaUpdatePacked(p.q, p.k, p.v, p.a, p.b, s.aLog, s.dtBias, pool, [0, 2, 6], [0]));
  expect(e.message).toContain("slots: 1 slots for 2 sequences");
  e = thrown(() => gatedDeltaUpdatePacked(p.q, p.k, p.v, p.a, p.b, s.aLog, s.dtBias, pool, [0, 4, 5], [0, 1]));
  expect(e).toBeInstanceOf(InvalidArgumentError);
  expect(e.message).toContain("cu_seqlens[2] is 5; expected total_T = 6");
  e = thrown(() => gatedDeltaUpdatePoolChunked(x.q, x.k, x.v, x.a, x.b, s.aLog, s.dtBias, pool, [0, 1, 2], null, null, 8));
  expect(e.message).toContain("chunk_size");
  disposeAll(x, p, s);
});
