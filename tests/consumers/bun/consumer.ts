// A Bun project's use of the installed mlxkern package (tests/consumers/bun/run.sh copies this
// file into a fresh project): one decode step of gatedDeltaUpdate and one gatedRmsNorm on the
// inputs of tests/consumers/reference.c's generator, printed in its format (float32 bit
// patterns in hex). Only the package's public API.

import { gatedDeltaUpdate, gatedRmsNorm, library, MlxArray } from "mlxkern";

console.error(`library: ${library.path}`);

let s = 2024;
/** reference.c's generator: s = s * 1664525 + 1013904223 (mod 2^32), a float in [-1, 1). */
function nextValue(): number {
  s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
  return ((s >>> 8) / 16777216) * 2 - 1;
}

function make(shape: number[]): MlxArray {
  const n = shape.reduce((p, d) => p * d, 1);
  const data = new Float32Array(n);
  for (let i = 0; i < n; i++) data[i] = nextValue();
  return MlxArray.fromFloat32(data, shape);
}

function print(name: string, a: MlxArray): void {
  const values = a.toFloat32Array();
  const bits = new Uint32Array(values.buffer, values.byteOffset, values.length);
  const words = Array.from(bits, (w) => w.toString(16).padStart(8, "0"));
  console.log(`${name} ${bits.length} ${words.join(" ")}`);
}

const [B, T, Hk, Hv, Dk, Dv] = [2, 1, 2, 4, 32, 8];
using q = make([B, T, Hk, Dk]);
using k = make([B, T, Hk, Dk]);
using v = make([B, T, Hv, Dv]);
using a = make([B, T, Hv]);
using b = make([B, T, Hv]);
using aLog = make([Hv]);
using dtBias = make([Hv]);
using state = make([B, Hv, Dv, Dk]);
const step = gatedDeltaUpdate(q, k, v, a, b, aLog, dtBias, state, null);
using y = step.y;
using stateOut = step.state;

using x = make([3, 16]);
using gate = make([3, 16]);
using weight = make([16]);
using norm = gatedRmsNorm(x, gate, weight, 1e-6);

print("y", y);
print("state", stateOut);
print("norm", norm);
