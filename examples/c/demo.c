/*
 * mlxkern demo: one Qwen3.5-35B-A3B Gated DeltaNet layer through the C ABI.
 *
 * Shapes of the model's linear-attention layers: Hk = 16 key heads, Hv = 32 value heads,
 * Dk = Dv = 128, bfloat16 activations, float32 A_log, batch 1. The demo runs a 512-token prefill
 * (no initial state), then 64 decode steps (T = 1), each passing the previous call's state
 * handle back in. It times both phases and checks every output against a float64 reference
 * written here in C, so it doubles as an end-to-end check: the exit status is non-zero when an
 * error exceeds its bound.
 *
 * The library is used through include/mlxkern.h alone. The few helpers that are not about the
 * library (CHECK_OK, bfloat16 conversion, a seeded random stream, xmalloc, a clock) come from
 * examples/common/mlxk_test_util.h, which the C tests and the bench share: see "Helpers" below.
 * Build and run: `make demo` (it compiles with -Iinclude -Iexamples/common and links -lmlxkern -lm).
 */

#define _POSIX_C_SOURCE 199309L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlxkern.h"
#include "mlxk_test_util.h"

enum {
    HK = 16,
    HV = 32,
    DK = 128,
    DV = 128,
    PREFILL = 512,
    DECODE = 64,
    TOTAL = PREFILL + DECODE,
    SEED = 20250601
};

/* Error bounds. y is bfloat16 rounded from a float32 sum: at most half a bf16 ulp from the
 * exact value plus float32 error, so allow a few ulps of the output's scale (and 2 ulps of each
 * element's own magnitude, floored at scale / 256 where float32 error dominates). The state is
 * float32 accumulated over 576 tokens, compared relative to its largest element. g is float32. */
#define Y_BOUND_ULPS 4.0
#define Y_BOUND_ELEM_ULPS 2.0
#define STATE_BOUND_REL 1e-3
#define G_BOUND_REL 1e-5

/* ---------------------------------------------------------------------------------------- */
/* Helpers                                                                                  */

/* examples/common/mlxk_test_util.h provides:
 *   CHECK_OK(call)      the call must return MLXK_OK, else the demo stops, printing the status
 *                       and the library's message (mlxk_last_error())
 *   mlxkt_bf16_*        float <-> bfloat16 bits (round to nearest even)
 *   mlxkt_rng_*         splitmix64 random numbers: uniform in [0, 1), standard normal
 *   mlxkt_xmalloc       malloc that stops the demo when out of memory
 *   mlxkt_now_seconds   the monotonic clock
 * The random stream has a fixed seed: every run sees the same inputs. */
static mlxkt_rng rng = {SEED};

/* ---------------------------------------------------------------------------------------- */
/* Inputs                                                                                   */

/* Host copies of every input, for all TOTAL tokens; the *_f arrays hold the bf16 values the
 * library sees, widened to float (what the reference reads). */
typedef struct {
    uint16_t *q, *k, *v, *a, *b; /* bf16 bits, [T, Hk, Dk] / [T, Hv, Dv] / [T, Hv] */
    uint16_t dt_bias[HV];        /* bf16 bits */
    float a_log[HV];             /* float32 */
    float *qf, *kf, *vf, *af, *bf;
    float dt_bias_f[HV];
} Inputs;

/* q and k as mlx-lm's normalize_qk leaves them: q = l2norm(q) * Dk^-1/2, k = l2norm(k). */
static void normalized_head(uint16_t *bits, float *widened, double scale) {
    double x[DK];
    double norm2 = 0.0;
    for (int i = 0; i < DK; i++) {
        x[i] = mlxkt_rng_normal(&rng);
        norm2 += x[i] * x[i];
    }
    double inv = scale / sqrt(norm2 + 1e-12);
    for (int i = 0; i < DK; i++) {
        bits[i] = mlxkt_bf16_from_float((float)(x[i] * inv));
        widened[i] = mlxkt_bf16_to_float(bits[i]);
    }
}

