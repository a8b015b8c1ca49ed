/*
 * The pool and packed calls from C: each row's y and state against the float64 reference from
 * its slot's state (zeros when fresh), padding rows zero, slots not named untouched; the
 * verify's y equal to the update's; the commit equal to mlxk_gated_delta_state on the gathered
 * states; the chunked, packed and from-conv forms against the dense calls bit for bit; the tree
 * verify and commit against chain verifies and commits bit for bit; the argument errors by name.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"

enum { N_POOL = 5, B_ROWS = 3 };

/* The gathered start states [B, Hv, Dv, Dk] of `slots` from `pool` (zeros where fresh or
 * padding), as floats. */
static float *gather(const float *pool, const int32_t *slots, const uint8_t *fresh, size_t rows,
                     size_t per) {
    float *out = alloc_floats(rows * per);
    for (size_t r = 0; r < rows; r++) {
        if (slots[r] >= 0 && (fresh == NULL || fresh[r] == 0)) {
            memcpy(out + r * per, pool + (size_t)slots[r] * per, per * sizeof(float));
        } else {
            memset(out + r * per, 0, per * sizeof(float));
        }
    }
    return out;
}

static int same_bits(const mlxk_array *a, const mlxk_array *b, size_t nbytes) {
    unsigned char *x = malloc(nbytes + 1), *y = malloc(nbytes + 1);
    int same = x != NULL && y != NULL && mlxk_array_read(a, x, nbytes) == MLXK_OK &&
               mlxk_array_read(b, y, nbytes) == MLXK_OK && memcmp(x, y, nbytes) == 0;
    free(x);
    free(y);
    return same;
}

/* n random values in [-0.5, 0.5) (a pool's states), to free. */
static float *random_values(size_t n) {
    float *values = alloc_floats(n);
    for (size_t i = 0; i < n; i++) {
        values[i] = (float)mlxkt_rng_uniform(&rng) - 0.5f;
    }
    return values;
}

