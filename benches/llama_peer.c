/*
 * The llama.cpp peer of the mlxkern benchmark: ggml's CPU GGML_OP_GATED_DELTA_NET (ggml 0.25.3,
 * as vendored by the llama-cpp-python 0.3.36 sdist) on the same cases and inputs as
 * benches/bench.c, timed the same way (benches/harness.h), records shaped like bench.c's with
 * impl "llama_cpp". Built against a CPU-only ggml and run by scripts/bench/llama-peer.sh and
 * scripts/bench/run.sh, one case group at a time, right after bench.c and peer.py ran the group.
 *
 *   llama_peer OUTPUT.json [GROUP...]    groups: decode1 decode4 decode16 prefill (default: all)
 *
 * Cases (Qwen3.5-35B-A3B dims: Hk 16, Hv 32, Dk = Dv = 128; 30 GDN layers):
 *   decode (T = 1) at B = 1, 4, 16
 *     hot   one layer, 30 steps: 30 ops in one graph, step i's state input a view of step
 *           i-1's output (the op writes y and the new state into a fresh output tensor; ggml
 *           has no in-place form), one ggml_graph_compute (chained), or one graph of one op
 *           per step, the 30 in turn (per call: the same nodes, computed one at a time)
 *     cold  30 distinct layer states, one step each: 30 ops in one graph (chained) or one
 *           graph per op, successive calls walking the layers (per call)
 *   prefill at T = 64, 512, 4096 (B = 1; the op needs a state: zeros)
 * Graphs are built once and computed repeatedly (llama.cpp reuses graphs between tokens);
 * every compute plans the graph (ggml_graph_plan) as ggml's CPU backend does. Threads: as many
 * as the CPUs online, at most 8 (the count mlxkern's worker pool takes);
 * MLXK_BENCH_LLAMA_THREADS overrides it.
 *
 * Semantic mapping (the op differs from mlxkern's update in four ways; the inputs are mapped so
 * that both compute the same numbers):
 *   1. f32 only: q, k, v are bench.c's bfloat16 values widened to float32 (exact).
 *   2. g in log space (the op applies expf(g)): g is mlxk_compute_g's float32 result (the very
 *      g mlxkern's kernel uses), passed as logf(g).
 *   3. beta given (mlxkern computes sigmoid(b) inside): beta = sigmoid(b) as MLX computes it for
 *      bfloat16 b (exp, then rounded to bfloat16 twice, as mlxkern's kernel does), in float32.
 *   4. y scaled by 1/sqrt(Dv) inside: q is passed times sqrt(Dk) (Dk = Dv; llama.cpp's model
 *      hands the op an L2-normalized q, mlx-lm's normalize_qk a q of norm Dk^-1/2).
 *   5. value head h reads key head h % Hk (tiled), mlxkern's h / (Hv / Hk) (repeated): the
 *      value heads are permuted, mlxkern's head h placed at position h / r + Hk * (h % r)
 *      (r = Hv / Hk), which reads key head h / r; v, g, beta and the state are written and y
 *      and the state read through that permutation. The state layout [B, Hv, Dv, Dk] is the
 *      same on both sides.
 * Before any case is timed, its outputs are compared with mlxkern's on the same inputs (through
 * the C ABI): the largest |difference| of y and of the state, relative to mlxkern's largest
 * magnitude, must stay within Y_TOL and STATE_TOL (see there); otherwise the program prints
 * the failure, writes the JSON with the check and exits 3 (scripts/bench/run.sh then reports the
 * peer as failed and goes on).
 *
 * Environment: MLXK_BENCH_QUICK=1 (short run), MLXK_BENCH_LLAMA_THREADS.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ggml-cpu.h"
#include "ggml.h"
#include "inputs.h"
#include "mlxkern.h"
#include "mlxk_test_util.h"
#include "harness.h"

#ifndef LLAMA_SOURCE
#define LLAMA_SOURCE "llama.cpp (unknown source)"
#endif

enum {
    HK = 16,
    HV = 32,
    DK = 128,
    DV = 128,
    R = HV / HK,  /* value heads per key head */
    LAYERS = 30,
    MAX_CHECKS = 32
};

#define STATE_ELEMS ((size_t)HV * DV * DK)

/* Agreement limits, relative to mlxkern's largest magnitude of the same output.
 * y: mlxkern returns y in bfloat16 (q's dtype), rounded to nearest, so near its largest values
 * y is off by up to half a bfloat16 ulp: at most 2^-8 of the largest magnitude; the float32
 * arithmetic of the two kernels (ggml: FMA-contracted vector dot products; mlxkern: lane
 * partials and a butterfly, no FMA) adds differences of order 1e-6 (mlxkern's kernel is within
 * 1.2e-6 of a float64 recurrence at these dims, T up to 4096). y: 2^-8 + 1e-4.
 * state: float32 on both sides: 1e-4, about 100x the float32 differences.
 * A semantic mismatch (a wrong head mapping, g taken as linear, beta = b, a missing scale) makes
 * differences of order 0.1 to 1. */
