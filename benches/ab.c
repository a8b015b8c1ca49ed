/*
 * Two builds of the library in one process, timed call by call in alternation: the A/B
 * comparison for changes that must keep speed (refactors), robust to a shared machine's load
 * because both sides see the same moments. Each build is dlopened on its own (RTLD_LOCAL: own
 * registry and worker pool, one libmlx); every case runs A then B (then B then A) N times with
 * a pause between calls, so one build's idle workers are parked when the other runs.
 *
 *   ab LIB_A LIB_B [ROUNDS]      (scripts/bench/ab.sh builds and runs it)
 *
 * Prints, per case: the best and the median time of each side and the median of the per-round
 * ratios B/A.
 */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlxkern.h"

typedef struct {
    void *lib;
    __typeof__(&mlxk_array_new) array_new;
    __typeof__(&mlxk_array_free) array_free;
    __typeof__(&mlxk_array_eval) array_eval;
    __typeof__(&mlxk_gated_delta_update) update;
    __typeof__(&mlxk_gated_delta_update_chunked) chunked;
    __typeof__(&mlxk_gated_delta_state) state;
    __typeof__(&mlxk_silu_rms_heads) heads;
    __typeof__(&mlxk_gated_rms_norm) norm;
    __typeof__(&mlxk_last_error) last_error;
} Lib;

static void *sym(void *lib, const char *name) {
    void *p = dlsym(lib, name);
    if (!p) {
        fprintf(stderr, "ab: %s: %s\n", name, dlerror());
        exit(2);
    }
    return p;
}

