/*
 * mlxkern benchmark: drives the C ABI as a user would, at Qwen3.5-35B-A3B's Gated DeltaNet
 * dims (Hk 16, Hv 32, Dk = Dv = 128, bfloat16 activations, float32 state; 30 GDN layers).
 *
 * Cases (each: warm-up, then repeated timed samples; median, min/max and p10/p90):
 *   decode (T = 1) at B = 1, 4, 16
 *     hot   one layer's state, 30 steps chained through the state handle
 *           - chained: 30 calls built, then one eval (old state freed before eval)
 *           - per call: one eval per step (the 30 token input sets in turn)
 *     cold  30 distinct layer states (one per GDN layer), one step each
 *           - chained: 30 layers built (layer l+1's v is layer l's y, as in a model), then
 *             one eval: an engine's token
 *           - per call: one eval per layer, successive calls walking the 30 layers
 *   prefill at T = 64, 512, 4096 (B = 1, no initial state) and a padded batch (B = 4, mixed
 *   lengths, left-padded with a mask)
 *   prefix replay (mlxk_gated_delta_state), T = 8 window, mixed accepted lengths
 *   head split (mlxk_silu_rms_heads) and gated norm (mlxk_gated_rms_norm) at S = 1 and 512
 *   memory baselines: plain copies of the same bytes (and an in-place read + write of the
 *   cold states), measured in the same run
 *
 * Every output handle of a call is evaluated (sibling outputs are no-op evals) and freed.
 * Usage: bench OUTPUT.json [GROUP...] with groups decode1 decode4 decode16 prefill replay small
 * (default: all); scripts/bench/run.sh runs one group at a time, alternating with peer.py, so that
 * both sides of each ratio are measured close together. Writes every figure to OUTPUT.json.
 * Environment: MLXK_BENCH_QUICK=1 for a short run (smaller time budget per case).
 *
 * Uses only include/mlxkern.h, the helpers the C programs share (examples/common/mlxk_test_util.h),
 * the timing and host description the C bench drivers share (benches/harness.h) and libc,
 * pthreads. Built and run by scripts/bench/run.sh.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "inputs.h"
#include "mlxkern.h"
#include "mlxk_test_util.h"
#include "harness.h" /* measure(), host description, JSON */

enum {
    HK = 16,
    HV = 32,
    DK = 128,
    DV = 128,
    CONV_DIM = 2 * HK * DK + HV * DV, /* 8192 */
    LAYERS = 30                       /* Qwen3.5-35B-A3B's Gated DeltaNet layers */
};

#define STATE_ELEMS ((size_t)HV * DV * DK) /* one sequence, one layer: 2 MiB of float32 */
#define NORM_EPS 1e-6f
#define HEAD_SPLIT_EPS (1e-6f / (float)DK) /* mlx-lm 0.32.2 normalize_qk's rms eps */

/* Keeps copies and stores from being optimized away. */
static volatile uint32_t sink;


/* ---------------------------------------------------------------------------------------- */
/* Inputs                                                                                   */

static mlxk_array *a_log_arr, *dt_bias_arr; /* shared by every layer */
/* The same a_log with every odd value head decaying strongly (A_log = 4.5: g = exp(-90 *
 * softplus(...)) reaches the subnormal range and zero), as some heads of real checkpoints do. */
static mlxk_array *a_log_decay_arr;
static float *state_pattern;                /* one sequence's state, reused for every row/layer */

typedef struct {
    int batch, tokens;
    mlxk_array *q, *k, *v, *a, *b;
} RecIn;

static RecIn make_rec_inputs(int batch, int tokens, uint64_t cs) {
    RecIn in = {batch, tokens, NULL, NULL, NULL, NULL, NULL};
    size_t n_qk = (size_t)batch * tokens * HK * DK;
    size_t n_v = (size_t)batch * tokens * HV * DV;
    size_t n_ab = (size_t)batch * tokens * HV;
    uint16_t *buf = mlxkt_xmalloc(sizeof(uint16_t) * n_v);
    int32_t qk_shape[4] = {batch, tokens, HK, DK};
    int32_t v_shape[4] = {batch, tokens, HV, DV};
    int32_t ab_shape[3] = {batch, tokens, HV};

    fill_unit_rows_bf16(buf, n_qk / DK, DK, tensor_seed(TAG_Q, cs), 1.0 / sqrt((double)DK));
    in.q = mlxkt_new_array(buf, qk_shape, 4, MLXK_DTYPE_BFLOAT16);
    fill_unit_rows_bf16(buf, n_qk / DK, DK, tensor_seed(TAG_K, cs), 1.0);
    in.k = mlxkt_new_array(buf, qk_shape, 4, MLXK_DTYPE_BFLOAT16);
    fill_normal_bf16(buf, n_v, tensor_seed(TAG_V, cs), 1.0);
    in.v = mlxkt_new_array(buf, v_shape, 4, MLXK_DTYPE_BFLOAT16);
    fill_normal_bf16(buf, n_ab, tensor_seed(TAG_A, cs), 1.0);
    in.a = mlxkt_new_array(buf, ab_shape, 3, MLXK_DTYPE_BFLOAT16);
    fill_normal_bf16(buf, n_ab, tensor_seed(TAG_B, cs), 1.0);
    in.b = mlxkt_new_array(buf, ab_shape, 3, MLXK_DTYPE_BFLOAT16);
    free(buf);
    return in;
}

