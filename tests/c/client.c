/*
 * C client test of the mlxkern C ABI: compiled against include/mlxkern.h only (and the helpers
 * the C programs share, tests/common/mlxk_test_util.h), linked to the cdylib, run under
 * AddressSanitizer with LeakSanitizer (tests/c/run.sh, `make test-c`).
 *
 * It calls every function of the header (run.sh checks that none is missed) on small random
 * inputs and checks the results (the kernels against a float64 reference written here), then
 * walks the error paths: NULL pointers, wrong ranks and dtypes, freed, double-freed and foreign handles, short buffers, the memory limit.
 * Every failure must return the documented status, leave out-parameters untouched, and set a
 * non-empty mlxk_last_error() that starts with the function's name and names the argument.
 * Every handle is freed; LeakSanitizer checks that at exit.
 *
 * MLXK_CLIENT_VERBOSE=1 prints every error message the checks see.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlxkern.h"
#include "mlxk_test_util.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers (CHECK, CHECK_OK, EXPECT_ERROR, bfloat16, random numbers: tests/common/)         */

static mlxkt_rng rng = {0x5EED1234ABCDull};

static mlxk_array *new_f32(const float *data, const int32_t *shape, size_t ndim) {
    return mlxkt_new_array(data, shape, ndim, MLXK_DTYPE_FLOAT32);
}

static mlxk_array *new_bf16(const float *data, size_t n, const int32_t *shape, size_t ndim) {
    uint16_t *bits = mlxkt_xmalloc(n * sizeof *bits);
    for (size_t i = 0; i < n; i++) {
        bits[i] = mlxkt_bf16_from_float(data[i]);
    }
    mlxk_array *out = mlxkt_new_array(bits, shape, ndim, MLXK_DTYPE_BFLOAT16);
    free(bits);
    return out;
}

static void free_ok(mlxk_array *a) { CHECK_OK(mlxk_array_free(a)); }

static void check_shape(const mlxk_array *a, const int32_t *want, size_t ndim, mlxk_dtype dtype,
                        int line) {
    size_t got_ndim = 99;
    int32_t dims[MLXK_MAX_NDIM];
    mlxk_dtype got_dtype = -1;
    CHECK_OK(mlxk_array_ndim(a, &got_ndim));
    mlxkt_check_at(got_ndim == ndim, "result rank", __FILE__, line);
    CHECK_OK(mlxk_array_shape(a, dims, MLXK_MAX_NDIM));
    int same = got_ndim == ndim;
    for (size_t i = 0; same && i < ndim; i++) {
        same = dims[i] == want[i];
    }
    mlxkt_check_at(same, "result shape", __FILE__, line);
    CHECK_OK(mlxk_array_dtype(a, &got_dtype));
    mlxkt_check_at(got_dtype == dtype, "result dtype", __FILE__, line);
}

/* max |got - ref| / max(max |ref|, tiny) */
static double rel_error(const float *got, const double *ref, size_t n) {
    double err = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= err)) {
            err = d;
        }
        if (fabs(ref[i]) > scale) {
            scale = fabs(ref[i]);
        }
    }
    return err / scale;
}

/* ---------------------------------------------------------------------------------------- */
/* float64 reference of the gate and the recurrence                                         */

/* Gates from float32 inputs (MLX computes them in float32: errors ~1e-7 relative), or, with
 * `bf16`, at MLX's bfloat16 rounding points (see examples/c/demo.c). */
static double ref_softplus(float x, int bf16) {
    if (!bf16) {
        double xd = x;
        return (xd > 0 ? xd : 0.0) + log1p(exp(-fabs(xd)));
    }
    float e = mlxkt_bf16_round((float)exp(-fabs((double)x)));
    float l = mlxkt_bf16_round((float)log1p((double)e));
    return mlxkt_bf16_round((x > 0.0f ? x : 0.0f) + l);
}

static double ref_sigmoid(float b, int bf16) {
    if (!bf16) {
        return 1.0 / (1.0 + exp(-(double)b));
    }
    float e = mlxkt_bf16_round((float)exp(fabs((double)b)));
    float y = 1.0f / (1.0f + e);
    return mlxkt_bf16_round(b < 0.0f ? y : 1.0f - y);
}

static double ref_g(float a_log, float a, float dt_bias, int bf16) {
    float x = bf16 ? mlxkt_bf16_round(a + dt_bias) : a + dt_bias;
    return exp(-exp((double)a_log) * ref_softplus(x, bf16));
}

typedef struct {
    int b, t, hk, hv, dk, dv;
} Dims;

/* Host inputs of one recurrence call, as the library sees them (already rounded for bf16). */
typedef struct {
    Dims d;
    int bf16; /* q, k, v, a, b, dt_bias in bfloat16, else float32; a_log always float32 */
    float *q, *k, *v, *a, *b, *a_log, *dt_bias;
} Host;

static size_t n_qk(Dims d) { return (size_t)d.b * d.t * d.hk * d.dk; }
static size_t n_v(Dims d) { return (size_t)d.b * d.t * d.hv * d.dv; }
static size_t n_gate(Dims d) { return (size_t)d.b * d.t * d.hv; }
static size_t n_state(Dims d) { return (size_t)d.b * d.hv * d.dv * d.dk; }

static float *alloc_floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (p == NULL) {
        exit(1);
    }
    return p;
}