/* mlxk_gated_delta_update_pool, its chunked form, the verify and the commit. */
static void check_pool_calls(void) {
    Dims d = {B_ROWS, 4, 1, 2, 32, 5};
    size_t per = (size_t)d.hv * d.dv * d.dk;
    Host h = host_random(d, 1);
    Args x = upload(&h);
    float *pool = random_values(N_POOL * per);
    int32_t pool_shape[4] = {N_POOL, d.hv, d.dv, d.dk};
    int32_t slots[B_ROWS] = {3, -1, 0};
    uint8_t fresh[B_ROWS] = {0, 0, 1};
    mlxk_array *p = new_f32(pool, pool_shape, 4);
    mlxk_array *y = NULL, *p2 = NULL;
    CHECK_OK(mlxk_gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p, slots,
                                          fresh, B_ROWS, NULL, &y, &p2));
    free_ok(p); /* given up before the eval: the kernel writes into its buffer */
    int32_t ys[4] = {d.b, d.t, d.hv, d.dv};
    check_shape(y, ys, 4, MLXK_DTYPE_BFLOAT16, __FILE__, __LINE__);
    check_shape(p2, pool_shape, 4, MLXK_DTYPE_FLOAT32, __FILE__, __LINE__);

    /* The float64 reference from the gathered states. */
    float *start = gather(pool, slots, fresh, B_ROWS, per);
    double *ref_state = malloc(B_ROWS * per * sizeof(double));
    double *y_ref = malloc(n_v(d) * sizeof(double));
    for (size_t i = 0; i < B_ROWS * per; i++) {
        ref_state[i] = start[i];
    }
    ref_update(&h, NULL, ref_state, y_ref);
    float *y_got = mlxkt_read_floats(y, n_v(d));
    float *p_got = mlxkt_read_floats(p2, N_POOL * per);
    size_t y_row = (size_t)d.t * d.hv * d.dv;
    for (size_t r = 0; r < B_ROWS; r++) {
        if (slots[r] < 0) {
            int zero = 1;
            for (size_t i = 0; i < y_row; i++) {
                zero &= y_got[r * y_row + i] == 0.0f;
            }
            CHECK(zero);
            continue;
        }
        CHECK(rel_error(y_got + r * y_row, y_ref + r * y_row, y_row) <= 2.0 / 128);
        CHECK(rel_error(p_got + (size_t)slots[r] * per, ref_state + r * per, per) <= 1e-5);
    }
    /* Slots 1, 2 and 4 are not named: their bits are the pool's. */
    CHECK(memcmp(p_got + 1 * per, pool + 1 * per, 2 * per * sizeof(float)) == 0);
    CHECK(memcmp(p_got + 4 * per, pool + 4 * per, per * sizeof(float)) == 0);

    /* The verify: the update's y, the pool only read. */
    mlxk_array *kept = new_f32(pool, pool_shape, 4);
    mlxk_array *yv = NULL;
    CHECK_OK(mlxk_gated_delta_verify_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, kept,
                                          slots, fresh, B_ROWS, NULL, &yv));
    CHECK(same_bits(yv, y, n_v(d) * 2));
    float *kept_after = mlxkt_read_floats(kept, N_POOL * per);
    CHECK(memcmp(kept_after, pool, N_POOL * per * sizeof(float)) == 0);
    free(kept_after);

    /* The commit: mlxk_gated_delta_state on the gathered states, bit for bit. */
    int32_t accepted[B_ROWS] = {2, 3, 0};
    mlxk_array *committed = NULL;
    CHECK_OK(mlxk_gated_delta_state_pool(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, kept, slots,
                                         fresh, accepted, B_ROWS, &committed));
    int32_t gs[4] = {B_ROWS, d.hv, d.dv, d.dk};
    mlxk_array *gathered = new_f32(start, gs, 4);
    mlxk_array *dense = NULL;
    CHECK_OK(mlxk_gated_delta_state(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, gathered, accepted,
                                    B_ROWS, &dense));
    float *c_got = mlxkt_read_floats(committed, N_POOL * per);
    float *d_got = mlxkt_read_floats(dense, B_ROWS * per);
    CHECK(memcmp(c_got + 3 * per, d_got + 0 * per, per * sizeof(float)) == 0);
    CHECK(memcmp(c_got + 0 * per, d_got + 2 * per, per * sizeof(float)) == 0);
    CHECK(memcmp(c_got + 1 * per, pool + 1 * per, per * sizeof(float)) == 0);
    free(c_got);
    free(d_got);

    /* The chunked form: mlxk_gated_delta_update_chunked on the gathered states, bit for bit. */
    mlxk_array *yc = NULL, *pc = NULL, *yd = NULL, *sd = NULL;
    CHECK_OK(mlxk_gated_delta_update_pool_chunked(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias,
                                                  kept, slots, NULL, B_ROWS, NULL, 16, &yc, &pc));
    float *plain = gather(pool, slots, NULL, B_ROWS, per);
    mlxk_array *g2 = new_f32(plain, gs, 4);
    CHECK_OK(mlxk_gated_delta_update_chunked(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, g2, NULL,
                                             16, &yd, &sd));
    float *pc_got = mlxkt_read_floats(pc, N_POOL * per);
    float *sd_got = mlxkt_read_floats(sd, B_ROWS * per);
    CHECK(memcmp(pc_got + 3 * per, sd_got, per * sizeof(float)) == 0);
    CHECK(memcmp(pc_got + 0 * per, sd_got + 2 * per, per * sizeof(float)) == 0);
    free(pc_got);
    free(sd_got);

    free(plain);
    free(start);
    free(ref_state);
    free(y_ref);
    free(y_got);
    free(p_got);
    free(pool);
    free_ok(y);
    free_ok(p2);
    free_ok(yv);
    free_ok(kept);
    free_ok(committed);
    free_ok(gathered);
    free_ok(dense);
    free_ok(yc);
    free_ok(pc);
    free_ok(yd);
    free_ok(sd);
    free_ok(g2);
    free_args(&x);
    host_free(&h);
}

