// Finding and opening libmlxkern, and the ABI check made at load.

import { dlopen, suffix } from "bun:ffi";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { MLXK_ABI_VERSION, symbols } from "./symbols.generated";

/** The package directory (the folder holding package.json and src/). */
const PACKAGE_DIR = join(import.meta.dir, "..");

/** The npm package that carries the prebuilt library (with the MLX it runs on) for each
 * `${process.platform}-${process.arch}`. mlxkern lists them as optionalDependencies; the package
 * manager installs the one whose os, cpu and libc fields match the machine. */
export const PLATFORM_PACKAGES: Readonly<Record<string, string>> = {
  "linux-x64": "mlxkern-linux-x64-gnu",
};

/** The platform package for `platform`-`arch` (default: this process's), or undefined where
 * none is built. */
export function platformPackageName(platform: string = process.platform, arch: string = process.arch): string | undefined {
  return PLATFORM_PACKAGES[`${platform}-${arch}`];
}

/** The library file inside the installed platform package `name` (default: this machine's):
 * the path its package.json names in the field "mlxkern": { "library": ... }, relative to that
 * package. undefined when the package is not installed (or none exists for this machine). */
export function platformLibrary(name: string | undefined = platformPackageName()): string | undefined {
  if (name === undefined) return undefined;
  let manifest: string;
  try {
    manifest = fileURLToPath(import.meta.resolve(`${name}/package.json`));
  } catch {
    return undefined;
  }
  const field: unknown = JSON.parse(readFileSync(manifest, "utf8"))?.mlxkern?.library;
  if (typeof field !== "string" || field === "") {
    throw new Error(`mlxkern: ${manifest} does not name its library (expected a field "mlxkern": { "library": "<path>" })`);
  }
  return join(dirname(manifest), field);
}

/** The cargo build outputs, when this package is the repository's bun/ folder (debug first:
 * `make build` makes it); else none. */
function repositoryCandidates(): string[] {
  const root = join(PACKAGE_DIR, "..");
  if (!existsSync(join(root, "Cargo.toml"))) return [];
  const file = `libmlxkern.${suffix}`;
  return [join(root, "target", "debug", file), join(root, "target", "release", file)];
}

/** Where the library is looked for, in order, when MLXKERN_LIB is not set: the installed
 * platform package's library, then (in a checkout of the repository) the cargo build outputs. */
export function defaultLibraryCandidates(): string[] {
  const installed = platformLibrary();
  return [...(installed === undefined ? [] : [installed]), ...repositoryCandidates()];
}

/** The library path to open: `MLXKERN_LIB` if set (it must exist), else the first existing
 * default candidate. Throws an Error naming every path tried and how to get the library. */
export function findLibrary(env: Record<string, string | undefined> = process.env): string {
  const fromEnv = env.MLXKERN_LIB;
  if (fromEnv !== undefined && fromEnv !== "") {
    const path = resolve(fromEnv);
    if (!existsSync(path)) {
      throw new Error(`mlxkern: MLXKERN_LIB is set to ${fromEnv}, but no file exists there`);
    }
    return path;
  }
  const candidates = defaultLibraryCandidates();
  const found = candidates.find((p) => existsSync(p));
  if (found === undefined) {
    const name = platformPackageName();
    const looked = candidates.length > 0 ? ` Looked at ${candidates.join(", ")}.` : "";
    const remedy =
      name === undefined
        ? `No prebuilt library exists for ${process.platform}-${process.arch}: build libmlxkern (cargo build --lib in the repository) and set MLXKERN_LIB to its path.`
        : `The prebuilt library comes in the package ${name} (an optional dependency of mlxkern, installed where its os/cpu/libc fields match: Linux x64 with glibc); add it (e.g. bun add ${name}, or its packed tarball), or set MLXKERN_LIB to a libmlxkern you built.`;
    throw new Error(`mlxkern: libmlxkern not found.${looked} ${remedy}`);
  }
  return found;
}

/** Raised at load when the library's mlxk_abi_version() differs from the MLXK_ABI_VERSION of
 * the header these bindings were generated from. */
export class AbiVersionError extends Error {
  override name = "AbiVersionError";
  constructor(
    readonly libraryPath: string,
    readonly libraryAbi: number,
    readonly expectedAbi: number,
  ) {
    super(
      `mlxkern: ABI mismatch: ${libraryPath} reports mlxk_abi_version() = ${libraryAbi}, but these ` +
        `bindings were generated for MLXK_ABI_VERSION ${expectedAbi} (include/mlxkern.h). Rebuild the ` +
        "library and regenerate src/symbols.generated.ts from the same checkout.",
    );
  }
}

export type Symbols = ReturnType<typeof dlopen<typeof symbols>>["symbols"];

export interface OpenedLibrary {
  path: string;
  symbols: Symbols;
  close(): void;
}

/** Opens the library at `path` (default: {@link findLibrary}) and checks its ABI version
 * against `expectedAbiVersion` (default: the generated MLXK_ABI_VERSION); on a mismatch the
 * library is closed again and an {@link AbiVersionError} thrown. */
export function openLibrary(
  options: { path?: string; expectedAbiVersion?: number } = {},
): OpenedLibrary {
  const path = options.path ?? findLibrary();
  const expected = options.expectedAbiVersion ?? MLXK_ABI_VERSION;
  const opened = dlopen(path, symbols);
  const abi = opened.symbols.mlxk_abi_version();
  if (abi !== expected) {
    opened.close();
    throw new AbiVersionError(path, abi, expected);
  }
  return { path, symbols: opened.symbols, close: () => opened.close() };
}

/** The library every wrapper in this package calls, opened once at import. */
export const library: OpenedLibrary = openLibrary();
export const lib: Symbols = library.symbols;