static void make_inputs(Inputs *in) {
    size_t nqk = (size_t)TOTAL * HK * DK, nv = (size_t)TOTAL * HV * DV, ng = (size_t)TOTAL * HV;
    in->q = mlxkt_xmalloc(nqk * sizeof *in->q);
    in->k = mlxkt_xmalloc(nqk * sizeof *in->k);
    in->v = mlxkt_xmalloc(nv * sizeof *in->v);
    in->a = mlxkt_xmalloc(ng * sizeof *in->a);
    in->b = mlxkt_xmalloc(ng * sizeof *in->b);
    in->qf = mlxkt_xmalloc(nqk * sizeof *in->qf);
    in->kf = mlxkt_xmalloc(nqk * sizeof *in->kf);
    in->vf = mlxkt_xmalloc(nv * sizeof *in->vf);
    in->af = mlxkt_xmalloc(ng * sizeof *in->af);
    in->bf = mlxkt_xmalloc(ng * sizeof *in->bf);

    const double q_scale = 1.0 / sqrt((double)DK);
    for (size_t head = 0; head < (size_t)TOTAL * HK; head++) {
        normalized_head(in->q + head * DK, in->qf + head * DK, q_scale);
        normalized_head(in->k + head * DK, in->kf + head * DK, 1.0);
    }
    for (size_t i = 0; i < nv; i++) {
        in->v[i] = mlxkt_bf16_from_float((float)mlxkt_rng_normal(&rng));
        in->vf[i] = mlxkt_bf16_to_float(in->v[i]);
    }
    for (size_t i = 0; i < ng; i++) {
        in->a[i] = mlxkt_bf16_from_float((float)mlxkt_rng_normal(&rng));
        in->af[i] = mlxkt_bf16_to_float(in->a[i]);
        in->b[i] = mlxkt_bf16_from_float((float)mlxkt_rng_normal(&rng));
        in->bf[i] = mlxkt_bf16_to_float(in->b[i]);
    }
    for (int h = 0; h < HV; h++) {
        /* As the model initialises them: A ~ U(0, 16) (A_log = log A), dt in [1e-3, 1e-1]
         * with dt_bias = softplus^-1(dt). */
        in->a_log[h] = (float)log(0.5 + 15.5 * mlxkt_rng_uniform(&rng));
        double dt = exp(log(1e-3) + (log(1e-1) - log(1e-3)) * mlxkt_rng_uniform(&rng));
        in->dt_bias[h] = mlxkt_bf16_from_float((float)(dt + log(-expm1(-dt))));
        in->dt_bias_f[h] = mlxkt_bf16_to_float(in->dt_bias[h]);
    }
}

static void free_inputs(Inputs *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->a);
    free(in->b);
    free(in->qf);
    free(in->kf);
    free(in->vf);
    free(in->af);
    free(in->bf);
}

/* The per-token arrays of tokens [t0, t0 + t) as library handles. */
typedef struct {
    mlxk_array *q, *k, *v, *a, *b;
} TokenArrays;

static TokenArrays upload_tokens(const Inputs *in, int t0, int t) {
    TokenArrays h;
    int32_t qk_shape[4] = {1, t, HK, DK};
    int32_t v_shape[4] = {1, t, HV, DV};
    int32_t g_shape[3] = {1, t, HV};
    CHECK_OK(mlxk_array_new(in->q + (size_t)t0 * HK * DK, qk_shape, 4, MLXK_DTYPE_BFLOAT16, &h.q));
    CHECK_OK(mlxk_array_new(in->k + (size_t)t0 * HK * DK, qk_shape, 4, MLXK_DTYPE_BFLOAT16, &h.k));
    CHECK_OK(mlxk_array_new(in->v + (size_t)t0 * HV * DV, v_shape, 4, MLXK_DTYPE_BFLOAT16, &h.v));
    CHECK_OK(mlxk_array_new(in->a + (size_t)t0 * HV, g_shape, 3, MLXK_DTYPE_BFLOAT16, &h.a));
    CHECK_OK(mlxk_array_new(in->b + (size_t)t0 * HV, g_shape, 3, MLXK_DTYPE_BFLOAT16, &h.b));
    return h;
}

static void free_tokens(TokenArrays *h) {
    CHECK_OK(mlxk_array_free(h->q));
    CHECK_OK(mlxk_array_free(h->k));
    CHECK_OK(mlxk_array_free(h->v));
    CHECK_OK(mlxk_array_free(h->a));
    CHECK_OK(mlxk_array_free(h->b));
}

