// The tree calls (src/pool.ts: gatedDeltaVerifyTreePool, gatedDeltaCommitTreePool) against the
// chain calls of the same API on random draft trees: every node's y is the last y of
// gatedDeltaVerifyPool on its path, each tree's commit gatedDeltaStatePool on that path, bit for
// bit; host arrays of the wrong length refused before the library reads them; the library's
// refusals name the argument.

import { afterEach, expect, test } from "bun:test";
import {
  gatedDeltaCommitTreePool,
  gatedDeltaStatePool,
  gatedDeltaVerifyPool,
  gatedDeltaVerifyTreePool,
  InvalidArgumentError,
  liveArrayCount,
  MlxArray,
} from "../src/index";
import { assertBitwiseEqual, disposeAll, floatArray, quantize, rngFor, SEED, type Rng } from "./helpers";

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

const h = { Hk: 1, Hv: 2, Dk: 32, Dv: 8 };

/** A random tree of `size` nodes: each node's parent an earlier node, or -1 now and then. */
function randomTree(rng: Rng, size: number): number[] {
  return Array.from({ length: size }, (_, j) => (j === 0 || rng.next() < 0.1 ? -1 : Math.floor(rng.next() * j)));
}

function pathTo(parents: number[], j: number): number[] {
  const path = [j];
  while (parents[path[path.length - 1]!]! >= 0) path.push(parents[path[path.length - 1]!]!);
  return path.reverse();
}

/** Host tokens of T nodes and the arrays of chosen ones as one row. */
class Tokens {
  q: Float64Array;
  k: Float64Array;
  v: Float64Array;
  a: Float64Array;
  b: Float64Array;
  constructor(rng: Rng, t: number) {
    this.q = quantize(rng.normals(t * h.Hk * h.Dk, 0.2), "bfloat16");
    this.k = quantize(rng.normals(t * h.Hk * h.Dk, 0.2), "bfloat16");
    this.v = quantize(rng.normals(t * h.Hv * h.Dv), "bfloat16");
    this.a = quantize(rng.normals(t * h.Hv, 2), "float32");
    this.b = quantize(rng.normals(t * h.Hv, 2), "float32");
  }
  arrays(pick: number[]) {
    const take = (x: Float64Array, per: number) => {
      const out = new Float64Array(pick.length * per);
      pick.forEach((t, i) => out.set(x.subarray(t * per, (t + 1) * per), i * per));
      return out;
    };
    const n = pick.length;
    return {
      q: floatArray(take(this.q, h.Hk * h.Dk), [1, n, h.Hk, h.Dk], "bfloat16"),
      k: floatArray(take(this.k, h.Hk * h.Dk), [1, n, h.Hk, h.Dk], "bfloat16"),
      v: floatArray(take(this.v, h.Hv * h.Dv), [1, n, h.Hv, h.Dv], "bfloat16"),
      a: floatArray(take(this.a, h.Hv), [1, n, h.Hv], "float32"),
      b: floatArray(take(this.b, h.Hv), [1, n, h.Hv], "float32"),
    };
  }
}

