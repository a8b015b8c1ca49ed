// Generates src/symbols.generated.ts (the bun:ffi symbol table, the MLXK_* constants and the
// layout of every plain-data struct) from the C header include/mlxkern.h.
//
//   bun scripts/gen-symbols.ts           rewrite src/symbols.generated.ts
//   bun scripts/gen-symbols.ts --check   exit 1 if the committed file differs from the header
//
// The header is cbindgen output, so the parser only has to understand what cbindgen writes:
// `typedef <int type> name;`, `typedef struct name name;` (opaque), `typedef struct name {...}
// name;` (plain data), `#define MLXK_* <integer or string>` and one prototype per function.
// Anything it does not understand (an unknown type, a struct passed by value) is an error, so a
// header change cannot silently produce a wrong symbol table.

import { readFileSync, writeFileSync } from "node:fs";
import { join, relative } from "node:path";

export const PACKAGE_DIR = join(import.meta.dir, "..");
export const DEFAULT_HEADER = join(PACKAGE_DIR, "..", "include", "mlxkern.h");
export const GENERATED_FILE = join(PACKAGE_DIR, "src", "symbols.generated.ts");

/** bun:ffi argument/return type names (see FFIType). */
type FfiName =
  | "void" | "bool" | "i8" | "u8" | "i16" | "u16" | "i32" | "u32" | "i64" | "u64"
  | "usize" | "isize" | "f32" | "f64" | "ptr" | "cstring";

/** C scalar types and their bun:ffi names. size_t is `usize` (bun's alias of u64: it takes a
 * number or a bigint; no function here returns one). */
const SCALARS: Record<string, FfiName> = {
  void: "void",
  bool: "bool",
  int8_t: "i8",
  uint8_t: "u8",
  int16_t: "i16",
  uint16_t: "u16",
  int32_t: "i32",
  uint32_t: "u32",
  int64_t: "i64",
  uint64_t: "u64",
  size_t: "usize",
  ptrdiff_t: "isize",
  float: "f32",
  double: "f64",
};

/** Byte sizes of the scalar types allowed in plain-data structs (natural alignment). */
const FIELD_SIZES: Record<string, number> = {
  int8_t: 1, uint8_t: 1, int16_t: 2, uint16_t: 2, int32_t: 4, uint32_t: 4, float: 4,
  int64_t: 8, uint64_t: 8, double: 8, size_t: 8,
};

/** Function-like macros cbindgen may put in front of a prototype. */
const ATTRIBUTE_MACROS = new Set(["MLXK_MUST_USE"]);

export interface Param { name: string; cType: string; ffi: FfiName }
export interface Prototype { name: string; returnCType: string; returns: FfiName; params: Param[] }
export interface StructField { name: string; cType: string; ffi: FfiName; offset: number; size: number }
export interface StructLayout { name: string; size: number; fields: StructField[] }
export interface Constant { name: string; value: number | string }
export interface Header {
  prototypes: Prototype[];
  structs: StructLayout[];
  constants: Constant[];
  opaque: string[];
}

