/*
 * A C host on mlx-c (MLX's C API) using mlxkern through include/mlxkern_mlxc.h: a decode loop
 * whose recurrent state stays an mlx-c array from step to step (no copy across the boundary),
 * one mlx-c evaluation per step, the results consumed by mlx-c ops, and the same steps through
 * mlxkern's own host-memory constructors as the reference (bit for bit). Fresh random inputs
 * every run (the seed is printed). Built and run by scripts/test/interop.sh under ASan + LSan.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlx/c/mlx.h"
#include "mlxk_test_util.h"
#include "mlxkern_mlxc.h"

enum { B = 1, T = 1, HK = 2, HV = 4, DK = 64, DV = 16, STEPS = 6 };

static mlx_array host_bf16(mlxkt_rng *rng, const int *shape, int ndim, float scale) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  uint16_t *v = mlxkt_xmalloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = mlxkt_bf16_from_float(scale * mlxkt_rng_sym(rng));
  mlx_array a = mlx_array_new_data(v, shape, ndim, MLX_BFLOAT16);
  free(v);
  return a;
}

static mlx_array host_f32(mlxkt_rng *rng, const int *shape, int ndim, float scale) {
  size_t n = 1;
  for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
  float *v = mlxkt_xmalloc(n * sizeof *v);
  for (size_t i = 0; i < n; i++) v[i] = scale * mlxkt_rng_sym(rng);
  mlx_array a = mlx_array_new_data(v, shape, ndim, MLX_FLOAT32);
  free(v);
  return a;
}

/* An mlx-c array's values as float32 (exact for bfloat16: each value widens to one float),
 * evaluated: `*n` values. */
static float *host_floats(mlx_array a, mlx_stream s, size_t *n) {
  mlx_array f = mlx_array_new();
  CHECK(mlx_astype(&f, a, MLX_FLOAT32, s) == 0);
  CHECK(mlx_array_eval(f) == 0);
  *n = mlx_array_size(f);
  float *out = mlxkt_xmalloc(*n * sizeof *out);
  memcpy(out, mlx_array_data_float32(f), *n * sizeof *out);
  mlx_array_free(f);
  return out;
}

/* A handle's values as float32 (widened from bfloat16 when needed). */
static float *handle_floats(const mlxk_array *h, size_t *n) {
  mlxk_dtype dtype;
  CHECK_OK(mlxk_array_dtype(h, &dtype));
  size_t bytes = 0;
  CHECK_OK(mlxk_array_nbytes(h, &bytes));
  if (dtype == MLXK_DTYPE_FLOAT32) {
    *n = bytes / 4;
    float *out = mlxkt_xmalloc(bytes);
    CHECK_OK(mlxk_array_read(h, out, bytes));
    return out;
  }
  *n = bytes / 2;
  uint16_t *bits = mlxkt_xmalloc(bytes);
  CHECK_OK(mlxk_array_read(h, bits, bytes));
  float *out = mlxkt_xmalloc(*n * sizeof *out);
  for (size_t i = 0; i < *n; i++) out[i] = mlxkt_bf16_to_float(bits[i]);
  free(bits);
  return out;
}

/* The same array through mlxkern's host-memory constructor (the copying path). */
static mlxk_array *copied(mlx_array a, mlx_stream s) {
  size_t n;
  float *v = host_floats(a, s, &n);
  int32_t shape[8];
  size_t nd = mlx_array_ndim(a);
  for (size_t i = 0; i < nd; i++) shape[i] = mlx_array_dim(a, (int)i);
  mlxk_array *h = NULL;
  if (mlx_array_dtype(a) == MLX_FLOAT32) {
    CHECK_OK(mlxk_array_new(v, shape, nd, MLXK_DTYPE_FLOAT32, &h));
  } else {
    uint16_t *bits = mlxkt_xmalloc(n * sizeof *bits);
    for (size_t i = 0; i < n; i++) bits[i] = mlxkt_bf16_from_float(v[i]);
    CHECK_OK(mlxk_array_new(bits, shape, nd, MLXK_DTYPE_BFLOAT16, &h));
    free(bits);
  }
  free(v);
  return h;
}

static mlxk_array *shared(mlx_array a) {
  mlxk_array *h = NULL;
  CHECK_OK(mlxk_array_from_mlx_c(a, &h));
  return h;
}