#define Y_TOL (1.0 / 256.0 + 1e-4)
#define STATE_TOL 1e-4

static int n_threads;
static struct ggml_threadpool *threadpool;
static uint8_t *work;
static size_t work_cap;
static HostInfo host;


typedef struct {
    char id[80];
    double y_rel, state_rel;
    int ok;
} Check;

static Check checks[MAX_CHECKS];
static int n_checks, check_failed;

/* ---------------------------------------------------------------------------------------- */
/* Inputs: bench.c's values (benches/inputs.h, same seeds)                                  */

typedef struct {
    int batch, tokens;
    uint16_t *q, *k, *v, *a, *b; /* bfloat16 bits */
} HostIn;

static HostIn gen_inputs(int batch, int tokens, uint64_t cs) {
    HostIn in = {batch, tokens, NULL, NULL, NULL, NULL, NULL};
    size_t n_qk = (size_t)batch * tokens * HK * DK;
    size_t n_v = (size_t)batch * tokens * HV * DV;
    size_t n_ab = (size_t)batch * tokens * HV;
    in.q = mlxkt_xmalloc(n_qk * sizeof(uint16_t));
    in.k = mlxkt_xmalloc(n_qk * sizeof(uint16_t));
    in.v = mlxkt_xmalloc(n_v * sizeof(uint16_t));
    in.a = mlxkt_xmalloc(n_ab * sizeof(uint16_t));
    in.b = mlxkt_xmalloc(n_ab * sizeof(uint16_t));
    fill_unit_rows_bf16(in.q, n_qk / DK, DK, tensor_seed(TAG_Q, cs), 1.0 / sqrt((double)DK));
    fill_unit_rows_bf16(in.k, n_qk / DK, DK, tensor_seed(TAG_K, cs), 1.0);
    fill_normal_bf16(in.v, n_v, tensor_seed(TAG_V, cs), 1.0);
    fill_normal_bf16(in.a, n_ab, tensor_seed(TAG_A, cs), 1.0);
    fill_normal_bf16(in.b, n_ab, tensor_seed(TAG_B, cs), 1.0);
    return in;
}

static void free_inputs(HostIn *in) {
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->a);
    free(in->b);
}

static float a_log[HV];
static uint16_t dt_bias[HV];
static float *state_pattern; /* one sequence's state [Hv, Dv, Dk] */
static mlxk_array *a_log_arr, *dt_bias_arr;

static void make_shared_inputs(void) {
    uint64_t cs = case_seed(KIND_SHARED, 0, 0, 0);
    for (int h = 0; h < HV; h++) {
        a_log[h] = (float)log(1.0 + 15.0 * uniform_at(tensor_seed(TAG_A_LOG, cs), (uint64_t)h));
    }
    fill_normal_bf16(dt_bias, HV, tensor_seed(TAG_DT_BIAS, cs), 0.5);
    int32_t shape[1] = {HV};
    a_log_arr = mlxkt_new_array(a_log, shape, 1, MLXK_DTYPE_FLOAT32);
    dt_bias_arr = mlxkt_new_array(dt_bias, shape, 1, MLXK_DTYPE_BFLOAT16);
    state_pattern = mlxkt_xmalloc(sizeof(float) * STATE_ELEMS);
    uint64_t seed = tensor_seed(TAG_STATE, cs);
    for (size_t i = 0; i < STATE_ELEMS; i++) {
        state_pattern[i] = (float)(normal_at(seed, i) * 0.05);
    }
}

/* ggml's position of mlxkern's value head h (see the header: item 5). */
static int vpos(int h) { return h / R + HK * (h % R); }

/* MLX's CPU sigmoid of a bfloat16 value: e = bf16(exp|x|), y = 1 / (1 + e), bf16(x < 0 ? y : 1 - y). */
static float sigmoid_bf16(float x) {
    float e = mlxkt_bf16_round(expf(fabsf(x)));
    float y = 1.0f / (1.0f + e);
    return mlxkt_bf16_round(x < 0.0f ? y : 1.0f - y);
}

/* ---------------------------------------------------------------------------------------- */
/* mlxkern side (the reference of the agreement check)                                      */

typedef struct {
    mlxk_array *q, *k, *v, *a, *b;
} KernIn;

