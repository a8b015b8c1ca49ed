/*
 * The C client test's checks of the Gated DeltaNet recurrence: mlxk_compute_g, the update (and
 * its chunked form, its backward pass, its argument errors), the prefix replay
 * (mlxk_gated_delta_state) and the update from the conv output, against the float64 reference
 * of client_util.c.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

void test_compute_g(void) {
    enum { B = 2, T = 3, HV = 4 };
    float a[B * T * HV], a_log[HV], dt[HV];
    for (int i = 0; i < B * T * HV; i++) {
        a[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < HV; i++) {
        a_log[i] = (float)log(1.0 + 8.0 * (1.0 + mlxkt_rng_sym(&rng)));
        dt[i] = -3.0f + 2.0f * mlxkt_rng_sym(&rng);
    }
    int32_t gs[3] = {B, T, HV}, hs[1] = {HV};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (bf16) {
            for (int i = 0; i < B * T * HV; i++) {
                a[i] = mlxkt_bf16_round(a[i]);
            }
            for (int i = 0; i < HV; i++) {
                dt[i] = mlxkt_bf16_round(dt[i]);
            }
        }
        mlxk_array *la = new_f32(a_log, hs, 1);
        mlxk_array *aa = bf16 ? new_bf16(a, B * T * HV, gs, 3) : new_f32(a, gs, 3);
        mlxk_array *dd = bf16 ? new_bf16(dt, HV, hs, 1) : new_f32(dt, hs, 1);
        mlxk_array *g = NULL;
        CHECK_OK(mlxk_compute_g(la, aa, dd, &g));
        check_shape(g, gs, 3, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
        float *got = mlxkt_read_floats(g, B * T * HV);
        double ref[B * T * HV];
        for (int i = 0; i < B * T * HV; i++) {
            ref[i] = ref_g(a_log[i % HV], a[i], dt[i % HV], bf16);
        }
        double worst = 0.0;
        for (int i = 0; i < B * T * HV; i++) {
            double r = fabs(got[i] - ref[i]) / ref[i];
            worst = r > worst ? r : worst;
        }
        CHECK(worst < 1e-5);
        if (!(worst < 1e-5)) {
            fprintf(stderr, "  compute_g (bf16 = %d): max relative error %.3e\n", bf16, worst);
        }
        free(got);
        free_ok(g);

        if (!bf16) {
            /* Errors. */
            mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
            mlxk_array *out = sentinel;
            int32_t two[2] = {2, 2}, five[1] = {5};
            float zeros[8] = {0};
            int32_t ints[HV] = {0};
            mlxk_array *rank2 = new_f32(zeros, two, 2);
            mlxk_array *len5 = new_f32(zeros, five, 1);
            mlxk_array *scalar = new_f32(zeros, NULL, 0);
            mlxk_array *int_hv = NULL;
            CHECK_OK(mlxk_array_new(ints, hs, 1, MLXK_DTYPE_INT32, &int_hv));
            mlxk_array *int_a = NULL;
            CHECK_OK(mlxk_array_astype(aa, MLXK_DTYPE_INT32, &int_a));
            mlxk_array *f16_log = NULL;
            CHECK_OK(mlxk_array_astype(la, MLXK_DTYPE_FLOAT16, &f16_log));
            const char *fn = "mlxk_compute_g";
            EXPECT_ERROR(mlxk_compute_g(rank2, aa, dd, &out), MLXK_ERR_SHAPE, fn,
                         ": a_log: expected rank 1");
            /* Hv comes from a_log; a's last dimension must match it. */
            EXPECT_ERROR(mlxk_compute_g(len5, aa, dd, &out), MLXK_ERR_SHAPE, fn,
                         ": a: dimension 2 (Hv) is 4, expected 5 (Hv of a_log)");
            EXPECT_ERROR(mlxk_compute_g(int_hv, aa, dd, &out), MLXK_ERR_DTYPE, fn,
                         ": a_log: dtype int32");
            EXPECT_ERROR(mlxk_compute_g(f16_log, aa, dd, &out), MLXK_ERR_DTYPE, fn,
                         ": a_log: dtype float16");
            EXPECT_ERROR(mlxk_compute_g(la, aa, len5, &out), MLXK_ERR_SHAPE, fn,
                         ": dt_bias: dimension 0 (Hv) is 5");
            EXPECT_ERROR(mlxk_compute_g(la, aa, int_hv, &out), MLXK_ERR_DTYPE, fn,
                         ": dt_bias: dtype int32");
            EXPECT_ERROR(mlxk_compute_g(la, int_a, dd, &out), MLXK_ERR_DTYPE, fn, ": a: dtype int32");
            EXPECT_ERROR(mlxk_compute_g(la, scalar, dd, &out), MLXK_ERR_SHAPE, fn, ": a: expected rank");
            /* a [2, 2] says Hv = 2; a_log has 4. */
            EXPECT_ERROR(mlxk_compute_g(la, rank2, dd, &out), MLXK_ERR_SHAPE, fn,
                         ": a: dimension 1 (Hv) is 2, expected 4 (Hv of a_log)");
            EXPECT_ERROR(mlxk_compute_g(NULL, aa, dd, &out), MLXK_ERR_NULL_POINTER, fn,
                         ": a_log is NULL");
            EXPECT_ERROR(mlxk_compute_g(la, NULL, dd, &out), MLXK_ERR_NULL_POINTER, fn, ": a is NULL");
            EXPECT_ERROR(mlxk_compute_g(la, aa, NULL, &out), MLXK_ERR_NULL_POINTER, fn,
                         ": dt_bias is NULL");
            EXPECT_ERROR(mlxk_compute_g(la, aa, dd, NULL), MLXK_ERR_NULL_POINTER, fn, ": g is NULL");
            free_ok(len5);
            EXPECT_ERROR(mlxk_compute_g(la, aa, len5, &out), MLXK_ERR_INVALID_HANDLE, fn,
                         ": dt_bias (0x");
            CHECK(out == sentinel);
            free_ok(rank2);
            free_ok(scalar);
            free_ok(int_hv);
            free_ok(int_a);
            free_ok(f16_log);
        }
        free_ok(la);
        free_ok(aa);
        free_ok(dd);
    }
}

