// The error model: each status becomes its MlxkError subclass with the library's message, read
// right after the failing call.

import { afterEach, describe, expect, test } from "bun:test";
import {
  BackendError,
  BufferTooSmallError,
  computeG,
  constants as C,
  DtypeError,
  errorClasses,
  errorFor,
  gatedDeltaState,
  gatedDeltaUpdate,
  gatedDeltaUpdateVjp,
  gatedRmsNorm,
  gatedRmsNormVjp,
  getMemoryLimit,
  gpuBackend,
  InvalidArgumentError,
  InvalidHandleError,
  lib,
  liveArrayCount,
  MlxArray,
  MlxkError,
  NullPointerError,
  OutOfMemoryError,
  PanicError,
  setCacheLimit,
  setDefaultDevice,
  setMemoryLimit,
  ShapeError,
  siluRmsHeads,
  siluRmsHeadsVjp,
  statusName,
  UnsupportedError,
} from "../src/index";

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

/** The error `fn` throws (fails the test if it returns). */
function thrown(fn: () => unknown): Error {
  try {
    fn();
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected an exception");
}

/** Small valid recurrence inputs: B 1, T 2, Hk 1, Hv 2, Dk 32, Dv 4, all float32. */
function recurrenceInputs() {
  const f = (shape: number[]) => MlxArray.fromFloat32(new Float32Array(shape.reduce((p, d) => p * d, 1)).fill(0.1), shape);
  return {
    q: f([1, 2, 1, 32]),
    k: f([1, 2, 1, 32]),
    v: f([1, 2, 2, 4]),
    a: f([1, 2, 2]),
    b: f([1, 2, 2]),
    aLog: f([2]),
    dtBias: f([2]),
    [Symbol.dispose]() {
      for (const a of Object.values(this)) a.dispose();
    },
  };
}

describe("status -> error class", () => {
  test("one subclass per MLXK_ERR_*, with status and statusName", () => {
    const expected: Array<[number, Function, string]> = [
      [C.MLXK_ERR_NULL_POINTER, NullPointerError, "MLXK_ERR_NULL_POINTER"],
      [C.MLXK_ERR_INVALID_ARGUMENT, InvalidArgumentError, "MLXK_ERR_INVALID_ARGUMENT"],
      [C.MLXK_ERR_SHAPE, ShapeError, "MLXK_ERR_SHAPE"],
      [C.MLXK_ERR_DTYPE, DtypeError, "MLXK_ERR_DTYPE"],
      [C.MLXK_ERR_UNSUPPORTED, UnsupportedError, "MLXK_ERR_UNSUPPORTED"],
      [C.MLXK_ERR_BACKEND, BackendError, "MLXK_ERR_BACKEND"],
      [C.MLXK_ERR_OUT_OF_MEMORY, OutOfMemoryError, "MLXK_ERR_OUT_OF_MEMORY"],
      [C.MLXK_ERR_BUFFER_TOO_SMALL, BufferTooSmallError, "MLXK_ERR_BUFFER_TOO_SMALL"],
      [C.MLXK_ERR_PANIC, PanicError, "MLXK_ERR_PANIC"],
      [C.MLXK_ERR_INVALID_HANDLE, InvalidHandleError, "MLXK_ERR_INVALID_HANDLE"],
    ];
    expect(errorClasses.size).toBe(expected.length);
    for (const [status, Class, name] of expected) {
      const e = errorFor(status, "message");
      expect(e).toBeInstanceOf(Class);
      expect(e).toBeInstanceOf(MlxkError);
      expect(e).toBeInstanceOf(Error);
      expect(e.status).toBe(status);
      expect(e.statusName).toBe(name);
      expect(statusName(status)).toBe(name);
    }
    expect(statusName(C.MLXK_OK)).toBe("MLXK_OK");
    expect(statusName(99)).toBe("MLXK_UNKNOWN_STATUS");
    const unknown = errorFor(99, "x");
    expect(unknown.constructor).toBe(MlxkError);
  });
});

describe("kernel argument errors", () => {
  test("wrong rank -> ShapeError, status 3, message naming the argument", () => {
    using x = recurrenceInputs();
    using q3 = MlxArray.fromFloat32(new Float32Array(64), [2, 1, 32]);
    const e = thrown(() => gatedDeltaUpdate(q3, x.k, x.v, x.a, x.b, x.aLog, x.dtBias));
    expect(e).toBeInstanceOf(ShapeError);
    expect((e as ShapeError).status).toBe(3);
    expect((e as ShapeError).statusName).toBe("MLXK_ERR_SHAPE");
    expect(e.message).toMatch(/^mlxk_gated_delta_update: q: expected rank 4 \[B, T, Hk, Dk\], got rank 3/);

    using aLog2 = MlxArray.fromFloat32(new Float32Array(4), [2, 2]);
    const g = thrown(() => computeG(aLog2, x.a, x.dtBias));
    expect(g).toBeInstanceOf(ShapeError);
    expect(g.message).toContain("a_log: expected rank 1 [Hv]");
  });

  test("mismatched dimension and bad Dk -> ShapeError naming the dimension", () => {
    using x = recurrenceInputs();
    using k = MlxArray.fromFloat32(new Float32Array(3 * 32), [1, 3, 1, 32]);
    const e = thrown(() => gatedDeltaUpdate(x.q, k, x.v, x.a, x.b, x.aLog, x.dtBias));
    expect(e).toBeInstanceOf(ShapeError);
    expect(e.message).toContain("k: dimension 1 (T) is 3, expected 2");
    using q = MlxArray.fromFloat32(new Float32Array(2 * 40), [1, 2, 1, 40]);
    using k40 = MlxArray.fromFloat32(new Float32Array(2 * 40), [1, 2, 1, 40]);
    const dk = thrown(() => gatedDeltaUpdate(q, k40, x.v, x.a, x.b, x.aLog, x.dtBias));
    expect(dk.message).toContain("Dk (dimension 3) is 40; it must be a multiple of 32");
  });

  test("wrong dtype -> DtypeError, status 4", () => {
    using x = recurrenceInputs();
    using state = MlxArray.zeros([1, 2, 4, 32], "bfloat16");
    const e = thrown(() => gatedDeltaUpdate(x.q, x.k, x.v, x.a, x.b, x.aLog, x.dtBias, state));
    expect(e).toBeInstanceOf(DtypeError);
    expect((e as DtypeError).status).toBe(4);
    expect(e.message).toContain("state: dtype bfloat16 is not accepted (the recurrent state is float32 only)");
    using mask = MlxArray.fromUint8(new Uint8Array(2).fill(1), [1, 2]);
    const m = thrown(() => gatedDeltaUpdate(x.q, x.k, x.v, x.a, x.b, x.aLog, x.dtBias, null, mask));
    expect(m).toBeInstanceOf(DtypeError);
    expect(m.message).toContain("mask: dtype uint8 is not accepted");
    using kb = x.k.astype("bfloat16");
    const mixed = thrown(() => gatedDeltaUpdate(x.q, kb, x.v, x.a, x.b, x.aLog, x.dtBias));
    expect(mixed.message).toContain("k: dtype bfloat16 differs from q's dtype float32");
    using xi = MlxArray.fromInt32(new Int32Array(4), [1, 4]);
    using w = MlxArray.fromBits(new Uint16Array(4), [4], "bfloat16");
    using xf = MlxArray.fromFloat32(new Float32Array(4), [1, 4]);
    expect(thrown(() => gatedRmsNorm(xi, xi, w, 1e-6))).toBeInstanceOf(DtypeError);
    expect(thrown(() => gatedRmsNorm(xf, xf, w, 1e-6)).message).toContain("weight: dtype bfloat16 differs from x's dtype float32");
  });

  test("invalid values -> InvalidArgumentError, status 2", () => {
    using x = recurrenceInputs();
    const len = thrown(() => gatedDeltaState(x.k, x.v, x.a, x.b, x.aLog, x.dtBias, null, [3]));
    expect(len).toBeInstanceOf(InvalidArgumentError);
    expect((len as InvalidArgumentError).status).toBe(2);
    expect(len.message).toContain("accepted_lengths[0] is 3; expected 0 <= length <= T (2)");
    const count = thrown(() => gatedDeltaState(x.k, x.v, x.a, x.b, x.aLog, x.dtBias, null, []));
    expect(count.message).toContain("n_lengths is 0, expected one length per batch row (B = 1)");
    using xf = MlxArray.fromFloat32(new Float32Array(8), [2, 4]);
    using w = MlxArray.fromFloat32(new Float32Array(4), [4]);
    expect(thrown(() => gatedRmsNorm(xf, xf, w, NaN)).message).toContain("eps is NaN");
    expect(thrown(() => gatedRmsNorm(xf, xf, w, -1))).toBeInstanceOf(InvalidArgumentError);
    using heads = MlxArray.fromFloat32(new Float32Array(1 * 1 * (2 * 4 + 4)), [1, 1, 12]);
    using scale = MlxArray.fromFloat32(new Float32Array(4), [4]);
    const hv = thrown(() => siluRmsHeads(heads, scale, scale, 1, 0, 4, 1e-6));
    expect(hv).toBeInstanceOf(InvalidArgumentError);
    expect(hv.message).toContain("value_heads is 0; expected >= 1");
  });

  test("the backward passes name their cotangents", () => {
    using x = recurrenceInputs();
    const dy = thrown(() => gatedDeltaUpdateVjp(x.q, x.k, x.v, x.a, x.b, x.aLog, x.dtBias, null, null, x.q));
    expect(dy).toBeInstanceOf(ShapeError);
    expect(dy.message).toStartWith("mlxk_gated_delta_update_vjp: dy: dimension 2 (Hv) is 1, expected 2");
    using bfState = MlxArray.fromBits(new Uint16Array(256), [1, 2, 4, 32], "bfloat16");
    const ds = thrown(() => gatedDeltaUpdateVjp(x.q, x.k, x.v, x.a, x.b, x.aLog, x.dtBias, null, null, null, bfState));
    expect(ds).toBeInstanceOf(DtypeError);
    expect(ds.message).toContain("dstate_out: dtype bfloat16 is not accepted");
    using heads = MlxArray.fromFloat32(new Float32Array(12), [1, 1, 12]);
    using scale = MlxArray.fromFloat32(new Float32Array(4), [4]);
    using dv = MlxArray.fromFloat32(new Float32Array(5), [1, 1, 1, 5]);
    const v = thrown(() => siluRmsHeadsVjp(heads, scale, scale, 1, 1, 4, 1e-6, null, null, dv));
    expect(v).toBeInstanceOf(ShapeError);
    expect(v.message).toContain("mlxk_silu_rms_heads_vjp: dv: dimension 3 (Dv) is 5, expected 4");
    using xf = MlxArray.fromFloat32(new Float32Array(8), [2, 4]);
    using w = MlxArray.fromFloat32(new Float32Array(4), [4]);
    using di = MlxArray.fromInt32(new Int32Array(8), [2, 4]);
    const dout = thrown(() => gatedRmsNormVjp(xf, xf, w, 1e-6, di));
    expect(dout).toBeInstanceOf(DtypeError);
    expect(dout.message).toContain("mlxk_gated_rms_norm_vjp: dout: dtype int32 is not a float dtype");
    expect(thrown(() => gatedRmsNormVjp(xf, xf, w, -1))).toBeInstanceOf(InvalidArgumentError);
  });

  test("JavaScript-side checks: RangeError for non-integers, TypeError for non-arrays", () => {
    using x = recurrenceInputs();
    expect(() => gatedDeltaState(x.k, x.v, x.a, x.b, x.aLog, x.dtBias, null, [1.5])).toThrow(RangeError);
    using heads = MlxArray.fromFloat32(new Float32Array(12), [1, 1, 12]);
    using scale = MlxArray.fromFloat32(new Float32Array(4), [4]);
    expect(() => siluRmsHeads(heads, scale, scale, 1.5, 1, 4, 1e-6)).toThrow(RangeError);
    expect(() => siluRmsHeads(heads, scale, scale, 2 ** 31, 1, 4, 1e-6)).toThrow(RangeError);
    expect(() => computeG({} as MlxArray, x.a, x.dtBias)).toThrow(TypeError);
  });

  test("the message is the failing call's own, read right after it", () => {
    using x = recurrenceInputs();
    using bad = MlxArray.fromFloat32(new Float32Array(2), [2]);
    using dtInt = x.dtBias.astype("int32");
    const first = thrown(() => computeG(x.aLog, bad, dtInt));
    const second = thrown(() => computeG(x.q, x.a, x.dtBias));
    expect(first.message).not.toBe(second.message);
    expect(first.message).toStartWith("mlxk_compute_g: ");
    expect(second.message).toStartWith("mlxk_compute_g: ");
    // A success in between leaves the message alone (it lives until the next failure).
    using ok = computeG(x.aLog, x.a, x.dtBias);
    expect(String(lib.mlxk_last_error())).toBe(second.message);
  });
});

describe("raw C misuse through the symbol table", () => {
  test("NULL out-parameters and handles give MLXK_ERR_NULL_POINTER", () => {
    using a = MlxArray.zeros([2]);
    expect(lib.mlxk_array_ndim(a.handle, null)).toBe(C.MLXK_ERR_NULL_POINTER);
    expect(errorFor(C.MLXK_ERR_NULL_POINTER)).toBeInstanceOf(NullPointerError);
    expect(String(lib.mlxk_last_error())).toContain("ndim is NULL");
    expect(lib.mlxk_array_eval(null)).toBe(C.MLXK_ERR_NULL_POINTER);
    expect(String(lib.mlxk_last_error())).toContain("array is NULL");
  });

  test("a short read buffer gives MLXK_ERR_BUFFER_TOO_SMALL and copies nothing", () => {
    using a = MlxArray.fromFloat32(new Float32Array([1, 2, 3]), [3]);
    const dst = new Float32Array([9, 9]);
    expect(lib.mlxk_array_read(a.handle, dst, dst.byteLength)).toBe(C.MLXK_ERR_BUFFER_TOO_SMALL);
    const e = errorFor(C.MLXK_ERR_BUFFER_TOO_SMALL);
    expect(e).toBeInstanceOf(BufferTooSmallError);
    expect(e.message).toContain("dst_bytes is 8; the array holds 12 bytes");
    expect(Array.from(dst)).toEqual([9, 9]);
  });

  test("a handle the library never made gives MLXK_ERR_INVALID_HANDLE", () => {
    expect(lib.mlxk_array_eval(0x7777_0000 as never)).toBe(C.MLXK_ERR_INVALID_HANDLE);
    expect(String(lib.mlxk_last_error())).toContain("is not a live mlxk_array handle");
  });
});

describe("devices and memory", () => {
  test("memory limit: requests above it throw OutOfMemoryError; 0 restores the default", () => {
    const before = getMemoryLimit();
    setMemoryLimit(1024);
    try {
      expect(getMemoryLimit()).toBe(1024);
      const e = thrown(() => MlxArray.zeros([1024], "float32"));
      expect(e).toBeInstanceOf(OutOfMemoryError);
      expect((e as OutOfMemoryError).status).toBe(7);
      expect(e.message).toContain("above the memory limit of 1024 bytes");
    } finally {
      setMemoryLimit(0);
    }
    expect(getMemoryLimit()).toBe(before);
    expect(() => setMemoryLimit(-1)).toThrow(RangeError);
    expect(() => setMemoryLimit(2 ** 53)).toThrow(RangeError);
    setCacheLimit(1n << 30n);
  });

  test("setDefaultDevice: gpu without a Metal GPU throws UnsupportedError and keeps the CPU", () => {
    expect(["none", "metal", "cuda"]).toContain(gpuBackend());
    if (gpuBackend() === "metal") {
      setDefaultDevice("gpu");
      setDefaultDevice("cpu");
      return;
    }
    const e = thrown(() => setDefaultDevice("gpu"));
    expect(e).toBeInstanceOf(UnsupportedError);
    expect((e as UnsupportedError).status).toBe(5);
    setDefaultDevice("cpu");
    expect(() => setDefaultDevice("tpu" as never)).toThrow(TypeError);
    using z = MlxArray.zeros([1]);
    expect(z.toFloat32Array()[0]).toBe(0);
  });
});
