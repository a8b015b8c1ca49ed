// The error model: every failing mlxk_ call becomes an MlxkError subclass chosen by its status,
// carrying the library's message (read from mlxk_last_error() right after the call, on the same
// thread, before any other mlxk_ call can replace it).

import { lib } from "./library";
import * as C from "./symbols.generated";

/** A failed mlxk_ call. `status` is the mlxk_status code, `statusName` its name
 * ("MLXK_ERR_SHAPE"), `message` the library's message (it names the function and argument). */
export class MlxkError extends Error {
  override name = "MlxkError";
  constructor(
    readonly status: number,
    readonly statusName: string,
    message: string,
  ) {
    super(message);
  }
}

/** MLXK_ERR_NULL_POINTER: a required pointer was NULL. */
export class NullPointerError extends MlxkError {
  override name = "NullPointerError";
}
/** MLXK_ERR_INVALID_ARGUMENT: a value outside what the function accepts. */
export class InvalidArgumentError extends MlxkError {
  override name = "InvalidArgumentError";
}
/** MLXK_ERR_SHAPE: wrong rank or a dimension that does not match. */
export class ShapeError extends MlxkError {
  override name = "ShapeError";
}
/** MLXK_ERR_DTYPE: a dtype the function does not accept. */
export class DtypeError extends MlxkError {
  override name = "DtypeError";
}
/** MLXK_ERR_UNSUPPORTED: valid, but this build or machine cannot run it (e.g. no GPU). */
export class UnsupportedError extends MlxkError {
  override name = "UnsupportedError";
}
/** MLXK_ERR_BACKEND: MLX reported an error (often only at eval/read: kernels are lazy). */
export class BackendError extends MlxkError {
  override name = "BackendError";
}
/** MLXK_ERR_OUT_OF_MEMORY: the result would exceed the memory limit; nothing was allocated. */
export class OutOfMemoryError extends MlxkError {
  override name = "OutOfMemoryError";
}
/** MLXK_ERR_BUFFER_TOO_SMALL: a destination buffer is too short. */
export class BufferTooSmallError extends MlxkError {
  override name = "BufferTooSmallError";
}
/** MLXK_ERR_PANIC: an internal panic was caught at the C boundary; the process is intact. */
export class PanicError extends MlxkError {
  override name = "PanicError";
}
/** MLXK_ERR_INVALID_HANDLE: a handle that is not live (disposed, or not made by the library). */
export class InvalidHandleError extends MlxkError {
  override name = "InvalidHandleError";
}

type ErrorClass = new (status: number, statusName: string, message: string) => MlxkError;

/** The class thrown for each status code. */
export const errorClasses: ReadonlyMap<number, ErrorClass> = new Map<number, ErrorClass>([
  [C.MLXK_ERR_NULL_POINTER, NullPointerError],
  [C.MLXK_ERR_INVALID_ARGUMENT, InvalidArgumentError],
  [C.MLXK_ERR_SHAPE, ShapeError],
  [C.MLXK_ERR_DTYPE, DtypeError],
  [C.MLXK_ERR_UNSUPPORTED, UnsupportedError],
  [C.MLXK_ERR_BACKEND, BackendError],
  [C.MLXK_ERR_OUT_OF_MEMORY, OutOfMemoryError],
  [C.MLXK_ERR_BUFFER_TOO_SMALL, BufferTooSmallError],
  [C.MLXK_ERR_PANIC, PanicError],
  [C.MLXK_ERR_INVALID_HANDLE, InvalidHandleError],
]);

/** The name of a status code, from the library ("MLXK_UNKNOWN_STATUS" for unknown codes). */
export function statusName(status: number): string {
  return String(lib.mlxk_status_name(status));
}

/** Builds the error for a failed call; `message` defaults to mlxk_last_error(). */
export function errorFor(status: number, message?: string): MlxkError {
  const text = message ?? String(lib.mlxk_last_error());
  const Class = errorClasses.get(status) ?? MlxkError;
  return new Class(status, statusName(status), text);
}

/** Throws the MlxkError for `status` unless it is MLXK_OK. Call it directly on the return
 * value of the mlxk_ call, with nothing in between, so the message is that call's. */
export function check(status: number): void {
  if (status !== C.MLXK_OK) {
    // Read the message first: statusName() is an mlxk_ call too (it never fails, so it leaves
    // the message alone, but the order keeps this correct for any future call).
    const message = String(lib.mlxk_last_error());
    throw errorFor(status, message);
  }
}
