// Loading: the library lookup, the ABI version check, and the generated symbol table staying in
// sync with include/mlxkern.h.

import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { DEFAULT_HEADER, GENERATED_FILE, generate, parseHeader } from "../scripts/gen-symbols";
import {
  AbiVersionError,
  abiVersion,
  constants,
  defaultLibraryCandidates,
  findLibrary,
  lib,
  library,
  openLibrary,
  version,
} from "../src/index";
import { MLXK_ABI_VERSION, MLXK_VERSION, symbols } from "../src/symbols.generated";

const PACKAGE_DIR = join(import.meta.dir, "..");

/** Runs `code` in a fresh Bun process from the package directory with `env` added. */
function runBun(code: string, env: Record<string, string>) {
  const proc = Bun.spawnSync([process.execPath, "-e", code], {
    cwd: PACKAGE_DIR,
    env: { ...process.env, ...env },
    stdout: "pipe",
    stderr: "pipe",
  });
  return { exitCode: proc.exitCode, stdout: proc.stdout.toString(), stderr: proc.stderr.toString() };
}

describe("ABI version", () => {
  test("the loaded library reports the header's MLXK_ABI_VERSION and version", () => {
    expect(abiVersion()).toBe(MLXK_ABI_VERSION);
    expect(version()).toBe(MLXK_VERSION);
    expect(constants.MLXK_ABI_VERSION).toBe(MLXK_ABI_VERSION);
  });

  test("a mismatch throws AbiVersionError with both versions and the path", () => {
    let error: unknown;
    try {
      openLibrary({ path: library.path, expectedAbiVersion: MLXK_ABI_VERSION + 1 });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(AbiVersionError);
    const e = error as AbiVersionError;
    expect(e.libraryAbi).toBe(MLXK_ABI_VERSION);
    expect(e.expectedAbi).toBe(MLXK_ABI_VERSION + 1);
    expect(e.message).toContain(`reports mlxk_abi_version() = ${MLXK_ABI_VERSION}`);
    expect(e.message).toContain(`generated for MLXK_ABI_VERSION ${MLXK_ABI_VERSION + 1}`);
    expect(e.message).toContain(library.path);
    // The library stays usable through the module's own handle.
    expect(lib.mlxk_abi_version()).toBe(MLXK_ABI_VERSION);
  });

  test("a matching second open works and can be closed", () => {
    const again = openLibrary({ path: library.path });
    expect(again.symbols.mlxk_abi_version()).toBe(MLXK_ABI_VERSION);
    again.close();
  });
});

describe("library lookup", () => {
  test("MLXKERN_LIB wins; else target/debug, then target/release", () => {
    expect(findLibrary({ MLXKERN_LIB: library.path })).toBe(library.path);
    const [debug, release] = defaultLibraryCandidates();
    expect(debug).toMatch(/target[\\/]debug[\\/]libmlxkern\.(so|dylib|dll)$/);
    expect(release).toMatch(/target[\\/]release[\\/]libmlxkern\.(so|dylib|dll)$/);
    expect(defaultLibraryCandidates()).toContain(findLibrary({}));
  });

  test("a missing MLXKERN_LIB is a clear error, not a fallback", () => {
    expect(() => findLibrary({ MLXKERN_LIB: "/nonexistent/libmlxkern.so" })).toThrow(
      "MLXKERN_LIB is set to /nonexistent/libmlxkern.so, but no file exists there",
    );
    const run = runBun('await import("./src/index.ts")', { MLXKERN_LIB: "/nonexistent/libmlxkern.so" });
    expect(run.exitCode).not.toBe(0);
    expect(run.stderr).toContain("MLXKERN_LIB is set to /nonexistent/libmlxkern.so");
  });

  test("MLXKERN_LIB pointing at the library loads it in a fresh process", () => {
    const run = runBun('const m = await import("./src/index.ts"); console.log(m.library.path, m.abiVersion())', {
      MLXKERN_LIB: library.path,
    });
    expect(run.stderr).toBe("");
    expect(run.stdout.trim()).toBe(`${library.path} ${MLXK_ABI_VERSION}`);
  });
});

describe("symbol table", () => {
  const header = readFileSync(DEFAULT_HEADER, "utf8");

  test("src/symbols.generated.ts equals a fresh generation from include/mlxkern.h", () => {
    const committed = readFileSync(GENERATED_FILE, "utf8");
    if (committed !== generate(header)) {
      throw new Error("src/symbols.generated.ts is stale: run `bun scripts/gen-symbols.ts` in bun/");
    }
  });

  test("every prototype in the header is in the table, and every symbol resolves", () => {
    // An independent count: lines that declare a function (a type, then mlxk_name, then "(").
    const declared = header
      .split("\n")
      .map((line) => /^[A-Za-z_][\w\s*]*?\b(mlxk_\w+)\(/.exec(line)?.[1])
      .filter((name): name is string => name !== undefined);
    expect(declared.length).toBeGreaterThan(20);
    expect(Object.keys(symbols).sort()).toEqual([...declared].sort());
    for (const name of declared) expect(typeof (lib as Record<string, unknown>)[name]).toBe("function");
  });

  test("types map as documented; the layout struct is 72 bytes of uint64", () => {
    expect(symbols.mlxk_array_new.args).toEqual(["ptr", "ptr", "usize", "i32", "ptr"]);
    expect(symbols.mlxk_glm52_layout_canonical.args).toEqual(["u64", "u64", "u32", "u32", "ptr"]);
    expect(symbols.mlxk_gated_rms_norm.args[3]).toBe("f32");
    expect(symbols.mlxk_last_error.returns).toBe("cstring");
    expect(symbols.mlxk_abi_version.returns).toBe("u32");
    const parsed = parseHeader(header);
    const layout = parsed.structs.find((s) => s.name === "mlxk_glm52_layout")!;
    expect(layout.size).toBe(72);
    expect(layout.fields.every((f) => f.ffi === "u64")).toBe(true);
  });

  test("the generator refuses what bun:ffi cannot express", () => {
    const byValue = "typedef struct s { uint64_t a; } s;\nint32_t mlxk_f(s value);\n#define MLXK_ABI_VERSION 1\n";
    expect(() => generate(byValue)).toThrow(/passed by value/);
    const unknown = "#define MLXK_ABI_VERSION 1\nint32_t mlxk_f(long double x);\n";
    expect(() => generate(unknown)).toThrow(/cannot parse type|unknown type/);
    expect(() => generate("int32_t mlxk_f(void);\n")).toThrow(/MLXK_ABI_VERSION/);
  });
});
