// The head split (SiLU, per-head RMS norm, scale) and the gated RMSNorm against float64.
//
// Tolerances are relative error bounds (plus a tiny absolute term for values near 0) derived
// from the rounding points in the header's formulas; the references round nowhere:
// - float32: every rounding is float32 (u = 2^-24) and MLX's float32 exp errs by up to
//   ~2e-7·(1+|x|), so rtol 2e-5 covers sigmoid, the mean of squares and rsqrt with a margin.
// - bfloat16 (8 significant bits: one rounding moves a value by at most 2^-8 of itself):
//   head split q, k: sigmoid (e = bf16(exp|x|) and the bf16 result: 2 roundings) and
//   silu = bf16(x·sigmoid) (1) put up to 3·2^-8 on each activation, hence up to 3·2^-8 on
//   rsqrt(mean(silu²)); then bf16(silu·inv) (1) and bf16(scale·n) (1): 8·2^-8 in all.
//   v is the activation only: 3·2^-8.
//   gated norm: bf16(x·inv), bf16(w·n) and the bf16 output: 3·2^-8 (the gate's SiLU is float32).
// k roundings compound to (1 + 2^-8)^k - 1 (slightly above k·2^-8), plus 1e-5 for the float32
// work in between. Measured maxima over 25 seeds: q, k 0.013 (bound 0.032), v 0.0072 (0.012),
// gated norm 0.0098 (0.012). The tests also require the median relative error to stay below 2·2^-8 for
// bfloat16 (measured ~0.002) and 2e-6 for float32 (measured ~6e-8), which a systematic bias
// (a wrong scale, eps or gate) fails even where the worst-case bound would not.

import { afterEach, describe, expect, test } from "bun:test";
import { gatedRmsNorm, liveArrayCount, siluRmsHeads } from "../src/index";
import { assertClose, disposeAll, floatArray, quantize, read, report, rngFor, type FloatDtype } from "./helpers";
import { gatedRmsNormRef, headSplitRef } from "./reference";

const BF16 = 2 ** -8;

/** The relative error bound of k bf16 roundings plus the float32 work between them. */
function bf16Bound(k: number): number {
  return (1 + BF16) ** k - 1 + 1e-5;
}

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

function rel(rtol: number, atol = 1e-7): (e: number) => number {
  return (e) => rtol * Math.abs(e) + atol;
}

function medianRelError(actual: ArrayLike<number>, expected: ArrayLike<number>): number {
  const errs: number[] = [];
  for (let i = 0; i < expected.length; i++) {
    if (Math.abs(expected[i]!) > 1e-3) errs.push(Math.abs(actual[i]! - expected[i]!) / Math.abs(expected[i]!));
  }
  errs.sort((x, y) => x - y);
  return errs[Math.floor(errs.length / 2)] ?? 0;
}