int main(void) {
  uint64_t seed = (uint64_t)time(NULL) ^ (uint64_t)clock();
  const char *env = getenv("MLXK_INTEROP_SEED");
  if (env) seed = strtoull(env, NULL, 10);
  printf("host_mlxc: seed %llu (MLXK_INTEROP_SEED replays), MLX %s\n", (unsigned long long)seed,
         mlxk_mlx_version());
  mlxkt_rng rng = {seed};
  mlx_stream cpu = mlx_default_cpu_stream_new();
  const int hv_shape[1] = {HV};
  mlx_array a_log = host_f32(&rng, hv_shape, 1, 1.0f);
  mlx_array dt_bias = host_bf16(&rng, hv_shape, 1, 1.0f);
  const int state_shape[4] = {B, HV, DV, DK};
  mlx_array state = host_f32(&rng, state_shape, 4, 0.5f);
  mlxk_array *ref_state = copied(state, cpu);
  mlxk_array *h_alog = shared(a_log), *h_dt = shared(dt_bias);
  mlxk_array *r_alog = copied(a_log, cpu), *r_dt = copied(dt_bias, cpu);
  int same = 1;
  for (int step = 0; step < STEPS; step++) {
    const int qk[4] = {B, T, HK, DK}, vs[4] = {B, T, HV, DV}, gs[3] = {B, T, HV};
    mlx_array q = host_bf16(&rng, qk, 4, 0.2f), k = host_bf16(&rng, qk, 4, 0.2f);
    mlx_array v = host_bf16(&rng, vs, 4, 1.0f);
    mlx_array a = host_bf16(&rng, gs, 3, 1.0f), b = host_bf16(&rng, gs, 3, 1.0f);
    /* Shared: the state is the mlx-c array of the previous step. */
    mlxk_array *hq = shared(q), *hk = shared(k), *hv = shared(v), *ha = shared(a), *hb = shared(b);
    mlxk_array *hs = shared(state);
    mlxk_array *y = NULL, *s = NULL;
    CHECK_OK(mlxk_gated_delta_update(hq, hk, hv, ha, hb, h_alog, h_dt, hs, NULL, &y, &s));
    mlx_array y_host = mlx_array_new(), s_host = mlx_array_new();
    CHECK_OK(mlxk_array_to_mlx_c(y, &y_host));
    CHECK_OK(mlxk_array_to_mlx_c(s, &s_host));
    mlxk_array *handles[8] = {hq, hk, hv, ha, hb, hs, y, s};
    for (int i = 0; i < 8; i++) CHECK_OK(mlxk_array_free(handles[i]));
    /* The host consumes y with its own op; one evaluation computes the kernel and the sum. */
    mlx_array total = mlx_array_new();
    CHECK(mlx_sum(&total, y_host, false, cpu) == 0);
    mlx_array outs[2] = {total, s_host};
    mlx_vector_array vec = mlx_vector_array_new_data(outs, 2);
    CHECK(mlx_eval(vec) == 0);
    mlx_vector_array_free(vec);
    /* Reference: the same step through host memory. */
    mlxk_array *rq = copied(q, cpu), *rk = copied(k, cpu), *rv = copied(v, cpu);
    mlxk_array *ra = copied(a, cpu), *rb = copied(b, cpu);
    mlxk_array *ry = NULL, *rs = NULL;
    CHECK_OK(mlxk_gated_delta_update(rq, rk, rv, ra, rb, r_alog, r_dt, ref_state, NULL, &ry, &rs));
    size_t ny, ns, ry_n, rs_n;
    float *y_got = host_floats(y_host, cpu, &ny), *s_got = host_floats(s_host, cpu, &ns);
    float *y_want = handle_floats(ry, &ry_n), *s_want = handle_floats(rs, &rs_n);
    same = same && ny == ry_n && ns == rs_n && !memcmp(y_got, y_want, ny * sizeof(float)) &&
           !memcmp(s_got, s_want, ns * sizeof(float));
    CHECK(mlx_array_ndim(total) == 0);
    free(y_got), free(s_got), free(y_want), free(s_want);
    mlxk_array *refs[7] = {rq, rk, rv, ra, rb, ry, ref_state};
    for (int i = 0; i < 7; i++) CHECK_OK(mlxk_array_free(refs[i]));
    ref_state = rs;
    mlx_array host_arrays[7] = {q, k, v, a, b, y_host, total};
    for (int i = 0; i < 7; i++) mlx_array_free(host_arrays[i]);
    mlx_array_free(state);
    state = s_host; /* carried to the next step as an mlx-c array */
  }
  CHECK(same);
  /* Misuse through the mlx-c helpers. */
  mlx_array empty = {NULL};
  mlxk_array *h = NULL;
  CHECK(mlxk_array_from_mlx_c(empty, &h) == MLXK_ERR_NULL_POINTER);
  CHECK(mlxk_array_to_mlx_c(h_alog, NULL) == MLXK_ERR_NULL_POINTER);
  CHECK_OK(mlxk_array_free(h_alog));
  mlx_array out = mlx_array_new();
  CHECK(mlxk_array_to_mlx_c(h_alog, &out) == MLXK_ERR_INVALID_HANDLE);
  mlx_array_free(out);
  CHECK_OK(mlxk_array_free(h_dt));
  CHECK_OK(mlxk_array_free(r_alog));
  CHECK_OK(mlxk_array_free(r_dt));
  CHECK_OK(mlxk_array_free(ref_state));
  mlx_array_free(state);
  mlx_array_free(a_log);
  mlx_array_free(dt_bias);
  mlx_stream_free(cpu);
  mlxkt_tally *t = mlxkt_checks();
  printf("host_mlxc: %ld checks, %ld failed\n", t->passed + t->failed, t->failed);
  return t->failed == 0 ? 0 : 1;
}