static KernIn kern_inputs(const HostIn *in) {
    int32_t qk_shape[4] = {in->batch, in->tokens, HK, DK};
    int32_t v_shape[4] = {in->batch, in->tokens, HV, DV};
    int32_t ab_shape[3] = {in->batch, in->tokens, HV};
    KernIn k = {mlxkt_new_array(in->q, qk_shape, 4, MLXK_DTYPE_BFLOAT16),
                mlxkt_new_array(in->k, qk_shape, 4, MLXK_DTYPE_BFLOAT16),
                mlxkt_new_array(in->v, v_shape, 4, MLXK_DTYPE_BFLOAT16),
                mlxkt_new_array(in->a, ab_shape, 3, MLXK_DTYPE_BFLOAT16),
                mlxkt_new_array(in->b, ab_shape, 3, MLXK_DTYPE_BFLOAT16)};
    return k;
}

static void free_kern_inputs(KernIn *k) {
    CHECK_OK(mlxk_array_free(k->q));
    CHECK_OK(mlxk_array_free(k->k));
    CHECK_OK(mlxk_array_free(k->v));
    CHECK_OK(mlxk_array_free(k->a));
    CHECK_OK(mlxk_array_free(k->b));
}

/* mlxkern's state for `batch` rows: the shared pattern in every row. */
static mlxk_array *kern_state(int batch) {
    float *buf = mlxkt_xmalloc(sizeof(float) * STATE_ELEMS * (size_t)batch);
    for (int b = 0; b < batch; b++) {
        memcpy(buf + (size_t)b * STATE_ELEMS, state_pattern, sizeof(float) * STATE_ELEMS);
    }
    int32_t shape[4] = {batch, HV, DV, DK};
    mlxk_array *s = mlxkt_new_array(buf, shape, 4, MLXK_DTYPE_FLOAT32);
    free(buf);
    return s;
}

/* ---------------------------------------------------------------------------------------- */
/* ggml side                                                                                */

typedef struct {
    struct ggml_tensor *q, *k, *v, *g, *beta;
} GgmlIn;

static struct ggml_tensor *new_f32(struct ggml_context *ctx, int64_t n0, int64_t n1, int64_t n2, int64_t n3) {
    struct ggml_tensor *t = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n0, n1, n2, n3);
    if (t == NULL || t->data == NULL) {
        fprintf(stderr, "llama_peer: ggml context out of memory\n");
        exit(1);
    }
    return t;
}

/* The op's inputs for `in` (mapped as the header says); `kin` gives g through mlxk_compute_g. */
static GgmlIn ggml_inputs(struct ggml_context *ctx, const HostIn *in, const KernIn *kin) {
    int B = in->batch, T = in->tokens;
    size_t bt_n = (size_t)B * T;
    GgmlIn g;
    g.q = new_f32(ctx, DK, HK, T, B);
    g.k = new_f32(ctx, DK, HK, T, B);
    g.v = new_f32(ctx, DV, HV, T, B);
    g.g = new_f32(ctx, 1, HV, T, B);
    g.beta = new_f32(ctx, 1, HV, T, B);
    float *q = g.q->data, *k = g.k->data, *v = g.v->data, *lg = g.g->data, *beta = g.beta->data;
    const float q_scale = sqrtf((float)DK);
    for (size_t i = 0; i < bt_n * HK * DK; i++) {
        q[i] = mlxkt_bf16_to_float(in->q[i]) * q_scale;
        k[i] = mlxkt_bf16_to_float(in->k[i]);
    }
    mlxk_array *garr;
    CHECK_OK(mlxk_compute_g(a_log_arr, kin->a, dt_bias_arr, &garr));
    float *gv = mlxkt_read_floats(garr, bt_n * HV);
    CHECK_OK(mlxk_array_free(garr));
    for (size_t bt = 0; bt < bt_n; bt++) {
        for (int h = 0; h < HV; h++) {
            size_t src = bt * HV + (size_t)h, dst = bt * HV + (size_t)vpos(h);
            for (int j = 0; j < DV; j++) {
                v[dst * DV + (size_t)j] = mlxkt_bf16_to_float(in->v[src * DV + (size_t)j]);
            }
            lg[dst] = logf(gv[src]);
            beta[dst] = sigmoid_bf16(mlxkt_bf16_to_float(in->b[src]));
        }
    }
    free(gv);
    return g;
}

/* A [Dk, Dv, Hv, B] state (ggml's order of dims): the shared pattern, heads permuted; or zeros. */
static struct ggml_tensor *ggml_state(struct ggml_context *ctx, int batch, int zeros) {
    struct ggml_tensor *s = new_f32(ctx, DK, DV, HV, batch);
    float *d = s->data;
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < HV; h++) {
            float *dst = d + ((size_t)b * HV + (size_t)vpos(h)) * DV * DK;
            if (zeros) {
                memset(dst, 0, sizeof(float) * DV * DK);
            } else {
                memcpy(dst, state_pattern + (size_t)h * DV * DK, sizeof(float) * DV * DK);
            }
        }
    }
    return s;
}