/* Packed prefill (exact and chunked): each sequence's y and state equal one call on it alone,
 * bit for bit; the errors of the offsets by name. */
static void check_packed(void) {
    enum { SEQS = 3 };
    int32_t cu[SEQS + 1] = {0, 3, 3, 7};
    Dims d = {1, 7, 2, 2, 64, 4};
    size_t per = (size_t)d.hv * d.dv * d.dk;
    Host h = host_random(d, 0);
    Args x = upload(&h);
    float *pool = random_values(2 * per);
    int32_t pool_shape[4] = {2, d.hv, d.dv, d.dk};
    int32_t slots[SEQS] = {1, -1, 0};
    const char *fn = "mlxk_gated_delta_update_packed";
    for (int chunked = 0; chunked < 2; chunked++) {
        mlxk_array *p = new_f32(pool, pool_shape, 4);
        mlxk_array *y = NULL, *p2 = NULL;
        if (chunked) {
            CHECK_OK(mlxk_gated_delta_update_packed_chunked(x.q, x.k, x.v, x.a, x.b, x.a_log,
                                                            x.dt_bias, p, cu, SEQS + 1, slots,
                                                            NULL, 0, &y, &p2));
        } else {
            CHECK_OK(mlxk_gated_delta_update_packed(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias,
                                                    p, cu, SEQS + 1, slots, NULL, &y, &p2));
        }
        float *y_got = mlxkt_read_floats(y, n_v(d));
        float *p_got = mlxkt_read_floats(p2, 2 * per);
        size_t tok = (size_t)d.hv * d.dv;
        for (int i = 0; i < SEQS; i++) {
            int len = cu[i + 1] - cu[i];
            if (slots[i] < 0 || len == 0) {
                continue;
            }
            /* The sequence alone: its tokens from the packed host values. */
            Host one = h;
            one.d.t = len;
            one.q = h.q + (size_t)cu[i] * d.hk * d.dk;
            one.k = h.k + (size_t)cu[i] * d.hk * d.dk;
            one.v = h.v + (size_t)cu[i] * tok;
            one.a = h.a + (size_t)cu[i] * d.hv;
            one.b = h.b + (size_t)cu[i] * d.hv;
            Args xo = upload(&one);
            int32_t s1[4] = {1, d.hv, d.dv, d.dk};
            mlxk_array *st = new_f32(pool + (size_t)slots[i] * per, s1, 4);
            mlxk_array *yo = NULL, *so = NULL;
            if (chunked) {
                CHECK_OK(mlxk_gated_delta_update_chunked(xo.q, xo.k, xo.v, xo.a, xo.b, xo.a_log,
                                                         xo.dt_bias, st, NULL, 0, &yo, &so));
            } else {
                CHECK_OK(mlxk_gated_delta_update(xo.q, xo.k, xo.v, xo.a, xo.b, xo.a_log,
                                                 xo.dt_bias, st, NULL, &yo, &so));
            }
            float *yo_got = mlxkt_read_floats(yo, (size_t)len * tok);
            float *so_got = mlxkt_read_floats(so, per);
            CHECK(memcmp(yo_got, y_got + (size_t)cu[i] * tok, (size_t)len * tok * 4) == 0);
            CHECK(memcmp(so_got, p_got + (size_t)slots[i] * per, per * 4) == 0);
            free(yo_got);
            free(so_got);
            free_ok(yo);
            free_ok(so);
            free_ok(st);
            free_args(&xo);
        }
        free(y_got);
        free(p_got);
        free_ok(y);
        free_ok(p2);
        free_ok(p);
    }
    /* Offsets that break the rules, each refused by name; out-parameters untouched. */
    mlxk_array *p = new_f32(pool, pool_shape, 4);
    mlxk_array *sentinel = (mlxk_array *)(uintptr_t)0x5E57;
    mlxk_array *y = sentinel, *p2 = sentinel;
    int32_t bad_first[SEQS + 1] = {1, 3, 3, 7}, bad_last[SEQS + 1] = {0, 3, 3, 6};
    EXPECT_ERROR(mlxk_gated_delta_update_packed(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p,
                                                bad_first, SEQS + 1, slots, NULL, &y, &p2),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "cu_seqlens[0] is 1");
    EXPECT_ERROR(mlxk_gated_delta_update_packed(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p,
                                                bad_last, SEQS + 1, slots, NULL, &y, &p2),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "total_T = 7");
    EXPECT_ERROR(mlxk_gated_delta_update_packed(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p,
                                                NULL, SEQS + 1, slots, NULL, &y, &p2),
                 MLXK_ERR_NULL_POINTER, fn, "cu_seqlens");
    CHECK(y == sentinel && p2 == sentinel);
    free_ok(p);
    free(pool);
    free_args(&x);
    host_free(&h);
}

