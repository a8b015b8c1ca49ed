/*
 * Benchmark inputs shared with benches/peer.py: a counter-based generator (splitmix64 of
 * seed + (i + 1) * golden), so value i of a tensor depends only on its seed and i, and the
 * Python side reproduces the same numbers with numpy. Each tensor's seed is
 * (tag << 48) ^ case_seed(kind, B, T, index); peer.py uses the same formulas.
 */

#ifndef MLXKERN_BENCH_INPUTS_H
#define MLXKERN_BENCH_INPUTS_H

#include <stdint.h>

#include "mlxk_test_util.h" /* splitmix64, Box-Muller, bfloat16 */

/* Tensor tags. */
enum {
    TAG_Q = 1,
    TAG_K = 2,
    TAG_V = 3,
    TAG_A = 4,
    TAG_B = 5,
    TAG_A_LOG = 6,
    TAG_DT_BIAS = 7,
    TAG_STATE = 8,
    TAG_CONV_OUT = 9,
    TAG_NORM_X = 10,
    TAG_NORM_GATE = 11,
    TAG_NORM_WEIGHT = 12,
    TAG_DY = 13,         /* the gradient bench's cotangents (benches/grad.cpp, grad_peer.py) */
    TAG_DSTATE_OUT = 14
};

/* Case kinds (part of the seed). */
enum {
    KIND_DECODE = 1,
    KIND_PREFILL = 2,
    KIND_PADDED = 3,
    KIND_REPLAY = 4,
    KIND_HEAD_SPLIT = 5,
    KIND_GATED_NORM = 6,
    KIND_SHARED = 7
};

static inline uint64_t case_seed(uint64_t kind, uint64_t batch, uint64_t tokens, uint64_t index) {
    return kind * 1000000000ull + batch * 1000000ull + tokens * 100ull + index;
}

static inline uint64_t tensor_seed(uint64_t tag, uint64_t case_seed_value) {
    return (tag << 48) ^ case_seed_value;
}

static inline uint64_t splitmix_at(uint64_t seed, uint64_t i) {
    return mlxkt_splitmix64(seed + (i + 1) * MLXKT_SPLITMIX64_GAMMA);
}

/* Uniform in [0, 1). */
static inline double uniform_at(uint64_t seed, uint64_t i) {
    return mlxkt_unit(splitmix_at(seed, i));
}

/* Standard normal (Box-Muller on draws 2i and 2i + 1). */
static inline double normal_at(uint64_t seed, uint64_t i) {
    return mlxkt_box_muller(uniform_at(seed, 2 * i), uniform_at(seed, 2 * i + 1));
}

/* n normals times scale, rounded to float32 then bfloat16. */
static inline void fill_normal_bf16(uint16_t *dst, size_t n, uint64_t seed, double scale) {
    for (size_t i = 0; i < n; i++) {
        dst[i] = mlxkt_bf16_from_float((float)(normal_at(seed, i) * scale));
    }
}

/* Rows of `width` (at most 256) normals, each scaled to L2 norm `norm` (mlx-lm's normalize_qk
 * leaves q with norm Dk^-1/2 and k with norm 1). */
static inline void fill_unit_rows_bf16(uint16_t *dst, size_t rows, size_t width, uint64_t seed,
                                       double norm) {
    double x[256];
    for (size_t r = 0; r < rows; r++) {
        double sum = 0.0;
        for (size_t j = 0; j < width && j < 256; j++) {
            x[j] = normal_at(seed, r * width + j);
            sum += x[j] * x[j];
        }
        double inv = norm / sqrt(sum + 1e-12);
        for (size_t j = 0; j < width && j < 256; j++) {
            dst[r * width + j] = mlxkt_bf16_from_float((float)(x[j] * inv));
        }
    }
}

#endif /* MLXKERN_BENCH_INPUTS_H */