static Host host_random(Dims d, int bf16) {
    Host h;
    h.d = d;
    h.bf16 = bf16;
    h.q = alloc_floats(n_qk(d));
    h.k = alloc_floats(n_qk(d));
    h.v = alloc_floats(n_v(d));
    h.a = alloc_floats(n_gate(d));
    h.b = alloc_floats(n_gate(d));
    h.a_log = alloc_floats((size_t)d.hv);
    h.dt_bias = alloc_floats((size_t)d.hv);
    /* q, k per head as normalize_qk leaves them: q = l2norm * Dk^-1/2, k = l2norm. */
    for (size_t head = 0; head < n_qk(d) / (size_t)d.dk; head++) {
        for (int which = 0; which < 2; which++) {
            float *x = (which ? h.k : h.q) + head * (size_t)d.dk;
            double norm2 = 0.0;
            for (int i = 0; i < d.dk; i++) {
                x[i] = mlxkt_rng_sym(&rng);
                norm2 += (double)x[i] * x[i];
            }
            double scale = (which ? 1.0 : 1.0 / sqrt((double)d.dk)) / sqrt(norm2);
            for (int i = 0; i < d.dk; i++) {
                x[i] = (float)(x[i] * scale);
            }
        }
    }
    for (size_t i = 0; i < n_v(d); i++) {
        h.v[i] = mlxkt_rng_sym(&rng);
    }
    for (size_t i = 0; i < n_gate(d); i++) {
        h.a[i] = 2.0f * mlxkt_rng_sym(&rng);
        h.b[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < d.hv; i++) {
        h.a_log[i] = (float)log(1.0 + 4.0 * (1.0 + mlxkt_rng_sym(&rng)));
        h.dt_bias[i] = -2.0f + mlxkt_rng_sym(&rng);
    }
    if (bf16) {
        float *arrays[] = {h.q, h.k, h.v, h.a, h.b, h.dt_bias};
        size_t counts[] = {n_qk(d), n_qk(d), n_v(d), n_gate(d), n_gate(d), (size_t)d.hv};
        for (int j = 0; j < 6; j++) {
            for (size_t i = 0; i < counts[j]; i++) {
                arrays[j][i] = mlxkt_bf16_round(arrays[j][i]);
            }
        }
    }
    return h;
}

static void host_free(Host *h) {
    free(h->q);
    free(h->k);
    free(h->v);
    free(h->a);
    free(h->b);
    free(h->a_log);
    free(h->dt_bias);
}

/* The recurrence from `state` (in/out, [B, Hv, Dv, Dk]) writing y [B, T, Hv, Dv]; mask [B, T]
 * bytes or NULL. */
static void ref_update(const Host *h, const uint8_t *mask, double *state, double *y) {
    Dims d = h->d;
    int group = d.hv / d.hk;
    for (int b = 0; b < d.b; b++) {
        for (int t = 0; t < d.t; t++) {
            size_t bt = (size_t)b * d.t + t;
            for (int hv = 0; hv < d.hv; hv++) {
                size_t gate = bt * d.hv + hv;
                double g = ref_g(h->a_log[hv], h->a[gate], h->dt_bias[hv], h->bf16);
                double beta = ref_sigmoid(h->b[gate], h->bf16);
                const float *q = h->q + (bt * d.hk + hv / group) * d.dk;
                const float *k = h->k + (bt * d.hk + hv / group) * d.dk;
                for (int dv = 0; dv < d.dv; dv++) {
                    double *yy = y + gate * d.dv + dv;
                    if (mask != NULL && mask[bt] == 0) {
                        *yy = 0.0;
                        continue;
                    }
                    double *s = state + (((size_t)b * d.hv + hv) * d.dv + dv) * d.dk;
                    double kv = 0.0, out = 0.0;
                    for (int i = 0; i < d.dk; i++) {
                        s[i] *= g;
                        kv += s[i] * k[i];
                    }
                    double delta = (h->v[gate * d.dv + dv] - kv) * beta;
                    for (int i = 0; i < d.dk; i++) {
                        s[i] += k[i] * delta;
                        out += s[i] * q[i];
                    }
                    *yy = out;
                }
            }
        }
    }
}

/* Library handles of a Host. */
typedef struct {
    mlxk_array *q, *k, *v, *a, *b, *a_log, *dt_bias;
} Args;

static Args upload(const Host *h) {
    Dims d = h->d;
    int32_t qk[4] = {d.b, d.t, d.hk, d.dk}, v[4] = {d.b, d.t, d.hv, d.dv}, g[3] = {d.b, d.t, d.hv};
    int32_t hv[1] = {d.hv};
    Args x;
    if (h->bf16) {
        x.q = new_bf16(h->q, n_qk(d), qk, 4);
        x.k = new_bf16(h->k, n_qk(d), qk, 4);
        x.v = new_bf16(h->v, n_v(d), v, 4);
        x.a = new_bf16(h->a, n_gate(d), g, 3);
        x.b = new_bf16(h->b, n_gate(d), g, 3);
        x.dt_bias = new_bf16(h->dt_bias, (size_t)d.hv, hv, 1);
    } else {
        x.q = new_f32(h->q, qk, 4);
        x.k = new_f32(h->k, qk, 4);
        x.v = new_f32(h->v, v, 4);
        x.a = new_f32(h->a, g, 3);
        x.b = new_f32(h->b, g, 3);
        x.dt_bias = new_f32(h->dt_bias, hv, 1);
    }
    x.a_log = new_f32(h->a_log, hv, 1);
    return x;
}

static void free_args(Args *x) {
    free_ok(x->q);
    free_ok(x->k);
    free_ok(x->v);
    free_ok(x->a);
    free_ok(x->b);
    free_ok(x->a_log);
    free_ok(x->dt_bias);
}

/* ---------------------------------------------------------------------------------------- */
/* Tests                                                                                    */

static void test_versions_and_status_names(void) {
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

static void test_device(void) {
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

static void test_arrays(void) {
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
        check_shape(a, shape, 3, dtypes[i].dtype, __LINE__);
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
    check_shape(z, shape, 3, MLXK_DTYPE_FLOAT32, __LINE__);
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
    check_shape(e, empty_shape, 2, MLXK_DTYPE_INT32, __LINE__);
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
    check_shape(h, eight, 1, MLXK_DTYPE_BFLOAT16, __LINE__);
    uint16_t hb[8];
    CHECK_OK(mlxk_array_read(h, hb, sizeof hb));
    int rne = 1;
    for (int i = 0; i < 8; i++) {
        rne &= hb[i] == mlxkt_bf16_from_float(src[i]);
    }
    CHECK(rne);
    CHECK_OK(mlxk_array_astype(h, MLXK_DTYPE_FLOAT32, &hf));
    float hfv[8];
    CHECK_OK(mlxk_array_read(hf, hfv, sizeof hfv));
    int exact = 1;
    for (int i = 0; i < 8; i++) {
        exact &= hfv[i] == mlxkt_bf16_to_float(hb[i]);
    }
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

static void test_array_errors(void) {
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

static void test_memory_limit(void) {
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
    Host hst = host_random(d, 0);
    Args x = upload(&hst);
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
    free_args(&x);
    host_free(&hst);
    free_ok(small);
    free_ok(a_log);
    free_ok(dt);
    free_ok(a);
}

static void test_compute_g(void) {
    enum { B = 2, T = 3, HV = 4 };
    float a[B * T * HV], a_log[HV], dt[HV];
    for (int i = 0; i < B * T * HV; i++) {
        a[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < HV; i++) {
        a_log[i] = (float)log(1.0 + 8.0 * (1.0 + mlxkt_rng_sym(&rng)));
        dt[i] = -3.0f + 2.0f * mlxkt_rng_sym(&rng);
    }
    int32_t gs[3] = {B, T, HV}, hs[1] = {HV};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (bf16) {
            for (int i = 0; i < B * T * HV; i++) {
                a[i] = mlxkt_bf16_round(a[i]);
            }
            for (int i = 0; i < HV; i++) {
                dt[i] = mlxkt_bf16_round(dt[i]);
            }
        }
        mlxk_array *la = new_f32(a_log, hs, 1);
        mlxk_array *aa = bf16 ? new_bf16(a, B * T * HV, gs, 3) : new_f32(a, gs, 3);
        mlxk_array *dd = bf16 ? new_bf16(dt, HV, hs, 1) : new_f32(dt, hs, 1);
        mlxk_array *g = NULL;
        CHECK_OK(mlxk_compute_g(la, aa, dd, &g));
        check_shape(g, gs, 3, MLXK_DTYPE_FLOAT32, __LINE__);
        float *got = mlxkt_read_floats(g, B * T * HV);
        double ref[B * T * HV];
        for (int i = 0; i < B * T * HV; i++) {
            ref[i] = ref_g(a_log[i % HV], a[i], dt[i % HV], bf16);
        }
        double worst = 0.0;
        for (int i = 0; i < B * T * HV; i++) {
            double r = fabs(got[i] - ref[i]) / ref[i];
            worst = r > worst ? r : worst;
        }
        CHECK(worst < 1e-5);
        if (!(worst < 1e-5)) {
            fprintf(stderr, "  compute_g (bf16 = %d): max relative error %.3e\n", bf16, worst);
        }
        free(got);
        free_ok(g);

        if (!bf16) {
            /* Errors. */
            mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
            mlxk_array *out = sentinel;
            int32_t two[2] = {2, 2}, five[1] = {5};
            float zeros[8] = {0};
            int32_t ints[HV] = {0};
            mlxk_array *rank2 = new_f32(zeros, two, 2);
            mlxk_array *len5 = new_f32(zeros, five, 1);
            mlxk_array *scalar = new_f32(zeros, NULL, 0);
            mlxk_array *int_hv = NULL;
            CHECK_OK(mlxk_array_new(ints, hs, 1, MLXK_DTYPE_INT32, &int_hv));
            mlxk_array *int_a = NULL;
            CHECK_OK(mlxk_array_astype(aa, MLXK_DTYPE_INT32, &int_a));
            mlxk_array *f16_log = NULL;
            CHECK_OK(mlxk_array_astype(la, MLXK_DTYPE_FLOAT16, &f16_log));
            const char *fn = "mlxk_compute_g";
            EXPECT_ERROR(mlxk_compute_g(rank2, aa, dd, &out), MLXK_ERR_SHAPE, fn,
                         ": a_log: expected rank 1");
            /* Hv comes from a_log; a's last dimension must match it. */
            EXPECT_ERROR(mlxk_compute_g(len5, aa, dd, &out), MLXK_ERR_SHAPE, fn,
                         ": a: dimension 2 (Hv) is 4, expected 5 (Hv of a_log)");
            EXPECT_ERROR(mlxk_compute_g(int_hv, aa, dd, &out), MLXK_ERR_DTYPE, fn,
                         ": a_log: dtype int32");
            EXPECT_ERROR(mlxk_compute_g(f16_log, aa, dd, &out), MLXK_ERR_DTYPE, fn,
                         ": a_log: dtype float16");
            EXPECT_ERROR(mlxk_compute_g(la, aa, len5, &out), MLXK_ERR_SHAPE, fn,
                         ": dt_bias: dimension 0 (Hv) is 5");
            EXPECT_ERROR(mlxk_compute_g(la, aa, int_hv, &out), MLXK_ERR_DTYPE, fn,
                         ": dt_bias: dtype int32");
            EXPECT_ERROR(mlxk_compute_g(la, int_a, dd, &out), MLXK_ERR_DTYPE, fn, ": a: dtype int32");
            EXPECT_ERROR(mlxk_compute_g(la, scalar, dd, &out), MLXK_ERR_SHAPE, fn, ": a: expected rank");
            /* a [2, 2] says Hv = 2; a_log has 4. */
            EXPECT_ERROR(mlxk_compute_g(la, rank2, dd, &out), MLXK_ERR_SHAPE, fn,
                         ": a: dimension 1 (Hv) is 2, expected 4 (Hv of a_log)");
            EXPECT_ERROR(mlxk_compute_g(NULL, aa, dd, &out), MLXK_ERR_NULL_POINTER, fn,
                         ": a_log is NULL");
            EXPECT_ERROR(mlxk_compute_g(la, NULL, dd, &out), MLXK_ERR_NULL_POINTER, fn, ": a is NULL");
            EXPECT_ERROR(mlxk_compute_g(la, aa, NULL, &out), MLXK_ERR_NULL_POINTER, fn,
                         ": dt_bias is NULL");
            EXPECT_ERROR(mlxk_compute_g(la, aa, dd, NULL), MLXK_ERR_NULL_POINTER, fn, ": g is NULL");
            free_ok(len5);
            EXPECT_ERROR(mlxk_compute_g(la, aa, len5, &out), MLXK_ERR_INVALID_HANDLE, fn,
                         ": dt_bias (0x");
            CHECK(out == sentinel);
            free_ok(rank2);
            free_ok(scalar);
            free_ok(int_hv);
            free_ok(int_a);
            free_ok(f16_log);
        }
        free_ok(la);
        free_ok(aa);
        free_ok(dd);
    }
}

/* One update call against the reference; returns the library's state_out (caller frees) and
 * advances `ref_state` in place. `chunk` < 0: mlxk_gated_delta_update; else the chunked form
 * with that chunk size. */
static mlxk_array *run_update_with(const Host *h, const Args *x, const mlxk_array *state,
                                   const uint8_t *mask, double *ref_state, double y_tol,
                                   double state_tol, int chunk, int line) {
    Dims d = h->d;
    mlxk_array *mask_array = NULL;
    if (mask != NULL) {
        int32_t ms[2] = {d.b, d.t};
        CHECK_OK(mlxk_array_new(mask, ms, 2, MLXK_DTYPE_BOOL, &mask_array));
    }
    mlxk_array *y = NULL, *s = NULL;
    if (chunk < 0) {
        CHECK_OK(mlxk_gated_delta_update(x->q, x->k, x->v, x->a, x->b, x->a_log, x->dt_bias, state,
                                         mask_array, &y, &s));
    } else {
        CHECK_OK(mlxk_gated_delta_update_chunked(x->q, x->k, x->v, x->a, x->b, x->a_log, x->dt_bias,
                                                 state, mask_array, chunk, &y, &s));
    }
    free_ok(mask_array);
    int32_t ys[4] = {d.b, d.t, d.hv, d.dv}, ss[4] = {d.b, d.hv, d.dv, d.dk};
    check_shape(y, ys, 4, h->bf16 ? MLXK_DTYPE_BFLOAT16 : MLXK_DTYPE_FLOAT32, line);
    check_shape(s, ss, 4, MLXK_DTYPE_FLOAT32, line);

    double *y_ref = mlxkt_xmalloc(n_v(d) * sizeof *y_ref);
    if (y_ref == NULL) {
        exit(1);
    }
    ref_update(h, mask, ref_state, y_ref);
    float *y_got = mlxkt_read_floats(y, n_v(d));
    float *s_got = mlxkt_read_floats(s, n_state(d));
    double ye = rel_error(y_got, y_ref, n_v(d));
    double se = rel_error(s_got, ref_state, n_state(d));
    mlxkt_check_at(ye <= y_tol, "y matches the float64 reference", __FILE__, line);
    mlxkt_check_at(se <= state_tol, "state_out matches the float64 reference", __FILE__, line);
    if (ye > y_tol || se > state_tol) {
        fprintf(stderr, "  y error %.3e (tolerance %.1e), state error %.3e (tolerance %.1e)\n", ye,
                y_tol, se, state_tol);
    }
    if (mask != NULL) {
        int zero = 1;
        for (size_t bt = 0; bt < (size_t)d.b * d.t; bt++) {
            for (size_t j = 0; mask[bt] == 0 && j < (size_t)d.hv * d.dv; j++) {
                zero &= y_got[bt * d.hv * d.dv + j] == 0.0f;
            }
        }
        mlxkt_check_at(zero, "y is exactly 0 at masked tokens", __FILE__, line);
    }
    free(y_ref);
    free(y_got);
    free(s_got);
    free_ok(y);
    return s;
}

static mlxk_array *run_update(const Host *h, const Args *x, const mlxk_array *state,
                              const uint8_t *mask, double *ref_state, double y_tol,
                              double state_tol, int line) {
    return run_update_with(h, x, state, mask, ref_state, y_tol, state_tol, -1, line);
}

/* The chunked form against the same float64 reference: a prefill longer than a chunk, then a
 * second call with a mask carrying the state on; bad chunk sizes are refused by name. */
static void test_gated_delta_update_chunked(void) {
    Dims d = {2, 70, 2, 4, 64, 16};
    double *ref_state = calloc(n_state(d), sizeof(double));
    Host h1 = host_random(d, 0);
    Args x1 = upload(&h1);
    mlxk_array *s1 = run_update_with(&h1, &x1, NULL, NULL, ref_state, 1e-5, 1e-5, 0, __LINE__);
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    int bad_chunks[4] = {8, -16, 24, 256};
    for (int i = 0; i < 4; i++) {
        mlxk_array *y = sentinel, *s = sentinel;
        EXPECT_ERROR(mlxk_gated_delta_update_chunked(x1.q, x1.k, x1.v, x1.a, x1.b, x1.a_log,
                                                     x1.dt_bias, NULL, NULL, bad_chunks[i], &y,
                                                     &s),
                     MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_delta_update_chunked", "chunk_size");
        CHECK(y == sentinel && s == sentinel);
    }
    free_args(&x1);
    host_free(&h1);

    Dims d2 = d;
    d2.t = 40;
    Host h2 = host_random(d2, 0);
    Args x2 = upload(&h2);
    uint8_t mask[80];
    for (int i = 0; i < 80; i++) {
        mask[i] = (uint8_t)(i % 7 != 3 && i < 75);
    }
    mlxk_array *s2 =
        run_update_with(&h2, &x2, s1, mask, ref_state, 1e-5, 1e-5, 16, __LINE__);
    free_ok(s1);
    free_ok(s2);
    free_args(&x2);
    host_free(&h2);
    free(ref_state);
}

/* The update's backward pass: eight gradients of the inputs' shapes, finite, and zero when no
 * cotangent is given; its own arguments named when wrong. */
static void test_gated_delta_update_vjp(void) {
    Dims d = {1, 6, 1, 2, 32, 4};
    Host h = host_random(d, 0);
    Args x = upload(&h);
    int32_t dy_shape[4] = {1, 6, 2, 4};
    float dy_data[48];
    for (int i = 0; i < 48; i++) dy_data[i] = (float)((i % 7) - 3) * 0.25f;
    mlxk_array *dy = new_f32(dy_data, dy_shape, 4);
    mlxk_array *g[8] = {NULL};
    CHECK_OK(mlxk_gated_delta_update_vjp(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         dy, NULL, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                                         &g[6], &g[7]));
    size_t want_ndim[8] = {4, 4, 4, 3, 3, 1, 1, 4};
    for (int i = 0; i < 8; i++) {
        size_t ndim = 0;
        CHECK_OK(mlxk_array_ndim(g[i], &ndim));
        CHECK(ndim == want_ndim[i]);
        mlxk_array *f = NULL;
        CHECK_OK(mlxk_array_astype(g[i], MLXK_DTYPE_FLOAT32, &f));
        size_t n = 0;
        CHECK_OK(mlxk_array_nbytes(f, &n));
        float *values = mlxkt_read_floats(f, n / 4);
        int finite = 1;
        for (size_t j = 0; j < n / 4; j++) finite &= isfinite(values[j]) != 0;
        CHECK(finite);
        free(values);
        free_ok(f);
        free_ok(g[i]);
    }
    int32_t bad_shape[4] = {1, 6, 2, 5};
    float bad_data[60] = {0};
    mlxk_array *bad = new_f32(bad_data, bad_shape, 4);
    EXPECT_ERROR(mlxk_gated_delta_update_vjp(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL,
                                             NULL, bad, NULL, &g[0], &g[1], &g[2], &g[3], &g[4],
                                             &g[5], &g[6], &g[7]),
                 MLXK_ERR_SHAPE, "mlxk_gated_delta_update_vjp", "dy");
    free_ok(bad);
    free_ok(dy);
    free_args(&x);
    host_free(&h);
}

static void test_gated_delta_update(void) {
    /* f32, B = 2, T = 5, Hv/Hk = 2, Dk = 64, Dv = 16: no state, no mask. */
    Dims d = {2, 5, 2, 4, 64, 16};
    double *ref_state = calloc(n_state(d), sizeof(double));
    Host h1 = host_random(d, 0);
    Args x1 = upload(&h1);
    mlxk_array *s1 = run_update(&h1, &x1, NULL, NULL, ref_state, 1e-5, 1e-5, __LINE__);
    free_args(&x1);
    host_free(&h1);

    /* Carrying the state, with a mask (row 0 pads its first two tokens, row 1 its last). */
    Host h2 = host_random(d, 0);
    Args x2 = upload(&h2);
    uint8_t mask[10] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 0};
    float *s1_before = mlxkt_read_floats(s1, n_state(d));
    mlxk_array *s2 = run_update(&h2, &x2, s1, mask, ref_state, 1e-5, 1e-5, __LINE__);
    /* s1 is still a live handle, so the kernel must not have written into it. */
    float *s1_after = mlxkt_read_floats(s1, n_state(d));
    CHECK(memcmp(s1_before, s1_after, n_state(d) * sizeof(float)) == 0);
    free(s1_before);
    free(s1_after);
    free_ok(s1);
    free_args(&x2);
    host_free(&h2);

    /* Decode loop, T = 1: the old state is freed before the new one is evaluated (in place). */
    Dims d1 = d;
    d1.t = 1;
    mlxk_array *state = s2;
    for (int step = 0; step < 4; step++) {
        Host h = host_random(d1, 0);
        Args x = upload(&h);
        mlxk_array *y = NULL, *next = NULL;
        CHECK_OK(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state, NULL,
                                         &y, &next));
        free_ok(state);
        state = next;
        free_args(&x); /* lazy results keep what they need */
        double y_ref[2 * 4 * 16];
        ref_update(&h, NULL, ref_state, y_ref);
        CHECK_OK(mlxk_array_eval(state));
        float *yg = mlxkt_read_floats(y, n_v(d1));
        float *sg = mlxkt_read_floats(state, n_state(d1));
        CHECK(rel_error(yg, y_ref, n_v(d1)) <= 1e-5);
        CHECK(rel_error(sg, ref_state, n_state(d1)) <= 1e-5);
        free(yg);
        free(sg);
        free_ok(y);
        host_free(&h);
    }
    free_ok(state);
    free(ref_state);

    /* bfloat16 q, k, v, a, b, dt_bias; Hv/Hk = 3, Dk = 32, Dv = 8; all-true mask. y is bf16:
     * allow 2 bf16 ulps of its scale. */
    Dims db = {1, 4, 1, 3, 32, 8};
    double *rs = calloc(n_state(db), sizeof(double));
    Host hb = host_random(db, 1);
    Args xb = upload(&hb);
    uint8_t all[4] = {1, 1, 1, 1};
    mlxk_array *sb = run_update(&hb, &xb, NULL, all, rs, 2.0 / 128, 1e-5, __LINE__);
    free_ok(sb);
    free_args(&xb);
    host_free(&hb);
    free(rs);
}

static void test_gated_delta_errors(void) {
    Dims d = {2, 3, 2, 4, 32, 8};
    Host h = host_random(d, 0);
    Args x = upload(&h);
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *y = sentinel, *s = sentinel;
    const char *fn = "mlxk_gated_delta_update";

    /* Wrong-shaped and wrong-typed companions. */
    float zeros[4096] = {0};
    int32_t r3[3] = {2, 3, 2};
    int32_t dk48[4] = {2, 3, 2, 48}, hv3[4] = {2, 3, 3, 8}, vb1[4] = {1, 3, 4, 8};
    int32_t g_t2[3] = {2, 2, 4}, hv5[1] = {5};
    int32_t st_ok[4] = {2, 4, 8, 32}, st_bad[4] = {2, 4, 8, 64};
    int32_t m_ok[2] = {2, 3}, m_bad[2] = {2, 4};
    mlxk_array *q_rank3 = new_f32(zeros, r3, 3);
    mlxk_array *q_dk48 = new_f32(zeros, dk48, 4);
    mlxk_array *v_hv3 = new_f32(zeros, hv3, 4);
    mlxk_array *v_b1 = new_f32(zeros, vb1, 4);
    mlxk_array *a_t2 = new_f32(zeros, g_t2, 3);
    mlxk_array *len5 = new_f32(zeros, hv5, 1);
    mlxk_array *state_bad = new_f32(zeros, st_bad, 4);
    mlxk_array *mask_bad_shape = NULL, *mask_f32 = new_f32(zeros, m_ok, 2);
    uint8_t mbytes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_OK(mlxk_array_new(mbytes, m_bad, 2, MLXK_DTYPE_BOOL, &mask_bad_shape));
    mlxk_array *state_ok = NULL, *state_bf16 = NULL, *k_bf16 = NULL, *b_int = NULL,
               *dt_int = NULL, *k_dk48 = NULL;
    CHECK_OK(mlxk_array_zeros(st_ok, 4, MLXK_DTYPE_FLOAT32, &state_ok));
    CHECK_OK(mlxk_array_astype(state_ok, MLXK_DTYPE_BFLOAT16, &state_bf16));
    CHECK_OK(mlxk_array_astype(x.k, MLXK_DTYPE_BFLOAT16, &k_bf16));
    CHECK_OK(mlxk_array_astype(x.b, MLXK_DTYPE_INT32, &b_int));
    CHECK_OK(mlxk_array_astype(x.dt_bias, MLXK_DTYPE_INT32, &dt_int));
    CHECK_OK(mlxk_array_astype(q_dk48, MLXK_DTYPE_FLOAT32, &k_dk48));

#define UPD(q, k, v, a, b, al, dt, st, m) \
    mlxk_gated_delta_update((q), (k), (v), (a), (b), (al), (dt), (st), (m), &y, &s)

    EXPECT_ERROR(UPD(q_rank3, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE,
                 fn, ": q: expected rank 4");
    EXPECT_ERROR(UPD(x.q, q_rank3, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE,
                 fn, ": k: expected rank 4");
    EXPECT_ERROR(UPD(q_dk48, k_dk48, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_SHAPE, fn, ": q: Dk (dimension 3) is 48");
    EXPECT_ERROR(UPD(x.q, k_bf16, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_DTYPE, fn,
                 ": k: dtype bfloat16");
    EXPECT_ERROR(UPD(x.q, x.k, v_hv3, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": v: Hv (dimension 2) is 3");
    EXPECT_ERROR(UPD(x.q, x.k, v_b1, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": v: dimension 0 (B)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, a_t2, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": a: dimension 1 (T)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, a_t2, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": b: dimension 1 (T)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, b_int, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_DTYPE, fn,
                 ": b: dtype int32");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, len5, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": a_log: dimension 0 (Hv)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, len5, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": dt_bias: dimension 0 (Hv)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, dt_int, NULL, NULL), MLXK_ERR_DTYPE, fn,
                 ": dt_bias: dtype int32");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_bf16, NULL), MLXK_ERR_DTYPE,
                 fn, ": state: dtype bfloat16");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_bad, NULL), MLXK_ERR_SHAPE,
                 fn, ": state: dimension 3 (Dk)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, mask_f32), MLXK_ERR_DTYPE,
                 fn, ": mask: dtype float32");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, mask_bad_shape),
                 MLXK_ERR_SHAPE, fn, ": mask: dimension 1 (T)");

    /* NULL where not allowed. */
    EXPECT_ERROR(UPD(NULL, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": q is NULL");
    EXPECT_ERROR(UPD(x.q, x.k, NULL, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": v is NULL");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, NULL, NULL, NULL), MLXK_ERR_NULL_POINTER, fn,
                 ": dt_bias is NULL");
    EXPECT_ERROR(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         NULL, &s),
                 MLXK_ERR_NULL_POINTER, fn, ": y is NULL");
    EXPECT_ERROR(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         &y, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": state_out is NULL");
    EXPECT_ERROR(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         &y, &y),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": y and state_out");

    /* Dead and foreign handles. */
    int on_stack = 0;
    mlxk_array *stack_handle = (mlxk_array *)(void *)&on_stack;
    EXPECT_ERROR(UPD(x.q, x.k, stack_handle, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_INVALID_HANDLE, fn, ": v (0x");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, stack_handle),
                 MLXK_ERR_INVALID_HANDLE, fn, ": mask (0x");
    free_ok(state_bad);
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_bad, NULL),
                 MLXK_ERR_INVALID_HANDLE, fn, ": state (0x");
    CHECK(on_stack == 0);
    CHECK(y == sentinel && s == sentinel);

    /* Still works after all that. */
    CHECK_OK(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_ok, NULL));
    CHECK_OK(mlxk_array_eval(y));
    free_ok(y);
    free_ok(s);