/* The update from the convolution's output on a pool: the head split, then the pool update. */
static void check_from_conv_pool(void) {
    enum { B = 2, T = 3, HK = 1, HV = 2, DK = 32, DV = 4, C = 2 * HK * DK + HV * DV };
    float xs[B * T * C], qs[DK], ks[DK], gates[2 * B * T * HV], a_log[HV], dt[HV];
    for (size_t i = 0; i < sizeof xs / sizeof xs[0]; i++) xs[i] = (float)mlxkt_rng_normal(&rng);
    for (int i = 0; i < DK; i++) {
        qs[i] = 0.05f + 0.01f * (float)(i % 7);
        ks[i] = 0.1f + 0.01f * (float)(i % 5);
    }
    for (size_t i = 0; i < sizeof gates / sizeof gates[0]; i++) {
        gates[i] = (float)mlxkt_rng_normal(&rng);
    }
    for (int i = 0; i < HV; i++) {
        a_log[i] = (float)mlxkt_rng_uniform(&rng);
        dt[i] = (float)mlxkt_rng_uniform(&rng);
    }
    int32_t xshape[3] = {B, T, C}, dshape[1] = {DK}, gshape[3] = {B, T, HV}, hshape[1] = {HV};
    int32_t pshape[4] = {3, HV, DV, DK};
    float pool[3 * HV * DV * DK];
    for (size_t i = 0; i < sizeof pool / sizeof pool[0]; i++) {
        pool[i] = (float)mlxkt_rng_uniform(&rng) - 0.5f;
    }
    mlxk_array *x = new_f32(xs, xshape, 3), *q_scale = new_f32(qs, dshape, 1);
    mlxk_array *k_scale = new_f32(ks, dshape, 1), *a = new_f32(gates, gshape, 3);
    mlxk_array *b = new_f32(gates + B * T * HV, gshape, 3), *al = new_f32(a_log, hshape, 1);
    mlxk_array *dtb = new_f32(dt, hshape, 1);
    int32_t slots[B] = {2, 0};
    mlxk_array *p = new_f32(pool, pshape, 4), *y = NULL, *p2 = NULL;
    CHECK_OK(mlxk_gated_delta_update_from_conv_pool(x, q_scale, k_scale, HK, HV, DV, 1e-6f, a, b,
                                                    al, dtb, p, slots, NULL, B, NULL, &y, &p2));
    mlxk_array *q = NULL, *k = NULL, *v = NULL, *y2 = NULL, *p3 = NULL;
    CHECK_OK(mlxk_silu_rms_heads(x, q_scale, k_scale, HK, HV, DV, 1e-6f, &q, &k, &v));
    CHECK_OK(mlxk_gated_delta_update_pool(q, k, v, a, b, al, dtb, p, slots, NULL, B, NULL, &y2,
                                          &p3));
    CHECK(same_bits(y, y2, (size_t)B * T * HV * DV * 4));
    CHECK(same_bits(p2, p3, sizeof pool));
    mlxk_array *handles[] = {x, q_scale, k_scale, a, b, al, dtb, p, y, p2, q, k, v, y2, p3};
    for (size_t i = 0; i < sizeof handles / sizeof handles[0]; i++) {
        free_ok(handles[i]);
    }
}

