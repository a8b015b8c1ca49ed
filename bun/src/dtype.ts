// Element types (named as mlxk_dtype's values) and host conversions for the 16-bit floats.

import * as C from "./symbols.generated";

export type Dtype = "bool" | "uint8" | "int8" | "int32" | "uint32" | "float16" | "bfloat16" | "float32";

/** mlxk_dtype code of each dtype name (values from the header). */
export const DTYPE_CODES: Readonly<Record<Dtype, number>> = {
  bool: C.MLXK_DTYPE_BOOL,
  uint8: C.MLXK_DTYPE_UINT8,
  int8: C.MLXK_DTYPE_INT8,
  int32: C.MLXK_DTYPE_INT32,
  uint32: C.MLXK_DTYPE_UINT32,
  float16: C.MLXK_DTYPE_FLOAT16,
  bfloat16: C.MLXK_DTYPE_BFLOAT16,
  float32: C.MLXK_DTYPE_FLOAT32,
};

const BY_CODE = new Map<number, Dtype>(Object.entries(DTYPE_CODES).map(([name, code]) => [code, name as Dtype]));

export function dtypeCode(dtype: Dtype): number {
  const code = DTYPE_CODES[dtype];
  if (code === undefined) throw new TypeError(`mlxkern: unknown dtype ${String(dtype)}`);
  return code;
}

export function dtypeName(code: number): Dtype {
  const name = BY_CODE.get(code);
  if (name === undefined) throw new TypeError(`mlxkern: unknown mlxk_dtype code ${code}`);
  return name;
}

/** Bytes per element. */
export function dtypeSize(dtype: Dtype): number {
  switch (dtype) {
    case "bool":
    case "uint8":
    case "int8":
      return 1;
    case "float16":
    case "bfloat16":
      return 2;
    default:
      return 4;
  }
}

/** The typed array that holds each dtype's elements on the host: 16-bit floats travel as their
 * bit patterns in a Uint16Array, bool as bytes 0/1 in a Uint8Array. */
export interface HostArrays {
  bool: Uint8Array;
  uint8: Uint8Array;
  int8: Int8Array;
  int32: Int32Array;
  uint32: Uint32Array;
  float16: Uint16Array;
  bfloat16: Uint16Array;
  float32: Float32Array;
}

export type HostArray = HostArrays[Dtype];

export function allocHost<D extends Dtype>(dtype: D, length: number): HostArrays[D] {
  switch (dtype) {
    case "bool":
    case "uint8":
      return new Uint8Array(length) as HostArrays[D];
    case "int8":
      return new Int8Array(length) as HostArrays[D];
    case "int32":
      return new Int32Array(length) as HostArrays[D];
    case "uint32":
      return new Uint32Array(length) as HostArrays[D];
    case "float16":
    case "bfloat16":
      return new Uint16Array(length) as HostArrays[D];
    case "float32":
      return new Float32Array(length) as HostArrays[D];
  }
  throw new TypeError(`mlxkern: unknown dtype ${String(dtype)}`);
}

/** The dtypes a typed array may hold, the first being the default when none is given. */
export function dtypesFor(data: ArrayBufferView): readonly Dtype[] {
  if (data instanceof Float32Array) return ["float32"];
  if (data instanceof Int32Array) return ["int32"];
  if (data instanceof Uint32Array) return ["uint32"];
  if (data instanceof Int8Array) return ["int8"];
  if (data instanceof Uint8Array) return ["uint8", "bool"];
  if (data instanceof Uint16Array) return ["bfloat16", "float16"]; // no default: see MlxArray.from
  return [];
}

// ---- 16-bit float conversions (bit patterns in Uint16Array) ----

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bfloat16 bits of one float, rounded to nearest even; every NaN becomes 0x7FC0 (MLX's
 * conversion, the upper half of the float32 quiet NaN). Infinities stay infinite and values
 * past the largest bfloat16 round to infinity. */
export function float32ToBfloat16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  if ((bits & 0x7fffffff) > 0x7f800000) return 0x7fc0;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

/** The float value of bfloat16 bits (exact). */
export function bfloat16BitsToFloat32(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0]!;
}

/** bfloat16 bits of every element, rounded to nearest even (NaN -> 0x7FC0). */
export function toBfloat16Bits(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = float32ToBfloat16Bits(values[i]!);
  return out;
}

/** Float32Array of the values of bfloat16 bits (exact). */
export function fromBfloat16Bits(bits: ArrayLike<number>): Float32Array {
  const out = new Float32Array(bits.length);
  const view = new Uint32Array(out.buffer);
  for (let i = 0; i < bits.length; i++) view[i] = (bits[i]! & 0xffff) << 16;
  return out;
}

/** `x` rounded to the nearest bfloat16 value (as a number). */
export function roundToBfloat16(x: number): number {
  return bfloat16BitsToFloat32(float32ToBfloat16Bits(x));
}

/** IEEE binary16 bits of one float (after rounding it to float32), rounded to nearest even,
 * with subnormals; NaN -> 0x7E00 (sign kept). */
export function float32ToFloat16Bits(x: number): number {
  f32[0] = x;
  const bits = u32[0]!;
  const sign = (bits >>> 16) & 0x8000;
  const exp = (bits >>> 23) & 0xff;
  const mant = bits & 0x7fffff;
  if (exp === 0xff) return sign | (mant !== 0 ? 0x7e00 : 0x7c00);
  const e = exp - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    // Subnormal half (or zero): value / 2^-24, rounded to nearest even.
    if (e < -10) return sign;
    const full = mant | 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    const rem = full & ((1 << shift) - 1);
    let q = full >>> shift;
    if (rem > half || (rem === half && (q & 1) === 1)) q++;
    return sign | q;
  }
  let h = sign | (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1) === 1)) h++; // a carry may reach infinity: correct
  return h;
}

/** The float value of binary16 bits (exact). */
export function float16BitsToFloat32(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exp = (bits >>> 10) & 0x1f;
  const mant = bits & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 0x1f) return mant !== 0 ? NaN : sign * Infinity;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

export function toFloat16Bits(values: ArrayLike<number>): Uint16Array {
  const out = new Uint16Array(values.length);
  for (let i = 0; i < values.length; i++) out[i] = float32ToFloat16Bits(values[i]!);
  return out;
}

export function fromFloat16Bits(bits: ArrayLike<number>): Float32Array {
  const out = new Float32Array(bits.length);
  for (let i = 0; i < bits.length; i++) out[i] = float16BitsToFloat32(bits[i]!);
  return out;
}