#undef UPD

    free_ok(q_rank3);
    free_ok(q_dk48);
    free_ok(v_hv3);
    free_ok(v_b1);
    free_ok(a_t2);
    free_ok(len5);
    free_ok(mask_bad_shape);
    free_ok(mask_f32);
    free_ok(state_ok);
    free_ok(state_bf16);
    free_ok(k_bf16);
    free_ok(b_int);
    free_ok(dt_int);
    free_ok(k_dk48);
    free_args(&x);
    host_free(&h);
}

/* Prefix replay: each row's state after its accepted prefix, bit-identical to the update's
 * state_out over the same tokens (here: the update with the rejected tokens masked out, which
 * leaves the state untouched at those tokens). */
static void test_gated_delta_state(void) {
    Dims d = {3, 4, 2, 4, 32, 8};
    const char *fn = "mlxk_gated_delta_state";
    Host h0 = host_random(d, 0), h = host_random(d, 0);
    Args x0 = upload(&h0), x = upload(&h);
    mlxk_array *y0 = NULL, *s0 = NULL;
    CHECK_OK(mlxk_gated_delta_update(x0.q, x0.k, x0.v, x0.a, x0.b, x0.a_log, x0.dt_bias, NULL, NULL,
                                     &y0, &s0));
    free_ok(y0);

    int32_t lengths[3] = {4, 0, 2};
    uint8_t mask[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0};
    int32_t ms[2] = {d.b, d.t};
    mlxk_array *mask_array = NULL, *y = NULL, *s_update = NULL, *s_replay = NULL;
    CHECK_OK(mlxk_array_new(mask, ms, 2, MLXK_DTYPE_BOOL, &mask_array));
    CHECK_OK(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, mask_array,
                                     &y, &s_update));
    CHECK_OK(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3,
                                    &s_replay));
    int32_t ss[4] = {d.b, d.hv, d.dv, d.dk};
    check_shape(s_replay, ss, 4, MLXK_DTYPE_FLOAT32, __LINE__);
    float *su = mlxkt_read_floats(s_update, n_state(d));
    float *sr = mlxkt_read_floats(s_replay, n_state(d));
    float *start = mlxkt_read_floats(s0, n_state(d));
    CHECK(memcmp(su, sr, n_state(d) * sizeof(float)) == 0);
    size_t row = n_state(d) / (size_t)d.b;
    CHECK(memcmp(sr + row, start + row, row * sizeof(float)) == 0); /* length 0: untouched */
    CHECK(memcmp(sr, start, row * sizeof(float)) != 0);
    /* And against the float64 reference. */
    double *ref = mlxkt_xmalloc(n_state(d) * sizeof *ref);
    double *yref = mlxkt_xmalloc(n_v(d) * sizeof *yref);
    if (ref == NULL || yref == NULL) {
        exit(1);
    }
    for (size_t i = 0; i < n_state(d); i++) {
        ref[i] = start[i];
    }
    ref_update(&h, mask, ref, yref);
    CHECK(rel_error(sr, ref, n_state(d)) <= 1e-5);
    free(ref);
    free(yref);
    free(su);
    free(sr);
    free(start);
    free_ok(s_replay);
    free_ok(s_update);
    free_ok(y);
    free_ok(mask_array);

    /* No state: from zeros; all lengths 0 gives zeros. */
    int32_t none[3] = {0, 0, 0};
    CHECK_OK(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, none, 3,
                                    &s_replay));
    float *z = mlxkt_read_floats(s_replay, n_state(d));
    int all_zero = 1;
    for (size_t i = 0; i < n_state(d); i++) {
        all_zero &= z[i] == 0.0f;
    }
    CHECK(all_zero);
    free(z);
    free_ok(s_replay);

    /* Errors. */
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *out = sentinel;
    int32_t too_long[3] = {4, 5, 0}, negative[3] = {-1, 0, 0};
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 2, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths: n_lengths is 2");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, too_long, 3, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths[1] is 5");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, negative, 3, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths[0] is -1");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, NULL, 3, &out),
                 MLXK_ERR_NULL_POINTER, fn, ": accepted_lengths is NULL");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": state_out is NULL");
    EXPECT_ERROR(mlxk_gated_delta_state(NULL, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3, &out),
                 MLXK_ERR_NULL_POINTER, fn, ": k is NULL");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, NULL, 0, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths: n_lengths is 0");
    EXPECT_ERROR(mlxk_gated_delta_state(x.v, x.k, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3, &out),
                 MLXK_ERR_SHAPE, fn, ": v:");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.q, lengths, 3, &out),
                 MLXK_ERR_SHAPE, fn, ": state:");
    mlxk_array *dead = NULL;
    CHECK_OK(mlxk_array_astype(x.b, MLXK_DTYPE_FLOAT16, &dead));
    free_ok(dead);
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, dead, x.a_log, x.dt_bias, s0, lengths, 3, &out),
                 MLXK_ERR_INVALID_HANDLE, fn, ": b (0x");
    CHECK(out == sentinel);

    free_ok(s0);
    free_args(&x0);
    free_args(&x);
    host_free(&h0);
    host_free(&h);
}

