// Arrays shared with a host's MLX: MlxArray.fromMlx / toMlx, mlxArrayFree, mlxVersion and
// withMlxLock. The host is a real mlx-c (MLX's C API) loaded into this process with bun:ffi:
// MLXKERN_TEST_MLXC names its shared library (scripts/test/bun.sh builds it from
// ../shared/vendor/mlx-c; without it those tests are skipped and the reason printed). mlx-c
// makes the inputs, mlxkern's kernels run on them without a copy, mlx-c evaluates and reads the
// results, and the same kernels through the binding's own copying path must give the same bits.
// The misuse, lock and second-libmlx tests need no mlx-c.

import { afterEach, describe, expect, test } from "bun:test";
import { dlopen, toArrayBuffer, type Pointer } from "bun:ffi";
import { copyFileSync, mkdtempSync, readFileSync, realpathSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  DtypeError,
  gatedDeltaUpdate,
  gatedRmsNorm,
  InvalidHandleError,
  lib,
  liveArrayCount,
  MlxArray,
  mlxArrayFree,
  mlxVersion,
  NullPointerError,
  toBfloat16Bits,
  withMlxLock,
} from "../src/index";
import { MLXK_ERR_INVALID_ARGUMENT, MLXK_ERR_NULL_POINTER, MLXK_ERR_UNSUPPORTED, MLXK_OK } from "../src/symbols.generated";
import { assertBitwiseEqual, disposeAll, rngFor, SEED } from "./helpers";

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