/* ---------------------------------------------------------------------------------------- */
/* float64 reference                                                                        */

/* The gates. With `exact`, plain float64 math on the bf16 inputs. Otherwise at the rounding
 * points MLX uses for bfloat16 inputs, which mlx-lm's compute_g and sigmoid(b) inherit and the
 * library reproduces (its contract): each elementwise op on bf16 values rounds to bf16, so
 *   x = bf16(a + dt_bias)
 *   softplus(x) = logaddexp(x, 0) = bf16(max(x, 0) + bf16(log1p(bf16(exp(-|x|)))))
 *   beta = sigmoid(b): e = bf16(exp(|b|)), y = 1 / (1 + e) in float32,
 *          beta = bf16(b < 0 ? y : 1 - y)
 * and g = exp(-exp(A_log) * softplus) from there in float64. The transcendentals here are
 * libm's, not MLX's own polynomials, so a value within a hair of a bf16 rounding boundary may
 * still land one bf16 ulp apart; with the fixed seed none does by enough to matter. */
static void reference_gates(const Inputs *in, int exact, double *g, double *beta) {
    for (size_t i = 0; i < (size_t)TOTAL * HV; i++) {
        int h = (int)(i % HV);
        double sp, bt;
        if (exact) {
            double x = (double)in->af[i] + (double)in->dt_bias_f[h];
            sp = (x > 0 ? x : 0.0) + log1p(exp(-fabs(x)));
            bt = 1.0 / (1.0 + exp(-(double)in->bf[i]));
        } else {
            float x = mlxkt_bf16_round(in->af[i] + in->dt_bias_f[h]);
            float e = mlxkt_bf16_round((float)exp(-fabs((double)x)));
            float l = mlxkt_bf16_round((float)log1p((double)e));
            sp = mlxkt_bf16_round((x > 0.0f ? x : 0.0f) + l);
            float b = in->bf[i];
            float eb = mlxkt_bf16_round((float)exp(fabs((double)b)));
            float y = 1.0f / (1.0f + eb);
            bt = mlxkt_bf16_round(b < 0.0f ? y : 1.0f - y);
        }
        g[i] = exp(-exp((double)in->a_log[h]) * sp);
        beta[i] = bt;
    }
}

/* The recurrence over all TOTAL tokens from a zero state. Writes y [T, Hv, Dv], the state
 * after the prefill into state_prefill and the final state into state [Hv, Dv, Dk]. */
static void reference_recurrence(const Inputs *in, const double *g, const double *beta,
                                 double *y, double *state_prefill, double *state) {
    memset(state, 0, sizeof(double) * HV * DV * DK);
    for (int t = 0; t < TOTAL; t++) {
        if (t == PREFILL) {
            memcpy(state_prefill, state, sizeof(double) * HV * DV * DK);
        }
        for (int h = 0; h < HV; h++) {
            int hk = h / (HV / HK);
            const float *q = in->qf + ((size_t)t * HK + hk) * DK;
            const float *k = in->kf + ((size_t)t * HK + hk) * DK;
            double gt = g[(size_t)t * HV + h], bt = beta[(size_t)t * HV + h];
            for (int dv = 0; dv < DV; dv++) {
                double *s = state + ((size_t)h * DV + dv) * DK;
                double kv = 0.0;
                for (int i = 0; i < DK; i++) {
                    s[i] *= gt;
                    kv += s[i] * (double)k[i];
                }
                double delta = ((double)in->vf[((size_t)t * HV + h) * DV + dv] - kv) * bt;
                double out = 0.0;
                for (int i = 0; i < DK; i++) {
                    s[i] += (double)k[i] * delta;
                    out += s[i] * (double)q[i];
                }
                y[((size_t)t * HV + h) * DV + dv] = out;
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Error measures                                                                           */

/* The spacing of bfloat16 values at magnitude |x| (one ulp). */
static double bf16_ulp(double x) {
    int e;
    frexp(fabs(x), &e); /* |x| = m * 2^e, 0.5 <= m < 1 */
    return ldexp(1.0, e - 8);
}

typedef struct {
    double max_abs;   /* max |got - ref| */
    double scale;     /* max |ref| */
    double rel;       /* max_abs / scale */
    double ulps;      /* max_abs in bf16 ulps of scale */
    double elem_ulps; /* max over elements of |err| in bf16 ulps of max(|ref|, scale / 256) */
} ErrorStats;

static ErrorStats compare(const double *ref, size_t n, const float *got) {
    ErrorStats e = {0.0, 0.0, 0.0, 0.0, 0.0};
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= e.max_abs)) { /* also catches NaN */
            e.max_abs = d;
        }
        if (fabs(ref[i]) > e.scale) {
            e.scale = fabs(ref[i]);
        }
    }
    double low = e.scale / 256.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]) / bf16_ulp(fabs(ref[i]) > low ? ref[i] : low);
        if (!(d <= e.elem_ulps)) {
            e.elem_ulps = d;
        }
    }
    e.rel = e.scale > 0 ? e.max_abs / e.scale : e.max_abs;
    e.ulps = e.scale > 0 ? e.max_abs / bf16_ulp(e.scale) : 0.0;
    return e;
}

