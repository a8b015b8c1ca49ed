/* The values every consumer test (tests/consumers/<kind>/) checks against: one decode step of
 * mlxk_gated_delta_update and one mlxk_gated_rms_norm on inputs from a fixed generator, through
 * the C ABI. Prints each result's float32 values as 8-digit hex bit patterns, one per line:
 *   y <n> <hex>...   state <n> <hex>...   norm <n> <hex>...
 *
 * The inputs (every consumer makes the same ones):
 *   generator: s = 2024 (uint32); next: s = s * 1664525 + 1013904223 (mod 2^32),
 *              value = (float)((s >> 8) / 16777216.0 * 2.0 - 1.0)   (exact in float32)
 *   decode, float32, B = 2, T = 1, Hk = 2, Hv = 4, Dk = 32, Dv = 8, filled in this order:
 *     q [B,T,Hk,Dk], k [B,T,Hk,Dk], v [B,T,Hv,Dv], a [B,T,Hv], b [B,T,Hv], a_log [Hv],
 *     dt_bias [Hv], state [B,Hv,Dv,Dk]; no mask.
 *   gated norm, float32, continuing the same generator: x [3, 16], gate [3, 16], weight [16];
 *     eps = 1e-6.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlxkern.h"

static uint32_t s = 2024;
static float next_value(void) {
  s = s * 1664525u + 1013904223u;
  return (float)((double)(s >> 8) / 16777216.0 * 2.0 - 1.0);
}

static mlxk_array *make(const int32_t *shape, size_t ndim) {
  size_t n = 1;
  for (size_t i = 0; i < ndim; ++i) n *= (size_t)shape[i];
  float *data = malloc(n * sizeof(float));
  for (size_t i = 0; i < n; ++i) data[i] = next_value();
  mlxk_array *a = NULL;
  if (mlxk_array_new(data, shape, ndim, MLXK_DTYPE_FLOAT32, &a) != MLXK_OK) {
    fprintf(stderr, "mlxk_array_new: %s\n", mlxk_last_error());
    exit(1);
  }
  free(data);
  return a;
}

static void print(const char *name, const mlxk_array *a) {
  size_t bytes = 0;
  if (mlxk_array_nbytes(a, &bytes) != MLXK_OK) exit(1);
  uint32_t *bits = malloc(bytes);
  if (mlxk_array_read(a, bits, bytes) != MLXK_OK) {
    fprintf(stderr, "mlxk_array_read: %s\n", mlxk_last_error());
    exit(1);
  }
  printf("%s %zu", name, bytes / 4);
  for (size_t i = 0; i < bytes / 4; ++i) printf(" %08" PRIx32, bits[i]);
  printf("\n");
  free(bits);
}

int main(void) {
  const int32_t qk[] = {2, 1, 2, 32}, vs[] = {2, 1, 4, 8}, gates[] = {2, 1, 4}, heads[] = {4},
                st[] = {2, 4, 8, 32}, rows[] = {3, 16}, width[] = {16};
  mlxk_array *q = make(qk, 4), *k = make(qk, 4), *v = make(vs, 4), *a = make(gates, 3),
             *b = make(gates, 3), *a_log = make(heads, 1), *dt_bias = make(heads, 1),
             *state = make(st, 4);
  mlxk_array *y = NULL, *state_out = NULL;
  if (mlxk_gated_delta_update(q, k, v, a, b, a_log, dt_bias, state, NULL, &y, &state_out) !=
      MLXK_OK) {
    fprintf(stderr, "mlxk_gated_delta_update: %s\n", mlxk_last_error());
    return 1;
  }
  mlxk_array *x = make(rows, 2), *gate = make(rows, 2), *weight = make(width, 1), *out = NULL;
  if (mlxk_gated_rms_norm(x, gate, weight, 1e-6f, &out) != MLXK_OK) {
    fprintf(stderr, "mlxk_gated_rms_norm: %s\n", mlxk_last_error());
    return 1;
  }
  print("y", y);
  print("state", state_out);
  print("norm", out);
  mlxk_array *all[] = {q, k, v, a, b, a_log, dt_bias, state, y, state_out, x, gate, weight, out};
  for (size_t i = 0; i < sizeof all / sizeof *all; ++i) mlxk_array_free(all[i]);
  return 0;
}
