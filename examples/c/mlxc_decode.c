/*
 * A decode loop of one Qwen3.5 Gated DeltaNet layer in C, on mlx-c (MLX's C API), with
 * mlxkern's kernels in the same graph through include/mlxkern_mlxc.h.
 *
 * Per step, for the token x [1, T, hidden] (bfloat16):
 *   mlx-c ops   qkv, z, b, a = x·W^T (four projections); conv_in = [conv_state | qkv];
 *               conv_out = conv1d(conv_in, w, groups = conv_dim)
 *   mlxkern     q, k, v = mlxk_silu_rms_heads(conv_out); y, state = mlxk_gated_delta_update(...);
 *               normed = mlxk_gated_rms_norm(y, z, norm.weight)
 *   mlx-c op    out = normed·W_out^T
 * The arrays cross with mlxk_array_from_mlx_c / mlxk_array_to_mlx_c (no copy, lazy stays
 * lazy); the recurrent state [1, Hv, Dv, Dk] float32 and the conv state [1, K-1, conv_dim]
 * bfloat16 are mlx-c arrays carried from step to step; each step is one graph and one
 * mlx_eval. The layer drops its old state before the eval, so the kernel writes the new state
 * into the old buffer.
 *
 * Random weights at Qwen3.5-35B-A3B's shapes (hidden 2048, Hk 16, Hv 32, Dk = Dv = 128, K 4).
 * The program decodes N tokens one at a time, then runs the same N tokens through a fresh
 * layer as one prefill and checks that both end in the same states and outputs (the exact
 * recurrence gives the same bits for any split of the tokens; MLX's projections may round a
 * few bfloat16 values differently between a one-row and an N-row product, so the check allows
 * a bfloat16 ulp's worth). Exit status 0 when they agree.
 *
 *   mlxc_decode [N]        (default 16 tokens)
 *
 * Build (scripts/test/interop.sh does, against a static mlx-c): a C11 compiler with mlx-c's
 * and mlxkern's headers, linked with libmlxc, libmlxkern and libmlx (the one mlxkern runs on).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "mlx/c/mlx.h"
#include "mlxkern_mlxc.h"

/* ---------------------------------------------------------------------------------------- */
/* Error handling: an example stops at the first failure, saying which call failed.         */

