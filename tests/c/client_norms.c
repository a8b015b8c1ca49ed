/*
 * The C client test's checks of the norms: the gated RMSNorm and the head split
 * (mlxk_silu_rms_heads), each with its backward pass, against float64 references.
 */

#define _POSIX_C_SOURCE 200809L

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

static double ref_silu(double z) { return z / (1.0 + exp(-z)); }

/* Gated RMSNorm: out = silu(gate) * (weight * x * rsqrt(mean(x^2) + eps)), per row of D. */
void test_gated_rms_norm(void) {
    enum { ROWS = 6, D = 40 };
    const char *fn = "mlxk_gated_rms_norm";
    const float eps = 1e-6f;
    float x[ROWS * D], gate[ROWS * D], w[D];
    for (int i = 0; i < ROWS * D; i++) {
        x[i] = 2.0f * mlxkt_rng_sym(&rng);
        gate[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < D; i++) {
        w[i] = 1.0f + 0.5f * mlxkt_rng_sym(&rng);
    }
    int32_t xs[3] = {2, 3, D}, ws[1] = {D};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (bf16) {
            for (int i = 0; i < ROWS * D; i++) {
                x[i] = mlxkt_bf16_round(x[i]);
                gate[i] = mlxkt_bf16_round(gate[i]);
            }
            for (int i = 0; i < D; i++) {
                w[i] = mlxkt_bf16_round(w[i]);
            }
        }
        mlxk_array *xa = bf16 ? new_bf16(x, ROWS * D, xs, 3) : new_f32(x, xs, 3);
        mlxk_array *ga = bf16 ? new_bf16(gate, ROWS * D, xs, 3) : new_f32(gate, xs, 3);
        mlxk_array *wa = bf16 ? new_bf16(w, D, ws, 1) : new_f32(w, ws, 1);
        mlxk_array *out = NULL;
        CHECK_OK(mlxk_gated_rms_norm(xa, ga, wa, eps, &out));
        check_shape(out, xs, 3, bf16 ? MLXK_DTYPE_BFLOAT16 : MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
        double ref[ROWS * D];
        for (int r = 0; r < ROWS; r++) {
            double ss = 0.0;
            for (int i = 0; i < D; i++) {
                ss += (double)x[r * D + i] * x[r * D + i];
            }
            double inv = 1.0 / sqrt(ss / D + eps);
            for (int i = 0; i < D; i++) {
                ref[r * D + i] = ref_silu(gate[r * D + i]) * (w[i] * (x[r * D + i] * inv));
            }
        }
        float *got = mlxkt_read_floats(out, ROWS * D);
        /* float32: float32 rounding only; bfloat16: three roundings to bf16 on the way. */
        double err = rel_error(got, ref, ROWS * D), tol = bf16 ? 4.0 / 256 : 1e-5;
        CHECK(err <= tol);
        if (err > tol) {
            fprintf(stderr, "  gated_rms_norm (bf16 = %d): error %.3e\n", bf16, err);
        }
        free(got);
        free_ok(out);

        if (!bf16) {
            mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
            mlxk_array *bad = sentinel, *w_bf16 = NULL, *short_w = NULL, *g2 = NULL;
            int32_t s2[2] = {ROWS, D}, s5[1] = {5};
            CHECK_OK(mlxk_array_astype(wa, MLXK_DTYPE_BFLOAT16, &w_bf16));
            short_w = new_f32(w, s5, 1);
            g2 = new_f32(gate, s2, 2);
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, w_bf16, eps, &bad), MLXK_ERR_DTYPE, fn,
                         ": weight: dtype bfloat16");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, short_w, eps, &bad), MLXK_ERR_SHAPE, fn,
                         ": weight:");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, g2, wa, eps, &bad), MLXK_ERR_SHAPE, fn, ": gate:");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, wa, -1.0f, &bad), MLXK_ERR_INVALID_ARGUMENT, fn,
                         "eps");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, wa, (float)NAN, &bad),
                         MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
            EXPECT_ERROR(mlxk_gated_rms_norm(NULL, ga, wa, eps, &bad), MLXK_ERR_NULL_POINTER, fn,
                         ": x is NULL");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, NULL, wa, eps, &bad), MLXK_ERR_NULL_POINTER, fn,
                         ": gate is NULL");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, NULL, eps, &bad), MLXK_ERR_NULL_POINTER, fn,
                         ": weight is NULL");
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, wa, eps, NULL), MLXK_ERR_NULL_POINTER, fn,
                         ": out is NULL");
            free_ok(short_w);
            EXPECT_ERROR(mlxk_gated_rms_norm(xa, ga, short_w, eps, &bad), MLXK_ERR_INVALID_HANDLE,
                         fn, ": weight (0x");
            CHECK(bad == sentinel);
            free_ok(w_bf16);
            free_ok(g2);
        }
        free_ok(xa);
        free_ok(ga);
        free_ok(wa);
    }
}

