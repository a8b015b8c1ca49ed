/*
 * mlxkern for hosts on mlx-c (MLX's C API): its `mlx_array` in and out without a copy.
 * Optional, header-only: include it after mlx-c's headers; the library itself does not depend
 * on mlx-c. An mlx-c `mlx_array` is a struct `{ void *ctx; }` whose ctx is the address of an
 * `mlx::core::array`, which is what mlxk_array_from_mlx() and mlxk_array_to_mlx() exchange.
 * The rules of those two functions apply (one libmlx in the process, the one mlxkern was built
 * against; mlxk_mlx_version() reports it).
 */
#ifndef MLXKERN_MLXC_H
#define MLXKERN_MLXC_H

#include "mlx/c/array.h"
#include "mlxkern.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A new mlxkern handle sharing the mlx-c array `arr` (which the caller keeps and frees as
 * usual with mlx_array_free). */
static inline mlxk_status mlxk_array_from_mlx_c(const mlx_array arr, mlxk_array **out) {
  return mlxk_array_from_mlx(arr.ctx, out);
}

/** A new mlx-c array sharing the handle `array`, written to `*out` on success; the caller
 * frees it with mlx_array_free. */
static inline mlxk_status mlxk_array_to_mlx_c(const mlxk_array *array, mlx_array *out) {
  void *ctx = 0;
  mlxk_status status;
  if (!out) return mlxk_array_to_mlx(array, 0); /* reports the NULL out-parameter */
  status = mlxk_array_to_mlx(array, &ctx);
  if (status == MLXK_OK) out->ctx = ctx;
  return status;
}

#ifdef __cplusplus
}
#endif

#endif /* MLXKERN_MLXC_H */