static double ref_silu(double z) { return z / (1.0 + exp(-z)); }

/* Gated RMSNorm: out = silu(gate) * (weight * x * rsqrt(mean(x^2) + eps)), per row of D. */
static void test_gated_rms_norm(void) {
    enum { ROWS = 6, D = 40 };
    const char *fn = "mlxk_gated_rms_norm";
    const float eps = 1e-6f;
    float x[ROWS * D], gate[ROWS * D], w[D];
    for (int i = 0; i < ROWS * D; i++) {
        x[i] = 2.0f * mlxkt_rng_sym(&rng);
        gate[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < D; i++) {
        w[i] = 1.0f + 0.5f * mlxkt_rng_sym(&rng);
    }
    int32_t xs[3] = {2, 3, D}, ws[1] = {D};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (bf16) {
            for (int i = 0; i < ROWS * D; i++) {
                x[i] = mlxkt_bf16_round(x[i]);
                gate[i] = mlxkt_bf16_round(gate[i]);
            }
            for (int i = 0; i < D; i++) {
                w[i] = mlxkt_bf16_round(w[i]);
            }
        }
        mlxk_array *xa = bf16 ? new_bf16(x, ROWS * D, xs, 3) : new_f32(x, xs, 3);
        mlxk_array *ga = bf16 ? new_bf16(gate, ROWS * D, xs, 3) : new_f32(gate, xs, 3);
        mlxk_array *wa = bf16 ? new_bf16(w, D, ws, 1) : new_f32(w, ws, 1);
        mlxk_array *out = NULL;
        CHECK_OK(mlxk_gated_rms_norm(xa, ga, wa, eps, &out));
        check_shape(out, xs, 3, bf16 ? MLXK_DTYPE_BFLOAT16 : MLXK_DTYPE_FLOAT32, __LINE__);
        double ref[ROWS * D];
        for (int r = 0; r < ROWS; r++) {
            double ss = 0.0;
            for (int i = 0; i < D; i++) {
                ss += (double)x[r * D + i] * x[r * D + i];
            }
            double inv = 1.0 / sqrt(ss / D + eps);
            for (int i = 0; i < D; i++) {
                ref[r * D + i] = ref_silu(gate[r * D + i]) * (w[i] * (x[r * D + i] * inv));
            }
        }
        float *got = mlxkt_read_floats(out, ROWS * D);
        /* float32: float32 rounding only; bfloat16: three roundings to bf16 on the way. */
        double err = rel_error(got, ref, ROWS * D), tol = bf16 ? 4.0 / 256 : 1e-5;
        CHECK(err <= tol);
        if (err > tol) {
            fprintf(stderr, "  gated_rms_norm (bf16 = %d): error %.3e\n", bf16, err);
        }
        free(got);
        free_ok(out);

        if (!bf16) {
            mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
            mlxk_array *bad = sentinel, *w_bf16 = NULL, *short_w = NULL, *g2 = NULL;
            int32_t s2[2] = {ROWS, D}, s5[1] = {5};
            CHECK_OK(mlxk_array_astype(wa, MLXK_DTYPE_BFLOAT16, &w_bf16));
            short_w = new_f32(w, s5, 1);
            g2 = new_f32(gate, s2, 2);
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, w_bf16, eps, &bad), MLXK_ERR_DTYPE, fn,
                         ": weight: dtype bfloat16");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, short_w, eps, &bad), MLXK_ERR_SHAPE, fn,
                         ": weight:");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, g2, wa, eps, &bad), MLXK_ERR_SHAPE, fn, ": gate:");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, wa, -1.0f, &bad), MLXK_ERR_INVALID_ARGUMENT, fn,
                         "eps");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, wa, (float)NAN, &bad),
                         MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
            EXPECT_ERROR(mlxk_gated_rms_norm(NULL, ga, wa, eps, &bad), MLXK_ERR_NULL_POINTER, fn,
                         ": x is NULL");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, NULL, wa, eps, &bad), MLXK_ERR_NULL_POINTER, fn,
                         ": gate is NULL");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, NULL, eps, &bad), MLXK_ERR_NULL_POINTER, fn,
                         ": weight is NULL");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, wa, eps, NULL), MLXK_ERR_NULL_POINTER, fn,
                         ": out is NULL");
            free_ok(short_w);
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, short_w, eps, &bad), MLXK_ERR_INVALID_HANDLE,
                         fn, ": weight (0x");
            CHECK(bad == sentinel);
            free_ok(w_bf16);
            free_ok(g2);
        }
        free_ok(xa);
        free_ok(ga);
        free_ok(wa);
    }
}