static void free_rec_inputs(RecIn *in) {
    CHECK_OK(mlxk_array_free(in->q));
    CHECK_OK(mlxk_array_free(in->k));
    CHECK_OK(mlxk_array_free(in->v));
    CHECK_OK(mlxk_array_free(in->a));
    CHECK_OK(mlxk_array_free(in->b));
}

static void make_shared_inputs(void) {
    uint64_t cs = case_seed(KIND_SHARED, 0, 0, 0);
    float a_log[HV];
    uint16_t dt_bias[HV];
    for (int h = 0; h < HV; h++) {
        a_log[h] = (float)log(1.0 + 15.0 * uniform_at(tensor_seed(TAG_A_LOG, cs), (uint64_t)h));
    }
    fill_normal_bf16(dt_bias, HV, tensor_seed(TAG_DT_BIAS, cs), 0.5);
    int32_t shape[1] = {HV};
    a_log_arr = mlxkt_new_array(a_log, shape, 1, MLXK_DTYPE_FLOAT32);
    for (int h = 1; h < HV; h += 2) a_log[h] = 4.5f;
    a_log_decay_arr = mlxkt_new_array(a_log, shape, 1, MLXK_DTYPE_FLOAT32);
    dt_bias_arr = mlxkt_new_array(dt_bias, shape, 1, MLXK_DTYPE_BFLOAT16);

    state_pattern = mlxkt_xmalloc(sizeof(float) * STATE_ELEMS);
    uint64_t seed = tensor_seed(TAG_STATE, cs);
    for (size_t i = 0; i < STATE_ELEMS; i++) {
        state_pattern[i] = (float)(normal_at(seed, i) * 0.05);
    }
}

/* A [batch, Hv, Dv, Dk] float32 state: the shared pattern in every row. */
static mlxk_array *make_state(int batch) {
    float *buf = mlxkt_xmalloc(sizeof(float) * STATE_ELEMS * (size_t)batch);
    for (int b = 0; b < batch; b++) {
        memcpy(buf + (size_t)b * STATE_ELEMS, state_pattern, sizeof(float) * STATE_ELEMS);
    }
    int32_t shape[4] = {batch, HV, DV, DK};
    mlxk_array *s = mlxkt_new_array(buf, shape, 4, MLXK_DTYPE_FLOAT32);
    free(buf);
    return s;
}

/* A [batch, T] bool mask, left-padded: row b's last lengths[b] tokens are real. */
static mlxk_array *make_left_padded_mask(int batch, int tokens, const int32_t *lengths) {
    uint8_t *m = mlxkt_xmalloc((size_t)batch * tokens);
    for (int b = 0; b < batch; b++) {
        for (int t = 0; t < tokens; t++) {
            m[(size_t)b * tokens + t] = (uint8_t)(t >= tokens - lengths[b]);
        }
    }
    int32_t shape[2] = {batch, tokens};
    mlxk_array *mask = mlxkt_new_array(m, shape, 2, MLXK_DTYPE_BOOL);
    free(m);
    return mask;
}

/* ---------------------------------------------------------------------------------------- */
/* Decode                                                                                   */

typedef struct {
    int batch;
    RecIn tok[LAYERS];         /* token inputs: step i (hot) or layer i (cold) */
    mlxk_array *state;         /* hot: the one layer's state */
    mlxk_array *states[LAYERS]; /* cold: one state per layer */
    int next;                   /* per-call modes: the next token set / layer */
} DecodeCtx;

static void step(const RecIn *t, mlxk_array *v, mlxk_array *state, mlxk_array **y, mlxk_array **s) {
    CHECK_OK(mlxk_gated_delta_update(t->q, t->k, v, t->a, t->b, a_log_arr, dt_bias_arr, state, NULL, y,
                                     s));
}

/* 30 steps of one layer chained through the state handle, then one eval. */
static void decode_hot_chained(void *p) {
    DecodeCtx *c = p;
    mlxk_array *ys[LAYERS];
    for (int i = 0; i < LAYERS; i++) {
        mlxk_array *s;
        step(&c->tok[i], c->tok[i].v, c->state, &ys[i], &s);
        CHECK_OK(mlxk_array_free(c->state)); /* before eval: the kernel may update in place */
        c->state = s;
    }
    CHECK_OK(mlxk_array_eval(c->state));
    for (int i = 0; i < LAYERS; i++) {
        CHECK_OK(mlxk_array_eval(ys[i]));
        CHECK_OK(mlxk_array_free(ys[i]));
    }
}

/* One step of one layer, one eval (the token inputs rotate over the 30 sets). */
static void decode_hot_per_call(void *p) {
    DecodeCtx *c = p;
    const RecIn *t = &c->tok[c->next];
    c->next = (c->next + 1) % LAYERS;
    mlxk_array *y, *s;
    step(t, t->v, c->state, &y, &s);
    CHECK_OK(mlxk_array_free(c->state));
    c->state = s;
    CHECK_OK(mlxk_array_eval(s));
    CHECK_OK(mlxk_array_eval(y));
    CHECK_OK(mlxk_array_free(y));
}

/* One token through 30 layers, each with its own state; layer l+1's v is layer l's y (so the
 * graph is one chain, as in a model), built in full, then one eval. */
