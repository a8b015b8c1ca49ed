/*
 * The C client test's helpers (declared in client.h): handles from host data, result shape
 * checks, the float64 reference of the gate and the recurrence, random recurrence inputs and
 * their upload. The checks themselves (CHECK, CHECK_OK, EXPECT_ERROR) are in
 * examples/common/mlxk_test_util.h.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

/* ---------------------------------------------------------------------------------------- */
/* Helpers (CHECK, CHECK_OK, EXPECT_ERROR, bfloat16, random numbers: examples/common/)      */

/* The checks of all the files count here (client.h defines MLXKT_SHARED_TALLY). */
mlxkt_tally *mlxkt_checks(void) {
    static mlxkt_tally tally;
    return &tally;
}

mlxkt_rng rng = {0x5EED1234ABCDull};

mlxk_array *new_f32(const float *data, const int32_t *shape, size_t ndim) {
    return mlxkt_new_array(data, shape, ndim, MLXK_DTYPE_FLOAT32);
}

mlxk_array *new_bf16(const float *data, size_t n, const int32_t *shape, size_t ndim) {
    uint16_t *bits = mlxkt_xmalloc(n * sizeof *bits);
    for (size_t i = 0; i < n; i++) {
        bits[i] = mlxkt_bf16_from_float(data[i]);
    }
    mlxk_array *out = mlxkt_new_array(bits, shape, ndim, MLXK_DTYPE_BFLOAT16);
    free(bits);
    return out;
}

void free_ok(mlxk_array *a) { CHECK_OK(mlxk_array_free(a)); }

void check_shape(const mlxk_array *a, const int32_t *want, size_t ndim, mlxk_dtype dtype,
                 const char *file, int line) {
    size_t got_ndim = 99;
    int32_t dims[MLXK_MAX_NDIM];
    mlxk_dtype got_dtype = -1;
    CHECK_OK(mlxk_array_ndim(a, &got_ndim));
    mlxkt_check_at(got_ndim == ndim, "result rank", file, line);
    CHECK_OK(mlxk_array_shape(a, dims, MLXK_MAX_NDIM));
    int same = got_ndim == ndim;
    for (size_t i = 0; same && i < ndim; i++) {
        same = dims[i] == want[i];
    }
    mlxkt_check_at(same, "result shape", file, line);
    CHECK_OK(mlxk_array_dtype(a, &got_dtype));
    mlxkt_check_at(got_dtype == dtype, "result dtype", file, line);
}

/* max |got - ref| / max(max |ref|, tiny) */
double rel_error(const float *got, const double *ref, size_t n) {
    double err = 0.0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= err)) {
            err = d;
        }
        if (fabs(ref[i]) > scale) {
            scale = fabs(ref[i]);
        }
    }
    return err / scale;
}

/* ---------------------------------------------------------------------------------------- */
/* float64 reference of the gate and the recurrence                                         */

/* Gates from float32 inputs (MLX computes them in float32: errors ~1e-7 relative), or, with
 * `bf16`, at MLX's bfloat16 rounding points (see examples/c/demo.c). */
double ref_softplus(float x, int bf16) {
    if (!bf16) {
        double xd = x;
        return (xd > 0 ? xd : 0.0) + log1p(exp(-fabs(xd)));
    }
    float e = mlxkt_bf16_round((float)exp(-fabs((double)x)));
    float l = mlxkt_bf16_round((float)log1p((double)e));
    return mlxkt_bf16_round((x > 0.0f ? x : 0.0f) + l);
}

double ref_sigmoid(float b, int bf16) {
    if (!bf16) {
        return 1.0 / (1.0 + exp(-(double)b));
    }
    float e = mlxkt_bf16_round((float)exp(fabs((double)b)));
    float y = 1.0f / (1.0f + e);
    return mlxkt_bf16_round(b < 0.0f ? y : 1.0f - y);
}

double ref_g(float a_log, float a, float dt_bias, int bf16) {
    float x = bf16 ? mlxkt_bf16_round(a + dt_bias) : a + dt_bias;
    return exp(-exp((double)a_log) * ref_softplus(x, bf16));
}

size_t n_qk(Dims d) { return (size_t)d.b * d.t * d.hk * d.dk; }
size_t n_v(Dims d) { return (size_t)d.b * d.t * d.hv * d.dv; }
size_t n_gate(Dims d) { return (size_t)d.b * d.t * d.hv; }
size_t n_state(Dims d) { return (size_t)d.b * d.hv * d.dv * d.dk; }

float *alloc_floats(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    if (p == NULL) {
        exit(1);
    }
    return p;
}

