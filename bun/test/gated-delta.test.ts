// compute_g, the gated-delta recurrence and the prefix replay against float64 references.
//
// Tolerances (u = 2^-24, the float32 unit roundoff; bf16 has 8 significant bits, so rounding a
// value to bf16 moves it by at most 2^-8 of itself):
// - compute_g, float32 inputs: MLX's float32 exp and logaddexp each err by a few u (its exp
//   polynomial by up to ~2e-7·(1+|x|)), and the outer exp turns an absolute error in its
//   argument into a relative one in g, so |g - ref| <= 4e-6 · (1 + |ln ref|) · ref.
// - compute_g, bfloat16 a and dt_bias: a + dt_bias and softplus are bf16, and MLX evaluates
//   logaddexp(x, 0) = max + log1p(exp(min - max)) rounding each step to bf16; the reference
//   rounds at the same points. Its float64 exp/log1p can still land on the other side of a bf16
//   rounding boundary than MLX's float32 ones (rarely: ~1e-7 / 2^-8 per value), moving softplus
//   by one bf16 ulp (2^-7 relative) and ln g by |ln g| · 2^-7: every element must lie within
//   that, and at least 95% must match the reference to float32 accuracy (measured: 100%; a
//   wrong rounding point fails this — the test checks that it can tell).
// - state (float32, accumulated in float32 by the kernel, float64 here): each token adds the
//   rounding errors of two Dk-term dot products, at most about Dk·u relative to the magnitudes
//   involved, and the delta rule with unit-norm k and beta in (0, 1) does not amplify them; so
//   |s - ref| <= 2 · T · Dk · u · max(1, max|ref|)  (T tokens). Measured over 25 seeds: at
//   most 2.7e-7 (the bound is 1.5e-5 to 5e-5 here).
// - y: the kernel's float32 sum (the state bound scaled by |q| = Dk^-1/2, plus Dk·u) then one
//   rounding to the output dtype: + 2^-8 · |ref| for bfloat16, + u · |ref| for float32.
//   Measured for bfloat16 over 25 seeds: max relative error 0.00386 < 2^-8 = 0.00391.
// - bf16 a, b and dt_bias (the model's dtypes): beta = sigmoid(b) is bf16 too (emulated with
//   MLX's rounding points, docs/DESIGN.md §4); the same rare one-ulp flip of beta or softplus (2^-7)
//   would move the state by up to ~2^-7 of an update, so the state bound there is
//   2^-6 · max|ref| (measured: at most 1.9e-7; a wrong head mapping, gate or sign errs by O(1)).
// - the chunked form against the exact update on the same inputs: the two differ only in
//   float32 rounding (the header: each within about 1e-6 of the largest magnitude of a float64
//   recurrence), so the state lies within 2e-5 · max|state| of the exact one, and y within one
//   ulp of the output dtype (the two float32 sums may round to neighbouring bf16 values) plus
//   2e-5 · max|y|. A wrong chunk boundary, gate product or mask errs by O(1).

import { afterEach, describe, expect, test } from "bun:test";
import {
  computeG,
  gatedDeltaState,
  gatedDeltaUpdate,
  gatedDeltaUpdateChunked,
  gatedDeltaUpdateFromConv,
  InvalidArgumentError,
  siluRmsHeads,
  liveArrayCount,
  MlxArray,
} from "../src/index";
import {
  assertBitwiseEqual,
  assertClose,
  disposeAll,
  floatArray,
  maxAbs,
  quantize,
  read,
  report,
  rngFor,
  type FloatDtype,
  type Rng,
} from "./helpers";
import { bf16, computeGRef, exact, recurrenceRef, sigmoidIn, type RecurrenceDims } from "./reference";

const U = 2 ** -24;

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

/** Host values of one recurrence problem (exactly representable in their dtypes). */
interface Problem {
  d: RecurrenceDims;
  qkvDtype: FloatDtype;
  gateDtype: FloatDtype;
  q: Float64Array;
  k: Float64Array;
  v: Float64Array;
  a: Float64Array;
  b: Float64Array;
  aLog: Float64Array;
  dtBias: Float64Array;
  state: Float64Array | null;
  mask: Uint8Array | null;
}

