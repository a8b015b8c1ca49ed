// Devices, memory limits and version information.

import { uint64Arg, uint64Result } from "./args";
import { check } from "./errors";
import { lib } from "./library";
import * as C from "./symbols.generated";

export type Device = "cpu" | "gpu";
export type GpuBackend = "none" | "metal" | "cuda";

/** Sets the device later kernel calls run on (process-wide). "gpu" needs a Metal GPU: without
 * one it throws UnsupportedError and the default stays as it was. */
export function setDefaultDevice(device: Device): void {
  const code = device === "cpu" ? C.MLXK_DEVICE_CPU : device === "gpu" ? C.MLXK_DEVICE_GPU : undefined;
  if (code === undefined) throw new TypeError(`mlxkern: device must be "cpu" or "gpu", got ${String(device)}`);
  check(lib.mlxk_set_default_device(code));
}

/** The GPU backend of the loaded MLX. */
export function gpuBackend(): GpuBackend {
  const kind = lib.mlxk_gpu_backend();
  if (kind === C.MLXK_GPU_METAL) return "metal";
  if (kind === C.MLXK_GPU_CUDA) return "cuda";
  return "none";
}

/** Sets the most bytes one call may produce (requests above it throw OutOfMemoryError before
 * anything is allocated); 0 restores the default, the machine's physical memory. `bytes`
 * follows the number/bigint rule (see uint64Arg). */
export function setMemoryLimit(bytes: number | bigint): void {
  check(lib.mlxk_set_memory_limit(uint64Arg("bytes", bytes)));
}

/** The current memory limit in bytes (a number when at most 2^53-1, else a bigint). */
export function getMemoryLimit(): number | bigint {
  const out = new BigUint64Array(1);
  check(lib.mlxk_get_memory_limit(out));
  return uint64Result(out[0]!);
}

/** Sets how many bytes of freed buffers MLX keeps cached for reuse. */
export function setCacheLimit(bytes: number | bigint): void {
  check(lib.mlxk_set_cache_limit(uint64Arg("bytes", bytes)));
}

/** The loaded library's version, e.g. "0.1.0". */
export function version(): string {
  return String(lib.mlxk_version());
}

/** The loaded library's C ABI version (checked against MLXK_ABI_VERSION at load). */
export function abiVersion(): number {
  return lib.mlxk_abi_version();
}