/** Throws, and returns the error for further checks. */
function caught(fn: () => unknown): Error {
  try {
    fn();
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected an error, nothing was thrown");
}

describe("without a host MLX", () => {
  test("mlxVersion names the loaded libmlx", () => {
    expect(mlxVersion()).toMatch(/^\d+\.\d+\.\d+/);
    expect(mlxVersion()).toBe(String(lib.mlxk_mlx_version()));
  });

  test("toMlx and fromMlx round-trip through a host array; mlxArrayFree releases it", () => {
    const values = Float32Array.from(rngFor("roundtrip").normals(12));
    const a = MlxArray.fromFloat32(values, [3, 4]);
    const host = a.toMlx();
    expect(typeof host).toBe("number");
    a.dispose(); // the host array keeps the data alive
    const b = MlxArray.fromMlx(host);
    const c = MlxArray.fromMlx(BigInt(host)); // an address as a bigint is the same
    mlxArrayFree(host); // the handles keep it alive in turn
    expect(b.shape).toEqual([3, 4]);
    expect(b.dtype).toBe("float32");
    assertBitwiseEqual("fromMlx(toMlx())", b.toTypedArray() as Float32Array, values);
    assertBitwiseEqual("fromMlx(bigint)", c.toTypedArray() as Float32Array, values);
    disposeAll(b, c);
  });

  test("misuse: NULL, a disposed array, something that is not a pointer", () => {
    for (const p of [null, 0, 0n]) {
      const e = caught(() => MlxArray.fromMlx(p));
      expect(e).toBeInstanceOf(NullPointerError);
      expect((e as NullPointerError).status).toBe(MLXK_ERR_NULL_POINTER);
      expect((e as NullPointerError).statusName).toBe("MLXK_ERR_NULL_POINTER");
      expect(e.message).toContain("mlxk_array_from_mlx");
    }
    const a = MlxArray.fromFloat32(new Float32Array([1, 2]), [2]);
    a.dispose();
    const e = caught(() => a.toMlx());
    expect(e).toBeInstanceOf(InvalidHandleError);
    expect(e.message).toContain("mlxk_array_to_mlx");
    expect(() => MlxArray.fromMlx("0x1234" as unknown as number)).toThrow(TypeError);
    expect(() => MlxArray.fromMlx(-8)).toThrow(RangeError);
    expect(() => MlxArray.fromMlx(8.5)).toThrow(RangeError);
    expect(() => MlxArray.fromMlx(1n << 60n)).toThrow(RangeError);
    // Freeing NULL does nothing.
    mlxArrayFree(null);
    mlxArrayFree(0);
  });

  test("withMlxLock returns fn's result, nests, runs kernels, and releases on a throw", () => {
    const sum = withMlxLock(() =>
      withMlxLock(() => {
        using a = MlxArray.fromFloat32(new Float32Array([1, 2, 3]), [3]);
        using b = a.astype("bfloat16");
        return Array.from(b.toFloat32Array()).reduce((s, x) => s + x, 0);
      }),
    );
    expect(sum).toBe(6);
    expect(() =>
      withMlxLock(() => {
        throw new RangeError("from fn");
      }),
    ).toThrow("from fn");
    // Every lock was given back: one more unlock is a misuse the library reports.
    expect(lib.mlxk_mlx_unlock()).toBe(MLXK_ERR_INVALID_ARGUMENT);
    expect(() => withMlxLock(async () => 1)).toThrow(TypeError);
    expect(lib.mlxk_mlx_unlock()).toBe(MLXK_ERR_INVALID_ARGUMENT);
    expect(() => withMlxLock(42 as unknown as () => void)).toThrow(TypeError);
    expect(lib.mlxk_mlx_lock()).toBe(MLXK_OK);
    expect(lib.mlxk_mlx_unlock()).toBe(MLXK_OK);
  });
});

describe("a second libmlx in the process", () => {
  // The libmlx this process loaded (through libmlxkern), from the memory map (Linux).
  const maps = process.platform === "linux" ? readFileSync("/proc/self/maps", "utf8") : "";
  const loaded = /\s(\/\S*\/libmlx\.so)$/m.exec(maps)?.[1];
  if (!loaded) console.log("mlx-interop: SKIP the second-libmlx test: no libmlx.so in /proc/self/maps (Linux only)");

  test.skipIf(!loaded)("makes the exchange refuse with UnsupportedError naming both copies", () => {
    const dir = mkdtempSync(join(tmpdir(), "mlxkern-second-libmlx-"));
    try {
      const copy = join(dir, "libmlx.so");
      copyFileSync(loaded!, copy);
      // A fresh process: an explicit dlopen of another file maps a second copy of libmlx.
      const code = `
        import { dlopen } from "bun:ffi";
        import { MlxArray } from "./src/index.ts";
        const a = MlxArray.fromFloat32(new Float32Array([1, 2]), [2]);
        const host = a.toMlx();
        dlopen(${JSON.stringify(copy)}, { _ZN3mlx4core7versionEv: { args: [], returns: "void" } });
        const seen = [];
        for (const f of [() => a.toMlx(), () => MlxArray.fromMlx(host)]) {
          try { f(); seen.push(null); } catch (e) { seen.push({ name: e.name, status: e.status, statusName: e.statusName, message: e.message }); }
        }
        a.dispose();
        console.log(JSON.stringify(seen));`;
      const proc = Bun.spawnSync([process.execPath, "-e", code], { cwd: join(import.meta.dir, ".."), stdout: "pipe", stderr: "pipe" });
      expect(proc.stderr.toString()).toBe("");
      expect(proc.exitCode).toBe(0);
      const seen = JSON.parse(proc.stdout.toString().trim().split("\n").at(-1)!);
      expect(seen).toHaveLength(2);
      for (const [i, fn] of ["mlxk_array_to_mlx", "mlxk_array_from_mlx"].entries()) {
        expect(seen[i].name).toBe("UnsupportedError");
        expect(seen[i].status).toBe(MLXK_ERR_UNSUPPORTED);
        expect(seen[i].statusName).toBe("MLXK_ERR_UNSUPPORTED");
        expect(seen[i].message).toContain(`${fn}: 2 copies of libmlx are loaded`);
        expect(seen[i].message).toContain(copy);
        expect(seen[i].message).toContain(realpathSync(loaded!));
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// ---- a real mlx-c in the process ----------------------------------------------------------

const MLXC_PATH = process.env.MLXKERN_TEST_MLXC ?? "";
const SKIP_REASON = MLXC_PATH === ""
  ? "MLXKERN_TEST_MLXC is not set (scripts/test/bun.sh sets it to an mlx-c built from ../shared/vendor/mlx-c)"
  : null;
if (SKIP_REASON) console.log(`mlx-interop: SKIP the tests with mlx-c: ${SKIP_REASON}`);

// mlx-c's dtype codes (mlx/c/array.h, enum mlx_dtype_).
const MLX_FLOAT32 = 10;
const MLX_FLOAT64 = 11;
const MLX_BFLOAT16 = 12;

/** mlx-c's handles (`mlx_array`, `mlx_string`, `mlx_stream`) are structs of one pointer,
 * `{ void *ctx; }`: passed and returned by value exactly as that pointer (x86-64 and arm64
 * C ABIs), so bun:ffi declares them as `ptr` and the value is the ctx. */
function openMlxc(path: string) {
  return dlopen(path, {
    mlx_array_new_data: { args: ["ptr", "ptr", "i32", "i32"], returns: "ptr" },
    mlx_array_free: { args: ["ptr"], returns: "i32" },
    mlx_array_eval: { args: ["ptr"], returns: "i32" },
    mlx_array_ndim: { args: ["ptr"], returns: "usize" },
    mlx_array_dim: { args: ["ptr", "i32"], returns: "i32" },
    mlx_array_dtype: { args: ["ptr"], returns: "i32" },
    mlx_array_nbytes: { args: ["ptr"], returns: "usize" },
    mlx_array_data_float32: { args: ["ptr"], returns: "ptr" },
    mlx_array_data_uint16: { args: ["ptr"], returns: "ptr" },
    mlx_add: { args: ["ptr", "ptr", "ptr", "ptr"], returns: "i32" },
    mlx_transpose: { args: ["ptr", "ptr", "ptr"], returns: "i32" },
    mlx_default_cpu_stream_new: { args: [], returns: "ptr" },
    mlx_stream_free: { args: ["ptr"], returns: "i32" },
    mlx_version: { args: ["ptr"], returns: "i32" },
    mlx_string_data: { args: ["ptr"], returns: "cstring" },
    mlx_string_free: { args: ["ptr"], returns: "i32" },
  }).symbols;
}

type Mlxc = ReturnType<typeof openMlxc>;

/** An mlx-c pointer result (bun:ffi gives a Pointer, or a bigint) as the Pointer the tests pass on. */
function pointerOf(p: Pointer | bigint | null, what: string): Pointer {
  if (p === null) throw new Error(`mlx-c: ${what} returned NULL`);
  return typeof p === "bigint" ? (Number(p) as Pointer) : p;
}

/** A small host on mlx-c: arrays are their ctx pointers. */
class Host {
  readonly c: Mlxc;
  readonly cpu: Pointer;
  constructor(path: string) {
    this.c = openMlxc(path);
    this.cpu = pointerOf(this.c.mlx_default_cpu_stream_new(), "mlx_default_cpu_stream_new");
  }

  version(): string {
    const slot = new BigUint64Array(1);
    expect(this.c.mlx_version(slot)).toBe(0);
    const ctx = Number(slot[0]!) as Pointer;
    const text = String(this.c.mlx_string_data(ctx));
    this.c.mlx_string_free(ctx);
    return text;
  }

  /** A new mlx-c array holding a copy of `data` (float32, or bfloat16 bits). */
  array(data: Float32Array | Uint16Array | Float64Array, shape: number[], dtype: number): Pointer {
    const dims = Int32Array.from(shape);
    return pointerOf(this.c.mlx_array_new_data(data, dims, dims.length, dtype), "mlx_array_new_data");
  }

  /** The result of an mlx-c op writing `mlx_array *res`. */
  op(call: (res: BigUint64Array) => number): Pointer {
    const res = new BigUint64Array(1);
    expect(call(res)).toBe(0);
    return Number(res[0]!) as Pointer;
  }

  add(a: Pointer, b: Pointer): Pointer {
    return this.op((res) => this.c.mlx_add(res, a, b, this.cpu));
  }

  transpose(a: Pointer): Pointer {
    return this.op((res) => this.c.mlx_transpose(res, a, this.cpu));
  }

  shape(a: Pointer): number[] {
    const n = Number(this.c.mlx_array_ndim(a));
    return Array.from({ length: n }, (_, i) => this.c.mlx_array_dim(a, i));
  }

  /** Evaluates with mlx-c and copies the data out (float32 values, or bfloat16 bits). */
  read(a: Pointer): Float32Array | Uint16Array {
    expect(this.c.mlx_array_eval(a)).toBe(0);
    const dtype = this.c.mlx_array_dtype(a);
    const n = Number(this.c.mlx_array_nbytes(a));
    const data = dtype === MLX_FLOAT32 ? this.c.mlx_array_data_float32(a) : this.c.mlx_array_data_uint16(a);
    expect(data).not.toBeNull();
    const bytes = toArrayBuffer(data!, 0, n).slice(0);
    return dtype === MLX_FLOAT32 ? new Float32Array(bytes) : new Uint16Array(bytes);
  }

  free(...arrays: Pointer[]): void {
    for (const a of arrays) expect(this.c.mlx_array_free(a)).toBe(0);
  }
}

/** Equal bits, 16-bit patterns (bfloat16) or float32 values. */
function sameBits(label: string, actual: Float32Array | Uint16Array, expected: Float32Array | Uint16Array): void {
  if (actual instanceof Float32Array && expected instanceof Float32Array) {
    assertBitwiseEqual(label, actual, expected);
    return;
  }
  expect(actual.constructor).toBe(expected.constructor);
  expect(actual.length).toBe(expected.length);
  for (let i = 0; i < actual.length; i++) {
    if (actual[i] !== expected[i]) throw new Error(`${label}: element ${i} differs: ${actual[i]} vs ${expected[i]} (seed ${SEED})`);
  }
}

describe.skipIf(SKIP_REASON !== null)("with mlx-c in the process", () => {
  const host = SKIP_REASON ? (null as unknown as Host) : new Host(MLXC_PATH);

  test("mlx-c links the libmlx that mlxkern shares arrays with", () => {
    expect(host.version()).toBe(mlxVersion());
  });

  test("no copy either way: the same buffer; each side keeps the array alive", () => {
    const values = Float32Array.from(rngFor("zero-copy").normals(24));
    const a = host.array(values, [2, 3, 4], MLX_FLOAT32);
    expect(host.c.mlx_array_eval(a)).toBe(0);
    const buffer = host.c.mlx_array_data_float32(a);
    const shared = MlxArray.fromMlx(a);
    expect(shared.shape).toEqual([2, 3, 4]);
    expect(shared.dtype).toBe("float32");
    const back = shared.toMlx();
    expect(host.c.mlx_array_data_float32(back)).toBe(buffer!);
    host.free(a); // the handle and `back` still hold the array
    assertBitwiseEqual("after the host freed its array", shared.toTypedArray() as Float32Array, values);
    shared.dispose();
    sameBits("back, after the handle was disposed", host.read(back), values);
    host.free(back);
  });

  test("gatedRmsNorm on a lazy host sum and a transposed host view, evaluated by mlx-c, equals the copying path bit for bit", () => {
    const rng = rngFor("rms-norm");
    const [rows, width] = [6, 48];
    const x1 = Float32Array.from(rng.normals(rows * width));
    const x2 = Float32Array.from(rng.normals(rows * width, 0.5));
    const gateT = Float32Array.from(rng.normals(rows * width, 2)); // [width, rows], transposed below
    const weight = Float32Array.from(rng.uniforms(width, 0.5, 1.5));
    const eps = 1e-6;
    // Host side: x is an unevaluated mlx-c sum, gate a transposed (strided) view.
    const h1 = host.array(x1, [rows, width], MLX_FLOAT32);
    const h2 = host.array(x2, [rows, width], MLX_FLOAT32);
    const hx = host.add(h1, h2);
    const hgT = host.array(gateT, [width, rows], MLX_FLOAT32);
    const hg = host.transpose(hgT);
    const hw = host.array(weight, [width], MLX_FLOAT32);
    const [x, gate, w] = [MlxArray.fromMlx(hx), MlxArray.fromMlx(hg), MlxArray.fromMlx(hw)];
    expect(gate.shape).toEqual([rows, width]);
    const out = gatedRmsNorm(x, gate, w, eps);
    const hout = out.toMlx();
    disposeAll(x, gate, w, out);
    // The host consumes the lazy result with its own op; one mlx-c evaluation computes both.
    const twice = host.add(hout, hout);
    const sum = host.read(twice) as Float32Array;
    const got = host.read(hout) as Float32Array;
    expect(host.shape(hout)).toEqual([rows, width]);
    // Reference: the same kernel on copies (float32 addition rounds the same on both sides).
    const xs = x1.map((v, i) => Math.fround(v + x2[i]!));
    const gate2 = new Float32Array(rows * width);
    for (let r = 0; r < rows; r++) for (let c = 0; c < width; c++) gate2[r * width + c] = gateT[c * rows + r]!;
    using rx = MlxArray.fromFloat32(xs, [rows, width]);
    using rg = MlxArray.fromFloat32(gate2, [rows, width]);
    using rw = MlxArray.fromFloat32(weight, [width]);
    using ref = gatedRmsNorm(rx, rg, rw, eps);
    const expected = ref.toTypedArray() as Float32Array;
    assertBitwiseEqual("gatedRmsNorm via mlx-c", got, expected);
    assertBitwiseEqual("host sum of the result", sum, expected.map((v) => Math.fround(v + v)));
    host.free(h1, h2, hx, hgT, hg, hw, hout, twice);
  });

  test("a decode loop whose state stays an mlx-c array: gatedDeltaUpdate equals the copying path bit for bit", () => {
    const rng = rngFor("decode");
    const [B, T, HK, HV, DK, DV, STEPS] = [1, 1, 2, 4, 64, 16, 5];
    const bf16 = (n: number, scale: number) => toBfloat16Bits(rng.normals(n, scale));
    const aLog = Float32Array.from(rng.normals(HV));
    const dtBias = bf16(HV, 1);
    const state0 = Float32Array.from(rng.normals(B * HV * DV * DK, 0.5));
    const hALog = host.array(aLog, [HV], MLX_FLOAT32);
    const hDt = host.array(dtBias, [HV], MLX_BFLOAT16);
    let hState = host.array(state0, [B, HV, DV, DK], MLX_FLOAT32);
    const sALog = MlxArray.fromMlx(hALog);
    const sDt = MlxArray.fromMlx(hDt);
    const rALog = MlxArray.fromFloat32(aLog, [HV]);
    const rDt = MlxArray.fromBits(dtBias, [HV], "bfloat16");
    let rState = MlxArray.fromFloat32(state0, [B, HV, DV, DK]);
    for (let step = 0; step < STEPS; step++) {
      const inputs = [
        [bf16(B * T * HK * DK, 0.2), [B, T, HK, DK]],
        [bf16(B * T * HK * DK, 0.2), [B, T, HK, DK]],
        [bf16(B * T * HV * DV, 1), [B, T, HV, DV]],
        [bf16(B * T * HV, 1), [B, T, HV]],
        [bf16(B * T * HV, 1), [B, T, HV]],
      ] as const;
      // Shared: host arrays in, host arrays out.
      const hosts = inputs.map(([bits, shape]) => host.array(bits, [...shape], MLX_BFLOAT16));
      const [q, k, v, a, b] = hosts.map((h) => MlxArray.fromMlx(h)) as [MlxArray, MlxArray, MlxArray, MlxArray, MlxArray];
      const state = MlxArray.fromMlx(hState);
      const result = gatedDeltaUpdate(q, k, v, a, b, sALog, sDt, state);
      const hY = result.y.toMlx();
      const hNext = result.state.toMlx();
      disposeAll(q, k, v, a, b, state, result);
      host.free(...hosts, hState);
      // Reference: copies.
      const [rq, rk, rv, ra, rb] = inputs.map(([bits, shape]) => MlxArray.fromBits(bits, [...shape], "bfloat16")) as [
        MlxArray, MlxArray, MlxArray, MlxArray, MlxArray,
      ];
      const ref = gatedDeltaUpdate(rq, rk, rv, ra, rb, rALog, rDt, rState);
      disposeAll(rq, rk, rv, ra, rb, rState);
      rState = ref.state;
      sameBits(`y, step ${step}`, host.read(hY), ref.y.toTypedArray() as Uint16Array);
      sameBits(`state, step ${step}`, host.read(hNext), rState.toTypedArray() as Float32Array);
      expect(host.shape(hNext)).toEqual([B, HV, DV, DK]);
      ref.y.dispose();
      host.free(hY);
      hState = hNext; // carried to the next step as an mlx-c array
    }
    disposeAll(sALog, sDt, rALog, rDt, rState);
    host.free(hALog, hDt, hState);
  });

  test("a host dtype mlxkern has no dtype for is refused with DtypeError", () => {
    const h = host.array(new Float64Array([1, 2, 3]), [3], MLX_FLOAT64);
    const e = caught(() => MlxArray.fromMlx(h));
    expect(e).toBeInstanceOf(DtypeError);
    expect((e as DtypeError).statusName).toBe("MLXK_ERR_DTYPE");
    expect(e.message).toContain("mlxk_array_from_mlx");
    host.free(h);
  });

  test("host MLX work inside withMlxLock, mlxkern calls nested in it", () => {
    const values = Float32Array.from(rngFor("lock").normals(8));
    const got = withMlxLock(() => {
      const h = host.array(values, [8], MLX_FLOAT32);
      const doubled = host.add(h, h);
      using shared = MlxArray.fromMlx(doubled);
      const data = shared.toTypedArray() as Float32Array;
      host.free(h, doubled);
      return data;
    });
    assertBitwiseEqual("doubled under the lock", got, values.map((v) => Math.fround(v + v)));
  });
});
