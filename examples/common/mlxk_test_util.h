/*
 * Helpers shared by the C programs of mlxkern (examples, benches and tests): examples/c/demo.c,
 * benches/bench.c (with benches/inputs.h), tests/c/client.c and tests/c/stress.c.
 *
 *   bfloat16        mlxkt_bf16_from_float (round to nearest even; a NaN stays a quiet NaN of
 *                   the same sign), mlxkt_bf16_to_float, mlxkt_bf16_round
 *   random numbers  splitmix64: mlxkt_splitmix64 (its output function), a seeded stream
 *                   mlxkt_rng with _next, _uniform [0, 1), _sym [-1, 1) and _normal, and
 *                   mlxkt_unit (64 random bits -> [0, 1)), mlxkt_box_muller
 *   memory, time    mlxkt_xmalloc (exits when out of memory), mlxkt_now_seconds (monotonic)
 *   checks          CHECK(cond); CHECK_OK(call): the call must return MLXK_OK, else the
 *                   program stops; EXPECT_ERROR(call, status, fn, arg): the call fails with
 *                   `status` and an mlxk_last_error() that starts with "fn:" and contains
 *                   `arg`. Each is counted in mlxkt_checks(); a failure prints
 *                   "FAIL (file:line): ..." with the library's message.
 *   arrays          mlxkt_new_array (upload, stops on failure), mlxkt_read_floats (a float32 or
 *                   bfloat16 array read back as floats)
 *
 * Header-only (static inline), C11 or C++17. Needs include/mlxkern.h on the include path and
 * -lm; in C, define _POSIX_C_SOURCE (199309L or later) before the first #include, for
 * clock_gettime.
 */

#ifndef MLXK_TEST_UTIL_H
#define MLXK_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlxkern.h"

/* ---------------------------------------------------------------------------------------- */
/* bfloat16                                                                                 */

/* float -> bfloat16 bits, round to nearest even (a NaN stays a quiet NaN, sign kept). */
static inline uint16_t mlxkt_bf16_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) {
        return (uint16_t)((u >> 16) | 0x0040u);
    }
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float mlxkt_bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The float nearest to f that bfloat16 holds. */
static inline float mlxkt_bf16_round(float f) { return mlxkt_bf16_to_float(mlxkt_bf16_from_float(f)); }

/* ---------------------------------------------------------------------------------------- */
/* Random numbers: splitmix64                                                               */

#define MLXKT_SPLITMIX64_GAMMA 0x9E3779B97F4A7C15ull

/* splitmix64's output function: value k (k = 1, 2, ...) of the stream seeded with s is
 * mlxkt_splitmix64(s + k * MLXKT_SPLITMIX64_GAMMA). */
static inline uint64_t mlxkt_splitmix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* 64 random bits -> uniform in [0, 1) (their top 53). */
static inline double mlxkt_unit(uint64_t bits) {
    return (double)(bits >> 11) * (1.0 / 9007199254740992.0);
}

