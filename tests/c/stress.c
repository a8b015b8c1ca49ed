/*
 * Stress client of the mlxkern C ABI: a long loop of mixed calls, successes and failures, over
 * every function of the header, freeing everything it makes. Built and run by
 * scripts/test/sanitizers.sh: plain (resident memory checked), under AddressSanitizer with
 * LeakSanitizer, and under valgrind memcheck.
 *
 *   stress [calls] [--rss-check]          (default: 10000 calls)
 *
 * Each iteration picks one scenario at random (fixed seed): arrays of random dtypes and shapes
 * (round trips checked), reads into exact, short and NULL buffers, casts, every kernel with
 * valid arguments (results' shapes checked, some values), every kernel with invalid ones
 * (wrong ranks, dims, dtypes, eps, head counts, lengths), NaN and Inf inputs, B = 0 and T = 0,
 * oversized and overflowing dims, requests above a lowered memory limit, freed, double-freed
 * and foreign handles (stack, heap, and freed-heap addresses: the library must never read
 * through them, which AddressSanitizer would report), NULL out-parameters, the GLM-5.2
 * layout functions, and the status, version and device functions. Every failure must return
 * the expected status with a message naming the function.
 *
 * MLX's cache limit is set (mlxk_set_cache_limit). Resident memory is sampled from
 * /proc/self/statm after a warm-up (a fifth of the calls) and at the end; with --rss-check the
 * run fails if it grew by more than RSS_SLACK_KIB.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mlxkern.h"
#include "mlxk_test_util.h"

#define RSS_SLACK_KIB (2 * 1024)
#define CACHE_LIMIT (4u << 20)

static long calls, failures_expected;
static long status_counts[16];

/* Every library call goes through here: counted, status tallied. */
static mlxk_status counted(mlxk_status st) {
    calls++;
    if (st >= 0 && st < 16) {
        status_counts[st]++;
    }
    return st;
}
#define C(call) counted(call)

/* A call that must succeed (a failure is counted, and the run goes on). */
#define OK(call) mlxkt_check_status_at(C(call), #call, __FILE__, __LINE__)

