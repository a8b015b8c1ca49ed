// The backward passes (gatedDeltaUpdateVjp, gatedDeltaUpdateChunkedVjp, siluRmsHeadsVjp,
// gatedRmsNormVjp) against central
// differences of the float64 forwards in reference.ts: for each input, the gradient along a
// random direction u, sum(grad * u), equals d/dt L(input + t·u) at t = 0, where L is
// sum(cotangent * output). The references round nowhere; the library computes in float32
// (float64 sums) and rounds each gradient once to its input's dtype.
//
// Tolerance: |sum(grad·u) − dL/dt| <= rtol · sum(|grad·u|) + 1e-6. Each gradient element is
// within its dtype's rounding (bfloat16: 2^-8 of itself) plus the float32 arithmetic of its
// formula; the update's backward adds up T·Dk float32 products, its tests' bound is 1e-3 of
// the magnitude. rtol: float32 head split and gated norm 1e-4, the update 2e-3; bfloat16
// 2^-8 + 1e-4. The central difference (h = 1e-5 on float64 losses of size ~10) is far more
// accurate than that.

import { afterEach, describe, expect, test } from "bun:test";
import {
  DtypeError,
  gatedDeltaUpdateChunkedVjp,
  gatedDeltaUpdateVjp,
  gatedRmsNorm,
  gatedRmsNormVjp,
  liveArrayCount,
  MlxArray,
  ShapeError,
  siluRmsHeadsVjp,
} from "../src/index";
import { disposeAll, floatArray, quantize, read, report, rngFor, SEED, type FloatDtype } from "./helpers";
import { computeGRef, gatedRmsNormRef, headSplitRef, recurrenceRef, sigmoid } from "./reference";

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

const H = 1e-5;

/** sum(a * b). */
function dot(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i]! * b[i]!;
  return s;
}

/**
 * Checks the gradient `grad` of input `index` of `loss` (a float64 function of all inputs)
 * along a random direction; returns the relative error for the report.
 */
function checkDirection(
  label: string,
  inputs: Float64Array[],
  index: number,
  grad: ArrayLike<number>,
  loss: (inputs: Float64Array[]) => number,
  rtol: number,
  rng: { normal(): number },
): number {
  const u = Float64Array.from({ length: grad.length }, () => rng.normal());
  const moved = (t: number) => {
    const copy = inputs.map((a) => a.slice());
    for (let i = 0; i < u.length; i++) copy[index]![i]! += t * u[i]!;
    return loss(copy);
  };
  const numeric = (moved(H) - moved(-H)) / (2 * H);
  const along = dot(grad, u);
  let scale = 0;
  for (let i = 0; i < u.length; i++) scale += Math.abs(grad[i]! * u[i]!);
  const err = Math.abs(along - numeric);
  if (!(err <= rtol * scale + 1e-6)) {
    throw new Error(`${label}: sum(grad·u) = ${along}, central difference ${numeric} (error ${err}, scale ${scale}; seed ${SEED})`);
  }
  expect(scale).toBeGreaterThan(0);
  return err / scale;
}