static struct ggml_tensor *gdn(struct ggml_context *ctx, const GgmlIn *in, struct ggml_tensor *state) {
    return ggml_gated_delta_net(ctx, in->q, in->k, in->v, in->g, in->beta, state, 1);
}

/* The new state inside an op's output [y (B*T*Hv*Dv) | state (B*Hv*Dv*Dk)], as a tensor. */
static struct ggml_tensor *state_view(struct ggml_context *ctx, struct ggml_tensor *op, int batch, int tokens) {
    size_t f = sizeof(float);
    return ggml_view_4d(ctx, op, DK, DV, HV, batch, DK * f, (size_t)DK * DV * f, STATE_ELEMS * f,
                        (size_t)batch * tokens * HV * DV * f);
}

static const float *out_state(const struct ggml_tensor *op, int batch, int tokens) {
    return (const float *)op->data + (size_t)batch * tokens * HV * DV;
}

/* One ggml_graph_compute of `gf` with the planned work buffer, as ggml's CPU backend does. */
static void compute(struct ggml_cgraph *gf) {
    struct ggml_cplan plan = ggml_graph_plan(gf, n_threads, threadpool);
    if (plan.work_size > work_cap) {
        free(work);
        work_cap = plan.work_size;
        work = mlxkt_xmalloc(work_cap);
    }
    plan.work_data = work;
    if (ggml_graph_compute(gf, &plan) != GGML_STATUS_SUCCESS) {
        fprintf(stderr, "llama_peer: ggml_graph_compute failed\n");
        exit(1);
    }
}

static void compute_body(void *p) { compute(p); }

typedef struct {
    struct ggml_cgraph *graphs[LAYERS];
    int next;
} Rotation;

/* One graph of one op; successive calls take the next graph. */
static void rotation_body(void *p) {
    Rotation *r = p;
    compute(r->graphs[r->next]);
    r->next = (r->next + 1) % LAYERS;
}

static struct ggml_cgraph *graph_of_one(struct ggml_context *ctx, struct ggml_tensor *op) {
    struct ggml_cgraph *gf = ggml_new_graph_custom(ctx, 8, false);
    ggml_graph_add_node(gf, op);
    return gf;
}

static struct ggml_context *new_context(size_t data_bytes, int tensors, int graphs) {
    struct ggml_init_params params = {
        data_bytes + (size_t)tensors * (ggml_tensor_overhead() + 64) +
            (size_t)graphs * ggml_graph_overhead() + ((size_t)1 << 20),
        NULL, false};
    struct ggml_context *ctx = ggml_init(params);
    if (ctx == NULL) {
        fprintf(stderr, "llama_peer: ggml_init failed (%zu bytes)\n", params.mem_size);
        exit(1);
    }
    return ctx;
}

/* ---------------------------------------------------------------------------------------- */
/* Agreement                                                                                */

typedef struct {
    double y_diff, y_scale, s_diff, s_scale;
} Agree;

/* y: mlxkern's [B, T, Hv, Dv] (head h) against ggml's (head at vpos(h)). */
static void agree_y(Agree *a, const float *ref, const float *got, size_t bt_n) {
    for (size_t bt = 0; bt < bt_n; bt++) {
        for (int h = 0; h < HV; h++) {
            const float *r = ref + (bt * HV + (size_t)h) * DV;
            const float *x = got + (bt * HV + (size_t)vpos(h)) * DV;
            for (int j = 0; j < DV; j++) {
                a->y_diff = fmax(a->y_diff, fabs((double)r[j] - (double)x[j]));
                a->y_scale = fmax(a->y_scale, fabs((double)r[j]));
            }
        }
    }
}

static void agree_state(Agree *a, const float *ref, const float *got, int batch) {
    for (int b = 0; b < batch; b++) {
        for (int h = 0; h < HV; h++) {
            const float *r = ref + ((size_t)b * HV + (size_t)h) * DV * DK;
            const float *x = got + ((size_t)b * HV + (size_t)vpos(h)) * DV * DK;
            for (size_t e = 0; e < (size_t)DV * DK; e++) {
                a->s_diff = fmax(a->s_diff, fabs((double)r[e] - (double)x[e]));
                a->s_scale = fmax(a->s_scale, fabs((double)r[e]));
            }
        }
    }
}