function stripComments(text: string): string {
  return text.replace(/\/\*[\s\S]*?\*\//g, " ").replace(/\/\/[^\n]*/g, " ");
}

/** Parses the parts of the header the bindings need. */
export function parseHeader(text: string): Header {
  const constants: Constant[] = [];
  for (const m of text.matchAll(/^#define\s+(MLXK_\w+)\s+(.+?)\s*$/gm)) {
    const [, name, raw] = m as unknown as [string, string, string];
    if (/^-?\d+$/.test(raw)) constants.push({ name, value: Number(raw) });
    else if (/^"[^"\\]*"$/.test(raw)) constants.push({ name, value: raw.slice(1, -1) });
    // anything else (attribute macros) is not a constant
  }

  // Preprocessor lines and comments carry nothing else we need.
  const code = stripComments(text)
    .split("\n")
    .filter((line) => !line.trimStart().startsWith("#"))
    .join("\n")
    .replace(/extern\s+"C"\s*\{/g, " ");

  const aliases = new Map<string, string>(); // typedef name -> scalar type
  const opaque: string[] = [];
  const structs: StructLayout[] = [];

  for (const m of code.matchAll(/typedef\s+struct\s+(\w+)\s*\{([^}]*)\}\s*(\w+)\s*;/g)) {
    const [, tag, body, name] = m as unknown as [string, string, string, string];
    if (tag !== name) throw new Error(`struct ${tag} is typedef'd as ${name}; expected the same name`);
    let offset = 0;
    let align = 1;
    const fields: StructField[] = [];
    for (const decl of body.split(";").map((s) => s.trim()).filter(Boolean)) {
      const fm = /^(\w+)\s+(\w+)$/.exec(decl.replace(/\s+/g, " "));
      if (!fm) throw new Error(`struct ${name}: cannot parse field "${decl}"`);
      const [, cType, fieldName] = fm as unknown as [string, string, string];
      const size = FIELD_SIZES[cType];
      if (size === undefined) throw new Error(`struct ${name}: unsupported field type ${cType}`);
      offset = Math.ceil(offset / size) * size;
      fields.push({ name: fieldName, cType, ffi: SCALARS[cType]!, offset, size });
      offset += size;
      align = Math.max(align, size);
    }
    structs.push({ name, size: Math.ceil(offset / align) * align, fields });
  }
  for (const m of code.matchAll(/typedef\s+struct\s+(\w+)\s+(\w+)\s*;/g)) {
    const [, tag, name] = m as unknown as [string, string, string];
    if (tag !== name) throw new Error(`opaque struct ${tag} is typedef'd as ${name}`);
    opaque.push(name);
  }
  for (const m of code.matchAll(/typedef\s+(\w+)\s+(\w+)\s*;/g)) {
    const [, target, name] = m as unknown as [string, string, string];
    if (target === "struct") continue;
    const resolved = SCALARS[target] ? target : aliases.get(target);
    if (!resolved) throw new Error(`typedef ${name}: unknown type ${target}`);
    aliases.set(name, resolved);
  }

  const structNames = new Set(structs.map((s) => s.name));
  const opaqueNames = new Set(opaque);

  /** Maps one C type (without the name) to its bun:ffi type. */
  const mapType = (cTypeRaw: string, where: string, isReturn: boolean): FfiName => {
    const cType = cTypeRaw.replace(/\s+/g, " ").replace(/\s*\*\s*/g, "*").trim();
    const stars = (cType.match(/\*/g) ?? []).length;
    const base = cType.replace(/\*/g, "").split(" ").filter((t) => t !== "const" && t !== "struct" && t !== "");
    if (base.length !== 1) throw new Error(`${where}: cannot parse type "${cTypeRaw}"`);
    const name = base[0]!;
    if (stars > 0) {
      if (isReturn && stars === 1 && name === "char" && /\bconst\b/.test(cType)) return "cstring";
      if (!SCALARS[name] && !aliases.has(name) && !structNames.has(name) && !opaqueNames.has(name) && name !== "char")
        throw new Error(`${where}: pointer to unknown type ${name}`);
      return "ptr";
    }
    if (structNames.has(name) || opaqueNames.has(name))
      throw new Error(`${where}: struct ${name} passed by value (bun:ffi cannot; pass a pointer)`);
    const scalar = SCALARS[name] ?? (aliases.get(name) !== undefined ? SCALARS[aliases.get(name)!] : undefined);
    if (!scalar) throw new Error(`${where}: unknown type ${name}`);
    if (scalar === "void" && !isReturn) throw new Error(`${where}: void parameter`);
    return scalar;
  };

  const prototypes: Prototype[] = [];
  const protoRe = /([A-Za-z_][\w\s\*]*?)\b(mlxk_\w+)\s*\(([^()]*)\)\s*;/g;
  for (const m of code.matchAll(protoRe)) {
    const [, retRaw, name, paramsRaw] = m as unknown as [string, string, string, string];
    const retTokens = retRaw.replace(/\*/g, " * ").split(/\s+/).filter((t) => t && !ATTRIBUTE_MACROS.has(t));
    const returnCType = retTokens.join(" ").replace(/ \*/g, "*").replace(/\* /g, "*").replace(/\*/g, " *").trim();
    if (retTokens.includes("typedef")) continue;
    const params: Param[] = [];
    const paramText = paramsRaw.trim();
    if (paramText !== "void" && paramText !== "") {
      for (const [i, p] of paramText.split(",").entries()) {
        const pm = /^([\s\S]*?[\s\*])(\w+)\s*$/.exec(p.trim());
        if (!pm) throw new Error(`${name}: cannot parse parameter ${i} "${p.trim()}"`);
        const [, typeText, paramName] = pm as unknown as [string, string, string];
        params.push({
          name: paramName,
          cType: typeText.replace(/\s+/g, " ").replace(/\s*\*\s*/g, " *").replace(/\*\s+\*/g, "**").trim(),
          ffi: mapType(typeText, `${name}(${paramName})`, false),
        });
      }
    }
    prototypes.push({ name, returnCType, returns: mapType(retTokens.join(" "), `${name} return`, true), params });
  }
  if (prototypes.length === 0) throw new Error("no mlxk_ prototypes found in the header");
  const seen = new Set<string>();
  for (const p of prototypes) {
    if (seen.has(p.name)) throw new Error(`${p.name} is declared twice`);
    seen.add(p.name);
  }
  return { prototypes, structs, constants, opaque };
}

/** The text of src/symbols.generated.ts for `headerText` (deterministic). */
export function generate(headerText: string, headerLabel = "include/mlxkern.h"): string {
  const h = parseHeader(headerText);
  const abi = h.constants.find((c) => c.name === "MLXK_ABI_VERSION");
  if (!abi || typeof abi.value !== "number") throw new Error("the header defines no integer MLXK_ABI_VERSION");
  const out: string[] = [];
  out.push(
    `// Generated from ${headerLabel} by scripts/gen-symbols.ts. Do not edit:`,
    "// run `bun scripts/gen-symbols.ts` (test/symbols.test.ts fails when this file is stale).",
    "",
    "/* eslint-disable */",
    "",
    "// ---- #define MLXK_* constants ----",
  );
  for (const c of h.constants) {
    out.push(`export const ${c.name} = ${typeof c.value === "number" ? c.value : JSON.stringify(c.value)};`);
  }
  out.push("", "// ---- plain-data structs (passed by pointer; offsets in bytes, natural alignment) ----");
  for (const s of h.structs) {
    out.push(`export const ${s.name}_struct = {`, `  name: ${JSON.stringify(s.name)},`, `  size: ${s.size},`, "  fields: [");
    for (const f of s.fields)
      out.push(`    { name: ${JSON.stringify(f.name)}, type: ${JSON.stringify(f.ffi)}, offset: ${f.offset} },`);
    out.push("  ],", "} as const;");
  }
  out.push(
    "",
    "// ---- opaque handle types (pointers in bun:ffi) ----",
    `export const opaqueTypes = ${JSON.stringify(h.opaque)} as const;`,
    "",
    "// ---- the bun:ffi symbol table, one entry per prototype, in header order ----",
    "export const symbols = {",
  );
  for (const p of h.prototypes) {
    const sig = `${p.returnCType} ${p.name}(${p.params.map((q) => `${q.cType} ${q.name}`).join(", ") || "void"})`;
    out.push(`  // ${sig}`);
    out.push(
      `  ${p.name}: { args: [${p.params.map((q) => JSON.stringify(q.ffi)).join(", ")}], returns: ${JSON.stringify(p.returns)} },`,
    );
  }
  out.push("} as const;", "");
  out.push(
    "/** Parameter names per function, as the header spells them (for messages and docs). */",
    "export const parameterNames = {",
  );
  for (const p of h.prototypes) out.push(`  ${p.name}: [${p.params.map((q) => JSON.stringify(q.name)).join(", ")}],`);
  out.push("} as const;", "");
  return out.join("\n");
}

if (import.meta.main) {
  const check = process.argv.includes("--check");
  const headerPath = process.env.MLXKERN_HEADER ?? DEFAULT_HEADER;
  const text = generate(readFileSync(headerPath, "utf8"));
  const target = relative(process.cwd(), GENERATED_FILE);
  if (check) {
    let current = "";
    try {
      current = readFileSync(GENERATED_FILE, "utf8");
    } catch {
      // missing counts as stale
    }
    if (current !== text) {
      console.error(`${target} is stale: run \`bun scripts/gen-symbols.ts\` in bun/`);
      process.exit(1);
    }
    console.log(`${target} is up to date`);
  } else {
    writeFileSync(GENERATED_FILE, text);
    console.log(`wrote ${target}`);
  }
}
