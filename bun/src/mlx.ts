// The host's MLX: the version arrays are shared with (MlxArray.fromMlx / toMlx), freeing the
// host arrays toMlx hands out, and the MLX lock for hosts that use MLX on several threads.

import type { Pointer } from "bun:ffi";
import { pointerArg } from "./array";
import { check } from "./errors";
import { lib } from "./library";

/** The version of the libmlx loaded in this process, e.g. "0.32.4". MlxArray.fromMlx and
 * toMlx work only with that libmlx, when it is the version mlxkern was built against and the
 * only copy loaded (otherwise they throw UnsupportedError). */
export function mlxVersion(): string {
  return String(lib.mlxk_mlx_version());
}

/** Deletes a host array made by MlxArray.toMlx() (once; null or 0 does nothing). An array
 * that was wrapped as an mlx-c `mlx_array` is freed with mlx-c's mlx_array_free instead. */
export function mlxArrayFree(mlxArray: Pointer | number | bigint | null): void {
  check(lib.mlxk_mlx_array_free(pointerArg("mlxArray", mlxArray)));
}

/**
 * Runs `fn` holding the lock under which mlxkern builds and evaluates MLX graphs, and returns
 * its result; the lock is released when `fn` returns or throws. MLX is not safe for graph
 * building on several threads at once: a host that also uses MLX itself (e.g. mlx-c) on other
 * threads (Workers) holds this lock around that work, so it never overlaps mlxkern's. mlxkern
 * calls inside `fn` run under the same lock (it counts; nesting is fine). A host that uses MLX
 * on one thread only needs none of this.
 *
 * `fn` must be synchronous: an async function would give the lock back at its first `await`,
 * before its work is done (a returned promise is refused with a TypeError once `fn` has run).
 */
export function withMlxLock<T>(fn: () => T): T {
  if (typeof fn !== "function") throw new TypeError("mlxkern: withMlxLock takes a function");
  check(lib.mlxk_mlx_lock());
  let result: T;
  try {
    result = fn();
  } finally {
    check(lib.mlxk_mlx_unlock());
  }
  if (result instanceof Promise) {
    result.catch(() => {}); // the caller learns of it through the TypeError
    throw new TypeError("mlxkern: withMlxLock needs a synchronous function (the lock is held only until it returns)");
  }
  return result;
}