/* Records the check; returns whether it passed (a failure is printed loudly). */
static int finish_check(const char *id, const Agree *a) {
    if (n_checks == MAX_CHECKS) {
        fprintf(stderr, "llama_peer: too many checks\n");
        exit(1);
    }
    Check *c = &checks[n_checks++];
    snprintf(c->id, sizeof c->id, "%s", id);
    c->y_rel = a->y_scale > 0 ? a->y_diff / a->y_scale : a->y_diff;
    c->state_rel = a->s_scale > 0 ? a->s_diff / a->s_scale : a->s_diff;
    c->ok = c->y_rel <= Y_TOL && c->state_rel <= STATE_TOL && isfinite(c->y_rel) && isfinite(c->state_rel);
    printf("  check %-28s llama.cpp vs mlxkern: max |dy| %.2e, max |dstate| %.2e of the largest magnitude"
           " (limits %.1e, %.0e): %s\n", id, c->y_rel, c->state_rel, Y_TOL, STATE_TOL, c->ok ? "agree" : "DISAGREE");
    if (!c->ok) {
        fprintf(stderr, "llama_peer: FAILED: llama.cpp's GGML_OP_GATED_DELTA_NET and mlxkern disagree on %s"
                        " (max |dy| %.3e > %.1e or max |dstate| %.3e > %.0e): its timings would not compare"
                        " the same computation\n", id, c->y_rel, Y_TOL, c->state_rel, STATE_TOL);
        check_failed = 1;
    }
    return c->ok;
}

/* ---------------------------------------------------------------------------------------- */
/* Cases                                                                                    */

static char op_note[160]; /* "ggml <version> CPU GGML_OP_GATED_DELTA_NET (f32, N threads)" */