/* sum(g * gated_rms_norm(x, z, w)) in float64 over ROWS rows of D. */
static double norm_loss(const double *x, const double *z, const double *w, const float *g, int rows,
                        int d, double eps) {
    double total = 0.0;
    for (int r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int i = 0; i < d; i++) {
            ss += x[r * d + i] * x[r * d + i];
        }
        double inv = 1.0 / sqrt(ss / d + eps);
        for (int i = 0; i < d; i++) {
            total += g[r * d + i] * ref_silu(z[r * d + i]) * w[i] * x[r * d + i] * inv;
        }
    }
    return total;
}

/* The gated norm's backward pass: each gradient against a central difference of the float64
 * loss along a random direction (<grad, u> = dL/dt at t = 0 for x + t u); NULL dout gives
 * zeros; its own arguments named when wrong. */
static void test_gated_rms_norm_vjp(void) {
    enum { ROWS = 4, D = 48, N = ROWS * D };
    const char *fn = "mlxk_gated_rms_norm_vjp";
    const double eps = 1e-5;
    static float x[N], z[N], w[D], g[N];
    static double in[3][N], dir[3][N];
    for (int i = 0; i < N; i++) {
        x[i] = 2.0f * mlxkt_rng_sym(&rng);
        z[i] = 3.0f * mlxkt_rng_sym(&rng);
        g[i] = mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < D; i++) {
        w[i] = 1.0f + 0.5f * mlxkt_rng_sym(&rng);
    }
    int32_t xs[2] = {ROWS, D}, ws[1] = {D};
    mlxk_array *xa = new_f32(x, xs, 2), *za = new_f32(z, xs, 2), *wa = new_f32(w, ws, 1);
    mlxk_array *ga = new_f32(g, xs, 2);
    mlxk_array *grads[3] = {NULL, NULL, NULL};
    CHECK_OK(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, ga, &grads[0], &grads[1], &grads[2]));
    check_shape(grads[0], xs, 2, MLXK_DTYPE_FLOAT32, __LINE__);
    check_shape(grads[1], xs, 2, MLXK_DTYPE_FLOAT32, __LINE__);
    check_shape(grads[2], ws, 1, MLXK_DTYPE_FLOAT32, __LINE__);
    const int counts[3] = {N, N, D};
    for (int which = 0; which < 3; which++) {
        const float *src = which == 0 ? x : which == 1 ? z : w;
        for (int i = 0; i < counts[which]; i++) {
            in[which][i] = src[i];
            dir[which][i] = mlxkt_rng_sym(&rng);
        }
    }
    for (int which = 0; which < 3; which++) {
        float *got = mlxkt_read_floats(grads[which], (size_t)counts[which]);
        double along = 0.0, scale = 0.0;
        for (int i = 0; i < counts[which]; i++) {
            along += got[i] * dir[which][i];
            scale += fabs(got[i] * dir[which][i]);
        }
        const double h = 1e-6;
        double *p = in[which];
        for (int i = 0; i < counts[which]; i++) p[i] += h * dir[which][i];
        double up = norm_loss(in[0], in[1], in[2], g, ROWS, D, eps);
        for (int i = 0; i < counts[which]; i++) p[i] -= 2 * h * dir[which][i];
        double down = norm_loss(in[0], in[1], in[2], g, ROWS, D, eps);
        for (int i = 0; i < counts[which]; i++) p[i] += h * dir[which][i];
        double want = (up - down) / (2 * h);
        /* float32 gradients summed along u: a few float32 roundings of each term. */
        CHECK(fabs(along - want) <= 1e-5 * scale + 1e-7);
        if (fabs(along - want) > 1e-5 * scale + 1e-7) {
            fprintf(stderr, "  gated_rms_norm_vjp input %d: %.9g vs %.9g\n", which, along, want);
        }
        free(got);
        free_ok(grads[which]);
    }
    CHECK_OK(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, NULL, &grads[0], &grads[1], &grads[2]));
    for (int which = 0; which < 3; which++) {
        float *got = mlxkt_read_floats(grads[which], (size_t)counts[which]);
        int zero = 1;
        for (int i = 0; i < counts[which]; i++) zero &= got[i] == 0.0f;
        CHECK(zero);
        free(got);
        free_ok(grads[which]);
    }
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o[3] = {sentinel, sentinel, sentinel};
    int32_t short_shape[2] = {ROWS, D - 1};
    mlxk_array *short_g = new_f32(g, short_shape, 2);
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, short_g, &o[0], &o[1], &o[2]),
                 MLXK_ERR_SHAPE, fn, ": dout: shape");
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, ga, &o[0], &o[0], &o[2]),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "dx and dgate");
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, ga, &o[0], &o[1], NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": dweight is NULL");
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, -1.0f, ga, &o[0], &o[1], &o[2]),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    CHECK(o[0] == sentinel && o[1] == sentinel && o[2] == sentinel);
    free_ok(short_g);
    free_ok(xa);
    free_ok(za);
    free_ok(wa);
    free_ok(ga);
}