static Lib open_lib(const char *path) {
    Lib l;
    l.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!l.lib) {
        fprintf(stderr, "ab: dlopen %s: %s\n", path, dlerror());
        exit(2);
    }
    *(void **)&l.array_new = sym(l.lib, "mlxk_array_new");
    *(void **)&l.array_free = sym(l.lib, "mlxk_array_free");
    *(void **)&l.array_eval = sym(l.lib, "mlxk_array_eval");
    *(void **)&l.update = sym(l.lib, "mlxk_gated_delta_update");
    *(void **)&l.chunked = sym(l.lib, "mlxk_gated_delta_update_chunked");
    *(void **)&l.state = sym(l.lib, "mlxk_gated_delta_state");
    *(void **)&l.heads = sym(l.lib, "mlxk_silu_rms_heads");
    *(void **)&l.norm = sym(l.lib, "mlxk_gated_rms_norm");
    *(void **)&l.last_error = sym(l.lib, "mlxk_last_error");
    return l;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float uniform(void) { /* [-1, 1) */
    rng_state += 0x9E3779B97F4A7C15ull;
    uint64_t z = rng_state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static uint16_t bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7FFF + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Fixed random bf16 (or f32) data, shared by both sides. */
typedef struct {
    void *data;
    int32_t shape[4];
    size_t ndim;
    mlxk_dtype dtype;
} Host;

static Host host(size_t ndim, const int32_t *shape, mlxk_dtype dtype, float scale) {
    Host h = {0};
    size_t n = 1;
    for (size_t i = 0; i < ndim; i++) n *= (size_t)(h.shape[i] = shape[i]);
    h.ndim = ndim;
    h.dtype = dtype;
    if (dtype == MLXK_DTYPE_FLOAT32) {
        float *v = malloc(n * 4);
        for (size_t i = 0; i < n; i++) v[i] = scale * uniform();
        h.data = v;
    } else {
        uint16_t *v = malloc(n * 2);
        for (size_t i = 0; i < n; i++) v[i] = bf16(scale * uniform());
        h.data = v;
    }
    return h;
}

static mlxk_array *upload(const Lib *l, const Host *h) {
    mlxk_array *a = NULL;
    if (l->array_new(h->data, h->shape, h->ndim, h->dtype, &a) != MLXK_OK) {
        fprintf(stderr, "ab: upload: %s\n", l->last_error());
        exit(1);
    }
    return a;
}

#define HK 16
#define HV 32
#define D 128

typedef struct {
    Host q, k, v, a, b, a_log, dt_bias, x, qs, ks, nx, gate, weight;
} Inputs;

enum { DECODE, PREFILL, CHUNKED, REPLAY, HEADS, NORM, CASES };
static const char *names[CASES] = {"decode B=1, 30 chained steps", "prefill T=512, exact",
                                   "prefill T=512, chunked", "replay T=8 (accept 5)",
                                   "head split S=512", "gated norm S=512 (x32 heads)"};

static void check(const Lib *l, mlxk_status st) {
    if (st != MLXK_OK) {
        fprintf(stderr, "ab: %s\n", l->last_error());
        exit(1);
    }
}

/* One timed call of `which` on library `l` (inputs uploaded before timing). */
static double run_case(const Lib *l, int which, const Inputs *in, const Inputs *dec) {
    const Inputs *x = which == DECODE || which == REPLAY ? dec : in;
    mlxk_array *q = upload(l, &x->q), *k = upload(l, &x->k), *v = upload(l, &x->v);
    mlxk_array *a = upload(l, &x->a), *b = upload(l, &x->b), *al = upload(l, &x->a_log);
    mlxk_array *dt = upload(l, &x->dt_bias);
    mlxk_array *xs = upload(l, &in->x), *qs = upload(l, &in->qs), *ks = upload(l, &in->ks);
    mlxk_array *nx = upload(l, &in->nx), *g = upload(l, &in->gate), *w = upload(l, &in->weight);
    double t0 = now();
    mlxk_array *y = NULL, *s = NULL, *o1 = NULL, *o2 = NULL, *o3 = NULL;
    switch (which) {
    case DECODE: {
        /* 30 chained steps, the old state freed before the one eval (in place). */
        mlxk_array *state = NULL;
        for (int step = 0; step < 30; step++) {
            check(l, l->update(q, k, v, a, b, al, dt, state, NULL, &y, &s));
            if (state) l->array_free(state);
            if (step + 1 < 30) l->array_free(y);
            state = s;
        }
        check(l, l->array_eval(state));
        s = state;
        break;
    }
    case PREFILL:
        check(l, l->update(q, k, v, a, b, al, dt, NULL, NULL, &y, &s));
        check(l, l->array_eval(s));
        break;
    case CHUNKED:
        check(l, l->chunked(q, k, v, a, b, al, dt, NULL, NULL, 0, &y, &s));
        check(l, l->array_eval(s));
        break;
    case REPLAY: {
        int32_t lengths[1] = {5};
        check(l, l->state(k, v, a, b, al, dt, NULL, lengths, 1, &s));
        check(l, l->array_eval(s));
        break;
    }
    case HEADS:
        check(l, l->heads(xs, qs, ks, HK, HV, D, 1e-6f / D, &o1, &o2, &o3));
        check(l, l->array_eval(o1));
        break;
    case NORM:
        check(l, l->norm(nx, g, w, 1e-6f, &o1));
        check(l, l->array_eval(o1));
        break;
    }
    double t = now() - t0;
    mlxk_array *all[] = {q, k, v, a, b, al, dt, xs, qs, ks, nx, g, w, y, s, o1, o2, o3};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        if (all[i]) l->array_free(all[i]);
    return t;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s LIB_A LIB_B [ROUNDS]\n", argv[0]);
        return 2;
    }
    int rounds = argc > 3 ? atoi(argv[3]) : 15;
    if (rounds < 1 || rounds > 1000) rounds = 15;
    Lib libs[2] = {open_lib(argv[1]), open_lib(argv[2])};
    const int T = 512, S = 512, TD = 8;
    int32_t qk[4] = {1, T, HK, D}, vv[4] = {1, T, HV, D}, gg[3] = {1, T, HV}, hv[1] = {HV};
    int32_t qk1[4] = {1, TD, HK, D}, vv1[4] = {1, TD, HV, D}, gg1[3] = {1, TD, HV};
    int32_t xs[3] = {1, S, 2 * HK * D + HV * D}, dd[1] = {D}, nx[2] = {S * HV, D};
    Inputs in = {host(4, qk, MLXK_DTYPE_BFLOAT16, 0.088f), host(4, qk, MLXK_DTYPE_BFLOAT16, 0.088f),
                 host(4, vv, MLXK_DTYPE_BFLOAT16, 1.0f),   host(3, gg, MLXK_DTYPE_BFLOAT16, 1.0f),
                 host(3, gg, MLXK_DTYPE_BFLOAT16, 1.0f),   host(1, hv, MLXK_DTYPE_FLOAT32, 1.0f),
                 host(1, hv, MLXK_DTYPE_BFLOAT16, 1.0f),   host(3, xs, MLXK_DTYPE_BFLOAT16, 2.0f),
                 host(1, dd, MLXK_DTYPE_BFLOAT16, 0.1f),   host(1, dd, MLXK_DTYPE_BFLOAT16, 0.1f),
                 host(2, nx, MLXK_DTYPE_BFLOAT16, 2.0f),   host(2, nx, MLXK_DTYPE_BFLOAT16, 2.0f),
                 host(1, dd, MLXK_DTYPE_BFLOAT16, 1.0f)};
    Inputs dec = in;
    int32_t q1[4] = {1, 1, HK, D}, v1[4] = {1, 1, HV, D}, g1[3] = {1, 1, HV};
    (void)qk1, (void)vv1, (void)gg1;
    dec.q = host(4, q1, MLXK_DTYPE_BFLOAT16, 0.088f);
    dec.k = host(4, q1, MLXK_DTYPE_BFLOAT16, 0.088f);
    dec.v = host(4, v1, MLXK_DTYPE_BFLOAT16, 1.0f);
    dec.a = host(3, g1, MLXK_DTYPE_BFLOAT16, 1.0f);
    dec.b = host(3, g1, MLXK_DTYPE_BFLOAT16, 1.0f);
    Inputs rep = in;
    rep.q = host(4, qk1, MLXK_DTYPE_BFLOAT16, 0.088f);
    rep.k = host(4, qk1, MLXK_DTYPE_BFLOAT16, 0.088f);
    rep.v = host(4, vv1, MLXK_DTYPE_BFLOAT16, 1.0f);
    rep.a = host(3, gg1, MLXK_DTYPE_BFLOAT16, 1.0f);
    rep.b = host(3, gg1, MLXK_DTYPE_BFLOAT16, 1.0f);
    struct timespec pause = {0, 2000000}; /* 2 ms: the other build's workers park */
    printf("%-32s %10s %10s %10s %10s %8s\n", "case", "A best", "B best", "A median", "B median",
           "B/A");
    for (int c = 0; c < CASES; c++) {
        const Inputs *d = c == REPLAY ? &rep : &dec;
        double ta[1000], tb[1000], ratio[1000];
        for (int side = 0; side < 2; side++) run_case(&libs[side], c, &in, d); /* warm-up */
        for (int r = 0; r < rounds; r++) {
            int first = r % 2;
            double t[2];
            for (int i = 0; i < 2; i++) {
                int side = i == 0 ? first : 1 - first;
                nanosleep(&pause, NULL);
                t[side] = run_case(&libs[side], c, &in, d);
            }
            ta[r] = t[0], tb[r] = t[1], ratio[r] = t[1] / t[0];
        }
        double ra = median(ratio, rounds);
        double ma = median(ta, rounds), mb = median(tb, rounds);
        printf("%-32s %8.1fus %8.1fus %8.1fus %8.1fus %8.3f\n", names[c], ta[0] * 1e6, tb[0] * 1e6,
               ma * 1e6, mb * 1e6, ra);
        fflush(stdout);
    }
    return 0;
}
