// Float64 references for the kernels, written from the formulas in include/mlxkern.h and
// docs/DESIGN.md §4 (not from the library's code). Inputs are the exact values the library holds (bf16
// or f32 values, as float64). Where the library rounds an intermediate to the input dtype, the
// reference can round at the same point (`round`), or not (`exact`), as each test chooses.

import { roundToBfloat16 } from "../src/index";

export type Rounding = (x: number) => number;
export const exact: Rounding = (x) => x;
export const bf16: Rounding = roundToBfloat16;

export function sigmoid(x: number): number {
  return x >= 0 ? 1 / (1 + Math.exp(-x)) : Math.exp(x) / (1 + Math.exp(x));
}

/** softplus(x) = log(1 + e^x) = logaddexp(x, 0), stable both ways. */
export function softplus(x: number): number {
  return x > 0 ? x + Math.log1p(Math.exp(-x)) : Math.log1p(Math.exp(x));
}

export function silu(x: number): number {
  return x * sigmoid(x);
}

/**
 * softplus(x) = logaddexp(x, 0) evaluated in a narrow dtype the way MLX's CPU evaluates
 * logaddexp(x, y) = max + log1p(exp(min - max)): each step's result is rounded to the dtype
 * (`round`), here with y = 0, so min - max = -|x| is exact.
 */
export function softplusIn(x: number, round: Rounding): number {
  const e = round(Math.exp(-Math.abs(x)));
  return round(Math.max(x, 0) + round(Math.log1p(e)));
}

/**
 * sigmoid in a narrow dtype with MLX's rounding points (docs/DESIGN.md §4): e = round(exp(|x|)),
 * y = 1 / (1 + e) in float32, round(x < 0 ? y : 1 - y).
 */
export function sigmoidIn(x: number, round: Rounding): number {
  if (round === exact) return sigmoid(x);
  const e = round(Math.exp(Math.abs(x)));
  const y = Math.fround(1 / Math.fround(1 + e));
  return round(x < 0 ? y : Math.fround(1 - y));
}

/**
 * compute_g: g = exp(-exp(aLog) * softplus(a + dtBias)), g [..., Hv] with a's layout.
 * `round` is applied where MLX keeps the inputs' dtype: to a + dtBias and inside softplus (for
 * bfloat16 a and dtBias they are bfloat16, see softplusIn); the product and the outer exp are
 * float32 there, float64 here.
 */
export function computeGRef(
  aLog: ArrayLike<number>,
  a: ArrayLike<number>,
  dtBias: ArrayLike<number>,
  round: Rounding = exact,
): Float64Array {
  const hv = aLog.length;
  const g = new Float64Array(a.length);
  for (let i = 0; i < a.length; i++) {
    const h = i % hv;
    const x = round(a[i]! + dtBias[h]!);
    const sp = round === exact ? softplus(x) : softplusIn(x, round);
    g[i] = Math.exp(-Math.exp(aLog[h]!) * sp);
  }
  return g;
}

export interface RecurrenceDims {
  B: number;
  T: number;
  Hk: number;
  Hv: number;
  Dk: number;
  Dv: number;
}

/**
 * The gated-delta recurrence in float64. Per batch row b, value head h (reading key head
 * h / (Hv/Hk)), value row dv and token t, with s = state[b, h, dv, :]:
 *   s *= g[b,t,h]; kv = sum(s*k); delta = (v[dv] - kv) * beta[b,t,h]; s += k*delta; y = sum(s*q)
 * A masked token (mask[b,t] = 0) leaves s alone and gives y = 0. `steps[b]` (optional) stops row
 * b after that many tokens (the prefix replay). Returns y [B,T,Hv,Dv] and state [B,Hv,Dv,Dk].
 */