/* Returns 0 when the agreement check failed (nothing timed). */
static int bench_decode(int batch) {
    printf("decode B=%d\n", batch);
    HostIn tok[LAYERS];
    KernIn ktok[LAYERS];
    GgmlIn gtok[LAYERS];
    size_t per_set = (size_t)batch * (2 * HK * DK + HV * DV + 2 * HV);
    size_t out_elems = (size_t)batch * HV * DV + (size_t)batch * STATE_ELEMS;
    size_t data = sizeof(float) * (LAYERS * per_set + (1 + LAYERS) * (size_t)batch * STATE_ELEMS +
                                   2 * LAYERS * out_elems);
    struct ggml_context *ctx = new_context(data, LAYERS * 12 + 8, 2 * LAYERS + 4);
    for (int l = 0; l < LAYERS; l++) {
        tok[l] = gen_inputs(batch, 1, case_seed(KIND_DECODE, (uint64_t)batch, 1, (uint64_t)l));
        ktok[l] = kern_inputs(&tok[l]);
        gtok[l] = ggml_inputs(ctx, &tok[l], &ktok[l]);
    }

    /* hot: 30 steps of one layer, each op's state input a view of the previous op's output */
    struct ggml_tensor *hot[LAYERS], *cold[LAYERS];
    struct ggml_tensor *s0 = ggml_state(ctx, batch, 0);
    for (int i = 0; i < LAYERS; i++) {
        hot[i] = gdn(ctx, &gtok[i], i == 0 ? s0 : state_view(ctx, hot[i - 1], batch, 1));
    }
    struct ggml_cgraph *hot_graph = ggml_new_graph(ctx);
    ggml_build_forward_expand(hot_graph, hot[LAYERS - 1]);
    Rotation hot_calls = {{NULL}, 0};
    for (int i = 0; i < LAYERS; i++) {
        hot_calls.graphs[i] = graph_of_one(ctx, hot[i]);
    }
    /* cold: 30 layer states, one step each */
    struct ggml_cgraph *cold_graph = ggml_new_graph(ctx);
    Rotation cold_calls = {{NULL}, 0};
    for (int l = 0; l < LAYERS; l++) {
        cold[l] = gdn(ctx, &gtok[l], ggml_state(ctx, batch, 0));
        ggml_build_forward_expand(cold_graph, cold[l]);
        cold_calls.graphs[l] = graph_of_one(ctx, cold[l]);
    }

    /* Agreement: the 30 chained steps (every y, the final state), and each cold layer. */
    char id[80];
    int ok = 1;
    {
        compute(hot_graph);
        Agree a = {0, 0, 0, 0};
        mlxk_array *state = kern_state(batch);
        for (int i = 0; i < LAYERS; i++) {
            mlxk_array *y, *s;
            CHECK_OK(mlxk_gated_delta_update(ktok[i].q, ktok[i].k, ktok[i].v, ktok[i].a, ktok[i].b, a_log_arr,
                                             dt_bias_arr, state, NULL, &y, &s));
            CHECK_OK(mlxk_array_free(state));
            state = s;
            float *yv = mlxkt_read_floats(y, (size_t)batch * HV * DV);
            agree_y(&a, yv, hot[i]->data, (size_t)batch);
            free(yv);
            CHECK_OK(mlxk_array_free(y));
        }
        float *sv = mlxkt_read_floats(state, (size_t)batch * STATE_ELEMS);
        agree_state(&a, sv, out_state(hot[LAYERS - 1], batch, 1), batch);
        free(sv);
        CHECK_OK(mlxk_array_free(state));
        snprintf(id, sizeof id, "decode_hot_chained_B%d", batch);
        ok = finish_check(id, &a) && ok;
    }
    {
        compute(cold_graph);
        Agree a = {0, 0, 0, 0};
        mlxk_array *state = kern_state(batch);
        for (int l = 0; l < LAYERS; l++) {
            mlxk_array *y, *s;
            CHECK_OK(mlxk_gated_delta_update(ktok[l].q, ktok[l].k, ktok[l].v, ktok[l].a, ktok[l].b, a_log_arr,
                                             dt_bias_arr, state, NULL, &y, &s));
            float *yv = mlxkt_read_floats(y, (size_t)batch * HV * DV);
            float *sv = mlxkt_read_floats(s, (size_t)batch * STATE_ELEMS);
            agree_y(&a, yv, cold[l]->data, (size_t)batch);
            agree_state(&a, sv, out_state(cold[l], batch, 1), batch);
            free(yv);
            free(sv);
            CHECK_OK(mlxk_array_free(y));
            CHECK_OK(mlxk_array_free(s));
        }
        CHECK_OK(mlxk_array_free(state));
        snprintf(id, sizeof id, "decode_cold_B%d", batch);
        ok = finish_check(id, &a) && ok;
    }

    if (ok) {
        char note[320];
        double tokens = batch;
        snprintf(note, sizeof note, "%s; one layer, 30 ops chained through the state (a view of the"
                 " previous op's output), one graph, one compute", op_note);
        snprintf(id, sizeof id, "decode_hot_chained_B%d", batch);
        add_record(id, "decode_hot_chained", "llama_cpp", "layer-step", batch, 1, tokens, 0,
                   measure(compute_body, hot_graph, LAYERS), note);
        snprintf(note, sizeof note, "%s; one layer, the same 30 chained ops, one graph of one op per"
                 " compute", op_note);
        snprintf(id, sizeof id, "decode_hot_per_call_B%d", batch);
        add_record(id, "decode_hot_per_call", "llama_cpp", "layer-step", batch, 1, tokens, 0,
                   measure(rotation_body, &hot_calls, 1), note);
        snprintf(note, sizeof note, "%s; 30 distinct layer states, one step each, 30 ops in one graph,"
                 " one compute", op_note);
        snprintf(id, sizeof id, "decode_cold_chained_B%d", batch);
        add_record(id, "decode_cold_chained", "llama_cpp", "layer-step", batch, 1, tokens, 0,
                   measure(compute_body, cold_graph, LAYERS), note);
        snprintf(note, sizeof note, "%s; 30 distinct layer states, one graph of one op per compute"
                 " (successive calls walk the layers)", op_note);
        snprintf(id, sizeof id, "decode_cold_per_call_B%d", batch);
        add_record(id, "decode_cold_per_call", "llama_cpp", "layer-step", batch, 1, tokens, 0,
                   measure(rotation_body, &cold_calls, 1), note);
    }
    for (int l = 0; l < LAYERS; l++) {
        free_kern_inputs(&ktok[l]);
        free_inputs(&tok[l]);
    }
    ggml_free(ctx);
    return ok;
}