static int report(const char *what, ErrorStats e, int is_state) {
    int ok;
    if (is_state) {
        ok = e.rel <= STATE_BOUND_REL;
        printf("  %-20s max |err| %.3e  scale %.3e  err/scale %.3e  %s\n", what, e.max_abs,
               e.scale, e.rel, ok ? "ok" : "TOO LARGE");
    } else {
        ok = e.ulps <= Y_BOUND_ULPS && e.elem_ulps <= Y_BOUND_ELEM_ULPS;
        printf("  %-20s max |err| %.3e  scale %.3e  err/scale %.3e  = %.2f bf16 ulp of scale; "
               "worst element %.2f ulp of itself  %s\n",
               what, e.max_abs, e.scale, e.rel, e.ulps, e.elem_ulps, ok ? "ok" : "TOO LARGE");
    }
    return ok;
}

/* ---------------------------------------------------------------------------------------- */

int main(void) {
    printf("mlxkern %s (header %s), C ABI %u (header %d)\n", mlxk_version(), MLXK_VERSION,
           mlxk_abi_version(), MLXK_ABI_VERSION);
    if (mlxk_abi_version() != (uint32_t)MLXK_ABI_VERSION) {
        fprintf(stderr, "demo: the loaded library's C ABI (%u) differs from the header's (%d)\n",
                mlxk_abi_version(), MLXK_ABI_VERSION);
        return 1;
    }
    if (strcmp(mlxk_version(), MLXK_VERSION) != 0) {
        printf("note: library version %s differs from the header's %s (same ABI)\n", mlxk_version(),
               MLXK_VERSION);
    }
    const char *backends[] = {"none", "Metal", "CUDA"};
    mlxk_gpu_backend_kind backend = mlxk_gpu_backend();
    printf("GPU backend of the loaded MLX: %s; kernels run on the CPU (default device)\n",
           backend >= 0 && backend <= 2 ? backends[backend] : "unknown");
    printf("Qwen3.5-35B-A3B Gated DeltaNet layer: Hk %d, Hv %d, Dk %d, Dv %d, B 1, bfloat16; "
           "prefill %d tokens, then %d decode steps\n\n",
           HK, HV, DK, DV, PREFILL, DECODE);

    Inputs in;
    make_inputs(&in);

    /* Per-layer constants, made once. */
    mlxk_array *a_log, *dt_bias;
    int32_t hv_shape[1] = {HV};
    CHECK_OK(mlxk_array_new(in.a_log, hv_shape, 1, MLXK_DTYPE_FLOAT32, &a_log));
    CHECK_OK(mlxk_array_new(in.dt_bias, hv_shape, 1, MLXK_DTYPE_BFLOAT16, &dt_bias));

    const size_t state_elems = (size_t)HV * DV * DK;
    uint16_t *y_bits = mlxkt_xmalloc(sizeof(uint16_t) * TOTAL * HV * DV);
    float *state_prefill = mlxkt_xmalloc(sizeof(float) * state_elems);
    float *state_final = mlxkt_xmalloc(sizeof(float) * state_elems);

    /* Prefill: T = 512, no initial state. */
    TokenArrays x = upload_tokens(&in, 0, PREFILL);
    mlxk_array *y, *state;
    double t0 = mlxkt_now_seconds();
    CHECK_OK(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, a_log, dt_bias, NULL, NULL, &y,
                                     &state));
    CHECK_OK(mlxk_array_eval(y)); /* one primitive computes y and the state together */
    CHECK_OK(mlxk_array_read(y, y_bits, sizeof(uint16_t) * PREFILL * HV * DV));
    double prefill_s = mlxkt_now_seconds() - t0;
    CHECK_OK(mlxk_array_free(y));
    CHECK_OK(mlxk_array_read(state, state_prefill, sizeof(float) * state_elems));

    /* The same prefill in chunked (WY) form: an explicit option, faster on the CPU for long
     * prompts, equal to the exact update up to float32 rounding. */
    uint16_t *y_chunked_bits = mlxkt_xmalloc(sizeof(uint16_t) * PREFILL * HV * DV);
    float *state_chunked = mlxkt_xmalloc(sizeof(float) * state_elems);
    mlxk_array *y_chunked, *s_chunked;
    double tc = mlxkt_now_seconds();
    CHECK_OK(mlxk_gated_delta_update_chunked(x.q, x.k, x.v, x.a, x.b, a_log, dt_bias, NULL, NULL, 0,
                                             &y_chunked, &s_chunked));
    CHECK_OK(mlxk_array_eval(y_chunked));
    CHECK_OK(mlxk_array_read(y_chunked, y_chunked_bits, sizeof(uint16_t) * PREFILL * HV * DV));
    double chunked_s = mlxkt_now_seconds() - tc;
    CHECK_OK(mlxk_array_read(s_chunked, state_chunked, sizeof(float) * state_elems));
    CHECK_OK(mlxk_array_free(y_chunked));
    CHECK_OK(mlxk_array_free(s_chunked));
    free_tokens(&x);

    /* Decode: T = 1 per step, carrying the state handle. The old state handle is freed before
     * the new state is evaluated, so MLX holds the only reference and the CPU kernel writes the
     * new state into the old buffer. */
    double t1 = mlxkt_now_seconds();
    for (int step = 0; step < DECODE; step++) {
        int t = PREFILL + step;
        TokenArrays xt = upload_tokens(&in, t, 1);
        mlxk_array *new_state;
        CHECK_OK(mlxk_gated_delta_update(xt.q, xt.k, xt.v, xt.a, xt.b, a_log, dt_bias, state, NULL,
                                         &y, &new_state));
        CHECK_OK(mlxk_array_free(state));
        state = new_state;
        free_tokens(&xt);
        CHECK_OK(mlxk_array_read(y, y_bits + (size_t)t * HV * DV, sizeof(uint16_t) * HV * DV));
        CHECK_OK(mlxk_array_free(y));
    }
    double decode_s = mlxkt_now_seconds() - t1;
    CHECK_OK(mlxk_array_read(state, state_final, sizeof(float) * state_elems));
    CHECK_OK(mlxk_array_free(state));

    /* The gate, through mlxk_compute_g, against the reference's (same rounding points). */
    mlxk_array *a_all, *g;
    int32_t g_shape[3] = {1, TOTAL, HV};
    CHECK_OK(mlxk_array_new(in.a, g_shape, 3, MLXK_DTYPE_BFLOAT16, &a_all));
    CHECK_OK(mlxk_compute_g(a_log, a_all, dt_bias, &g));
    float *g_lib = mlxkt_xmalloc(sizeof(float) * TOTAL * HV);
    CHECK_OK(mlxk_array_read(g, g_lib, sizeof(float) * TOTAL * HV));
    CHECK_OK(mlxk_array_free(g));
    CHECK_OK(mlxk_array_free(a_all));
    CHECK_OK(mlxk_array_free(a_log));
    CHECK_OK(mlxk_array_free(dt_bias));

    printf("prefill: %d tokens in %.1f ms = %.0f tokens/s (one call, eval, y read back)\n", PREFILL,
           prefill_s * 1e3, PREFILL / prefill_s);
    printf("prefill, chunked form (mlxk_gated_delta_update_chunked): %.1f ms = %.0f tokens/s\n",
           chunked_s * 1e3, PREFILL / chunked_s);
    printf("decode:  %d steps in %.1f ms = %.0f us/step = %.0f tokens/s (T = 1, one eval per step, "
           "inputs uploaded each step)\n\n",
           DECODE, decode_s * 1e3, decode_s * 1e6 / DECODE, DECODE / decode_s);

    /* float64 reference, at the library's gate rounding points, and with exact gates. */
    double *g_ref = mlxkt_xmalloc(sizeof(double) * TOTAL * HV);
    double *beta_ref = mlxkt_xmalloc(sizeof(double) * TOTAL * HV);
    double *y_ref = mlxkt_xmalloc(sizeof(double) * TOTAL * HV * DV);
    double *s_ref_prefill = mlxkt_xmalloc(sizeof(double) * state_elems);
    double *s_ref = mlxkt_xmalloc(sizeof(double) * state_elems);
    float *y_got = mlxkt_xmalloc(sizeof(float) * TOTAL * HV * DV);
    for (size_t i = 0; i < (size_t)TOTAL * HV * DV; i++) {
        y_got[i] = mlxkt_bf16_to_float(y_bits[i]);
    }

    reference_gates(&in, 0, g_ref, beta_ref);
    double g_rel = 0.0;
    for (size_t i = 0; i < (size_t)TOTAL * HV; i++) {
        double d = fabs((double)g_lib[i] - g_ref[i]) / (g_ref[i] > 1e-30 ? g_ref[i] : 1e-30);
        if (!(d <= g_rel)) {
            g_rel = d;
        }
    }
    reference_recurrence(&in, g_ref, beta_ref, y_ref, s_ref_prefill, s_ref);

    const size_t prefill_y = (size_t)PREFILL * HV * DV, decode_y = (size_t)DECODE * HV * DV;
    int ok = 1;
    printf("errors against the float64 reference (gates at mlx-lm's bf16 rounding points):\n");
    int g_ok = g_rel <= G_BOUND_REL;
    printf("  %-20s max relative error %.3e  %s\n", "g (mlxk_compute_g)", g_rel,
           g_ok ? "ok" : "TOO LARGE");
    ok &= g_ok;
    ok &= report("y prefill", compare(y_ref, prefill_y, y_got), 0);
    ok &= report("y decode", compare(y_ref + prefill_y, decode_y, y_got + prefill_y), 0);
    ok &= report("state after prefill", compare(s_ref_prefill, state_elems, state_prefill), 1);
    ok &= report("state after decode", compare(s_ref, state_elems, state_final), 1);
    float *y_chunked_f = mlxkt_xmalloc(sizeof(float) * PREFILL * HV * DV);
    for (size_t i = 0; i < prefill_y; i++) {
        y_chunked_f[i] = mlxkt_bf16_to_float(y_chunked_bits[i]);
    }
    ok &= report("y prefill, chunked", compare(y_ref, prefill_y, y_chunked_f), 0);
    ok &= report("state, chunked", compare(s_ref_prefill, state_elems, state_chunked), 1);
    free(y_chunked_f);

    /* For information: how far the bf16 gate roundings (mlx-lm's, hence the library's) move the
     * result from the same recurrence with exact float64 gates. Not a pass/fail measure. */
    reference_gates(&in, 1, g_ref, beta_ref);
    reference_recurrence(&in, g_ref, beta_ref, y_ref, s_ref_prefill, s_ref);
    ErrorStats ye = compare(y_ref, prefill_y + decode_y, y_got);
    ErrorStats se = compare(s_ref, state_elems, state_final);
    printf("for reference, against float64 gates without bf16 rounding: y err/scale %.3e, "
           "final state err/scale %.3e\n",
           ye.rel, se.rel);

    free(g_ref);
    free(beta_ref);
    free(y_ref);
    free(s_ref_prefill);
    free(s_ref);
    free(y_got);
    free(g_lib);
    free(y_bits);
    free(state_prefill);
    free(state_final);
    free(y_chunked_bits);
    free(state_chunked);
    free_inputs(&in);

    if (!ok) {
        fprintf(stderr, "demo: FAILED: an error exceeds its bound (y %.0f bf16 ulps of scale, "
                        "state %.0e relative, g %.0e relative)\n",
                Y_BOUND_ULPS, STATE_BOUND_REL, G_BOUND_REL);
        return 1;
    }
    printf("\ndemo: PASS\n");
    return 0;
}
