// Finding and opening libmlxkern, and the ABI check made at load.

import { dlopen, suffix } from "bun:ffi";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { MLXK_ABI_VERSION, symbols } from "./symbols.generated";

/** The package directory (bun/). */
const PACKAGE_DIR = join(import.meta.dir, "..");

/** Where the library is looked for, in order, when MLXKERN_LIB is not set: the cargo build
 * outputs next to this package (debug first: `make build` makes it). */
export function defaultLibraryCandidates(): string[] {
  const file = `libmlxkern.${suffix}`;
  return [
    join(PACKAGE_DIR, "..", "target", "debug", file),
    join(PACKAGE_DIR, "..", "target", "release", file),
  ];
}

/** The library path to open: `MLXKERN_LIB` if set (it must exist), else the first existing
 * default candidate. Throws an Error naming every path tried. */
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
  if (!found) {
    throw new Error(
      `mlxkern: libmlxkern not found; looked at ${candidates.join(", ")}. ` +
        "Build it (`make build` in the repository root) or set MLXKERN_LIB to its path.",
    );
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