/* A float64 loss of three inputs; `rest` holds its other arguments. */
typedef double (*loss3)(double *const in[3], const void *rest);

/* Checks three gradients (each read, then freed) against a central difference of `loss` along a
 * random direction per input (<grad, u> = dL/dt at t = 0 for in + t u); in[which] (counts[which]
 * values) starts as src[which], dir[which] is drawn here. */
static void check_along_directions(const char *fn, mlxk_array *grads[3],
                                   const float *const src[3], const int counts[3],
                                   double *const in[3], double *const dir[3], loss3 loss,
                                   const void *rest) {
    for (int which = 0; which < 3; which++) {
        for (int i = 0; i < counts[which]; i++) {
            in[which][i] = src[which][i];
            dir[which][i] = mlxkt_rng_sym(&rng);
        }
    }
    for (int which = 0; which < 3; which++) {
        float *got = mlxkt_read_floats(grads[which], (size_t)counts[which]);
        double along = 0.0, scale = 0.0;
        for (int i = 0; i < counts[which]; i++) {
            along += got[i] * dir[which][i];
            scale += fabs(got[i] * dir[which][i]);
        }
        const double h = 1e-6;
        double *p = in[which];
        for (int i = 0; i < counts[which]; i++) p[i] += h * dir[which][i];
        double up = loss(in, rest);
        for (int i = 0; i < counts[which]; i++) p[i] -= 2 * h * dir[which][i];
        double down = loss(in, rest);
        for (int i = 0; i < counts[which]; i++) p[i] += h * dir[which][i];
        double want = (up - down) / (2 * h);
        /* float32 gradients summed along u: a few float32 roundings of each term. */
        CHECK(fabs(along - want) <= 1e-5 * scale + 1e-7);
        if (fabs(along - want) > 1e-5 * scale + 1e-7) {
            fprintf(stderr, "  %s input %d: %.9g vs %.9g\n", fn, which, along, want);
        }
        free(got);
        free_ok(grads[which]);
    }
}

/* sum(g * gated_rms_norm(x, z, w)) in float64 over ROWS rows of D. */
static double norm_loss(const double *x, const double *z, const double *w, const float *g, int rows,
                        int d, double eps) {
    double total = 0.0;
    for (int r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int i = 0; i < d; i++) {
            ss += x[r * d + i] * x[r * d + i];
        }
        double inv = 1.0 / sqrt(ss / d + eps);
        for (int i = 0; i < d; i++) {
            total += g[r * d + i] * ref_silu(z[r * d + i]) * w[i] * x[r * d + i] * inv;
        }
    }
    return total;
}

struct norm_rest {
    const float *g;
    int rows, d;
    double eps;
};

static double norm_loss3(double *const in[3], const void *rest) {
    const struct norm_rest *r = rest;
    return norm_loss(in[0], in[1], in[2], r->g, r->rows, r->d, r->eps);
}

/* The gated norm's backward pass: each gradient against a central difference of the float64
 * loss along a random direction (<grad, u> = dL/dt at t = 0 for x + t u); NULL dout gives
 * zeros; its own arguments named when wrong. */
