// MlxArray: one owned mlxk_array handle.

import { ptr, type Pointer } from "bun:ffi";
import {
  allocHost,
  dtypeCode,
  dtypeName,
  dtypesFor,
  dtypeSize,
  fromBfloat16Bits,
  fromFloat16Bits,
  type Dtype,
  type HostArrays,
} from "./dtype";
import { check } from "./errors";
import { lib } from "./library";
import { MLXK_MAX_NDIM } from "./symbols.generated";

// ---- leak warnings (optional) ----

let warnOnLeak = true;
let liveArrays = 0;

/** Arrays garbage-collected without dispose() print one warning each (the native handle is
 * then leaked until the process ends: the registry never frees on its own). On by default. */
export function setLeakWarnings(enabled: boolean): void {
  warnOnLeak = enabled;
}

/** How many MlxArray objects made by this process are not yet disposed. */
export function liveArrayCount(): number {
  return liveArrays;
}

const leakRegistry = new FinalizationRegistry<string>((what) => {
  if (warnOnLeak) console.warn(`mlxkern: an MlxArray (${what}) was garbage-collected without dispose(); its native handle leaked`);
});

// ---- small FFI helpers ----

/** An out-parameter slot for one pointer (`mlxk_array **`). */
export function outSlot(): BigUint64Array {
  return new BigUint64Array(1);
}

/** Reads the handle a successful call wrote into `slot`. */
function handleIn(slot: BigUint64Array): Pointer {
  return Number(slot[0]!) as Pointer;
}

/** Checks and converts a shape to int32 dims. */
function shapeArg(shape: readonly number[]): Int32Array {
  if (!Array.isArray(shape) && !(shape instanceof Int32Array)) throw new TypeError("mlxkern: shape must be an array of numbers");
  if (shape.length > MLXK_MAX_NDIM) throw new RangeError(`mlxkern: shape has ${shape.length} dimensions; at most ${MLXK_MAX_NDIM}`);
  for (const d of shape) {
    if (!Number.isInteger(d) || d < 0 || d > 0x7fffffff) throw new RangeError(`mlxkern: shape ${JSON.stringify(shape)}: dimensions must be integers in [0, 2^31-1]`);
  }
  return Int32Array.from(shape);
}

/** A raw pointer argument: a bun:ffi Pointer, a number or a bigint holding an address; null,
 * undefined and 0 pass NULL (which the library reports). */
export function pointerArg(name: string, value: Pointer | number | bigint | null | undefined): Pointer | null {
  if (value === null || value === undefined) return null;
  if (typeof value === "bigint") {
    if (value < 0n || value > BigInt(Number.MAX_SAFE_INTEGER)) {
      throw new RangeError(`mlxkern: ${name} must be an address in [0, 2^53-1], got ${value}n`);
    }
    value = Number(value);
  }
  if (typeof value !== "number") throw new TypeError(`mlxkern: ${name} must be a pointer (a number or bigint address), got ${typeof value}`);
  if (!Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(`mlxkern: ${name} must be an address in [0, 2^53-1], got ${String(value)}`);
  }
  return value === 0 ? null : (value as Pointer);
}

function elementCount(shape: readonly number[]): number {
  return shape.reduce((n, d) => n * d, 1);
}

/** A pointer argument for a host buffer, or null for an empty one (bun:ffi refuses a pointer to
 * zero bytes; the C API accepts NULL there). */
function bufferArg(view: ArrayInit | BigUint64Array): Pointer | null {
  return view.byteLength === 0 ? null : ptr(view);
}

export type ArrayInit = Float32Array | Uint16Array | Int32Array | Uint32Array | Uint8Array | Int8Array;

/**
 * An MLX array owned by JavaScript: one mlxk_array handle, released by dispose() (or a `using`
 * declaration). Arrays are lazy: kernels return at once, and computation happens at eval() or
 * toTypedArray(), where computation errors are reported.
 *
 * Dispose rules: call dispose() exactly when you no longer need the array; a second dispose()
 * is a no-op. A disposed array keeps its (dead) handle: any later use goes to the library, which
 * rejects it with InvalidHandleError (handles are never reused, so this is always safe).
 * Results already computed from a disposed array stay valid.
 */
export class MlxArray {
  #handle: Pointer;
  #disposed = false;

  /** Wraps a handle the caller owns (as returned through an `mlxk_array **` out-parameter). */
  constructor(handle: Pointer | number, what = "array") {
    this.#handle = handle as Pointer;
    liveArrays++;
    leakRegistry.register(this, what, this);
  }