describe("gatedRmsNormVjp", () => {
  const cases: Array<[FloatDtype, FloatDtype, number[]]> = [
    ["float32", "float32", [3, 64]],
    ["float32", "bfloat16", [2, 2, 33]],
    ["bfloat16", "float32", [4, 128]],
    ["bfloat16", "bfloat16", [2, 1000]],
  ];
  for (const [dtype, gateDtype, shape] of cases) {
    test(`${dtype} x, ${gateDtype} gate, shape [${shape.join(", ")}]`, () => {
      const rng = rngFor(`norm vjp ${dtype} ${gateDtype} ${shape.join("x")}`);
      const n = shape.reduce((p, d) => p * d, 1);
      const D = shape.at(-1)!;
      const x = quantize(rng.normals(n, 2), dtype);
      const gate = quantize(rng.normals(n, 3), gateDtype);
      const weight = quantize(rng.uniforms(D, 0.5, 1.5), dtype);
      const dout = quantize(rng.normals(n), dtype);
      const eps = 1e-6;
      using xA = floatArray(x, shape, dtype);
      using gA = floatArray(gate, shape, gateDtype);
      using wA = floatArray(weight, [D], dtype);
      using dA = floatArray(dout, shape, dtype);
      const g = gatedRmsNormVjp(xA, gA, wA, eps, dA);
      try {
        expect(g.dx.shape).toEqual(shape);
        expect(g.dx.dtype).toBe(dtype);
        expect(g.dgate.dtype).toBe(gateDtype);
        expect(g.dweight.shape).toEqual([D]);
        const loss = ([xs, zs, ws]: Float64Array[]) => dot(dout, gatedRmsNormRef(xs!, zs!, ws!, Math.fround(eps)));
        const inputs = [x, gate, weight];
        const stats: Record<string, number> = {};
        for (const [i, name, arr, t] of [
          [0, "dx", g.dx, dtype],
          [1, "dgate", g.dgate, gateDtype],
          [2, "dweight", g.dweight, dtype],
        ] as const) {
          const rtol = t === "bfloat16" ? 2 ** -8 + 1e-4 : 1e-4;
          stats[name] = checkDirection(`${name} (${t})`, inputs, i, read(arr), loss, rtol, rng);
        }
        report(`gatedRmsNormVjp ${dtype}/${gateDtype} [${shape}]`, stats);
      } finally {
        disposeAll(g);
      }
    });
  }

  test("no dout: zero gradients; a dout of another shape or dtype is refused", () => {
    const rng = rngFor("norm vjp none");
    using x = floatArray(rng.normals(12), [3, 4], "float32");
    using w = floatArray(rng.uniforms(4, 0.5, 1.5), [4], "float32");
    const g = gatedRmsNormVjp(x, x, w, 1e-6);
    try {
      for (const a of [g.dx, g.dgate, g.dweight]) expect(Array.from(read(a)).every((v) => v === 0)).toBe(true);
    } finally {
      disposeAll(g);
    }
    using out = gatedRmsNorm(x, x, w, 1e-6);
    using wrong = floatArray(rng.normals(4), [4], "float32");
    expect(() => gatedRmsNormVjp(x, x, w, 1e-6, wrong)).toThrow(ShapeError);
    using ints = MlxArray.fromInt32(new Int32Array(12), [3, 4]);
    expect(() => gatedRmsNormVjp(x, x, w, 1e-6, ints)).toThrow(DtypeError);
    const withOut = gatedRmsNormVjp(x, x, w, 1e-6, out);
    disposeAll(withOut);
  });
});