void test_gated_rms_norm_vjp(void) {
    enum { ROWS = 4, D = 48, N = ROWS * D };
    const char *fn = "mlxk_gated_rms_norm_vjp";
    const double eps = 1e-5;
    static float x[N], z[N], w[D], g[N];
    static double in[3][N], dir[3][N];
    for (int i = 0; i < N; i++) {
        x[i] = 2.0f * mlxkt_rng_sym(&rng);
        z[i] = 3.0f * mlxkt_rng_sym(&rng);
        g[i] = mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < D; i++) {
        w[i] = 1.0f + 0.5f * mlxkt_rng_sym(&rng);
    }
    int32_t xs[2] = {ROWS, D}, ws[1] = {D};
    mlxk_array *xa = new_f32(x, xs, 2), *za = new_f32(z, xs, 2), *wa = new_f32(w, ws, 1);
    mlxk_array *ga = new_f32(g, xs, 2);
    mlxk_array *grads[3] = {NULL, NULL, NULL};
    CHECK_OK(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, ga, &grads[0], &grads[1], &grads[2]));
    check_shape(grads[0], xs, 2, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    check_shape(grads[1], xs, 2, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    check_shape(grads[2], ws, 1, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    const int counts[3] = {N, N, D};
    const float *const src[3] = {x, z, w};
    const struct norm_rest rest = {g, ROWS, D, eps};
    check_along_directions(fn, grads, src, counts, (double *const[3]){in[0], in[1], in[2]},
                           (double *const[3]){dir[0], dir[1], dir[2]}, norm_loss3, &rest);
    CHECK_OK(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, NULL, &grads[0], &grads[1], &grads[2]));
    for (int which = 0; which < 3; which++) {
        float *got = mlxkt_read_floats(grads[which], (size_t)counts[which]);
        int zero = 1;
        for (int i = 0; i < counts[which]; i++) zero &= got[i] == 0.0f;
        CHECK(zero);
        free(got);
        free_ok(grads[which]);
    }
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o[3] = {sentinel, sentinel, sentinel};
    int32_t short_shape[2] = {ROWS, D - 1};
    mlxk_array *short_g = new_f32(g, short_shape, 2);
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, short_g, &o[0], &o[1], &o[2]),
                 MLXK_ERR_SHAPE, fn, ": dout: shape");
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, ga, &o[0], &o[0], &o[2]),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "dx and dgate");
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, (float)eps, ga, &o[0], &o[1], NULL),
                 MLXK_ERR_NULL_POINTER, fn, ": dweight is NULL");
    EXPECT_ERROR(mlxk_gated_rms_norm_vjp(xa, za, wa, -1.0f, ga, &o[0], &o[1], &o[2]),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    CHECK(o[0] == sentinel && o[1] == sentinel && o[2] == sentinel);
    free_ok(short_g);
    free_ok(xa);
    free_ok(za);
    free_ok(wa);
    free_ok(ga);
}

/* Head split of the conv output x [B, S, 2*Hk*Dk + Hv*Dv]: silu everywhere, q and k
 * RMS-normalized per head and scaled, v = silu. */