/* Head split of the conv output x [B, S, 2*Hk*Dk + Hv*Dv]: silu everywhere, q and k
 * RMS-normalized per head and scaled, v = silu. */
static void test_silu_rms_heads(void) {
    enum { B = 2, S = 3, HK = 2, DK = 16, HV = 4, DV = 8, C = 2 * HK * DK + HV * DV };
    const char *fn = "mlxk_silu_rms_heads";
    const float eps = 1e-6f / DK;
    float x[B * S * C], qs[DK], ks[DK];
    for (int i = 0; i < B * S * C; i++) {
        x[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < DK; i++) {
        qs[i] = 1.0f / DK;
        ks[i] = 1.0f / sqrtf((float)DK);
    }
    int32_t xs[3] = {B, S, C}, ss[1] = {DK};
    int32_t qk_shape[4] = {B, S, HK, DK}, v_shape[4] = {B, S, HV, DV};
    mlxk_array *xa = new_f32(x, xs, 3), *qa = new_f32(qs, ss, 1), *ka = new_f32(ks, ss, 1);
    mlxk_array *q = NULL, *k = NULL, *v = NULL;
    CHECK_OK(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, eps, &q, &k, &v));
    check_shape(q, qk_shape, 4, MLXK_DTYPE_FLOAT32, __LINE__);
    check_shape(k, qk_shape, 4, MLXK_DTYPE_FLOAT32, __LINE__);
    check_shape(v, v_shape, 4, MLXK_DTYPE_FLOAT32, __LINE__);
    double qr[B * S * HK * DK], kr[B * S * HK * DK], vr[B * S * HV * DV];
    for (int bs = 0; bs < B * S; bs++) {
        const float *row = x + bs * C;
        for (int which = 0; which < 2; which++) {
            for (int h = 0; h < HK; h++) {
                const float *head = row + (which * HK + h) * DK;
                double ssum = 0.0;
                for (int i = 0; i < DK; i++) {
                    ssum += ref_silu(head[i]) * ref_silu(head[i]);
                }
                double inv = 1.0 / sqrt(ssum / DK + eps);
                for (int i = 0; i < DK; i++) {
                    double value = ref_silu(head[i]) * inv;
                    if (which == 0) {
                        qr[(bs * HK + h) * DK + i] = qs[i] * value;
                    } else {
                        kr[(bs * HK + h) * DK + i] = ks[i] * value;
                    }
                }
            }
        }
        for (int i = 0; i < HV * DV; i++) {
            vr[bs * HV * DV + i] = ref_silu(row[2 * HK * DK + i]);
        }
    }
    float *qg = mlxkt_read_floats(q, B * S * HK * DK), *kg = mlxkt_read_floats(k, B * S * HK * DK);
    float *vg = mlxkt_read_floats(v, B * S * HV * DV);
    CHECK(rel_error(qg, qr, B * S * HK * DK) <= 1e-5);
    CHECK(rel_error(kg, kr, B * S * HK * DK) <= 1e-5);
    CHECK(rel_error(vg, vr, B * S * HV * DV) <= 1e-5);
    free(qg);
    free(kg);
    free(vg);
    free_ok(q);
    free_ok(k);
    free_ok(v);

    /* Errors. */
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o1 = sentinel, *o2 = sentinel, *o3 = sentinel, *qs_bf16 = NULL, *x2 = NULL;
    int32_t x2s[2] = {B * S, C};
    x2 = new_f32(x, x2s, 2);
    CHECK_OK(mlxk_array_astype(qa, MLXK_DTYPE_BFLOAT16, &qs_bf16));
    EXPECT_ERROR(mlxk_silu_rms_heads(x2, qa, ka, HK, HV, DV, eps, &o1, &o2, &o3), MLXK_ERR_SHAPE,
                 fn, ": x: expected rank 3");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV + 1, eps, &o1, &o2, &o3), MLXK_ERR_SHAPE,
                 fn, ": x: dimension 2 (channels)");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qs_bf16, ka, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_DTYPE, fn, "q_scale");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, 0, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": key_heads is 0");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, -1, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": value_heads is -1");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, 0, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": value_width is 0");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, -eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, (float)INFINITY, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    EXPECT_ERROR(mlxk_silu_rms_heads(NULL, qa, ka, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_NULL_POINTER, fn, ": x is NULL");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, NULL, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_NULL_POINTER, fn, ": k_scale is NULL");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, eps, &o1, NULL, &o3),
                 MLXK_ERR_NULL_POINTER, fn, ": k is NULL");
    free_ok(x2);
    EXPECT_ERROR(mlxk_silu_rms_heads(x2, qa, ka, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_HANDLE, fn, ": x (0x");
    CHECK(o1 == sentinel && o2 == sentinel && o3 == sentinel);
    free_ok(qs_bf16);
    free_ok(xa);
    free_ok(qa);
    free_ok(ka);
}

/* The head split and the update in one call: the bits of mlxk_silu_rms_heads followed by
 * mlxk_gated_delta_update (float32, GQA 2, a mask, a given state), and its argument errors. */