  /** The raw handle, for calling the symbols directly (it stays owned by this object). */
  get handle(): Pointer {
    return this.#handle;
  }

  get disposed(): boolean {
    return this.#disposed;
  }

  /** Copies host data into a new array of `shape`. `data` is row-major with exactly
   * product(shape) elements. The dtype follows the typed array: Float32Array float32,
   * Int32Array int32, Uint32Array uint32, Int8Array int8, Uint8Array uint8 (or "bool": bytes 0
   * and 1 only); a Uint16Array holds 16-bit float bits and needs dtype "bfloat16" or "float16". */
  static from(data: ArrayInit, shape: readonly number[], dtype?: Dtype): MlxArray {
    const allowed = dtypesFor(data);
    if (allowed.length === 0) throw new TypeError("mlxkern: data must be a Float32Array, Uint16Array, Int32Array, Uint32Array, Uint8Array or Int8Array");
    if (dtype === undefined) {
      if (data instanceof Uint16Array) throw new TypeError('mlxkern: a Uint16Array holds 16-bit float bits: pass dtype "bfloat16" or "float16"');
      dtype = allowed[0]!;
    } else if (!allowed.includes(dtype)) {
      throw new TypeError(`mlxkern: a ${data.constructor.name} cannot hold ${dtype} data (it holds ${allowed.join(" or ")})`);
    }
    const dims = shapeArg(shape);
    const count = elementCount(shape);
    if (data.length !== count) {
      throw new RangeError(`mlxkern: data has ${data.length} elements, shape ${JSON.stringify(shape)} needs ${count}`);
    }
    const out = outSlot();
    check(lib.mlxk_array_new(bufferArg(data), bufferArg(dims), dims.length, dtypeCode(dtype), out));
    return new MlxArray(handleIn(out), dtype);
  }

  static fromFloat32(data: Float32Array, shape: readonly number[]): MlxArray {
    return MlxArray.from(data, shape, "float32");
  }

  /** bfloat16 or float16 data given as bit patterns (see toBfloat16Bits / toFloat16Bits). */
  static fromBits(data: Uint16Array, shape: readonly number[], dtype: "bfloat16" | "float16"): MlxArray {
    return MlxArray.from(data, shape, dtype);
  }

  static fromInt32(data: Int32Array, shape: readonly number[]): MlxArray {
    return MlxArray.from(data, shape, "int32");
  }

  static fromUint8(data: Uint8Array, shape: readonly number[], dtype: "uint8" | "bool" = "uint8"): MlxArray {
    return MlxArray.from(data, shape, dtype);
  }

  static fromBool(data: Uint8Array | readonly boolean[], shape: readonly number[]): MlxArray {
    const bytes = data instanceof Uint8Array ? data : Uint8Array.from(data, (b) => (b ? 1 : 0));
    return MlxArray.from(bytes, shape, "bool");
  }

  static fromInt8(data: Int8Array, shape: readonly number[]): MlxArray {
    return MlxArray.from(data, shape, "int8");
  }

  /**
   * A new array sharing the host's MLX array at `mlxArray`: the address of an
   * `mlx::core::array`, e.g. the `ctx` of an mlx-c `mlx_array` (a one-pointer struct; bun:ffi
   * code on mlx-c holds it as that pointer). Nothing is copied: the two are the same MLX array
   * (same buffer; an unevaluated host node stays lazy and becomes an input of the kernels).
   * Views (transposed, broadcast, sliced) are accepted.
   *
   * The host keeps its array and frees it as usual (e.g. mlx_array_free): the data lives while
   * either side holds it. The returned MlxArray is yours (dispose it).
   *
   * Only with the libmlx mlxkern was built against, loaded once in the process (mlxVersion()
   * names it): a second libmlx file, an MLX compiled into another binary (found on Linux
   * through its ELF symbol table unless stripped; see docs/hosts/bun.md) or another version throws
   * UnsupportedError. An address that is not an
   * `mlx::core::array` cannot be detected (undefined behaviour, as for any raw pointer).
   * Throws NullPointerError for null or 0, DtypeError for dtypes without an mlxkern dtype
   * (float64, int64, ...), ShapeError past MLXK_MAX_NDIM dimensions; TypeError / RangeError
   * for something that is not a pointer, before C is called.
   */
  static fromMlx(mlxArray: Pointer | number | bigint | null): MlxArray {
    const out = outSlot();
    check(lib.mlxk_array_from_mlx(pointerArg("mlxArray", mlxArray), out));
    return new MlxArray(handleIn(out), "fromMlx");
  }