/* One update call against the reference; returns the library's state_out (caller frees) and
 * advances `ref_state` in place. `chunk` < 0: mlxk_gated_delta_update; else the chunked form
 * with that chunk size. */
static mlxk_array *run_update_with(const Host *h, const Args *x, const mlxk_array *state,
                                   const uint8_t *mask, double *ref_state, double y_tol,
                                   double state_tol, int chunk, int line) {
    Dims d = h->d;
    mlxk_array *mask_array = NULL;
    if (mask != NULL) {
        int32_t ms[2] = {d.b, d.t};
        CHECK_OK(mlxk_array_new(mask, ms, 2, MLXK_DTYPE_BOOL, &mask_array));
    }
    mlxk_array *y = NULL, *s = NULL;
    if (chunk < 0) {
        CHECK_OK(mlxk_gated_delta_update(x->q, x->k, x->v, x->a, x->b, x->a_log, x->dt_bias, state,
                                         mask_array, &y, &s));
    } else {
        CHECK_OK(mlxk_gated_delta_update_chunked(x->q, x->k, x->v, x->a, x->b, x->a_log, x->dt_bias,
                                                 state, mask_array, chunk, &y, &s));
    }
    free_ok(mask_array);
    int32_t ys[4] = {d.b, d.t, d.hv, d.dv}, ss[4] = {d.b, d.hv, d.dv, d.dk};
    check_shape(y, ys, 4, h->bf16 ? MLXK_DTYPE_BFLOAT16 : MLXK_DTYPE_FLOAT32, __FILE__, line);
    check_shape(s, ss, 4, MLXK_DTYPE_FLOAT32, __FILE__, line);

    double *y_ref = mlxkt_xmalloc(n_v(d) * sizeof *y_ref);
    if (y_ref == NULL) {
        exit(1);
    }
    ref_update(h, mask, ref_state, y_ref);
    float *y_got = mlxkt_read_floats(y, n_v(d));
    float *s_got = mlxkt_read_floats(s, n_state(d));
    double ye = rel_error(y_got, y_ref, n_v(d));
    double se = rel_error(s_got, ref_state, n_state(d));
    mlxkt_check_at(ye <= y_tol, "y matches the float64 reference", __FILE__, line);
    mlxkt_check_at(se <= state_tol, "state_out matches the float64 reference", __FILE__, line);
    if (ye > y_tol || se > state_tol) {
        fprintf(stderr, "  y error %.3e (tolerance %.1e), state error %.3e (tolerance %.1e)\n", ye,
                y_tol, se, state_tol);
    }
    if (mask != NULL) {
        int zero = 1;
        for (size_t bt = 0; bt < (size_t)d.b * d.t; bt++) {
            for (size_t j = 0; mask[bt] == 0 && j < (size_t)d.hv * d.dv; j++) {
                zero &= y_got[bt * d.hv * d.dv + j] == 0.0f;
            }
        }
        mlxkt_check_at(zero, "y is exactly 0 at masked tokens", __FILE__, line);
    }
    free(y_ref);
    free(y_got);
    free(s_got);
    free_ok(y);
    return s;
}