static void decode_cold_chained(void *p) {
    DecodeCtx *c = p;
    mlxk_array *ys[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        mlxk_array *s;
        mlxk_array *v = l == 0 ? c->tok[0].v : ys[l - 1];
        step(&c->tok[l], v, c->states[l], &ys[l], &s);
        CHECK_OK(mlxk_array_free(c->states[l]));
        c->states[l] = s;
    }
    CHECK_OK(mlxk_array_eval(ys[LAYERS - 1]));
    for (int l = 0; l < LAYERS; l++) {
        CHECK_OK(mlxk_array_eval(c->states[l]));
        CHECK_OK(mlxk_array_eval(ys[l]));
    }
    for (int l = 0; l < LAYERS; l++) {
        CHECK_OK(mlxk_array_free(ys[l]));
    }
}

/* One layer's step, one eval; successive calls walk the 30 layers (each with its own state). */
static void decode_cold_per_call(void *p) {
    DecodeCtx *c = p;
    int l = c->next;
    c->next = (c->next + 1) % LAYERS;
    mlxk_array *y, *s;
    step(&c->tok[l], c->tok[l].v, c->states[l], &y, &s);
    CHECK_OK(mlxk_array_free(c->states[l]));
    c->states[l] = s;
    CHECK_OK(mlxk_array_eval(s));
    CHECK_OK(mlxk_array_eval(y));
    CHECK_OK(mlxk_array_free(y));
}

/* ---------------------------------------------------------------------------------------- */
/* Memory baselines                                                                         */

typedef struct {
    int n_bufs;
    size_t bytes_each;
    unsigned char **src, **dst, **dst_base;
} CopyCtx;

/* Page-aligned source, destination 64 bytes past a page boundary: glibc's memcpy on this
 * machine (AMD, rep movsb) runs small copies ~20x slower between two malloc'd (16-byte
 * aligned) buffers, which would understate the floor. */
enum { COPY_DST_OFFSET = 64 };

static unsigned char *page_alloc(size_t bytes) {
    size_t rounded = (bytes + 4095) / 4096 * 4096;
    unsigned char *p = aligned_alloc(4096, rounded);
    if (p == NULL) {
        fprintf(stderr, "bench: out of host memory (%zu bytes)\n", rounded);
        exit(1);
    }
    return p;
}

typedef struct {
    CopyCtx *c;
    int half; /* 0: first half of every buffer, 1: second half */
    int in_place;
} CopyJob;

static void copy_part(CopyCtx *c, int half, int halves, int in_place) {
    size_t part = c->bytes_each / (size_t)halves;
    part &= ~(size_t)63;
    for (int i = 0; i < c->n_bufs; i++) {
        size_t off = part * (size_t)half;
        size_t len = half == halves - 1 ? c->bytes_each - off : part;
        if (in_place) {
            /* read + write the same bytes (what an in-place state update does): flip signs */
            uint32_t *w = (uint32_t *)(c->src[i] + off);
            size_t n = len / sizeof(uint32_t);
            for (size_t j = 0; j < n; j++) {
                w[j] ^= 0x80000000u;
            }
        } else {
            memcpy(c->dst[i] + off, c->src[i] + off, len);
        }
    }
    sink += c->dst[c->n_bufs - 1][c->bytes_each - 1];
}

static void *copy_thread(void *p) {
    CopyJob *j = p;
    copy_part(j->c, j->half, 2, j->in_place);
    return NULL;
}

static void copy_1t(void *p) { copy_part(p, 0, 1, 0); }

static void copy_2t_common(CopyCtx *c, int in_place) {
    pthread_t th;
    CopyJob job = {c, 1, in_place};
    if (pthread_create(&th, NULL, copy_thread, &job) != 0) {
        fprintf(stderr, "bench: pthread_create failed\n");
        exit(1);
    }
    copy_part(c, 0, 2, in_place);
    pthread_join(th, NULL);
}

static void copy_2t(void *p) { copy_2t_common(p, 0); }
static void rmw_2t(void *p) { copy_2t_common(p, 1); }

static CopyCtx copy_ctx_new(int n_bufs, size_t bytes_each) {
    size_t list_bytes = sizeof(void *) * (size_t)n_bufs;
    CopyCtx c = {n_bufs, bytes_each, mlxkt_xmalloc(list_bytes), mlxkt_xmalloc(list_bytes),
                 mlxkt_xmalloc(list_bytes)};
    for (int i = 0; i < n_bufs; i++) {
        c.src[i] = page_alloc(bytes_each);
        c.dst_base[i] = page_alloc(bytes_each + COPY_DST_OFFSET);
        c.dst[i] = c.dst_base[i] + COPY_DST_OFFSET;
        /* fault every page in; src holds state-like floats */
        size_t pattern_bytes = sizeof(float) * STATE_ELEMS;
        for (size_t off = 0; off < bytes_each; off += pattern_bytes) {
            size_t len = bytes_each - off < pattern_bytes ? bytes_each - off : pattern_bytes;
            memcpy(c.src[i] + off, state_pattern, len);
        }
        memset(c.dst[i], 0, bytes_each);
    }
    return c;
}

static void copy_ctx_free(CopyCtx *c) {
    for (int i = 0; i < c->n_bufs; i++) {
        free(c->src[i]);
        free(c->dst_base[i]);
    }
    free(c->src);
    free(c->dst);
    free(c->dst_base);
}