describe("siluRmsHeadsVjp", () => {
  const cases: Array<[FloatDtype, number, number, number, number, number, number]> = [
    // dtype, B, S, Hk, Hv, Dk, Dv
    ["float32", 2, 2, 2, 4, 32, 16],
    ["float32", 1, 3, 1, 3, 7, 33],
    ["bfloat16", 1, 2, 2, 2, 128, 128],
  ];
  for (const [dtype, B, S, Hk, Hv, Dk, Dv] of cases) {
    test(`${dtype} B=${B} S=${S} Hk=${Hk} Hv=${Hv} Dk=${Dk} Dv=${Dv}`, () => {
      const rng = rngFor(`heads vjp ${dtype} ${Dk} ${Dv}`);
      const C = 2 * Hk * Dk + Hv * Dv;
      const rows = B * S;
      const x = quantize(rng.normals(rows * C, 2), dtype);
      const qScale = quantize(rng.uniforms(Dk, 0.5, 1.5), dtype);
      const kScale = quantize(rng.uniforms(Dk, 0.5, 1.5), dtype);
      const dq = quantize(rng.normals(rows * Hk * Dk), dtype);
      const dk = quantize(rng.normals(rows * Hk * Dk), dtype);
      const dv = quantize(rng.normals(rows * Hv * Dv), dtype);
      const eps = 1e-6 / Dk;
      using xA = floatArray(x, [B, S, C], dtype);
      using qs = floatArray(qScale, [Dk], dtype);
      using ks = floatArray(kScale, [Dk], dtype);
      using dqA = floatArray(dq, [B, S, Hk, Dk], dtype);
      using dkA = floatArray(dk, [B, S, Hk, Dk], dtype);
      using dvA = floatArray(dv, [B, S, Hv, Dv], dtype);
      const g = siluRmsHeadsVjp(xA, qs, ks, Hk, Hv, Dv, eps, dqA, dkA, dvA);
      try {
        expect(g.dx.shape).toEqual([B, S, C]);
        expect(g.dqScale.shape).toEqual([Dk]);
        for (const a of [g.dx, g.dqScale, g.dkScale]) expect(a.dtype).toBe(dtype);
        const loss = ([xs, qss, kss]: Float64Array[]) => {
          const out = headSplitRef(xs!, rows, Hk, Hv, Dk, Dv, qss!, kss!, Math.fround(eps));
          return dot(dq, out.q) + dot(dk, out.k) + dot(dv, out.v);
        };
        const rtol = dtype === "bfloat16" ? 2 ** -8 + 1e-4 : 1e-4;
        const stats: Record<string, number> = {};
        for (const [i, name, arr] of [
          [0, "dx", g.dx],
          [1, "dqScale", g.dqScale],
          [2, "dkScale", g.dkScale],
        ] as const) {
          stats[name] = checkDirection(`${name} (${dtype})`, [x, qScale, kScale], i, read(arr), loss, rtol, rng);
        }
        report(`siluRmsHeadsVjp ${dtype} Dk=${Dk} Dv=${Dv}`, stats);
      } finally {
        disposeAll(g);
      }
    });
  }

  test("absent cotangents are zeros", () => {
    const rng = rngFor("heads vjp none");
    using x = floatArray(rng.normals(2 * 14), [1, 2, 14], "float32");
    using sc = floatArray(rng.uniforms(4, 0.5, 1.5), [4], "float32");
    using dv = floatArray(rng.normals(2 * 6), [1, 2, 2, 3], "float32");
    const g = siluRmsHeadsVjp(x, sc, sc, 1, 2, 3, 1e-6, null, null, dv);
    try {
      const dx = read(g.dx);
      // Only the v channels (8..13 of each row) get gradients; the scales none.
      for (let r = 0; r < 2; r++) {
        for (let c = 0; c < 8; c++) expect(dx[r * 14 + c]).toBe(0);
        expect(Array.from(dx.subarray(r * 14 + 8, r * 14 + 14)).some((v) => v !== 0)).toBe(true);
      }
      expect(Array.from(read(g.dqScale)).every((v) => v === 0)).toBe(true);
    } finally {
      disposeAll(g);
    }
    expect(() => siluRmsHeadsVjp(x, sc, sc, 1, 2, 3, 1e-6, dv)).toThrow(ShapeError);
  });
});