export function recurrenceRef(
  d: RecurrenceDims,
  q: ArrayLike<number> | null,
  k: ArrayLike<number>,
  v: ArrayLike<number>,
  g: ArrayLike<number>,
  beta: ArrayLike<number>,
  state0: ArrayLike<number> | null,
  mask: ArrayLike<number> | null = null,
  steps: ArrayLike<number> | null = null,
): { y: Float64Array; state: Float64Array } {
  const { B, T, Hk, Hv, Dk, Dv } = d;
  const group = Hv / Hk;
  const y = new Float64Array(B * T * Hv * Dv);
  const state = new Float64Array(B * Hv * Dv * Dk);
  const s = new Float64Array(Dk);
  for (let b = 0; b < B; b++) {
    const keep = steps ? steps[b]! : T;
    for (let h = 0; h < Hv; h++) {
      const hk = Math.floor(h / group);
      for (let dv = 0; dv < Dv; dv++) {
        const at = ((b * Hv + h) * Dv + dv) * Dk;
        for (let i = 0; i < Dk; i++) s[i] = state0 ? state0[at + i]! : 0;
        for (let t = 0; t < keep; t++) {
          const yAt = ((b * T + t) * Hv + h) * Dv + dv;
          if (mask && !mask[b * T + t]) {
            y[yAt] = 0;
            continue;
          }
          const gate = (b * T + t) * Hv + h;
          const kAt = ((b * T + t) * Hk + hk) * Dk;
          let kv = 0;
          for (let i = 0; i < Dk; i++) {
            s[i]! *= g[gate]!;
            kv += s[i]! * k[kAt + i]!;
          }
          const delta = (v[((b * T + t) * Hv + h) * Dv + dv]! - kv) * beta[gate]!;
          let out = 0;
          for (let i = 0; i < Dk; i++) {
            s[i]! += k[kAt + i]! * delta;
            if (q) out += s[i]! * q[kAt + i]!;
          }
          y[yAt] = out;
        }
        state.set(s, at);
      }
    }
  }
  return { y, state };
}

/**
 * The head split in float64 (no intermediate rounding): x [rows, 2*Hk*Dk + Hv*Dv] ->
 * q, k [rows, Hk, Dk] = scale * silu * rsqrt(mean(silu^2) + eps) per head, v [rows, Hv, Dv] =
 * silu.
 */
export function headSplitRef(
  x: ArrayLike<number>,
  rows: number,
  Hk: number,
  Hv: number,
  Dk: number,
  Dv: number,
  qScale: ArrayLike<number>,
  kScale: ArrayLike<number>,
  eps: number,
): { q: Float64Array; k: Float64Array; v: Float64Array } {
  const C = 2 * Hk * Dk + Hv * Dv;
  const q = new Float64Array(rows * Hk * Dk);
  const k = new Float64Array(rows * Hk * Dk);
  const v = new Float64Array(rows * Hv * Dv);
  for (let r = 0; r < rows; r++) {
    for (let head = 0; head < 2 * Hk; head++) {
      const act = Array.from({ length: Dk }, (_, i) => silu(x[r * C + head * Dk + i]!));
      const inv = 1 / Math.sqrt(act.reduce((s, a) => s + a * a, 0) / Dk + eps);
      const [out, scale] = head < Hk ? [q, qScale] : [k, kScale];
      const at = (r * Hk + (head % Hk)) * Dk;
      for (let i = 0; i < Dk; i++) out[at + i] = scale[i]! * act[i]! * inv;
    }
    for (let h = 0; h < Hv; h++) {
      for (let i = 0; i < Dv; i++) v[(r * Hv + h) * Dv + i] = silu(x[r * C + 2 * Hk * Dk + h * Dv + i]!);
    }
  }
  return { q, k, v };
}

/** Gated RMSNorm in float64: out = silu(gate) * weight * x * rsqrt(mean(x^2) + eps) per row. */
export function gatedRmsNormRef(
  x: ArrayLike<number>,
  gate: ArrayLike<number>,
  weight: ArrayLike<number>,
  eps: number,
): Float64Array {
  const D = weight.length;
  const out = new Float64Array(x.length);
  for (let r = 0; r < x.length / D; r++) {
    let sum = 0;
    for (let i = 0; i < D; i++) sum += x[r * D + i]! ** 2;
    const inv = 1 / Math.sqrt(sum / D + eps);
    for (let i = 0; i < D; i++) out[r * D + i] = silu(gate[r * D + i]!) * weight[i]! * x[r * D + i]! * inv;
  }
  return out;
}