/* Slots that break the rules, each refused by name. */
static void check_pool_errors(void) {
    Dims d = {2, 2, 1, 2, 32, 4};
    Host h = host_random(d, 0);
    Args x = upload(&h);
    float pool[3 * 2 * 4 * 32] = {0.25f};
    int32_t shape[4] = {3, 2, 4, 32};
    mlxk_array *p = new_f32(pool, shape, 4);
    const char *fn = "mlxk_gated_delta_update_pool";
    mlxk_array *sentinel = (mlxk_array *)(uintptr_t)0x5E57;
    mlxk_array *y = sentinel, *p2 = sentinel;
    int32_t twice[2] = {1, 1}, past[2] = {0, 3};
    EXPECT_ERROR(mlxk_gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p,
                                              twice, NULL, 2, NULL, &y, &p2),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "slots[1] is 1");
    EXPECT_ERROR(mlxk_gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p,
                                              past, NULL, 2, NULL, &y, &p2),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "N = 3");
    EXPECT_ERROR(mlxk_gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p,
                                              past, NULL, 1, NULL, &y, &p2),
                 MLXK_ERR_INVALID_ARGUMENT, fn, "n_slots is 1");
    EXPECT_ERROR(mlxk_gated_delta_update_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, x.v,
                                              past, NULL, 2, NULL, &y, &p2),
                 MLXK_ERR_SHAPE, fn, "pool");
    CHECK(y == sentinel && p2 == sentinel);
    free_ok(p);
    free_args(&x);
    host_free(&h);
}

/* The host values of tokens `tokens` (n of them) of row 0 of `h`, as one row. */
static Host host_tokens(const Host *h, const int *tokens, int n) {
    Host out = *h;
    Dims d = h->d;
    out.d.t = n;
    size_t qk = (size_t)d.hk * d.dk, vv = (size_t)d.hv * d.dv, g = (size_t)d.hv;
    out.q = alloc_floats(n * qk);
    out.k = alloc_floats(n * qk);
    out.v = alloc_floats(n * vv);
    out.a = alloc_floats(n * g);
    out.b = alloc_floats(n * g);
    for (int i = 0; i < n; i++) {
        size_t t = (size_t)tokens[i];
        memcpy(out.q + i * qk, h->q + t * qk, qk * sizeof(float));
        memcpy(out.k + i * qk, h->k + t * qk, qk * sizeof(float));
        memcpy(out.v + i * vv, h->v + t * vv, vv * sizeof(float));
        memcpy(out.a + i * g, h->a + t * g, g * sizeof(float));
        memcpy(out.b + i * g, h->b + t * g, g * sizeof(float));
    }
    return out;
}

static void free_tokens(Host *h) {
    free(h->q);
    free(h->k);
    free(h->v);
    free(h->a);
    free(h->b);
}

/* The tree verify: every node's y the last y of the chain verify of its path, bit for bit; the
 * commit of a path the chain commit of it; a parent after its child refused by name. */