describe("gatedDeltaUpdateVjp and gatedDeltaUpdateChunkedVjp", () => {
  // The exact backward on a short window; the chunked one over three chunks of 16 and a partial
  // fourth, with and without a start state.
  const cases: Array<[string, number, number, boolean]> = [
    ["exact", 5, 0, true],
    ["chunked", 53, 16, true],
    ["chunked", 40, 32, false],
  ];
  for (const [form, T, chunk, withState] of cases) {
    test(`${form}: float32, GQA, T = ${T}${chunk ? `, chunk ${chunk}` : ""}, ${withState ? "with" : "no"} state, both cotangents`, () => {
      const rng = rngFor(`update vjp ${form} ${T} ${chunk}`);
      const [B, Hk, Hv, Dk, Dv] = [1, 1, 2, 32, 3];
      const d = { B, T, Hk, Hv, Dk, Dv };
      const f = (n: number, scale: number) => quantize(rng.normals(n, scale), "float32");
      const inputs = [
        f(B * T * Hk * Dk, 0.2), // q
        f(B * T * Hk * Dk, 0.2), // k
        f(B * T * Hv * Dv, 1), // v
        f(B * T * Hv, 1), // a
        f(B * T * Hv, 1), // b
        f(Hv, 0.5), // aLog
        f(Hv, 0.5), // dtBias
        withState ? f(B * Hv * Dv * Dk, 0.5) : new Float64Array(B * Hv * Dv * Dk), // state
      ];
      const dy = f(B * T * Hv * Dv, 1);
      const dState = f(B * Hv * Dv * Dk, 0.5);
      const shapes = [[B, T, Hk, Dk], [B, T, Hk, Dk], [B, T, Hv, Dv], [B, T, Hv], [B, T, Hv], [Hv], [Hv], [B, Hv, Dv, Dk]];
      const arrays = inputs.map((v, i) => floatArray(v, shapes[i]!, "float32"));
      const dyA = floatArray(dy, [B, T, Hv, Dv], "float32");
      const dsA = floatArray(dState, [B, Hv, Dv, Dk], "float32");
      const [q, k, v, a, b, aLog, dtBias, state] = arrays as [MlxArray, MlxArray, MlxArray, MlxArray, MlxArray, MlxArray, MlxArray, MlxArray];
      const start = withState ? state : null;
      const g = form === "exact"
        ? gatedDeltaUpdateVjp(q, k, v, a, b, aLog, dtBias, start, null, dyA, dsA)
        : gatedDeltaUpdateChunkedVjp(q, k, v, a, b, aLog, dtBias, start, null, chunk, dyA, dsA);
      try {
        const grads = [g.dq, g.dk, g.dv, g.da, g.db, g.daLog, g.dDtBias, g.dState];
        grads.forEach((arr, i) => expect(arr.shape).toEqual(shapes[i]!));
        const loss = ([qs, ks, vs, as, bs, als, dts, s0]: Float64Array[]) => {
          const gate = computeGRef(als!, as!, dts!);
          const beta = Float64Array.from(bs!, sigmoid);
          const out = recurrenceRef(d, qs!, ks!, vs!, gate, beta, s0!);
          return dot(dy, out.y) + dot(dState, out.state);
        };
        const names = ["dq", "dk", "dv", "da", "db", "daLog", "dDtBias", "dState"];
        const stats: Record<string, number> = {};
        grads.forEach((arr, i) => {
          stats[names[i]!] = checkDirection(names[i]!, inputs, i, read(arr), loss, 2e-3, rng);
        });
        report(`gatedDeltaUpdate${form === "exact" ? "" : "Chunked"}Vjp float32 T=${T}`, stats);
      } finally {
        disposeAll(g, ...arrays, dyA, dsA);
      }
    });
  }

  test("chunked: a chunk size that is not 0 or a multiple of 16 in [16, 128] is refused by name", () => {
    const rng = rngFor("update vjp chunk size");
    const [T, Hk, Hv, Dk, Dv] = [4, 1, 1, 32, 2];
    using q = floatArray(rng.normals(T * Hk * Dk, 0.2), [1, T, Hk, Dk], "float32");
    using k = floatArray(rng.normals(T * Hk * Dk, 0.2), [1, T, Hk, Dk], "float32");
    using v = floatArray(rng.normals(T * Hv * Dv), [1, T, Hv, Dv], "float32");
    using a = floatArray(rng.normals(T * Hv), [1, T, Hv], "float32");
    using b = floatArray(rng.normals(T * Hv), [1, T, Hv], "float32");
    using aLog = floatArray(rng.normals(Hv, 0.5), [Hv], "float32");
    using dtBias = floatArray(rng.normals(Hv, 0.5), [Hv], "float32");
    for (const bad of [8, 24, 144, -16]) {
      let message = "";
      try {
        gatedDeltaUpdateChunkedVjp(q, k, v, a, b, aLog, dtBias, null, null, bad);
      } catch (e) {
        message = String((e as Error).message);
      }
      expect(message).toContain("chunk_size");
      expect(message).toContain(String(bad));
    }
  });
});