void test_silu_rms_heads(void) {
    enum { B = 2, S = 3, HK = 2, DK = 16, HV = 4, DV = 8, C = 2 * HK * DK + HV * DV };
    const char *fn = "mlxk_silu_rms_heads";
    const float eps = 1e-6f / DK;
    float x[B * S * C], qs[DK], ks[DK];
    for (int i = 0; i < B * S * C; i++) {
        x[i] = 3.0f * mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < DK; i++) {
        qs[i] = 1.0f / DK;
        ks[i] = 1.0f / sqrtf((float)DK);
    }
    int32_t xs[3] = {B, S, C}, ss[1] = {DK};
    int32_t qk_shape[4] = {B, S, HK, DK}, v_shape[4] = {B, S, HV, DV};
    mlxk_array *xa = new_f32(x, xs, 3), *qa = new_f32(qs, ss, 1), *ka = new_f32(ks, ss, 1);
    mlxk_array *q = NULL, *k = NULL, *v = NULL;
    CHECK_OK(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, eps, &q, &k, &v));
    check_shape(q, qk_shape, 4, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    check_shape(k, qk_shape, 4, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    check_shape(v, v_shape, 4, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    double qr[B * S * HK * DK], kr[B * S * HK * DK], vr[B * S * HV * DV];
    for (int bs = 0; bs < B * S; bs++) {
        const float *row = x + bs * C;
        for (int which = 0; which < 2; which++) {
            for (int h = 0; h < HK; h++) {
                const float *head = row + (which * HK + h) * DK;
                double ssum = 0.0;
                for (int i = 0; i < DK; i++) {
                    ssum += ref_silu(head[i]) * ref_silu(head[i]);
                }
                double inv = 1.0 / sqrt(ssum / DK + eps);
                for (int i = 0; i < DK; i++) {
                    double value = ref_silu(head[i]) * inv;
                    if (which == 0) {
                        qr[(bs * HK + h) * DK + i] = qs[i] * value;
                    } else {
                        kr[(bs * HK + h) * DK + i] = ks[i] * value;
                    }
                }
            }
        }
        for (int i = 0; i < HV * DV; i++) {
            vr[bs * HV * DV + i] = ref_silu(row[2 * HK * DK + i]);
        }
    }
    float *qg = mlxkt_read_floats(q, B * S * HK * DK), *kg = mlxkt_read_floats(k, B * S * HK * DK);
    float *vg = mlxkt_read_floats(v, B * S * HV * DV);
    CHECK(rel_error(qg, qr, B * S * HK * DK) <= 1e-5);
    CHECK(rel_error(kg, kr, B * S * HK * DK) <= 1e-5);
    CHECK(rel_error(vg, vr, B * S * HV * DV) <= 1e-5);
    free(qg);
    free(kg);
    free(vg);
    free_ok(q);
    free_ok(k);
    free_ok(v);

    /* Errors. */
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o1 = sentinel, *o2 = sentinel, *o3 = sentinel, *qs_bf16 = NULL, *x2 = NULL;
    int32_t x2s[2] = {B * S, C};
    x2 = new_f32(x, x2s, 2);
    CHECK_OK(mlxk_array_astype(qa, MLXK_DTYPE_BFLOAT16, &qs_bf16));
    EXPECT_ERROR(mlxk_silu_rms_heads(x2, qa, ka, HK, HV, DV, eps, &o1, &o2, &o3), MLXK_ERR_SHAPE,
                 fn, ": x: expected rank 3");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV + 1, eps, &o1, &o2, &o3), MLXK_ERR_SHAPE,
                 fn, ": x: dimension 2 (channels)");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qs_bf16, ka, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_DTYPE, fn, "q_scale");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, 0, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": key_heads is 0");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, -1, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": value_heads is -1");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, 0, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, ": value_width is 0");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, -eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, (float)INFINITY, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "eps");
    EXPECT_ERROR(mlxk_silu_rms_heads(NULL, qa, ka, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_NULL_POINTER, fn, ": x is NULL");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, NULL, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_NULL_POINTER, fn, ": k_scale is NULL");
    EXPECT_ERROR(mlxk_silu_rms_heads(xa, qa, ka, HK, HV, DV, eps, &o1, NULL, &o3),
                 MLXK_ERR_NULL_POINTER, fn, ": k is NULL");
    free_ok(x2);
    EXPECT_ERROR(mlxk_silu_rms_heads(x2, qa, ka, HK, HV, DV, eps, &o1, &o2, &o3),
                 MLXK_ERR_INVALID_HANDLE, fn, ": x (0x");
    CHECK(o1 == sentinel && o2 == sentinel && o3 == sentinel);
    free_ok(qs_bf16);
    free_ok(xa);
    free_ok(qa);
    free_ok(ka);
}

enum { SB = 2, SS = 2, SHK = 2, SDK = 12, SHV = 3, SDV = 5, SC = 2 * SHK * SDK + SHV * SDV };

/* sum(gq * q) + sum(gk * k) + sum(gv * v) of the head split in float64. */
static double split_loss(const double *x, const double *qs, const double *ks, const float *gq,
                         const float *gk, const float *gv, double eps) {
    double total = 0.0;
    for (int bs = 0; bs < SB * SS; bs++) {
        const double *row = x + bs * SC;
        for (int which = 0; which < 2; which++) {
            for (int h = 0; h < SHK; h++) {
                const double *head = row + (which * SHK + h) * SDK;
                double ssum = 0.0;
                for (int i = 0; i < SDK; i++) ssum += ref_silu(head[i]) * ref_silu(head[i]);
                double inv = 1.0 / sqrt(ssum / SDK + eps);
                const float *g = (which == 0 ? gq : gk) + (bs * SHK + h) * SDK;
                const double *scale = which == 0 ? qs : ks;
                for (int i = 0; i < SDK; i++) total += g[i] * scale[i] * ref_silu(head[i]) * inv;
            }
        }
        for (int i = 0; i < SHV * SDV; i++) {
            total += gv[bs * SHV * SDV + i] * ref_silu(row[2 * SHK * SDK + i]);
        }
    }
    return total;
}

struct split_rest {
    const float *gq, *gk, *gv;
    double eps;
};

static double split_loss3(double *const in[3], const void *rest) {
    const struct split_rest *r = rest;
    return split_loss(in[0], in[1], in[2], r->gq, r->gk, r->gv, r->eps);
}

/* The head split's backward pass: each gradient against a central difference of the float64
 * loss along a random direction; absent cotangents are zeros; its own arguments named. */