test("every node is the chain verify of its path and the commit the chain commit, bit for bit", () => {
  const rng = rngFor("tree");
  const star = [-1, 0, 0, 0, 0, 0];
  const chain = [-1, 0, 1, 2, 3, 4, 5, 6];
  for (const trees of [[[-1]], [chain], [star, randomTree(rng, 9), [-1, 0]], [randomTree(rng, 12), [], randomTree(rng, 5)]]) {
    const cu = [0];
    for (const t of trees) cu.push(cu[cu.length - 1]! + t.length);
    const parents = trees.flat();
    const total = parents.length;
    const N = trees.length + 2;
    const stateSize = h.Hv * h.Dv * h.Dk;
    const poolHost = Float32Array.from(rng.normals(N * stateSize, 0.5));
    using pool = MlxArray.fromFloat32(poolHost, [N, h.Hv, h.Dv, h.Dk]);
    using aLog = floatArray(quantize(rng.normals(h.Hv, 0.5), "float32"), [h.Hv], "float32");
    using dtBias = floatArray(quantize(rng.normals(h.Hv, 0.5), "float32"), [h.Hv], "float32");
    const tokens = new Tokens(rng, total);
    const slots = trees.map((_, i) => (i === 1 && trees.length > 2 ? -1 : (i * 3 + 1) % N));
    const fresh = trees.map(() => rng.next() < 0.3);
    const x = tokens.arrays([...Array(total).keys()]);
    using y = gatedDeltaVerifyTreePool(x.q, x.k, x.v, x.a, x.b, aLog, dtBias, pool, cu, parents, slots, fresh);
    const yh = y.toFloat32Array();
    const tok = h.Hv * h.Dv;
    const label = `trees ${JSON.stringify(trees)} slots ${slots} (seed ${SEED})`;
    const lengths: number[] = [];
    const accepted: number[] = [];
    trees.forEach((tree, i) => {
      const c0 = cu[i]!;
      for (let j = 0; j < tree.length; j++) {
        const got = yh.subarray((c0 + j) * tok, (c0 + j + 1) * tok);
        if (slots[i]! < 0) {
          expect(got.every((v) => v === 0)).toBe(true);
          continue;
        }
        const c = tokens.arrays(pathTo(tree, j).map((p) => c0 + p));
        using yc = gatedDeltaVerifyPool(c.q, c.k, c.v, c.a, c.b, aLog, dtBias, pool, [slots[i]!], [fresh[i]!]);
        const want = yc.toFloat32Array();
        assertBitwiseEqual(`${label}: tree ${i} node ${j}`, got, want.subarray(want.length - tok));
        disposeAll(c);
      }
      const path = tree.length === 0 ? [] : pathTo(tree, Math.floor(rng.next() * tree.length));
      lengths.push(path.length);
      accepted.push(...path);
    });
    using committed = gatedDeltaCommitTreePool(x.k, x.v, x.a, x.b, aLog, dtBias, pool, cu, parents, slots, lengths, accepted, fresh);
    const got = committed.toFloat32Array();
    let at = 0;
    trees.forEach((_, i) => {
      const path = accepted.slice(at, at + lengths[i]!).map((p) => cu[i]! + p);
      at += lengths[i]!;
      if (slots[i]! < 0) return;
      const c = tokens.arrays(path);
      using want = gatedDeltaStatePool(c.k, c.v, c.a, c.b, aLog, dtBias, pool, [slots[i]!], [path.length], [fresh[i]!]);
      const s = slots[i]! * stateSize;
      assertBitwiseEqual(`${label}: tree ${i}'s commit`, got.subarray(s, s + stateSize), want.toFloat32Array().subarray(s, s + stateSize));
      disposeAll(c);
    });
    disposeAll(x);
  }
});

test("bad trees, paths and counts throw errors naming them", () => {
  const rng = rngFor("tree-errors");
  const tokens = new Tokens(rng, 3);
  const x = tokens.arrays([0, 1, 2]);
  using pool = MlxArray.fromFloat32(new Float32Array(3 * h.Hv * h.Dv * h.Dk), [3, h.Hv, h.Dv, h.Dk]);
  using aLog = floatArray([0.1, 0.2], [h.Hv], "float32");
  using dtBias = floatArray([0.3, 0.4], [h.Hv], "float32");
  const verify = (cu: number[], parents: number[], slots: number[]) => () =>
    gatedDeltaVerifyTreePool(x.q, x.k, x.v, x.a, x.b, aLog, dtBias, pool, cu, parents, slots).dispose();
  expect(verify([0, 2, 3], [-1, 0, -1], [0])).toThrow("slots: 1 values for 2 trees");
  expect(verify([0, 3], [-1, 2, 0], [1])).toThrow("parents[1] is 2");
  expect(verify([0, 3], [-1, 0, 1], [3])).toThrow("slots[0] is 3");
  const commit = (lengths: number[], paths: number[]) => () =>
    gatedDeltaCommitTreePool(x.k, x.v, x.a, x.b, aLog, dtBias, pool, [0, 3], [-1, 0, 1], [1], lengths, paths).dispose();
  expect(commit([1, 1], [0, 0])).toThrow("acceptedLengths: 2 values for 1 slots");
  expect(commit([2], [0, 2])).toThrow("accepted_paths[1] is node 2");
  expect(commit([2], [0])).toThrow("n_accepted is 1");
  let caught: unknown;
  try {
    commit([2], [1, 2])();
  } catch (e) {
    caught = e;
  }
  expect(caught).toBeInstanceOf(InvalidArgumentError);
  disposeAll(x);
});
