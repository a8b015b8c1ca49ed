/*
 * include/mlxkern.h as a C11 translation unit sees it: self-contained (included first), safe to
 * include twice, and declaring the contract's signatures (docs/DESIGN.md §5). Built by tests/c/run.sh
 * with -std=c11 -Wall -Wextra -Werror -pedantic, linked to the library and run.
 */
#include "mlxkern.h"
#include "mlxkern.h" /* the include guard makes a second include a no-op */

#include <stdio.h>
#include <string.h>

_Static_assert(sizeof(mlxk_status) == 4, "mlxk_status is int32_t");
_Static_assert(sizeof(mlxk_dtype) == 4, "mlxk_dtype is int32_t");
_Static_assert(sizeof(mlxk_device) == 4, "mlxk_device is int32_t");
_Static_assert(MLXK_OK == 0 && MLXK_ERR_NULL_POINTER == 1 && MLXK_ERR_INVALID_ARGUMENT == 2 &&
                   MLXK_ERR_SHAPE == 3 && MLXK_ERR_DTYPE == 4 && MLXK_ERR_UNSUPPORTED == 5 &&
                   MLXK_ERR_BACKEND == 6 && MLXK_ERR_OUT_OF_MEMORY == 7 &&
                   MLXK_ERR_BUFFER_TOO_SMALL == 8 && MLXK_ERR_PANIC == 9 &&
                   MLXK_ERR_INVALID_HANDLE == 10,
               "status codes");
_Static_assert(MLXK_DTYPE_BOOL == 0 && MLXK_DTYPE_FLOAT32 == 7, "dtype codes");
_Static_assert(MLXK_MAX_NDIM >= 4, "room for [B, T, H, D]");
_Static_assert(MLXK_ABI_VERSION >= 1, "ABI version");

#ifdef MLXK_GLM52_EXPERT_SLOT_ALIGNMENT
_Static_assert(MLXK_GLM52_EXPERT_SLOT_ALIGNMENT == 16384, "16 KiB slots");
_Static_assert(sizeof(mlxk_glm52_layout) == 9 * sizeof(uint64_t), "nine uint64_t fields");
#endif

/* Assigning each function to a pointer of the contract's type fails to compile (an
 * incompatible-pointer-types error) if a signature drifts. */
static mlxk_status (*const new_fn)(const void *, const int32_t *, size_t, mlxk_dtype,
                                   mlxk_array **) = mlxk_array_new;
static mlxk_status (*const zeros_fn)(const int32_t *, size_t, mlxk_dtype, mlxk_array **) =
    mlxk_array_zeros;
static mlxk_status (*const free_fn)(mlxk_array *) = mlxk_array_free;
static mlxk_status (*const shape_fn)(const mlxk_array *, int32_t *, size_t) = mlxk_array_shape;
static mlxk_status (*const read_fn)(const mlxk_array *, void *, size_t) = mlxk_array_read;
static mlxk_status (*const update_fn)(const mlxk_array *, const mlxk_array *, const mlxk_array *,
                                      const mlxk_array *, const mlxk_array *, const mlxk_array *,
                                      const mlxk_array *, const mlxk_array *, const mlxk_array *,
                                      mlxk_array **, mlxk_array **) = mlxk_gated_delta_update;
static mlxk_status (*const g_fn)(const mlxk_array *, const mlxk_array *, const mlxk_array *,
                                 mlxk_array **) = mlxk_compute_g;
static const char *(*const last_error_fn)(void) = mlxk_last_error;
static uint32_t (*const abi_fn)(void) = mlxk_abi_version;

int main(void) {
    if (new_fn == NULL || zeros_fn == NULL || free_fn == NULL || shape_fn == NULL ||
        read_fn == NULL || update_fn == NULL || g_fn == NULL || last_error_fn == NULL) {
        return 1;
    }
    mlxk_array *none = NULL;
    if (mlxk_array_free(none) != MLXK_OK || abi_fn() != MLXK_ABI_VERSION ||
        strcmp(mlxk_version(), MLXK_VERSION) != 0) {
        fprintf(stderr, "header_c: the library disagrees with the header\n");
        return 1;
    }
    printf("header_c: mlxkern %s, ABI %u, %s\n", mlxk_version(), abi_fn(),
           mlxk_status_name(MLXK_ERR_SHAPE));
    return 0;
}
