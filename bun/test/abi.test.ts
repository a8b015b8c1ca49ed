// Loading: the library lookup, the ABI version check, and the generated symbol table staying in
// sync with include/mlxkern.h.

import { describe, expect, test } from "bun:test";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
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
  PLATFORM_PACKAGES,
  platformLibrary,
  platformPackageName,
  version,
} from "../src/index";
import { MLXK_ABI_VERSION, MLXK_VERSION, symbols } from "../src/symbols.generated";

const PACKAGE_DIR = join(import.meta.dir, "..");

/** Runs `code` in a fresh Bun process from `cwd` (default: the package directory) with `env`
 * added; `MLXKERN_LIB: undefined` removes it. */
function runBun(code: string, env: Record<string, string | undefined>, cwd = PACKAGE_DIR) {
  const proc = Bun.spawnSync([process.execPath, "-e", code], {
    cwd,
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
  test("MLXKERN_LIB wins; in the repository (no platform package installed), target/debug, then target/release", () => {
    expect(findLibrary({ MLXKERN_LIB: library.path })).toBe(library.path);
    expect(platformLibrary()).toBeUndefined();
    const [debug, release, ...rest] = defaultLibraryCandidates();
    expect(debug).toMatch(/target[\\/]debug[\\/]libmlxkern\.(so|dylib|dll)$/);
    expect(release).toMatch(/target[\\/]release[\\/]libmlxkern\.(so|dylib|dll)$/);
    expect(rest).toEqual([]);
    if ([debug, release].some((path) => path !== undefined && existsSync(path))) {
      expect(defaultLibraryCandidates()).toContain(findLibrary({}));
    } else {
      // Only MLXKERN_LIB named the library this run loaded.
      expect(() => findLibrary({})).toThrow(`libmlxkern not found. Looked at ${debug}, ${release}.`);
    }
  });

  test("one platform package per built platform; none elsewhere", () => {
    expect(platformPackageName("linux", "x64")).toBe("mlxkern-linux-x64-gnu");
    expect(platformPackageName("darwin", "arm64")).toBeUndefined();
    expect(platformPackageName("linux", "arm64")).toBeUndefined();
    expect(Object.values(PLATFORM_PACKAGES)).toEqual(["mlxkern-linux-x64-gnu"]);
    expect(platformLibrary(undefined)).toBeUndefined();
    expect(platformLibrary("mlxkern-no-such-platform")).toBeUndefined();
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

// A project outside the repository with the package installed as a package manager lays it out:
// node_modules/mlxkern (package.json, src/) beside node_modules/<platform package> (package.json,
// lib/ holding the library, here a link to the built one).
describe.if(platformPackageName() !== undefined)("installed in a project", () => {
  const platform = platformPackageName() ?? "";
  const load = 'const m = await import("mlxkern"); console.log(m.library.path, m.abiVersion())';

  function project(manifest: object | null): { dir: string; libraryPath: string } {
    const dir = mkdtempSync(join(tmpdir(), "mlxkern-bun-install-"));
    const modules = join(dir, "node_modules");
    mkdirSync(join(modules, "mlxkern"), { recursive: true });
    cpSync(join(PACKAGE_DIR, "package.json"), join(modules, "mlxkern", "package.json"));
    cpSync(join(PACKAGE_DIR, "src"), join(modules, "mlxkern", "src"), { recursive: true });
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "consumer", private: true }));
    const libraryPath = join(modules, platform, "lib", "libmlxkern.so.1");
    if (manifest !== null) {
      mkdirSync(join(modules, platform, "lib"), { recursive: true });
      writeFileSync(join(modules, platform, "package.json"), JSON.stringify({ name: platform, version: "0.0.0", ...manifest }));
      symlinkSync(library.path, libraryPath);
    }
    return { dir, libraryPath };
  }

  test("the platform package's library loads without MLXKERN_LIB", () => {
    const { dir, libraryPath } = project({ mlxkern: { library: "lib/libmlxkern.so.1" } });
    try {
      const run = runBun(load, { MLXKERN_LIB: undefined }, dir);
      expect(run.stderr).toBe("");
      expect(run.stdout.trim()).toBe(`${libraryPath} ${MLXK_ABI_VERSION}`);
      // MLXKERN_LIB still wins over it.
      const over = runBun(load, { MLXKERN_LIB: library.path }, dir);
      expect(over.stdout.trim()).toBe(`${library.path} ${MLXK_ABI_VERSION}`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("without the platform package, the error names it (and no repository paths)", () => {
    const { dir } = project(null);
    try {
      const run = runBun(load, { MLXKERN_LIB: undefined }, dir);
      expect(run.exitCode).not.toBe(0);
      expect(run.stderr).toContain(`libmlxkern not found. The prebuilt library comes in the package ${platform}`);
      expect(run.stderr).not.toContain("target");
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  test("a platform package that does not name its library is an error naming the field", () => {
    const { dir } = project({});
    try {
      const run = runBun(load, { MLXKERN_LIB: undefined }, dir);
      expect(run.exitCode).not.toBe(0);
      expect(run.stderr).toContain(`${platform}/package.json does not name its library`);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
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
