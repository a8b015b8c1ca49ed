/*
 * include/mlxkern.h as a C++17 translation unit sees it: self-contained, safe to include twice,
 * extern "C" linkage, and the contract's signatures (docs/DESIGN.md §5) checked exactly with
 * std::is_same. Built by tests/c/run.sh with -std=c++17 -Wall -Wextra -Werror -pedantic
 * -Wold-style-cast, linked to the library and run.
 */
#include "mlxkern.h"
#include "mlxkern.h"  // the include guard makes a second include a no-op

#include <cstdio>
#include <cstring>
#include <memory>
#include <type_traits>

static_assert(std::is_same<mlxk_status, int32_t>::value, "mlxk_status is int32_t");
static_assert(std::is_same<mlxk_dtype, int32_t>::value, "mlxk_dtype is int32_t");
static_assert(std::is_same<mlxk_device, int32_t>::value, "mlxk_device is int32_t");
static_assert(MLXK_ERR_INVALID_HANDLE == 10 && MLXK_DTYPE_BFLOAT16 == 6, "codes");

#define SAME_TYPE(fn, type) static_assert(std::is_same<decltype(&fn), type>::value, #fn)

SAME_TYPE(mlxk_array_new,
          mlxk_status (*)(const void *, const int32_t *, size_t, mlxk_dtype, mlxk_array **));
SAME_TYPE(mlxk_array_zeros, mlxk_status (*)(const int32_t *, size_t, mlxk_dtype, mlxk_array **));
SAME_TYPE(mlxk_array_free, mlxk_status (*)(mlxk_array *));
SAME_TYPE(mlxk_array_ndim, mlxk_status (*)(const mlxk_array *, size_t *));
SAME_TYPE(mlxk_array_shape, mlxk_status (*)(const mlxk_array *, int32_t *, size_t));
SAME_TYPE(mlxk_array_dtype, mlxk_status (*)(const mlxk_array *, mlxk_dtype *));
SAME_TYPE(mlxk_array_nbytes, mlxk_status (*)(const mlxk_array *, size_t *));
SAME_TYPE(mlxk_array_eval, mlxk_status (*)(const mlxk_array *));
SAME_TYPE(mlxk_array_read, mlxk_status (*)(const mlxk_array *, void *, size_t));
SAME_TYPE(mlxk_array_astype, mlxk_status (*)(const mlxk_array *, mlxk_dtype, mlxk_array **));
SAME_TYPE(mlxk_set_default_device, mlxk_status (*)(mlxk_device));
SAME_TYPE(mlxk_gpu_backend, mlxk_gpu_backend_kind (*)());
SAME_TYPE(mlxk_set_memory_limit, mlxk_status (*)(size_t));
SAME_TYPE(mlxk_get_memory_limit, mlxk_status (*)(size_t *));
SAME_TYPE(mlxk_set_cache_limit, mlxk_status (*)(size_t));
SAME_TYPE(mlxk_compute_g, mlxk_status (*)(const mlxk_array *, const mlxk_array *,
                                          const mlxk_array *, mlxk_array **));
SAME_TYPE(mlxk_gated_delta_update,
          mlxk_status (*)(const mlxk_array *, const mlxk_array *, const mlxk_array *,
                          const mlxk_array *, const mlxk_array *, const mlxk_array *,
                          const mlxk_array *, const mlxk_array *, const mlxk_array *,
                          mlxk_array **, mlxk_array **));
SAME_TYPE(mlxk_last_error, const char *(*)());
SAME_TYPE(mlxk_status_name, const char *(*)(mlxk_status));
SAME_TYPE(mlxk_version, const char *(*)());
SAME_TYPE(mlxk_abi_version, uint32_t (*)());

#ifdef MLXK_GLM52_EXPERT_SLOT_ALIGNMENT
static_assert(std::is_standard_layout<mlxk_glm52_layout>::value &&
                  std::is_trivially_copyable<mlxk_glm52_layout>::value &&
                  sizeof(mlxk_glm52_layout) == 9 * sizeof(uint64_t),
              "mlxk_glm52_layout is plain data");
SAME_TYPE(mlxk_glm52_layout_canonical,
          mlxk_status (*)(uint64_t, uint64_t, uint32_t, uint32_t, mlxk_glm52_layout *));
SAME_TYPE(mlxk_glm52_layout_validate,
          mlxk_status (*)(const mlxk_glm52_layout *, uint32_t, uint32_t));
#endif

namespace {
// What a C++ caller typically writes: a unique_ptr that frees the handle.
struct ArrayDeleter {
    void operator()(mlxk_array *a) const noexcept {
        mlxk_status status = mlxk_array_free(a);  // a destructor cannot report it
        static_cast<void>(status);
    }
};
using ArrayPtr = std::unique_ptr<mlxk_array, ArrayDeleter>;
}  // namespace

int main() {
    const int32_t shape[2] = {2, 3};
    mlxk_array *raw = nullptr;
    if (mlxk_array_zeros(shape, 2, MLXK_DTYPE_FLOAT32, &raw) != MLXK_OK) {
        std::fprintf(stderr, "header_cpp: mlxk_array_zeros: %s\n", mlxk_last_error());
        return 1;
    }
    ArrayPtr array(raw);
    float values[6] = {1, 1, 1, 1, 1, 1};
    if (mlxk_array_read(array.get(), values, sizeof values) != MLXK_OK || values[5] != 0.0f ||
        mlxk_abi_version() != MLXK_ABI_VERSION || std::strcmp(mlxk_version(), MLXK_VERSION) != 0) {
        std::fprintf(stderr, "header_cpp: unexpected result\n");
        return 1;
    }
    std::printf("header_cpp: mlxkern %s, ABI %u\n", mlxk_version(), mlxk_abi_version());
    return 0;
}
