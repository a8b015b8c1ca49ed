/*
 * The C client test's checks of the library's own surface: versions and status names, the
 * device, arrays (make, read, convert, free) and their errors, the memory limit, and
 * mlxk_last_error() per thread.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* ---------------------------------------------------------------------------------------- */
/* Tests                                                                                    */

void test_versions_and_status_names(void) {
    /* Nothing has failed on this thread yet. */
    CHECK(mlxk_last_error() != NULL && mlxk_last_error()[0] == '\0');
    CHECK(mlxk_version() != NULL && strcmp(mlxk_version(), MLXK_VERSION) == 0);
    CHECK(mlxk_abi_version() == (uint32_t)MLXK_ABI_VERSION);
    char joined[32];
    snprintf(joined, sizeof joined, "%d.%d.%d", MLXK_VERSION_MAJOR, MLXK_VERSION_MINOR,
             MLXK_VERSION_PATCH);
    CHECK(strcmp(joined, MLXK_VERSION) == 0);

    static const struct {
        mlxk_status status;
        const char *name;
    } names[] = {
        {MLXK_OK, "MLXK_OK"},
        {MLXK_ERR_NULL_POINTER, "MLXK_ERR_NULL_POINTER"},
        {MLXK_ERR_INVALID_ARGUMENT, "MLXK_ERR_INVALID_ARGUMENT"},
        {MLXK_ERR_SHAPE, "MLXK_ERR_SHAPE"},
        {MLXK_ERR_DTYPE, "MLXK_ERR_DTYPE"},
        {MLXK_ERR_UNSUPPORTED, "MLXK_ERR_UNSUPPORTED"},
        {MLXK_ERR_BACKEND, "MLXK_ERR_BACKEND"},
        {MLXK_ERR_OUT_OF_MEMORY, "MLXK_ERR_OUT_OF_MEMORY"},
        {MLXK_ERR_BUFFER_TOO_SMALL, "MLXK_ERR_BUFFER_TOO_SMALL"},
        {MLXK_ERR_PANIC, "MLXK_ERR_PANIC"},
        {MLXK_ERR_INVALID_HANDLE, "MLXK_ERR_INVALID_HANDLE"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        CHECK(names[i].status == (mlxk_status)i); /* the contract's numbering */
        CHECK(strcmp(mlxk_status_name(names[i].status), names[i].name) == 0);
    }
    CHECK(strcmp(mlxk_status_name(11), "MLXK_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(mlxk_status_name(-1), "MLXK_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(mlxk_status_name(INT32_MAX), "MLXK_UNKNOWN_STATUS") == 0);
    /* Values of the other enumerations (contract, docs/DESIGN.md §5). */
    CHECK(MLXK_DTYPE_BOOL == 0 && MLXK_DTYPE_UINT8 == 1 && MLXK_DTYPE_INT8 == 2 &&
          MLXK_DTYPE_INT32 == 3 && MLXK_DTYPE_UINT32 == 4 && MLXK_DTYPE_FLOAT16 == 5 &&
          MLXK_DTYPE_BFLOAT16 == 6 && MLXK_DTYPE_FLOAT32 == 7);
    CHECK(MLXK_DEVICE_CPU == 0 && MLXK_DEVICE_GPU == 1);
    CHECK(MLXK_GPU_NONE == 0 && MLXK_GPU_METAL == 1 && MLXK_GPU_CUDA == 2);
}

void test_device(void) {
    mlxk_gpu_backend_kind backend = mlxk_gpu_backend();
    CHECK(backend == MLXK_GPU_NONE || backend == MLXK_GPU_METAL || backend == MLXK_GPU_CUDA);
    if (backend == MLXK_GPU_METAL) {
        CHECK_OK(mlxk_set_default_device(MLXK_DEVICE_GPU));
    } else {
        /* This machine: Linux, MLX's CPU build (or CUDA, which the kernels do not support). */
        EXPECT_ERROR(mlxk_set_default_device(MLXK_DEVICE_GPU), MLXK_ERR_UNSUPPORTED,
                     "mlxk_set_default_device", "MLXK_DEVICE_GPU");
    }
    CHECK_OK(mlxk_set_default_device(MLXK_DEVICE_CPU));
    EXPECT_ERROR(mlxk_set_default_device(2), MLXK_ERR_INVALID_ARGUMENT, "mlxk_set_default_device",
                 ": device is 2");
    EXPECT_ERROR(mlxk_set_default_device(-1), MLXK_ERR_INVALID_ARGUMENT, "mlxk_set_default_device",
                 ": device is -1");
    CHECK_OK(mlxk_set_cache_limit((size_t)64 << 20));
    CHECK_OK(mlxk_set_cache_limit(0));
    CHECK_OK(mlxk_set_cache_limit((size_t)256 << 20));
}

void test_arrays(void) {
    /* Every dtype round-trips its bytes, with the right metadata. */
    static const struct {
        mlxk_dtype dtype;
        size_t size;
    } dtypes[] = {
        {MLXK_DTYPE_BOOL, 1},    {MLXK_DTYPE_UINT8, 1},   {MLXK_DTYPE_INT8, 1},
        {MLXK_DTYPE_INT32, 4},   {MLXK_DTYPE_UINT32, 4},  {MLXK_DTYPE_FLOAT16, 2},
        {MLXK_DTYPE_BFLOAT16, 2}, {MLXK_DTYPE_FLOAT32, 4},
    };
    int32_t shape[3] = {2, 3, 4};
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
        uint8_t data[24 * 4], back[24 * 4 + 8];
        size_t nbytes = 24 * dtypes[i].size;
        for (size_t j = 0; j < nbytes; j++) {
            uint64_t mask = dtypes[i].dtype == MLXK_DTYPE_BOOL ? 1u : 0x3Fu;
            data[j] = (uint8_t)(mlxkt_rng_next(&rng) & mask);
        }
        mlxk_array *a = NULL;
        CHECK_OK(mlxk_array_new(data, shape, 3, dtypes[i].dtype, &a));
        CHECK(a != NULL);
        check_shape(a, shape, 3, dtypes[i].dtype, __FILE__, __LINE__);
        size_t got = 0;
        CHECK_OK(mlxk_array_nbytes(a, &got));
        CHECK(got == nbytes);
        CHECK_OK(mlxk_array_eval(a));
        /* A longer buffer keeps its tail. */
        memset(back, 0xA5, sizeof back);
        CHECK_OK(mlxk_array_read(a, back, nbytes + 8));
        CHECK(memcmp(back, data, nbytes) == 0);
        CHECK(back[nbytes] == 0xA5 && back[nbytes + 7] == 0xA5);
        /* A short one gets nothing. */
        memset(back, 0xA5, sizeof back);
        EXPECT_ERROR(mlxk_array_read(a, back, nbytes - 1), MLXK_ERR_BUFFER_TOO_SMALL,
                     "mlxk_array_read", "dst_bytes");
        CHECK(back[0] == 0xA5 && back[nbytes - 2] == 0xA5);
        free_ok(a);
    }

    /* zeros */
    mlxk_array *z = NULL;
    CHECK_OK(mlxk_array_zeros(shape, 3, MLXK_DTYPE_FLOAT32, &z));
    check_shape(z, shape, 3, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    float zf[24];
    memset(zf, 0xFF, sizeof zf);
    CHECK_OK(mlxk_array_read(z, zf, sizeof zf));
    int all_zero = 1;
    for (int i = 0; i < 24; i++) {
        all_zero &= zf[i] == 0.0f;
    }
    CHECK(all_zero);
    free_ok(z);

    /* A scalar: ndim 0, shape may be NULL, dims may be NULL with capacity 0. */
    float pi = 3.25f, back = 0.0f;
    mlxk_array *s = NULL;
    CHECK_OK(mlxk_array_new(&pi, NULL, 0, MLXK_DTYPE_FLOAT32, &s));
    size_t nd = 99, nb = 0;
    CHECK_OK(mlxk_array_ndim(s, &nd));
    CHECK(nd == 0);
    CHECK_OK(mlxk_array_shape(s, NULL, 0));
    CHECK_OK(mlxk_array_nbytes(s, &nb));
    CHECK(nb == sizeof(float));
    CHECK_OK(mlxk_array_read(s, &back, sizeof back));
    CHECK(back == 3.25f);
    free_ok(s);

    /* An empty array: data and dst may be NULL. */
    int32_t empty_shape[2] = {0, 5};
    mlxk_array *e = NULL;
    CHECK_OK(mlxk_array_new(NULL, empty_shape, 2, MLXK_DTYPE_INT32, &e));
    CHECK_OK(mlxk_array_nbytes(e, &nb));
    CHECK(nb == 0);
    CHECK_OK(mlxk_array_eval(e));
    CHECK_OK(mlxk_array_read(e, NULL, 0));
    check_shape(e, empty_shape, 2, MLXK_DTYPE_INT32, __FILE__, __LINE__);
    free_ok(e);

    /* MLXK_MAX_NDIM dims are fine, one more is a shape error. */
    int32_t ones[MLXK_MAX_NDIM + 1];
    for (int i = 0; i <= MLXK_MAX_NDIM; i++) {
        ones[i] = 1;
    }
    mlxk_array *m = NULL;
    CHECK_OK(mlxk_array_zeros(ones, MLXK_MAX_NDIM, MLXK_DTYPE_UINT8, &m));
    CHECK_OK(mlxk_array_ndim(m, &nd));
    CHECK(nd == MLXK_MAX_NDIM);
    free_ok(m);

    /* astype: float32 -> bfloat16 rounds to nearest even; bfloat16 -> float32 is exact;
     * float -> int32 truncates. */
    float src[8] = {1.0f, -2.7f, 0.1f, 3.14159265f, 1.00390625f, 1.01171875f, -0.0f, 65504.0f};
    int32_t eight[1] = {8};
    mlxk_array *f = new_f32(src, eight, 1);
    mlxk_array *h = NULL, *hf = NULL, *iv = NULL;
    CHECK_OK(mlxk_array_astype(f, MLXK_DTYPE_BFLOAT16, &h));
    check_shape(h, eight, 1, MLXK_DTYPE_BFLOAT16, __FILE__, __LINE__);
    uint16_t hb[8];
    float hfv[8];
    CHECK_OK(mlxk_array_read(h, hb, sizeof hb));
    CHECK_OK(mlxk_array_astype(h, MLXK_DTYPE_FLOAT32, &hf));
    CHECK_OK(mlxk_array_read(hf, hfv, sizeof hfv));
    int rne = 1, exact = 1;
    for (int i = 0; i < 8; i++) {
        rne &= hb[i] == mlxkt_bf16_from_float(src[i]); /* round to nearest even */
        exact &= hfv[i] == mlxkt_bf16_to_float(hb[i]); /* bf16 -> f32 is exact */
    }
    CHECK(rne);
    CHECK(exact);
    CHECK_OK(mlxk_array_astype(f, MLXK_DTYPE_INT32, &iv));
    int32_t ivv[8];
    CHECK_OK(mlxk_array_read(iv, ivv, sizeof ivv));
    CHECK(ivv[0] == 1 && ivv[1] == -2 && ivv[2] == 0 && ivv[3] == 3 && ivv[7] == 65504);
    free_ok(f);
    free_ok(h);
    free_ok(hf);
    free_ok(iv);
}

void test_array_errors(void) {
    int32_t shape[2] = {2, 2};
    float data[4] = {1, 2, 3, 4};
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *out = sentinel;

    /* mlxk_array_new / zeros */
    EXPECT_ERROR(mlxk_array_new(data, shape, 2, MLXK_DTYPE_FLOAT32, NULL), MLXK_ERR_NULL_POINTER,
                 "mlxk_array_new", ": out is NULL");
    EXPECT_ERROR(mlxk_array_new(data, NULL, 2, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_NULL_POINTER,
                 "mlxk_array_new", ": shape is NULL");
    EXPECT_ERROR(mlxk_array_new(NULL, shape, 2, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_NULL_POINTER,
                 "mlxk_array_new", ": data is NULL");
    EXPECT_ERROR(mlxk_array_new(data, shape, 2, 8, &out), MLXK_ERR_DTYPE, "mlxk_array_new",
                 ": dtype: unknown dtype code 8");
    EXPECT_ERROR(mlxk_array_new(data, shape, 2, -1, &out), MLXK_ERR_DTYPE, "mlxk_array_new",
                 ": dtype: unknown dtype code -1");
    int32_t negative[2] = {2, -2};
    EXPECT_ERROR(mlxk_array_new(data, negative, 2, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_SHAPE,
                 "mlxk_array_new", ": shape: dimension 1 is -2");
    int32_t many[MLXK_MAX_NDIM + 1] = {0};
    EXPECT_ERROR(mlxk_array_new(data, many, MLXK_MAX_NDIM + 1, MLXK_DTYPE_FLOAT32, &out),
                 MLXK_ERR_SHAPE, "mlxk_array_new", ": ndim is 17");
    uint8_t bad_bool[4] = {0, 1, 2, 1};
    EXPECT_ERROR(mlxk_array_new(bad_bool, shape, 2, MLXK_DTYPE_BOOL, &out),
                 MLXK_ERR_INVALID_ARGUMENT, "mlxk_array_new", ": data: bool element 2");
    int32_t huge[2] = {65536, 65536}; /* 2^32 elements, above 2^31-1 */
    EXPECT_ERROR(mlxk_array_new(data, huge, 2, MLXK_DTYPE_UINT8, &out), MLXK_ERR_INVALID_ARGUMENT,
                 "mlxk_array_new", ": shape: shape [65536, 65536]");
    EXPECT_ERROR(mlxk_array_zeros(huge, 2, MLXK_DTYPE_UINT8, &out), MLXK_ERR_INVALID_ARGUMENT,
                 "mlxk_array_zeros", ": shape: shape [65536, 65536]");
    EXPECT_ERROR(mlxk_array_zeros(shape, 2, MLXK_DTYPE_FLOAT32, NULL), MLXK_ERR_NULL_POINTER,
                 "mlxk_array_zeros", ": out is NULL");
    EXPECT_ERROR(mlxk_array_zeros(NULL, 2, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_NULL_POINTER,
                 "mlxk_array_zeros", ": shape is NULL");
    EXPECT_ERROR(mlxk_array_zeros(shape, 2, 42, &out), MLXK_ERR_DTYPE, "mlxk_array_zeros",
                 ": dtype: unknown dtype code 42");
    EXPECT_ERROR(mlxk_array_zeros(negative, 2, MLXK_DTYPE_INT8, &out), MLXK_ERR_SHAPE,
                 "mlxk_array_zeros", ": shape: dimension 1 is -2");
    CHECK(out == sentinel); /* out-parameters are written only on success */

    /* Handles: NULL, freed (double free), a stack address, a heap address. */
    mlxk_array *a = new_f32(data, shape, 2);
    mlxk_array *b = new_f32(data, shape, 2);
    CHECK(a != b);
    int on_stack = 0;
    mlxk_array *stack_handle = (mlxk_array *)(void *)&on_stack;
    void *heap = malloc(64);
    mlxk_array *heap_handle = (mlxk_array *)heap;
    CHECK(mlxk_array_free(NULL) == MLXK_OK);
    free_ok(b);
    EXPECT_ERROR(mlxk_array_free(b), MLXK_ERR_INVALID_HANDLE, "mlxk_array_free", ": array (0x");
    EXPECT_ERROR(mlxk_array_free(stack_handle), MLXK_ERR_INVALID_HANDLE, "mlxk_array_free",
                 ": array (0x");
    EXPECT_ERROR(mlxk_array_free(heap_handle), MLXK_ERR_INVALID_HANDLE, "mlxk_array_free",
                 ": array (0x");
    CHECK(on_stack == 0);
    free(heap);
    /* Tokens are never reused: a new array never gets b's old value. */
    mlxk_array *c = new_f32(data, shape, 2);
    CHECK(c != b);

    size_t nd = 77, nb = 77;
    mlxk_dtype dt = 77;
    int32_t dims[2] = {77, 77};
    float buf[4];
    mlxk_array *bad[3] = {b, stack_handle, NULL};
    const mlxk_status want[3] = {MLXK_ERR_INVALID_HANDLE, MLXK_ERR_INVALID_HANDLE,
                                 MLXK_ERR_NULL_POINTER};
    const char *named[3] = {": array (0x", ": array (0x", ": array is NULL"};
    for (int i = 0; i < 3; i++) {
        EXPECT_ERROR(mlxk_array_ndim(bad[i], &nd), want[i], "mlxk_array_ndim", named[i]);
        EXPECT_ERROR(mlxk_array_shape(bad[i], dims, 2), want[i], "mlxk_array_shape", named[i]);
        EXPECT_ERROR(mlxk_array_dtype(bad[i], &dt), want[i], "mlxk_array_dtype", named[i]);
        EXPECT_ERROR(mlxk_array_nbytes(bad[i], &nb), want[i], "mlxk_array_nbytes", named[i]);
        EXPECT_ERROR(mlxk_array_eval(bad[i]), want[i], "mlxk_array_eval", named[i]);
        EXPECT_ERROR(mlxk_array_read(bad[i], buf, sizeof buf), want[i], "mlxk_array_read", named[i]);
        EXPECT_ERROR(mlxk_array_astype(bad[i], MLXK_DTYPE_FLOAT16, &out), want[i],
                     "mlxk_array_astype", named[i]);
    }
    CHECK(nd == 77 && nb == 77 && dt == 77 && dims[0] == 77 && out == sentinel);
    CHECK(on_stack == 0);

    /* NULL out-parameters and buffers of a live handle. */
    EXPECT_ERROR(mlxk_array_ndim(a, NULL), MLXK_ERR_NULL_POINTER, "mlxk_array_ndim", ": ndim is NULL");
    EXPECT_ERROR(mlxk_array_dtype(a, NULL), MLXK_ERR_NULL_POINTER, "mlxk_array_dtype", ": dtype is NULL");
    EXPECT_ERROR(mlxk_array_nbytes(a, NULL), MLXK_ERR_NULL_POINTER, "mlxk_array_nbytes", ": nbytes is NULL");
    EXPECT_ERROR(mlxk_array_shape(a, NULL, 2), MLXK_ERR_NULL_POINTER, "mlxk_array_shape", ": dims is NULL");
    EXPECT_ERROR(mlxk_array_shape(a, dims, 1), MLXK_ERR_BUFFER_TOO_SMALL, "mlxk_array_shape",
                 ": dims: capacity 1");
    CHECK(dims[0] == 77); /* nothing written */
    EXPECT_ERROR(mlxk_array_read(a, NULL, sizeof buf), MLXK_ERR_NULL_POINTER, "mlxk_array_read",
                 ": dst is NULL");
    EXPECT_ERROR(mlxk_array_read(a, buf, 0), MLXK_ERR_BUFFER_TOO_SMALL, "mlxk_array_read",
                 ": dst_bytes is 0");
    EXPECT_ERROR(mlxk_array_astype(a, MLXK_DTYPE_FLOAT16, NULL), MLXK_ERR_NULL_POINTER,
                 "mlxk_array_astype", ": out is NULL");
    EXPECT_ERROR(mlxk_array_astype(a, 99, &out), MLXK_ERR_DTYPE, "mlxk_array_astype",
                 ": dtype: unknown dtype code 99");
    CHECK(out == sentinel);

    /* The message stays until the next failure; successes do not clear it. */
    char saved[512];
    snprintf(saved, sizeof saved, "%s", mlxk_last_error());
    CHECK_OK(mlxk_array_eval(a));
    CHECK(strcmp(saved, mlxk_last_error()) == 0);

    free_ok(a);
    free_ok(c);
}

void test_memory_limit(void) {
    size_t original = 0, now = 0;
    CHECK_OK(mlxk_get_memory_limit(&original));
    CHECK(original > 0);
    EXPECT_ERROR(mlxk_get_memory_limit(NULL), MLXK_ERR_NULL_POINTER, "mlxk_get_memory_limit",
                 ": bytes is NULL");

    /* Arrays made before the limit stays usable. */
    float data[64];
    for (int i = 0; i < 64; i++) {
        data[i] = mlxkt_rng_sym(&rng);
    }
    int32_t shape64[1] = {64};
    mlxk_array *small = new_f32(data, shape64, 1);
    int32_t gshape[3] = {1, 2, 4}, hv[1] = {4};
    mlxk_array *a_log = new_f32(data, hv, 1), *dt = new_f32(data + 4, hv, 1);
    mlxk_array *a = new_f32(data + 8, gshape, 3);

    CHECK_OK(mlxk_set_memory_limit(100));
    CHECK_OK(mlxk_get_memory_limit(&now));
    CHECK(now == 100);
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *out = sentinel, *out2 = sentinel;
    EXPECT_ERROR(mlxk_array_new(data, shape64, 1, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_OUT_OF_MEMORY,
                 "mlxk_array_new", "above the memory limit of 100 bytes");
    EXPECT_ERROR(mlxk_array_zeros(shape64, 1, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_OUT_OF_MEMORY,
                 "mlxk_array_zeros", ": shape: the result needs 256 bytes");
    /* 64 x 4 = 256 bytes of float32 do not fit; 64 bytes of int8 do. */
    EXPECT_ERROR(mlxk_array_astype(small, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_OUT_OF_MEMORY,
                 "mlxk_array_astype", ": out: the result needs 256 bytes");
    CHECK_OK(mlxk_array_astype(small, MLXK_DTYPE_INT8, &out));
    free_ok(out);
    out = sentinel;

    /* Kernels: g needs 32 bytes, fine under 100; under 16 it is refused. */
    CHECK_OK(mlxk_compute_g(a_log, a, dt, &out));
    free_ok(out);
    out = sentinel;
    CHECK_OK(mlxk_set_memory_limit(16));
    EXPECT_ERROR(mlxk_compute_g(a_log, a, dt, &out), MLXK_ERR_OUT_OF_MEMORY, "mlxk_compute_g",
                 ": g: the result needs 32 bytes");

    Dims d = {1, 2, 1, 2, 32, 4};
    CHECK_OK(mlxk_set_memory_limit(0)); /* restore, to upload */
    Host hst;
    Args x = upload_random(d, 0, &hst);
    CHECK_OK(mlxk_set_memory_limit(1024)); /* state alone is 1 x 2 x 4 x 32 x 4 = 1024 bytes */
    EXPECT_ERROR(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         &out, &out2),
                 MLXK_ERR_OUT_OF_MEMORY, "mlxk_gated_delta_update", ": y, state_out");
    CHECK(out == sentinel && out2 == sentinel);

    CHECK_OK(mlxk_set_memory_limit(0));
    CHECK_OK(mlxk_get_memory_limit(&now));
    CHECK(now == original);
    CHECK_OK(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL, &out,
                                     &out2));
    CHECK_OK(mlxk_array_eval(out2));
    free_ok(out);
    free_ok(out2);
    free_inputs(&hst, &x);
    free_ok(small);
    free_ok(a_log);
    free_ok(dt);
    free_ok(a);
}

/* mlxk_last_error() is per thread. */
typedef struct {
    int status;
    char message[512];
} ThreadResult;

static void *thread_main(void *arg) {
    ThreadResult *r = arg;
    int32_t shape[1] = {1};
    mlxk_array *out = NULL;
    r->status = mlxk_array_zeros(shape, 1, 1234, &out);
    snprintf(r->message, sizeof r->message, "%s", mlxk_last_error());
    return NULL;
}

void test_threads(void) {
    mlxk_array *out = NULL;
    EXPECT_ERROR(mlxk_array_astype(NULL, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_NULL_POINTER,
                 "mlxk_array_astype", ": array is NULL");
    char mine[512];
    snprintf(mine, sizeof mine, "%s", mlxk_last_error());
    ThreadResult r = {0, ""};
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, thread_main, &r) == 0);
    CHECK(pthread_join(thread, NULL) == 0);
    CHECK(r.status == MLXK_ERR_DTYPE);
    CHECK(strstr(r.message, "mlxk_array_zeros") == r.message && strstr(r.message, "1234") != NULL);
    CHECK(strcmp(mine, mlxk_last_error()) == 0); /* this thread's message is its own */
}