/** Unit-norm rows of `width` (scaled by `scale`), as mlx-lm's normalize_qk gives. */
function unitRows(rng: Rng, rows: number, width: number, scale: number): Float64Array {
  const out = rng.normals(rows * width);
  for (let r = 0; r < rows; r++) {
    let n = 0;
    for (let i = 0; i < width; i++) n += out[r * width + i]! ** 2;
    const f = scale / Math.sqrt(n);
    for (let i = 0; i < width; i++) out[r * width + i]! *= f;
  }
  return out;
}

function makeProblem(
  rng: Rng,
  d: RecurrenceDims,
  qkvDtype: FloatDtype,
  gateDtype: FloatDtype,
  withState: boolean,
  withMask: boolean,
): Problem {
  const { B, T, Hk, Hv, Dk, Dv } = d;
  const mask = withMask ? Uint8Array.from({ length: B * T }, () => (rng.next() < 0.7 ? 1 : 0)) : null;
  return {
    d,
    qkvDtype,
    gateDtype,
    // mlx-lm: q = Dk^-1 · rms_norm(q) has norm Dk^-1/2; k = Dk^-1/2 · rms_norm(k) has norm 1.
    q: quantize(unitRows(rng, B * T * Hk, Dk, 1 / Math.sqrt(Dk)), qkvDtype),
    k: quantize(unitRows(rng, B * T * Hk, Dk, 1), qkvDtype),
    v: quantize(rng.normals(B * T * Hv * Dv), qkvDtype),
    a: quantize(rng.normals(B * T * Hv), gateDtype),
    b: quantize(rng.normals(B * T * Hv, 2), gateDtype),
    aLog: quantize(rng.uniforms(Hv, -1.5, 1), gateDtype),
    dtBias: quantize(rng.uniforms(Hv, -0.5, 0.5), gateDtype),
    state: withState ? quantize(rng.normals(B * Hv * Dv * Dk, 0.5), "float32") : null,
    mask,
  };
}

/** The library's arrays for a problem (caller disposes). */
function arraysOf(p: Problem) {
  const { B, T, Hk, Hv, Dk, Dv } = p.d;
  return {
    q: floatArray(p.q, [B, T, Hk, Dk], p.qkvDtype),
    k: floatArray(p.k, [B, T, Hk, Dk], p.qkvDtype),
    v: floatArray(p.v, [B, T, Hv, Dv], p.qkvDtype),
    a: floatArray(p.a, [B, T, Hv], p.gateDtype),
    b: floatArray(p.b, [B, T, Hv], p.gateDtype),
    aLog: floatArray(p.aLog, [Hv], p.gateDtype),
    dtBias: floatArray(p.dtBias, [Hv], p.gateDtype),
    ...(p.state ? { state: floatArray(p.state, [B, Hv, Dv, Dk], "float32") } : {}),
    ...(p.mask ? { mask: MlxArray.fromBool(p.mask, [B, T]) } : {}),
  } as Record<string, MlxArray>;
}

/** Reference g and beta with the gate dtype's rounding points. */
function gatesRef(p: Problem): { g: Float64Array; beta: Float64Array } {
  const round = p.gateDtype === "bfloat16" ? bf16 : exact;
  return {
    g: computeGRef(p.aLog, p.a, p.dtBias, round),
    beta: Float64Array.from(p.b, (x) => sigmoidIn(x, round)),
  };
}

function stateTolerance(p: Problem, ref: Float64Array): (e: number) => number {
  if (p.gateDtype === "bfloat16") {
    const bound = 2 ** -6 * Math.max(1, maxAbs(ref));
    return () => bound;
  }
  const bound = 2 * p.d.T * p.d.Dk * U * Math.max(1, maxAbs(ref));
  return () => bound;
}

function yTolerance(p: Problem, stateRef: Float64Array): (e: number) => number {
  const sumBound = stateTolerance(p, stateRef)(0) / Math.sqrt(p.d.Dk) + p.d.Dk * U;
  const rounding = p.qkvDtype === "bfloat16" ? 2 ** -8 : U;
  return (e) => sumBound + rounding * Math.abs(e);
}