static void check_tree_calls(void) {
    enum { NODES = 5, TREES = 2 };
    Dims d = {1, NODES, 1, 2, 32, 4};
    size_t per = (size_t)d.hv * d.dv * d.dk, tok = (size_t)d.hv * d.dv;
    Host h = host_random(d, 1);
    Args x = upload(&h);
    float *pool = random_values(N_POOL * per);
    int32_t pool_shape[4] = {N_POOL, d.hv, d.dv, d.dk};
    mlxk_array *p = new_f32(pool, pool_shape, 4);
    /* Tree 0: node 0 from slot 2, nodes 1 and 2 after it, node 3 after node 1; tree 1: one
     * node from zeros (fresh), slot 4. */
    int32_t cu[TREES + 1] = {0, 4, 5}, parents[NODES] = {-1, 0, 0, 1, -1};
    int32_t slots[TREES] = {2, 4};
    uint8_t fresh[TREES] = {0, 1};
    mlxk_array *y = NULL;
    CHECK_OK(mlxk_gated_delta_verify_tree_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p,
                                               cu, TREES + 1, parents, NODES, slots, fresh, &y));
    uint16_t *y_got = malloc(NODES * tok * 2);
    CHECK_OK(mlxk_array_read(y, y_got, NODES * tok * 2));
    static const int paths[NODES][3] = {{0}, {0, 1}, {0, 2}, {0, 1, 3}, {4}};
    static const int depth[NODES] = {1, 2, 2, 3, 1};
    for (int node = 0; node < NODES; node++) {
        int tree = node < 4 ? 0 : 1;
        Host one = host_tokens(&h, paths[node], depth[node]);
        Args xo = upload(&one);
        mlxk_array *yo = NULL;
        CHECK_OK(mlxk_gated_delta_verify_pool(xo.q, xo.k, xo.v, xo.a, xo.b, xo.a_log, xo.dt_bias,
                                              p, &slots[tree], &fresh[tree], 1, NULL, &yo));
        uint16_t *yo_got = malloc(depth[node] * tok * 2);
        CHECK_OK(mlxk_array_read(yo, yo_got, depth[node] * tok * 2));
        CHECK(memcmp(yo_got + (depth[node] - 1) * tok, y_got + node * tok, tok * 2) == 0);
        free(yo_got);
        free_ok(yo);
        free_args(&xo);
        free_tokens(&one);
    }
    free(y_got);
    /* The commit of 0 -> 1 -> 3 in tree 0 and of its one node in tree 1. */
    int32_t lengths[TREES] = {3, 1}, accepted[4] = {0, 1, 3, 0};
    mlxk_array *committed = NULL;
    CHECK_OK(mlxk_gated_delta_commit_tree_pool(x.k, x.v, x.a, x.b, x.a_log, x.dt_bias, p, cu,
                                               TREES + 1, parents, NODES, slots, fresh, lengths,
                                               accepted, 4, &committed));
    float *c_got = mlxkt_read_floats(committed, N_POOL * per);
    for (int tree = 0; tree < TREES; tree++) {
        Host one = host_tokens(&h, paths[tree == 0 ? 3 : 4], lengths[tree]);
        Args xo = upload(&one);
        mlxk_array *chain = NULL;
        CHECK_OK(mlxk_gated_delta_state_pool(xo.k, xo.v, xo.a, xo.b, xo.a_log, xo.dt_bias, p,
                                             &slots[tree], &fresh[tree], &lengths[tree], 1,
                                             &chain));
        float *want = mlxkt_read_floats(chain, N_POOL * per);
        size_t at = (size_t)slots[tree] * per;
        CHECK(memcmp(c_got + at, want + at, per * sizeof(float)) == 0);
        free(want);
        free_ok(chain);
        free_args(&xo);
        free_tokens(&one);
    }
    CHECK(memcmp(c_got, pool, 2 * per * sizeof(float)) == 0); /* slots 0, 1 not named */
    free(c_got);
    /* A parent after its child, refused by name; the out-parameter untouched. */
    mlxk_array *sentinel = (mlxk_array *)(uintptr_t)0x5E57, *y2 = sentinel;
    int32_t late[NODES] = {-1, 2, 0, 1, -1};
    EXPECT_ERROR(mlxk_gated_delta_verify_tree_pool(x.q, x.k, x.v, x.a, x.b, x.a_log, x.dt_bias,
                                                   p, cu, TREES + 1, late, NODES, slots, fresh,
                                                   &y2),
                 MLXK_ERR_INVALID_ARGUMENT, "mlxk_gated_delta_verify_tree_pool", "parents[1] is 2");
    CHECK(y2 == sentinel);
    free_ok(committed);
    free_ok(y);
    free_ok(p);
    free(pool);
    free_args(&x);
    host_free(&h);
}

void test_gated_delta_pool(void) {
    check_pool_calls();
    check_packed();
    check_from_conv_pool();
    check_pool_errors();
    check_tree_calls();
}