/* run_update_with on fresh random inputs of dims `d` (drawn, uploaded and freed here). */
static mlxk_array *run_fresh(Dims d, int bf16, const mlxk_array *state, const uint8_t *mask,
                             double *ref_state, double y_tol, double state_tol, int chunk,
                             int line) {
    Host h;
    Args x = upload_random(d, bf16, &h);
    mlxk_array *s = run_update_with(&h, &x, state, mask, ref_state, y_tol, state_tol, chunk, line);
    free_inputs(&h, &x);
    return s;
}

/* The chunked form against the same float64 reference: a prefill longer than a chunk, then a
 * second call with a mask carrying the state on; bad chunk sizes are refused by name. */
void test_gated_delta_update_chunked(void) {
    Dims d = {2, 70, 2, 4, 64, 16};
    double *ref_state = calloc(n_state(d), sizeof(double));
    Host h1;
    Args x1 = upload_random(d, 0, &h1);
    mlxk_array *s1 = run_update_with(&h1, &x1, NULL, NULL, ref_state, 1e-5, 1e-5, 0, __LINE__);
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    int bad_chunks[4] = {8, -16, 24, 256};
    for (int i = 0; i < 4; i++) {
        mlxk_array *y = sentinel, *s = sentinel;
        EXPECT_ERROR(mlxk_gated_delta_update_chunked(x1.q, x1.k, x1.v, x1.a, x1.b, x1.a_log,
                                                     x1.dt_bias, NULL, NULL, bad_chunks[i], &y,
                                                     &s),
                     MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_delta_update_chunked", "chunk_size");
        CHECK(y == sentinel && s == sentinel);
    }
    free_inputs(&h1, &x1);

    Dims d2 = d;
    d2.t = 40;
    uint8_t mask[80];
    for (int i = 0; i < 80; i++) {
        mask[i] = (uint8_t)(i % 7 != 3 && i < 75);
    }
    mlxk_array *s2 = run_fresh(d2, 0, s1, mask, ref_state, 1e-5, 1e-5, 16, __LINE__);
    free_ok(s1);
    free_ok(s2);
    free(ref_state);
}

/* The update's backward pass: eight gradients of the inputs' shapes, finite, and zero when no
 * cotangent is given; its own arguments named when wrong. */
void test_gated_delta_update_vjp(void) {
    Dims d = {1, 6, 1, 2, 32, 4};
    Host h;
    Args x = upload_random(d, 0, &h);
    int32_t dy_shape[4] = {1, 6, 2, 4};
    float dy_data[48];
    for (int i = 0; i < 48; i++) dy_data[i] = (float)((i % 7) - 3) * 0.25f;
    mlxk_array *dy = new_f32(dy_data, dy_shape, 4);
    mlxk_array *g[8] = {NULL};
    CHECK_OK(mlxk_gated_delta_update_vjp(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         dy, NULL, &g[0], &g[1], &g[2], &g[3], &g[4], &g[5],
                                         &g[6], &g[7]));
    size_t want_ndim[8] = {4, 4, 4, 3, 3, 1, 1, 4};
    for (int i = 0; i < 8; i++) {
        size_t ndim = 0;
        CHECK_OK(mlxk_array_ndim(g[i], &ndim));
        CHECK(ndim == want_ndim[i]);
        mlxk_array *f = NULL;
        CHECK_OK(mlxk_array_astype(g[i], MLXK_DTYPE_FLOAT32, &f));
        size_t n = 0;
        CHECK_OK(mlxk_array_nbytes(f, &n));
        float *values = mlxkt_read_floats(f, n / 4);
        int finite = 1;
        for (size_t j = 0; j < n / 4; j++) finite &= isfinite(values[j]) != 0;
        CHECK(finite);
        free(values);
        free_ok(f);
        free_ok(g[i]);
    }
    int32_t bad_shape[4] = {1, 6, 2, 5};
    float bad_data[60] = {0};
    mlxk_array *bad = new_f32(bad_data, bad_shape, 4);
    EXPECT_ERROR(mlxk_gated_delta_update_vjp(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL,
                                             NULL, bad, NULL, &g[0], &g[1], &g[2], &g[3], &g[4],
                                             &g[5], &g[6], &g[7]),
                 MLXK_ERR_SHAPE, "mlxk_gated_delta_update_vjp", "dy");
    free_ok(bad);
    free_ok(dy);
    free_inputs(&h, &x);
}

/* The chunked form's backward pass: the gradients of mlxk_gated_delta_update_vjp up to float32
 * rounding (both read back as float32), and its chunk size named when wrong. */
void test_gated_delta_update_chunked_vjp(void) {
    Dims d = {1, 21, 1, 2, 32, 5};
    Host h;
    Args x = upload_random(d, 0, &h);
    int32_t dy_shape[4] = {1, 21, 2, 5};
    float dy_data[210];
    for (int i = 0; i < 210; i++) dy_data[i] = (float)((i * 7) % 11 - 5) * 0.2f;
    mlxk_array *dy = new_f32(dy_data, dy_shape, 4);
    mlxk_array *e[8] = {NULL}, *c[8] = {NULL};
    CHECK_OK(mlxk_gated_delta_update_vjp(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         dy, NULL, &e[0], &e[1], &e[2], &e[3], &e[4], &e[5],
                                         &e[6], &e[7]));
    CHECK_OK(mlxk_gated_delta_update_chunked_vjp(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias,
                                                 NULL, NULL, 16, dy, NULL, &c[0], &c[1], &c[2],
                                                 &c[3], &c[4], &c[5], &c[6], &c[7]));
    for (int i = 0; i < 8; i++) {
        mlxk_array *fe = NULL, *fc = NULL;
        CHECK_OK(mlxk_array_astype(e[i], MLXK_DTYPE_FLOAT32, &fe));
        CHECK_OK(mlxk_array_astype(c[i], MLXK_DTYPE_FLOAT32, &fc));
        size_t n = 0, m = 0;
        CHECK_OK(mlxk_array_nbytes(fe, &n));
        CHECK_OK(mlxk_array_nbytes(fc, &m));
        CHECK(n == m);
        float *ve = mlxkt_read_floats(fe, n / 4), *vc = mlxkt_read_floats(fc, n / 4);
        float scale = 1e-30f, err = 0.0f;
        for (size_t j = 0; j < n / 4; j++) {
            scale = fmaxf(scale, fabsf(ve[j]));
            err = fmaxf(err, fabsf(ve[j] - vc[j]));
        }
        CHECK(err <= 1e-4f * scale); /* float32 rounding of sums over 21 tokens */
        free(ve);
        free(vc);
        free_ok(fe);
        free_ok(fc);
        free_ok(e[i]);
        free_ok(c[i]);
    }
    EXPECT_ERROR(mlxk_gated_delta_update_chunked_vjp(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias,
                                                     NULL, NULL, 24, dy, NULL, &c[0], &c[1], &c[2],
                                                     &c[3], &c[4], &c[5], &c[6], &c[7]),
                 MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_delta_update_chunked_vjp", "chunk_size");
    free_ok(dy);
    free_inputs(&h, &x);
}

void test_gated_delta_update(void) {
    /* f32, B = 2, T = 5, Hv/Hk = 2, Dk = 64, Dv = 16: no state, no mask. */
    Dims d = {2, 5, 2, 4, 64, 16};
    double *ref_state = calloc(n_state(d), sizeof(double));
    mlxk_array *s1 = run_fresh(d, 0, NULL, NULL, ref_state, 1e-5, 1e-5, -1, __LINE__);

    /* Carrying the state, with a mask (row 0 pads its first two tokens, row 1 its last). */
    uint8_t mask[10] = {0, 0, 1, 1, 1, 1, 1, 1, 1, 0};
    float *s1_before = mlxkt_read_floats(s1, n_state(d));
    mlxk_array *s2 = run_fresh(d, 0, s1, mask, ref_state, 1e-5, 1e-5, -1, __LINE__);
    /* s1 is still a live handle, so the kernel must not have written into it. */
    float *s1_after = mlxkt_read_floats(s1, n_state(d));
    CHECK(memcmp(s1_before, s1_after, n_state(d) * sizeof(float)) == 0);
    free(s1_before);
    free(s1_after);
    free_ok(s1);

    /* Decode loop, T = 1: the old state is freed before the new one is evaluated (in place). */
    Dims d1 = d;
    d1.t = 1;
    mlxk_array *state = s2;
    for (int step = 0; step < 4; step++) {
        Host h;
        Args x = upload_random(d1, 0, &h);
        mlxk_array *y = NULL, *next = NULL;
        CHECK_OK(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state, NULL,
                                         &y, &next));
        free_ok(state);
        state = next;
        free_args(&x); /* lazy results keep what they need */
        double y_ref[2 * 4 * 16];
        ref_update(&h, NULL, ref_state, y_ref);
        CHECK_OK(mlxk_array_eval(state));
        float *yg = mlxkt_read_floats(y, n_v(d1));
        float *sg = mlxkt_read_floats(state, n_state(d1));
        CHECK(rel_error(yg, y_ref, n_v(d1)) <= 1e-5);
        CHECK(rel_error(sg, ref_state, n_state(d1)) <= 1e-5);
        free(yg);
        free(sg);
        free_ok(y);
        host_free(&h);
    }
    free_ok(state);
    free(ref_state);

    /* bfloat16 q, k, v, a, b, dt_bias; Hv/Hk = 3, Dk = 32, Dv = 8; all-true mask. y is bf16:
     * allow 2 bf16 ulps of its scale. */
    Dims db = {1, 4, 1, 3, 32, 8};
    double *rs = calloc(n_state(db), sizeof(double));
    uint8_t all[4] = {1, 1, 1, 1};
    mlxk_array *sb = run_fresh(db, 1, NULL, all, rs, 2.0 / 128, 1e-5, -1, __LINE__);
    free_ok(sb);
    free(rs);
}

void test_gated_delta_errors(void) {
    Dims d = {2, 3, 2, 4, 32, 8};
    Host h;
    Args x = upload_random(d, 0, &h);
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *y = sentinel, *s = sentinel;
    const char *fn = "mlxk_gated_delta_update";

    /* Wrong-shaped and wrong-typed companions. */
    float zeros[4096] = {0};
    int32_t r3[3] = {2, 3, 2};
    int32_t dk48[4] = {2, 3, 2, 48}, hv3[4] = {2, 3, 3, 8}, vb1[4] = {1, 3, 4, 8};
    int32_t g_t2[3] = {2, 2, 4}, hv5[1] = {5};
    int32_t st_ok[4] = {2, 4, 8, 32}, st_bad[4] = {2, 4, 8, 64};
    int32_t m_ok[2] = {2, 3}, m_bad[2] = {2, 4};
    mlxk_array *q_rank3 = new_f32(zeros, r3, 3);
    mlxk_array *q_dk48 = new_f32(zeros, dk48, 4);
    mlxk_array *v_hv3 = new_f32(zeros, hv3, 4);
    mlxk_array *v_b1 = new_f32(zeros, vb1, 4);
    mlxk_array *a_t2 = new_f32(zeros, g_t2, 3);
    mlxk_array *len5 = new_f32(zeros, hv5, 1);
    mlxk_array *state_bad = new_f32(zeros, st_bad, 4);
    mlxk_array *mask_bad_shape = NULL, *mask_f32 = new_f32(zeros, m_ok, 2);
    uint8_t mbytes[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    CHECK_OK(mlxk_array_new(mbytes, m_bad, 2, MLXK_DTYPE_BOOL, &mask_bad_shape));
    mlxk_array *state_ok = NULL, *state_bf16 = NULL, *k_bf16 = NULL, *b_int = NULL,
               *dt_int = NULL, *k_dk48 = NULL;
    CHECK_OK(mlxk_array_zeros(st_ok, 4, MLXK_DTYPE_FLOAT32, &state_ok));
    CHECK_OK(mlxk_array_astype(state_ok, MLXK_DTYPE_BFLOAT16, &state_bf16));
    CHECK_OK(mlxk_array_astype(x.k, MLXK_DTYPE_BFLOAT16, &k_bf16));
    CHECK_OK(mlxk_array_astype(x.b, MLXK_DTYPE_INT32, &b_int));
    CHECK_OK(mlxk_array_astype(x.dt_bias, MLXK_DTYPE_INT32, &dt_int));
    CHECK_OK(mlxk_array_astype(q_dk48, MLXK_DTYPE_FLOAT32, &k_dk48));

#define UPD(q, k, v, a, b, al, dt, st, m) \
    mlxk_gated_delta_update((q), (k), (v), (a), (b), (al), (dt), (st), (m), &y, &s)

    EXPECT_ERROR(UPD(q_rank3, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE,
                 fn, ": q: expected rank 4");
    EXPECT_ERROR(UPD(x.q, q_rank3, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE,
                 fn, ": k: expected rank 4");
    EXPECT_ERROR(UPD(q_dk48, k_dk48, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_SHAPE, fn, ": q: Dk (dimension 3) is 48");
    EXPECT_ERROR(UPD(x.q, k_bf16, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_DTYPE, fn,
                 ": k: dtype bfloat16");
    EXPECT_ERROR(UPD(x.q, x.k, v_hv3, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": v: Hv (dimension 2) is 3");
    EXPECT_ERROR(UPD(x.q, x.k, v_b1, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": v: dimension 0 (B)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, a_t2, x.b, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": a: dimension 1 (T)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, a_t2, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": b: dimension 1 (T)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, b_int, x.a_log, x.dt_bias, NULL, NULL), MLXK_ERR_DTYPE, fn,
                 ": b: dtype int32");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, len5, x.dt_bias, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": a_log: dimension 0 (Hv)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, len5, NULL, NULL), MLXK_ERR_SHAPE, fn,
                 ": dt_bias: dimension 0 (Hv)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, dt_int, NULL, NULL), MLXK_ERR_DTYPE, fn,
                 ": dt_bias: dtype int32");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_bf16, NULL), MLXK_ERR_DTYPE,
                 fn, ": state: dtype bfloat16");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_bad, NULL), MLXK_ERR_SHAPE,
                 fn, ": state: dimension 3 (Dk)");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, mask_f32), MLXK_ERR_DTYPE,
                 fn, ": mask: dtype float32");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, mask_bad_shape),
                 MLXK_ERR_SHAPE, fn, ": mask: dimension 1 (T)");

    /* NULL where not allowed. */
    EXPECT_ERROR(UPD(NULL, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": q is NULL");
    EXPECT_ERROR(UPD(x.q, x.k, NULL, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": v is NULL");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, NULL, NULL, NULL), MLXK_ERR_NULL_POINTER, fn,
                 ": dt_bias is NULL");
    EXPECT_ERROR(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         NULL, &s),
                 MLXK_ERR_NULL_POINTER, fn, ": y is NULL");
    EXPECT_ERROR(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         &y, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": state_out is NULL");
    EXPECT_ERROR(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL,
                                         &y, &y),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": y and state_out");

    /* Dead and foreign handles. */
    int on_stack = 0;
    mlxk_array *stack_handle = (mlxk_array *)(void *)&on_stack;
    EXPECT_ERROR(UPD(x.q, x.k, stack_handle, x.a, x.b, x.a_log, x.dt_bias, NULL, NULL),
                 MLXK_ERR_INVALID_HANDLE, fn, ": v (0x");
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, stack_handle),
                 MLXK_ERR_INVALID_HANDLE, fn, ": mask (0x");
    free_ok(state_bad);
    EXPECT_ERROR(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_bad, NULL),
                 MLXK_ERR_INVALID_HANDLE, fn, ": state (0x");
    CHECK(on_stack == 0);
    CHECK(y == sentinel && s == sentinel);

    /* Still works after all that. */
    CHECK_OK(UPD(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, state_ok, NULL));
    CHECK_OK(mlxk_array_eval(y));
    free_ok(y);
    free_ok(s);