static int bench_prefill(int tokens) {
    HostIn in = gen_inputs(1, tokens, case_seed(KIND_PREFILL, 1, (uint64_t)tokens, 0));
    KernIn kin = kern_inputs(&in);
    size_t data = sizeof(float) * ((size_t)tokens * (2 * HK * DK + HV * DV + 2 * HV) + STATE_ELEMS +
                                   (size_t)tokens * HV * DV + STATE_ELEMS);
    struct ggml_context *ctx = new_context(data, 16, 2);
    GgmlIn g = ggml_inputs(ctx, &in, &kin);
    struct ggml_tensor *op = gdn(ctx, &g, ggml_state(ctx, 1, 1));
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, op);

    char id[80];
    snprintf(id, sizeof id, "prefill_T%d_B1", tokens);
    compute(gf);
    Agree a = {0, 0, 0, 0};
    mlxk_array *y, *s;
    CHECK_OK(mlxk_gated_delta_update(kin.q, kin.k, kin.v, kin.a, kin.b, a_log_arr, dt_bias_arr, NULL, NULL, &y, &s));
    float *yv = mlxkt_read_floats(y, (size_t)tokens * HV * DV);
    float *sv = mlxkt_read_floats(s, STATE_ELEMS);
    agree_y(&a, yv, op->data, (size_t)tokens);
    agree_state(&a, sv, out_state(op, 1, tokens), 1);
    free(yv);
    free(sv);
    CHECK_OK(mlxk_array_free(y));
    CHECK_OK(mlxk_array_free(s));
    int ok = finish_check(id, &a);
    if (ok) {
        /* As bench.c: the T = 4096 row gets the whole per-case time. */
        double budget = cfg.budget_s;
        if (tokens == 4096) {
            cfg.budget_s = cfg.max_case_s;
        }
        char note[320];
        snprintf(note, sizeof note, "%s; no initial state (a zero state tensor), one graph of one op,"
                 " one compute (the op is sequential over tokens)", op_note);
        add_record(id, "prefill", "llama_cpp", "call", 1, tokens, tokens, 0, measure(compute_body, gf, 1),
                   note);
        cfg.budget_s = budget;
    }
    free_kern_inputs(&kin);
    free_inputs(&in);
    ggml_free(ctx);
    return ok;
}

/* ---------------------------------------------------------------------------------------- */
/* JSON                                                                                     */

static const char *const GROUPS[] = {"decode1", "decode4", "decode16", "prefill"};
enum { N_GROUPS = sizeof GROUPS / sizeof GROUPS[0] };
static int selected[N_GROUPS];
static char loadavg_start[64], loadavg_end[64];

