/*
 * What the files of the C client test share (client.c runs the checks; client_util.c holds the
 * helpers; client_arrays.c, client_gated_delta.c, client_pool.c, client_norms.c and
 * client_host.c the checks, by the surface they cover). The check macros (CHECK, CHECK_OK, EXPECT_ERROR), bfloat16 and
 * random numbers come from examples/common/mlxk_test_util.h.
 */

#ifndef MLXK_CLIENT_H
#define MLXK_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "mlxkern.h"
/* One check tally for all the files (mlxkt_checks() is defined in client_util.c). */
#define MLXKT_SHARED_TALLY
#include "mlxk_test_util.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers (client_util.c)                                                                  */

/* The one random stream of the test: the checks draw from it in the order main() runs them. */
extern mlxkt_rng rng;

mlxk_array *new_f32(const float *data, const int32_t *shape, size_t ndim);
mlxk_array *new_bf16(const float *data, size_t n, const int32_t *shape, size_t ndim);
void free_ok(mlxk_array *a);
void check_shape(const mlxk_array *a, const int32_t *want, size_t ndim, mlxk_dtype dtype,
                 const char *file, int line);
/* max |got - ref| / max(max |ref|, tiny) */
double rel_error(const float *got, const double *ref, size_t n);

/* float64 reference of the gate and the recurrence */
double ref_softplus(float x, int bf16);
double ref_sigmoid(float b, int bf16);
double ref_g(float a_log, float a, float dt_bias, int bf16);

typedef struct {
    int b, t, hk, hv, dk, dv;
} Dims;

/* Host inputs of one recurrence call, as the library sees them (already rounded for bf16). */
typedef struct {
    Dims d;
    int bf16; /* q, k, v, a, b, dt_bias in bfloat16, else float32; a_log always float32 */
    float *q, *k, *v, *a, *b, *a_log, *dt_bias;
} Host;

/* Library handles of a Host. */
typedef struct {
    mlxk_array *q, *k, *v, *a, *b, *a_log, *dt_bias;
} Args;

size_t n_qk(Dims d);
size_t n_v(Dims d);
size_t n_gate(Dims d);
size_t n_state(Dims d);
float *alloc_floats(size_t n);
Host host_random(Dims d, int bf16);
void host_free(Host *h);
/* The recurrence from `state` (in/out, [B, Hv, Dv, Dk]) writing y [B, T, Hv, Dv]; mask [B, T]
 * bytes or NULL. */
void ref_update(const Host *h, const uint8_t *mask, double *state, double *y);
Args upload(const Host *h);
void free_args(Args *x);
/* A call's random inputs on both sides: *h = host_random(d, bf16), and its upload. */
Args upload_random(Dims d, int bf16, Host *h);
/* free_args, then host_free. */
void free_inputs(Host *h, Args *x);

/* ---------------------------------------------------------------------------------------- */
/* Checks, in the order main() runs them                                                    */

/* client_arrays.c */
void test_versions_and_status_names(void);
void test_device(void);
void test_arrays(void);
void test_array_errors(void);
void test_memory_limit(void);
void test_threads(void);

/* client_gated_delta.c */
void test_compute_g(void);
void test_gated_delta_update(void);
void test_gated_delta_update_chunked(void);
void test_gated_delta_update_vjp(void);
void test_gated_delta_update_chunked_vjp(void);
void test_gated_delta_errors(void);
void test_gated_delta_state(void);
void test_gated_delta_update_from_conv(void);

/* client_pool.c */
void test_gated_delta_pool(void);

/* client_norms.c */
void test_gated_rms_norm(void);
void test_gated_rms_norm_vjp(void);
void test_silu_rms_heads(void);
void test_silu_rms_heads_vjp(void);

/* client_host.c */
#ifdef MLXK_GLM52_EXPERT_SLOT_ALIGNMENT
void test_host_mlx(void);
void test_glm52(void);
#endif

#endif