describe("computeG", () => {
  test("float32 inputs against float64", () => {
    const rng = rngFor("computeG f32");
    const Hv = 6;
    const aLog = quantize(rng.uniforms(Hv, -2, 1.2), "float32");
    const a = quantize(rng.normals(3 * 5 * Hv, 2), "float32");
    const dtBias = quantize(rng.uniforms(Hv, -1, 1), "float32");
    using aLogA = floatArray(aLog, [Hv], "float32");
    using aA = floatArray(a, [3, 5, Hv], "float32");
    using dtA = floatArray(dtBias, [Hv], "float32");
    using g = computeG(aLogA, aA, dtA);
    expect(g.dtype).toBe("float32");
    expect(g.shape).toEqual([3, 5, Hv]);
    const ref = computeGRef(aLog, a, dtBias);
    const c = assertClose("g (float32)", read(g), ref, (e) => 4e-6 * (1 + Math.abs(Math.log(e))) * e);
    report("computeG f32", c);
  });

  test("bfloat16 a, dt_bias and a_log: bf16 rounding points, float32 result", () => {
    const rng = rngFor("computeG bf16");
    const Hv = 8;
    const aLog = quantize(rng.uniforms(Hv, -2, 1.2), "bfloat16");
    const a = quantize(rng.normals(4 * 16 * Hv, 2), "bfloat16");
    const dtBias = quantize(rng.uniforms(Hv, -1, 1), "bfloat16");
    using aLogA = floatArray(aLog, [Hv], "bfloat16");
    using aA = floatArray(a, [4, 16, Hv], "bfloat16");
    using dtA = floatArray(dtBias, [Hv], "bfloat16");
    using g = computeG(aLogA, aA, dtA);
    expect(g.dtype).toBe("float32");
    const actual = read(g);
    const ref = computeGRef(aLog, a, dtBias, bf16);
    const c = assertClose("g (bf16 inputs)", actual, ref, (e) => (Math.abs(Math.log(e)) * 2 ** -7 + 1e-5) * e);
    let close = 0;
    for (let i = 0; i < ref.length; i++) {
      if (Math.abs(actual[i]! - ref[i]!) <= 4e-6 * (1 + Math.abs(Math.log(ref[i]!))) * ref[i]!) close++;
    }
    report("computeG bf16", { ...c, fractionWithinF32: close / ref.length });
    expect(close / ref.length).toBeGreaterThanOrEqual(0.95);
    // Without the rounding points the reference is measurably different: the test can tell.
    const unrounded = computeGRef(aLog, a, dtBias, exact);
    let far = 0;
    for (let i = 0; i < ref.length; i++) if (Math.abs(unrounded[i]! - actual[i]!) > 1e-5 * actual[i]!) far++;
    expect(far).toBeGreaterThan(ref.length / 4);
  });
});