static void test_gated_delta_update_from_conv(void) {
    enum { B = 2, T = 3, HK = 1, HV = 2, DK = 32, DV = 5, C = 2 * HK * DK + HV * DV };
    const char *fn = "mlxk_gated_delta_update_from_conv";
    const float eps = 1e-6f / DK;
    float x[B * T * C], qs[DK], ks[DK], a[B * T * HV], b[B * T * HV], a_log[HV], dt[HV];
    float st[B * HV * DV * DK];
    for (int i = 0; i < B * T * C; i++) x[i] = 3.0f * mlxkt_rng_sym(&rng);
    for (int i = 0; i < DK; i++) {
        qs[i] = (1.0f + 0.5f * mlxkt_rng_sym(&rng)) / DK;
        ks[i] = (1.0f + 0.5f * mlxkt_rng_sym(&rng)) / sqrtf((float)DK);
    }
    for (int i = 0; i < B * T * HV; i++) {
        a[i] = 2.0f * mlxkt_rng_sym(&rng);
        b[i] = 2.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < HV; i++) {
        a_log[i] = mlxkt_rng_sym(&rng);
        dt[i] = mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < B * HV * DV * DK; i++) st[i] = 0.5f * mlxkt_rng_sym(&rng);
    const bool mask[B * T] = {true, true, false, true, false, true};
    int32_t xs[3] = {B, T, C}, ss[1] = {DK}, gs[3] = {B, T, HV}, hs[1] = {HV};
    int32_t sts[4] = {B, HV, DV, DK}, ms[2] = {B, T};
    int32_t y_shape[4] = {B, T, HV, DV};
    mlxk_array *xa = new_f32(x, xs, 3), *qa = new_f32(qs, ss, 1), *ka = new_f32(ks, ss, 1);
    mlxk_array *aa = new_f32(a, gs, 3), *ba = new_f32(b, gs, 3), *la = new_f32(a_log, hs, 1);
    mlxk_array *da = new_f32(dt, hs, 1), *sa = new_f32(st, sts, 4), *ma = NULL;
    CHECK_OK(mlxk_array_new(mask, ms, 2, MLXK_DTYPE_BOOL, &ma));
    mlxk_array *y = NULL, *s = NULL;
    CHECK_OK(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, aa, ba, la, da, sa, ma,
                                               &y, &s));
    check_shape(y, y_shape, 4, MLXK_DTYPE_FLOAT32, __LINE__);
    check_shape(s, sts, 4, MLXK_DTYPE_FLOAT32, __LINE__);
    mlxk_array *q = NULL, *k = NULL, *v = NULL, *y2 = NULL, *s2 = NULL;
    CHECK_OK(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, eps, &q, &k, &v));
    CHECK_OK(mlxk_gated_delta_update(q, k, v, aa, ba, la, da, sa, ma, &y2, &s2));
    float *yg = mlxkt_read_floats(y, B * T * HV * DV), *yr = mlxkt_read_floats(y2, B * T * HV * DV);
    float *sg = mlxkt_read_floats(s, B * HV * DV * DK), *sr = mlxkt_read_floats(s2, B * HV * DV * DK);
    CHECK(memcmp(yg, yr, sizeof(float) * B * T * HV * DV) == 0);
    CHECK(memcmp(sg, sr, sizeof(float) * B * HV * DV * DK) == 0);
    int moved = 0;
    for (int i = 0; i < B * HV * DV * DK; i++) moved += sg[i] != st[i];
    CHECK(moved > 0);
    free(yg);
    free(yr);
    free(sg);
    free(sr);
    free_ok(q);
    free_ok(k);
    free_ok(v);
    free_ok(y);
    free_ok(s);
    free_ok(y2);
    free_ok(s2);

    /* Errors name this call's arguments. */
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o1 = sentinel, *o2 = sentinel;
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(NULL, qa, ka, HK, HV, DV, eps, aa, ba, la, da,
                                                   sa, ma, &o1, &o2),
                 MLXK_ERR_NULL_POINTER, fn, "x");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV + 1, eps, aa, ba, la, da,
                                                   sa, ma, &o1, &o2),
                 MLXK_ERR_SHAPE, fn, ": x: dimension 2 (channels)");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, ba, aa, la, da,
                                                   ma, ma, &o1, &o2),
                 MLXK_ERR_SHAPE, fn, ": state: expected rank 4");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, xa, ba, la, da, sa,
                                                   ma, &o1, &o2),
                 MLXK_ERR_SHAPE, fn, ": a: dimension 2 (Hv)");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, -1.0f, aa, ba, la, da,
                                                   sa, ma, &o1, &o2),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, aa, ba, la, da, sa,
                                                   ma, &o1, &o1),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "y and state_out");
    CHECK(o1 == sentinel && o2 == sentinel);
    mlxk_array *all[] = {xa, qa, ka, aa, ba, la, da, sa, ma};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free_ok(all[i]);
}

enum { SB = 2, SS = 2, SHK = 2, SDK = 12, SHV = 3, SDV = 5, SC = 2 * SHK * SDK + SHV * SDV };

/* sum(gq * q) + sum(gk * k) + sum(gv * v) of the head split in float64. */
static double split_loss(const double *x, const double *qs, const double *ks, const float *gq,
                         const float *gk, const float *gv, double eps) {
    double total = 0.0;
    for (int bs = 0; bs < SB * SS; bs++) {
        const double *row = x + bs * SC;
        for (int which = 0; which < 2; which++) {
            for (int h = 0; h < SHK; h++) {
                const double *head = row + (which * SHK + h) * SDK;
                double ssum = 0.0;
                for (int i = 0; i < SDK; i++) ssum += ref_silu(head[i]) * ref_silu(head[i]);
                double inv = 1.0 / sqrt(ssum / SDK + eps);
                const float *g = (which == 0 ? gq : gk) + (bs * SHK + h) * SDK;
                const double *scale = which == 0 ? qs : ks;
                for (int i = 0; i < SDK; i++) total += g[i] * scale[i] * ref_silu(head[i]) * inv;
            }
        }
        for (int i = 0; i < SHV * SDV; i++) {
            total += gv[bs * SHV * SDV + i] * ref_silu(row[2 * SHK * SDK + i]);
        }
    }
    return total;
}

/* The head split's backward pass: each gradient against a central difference of the float64
 * loss along a random direction; absent cotangents are zeros; its own arguments named. */