void test_silu_rms_heads_vjp(void) {
    enum { NX = SB * SS * SC, NQ = SB * SS * SHK * SDK, NV = SB * SS * SHV * SDV };
    const char *fn = "mlxk_silu_rms_heads_vjp";
    const double eps = 1e-4;
    static float x[NX], qs[SDK], ks[SDK], gq[NQ], gk[NQ], gv[NV];
    static double in[3][NX], dir[3][NX];
    for (int i = 0; i < NX; i++) x[i] = 3.0f * mlxkt_rng_sym(&rng);
    for (int i = 0; i < SDK; i++) {
        qs[i] = 0.5f + mlxkt_rng_sym(&rng);
        ks[i] = 0.5f + mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < NQ; i++) {
        gq[i] = mlxkt_rng_sym(&rng);
        gk[i] = mlxkt_rng_sym(&rng);
    }
    for (int i = 0; i < NV; i++) gv[i] = mlxkt_rng_sym(&rng);
    int32_t xs[3] = {SB, SS, SC}, ss[1] = {SDK};
    int32_t qk_shape[4] = {SB, SS, SHK, SDK}, v_shape[4] = {SB, SS, SHV, SDV};
    mlxk_array *xa = new_f32(x, xs, 3), *qa = new_f32(qs, ss, 1), *ka = new_f32(ks, ss, 1);
    mlxk_array *gqa = new_f32(gq, qk_shape, 4), *gka = new_f32(gk, qk_shape, 4);
    mlxk_array *gva = new_f32(gv, v_shape, 4);
    mlxk_array *grads[3] = {NULL, NULL, NULL};
    CHECK_OK(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gqa, gka, gva,
                                     &grads[0], &grads[1], &grads[2]));
    check_shape(grads[0], xs, 3, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    check_shape(grads[1], ss, 1, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    check_shape(grads[2], ss, 1, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);
    const int counts[3] = {NX, SDK, SDK};
    const float *const src[3] = {x, qs, ks};
    const struct split_rest rest = {gq, gk, gv, eps};
    check_along_directions(fn, grads, src, counts, (double *const[3]){in[0], in[1], in[2]},
                           (double *const[3]){dir[0], dir[1], dir[2]}, split_loss3, &rest);
    /* Only dv: the scales get zero gradients, x only on its v channels. */
    CHECK_OK(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, NULL, NULL, gva,
                                     &grads[0], &grads[1], &grads[2]));
    float *dx = mlxkt_read_floats(grads[0], NX);
    int qk_zero = 1, v_nonzero = 0;
    for (int bs = 0; bs < SB * SS; bs++) {
        for (int c = 0; c < SC; c++) {
            if (c < 2 * SHK * SDK) {
                qk_zero &= dx[bs * SC + c] == 0.0f;
            } else {
                v_nonzero |= dx[bs * SC + c] != 0.0f;
            }
        }
    }
    CHECK(qk_zero && v_nonzero);
    free(dx);
    for (int which = 1; which < 3; which++) {
        float *got = mlxkt_read_floats(grads[which], SDK);
        int zero = 1;
        for (int i = 0; i < SDK; i++) zero &= got[i] == 0.0f;
        CHECK(zero);
        free(got);
    }
    for (int which = 0; which < 3; which++) free_ok(grads[which]);
    mlxk_array *const sentinel = (mlxk_array *)(uintptr_t)0xDEADBEE0u;
    mlxk_array *o[3] = {sentinel, sentinel, sentinel};
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gva, gka, gva,
                                         &o[0], &o[1], &o[2]),
                 MLXK_ERR_SHAPE, fn, ": dq: dimension 2 (Hk)");
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV + 1, (float)eps, gqa, gka, gva,
                                         &o[0], &o[1], &o[2]),
                 MLXK_ERR_SHAPE, fn, ": x: dimension 2 (channels)");
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gqa, gka, gva,
                                         &o[0], &o[1], &o[1]),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "dq_scale and dk_scale");
    EXPECT_ERROR(mlxk_silu_rms_heads_vjp(xa, qa, ka, SHK, SHV, SDV, (float)eps, gqa, gka, gva,
                                         NULL, &o[1], &o[2]),
                 MLXK_ERR_NULL_POINTER, fn, ": dx is NULL");
    CHECK(o[0] == sentinel && o[1] == sentinel && o[2] == sentinel);
    mlxk_array *all[6] = {xa, qa, ka, gqa, gka, gva};
    for (int i = 0; i < 6; i++) free_ok(all[i]);
}
