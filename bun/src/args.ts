// Checks of scalar arguments made before calling C: bun:ffi would otherwise wrap or truncate a
// JavaScript number silently into the C type.

/** An int32_t argument: an integer in [-2^31, 2^31-1]. */
export function int32Arg(name: string, value: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < -0x80000000 || value > 0x7fffffff) {
    throw new RangeError(`mlxkern: ${name} must be an integer in [-2^31, 2^31-1], got ${String(value)}`);
  }
  return value;
}

/** A uint32_t argument: an integer in [0, 2^32-1]. */
export function uint32Arg(name: string, value: number): number {
  if (typeof value !== "number" || !Number.isInteger(value) || value < 0 || value > 0xffffffff) {
    throw new RangeError(`mlxkern: ${name} must be an integer in [0, 2^32-1], got ${String(value)}`);
  }
  return value;
}

/** A float argument (passed as C float): any number; the library checks the range it accepts. */
export function floatArg(name: string, value: number): number {
  if (typeof value !== "number") throw new TypeError(`mlxkern: ${name} must be a number, got ${typeof value}`);
  return value;
}

export const U64_MAX = (1n << 64n) - 1n;

/**
 * A uint64_t / size_t argument, returned as a bigint. The number/bigint rule: a `number` must be
 * a non-negative safe integer (at most Number.MAX_SAFE_INTEGER = 2^53-1, where every integer is
 * exact); anything else (a fraction, a negative, NaN, 2^53 or more) is a RangeError, because a
 * JavaScript number past 2^53-1 may already have been rounded. Larger values are passed as
 * `bigint`, checked against [0, 2^64-1], and reach C unchanged.
 */
export function uint64Arg(name: string, value: number | bigint): bigint {
  if (typeof value === "bigint") {
    if (value < 0n || value > U64_MAX) throw new RangeError(`mlxkern: ${name} must lie in [0, 2^64-1], got ${value}n`);
    return value;
  }
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < 0) {
    throw new RangeError(
      `mlxkern: ${name} must be a non-negative safe integer (at most 2^53-1) or a bigint, got ${String(value)}`,
    );
  }
  return BigInt(value);
}

/** A uint64 read back from C: a `number` when at most 2^53-1, else a `bigint`. */
export function uint64Result(value: bigint): number | bigint {
  return value <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(value) : value;
}