#undef UPD

    free_ok(q_rank3);
    free_ok(q_dk48);
    free_ok(v_hv3);
    free_ok(v_b1);
    free_ok(a_t2);
    free_ok(len5);
    free_ok(mask_bad_shape);
    free_ok(mask_f32);
    free_ok(state_ok);
    free_ok(state_bf16);
    free_ok(k_bf16);
    free_ok(b_int);
    free_ok(dt_int);
    free_ok(k_dk48);
    free_inputs(&h, &x);
}

/* Prefix replay: each row's state after its accepted prefix, bit-identical to the update's
 * state_out over the same tokens (here: the update with the rejected tokens masked out, which
 * leaves the state untouched at those tokens). */
void test_gated_delta_state(void) {
    Dims d = {3, 4, 2, 4, 32, 8};
    const char *fn = "mlxk_gated_delta_state";
    Host h0 = host_random(d, 0), h = host_random(d, 0);
    Args x0 = upload(&h0), x = upload(&h);
    mlxk_array *y0 = NULL, *s0 = NULL;
    CHECK_OK(mlxk_gated_delta_update(x0.q, x0.k, x0.v, x0.a, x0.b, x0.a_log, x0.dt_bias, NULL, NULL,
                                     &y0, &s0));
    free_ok(y0);

    int32_t lengths[3] = {4, 0, 2};
    uint8_t mask[12] = {1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0};
    int32_t ms[2] = {d.b, d.t};
    mlxk_array *mask_array = NULL, *y = NULL, *s_update = NULL, *s_replay = NULL;
    CHECK_OK(mlxk_array_new(mask, ms, 2, MLXK_DTYPE_BOOL, &mask_array));
    CHECK_OK(mlxk_gated_delta_update(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, mask_array,
                                     &y, &s_update));
    CHECK_OK(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3,
                                    &s_replay));
    int32_t ss[4] = {d.b, d.hv, d.dv, d.dk};
    check_shape(s_replay, ss, 4, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    float *su = mlxkt_read_floats(s_update, n_state(d));
    float *sr = mlxkt_read_floats(s_replay, n_state(d));
    float *start = mlxkt_read_floats(s0, n_state(d));
    CHECK(memcmp(su, sr, n_state(d) * sizeof(float)) == 0);
    size_t row = n_state(d) / (size_t)d.b;
    CHECK(memcmp(sr + row, start + row, row * sizeof(float)) == 0); /* length 0: untouched */
    CHECK(memcmp(sr, start, row * sizeof(float)) != 0);
    /* And against the float64 reference. */
    double *ref = mlxkt_xmalloc(n_state(d) * sizeof *ref);
    double *yref = mlxkt_xmalloc(n_v(d) * sizeof *yref);
    if (ref == NULL || yref == NULL) {
        exit(1);
    }
    for (size_t i = 0; i < n_state(d); i++) {
        ref[i] = start[i];
    }
    ref_update(&h, mask, ref, yref);
    CHECK(rel_error(sr, ref, n_state(d)) <= 1e-5);
    free(ref);
    free(yref);
    free(su);
    free(sr);
    free(start);
    free_ok(s_replay);
    free_ok(s_update);
    free_ok(y);
    free_ok(mask_array);

    /* No state: from zeros; all lengths 0 gives zeros. */
    int32_t none[3] = {0, 0, 0};
    CHECK_OK(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, NULL, none, 3,
                                    &s_replay));
    float *z = mlxkt_read_floats(s_replay, n_state(d));
    int all_zero = 1;
    for (size_t i = 0; i < n_state(d); i++) {
        all_zero &= z[i] == 0.0f;
    }
    CHECK(all_zero);
    free(z);
    free_ok(s_replay);

    /* Errors. */
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *out = sentinel;
    int32_t too_long[3] = {4, 5, 0}, negative[3] = {-1, 0, 0};
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 2, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths: n_lengths is 2");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, too_long, 3, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths[1] is 5");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, negative, 3, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths[0] is -1");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, NULL, 3, &out),
                 MLXK_ERR_NULL_POINTER, fn, ": accepted_lengths is NULL");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3, NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": state_out is NULL");
    EXPECT_ERROR(mlxk_gated_delta_state(NULL, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3, &out),
                 MLXK_ERR_NULL_POINTER, fn, ": k is NULL");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, s0, NULL, 0, &out),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": accepted_lengths: n_lengths is 0");
    EXPECT_ERROR(mlxk_gated_delta_state(x.v, x.k, x.a, x.b, x.a_log, x.dt_bias, s0, lengths, 3, &out),
                 MLXK_ERR_SHAPE, fn, ": v:");
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.q, lengths, 3, &out),
                 MLXK_ERR_SHAPE, fn, ": state:");
    mlxk_array *dead = NULL;
    CHECK_OK(mlxk_array_astype(x.b, MLXK_DTYPE_FLOAT16, &dead));
    free_ok(dead);
    EXPECT_ERROR(mlxk_gated_delta_state(x.k, x.v, x.a, dead, x.a_log, x.dt_bias, s0, lengths, 3, &out),
                 MLXK_ERR_INVALID_HANDLE, fn, ": b (0x");
    CHECK(out == sentinel);

    free_ok(s0);
    free_args(&x0);
    free_inputs(&h0, &x);
    host_free(&h);
}