static void test_silu_rms_heads_vjp(void) {
    enum { NX = SB * SS * SC, NQ = SB * SS * SHK * SDK, NV = SB * SS * SHV * SDV };
    const char *fn = "mlxk_silu_rms_heads_vjp";
    const double eps = 1e-4;
    static float x[NX], qs[SDK], ks[SDK], gq[NQ], gk[NQ], gv[NV];
    static double in[3][NX], dir[3][NX];
    for (int i = 0; i < NX; i++) x[i] = 3.0f * mlxkt_rng_sym(&rng);
    for (int i = 0; i < SDK; i++) {
        qs[i] = 0.5f + mlxkt_rng_sym(&rng);
        ks[i] = 0.5f + mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < NQ; i++) {
        gq[i] = mlxkt_rng_sym(&rng);
        gk[i] = mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < NV; i++) gv[i] = mlxkt_rng_sym(&rng);
    int32_t xs[3] = {SB, SS, SC}, ss[1] = {SDK};
    int32_t qk_shape[4] = {SB, SS, SHK, SDK}, v_shape[4] = {SB, SS, SHV, SDV};
    mlxk_array *xa = new_f32(x, xs, 3), *qa = new_f32(qs, ss, 1), *ka = new_f32(ks, ss, 1);
    mlxk_array *gqa = new_f32(gq, qk_shape, 4), *gka = new_f32(gk, qk_shape, 4);
    mlxk_array *gva = new_f32(gv, v_shape, 4);
    mlxk_array *grads[3] = {NULL, NULL, NULL};
    CHECK_OK(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gqa, gka, gva,
                                     &grads[0], &grads[1], &grads[2]));
    check_shape(grads[0], xs, 3, MLXK_DTYPE_FLOAT32, __LINE__);
    check_shape(grads[1], ss, 1, MLXK_DTYPE_FLOAT32, __LINE__);
    check_shape(grads[2], ss, 1, MLXK_DTYPE_FLOAT32, __LINE__);
    const int counts[3] = {NX, SDK, SDK};
    for (int which = 0; which < 3; which++) {
        const float *src = which == 0 ? x : which == 1 ? qs : ks;
        for (int i = 0; i < counts[which]; i++) {
            in[which][i] = src[i];
            dir[which][i] = mlxkt_rng_sym(&rng);
        }
    }
    for (int which = 0; which < 3; which++) {
        float *got = mlxkt_read_floats(grads[which], (size_t)counts[which]);
        double along = 0.0, scale = 0.0;
        for (int i = 0; i < counts[which]; i++) {
            along += got[i] * dir[which][i];
            scale += fabs(got[i] * dir[which][i]);
        }
        const double h = 1e-6;
        double *p = in[which];
        for (int i = 0; i < counts[which]; i++) p[i] += h * dir[which][i];
        double up = split_loss(in[0], in[1], in[2], gq, gk, gv, eps);
        for (int i = 0; i < counts[which]; i++) p[i] -= 2 * h * dir[which][i];
        double down = split_loss(in[0], in[1], in[2], gq, gk, gv, eps);
        for (int i = 0; i < counts[which]; i++) p[i] += h * dir[which][i];
        double want = (up - down) / (2 * h);
        CHECK(fabs(along - want) <= 1e-5 * scale + 1e-7);
        if (fabs(along - want) > 1e-5 * scale + 1e-7) {
            fprintf(stderr, "  silu_rms_heads_vjp input %d: %.9g vs %.9g\n", which, along, want);
        }
        free(got);
        free_ok(grads[which]);
    }
    /* Only dv: the scales get zero gradients, x only on its v channels. */
    CHECK_OK(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, NULL, NULL, gva,
                                     &grads[0], &grads[1], &grads[2]));
    float *dx = mlxkt_read_floats(grads[0], NX);
    int qk_zero = 1, v_nonzero = 0;
    for (int bs = 0; bs < SB * SS; bs++) {
        for (int c = 0; c < SC; c++) {
            if (c < 2 * SHK * SDK) {
                qk_zero &= dx[bs * SC + c] == 0.0f;
            } else {
                v_nonzero |= dx[bs * SC + c] != 0.0f;
            }
        }
    }
    CHECK(qk_zero && v_nonzero);
    free(dx);
    for (int which = 1; which < 3; which++) {
        float *got = mlxkt_read_floats(grads[which], SDK);
        int zero = 1;
        for (int i = 0; i < SDK; i++) zero &= got[i] == 0.0f;
        CHECK(zero);
        free(got);
    }
    for (int which = 0; which < 3; which++) free_ok(grads[which]);
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o[3] = {sentinel, sentinel, sentinel};
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gva, gka, gva,
                                         &o[0], &o[1], &o[2]),
                 MLXK_ERR_SHAPE, fn, ": dq: dimension 2 (Hk)");
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV + 1, (float)eps, gqa, gka, gva,
                                         &o[0], &o[1], &o[2]),
                 MLXK_ERR_SHAPE, fn, ": x: dimension 2 (channels)");
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gqa, gka, gva,
                                         &o[0], &o[1], &o[1]),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "dq_scale and dk_scale");
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gqa, gka, gva,
                                         NULL, &o[1], &o[2]),
                 MLXK_ERR_NULL_POINTER, fn, ": dx is NULL");
    CHECK(o[0] == sentinel && o[1] == sentinel && o[2] == sentinel);
    mlxk_array *all[6] = {xa, qa, ka, gqa, gka, gva};
    for (int i = 0; i < 6; i++) free_ok(all[i]);
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

static void test_threads(void) {
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

#ifdef MLXK_GLM52_EXPERT_SLOT_ALIGNMENT
/* Sharing with a host's MLX from plain C: a handle's array handed out as an mlx::core::array
 * and taken back in (the round trip shares one array: the bytes are the same); the lock. */
static void test_host_mlx(void) {
    const char *version = mlxk_mlx_version();
    CHECK(version != NULL && strlen(version) >= 5);
    float data[6] = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 8.0f};
    int32_t shape[2] = {2, 3};
    mlxk_array *a = new_f32(data, shape, 2);
    void *host = NULL;
    CHECK_OK(mlxk_array_to_mlx(a, &host));
    CHECK(host != NULL);
    mlxk_array *b = NULL;
    CHECK_OK(mlxk_array_from_mlx(host, &b));
    CHECK_OK(mlxk_mlx_array_free(host));
    CHECK_OK(mlxk_array_free(a));
    float back[6] = {0};
    CHECK_OK(mlxk_array_read(b, back, sizeof back));
    CHECK(memcmp(back, data, sizeof data) == 0);
    EXPECT_ERROR(mlxk_array_from_mlx(NULL, &a), MLXK_ERR_NULL_POINTER, "mlxk_array_from_mlx",
                 "mlx_array");
    EXPECT_ERROR(mlxk_array_to_mlx(b, NULL), MLXK_ERR_NULL_POINTER, "mlxk_array_to_mlx",
                 "mlx_array_out");
    CHECK_OK(mlxk_array_free(b));
    EXPECT_ERROR(mlxk_array_to_mlx(b, &host), MLXK_ERR_INVALID_HANDLE, "mlxk_array_to_mlx",
                 "array");
    CHECK_OK(mlxk_mlx_array_free(NULL));
    CHECK_OK(mlxk_mlx_lock());
    CHECK_OK(mlxk_mlx_lock());
    mlxk_array *c = new_f32(data, shape, 2);
    CHECK_OK(mlxk_array_free(c));
    CHECK_OK(mlxk_mlx_unlock());
    CHECK_OK(mlxk_mlx_unlock());
    EXPECT_ERROR(mlxk_mlx_unlock(), MLXK_ERR_INVALID_ARGUMENT, "mlxk_mlx_unlock", "lock");
}

static void test_glm52(void) {
    CHECK(MLXK_GLM52_EXPERT_SLOT_ALIGNMENT == 16384);
    mlxk_glm52_layout l;
    memset(&l, 0, sizeof l);
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 4, 64, &l));
    CHECK(l.hidden_size == 6144 && l.intermediate_size == 2048);
    CHECK(l.gate_weight_offset == 0 && l.up_weight_offset == 6291456 &&
          l.down_weight_offset == 12582912 && l.gate_scale_offset == 18874368 &&
          l.up_scale_offset == 19267584 && l.down_scale_offset == 19660800 &&
          l.slot_bytes == 20054016);
    CHECK_OK(mlxk_glm52_layout_validate(&l, 4, 64));
    mlxk_glm52_layout q8;
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 8, 64, &q8));
    CHECK(q8.slot_bytes == 38928384 && q8.up_weight_offset == 12582912);
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 4, 32, &q8));
    CHECK(q8.slot_bytes == 21233664);
    CHECK_OK(mlxk_glm52_layout_canonical(6144, 2048, 8, 128, &q8));
    CHECK(q8.slot_bytes == 38338560);

    const char *canon = "mlxk_glm52_layout_canonical", *val = "mlxk_glm52_layout_validate";
    EXPECT_ERROR(mlxk_glm52_layout_canonical(6144, 2048, 4, 64, NULL), MLXK_ERR_NULL_POINTER, canon,
                 "out");
    EXPECT_ERROR(mlxk_glm52_layout_canonical(6144, 2048, 3, 64, &q8), MLXK_ERR_INVALID_ARGUMENT,
                 canon, "bits");
    EXPECT_ERROR(mlxk_glm52_layout_canonical(6144, 2048, 4, 48, &q8), MLXK_ERR_INVALID_ARGUMENT,
                 canon, "group_size");
    EXPECT_ERROR(mlxk_glm52_layout_validate(NULL, 4, 64), MLXK_ERR_NULL_POINTER, val, "layout");
    EXPECT_ERROR(mlxk_glm52_layout_validate(&l, 8, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "exceeds the canonical expert slot");
    mlxk_glm52_layout bad = l;
    bad.down_scale_offset += 8;
    EXPECT_ERROR(mlxk_glm52_layout_validate(&bad, 4, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "down scale offset is not 16-byte aligned");
    bad = l;
    bad.up_scale_offset = bad.down_weight_offset;
    EXPECT_ERROR(mlxk_glm52_layout_validate(&bad, 4, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "up scale overlaps down weight");
    bad = l;
    bad.slot_bytes = 100;
    EXPECT_ERROR(mlxk_glm52_layout_validate(&bad, 4, 64), MLXK_ERR_INVALID_ARGUMENT, val,
                 "slot bytes 100 must be a positive multiple of 16384");
}
#endif

int main(void) {
    mlxkt_checks()->verbose = getenv("MLXK_CLIENT_VERBOSE") != NULL;
    test_versions_and_status_names();
    test_device();
    test_arrays();
    test_array_errors();
    test_memory_limit();
    test_compute_g();
    test_gated_delta_update();
    test_gated_delta_update_chunked();
    test_gated_delta_update_vjp();
    test_gated_delta_errors();
    test_gated_delta_state();
    test_gated_rms_norm();
    test_gated_rms_norm_vjp();
    test_silu_rms_heads();
    test_gated_delta_update_from_conv();
    test_silu_rms_heads_vjp();
    test_threads();
    test_host_mlx();
#ifdef MLXK_GLM52_EXPERT_SLOT_ALIGNMENT
    test_glm52();
    const char *glm = " (GLM-5.2 layout included)";
#else
    const char *glm = " (GLM-5.2 layout not in this header)";
#endif
    const mlxkt_tally *checks = mlxkt_checks();
    printf("client: %ld checks passed, %ld failed%s\n", checks->passed, checks->failed, glm);
    return checks->failed == 0 ? 0 : 1;
}