  static zeros(shape: readonly number[], dtype: Dtype = "float32"): MlxArray {
    const dims = shapeArg(shape);
    const out = outSlot();
    check(lib.mlxk_array_zeros(bufferArg(dims), dims.length, dtypeCode(dtype), out));
    return new MlxArray(handleIn(out), dtype);
  }

  get ndim(): number {
    const n = new BigUint64Array(1);
    check(lib.mlxk_array_ndim(this.#handle, n));
    return Number(n[0]!);
  }

  get shape(): number[] {
    const dims = new Int32Array(MLXK_MAX_NDIM);
    check(lib.mlxk_array_shape(this.#handle, dims, dims.length));
    return Array.from(dims.subarray(0, this.ndim));
  }

  get dtype(): Dtype {
    const code = new Int32Array(1);
    check(lib.mlxk_array_dtype(this.#handle, code));
    return dtypeName(code[0]!);
  }

  /** Bytes of the data (elements times the dtype size). */
  get nbytes(): number {
    const n = new BigUint64Array(1);
    check(lib.mlxk_array_nbytes(this.#handle, n));
    return Number(n[0]!);
  }

  /** Number of elements. */
  get size(): number {
    const dtype = this.dtype;
    return this.nbytes / dtypeSize(dtype);
  }

  /** Computes the array now; computation errors of the kernels behind it are thrown here. */
  eval(): this {
    check(lib.mlxk_array_eval(this.#handle));
    return this;
  }

  /** Evaluates and copies the elements out, row-major, in the dtype's host array (16-bit floats
   * as bit patterns in a Uint16Array, bool as bytes 0/1). */
  toTypedArray(): HostArrays[Dtype] {
    const dtype = this.dtype;
    const nbytes = this.nbytes;
    const out = allocHost(dtype, nbytes / dtypeSize(dtype));
    check(lib.mlxk_array_read(this.#handle, bufferArg(out), out.byteLength));
    return out;
  }

  /** Evaluates and reads a float array (float32, bfloat16 or float16) as Float32Array values. */
  toFloat32Array(): Float32Array {
    const dtype = this.dtype;
    const data = this.toTypedArray();
    switch (dtype) {
      case "float32":
        return data as Float32Array;
      case "bfloat16":
        return fromBfloat16Bits(data as Uint16Array);
      case "float16":
        return fromFloat16Bits(data as Uint16Array);
      default:
        return Float32Array.from(data as ArrayLike<number>);
    }
  }

  /** A lazy copy converted to `dtype` (MLX's rules: round to nearest even; float to integer
   * truncates). */
  astype(dtype: Dtype): MlxArray {
    const out = outSlot();
    check(lib.mlxk_array_astype(this.#handle, dtypeCode(dtype), out));
    return new MlxArray(handleIn(out), dtype);
  }

  /**
   * A new host MLX array sharing this one: the address of a heap `mlx::core::array` (no copy;
   * a kernel's unevaluated result stays lazy, and the host's evaluation computes it). Wrap it
   * as an mlx-c `mlx_array` (its `ctx`) to feed it to mlx-c ops.
   *
   * Ownership: the pointer is the caller's, and is not tracked by this object or the leak
   * warnings. Release it exactly once, with mlxArrayFree(pointer) or mlx-c's mlx_array_free on
   * the `mlx_array` that wraps it. This MlxArray stays yours too (dispose it when done; the
   * host's array keeps the data alive). Throws InvalidHandleError on a disposed array,
   * UnsupportedError as fromMlx.
   */
  toMlx(): Pointer {
    const out = outSlot();
    check(lib.mlxk_array_to_mlx(this.#handle, out));
    return handleIn(out);
  }

  /** Releases the handle. A second call does nothing. */
  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    liveArrays--;
    leakRegistry.unregister(this);
    check(lib.mlxk_array_free(this.#handle));
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  toString(): string {
    if (this.#disposed) return "MlxArray(disposed)";
    return `MlxArray(${this.dtype}, [${this.shape.join(", ")}])`;
  }
}

/** Wraps the handle in an out-parameter slot a successful call filled. */
export function adopt(slot: BigUint64Array, what: string): MlxArray {
  return new MlxArray(handleIn(slot), what);
}

/** The handle of an optional argument: null/undefined pass NULL. */
export function optionalHandle(a: MlxArray | null | undefined): Pointer | null {
  return a == null ? null : handleOf(a);
}

/** The handle of a required argument, checking it is an MlxArray. */
export function handleOf(a: MlxArray, name = "argument"): Pointer {
  if (!(a instanceof MlxArray)) throw new TypeError(`mlxkern: ${name} must be an MlxArray`);
  return a.handle;
}