/* Copy baselines for `total_bytes` moved (read + written) as n_bufs buffers; ids get the given
 * prefix. in_place adds the in-place read + write variant. */
static void copy_baselines(const char *prefix, const char *op, int batch, int tokens_t,
                           int n_bufs, double total_bytes, int in_place, const char *note) {
    size_t each = (size_t)(total_bytes / 2.0 / n_bufs);
    CopyCtx c = copy_ctx_new(n_bufs, each);
    char id[80];
    snprintf(id, sizeof id, "%s", prefix);
    add_record(id, op, "memcpy", "call", batch, tokens_t, 0, total_bytes, measure(copy_1t, &c, 1), note);
    if (total_bytes >= 8.0 * 1024 * 1024) { /* below that, starting a thread costs more than the copy */
        add_record(id, op, "memcpy_2t", "call", batch, tokens_t, 0, total_bytes, measure(copy_2t, &c, 1), note);
    }
    if (in_place) {
        /* in place: every byte read and written once, so the traffic equals the copy's */
        add_record(id, op, "rmw_2t", "call", batch, tokens_t, 0, total_bytes, measure(rmw_2t, &c, 1),
                   "in-place read + write of the same bytes (sign flip), 2 threads");
    }
    copy_ctx_free(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* Prefill, replay                                                                          */

typedef struct {
    RecIn in;
    mlxk_array *mask; /* or NULL */
    int chunk;        /* < 0: the exact update; else mlxk_gated_delta_update_chunked's chunk_size */
    mlxk_array *a_log; /* NULL: a_log_arr */
} PrefillCtx;

static void prefill_run(const PrefillCtx *c, mlxk_array **y, mlxk_array **s) {
    mlxk_array *a_log = c->a_log ? c->a_log : a_log_arr;
    if (c->chunk < 0) {
        CHECK_OK(mlxk_gated_delta_update(c->in.q, c->in.k, c->in.v, c->in.a, c->in.b, a_log,
                                         dt_bias_arr, NULL, c->mask, y, s));
    } else {
        CHECK_OK(mlxk_gated_delta_update_chunked(c->in.q, c->in.k, c->in.v, c->in.a, c->in.b, a_log,
                                                 dt_bias_arr, NULL, c->mask, c->chunk, y, s));
    }
}

static void prefill_call(void *p) {
    PrefillCtx *c = p;
    mlxk_array *y, *s;
    prefill_run(c, &y, &s);
    CHECK_OK(mlxk_array_eval(y));
    CHECK_OK(mlxk_array_eval(s));
    CHECK_OK(mlxk_array_free(y));
    CHECK_OK(mlxk_array_free(s));
}

typedef struct {
    RecIn in;
    mlxk_array *state; /* pre-verify state, kept */
    int32_t lengths[16];
} ReplayCtx;

static void replay_call(void *p) {
    ReplayCtx *c = p;
    mlxk_array *s;
    CHECK_OK(mlxk_gated_delta_state(c->in.k, c->in.v, c->in.a, c->in.b, a_log_arr, dt_bias_arr,
                                    c->state, c->lengths, (size_t)c->in.batch, &s));
    CHECK_OK(mlxk_array_eval(s));
    CHECK_OK(mlxk_array_free(s));
}

/* ---------------------------------------------------------------------------------------- */
/* Head split, gated norm                                                                   */

typedef struct {
    mlxk_array *x, *q_scale, *k_scale;
} HeadSplitCtx;

static void head_split_call(void *p) {
    HeadSplitCtx *c = p;
    mlxk_array *q, *k, *v;
    CHECK_OK(mlxk_silu_rms_heads(c->x, c->q_scale, c->k_scale, HK, HV, DV, HEAD_SPLIT_EPS, &q, &k, &v));
    CHECK_OK(mlxk_array_eval(q));
    CHECK_OK(mlxk_array_eval(k));
    CHECK_OK(mlxk_array_eval(v));
    CHECK_OK(mlxk_array_free(q));
    CHECK_OK(mlxk_array_free(k));
    CHECK_OK(mlxk_array_free(v));
}

typedef struct {
    mlxk_array *x, *gate, *weight;
} GatedNormCtx;

static void gated_norm_call(void *p) {
    GatedNormCtx *c = p;
    mlxk_array *out;
    CHECK_OK(mlxk_gated_rms_norm(c->x, c->gate, c->weight, NORM_EPS, &out));
    CHECK_OK(mlxk_array_eval(out));
    CHECK_OK(mlxk_array_free(out));
}

/* ---------------------------------------------------------------------------------------- */
/* Eval overhead probes                                                                     */

static mlxk_array *probe_small;

static void eval_noop(void *p) {
    (void)p;
    CHECK_OK(mlxk_array_eval(probe_small));
}

static void eval_roundtrip(void *p) {
    (void)p;
    mlxk_array *o;
    CHECK_OK(mlxk_array_astype(probe_small, MLXK_DTYPE_BFLOAT16, &o));
    CHECK_OK(mlxk_array_eval(o));
    CHECK_OK(mlxk_array_free(o));
}

/* ---------------------------------------------------------------------------------------- */
/* Output checks (same inputs on both sides: peer.py computes the same sums)                */

static double checks_y_abs_sum, checks_state_abs_sum;
static int checks_done;

static void prefill_checksums(const RecIn *in) {
    mlxk_array *y, *s;
    CHECK_OK(mlxk_gated_delta_update(in->q, in->k, in->v, in->a, in->b, a_log_arr, dt_bias_arr, NULL,
                                     NULL, &y, &s));
    size_t ny = (size_t)in->batch * in->tokens * HV * DV;
    size_t ns = (size_t)in->batch * STATE_ELEMS;
    uint16_t *yb = mlxkt_xmalloc(ny * sizeof(uint16_t));
    float *sb = mlxkt_xmalloc(ns * sizeof(float));
    CHECK_OK(mlxk_array_read(y, yb, ny * sizeof(uint16_t)));
    CHECK_OK(mlxk_array_read(s, sb, ns * sizeof(float)));
    checks_done = 1;
    checks_y_abs_sum = 0.0;
    for (size_t i = 0; i < ny; i++) {
        checks_y_abs_sum += fabs((double)mlxkt_bf16_to_float(yb[i]));
    }
    checks_state_abs_sum = 0.0;
    for (size_t i = 0; i < ns; i++) {
        checks_state_abs_sum += fabs((double)sb[i]);
    }
    free(yb);
    free(sb);
    CHECK_OK(mlxk_array_free(y));
    CHECK_OK(mlxk_array_free(s));
}

/* The chunked form against the exact update on the T = 4096 prefill's inputs: the largest
 * difference of y and of the state, relative to the exact result's largest magnitude. */
static double chunked_dy, chunked_ds;
static int chunked_done;

static void max_diff(const float *a, const float *b, size_t n, double *rel) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = 0; i < n; i++) {
        diff = fmax(diff, fabs((double)a[i] - (double)b[i]));
        scale = fmax(scale, fabs((double)b[i]));
    }
    *rel = scale > 0.0 ? diff / scale : diff;
}

