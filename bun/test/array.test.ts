// MlxArray: construction from every typed array, read-back, metadata, casts, dispose rules, and
// the host bfloat16 / float16 conversions checked against MLX's own.

import { afterEach, describe, expect, test } from "bun:test";
import {
  bfloat16BitsToFloat32,
  float16BitsToFloat32,
  float32ToBfloat16Bits,
  float32ToFloat16Bits,
  InvalidArgumentError,
  InvalidHandleError,
  lib,
  liveArrayCount,
  MlxArray,
  toBfloat16Bits,
  toFloat16Bits,
} from "../src/index";
import { rngFor } from "./helpers";

afterEach(() => {
  expect(liveArrayCount()).toBe(0);
});

describe("construction and read-back", () => {
  test("every dtype round-trips with its shape, dtype and nbytes", () => {
    const cases = [
      [new Float32Array([1.5, -2, 3.25, 0, -0, 1e-30]), [2, 3], undefined, "float32", 24],
      [new Uint16Array([0x3f80, 0xc000, 0x7fc0, 0x0001]), [4], "bfloat16", "bfloat16", 8],
      [new Uint16Array([0x3c00, 0xfbff, 0x0001, 0x7c00]), [2, 2], "float16", "float16", 8],
      [new Int32Array([-2147483648, 2147483647, 0, 7]), [1, 4], undefined, "int32", 16],
      [new Uint32Array([0, 4294967295, 5]), [3], undefined, "uint32", 12],
      [new Uint8Array([0, 255, 7]), [3], undefined, "uint8", 3],
      [new Uint8Array([1, 0, 1, 1]), [2, 2], "bool", "bool", 4],
      [new Int8Array([-128, 127, -1]), [3, 1], undefined, "int8", 3],
    ] as const;
    for (const [data, shape, dtype, expectDtype, nbytes] of cases) {
      using a = MlxArray.from(data, shape, dtype);
      expect(a.dtype).toBe(expectDtype);
      expect(a.shape).toEqual([...shape]);
      expect(a.ndim).toBe(shape.length);
      expect(a.nbytes).toBe(nbytes);
      expect(a.size).toBe(data.length);
      const back = a.toTypedArray();
      expect(back.constructor).toBe(data.constructor);
      expect(Array.from(back as ArrayLike<number>)).toEqual(Array.from(data as ArrayLike<number>));
    }
  });

  test("named constructors, zeros, scalars and empty arrays", () => {
    using f = MlxArray.fromFloat32(new Float32Array([1, 2]), [2]);
    using b = MlxArray.fromBits(toBfloat16Bits([0.5, 3]), [2], "bfloat16");
    using i = MlxArray.fromInt32(new Int32Array([3]), [1]);
    using u = MlxArray.fromUint8(new Uint8Array([9]), [1]);
    using m = MlxArray.fromBool([true, false, true], [3]);
    using s = MlxArray.fromInt8(new Int8Array([-5]), []);
    using z = MlxArray.zeros([2, 0, 3], "bfloat16");
    using z2 = MlxArray.zeros([2, 2]);
    expect(Array.from(b.toFloat32Array())).toEqual([0.5, 3]);
    expect(i.dtype).toBe("int32");
    expect(u.dtype).toBe("uint8");
    expect(Array.from(m.toTypedArray() as Uint8Array)).toEqual([1, 0, 1]);
    expect(s.shape).toEqual([]);
    expect(s.ndim).toBe(0);
    expect(Array.from(s.toTypedArray() as Int8Array)).toEqual([-5]);
    expect(z.shape).toEqual([2, 0, 3]);
    expect(z.nbytes).toBe(0);
    expect(z.toTypedArray().length).toBe(0);
    expect(Array.from(z2.toFloat32Array())).toEqual([0, 0, 0, 0]);
    using empty = MlxArray.fromFloat32(new Float32Array(0), [0, 4]);
    expect(empty.shape).toEqual([0, 4]);
    expect(String(f)).toBe("MlxArray(float32, [2])");
  });

  test("host-side argument errors are thrown before calling C", () => {
    expect(() => MlxArray.from(new Uint16Array(2), [2])).toThrow(/pass dtype "bfloat16" or "float16"/);
    expect(() => MlxArray.from(new Float32Array(2), [2], "int32")).toThrow(TypeError);
    expect(() => MlxArray.fromFloat32(new Float32Array(3), [2, 2])).toThrow(/3 elements, shape \[2,2\] needs 4/);
    expect(() => MlxArray.fromFloat32(new Float32Array(2), [2.5])).toThrow(RangeError);
    expect(() => MlxArray.fromFloat32(new Float32Array(0), [-1])).toThrow(RangeError);
    expect(() => MlxArray.zeros(new Array(17).fill(1))).toThrow(/at most 16/);
  });

  test("a bool byte other than 0/1 is rejected by the library", () => {
    let error: unknown;
    try {
      MlxArray.from(new Uint8Array([1, 2]), [2], "bool");
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(InvalidArgumentError);
    expect((error as InvalidArgumentError).status).toBe(2);
    expect((error as Error).message).toContain("bool element 1 holds byte 2");
  });

  test("eval() returns the array and astype() converts lazily", () => {
    using a = MlxArray.fromFloat32(new Float32Array([1.7, -2.9, 300]), [3]);
    expect(a.eval()).toBe(a);
    using i = a.astype("int32");
    expect(Array.from(i.toTypedArray() as Int32Array)).toEqual([1, -2, 300]); // truncation
    using u8 = a.astype("int8");
    expect(u8.dtype).toBe("int8");
  });
});

describe("dispose rules", () => {
  test("dispose() releases the handle; a second dispose() is a no-op", () => {
    const a = MlxArray.zeros([2]);
    expect(liveArrayCount()).toBe(1);
    a.dispose();
    expect(a.disposed).toBe(true);
    expect(liveArrayCount()).toBe(0);
    expect(() => a.dispose()).not.toThrow();
    expect(String(a)).toBe("MlxArray(disposed)");
  });

  test("a disposed array used again gives InvalidHandleError (status 10) from the library", () => {
    const a = MlxArray.fromFloat32(new Float32Array([1, 2]), [2]);
    a.dispose();
    for (const use of [() => a.shape, () => a.dtype, () => a.toTypedArray(), () => a.eval(), () => a.astype("bfloat16")]) {
      let error: unknown;
      try {
        use();
      } catch (e) {
        error = e;
      }
      expect(error).toBeInstanceOf(InvalidHandleError);
      expect((error as InvalidHandleError).status).toBe(10);
      expect((error as InvalidHandleError).statusName).toBe("MLXK_ERR_INVALID_HANDLE");
      expect((error as Error).message).toContain("is not a live mlxk_array handle");
    }
  });

  test("the C free of a freed handle gives MLXK_ERR_INVALID_HANDLE; NULL is a no-op", () => {
    const a = MlxArray.zeros([1]);
    const handle = a.handle;
    a.dispose();
    expect(lib.mlxk_array_free(handle)).toBe(10);
    expect(lib.mlxk_array_free(null)).toBe(0);
  });

  test("`using` disposes at the end of the block; results of a disposed array stay valid", () => {
    let cast: MlxArray;
    {
      using a = MlxArray.fromFloat32(new Float32Array([1.25, 2.5]), [2]);
      cast = a.astype("bfloat16");
    }
    expect(liveArrayCount()).toBe(1);
    expect(Array.from(cast.toFloat32Array())).toEqual([1.25, 2.5]);
    cast.dispose();
  });
});

describe("16-bit float conversions", () => {
  test("float32 -> bfloat16 bits: round to nearest even, NaN -> 0x7FC0", () => {
    const f = new Float32Array(1);
    const u = new Uint32Array(f.buffer);
    const bits = (x: number) => ((u[0] = x), f[0]!);
    expect(float32ToBfloat16Bits(1)).toBe(0x3f80);
    expect(float32ToBfloat16Bits(bits(0x3f808000))).toBe(0x3f80); // tie, even stays
    expect(float32ToBfloat16Bits(bits(0x3f818000))).toBe(0x3f82); // tie, odd rounds up
    expect(float32ToBfloat16Bits(bits(0x3f808001))).toBe(0x3f81);
    expect(float32ToBfloat16Bits(NaN)).toBe(0x7fc0);
    expect(float32ToBfloat16Bits(bits(0xffc00001))).toBe(0x7fc0); // negative NaN too
    expect(float32ToBfloat16Bits(Infinity)).toBe(0x7f80);
    expect(float32ToBfloat16Bits(-Infinity)).toBe(0xff80);
    expect(float32ToBfloat16Bits(3.4028234663852886e38)).toBe(0x7f80); // rounds past the max
    expect(float32ToBfloat16Bits(-0)).toBe(0x8000);
    expect(bfloat16BitsToFloat32(0x3f80)).toBe(1);
    expect(bfloat16BitsToFloat32(0xc040)).toBe(-3);
  });

  test("float32 -> float16 bits, including subnormals and overflow", () => {
    expect(float32ToFloat16Bits(1)).toBe(0x3c00);
    expect(float32ToFloat16Bits(65504)).toBe(0x7bff);
    expect(float32ToFloat16Bits(65520)).toBe(0x7c00); // tie at the max rounds to infinity
    expect(float32ToFloat16Bits(2 ** -24)).toBe(0x0001);
    expect(float32ToFloat16Bits(2 ** -25)).toBe(0x0000); // tie, even
    expect(float32ToFloat16Bits(3 * 2 ** -25)).toBe(0x0002); // tie, odd rounds up
    expect(float16BitsToFloat32(0x0001)).toBe(2 ** -24);
    expect(float16BitsToFloat32(0xfc00)).toBe(-Infinity);
    expect(Number.isNaN(float16BitsToFloat32(0x7e00))).toBe(true);
  });

  test("the host conversions agree bit for bit with MLX's astype", () => {
    const rng = rngFor("conversions");
    const f = new Float32Array(1);
    const u = new Uint32Array(f.buffer);
    const values: number[] = [0, -0, 1, -1, NaN, Infinity, -Infinity, 65504, 65520, 1e-8, 2 ** -24, 3 * 2 ** -25, 3.4e38];
    for (let i = 0; i < 3000; i++) {
      u[0] = (rng.next() * 2 ** 32) >>> 0; // any bit pattern, NaNs included
      values.push(f[0]!);
      values.push(rng.normal() * 10 ** rng.uniform(-9, 6));
    }
    using a = MlxArray.fromFloat32(Float32Array.from(values), [values.length]);
    using asBf16 = a.astype("bfloat16");
    using asF16 = a.astype("float16");
    const mlxBf16 = asBf16.toTypedArray() as Uint16Array;
    const mlxF16 = asF16.toTypedArray() as Uint16Array;
    const hostBf16 = toBfloat16Bits(values);
    const hostF16 = toFloat16Bits(values);
    for (let i = 0; i < values.length; i++) {
      if (mlxBf16[i] !== hostBf16[i]) throw new Error(`bf16 of ${values[i]}: MLX 0x${mlxBf16[i]!.toString(16)}, host 0x${hostBf16[i]!.toString(16)}`);
      const isNaN16 = (b: number) => (b & 0x7c00) === 0x7c00 && (b & 0x3ff) !== 0;
      if (isNaN16(mlxF16[i]!) && isNaN16(hostF16[i]!)) continue; // NaN payloads: compared as a class
      if (mlxF16[i] !== hostF16[i]) throw new Error(`f16 of ${values[i]}: MLX 0x${mlxF16[i]!.toString(16)}, host 0x${hostF16[i]!.toString(16)}`);
    }
  });
});
