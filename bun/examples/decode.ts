// A Gated DeltaNet layer's recurrent path, prefill then decode, carrying the state:
//
//   conv output x --siluRmsHeads--> q, k, v --gatedDeltaUpdate(state)--> y, state'
//   y --gatedRmsNorm(gate z)--> output
//
// Run from bun/:  bun examples/decode.ts   (needs ../target/debug/libmlxkern.so: `make build`)
//
// Random numbers stand in for the model's projections; the shapes and dtypes are Qwen3.5's
// (bfloat16 activations, float32 state) at a small size.

import {
  gatedDeltaUpdate,
  gatedRmsNorm,
  MlxArray,
  siluRmsHeads,
  toBfloat16Bits,
  version,
} from "../src/index";

const B = 1; // sequences
const Hk = 2; // key heads
const Hv = 4; // value heads (each reads key head h / (Hv / Hk))
const Dk = 64; // key width (a multiple of 32)
const Dv = 64; // value width
const CHANNELS = 2 * Hk * Dk + Hv * Dv; // q | k | v
const PROMPT = 12;
const DECODE_STEPS = 4;

let seed = 12345;
function random(): number {
  seed = (Math.imul(seed, 1103515245) + 12345) >>> 0;
  return seed / 2 ** 32 - 0.5;
}

/** A bfloat16 array of random values of `shape`, scaled. */
function randomBf16(shape: number[], scale = 1): MlxArray {
  const n = shape.reduce((p, d) => p * d, 1);
  return MlxArray.fromBits(toBfloat16Bits(Float32Array.from({ length: n }, () => random() * scale)), shape, "bfloat16");
}

// Per-layer parameters (would come from the checkpoint).
using aLog = MlxArray.fromFloat32(Float32Array.from({ length: Hv }, () => random()), [Hv]);
using dtBias = randomBf16([Hv]);
using qScale = MlxArray.fromBits(toBfloat16Bits(new Float32Array(Dk).fill(1 / Dk)), [Dk], "bfloat16");
using kScale = MlxArray.fromBits(toBfloat16Bits(new Float32Array(Dk).fill(1 / Math.sqrt(Dk))), [Dk], "bfloat16");
using normWeight = MlxArray.fromBits(toBfloat16Bits(Float32Array.from({ length: Dv }, () => 1 + 0.2 * random())), [Dv], "bfloat16");
const eps = 1e-6;

/** One call of the layer's recurrent path over `T` tokens, from `state` (null: zeros).
 * Returns the normalized output and the new state (both owned by the caller). */
function layer(T: number, state: MlxArray | null): { out: MlxArray; state: MlxArray } {
  using x = randomBf16([B, T, CHANNELS], 4); // the depthwise conv output
  using a = randomBf16([B, T, Hv]);
  using b = randomBf16([B, T, Hv], 4);
  using z = randomBf16([B, T, Hv, Dv], 2); // the output gate
  const heads = siluRmsHeads(x, qScale, kScale, Hk, Hv, Dv, eps / Dk);
  using q = heads.q;
  using k = heads.k;
  using v = heads.v;
  const result = gatedDeltaUpdate(q, k, v, a, b, aLog, dtBias, state, null);
  using y = result.y;
  const out = gatedRmsNorm(y, z, normWeight, eps); // per head: the last axis, Dv
  return { out, state: result.state };
}

function rms(a: MlxArray): number {
  const v = a.toFloat32Array();
  return Math.sqrt(v.reduce((s, x) => s + x * x, 0) / v.length);
}

console.log(`mlxkern ${version()}: B=${B} Hk=${Hk} Hv=${Hv} Dk=${Dk} Dv=${Dv}`);

// Prefill: the whole prompt in one call, starting from a zero state.
let { out, state } = layer(PROMPT, null);
state.eval();
console.log(`prefill  T=${PROMPT}: output rms ${rms(out).toFixed(4)}, state [${state.shape.join(", ")}] ${state.dtype}`);
out.dispose();

// Decode: one token per step. Dispose the old state before evaluating the new one: the new
// state then has the only reference to the old buffer, and the CPU kernel writes into it in
// place instead of allocating 4 bytes x Hv x Dv x Dk per step.
for (let step = 1; step <= DECODE_STEPS; step++) {
  const next = layer(1, state);
  state.dispose();
  next.state.eval();
  state = next.state;
  console.log(`decode   step ${step}: output rms ${rms(next.out).toFixed(4)}, state rms ${rms(state).toFixed(4)}`);
  next.out.dispose();
}
state.dispose();
console.log("done");
