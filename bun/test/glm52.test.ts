// The GLM-5.2 expert-slot layout: docs/DESIGN.md §4's table for GLM-5 dims, validation messages, and the
// number/bigint rule at the 2^53-1 boundary.

import { describe, expect, test } from "bun:test";
import {
  constants as C,
  GLM52_LAYOUT_KEYS,
  glm52Canonical,
  glm52Validate,
  InvalidArgumentError,
  uint64Arg,
  uint64Result,
  type Glm52Layout,
} from "../src/index";

const HIDDEN = 6144;
const INTERMEDIATE = 2048;
const MAX_SAFE = Number.MAX_SAFE_INTEGER; // 2^53 - 1

function thrown(fn: () => unknown): Error {
  try {
    fn();
  } catch (e) {
    return e as Error;
  }
  throw new Error("expected an exception");
}

type U = number | bigint;

/** Offsets in canonical order: gate w, up w, down w, gate s, up s, down s. */
function offsets(l: Glm52Layout): U[] {
  return [l.gateWeightOffset, l.upWeightOffset, l.downWeightOffset, l.gateScaleOffset, l.upScaleOffset, l.downScaleOffset];
}

describe("glm52Canonical (docs/DESIGN.md §4, GLM-5: hidden 6144, intermediate 2048)", () => {
  test("Q4 g64 offsets and slot bytes", () => {
    const l = glm52Canonical(HIDDEN, INTERMEDIATE, 4, 64);
    expect(offsets(l)).toEqual([0, 6291456, 12582912, 18874368, 19267584, 19660800]);
    expect(l.slotBytes).toBe(20054016);
    expect(l.hiddenSize).toBe(HIDDEN);
    expect(l.intermediateSize).toBe(INTERMEDIATE);
  });

  test("Q8 g64 offsets and slot bytes", () => {
    const l = glm52Canonical(HIDDEN, INTERMEDIATE, 8, 64);
    expect(offsets(l)).toEqual([0, 12582912, 25165824, 37748736, 38141952, 38535168]);
    expect(l.slotBytes).toBe(38928384);
  });

  test("slot bytes for Q4/Q8 x g32/g64/g128; every canonical layout validates", () => {
    const table: Array<[number, number, number]> = [
      [4, 32, 21233664],
      [4, 64, 20054016],
      [4, 128, 19464192],
      [8, 32, 40108032],
      [8, 64, 38928384],
      [8, 128, 38338560],
    ];
    for (const [bits, groupSize, slotBytes] of table) {
      const l = glm52Canonical(HIDDEN, INTERMEDIATE, bits, groupSize);
      expect(l.slotBytes).toBe(slotBytes);
      expect(Number(l.slotBytes) % C.MLXK_GLM52_EXPERT_SLOT_ALIGNMENT).toBe(0);
      for (const o of offsets(l)) expect(Number(o) % C.MLXK_GLM52_EXPERT_SLOT_ALIGNMENT).toBe(0);
      expect(() => glm52Validate(l, bits, groupSize)).not.toThrow();
      // All fields are safe integers, so they come back as numbers.
      for (const key of GLM52_LAYOUT_KEYS) expect(typeof l[key]).toBe("number");
    }
  });

  test("bigint inputs are accepted; results are still numbers when safe", () => {
    const l = glm52Canonical(BigInt(HIDDEN), BigInt(INTERMEDIATE), 4, 64);
    expect(l.slotBytes).toBe(20054016);
  });

  test("unsupported formats and dims -> InvalidArgumentError naming the argument", () => {
    const bits = thrown(() => glm52Canonical(HIDDEN, INTERMEDIATE, 3, 64));
    expect(bits).toBeInstanceOf(InvalidArgumentError);
    expect(bits.message).toContain("bits is 3 (expected 4 or 8)");
    expect(thrown(() => glm52Canonical(HIDDEN, INTERMEDIATE, 4, 16)).message).toContain("group_size is 16 (expected 32, 64 or 128)");
    expect(thrown(() => glm52Canonical(100, INTERMEDIATE, 4, 64))).toBeInstanceOf(InvalidArgumentError);
    // A slot beyond 2^53-1 bytes is refused by C, whatever the input type.
    const huge = thrown(() => glm52Canonical((1n << 40n), (1n << 40n), 8, 32));
    expect(huge).toBeInstanceOf(InvalidArgumentError);
  });
});