#define MLX_OK(call)                                                                 \
  do {                                                                               \
    if ((call) != 0) {                                                               \
      fprintf(stderr, "mlxc_decode: %s failed (%s:%d)\n", #call, __FILE__, __LINE__); \
      exit(1);                                                                       \
    }                                                                                \
  } while (0)

#define KERN_OK(call)                                                                     \
  do {                                                                                    \
    mlxk_status status_ = (call);                                                         \
    if (status_ != MLXK_OK) {                                                             \
      fprintf(stderr, "mlxc_decode: %s: %s: %s\n", #call, mlxk_status_name(status_),      \
              mlxk_last_error());                                                         \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

/* ---------------------------------------------------------------------------------------- */
/* The layer                                                                                */

enum { HIDDEN = 2048, HK = 16, HV = 32, DK = 128, DV = 128, KCONV = 4 };
enum { KEY_WIDTH = HK * DK, VALUE_WIDTH = HV * DV, CONV_DIM = 2 * KEY_WIDTH + VALUE_WIDTH };
#define NORM_EPS 1e-6f

typedef struct {
  mlx_stream s;
  /* mlx-c arrays: the projections' weights (transposed views, as nn.Linear uses them), the
   * conv weight [conv_dim, K, 1], and the two carried states. */
  mlx_array w_qkv_t, w_z_t, w_b_t, w_a_t, w_out_t, conv_w;
  mlx_array state, conv_state;
  /* mlxkern handles sharing the small parameters, made once. */
  mlxk_array *a_log, *dt_bias, *norm_w, *q_scale, *k_scale;
  float qk_eps;
} Layer;

typedef struct {
  mlx_array w_qkv, w_z, w_b, w_a, w_out, conv_w, a_log, dt_bias, norm_w;
} Weights;

static mlx_array new_key(mlx_array *key, mlx_stream s) {
  mlx_array next = mlx_array_new(), sub = mlx_array_new();
  MLX_OK(mlx_random_split(&next, &sub, *key, s));
  mlx_array_free(*key);
  *key = next;
  return sub;
}

static mlx_array uniform(mlx_array *key, float lo, float hi, const int *shape, size_t ndim,
                         mlx_dtype dtype, mlx_stream s) {
  mlx_array low = mlx_array_new_float(lo), high = mlx_array_new_float(hi), out = mlx_array_new();
  mlx_array k = new_key(key, s);
  MLX_OK(mlx_random_uniform(&out, low, high, shape, ndim, dtype, k, s));
  mlx_array_free(low), mlx_array_free(high), mlx_array_free(k);
  return out;
}

static mlx_array linear_weight(mlx_array *key, int out, int in, mlx_stream s) {
  const int shape[2] = {out, in};
  const float bound = 1.0f / sqrtf((float)in);
  return uniform(key, -bound, bound, shape, 2, MLX_BFLOAT16, s);
}

static Weights random_weights(uint64_t seed, mlx_stream s) {
  Weights w;
  mlx_array key = mlx_array_new();
  MLX_OK(mlx_random_key(&key, seed));
  w.w_qkv = linear_weight(&key, CONV_DIM, HIDDEN, s);
  w.w_z = linear_weight(&key, VALUE_WIDTH, HIDDEN, s);
  w.w_b = linear_weight(&key, HV, HIDDEN, s);
  w.w_a = linear_weight(&key, HV, HIDDEN, s);
  w.w_out = linear_weight(&key, HIDDEN, VALUE_WIDTH, s);
  const int conv_shape[3] = {CONV_DIM, KCONV, 1};
  w.conv_w = uniform(&key, -0.5f, 0.5f, conv_shape, 3, MLX_BFLOAT16, s);
  const int hv[1] = {HV}, dv[1] = {DV};
  mlx_array rates = uniform(&key, 0.02f, 1.0f, hv, 1, MLX_FLOAT32, s);
  w.a_log = mlx_array_new();
  MLX_OK(mlx_log(&w.a_log, rates, s)); /* A_log, float32 */
  mlx_array_free(rates);
  w.dt_bias = uniform(&key, -0.5f, 0.5f, hv, 1, MLX_BFLOAT16, s);
  w.norm_w = uniform(&key, 0.8f, 1.2f, dv, 1, MLX_BFLOAT16, s);
  mlx_array all[9] = {w.w_qkv, w.w_z, w.w_b, w.w_a, w.w_out, w.conv_w, w.a_log, w.dt_bias, w.norm_w};
  mlx_vector_array vec = mlx_vector_array_new_data(all, 9);
  MLX_OK(mlx_eval(vec));
  mlx_vector_array_free(vec);
  mlx_array_free(key);
  return w;
}

static void free_weights(Weights *w) {
  mlx_array all[9] = {w->w_qkv, w->w_z, w->w_b, w->w_a, w->w_out, w->conv_w, w->a_log, w->dt_bias, w->norm_w};
  for (int i = 0; i < 9; i++) mlx_array_free(all[i]);
}

static mlx_array transposed(mlx_array w, mlx_stream s) {
  mlx_array t = mlx_array_new();
  MLX_OK(mlx_transpose(&t, w, s));
  return t;
}

static mlxk_array *shared(mlx_array a) {
  mlxk_array *h = NULL;
  KERN_OK(mlxk_array_from_mlx_c(a, &h));
  return h;
}

static void layer_init(Layer *layer, const Weights *w, mlx_stream s) {
  layer->s = s;
  layer->w_qkv_t = transposed(w->w_qkv, s);
  layer->w_z_t = transposed(w->w_z, s);
  layer->w_b_t = transposed(w->w_b, s);
  layer->w_a_t = transposed(w->w_a, s);
  layer->w_out_t = transposed(w->w_out, s);
  layer->conv_w = mlx_array_new();
  mlx_array_set(&layer->conv_w, w->conv_w);
  const int state_shape[4] = {1, HV, DV, DK}, conv_shape[3] = {1, KCONV - 1, CONV_DIM};
  layer->state = mlx_array_new();
  layer->conv_state = mlx_array_new();
  MLX_OK(mlx_zeros(&layer->state, state_shape, 4, MLX_FLOAT32, s));
  MLX_OK(mlx_zeros(&layer->conv_state, conv_shape, 3, MLX_BFLOAT16, s));
  /* mlx-lm's normalize_qk: q scaled by Dk^-1, k by Dk^-1/2 (bfloat16 scalars), rms eps
   * 1e-6 / Dk. */
  const int dk[1] = {DK};
  mlx_array qs = mlx_array_new(), ks = mlx_array_new();
  mlx_array qv = mlx_array_new_float(1.0f / (float)DK), kv = mlx_array_new_float(1.0f / sqrtf((float)DK));
  MLX_OK(mlx_full(&qs, dk, 1, qv, MLX_BFLOAT16, s));
  MLX_OK(mlx_full(&ks, dk, 1, kv, MLX_BFLOAT16, s));
  mlx_array ready[2] = {qs, ks};
  mlx_vector_array vec = mlx_vector_array_new_data(ready, 2);
  MLX_OK(mlx_eval(vec));
  mlx_vector_array_free(vec);
  layer->a_log = shared(w->a_log);
  layer->dt_bias = shared(w->dt_bias);
  layer->norm_w = shared(w->norm_w);
  layer->q_scale = shared(qs);
  layer->k_scale = shared(ks);
  layer->qk_eps = 1e-6f / (float)DK;
  mlx_array_free(qs), mlx_array_free(ks), mlx_array_free(qv), mlx_array_free(kv);
}

static void layer_free(Layer *layer) {
  mlx_array arrays[8] = {layer->w_qkv_t, layer->w_z_t, layer->w_b_t, layer->w_a_t,
                         layer->w_out_t, layer->conv_w, layer->state, layer->conv_state};
  for (int i = 0; i < 8; i++) mlx_array_free(arrays[i]);
  mlxk_array *handles[5] = {layer->a_log, layer->dt_bias, layer->norm_w, layer->q_scale, layer->k_scale};
  for (int i = 0; i < 5; i++) KERN_OK(mlxk_array_free(handles[i]));
}

/* Builds one step over x [1, T, hidden] (lazy): returns the output [1, T, hidden] and replaces
 * the layer's states with the step's (lazy) ones. Nothing is computed until the caller's
 * mlx_eval of the output and the two states. */
static mlx_array layer_step(Layer *layer, mlx_array x, int tokens) {
  mlx_stream s = layer->s;
  mlx_array qkv = mlx_array_new(), z = mlx_array_new(), b = mlx_array_new(), a = mlx_array_new();
  MLX_OK(mlx_matmul(&qkv, x, layer->w_qkv_t, s));
  MLX_OK(mlx_matmul(&z, x, layer->w_z_t, s));
  MLX_OK(mlx_matmul(&b, x, layer->w_b_t, s));
  MLX_OK(mlx_matmul(&a, x, layer->w_a_t, s));
  const int z_shape[4] = {1, tokens, HV, DV};
  MLX_OK(mlx_reshape(&z, z, z_shape, 4, s));

  /* The depthwise causal conv over [conv_state | qkv]; the next conv state is its last K-1
   * rows. */
  mlx_array parts[2] = {layer->conv_state, qkv};
  mlx_vector_array pv = mlx_vector_array_new_data(parts, 2);
  mlx_array conv_in = mlx_array_new(), conv_out = mlx_array_new(), next_conv = mlx_array_new();
  MLX_OK(mlx_concatenate_axis(&conv_in, pv, 1, s));
  mlx_vector_array_free(pv);
  const int start[3] = {0, tokens, 0}, stop[3] = {1, tokens + KCONV - 1, CONV_DIM}, step[3] = {1, 1, 1};
  MLX_OK(mlx_slice(&next_conv, conv_in, start, 3, stop, 3, step, 3, s));
  MLX_OK(mlx_contiguous(&next_conv, next_conv, false, s));
  MLX_OK(mlx_conv1d(&conv_out, conv_in, layer->conv_w, 1, 0, 1, CONV_DIM, s));

  /* mlxkern: head split, recurrence, gated norm, on the shared arrays. */
  mlxk_array *h_conv = shared(conv_out), *h_a = shared(a), *h_b = shared(b), *h_z = shared(z);
  mlxk_array *h_state = shared(layer->state);
  mlxk_array *q = NULL, *k = NULL, *v = NULL, *y = NULL, *state = NULL, *normed = NULL;
  KERN_OK(mlxk_silu_rms_heads(h_conv, layer->q_scale, layer->k_scale, HK, HV, DV, layer->qk_eps,
                              &q, &k, &v));
  KERN_OK(mlxk_gated_delta_update(q, k, v, h_a, h_b, layer->a_log, layer->dt_bias, h_state, NULL,
                                  &y, &state));
  KERN_OK(mlxk_gated_rms_norm(y, h_z, layer->norm_w, NORM_EPS, &normed));
  mlx_array normed_c = mlx_array_new(), state_c = mlx_array_new();
  KERN_OK(mlxk_array_to_mlx_c(normed, &normed_c));
  KERN_OK(mlxk_array_to_mlx_c(state, &state_c));
  mlxk_array *handles[11] = {h_conv, h_a, h_b, h_z, h_state, q, k, v, y, state, normed};
  for (int i = 0; i < 11; i++) KERN_OK(mlxk_array_free(handles[i]));

  /* out_proj, an mlx-c op on the kernel's lazy result. */
  mlx_array out = mlx_array_new();
  const int flat[3] = {1, tokens, VALUE_WIDTH};
  MLX_OK(mlx_reshape(&normed_c, normed_c, flat, 3, s));
  MLX_OK(mlx_matmul(&out, normed_c, layer->w_out_t, s));

  /* The layer lets go of its old states (the graph holds their last references). */
  mlx_array_free(layer->state);
  mlx_array_free(layer->conv_state);
  layer->state = state_c;
  layer->conv_state = next_conv;
  mlx_array temps[7] = {qkv, z, b, a, conv_in, conv_out, normed_c};
  for (int i = 0; i < 7; i++) mlx_array_free(temps[i]);
  return out;
}

/* The step's one evaluation: the output and both states. */
static void eval_step(Layer *layer, mlx_array out) {
  mlx_array all[3] = {out, layer->state, layer->conv_state};
  mlx_vector_array vec = mlx_vector_array_new_data(all, 3);
  MLX_OK(mlx_eval(vec));
  mlx_vector_array_free(vec);
}

/* ---------------------------------------------------------------------------------------- */
/* Comparisons                                                                              */

/* max |a - b| / max |b|, computed with mlx-c ops (float32). */
static float relative_diff(mlx_array a, mlx_array b, mlx_stream s) {
  mlx_array fa = mlx_array_new(), fb = mlx_array_new(), d = mlx_array_new(), md = mlx_array_new();
  mlx_array mb = mlx_array_new();
  MLX_OK(mlx_astype(&fa, a, MLX_FLOAT32, s));
  MLX_OK(mlx_astype(&fb, b, MLX_FLOAT32, s));
  MLX_OK(mlx_subtract(&d, fa, fb, s));
  MLX_OK(mlx_abs(&d, d, s));
  MLX_OK(mlx_max(&md, d, false, s));
  MLX_OK(mlx_abs(&fb, fb, s));
  MLX_OK(mlx_max(&mb, fb, false, s));
  float num = 0, den = 0;
  MLX_OK(mlx_array_item_float32(&num, md));
  MLX_OK(mlx_array_item_float32(&den, mb));
  mlx_array all[5] = {fa, fb, d, md, mb};
  for (int i = 0; i < 5; i++) mlx_array_free(all[i]);
  return den > 0 ? num / den : num;
}

static int bit_identical(mlx_array a, mlx_array b, mlx_stream s) {
  mlx_array eq = mlx_array_new();
  MLX_OK(mlx_array_equal(&eq, a, b, false, s));
  bool same = false;
  MLX_OK(mlx_array_item_bool(&same, eq));
  mlx_array_free(eq);
  return same;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 16;
  if (n < 1 || n > 4096) {
    fprintf(stderr, "usage: %s [TOKENS (1..4096)]\n", argv[0]);
    return 2;
  }
  mlx_stream s = mlx_default_cpu_stream_new();
  printf("mlxc_decode: mlxkern %s on MLX %s (mlx-c), Qwen3.5-35B-A3B layer shapes, %d tokens\n",
         mlxk_version(), mlxk_mlx_version(), n);
  Weights w = random_weights(20250601, s);

  /* The token stream x [1, n, hidden], bfloat16. */
  mlx_array key = mlx_array_new(), xs = mlx_array_new();
  MLX_OK(mlx_random_key(&key, 7));
  const int x_shape[3] = {1, n, HIDDEN};
  MLX_OK(mlx_random_normal(&xs, x_shape, 3, MLX_BFLOAT16, 0.0f, 1.0f, key, s));
  mlx_vector_array xv = mlx_vector_array_new_data(&xs, 1);
  MLX_OK(mlx_eval(xv));
  mlx_vector_array_free(xv);

  /* 1. Decode: one token per step, one eval per step. */
  Layer dec;
  layer_init(&dec, &w, s);
  mlx_array *outs = malloc(sizeof(mlx_array) * (size_t)n);
  if (!outs) return 1;
  double t0 = now_s();
  for (int t = 0; t < n; t++) {
    const int start[3] = {0, t, 0}, stop[3] = {1, t + 1, HIDDEN}, step[3] = {1, 1, 1};
    mlx_array x = mlx_array_new();
    MLX_OK(mlx_slice(&x, xs, start, 3, stop, 3, step, 3, s));
    outs[t] = layer_step(&dec, x, 1);
    eval_step(&dec, outs[t]);
    mlx_array_free(x);
  }
  const double decode_s = now_s() - t0;
  printf("  decode: %d steps, %d evals (one per step), %.2f ms/step, %.1f tokens/s\n", n, n,
         1e3 * decode_s / n, n / decode_s);

  /* 2. The same tokens as one prefill through a fresh layer. */
  Layer pre;
  layer_init(&pre, &w, s);
  t0 = now_s();
  mlx_array out_pre = layer_step(&pre, xs, n);
  eval_step(&pre, out_pre);
  const double prefill_s = now_s() - t0;
  printf("  prefill: %d tokens, 1 eval, %.2f ms, %.1f tokens/s\n", n, 1e3 * prefill_s, n / prefill_s);

  /* 3. Both must end in the same place. */
  mlx_vector_array ov = mlx_vector_array_new_data(outs, (size_t)n);
  mlx_array out_dec = mlx_array_new();
  MLX_OK(mlx_concatenate_axis(&out_dec, ov, 1, s));
  mlx_vector_array_free(ov);
  const float d_state = relative_diff(dec.state, pre.state, s);
  const float d_conv = relative_diff(dec.conv_state, pre.conv_state, s);
  const float d_out = relative_diff(out_dec, out_pre, s);
  const int same_state = bit_identical(dec.state, pre.state, s);
  const int same_out = bit_identical(out_dec, out_pre, s);
  printf("  decode vs prefill: state %s (max |d| %.2g of max|s|), conv state max |d| %.2g, "
         "outputs %s (max |d| %.2g of max|y|)\n",
         same_state ? "bit-identical" : "differs", d_state, d_conv,
         same_out ? "bit-identical" : "differ", d_out);
  /* Allowed: a few bfloat16 roundings of the projections that differ between the one-row and
   * the n-row product (2^-8 of the largest value). */
  const int ok = d_state <= 0x1p-8f && d_conv <= 0x1p-8f && d_out <= 0x1p-8f;

  for (int t = 0; t < n; t++) mlx_array_free(outs[t]);
  free(outs);
  mlx_array_free(out_dec), mlx_array_free(out_pre), mlx_array_free(xs), mlx_array_free(key);
  layer_free(&dec);
  layer_free(&pre);
  free_weights(&w);
  mlx_stream_free(s);
  printf("mlxc_decode: %s\n", ok ? "OK" : "FAIL: decode and prefill disagree");
  return ok ? 0 : 1;
}