static void write_json(const char *path, double total_s) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "llama_peer: cannot write %s\n", path);
        exit(1);
    }
    fprintf(f, "{\n  \"tool\": \"mlxkern benches/llama_peer.c\",\n  \"impl\": \"llama_cpp\",\n");
    fprintf(f, "  \"ggml_version\": ");
    json_string(f, ggml_version());
    fprintf(f, ",\n  \"ggml_commit\": ");
    json_string(f, ggml_commit());
    fprintf(f, ",\n  \"source\": ");
    json_string(f, LLAMA_SOURCE);
    fprintf(f, ",\n  \"op\": \"GGML_OP_GATED_DELTA_NET (ggml_gated_delta_net, CPU backend, f32, K = 1)\",\n");
    fprintf(f, "  \"ggml_build\": {\"avx2\": %s, \"fma\": %s, \"avx512\": %s, \"avx512_bf16\": %s, "
               "\"avx512_vnni\": %s, \"neon\": %s},\n",
            ggml_cpu_has_avx2() ? "true" : "false", ggml_cpu_has_fma() ? "true" : "false",
            ggml_cpu_has_avx512() ? "true" : "false", ggml_cpu_has_avx512_bf16() ? "true" : "false",
            ggml_cpu_has_avx512_vnni() ? "true" : "false", ggml_cpu_has_neon() ? "true" : "false");
    fprintf(f, "  \"threads\": %d,\n", n_threads);
    fprintf(f, "  \"mlxkern_version\": ");
    json_string(f, mlxk_version());
    fprintf(f, ",\n  \"quick\": %s,\n", cfg.quick ? "true" : "false");
    fprintf(f, "  \"cpus_online\": %ld,\n  ", host.cpus_online);
    host_json(f, &host);
    fprintf(f, ",\n  \"loadavg_start\": %s,\n  \"loadavg_end\": %s,\n", loadavg_start, loadavg_end);
    fprintf(f, "  \"dims\": {\"Hk\": %d, \"Hv\": %d, \"Dk\": %d, \"Dv\": %d, \"layers\": %d, "
               "\"dtype\": \"float32 (bench.c's bfloat16 values widened)\", \"state_dtype\": \"float32\"},\n",
            HK, HV, DK, DV, LAYERS);
    fprintf(f, "  \"timing\": {\"budget_s\": %g, \"max_case_s\": %g, \"min_reps\": %d, \"max_reps\": %d, "
               "\"clock\": \"CLOCK_MONOTONIC\", \"stats\": \"seconds per unit over timed samples\"},\n",
            cfg.budget_s, cfg.max_case_s, cfg.min_reps, cfg.max_reps);
    fprintf(f, "  \"mapping\": \"q, k, v: bench.c's bf16 values as f32, q times sqrt(Dk) (the op scales y by"
               " 1/sqrt(Dv)); g: logf of mlxk_compute_g (the op takes log-space g); beta: MLX's bf16 sigmoid(b)"
               " as f32; value head h at position h / r + Hk * (h %% r), r = Hv / Hk (the op reads key head"
               " h %% Hk, mlxkern h / r)\",\n");
    fprintf(f, "  \"check_limits\": {\"y_max_rel\": %.6g, \"state_max_rel\": %.6g, \"relative_to\": "
               "\"mlxkern's largest magnitude of the same output\"},\n", Y_TOL, STATE_TOL);
    fprintf(f, "  \"check_failed\": %s,\n  \"checks\": {", check_failed ? "true" : "false");
    for (int i = 0; i < n_checks; i++) {
        fprintf(f, "%s\"%s\": {\"y_max_rel\": %.4g, \"state_max_rel\": %.4g, \"ok\": %s}", i ? ", " : "",
                checks[i].id, checks[i].y_rel, checks[i].state_rel, checks[i].ok ? "true" : "false");
    }
    fprintf(f, "},\n  \"groups\": [");
    for (int i = 0, first = 1; i < N_GROUPS; i++) {
        if (selected[i]) {
            fprintf(f, "%s\"%s\"", first ? "" : ", ", GROUPS[i]);
            first = 0;
        }
    }
    fprintf(f, "],\n  \"total_s\": %.3f,\n  \"records\": ", total_s);
    char extra[32];
    snprintf(extra, sizeof extra, ", \"threads\": %d", n_threads);
    write_records(f, extra);
    fprintf(f, "\n}\n");
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUTPUT.json [GROUP...]   groups: decode1 decode4 decode16 prefill"
                        " (default: all); MLXK_BENCH_QUICK=1, MLXK_BENCH_LLAMA_THREADS=N\n", argv[0]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        int g = -1;
        for (int j = 0; j < N_GROUPS; j++) {
            if (strcmp(argv[i], GROUPS[j]) == 0) {
                g = j;
            }
        }
        if (g < 0) {
            fprintf(stderr, "llama_peer: unknown group %s\n", argv[i]);
            return 2;
        }
        selected[g] = 1;
    }
    for (int i = 0; i < N_GROUPS; i++) {
        selected[i] = selected[i] || argc == 2;
    }
    config_from_env();
    double t_start = mlxkt_now_seconds();
    read_loadavg(loadavg_start, sizeof loadavg_start);
    host = host_info();
    n_threads = host.cpus_online > 8 ? 8 : (int)host.cpus_online;
    const char *env_threads = getenv("MLXK_BENCH_LLAMA_THREADS");
    if (env_threads != NULL && atoi(env_threads) > 0) {
        n_threads = atoi(env_threads);
    }
    if (n_threads < 1) {
        n_threads = 1;
    }
    snprintf(op_note, sizeof op_note, "ggml %s CPU GGML_OP_GATED_DELTA_NET (f32, %d threads)", ggml_version(),
             n_threads);
    char host_text[320];
    host_line(&host, host_text, sizeof host_text);
    printf("llama.cpp peer (%s): ggml %s, %s, CPU GGML_OP_GATED_DELTA_NET, %d threads; built with AVX2 %s,"
           " FMA %s, AVX-512 %s\n", cfg.quick ? "quick" : "full", ggml_version(), LLAMA_SOURCE, n_threads,
           ggml_cpu_has_avx2() ? "yes" : "no", ggml_cpu_has_fma() ? "yes" : "no",
           ggml_cpu_has_avx512() ? "yes" : "no");
    printf("host: %s; load average %s\n", host_text, loadavg_start);

    ggml_cpu_init();
    struct ggml_threadpool_params tpp = ggml_threadpool_params_default(n_threads);
    threadpool = ggml_threadpool_new(&tpp);
    if (threadpool == NULL) {
        fprintf(stderr, "llama_peer: ggml_threadpool_new failed\n");
        return 1;
    }
    make_shared_inputs();

    static const int batches[3] = {1, 4, 16};
    for (int i = 0; i < 3 && !check_failed; i++) {
        if (selected[i]) {
            bench_decode(batches[i]);
        }
    }
    if (selected[3] && !check_failed) {
        printf("prefill\n");
        static const int prefill_t[3] = {64, 512, 4096};
        for (int i = 0; i < 3 && !check_failed; i++) {
            bench_prefill(prefill_t[i]);
        }
    }

    ggml_threadpool_free(threadpool);
    free(work);
    CHECK_OK(mlxk_array_free(a_log_arr));
    CHECK_OK(mlxk_array_free(dt_bias_arr));
    free(state_pattern);
    double total = mlxkt_now_seconds() - t_start;
    read_loadavg(loadavg_end, sizeof loadavg_end);
    write_json(argv[1], total);
    printf("llama_peer.c: %d records, %d checks in %.1f s -> %s\n", n_records, n_checks, total, argv[1]);
    return check_failed ? 3 : 0;
}
