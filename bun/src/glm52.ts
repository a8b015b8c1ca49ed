// The GLM-5.2 expert-slot layout: canonical layout and validation (pure arithmetic in C).
//
// The nine fields are uint64_t in C. The number/bigint rule: each field is returned as a
// `number` when it is at most 2^53-1 (Number.MAX_SAFE_INTEGER, where numbers are exact) and as
// a `bigint` otherwise; inputs may be either, but a `number` must be a non-negative safe
// integer (a RangeError is thrown before any C call otherwise): pass larger values as bigint.
// The C validator itself rejects any field above 2^53-1 (InvalidArgumentError).

import { ptr } from "bun:ffi";
import { uint32Arg, uint64Arg, uint64Result } from "./args";
import { check } from "./errors";
import { lib } from "./library";
import { mlxk_glm52_layout_struct as LAYOUT } from "./symbols.generated";

export type U64 = number | bigint;

/** One expert slot's layout; byte offsets are from the start of the slot. Field order is the C
 * struct's (mlxk_glm52_layout). */
export interface Glm52Layout<T extends U64 = U64> {
  hiddenSize: T;
  intermediateSize: T;
  slotBytes: T;
  downWeightOffset: T;
  gateWeightOffset: T;
  upWeightOffset: T;
  downScaleOffset: T;
  gateScaleOffset: T;
  upScaleOffset: T;
}

type Key = keyof Glm52Layout;

const camel = (snake: string) => snake.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/** [JavaScript key, byte offset] of each C field, from the generated struct description. */
const FIELDS: ReadonlyArray<readonly [Key, number]> = LAYOUT.fields.map((f) => {
  if (f.type !== "u64") throw new Error(`mlxkern: mlxk_glm52_layout.${f.name} is ${f.type}; these bindings expect uint64_t`);
  return [camel(f.name) as Key, f.offset] as const;
});

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** The keys of a layout, in C field order. */
export const GLM52_LAYOUT_KEYS: readonly Key[] = FIELDS.map(([key]) => key);

function toStruct(layout: Glm52Layout): Uint8Array {
  if (layout === null || typeof layout !== "object") throw new TypeError("mlxkern: layout must be an object");
  const bytes = new Uint8Array(LAYOUT.size);
  const view = new DataView(bytes.buffer);
  for (const [key, offset] of FIELDS) {
    const value = layout[key];
    if (value === undefined) throw new TypeError(`mlxkern: layout.${key} is missing`);
    view.setBigUint64(offset, uint64Arg(`layout.${key}`, value), LITTLE_ENDIAN);
  }
  return bytes;
}

function fromStruct(bytes: Uint8Array): Glm52Layout {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const layout = {} as Record<Key, U64>;
  for (const [key, offset] of FIELDS) layout[key] = uint64Result(view.getBigUint64(offset, LITTLE_ENDIAN));
  return layout as Glm52Layout;
}

/**
 * The canonical layout of one expert slot for hidden x intermediate in Q`bits` (4 or 8) with
 * `groupSize` (32, 64 or 128): gate, up, down weights, then gate, up, down scales, each on a
 * 16 KiB boundary. Throws InvalidArgumentError for unsupported formats or dims.
 */
export function glm52Canonical(hidden: U64, intermediate: U64, bits: number, groupSize: number): Glm52Layout {
  const out = new Uint8Array(LAYOUT.size);
  check(
    lib.mlxk_glm52_layout_canonical(
      uint64Arg("hidden", hidden),
      uint64Arg("intermediate", intermediate),
      uint32Arg("bits", bits),
      uint32Arg("groupSize", groupSize),
      ptr(out),
    ),
  );
  return fromStruct(out);
}

/**
 * Checks that `layout` is safe for the decode kernels with Q`bits` weights and `groupSize`;
 * throws InvalidArgumentError naming the field or regions at fault (e.g. "gate weight exceeds
 * the canonical expert slot", "up scale overlaps down weight"). Returns nothing when valid.
 */
export function glm52Validate(layout: Glm52Layout, bits: number, groupSize: number): void {
  const struct = toStruct(layout);
  check(lib.mlxk_glm52_layout_validate(ptr(struct), uint32Arg("bits", bits), uint32Arg("groupSize", groupSize)));
}