describe("siluRmsHeads", () => {
  const cases: Array<[FloatDtype, number, number, number, number, number, number]> = [
    // dtype, B, S, Hk, Hv, Dk, Dv
    ["bfloat16", 2, 3, 2, 4, 64, 48],
    ["bfloat16", 1, 2, 1, 3, 128, 128],
    ["bfloat16", 1, 2, 3, 1, 5, 7], // widths that leave SIMD lanes partly empty
    ["float32", 2, 2, 2, 2, 96, 16],
  ];
  for (const [dtype, B, S, Hk, Hv, Dk, Dv] of cases) {
    test(`${dtype} B=${B} S=${S} Hk=${Hk} Hv=${Hv} Dk=${Dk} Dv=${Dv}`, () => {
      const rng = rngFor(`heads ${dtype} ${Dk} ${Dv}`);
      const C = 2 * Hk * Dk + Hv * Dv;
      const x = quantize(rng.normals(B * S * C, 2), dtype);
      // mlx-lm's scales are Dk^-1 (q) and Dk^-1/2 (k); vary them per element to see each used.
      const qScale = quantize(Float64Array.from({ length: Dk }, () => rng.uniform(0.5, 1.5) / Dk), dtype);
      const kScale = quantize(Float64Array.from({ length: Dk }, () => rng.uniform(0.5, 1.5) / Math.sqrt(Dk)), dtype);
      const eps = 1e-6 / Dk;
      using xA = floatArray(x, [B, S, C], dtype);
      using qs = floatArray(qScale, [Dk], dtype);
      using ks = floatArray(kScale, [Dk], dtype);
      const out = siluRmsHeads(xA, qs, ks, Hk, Hv, Dv, eps);
      try {
        expect(out.q.shape).toEqual([B, S, Hk, Dk]);
        expect(out.k.shape).toEqual([B, S, Hk, Dk]);
        expect(out.v.shape).toEqual([B, S, Hv, Dv]);
        for (const a of [out.q, out.k, out.v]) expect(a.dtype).toBe(dtype);
        const ref = headSplitRef(x, B * S, Hk, Hv, Dk, Dv, qScale, kScale, Math.fround(eps));
        const bf = dtype === "bfloat16";
        const stats: Record<string, number> = {};
        for (const [name, arr, refArr, rtol] of [
          ["q", out.q, ref.q, bf ? bf16Bound(8) : 2e-5],
          ["k", out.k, ref.k, bf ? bf16Bound(8) : 2e-5],
          ["v", out.v, ref.v, bf ? bf16Bound(3) : 2e-5],
        ] as const) {
          const actual = read(arr);
          const c = assertClose(`${name} (${dtype})`, actual, refArr, rel(rtol));
          const median = medianRelError(actual, refArr);
          expect(median).toBeLessThan(bf ? 2 * BF16 : 2e-6);
          stats[`${name}MaxRel`] = c.maxRelError;
          stats[`${name}MedianRel`] = median;
        }
        report(`siluRmsHeads ${dtype} Dk=${Dk} Dv=${Dv}`, stats);
      } finally {
        disposeAll(out);
      }
    });
  }
});

describe("gatedRmsNorm", () => {
  const cases: Array<[FloatDtype, FloatDtype, number[]]> = [
    // x dtype, gate dtype, shape (last axis normalized)
    ["bfloat16", "float32", [2, 3, 100]],
    ["bfloat16", "bfloat16", [3, 1000]], // 256 threads: the second butterfly
    ["bfloat16", "bfloat16", [4, 1]],
    ["float32", "float32", [2, 5, 300]],
    ["float32", "bfloat16", [7, 64]],
  ];
  for (const [dtype, gateDtype, shape] of cases) {
    test(`${dtype} x, ${gateDtype} gate, shape [${shape.join(", ")}]`, () => {
      const rng = rngFor(`norm ${dtype} ${gateDtype} ${shape.join("x")}`);
      const n = shape.reduce((p, d) => p * d, 1);
      const D = shape.at(-1)!;
      const x = quantize(rng.normals(n), dtype);
      const gate = quantize(rng.normals(n, 2), gateDtype);
      const weight = quantize(rng.uniforms(D, 0.5, 1.5), dtype);
      const eps = 1e-6;
      using xA = floatArray(x, shape, dtype);
      using gA = floatArray(gate, shape, gateDtype);
      using wA = floatArray(weight, [D], dtype);
      using out = gatedRmsNorm(xA, gA, wA, eps);
      expect(out.shape).toEqual(shape);
      expect(out.dtype).toBe(dtype);
      const ref = gatedRmsNormRef(x, gate, weight, Math.fround(eps));
      const actual = read(out);
      const bf = dtype === "bfloat16";
      const c = assertClose(`gated norm (${dtype})`, actual, ref, rel(bf ? bf16Bound(3) : 2e-5));
      const median = medianRelError(actual, ref);
      expect(median).toBeLessThan(bf ? 2 * BF16 : 2e-6);
      report(`gatedRmsNorm ${dtype}/${gateDtype} [${shape}]`, { maxRel: c.maxRelError, medianRel: median });
    });
  }
});