/* The head split and the update in one call: the bits of mlxk_silu_rms_heads followed by
 * mlxk_gated_delta_update (float32, GQA 2, a mask, a given state), and its argument errors. */
void test_gated_delta_update_from_conv(void) {
    enum { B = 2, T = 3, HK = 1, HV = 2, DK = 32, DV = 5, C = 2 * HK * DK + HV * DV };
    const char *fn = "mlxk_gated_delta_update_from_conv";
    const float eps = 1e-6f / DK;
    float x[B * T * C], qs[DK], ks[DK], a[B * T * HV], b[B * T * HV], a_log[HV], dt[HV];
    float st[B * HV * DV * DK];
    for (int i = 0; i < B * T * C; i++) x[i] = 3.0f * mlxkt_rng_sym(&rng);
    for (int i = 0; i < DK; i++) {
        qs[i] = (1.0f + 0.5f * mlxkt_rng_sym(&rng)) / DK;
        ks[i] = (1.0f + 0.5f * mlxkt_rng_sym(&rng)) / sqrtf((float)DK);
    }
    for (int i = 0; i < B * T * HV; i++) {
        a[i] = 2.0f * mlxkt_rng_sym(&rng);
        b[i] = 2.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < HV; i++) {
        a_log[i] = mlxkt_rng_sym(&rng);
        dt[i] = mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < B * HV * DV * DK; i++) st[i] = 0.5f * mlxkt_rng_sym(&rng);
    const bool mask[B * T] = {true, true, false, true, false, true};
    int32_t xs[3] = {B, T, C}, ss[1] = {DK}, gs[3] = {B, T, HV}, hs[1] = {HV};
    int32_t sts[4] = {B, HV, DV, DK}, ms[2] = {B, T};
    int32_t y_shape[4] = {B, T, HV, DV};
    mlxk_array *xa = new_f32(x, xs, 3), *qa = new_f32(qs, ss, 1), *ka = new_f32(ks, ss, 1);
    mlxk_array *aa = new_f32(a, gs, 3), *ba = new_f32(b, gs, 3), *la = new_f32(a_log, hs, 1);
    mlxk_array *da = new_f32(dt, hs, 1), *sa = new_f32(st, sts, 4), *ma = NULL;
    CHECK_OK(mlxk_array_new(mask, ms, 2, MLXK_DTYPE_BOOL, &ma));
    mlxk_array *y = NULL, *s = NULL;
    CHECK_OK(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, aa, ba, la, da, sa, ma,
                                               &y, &s));
    check_shape(y, y_shape, 4, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    check_shape(s, sts, 4, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    mlxk_array *q = NULL, *k = NULL, *v = NULL, *y2 = NULL, *s2 = NULL;
    CHECK_OK(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, eps, &q, &k, &v));
    CHECK_OK(mlxk_gated_delta_update(q, k, v, aa, ba, la, da, sa, ma, &y2, &s2));
    float *yg = mlxkt_read_floats(y, B * T * HV * DV), *yr = mlxkt_read_floats(y2, B * T * HV * DV);
    float *sg = mlxkt_read_floats(s, B * HV * DV * DK), *sr = mlxkt_read_floats(s2, B * HV * DV * DK);
    CHECK(memcmp(yg, yr, sizeof(float) * B * T * HV * DV) == 0);
    CHECK(memcmp(sg, sr, sizeof(float) * B * HV * DV * DK) == 0);
    int moved = 0;
    for (int i = 0; i < B * HV * DV * DK; i++) moved += sg[i] != st[i];
    CHECK(moved > 0);
    free(yg);
    free(yr);
    free(sg);
    free(sr);
    free_ok(q);
    free_ok(k);
    free_ok(v);
    free_ok(y);
    free_ok(s);
    free_ok(y2);
    free_ok(s2);

    /* Errors name this call's arguments. */
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o1 = sentinel, *o2 = sentinel;
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(NULL, qa, ka, HK, HV, DV, eps, aa, ba, la, da,
                                                   sa, ma, &o1, &o2),
                 MLXK_ERR_NULL_POINTER, fn, "x");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV + 1, eps, aa, ba, la, da,
                                                   sa, ma, &o1, &o2),
                 MLXK_ERR_SHAPE, fn, ": x: dimension 2 (channels)");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, ba, aa, la, da,
                                                   ma, ma, &o1, &o2),
                 MLXK_ERR_SHAPE, fn, ": state: expected rank 4");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, xa, ba, la, da, sa,
                                                   ma, &o1, &o2),
                 MLXK_ERR_SHAPE, fn, ": a: dimension 2 (Hv)");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, -1.0f, aa, ba, la, da,
                                                   sa, ma, &o1, &o2),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    EXPECT_ERROR(mlxk_gated_delta_update_from_conv(xa, qa, ka, HK, HV, DV, eps, aa, ba, la, da, sa,
                                                   ma, &o1, &o1),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "y and state_out");
    CHECK(o1 == sentinel && o2 == sentinel);
    mlxk_array *all[] = {xa, qa, ka, aa, ba, la, da, sa, ma};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free_ok(all[i]);
}