static void chunked_differences(const PrefillCtx *exact) {
    PrefillCtx c = *exact;
    mlxk_array *y[2], *s[2];
    float *yv[2], *sv[2];
    size_t ny = (size_t)c.in.batch * c.in.tokens * HV * DV, ns = (size_t)c.in.batch * STATE_ELEMS;
    for (int i = 0; i < 2; i++) {
        c.chunk = i == 0 ? -1 : 0;
        prefill_run(&c, &y[i], &s[i]);
        yv[i] = mlxkt_read_floats(y[i], ny);
        sv[i] = mlxkt_read_floats(s[i], ns);
        CHECK_OK(mlxk_array_free(y[i]));
        CHECK_OK(mlxk_array_free(s[i]));
    }
    max_diff(yv[1], yv[0], ny, &chunked_dy);
    max_diff(sv[1], sv[0], ns, &chunked_ds);
    chunked_done = 1;
    for (int i = 0; i < 2; i++) {
        free(yv[i]);
        free(sv[i]);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* JSON                                                                                     */

static char loadavg_start[64], loadavg_end[64];
static HostInfo host;

static const char *const GROUPS[] = {"decode1", "decode4", "decode16", "prefill", "replay", "small"};
enum { N_GROUPS = sizeof GROUPS / sizeof GROUPS[0] };
static int selected[N_GROUPS];


static void write_json(const char *path, double total_s, double noop_us, double roundtrip_us) {
    FILE *f = fopen(path, "w");
    if (f == NULL) {
        fprintf(stderr, "bench: cannot write %s\n", path);
        exit(1);
    }
    fprintf(f, "{\n  \"tool\": \"mlxkern benches/bench.c\",\n");
    fprintf(f, "  \"library_version\": ");
    json_string(f, mlxk_version());
    fprintf(f, ",\n  \"abi_version\": %u,\n", mlxk_abi_version());
    fprintf(f, "  \"quick\": %s,\n", cfg.quick ? "true" : "false");
    fprintf(f, "  \"cpus_online\": %ld,\n  ", host.cpus_online);
    host_json(f, &host);
    fprintf(f, ",\n");
    fprintf(f, "  \"loadavg_start\": %s,\n  \"loadavg_end\": %s,\n", loadavg_start, loadavg_end);
    fprintf(f, "  \"dims\": {\"Hk\": %d, \"Hv\": %d, \"Dk\": %d, \"Dv\": %d, \"layers\": %d, "
               "\"conv_dim\": %d, \"dtype\": \"bfloat16\", \"state_dtype\": \"float32\"},\n",
            HK, HV, DK, DV, LAYERS, CONV_DIM);
    fprintf(f, "  \"timing\": {\"budget_s\": %g, \"max_case_s\": %g, \"min_reps\": %d, \"max_reps\": %d, "
               "\"clock\": \"CLOCK_MONOTONIC\", \"stats\": \"seconds per unit over timed samples\"},\n",
            cfg.budget_s, cfg.max_case_s, cfg.min_reps, cfg.max_reps);
    fprintf(f, "  \"eval_noop_us\": %.4f,\n  \"eval_roundtrip_us\": %.4f,\n", noop_us, roundtrip_us);
    fprintf(f, "  \"checks\": {");
    if (checks_done) {
        fprintf(f, "\"prefill_T64_B1\": {\"y_abs_sum\": %.9g, \"state_abs_sum\": %.9g}",
                checks_y_abs_sum, checks_state_abs_sum);
    }
    if (chunked_done) {
        fprintf(f, "%s\"chunked_vs_exact_T4096_B1\": {\"y_max_rel\": %.4g, \"state_max_rel\": %.4g}",
                checks_done ? ", " : "", chunked_dy, chunked_ds);
    }
    fprintf(f, "},\n");
    fprintf(f, "  \"groups\": [");
    for (int i = 0, first = 1; i < N_GROUPS; i++) {
        if (selected[i]) {
            fprintf(f, "%s\"%s\"", first ? "" : ", ", GROUPS[i]);
            first = 0;
        }
    }
    fprintf(f, "],\n");
    fprintf(f, "  \"total_s\": %.3f,\n  \"records\": ", total_s);
    write_records(f, "");
    fprintf(f, "\n}\n");
    fclose(f);
}

/* ---------------------------------------------------------------------------------------- */

static void bench_decode(int batch) {
    printf("decode B=%d\n", batch);
    DecodeCtx *c = mlxkt_xmalloc(sizeof *c);
    memset(c, 0, sizeof *c);
    c->batch = batch;
    for (int l = 0; l < LAYERS; l++) {
        c->tok[l] = make_rec_inputs(batch, 1, case_seed(KIND_DECODE, (uint64_t)batch, 1, (uint64_t)l));
    }
    char id[80];
    double tokens = batch; /* one token per sequence per layer-step */

    c->state = make_state(batch);
    snprintf(id, sizeof id, "decode_hot_chained_B%d", batch);
    add_record(id, "decode_hot_chained", "mlxkern", "layer-step", batch, 1, tokens,
               0, measure(decode_hot_chained, c, LAYERS),
               "one layer's state, 30 steps chained through the state handle, one eval");
    snprintf(id, sizeof id, "decode_hot_per_call_B%d", batch);
    add_record(id, "decode_hot_per_call", "mlxkern", "layer-step", batch, 1, tokens,
               0, measure(decode_hot_per_call, c, 1), "one layer's state, one eval per step");
    CHECK_OK(mlxk_array_free(c->state));

    for (int l = 0; l < LAYERS; l++) {
        c->states[l] = make_state(batch);
    }
    snprintf(id, sizeof id, "decode_cold_chained_B%d", batch);
    add_record(id, "decode_cold_chained", "mlxkern", "layer-step", batch, 1, tokens,
               0, measure(decode_cold_chained, c, LAYERS),
               "30 distinct layer states, one step each, layer l+1's v = layer l's y, one eval");
    snprintf(id, sizeof id, "decode_cold_per_call_B%d", batch);
    add_record(id, "decode_cold_per_call", "mlxkern", "layer-step", batch, 1, tokens,
               0, measure(decode_cold_per_call, c, 1),
               "30 distinct layer states, one eval per layer (successive calls walk the layers)");
    for (int l = 0; l < LAYERS; l++) {
        CHECK_OK(mlxk_array_free(c->states[l]));
        free_rec_inputs(&c->tok[l]);
    }
    free(c);

    /* Streaming the 30 states once: read + write of 30 x batch x 2 MiB, per layer-step. */
    double state_bytes = (double)LAYERS * batch * STATE_ELEMS * sizeof(float);
    snprintf(id, sizeof id, "stream_states_B%d", batch);
    size_t each = (size_t)batch * STATE_ELEMS * sizeof(float);
    CopyCtx cc = copy_ctx_new(LAYERS, each);
    const char *note = "the 30 layer states streamed once (read + write), per layer (time / 30)";
    add_record(id, "stream_states", "memcpy", "layer-step", batch, 1, 0, 2.0 * state_bytes / LAYERS,
               measure(copy_1t, &cc, LAYERS), note);
    add_record(id, "stream_states", "memcpy_2t", "layer-step", batch, 1, 0, 2.0 * state_bytes / LAYERS,
               measure(copy_2t, &cc, LAYERS), note);
    add_record(id, "stream_states", "rmw_2t", "layer-step", batch, 1, 0, 2.0 * state_bytes / LAYERS,
               measure(rmw_2t, &cc, LAYERS), "the 30 layer states read and written in place, 2 threads, per layer");
    copy_ctx_free(&cc);
}

static void bench_prefill(int tokens) {
    PrefillCtx c = {make_rec_inputs(1, tokens, case_seed(KIND_PREFILL, 1, (uint64_t)tokens, 0)), NULL, -1, NULL};
    char id[80];
    snprintf(id, sizeof id, "prefill_T%d_B1", tokens);
    if (tokens == 64) {
        prefill_checksums(&c.in);
    }
    /* The T = 4096 rows carry the target: give them the whole per-case time (more samples, a
     * steadier median on a shared machine). */
    double budget = cfg.budget_s;
    if (tokens == 4096) {
        cfg.budget_s = cfg.max_case_s;
    }
    add_record(id, "prefill", "mlxkern", "call", 1, tokens, tokens, 0, measure(prefill_call, &c, 1),
               "no initial state, one call, one eval");
    if (tokens == 4096) {
        chunked_differences(&c);
    }
    c.chunk = 0;
    snprintf(id, sizeof id, "prefill_chunked_T%d_B1", tokens);
    add_record(id, "prefill_chunked", "mlxkern", "call", 1, tokens, tokens, 0, measure(prefill_call, &c, 1),
               "mlxk_gated_delta_update_chunked (default chunk 32), no initial state, one call, one eval");
    cfg.budget_s = budget;
    if (tokens == 4096) {
        /* Half the heads decaying into the subnormal range: the speed must not depend on it. */
        c.a_log = a_log_decay_arr;
        c.chunk = -1;
        add_record("prefill_decay_T4096_B1", "prefill_decay", "mlxkern", "call", 1, tokens, tokens, 0,
                   measure(prefill_call, &c, 1), "as prefill_T4096_B1, every odd value head with A_log = 4.5");
        c.chunk = 0;
        add_record("prefill_decay_chunked_T4096_B1", "prefill_decay_chunked", "mlxkern", "call", 1, tokens,
                   tokens, 0, measure(prefill_call, &c, 1),
                   "as prefill_chunked_T4096_B1, every odd value head with A_log = 4.5");
    }
    free_rec_inputs(&c.in);
}

static void bench_padded(void) {
    enum { B = 4, T = 128 };
    int32_t lengths[B] = {128, 96, 64, 32};
    PrefillCtx c = {make_rec_inputs(B, T, case_seed(KIND_PADDED, B, T, 0)),
                    make_left_padded_mask(B, T, lengths), -1, NULL};
    double real = 0;
    for (int b = 0; b < B; b++) {
        real += lengths[b];
    }
    add_record("prefill_padded_T128_B4", "prefill_padded", "mlxkern", "call", B, T, real, 0,
               measure(prefill_call, &c, 1),
               "B=4, T=128, left-padded lengths 128/96/64/32 with a mask; tokens = real tokens (320)");
    c.chunk = 0;
    add_record("prefill_padded_chunked_T128_B4", "prefill_padded_chunked", "mlxkern", "call", B, T, real, 0,
               measure(prefill_call, &c, 1), "as prefill_padded_T128_B4, mlxk_gated_delta_update_chunked");
    free_rec_inputs(&c.in);
    CHECK_OK(mlxk_array_free(c.mask));
}

static void bench_replay(int batch, const int32_t *lengths) {
    enum { T = 8 };
    ReplayCtx c;
    memset(&c, 0, sizeof c);
    c.in = make_rec_inputs(batch, T, case_seed(KIND_REPLAY, (uint64_t)batch, T, 0));
    c.state = make_state(batch);
    double real = 0;
    char lens[64] = "";
    for (int b = 0; b < batch; b++) {
        c.lengths[b] = lengths[b];
        real += lengths[b];
        char part[16];
        snprintf(part, sizeof part, "%s%d", b ? "/" : "", lengths[b]);
        strncat(lens, part, sizeof lens - strlen(lens) - 1);
    }
    char id[80], note[200];
    snprintf(id, sizeof id, "replay_T8_B%d", batch);
    snprintf(note, sizeof note, "prefix-state replay over a T=8 window, accepted lengths %s; tokens = accepted", lens);
    add_record(id, "replay", "mlxkern", "call", batch, T, real, 0, measure(replay_call, &c, 1), note);
    free_rec_inputs(&c.in);
    CHECK_OK(mlxk_array_free(c.state));
}

static void bench_head_split(int rows) {
    HeadSplitCtx c;
    size_t n = (size_t)rows * CONV_DIM;
    uint16_t *buf = mlxkt_xmalloc(n * sizeof(uint16_t));
    fill_normal_bf16(buf, n, tensor_seed(TAG_CONV_OUT, case_seed(KIND_HEAD_SPLIT, 1, (uint64_t)rows, 0)), 1.0);
    int32_t shape[3] = {1, rows, CONV_DIM};
    c.x = mlxkt_new_array(buf, shape, 3, MLXK_DTYPE_BFLOAT16);
    free(buf);
    uint16_t qs[DK], ks[DK];
    for (int i = 0; i < DK; i++) {
        qs[i] = mlxkt_bf16_from_float((float)(1.0 / DK));
        ks[i] = mlxkt_bf16_from_float((float)(1.0 / sqrt((double)DK)));
    }
    int32_t sshape[1] = {DK};
    c.q_scale = mlxkt_new_array(qs, sshape, 1, MLXK_DTYPE_BFLOAT16);
    c.k_scale = mlxkt_new_array(ks, sshape, 1, MLXK_DTYPE_BFLOAT16);
    char id[80];
    snprintf(id, sizeof id, "head_split_S%d", rows);
    add_record(id, "head_split", "mlxkern", "call", 1, rows, rows, 0, measure(head_split_call, &c, 1),
               "x [1, S, 8192] bf16 -> q, k [1, S, 16, 128], v [1, S, 32, 128]; tokens = S");
    CHECK_OK(mlxk_array_free(c.x));
    CHECK_OK(mlxk_array_free(c.q_scale));
    CHECK_OK(mlxk_array_free(c.k_scale));
    /* bytes: read S x 8192 bf16, write S x 8192 bf16 */
    double bytes = 2.0 * rows * CONV_DIM * sizeof(uint16_t);
    snprintf(id, sizeof id, "head_split_S%d", rows);
    copy_baselines(id, "copy", 1, rows, 1, bytes, 0,
                   "plain copy moving the op's input + output bytes (read half, write half)");
}

static void bench_gated_norm(int rows) {
    GatedNormCtx c;
    size_t n = (size_t)rows * HV * DV;
    uint64_t cs = case_seed(KIND_GATED_NORM, 1, (uint64_t)rows, 0);
    uint16_t *buf = mlxkt_xmalloc(n * sizeof(uint16_t));
    int32_t shape[4] = {1, rows, HV, DV};
    fill_normal_bf16(buf, n, tensor_seed(TAG_NORM_X, cs), 0.2);
    c.x = mlxkt_new_array(buf, shape, 4, MLXK_DTYPE_BFLOAT16);
    fill_normal_bf16(buf, n, tensor_seed(TAG_NORM_GATE, cs), 1.0);
    c.gate = mlxkt_new_array(buf, shape, 4, MLXK_DTYPE_BFLOAT16);
    uint16_t w[DV];
    for (int i = 0; i < DV; i++) {
        double x = normal_at(tensor_seed(TAG_NORM_WEIGHT, cs), (uint64_t)i);
        w[i] = mlxkt_bf16_from_float((float)(1.0 + 0.1 * x));
    }
    int32_t wshape[1] = {DV};
    c.weight = mlxkt_new_array(w, wshape, 1, MLXK_DTYPE_BFLOAT16);
    free(buf);
    char id[80];
    snprintf(id, sizeof id, "gated_norm_S%d", rows);
    add_record(id, "gated_norm", "mlxkern", "call", 1, rows, rows, 0, measure(gated_norm_call, &c, 1),
               "x, gate [1, S, 32, 128] bf16, weight [128] bf16 -> out bf16 (S x 32 rows of 128); tokens = S");
    CHECK_OK(mlxk_array_free(c.x));
    CHECK_OK(mlxk_array_free(c.gate));
    CHECK_OK(mlxk_array_free(c.weight));
    /* bytes: read x and gate, write out */
    double bytes = 3.0 * rows * HV * DV * sizeof(uint16_t);
    copy_baselines(id, "copy", 1, rows, 1, bytes, 0,
                   "plain copy moving the op's input + output bytes (read half, write half)");
}

static int group_index(const char *name) {
    for (int i = 0; i < N_GROUPS; i++) {
        if (strcmp(name, GROUPS[i]) == 0) {
            return i;
        }
    }
    return -1;
}

static int want(const char *name) { return selected[group_index(name)]; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s OUTPUT.json [GROUP...]   groups: decode1 decode4 decode16 prefill replay"
                        " small (default: all); MLXK_BENCH_QUICK=1 for a short run\n", argv[0]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        int g = group_index(argv[i]);
        if (g < 0) {
            fprintf(stderr, "bench: unknown group %s\n", argv[i]);
            return 2;
        }
        selected[g] = 1;
    }
    for (int i = 0; i < N_GROUPS; i++) {
        selected[i] = selected[i] || argc == 2;
    }
    if (mlxk_abi_version() != MLXK_ABI_VERSION) {
        fprintf(stderr, "bench: header ABI %d, library ABI %u\n", MLXK_ABI_VERSION, mlxk_abi_version());
        return 1;
    }
    config_from_env();
    double t_start = mlxkt_now_seconds();
    read_loadavg(loadavg_start, sizeof loadavg_start);
    host = host_info();
    char host_text[320];
    host_line(&host, host_text, sizeof host_text);
    printf("mlxkern %s bench (%s): Hk %d, Hv %d, Dk %d, Dv %d, bf16 inputs, f32 state, %d layers\n",
           mlxk_version(), cfg.quick ? "quick" : "full", HK, HV, DK, DV, LAYERS);
    printf("host: %s; load average %s\n", host_text, loadavg_start);

    make_shared_inputs();

    float one = 1.0f;
    int32_t one_shape[1] = {1};
    probe_small = mlxkt_new_array(&one, one_shape, 1, MLXK_DTYPE_FLOAT32);
    Stats noop = measure(eval_noop, NULL, 1);
    Stats roundtrip = measure(eval_roundtrip, NULL, 1);
    printf("eval of an evaluated array: %.2f us; one tiny op built + evaluated: %.2f us\n",
           noop.median * 1e6, roundtrip.median * 1e6);
    CHECK_OK(mlxk_array_free(probe_small));

    if (want("decode1")) {
        bench_decode(1);
    }
    if (want("decode4")) {
        bench_decode(4);
    }
    if (want("decode16")) {
        bench_decode(16);
    }

    if (want("prefill")) {
        printf("prefill\n");
        static const int prefill_t[3] = {64, 512, 4096};
        for (int i = 0; i < 3; i++) {
            bench_prefill(prefill_t[i]);
        }
        bench_padded();
    }

    if (want("replay")) {
        printf("replay\n");
        static const int32_t len1[1] = {5};
        static const int32_t len4[4] = {1, 3, 5, 8};
        bench_replay(1, len1);
        bench_replay(4, len4);
    }

    if (want("small")) {
        printf("head split, gated norm\n");
        bench_head_split(1);
        bench_head_split(512);
        bench_gated_norm(1);
        bench_gated_norm(512);
    }

    CHECK_OK(mlxk_array_free(a_log_arr));
    CHECK_OK(mlxk_array_free(a_log_decay_arr));
    CHECK_OK(mlxk_array_free(dt_bias_arr));
    free(state_pattern);

    double total = mlxkt_now_seconds() - t_start;
    read_loadavg(loadavg_end, sizeof loadavg_end);
    write_json(argv[1], total, noop.median * 1e6, roundtrip.median * 1e6);
    printf("bench.c: %d records in %.1f s -> %s\n", n_records, total, argv[1]);
    return 0;
}