describe("gatedDeltaUpdate", () => {
  const cases: Array<[string, RecurrenceDims, FloatDtype, FloatDtype, boolean, boolean]> = [
    ["bf16 q/k/v, prefill with state, Hv/Hk = 2", { B: 2, T: 6, Hk: 2, Hv: 4, Dk: 64, Dv: 8 }, "bfloat16", "float32", true, false],
    ["bf16 q/k/v, no state (zeros), mask, Hv/Hk = 3", { B: 3, T: 5, Hk: 1, Hv: 3, Dk: 32, Dv: 5 }, "bfloat16", "float32", false, true],
    ["bf16 decode T = 1, Dk = 128", { B: 2, T: 1, Hk: 2, Hv: 2, Dk: 128, Dv: 4 }, "bfloat16", "float32", true, false],
    ["f32 q/k/v, Hv/Hk = 4, mask and state", { B: 2, T: 4, Hk: 1, Hv: 4, Dk: 96, Dv: 3 }, "float32", "float32", true, true],
    ["bf16 everything (the model's dtypes)", { B: 2, T: 7, Hk: 2, Hv: 4, Dk: 64, Dv: 6 }, "bfloat16", "bfloat16", true, true],
  ];
  for (const [name, d, qkvDtype, gateDtype, withState, withMask] of cases) {
    test(name, () => {
      const rng = rngFor(`update ${name}`);
      const p = makeProblem(rng, d, qkvDtype, gateDtype, withState, withMask);
      const x = arraysOf(p);
      const { y, state } = gatedDeltaUpdate(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, x.state ?? null, x.mask ?? null);
      try {
        expect(y.shape).toEqual([d.B, d.T, d.Hv, d.Dv]);
        expect(y.dtype).toBe(qkvDtype);
        expect(state.shape).toEqual([d.B, d.Hv, d.Dv, d.Dk]);
        expect(state.dtype).toBe("float32");
        const { g, beta } = gatesRef(p);
        const ref = recurrenceRef(d, p.q, p.k, p.v, g, beta, p.state, p.mask);
        const yActual = read(y);
        const cs = assertClose(`${name}: state`, read(state), ref.state, stateTolerance(p, ref.state));
        const cy = assertClose(`${name}: y`, yActual, ref.y, yTolerance(p, ref.state));
        report(`update ${name}`, { stateMaxAbsErr: cs.maxAbsError, stateMaxAbs: maxAbs(ref.state), yMaxAbsErr: cy.maxAbsError, yMaxRel: cy.maxRelError });
        if (p.mask) {
          // Masked tokens write exactly 0.
          const per = d.Hv * d.Dv;
          for (let bt = 0; bt < d.B * d.T; bt++) {
            if (p.mask[bt]) continue;
            for (let i = 0; i < per; i++) expect(yActual[bt * per + i]).toBe(0);
          }
        }
      } finally {
        disposeAll(y, state, x);
      }
    });
  }

  test("one prefill call equals token-by-token decode carrying the state, bit for bit", () => {
    const rng = rngFor("prefill vs decode");
    const d: RecurrenceDims = { B: 2, T: 4, Hk: 1, Hv: 2, Dk: 32, Dv: 4 };
    const p = makeProblem(rng, d, "bfloat16", "float32", true, false);
    const x = arraysOf(p);
    const full = gatedDeltaUpdate(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, x.state!, null);
    const fullState = full.state.toFloat32Array();
    const fullY = full.y.toFloat32Array();
    disposeAll(full.y, full.state);

    // The same tokens one at a time, in a decode loop that frees the old state first.
    const { B, Hk, Hv, Dk, Dv, T } = d;
    let state: MlxArray = x.state!.astype("float32");
    const ys: Float32Array[] = [];
    for (let t = 0; t < T; t++) {
      const slice = (values: Float64Array, inner: number) => {
        const out = new Float64Array(B * inner);
        for (let b = 0; b < B; b++) out.set(values.subarray((b * T + t) * inner, (b * T + t + 1) * inner), b * inner);
        return out;
      };
      using q = floatArray(slice(p.q, Hk * Dk), [B, 1, Hk, Dk], "bfloat16");
      using k = floatArray(slice(p.k, Hk * Dk), [B, 1, Hk, Dk], "bfloat16");
      using v = floatArray(slice(p.v, Hv * Dv), [B, 1, Hv, Dv], "bfloat16");
      using a = floatArray(slice(p.a, Hv), [B, 1, Hv], "float32");
      using b = floatArray(slice(p.b, Hv), [B, 1, Hv], "float32");
      const step = gatedDeltaUpdate(q, k, v, a, b, x.aLog!, x.dtBias!, state, null);
      state.dispose(); // before evaluating the new state: the kernel may reuse its buffer
      step.state.eval();
      state = step.state;
      ys.push(step.y.toFloat32Array());
      step.y.dispose();
    }
    const decodedState = state.toFloat32Array();
    state.dispose();
    disposeAll(x);
    assertBitwiseEqual("decode state vs prefill state", decodedState, fullState);
    // y: token t of row b is ys[t][b]; the prefill has it at [b, t].
    const per = Hv * Dv;
    const stitched = new Float32Array(B * T * per);
    for (let t = 0; t < T; t++) for (let b = 0; b < B; b++) stitched.set(ys[t]!.subarray(b * per, (b + 1) * per), (b * T + t) * per);
    assertBitwiseEqual("decode y vs prefill y", stitched, fullY);
  });
});