Host host_random(Dims d, int bf16) {
    Host h;
    h.d = d;
    h.bf16 = bf16;
    h.q = alloc_floats(n_qk(d));
    h.k = alloc_floats(n_qk(d));
    h.v = alloc_floats(n_v(d));
    h.a = alloc_floats(n_gate(d));
    h.b = alloc_floats(n_gate(d));
    h.a_log = alloc_floats((size_t)d.hv);
    h.dt_bias = alloc_floats((size_t)d.hv);
    /* q, k per head as normalize_qk leaves them: q = l2norm * Dk^-1/2, k = l2norm. */
    for (size_t head = 0; head < n_qk(d) / (size_t)d.dk; head++) {
        for (int which = 0; which < 2; which++) {
            float *x = (which ? h.k : h.q) + head * (size_t)d.dk;
            double norm2 = 0.0;
            for (int i = 0; i < d.dk; i++) {
                x[i] = mlxkt_rng_sym(&rng);
                norm2 += (double)x[i] * x[i];
            }
            double scale = (which ? 1.0 : 1.0 / sqrt((double)d.dk)) / sqrt(norm2);
            for (int i = 0; i < d.dk; i++) {
                x[i] = (float)(x[i] * scale);
            }
        }
    }
    for (size_t i = 0; i < n_v(d); i++) {
        h.v[i] = mlxkt_rng_sym(&rng);
    }
    for (size_t i = 0; i < n_gate(d); i++) {
        h.a[i] = 2.0f * mlxkt_rng_sym(&rng);
        h.b[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < d.hv; i++) {
        h.a_log[i] = (float)log(1.0 + 4.0 * (1.0 + mlxkt_rng_sym(&rng)));
        h.dt_bias[i] = -2.0f + mlxkt_rng_sym(&rng);
    }
    if (bf16) {
        float *arrays[] = {h.q, h.k, h.v, h.a, h.b, h.dt_bias};
        size_t counts[] = {n_qk(d), n_qk(d), n_v(d), n_gate(d), n_gate(d), (size_t)d.hv};
        for (int j = 0; j < 6; j++) {
            for (size_t i = 0; i < counts[j]; i++) {
                arrays[j][i] = mlxkt_bf16_round(arrays[j][i]);
            }
        }
    }
    return h;
}

void host_free(Host *h) {
    float *all[] = {h->q, h->k, h->v, h->a, h->b, h->a_log, h->dt_bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free(all[i]);
    }
}

/* The recurrence from `state` (in/out, [B, Hv, Dv, Dk]) writing y [B, T, Hv, Dv]; mask [B, T]
 * bytes or NULL. */
void ref_update(const Host *h, const uint8_t *mask, double *state, double *y) {
    Dims d = h->d;
    int group = d.hv / d.hk;
    for (int b = 0; b < d.b; b++) {
        for (int t = 0; t < d.t; t++) {
            size_t bt = (size_t)b * d.t + t;
            for (int hv = 0; hv < d.hv; hv++) {
                size_t gate = bt * d.hv + hv;
                double g = ref_g(h->a_log[hv], h->a[gate], h->dt_bias[hv], h->bf16);
                double beta = ref_sigmoid(h->b[gate], h->bf16);
                const float *q = h->q + (bt * d.hk + hv / group) * d.dk;
                const float *k = h->k + (bt * d.hk + hv / group) * d.dk;
                for (int dv = 0; dv < d.dv; dv++) {
                    double *yy = y + gate * d.dv + dv;
                    if (mask != NULL && mask[bt] == 0) {
                        *yy = 0.0;
                        continue;
                    }
                    double *s = state + (((size_t)b * d.hv + hv) * d.dv + dv) * d.dk;
                    double kv = 0.0, out = 0.0;
                    for (int i = 0; i < d.dk; i++) {
                        s[i] *= g;
                        kv += s[i] * k[i];
                    }
                    double delta = (h->v[gate * d.dv + dv] - kv) * beta;
                    for (int i = 0; i < d.dk; i++) {
                        s[i] += k[i] * delta;
                        out += s[i] * q[i];
                    }
                    *yy = out;
                }
            }
        }
    }
}

Args upload(const Host *h) {
    Dims d = h->d;
    int32_t qk[4] = {d.b, d.t, d.hk, d.dk}, v[4] = {d.b, d.t, d.hv, d.dv}, g[3] = {d.b, d.t, d.hv};
    int32_t hv[1] = {d.hv};
    Args x;
    if (h->bf16) {
        x.q = new_bf16(h->q, n_qk(d), qk, 4);
        x.k = new_bf16(h->k, n_qk(d), qk, 4);
        x.v = new_bf16(h->v, n_v(d), v, 4);
        x.a = new_bf16(h->a, n_gate(d), g, 3);
        x.b = new_bf16(h->b, n_gate(d), g, 3);
        x.dt_bias = new_bf16(h->dt_bias, (size_t)d.hv, hv, 1);
    } else {
        x.q = new_f32(h->q, qk, 4);
        x.k = new_f32(h->k, qk, 4);
        x.v = new_f32(h->v, v, 4);
        x.a = new_f32(h->a, g, 3);
        x.b = new_f32(h->b, g, 3);
        x.dt_bias = new_f32(h->dt_bias, hv, 1);
    }
    x.a_log = new_f32(h->a_log, hv, 1);
    return x;
}

void free_args(Args *x) {
    mlxk_array *all[] = {x->q, x->k, x->v, x->a, x->b, x->a_log, x->dt_bias};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        free_ok(all[i]);
    }
}

Args upload_random(Dims d, int bf16, Host *h) {
    *h = host_random(d, bf16);
    return upload(h);
}

void free_inputs(Host *h, Args *x) {
    free_args(x);
    host_free(h);
}