describe("glm52Validate", () => {
  const base = () => glm52Canonical(HIDDEN, INTERMEDIATE, 4, 64);

  test("messages name the field or regions at fault", () => {
    const cases: Array<[Partial<Glm52Layout>, string]> = [
      [{ slotBytes: 100 }, "slot bytes 100 must be a positive multiple of 16384"],
      [{ downScaleOffset: 19660808 }, "down scale offset is not 16-byte aligned"],
      [{ gateWeightOffset: 20054016 - 16 }, "gate weight exceeds the canonical expert slot"],
      // Canonical Q4 g64: the down weight spans [12582912, 18874368).
      [{ upScaleOffset: 12582912 }, "up scale overlaps down weight"],
    ];
    for (const [change, message] of cases) {
      const e = thrown(() => glm52Validate({ ...base(), ...change }, 4, 64));
      expect(e).toBeInstanceOf(InvalidArgumentError);
      expect((e as InvalidArgumentError).status).toBe(C.MLXK_ERR_INVALID_ARGUMENT);
      expect(e.message).toStartWith("mlxk_glm52_layout_validate: ");
      expect(e.message).toContain(message);
    }
  });

  test("the format is checked too", () => {
    expect(thrown(() => glm52Validate(base(), 4, 48)).message).toContain("group_size is 48");
    // The Q4 layout is too small for Q8 weights.
    expect(thrown(() => glm52Validate(base(), 8, 64))).toBeInstanceOf(InvalidArgumentError);
  });

  test("a field at exactly 2^53-1 reaches C unchanged (as a number) and is judged there", () => {
    const slot = thrown(() => glm52Validate({ ...base(), slotBytes: MAX_SAFE }, 4, 64));
    expect(slot).toBeInstanceOf(InvalidArgumentError);
    expect(slot.message).toContain(`slot bytes ${MAX_SAFE} must be a positive multiple of 16384`);
    const aligned = thrown(() => glm52Validate({ ...base(), upScaleOffset: MAX_SAFE }, 4, 64));
    expect(aligned.message).toContain(`up scale offset is not 16-byte aligned (${MAX_SAFE})`);
    // The largest 16-byte aligned offset: its end passes 2^53-1, and C names that range.
    const end = thrown(() => glm52Validate({ ...base(), gateWeightOffset: MAX_SAFE - 15 }, 4, 64));
    expect(end.message).toContain(`gate weight offset + length exceeds 2^53-1 (${MAX_SAFE - 15} + 6291456)`);
  });

  test("a field beyond 2^53-1 (bigint 2^53) -> InvalidArgumentError naming the range", () => {
    for (const key of GLM52_LAYOUT_KEYS) {
      const e = thrown(() => glm52Validate({ ...base(), [key]: 2n ** 53n }, 4, 64));
      expect(e).toBeInstanceOf(InvalidArgumentError);
      expect(e.message).toContain(`exceeds 2^53-1 (${2n ** 53n})`);
    }
    const max = thrown(() => glm52Validate({ ...base(), hiddenSize: (1n << 64n) - 1n }, 4, 64));
    expect(max.message).toContain("hidden size exceeds 2^53-1 (18446744073709551615)");
  });

  test("number inputs beyond the safe range, negative or fractional -> RangeError before C", () => {
    for (const bad of [2 ** 53, 2 ** 53 + 2, -16, 16.5, NaN, Infinity]) {
      const e = thrown(() => glm52Validate({ ...base(), upScaleOffset: bad }, 4, 64));
      expect(e).toBeInstanceOf(RangeError);
      expect(e.message).toContain("layout.upScaleOffset must be a non-negative safe integer");
    }
    expect(() => glm52Canonical(2 ** 53, INTERMEDIATE, 4, 64)).toThrow(RangeError);
    expect(() => glm52Canonical(HIDDEN, INTERMEDIATE, -4, 64)).toThrow(RangeError);
    expect(() => glm52Canonical(HIDDEN, INTERMEDIATE, 4, 2 ** 32)).toThrow(RangeError);
    expect(() => glm52Validate({ ...base(), slotBytes: -1n }, 4, 64)).toThrow(RangeError);
    expect(() => glm52Validate({ ...base(), slotBytes: 1n << 64n }, 4, 64)).toThrow(RangeError);
    const { slotBytes: _, ...missing } = base();
    expect(() => glm52Validate(missing as Glm52Layout, 4, 64)).toThrow(/layout.slotBytes is missing/);
  });

  test("the number/bigint rule of the converters", () => {
    expect(uint64Result(BigInt(MAX_SAFE))).toBe(MAX_SAFE);
    expect(uint64Result(2n ** 53n)).toBe(2n ** 53n);
    expect(uint64Arg("x", MAX_SAFE)).toBe(BigInt(MAX_SAFE));
    expect(uint64Arg("x", 2n ** 60n)).toBe(2n ** 60n);
    expect(() => uint64Arg("x", 2 ** 53)).toThrow(RangeError);
  });
});