describe("gatedDeltaState (prefix replay)", () => {
  test("equals the update's state for each row's accepted prefix, bit for bit, and the float64 reference", () => {
    const rng = rngFor("replay");
    const d: RecurrenceDims = { B: 4, T: 5, Hk: 2, Hv: 4, Dk: 64, Dv: 6 };
    const p = makeProblem(rng, d, "bfloat16", "float32", true, false);
    const x = arraysOf(p);
    const lengths = [0, 3, 5, 1];
    // The update over the same window with a mask keeping exactly each row's prefix: a masked
    // token leaves the state untouched, so its state is the prefix state.
    const prefixMask = Uint8Array.from({ length: d.B * d.T }, (_, i) => (i % d.T < lengths[Math.floor(i / d.T)]! ? 1 : 0));
    using mask = MlxArray.fromBool(prefixMask, [d.B, d.T]);
    using replayed = gatedDeltaState(x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, x.state!, lengths);
    const updated = gatedDeltaUpdate(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, x.state!, mask);
    try {
      expect(replayed.shape).toEqual([d.B, d.Hv, d.Dv, d.Dk]);
      expect(replayed.dtype).toBe("float32");
      const replayState = replayed.toFloat32Array();
      assertBitwiseEqual("replay vs masked update", replayState, updated.state.toFloat32Array());
      // Row 0 accepted nothing: its state is the initial state, bit for bit.
      const rowSize = d.Hv * d.Dv * d.Dk;
      assertBitwiseEqual("length 0 keeps the state", replayState.subarray(0, rowSize), Float32Array.from(p.state!.subarray(0, rowSize)));
      const { g, beta } = gatesRef(p);
      const ref = recurrenceRef(d, null, p.k, p.v, g, beta, p.state, null, lengths);
      const c = assertClose("replay state", Float64Array.from(replayState), ref.state, stateTolerance(p, ref.state));
      report("replay", c);
    } finally {
      disposeAll(updated.y, updated.state, x);
    }
  });

  test("lengths as Int32Array, no state (zeros), all tokens accepted", () => {
    const rng = rngFor("replay zeros");
    const d: RecurrenceDims = { B: 2, T: 3, Hk: 1, Hv: 1, Dk: 32, Dv: 2 };
    const p = makeProblem(rng, d, "float32", "float32", false, false);
    const x = arraysOf(p);
    using replayed = gatedDeltaState(x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, null, new Int32Array([3, 3]));
    const updated = gatedDeltaUpdate(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!);
    try {
      assertBitwiseEqual("replay of the whole window", replayed.toFloat32Array(), updated.state.toFloat32Array());
    } finally {
      disposeAll(updated.y, updated.state, x);
    }
  });
});

/** One ulp of the float32 or bfloat16 value x (0 for 0). */
function ulpOf(x: number, dtype: FloatDtype): number {
  if (x === 0) return 0;
  const exponent = ((new Uint32Array(Float32Array.of(x).buffer)[0]! >>> 23) & 0xff) - 127;
  return 2 ** (exponent - (dtype === "bfloat16" ? 7 : 23));
}

