// mlxkern for Bun: bun:ffi bindings to libmlxkern (Gated DeltaNet kernels on MLX, arrays shared
// with a host's MLX, and the GLM-5.2 expert-slot layout). The library is found and opened at
// import (MLXKERN_LIB, else the installed platform package mlxkern-<platform>-<arch>-<libc>,
// else, in a checkout of the repository, ../target/{debug,release}/libmlxkern.{so,dylib}), and
// its ABI version checked.

export {
  AbiVersionError,
  defaultLibraryCandidates,
  findLibrary,
  lib,
  library,
  openLibrary,
  PLATFORM_PACKAGES,
  platformLibrary,
  platformPackageName,
} from "./library";
export type { OpenedLibrary, Symbols } from "./library";
export {
  BackendError,
  BufferTooSmallError,
  check,
  DtypeError,
  errorClasses,
  errorFor,
  InvalidArgumentError,
  InvalidHandleError,
  MlxkError,
  NullPointerError,
  OutOfMemoryError,
  PanicError,
  ShapeError,
  statusName,
  UnsupportedError,
} from "./errors";
export {
  bfloat16BitsToFloat32,
  DTYPE_CODES,
  dtypeSize,
  float16BitsToFloat32,
  float32ToBfloat16Bits,
  float32ToFloat16Bits,
  fromBfloat16Bits,
  fromFloat16Bits,
  roundToBfloat16,
  toBfloat16Bits,
  toFloat16Bits,
} from "./dtype";
export type { Dtype, HostArray, HostArrays } from "./dtype";
export { liveArrayCount, MlxArray, setLeakWarnings } from "./array";
export type { ArrayInit } from "./array";
export {
  computeG,
  gatedDeltaState,
  gatedDeltaUpdate,
  gatedDeltaUpdateChunked,
  gatedDeltaUpdateChunkedVjp,
  gatedDeltaUpdateFromConv,
  gatedDeltaUpdateVjp,
  gatedRmsNorm,
  gatedRmsNormVjp,
  siluRmsHeads,
  siluRmsHeadsVjp,
} from "./kernels";
export type {
  GatedDeltaGradients,
  GatedDeltaResult,
  GatedRmsNormGradients,
  HeadSplit,
  HeadSplitGradients,
} from "./kernels";
export {
  gatedDeltaCommitTreePool,
  gatedDeltaStatePool,
  gatedDeltaUpdateFromConvPool,
  gatedDeltaUpdatePacked,
  gatedDeltaUpdatePackedChunked,
  gatedDeltaUpdatePool,
  gatedDeltaUpdatePoolChunked,
  gatedDeltaVerifyPool,
  gatedDeltaVerifyTreePool,
} from "./pool";
export type { FreshInit, GatedDeltaPoolResult, Int32Init } from "./pool";
export { GLM52_LAYOUT_KEYS, glm52Canonical, glm52Validate } from "./glm52";
export type { Glm52Layout, U64 } from "./glm52";
export { mlxArrayFree, mlxVersion, withMlxLock } from "./mlx";
export { abiVersion, getMemoryLimit, gpuBackend, setCacheLimit, setDefaultDevice, setMemoryLimit, version } from "./device";
export type { Device, GpuBackend } from "./device";
export { uint64Arg, uint64Result } from "./args";
export * as constants from "./symbols.generated";