/* Two uniforms in [0, 1) -> one standard normal (Box-Muller). */
static inline double mlxkt_box_muller(double u1, double u2) {
    if (u1 < 1e-300) {
        u1 = 1e-300;
    }
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A seeded stream: `mlxkt_rng rng = {seed};` gives the same numbers on every run. */
typedef struct {
    uint64_t state;
} mlxkt_rng;

static inline uint64_t mlxkt_rng_next(mlxkt_rng *rng) {
    rng->state += MLXKT_SPLITMIX64_GAMMA;
    return mlxkt_splitmix64(rng->state);
}

/* Uniform in [0, 1). */
static inline double mlxkt_rng_uniform(mlxkt_rng *rng) { return mlxkt_unit(mlxkt_rng_next(rng)); }

/* Uniform in [-1, 1), as a float. */
static inline float mlxkt_rng_sym(mlxkt_rng *rng) {
    return (float)(2.0 * mlxkt_unit(mlxkt_rng_next(rng)) - 1.0);
}

/* Standard normal, from the next two uniforms. */
static inline double mlxkt_rng_normal(mlxkt_rng *rng) {
    double u1 = mlxkt_rng_uniform(rng);
    double u2 = mlxkt_rng_uniform(rng);
    return mlxkt_box_muller(u1, u2);
}

/* ---------------------------------------------------------------------------------------- */
/* Memory, time                                                                             */

/* malloc that never returns NULL: the program stops when the host is out of memory. */
static inline void *mlxkt_xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (p == NULL) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

/* Seconds on the monotonic clock. */
static inline double mlxkt_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------------------- */
/* Checks                                                                                   */

typedef struct {
    long passed;
    long failed;
    long max_failed; /* 0: no limit; otherwise the program stops once more checks fail */
    int verbose;     /* EXPECT_ERROR prints every message it sees */
} mlxkt_tally;

/* The program's check counts. A program of several files defines MLXKT_SHARED_TALLY before
 * including this header, in each file, and defines mlxkt_checks() in one of them (the same
 * body): then all its files count into one tally. */
#ifdef MLXKT_SHARED_TALLY
mlxkt_tally *mlxkt_checks(void);
#else
static inline mlxkt_tally *mlxkt_checks(void) {
    static mlxkt_tally tally;
    return &tally;
}
#endif

/* Counts one check; a failed one is printed as "FAIL (file:line): what". Returns ok. */
static inline int mlxkt_check_at(int ok, const char *what, const char *file, int line) {
    mlxkt_tally *t = mlxkt_checks();
    if (ok) {
        t->passed++;
        return 1;
    }
    t->failed++;
    const char *slash = strrchr(file, '/');
    fprintf(stderr, "FAIL (%s:%d): %s\n", slash != NULL ? slash + 1 : file, line, what);
    if (t->max_failed > 0 && t->failed > t->max_failed) {
        fprintf(stderr, "more than %ld checks failed: stopping\n", t->max_failed);
        exit(1);
    }
    return 0;
}

/* A call's status must be MLXK_OK: one check; a failure prints the status and
 * mlxk_last_error(). Returns whether it was. */
static inline int mlxkt_check_status_at(mlxk_status status, const char *call, const char *file,
                                        int line) {
    if (status == MLXK_OK) {
        return mlxkt_check_at(1, call, file, line);
    }
    char what[768];
    snprintf(what, sizeof what, "%s -> %s: %s", call, mlxk_status_name(status), mlxk_last_error());
    return mlxkt_check_at(0, what, file, line);
}

/* A call that must fail with `want`, with a message that starts with "fn:" and, unless `arg` is
 * NULL, contains `arg` after that: a check each. */
static inline void mlxkt_expect_error_at(mlxk_status got, mlxk_status want, const char *fn,
                                         const char *arg, const char *call, const char *file,
                                         int line) {
    const char *msg = mlxk_last_error();
    char what[1024];
    if (mlxkt_checks()->verbose) {
        printf("  %-26s %s\n", mlxk_status_name(got), msg);
    }
    int ok = got == want;
    snprintf(what, sizeof what, "%s -> %s (expected %s)", call, mlxk_status_name(got),
             mlxk_status_name(want));
    if (!mlxkt_check_at(ok, what, file, line)) {
        fprintf(stderr, "  message: %s\n", msg);
        return;
    }
    mlxkt_check_at(msg != NULL && msg[0] != '\0', "mlxk_last_error() is non-empty after a failure",
                   file, line);
    if (msg == NULL) {
        return;
    }
    size_t n = strlen(fn);
    ok = strncmp(msg, fn, n) == 0 && msg[n] == ':';
    snprintf(what, sizeof what, "%s: message names the function %s: \"%s\"", call, fn, msg);
    mlxkt_check_at(ok, what, file, line);
    if (arg != NULL) {
        snprintf(what, sizeof what, "%s: message names \"%s\": \"%s\"", call, arg, msg);
        mlxkt_check_at(strstr(msg + n, arg) != NULL, what, file, line);
    }
}

#define CHECK(cond) mlxkt_check_at((cond) ? 1 : 0, #cond, __FILE__, __LINE__)

/* A call that must succeed; the program cannot go on without its result. */
#define CHECK_OK(call)                                                                       \
    do {                                                                                     \
        if (!mlxkt_check_status_at((call), #call, __FILE__, __LINE__)) {                     \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define EXPECT_ERROR(call, want, fn, arg)                                                    \
    mlxkt_expect_error_at((call), (want), (fn), (arg), #call, __FILE__, __LINE__)

/* ---------------------------------------------------------------------------------------- */
/* Arrays                                                                                   */

/* A new array holding a copy of `data`; stops the program on failure. */
static inline mlxk_array *mlxkt_new_array(const void *data, const int32_t *shape, size_t ndim,
                                          mlxk_dtype dtype) {
    mlxk_array *out = NULL;
    CHECK_OK(mlxk_array_new(data, shape, ndim, dtype, &out));
    return out;
}

/* Reads a float32 or bfloat16 array of n elements as floats (the caller frees them). */
static inline float *mlxkt_read_floats(const mlxk_array *a, size_t n) {
    mlxk_dtype dtype;
    size_t nbytes;
    CHECK_OK(mlxk_array_dtype(a, &dtype));
    CHECK_OK(mlxk_array_nbytes(a, &nbytes));
    float *out = (float *)mlxkt_xmalloc(n * sizeof *out);
    if (dtype == MLXK_DTYPE_FLOAT32) {
        CHECK(nbytes == n * sizeof(float));
        CHECK_OK(mlxk_array_read(a, out, n * sizeof(float)));
    } else {
        CHECK(dtype == MLXK_DTYPE_BFLOAT16);
        CHECK(nbytes == n * sizeof(uint16_t));
        uint16_t *bits = (uint16_t *)mlxkt_xmalloc(n * sizeof *bits);
        CHECK_OK(mlxk_array_read(a, bits, n * sizeof(uint16_t)));
        for (size_t i = 0; i < n; i++) {
            out[i] = mlxkt_bf16_to_float(bits[i]);
        }
        free(bits);
    }
    return out;
}

#endif /* MLXK_TEST_UTIL_H */