describe("gatedDeltaUpdateChunked", () => {
  // [name, dims, q/k/v dtype, gate dtype, state, mask, chunkSize]: T spans several chunks and
  // ends in a partial one.
  const cases: Array<[string, RecurrenceDims, FloatDtype, FloatDtype, boolean, boolean, number]> = [
    ["bf16 q/k/v, state, default chunk (0), Hv/Hk = 2", { B: 2, T: 70, Hk: 2, Hv: 4, Dk: 64, Dv: 16 }, "bfloat16", "float32", true, false, 0],
    ["f32 q/k/v, no state, chunk 16, Hv/Hk = 3", { B: 1, T: 37, Hk: 1, Hv: 3, Dk: 32, Dv: 8 }, "float32", "float32", false, false, 16],
    ["bf16 everything, mask and state, chunk 48, Dk = 128", { B: 3, T: 50, Hk: 2, Hv: 4, Dk: 128, Dv: 8 }, "bfloat16", "bfloat16", true, true, 48],
    ["f32 q/k/v, mask, no state, chunk 128 (one partial chunk)", { B: 2, T: 45, Hk: 1, Hv: 2, Dk: 96, Dv: 6 }, "float32", "float32", false, true, 128],
  ];
  for (const [name, d, qkvDtype, gateDtype, withState, withMask, chunkSize] of cases) {
    test(`${name}: equals the exact update up to float32 rounding`, () => {
      const rng = rngFor(`chunked ${name}`);
      const p = makeProblem(rng, d, qkvDtype, gateDtype, withState, withMask);
      const x = arraysOf(p);
      const args = [x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, x.state ?? null, x.mask ?? null] as const;
      const exactOut = gatedDeltaUpdate(...args);
      const chunked = gatedDeltaUpdateChunked(...args, chunkSize);
      try {
        expect(chunked.y.shape).toEqual([d.B, d.T, d.Hv, d.Dv]);
        expect(chunked.y.dtype).toBe(qkvDtype);
        expect(chunked.state.shape).toEqual([d.B, d.Hv, d.Dv, d.Dk]);
        expect(chunked.state.dtype).toBe("float32");
        const stateRef = read(exactOut.state);
        const yRef = read(exactOut.y);
        const yActual = read(chunked.y);
        const stateBound = 2e-5 * maxAbs(stateRef);
        const cs = assertClose(`${name}: chunked state`, read(chunked.state), stateRef, () => stateBound);
        const ySlack = 2e-5 * maxAbs(yRef);
        const cy = assertClose(
          `${name}: chunked y`,
          yActual,
          yRef,
          (e, i) => Math.max(ulpOf(e, qkvDtype), ulpOf(yActual[i]!, qkvDtype)) + ySlack,
        );
        report(`chunked ${name}`, {
          stateMaxAbsErr: cs.maxAbsError,
          stateMaxAbs: maxAbs(stateRef),
          yMaxAbsErr: cy.maxAbsError,
          yMaxAbs: maxAbs(yRef),
        });
        if (p.mask) {
          // Masked tokens write exactly 0, as in the exact update.
          const per = d.Hv * d.Dv;
          for (let bt = 0; bt < d.B * d.T; bt++) {
            if (p.mask[bt]) continue;
            for (let i = 0; i < per; i++) expect(yActual[bt * per + i]).toBe(0);
          }
        }
      } finally {
        disposeAll(exactOut.y, exactOut.state, chunked.y, chunked.state, x);
      }
    });
  }

  test("chunkSize 0 is the default 32, bit for bit; a split at a chunk multiple gives one call's bits", () => {
    const rng = rngFor("chunked default and split");
    const d: RecurrenceDims = { B: 2, T: 64, Hk: 1, Hv: 2, Dk: 32, Dv: 4 };
    const p = makeProblem(rng, d, "bfloat16", "float32", true, false);
    const x = arraysOf(p);
    const byDefault = gatedDeltaUpdateChunked(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, x.state!);
    const explicit = gatedDeltaUpdateChunked(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, x.state!, null, 32);
    const outputs = [byDefault, explicit];
    try {
      assertBitwiseEqual("chunkSize 0 vs 32: state", byDefault.state.toFloat32Array(), explicit.state.toFloat32Array());
      assertBitwiseEqual("chunkSize 0 vs 32: y", byDefault.y.toFloat32Array(), explicit.y.toFloat32Array());

      // The same prefill as two calls of 32 tokens, the first's state passed to the second.
      const { B, T, Hk, Hv, Dk, Dv } = d;
      const half = T / 2;
      const part = (values: Float64Array, inner: number, from: number) => {
        const out = new Float64Array(B * half * inner);
        for (let b = 0; b < B; b++) {
          out.set(values.subarray((b * T + from) * inner, (b * T + from + half) * inner), b * half * inner);
        }
        return out;
      };
      let state: MlxArray = x.state!;
      const ys: Float32Array[] = [];
      for (const from of [0, half]) {
        using q = floatArray(part(p.q, Hk * Dk, from), [B, half, Hk, Dk], "bfloat16");
        using k = floatArray(part(p.k, Hk * Dk, from), [B, half, Hk, Dk], "bfloat16");
        using v = floatArray(part(p.v, Hv * Dv, from), [B, half, Hv, Dv], "bfloat16");
        using a = floatArray(part(p.a, Hv, from), [B, half, Hv], "float32");
        using b = floatArray(part(p.b, Hv, from), [B, half, Hv], "float32");
        const step = gatedDeltaUpdateChunked(q, k, v, a, b, x.aLog!, x.dtBias!, state, null, 32);
        outputs.push(step);
        state = step.state;
        ys.push(step.y.toFloat32Array());
      }
      assertBitwiseEqual("split prefill state", state.toFloat32Array(), byDefault.state.toFloat32Array());
      const per = Hv * Dv;
      const stitched = new Float32Array(B * T * per);
      for (let i = 0; i < 2; i++) {
        for (let b = 0; b < B; b++) {
          stitched.set(ys[i]!.subarray(b * half * per, (b + 1) * half * per), (b * T + i * half) * per);
        }
      }
      assertBitwiseEqual("split prefill y", stitched, byDefault.y.toFloat32Array());
    } finally {
      for (const o of outputs) disposeAll(o.y, o.state);
      disposeAll(x);
    }
  });

  test("a bad chunkSize throws InvalidArgumentError naming chunk_size", () => {
    const rng = rngFor("chunked bad chunk");
    const d: RecurrenceDims = { B: 1, T: 3, Hk: 1, Hv: 1, Dk: 32, Dv: 2 };
    const x = arraysOf(makeProblem(rng, d, "float32", "float32", false, false));
    try {
      for (const chunkSize of [8, -16, 24, 144, 256]) {
        let caught: unknown;
        try {
          const out = gatedDeltaUpdateChunked(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, null, null, chunkSize);
          disposeAll(out.y, out.state);
        } catch (e) {
          caught = e;
        }
        expect(caught).toBeInstanceOf(InvalidArgumentError);
        const e = caught as InvalidArgumentError;
        expect(e.statusName).toBe("MLXK_ERR_INVALID_ARGUMENT");
        expect(e.message).toContain("mlxk_gated_delta_update_chunked");
        expect(e.message).toContain(`chunk_size is ${chunkSize}`);
      }
      // Not an int32: refused before the call.
      expect(() => gatedDeltaUpdateChunked(x.q!, x.k!, x.v!, x.a!, x.b!, x.aLog!, x.dtBias!, null, null, 16.5)).toThrow(RangeError);
    } finally {
      disposeAll(x);
    }
  });
});