/* A call that must fail with `want`, and a message starting with "fn: ". */
#define EXPECT(call, want, fn)                                                                \
    (failures_expected++,                                                                     \
     mlxkt_expect_error_at(C(call), (want), (fn), NULL, #call, __FILE__, __LINE__))

static mlxkt_rng rng = {0x5EED5EED12345ull};
static uint64_t next(void) { return mlxkt_rng_next(&rng); }
static int below(int n) { return (int)(next() % (uint64_t)n); }

static size_t dtype_size(mlxk_dtype d) {
    static const size_t sizes[] = {1, 1, 1, 4, 4, 2, 2, 4};
    return sizes[d];
}

static size_t count(const int32_t *shape, size_t ndim) {
    size_t n = 1;
    for (size_t i = 0; i < ndim; i++) n *= (size_t)shape[i];
    return n;
}

/* A float array (bf16 or f32) of random values in [-scale, scale]; `special` puts NaN, +Inf
 * and -Inf at random places. */
static mlxk_array *floats(const int32_t *shape, size_t ndim, mlxk_dtype dtype, float scale, int special) {
    size_t n = count(shape, ndim);
    void *data = mlxkt_xmalloc(n * dtype_size(dtype));
    for (size_t i = 0; i < n; i++) {
        float v = mlxkt_rng_sym(&rng) * scale;
        if (special && below(8) == 0) v = (float[]){NAN, INFINITY, -INFINITY}[below(3)];
        if (dtype == MLXK_DTYPE_BFLOAT16) {
            ((uint16_t *)data)[i] = mlxkt_bf16_from_float(v);
        } else {
            ((float *)data)[i] = v;
        }
    }
    mlxk_array *out = NULL;
    OK(mlxk_array_new(data, shape, ndim, dtype, &out));
    free(data);
    return out;
}

static void release(mlxk_array *a) {
    if (a != NULL) OK(mlxk_array_free(a));
}

/* Releases every array of a NULL-terminated list of handles' addresses and clears them. */
static void release_all(mlxk_array **const *handles) {
    for (; *handles != NULL; handles++) {
        release(**handles);
        **handles = NULL;
    }
}

static void check_dims(const mlxk_array *a, const int32_t *want, size_t ndim, int line) {
    size_t nd = 99;
    int32_t dims[MLXK_MAX_NDIM];
    if (C(mlxk_array_ndim(a, &nd)) != MLXK_OK || nd != ndim) {
        mlxkt_check_at(0, "result rank", __FILE__, line);
        return;
    }
    if (C(mlxk_array_shape(a, dims, MLXK_MAX_NDIM)) != MLXK_OK || (ndim && memcmp(dims, want, ndim * sizeof *dims) != 0)) {
        mlxkt_check_at(0, "result dims", __FILE__, line);
    }
}

/* Reads an array fully (evaluating it); returns the bytes (caller frees). */
static uint8_t *read_all(const mlxk_array *a, size_t *nbytes) {
    OK(mlxk_array_nbytes(a, nbytes));
    uint8_t *buf = mlxkt_xmalloc(*nbytes);
    OK(mlxk_array_read(a, buf, *nbytes));
    return buf;
}

/* An update's y and state: their dims checked and both read (when the call made them), then
 * released and cleared. */
static void check_update(mlxk_array **y, mlxk_array **s, const int32_t *ys, const int32_t *ss,
                         int line) {
    if (*y != NULL && *s != NULL) {
        check_dims(*y, ys, 4, line);
        check_dims(*s, ss, 4, line);
        size_t n1, n2;
        free(read_all(*y, &n1));
        free(read_all(*s, &n2));
    }
    release_all((mlxk_array **const[]){y, s, NULL});
}

static long rss_kib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, resident = 0;
    if (f == NULL) return -1;
    if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

/* Handles that are not live: filled as the run goes. */
static mlxk_array *freed_handle;
/* An address in main's stack frame (live for the whole run). */
static void *stack_address;

/* A pointer that is no handle: stack, heap, freed heap, odd, small. */
static mlxk_array *foreign(void) {
    static long on_static;
    static void *heap;
    static void *gone;
    if (heap == NULL) {
        heap = mlxkt_xmalloc(64);
        gone = mlxkt_xmalloc(64);
        free(gone); /* dangling: AddressSanitizer reports any read through it */
    }
    switch (below(6)) {
        case 0: return (mlxk_array *)stack_address;
        case 1: return (mlxk_array *)heap;
        case 2: return (mlxk_array *)gone;
        case 3: return (mlxk_array *)(void *)&on_static;
        case 4: return (mlxk_array *)(uintptr_t)0x1001;
        default: return freed_handle ? freed_handle : (mlxk_array *)(uintptr_t)8;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Scenarios                                                                                */

static void arrays(void) {
    int32_t shape[4];
    size_t ndim = (size_t)below(5);
    for (size_t i = 0; i < ndim; i++) shape[i] = below(6);
    mlxk_dtype dtype = below(8);
    size_t n = count(shape, ndim), nbytes = n * dtype_size(dtype);
    uint8_t *data = mlxkt_xmalloc(nbytes);
    for (size_t i = 0; i < nbytes; i++) data[i] = (uint8_t)(dtype == MLXK_DTYPE_BOOL ? next() & 1 : next());
    mlxk_array *a = NULL;
    OK(mlxk_array_new(data, shape, ndim, dtype, &a));
    if (a == NULL) {
        free(data);
        return;
    }
    check_dims(a, shape, ndim, __LINE__);
    mlxk_dtype got = -1;
    OK(mlxk_array_dtype(a, &got));
    CHECK(got == dtype);
    size_t len = 0;
    uint8_t *back = read_all(a, &len);
    CHECK(len == nbytes && memcmp(back, data, nbytes) == 0);
    if (nbytes > 0) {
        EXPECT(mlxk_array_read(a, back, nbytes - 1), MLXK_ERR_BUFFER_TOO_SMALL, "mlxk_array_read");
        EXPECT(mlxk_array_read(a, NULL, nbytes), MLXK_ERR_NULL_POINTER, "mlxk_array_read");
    } else {
        OK(mlxk_array_read(a, NULL, 0));
    }
    if (ndim > 0) {
        int32_t dims[4];
        EXPECT(mlxk_array_shape(a, dims, ndim - 1), MLXK_ERR_BUFFER_TOO_SMALL, "mlxk_array_shape");
    }
    mlxk_array *c = NULL;
    OK(mlxk_array_astype(a, below(8), &c));
    OK(mlxk_array_eval(c));
    release(c);
    EXPECT(mlxk_array_astype(a, 8 + below(100), &c), MLXK_ERR_DTYPE, "mlxk_array_astype");
    EXPECT(mlxk_array_astype(a, MLXK_DTYPE_FLOAT32, NULL), MLXK_ERR_NULL_POINTER, "mlxk_array_astype");
    mlxk_array *z = NULL;
    OK(mlxk_array_zeros(shape, ndim, dtype, &z));
    release(z);
    release(a);
    /* Use after free and double free of the handle just released. */
    freed_handle = a;
    size_t nd;
    EXPECT(mlxk_array_ndim(a, &nd), MLXK_ERR_INVALID_HANDLE, "mlxk_array_ndim");
    EXPECT(mlxk_array_free(a), MLXK_ERR_INVALID_HANDLE, "mlxk_array_free");
    free(back);
    free(data);
}

static void bad_arrays(void) {
    static const int32_t huge3[] = {INT32_MAX, INT32_MAX, INT32_MAX}; /* 2^93 elements */
    static const int32_t big2[] = {65536, 65536};                      /* 2^32 elements */
    static const int32_t neg[] = {3, -1};
    static const int32_t many[17] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    static const int32_t two[] = {2, 3};
    uint8_t bytes[32] = {0};
    mlxk_array *out = NULL;
    switch (below(8)) {
        case 0: EXPECT(mlxk_array_new(bytes, huge3, 3, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_INVALID_ARGUMENT, "mlxk_array_new"); break;
        case 1: EXPECT(mlxk_array_zeros(big2, 2, MLXK_DTYPE_BOOL, &out), MLXK_ERR_INVALID_ARGUMENT, "mlxk_array_zeros"); break;
        case 2: EXPECT(mlxk_array_new(bytes, neg, 2, MLXK_DTYPE_INT8, &out), MLXK_ERR_SHAPE, "mlxk_array_new"); break;
        case 3: EXPECT(mlxk_array_zeros(many, 17, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_SHAPE, "mlxk_array_zeros"); break;
        case 4: EXPECT(mlxk_array_new(NULL, two, 2, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_NULL_POINTER, "mlxk_array_new"); break;
        case 5:
            bytes[3] = 2;
            EXPECT(mlxk_array_new(bytes, two, 2, MLXK_DTYPE_BOOL, &out), MLXK_ERR_INVALID_ARGUMENT, "mlxk_array_new");
            break;
        case 6: EXPECT(mlxk_array_new(bytes, two, 2, -1 - below(1000), &out), MLXK_ERR_DTYPE, "mlxk_array_new"); break;
        default: EXPECT(mlxk_array_new(bytes, two, 2, MLXK_DTYPE_INT8, NULL), MLXK_ERR_NULL_POINTER, "mlxk_array_new"); break;
    }
    CHECK(out == NULL);
}

static void handles(void) {
    mlxk_array *h = foreign();
    size_t n;
    int32_t dims[4];
    mlxk_dtype d;
    float buf[4];
    mlxk_array *out = NULL;
    switch (below(8)) {
        case 0: EXPECT(mlxk_array_ndim(h, &n), MLXK_ERR_INVALID_HANDLE, "mlxk_array_ndim"); break;
        case 1: EXPECT(mlxk_array_shape(h, dims, 4), MLXK_ERR_INVALID_HANDLE, "mlxk_array_shape"); break;
        case 2: EXPECT(mlxk_array_dtype(h, &d), MLXK_ERR_INVALID_HANDLE, "mlxk_array_dtype"); break;
        case 3: EXPECT(mlxk_array_nbytes(h, &n), MLXK_ERR_INVALID_HANDLE, "mlxk_array_nbytes"); break;
        case 4: EXPECT(mlxk_array_eval(h), MLXK_ERR_INVALID_HANDLE, "mlxk_array_eval"); break;
        case 5: EXPECT(mlxk_array_read(h, buf, sizeof buf), MLXK_ERR_INVALID_HANDLE, "mlxk_array_read"); break;
        case 6: EXPECT(mlxk_array_astype(h, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_INVALID_HANDLE, "mlxk_array_astype"); break;
        default: EXPECT(mlxk_array_free(h), MLXK_ERR_INVALID_HANDLE, "mlxk_array_free"); break;
    }
    CHECK(out == NULL);
    EXPECT(mlxk_array_ndim(NULL, &n), MLXK_ERR_NULL_POINTER, "mlxk_array_ndim");
    OK(mlxk_array_free(NULL));
}

typedef struct {
    int32_t b, t, hk, hv, dk, dv;
    mlxk_array *q, *k, *v, *a, *bb, *a_log, *dt_bias, *state, *mask;
} Rec;

static Rec rec_new(int32_t b, int32_t t, int special) {
    Rec r;
    r.b = b;
    r.t = t;
    r.hk = 1 + below(2);
    r.hv = r.hk * (1 + below(2));
    r.dk = 32 * (1 + below(2));
    r.dv = 1 + below(8);
    mlxk_dtype dt = below(2) ? MLXK_DTYPE_BFLOAT16 : MLXK_DTYPE_FLOAT32;
    int32_t qk[] = {b, t, r.hk, r.dk}, v[] = {b, t, r.hv, r.dv}, g[] = {b, t, r.hv}, h[] = {r.hv};
    int32_t s[] = {b, r.hv, r.dv, r.dk}, m[] = {b, t};
    r.q = floats(qk, 4, dt, 0.2f, special);
    r.k = floats(qk, 4, dt, 0.2f, 0);
    r.v = floats(v, 4, dt, 1.0f, special);
    r.a = floats(g, 3, MLXK_DTYPE_BFLOAT16, 1.0f, special);
    r.bb = floats(g, 3, MLXK_DTYPE_BFLOAT16, 1.0f, 0);
    r.a_log = floats(h, 1, MLXK_DTYPE_FLOAT32, 0.5f, 0);
    r.dt_bias = floats(h, 1, MLXK_DTYPE_BFLOAT16, 0.5f, 0);
    r.state = below(2) ? floats(s, 4, MLXK_DTYPE_FLOAT32, 0.5f, 0) : NULL;
    r.mask = NULL;
    if (below(2)) {
        size_t n = (size_t)b * (size_t)t;
        uint8_t *mask = mlxkt_xmalloc(n);
        for (size_t i = 0; i < n; i++) mask[i] = (uint8_t)(below(4) != 0);
        OK(mlxk_array_new(mask, m, 2, MLXK_DTYPE_BOOL, &r.mask));
        free(mask);
    }
    return r;
}

static void rec_free(Rec *r) {
    mlxk_array *all[] = {r->q, r->k, r->v, r->a, r->bb, r->a_log, r->dt_bias, r->state, r->mask};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) release(all[i]);
}

static void recurrence(void) {
    int edge = below(8);
    int32_t b = edge == 0 ? 0 : 1 + below(2), t = edge == 1 ? 0 : 1 + below(4);
    Rec r = rec_new(b, t, below(6) == 0);
    mlxk_array *y = NULL, *s = NULL, *g = NULL;
    OK(mlxk_gated_delta_update(r.q, r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, r.mask, &y, &s));
    int32_t ys[] = {b, t, r.hv, r.dv}, ss[] = {b, r.hv, r.dv, r.dk};
    if (y != NULL && s != NULL) {
        check_dims(y, ys, 4, __LINE__);
        check_dims(s, ss, 4, __LINE__);
        if (below(2) && r.state != NULL) { /* decode loop: old state freed before evaluating */
            release(r.state);
            r.state = NULL;
        }
        size_t n1, n2;
        free(read_all(y, &n1));
        free(read_all(s, &n2));
    }
    release(y);
    release(s);
    y = s = NULL;
    /* The chunked form on the same inputs (a chunk size valid or not). */
    {
        static const int32_t chunks[] = {0, 16, 32, 128, 8, -16};
        int32_t chunk = chunks[below(6)];
        if (chunk == 8 || chunk == -16) {
            EXPECT(mlxk_gated_delta_update_chunked(r.q, r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, r.mask,
                                                   chunk, &y, &s),
                   MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_delta_update_chunked");
            CHECK(y == NULL && s == NULL);
        } else {
            OK(mlxk_gated_delta_update_chunked(r.q, r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, r.mask, chunk,
                                               &y, &s));
            check_update(&y, &s, ys, ss, __LINE__);
        }
    }
    OK(mlxk_compute_g(r.a_log, r.a, r.dt_bias, &g));
    OK(mlxk_array_eval(g));
    release(g);
    int32_t lengths[3] = {0, 0, 0};
    for (int i = 0; i < b; i++) lengths[i] = below(t + 1);
    OK(mlxk_gated_delta_state(r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, lengths, (size_t)b, &s));
    if (s != NULL) check_dims(s, ss, 4, __LINE__);
    release(s);
    s = NULL;
    /* Errors. */
    y = s = NULL;
    switch (below(7)) {
        case 0: /* k with another Dk */
        {
            int32_t bad[] = {b, t, r.hk, r.dk + 32};
            mlxk_array *k2 = floats(bad, 4, MLXK_DTYPE_FLOAT32, 1.0f, 0);
            EXPECT(mlxk_gated_delta_update(r.q, k2, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, r.mask, &y, &s), MLXK_ERR_SHAPE, "mlxk_gated_delta_update");
            release(k2);
            break;
        }
        case 1: EXPECT(mlxk_gated_delta_update(r.q, r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, r.mask, &y, NULL), MLXK_ERR_NULL_POINTER, "mlxk_gated_delta_update"); break;
        case 2: EXPECT(mlxk_gated_delta_update(r.q, foreign(), r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, r.mask, &y, &s), MLXK_ERR_INVALID_HANDLE, "mlxk_gated_delta_update"); break;
        case 3: /* a row accepting more than T tokens */
            if (b > 0) {
                lengths[0] = t + 1;
                EXPECT(mlxk_gated_delta_state(r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, lengths, (size_t)b, &s), MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_delta_state");
            }
            break;
        case 4: EXPECT(mlxk_gated_delta_state(r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, r.state, lengths, (size_t)b + 1, &s), MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_delta_state"); break;
        case 5: EXPECT(mlxk_compute_g(r.a_log, r.q, r.dt_bias, &g), MLXK_ERR_SHAPE, "mlxk_compute_g"); break;
        default: /* the memory limit: refused before anything is built */
            OK(mlxk_set_memory_limit(64)); /* the new state alone is >= 128 bytes when B > 0 */
            if (b > 0) {
                EXPECT(mlxk_gated_delta_update(r.q, r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, NULL, NULL, &y, &s), MLXK_ERR_OUT_OF_MEMORY, "mlxk_gated_delta_update");
            } else {
                OK(mlxk_gated_delta_update(r.q, r.k, r.v, r.a, r.bb, r.a_log, r.dt_bias, NULL, NULL, &y, &s));
                release(y);
                release(s);
                y = s = NULL;
            }
            OK(mlxk_set_memory_limit(0));
            break;
    }
    CHECK(y == NULL && s == NULL);
    rec_free(&r);
}

static void norms(void) {
    int32_t b = below(6) == 0 ? 0 : 1 + below(2), sl = 1 + below(3);
    int32_t hk = 1 + below(2), hv = 1 + below(3), dk = 1 + below(16), dv = 1 + below(16);
    int32_t c = 2 * hk * dk + hv * dv;
    int32_t xs[] = {b, sl, c}, ks[] = {dk};
    int special = below(6) == 0;
    mlxk_array *x = floats(xs, 3, MLXK_DTYPE_BFLOAT16, 2.0f, special);
    mlxk_array *qs = floats(ks, 1, MLXK_DTYPE_BFLOAT16, 1.0f, 0);
    mlxk_array *kk = floats(ks, 1, MLXK_DTYPE_BFLOAT16, 1.0f, 0);
    mlxk_array *q = NULL, *k = NULL, *v = NULL;
    OK(mlxk_silu_rms_heads(x, qs, kk, hk, hv, dv, 1e-6f, &q, &k, &v));
    if (v != NULL) {
        int32_t vs[] = {b, sl, hv, dv};
        check_dims(v, vs, 4, __LINE__);
        size_t n;
        free(read_all(q, &n));
    }
    /* The backward pass, the results as their own cotangents (dq absent half the time). */
    mlxk_array *g0 = NULL, *g1 = NULL, *g2 = NULL;
    OK(mlxk_silu_rms_heads_vjp(x, qs, kk, hk, hv, dv, 1e-6f, below(2) ? q : NULL, k, v, &g0, &g1,
                               &g2));
    if (g0 != NULL) {
        check_dims(g0, xs, 3, __LINE__);
        check_dims(g1, ks, 1, __LINE__);
        OK(mlxk_array_eval(g2));
    }
    release_all((mlxk_array **const[]){&g0, &g1, &g2, &q, &k, &v, NULL});
    switch (below(4)) {
        case 0: EXPECT(mlxk_silu_rms_heads(x, qs, kk, hk, hv, dv, -1.0f, &q, &k, &v), MLXK_ERR_INVALID_ARGUMENT, "mlxk_silu_rms_heads"); break;
        case 1: EXPECT(mlxk_silu_rms_heads(x, qs, kk, hk + 1, hv, dv, 1e-6f, &q, &k, &v), MLXK_ERR_SHAPE, "mlxk_silu_rms_heads"); break;
        case 2: EXPECT(mlxk_silu_rms_heads(x, qs, kk, 0, hv, dv, 1e-6f, &q, &k, &v), MLXK_ERR_INVALID_ARGUMENT, "mlxk_silu_rms_heads"); break;
        default: EXPECT(mlxk_silu_rms_heads(x, qs, kk, hk, hv, dv, NAN, &q, &k, &v), MLXK_ERR_INVALID_ARGUMENT, "mlxk_silu_rms_heads"); break;
    }
    CHECK(q == NULL && k == NULL && v == NULL);
    release(x);
    release(qs);
    release(kk);

    int32_t rows = below(6) == 0 ? 0 : 1 + below(4), d = 1 + below(300);
    int32_t ns[] = {rows, d}, ws[] = {d};
    mlxk_array *nx = floats(ns, 2, MLXK_DTYPE_BFLOAT16, 2.0f, special);
    mlxk_array *gate = floats(ns, 2, MLXK_DTYPE_FLOAT32, 2.0f, 0);
    mlxk_array *w = floats(ws, 1, MLXK_DTYPE_BFLOAT16, 1.0f, 0);
    mlxk_array *wf = floats(ws, 1, MLXK_DTYPE_FLOAT32, 1.0f, 0);
    mlxk_array *out = NULL;
    OK(mlxk_gated_rms_norm(nx, gate, w, 1e-6f, &out));
    if (out != NULL) {
        check_dims(out, ns, 2, __LINE__);
        OK(mlxk_array_eval(out));
    }
    OK(mlxk_gated_rms_norm_vjp(nx, gate, w, 1e-6f, below(2) ? out : NULL, &g0, &g1, &g2));
    if (g0 != NULL) {
        check_dims(g1, ns, 2, __LINE__);
        check_dims(g2, ws, 1, __LINE__);
        OK(mlxk_array_eval(g0));
    }
    release_all((mlxk_array **const[]){&g0, &g1, &g2, &out, NULL});
    switch (below(4)) {
        case 0: EXPECT(mlxk_gated_rms_norm(nx, gate, wf, 1e-6f, &out), MLXK_ERR_DTYPE, "mlxk_gated_rms_norm"); break;
        case 1: EXPECT(mlxk_gated_rms_norm(nx, gate, w, INFINITY, &out), MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_rms_norm"); break;
        case 2: EXPECT(mlxk_gated_rms_norm(nx, w, w, 1e-6f, &out), MLXK_ERR_SHAPE, "mlxk_gated_rms_norm"); break;
        default:
            OK(mlxk_set_memory_limit(16));
            if ((size_t)rows * (size_t)d * 2 > 16) {
                EXPECT(mlxk_gated_rms_norm(nx, gate, w, 1e-6f, &out), MLXK_ERR_OUT_OF_MEMORY, "mlxk_gated_rms_norm");
            } else {
                OK(mlxk_gated_rms_norm(nx, gate, w, 1e-6f, &out));
                release(out);
                out = NULL;
            }
            OK(mlxk_set_memory_limit(0));
            break;
    }
    CHECK(out == NULL);
    release(nx);
    release(gate);
    release(w);
    release(wf);
}

static void glm52(void) {
    mlxk_glm52_layout l;
    uint64_t group = (uint64_t)32 << below(3);
    uint64_t h = group * (uint64_t)(1 + below(200)), i = group * (uint64_t)(1 + below(200));
    uint32_t bits = below(2) ? 4 : 8;
    OK(mlxk_glm52_layout_canonical(h, i, bits, (uint32_t)group, &l));
    OK(mlxk_glm52_layout_validate(&l, bits, (uint32_t)group));
    mlxk_glm52_layout bad = l;
    switch (below(5)) {
        case 0: bad.up_weight_offset = bad.gate_weight_offset; break;          /* overlap */
        case 1: bad.slot_bytes = 100; break;                                   /* not a multiple */
        case 2: bad.down_scale_offset += 8; break;                             /* misaligned */
        case 3: bad.hidden_size = UINT64_MAX; break;                           /* > 2^53-1 */
        default: bad.down_scale_offset = bad.slot_bytes; break;                /* past the slot */
    }
    EXPECT(mlxk_glm52_layout_validate(&bad, bits, (uint32_t)group), MLXK_ERR_INVALID_ARGUMENT, "mlxk_glm52_layout_validate");
    EXPECT(mlxk_glm52_layout_validate(NULL, bits, (uint32_t)group), MLXK_ERR_NULL_POINTER, "mlxk_glm52_layout_validate");
    EXPECT(mlxk_glm52_layout_canonical(h, i, 5, (uint32_t)group, &l), MLXK_ERR_INVALID_ARGUMENT, "mlxk_glm52_layout_canonical");
    EXPECT(mlxk_glm52_layout_canonical(h + 1, i, bits, (uint32_t)group, &l), MLXK_ERR_INVALID_ARGUMENT, "mlxk_glm52_layout_canonical");
    EXPECT(mlxk_glm52_layout_canonical(h, i, bits, (uint32_t)group, NULL), MLXK_ERR_NULL_POINTER, "mlxk_glm52_layout_canonical");
}

static void misc(void) {
    calls += 4;
    CHECK(strcmp(mlxk_status_name(MLXK_ERR_SHAPE), "MLXK_ERR_SHAPE") == 0);
    CHECK(strcmp(mlxk_status_name(1000 + below(1000)), "MLXK_UNKNOWN_STATUS") == 0);
    CHECK(strcmp(mlxk_version(), MLXK_VERSION) == 0);
    CHECK(mlxk_abi_version() == MLXK_ABI_VERSION);
    calls += 2;
    CHECK(mlxk_last_error() != NULL);
    mlxk_gpu_backend_kind kind = mlxk_gpu_backend();
    if (kind == MLXK_GPU_NONE) {
        EXPECT(mlxk_set_default_device(MLXK_DEVICE_GPU), MLXK_ERR_UNSUPPORTED, "mlxk_set_default_device");
    }
    EXPECT(mlxk_set_default_device(7), MLXK_ERR_INVALID_ARGUMENT, "mlxk_set_default_device");
    OK(mlxk_set_default_device(MLXK_DEVICE_CPU));
    size_t limit = 0;
    OK(mlxk_get_memory_limit(&limit));
    CHECK(limit > 0);
    EXPECT(mlxk_get_memory_limit(NULL), MLXK_ERR_NULL_POINTER, "mlxk_get_memory_limit");
    OK(mlxk_set_cache_limit(CACHE_LIMIT));
    /* Above the limit: refused before allocating. */
    OK(mlxk_set_memory_limit(1024));
    int32_t shape[] = {16, 17};
    mlxk_array *out = NULL;
    EXPECT(mlxk_array_zeros(shape, 2, MLXK_DTYPE_FLOAT32, &out), MLXK_ERR_OUT_OF_MEMORY, "mlxk_array_zeros");
    OK(mlxk_set_memory_limit(0));
    CHECK(out == NULL);
}

int main(int argc, char **argv) {
    long target = 10000;
    int rss_check = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--rss-check") == 0) {
            rss_check = 1;
        } else {
            target = atol(argv[i]);
        }
    }
    mlxkt_checks()->max_failed = 20;
    long on_stack = 0;
    stack_address = &on_stack;
    OK(mlxk_set_cache_limit(CACHE_LIMIT));
    long warm = target / 5, rss_warm = -1, iterations = 0;
    while (calls < target) {
        switch (below(9)) {
            case 0: arrays(); break;
            case 1: bad_arrays(); break;
            case 2: handles(); break;
            case 3:
            case 4: recurrence(); break;
            case 5:
            case 6: norms(); break;
            case 7: glm52(); break;
            default: misc(); break;
        }
        iterations++;
        if (rss_warm < 0 && calls >= warm) {
            rss_warm = rss_kib();
        }
    }
    long rss_end = rss_kib();
    long successes = status_counts[MLXK_OK];
    printf("stress: %ld calls in %ld iterations: %ld succeeded, %ld failed as expected (", calls,
           iterations, successes, failures_expected);
    for (int s = 1; s <= MLXK_ERR_INVALID_HANDLE; s++) {
        if (status_counts[s]) printf("%s%s %ld", s > 1 ? ", " : "", mlxk_status_name(s) + 9, status_counts[s]);
    }
    printf(")\n");
    printf("stress: resident memory after warm-up (%ld calls) %ld KiB, at the end %ld KiB (%+ld KiB)\n",
           warm, rss_warm, rss_end, rss_end - rss_warm);
    if (rss_check && rss_end - rss_warm > RSS_SLACK_KIB) {
        mlxkt_check_at(0, "resident memory grew after warm-up", __FILE__, __LINE__);
    }
    if (status_counts[MLXK_ERR_PANIC] != 0) {
        mlxkt_check_at(0, "a call returned MLXK_ERR_PANIC", __FILE__, __LINE__);
    }
    if (mlxkt_checks()->failed) {
        fprintf(stderr, "stress: %ld check(s) failed\n", mlxkt_checks()->failed);
        return 1;
    }
    printf("stress: all checks passed\n");
    return 0;
}
