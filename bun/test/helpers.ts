// Test helpers: a seeded random source (fresh seed each run unless MLXK_TEST_SEED is set; the
// seed is in every failure message), input makers and tolerance checks that report the worst
// element.

import { MlxArray, roundToBfloat16, toBfloat16Bits, type Dtype } from "../src/index";

export const SEED = process.env.MLXK_TEST_SEED !== undefined
  ? Number(process.env.MLXK_TEST_SEED) >>> 0
  : (Math.random() * 2 ** 32) >>> 0;

/** A small deterministic generator (mulberry32) with uniform and normal draws. */
export class Rng {
  #state: number;
  constructor(seed: number) {
    this.#state = seed >>> 0;
  }
  /** Uniform in [0, 1). */
  next(): number {
    let t = (this.#state = (this.#state + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  uniform(lo: number, hi: number): number {
    return lo + (hi - lo) * this.next();
  }
  normal(): number {
    const u = 1 - this.next();
    const v = this.next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  }
  normals(n: number, scale = 1): Float64Array {
    return Float64Array.from({ length: n }, () => this.normal() * scale);
  }
  uniforms(n: number, lo: number, hi: number): Float64Array {
    return Float64Array.from({ length: n }, () => this.uniform(lo, hi));
  }
}

/** A fresh generator per test, derived from the run's seed and a label. */
export function rngFor(label: string): Rng {
  let h = SEED ^ 0x9e3779b9;
  for (let i = 0; i < label.length; i++) h = Math.imul(h ^ label.charCodeAt(i), 0x01000193) >>> 0;
  return new Rng(h);
}

export type FloatDtype = "float32" | "bfloat16";

/** Values as the library will hold them in `dtype` (float32 or bfloat16 rounding). */
export function quantize(values: ArrayLike<number>, dtype: FloatDtype): Float64Array {
  const round = dtype === "bfloat16" ? roundToBfloat16 : Math.fround;
  return Float64Array.from(values as ArrayLike<number>, (x) => round(x));
}

/** An array of `dtype` holding `values` (already representable: see quantize). */
export function floatArray(values: ArrayLike<number>, shape: number[], dtype: FloatDtype): MlxArray {
  if (dtype === "bfloat16") return MlxArray.fromBits(toBfloat16Bits(values), shape, "bfloat16");
  return MlxArray.fromFloat32(Float32Array.from(values as ArrayLike<number>), shape);
}

/** Reads a float array as float64 values. */
export function read(a: MlxArray): Float64Array {
  return Float64Array.from(a.toFloat32Array());
}

export function maxAbs(values: ArrayLike<number>): number {
  let m = 0;
  for (let i = 0; i < values.length; i++) m = Math.max(m, Math.abs(values[i]!));
  return m;
}

export interface Comparison {
  /** Largest |actual - expected| / tolerance(i) (<= 1 passes). */
  worstRatio: number;
  worstIndex: number;
  maxAbsError: number;
  maxRelError: number;
}

/**
 * Checks |actual[i] - expected[i]| <= tolerance(i, expected[i]) for every element and throws a
 * message naming the worst element, the label and the seed otherwise. Returns the statistics
 * (the tests print them).
 */
export function assertClose(
  label: string,
  actual: ArrayLike<number>,
  expected: ArrayLike<number>,
  tolerance: (expected: number, i: number) => number,
): Comparison {
  if (actual.length !== expected.length) {
    throw new Error(`${label}: ${actual.length} elements, expected ${expected.length} (seed ${SEED})`);
  }
  let worstRatio = 0;
  let worstIndex = -1;
  let maxAbsError = 0;
  let maxRelError = 0;
  for (let i = 0; i < expected.length; i++) {
    const a = actual[i]!;
    const e = expected[i]!;
    const err = Math.abs(a - e);
    if (!Number.isFinite(a) || Number.isNaN(err)) {
      throw new Error(`${label}: element ${i} is ${a}, expected ${e} (seed ${SEED})`);
    }
    const tol = tolerance(e, i);
    const ratio = tol > 0 ? err / tol : err > 0 ? Infinity : 0;
    if (ratio > worstRatio) {
      worstRatio = ratio;
      worstIndex = i;
    }
    maxAbsError = Math.max(maxAbsError, err);
    if (e !== 0) maxRelError = Math.max(maxRelError, err / Math.abs(e));
  }
  if (worstRatio > 1) {
    const i = worstIndex;
    throw new Error(
      `${label}: element ${i} is ${actual[i]}, expected ${expected[i]} ` +
        `(error ${Math.abs(actual[i]! - expected[i]!)}, tolerance ${tolerance(expected[i]!, i)}; seed ${SEED}, ` +
        "rerun with MLXK_TEST_SEED to reproduce)",
    );
  }
  return { worstRatio, worstIndex, maxAbsError, maxRelError };
}

/** Bitwise equality of two float arrays (NaN payloads included), with the first difference. */
export function assertBitwiseEqual(label: string, actual: Float32Array, expected: Float32Array): void {
  const a = new Uint32Array(actual.buffer, actual.byteOffset, actual.length);
  const e = new Uint32Array(expected.buffer, expected.byteOffset, expected.length);
  if (a.length !== e.length) throw new Error(`${label}: ${a.length} elements, expected ${e.length}`);
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== e[i]) {
      throw new Error(`${label}: element ${i} differs: ${actual[i]} vs ${expected[i]} (seed ${SEED})`);
    }
  }
}

/** Disposes every array given, and every MlxArray property of the objects given. */
export function disposeAll(...items: Array<MlxArray | object | null | undefined>): void {
  for (const item of items) {
    if (item == null) continue;
    if (item instanceof MlxArray) item.dispose();
    else for (const a of Object.values(item)) if (a instanceof MlxArray) a.dispose();
  }
}

/** Set STATS=1 to print the measured errors of every numeric check. */
export function report(label: string, c: Comparison | Record<string, number | string>): void {
  if (process.env.STATS) console.log(`[stats] ${label}: ${JSON.stringify(c)}`);
}

export type { Dtype };