describe("gatedDeltaUpdateFromConv", () => {
  test("gives the bits of siluRmsHeads then gatedDeltaUpdate", () => {
    const rng = rngFor("gatedDeltaUpdateFromConv");
    const [B, T, HK, HV, DK, DV] = [2, 3, 2, 4, 64, 12];
    const C = 2 * HK * DK + HV * DV;
    const values = (n: number, scale: number) => Array.from({ length: n }, () => scale * rng.normal());
    const x = floatArray(values(B * T * C, 3), [B, T, C], "bfloat16");
    const qScale = floatArray(Array.from({ length: DK }, () => rng.uniform(0.5, 1.5) / DK), [DK], "bfloat16");
    const kScale = floatArray(Array.from({ length: DK }, () => rng.uniform(0.5, 1.5) / Math.sqrt(DK)), [DK], "bfloat16");
    const a = floatArray(values(B * T * HV, 1), [B, T, HV], "bfloat16");
    const b = floatArray(values(B * T * HV, 1), [B, T, HV], "bfloat16");
    const aLog = floatArray(Array.from({ length: HV }, () => rng.uniform(-2.3, 1.1)), [HV], "float32");
    const dtBias = floatArray(values(HV, 0.5), [HV], "bfloat16");
    const state = floatArray(values(B * HV * DV * DK, 0.3), [B, HV, DV, DK], "float32");
    const mask = MlxArray.fromBool([true, false, true, true, true, false], [B, T]);
    const eps = 1e-6 / DK;
    const fused = gatedDeltaUpdateFromConv(x, qScale, kScale, HK, HV, DV, eps, a, b, aLog, dtBias, state, mask);
    const split = siluRmsHeads(x, qScale, kScale, HK, HV, DV, eps);
    const composed = gatedDeltaUpdate(split.q, split.k, split.v, a, b, aLog, dtBias, state, mask);
    const y = fused.y.toFloat32Array();
    assertBitwiseEqual("y", y, composed.y.toFloat32Array());
    assertBitwiseEqual("state", fused.state.toFloat32Array(), composed.state.toFloat32Array());
    expect(y.some((v) => v !== 0)).toBe(true);
    expect(() => gatedDeltaUpdateFromConv(x, qScale, kScale, HK, 3, DV, eps, a, b, aLog, dtBias)).toThrow(
      /mlxk_gated_delta_update_from_conv/,
    );
    disposeAll(x, qScale, kScale, a, b, aLog, dtBias, state, mask, fused, split, composed);
  });
});
